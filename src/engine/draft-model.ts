// Speculative decoding with a draft model (vLLM's speculative_config {"model": ..., "num_speculative_tokens": k},
// method "draft_model"): a smaller model of the same vocabulary runs ahead of the served one, k greedy tokens per
// step, which the served model then verifies in one pass as it verifies n-gram drafts (speculative.ts: a one-hot
// draft accepted iff the sampled token equals it keeps the served model's distribution exactly).
//
// The draft model has its own paged KV cache and block tables (the served model's blocks are allocated by its
// scheduler only when a step is scheduled; the draft writes positions ahead of that). Per request it keeps how many
// of the request's tokens its cache holds; each proposal first feeds the tokens it has not seen (the whole prompt
// the first time, in chunks; then the tokens the last step accepted), whose last logits give draft 1, then feeds
// each draft to get the next: 1 + (k - 1) draft forwards per step, batched over the requests. Drafts that were
// rejected leave K/V past the request's length, overwritten when those positions are fed again. A request no longer
// running (finished, aborted or preempted) gives its blocks back at the next proposal; one the draft cache has no
// room for gets no drafts.

import { DraftKvBlocks, type DraftKvState } from "./draft-blocks.js";
import type { ModelRunner, ScheduledSequence } from "./model-runner.js";
import { argmax } from "./sampling-math.js";
import type { DraftRequest, Drafter } from "./speculative.js";

export type { DraftRequest } from "./speculative.js";

/** (computed: tokens of the request whose K/V the draft cache holds) */
type DraftState = DraftKvState;

export class DraftModelProposer implements Drafter {
  private readonly kv: DraftKvBlocks<DraftState>;

  /**
   * `runner`: the draft model over its own KV cache of `numBlocks` blocks of `blockSize` tokens (block 0, which
   * padded rows of a step graph write, is never handed out). `maxTokensPerStep`: the most tokens one draft forward
   * takes (the prompt is fed in chunks of it).
   */
  constructor(
    private readonly runner: ModelRunner & { dispose?(): void; releaseKvCache?(): void; restoreKvCache?(): void },
    blockSize: number,
    numBlocks: number,
    private readonly maxTokensPerStep = 2048,
  ) {
    this.kv = new DraftKvBlocks(blockSize, numBlocks);
  }

  /** Blocks the draft cache has left. */
  get numFreeBlocks(): number {
    return this.kv.numFree;
  }

  /** Requests the draft cache holds K/V of. */
  get numTracked(): number {
    return this.kv.states.size;
  }

  /**
   * Up to `k` greedy drafts for each request (by request id; [] for one without room in the draft cache). `running`:
   * every request still running; the others' blocks are given back first.
   */
  propose(requests: readonly DraftRequest[], running: ReadonlySet<string>): Map<string, number[]> {
    this.kv.keepOnly(running);
    const drafts = new Map<string, number[]>();
    const active: { r: DraftRequest; st: DraftState }[] = [];
    for (const r of requests) {
      drafts.set(r.requestId, []);
      if (r.k <= 0 || r.tokens.length === 0) continue;
      const st = this.kv.states.get(r.requestId) ?? { blocks: [], computed: 0 };
      this.kv.states.set(r.requestId, st);
      // (the last known token is fed again when the cache holds all of them: its logits give the first draft)
      st.computed = Math.min(st.computed, r.tokens.length - 1);
      // K/V at positions up to tokens + k - 2 (the last draft is not fed)
      if (!this.kv.grow(st, r.tokens.length + r.k - 1)) continue;
      active.push({ r, st });
    }
    // catch up: the tokens each cache lacks, in chunks; the chunk reaching the last token gives draft 1
    for (let pending = active; pending.length > 0; ) {
      const batch: { entry: (typeof active)[number]; n: number; last: boolean }[] = [];
      let budget = this.maxTokensPerStep;
      for (const entry of pending) {
        if (budget <= 0) break;
        const n = Math.min(entry.r.tokens.length - entry.st.computed, budget);
        budget -= n;
        batch.push({ entry, n, last: entry.st.computed + n === entry.r.tokens.length });
      }
      const ids = this.run(batch.map(({ entry: { r, st }, n, last }) => this.sequence(r.requestId, st, r.tokens.slice(st.computed, st.computed + n), st.computed, last)));
      let row = 0;
      for (const { entry, n, last } of batch) {
        entry.st.computed += n;
        if (last) drafts.get(entry.r.requestId)!.push(ids[row++]!);
      }
      pending = pending.filter((e) => e.st.computed < e.r.tokens.length);
    }
    // then each draft fed in turn, for the requests that take more
    for (let j = 1; ; j++) {
      const next = active.filter(({ r }) => r.k > j);
      if (next.length === 0) break;
      const ids = this.run(next.map(({ r, st }) => this.sequence(r.requestId, st, [drafts.get(r.requestId)![j - 1]!], r.tokens.length + j - 1, true)));
      next.forEach(({ r }, i) => drafts.get(r.requestId)!.push(ids[i]!));
    }
    return drafts;
  }

  /** Sleep mode (level 1 and up): frees the draft's KV cache; every request's drafting starts over after restoreKvCache(). */
  releaseKvCache(): void {
    this.kv.releaseAll();
    this.runner.releaseKvCache?.();
  }

  restoreKvCache(): void {
    this.runner.restoreKvCache?.();
  }

  /** Gives back every block and frees the draft runner's memory (its KV cache, step graphs). */
  dispose(): void {
    this.kv.releaseAll();
    this.runner.dispose?.();
  }

  private sequence(requestId: string, st: DraftState, tokenIds: readonly number[], startPosition: number, needsLogits: boolean): ScheduledSequence {
    const slotMapping = this.kv.slots(st, startPosition, tokenIds.length);
    return { requestId, tokenIds, startPosition, blockTable: st.blocks, slotMapping, needsLogits, needsPromptLogits: false };
  }

  /** One draft forward: the greedy token of each sequence that needs logits, in order. */
  private run(sequences: ScheduledSequence[]): Int32Array {
    const numTokens = sequences.reduce((n, s) => n + s.tokenIds.length, 0);
    const out = this.runner.execute({ sequences, blockSize: this.kv.blockSize, numTokens, finishedRequestIds: [], sampleOnDevice: true });
    if (out.tokenIds !== undefined) return out.tokenIds;
    // a runner that returns logits only: the argmax of each row
    const V = this.runner.vocabSize;
    return Int32Array.from({ length: out.logits.length / V }, (_, r) => argmax(out.logits.subarray(r * V, (r + 1) * V)));
  }
}
