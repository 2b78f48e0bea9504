// Reductions and row-wise normalisations. Each moves the reduced dims last, makes the input a dense
// [rows, n] matrix, and runs one row kernel.
import type { ReduceOp } from "../../backends/backend.js";
import { meanDtype, softmaxDtype, sumDtype, type DType } from "../../backends/dtype.js";
import { OpError } from "../../util/errors.js";
import { runKernel } from "../dispatch.js";
import { noGrad, recordOp } from "../grad-mode.js";
import { empty, numel, Tensor } from "../tensor.js";
import { contiguous, normDim, permute } from "./shape.js";
import { abs, add, log, sub, where } from "./elementwise.js";

/** The dims a reduction reduces, sorted: every dim when dim is omitted or [] (torch's sum(dim=[]) reduces them all). */
function reducedDims(t: Tensor, dim: number | number[] | undefined, op: string): number[] {
  if (dim === undefined || (Array.isArray(dim) && dim.length === 0)) return t.shape.map((_, i) => i);
  const dims = (Array.isArray(dim) ? dim : [dim]).map((d) => normDim(d, t.ndim, op));
  const repeated = dims.find((d, i) => dims.indexOf(d) !== i);
  if (repeated !== undefined) throw new OpError(op, `dim ${repeated} appears multiple times in the list of dims`);
  return dims.sort((a, b) => a - b);
}

/** Returns t as a dense [rows, n] matrix with `dims` last, plus the output shape. */
function asRows(t: Tensor, dims: number[], keepdim: boolean): { rows: Tensor; n: number; outShape: number[] } {
  const kept = t.shape.map((_, i) => i).filter((i) => !dims.includes(i));
  const order = [...kept, ...dims];
  const p = order.every((d, i) => d === i) ? t : permute(t, order);
  const c = contiguous(p);
  if (p !== t && p !== c) p.dispose();
  const n = numel(dims.map((d) => t.shape[d]!));
  const outShape = keepdim ? t.shape.map((s, i) => (dims.includes(i) ? 1 : s)) : kept.map((d) => t.shape[d]!);
  return { rows: c, n, outShape };
}

function reduce(fn: ReduceOp, t: Tensor, dim: number | number[] | undefined, keepdim: boolean, op: string): Tensor {
  const dims = reducedDims(t, dim, op);
  if (t.ndim === 0) dims.length = 0;
  const { rows, n, outShape } = asRows(t, dims, keepdim);
  if (n === 0 && fn !== "sum" && fn !== "prod") throw new OpError(op, "cannot reduce an empty dimension");
  const isArg = fn === "argmax" || fn === "argmin";
  // sums and products of bool / 8-bit ints accumulate in int32 (torch: int64), not wrapping in the input's dtype
  const dtype: DType = isArg ? "int32" : fn === "sum" || fn === "prod" ? sumDtype(t.dtype) : t.dtype;
  const out = empty(outShape, { dtype, device: t.device });
  const numRows = numel(outShape);
  runKernel(op, t.device, { op: "reduce", fn, x: rows.view_(op), out: out.view_(op), rows: numRows, n }, isArg ? [] : [out]);
  if (rows !== t) rows.dispose();
  if (!isArg) recordOp(op, [t], out, { dims, keepdim, inputShape: t.shape });
  return out;
}

export const sum = (t: Tensor, dim?: number | number[], keepdim = false): Tensor => reduce("sum", t, dim, keepdim, "sum");
export const prod = (t: Tensor, dim?: number | number[], keepdim = false): Tensor => reduce("prod", t, dim, keepdim, "prod");
export const max = (t: Tensor, dim?: number, keepdim = false): Tensor => reduce("max", t, dim, keepdim, "max");
export const min = (t: Tensor, dim?: number, keepdim = false): Tensor => reduce("min", t, dim, keepdim, "min");
/** torch.amax / amin: the extremum over dims (all when omitted or []); the gradient is shared evenly among ties. */
export const amax = (t: Tensor, dim?: number | number[], keepdim = false): Tensor => reduce("max", t, dim, keepdim, "amax");
export const amin = (t: Tensor, dim?: number | number[], keepdim = false): Tensor => reduce("min", t, dim, keepdim, "amin");
export const argmax = (t: Tensor, dim?: number, keepdim = false): Tensor => reduce("argmax", t, dim, keepdim, "argmax");
export const argmin = (t: Tensor, dim?: number, keepdim = false): Tensor => reduce("argmin", t, dim, keepdim, "argmin");

/**
 * Mean over dims, in t's dtype. As torch: a 16-bit or 8-bit float is summed and divided in float32 and rounded once
 * (not its sum rounded first); an integer or bool t is refused (cast it to a float first).
 */
export function mean(t: Tensor, dim?: number | number[], keepdim = false): Tensor {
  meanDtype(t.dtype); // throws for an integer or bool t
  const dims = reducedDims(t, dim, "mean");
  const count = numel(dims.map((d) => t.shape[d] ?? 1)); // a 0-d t's dim 0 holds its one element
  const src = t.to("float32");
  const s = sum(src, dims, keepdim);
  const m = s.div(count);
  s.dispose();
  if (src !== t) src.dispose();
  if (m.dtype === t.dtype) return m;
  const out = m.to(t.dtype);
  m.dispose();
  return out;
}

/** Applies a row kernel along `dim`, returning a tensor of t's shape. */
function alongDim(
  t: Tensor, dim: number, op: string, make: (rows: Tensor, out: Tensor, numRows: number, n: number) => void,
  dtype: DType = softmaxDtype(t.dtype),
): Tensor {
  const d = normDim(dim, Math.max(t.ndim, 1), op);
  const last = t.ndim - 1;
  if (t.ndim === 0) {
    const r = t.reshape(1);
    const o = alongDim(r, 0, op, make, dtype);
    r.dispose();
    const out = o.reshape();
    o.dispose();
    return out;
  }
  const moved = d === last ? t : t.transpose(d, last);
  const rows = contiguous(moved);
  const n = t.shape[d]!;
  const out = empty(rows.shape, { dtype, device: t.device });
  make(rows, out, numel(rows.shape) / Math.max(n, 1), n);
  if (rows !== t) rows.dispose();
  if (moved !== t && moved !== rows) moved.dispose();
  if (d === last) return out;
  const back = out.transpose(d, last);
  const res = contiguous(back);
  if (back !== res) back.dispose(); // a transpose over size-1 dims is already contiguous: then it is the result
  out.dispose();
  return res;
}

function softmaxImpl(t: Tensor, dim: number, logOut: boolean): Tensor {
  const op = logOut ? "log_softmax" : "softmax";
  const out = alongDim(t, dim, op, (rows, o, numRows, n) =>
    runKernel(op, t.device, { op: "softmax", log: logOut, x: rows.view_(op), out: o.view_(op), rows: numRows, n }, [o]),
  );
  recordOp(op, [t], out, { dim: normDim(dim, Math.max(t.ndim, 1), op) });
  return out;
}

export const softmax = (t: Tensor, dim = -1): Tensor => softmaxImpl(t, dim, false);
export const logSoftmax = (t: Tensor, dim = -1): Tensor => softmaxImpl(t, dim, true);

/**
 * log(sum(exp(x))) along dim, computed stably as m + log(sum(exp(x - m))) with m the row max, or 0 where the max
 * is infinite (torch's rule: an all -inf row gives -inf, a row holding +inf gives inf, not NaN).
 */
export function logsumexp(t: Tensor, dim: number, keepdim = false): Tensor {
  if (t.ndim > 0 && t.shape[normDim(dim, t.ndim, "logsumexp")] === 0) {
    // an empty sum: log(0) = -inf, as torch (there is no max to shift by)
    const s = sum(t, dim, keepdim);
    const out = log(s);
    s.dispose();
    return out;
  }
  const m = noGrad(() => {
    const mx = max(t, dim, true);
    const size = abs(mx);
    const inf = size.eq(Infinity);
    const finite = where(inf, 0, mx);
    for (const x of [mx, size, inf]) x.dispose();
    return finite;
  });
  const shifted = sub(t, m);
  const e = shifted.exp();
  const s = sum(e, dim, true);
  const l = log(s);
  const r = add(l, m);
  for (const x of [shifted, e, s, l, m]) x.dispose();
  if (keepdim) return r;
  const out = r.squeeze(normDim(dim, t.ndim, "logsumexp"));
  r.dispose();
  return out;
}

/** Running sums along dim; integers and bools sum in sumDtype (int32, int64 kept), as torch's integral cumsum. */
export function cumsum(t: Tensor, dim: number): Tensor {
  const out = alongDim(t, dim, "cumsum", (rows, o, numRows, n) =>
    runKernel("cumsum", t.device, { op: "cumsum", x: rows.view_("cumsum"), out: o.view_("cumsum"), rows: numRows, n }, [o]),
  sumDtype(t.dtype));
  recordOp("cumsum", [t], out, { dim: normDim(dim, Math.max(t.ndim, 1), "cumsum") });
  return out;
}

/**
 * Sorts along dim; returns values and int32 indices. Stable. The values are differentiable as torch's: their
 * gradient flows back to the positions they came from (a gather of t by the indices).
 */
export function sort(t: Tensor, dim = -1, descending = false): { values: Tensor; indices: Tensor } {
  if (t.ndim === 0) {
    // a 0-d tensor is its own sort (index 0), as torch's
    normDim(dim, 1, "sort"); // 0 or -1
    const one = t.reshape(1);
    const s = sort(one, 0, descending);
    one.dispose();
    const r = { values: s.values.reshape(), indices: s.indices.reshape() };
    s.values.dispose();
    s.indices.dispose();
    return r;
  }
  const r = sortUnrecorded(t, dim, descending);
  recordOp("gather", [t, null], r.values, { dim: normDim(dim, Math.max(t.ndim, 1), "sort"), index: r.indices, inputShape: t.shape });
  return r;
}

function sortUnrecorded(t: Tensor, dim: number, descending: boolean): { values: Tensor; indices: Tensor } {
  const d = normDim(dim, Math.max(t.ndim, 1), "sort");
  const last = t.ndim - 1;
  const moved = d === last ? t : t.transpose(d, last);
  const rows = contiguous(moved);
  const n = t.shape[d] ?? 1;
  const values = empty(rows.shape, { dtype: t.dtype, device: t.device });
  const indices = empty(rows.shape, { dtype: "int32", device: t.device });
  runKernel("sort", t.device, {
    op: "sort",
    x: rows.view_("sort"),
    values: values.view_("sort"),
    indices: indices.view_("sort"),
    rows: numel(rows.shape) / Math.max(n, 1),
    n,
    descending,
  });
  if (rows !== t) rows.dispose();
  if (moved !== t && moved !== rows) moved.dispose();
  if (d === last) return { values, indices };
  const fix = (x: Tensor) => {
    const b = x.transpose(d, last);
    const c = contiguous(b);
    if (b !== c) b.dispose();
    x.dispose();
    return c;
  };
  return { values: fix(values), indices: fix(indices) };
}

/** The k largest (or smallest) entries along dim, sorted. */
export function topk(t: Tensor, k: number, dim = -1, largest = true): { values: Tensor; indices: Tensor } {
  const d = normDim(dim, Math.max(t.ndim, 1), "topk");
  if (!Number.isInteger(k) || k < 0 || k > (t.shape[d] ?? 1)) throw new OpError("topk", `k=${k} out of range for size ${t.shape[d]}`);
  if (t.ndim === 0) {
    if (k !== 1) throw new OpError("topk", `k=${k} out of range for a 0-d tensor (k must be 1)`);
    return sort(t, d, largest);
  }
  const s = sort(t, d, largest);
  const take = (x: Tensor) => {
    const n = x.narrow(d, 0, k);
    const c = n.contiguous();
    if (c !== n) n.dispose();
    x.dispose();
    return c;
  };
  return { values: take(s.values), indices: take(s.indices) };
}
