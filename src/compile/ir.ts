// The compiler's one IR (STYLE.md 6-7): a graph of typed nodes, each with a static shape and dtype.
// Nodes are in topological order (an input's id is always smaller than its user's). Passes rewrite
// this structure; the renderer (codegen-c.ts) and the interpreter (interpret.ts) consume it.
import type { BinaryOp, QuantScheme, UnaryOp } from "../backends/backend.js";
import type { DType } from "../backends/dtype.js";

export type { BinaryOp, UnaryOp, DType };

/** Row reductions over the last dim (mean = sum / n, folded into the kernel). */
export type ReduceFn = "sum" | "mean" | "max" | "min";

/** The op set, grouped. Every op's operands are node ids (`NodeId`), attributes are plain data. */
export type Op =
  // ---- leaves ----
  | { kind: "input"; index: number } // argument `index` of the compiled function
  | { kind: "param"; index: number } // a tensor captured by closure (weights), bound by reference
  | { kind: "const"; value: number } // a scalar broadcast to the node's shape
  // ---- elementwise (fusable: one output element reads one element of each operand, after broadcasting) ----
  | { kind: "unary"; fn: UnaryOp; x: NodeId }
  | { kind: "binary"; fn: BinaryOp; a: NodeId; b: NodeId }
  | { kind: "where"; cond: NodeId; a: NodeId; b: NodeId }
  | { kind: "cast"; x: NodeId } // to the node's dtype (same dtype: an explicit copy)
  // ---- row ops over the last dim (fusable with an elementwise prologue; rms_norm/softmax also an epilogue) ----
  | { kind: "reduce"; fn: ReduceFn; x: NodeId; keepdim: boolean }
  | { kind: "softmax"; x: NodeId; log: boolean }
  | { kind: "rms_norm"; x: NodeId; weight: NodeId; eps: number }
  // ---- opaque kernels (run through the back end's kernels, never fused) ----
  | { kind: "matmul"; a: NodeId; b: NodeId; bTransposed: boolean } // a [..., M, K] @ b [K, N] (or [N, K])
  | { kind: "rotary"; x: NodeId; positions: NodeId; cos: NodeId; sin: NodeId; neox: boolean }
  | { kind: "custom"; name: string; inputs: NodeId[] } // a user op from defineOp()
  | { kind: "gather_rows"; table: NodeId; ids: NodeId } // table [rows, dim] (f32/bf16), ids int32 [n] -> [n, dim]
  // x [M, K] f32 @ a weight-only quantized [N, K] (data, scales, rowSums as the scheme's layout: backend.ts)
  | { kind: "quant_matmul"; scheme: QuantScheme; x: NodeId; w: NodeId; scales: NodeId; rowSums: NodeId | null }
  // ragged paged attention (q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D]); also writes k/v into the kCache/vCache
  // leaves (in/out buffers) at slotMapping. `dynamicTokens`: T is the bucketed dim, narrowed to the real
  // token count at run time so padded rows never touch the cache.
  | {
      kind: "paged_attention";
      q: NodeId; k: NodeId; v: NodeId; kCache: NodeId; vCache: NodeId;
      slotMapping: NodeId; blockTables: NodeId; queryStart: NodeId; seqLens: NodeId;
      scale: number; slidingWindow: number; softcap: number; dynamicTokens: boolean; bidirectional: boolean;
      // fused rotary (q, k un-rotated; positions [T] bucketed like q), or null
      rotary: { positions: NodeId; cos: NodeId; sin: NodeId; neox: boolean } | null;
      // attention sinks [Hq] (gpt-oss), or null
      sinks: NodeId | null;
    }
  // an eager callable run as one opaque step (compile()'s `opaque` option: data-dependent code such as MoE routing)
  | { kind: "call"; index: number; inputs: NodeId[] }
  // ---- views (no compute: reshape aliases its contiguous input; permute is a strided read) ----
  | { kind: "reshape"; x: NodeId }
  | { kind: "permute"; x: NodeId; dims: number[] };

export type NodeId = number;
export type OpKind = Op["kind"];

export interface Node {
  readonly id: NodeId;
  readonly op: Op;
  readonly shape: readonly number[];
  readonly dtype: DType;
}

export interface Graph {
  nodes: Node[]; // topological order; nodes[i].id === i until a pass compacts ids
  outputs: NodeId[];
  numInputs: number;
  numParams: number;
}

export const ELEMENTWISE: ReadonlySet<OpKind> = new Set(["unary", "binary", "where", "cast"]);
export const ROW_OPS: ReadonlySet<OpKind> = new Set(["reduce", "softmax", "rms_norm"]);
export const OPAQUE: ReadonlySet<OpKind> = new Set(["matmul", "quant_matmul", "rotary", "custom", "gather_rows", "paged_attention", "call"]);
/** Ops with effects beyond their output (in-place cache writes, arbitrary eager code): never dropped. */
export const SIDE_EFFECTS: ReadonlySet<OpKind> = new Set(["paged_attention", "call"]);

const PAGED_OPERANDS = ["q", "k", "v", "kCache", "vCache", "slotMapping", "blockTables", "queryStart", "seqLens"] as const;

/** Operand ids of an op, in a fixed order. */
export function operands(op: Op): NodeId[] {
  switch (op.kind) {
    case "input":
    case "param":
    case "const":
      return [];
    case "unary":
    case "cast":
    case "reduce":
    case "softmax":
    case "reshape":
    case "permute":
      return [op.x];
    case "binary":
    case "matmul":
      return [op.a, op.b];
    case "where":
      return [op.cond, op.a, op.b];
    case "rms_norm":
      return [op.x, op.weight];
    case "rotary":
      return [op.x, op.positions, op.cos, op.sin];
    case "custom":
    case "call":
      return [...op.inputs];
    case "gather_rows":
      return [op.table, op.ids];
    case "quant_matmul":
      return op.rowSums === null ? [op.x, op.w, op.scales] : [op.x, op.w, op.scales, op.rowSums];
    case "paged_attention": {
      const ids = PAGED_OPERANDS.map((f) => op[f]);
      if (op.sinks !== null) ids.push(op.sinks);
      return op.rotary ? [...ids, op.rotary.positions, op.rotary.cos, op.rotary.sin] : ids;
    }
  }
}

/** The op with every operand id mapped through f. */
export function mapOperands(op: Op, f: (id: NodeId) => NodeId): Op {
  switch (op.kind) {
    case "input":
    case "param":
    case "const":
      return op;
    case "unary":
    case "cast":
    case "reduce":
    case "softmax":
    case "reshape":
    case "permute":
      return { ...op, x: f(op.x) };
    case "binary":
    case "matmul":
      return { ...op, a: f(op.a), b: f(op.b) };
    case "where":
      return { ...op, cond: f(op.cond), a: f(op.a), b: f(op.b) };
    case "rms_norm":
      return { ...op, x: f(op.x), weight: f(op.weight) };
    case "rotary":
      return { ...op, x: f(op.x), positions: f(op.positions), cos: f(op.cos), sin: f(op.sin) };
    case "custom":
    case "call":
      return { ...op, inputs: op.inputs.map(f) };
    case "gather_rows":
      return { ...op, table: f(op.table), ids: f(op.ids) };
    case "quant_matmul":
      return { ...op, x: f(op.x), w: f(op.w), scales: f(op.scales), rowSums: op.rowSums === null ? null : f(op.rowSums) };
    case "paged_attention": {
      const out = { ...op };
      for (const k of PAGED_OPERANDS) out[k] = f(op[k]);
      if (op.rotary) out.rotary = { ...op.rotary, positions: f(op.rotary.positions), cos: f(op.rotary.cos), sin: f(op.rotary.sin) };
      if (op.sinks !== null) out.sinks = f(op.sinks);
      return out;
    }
  }
}

/** Users of each node (graph outputs are not counted). */
export function users(g: Graph): NodeId[][] {
  const u: NodeId[][] = g.nodes.map(() => []);
  for (const n of g.nodes) for (const o of operands(n.op)) u[o]!.push(n.id);
  return u;
}

/** Renumbers nodes 0..n-1 keeping order (after passes drop nodes). */
export function compact(g: Graph, keep: (n: Node) => boolean): Graph {
  const remap = new Map<NodeId, NodeId>();
  const nodes: Node[] = [];
  for (const n of g.nodes) {
    if (!keep(n)) continue;
    const id = nodes.length;
    remap.set(n.id, id);
    nodes.push({ ...n, id, op: mapOperands(n.op, (o) => remap.get(o)!) });
  }
  return { ...g, nodes, outputs: g.outputs.map((o) => remap.get(o)!) };
}

/** A stable text form: the part of the cache key that identifies the computation. */
export function serialize(g: Graph): string {
  // JSON writes -0 as 0 and NaN / Infinity as null: spell them out so such consts never share a key
  const exact = (_: string, v: unknown) => (Object.is(v, -0) ? "-0" : typeof v === "number" && !Number.isFinite(v) ? String(v) : v);
  const lines = g.nodes.map((n) => `%${n.id} = ${JSON.stringify(n.op, exact)} : ${n.dtype}[${n.shape.join(",")}]`);
  lines.push(`return ${g.outputs.map((o) => `%${o}`).join(", ")}`);
  return lines.join("\n");
}

export function numelOf(shape: readonly number[]): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}
