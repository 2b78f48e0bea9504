// What the router's policies share: the worker view they choose from, the decision they return, their interface,
// and the least-loaded choice every load-aware policy falls back to.

export const POLICY_NAMES = ["cache_aware", "round_robin", "random", "power_of_two", "weighted", "precise_prefix"] as const;
export type PolicyName = (typeof POLICY_NAMES)[number];

/**
 * What a worker does in the fleet: "regular" serves whole requests; with P/D disaggregation (--pd-disaggregation) a
 * "prefill" worker runs a completion's prompt and hands its KV cache on, a "decode" worker pulls it and generates.
 */
export type WorkerRole = "regular" | "prefill" | "decode";

/**
 * How a worker joined the fleet: a flag (--worker-urls, --prefill, --decode), POST /add_worker, or Kubernetes
 * service discovery (--service-discovery), which names the pod it stands for.
 */
export type WorkerOrigin =
  | { readonly source: "static" }
  | { readonly source: "api" }
  | { readonly source: "discovered"; readonly pod: string; readonly namespace: string };

/** What a policy sees of a worker. */
export interface WorkerView {
  readonly url: string;
  /** Requests on it: the router's in-flight count, or the worker's reported running + waiting when larger. */
  readonly load: number;
  /** The worker's reported vllm:kv_cache_usage_perc (0..1), or null before the first scrape. */
  readonly kvCacheUsage: number | null;
}

/**
 * Why a worker was chosen: cache_aware's prefix hit, its miss (least loaded, then fewest cached characters), its
 * fallback to the least loaded worker when the fleet is imbalanced, the weighted scorers' highest total, or one of the
 * load-only policies. precise_prefix: cache_hit when a worker's KV-cache events say it holds the prompt's first
 * blocks, else cache_miss.
 */
export type RoutingReason = "cache_hit" | "cache_miss" | "load_balanced" | "round_robin" | "random" | "power_of_two" | "weighted" | "lookup";

export interface RoutingDecision {
  readonly url: string;
  readonly reason: RoutingReason;
  /**
   * cache_aware, weighted: the chosen worker's matched characters / routing text length (0 for the load-only
   * policies); precise_prefix (and weighted's precise scorer): its held leading blocks / the prompt's full blocks.
   */
  readonly matchRate: number;
}

/** The request prompt's chain block hashes for an engine block size (precise_prefix; null when the prompt is unknown). */
export type BlockHashesOf = (blockSize: number) => readonly string[];

export interface RoutingPolicy {
  readonly name: PolicyName;
  /**
   * Picks one of `candidates` (never empty) for a request whose routing text is `text` and, where the router has
   * the model's tokenizer, whose prompt hashes to `hashesOf(blockSize)`.
   */
  select(candidates: readonly WorkerView[], text: string, hashesOf?: BlockHashesOf | null): RoutingDecision;
  /** A worker left the fleet or went down: forget what it cached. */
  forgetWorker(url: string): void;
  /** Periodic upkeep (cache_aware: evict its tree down to max-tree-size). */
  maintain(): void;
}

/**
 * The least loaded candidate; ties go to the lower KV-cache usage, then to `tieBreak`'s smaller value, then to the
 * earlier candidate (deterministic).
 */
export function leastLoaded(candidates: readonly WorkerView[], tieBreak: (w: WorkerView) => number = () => 0): WorkerView {
  let best = candidates[0]!;
  for (const w of candidates.slice(1)) {
    const d = w.load - best.load || (w.kvCacheUsage ?? 0) - (best.kvCacheUsage ?? 0) || tieBreak(w) - tieBreak(best);
    if (d < 0) best = w;
  }
  return best;
}
