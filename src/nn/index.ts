export { Module, StateDictError, type IncompatibleKeys } from "./module.js";
export {
  Sequential, ModuleList, ModuleDict, ContainerError, checkpointSequential, ReLU, Tanh, Sigmoid, SiLU, GELU, Softmax, LogSoftmax, Identity, Flatten, type TensorModule,
} from "./containers.js";
export { type Dataset, TensorDataset, DataLoader, DataError, defaultCollate, type DataLoaderOptions } from "./data.js";
export { MSELoss, L1Loss, SmoothL1Loss, HuberLoss, CrossEntropyLoss, NLLLoss, BCELoss, BCEWithLogitsLoss, KLDivLoss } from "./losses.js";
export { Linear, Embedding, RMSNorm, LayerNorm, Dropout, newParameter, type LayerOptions, type LinearLoraSlots } from "./layers.js";
export { RotaryEmbedding, rotaryInvFreq, type RotaryConfig, type RopeScaling } from "./rotary.js";
export { Attention, type AttentionConfig, type ForwardContext, type PagedContext, type DenseContext } from "./attention.js";
export { documentIds, documentPositions } from "./documents.js";
export { GatedMLP, MoE, type MoeOptions } from "./mlp.js";
export { DistributedDataParallel, type DdpOptions } from "./ddp.js";
export {
  ColumnParallelLinear, RowParallelLinear, TensorParallelError, divideForTp, narrowToShard, shardedParameters, tensorParallelOf,
  type ShardSpec, type TensorParallel,
} from "./parallel.js";
