// Batched sampling over a [numRows, vocab] logits buffer, in vLLM v1's order:
//   allowed_token_ids -> bad_words -> logit_bias -> min_tokens -> penalties (repetition, frequency, presence)
//   -> per-request logits processors -> [greedy: argmax] | [temperature -> min_p -> top_k -> top_p -> draw]
// Logprobs are "processed" logprobs (vLLM logprobs_mode=processed_logprobs): log_softmax of the logits after
// every step above (after temperature and the top-k/top-p/min-p masks for random rows; masked tokens get
// -Infinity). vLLM's default is raw logprobs of the model; prompt logprobs here are raw (unprocessed), as in vLLM.
// Scratch buffers are allocated once per vocab size and reused for every row and step.
import { isGreedy } from "./sampling-params.js";
import type { Rng } from "./rng.js";
import type { SamplingParams } from "./types.js";

/** What the sampler needs to know about one row's request. */
export interface SamplingRow {
  params: SamplingParams;
  promptTokenIds: readonly number[];
  outputTokenIds: readonly number[];
  /** The request's own generator when seeded, else null (the sampler's shared generator is used). */
  generator: Rng | null;
  badWordsTokenIds: readonly (readonly number[])[];
  eosTokenIds: readonly number[];
}

/** Logprobs of one position: entry 0 is the chosen token, then the top-N by logprob (ties: lower id first). */
export interface LogprobsEntry {
  tokenIds: number[];
  logprobs: number[];
  ranks: number[];
}

export interface SampledToken {
  tokenId: number;
  /** Present when the request asked for logprobs. */
  logprobs: LogprobsEntry | null;
}

export class Sampler {
  private readonly banned: Uint8Array; // allowed_token_ids mask scratch
  private readonly seen: Uint8Array; // token occurs in prompt or output
  private readonly counts: Int32Array; // occurrences in output
  private readonly sorted: Float32Array; // sort scratch for top-k / top-p

  /**
   * @param vocabSize row width of the logits buffers.
   * @param generator the engine generator used by unseeded rows (engine `seed` arg).
   */
  constructor(
    readonly vocabSize: number,
    private readonly generator: Rng,
  ) {
    this.banned = new Uint8Array(vocabSize);
    this.seen = new Uint8Array(vocabSize);
    this.counts = new Int32Array(vocabSize);
    this.sorted = new Float32Array(vocabSize);
  }

  /** Samples one token per row. Edits `logits` in place (it ends up holding the processed logits). */
  sample(logits: Float32Array, rows: readonly SamplingRow[]): SampledToken[] {
    const V = this.vocabSize;
    if (logits.length !== rows.length * V) throw new Error(`[sampler] logits has ${logits.length} values, expected ${rows.length} x ${V}`);
    const out: SampledToken[] = [];
    for (let r = 0; r < rows.length; r++) {
      const row = rows[r]!;
      const l = logits.subarray(r * V, (r + 1) * V);
      this.applyLogitsProcessing(l, row);
      const p = row.params;
      let tokenId: number;
      if (isGreedy(p)) {
        tokenId = argmax(l);
      } else {
        if (p.temperature !== 1) {
          const inv = 1 / p.temperature;
          for (let v = 0; v < V; v++) l[v]! *= inv;
        }
        if (p.minP > 0) applyMinP(l, p.minP);
        if (p.topK > 0 || p.topP < 1) this.applyTopKTopP(l, p.topK, p.topP);
        tokenId = drawFromLogits(l, (row.generator ?? this.generator).nextFloat());
      }
      out.push({ tokenId, logprobs: p.logprobs === null ? null : computeLogprobs(l, tokenId, p.logprobs) });
    }
    return out;
  }

  /** Everything before temperature: masks, bias, penalties and custom processors. Exposed for tests. */
  applyLogitsProcessing(l: Float32Array, row: SamplingRow): void {
    const p = row.params;
    const V = this.vocabSize;
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
      for (const t of p.stopTokenIds) l[t] = -Infinity;
      if (!p.ignoreEos) for (const t of row.eosTokenIds) l[t] = -Infinity;
    }
    if (p.repetitionPenalty !== 1 || p.frequencyPenalty !== 0 || p.presencePenalty !== 0) this.applyPenalties(l, row);
    for (const f of p.logitsProcessors) f(out, l);
  }

  /** vLLM apply_penalties: repetition over prompt+output (divide positive, multiply negative), then frequency and presence over output. */
  private applyPenalties(l: Float32Array, row: SamplingRow): void {
    const p = row.params;
    const { seen, counts } = this;
    const out = row.outputTokenIds;
    if (p.repetitionPenalty !== 1) {
      for (const t of row.promptTokenIds) seen[t] = 1;
      for (const t of out) seen[t] = 1;
      const rp = p.repetitionPenalty;
      const apply = (t: number): void => {
        if (seen[t] === 0) return; // already penalized (duplicate occurrence)
        seen[t] = 0;
        const x = l[t]!;
        l[t] = x > 0 ? x / rp : x * rp;
      };
      for (const t of row.promptTokenIds) apply(t);
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

  /** Masks all but the top-k logits (ties with the k-th kept), then the smallest set with cumulative prob >= top_p. */
  private applyTopKTopP(l: Float32Array, topK: number, topP: number): void {
    let n = 0;
    const s = this.sorted;
    for (let v = 0; v < l.length; v++) if (l[v]! > -Infinity) s[n++] = l[v]!;
    const vals = s.subarray(0, n);
    vals.sort(); // ascending, native
    let lo = 0; // vals[lo..n) survive
    if (topK > 0 && topK < n) lo = n - topK;
    if (topP < 1) {
      const max = vals[n - 1]!;
      let sum = 0;
      for (let i = lo; i < n; i++) sum += Math.exp(vals[i]! - max);
      // Ascending cumulative mass; drop entries while it stays <= 1 - p, always keeping the largest.
      let cum = 0;
      const limit = (1 - topP) * sum;
      let i = lo;
      while (i < n - 1) {
        cum += Math.exp(vals[i]! - max);
        if (cum > limit) break;
        i++;
      }
      lo = i;
    }
    if (lo === 0) return;
    const cut = vals[lo]!;
    for (let v = 0; v < l.length; v++) if (l[v]! < cut) l[v] = -Infinity;
  }
}

/** Index of the largest value; lowest index on ties. */
export function argmax(l: Float32Array): number {
  let best = 0;
  let bv = l[0]!;
  for (let v = 1; v < l.length; v++)
    if (l[v]! > bv) {
      bv = l[v]!;
      best = v;
    }
  return best;
}

/** log(sum(exp(l))), stable; -Infinity if every entry is -Infinity. */
export function logSumExp(l: Float32Array): number {
  let max = -Infinity;
  for (let v = 0; v < l.length; v++) if (l[v]! > max) max = l[v]!;
  if (max === -Infinity) return -Infinity;
  let sum = 0;
  for (let v = 0; v < l.length; v++) sum += Math.exp(l[v]! - max);
  return max + Math.log(sum);
}

/** min_p: drop tokens whose probability is below minP x the top probability (on temperature-scaled logits). */
function applyMinP(l: Float32Array, minP: number): void {
  let max = -Infinity;
  for (let v = 0; v < l.length; v++) if (l[v]! > max) max = l[v]!;
  const cut = max + Math.log(minP); // p_v / p_max < minP  <=>  l_v < max + log(minP)
  for (let v = 0; v < l.length; v++) if (l[v]! < cut) l[v] = -Infinity;
}

/** Inverse-CDF draw in token-id order with one uniform `u` in [0, 1). */
function drawFromLogits(l: Float32Array, u: number): number {
  let max = -Infinity;
  for (let v = 0; v < l.length; v++) if (l[v]! > max) max = l[v]!;
  let sum = 0;
  for (let v = 0; v < l.length; v++) sum += Math.exp(l[v]! - max);
  const target = u * sum;
  let cum = 0;
  let last = 0;
  for (let v = 0; v < l.length; v++) {
    const x = l[v]!;
    if (x === -Infinity) continue;
    cum += Math.exp(x - max);
    last = v;
    if (cum > target) return v;
  }
  return last; // rounding: u*sum landed past the final cumulative sum
}

/**
 * Logprob and rank of `tokenId` plus the top `n` entries of log_softmax(l). Rank = 1 + number of tokens with a
 * strictly larger logprob (vLLM's definition).
 */
export function computeLogprobs(l: Float32Array, tokenId: number, n: number): LogprobsEntry {
  const logZ = logSumExp(l);
  const x = l[tokenId]!;
  let rank = 1;
  for (let v = 0; v < l.length; v++) if (l[v]! > x) rank++;
  const entry: LogprobsEntry = { tokenIds: [tokenId], logprobs: [x - logZ], ranks: [rank] };
  if (n > 0) {
    // Keep the n best (value desc, id asc) by insertion into a short sorted list.
    const ids: number[] = [];
    const vals: number[] = [];
    for (let v = 0; v < l.length; v++) {
      const y = l[v]!;
      if (ids.length === n && !(y > vals[n - 1]!)) continue;
      let i = ids.length;
      while (i > 0 && y > vals[i - 1]!) i--;
      ids.splice(i, 0, v);
      vals.splice(i, 0, y);
      if (ids.length > n) {
        ids.pop();
        vals.pop();
      }
    }
    for (let i = 0; i < ids.length; i++) {
      entry.tokenIds.push(ids[i]!);
      entry.logprobs.push(vals[i]! - logZ);
      entry.ranks.push(i + 1 + countTiesBefore(vals, i));
    }
  }
  return entry;
}

/** Ranks of tied entries: equal values share the rank of the first of them. */
function countTiesBefore(vals: number[], i: number): number {
  let k = 0;
  while (i - k - 1 >= 0 && vals[i - k - 1] === vals[i]) k++;
  return -k;
}
