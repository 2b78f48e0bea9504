// torch.distributed's role: process groups and collectives over gloo (see process-group.ts, collectives.ts).
export {
  initProcessGroup, destroyProcessGroup, isInitialized, getRank, getWorldSize, getBackend, getProcessGroupRanks, newGroup, ProcessGroup,
  DEFAULT_TIMEOUT_MS,
  type InitProcessGroupOptions, type DistributedBackend,
} from "./process-group.js";
export {
  allReduce, broadcast, allGather, allGatherIntoTensor, reduceScatter, reduceScatterTensor, barrier, send, recv, isend, irecv,
  ReduceOp, type ReduceOpName,
} from "./collectives.js";
export { reduce, gather, scatter, allToAll, allToAllSingle } from "./rooted-collectives.js";
export { allGatherObject, broadcastObjectList, gatherObject, scatterObjectList } from "./object-collectives.js";
export { monitoredBarrier } from "./monitored-barrier.js";
export { Work, type AsyncResult } from "./work.js";
export { DistributedError, DistributedTimeoutError, DistributedBackendError, GlooUnavailableError } from "./errors.js";
export { glooUnavailableReason } from "./gloo-native.js";
