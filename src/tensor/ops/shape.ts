// View and layout ops. Views share storage; contiguous()/clone() copy through the copy kernel.
import type { DType } from "../../backends/dtype.js";
import { IndexOutOfRangeError, OpError } from "../../util/errors.js";
import type { Device } from "../device.js";
import { flushDeferred, runKernel } from "../dispatch.js";
import { recordOp } from "../grad-mode.js";
import { checkDType, contiguousStrides, empty, emptyOutput, makeView, numel, Tensor, type Shape } from "../tensor.js";

/** dim in [0, ndim) (negative counts from the end); as torch, a 0-d tensor takes dim 0 or -1, as if it were 1-d. */
export function normDim(dim: number, ndim: number, op: string): number {
  if (!Number.isInteger(dim)) throw new OpError(op, `dimension ${dim} must be an integer`);
  const n = Math.max(ndim, 1);
  const d = dim < 0 ? dim + n : dim;
  if (d < 0 || d >= n) throw new OpError(op, `dimension ${dim} out of range for a ${ndim}-d tensor`);
  return d;
}

/** torch's "select() cannot be applied to a 0-dim tensor." for ops that need a dim to index into. */
function checkHasDims(t: Tensor, op: string): void {
  if (t.ndim === 0) throw new OpError(op, `${op}() cannot be applied to a 0-dim tensor`);
}

function inferShape(op: string, shape: number[], total: number): number[] {
  const out = [...shape];
  const neg = out.indexOf(-1);
  if (neg !== out.lastIndexOf(-1)) throw new OpError(op, "only one dimension can be -1");
  if (neg >= 0) {
    const rest = numel(out.filter((_, i) => i !== neg));
    if (rest === 0 || total % rest !== 0) throw new OpError(op, `shape [${shape.join(", ")}] is invalid for ${total} elements`);
    out[neg] = total / rest;
  }
  if (numel(out) !== total || out.some((d) => !Number.isInteger(d) || d < 0))
    throw new OpError(op, `shape [${shape.join(", ")}] is invalid for ${total} elements`);
  return out;
}

/** Strides for viewing t with a new shape without copying, or null when impossible (torch's computeStride). */
function viewStrides(t: Tensor, newShape: number[]): number[] | null {
  // no elements: any shape is a view (torch keeps the strides for the same shape, else takes contiguous ones)
  if (t.numel === 0) return newShape.join() === t.shape.join() ? [...t.strides] : contiguousStrides(newShape);
  if (t.isContiguous) return contiguousStrides(newShape);
  // Merge chunks of old dims that are contiguous with each other, then split them into new dims.
  const oldShape = t.shape;
  const oldStrides = t.strides;
  const newStrides = new Array<number>(newShape.length).fill(0);
  let viewD = newShape.length - 1;
  let chunkBase = oldStrides[oldStrides.length - 1] ?? 1;
  let tensorNumel = 1;
  let viewNumel = 1;
  for (let d = oldShape.length - 1; d >= 0; d--) {
    tensorNumel *= oldShape[d]!;
    if (d === 0 || (oldShape[d - 1] !== 1 && oldStrides[d - 1] !== tensorNumel * chunkBase)) {
      while (viewD >= 0 && (viewNumel < tensorNumel || newShape[viewD] === 1)) {
        newStrides[viewD] = viewNumel * chunkBase;
        viewNumel *= newShape[viewD]!;
        viewD--;
      }
      if (viewNumel !== tensorNumel) return null;
      if (d > 0) {
        chunkBase = oldStrides[d - 1]!;
        tensorNumel = 1;
        viewNumel = 1;
      }
    }
  }
  if (viewD !== -1) return null;
  return newStrides;
}

export function view(t: Tensor, shape: number[]): Tensor {
  const s = inferShape("view", shape, t.numel);
  const strides = viewStrides(t, s);
  if (!strides) throw new OpError("view", "view size is not compatible with the input's strides; use reshape()");
  const out = makeView(t, s, strides, t.offset);
  recordOp("view", [t], out, { shape: t.shape });
  return out;
}

export function reshape(t: Tensor, shape: number[]): Tensor {
  const s = inferShape("reshape", shape, t.numel);
  if (viewStrides(t, s)) return view(t, s);
  const c = contiguous(t);
  const out = view(c, s);
  c.dispose();
  return out;
}

export function permute(t: Tensor, dims: number[]): Tensor {
  if (dims.length !== t.ndim) throw new OpError("permute", `expected ${t.ndim} dims, got ${dims.length}`);
  const nd = dims.map((d) => normDim(d, t.ndim, "permute"));
  if (new Set(nd).size !== nd.length) throw new OpError("permute", "repeated dimension");
  const out = makeView(t, nd.map((d) => t.shape[d]!), nd.map((d) => t.strides[d]!), t.offset, "permute");
  recordOp("permute", [t], out, { dims: nd });
  return out;
}

export function transpose(t: Tensor, d0: number, d1: number): Tensor {
  t.view_("transpose"); // disposed check under this op's name
  const dims = Array.from({ length: t.ndim }, (_, i) => i);
  const a = normDim(d0, t.ndim, "transpose");
  const b = normDim(d1, t.ndim, "transpose");
  if (t.ndim === 0) return permute(t, []); // torch: a 0-d tensor's transpose(0, -1) is a view of itself
  dims[a] = b;
  dims[b] = a;
  return permute(t, dims);
}

export function narrow(t: Tensor, dim: number, start: number, length: number): Tensor {
  checkHasDims(t, "narrow");
  const d = normDim(dim, t.ndim, "narrow");
  t.view_("narrow");
  if (start < 0) start += t.shape[d]!;
  if (start < 0 || length < 0 || start + length > t.shape[d]!)
    throw new OpError("narrow", `range [${start}, ${start + length}) out of bounds for size ${t.shape[d]}`);
  return slice(t, d, start, start + length, 1);
}

export function slice(t: Tensor, dim: number, start = 0, end?: number, step = 1): Tensor {
  checkHasDims(t, "slice");
  const d = normDim(dim, t.ndim, "slice");
  const size = t.shape[d]!;
  if (step <= 0) throw new OpError("slice", "step must be positive");
  const clampIdx = (i: number) => Math.min(Math.max(i < 0 ? i + size : i, 0), size);
  const s = clampIdx(start);
  const e = Math.max(clampIdx(end ?? size), s);
  const shape = [...t.shape];
  shape[d] = Math.ceil((e - s) / step);
  const strides = [...t.strides];
  strides[d] = t.strides[d]! * step;
  const out = makeView(t, shape, strides, t.offset + s * t.strides[d]!, "slice");
  recordOp("slice", [t], out, { dim: d, start: s, step, inputShape: t.shape });
  return out;
}

export function select(t: Tensor, dim: number, index: number): Tensor {
  checkHasDims(t, "select");
  const d = normDim(dim, t.ndim, "select");
  t.view_("select");
  const size = t.shape[d]!;
  const i = index < 0 ? index + size : index;
  if (i < 0 || i >= size) throw new IndexOutOfRangeError("select", `index ${index} out of range for size ${size}`);
  const s = slice(t, d, i, i + 1);
  const out = squeeze(s, d);
  s.dispose();
  return out;
}

export function expand(t: Tensor, shape: number[]): Tensor {
  if (shape.length < t.ndim) throw new OpError("expand", `cannot expand [${t.shape.join(", ")}] to [${shape.join(", ")}]`);
  const lead = shape.length - t.ndim;
  const strides: number[] = [];
  const out: number[] = [];
  for (let i = 0; i < shape.length; i++) {
    const src = i - lead;
    const want = shape[i]!;
    if (!Number.isInteger(want) || want < -1)
      throw new OpError("expand", `cannot expand [${t.shape.join(", ")}] to [${shape.join(", ")}]: sizes must be non-negative integers (or -1 to keep a dim)`);
    if (src < 0) {
      if (want < 0) throw new OpError("expand", "-1 not allowed for new leading dims");
      out.push(want);
      strides.push(0);
      continue;
    }
    const have = t.shape[src]!;
    if (want === -1 || want === have) {
      out.push(have);
      strides.push(t.strides[src]!);
    } else if (have === 1) {
      out.push(want);
      strides.push(0);
    } else throw new OpError("expand", `cannot expand [${t.shape.join(", ")}] to [${shape.join(", ")}]`);
  }
  const r = makeView(t, out, strides, t.offset, "expand");
  recordOp("expand", [t], r, { inputShape: t.shape });
  return r;
}

export function squeeze(t: Tensor, dim?: number): Tensor {
  let keep: number[];
  if (dim === undefined) keep = t.shape.map((_, i) => i).filter((i) => t.shape[i] !== 1);
  else {
    const d = normDim(dim, t.ndim, "squeeze");
    keep = t.shape.map((_, i) => i).filter((i) => i !== d || t.shape[i] !== 1);
  }
  const out = makeView(t, keep.map((i) => t.shape[i]!), keep.map((i) => t.strides[i]!), t.offset, "squeeze");
  recordOp("view", [t], out, { shape: t.shape });
  return out;
}

export function unsqueeze(t: Tensor, dim: number): Tensor {
  const d = dim < 0 ? dim + t.ndim + 1 : dim;
  if (d < 0 || d > t.ndim) throw new OpError("unsqueeze", `dimension ${dim} out of range`);
  const shape = [...t.shape];
  const strides = [...t.strides];
  shape.splice(d, 0, 1);
  strides.splice(d, 0, d < t.ndim ? t.strides[d]! * t.shape[d]! : 1);
  const out = makeView(t, shape, strides, t.offset, "unsqueeze");
  recordOp("view", [t], out, { shape: t.shape });
  return out;
}

export function flatten(t: Tensor, startDim = 0, endDim = -1): Tensor {
  if (t.ndim === 0) return reshape(t, [1]);
  const s = normDim(startDim, t.ndim, "flatten");
  const e = normDim(endDim, t.ndim, "flatten");
  if (s > e) throw new OpError("flatten", `flatten() has invalid args: start_dim (${startDim}) cannot come after end_dim (${endDim})`);
  const shape = [...t.shape.slice(0, s), numel(t.shape.slice(s, e + 1)), ...t.shape.slice(e + 1)];
  return reshape(t, shape);
}

/** Copies t into a new contiguous tensor of the given dtype/device (the one copy primitive). */
function copyTo(t: Tensor, dtype: DType, device: Device): Tensor {
  if (device !== t.device) {
    // Cross-device: stage through host bytes of a contiguous copy.
    const src = t.isContiguous && t.offset === 0 ? t : copyTo(t, t.dtype, t.device);
    const out = empty(t.shape, { dtype: t.dtype, device });
    flushDeferred();
    const bytes = t.device.backend.read(src.storage.buffer, 0, out.storage.buffer.byteLength);
    device.backend.write(out.storage.buffer, 0, bytes.subarray(0, out.storage.buffer.byteLength));
    if (src !== t) src.dispose();
    if (dtype === t.dtype) return out;
    const cast = copyTo(out, dtype, device);
    out.dispose();
    return cast;
  }
  const out = emptyOutput(t.shape, { dtype, device }); // the copy writes every element
  runKernel("copy", device, { op: "copy", x: t.view_("copy"), out: out.view_("copy") }, [out]);
  return out;
}

export function contiguous(t: Tensor): Tensor {
  if (t.isContiguous) {
    // A contiguous tensor returns itself, as in torch (callers must not dispose it separately).
    return t;
  }
  const out = copyTo(t, t.dtype, t.device);
  recordOp("identity", [t], out);
  return out;
}

export function clone(t: Tensor): Tensor {
  const out = copyTo(t, t.dtype, t.device);
  recordOp("identity", [t], out);
  return out;
}

export function to(t: Tensor, dtypeOrDevice: DType | Device, dtype?: DType): Tensor {
  let dev = t.device;
  let dt = t.dtype;
  if (typeof dtypeOrDevice === "string") dt = dtypeOrDevice;
  else {
    dev = dtypeOrDevice;
    if (dtype) dt = dtype;
  }
  checkDType(dt);
  if (dev === t.device && dt === t.dtype) return t;
  const out = copyTo(t, dt, dev);
  recordOp("cast", [t], out, { dtype: t.dtype });
  return out;
}

export function detach(t: Tensor): Tensor {
  return makeView(t, t.shape, t.strides, t.offset, "detach");
}

/** Broadcast shape of two shapes (numpy rules). */
export function broadcastShapes(op: string, a: Shape, b: Shape): number[] {
  const n = Math.max(a.length, b.length);
  const out = new Array<number>(n);
  for (let i = 0; i < n; i++) {
    const x = a[a.length - n + i] ?? 1;
    const y = b[b.length - n + i] ?? 1;
    if (x !== y && x !== 1 && y !== 1)
      throw new OpError(op, `shapes [${a.join(", ")}] and [${b.join(", ")}] cannot be broadcast`);
    out[i] = x === 1 ? y : x;
  }
  return out;
}

/** A stride-0 view of t broadcast to shape (no autograd record: callers record the op that used it). */
export function broadcastView(t: Tensor, shape: Shape, op = "broadcast"): Tensor {
  const lead = shape.length - t.ndim;
  const strides = shape.map((s, i) => {
    const src = i - lead;
    if (src < 0) return 0;
    return t.shape[src] === 1 && s !== 1 ? 0 : t.strides[src]!;
  });
  return makeView(t, shape, strides, t.offset, op);
}
