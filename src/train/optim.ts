// Kiln's torch.optim: the optimizer base (optimizers/optimizer.ts) and the algorithms, each with torch's update rule,
// defaults and hyper-parameter checks, float32 state per param and an exact stateDict() resume.
//   Adam, AdamW                   optimizers/adam.ts
//   Adamax, NAdam, RAdam          optimizers/adam-variants.ts
//   Adagrad, RMSprop              optimizers/adagrad-rmsprop.ts
//   SGD                           optimizers/sgd.ts
// The lr schedulers (torch.optim.lr_scheduler) are in lr-schedulers.ts.
export { Optimizer, OptimizerError } from "./optimizers/optimizer.js";
export type { BaseOptimizerOptions, OptimizerKind, OptimizerStateDict, ParamState, SteppableOptimizer } from "./optimizers/optimizer.js";
export { Adam, AdamW } from "./optimizers/adam.js";
export type { AdamOptions, AdamWOptions } from "./optimizers/adam.js";
export { Adamax, NAdam, RAdam } from "./optimizers/adam-variants.js";
export type { AdamVariantOptions, NAdamOptions, RAdamOptions } from "./optimizers/adam-variants.js";
export { Adagrad, RMSprop } from "./optimizers/adagrad-rmsprop.js";
export type { AdagradOptions, RMSpropOptions } from "./optimizers/adagrad-rmsprop.js";
export { SGD } from "./optimizers/sgd.js";
export type { SGDOptions } from "./optimizers/sgd.js";
