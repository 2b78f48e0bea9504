// weighted (llm-d's inference scheduler, its default profile): every candidate gets a score in [0, 1] from each
// scorer, the weighted sum picks the worker (max-score picker; ties go to the least loaded, then the first).
//   prefix-cache scorer:          matched characters of the request's text on that worker / text length
//   queue scorer:                 (max_load - load) / (max_load - min_load) over the candidates (1 when all equal)
//   kv-cache-utilization scorer:  1 - the worker's reported vllm:kv_cache_usage_perc (1 before its first scrape)
//   precise-prefix-cache scorer:  leading prompt blocks the worker's KV-cache events say it holds / the prompt's full
//                                 blocks (with --kv-events-endpoint and --tokenizer; weight 0 by default)
// As cache_aware does, the chosen worker is recorded in the prefix tree as having been sent the whole text.
import type { KvBlockIndex } from "./kv-block-index.js";
import { prefixHits } from "./precise-prefix-policy.js";
import { PrefixTree } from "./prefix-tree.js";
import { leastLoaded, type BlockHashesOf, type RoutingDecision, type RoutingPolicy, type WorkerView } from "./routing-types.js";

export interface WeightedOptions {
  /** llm-d's default profile weighs prefix-cache 3, queue 2, kv-cache-utilization 2. */
  prefixCacheScorerWeight: number;
  queueScorerWeight: number;
  kvCacheUtilizationScorerWeight: number;
  /** llm-d's precise-prefix-cache scorer (needs the KV-block index); 0 (the default) leaves it out. */
  precisePrefixCacheScorerWeight?: number;
  /** Characters the tree keeps per worker (as cache_aware's). */
  maxTreeSize: number;
}

export interface WorkerScores {
  prefix: number;
  queue: number;
  kvCache: number;
  precise: number;
  total: number;
}

export class WeightedPolicy implements RoutingPolicy {
  readonly name = "weighted";
  readonly tree = new PrefixTree();

  constructor(
    private readonly options: WeightedOptions,
    private readonly index: KvBlockIndex | null = null,
  ) {}

  /** Each candidate's scores, in candidate order. */
  score(candidates: readonly WorkerView[], text: string, hashesOf: BlockHashesOf | null = null): WorkerScores[] {
    const { prefixCacheScorerWeight, queueScorerWeight, kvCacheUtilizationScorerWeight, precisePrefixCacheScorerWeight = 0 } = this.options;
    const usePrecise = this.index !== null && precisePrefixCacheScorerWeight > 0;
    const hits = usePrecise ? prefixHits(this.index!, candidates, hashesOf) : null;
    const matched = text.length > 0 ? this.tree.matchEach(text) : new Map<string, number>();
    const loads = candidates.map((w) => w.load);
    const max = Math.max(...loads);
    const min = Math.min(...loads);
    return candidates.map((w, i) => {
      const prefix = text.length > 0 ? (matched.get(w.url) ?? 0) / text.length : 0;
      const queue = max === min ? 1 : (max - w.load) / (max - min);
      const kvCache = 1 - (w.kvCacheUsage ?? 0);
      const h = hits?.[i];
      const precise = h === undefined || h.blocks === 0 ? 0 : h.hits / h.blocks;
      const total = prefixCacheScorerWeight * prefix + queueScorerWeight * queue + kvCacheUtilizationScorerWeight * kvCache + precisePrefixCacheScorerWeight * precise;
      return { prefix, queue, kvCache, precise, total };
    });
  }

  select(candidates: readonly WorkerView[], text: string, hashesOf: BlockHashesOf | null = null): RoutingDecision {
    const scores = this.score(candidates, text, hashesOf);
    const best = Math.max(...scores.map((s) => s.total));
    // equal up to rounding (sums of products of fractions)
    const top = candidates.filter((_, i) => best - scores[i]!.total < 1e-9);
    const chosen = leastLoaded(top);
    this.tree.record(text, chosen.url, this.options.maxTreeSize);
    return { url: chosen.url, reason: "weighted", matchRate: scores[candidates.indexOf(chosen)]!.prefix };
  }

  forgetWorker(url: string): void {
    this.tree.removeTenant(url);
  }

  maintain(): void {
    this.tree.evict(this.options.maxTreeSize);
  }
}
