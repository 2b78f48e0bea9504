// Speculative decoding with an EAGLE head (vLLM's speculative_config {"method": "eagle" | "eagle3", "model": <head>,
// "num_speculative_tokens": k}): the head (models/eagle-head.ts) reads the served model's hidden states and drafts k
// tokens greedily per step, which the served model verifies as any drafts (speculative.ts).
//
// Positions, as vLLM's EagleProposer lays them out: the head's input at position p is (token p + 1, the served
// model's hidden state at p), and its output there proposes token p + 2. After a step, the served model has computed
// positions up to N - 2 of a request with N tokens (the last one just sampled): the head is fed every position it has
// not seen up to N - 2 (the tokens it lacks are known: the prompt, or the tokens the step accepted), whose last output
// gives draft 1; then draft j - 1 is fed at position N - 3 + j with the head's own output as its hidden state. The
// positions fed with its own states are fed again with the served model's once verified (their K/V overwritten).
//
// The head has its own paged KV cache (draft-blocks.ts), as a draft model has. The served model's hidden rows come
// after each step (observe) and wait per request until fed; every running request is fed each step (prompt chunks
// too), so they never pile up beyond a step's. A request whose first rows start past position 0 (a prefix-cache hit)
// has the head's sequence start there: its positions are shifted by that base (rotary attention depends on position
// differences only), and the head attends to what it has seen. The head's forwards run in eagle-runner.ts (step graphs
// where captured).
import { noGrad } from "../tensor/index.js";
import type { EagleHead, EagleHeadConfig } from "../models/eagle-head.js";
import type { DType } from "../backends/dtype.js";
import { DraftKvBlocks, type DraftKvState } from "./draft-blocks.js";
import { EagleHeadRunner, type HeadCaptureOptions, type HeadOutput } from "./eagle-runner.js";
import type { HiddenStatesRequest } from "./model-runner.js";
import type { DraftRequest, Drafter } from "./speculative.js";

/** The served model's hidden rows a head reads: EAGLE-1 the final (normed) states, EAGLE-3 its aux layers' residual streams. */
export function eagleHiddenStates(config: EagleHeadConfig): HiddenStatesRequest {
  return config.method === "eagle" ? "final" : { layers: config.auxLayers };
}

interface EagleState extends DraftKvState {
  /** Served-model position of the head's position 0 (where the first hidden rows came from). */
  base: number;
  /** Hidden rows of served-model positions base + computed .., not yet fed to the head. */
  pending: Float32Array[];
  /** The last row fed (position base + computed - 1), fed again when a request drafts again without new rows. */
  last: Float32Array | null;
}

/** One sequence of a head forward: tokens at head positions start .., their hidden inputs, and whether its last row is read. */
interface HeadFeed {
  st: EagleState;
  ids: readonly number[];
  rows: readonly Float32Array[];
  start: number;
  read: boolean;
}

export class EagleProposer implements Drafter {
  readonly hiddenStates: HiddenStatesRequest;
  private readonly kv: DraftKvBlocks<EagleState>;
  /** The head's forwards over its own KV cache. */
  readonly runner: EagleHeadRunner;

  /**
   * `head` over its own KV cache of `numBlocks` blocks of `blockSize` tokens in `kvDtype`; `maxTokensPerStep`: the
   * most positions one head forward takes.
   */
  constructor(
    readonly head: EagleHead,
    blockSize: number,
    numBlocks: number,
    private readonly maxTokensPerStep = 2048,
    kvDtype: DType = "float32",
  ) {
    this.kv = new DraftKvBlocks(blockSize, numBlocks);
    this.hiddenStates = eagleHiddenStates(head.config);
    this.runner = new EagleHeadRunner(head, blockSize, numBlocks, kvDtype);
  }

  /** Captures the head's steps as step graphs (EagleHeadRunner.capture); false when they run eagerly. */
  captureStepGraphs(maxModelLen: number, options: HeadCaptureOptions): boolean {
    return this.runner.capture(maxModelLen, options);
  }

  get numFreeBlocks(): number {
    return this.kv.numFree;
  }

  get numTracked(): number {
    return this.kv.states.size;
  }

  observe(requestId: string, start: number, rows: Float32Array, n: number): void {
    const width = rows.length / Math.max(1, n);
    let st = this.kv.states.get(requestId);
    // rows before the head's sequence, or after a gap: it starts over from these
    if (st !== undefined && (start < st.base || start > st.base + st.computed + st.pending.length)) {
      this.kv.release(requestId);
      st = undefined;
    }
    if (st === undefined) {
      st = { blocks: [], computed: 0, base: start, pending: [], last: null };
      this.kv.states.set(requestId, st);
    }
    const at = start - st.base;
    if (at < st.computed) {
      // positions computed again (a recompute after preemption): fed again
      st.computed = at;
      st.pending = [];
      st.last = null;
    } else st.pending.length = at - st.computed;
    for (let j = 0; j < n; j++) st.pending.push(rows.slice(j * width, (j + 1) * width));
  }

  propose(requests: readonly DraftRequest[], running: ReadonlySet<string>): Map<string, number[]> {
    this.kv.keepOnly(running);
    const drafts = new Map<string, number[]>();
    // what each request feeds: head positions from st.computed to `end` (exclusive), with tokens[base + p + 1]
    const feeds: { r: DraftRequest; st: EagleState; end: number; drafting: boolean }[] = [];
    for (const r of requests) {
      drafts.set(r.requestId, []);
      const st = this.kv.states.get(r.requestId);
      if (st === undefined) continue;
      const N = r.tokens.length;
      let end = Math.min(st.computed + st.pending.length, N - 1 - st.base);
      let drafting = r.k > 0 && end === N - 1 - st.base;
      if (drafting && end === st.computed) {
        // nothing new since the last drafts (the request was not scheduled): the last position again
        if (st.last === null || st.computed === 0) drafting = false;
        else {
          st.computed--;
          st.pending.unshift(st.last);
        }
      }
      if (end <= st.computed && !drafting) continue;
      end = Math.max(end, st.computed);
      // K/V of positions up to end - 1, and to N - 3 + k for the drafts (the last draft is not fed)
      if (!this.kv.grow(st, Math.max(end, drafting ? N - 2 + r.k - st.base : 0))) {
        this.kv.release(r.requestId); // no room: it starts over from the next rows
        continue;
      }
      feeds.push({ r, st, end, drafting });
    }
    noGrad(() => {
      const next = new Map<string, Float32Array>(); // the head's own output row at the last position fed, per request
      // the served model's rows, in chunks of at most maxTokensPerStep positions
      for (let pending = feeds.filter((f) => f.end > f.st.computed); pending.length > 0; ) {
        const batch: { f: (typeof feeds)[number]; n: number }[] = [];
        let budget = this.maxTokensPerStep;
        for (const f of pending) {
          if (budget <= 0) break;
          const n = Math.min(f.end - f.st.computed, budget);
          budget -= n;
          batch.push({ f, n });
        }
        const seqs = batch.map(({ f, n }): HeadFeed => {
          const p0 = f.st.computed;
          const ids = Array.from({ length: n }, (_, j) => f.r.tokens[f.st.base + p0 + j + 1]!);
          return { st: f.st, ids, rows: f.st.pending.slice(0, n), start: p0, read: f.drafting && p0 + n === f.end };
        });
        const out = this.run(seqs, true);
        batch.forEach(({ f, n }, i) => {
          f.st.last = f.st.pending[n - 1]!;
          f.st.pending.splice(0, n);
          f.st.computed += n;
          const o = out[i];
          if (o !== undefined) {
            drafts.get(f.r.requestId)!.push(o.token);
            next.set(f.r.requestId, o.hidden);
          }
        });
        pending = pending.filter((f) => f.end > f.st.computed);
      }
      // then each draft fed in turn with the head's own hidden state, at positions the verify step will overwrite
      for (let j = 1; ; j++) {
        const more = feeds.filter(({ r, drafting }) => drafting && r.k > j && next.has(r.requestId));
        if (more.length === 0) break;
        const out = this.run(more.map(({ r, st }) => ({ st, ids: [drafts.get(r.requestId)![j - 1]!], rows: [next.get(r.requestId)!], start: st.computed + j - 1, read: true })), false);
        more.forEach(({ r }, i) => {
          drafts.get(r.requestId)!.push(out[i]!.token);
          next.set(r.requestId, out[i]!.hidden);
        });
      }
    });
    return drafts;
  }

  /** One head forward over `seqs` (`target`: their rows are the served model's); each read sequence's output. */
  private run(seqs: readonly HeadFeed[], target: boolean): (HeadOutput | undefined)[] {
    return this.runner.run(seqs.map((s) => ({ ...s, blockTable: s.st.blocks, slots: this.kv.slots(s.st, s.start, s.ids.length) })), target);
  }

  /** Sleep mode: frees the head's KV cache; drafting starts over after restoreKvCache(). */
  releaseKvCache(): void {
    this.kv.releaseAll();
    this.runner.releaseKvCache();
  }

  restoreKvCache(): void {
    this.runner.restoreKvCache();
  }

  dispose(): void {
    this.kv.releaseAll();
    this.runner.dispose();
  }
}
