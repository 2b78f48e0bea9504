// Broadcasting elementwise arithmetic, math, comparisons, where, and the in-place forms.
import type { BinaryOp, UnaryOp } from "../../backends/backend.js";
import { binaryResultDtype, binaryScalarDtype, isFloating, promoteTypes, unaryResultDtype, whereResultDtype, type DType } from "../../backends/dtype.js";
import { OpError } from "../../util/errors.js";
import { runKernel, sameDevice } from "../dispatch.js";
import { isGradEnabled, noGrad, recordOp } from "../grad-mode.js";
import { emptyOutput, full, Tensor, type TensorOrScalar } from "../tensor.js";
import { broadcastShapes, broadcastView } from "./shape.js";

/** A scalar operand as a 0-d tensor next to `like`, in binaryScalarDtype (torch's opmath: float32 for 16-bit floats). */
function asTensor(x: TensorOrScalar, like: Tensor, op: BinaryOp): Tensor {
  if (x instanceof Tensor) return x;
  return full([], typeof x === "boolean" ? (x ? 1 : 0) : x, { dtype: binaryScalarDtype(op, like.dtype, x), device: like.device });
}

export function binary(op: BinaryOp, a: TensorOrScalar, b: TensorOrScalar): Tensor {
  if (!(a instanceof Tensor) && !(b instanceof Tensor)) throw new OpError(op, "needs at least one tensor");
  for (const x of [a, b]) if (x instanceof Tensor) x.view_(op); // disposed check before allocating
  if (op === "sub") checkBoolSub(a, b);
  if (op === "remainder") checkIntegerDivisor(op, a, b);
  // torch checks a scalar exponent (a tensor one would need its values read back)
  if (op === "pow" && a instanceof Tensor && !isFloating(a.dtype) && typeof b === "number" && Number.isInteger(b) && b < 0)
    throw new OpError("pow", "Integers to negative integer powers are not allowed.");
  const ta = asTensor(a, (b instanceof Tensor ? b : a) as Tensor, op);
  const tb = asTensor(b, ta, op);
  const dev = sameDevice(op, ta, tb);
  // torch's promotion (dtype.ts, shared with compile()'s tracer): a 0-d tensor or a scalar raises only the category
  const dtype = binaryResultDtype(op, a instanceof Tensor ? ta : (a as number | boolean), b instanceof Tensor ? tb : (b as number | boolean));
  const shape = broadcastShapes(op, ta.shape, tb.shape);
  const out = emptyOutput(shape, { dtype, device: dev }); // the kernel writes every element
  const va = broadcastView(ta, shape, op);
  const vb = broadcastView(tb, shape, op);
  runKernel(op, dev, { op: "binary", fn: op, a: va.view_(op), b: vb.view_(op), out: out.view_(op) }, [out]);
  va.dispose();
  vb.dispose();
  recordOp(op, [a instanceof Tensor ? ta : null, b instanceof Tensor ? tb : null], out, {
    aScalar: a instanceof Tensor ? undefined : a,
    bScalar: b instanceof Tensor ? undefined : b,
  });
  if (!(a instanceof Tensor)) ta.dispose();
  if (!(b instanceof Tensor)) tb.dispose();
  return out;
}

/**
 * torch's integer remainder (as its floor / trunc division) raises "ZeroDivisionError" on a zero divisor, where the
 * float kernel gives NaN and its cast to an integer dtype garbage. Float operands keep NaN. Reads a tensor divisor
 * back to the host (integer operands only).
 */
function checkIntegerDivisor(op: BinaryOp, a: TensorOrScalar, b: TensorOrScalar): void {
  const integral = (x: TensorOrScalar) => (x instanceof Tensor ? !isFloating(x.dtype) : typeof x === "boolean" || Number.isInteger(x));
  if (!integral(a) || !integral(b)) return;
  if (b instanceof Tensor ? !hasZero(b) : Number(b) !== 0) return;
  const tensors = [a, b].filter((x): x is Tensor => x instanceof Tensor);
  const dtype = tensors.map((t) => t.dtype).reduce(promoteTypes);
  throw new OpError(op, `ZeroDivisionError: integer division by zero (${dtype} on ${tensors[0]!.device.name})`);
}

function hasZero(t: Tensor): boolean {
  const values = t.dataSync();
  for (let i = 0; i < values.length; i++) if (Number(values[i]) === 0) return true;
  return false;
}

/** torch refuses `-` on bool operands (a JS boolean counts as one): invert a mask with logicalNot instead. */
function checkBoolSub(a: TensorOrScalar, b: TensorOrScalar): void {
  const isBool = (x: TensorOrScalar) => (x instanceof Tensor ? x.dtype === "bool" : typeof x === "boolean");
  if (isBool(a) && isBool(b))
    throw new OpError("sub", "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` operator instead.");
  if (isBool(a) || isBool(b))
    throw new OpError("sub", "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.");
}

export function unary(op: UnaryOp, x: Tensor, recordName: string = op): Tensor {
  if (op === "neg" && x.dtype === "bool")
    throw new OpError("neg", "Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.");
  const out = emptyOutput(x.shape, { dtype: unaryResultDtype(op, x.dtype), device: x.device }); // written whole
  runKernel(op, x.device, { op: "unary", fn: op, x: x.view_(op), out: out.view_(op) }, [out]);
  recordOp(recordName, [x], out);
  return out;
}

export const add = (a: TensorOrScalar, b: TensorOrScalar, alpha?: number): Tensor => {
  if (alpha === undefined || alpha === 1) return binary("add", a, b);
  const scaled = binary("mul", b, alpha);
  const out = binary("add", a, scaled);
  scaled.dispose();
  return out;
};
export const sub = (a: TensorOrScalar, b: TensorOrScalar): Tensor => binary("sub", a, b);
export const mul = (a: TensorOrScalar, b: TensorOrScalar): Tensor => binary("mul", a, b);
export const div = (a: TensorOrScalar, b: TensorOrScalar): Tensor => binary("div", a, b);
export const pow = (a: TensorOrScalar, b: TensorOrScalar): Tensor => binary("pow", a, b);
export const maximum = (a: TensorOrScalar, b: TensorOrScalar): Tensor => binary("maximum", a, b);
export const minimum = (a: TensorOrScalar, b: TensorOrScalar): Tensor => binary("minimum", a, b);
export const remainder = (a: TensorOrScalar, b: TensorOrScalar): Tensor => binary("remainder", a, b);
export const eq = (a: TensorOrScalar, b: TensorOrScalar): Tensor => binary("eq", a, b);
export const ne = (a: TensorOrScalar, b: TensorOrScalar): Tensor => binary("ne", a, b);
export const lt = (a: TensorOrScalar, b: TensorOrScalar): Tensor => binary("lt", a, b);
export const le = (a: TensorOrScalar, b: TensorOrScalar): Tensor => binary("le", a, b);
export const gt = (a: TensorOrScalar, b: TensorOrScalar): Tensor => binary("gt", a, b);
export const ge = (a: TensorOrScalar, b: TensorOrScalar): Tensor => binary("ge", a, b);
export const logicalAnd = (a: TensorOrScalar, b: TensorOrScalar): Tensor => binary("logical_and", a, b);
export const logicalOr = (a: TensorOrScalar, b: TensorOrScalar): Tensor => binary("logical_or", a, b);

export const neg = (x: Tensor): Tensor => unary("neg", x);
export const exp = (x: Tensor): Tensor => unary("exp", x);
export const log = (x: Tensor): Tensor => unary("log", x);
export const sqrt = (x: Tensor): Tensor => unary("sqrt", x);
export const rsqrt = (x: Tensor): Tensor => unary("rsqrt", x);
export const tanh = (x: Tensor): Tensor => unary("tanh", x);
export const sigmoid = (x: Tensor): Tensor => unary("sigmoid", x);
export const silu = (x: Tensor): Tensor => unary("silu", x);
export const gelu = (x: Tensor, approximate: "none" | "tanh" = "none"): Tensor =>
  unary(approximate === "tanh" ? "gelu_tanh" : "gelu", x);
export const relu = (x: Tensor): Tensor => unary("relu", x);
export const abs = (x: Tensor): Tensor => unary("abs", x);
export const square = (x: Tensor): Tensor => unary("square", x);
export const reciprocal = (x: Tensor): Tensor => unary("reciprocal", x);
export const sin = (x: Tensor): Tensor => unary("sin", x);
export const cos = (x: Tensor): Tensor => unary("cos", x);
export const floor = (x: Tensor): Tensor => unary("floor", x);
export const ceil = (x: Tensor): Tensor => unary("ceil", x);
/** Rounds half to even, as torch.round. */
export const round = (x: Tensor): Tensor => unary("round", x);
export const sign = (x: Tensor): Tensor => unary("sign", x);
export const logicalNot = (x: Tensor): Tensor => unary("logical_not", x);

/**
 * where(cond, a, b): elementwise select with broadcasting. The result dtype is torch.result_type(a, b): a scalar, or
 * a 0-d tensor next to a dimensioned one, raises only the category (where(c, int32, 0.5) is float32, where(c, bf16, 0)
 * and where(c, bf16[n], f32[]) bf16; two integer scalars give int32).
 */
export function where(cond: Tensor, a: TensorOrScalar, b: TensorOrScalar): Tensor {
  for (const x of [cond, a, b]) if (x instanceof Tensor) x.view_("where");
  if (cond.dtype !== "bool") throw new OpError("where", `expected condition to be a boolean tensor, but got ${cond.dtype}`);
  const dtype = whereResultDtype(a, b);
  const ta = a instanceof Tensor ? a : full([], Number(a), { dtype, device: cond.device });
  const tb = b instanceof Tensor ? b : full([], Number(b), { dtype, device: cond.device });
  const dev = sameDevice("where", cond, ta, tb);
  const shape = broadcastShapes("where", broadcastShapes("where", cond.shape, ta.shape), tb.shape);
  const out = emptyOutput(shape, { dtype, device: dev }); // the kernel writes every element
  const vc = broadcastView(cond, shape, "where");
  const va = broadcastView(ta, shape, "where");
  const vb = broadcastView(tb, shape, "where");
  // no debug NaN/Inf check: where only selects existing values (masking with -inf is its normal use)
  runKernel("where", dev, { op: "where", cond: vc.view_("where"), a: va.view_("where"), b: vb.view_("where"), out: out.view_("where") }, []);
  for (const v of [vc, va, vb]) v.dispose();
  recordOp("where", [null, a instanceof Tensor ? ta : null, b instanceof Tensor ? tb : null], out, { cond });
  if (!(a instanceof Tensor)) ta.dispose();
  if (!(b instanceof Tensor)) tb.dispose();
  return out;
}

/** x with value where mask is true; keeps x's dtype (the value is cast to it, as torch's masked_fill). */
export function maskedFill(x: Tensor, mask: Tensor, value: number): Tensor {
  if (mask.dtype !== "bool") throw new OpError("masked_fill", `mask must be bool, got ${mask.dtype}`);
  const v = full([], value, { dtype: x.dtype, device: x.device });
  try {
    return where(mask, v, x);
  } finally {
    v.dispose();
  }
}

/**
 * clamp(x, min, max) = minimum(maximum(x, min), max), one autograd op: as torch, the gradient passes where
 * min <= x <= max (bounds included), where maximum/minimum would split it in half on a tie.
 */
export function clamp(x: Tensor, min?: number, max?: number): Tensor {
  const out = noGrad(() => {
    let cur = x;
    if (min !== undefined) cur = maximum(cur, min);
    if (max !== undefined) {
      const next = minimum(cur, max);
      if (cur !== x) cur.dispose();
      cur = next;
    }
    return cur === x ? x.clone() : cur;
  });
  recordOp("clamp", [x], out, { min, max });
  return out;
}

/**
 * Refuses an in-place op that autograd would have to record: with grad enabled, on a tensor that requires grad, or
 * writing a value that requires grad. Autograd here links nodes through tensors, so rebasing a tensor's history in
 * place (as torch does) would also rewrite the history of every value computed from it earlier, and the gradients
 * would be silently wrong; the out-of-place op (or the write under noGrad, as optimizers do) is the way.
 */
export function checkInPlace(op: string, target: Tensor, ...sources: unknown[]): void {
  if (target.shape.some((n, d) => n > 1 && target.strides[d] === 0))
    throw new OpError(op, "more than one element of the written-to tensor refers to a single memory location (an expanded view); clone() it first");
  if (!isGradEnabled()) return;
  if (target.requiresGrad && target.gradFn === null)
    throw new OpError(op, "a leaf tensor that requires grad cannot be modified in place (outside noGrad())");
  if (target.requiresGrad || sources.some((s) => s instanceof Tensor && s.requiresGrad)) {
    throw new OpError(op, "in-place operations on tensors that require grad are not supported by autograd: use the out-of-place op " +
      "(x = x.add(y) for x.add_(y)), or clone() first");
  }
}

/**
 * Writes `result` into `target` (through views) and disposes result: the in-place form of `op` (checkInPlace
 * first). As in torch, the result must have target's shape (no broadcasting of target itself) and a dtype that casts
 * to target's without losing its kind (no float into an integer tensor, no integer into a bool one); castValue: a
 * scalar fill (masked_fill_) is cast to target's dtype, as torch casts it.
 */
export function inPlace(op: string, target: Tensor, result: Tensor, { castValue = false } = {}): void {
  try {
    if (result.ndim !== target.ndim || result.shape.some((n, d) => n !== target.shape[d]))
      throw new OpError(op, `output with shape [${target.shape.join(", ")}] doesn't match the broadcast shape [${result.shape.join(", ")}]`);
    const kind = (d: DType): number => (d === "bool" ? 0 : isFloating(d) ? 2 : 1);
    if (!castValue && kind(result.dtype) > kind(target.dtype)) throw new OpError(op, `result type ${result.dtype} can't be cast to the desired output type ${target.dtype}`);
    copyInto(target, result);
  } finally {
    result.dispose();
  }
}

/**
 * copy_: broadcasts src to dst's shape and converts dtype. As torch, src and dst sharing some memory is an error
 * (the result would depend on the kernel's traversal order), except for the very same view, a no-op.
 */
export function copyInto(dst: Tensor, src: Tensor): void {
  const dev = sameDevice("copy_", dst, src);
  dst.view_("copy_");
  src.view_("copy_");
  const overlap = dst.storage === src.storage ? checkCopyOverlap(dst, src) : "none";
  if (overlap === "same") return;
  const shape = broadcastShapes("copy_", dst.shape, src.shape);
  if (shape.length !== dst.ndim || shape.some((s, i) => s !== dst.shape[i]))
    throw new OpError("copy_", `cannot copy [${src.shape.join(", ")}] into [${dst.shape.join(", ")}]`);
  // undecided (strided views over a huge span): read src in full first, so the result never depends on the order
  const from = overlap === "unknown" ? src.clone() : src;
  const v = broadcastView(from, dst.shape, "copy_");
  runKernel("copy_", dev, { op: "copy", x: v.view_("copy_"), out: dst.view_("copy_") }, [dst]);
  v.dispose();
  if (from !== src) from.dispose();
  dst.storage.version++;
}

/** dst and src share a storage: "same" view (nothing to copy), "none" in common, or "unknown"; throws on an overlap. */
function checkCopyOverlap(dst: Tensor, src: Tensor): "same" | "none" | "unknown" {
  const sameView = dst.offset === src.offset && dst.ndim === src.ndim &&
    dst.shape.every((n, d) => n === src.shape[d] && (n === 1 || dst.strides[d] === src.strides[d]));
  if (sameView) return "same";
  const overlap = elementsOverlap(dst, src);
  if (overlap === true)
    throw new OpError("copy_", "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location. " +
      "Please clone() the tensor before performing the operation.");
  return overlap === false ? "none" : "unknown";
}

/** Above this many elements of common span, strided views are not compared element by element. */
const MAX_OVERLAP_SCAN = 1 << 26;

/** [first, last] element offsets a view touches (strides are non-negative here). */
function span(t: Tensor): [number, number] {
  let last = t.offset;
  for (let d = 0; d < t.ndim; d++) last += t.strides[d]! * (t.shape[d]! - 1);
  return [t.offset, last];
}

/** torch's is_non_overlapping_and_dense: the elements fill [first, last] exactly once, in some dim order. */
function isDense(t: Tensor): boolean {
  const dims = t.shape.map((n, d) => [n, t.strides[d]!] as const).filter(([n]) => n !== 1).sort((a, b) => a[1] - b[1]);
  let expected = 1;
  for (const [n, stride] of dims) {
    if (stride !== expected) return false;
    expected *= n;
  }
  return true;
}

/**
 * Whether two views of one storage touch a common element: by their spans when both are dense (torch's check),
 * else element by element; "unknown" when that scan would be too large.
 */
function elementsOverlap(a: Tensor, b: Tensor): boolean | "unknown" {
  if (a.numel === 0 || b.numel === 0) return false;
  const [a0, a1] = span(a);
  const [b0, b1] = span(b);
  const lo = Math.max(a0, b0);
  const hi = Math.min(a1, b1);
  if (lo > hi) return false;
  if (isDense(a) && isDense(b)) return true;
  if (hi - lo + 1 > MAX_OVERLAP_SCAN || a.numel + b.numel > MAX_OVERLAP_SCAN) return "unknown";
  // strided views whose spans interleave (a[::2] and a[1::2]): mark a's elements, then look for b's
  const marked = new Uint8Array(hi - lo + 1);
  forEachOffset(a, (o) => {
    if (o >= lo && o <= hi) marked[o - lo] = 1;
  });
  let hit = false;
  forEachOffset(b, (o) => {
    if (o >= lo && o <= hi && marked[o - lo] === 1) hit = true;
  });
  return hit;
}

function forEachOffset(t: Tensor, f: (offset: number) => void): void {
  const walk = (d: number, at: number): void => {
    if (d === t.ndim) return f(at);
    for (let i = 0; i < t.shape[d]!; i++) walk(d + 1, at + i * t.strides[d]!);
  };
  walk(0, t.offset);
}

export function fillInto(dst: Tensor, value: number): void {
  runKernel("fill_", dst.device, { op: "fill", out: dst.view_("fill_"), value }, []);
  dst.storage.version++;
}
