// The router layer (DESIGN.md: "fleet front door: prefix-cache + load aware routing, flow control").
export { createRouter, PD_ROUTES, PROXIED_POST_ROUTES, type Router, type RouterDeps, type WorkerGroup } from "./router-server.js";
export { DEFAULT_ROUTER_CONFIG, resolveRouterConfig, RouterConfigError, type PrefillUrl, type RouterConfig } from "./router-config.js";
export { decodeBody, kvTransferParamsOf, PREFILL_KV_TRANSFER_PARAMS, prefillBody } from "./pd-proxy.js";
export { createPolicy, leastLoaded, POLICY_NAMES, type PolicyName, type RoutingDecision, type RoutingPolicy, type RoutingReason, type WorkerView } from "./policies.js";
export type { WorkerOrigin, WorkerRole } from "./routing-types.js";
export { CacheAwarePolicy, type CacheAwareOptions } from "./cache-aware-policy.js";
export { WeightedPolicy, type WeightedOptions, type WorkerScores } from "./weighted-policy.js";
export { PrefixTree, type PrefixMatch } from "./prefix-tree.js";
export { routingText } from "./request-text.js";
export { WorkerPool, normalizeWorkerUrl, readGauge, type WorkerState } from "./worker-pool.js";
export { RouterError } from "./errors.js";
export { KvBlockIndex, type KvBlockIndexStats } from "./kv-block-index.js";
export { KvEventsSubscriber, parseKvEventBatch, workerOfEngine } from "./kv-events-subscriber.js";
export { PrecisePrefixPolicy, prefixHits, DEFAULT_KV_BLOCK_SIZE } from "./precise-prefix-policy.js";
export { RequestTokenizer } from "./request-tokens.js";
export { KubeApiError, KubeClient, KubeConfigError, inClusterConnection, urlConnection, selectorText, SERVICE_ACCOUNT_DIR, type KubeConnection, type Pod, type PodWatchEvent } from "./kube-api.js";
export { PodDiscovery, podWorker, matchesSelector, type DiscoveredWorker, type DiscoverySink, type DiscoveryStatus, type PodWatchSpec } from "./pod-discovery.js";
