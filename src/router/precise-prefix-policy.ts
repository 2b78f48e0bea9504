// precise_prefix (llm-d's precise prefix-cache scorer): the workers' own KV-cache events (kv-block-index.ts) say which
// prefix-cache blocks each holds; a request's prompt is tokenized and hashed as the engine hashes it, and each worker
// scores the number of leading blocks it holds. The most blocks win (ties: the least loaded); when no worker holds
// the first block, or the prompt is unknown (no tokenizer, an endpoint without a prompt, a remote image), the least
// loaded worker. Image chats and Anthropic's Messages are hashed as the worker hashes them (request-tokens.ts).
// Nothing is recorded on routing: the index changes only when a worker says its cache did.
import type { KvBlockIndex } from "./kv-block-index.js";
import { leastLoaded, type BlockHashesOf, type RoutingDecision, type RoutingPolicy, type WorkerView } from "./routing-types.js";

/** Engine block size assumed for a worker whose events have not said (the engine's default). */
export const DEFAULT_KV_BLOCK_SIZE = 16;

/**
 * Each candidate's leading cached blocks of the request and the request's full blocks on that worker's block size.
 * @example prefixHits(index, candidates, hashesOf) // [{ hits: 3, blocks: 4 }, { hits: 0, blocks: 4 }]
 */
export function prefixHits(index: KvBlockIndex, candidates: readonly WorkerView[], hashesOf: BlockHashesOf | null): { hits: number; blocks: number }[] {
  if (hashesOf === null) return candidates.map(() => ({ hits: 0, blocks: 0 }));
  return candidates.map((w) => {
    const hashes = hashesOf(index.blockSize(w.url) ?? DEFAULT_KV_BLOCK_SIZE);
    return { hits: index.longestPrefix(hashes, [w.url]).get(w.url)!, blocks: hashes.length };
  });
}

export class PrecisePrefixPolicy implements RoutingPolicy {
  readonly name = "precise_prefix";

  constructor(readonly index: KvBlockIndex) {}

  select(candidates: readonly WorkerView[], _text: string, hashesOf: BlockHashesOf | null = null): RoutingDecision {
    const scores = prefixHits(this.index, candidates, hashesOf);
    const best = Math.max(...scores.map((s) => s.hits));
    if (best === 0) return { url: leastLoaded(candidates).url, reason: "cache_miss", matchRate: 0 };
    const top = candidates.filter((_, i) => scores[i]!.hits === best);
    const chosen = leastLoaded(top);
    const s = scores[candidates.indexOf(chosen)]!;
    return { url: chosen.url, reason: "cache_hit", matchRate: s.hits / s.blocks };
  }

  forgetWorker(url: string): void {
    this.index.removeWorker(url);
  }

  maintain(): void {}
}
