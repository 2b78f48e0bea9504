// The pure-TypeScript reference of every primitive kernel: slow, readable, computed in float64.
// Native kernels are tested against these (STYLE.md 9).
import type { BinaryOp, BufferView, KernelCall, PagedAttentionArgs, QuantizedRowsView, ReduceOp, UnaryOp } from "../backend.js";
import { f32ToFp8Bits, isComparison, isFloating, promoteTypes, type DType } from "../dtype.js";
import { floatToInt, integerBinary, wrapsInInt32 } from "../int-math.js";
import { forEachIndex, getter, numel, rawArray, readF64, setter, writeDense } from "./host-memory.js";
import { quantizeActivationsRef } from "../quant-activations.js";
import { flashAttentionBackwardReference, flashAttentionReference } from "./flash-attention-reference.js";
import { moeReference } from "./moe-reference.js";

function erf(x: number): number {
  // Abramowitz-Stegun 7.1.26 is only 1.5e-7 accurate; use a series/continued fraction split for ~1e-15.
  const ax = Math.abs(x);
  if (ax < 2.5) {
    // Maclaurin series: erf(x) = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1))
    let term = ax;
    let sum = ax;
    const x2 = ax * ax;
    for (let n = 1; n < 80; n++) {
      term *= -x2 / n;
      const add = term / (2 * n + 1);
      sum += add;
      if (Math.abs(add) < 1e-17 * Math.abs(sum)) break;
    }
    const r = (2 / Math.sqrt(Math.PI)) * sum;
    return x < 0 ? -r : r;
  }
  // erfc continued fraction (Lentz) for large |x|
  let f = ax;
  let c = ax;
  let d = 0;
  for (let i = 1; i < 200; i++) {
    const an = i / 2;
    d = ax + an * d;
    d = 1 / d;
    c = ax + an / c;
    const delta = c * d;
    f *= delta;
    if (Math.abs(delta - 1) < 1e-16) break;
  }
  const erfc = Math.exp(-ax * ax) / (f * Math.sqrt(Math.PI));
  const r = 1 - erfc;
  return x < 0 ? -r : r;
}

export const UNARY: Record<UnaryOp, (x: number) => number> = {
  neg: (x) => -x,
  exp: Math.exp,
  log: Math.log,
  sqrt: Math.sqrt,
  rsqrt: (x) => 1 / Math.sqrt(x),
  tanh: Math.tanh,
  sigmoid: (x) => 1 / (1 + Math.exp(-x)),
  silu: (x) => x / (1 + Math.exp(-x)),
  gelu: (x) => 0.5 * x * (1 + erf(x / Math.SQRT2)),
  gelu_tanh: (x) => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x * x * x))),
  abs: Math.abs,
  reciprocal: (x) => 1 / x,
  sin: Math.sin,
  cos: Math.cos,
  square: (x) => x * x,
  relu: (x) => (x <= 0 ? 0 : x), // NaN stays NaN, as torch
  floor: Math.floor,
  ceil: Math.ceil,
  round: (x) => {
    // round half to even, as torch.round
    const r = Math.round(x);
    return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
  },
  sign: (x) => Number(x > 0) - Number(x < 0), // torch's (0 < x) - (x < 0): NaN and -0 give 0, as the generated C
  logical_not: (x) => (x === 0 ? 1 : 0), // NaN is true, as any nonzero (torch)
};

export const BINARY: Record<BinaryOp, (a: number, b: number) => number> = {
  add: (a, b) => a + b,
  sub: (a, b) => a - b,
  mul: (a, b) => a * b,
  div: (a, b) => a / b,
  pow: (a, b) => (a === 1 || (a === -1 && Math.abs(b) === Infinity) ? 1 : Math.pow(a, b)), // C's pow: 1^NaN = (-1)^inf = 1 (JS: NaN)
  maximum: (a, b) => (Number.isNaN(a) || Number.isNaN(b) ? NaN : Math.max(a, b)),
  minimum: (a, b) => (Number.isNaN(a) || Number.isNaN(b) ? NaN : Math.min(a, b)),
  remainder: (a, b) => {
    // torch's fmod(a, b), moved to the divisor's sign: exact, and a finite a over an infinite b stays finite (5 % inf = 5)
    const r = a % b;
    return r !== 0 && r < 0 !== b < 0 ? r + b : r;
  },
  eq: (a, b) => (a === b ? 1 : 0),
  ne: (a, b) => (a !== b ? 1 : 0),
  lt: (a, b) => (a < b ? 1 : 0),
  le: (a, b) => (a <= b ? 1 : 0),
  gt: (a, b) => (a > b ? 1 : 0),
  ge: (a, b) => (a >= b ? 1 : 0),
  logical_and: (a, b) => (a !== 0 && b !== 0 ? 1 : 0),
  logical_or: (a, b) => (a !== 0 || b !== 0 ? 1 : 0),
};

/**
 * UNARY / BINARY for a result dtype: integer square, mul and pow wrap as torch's (int-math.ts) where the float64
 * formulas would round past 2^53 (46341 ** 2 fits float64; 2147483647 ** 2 does not).
 */
export function unaryKernel(fn: UnaryOp, out: DType): (x: number) => number {
  return fn === "square" && wrapsInInt32(out) ? (x) => Math.imul(x, x) : UNARY[fn];
}

export function binaryKernel(fn: BinaryOp, out: DType): (a: number, b: number) => number {
  return integerBinary(fn, out) ?? BINARY[fn];
}

/** The dtype binary `fn` computes in: a comparison in its operands' promoted dtype, the rest in the result's. */
export function binaryComputeDtype(fn: BinaryOp, a: DType, b: DType, out: DType): DType {
  return isComparison(fn) ? promoteTypes(a, b) : out;
}

/**
 * Operand values of dtype `from` as an op computing in `computeIn` reads them: torch casts operands to that dtype, so
 * an int32 / int64 operand of a float32 op is rounded to float32 first (16777217 + 0.5 is 16777216, sin(2147483647)
 * is sin(2^31)), as the generated C converts it. A new array where values change, else `x`.
 */
export function operandValues<T extends ArrayLike<number>>(x: T, from: DType, computeIn: DType): T | Float64Array {
  return computeIn === "float32" && (from === "int32" || from === "int64") ? Float64Array.from(x, Math.fround) : x;
}

/** The values of a copy from `from` into `to`: a float cast to an integer dtype as floatToInt (NaN gives the minimum). */
function castValues(x: Float64Array, from: DType, to: DType): Float64Array {
  if (isFloating(from) && !isFloating(to) && to !== "bool") for (let i = 0; i < x.length; i++) x[i] = floatToInt(x[i]!, to);
  return x;
}

/** One row's reduction; `mul` is prod's product (binaryKernel's: an int32 product wraps). */
function reduceRow(fn: ReduceOp, x: Float64Array, start: number, n: number, mul: (a: number, b: number) => number): number {
  switch (fn) {
    case "sum": {
      let s = 0;
      for (let i = 0; i < n; i++) s += x[start + i]!;
      return s;
    }
    case "prod": {
      let s = 1;
      for (let i = 0; i < n; i++) s = mul(s, x[start + i]!);
      return s;
    }
    case "max":
    case "min": {
      let m = x[start]!;
      for (let i = 1; i < n; i++) {
        const v = x[start + i]!;
        if (Number.isNaN(v)) return NaN;
        if (fn === "max" ? v > m : v < m) m = v;
      }
      return m;
    }
    case "argmax":
    case "argmin": {
      let best = 0;
      let m = x[start]!;
      for (let i = 1; i < n; i++) {
        const v = x[start + i]!;
        if (Number.isNaN(m)) break;
        if (Number.isNaN(v) || (fn === "argmax" ? v > m : v < m)) {
          m = v;
          best = i;
        }
      }
      return best;
    }
  }
}

/** splitmix64-style mixing of (seed, counter) into a uniform double in [0, 1). Counter-based: any slice reproducible. */
export function counterUniform(seed: number, counter: number): number {
  let h = Math.imul((seed ^ 0x9e3779b9) >>> 0, 0x85ebca6b) ^ Math.imul(counter >>> 0, 0xc2b2ae35);
  h ^= Math.floor(counter / 4294967296) * 0x27d4eb2f;
  h = Math.imul(h ^ (h >>> 16), 0x7feb352d);
  h = Math.imul(h ^ (h >>> 15), 0x846ca68b);
  h ^= h >>> 16;
  let g = Math.imul((h ^ seed) >>> 0, 0x9e3779b1) ^ 0x6a09e667;
  g = Math.imul(g ^ (g >>> 16), 0x21f0aaad);
  g = Math.imul(g ^ (g >>> 15), 0x735a2d97);
  g ^= g >>> 15;
  // 53 random bits from two 32-bit words
  return ((h >>> 0) * 2097152 + ((g >>> 0) >>> 11)) / 9007199254740992;
}

/**
 * Rotary in place on x [T, heads, headDim] (float64 values) at positions [T] with cos/sin [maxPos, rotaryDim/2]:
 * neox rotates (i, i + rotaryDim/2) pairs, else (2i, 2i+1).
 */
function rotateRows(x: Float64Array, pos: Float64Array, cos: Float64Array, sin: Float64Array, heads: number, headDim: number, rotaryDim: number, neox: boolean): void {
  const half = rotaryDim / 2;
  if (half === 0) return;
  const maxPos = cos.length / half;
  for (let t = 0; t < pos.length; t++) {
    const p = pos[t]!;
    if (p < 0 || p >= maxPos) throw new RangeError(`position ${p} out of range for ${maxPos} rotary positions`);
    for (let h = 0; h < heads; h++) {
      const base = (t * heads + h) * headDim;
      for (let i = 0; i < half; i++) {
        const c = cos[p * half + i]!;
        const s = sin[p * half + i]!;
        const i0 = neox ? base + i : base + 2 * i;
        const i1 = neox ? base + i + half : base + 2 * i + 1;
        const x0 = x[i0]!;
        const x1 = x[i1]!;
        x[i0] = x0 * c - x1 * s;
        x[i1] = x1 * c + x0 * s;
      }
    }
  }
}

/** rms_norm of each row of x [rows, n] in place (in float64): x * (mean(x^2) + eps)^-1/2 * w. */
function rmsNormRows(x: Float64Array, w: Float64Array, rows: number, n: number, eps: number): void {
  for (let r = 0; r < rows; r++) {
    const o = r * n;
    let ss = 0;
    for (let i = 0; i < n; i++) ss += x[o + i]! * x[o + i]!;
    const inv = 1 / Math.sqrt(ss / n + eps);
    for (let i = 0; i < n; i++) x[o + i] = x[o + i]! * inv * w[i]!;
  }
}

/** quant_matmul's activation quantization of float32 rows x [rows, n] into xq (see QuantizedRowsView). */
function quantizeRowsReference(x: Float64Array, rows: number, n: number, xq: QuantizedRowsView): void {
  const setQ = setter(xq.data.buffer, xq.data.dtype);
  const setS = setter(xq.scales.buffer, xq.scales.dtype);
  const q = quantizeActivationsRef(x, rows, n);
  for (let r = 0; r < rows; r++) setS(xq.scales.offset + r, q.xs[r]!);
  for (let i = 0; i < rows * n; i++) setQ(xq.data.offset + i, q.xq[i]!);
}

/**
 * Writes into a paged KV cache: as the dtype's setter, but fp8 values saturate at the largest finite one (vLLM's
 * saturating fp8 cache writes; a tensor cast to e5m2 overflows to inf instead).
 */
function cacheSetter(v: BufferView): (i: number, x: number) => void {
  if (v.dtype !== "float8_e4m3fn" && v.dtype !== "float8_e5m2") return setter(v.buffer, v.dtype);
  const format = v.dtype === "float8_e4m3fn" ? "e4m3fn" : "e5m2";
  const bytes = rawArray(v.buffer, v.dtype) as Uint8Array;
  return (i, x) => (bytes[i] = f32ToFp8Bits(x, format));
}

export function pagedAttentionReference(p: PagedAttentionArgs): void {
  const { numSeqs, numHeads, numKvHeads, headDim: D, blockSize, maxBlocksPerSeq, scale, slidingWindow, softcap } = p;
  const q = readF64(p.q);
  const kNew = readF64(p.kNew);
  if (p.rotary) {
    // fused rotary: the same values the separate rotary kernel would store (rounded to float32)
    const { positions, cos, sin, rotaryDim, neox } = p.rotary;
    const [pos, c, s] = [readF64(positions), readF64(cos), readF64(sin)];
    if (pos.length !== p.q.shape[0]) throw new RangeError(`[paged_attention] expected ${p.q.shape[0]} rotary positions, got ${pos.length}`);
    rotateRows(q, pos, c, s, numHeads, D, rotaryDim, neox);
    rotateRows(kNew, pos, c, s, numKvHeads, D, rotaryDim, neox);
    for (const x of [q, kNew]) for (let i = 0; i < x.length; i++) x[i] = Math.fround(x[i]!);
  }
  const vNew = readF64(p.vNew);
  const slots = readF64(p.slotMapping);
  const tables = readF64(p.blockTables);
  const qStart = readF64(p.queryStart);
  const seqLens = readF64(p.seqLens);
  const sinks = p.sinks ? readF64(p.sinks) : null;
  const kGet = getter(p.kCache.buffer, p.kCache.dtype);
  const kSet = cacheSetter(p.kCache);
  const vGet = getter(p.vCache.buffer, p.vCache.dtype);
  const vSet = cacheSetter(p.vCache);
  const kvRow = numKvHeads * D; // elements per slot
  // 1. write the new K/V into their slots
  for (let t = 0; t < slots.length; t++) {
    const slot = slots[t]!;
    if (slot < 0) continue;
    for (let i = 0; i < kvRow; i++) {
      kSet(p.kCache.offset + slot * kvRow + i, kNew[t * kvRow + i]!);
      vSet(p.vCache.offset + slot * kvRow + i, vNew[t * kvRow + i]!);
    }
  }
  // 2. attend: query j of sequence s sits at position seqLen - qlen + j (and sees every key when bidirectional)
  const out = new Float64Array(numel(p.out.shape));
  const group = numHeads / numKvHeads;
  for (let s = 0; s < numSeqs; s++) {
    const q0 = qStart[s]!;
    const qlen = qStart[s + 1]! - q0;
    const seqLen = seqLens[s]!;
    for (let j = 0; j < qlen; j++) {
      const pos = p.bidirectional ? seqLen - 1 : seqLen - qlen + j;
      const lo = slidingWindow > 0 ? Math.max(0, pos - slidingWindow + 1) : 0;
      for (let h = 0; h < numHeads; h++) {
        const kvh = Math.floor(h / group);
        const qOff = ((q0 + j) * numHeads + h) * D;
        const scores: number[] = [];
        let max = -Infinity;
        for (let c = lo; c <= pos; c++) {
          const block = tables[s * maxBlocksPerSeq + Math.floor(c / blockSize)]!;
          const base = p.kCache.offset + (block * blockSize + (c % blockSize)) * kvRow + kvh * D;
          let dot = 0;
          for (let d = 0; d < D; d++) dot += q[qOff + d]! * kGet(base + d);
          const sc = softcap > 0 ? softcap * Math.tanh((dot * scale) / softcap) : dot * scale; // soft-capped before the mask
          scores.push(sc);
          if (sc > max) max = sc;
        }
        // an attention sink joins the denominator as one more logit whose value row is zero
        let denom = sinks ? Math.exp(sinks[h]! - max) : 0;
        for (let i = 0; i < scores.length; i++) denom += scores[i] = Math.exp(scores[i]! - max);
        for (let c = lo; c <= pos; c++) {
          const w = scores[c - lo]! / denom;
          const block = tables[s * maxBlocksPerSeq + Math.floor(c / blockSize)]!;
          const base = p.vCache.offset + (block * blockSize + (c % blockSize)) * kvRow + kvh * D;
          for (let d = 0; d < D; d++) out[qOff + d] += w * vGet(base + d);
        }
      }
    }
  }
  writeDense(p.out, out);
}

/** lora_apply (see KernelCall): u = a[q] x[t] and the expand sum in float64, then rounded once into out. */
function loraApplyReference(call: Extract<KernelCall, { op: "lora_apply" }>): void {
  const { t: T, n: N, k: K, r: R, s: S } = call;
  const out = readF64(call.base);
  const [x, a, b, scales, slots] = [readF64(call.x), readF64(call.a), readF64(call.b), readF64(call.scales), readF64(call.slots)];
  const u = new Float64Array(R);
  for (let t = 0; t < T; t++) {
    const q = slots[t]!;
    if (!(q >= 0 && q < S)) continue; // no adapter: the base row
    for (let r = 0; r < R; r++) {
      let dot = 0;
      for (let k = 0; k < K; k++) dot += a[(q * R + r) * K + k]! * x[t * K + k]!;
      u[r] = dot;
    }
    for (let n = 0; n < N; n++) {
      let delta = 0;
      for (let r = 0; r < R; r++) delta += b[(q * R + r) * N + n]! * u[r]!;
      out[t * N + n] += scales[q]! * delta;
    }
  }
  writeDense(call.out, out);
}

/** Runs one kernel call with float64 math. */
export function runReference(call: KernelCall): void {
  switch (call.op) {
    case "unary": {
      const f = unaryKernel(call.fn, call.out.dtype);
      const x = operandValues(readF64(call.x), call.x.dtype, call.out.dtype);
      for (let i = 0; i < x.length; i++) x[i] = f(x[i]!);
      return writeDense(call.out, x);
    }
    case "silu_mul": {
      // as the unfused pair: silu rounded to float32, then the product
      const g = readF64(call.gate);
      const u = readF64(call.up);
      for (let i = 0; i < g.length; i++) g[i] = Math.fround(UNARY.silu(g[i]!)) * u[i]!;
      writeDense(call.out, g);
      if (call.xq) quantizeRowsReference(readF64(call.out), call.rows, call.n, call.xq);
      return;
    }
    case "binary": {
      const f = binaryKernel(call.fn, call.out.dtype);
      const ct = binaryComputeDtype(call.fn, call.a.dtype, call.b.dtype, call.out.dtype);
      const a = operandValues(readF64(call.a), call.a.dtype, ct);
      const b = operandValues(readF64(call.b), call.b.dtype, ct);
      for (let i = 0; i < a.length; i++) a[i] = f(a[i]!, b[i]!);
      return writeDense(call.out, a);
    }
    case "where": {
      const c = readF64(call.cond);
      const a = readF64(call.a);
      const b = readF64(call.b);
      for (let i = 0; i < a.length; i++) a[i] = c[i] ? a[i]! : b[i]!;
      return writeDense(call.out, a);
    }
    case "copy":
      return writeDense(call.out, castValues(readF64(call.x), call.x.dtype, call.out.dtype));
    case "fill": {
      const set = setter(call.out.buffer, call.out.dtype);
      return forEachIndex(call.out, (s) => set(s, call.value));
    }
    case "reduce": {
      const x = readF64(call.x);
      const out = new Float64Array(call.rows);
      const mul = binaryKernel("mul", call.out.dtype);
      for (let r = 0; r < call.rows; r++) out[r] = reduceRow(call.fn, x, r * call.n, call.n, mul);
      return writeDense(call.out, out);
    }
    case "softmax": {
      const x = readF64(call.x);
      const { rows, n } = call;
      for (let r = 0; r < rows; r++) {
        const o = r * n;
        let m = -Infinity;
        for (let i = 0; i < n; i++) m = Math.max(m, x[o + i]!);
        let s = 0;
        for (let i = 0; i < n; i++) s += Math.exp(x[o + i]! - m);
        for (let i = 0; i < n; i++) x[o + i] = call.log ? x[o + i]! - m - Math.log(s) : Math.exp(x[o + i]! - m) / s;
      }
      return writeDense(call.out, x);
    }
    case "cumsum": {
      const x = readF64(call.x);
      for (let r = 0; r < call.rows; r++) for (let i = 1; i < call.n; i++) x[r * call.n + i] += x[r * call.n + i - 1]!;
      return writeDense(call.out, x);
    }
    case "sort": {
      const x = readF64(call.x);
      const { rows, n, descending } = call;
      const vals = new Float64Array(rows * n);
      const idx = new Float64Array(rows * n);
      const order = Array.from({ length: n }, (_, i) => i);
      for (let r = 0; r < rows; r++) {
        const o = r * n;
        for (let i = 0; i < n; i++) order[i] = i;
        // NaN sorts as the largest value, as in torch
        const key = (i: number) => (Number.isNaN(x[o + i]!) ? Infinity : x[o + i]!);
        order.sort((i, j) => {
          const d = descending ? key(j) - key(i) : key(i) - key(j);
          return d !== 0 && !Number.isNaN(d) ? d : i - j;
        });
        for (let i = 0; i < n; i++) {
          vals[o + i] = x[o + order[i]!]!;
          idx[o + i] = order[i]!;
        }
      }
      writeDense(call.values, vals);
      return writeDense(call.indices, idx);
    }
    case "rms_norm": {
      const x = readF64(call.x);
      rmsNormRows(x, readF64(call.weight), call.rows, call.n, call.eps);
      writeDense(call.out, x);
      if (call.xq) quantizeRowsReference(readF64(call.out), call.rows, call.n, call.xq);
      return;
    }
    case "add_rms_norm": {
      // the sum rounded to float32 first, as the separate add writes it
      const x = readF64(call.x);
      const r = readF64(call.residual);
      for (let i = 0; i < x.length; i++) x[i] = Math.fround(x[i]! + r[i]!);
      writeDense(call.sum, x);
      rmsNormRows(x, readF64(call.weight), call.rows, call.n, call.eps);
      writeDense(call.out, x);
      if (call.xq) quantizeRowsReference(readF64(call.out), call.rows, call.n, call.xq);
      return;
    }
    case "matmul": {
      const { batch, m, n, k, bTransposed, strideA, strideB, strideOut } = call;
      const aTransposed = call.aTransposed ?? false;
      const aGet = getter(call.a.buffer, call.a.dtype);
      const bGet = getter(call.b.buffer, call.b.dtype);
      const oSet = setter(call.out.buffer, call.out.dtype);
      for (let bi = 0; bi < batch; bi++) {
        const aBase = call.a.offset + bi * strideA;
        const bBase = call.b.offset + bi * strideB;
        const oBase = call.out.offset + bi * strideOut;
        for (let i = 0; i < m; i++) {
          for (let j = 0; j < n; j++) {
            let s = 0;
            for (let p = 0; p < k; p++) s += aGet(aBase + (aTransposed ? p * m + i : i * k + p)) * bGet(bBase + (bTransposed ? j * k + p : p * n + j));
            oSet(oBase + i * n + j, s);
          }
        }
      }
      return;
    }
    case "gather_rows": {
      const ids = readF64(call.ids);
      const get = getter(call.table.buffer, call.table.dtype);
      const out = new Float64Array(call.numIds * call.dim);
      for (let i = 0; i < call.numIds; i++) {
        const row = ids[i]!;
        if (row < 0 || row >= call.rows) throw new RangeError(`index ${row} out of range for ${call.rows} rows`);
        for (let d = 0; d < call.dim; d++) out[i * call.dim + d] = get(call.table.offset + row * call.dim + d);
      }
      return writeDense(call.out, out);
    }
    case "gather": {
      const x = readF64(call.x);
      const index = readF64(call.index);
      const { rows, n, m } = call;
      const out = new Float64Array(rows * m);
      for (let r = 0; r < rows; r++)
        for (let j = 0; j < m; j++) {
          const i = index[r * m + j]!;
          if (i < 0 || i >= n) throw new RangeError(`index ${i} out of range for size ${n}`);
          out[r * m + j] = x[r * n + i]!;
        }
      return writeDense(call.out, out);
    }
    case "scatter": {
      const out = readF64(call.out);
      const index = readF64(call.index);
      const src = readF64(call.src);
      const { rows, n, m } = call;
      for (let r = 0; r < rows; r++)
        for (let j = 0; j < m; j++) {
          const i = index[r * m + j]!;
          if (i < 0 || i >= n) throw new RangeError(`index ${i} out of range for size ${n}`);
          if (call.accumulate) out[r * n + i] += src[r * m + j]!;
          else out[r * n + i] = src[r * m + j]!;
        }
      return writeDense(call.out, out);
    }
    case "index_copy_rows": {
      const ids = readF64(call.ids);
      const src = readF64(call.src);
      const set = setter(call.out.buffer, call.out.dtype);
      for (let i = 0; i < call.numIds; i++) {
        const row = ids[i]!;
        if (row < 0 || row >= call.rows) throw new RangeError(`index ${row} out of range for ${call.rows} rows`);
        for (let d = 0; d < call.dim; d++) set(call.out.offset + row * call.dim + d, src[i * call.dim + d]!);
      }
      return;
    }
    case "index_add_rows": {
      const ids = readF64(call.ids);
      const src = readF64(call.src);
      const out = readF64(call.out);
      for (let i = 0; i < call.numIds; i++) {
        const row = ids[i]!;
        if (row < 0 || row >= call.rows) throw new RangeError(`index ${row} out of range for ${call.rows} rows`);
        // rounded to float32 after each add, as the kernel adds
        for (let d = 0; d < call.dim; d++) out[row * call.dim + d] = Math.fround(out[row * call.dim + d]! + src[i * call.dim + d]!);
      }
      return writeDense(call.out, out);
    }
    case "rotary": {
      const x = readF64(call.x);
      rotateRows(x, readF64(call.positions), readF64(call.cos), readF64(call.sin), call.heads, call.headDim, call.rotaryDim, call.neox);
      return writeDense(call.out, x);
    }
    case "paged_attention":
      return pagedAttentionReference(call);
    case "flash_attention":
      return flashAttentionReference(call);
    case "flash_attention_backward":
      return flashAttentionBackwardReference(call);
    case "lora_apply":
      return loraApplyReference(call);
    case "moe":
      return moeReference(call);
    case "random": {
      const n = numel(call.out.shape);
      const vals = new Float64Array(n);
      if (call.dist === "uniform") {
        for (let i = 0; i < n; i++) vals[i] = call.a + (call.b - call.a) * counterUniform(call.seed, call.counter + i);
      } else {
        // Box-Muller on counter pairs: element i uses counters (2i, 2i+1) so any prefix is reproducible
        for (let i = 0; i < n; i++) {
          const u1 = Math.max(counterUniform(call.seed, call.counter + 2 * i), 1e-300);
          const u2 = counterUniform(call.seed, call.counter + 2 * i + 1);
          vals[i] = call.a + call.b * Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2);
        }
      }
      return writeDense(call.out, vals);
    }
  }
}

export function viewNumel(v: BufferView): number {
  return numel(v.shape);
}
