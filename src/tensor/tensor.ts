// Tensor: dtype, shape, strides, offset and a shared device storage. Views share storage (PyTorch semantics).
import type { BufferView } from "../backends/backend.js";
import { DTYPE_BYTES, DTYPES, isDType, isFloating, type DType } from "../backends/dtype.js";
import { DisposedTensorError, OpError } from "../util/errors.js";
import { env } from "../util/env.js";
import { resolveDevice, type Device, type DeviceLike } from "./device.js";
import { Storage, storageFinalizer } from "./storage.js";
import { flushDeferred } from "./dispatch.js";
import { runBackward, type BackwardOptions } from "./grad-mode.js";
// installs the autograd recorder and backward engine (its module body touches only grad-mode.ts)
import "./autograd.js";
import * as ew from "./ops/elementwise.js";
import * as sh from "./ops/shape.js";
import * as rd from "./ops/reduce.js";
import * as la from "./ops/linalg.js";
import * as ix from "./ops/indexing.js";
import * as mx from "./ops/matrix.js";
import * as ra from "./ops/rearrange.js";
import * as st from "./ops/statistics.js";
import * as ac from "./ops/activations.js";

export type Shape = readonly number[];
export type Scalar = number | boolean;
export type TensorOrScalar = Tensor | Scalar;

export function numel(shape: Shape): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

export function contiguousStrides(shape: Shape): number[] {
  const strides = new Array<number>(shape.length);
  let s = 1;
  for (let d = shape.length - 1; d >= 0; d--) {
    strides[d] = s;
    s *= shape[d]!;
  }
  return strides;
}

let nextId = 1;

/** Autograd node attached to a tensor produced by a differentiable op (filled by tensor/autograd.ts). */
export interface GradNode {
  readonly op: string;
  readonly inputs: (Tensor | null)[];
  readonly attrs: Record<string, unknown>;
}

/** torch's two spellings of a size argument: t.view(2, 3) and t.view([2, 3]). */
function sizesArg(args: number[] | [readonly number[]]): number[] {
  return args.length === 1 && Array.isArray(args[0]) ? [...args[0]] : (args as number[]);
}

export class Tensor {
  readonly id = nextId++;
  requiresGrad = false;
  grad: Tensor | null = null;
  gradFn: GradNode | null = null;
  /** Set by retainGrad() for non-leaf tensors whose grad should be kept. */
  retainsGrad = false;
  private disposed = false;

  constructor(
    readonly storage: Storage,
    readonly dtype: DType,
    readonly shape: Shape,
    readonly strides: Shape,
    readonly offset: number,
  ) {
    storage.retain();
    storageFinalizer.register(this, storage, this);
  }

  get device(): Device {
    return this.storage.device;
  }
  get ndim(): number {
    return this.shape.length;
  }
  get numel(): number {
    return numel(this.shape);
  }
  get isDisposed(): boolean {
    return this.disposed;
  }
  size(dim?: number): number | Shape {
    if (dim === undefined) return this.shape;
    if (this.ndim === 0) throw new OpError("size", `dimension specified as ${dim} but tensor has no dimensions`);
    return this.shape[sh.normDim(dim, this.ndim, "size")]!;
  }
  /** True when the elements are laid out densely in row-major order. */
  get isContiguous(): boolean {
    let expected = 1;
    for (let d = this.shape.length - 1; d >= 0; d--) {
      if (this.shape[d] !== 1 && this.strides[d] !== expected) return false;
      expected *= this.shape[d]!;
    }
    return true;
  }

  /** The kernel-facing view; throws if the tensor was disposed. */
  view_(op: string): BufferView {
    if (this.disposed || this.storage.isFreed) throw new DisposedTensorError(op, `tensor #${this.id} was disposed`);
    return { buffer: this.storage.buffer, dtype: this.dtype, shape: this.shape, strides: this.strides, offset: this.offset };
  }

  /** Frees this tensor's hold on its storage now (the storage is freed when no view holds it). */
  dispose(): void {
    // Safe inside autograd graphs: nodes keep their own detached views of every value backward needs
    // (tensor/autograd.ts), so disposing an activation frees it as soon as backward has run.
    if (this.disposed) return;
    this.disposed = true;
    storageFinalizer.unregister(this);
    this.storage.release();
  }
  [Symbol.dispose](): void {
    this.dispose();
  }

  // ---- reading values ----

  /** Waits for pending work and returns the elements in row-major order (float types as Float32Array). */
  async toArray(): Promise<Float32Array | Int32Array | Uint8Array | Int8Array | BigInt64Array> {
    flushDeferred();
    await this.device.backend.synchronize();
    return this.dataSync();
  }

  /**
   * Synchronous read for host back ends (used internally and by tests): blocks the JS thread until the
   * device stream has finished the work this tensor depends on (backend.read waits), then copies out.
   * Prefer `await toArray()` off the hot path: it waits without blocking the event loop.
   */
  dataSync(): Float32Array | Int32Array | Uint8Array | Int8Array | BigInt64Array {
    this.view_("dataSync"); // disposed check
    const c = this.isContiguous ? this : this.contiguous();
    const t = isReducedFloat(this.dtype) ? c.to(readDtype(this.dtype)) : c;
    flushDeferred(); // a sync point of defer-and-fuse (after the copies above, which may be deferred too)
    const bytes = t.device.backend.read(t.storage.buffer, t.offset * DTYPE_BYTES[t.dtype], t.numel * DTYPE_BYTES[t.dtype]);
    if (t !== this) t.dispose();
    if (c !== this) c.dispose();
    const buf = bytes.buffer;
    switch (readDtype(this.dtype)) {
      case "float32":
        return new Float32Array(buf, bytes.byteOffset, this.numel);
      case "int32":
        return new Int32Array(buf, bytes.byteOffset, this.numel);
      case "int8":
        return new Int8Array(buf, bytes.byteOffset, this.numel);
      case "int64":
        return new BigInt64Array(buf, bytes.byteOffset, this.numel);
      default:
        return new Uint8Array(buf, bytes.byteOffset, this.numel);
    }
  }

  /** Elements as plain numbers (row-major). */
  toList(): number[] {
    return Array.from(this.dataSync() as ArrayLike<number | bigint>, Number);
  }

  /** The value of a one-element tensor. */
  item(): number {
    if (this.numel !== 1) throw new OpError("item", `a tensor with ${this.numel} elements cannot be converted to a scalar`);
    return Number(this.dataSync()[0]!);
  }

  toString(): string {
    return `Tensor(shape=[${this.shape.join(", ")}], dtype=${this.dtype}, device=${this.device.name})`;
  }

  // ---- views and shape ops ----
  view(...shape: number[] | [readonly number[]]): Tensor {
    return sh.view(this, sizesArg(shape));
  }
  reshape(...shape: number[] | [readonly number[]]): Tensor {
    return sh.reshape(this, sizesArg(shape));
  }
  permute(...dims: number[] | [readonly number[]]): Tensor {
    return sh.permute(this, sizesArg(dims));
  }
  transpose(d0: number, d1: number): Tensor {
    return sh.transpose(this, d0, d1);
  }
  /** torch's Tensor.T: the dims reversed (the matrix transpose of a 2-d tensor; a 0-d or 1-d tensor's own view). */
  get T(): Tensor {
    return sh.permute(this, Array.from({ length: this.ndim }, (_, i) => this.ndim - 1 - i));
  }
  /** torch's Tensor.mT: the last two dims swapped (a batch of matrices transposed). */
  get mT(): Tensor {
    return sh.transpose(this, -2, -1);
  }
  narrow(dim: number, start: number, length: number): Tensor {
    return sh.narrow(this, dim, start, length);
  }
  slice(dim: number, start?: number, end?: number, step = 1): Tensor {
    return sh.slice(this, dim, start, end, step);
  }
  select(dim: number, index: number): Tensor {
    return sh.select(this, dim, index);
  }
  expand(...shape: number[] | [readonly number[]]): Tensor {
    return sh.expand(this, sizesArg(shape));
  }
  squeeze(dim?: number): Tensor {
    return sh.squeeze(this, dim);
  }
  unsqueeze(dim: number): Tensor {
    return sh.unsqueeze(this, dim);
  }
  flatten(startDim = 0, endDim = -1): Tensor {
    return sh.flatten(this, startDim, endDim);
  }
  contiguous(): Tensor {
    return sh.contiguous(this);
  }
  clone(): Tensor {
    return sh.clone(this);
  }
  /** Casts to a dtype and/or moves to a device (a no-op returns this). */
  to(dtypeOrDevice: DType | Device, dtype?: DType): Tensor {
    return sh.to(this, dtypeOrDevice, dtype);
  }
  detach(): Tensor {
    return sh.detach(this);
  }

  // ---- autograd (engine in tensor/autograd.ts) ----
  /**
   * Accumulates d(this)/d(leaf) into every leaf's .grad (grad defaults to 1 for a one-element tensor).
   * @example const w = randn([3], { requiresGrad: true }); w.square().sum().backward(); w.grad // 2w
   */
  backward(grad?: Tensor, options?: BackwardOptions): void {
    runBackward(this, grad, options);
  }
  /** Keeps .grad on this non-leaf tensor after backward (leaves always keep theirs). */
  retainGrad(): this {
    if (this.gradFn !== null) this.retainsGrad = true;
    return this;
  }
  /** Marks a leaf as requiring grad (in place), as torch's requires_grad_(). */
  requiresGrad_(on = true): this {
    if (on) checkGradDtype(this.dtype);
    // as torch: turning it off on a computed tensor would silently cut the gradient of everything computed from it
    if (!on && this.gradFn !== null)
      throw new OpError("requires_grad_", "you can only change requires_grad flags of leaf variables. If you want to use a computed variable " +
        "in a subgraph that doesn't require differentiation use var_no_grad = var.detach()");
    this.requiresGrad = on;
    return this;
  }

  // ---- elementwise ----
  add(o: TensorOrScalar, alpha?: number): Tensor {
    return ew.add(this, o, alpha);
  }
  sub(o: TensorOrScalar): Tensor {
    return ew.sub(this, o);
  }
  mul(o: TensorOrScalar): Tensor {
    return ew.mul(this, o);
  }
  div(o: TensorOrScalar): Tensor {
    return ew.div(this, o);
  }
  pow(o: TensorOrScalar): Tensor {
    return ew.pow(this, o);
  }
  maximum(o: TensorOrScalar): Tensor {
    return ew.maximum(this, o);
  }
  minimum(o: TensorOrScalar): Tensor {
    return ew.minimum(this, o);
  }
  eq(o: TensorOrScalar): Tensor {
    return ew.eq(this, o);
  }
  ne(o: TensorOrScalar): Tensor {
    return ew.ne(this, o);
  }
  lt(o: TensorOrScalar): Tensor {
    return ew.lt(this, o);
  }
  le(o: TensorOrScalar): Tensor {
    return ew.le(this, o);
  }
  gt(o: TensorOrScalar): Tensor {
    return ew.gt(this, o);
  }
  ge(o: TensorOrScalar): Tensor {
    return ew.ge(this, o);
  }
  neg(): Tensor {
    return ew.neg(this);
  }
  exp(): Tensor {
    return ew.exp(this);
  }
  log(): Tensor {
    return ew.log(this);
  }
  sqrt(): Tensor {
    return ew.sqrt(this);
  }
  rsqrt(): Tensor {
    return ew.rsqrt(this);
  }
  tanh(): Tensor {
    return ew.tanh(this);
  }
  sigmoid(): Tensor {
    return ew.sigmoid(this);
  }
  silu(): Tensor {
    return ew.silu(this);
  }
  gelu(approximate: "none" | "tanh" = "none"): Tensor {
    return ew.gelu(this, approximate);
  }
  relu(): Tensor {
    return ew.relu(this);
  }
  abs(): Tensor {
    return ew.abs(this);
  }
  square(): Tensor {
    return ew.square(this);
  }
  clamp(min?: number, max?: number): Tensor {
    return ew.clamp(this, min, max);
  }
  where(cond: Tensor, other: TensorOrScalar): Tensor {
    return ew.where(cond, this, other);
  }
  maskedFill(mask: Tensor, value: number): Tensor {
    return ew.maskedFill(this, mask, value);
  }

  // ---- in place (mutate through views; refused where autograd would have to record them: ew.checkInPlace) ----
  add_(o: TensorOrScalar, alpha?: number): this {
    ew.checkInPlace("add_", this, o);
    ew.inPlace("add_", this, ew.add(this, o, alpha));
    return this;
  }
  sub_(o: TensorOrScalar): this {
    ew.checkInPlace("sub_", this, o);
    ew.inPlace("sub_", this, ew.sub(this, o));
    return this;
  }
  mul_(o: TensorOrScalar): this {
    ew.checkInPlace("mul_", this, o);
    ew.inPlace("mul_", this, ew.mul(this, o));
    return this;
  }
  div_(o: TensorOrScalar): this {
    ew.checkInPlace("div_", this, o);
    ew.inPlace("div_", this, ew.div(this, o));
    return this;
  }
  copy_(src: Tensor): this {
    ew.checkInPlace("copy_", this, src);
    ew.copyInto(this, src);
    return this;
  }
  fill_(value: number): this {
    ew.checkInPlace("fill_", this);
    ew.fillInto(this, value);
    return this;
  }
  maskedFill_(mask: Tensor, value: number): this {
    ew.checkInPlace("masked_fill_", this);
    ew.inPlace("masked_fill_", this, ew.maskedFill(this, mask, value), { castValue: true });
    return this;
  }
  indexCopy_(dim: number, index: Tensor, src: Tensor): this {
    ew.checkInPlace("index_copy_", this, src);
    ix.indexCopyInto(this, dim, index, src);
    return this;
  }

  // ---- reductions ----
  sum(dim?: number | number[], keepdim = false): Tensor {
    return rd.sum(this, dim, keepdim);
  }
  mean(dim?: number | number[], keepdim = false): Tensor {
    return rd.mean(this, dim, keepdim);
  }
  max(dim?: number, keepdim = false): Tensor {
    return rd.max(this, dim, keepdim);
  }
  min(dim?: number, keepdim = false): Tensor {
    return rd.min(this, dim, keepdim);
  }
  argmax(dim?: number, keepdim = false): Tensor {
    return rd.argmax(this, dim, keepdim);
  }
  argmin(dim?: number, keepdim = false): Tensor {
    return rd.argmin(this, dim, keepdim);
  }
  softmax(dim = -1): Tensor {
    return rd.softmax(this, dim);
  }
  logSoftmax(dim = -1): Tensor {
    return rd.logSoftmax(this, dim);
  }
  logsumexp(dim: number, keepdim = false): Tensor {
    return rd.logsumexp(this, dim, keepdim);
  }
  cumsum(dim: number): Tensor {
    return rd.cumsum(this, dim);
  }

  // ---- linear algebra and indexing ----
  matmul(o: Tensor): Tensor {
    return la.matmul(this, o);
  }
  indexSelect(dim: number, index: Tensor): Tensor {
    return ix.indexSelect(this, dim, index);
  }
  gather(dim: number, index: Tensor): Tensor {
    return ix.gather(this, dim, index);
  }
  tril(diagonal = 0): Tensor {
    return mx.tril(this, diagonal);
  }
  triu(diagonal = 0): Tensor {
    return mx.triu(this, diagonal);
  }
  diagonal(offset = 0, dim1 = 0, dim2 = 1): Tensor {
    return mx.diagonal(this, offset, dim1, dim2);
  }
  diag(diagonal = 0): Tensor {
    return mx.diag(this, diagonal);
  }
  trace(): Tensor {
    return mx.trace(this);
  }
  outer(o: Tensor): Tensor {
    return mx.outer(this, o);
  }
  addmm(a: Tensor, b: Tensor, options?: mx.ScaleOptions): Tensor {
    return mx.addmm(this, a, b, options);
  }

  // ---- rearranging (ops/rearrange.ts) ----
  flip(...dims: number[] | [readonly number[]]): Tensor {
    return ra.flip(this, sizesArg(dims));
  }
  roll(shifts: number | readonly number[], dims?: number | readonly number[]): Tensor {
    return ra.roll(this, shifts, dims);
  }
  repeat(...sizes: number[] | [readonly number[]]): Tensor {
    return ra.repeat(this, ...sizesArg(sizes));
  }
  tile(...dims: number[] | [readonly number[]]): Tensor {
    return ra.tile(this, sizesArg(dims));
  }
  repeatInterleave(repeats: number, dim?: number): Tensor {
    return ra.repeatInterleave(this, repeats, dim);
  }

  // ---- statistics and value tests (ops/statistics.ts) ----
  var(dim?: number | readonly number[], options?: st.VarOptions): Tensor {
    return st.variance(this, dim, options);
  }
  std(dim?: number | readonly number[], options?: st.VarOptions): Tensor {
    return st.std(this, dim, options);
  }
  norm(p: number | "fro" = 2, dim?: number | readonly number[], keepdim = false): Tensor {
    return st.norm(this, p, dim, keepdim);
  }
  amax(dim?: number | number[], keepdim = false): Tensor {
    return rd.amax(this, dim, keepdim);
  }
  amin(dim?: number | number[], keepdim = false): Tensor {
    return rd.amin(this, dim, keepdim);
  }
  isnan(): Tensor {
    return st.isnan(this);
  }
  isinf(): Tensor {
    return st.isinf(this);
  }
  isfinite(): Tensor {
    return st.isfinite(this);
  }

  // ---- elementwise extras (ops/activations.ts) ----
  lerp(end: Tensor, weight: TensorOrScalar): Tensor {
    return ac.lerp(this, end, weight);
  }
  log1p(): Tensor {
    return ac.log1p(this);
  }
  clampMin(min: number): Tensor {
    return ac.clampMin(this, min);
  }
  clampMax(max: number): Tensor {
    return ac.clampMax(this, max);
  }
}

function isReducedFloat(d: DType): boolean {
  return d === "float16" || d === "bfloat16" || d === "float8_e4m3fn" || d === "float8_e5m2";
}

/** The dtype dataSync() returns values in: reduced floats widen to float32, bool/uint8 stay bytes. */
function readDtype(d: DType): DType {
  return isReducedFloat(d) ? "float32" : d;
}

// ---- construction ----

export interface TensorOptions {
  dtype?: DType;
  device?: DeviceLike;
  requiresGrad?: boolean;
}

/** Allocates an uninitialised contiguous tensor. */
export function empty(shape: Shape, options: TensorOptions = {}): Tensor {
  return allocateContiguous(shape, options, false);
}

/**
 * empty() for a kernel output the kernel writes whole before anything reads it (elementwise ops, copies, matmul
 * with K > 0): memory the host allocator hands out again is not zeroed first. Only at call sites that hold to that.
 */
export function emptyOutput(shape: Shape, options: TensorOptions = {}): Tensor {
  return allocateContiguous(shape, options, true);
}

function allocateContiguous(shape: Shape, options: TensorOptions, overwritten: boolean): Tensor {
  for (const d of shape) {
    if (!Number.isInteger(d) || d < 0) throw new OpError("empty", `invalid shape [${shape.join(", ")}]`);
  }
  const dev = resolveDevice(options.device);
  const dtype = options.dtype ?? "float32";
  checkDType(dtype);
  const t = new Tensor(Storage.allocate(dev, numel(shape) * DTYPE_BYTES[dtype], overwritten), dtype, [...shape], contiguousStrides(shape), 0);
  if (options.requiresGrad) {
    checkGradDtype(dtype);
    t.requiresGrad = true;
  }
  return t;
}

/** A dtype given from plain JS (or a cast) that Kiln has no storage for, named with the ones it has. */
export function checkDType(dtype: unknown): asserts dtype is DType {
  if (!isDType(dtype)) throw new OpError("dtype", `${JSON.stringify(dtype)} is not a dtype Kiln stores (${DTYPES.join(", ")})`);
}

/** Only floating-point tensors can require gradients (torch's rule). */
function checkGradDtype(dtype: DType): void {
  if (!isFloating(dtype)) throw new OpError("requires_grad", `only tensors of floating point dtype can require gradients, got ${dtype}`);
}

/**
 * A tensor with a shape and dtype but no elements (its one-byte storage is released at once): any kernel that
 * reads it throws DisposedTensorError. Stands for a parameter that a loader replaces, so building the module
 * allocates nothing that is thrown away.
 */
export function unallocated(shape: Shape, options: TensorOptions = {}): Tensor {
  const t = new Tensor(Storage.allocate(resolveDevice(options.device), 1), options.dtype ?? "float32", [...shape], shape.map(() => 0), 0);
  t.dispose();
  return t;
}

type NestedArray = number | boolean | NestedArray[];

function inferShape(data: NestedArray): number[] {
  const shape: number[] = [];
  let cur: NestedArray = data;
  while (Array.isArray(cur)) {
    shape.push(cur.length);
    cur = cur[0] as NestedArray;
  }
  return shape;
}

function flattenNested(data: NestedArray, shape: number[], out: number[], depth = 0): void {
  if (depth === shape.length) {
    if (Array.isArray(data)) throw new OpError("tensor", "ragged nested array");
    out.push(typeof data === "boolean" ? (data ? 1 : 0) : data);
    return;
  }
  if (!Array.isArray(data) || data.length !== shape[depth]) throw new OpError("tensor", "ragged nested array");
  for (const x of data) flattenNested(x, shape, out, depth + 1);
}

type TypedData = Float32Array | Float64Array | Int32Array | Int8Array | Uint8Array | Uint16Array | BigInt64Array;

/**
 * Creates a tensor from nested arrays, a flat typed array (with options.shape) or a scalar.
 * @example tensor([[1, 2], [3, 4]]).sum().item() // 10
 */
export function tensor(data: NestedArray | TypedData, options: TensorOptions & { shape?: Shape } = {}): Tensor {
  let shape: number[];
  let values: ArrayLike<number> | TypedData;
  if (ArrayBuffer.isView(data)) {
    shape = options.shape ? [...options.shape] : [data.length];
    values = data;
  } else {
    shape = options.shape ? [...options.shape] : inferShape(data);
    const flat: number[] = [];
    flattenNested(data, inferShape(data), flat);
    values = flat;
  }
  if (numel(shape) !== values.length) throw new OpError("tensor", `shape [${shape.join(", ")}] does not match ${values.length} values`);
  const dtype = options.dtype ?? defaultDtypeFor(data);
  const t = empty(shape, { ...options, dtype });
  writeValues(t, values);
  return t;
}

function defaultDtypeFor(data: NestedArray | TypedData): DType {
  if (data instanceof Int32Array) return "int32";
  if (data instanceof BigInt64Array) return "int64";
  if (data instanceof Uint8Array) return "uint8";
  if (data instanceof Int8Array) return "int8";
  if (typeof data === "boolean") return "bool";
  if (Array.isArray(data)) {
    let cur: NestedArray = data;
    while (Array.isArray(cur) && cur.length > 0) cur = cur[0] as NestedArray;
    if (typeof cur === "boolean") return "bool";
  }
  return "float32";
}

/** Writes raw element values (already in the tensor's dtype encoding when the typed array matches it). */
function writeValues(t: Tensor, values: ArrayLike<number> | TypedData): void {
  const backend = t.device.backend;
  const bytesPer = DTYPE_BYTES[t.dtype];
  // Exact byte-level match: copy bytes as they are (bf16/f16 bits in a Uint16Array, f32, i32...).
  const sameEncoding =
    (t.dtype === "float32" && values instanceof Float32Array) ||
    (t.dtype === "int32" && values instanceof Int32Array) ||
    (t.dtype === "int64" && values instanceof BigInt64Array) ||
    ((t.dtype === "bfloat16" || t.dtype === "float16") && values instanceof Uint16Array) ||
    ((t.dtype === "uint8" || t.dtype === "bool" || t.dtype === "float8_e4m3fn" || t.dtype === "float8_e5m2") && values instanceof Uint8Array) ||
    (t.dtype === "int8" && values instanceof Int8Array);
  if (sameEncoding) {
    const v = values as TypedData;
    backend.write(t.storage.buffer, 0, new Uint8Array(v.buffer, v.byteOffset, t.numel * bytesPer));
    return;
  }
  if (values instanceof BigInt64Array) values = Float64Array.from(values, Number);
  if (t.dtype === "int64") {
    // written as 64-bit integers directly: an int32 staging tensor would wrap values past 2^31 (torch keeps them);
    // fractions truncate toward zero as the copy kernel does, non-finite values become 0 as they did through int32
    const arr = BigInt64Array.from(values as ArrayLike<number>, (v) => (Number.isFinite(v) ? BigInt(Math.trunc(v)) : 0n));
    backend.write(t.storage.buffer, 0, new Uint8Array(arr.buffer));
    return;
  }
  // Otherwise go through a float32/int32 staging tensor and the copy kernel (which converts dtypes).
  const isInt = t.dtype === "int32" || t.dtype === "int8" || t.dtype === "uint8" || t.dtype === "bool";
  const stagingDtype: DType = isInt ? "int32" : "float32";
  const staging = empty(t.shape, { dtype: stagingDtype, device: t.device });
  // bool: any nonzero value is true, NaN included (through int32 it would have become 0)
  const arr = t.dtype === "bool" ? Int32Array.from(values as ArrayLike<number>, (v) => (v !== 0 ? 1 : 0))
    : isInt ? Int32Array.from(values as ArrayLike<number>) : Float32Array.from(values as ArrayLike<number>);
  backend.write(staging.storage.buffer, 0, new Uint8Array(arr.buffer));
  backend.run({ op: "copy", x: staging.view_("tensor"), out: t.view_("tensor") });
  staging.dispose();
}

export function full(shape: Shape, value: number, options: TensorOptions = {}): Tensor {
  const t = allocateContiguous(shape, options, true); // the fill writes every element: no zeroing first
  t.device.backend.run({ op: "fill", out: t.view_("full"), value });
  return t;
}

export function zeros(shape: Shape, options: TensorOptions = {}): Tensor {
  return full(shape, 0, options);
}

export function ones(shape: Shape, options: TensorOptions = {}): Tensor {
  return full(shape, 1, options);
}

export function zerosLike(t: Tensor, options: TensorOptions = {}): Tensor {
  return zeros(t.shape, { dtype: t.dtype, device: t.device, ...options });
}

export function onesLike(t: Tensor, options: TensorOptions = {}): Tensor {
  return ones(t.shape, { dtype: t.dtype, device: t.device, ...options });
}

export function fullLike(t: Tensor, value: number, options: TensorOptions = {}): Tensor {
  return full(t.shape, value, { dtype: t.dtype, device: t.device, ...options });
}

/** arange(end) or arange(start, end, step); int32 unless a dtype is given or any argument is fractional (then float32). */
export function arange(start: number, end?: number, step = 1, options: TensorOptions = {}): Tensor {
  if (end === undefined) {
    end = start;
    start = 0;
  }
  if (step === 0) throw new OpError("arange", "step must be non-zero");
  // torch's range checks: a finite range whose direction agrees with the step (arange(5, 0) is an error, not empty)
  if (!Number.isFinite(start) || !Number.isFinite(end) || !Number.isFinite(step)) throw new OpError("arange", `unsupported range: ${start} -> ${end} (step ${step})`);
  if ((step > 0 && end < start) || (step < 0 && end > start)) throw new OpError("arange", `upper bound and larger bound inconsistent with step sign: ${start} -> ${end}, step ${step}`);
  const n = Math.max(0, Math.ceil((end - start) / step));
  const integral = Number.isInteger(start) && Number.isInteger(end) && Number.isInteger(step);
  const dtype = options.dtype ?? (integral ? "int32" : "float32");
  const vals = new Float64Array(n);
  for (let i = 0; i < n; i++) vals[i] = start + i * step;
  return tensor(vals, { ...options, dtype, shape: [n] });
}

/** Wraps existing bytes of a given dtype as a new tensor (one copy into device memory). */
export function fromBytes(bytes: Uint8Array, dtype: DType, shape: Shape, options: TensorOptions = {}): Tensor {
  const t = empty(shape, { ...options, dtype });
  if (bytes.byteLength !== t.numel * DTYPE_BYTES[dtype])
    throw new OpError("fromBytes", `${bytes.byteLength} bytes do not hold ${dtype}[${shape.join(", ")}]`);
  t.device.backend.write(t.storage.buffer, 0, bytes);
  return t;
}

/**
 * New tensors of the given dtypes and shapes whose bytes `fill` writes at once (each tensor's bytes, in order): in
 * place on host back ends, so the memory is written once with no staging copy (a loader repacking GGUF blocks
 * straight into the weights); elsewhere into staging arrays then written to the device. `fill` must write every byte.
 */
export function fromBytesFilled(parts: { dtype: DType; shape: Shape }[], fill: (bytes: Uint8Array[]) => void, options: TensorOptions = {}): Tensor[] {
  const ts = parts.map((p) => emptyOutput(p.shape, { ...options, dtype: p.dtype }));
  const lengths = ts.map((t) => t.numel * DTYPE_BYTES[t.dtype]);
  const hosts = ts.map((t) => t.storage.buffer.host);
  if (hosts.every((h) => h !== undefined)) fill(hosts.map((h, i) => new Uint8Array(h!, 0, lengths[i]!)));
  else {
    const staged = lengths.map((n) => new Uint8Array(n));
    fill(staged);
    ts.forEach((t, i) => t.device.backend.write(t.storage.buffer, 0, staged[i]!));
  }
  return ts;
}

/**
 * A tensor over a file's raw little-endian bytes at byteOffset, memory-mapped in place (no read, no copy;
 * copy-on-write) on back ends that map files. Null when the device cannot map, KILN_NO_MMAP=1, or the offset
 * is not a multiple of the element size: the caller reads the bytes instead.
 */
export function mapFromFile(path: string, byteOffset: number, dtype: DType, shape: Shape, options: TensorOptions = {}): Tensor | null {
  const dev = resolveDevice(options.device);
  const byteLength = numel(shape) * DTYPE_BYTES[dtype];
  const backend = dev.backend;
  if (backend.mapFile === undefined || env.noMmap || byteLength === 0 || byteOffset % DTYPE_BYTES[dtype] !== 0) return null;
  return new Tensor(new Storage(dev, backend.mapFile(path, byteOffset, byteLength)), dtype, [...shape], contiguousStrides(shape), 0);
}

/** Makes a tensor view over existing storage (used by view ops). */
export function makeView(base: Tensor, shape: Shape, strides: Shape, offset: number, op = "view"): Tensor {
  base.view_(op); // disposed check
  return new Tensor(base.storage, base.dtype, [...shape], [...strides], offset);
}
