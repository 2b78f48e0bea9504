// Graph capture front end. compile() does not hook the eager dispatcher (tensor/dispatch.ts runs real
// kernels); it calls the user function once with symbolic `Sym` tensors that offer the Tensor method
// names of the supported subset and record IR nodes instead of computing. Real Tensors met during the
// trace (weights captured by closure) become `param` leaves bound by reference. The same builder backs
// the lazy defer-and-fuse scope (lazy.ts), where every leaf is a bound param and reads realize the graph.
import { binaryResultDtype, binaryScalarDtype, isFloating, meanDtype, softmaxDtype, sumDtype, unaryResultDtype, whereResultDtype } from "../backends/dtype.js";
import type { BinaryOp, UnaryOp } from "../backends/backend.js";
import { Tensor } from "../tensor/index.js";
import { OpError, UnsupportedError } from "../util/errors.js";
import { numelOf, type DType, type Graph, type Node, type NodeId, type Op, type ReduceFn } from "./ir.js";

export type SymOrScalar = Sym | Tensor | number | boolean;

/** Records nodes; `dyn[id]` lists the axes of node id that derive from a bucketed dynamic dim. */
export class GraphBuilder {
  readonly nodes: Node[] = [];
  readonly dyn: number[][] = [];
  readonly params: Tensor[] = [];
  private readonly paramIds = new Map<Tensor, NodeId>();
  numInputs = 0;
  /** Set in lazy mode: materializes a Sym into a real Tensor (reads trigger it). */
  realize: ((s: Sym) => Tensor) | null = null;

  push(op: Op, shape: readonly number[], dtype: DType, dyn: number[] = []): Sym {
    const id = this.nodes.length;
    this.nodes.push({ id, op, shape: [...shape], dtype });
    this.dyn.push(dyn);
    return new Sym(this, id);
  }

  input(shape: readonly number[], dtype: DType, dyn: number[] = []): Sym {
    return this.push({ kind: "input", index: this.numInputs++ }, shape, dtype, dyn);
  }

  /** A real tensor used in the trace: one param leaf per tensor object. */
  param(t: Tensor): Sym {
    const known = this.paramIds.get(t);
    if (known !== undefined) return new Sym(this, known);
    const s = this.push({ kind: "param", index: this.params.length }, t.shape, t.dtype);
    this.params.push(t);
    this.paramIds.set(t, s.id);
    return s;
  }

  /** Replaces a node by a param bound to its computed value (lazy mode, after a flush). */
  rebind(id: NodeId, t: Tensor): void {
    const n = this.nodes[id]!;
    this.nodes[id] = { ...n, op: { kind: "param", index: this.params.length } };
    this.params.push(t);
    this.paramIds.set(t, id);
  }

  graph(outputs: NodeId[]): Graph {
    return { nodes: [...this.nodes], outputs, numInputs: this.numInputs, numParams: this.params.length };
  }

  node(id: NodeId): Node {
    return this.nodes[id]!;
  }

  /** Lifts a scalar or tensor operand into this graph; a scalar becomes a 0-d const of `dtype`. */
  lift(x: SymOrScalar, dtype: DType, op: string): Sym {
    if (x instanceof Sym) {
      if (x.builder !== this) throw new OpError(op, "symbolic tensors from two different traces");
      return x;
    }
    if (x instanceof Tensor) return this.param(x);
    const v = typeof x === "boolean" ? (x ? 1 : 0) : x;
    return this.push({ kind: "const", value: v }, [], dtype);
  }
}

/** torch refuses `-` on bool operands (a JS boolean counts as one), as eager binary() does. */
function checkBoolSub(a: SymOrScalar, b: SymOrScalar): void {
  const isBool = (x: SymOrScalar) => typeof x === "boolean" || (typeof x === "object" && x.dtype === "bool");
  if (isBool(a) && isBool(b))
    throw new OpError("sub", "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` operator instead.");
  if (isBool(a) || isBool(b))
    throw new OpError("sub", "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.");
}

function broadcast(op: string, a: readonly number[], b: readonly number[]): number[] {
  const n = Math.max(a.length, b.length);
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const x = a[a.length - n + i] ?? 1;
    const y = b[b.length - n + i] ?? 1;
    if (x !== y && x !== 1 && y !== 1) throw new OpError(op, `shapes [${a.join(", ")}] and [${b.join(", ")}] do not broadcast`);
    out.push(x === 1 ? y : x);
  }
  return out;
}

/** Dynamic axes of an operand, right-aligned into an output of rank `rank`. */
function alignDyn(dyn: number[], rank: number, ownRank: number): number[] {
  return dyn.map((d) => d + rank - ownRank);
}

function union(...xs: number[][]): number[] {
  return [...new Set(xs.flat())].sort((a, b) => a - b);
}

/** A symbolic tensor: shape and dtype known, values not. Method names follow Tensor. */
export class Sym {
  constructor(
    readonly builder: GraphBuilder,
    readonly id: NodeId,
  ) {}

  get shape(): readonly number[] {
    return this.builder.node(this.id).shape;
  }
  get dtype(): DType {
    return this.builder.node(this.id).dtype;
  }
  get ndim(): number {
    return this.shape.length;
  }
  get numel(): number {
    return numelOf(this.shape);
  }
  private get dynAxes(): number[] {
    return this.builder.dyn[this.id]!;
  }

  // ---- realizing (lazy mode only) ----
  /** The value as a real Tensor: flushes the deferred graph (lazy mode); in compile() a trace error. */
  toTensor(): Tensor {
    if (!this.builder.realize) throw new OpError("compile", "a traced value cannot be read inside compile() (data-dependent control flow is not captured)");
    return this.builder.realize(this);
  }
  dataSync(): ReturnType<Tensor["dataSync"]> {
    return this.toTensor().dataSync();
  }
  async toArray(): Promise<ReturnType<Tensor["dataSync"]>> {
    return this.toTensor().toArray();
  }
  item(): number {
    return this.toTensor().item();
  }
  toList(): number[] {
    return this.toTensor().toList();
  }

  // ---- elementwise ----
  /**
   * this `fn` other (other `fn` this when reversed) with eager binary()'s dtype rules (dtype.ts, shared): a JS scalar
   * is a 0-d const in binaryScalarDtype (float32 next to a 16-bit float: torch's opmath, one rounding), a 0-d
   * operand only raises the category, a scalar never widens a floating tensor.
   */
  binary(fn: BinaryOp, other: SymOrScalar, reversed = false): Sym {
    const b = this.builder;
    const scalar = typeof other === "number" || typeof other === "boolean" ? other : null;
    if (fn === "sub") checkBoolSub(this, other);
    if (fn === "pow" && !reversed && !isFloating(this.dtype) && typeof scalar === "number" && Number.isInteger(scalar) && scalar < 0)
      throw new OpError("pow", "Integers to negative integer powers are not allowed.");
    const o = b.lift(other, scalar === null ? this.dtype : binaryScalarDtype(fn, this.dtype, scalar), fn);
    const [x, y] = reversed ? [o, this] : [this, o];
    const operand = scalar ?? o;
    const dtype = reversed ? binaryResultDtype(fn, operand, this) : binaryResultDtype(fn, this, operand);
    const shape = broadcast(fn, x.shape, y.shape);
    const dyn = union(alignDyn(x.dynAxes, shape.length, x.ndim), alignDyn(y.dynAxes, shape.length, y.ndim));
    return b.push({ kind: "binary", fn, a: x.id, b: y.id }, shape, dtype, dyn);
  }
  unary(fn: UnaryOp): Sym {
    if (fn === "neg" && this.dtype === "bool")
      throw new OpError("neg", "Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.");
    return this.builder.push({ kind: "unary", fn, x: this.id }, this.shape, unaryResultDtype(fn, this.dtype), this.dynAxes);
  }
  add(o: SymOrScalar, alpha?: number): Sym {
    if (alpha === undefined || alpha === 1) return this.binary("add", o);
    // eager add: binary("mul", o, alpha) first, which needs o to be a tensor
    if (typeof o === "number" || typeof o === "boolean") throw new OpError("mul", "needs at least one tensor");
    return this.binary("add", this.builder.lift(o, this.dtype, "add").mul(alpha));
  }
  sub(o: SymOrScalar): Sym {
    return this.binary("sub", o);
  }
  mul(o: SymOrScalar): Sym {
    return this.binary("mul", o);
  }
  div(o: SymOrScalar): Sym {
    return this.binary("div", o);
  }
  pow(o: SymOrScalar): Sym {
    return this.binary("pow", o);
  }
  maximum(o: SymOrScalar): Sym {
    return this.binary("maximum", o);
  }
  minimum(o: SymOrScalar): Sym {
    return this.binary("minimum", o);
  }
  eq(o: SymOrScalar): Sym {
    return this.binary("eq", o);
  }
  ne(o: SymOrScalar): Sym {
    return this.binary("ne", o);
  }
  lt(o: SymOrScalar): Sym {
    return this.binary("lt", o);
  }
  le(o: SymOrScalar): Sym {
    return this.binary("le", o);
  }
  gt(o: SymOrScalar): Sym {
    return this.binary("gt", o);
  }
  ge(o: SymOrScalar): Sym {
    return this.binary("ge", o);
  }
  neg(): Sym {
    return this.unary("neg");
  }
  exp(): Sym {
    return this.unary("exp");
  }
  log(): Sym {
    return this.unary("log");
  }
  sqrt(): Sym {
    return this.unary("sqrt");
  }
  rsqrt(): Sym {
    return this.unary("rsqrt");
  }
  tanh(): Sym {
    return this.unary("tanh");
  }
  sigmoid(): Sym {
    return this.unary("sigmoid");
  }
  silu(): Sym {
    return this.unary("silu");
  }
  gelu(approximate: "none" | "tanh" = "none"): Sym {
    return this.unary(approximate === "tanh" ? "gelu_tanh" : "gelu");
  }
  relu(): Sym {
    return this.unary("relu");
  }
  abs(): Sym {
    return this.unary("abs");
  }
  square(): Sym {
    return this.unary("square");
  }
  reciprocal(): Sym {
    return this.unary("reciprocal");
  }
  sin(): Sym {
    return this.unary("sin");
  }
  cos(): Sym {
    return this.unary("cos");
  }
  clamp(min?: number, max?: number): Sym {
    if (min === undefined && max === undefined) return this.to(this.dtype);
    const lo = min === undefined ? undefined : this.maximum(min);
    return max === undefined ? lo! : (lo ?? this).minimum(max);
  }
  /** this where cond else other (Tensor.where's argument order). */
  where(cond: SymOrScalar, other: SymOrScalar): Sym {
    return where(cond, this, other);
  }
  /** Casts (same dtype: an explicit copy, as torch's clone). */
  to(dtype: DType): Sym {
    return this.builder.push({ kind: "cast", x: this.id }, this.shape, dtype, this.dynAxes);
  }
  clone(): Sym {
    return this.to(this.dtype);
  }
  contiguous(): Sym {
    return this;
  }

  // ---- row ops over the last dim ----
  private lastDim(op: string, dim: number | undefined): void {
    const d = dim === undefined ? this.ndim - 1 : dim < 0 ? dim + this.ndim : dim;
    if (d !== this.ndim - 1) throw new UnsupportedError(op, `compile() supports ${op} over the last dim only (got dim ${dim} of a ${this.ndim}-d tensor)`);
    if (this.dynAxes.includes(this.ndim - 1)) throw new UnsupportedError(op, "cannot reduce over a dynamic (bucketed) dim");
  }
  private reduce(fn: ReduceFn, dim: number | undefined, keepdim: boolean): Sym {
    if (dim === undefined && this.ndim !== 1) {
      // over every dim; keepdim keeps each as 1 (eager's [1, 1] for a 2-d x, not the flattened [1])
      const r = this.reshape(this.numel).reduce(fn, 0, keepdim);
      return keepdim ? r.reshape(...this.shape.map(() => 1)) : r;
    }
    this.lastDim(fn, dim);
    const shape = keepdim ? [...this.shape.slice(0, -1), 1] : this.shape.slice(0, -1);
    // as eager: mean keeps a float dtype (bf16 rounds once) and refuses integers; sum widens bool / 8-bit ints
    const dtype: DType = fn === "mean" ? meanDtype(this.dtype) : fn === "sum" ? sumDtype(this.dtype) : this.dtype;
    return this.builder.push({ kind: "reduce", fn, x: this.id, keepdim }, shape, dtype, this.dynAxes);
  }
  sum(dim?: number, keepdim = false): Sym {
    return this.reduce("sum", dim, keepdim);
  }
  mean(dim?: number, keepdim = false): Sym {
    return this.reduce("mean", dim, keepdim);
  }
  max(dim?: number, keepdim = false): Sym {
    return this.reduce("max", dim, keepdim);
  }
  min(dim?: number, keepdim = false): Sym {
    return this.reduce("min", dim, keepdim);
  }
  softmax(dim = -1): Sym {
    this.lastDim("softmax", dim);
    return this.builder.push({ kind: "softmax", x: this.id, log: false }, this.shape, softmaxDtype(this.dtype), this.dynAxes);
  }
  logSoftmax(dim = -1): Sym {
    this.lastDim("log_softmax", dim);
    return this.builder.push({ kind: "softmax", x: this.id, log: true }, this.shape, softmaxDtype(this.dtype), this.dynAxes);
  }

  // ---- linear algebra ----
  matmul(other: SymOrScalar, bTransposed = false): Sym {
    const b = this.builder.lift(other, this.dtype, "matmul");
    if (this.ndim < 2 || b.ndim !== 2) throw new UnsupportedError("matmul", `compile() supports [..., M, K] @ [K, N] (got [${this.shape.join(", ")}] @ [${b.shape.join(", ")}])`);
    const K = this.shape[this.ndim - 1]!;
    const [Kb, N] = bTransposed ? [b.shape[1]!, b.shape[0]!] : [b.shape[0]!, b.shape[1]!];
    if (K !== Kb) throw new OpError("matmul", `shapes [${this.shape.join(", ")}] and [${b.shape.join(", ")}] cannot be multiplied (${K} != ${Kb})`);
    if (this.dynAxes.includes(this.ndim - 1)) throw new UnsupportedError("matmul", "the contracted dim cannot be dynamic");
    return this.builder.push({ kind: "matmul", a: this.id, b: b.id, bTransposed }, [...this.shape.slice(0, -1), N], "float32", this.dynAxes);
  }

  // ---- views ----
  reshape(...shape: number[]): Sym {
    const total = this.numel;
    if (shape.filter((d) => d === -1).length > 1) throw new OpError("reshape", "only one dimension can be -1"); // as eager
    const known = shape.filter((d) => d !== -1).reduce((p, d) => p * d, 1);
    const s = shape.map((d) => (d === -1 ? total / known : d));
    if (numelOf(s) !== total) throw new OpError("reshape", `shape [${shape.join(", ")}] is invalid for ${total} elements`);
    // dynamic axes survive only in a leading prefix that the reshape leaves unchanged
    const dyn = this.dynAxes;
    if (dyn.length > 0) {
      const k = Math.max(...dyn) + 1;
      for (let i = 0; i < k; i++) {
        if (s[i] !== this.shape[i]) throw new UnsupportedError("reshape", "a reshape must keep the dims up to a dynamic (bucketed) dim unchanged");
      }
    }
    return this.builder.push({ kind: "reshape", x: this.id }, s, this.dtype, dyn);
  }
  view(...shape: number[]): Sym {
    return this.reshape(...shape);
  }
  flatten(): Sym {
    return this.reshape(this.numel);
  }
  unsqueeze(dim: number): Sym {
    const d = dim < 0 ? dim + this.ndim + 1 : dim;
    if (!Number.isInteger(d) || d < 0 || d > this.ndim) throw new OpError("unsqueeze", `dimension ${dim} out of range`); // as eager
    return this.reshape(...this.shape.slice(0, d), 1, ...this.shape.slice(d));
  }
  permute(...dims: number[]): Sym {
    const nd = dims.map((d) => (d < 0 ? d + this.ndim : d));
    if (nd.length !== this.ndim || new Set(nd).size !== nd.length) throw new OpError("permute", `bad dims [${dims.join(", ")}]`);
    const dyn = nd.map((src, i) => (this.dynAxes.includes(src) ? i : -1)).filter((i) => i >= 0);
    return this.builder.push({ kind: "permute", x: this.id, dims: nd }, nd.map((d) => this.shape[d]!), this.dtype, dyn);
  }
  transpose(d0: number, d1: number): Sym {
    const dims = this.shape.map((_, i) => i);
    const a = d0 < 0 ? d0 + this.ndim : d0;
    const b = d1 < 0 ? d1 + this.ndim : d1;
    [dims[a], dims[b]] = [dims[b]!, dims[a]!];
    return this.permute(...dims);
  }
  /** torch's Tensor.T, as eager's: the dims reversed (a 3-d x's T is [c, b, a], not its last two swapped: that is mT). */
  get T(): Sym {
    return this.permute(...this.shape.map((_, i) => this.ndim - 1 - i));
  }
  /** torch's Tensor.mT: the last two dims swapped. */
  get mT(): Sym {
    return this.transpose(-2, -1);
  }
}

/** where(cond, a, b) with broadcasting. */
export function where(cond: SymOrScalar, a: SymOrScalar, b: SymOrScalar): Sym {
  const any = [cond, a, b].find((x): x is Sym => x instanceof Sym);
  if (!any) throw new OpError("where", "needs a symbolic operand");
  const bld = any.builder;
  // torch.result_type(a, b), as eager where: a scalar or a 0-d operand raises only the category
  const dtype = whereResultDtype(a, b);
  const c = cond instanceof Sym || cond instanceof Tensor ? cond.dtype : typeof cond === "boolean" ? "bool" : "a number";
  if (c !== "bool") throw new OpError("where", `expected condition to be a boolean tensor, but got ${c}`);
  const ta = bld.lift(a, dtype, "where");
  const tb = bld.lift(b, dtype, "where");
  const tc = bld.lift(cond, "bool", "where");
  const shape = broadcast("where", broadcast("where", tc.shape, ta.shape), tb.shape);
  const dyn = union(...[tc, ta, tb].map((s) => alignDyn(bld.dyn[s.id]!, shape.length, s.ndim)));
  return bld.push({ kind: "where", cond: tc.id, a: ta.id, b: tb.id }, shape, dtype, dyn);
}

export function rmsNorm(x: Sym, weight: SymOrScalar, eps: number): Sym {
  const w = x.builder.lift(weight, "float32", "rms_norm");
  const n = x.shape[x.ndim - 1]!;
  if (w.ndim !== 1 || w.shape[0] !== n) throw new OpError("rms_norm", `weight [${w.shape.join(", ")}] does not match last dim ${n}`);
  if (x.builder.dyn[x.id]!.includes(x.ndim - 1)) throw new UnsupportedError("rms_norm", "the normalised dim cannot be dynamic");
  return x.builder.push({ kind: "rms_norm", x: x.id, weight: w.id, eps }, x.shape, "float32", x.builder.dyn[x.id]!);
}

export function rotaryEmbedding(x: Sym, positions: SymOrScalar, cos: SymOrScalar, sin: SymOrScalar, neox = true): Sym {
  const b = x.builder;
  if (x.ndim !== 3) throw new OpError("rotary", `x must be [tokens, heads, head_dim], got [${x.shape.join(", ")}]`);
  const p = b.lift(positions, "int32", "rotary");
  const c = b.lift(cos, "float32", "rotary");
  const s = b.lift(sin, "float32", "rotary");
  return b.push({ kind: "rotary", x: x.id, positions: p.id, cos: c.id, sin: s.id, neox }, x.shape, "float32", b.dyn[x.id]!);
}
