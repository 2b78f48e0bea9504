// cache_aware (sglang / vllm-router's default policy): route a request to the worker that was already sent the
// longest prefix of its text, so that worker's prefix cache hits, unless the fleet's load is imbalanced.
//
//   imbalanced = (max_load - min_load) > balance_abs_threshold  AND  max_load > min_load * balance_rel_threshold
//   imbalanced                      -> the least loaded worker                    ("load_balanced")
//   match_rate > cache_threshold    -> the least loaded worker holding the match  ("cache_hit")
//   otherwise                       -> the least loaded worker, then the one with the fewest cached characters
//                                      (vllm-router: "the smallest tree", most room in its cache)  ("cache_miss")
//
// Whatever the reason, the chosen worker is recorded in the tree as having been sent the whole text.
import { leastLoaded, type RoutingDecision, type RoutingPolicy, type WorkerView } from "./routing-types.js";
import { PrefixTree } from "./prefix-tree.js";

export interface CacheAwareOptions {
  /** A prefix match counts when matched / text length is over this (0..1; vllm-router default 0.3). */
  cacheThreshold: number;
  /** Imbalanced needs max - min load over this (vllm-router default 64). */
  balanceAbsThreshold: number;
  /** ... and max load over min load times this (vllm-router default 1.5). */
  balanceRelThreshold: number;
  /** Characters the tree keeps per worker; periodic eviction trims to it, an insert past twice it trims at once. */
  maxTreeSize: number;
}

export class CacheAwarePolicy implements RoutingPolicy {
  readonly name = "cache_aware";
  readonly tree = new PrefixTree();

  constructor(private readonly options: CacheAwareOptions) {}

  select(candidates: readonly WorkerView[], text: string): RoutingDecision {
    const { cacheThreshold, balanceAbsThreshold, balanceRelThreshold, maxTreeSize } = this.options;
    const loads = candidates.map((w) => w.load);
    const max = Math.max(...loads);
    const min = Math.min(...loads);
    let decision: RoutingDecision;
    if (max - min > balanceAbsThreshold && max > min * balanceRelThreshold) {
      decision = { url: leastLoaded(candidates).url, reason: "load_balanced", matchRate: 0 };
    } else {
      const urls = new Set(candidates.map((w) => w.url));
      const match = text.length > 0 ? this.tree.match(text, (t) => urls.has(t)) : { matchedChars: 0, tenants: [] };
      const matchRate = text.length > 0 ? match.matchedChars / text.length : 0;
      if (matchRate > cacheThreshold) {
        const holders = new Set(match.tenants);
        decision = { url: leastLoaded(candidates.filter((w) => holders.has(w.url))).url, reason: "cache_hit", matchRate };
      } else {
        decision = { url: leastLoaded(candidates, (w) => this.tree.size(w.url)).url, reason: "cache_miss", matchRate };
      }
    }
    this.tree.record(text, decision.url, maxTreeSize);
    return decision;
  }

  forgetWorker(url: string): void {
    this.tree.removeTenant(url);
  }

  maintain(): void {
    this.tree.evict(this.options.maxTreeSize);
  }
}
