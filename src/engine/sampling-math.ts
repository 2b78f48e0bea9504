// The per-row sampling math in plain TS: the reference (and the fallback without the native addon) of the
// batched kernel in native/sampling.cc, plus log_softmax logprobs. Sampler (sampler.ts) drives them.

export interface LogprobsEntry {
  tokenIds: number[];
  logprobs: number[];
  ranks: number[];
}

/**
 * top-k then top-p on one row, masking dropped tokens to -Infinity, without sorting the vocabulary.
 * top-k keeps every token >= the k-th largest finite logit (ties kept, as vLLM). top-p over those
 * candidates: walking them in descending order, a token is kept while the mass walked before it is
 * < top_p x S, where S = sum of exp(l - max) over the candidates in token-id order; every token >= the last
 * kept one survives (ties kept). Candidates are selected in growing chunks (64, then doubling the total) by
 * quickselect and only each chunk is sorted, since the nucleus is usually a small part of the vocabulary.
 * `topKTopPReference` (below) is the full-sort definition that tests compare against.
 *
 * @param scratch at least l.length floats.
 */
export function applyTopKTopP(l: Float32Array, topK: number, topP: number, scratch: Float32Array): void {
  const s = scratch;
  let n = 0;
  let max = -Infinity;
  for (let v = 0; v < l.length; v++) {
    const x = l[v]!;
    if (x > -Infinity) {
      s[n++] = x;
      if (x > max) max = x;
    }
  }
  if (n === 0) return;
  let m = n; // candidates: s[0, m) after the top-k partition
  let kth = -Infinity;
  if (topK > 0 && topK < n) {
    selectLargest(s, 0, n, topK);
    m = topK;
    kth = minOf(s, 0, m);
  }
  if (topP >= 1) {
    if (kth > -Infinity) maskBelow(l, kth);
    return;
  }
  let total = 0; // token-id order, so the sum does not depend on how candidates were selected
  for (let v = 0; v < l.length; v++) {
    const x = l[v]!;
    if (x >= kth) total += Math.exp(x - max);
  }
  const target = topP * total;
  let cum = 0;
  let cut = s[0]!; // overwritten: the first chunk is non-empty and its largest entry is always kept
  let done = 0;
  for (let chunk = Math.min(64, m); ; chunk = done) {
    const hi = Math.min(m, done + chunk);
    if (hi < m) selectLargest(s, done, m, hi - done);
    const part = s.subarray(done, hi).sort(); // ascending; walked from its end
    for (let j = part.length - 1; j >= 0; j--) {
      if (cum >= target) {
        maskBelow(l, cut);
        return;
      }
      cut = part[j]!;
      cum += Math.exp(cut - max);
    }
    done = hi;
    if (done === m) break;
  }
  maskBelow(l, cut);
}

/**
 * The full-sort definition of {@link applyTopKTopP}: slow and plain, kept for tests (STYLE.md 9). Its
 * descending walk adds the same values in the same order as the fast path (ties are equal addends), so the
 * two agree exactly; walking the top-k ties past the k-th entry cannot move the cut below the k-th value.
 */
export function topKTopPReference(l: Float32Array, topK: number, topP: number): void {
  const desc = Array.from(l)
    .filter((x) => x > -Infinity)
    .sort((a, b) => b - a);
  if (desc.length === 0) return;
  const max = desc[0]!;
  const kth = topK > 0 && topK < desc.length ? desc[topK - 1]! : -Infinity;
  if (topP >= 1) {
    for (let v = 0; v < l.length; v++) if (l[v]! < kth) l[v] = -Infinity;
    return;
  }
  let total = 0;
  for (let v = 0; v < l.length; v++) if (l[v]! >= kth) total += Math.exp(l[v]! - max);
  let cum = 0;
  let cut = max;
  for (const x of desc) {
    if (x < kth || cum >= topP * total) break;
    cut = x;
    cum += Math.exp(x - max);
  }
  for (let v = 0; v < l.length; v++) if (l[v]! < cut) l[v] = -Infinity;
}

function maskBelow(l: Float32Array, cut: number): void {
  for (let v = 0; v < l.length; v++) if (l[v]! < cut) l[v] = -Infinity;
}

function minOf(a: Float32Array, lo: number, hi: number): number {
  let m = Infinity;
  for (let i = lo; i < hi; i++) if (a[i]! < m) m = a[i]!;
  return m;
}

/** Quickselect (Wirth): rearranges a[lo, hi) so that a[lo, lo + k) holds its k largest values, in no order. */
function selectLargest(a: Float32Array, lo: number, hi: number, k: number): void {
  const target = lo + k - 1; // the k-th largest lands here
  let left = lo;
  let right = hi - 1;
  while (left < right) {
    const pivot = a[target]!;
    let i = left;
    let j = right;
    do {
      while (a[i]! > pivot) i++;
      while (pivot > a[j]!) j--;
      if (i <= j) {
        const t = a[i]!;
        a[i] = a[j]!;
        a[j] = t;
        i++;
        j--;
      }
    } while (i <= j);
    if (j < target) left = i;
    if (target < i) right = j;
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
export function applyMinP(l: Float32Array, minP: number): void {
  let max = -Infinity;
  for (let v = 0; v < l.length; v++) if (l[v]! > max) max = l[v]!;
  const cut = max + Math.log(minP); // p_v / p_max < minP  <=>  l_v < max + log(minP)
  for (let v = 0; v < l.length; v++) if (l[v]! < cut) l[v] = -Infinity;
}

/** Inverse-CDF draw in token-id order with one uniform `u` in [0, 1). */
export function drawFromLogits(l: Float32Array, u: number): number {
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
