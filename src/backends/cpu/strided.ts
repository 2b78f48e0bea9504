// Fast host paths for strided (non-contiguous, broadcast) views of float32 / int32 / byte tensors:
// storage offsets are generated once per call in a tight loop, then each op is one typed-array loop.
// This replaces the reference kernels' per-element closures for the layouts that training produces
// (transposes, broadcasts, gradient reductions).
import type { BinaryOp, BufferView, UnaryOp } from "../backend.js";
import type { DType } from "../dtype.js";
import { hostOf, isContiguous, numel, offsets } from "../reference/host-memory.js";
import { binaryComputeDtype, binaryKernel, operandValues, unaryKernel } from "../reference/reference-kernels.js";
import { floatToInt } from "../int-math.js";

type Direct = Float32Array | Int32Array | Uint8Array | Int8Array;

/** Dtypes whose elements are plain numbers in a typed array (no bit conversions). */
export function isDirect(d: DType): boolean {
  return d === "float32" || d === "int32" || d === "uint8" || d === "bool" || d === "int8";
}

export function directArray(v: BufferView): Direct {
  const host = hostOf(v.buffer);
  switch (v.dtype) {
    case "float32":
      return new Float32Array(host, 0, host.byteLength >>> 2);
    case "int32":
      return new Int32Array(host, 0, host.byteLength >>> 2);
    case "int8":
      return new Int8Array(host);
    default:
      return new Uint8Array(host);
  }
}

/** Values of a direct view in logical order (a subarray when already contiguous). */
function dense(v: BufferView): { data: Direct; idx: Int32Array | null; start: number } {
  const data = directArray(v);
  if (isContiguous(v.shape, v.strides)) return { data, idx: null, start: v.offset };
  return { data, idx: offsets(v), start: 0 };
}

/** Conversion of a `from` value stored as `d` (a float32 cast to an integer as floatToInt; integers wrap). */
function convert(d: DType, from: DType = d): (x: number) => number {
  if (d === "bool") return (x) => (x !== 0 ? 1 : 0); // NaN is true, as torch
  if (d === "float32") return (x) => x;
  if (from === "float32") return (x) => floatToInt(x, d);
  return Math.trunc;
}

/** Strided copy between direct dtypes (cast float->int truncates toward zero, as torch; NaN gives the minimum). */
export function copyStrided(x: BufferView, out: BufferView): boolean {
  if (!isDirect(x.dtype) || !isDirect(out.dtype)) return false;
  const n = numel(out.shape);
  const src = dense(x);
  const dst = dense(out);
  const cv = x.dtype === out.dtype || (out.dtype === "float32" && x.dtype !== "float32") ? null : convert(out.dtype, x.dtype);
  const s = src.data;
  const o = dst.data;
  const si = src.idx;
  const oi = dst.idx;
  if (cv === null) {
    if (si === null && oi === null) for (let i = 0; i < n; i++) o[dst.start + i] = s[src.start + i]!;
    else if (oi === null) for (let i = 0; i < n; i++) o[dst.start + i] = s[si![i]!]!;
    else if (si === null) for (let i = 0; i < n; i++) o[oi[i]!] = s[src.start + i]!;
    else for (let i = 0; i < n; i++) o[oi[i]!] = s[si[i]!]!;
  } else {
    for (let i = 0; i < n; i++) o[oi ? oi[i]! : dst.start + i] = cv(s[si ? si[i]! : src.start + i]!);
  }
  return true;
}

function fetch(v: BufferView, n: number): Float32Array | Int32Array | Uint8Array | Int8Array | Float64Array {
  const d = dense(v);
  if (d.idx === null) return d.data.subarray(d.start, d.start + n);
  const out = new Float64Array(n);
  const src = d.data;
  const idx = d.idx;
  for (let i = 0; i < n; i++) out[i] = src[idx[i]!]!;
  return out;
}

/** Writes computed dense values into the (possibly strided) output. */
function store(out: BufferView, values: Float64Array | Float32Array, n: number): void {
  const d = dense(out);
  const cv = out.dtype === "float32" ? null : convert(out.dtype);
  const o = d.data;
  if (d.idx === null) {
    if (cv === null) (o as Float32Array).set(values.subarray(0, n), d.start);
    else for (let i = 0; i < n; i++) o[d.start + i] = cv(values[i]!);
  } else {
    const idx = d.idx;
    for (let i = 0; i < n; i++) o[idx[i]!] = cv ? cv(values[i]!) : values[i]!;
  }
}

/** Elementwise binary op on direct dtypes with arbitrary (broadcast) strides. */
export function binaryStrided(fn: BinaryOp, a: BufferView, b: BufferView, out: BufferView): boolean {
  if (!isDirect(a.dtype) || !isDirect(b.dtype) || !isDirect(out.dtype)) return false;
  const n = numel(out.shape);
  // (an int32 operand of a float32 op is rounded to float32 first: below, through operandValues)
  if (out.dtype === "float32" && a.dtype !== "int32" && b.dtype !== "int32" && isContiguous(out.shape, out.strides)) {
    // common training case: write straight into the output, reading both sides through offset tables
    const o = new Float32Array(hostOf(out.buffer), out.offset * 4, n);
    const A = dense(a);
    const B = dense(b);
    const ad = A.data;
    const bd = B.data;
    // a side is either contiguous (index = start + i) or read through its offset table
    const ai = A.idx;
    const bi = B.idx;
    const as = A.start;
    const bs = B.start;
    const f = fn === "add" ? (x: number, y: number) => x + y : fn === "sub" ? (x: number, y: number) => x - y : fn === "mul" ? (x: number, y: number) => x * y : fn === "div" ? (x: number, y: number) => x / y : binaryKernel(fn, "float32");
    if (ai && bi) for (let i = 0; i < n; i++) o[i] = f(ad[ai[i]!]!, bd[bi[i]!]!);
    else if (ai) for (let i = 0; i < n; i++) o[i] = f(ad[ai[i]!]!, bd[bs + i]!);
    else if (bi) for (let i = 0; i < n; i++) o[i] = f(ad[as + i]!, bd[bi[i]!]!);
    else for (let i = 0; i < n; i++) o[i] = f(ad[as + i]!, bd[bs + i]!);
    return true;
  }
  const ct = binaryComputeDtype(fn, a.dtype, b.dtype, out.dtype);
  const av = operandValues(fetch(a, n), a.dtype, ct);
  const bv = operandValues(fetch(b, n), b.dtype, ct);
  const r = new Float64Array(n);
  const f = binaryKernel(fn, out.dtype);
  for (let i = 0; i < n; i++) r[i] = f(av[i]!, bv[i]!);
  store(out, r, n);
  return true;
}

/** torch.gather / scatter along the last dim of contiguous [rows, n] direct-dtype tensors. */
export function gatherRows(x: BufferView, index: BufferView, out: BufferView, rows: number, n: number, m: number): boolean {
  if (!isDirect(x.dtype) || index.dtype !== "int32" || !isDirect(out.dtype)) return false;
  if (!isContiguous(x.shape, x.strides) || !isContiguous(index.shape, index.strides) || !isContiguous(out.shape, out.strides)) return false;
  const xs = directArray(x);
  const ix = new Int32Array(hostOf(index.buffer), index.offset * 4, rows * m);
  const os = directArray(out);
  for (let r = 0; r < rows; r++)
    for (let j = 0; j < m; j++) {
      const i = ix[r * m + j]!;
      if (i < 0 || i >= n) throw new RangeError(`index ${i} out of range for size ${n}`);
      os[out.offset + r * m + j] = xs[x.offset + r * n + i]!;
    }
  return true;
}

export function scatterRows(out: BufferView, index: BufferView, src: BufferView, rows: number, n: number, m: number, accumulate: boolean): boolean {
  if (!isDirect(out.dtype) || index.dtype !== "int32" || !isDirect(src.dtype)) return false;
  if (!isContiguous(out.shape, out.strides) || !isContiguous(index.shape, index.strides) || !isContiguous(src.shape, src.strides)) return false;
  const os = directArray(out);
  const ix = new Int32Array(hostOf(index.buffer), index.offset * 4, rows * m);
  const ss = directArray(src);
  for (let r = 0; r < rows; r++)
    for (let j = 0; j < m; j++) {
      const i = ix[r * m + j]!;
      if (i < 0 || i >= n) throw new RangeError(`index ${i} out of range for size ${n}`);
      const o = out.offset + r * n + i;
      const v = ss[src.offset + r * m + j]!;
      os[o] = accumulate ? os[o]! + v : v;
    }
  return true;
}

export function unaryStrided(fn: UnaryOp, x: BufferView, out: BufferView): boolean {
  if (!isDirect(x.dtype) || !isDirect(out.dtype)) return false;
  const n = numel(out.shape);
  const xv = operandValues(fetch(x, n), x.dtype, out.dtype);
  const f = unaryKernel(fn, out.dtype);
  const r = new Float64Array(n);
  for (let i = 0; i < n; i++) r[i] = f(xv[i]!);
  store(out, r, n);
  return true;
}

export function whereStrided(cond: BufferView, a: BufferView, b: BufferView, out: BufferView): boolean {
  if (!isDirect(cond.dtype) || !isDirect(a.dtype) || !isDirect(b.dtype) || !isDirect(out.dtype)) return false;
  const n = numel(out.shape);
  const c = fetch(cond, n);
  const av = fetch(a, n);
  const bv = fetch(b, n);
  const r = new Float64Array(n);
  for (let i = 0; i < n; i++) r[i] = c[i] ? av[i]! : bv[i]!;
  store(out, r, n);
  return true;
}

/** fill on a direct dtype view. */
export function fillStrided(out: BufferView, value: number): boolean {
  if (!isDirect(out.dtype)) return false;
  const d = dense(out);
  const v = convert(out.dtype)(value);
  const n = numel(out.shape);
  if (d.idx === null) d.data.fill(v, d.start, d.start + n);
  else for (let i = 0; i < n; i++) d.data[d.idx[i]!] = v;
  return true;
}
