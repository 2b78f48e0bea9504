// Batched sampling over a [numRows, vocab] logits buffer, in vLLM v1's order:
//   structured output's grammar mask -> allowed_token_ids -> bad_words -> logit_bias -> min_tokens -> engine logits processors (non-argmax-invariant)
//   -> per-request logits processor functions -> penalties (repetition, frequency, presence)
//   -> [greedy: argmax] | [temperature -> engine processors (argmax-invariant) -> min_p -> top_k -> top_p -> draw]
// Logprobs follow vLLM's logprobs_mode: "raw_logprobs" (the default) is log_softmax of the model's logits as they
// came, before any step above; "processed_logprobs" that of the logits after every step (after temperature and the
// top-k/top-p/min-p masks for random rows; masked tokens get -Infinity). Prompt logprobs are raw, as in vLLM.
// Scratch buffers are allocated once per vocab size and reused for every row and step.
// When the native addon is loaded, temperature, greedy argmax, min_p, top-k/top-p and the draw run as one
// batched kernel over all rows (native/sampling.cc); the JS functions below are its reference and fallback.
import { tryLoadNativeKernels, type NativeKernels } from "../backends/cpu/native.js";
import {
  LogitsProcessorSet,
  instantiateLogitsProcessors,
  type LogitsProcessorInput,
  type LogitsProcessorRow,
  type ProcessorRequestSource,
} from "./logits-processors.js";
import { isGreedy } from "./sampling-params.js";
import { applyMinP, applyTopKTopP, argmax, computeLogprobs, drawFromLogits, type LogprobsEntry } from "./sampling-math.js";
import type { Rng } from "./rng.js";
import type { SamplingParams } from "./types.js";

export type { LogitsProcessorInput } from "./logits-processors.js";
export { applyTopKTopP, topKTopPReference, argmax, logSumExp, computeLogprobs, type LogprobsEntry } from "./sampling-math.js";

/** What the sampler needs to know about one row's request (the engine's Request satisfies it). */
export interface SamplingRow extends ProcessorRequestSource {
  params: SamplingParams;
  promptTokenIds: readonly number[];
  outputTokenIds: readonly number[];
  /** The request's own generator when seeded, else null (the sampler's shared generator is used). */
  generator: Rng | null;
  badWordsTokenIds: readonly (readonly number[])[];
  eosTokenIds: readonly number[];
  /** Structured output: masks the tokens its grammar does not allow next. */
  grammar?: { applyMask(logits: Float32Array): void } | null;
  /** Prompt runs given as embeddings (MultiModalFeature.inputEmbeds): their placeholder ids are no prompt tokens. */
  mmFeatures?: readonly { offset: number; length: number; inputEmbeds?: Float32Array }[];
}

/** vLLM's --logprobs-mode values that Kiln serves (raw_logits and processed_logits are not). */
export const LOGPROBS_MODES = ["raw_logprobs", "processed_logprobs"] as const;
export type LogprobsMode = (typeof LOGPROBS_MODES)[number];

export interface SampledToken {
  tokenId: number;
  /** Present when the request asked for logprobs. */
  logprobs: LogprobsEntry | null;
}

/** The native batched sampling kernel (native/sampling.h), or null to sample in JS. */
export type SampleRowsKernel = NonNullable<NativeKernels["sampleRows"]>;

/** `stages` of {@link SampleRowsKernel}. */
const Stage = { scale: 1, draw: 2, all: 3 } as const;

/** The addon's kernel when the addon is built and has it, else null. */
export function nativeSampleRows(): SampleRowsKernel | null {
  const k = tryLoadNativeKernels();
  return typeof k?.sampleRows === "function" ? k.sampleRows.bind(k) : null;
}

/** Per-row arguments of the native kernel for up to `capacity` rows. */
class RowParams {
  readonly temperature: Float64Array; // 0 = greedy
  readonly topK: Int32Array;
  readonly topP: Float64Array;
  readonly minP: Float64Array;
  readonly uniform: Float64Array;
  readonly tokenIds: Int32Array; // the kernel's output

  constructor(readonly capacity: number) {
    this.temperature = new Float64Array(capacity);
    this.topK = new Int32Array(capacity);
    this.topP = new Float64Array(capacity);
    this.minP = new Float64Array(capacity);
    this.uniform = new Float64Array(capacity);
    this.tokenIds = new Int32Array(capacity);
  }
}

export class Sampler {
  /** The engine-level logits processors (vLLM `logits_processors`). */
  readonly logitsProcessors: LogitsProcessorSet;
  private readonly banned: Uint8Array; // allowed_token_ids mask scratch
  private readonly seen: Uint8Array; // token occurs in prompt or output
  private readonly counts: Int32Array; // occurrences in output
  private readonly candidates: Float32Array; // top-k / top-p selection scratch
  private rowParams = new RowParams(0); // native kernel arguments, grown to the largest batch
  private rawRows: Float32Array[] = []; // raw_logprobs: copies of the logits of this step's rows that want logprobs
  private raw: (Float32Array | null)[] = []; // per row of the step: its copy, or null

  /**
   * @param vocabSize row width of the logits buffers.
   * @param generator the engine generator used by unseeded rows (engine `seed` arg).
   * @param logitsProcessors engine-level processors: instances, or classes constructed here with {vocabSize}.
   * @param native the batched sampling kernel (default: the addon's when loaded); null samples in JS.
   * @param logprobsMode what logprobs report (see the file comment).
   */
  constructor(
    readonly vocabSize: number,
    private readonly generator: Rng,
    logitsProcessors: readonly LogitsProcessorInput[] = [],
    readonly native: SampleRowsKernel | null = nativeSampleRows(),
    readonly logprobsMode: LogprobsMode = "raw_logprobs",
  ) {
    this.logitsProcessors = new LogitsProcessorSet(instantiateLogitsProcessors(logitsProcessors, { vocabSize }));
    this.banned = new Uint8Array(vocabSize);
    this.seen = new Uint8Array(vocabSize);
    this.counts = new Int32Array(vocabSize);
    this.candidates = new Float32Array(vocabSize);
  }

  /**
   * Runs the engine processors' validateParams on a request's params; throws EngineInputError (`extra_args`).
   * Call it before adding the request to the engine.
   */
  validateParams(params: Partial<SamplingParams>): void {
    this.logitsProcessors.validateParams(params);
  }

  /**
   * Whether the row's token is the plain argmax of its raw logits (greedy, no logprobs, masks, bias,
   * penalties, pending min_tokens or processors): then the device may sample it.
   */
  isPlainGreedy(row: SamplingRow): boolean {
    const p = row.params;
    return (
      isGreedy(p) &&
      p.logprobs === null &&
      p.allowedTokenIds === null &&
      p.logitBias === null &&
      row.badWordsTokenIds.length === 0 &&
      row.outputTokenIds.length >= p.minTokens &&
      p.repetitionPenalty === 1 &&
      p.frequencyPenalty === 0 &&
      p.presencePenalty === 0 &&
      p.logitsProcessors.length === 0 &&
      (row.grammar ?? null) === null &&
      this.logitsProcessors.size === 0
    );
  }

  /** Samples one token per row. Edits `logits` in place (it ends up holding the processed logits). */
  sample(logits: Float32Array, rows: readonly SamplingRow[]): SampledToken[] {
    const V = this.vocabSize;
    if (logits.length !== rows.length * V) throw new Error(`[sampler] logits has ${logits.length} values, expected ${rows.length} x ${V}`);
    const procs = this.logitsProcessors;
    const procRows: LogitsProcessorRow[] | null = procs.size > 0 ? procs.rowsFor(rows) : null;
    this.raw.length = rows.length;
    for (let r = 0, k = 0; r < rows.length; r++) {
      if (this.logprobsMode !== "raw_logprobs" || rows[r]!.params.logprobs === null) {
        this.raw[r] = null;
        continue;
      }
      const copy = (this.rawRows[k++] ??= new Float32Array(V));
      copy.set(logits.subarray(r * V, (r + 1) * V));
      this.raw[r] = copy;
    }
    for (let r = 0; r < rows.length; r++) this.applyMasksAndBias(logits.subarray(r * V, (r + 1) * V), rows[r]!);
    if (procRows !== null) for (const p of procs.nonArgmaxInvariant) p.apply(logits, procRows, V);
    for (let r = 0; r < rows.length; r++) {
      const sr = rows[r]!;
      const l = logits.subarray(r * V, (r + 1) * V);
      const p = sr.params;
      for (const f of p.logitsProcessors) f(sr.outputTokenIds, l);
      if (p.repetitionPenalty !== 1 || p.frequencyPenalty !== 0 || p.presencePenalty !== 0) this.applyPenalties(l, sr);
    }
    return this.native === null ? this.sampleJs(logits, rows, procRows) : this.sampleNative(this.native, logits, rows, procRows);
  }

  /** The reference path: [greedy: argmax] | [temperature -> argmax-invariant processors -> min_p -> top-k/p -> draw]. */
  private sampleJs(logits: Float32Array, rows: readonly SamplingRow[], procRows: LogitsProcessorRow[] | null): SampledToken[] {
    const V = this.vocabSize;
    const row = (r: number): Float32Array => logits.subarray(r * V, (r + 1) * V);
    const out: SampledToken[] = new Array<SampledToken>(rows.length);
    let anyRandom = false;
    for (let r = 0; r < rows.length; r++) {
      const p = rows[r]!.params;
      const l = row(r);
      if (isGreedy(p)) {
        out[r] = this.token(l, argmax(l), p, r);
      } else {
        anyRandom = true;
        if (p.temperature !== 1) {
          const inv = 1 / p.temperature;
          for (let v = 0; v < V; v++) l[v]! *= inv;
        }
      }
    }
    if (!anyRandom) return out;
    // Argmax-invariant processors see the whole batch, as in vLLM; greedy rows are already decided.
    if (procRows !== null) for (const p of this.logitsProcessors.argmaxInvariant) p.apply(logits, procRows, V);
    for (let r = 0; r < rows.length; r++) {
      const sr = rows[r]!;
      const p = sr.params;
      if (isGreedy(p)) continue;
      const l = row(r);
      if (p.minP > 0) applyMinP(l, p.minP);
      if (p.topK > 0 || p.topP < 1) applyTopKTopP(l, p.topK, p.topP, this.candidates);
      out[r] = this.token(l, drawFromLogits(l, (sr.generator ?? this.generator).nextFloat()), p, r);
    }
    return out;
  }

  /**
   * The same steps as {@link sampleJs} as one kernel call over the batch, or two (scale; draw) when
   * argmax-invariant processors must run between them. Uniforms are drawn in row order, as the JS path does.
   */
  private sampleNative(
    kernel: SampleRowsKernel,
    logits: Float32Array,
    rows: readonly SamplingRow[],
    procRows: LogitsProcessorRow[] | null,
  ): SampledToken[] {
    const V = this.vocabSize;
    const n = rows.length;
    if (this.rowParams.capacity < n) this.rowParams = new RowParams(Math.max(n, 2 * this.rowParams.capacity));
    const a = this.rowParams;
    let anyRandom = false;
    for (let r = 0; r < n; r++) {
      const p = rows[r]!.params;
      const greedy = isGreedy(p);
      anyRandom ||= !greedy;
      a.temperature[r] = greedy ? 0 : p.temperature;
      a.topK[r] = Math.min(p.topK, V); // top_k >= vocab keeps everything, as 0 does
      a.topP[r] = p.topP;
      a.minP[r] = p.minP;
    }
    const invariant = procRows !== null && anyRandom ? this.logitsProcessors.argmaxInvariant : [];
    const call = (stages: (typeof Stage)[keyof typeof Stage]): void =>
      kernel(logits, n, V, a.temperature, a.topK, a.topP, a.minP, a.uniform, a.tokenIds, stages);
    const out: SampledToken[] = new Array<SampledToken>(n);
    const finish = (greedy: boolean): void => {
      for (let r = 0; r < n; r++)
        if (isGreedy(rows[r]!.params) === greedy) out[r] = this.token(logits.subarray(r * V, (r + 1) * V), a.tokenIds[r]!, rows[r]!.params, r);
    };
    if (invariant.length > 0) {
      call(Stage.scale);
      finish(true); // greedy logprobs before the processors edit the batch
      for (const p of invariant) p.apply(logits, procRows!, V);
    }
    for (let r = 0; r < n; r++) {
      const sr = rows[r]!;
      a.uniform[r] = isGreedy(sr.params) ? 0 : (sr.generator ?? this.generator).nextFloat();
    }
    call(invariant.length > 0 ? Stage.draw : Stage.all);
    if (invariant.length === 0) finish(true);
    finish(false);
    return out;
  }

  /** The sampled token of processed row r, with logprobs (of its raw copy in raw_logprobs mode) when asked for. */
  private token(l: Float32Array, tokenId: number, p: SamplingParams, r: number): SampledToken {
    return { tokenId, logprobs: p.logprobs === null ? null : computeLogprobs(this.raw[r] ?? l, tokenId, p.logprobs) };
  }

  /** The grammar's mask, allowed_token_ids, bad_words, logit_bias and min_tokens: the built-in steps before the processors. */
  private applyMasksAndBias(l: Float32Array, row: SamplingRow): void {
    const p = row.params;
    const V = this.vocabSize;
    row.grammar?.applyMask(l);
    if (p.allowedTokenIds !== null) {
      const banned = this.banned;
      banned.fill(1);
      for (const t of p.allowedTokenIds) banned[t] = 0;
      for (let v = 0; v < V; v++) if (banned[v]) l[v] = -Infinity;
    }
    const out = row.outputTokenIds;
    for (const word of row.badWordsTokenIds) {
      // Ban the word's last token when the output ends with the rest of the word.
      const n = word.length - 1;
      if (n > out.length) continue;
      let match = true;
      for (let i = 0; i < n && match; i++) match = out[out.length - n + i] === word[i];
      if (match) l[word[n]!] = -Infinity;
    }
    if (p.logitBias !== null) for (const [k, b] of Object.entries(p.logitBias)) l[Number(k)]! += b;
    if (out.length < p.minTokens) {
      const ids = p.ignoreEos ? p.stopTokenIds : [...p.stopTokenIds, ...row.eosTokenIds];
      const kept = row.grammar ? ids.map((t) => l[t]!) : null;
      for (const t of ids) l[t] = -Infinity;
      // a complete structured output allows only its stop tokens: it ends there, min_tokens or not
      if (kept !== null && !l.some((x) => x > -Infinity)) ids.forEach((t, i) => (l[t] = kept[i]!));
    }
  }

  /** vLLM apply_penalties: repetition over prompt+output (divide positive, multiply negative), then frequency and presence over output. */
  private applyPenalties(l: Float32Array, row: SamplingRow): void {
    const p = row.params;
    const { seen, counts } = this;
    const out = row.outputTokenIds;
    if (p.repetitionPenalty !== 1) {
      const prompt = promptTokensForPenalties(row);
      for (const t of prompt) seen[t] = 1;
      for (const t of out) seen[t] = 1;
      const rp = p.repetitionPenalty;
      const apply = (t: number): void => {
        if (seen[t] === 0) return; // already penalized (duplicate occurrence)
        seen[t] = 0;
        const x = l[t]!;
        l[t] = x > 0 ? x / rp : x * rp;
      };
      for (const t of prompt) apply(t);
      for (const t of out) apply(t);
    }
    if (p.frequencyPenalty !== 0 || p.presencePenalty !== 0) {
      for (const t of out) counts[t]!++;
      for (const t of out) {
        const c = counts[t]!;
        if (c === 0) continue;
        counts[t] = 0; // reset scratch as we go; each token penalized once
        l[t]! -= p.frequencyPenalty * c + p.presencePenalty;
      }
    }
  }
}


/** The row's prompt token ids that the repetition penalty counts: all but the placeholders of prompt embeddings. */
function promptTokensForPenalties(row: SamplingRow): readonly number[] {
  const embedded = row.mmFeatures?.filter((f) => f.inputEmbeds !== undefined) ?? [];
  if (embedded.length === 0) return row.promptTokenIds;
  return row.promptTokenIds.filter((_, i) => !embedded.some((f) => i >= f.offset && i < f.offset + f.length));
}
