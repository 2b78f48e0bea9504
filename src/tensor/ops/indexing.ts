// Indexing ops: embedding / index_select, gather / scatter, index_copy_, and cat / stack / split.
import { promoteTypes, type DType } from "../../backends/dtype.js";
import { IndexOutOfRangeError, OpError } from "../../util/errors.js";
import { runKernel, sameDevice } from "../dispatch.js";
import { recordOp } from "../grad-mode.js";
import { empty, numel, Tensor } from "../tensor.js";
import { contiguous, normDim } from "./shape.js";
import { copyInto } from "./elementwise.js";

function asIndex(op: string, index: Tensor): Tensor {
  if (index.dtype !== "int32" && index.dtype !== "int64" && index.dtype !== "uint8" && index.dtype !== "int8")
    throw new OpError(op, `index must be an integer tensor, got ${index.dtype}`);
  if (index.dtype === "int64") checkInt32Range(op, index);
  return index.dtype === "int32" ? contiguous(index) : index.to("int32");
}

/** The kernels index in int32: an int64 id past its range would wrap onto a valid row, so it is refused here. */
function checkInt32Range(op: string, index: Tensor): void {
  for (const v of index.dataSync() as BigInt64Array)
    if (v < -2147483648n || v > 2147483647n) throw new IndexOutOfRangeError(op, `index ${v} out of range`);
}

/** Moves dim to the front and returns a contiguous [size, rest] view. */
function dimFirst(t: Tensor, d: number): Tensor {
  const p = d === 0 ? t : t.transpose(0, d);
  const c = contiguous(p);
  if (p !== t && p !== c) p.dispose();
  return c;
}

/** Swaps dim d back from the last position into a new contiguous tensor; disposes x. */
function backFromLast(x: Tensor, d: number, last: number): Tensor {
  const b = x.transpose(d, last);
  const res = contiguous(b);
  if (b !== res) b.dispose();
  x.dispose();
  return res;
}

/** index_select(t, dim, index): rows of dim picked by a 1-d index. embedding = indexSelect(weight, 0, ids). */
export function indexSelect(t: Tensor, dim: number, index: Tensor): Tensor {
  return indexSelectAs("index_select", t, dim, index);
}

/** index_select under the name of the op the caller exposes (embedding), so errors name it. */
function indexSelectAs(op: string, t: Tensor, dim: number, index: Tensor): Tensor {
  const d = normDim(dim, t.ndim, op);
  if (index.ndim > 1) throw new OpError(op, "index must be 0-d or 1-d");
  if (t.ndim === 0) {
    if (index.numel !== 1) throw new OpError(op, `index_select(): Index to scalar can have only 1 value, got ${index.numel} value(s)`);
    return asVectors([t, index], ([t1, i1]) => indexSelectAs(op, t1!, 0, i1!));
  }
  const dev = sameDevice(op, t, index);
  const idx = asIndex(op, index);
  const src = dimFirst(t, d);
  const rows = src.shape[0]!;
  const dim_ = numel(src.shape) / Math.max(rows, 1);
  // the row kernel widens bf16 rows to float32 (embedding's fused dequantization)
  const outFirst = empty([idx.numel, ...src.shape.slice(1)], { dtype: t.dtype === "bfloat16" ? "float32" : t.dtype, device: dev });
  runKernel(op, dev, {
    op: "gather_rows",
    table: src.view_(op),
    ids: idx.view_(op),
    out: outFirst.view_(op),
    numIds: idx.numel,
    dim: dim_,
    rows,
  });
  if (src !== t) src.dispose();
  if (idx !== index) idx.dispose();
  const picked = op === "index_select" ? toDtype(outFirst, t.dtype) : outFirst; // torch's index_select keeps bf16 (exact)
  const out = d === 0 ? picked : backFromLast(picked, 0, d);
  recordOp("index_select", [t, null], out, { dim: d, index, inputShape: t.shape });
  return out;
}

/**
 * f of 0-d tensors viewed as 1-element vectors, its result viewed as 0-d again: torch indexes a 0-d tensor along
 * dim 0 (or -1) so, and the kernels here need a dim to index along.
 */
function asVectors(ts: Tensor[], f: (vectors: Tensor[]) => Tensor): Tensor {
  const vs = ts.map((t) => t.reshape(1));
  const r = f(vs);
  const out = r.reshape([]);
  for (const v of new Set([...vs, r])) if (!ts.includes(v) && v !== out) v.dispose();
  return out;
}

/** x cast to dtype (x disposed), or x itself. */
function toDtype(x: Tensor, dtype: DType): Tensor {
  if (x.dtype === dtype) return x;
  const out = x.to(dtype);
  x.dispose();
  return out;
}

/**
 * embedding(ids, weight): weight rows for each id; output shape [...ids.shape, dim]. A bf16 table gives float32 rows
 * (the models' activations; torch's embedding keeps bf16, which indexSelect does).
 */
export function embedding(ids: Tensor, weight: Tensor): Tensor {
  const flat = ids.reshape(-1);
  const rows = indexSelectAs("embedding", weight, 0, flat);
  flat.dispose();
  const out = rows.view(...ids.shape, weight.shape[1]!);
  rows.dispose();
  return out;
}

/** torch.gather along dim: out[i][j] = t[i][index[i][j]] (for dim = last). */
export function gather(t: Tensor, dim: number, index: Tensor): Tensor {
  const d = normDim(dim, t.ndim, "gather");
  if (index.ndim !== t.ndim) throw new OpError("gather", "index must have the same rank as the input");
  if (t.ndim === 0) return asVectors([t, index], ([t1, i1]) => gather(t1!, 0, i1!));
  const last = t.ndim - 1;
  const tt = d === last ? t : t.transpose(d, last);
  const it = d === last ? index : index.transpose(d, last);
  const x = contiguous(tt);
  const idx = asIndex("gather", it);
  for (let i = 0; i < last; i++)
    if (idx.shape[i]! > x.shape[i]!) throw new OpError("gather", `index size ${idx.shape[i]} exceeds input size ${x.shape[i]} at dim ${i}`);
  // rows must line up: narrow x's leading dims to index's
  let xr = x;
  for (let i = 0; i < last; i++) {
    if (idx.shape[i] === x.shape[i]) continue;
    const nx = xr.narrow(i, 0, idx.shape[i]!);
    if (xr !== x) xr.dispose();
    xr = nx;
  }
  const xc = contiguous(xr);
  const n = xc.shape[last]!;
  const m = idx.shape[last]!;
  const out = empty(idx.shape, { dtype: t.dtype, device: t.device });
  runKernel("gather", t.device, {
    op: "gather",
    x: xc.view_("gather"),
    index: idx.view_("gather"),
    out: out.view_("gather"),
    rows: numel(idx.shape) / Math.max(m, 1),
    n,
    m,
  });
  for (const tmp of new Set([tt, it, x, xr, xc, idx])) if (tmp !== t && tmp !== index) tmp.dispose();
  const res = d === last ? out : backFromLast(out, d, last);
  recordOp("gather", [t, null], res, { dim: d, index, inputShape: t.shape });
  return res;
}

/**
 * Out-of-place scatter (or scatter_add with accumulate): a copy of t with src values placed at index along dim.
 * As torch, src must have t's dtype (no silent cast of the values written).
 */
export function scatter(t: Tensor, dim: number, index: Tensor, src: Tensor, accumulate = false): Tensor {
  const op = accumulate ? "scatter_add" : "scatter";
  const d = normDim(dim, t.ndim, op);
  const last = t.ndim - 1;
  if (index.ndim !== t.ndim || src.ndim !== t.ndim) throw new OpError(op, "index and src must have the input's rank");
  if (src.dtype !== t.dtype) throw new OpError(op, `Expected self.dtype to be equal to src.dtype (self ${t.dtype}, src ${src.dtype})`);
  if (t.ndim === 0) return asVectors([t, index, src], ([t1, i1, s1]) => scatter(t1!, 0, i1!, s1!, accumulate));
  const moved = d === last ? t : t.transpose(d, last);
  const base = moved.clone();
  const it = d === last ? index : index.transpose(d, last);
  const idx = asIndex(op, it);
  const st = d === last ? src : src.transpose(d, last);
  const s = contiguous(st);
  for (let i = 0; i < last; i++)
    if (idx.shape[i] !== base.shape[i]) throw new OpError(op, "index must match the input in every dim but the scatter dim");
  // torch: src may be larger than index in any dim; the kernel reads src as dense [rows, m] rows lined up with index's
  for (let i = 0; i <= last; i++)
    if (s.shape[i]! < idx.shape[i]!) throw new OpError(op, `src [${src.shape.join(", ")}] is smaller than index [${index.shape.join(", ")}] at dim ${i === last ? d : i === d ? last : i}`);
  const m = idx.shape[last]!;
  let sn = s;
  for (let i = 0; i <= last; i++) {
    if (sn.shape[i] === idx.shape[i]) continue;
    const next = sn.narrow(i, 0, idx.shape[i]!);
    if (sn !== s) sn.dispose();
    sn = next;
  }
  const sv = contiguous(sn);
  runKernel(op, t.device, {
    op: "scatter",
    out: base.view_(op),
    index: idx.view_(op),
    src: sv.view_(op),
    rows: numel(idx.shape) / Math.max(m, 1),
    n: base.shape[last]!,
    m,
    accumulate,
  });
  for (const tmp of new Set([moved, it, idx, st, s, sn, sv])) if (tmp !== t && tmp !== index && tmp !== src) tmp.dispose();
  const res = d === last ? base : backFromLast(base, d, last);
  recordOp(op, [t, null, src], res, { dim: d, index });
  return res;
}

/**
 * index_add_ along dim 0 of a contiguous float32 table t [rows, ...] (in place): t[index[i]] += src[i], in index
 * order, on the device (an embedding's gradient: index_select's backward). src [index.numel, ...] float32. No
 * autograd.
 */
export function indexAddRowsInto(t: Tensor, index: Tensor, src: Tensor): void {
  const op = "index_add_";
  if (t.dtype !== "float32" || src.dtype !== "float32") throw new OpError(op, `self and source must be float32, got ${t.dtype} and ${src.dtype}`);
  if (!t.isContiguous || t.ndim < 1) throw new OpError(op, "self must be a contiguous table");
  const idx = asIndex(op, index);
  const dim = numel(t.shape) / Math.max(t.shape[0]!, 1);
  if (idx.ndim !== 1 || src.numel !== idx.numel * dim) throw new OpError(op, `source [${src.shape.join(", ")}] does not hold ${idx.numel} rows of ${dim}`);
  const dev = sameDevice(op, t, idx, src);
  const s = contiguous(src);
  if (idx.numel > 0) runKernel(op, dev, { op: "index_add_rows", out: t.view_(op), ids: idx.view_(op), src: s.view_(op), numIds: idx.numel, dim, rows: t.shape[0]! }, [t]);
  if (s !== src) s.dispose();
  if (idx !== index) idx.dispose();
}

/** index_copy_ along dim: t[..., index[i], ...] = src[..., i, ...], writing through views of t; src has t's dtype. */
export function indexCopyInto(t: Tensor, dim: number, index: Tensor, src: Tensor): void {
  const d = normDim(dim, t.ndim, "index_copy_");
  if (src.dtype !== t.dtype)
    throw new OpError("index_copy_", `self and source expected to have the same dtype, but got (self) ${t.dtype} and (source) ${src.dtype}`);
  const idx = asIndex("index_copy_", index);
  if (idx.ndim !== 1 || src.shape[d] !== idx.numel) throw new OpError("index_copy_", "index must be 1-d with one entry per src slice");
  const ids = idx.dataSync() as Int32Array;
  for (let i = 0; i < ids.length; i++) {
    const row = ids[i]!;
    if (row < 0 || row >= t.shape[d]!) throw new IndexOutOfRangeError("index_copy_", `index ${row} out of range for size ${t.shape[d]}`);
    const dst = t.select(d, row);
    const s = src.select(d, i);
    copyInto(dst, s);
    dst.dispose();
    s.dispose();
  }
  if (idx !== index) idx.dispose();
}

export function cat(inputs: Tensor[], dim = 0): Tensor {
  if (inputs.length === 0) throw new OpError("cat", "expects a non-empty list");
  const scalarAt = inputs.findIndex((t) => t.ndim === 0);
  if (scalarAt >= 0) throw new OpError("cat", `zero-dimensional tensor (at position ${scalarAt}) cannot be concatenated`);
  // torch's legacy rule: a 1-d empty tensor (tensor([]), the usual start of a cat loop) is skipped whatever the others' shape
  const nonEmpty = inputs.filter((t) => !(t.ndim === 1 && t.numel === 0));
  const tensors = nonEmpty.length > 0 ? nonEmpty : inputs;
  const first = tensors[0]!;
  const d = normDim(dim, first.ndim, "cat");
  const dev = sameDevice("cat", ...inputs);
  for (const t of tensors) {
    if (t.ndim !== first.ndim || t.shape.some((s, i) => i !== d && s !== first.shape[i]))
      throw new OpError("cat", `shapes [${first.shape.join(", ")}] and [${t.shape.join(", ")}] differ outside dim ${d}`);
  }
  const shape = [...first.shape];
  shape[d] = tensors.reduce((s, t) => s + t.shape[d]!, 0);
  // torch.result_type of all the inputs (cat([int32, float32]) is float32); copy_ converts each part
  const dtype = inputs.reduce<DType>((acc, t) => promoteTypes(acc, t.dtype), first.dtype);
  const out = empty(shape, { dtype, device: dev });
  let at = 0;
  for (const t of tensors) {
    const dst = out.narrow(d, at, t.shape[d]!);
    copyInto(dst, t);
    dst.dispose();
    at += t.shape[d]!;
  }
  recordOp("cat", tensors, out, { dim: d, sizes: tensors.map((t) => t.shape[d]!) });
  return out;
}

export function stack(tensors: Tensor[], dim = 0): Tensor {
  if (tensors.length === 0) throw new OpError("stack", "expects a non-empty list");
  const first = tensors[0]!;
  tensors.forEach((t, i) => {
    if (t.ndim !== first.ndim || t.shape.some((s, j) => s !== first.shape[j]))
      throw new OpError("stack", `expects each tensor to be equal size, but got [${first.shape.join(", ")}] at entry 0 and [${t.shape.join(", ")}] at entry ${i}`);
  });
  const d = dim < 0 ? dim + first.ndim + 1 : dim;
  if (d < 0 || d > first.ndim) throw new OpError("stack", `dimension ${dim} out of range for stacking ${first.ndim}-d tensors`);
  const us = tensors.map((t) => t.unsqueeze(d));
  const out = cat(us, d);
  for (const u of us) u.dispose();
  return out;
}

/** Splits into chunks of `size` (number) or the given sizes (array) along dim; results are views. */
export function split(t: Tensor, sizeOrSizes: number | number[], dim = 0): Tensor[] {
  if (t.ndim === 0) throw new OpError("split", "split expects at least a 1-dimensional tensor");
  const d = normDim(dim, t.ndim, "split");
  const total = t.shape[d]!;
  const sizes: number[] = [];
  if (Array.isArray(sizeOrSizes)) {
    if (sizeOrSizes.some((s) => !Number.isInteger(s) || s < 0))
      throw new OpError("split", `split sizes must be non-negative integers, got [${sizeOrSizes.join(", ")}]`);
    if (sizeOrSizes.reduce((a, b) => a + b, 0) !== total) throw new OpError("split", `sizes do not sum to ${total}`);
    sizes.push(...sizeOrSizes);
  } else {
    // torch: a size of 0 only splits an empty dim; an empty dim splits into one empty piece
    if (!Number.isInteger(sizeOrSizes) || sizeOrSizes < 0 || (sizeOrSizes === 0 && total > 0))
      throw new OpError("split", `split size must be a positive integer, got ${sizeOrSizes}`);
    for (let at = 0; at < total; at += sizeOrSizes) sizes.push(Math.min(sizeOrSizes, total - at));
    if (total === 0) sizes.push(0);
  }
  const out: Tensor[] = [];
  let at = 0;
  for (const s of sizes) {
    out.push(t.narrow(d, at, s));
    at += s;
  }
  return out;
}

export function chunk(t: Tensor, chunks: number, dim = 0): Tensor[] {
  if (!Number.isInteger(chunks) || chunks <= 0) throw new OpError("chunk", `expects \`chunks\` to be an integer greater than 0, got ${chunks}`);
  if (t.ndim === 0) throw new OpError("chunk", "chunk expects at least a 1-dimensional tensor");
  const d = normDim(dim, t.ndim, "chunk");
  return split(t, Math.ceil(t.shape[d]! / chunks), d);
}
