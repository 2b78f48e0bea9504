// Dispatch capture: compile()'s second front end, for functions written against eager Tensors (whole model
// forwards of src/nn and src/models) rather than the Sym subset. The function runs once on placeholder
// tensors of the bucket shapes with a recorder installed as the dispatcher's hook (tensor/dispatch.ts,
// torch's make_fx role): every KernelCall becomes IR nodes keyed by the buffer regions it reads and writes,
// and nothing executes. Buffers first seen as reads are `param` leaves bound by reference (weights, rotary
// tables, KV caches); argument placeholders are `input` leaves. Paged attention's in-place cache write is
// part of its opaque node. Host reads of traced values (data-dependent code) fail, except inside modules
// passed as `opaque`, whose forward becomes one opaque step run eagerly.
import type { BufferView, DeviceBuffer, KernelCall, ReduceOp } from "../backends/backend.js";
import { DTYPE_BYTES } from "../backends/dtype.js";
import * as k from "../tensor/index.js";
import { Tensor, setDeferHook, withEagerMode, type DeferHook, type Device } from "../tensor/index.js";
import { OpError, UnsupportedError } from "../util/errors.js";
import { analyzeRead, isDense, strip } from "./buffer-views.js";
import { enableDeferAndFuse } from "./defer.js";
import { numelOf, type DType, type Graph, type NodeId, type Op, type ReduceFn } from "./ir.js";
import type { Bound } from "./program.js";
import { GraphBuilder } from "./trace.js";

/** A module (or any object) whose `forward(x)` runs as one opaque step; its output has x's shape, float32. */
export interface OpaqueModule {
  forward(x: Tensor): Tensor;
}

/** An opaque step's eager body (inputs are views of the program's buffers). */
export type OpaqueFn = (inputs: Tensor[]) => Tensor;

export interface Captured {
  graph: Graph;
  params: Bound[];
  outDyn: number[][];
  multi: boolean;
  calls: OpaqueFn[];
}

interface Written {
  offset: number;
  numel: number;
  node: NodeId;
}

/** What the trace knows about one buffer. */
interface BufferState {
  /** Set for an argument placeholder: the input node covering the whole buffer. */
  input: NodeId | null;
  /** Param leaves read from this buffer, by region key. */
  params: Map<string, NodeId>;
  /** Regions written by recorded kernels (latest value each). */
  writes: Written[];
}

const REDUCE_FNS: Partial<Record<ReduceOp, ReduceFn>> = { sum: "sum", max: "max", min: "min" };

/** Dynamic axes after a reshape of `from` (dyn axes `dyn`) to `to`: each must survive as a dim of the same size and prefix. */
function reshapeDyn(from: readonly number[], dyn: number[], to: readonly number[]): number[] {
  return dyn.map((d) => {
    const before = numelOf(from.slice(0, d));
    let acc = 1;
    for (let j = 0; j < to.length; j++) {
      if (acc === before && to[j] === from[d]) return j;
      acc *= to[j]!;
    }
    throw new UnsupportedError("reshape", `compile() cannot follow the dynamic (bucketed) dim through a reshape [${from.join(", ")}] -> [${to.join(", ")}]`);
  });
}

class Recorder {
  readonly b = new GraphBuilder();
  readonly params: Bound[] = [];
  readonly calls: OpaqueFn[] = [];
  private readonly buffers = new Map<DeviceBuffer, BufferState>();
  /** Buffers whose tensors were disposed during the trace: freed when it ends. */
  readonly adopted: DeviceBuffer[] = [];
  closed = false;

  constructor(readonly device: Device) {}

  state(buffer: DeviceBuffer): BufferState {
    let s = this.buffers.get(buffer);
    if (!s) this.buffers.set(buffer, (s = { input: null, params: new Map(), writes: [] }));
    return s;
  }

  knows(buffer: DeviceBuffer): boolean {
    return this.buffers.has(buffer);
  }

  isParamBuffer(buffer: DeviceBuffer): boolean {
    return (this.buffers.get(buffer)?.params.size ?? 0) > 0;
  }

  dyn(id: NodeId): number[] {
    return this.b.dyn[id]!;
  }

  push(op: Op, shape: readonly number[], dtype: DType, dyn: number[]): NodeId {
    return this.b.push(op, shape, dtype, dyn).id;
  }

  reshape(id: NodeId, shape: readonly number[]): NodeId {
    const n = this.b.node(id);
    if (n.shape.join() === shape.join()) return id;
    return this.push({ kind: "reshape", x: id }, shape, n.dtype, reshapeDyn(n.shape, this.dyn(id), shape));
  }

  /** The node holding what `v` reads, shaped as v (1 on broadcast dims). */
  read(v: BufferView, op: string): NodeId {
    const p = analyzeRead(v);
    if (!p) throw new UnsupportedError(op, `compile() cannot capture a read of a strided view (shape [${v.shape.join(", ")}], strides [${v.strides.join(", ")}])`);
    const st = this.state(v.buffer);
    const memShape = p.perm ? p.perm.memShape : p.shape;
    const end = p.offset + p.numel;
    let base: NodeId;
    const w = st.writes.find((x) => x.offset === p.offset && x.numel === p.numel);
    if (w) {
      base = strip(this.b.node(w.node).shape) === strip(memShape) ? w.node : this.reshape(w.node, memShape);
    } else if (st.writes.some((x) => x.offset < end && p.offset < x.offset + x.numel)) {
      throw new UnsupportedError(op, "compile() cannot capture a read that partially overlaps an earlier result (slices of computed values)");
    } else if (st.input !== null) {
      const inp = this.b.node(st.input);
      if (p.offset !== 0 || p.numel !== numelOf(inp.shape)) throw new UnsupportedError(op, "compile() cannot capture a read of part of an argument");
      base = this.reshape(st.input, memShape);
    } else {
      const key = `${p.offset}:${memShape.join(",")}:${v.dtype}`;
      const known = st.params.get(key);
      if (known !== undefined) base = known;
      else {
        base = this.push({ kind: "param", index: this.params.length }, memShape, v.dtype, []);
        this.params.push({ buffer: v.buffer, byteOffset: p.offset * DTYPE_BYTES[v.dtype] });
        st.params.set(key, base);
      }
    }
    if (!p.perm) return base;
    const dyn = this.dyn(base);
    const permDyn = p.perm.dims.map((src, i) => (dyn.includes(src) ? i : -1)).filter((i) => i >= 0);
    return this.push({ kind: "permute", x: base, dims: p.perm.dims }, v.shape, v.dtype, permDyn);
  }

  /** Records that `v` (a dense output) now holds node `id`. */
  write(v: BufferView, id: NodeId, op: string): void {
    if (!isDense(v)) throw new UnsupportedError(op, "compile() cannot capture a write into a strided view");
    const st = this.state(v.buffer);
    if (st.input !== null || st.params.size > 0) throw new UnsupportedError(op, "compile() cannot capture an in-place write into an argument or a captured tensor");
    const n = numelOf(v.shape);
    const end = v.offset + n;
    if (st.writes.some((x) => x.offset < end && v.offset < x.offset + x.numel && !(x.offset === v.offset && x.numel === n)))
      throw new UnsupportedError(op, "compile() cannot capture a write that partially overlaps an earlier result");
    st.writes = st.writes.filter((x) => !(x.offset === v.offset && x.numel === n));
    st.writes.push({ offset: v.offset, numel: n, node: this.reshape(id, v.shape) });
  }

  /** Dyn axes of an elementwise result: the operands' right-aligned into the output rank. */
  private union(ids: NodeId[], rank: number): number[] {
    const axes = new Set<number>();
    for (const id of ids) for (const d of this.dyn(id)) axes.add(d + rank - this.b.node(id).shape.length);
    return [...axes].sort((a, b) => a - b);
  }

  private lastDimStatic(id: NodeId, op: string): void {
    const n = this.b.node(id);
    if (this.dyn(id).includes(n.shape.length - 1)) throw new UnsupportedError(op, "compile() cannot reduce over a dynamic (bucketed) dim");
  }

  record(call: KernelCall): void {
    const op = call.op;
    switch (call.op) {
      case "unary": {
        const x = this.read(call.x, op);
        this.write(call.out, this.push({ kind: "unary", fn: call.fn, x }, call.out.shape, call.out.dtype, this.union([x], call.out.shape.length)), op);
        return;
      }
      case "binary": {
        const a = this.read(call.a, op);
        const b = this.read(call.b, op);
        this.write(call.out, this.push({ kind: "binary", fn: call.fn, a, b }, call.out.shape, call.out.dtype, this.union([a, b], call.out.shape.length)), op);
        return;
      }
      case "silu_mul": {
        // as the unfused pair (elementwise nodes the fusion pass can merge); xq is left out as for rms_norm
        const shape = [call.rows, call.n];
        const gate = this.reshape(this.read({ ...call.gate, shape, strides: [call.n, 1] }, op), shape);
        const up = this.reshape(this.read({ ...call.up, shape, strides: [call.n, 1] }, op), shape);
        const s = this.push({ kind: "unary", fn: "silu", x: gate }, shape, "float32", this.union([gate], 2));
        const prod = this.push({ kind: "binary", fn: "mul", a: s, b: up }, shape, "float32", this.union([s, up], 2));
        this.write(call.out, this.reshape(prod, call.out.shape), op);
        return;
      }
      case "add_rms_norm": {
        // as the unfused pair: the add's node (written to sum) then rms_norm over it; xq is left out as for rms_norm
        const shape = [call.rows, call.n];
        const x = this.reshape(this.read({ ...call.x, shape, strides: [call.n, 1] }, op), shape);
        const r = this.reshape(this.read({ ...call.residual, shape, strides: [call.n, 1] }, op), shape);
        const sum = this.push({ kind: "binary", fn: "add", a: x, b: r }, shape, "float32", this.union([x, r], 2));
        this.write(call.sum, this.reshape(sum, call.sum.shape), op);
        const weight = this.read(call.weight, op);
        this.write(call.out, this.reshape(this.push({ kind: "rms_norm", x: sum, weight, eps: call.eps }, shape, "float32", this.dyn(sum)), call.out.shape), op);
        return;
      }
      case "where": {
        const cond = this.read(call.cond, op);
        const a = this.read(call.a, op);
        const b = this.read(call.b, op);
        this.write(call.out, this.push({ kind: "where", cond, a, b }, call.out.shape, call.out.dtype, this.union([cond, a, b], call.out.shape.length)), op);
        return;
      }
      case "copy": {
        const x = this.read(call.x, op);
        this.write(call.out, this.push({ kind: "cast", x }, call.out.shape, call.out.dtype, this.union([x], call.out.shape.length)), op);
        return;
      }
      case "fill": {
        const c = this.push({ kind: "const", value: call.value }, [], call.out.dtype, []);
        this.write(call.out, this.push({ kind: "cast", x: c }, call.out.shape, call.out.dtype, []), op);
        return;
      }
      case "reduce":
      case "softmax":
      case "rms_norm": {
        // rms_norm's xq output (quantized rows for quant_matmul) is left out: quant_matmul nodes quantize x themselves
        let x = this.read(call.x, op);
        if (this.b.node(x).shape.at(-1) !== call.n) x = this.reshape(x, [call.rows, call.n]);
        this.lastDimStatic(x, op);
        const xs = this.b.node(x).shape;
        let id: NodeId;
        if (call.op === "reduce") {
          const fn = REDUCE_FNS[call.fn];
          if (!fn) throw new UnsupportedError(op, `compile() cannot capture reduce ${call.fn}`);
          id = this.push({ kind: "reduce", fn, x, keepdim: false }, xs.slice(0, -1), call.out.dtype, this.dyn(x));
        } else if (call.op === "softmax") {
          id = this.push({ kind: "softmax", x, log: call.log }, xs, call.out.dtype, this.dyn(x)); // bf16 stays bf16, as eager
        } else {
          const weight = this.read(call.weight, op);
          id = this.push({ kind: "rms_norm", x, weight, eps: call.eps }, xs, call.out.dtype, this.dyn(x));
        }
        this.write(call.out, id, op);
        return;
      }
      case "matmul": {
        // one [M, K] @ [K, N] (or [N, K]) product; a batch sharing one right operand is the same product
        if (call.aTransposed || (call.batch > 1 && (call.strideB !== 0 || call.strideA !== call.m * call.k || call.strideOut !== call.m * call.n)))
          throw new UnsupportedError(op, "compile() captures [M, K] @ [K, N] products only (batched attention-style matmuls are not supported)");
        const a = this.reshape(this.read({ ...call.a, shape: [call.batch * call.m, call.k], strides: [call.k, 1] }, op), [call.batch * call.m, call.k]);
        const bShape = call.bTransposed ? [call.n, call.k] : [call.k, call.n];
        const b = this.read({ ...call.b, shape: bShape, strides: [bShape[1]!, 1] }, op);
        if (this.dyn(a).includes(1)) throw new UnsupportedError(op, "the contracted dim cannot be dynamic");
        this.write(call.out, this.push({ kind: "matmul", a, b, bTransposed: call.bTransposed }, [call.batch * call.m, call.n], "float32", this.dyn(a)), op);
        return;
      }
      case "quant_matmul": {
        // a pre-quantized x (call.xq, written by a fused rms_norm) is left out: the node quantizes x itself, the
        // same bits, and rms_norm's xq output is then never read
        const x = this.reshape(this.read({ ...call.x, shape: [call.m, call.k], strides: [call.k, 1] }, op), [call.m, call.k]);
        if (this.dyn(x).includes(1)) throw new UnsupportedError(op, "the contracted dim cannot be dynamic");
        const w = this.read(call.w, op);
        const scales = this.read(call.scales, op);
        const rowSums = call.rowSums === null ? null : this.read(call.rowSums, op);
        this.write(call.out, this.push({ kind: "quant_matmul", scheme: call.scheme, x, w, scales, rowSums }, [call.m, call.n], "float32", this.dyn(x)), op);
        return;
      }
      case "rotary": {
        const x = this.read(call.x, op);
        const positions = this.read(call.positions, op);
        const cos = this.read(call.cos, op);
        const sin = this.read(call.sin, op);
        if (this.b.node(cos).shape[1]! * 2 !== call.rotaryDim) throw new UnsupportedError(op, "compile() needs the rotary tables' width to be rotaryDim / 2");
        this.write(call.out, this.push({ kind: "rotary", x, positions, cos, sin, neox: call.neox }, call.out.shape, "float32", this.dyn(x)), op);
        return;
      }
      case "gather_rows": {
        const table = this.read(call.table, op);
        const ids = this.read(call.ids, op);
        this.write(call.out, this.push({ kind: "gather_rows", table, ids }, [call.numIds, call.dim], call.out.dtype, this.dyn(ids)), op);
        return;
      }
      case "paged_attention": {
        const r = (v: BufferView) => this.read(v, op);
        const q = r(call.q);
        const fields = {
          q, k: r(call.kNew), v: r(call.vNew), kCache: r(call.kCache), vCache: r(call.vCache),
          slotMapping: r(call.slotMapping), blockTables: r(call.blockTables), queryStart: r(call.queryStart), seqLens: r(call.seqLens),
        };
        for (const c of [fields.kCache, fields.vCache]) {
          if (this.b.node(c).op.kind !== "param" && this.b.node(c).op.kind !== "input") throw new UnsupportedError(op, "the KV caches must be tensors from outside the compiled function");
        }
        const dyn = this.dyn(q);
        const rot = call.rotary;
        if (rot) {
          const cosW = this.b.node(r(rot.cos)).shape[1]!;
          if (cosW * 2 !== rot.rotaryDim) throw new UnsupportedError(op, "compile() needs the rotary tables' width to be rotaryDim / 2");
        }
        const rotary = rot ? { positions: r(rot.positions), cos: r(rot.cos), sin: r(rot.sin), neox: rot.neox } : null;
        const id = this.push(
          {
            kind: "paged_attention", ...fields, scale: call.scale, slidingWindow: call.slidingWindow, softcap: call.softcap, dynamicTokens: dyn.includes(0), rotary,
            bidirectional: call.bidirectional === true,
            sinks: call.sinks ? r(call.sinks) : null,
          },
          call.out.shape, "float32", dyn,
        );
        this.write(call.out, id, op);
        return;
      }
      default:
        throw new UnsupportedError(op, `compile() cannot capture the ${op} kernel (pass the module that uses it through the \`opaque\` option)`);
    }
  }

  /** A shadowed opaque forward: one `call` node, and a placeholder result the trace continues with. */
  opaqueCall(fn: OpaqueFn, x: Tensor): Tensor {
    const input = this.read(x.view_("compile"), "compile");
    const index = this.calls.length;
    this.calls.push(fn);
    const id = this.push({ kind: "call", index, inputs: [input] }, x.shape, "float32", this.dyn(input));
    const out = k.empty(x.shape, { dtype: "float32", device: this.device });
    this.write(out.view_("compile"), id, "compile");
    return out;
  }

  hook(): DeferHook {
    return {
      record: (_op, device, call) => {
        if (this.closed) return false;
        if (device !== this.device) throw new OpError(call.op, `compile() captures one device (${this.device.name}), met ${device.name}`);
        this.record(call);
        return true;
      },
      flush: () => {
        if (this.closed) return;
        throw new OpError("compile", "a value computed inside compile() was read on the host (data-dependent code is not captured; pass such modules through the `opaque` option)");
      },
      hasPending: () => !this.closed,
      adoptFree: (_device, buffer) => {
        if (this.closed || !this.knows(buffer)) return false;
        this.adopted.push(buffer);
        return true;
      },
    };
  }
}

/**
 * Captures fn on placeholders of `shapes` (tensor arguments; null for scalars). `dynAxes[i]` are argument
 * i's bucketed dims. `opaque` modules' forwards become opaque steps for the extent of the capture.
 */
export function captureDispatch(
  fn: (...args: (Tensor | number | boolean)[]) => unknown,
  args: (Tensor | number | boolean)[],
  shapes: (number[] | null)[],
  dynAxes: number[][],
  opaque: readonly OpaqueModule[],
): Captured {
  const device = args.find((a): a is Tensor => a instanceof Tensor)?.device ?? k.defaultDevice();
  const rec = new Recorder(device);
  const placeholders: Tensor[] = [];
  const traceArgs = args.map((a, i) => {
    if (!(a instanceof Tensor)) return a;
    const t = k.empty(shapes[i]!, { dtype: a.dtype, device });
    placeholders.push(t);
    rec.state(t.storage.buffer).input = rec.b.input(shapes[i]!, a.dtype, dynAxes[i]!).id;
    return t;
  });
  const shadowed = opaque.map((m) => {
    const own = Object.prototype.hasOwnProperty.call(m, "forward");
    const prev = m.forward;
    const body: OpaqueFn = ([x]) => k.noGrad(() => prev.call(m, x!));
    m.forward = (x: Tensor) => rec.opaqueCall(body, x);
    return () => {
      if (own) m.forward = prev;
      else delete (m as Partial<OpaqueModule>).forward;
    };
  });
  setDeferHook(rec.hook());
  let outs: Tensor[] = [];
  let multi = false;
  let outIds: NodeId[] = [];
  try {
    const res = withEagerMode("defer-and-fuse", () => k.noGrad(() => fn(...traceArgs)));
    multi = Array.isArray(res);
    const list: unknown[] = Array.isArray(res) ? res : [res];
    for (const o of list) if (!(o instanceof Tensor)) throw new OpError("compile", "the compiled function must return tensors");
    outs = list as Tensor[];
    // read() may hand back a node that differs from the view by leading 1s ([1, N] for matmul's squeezed [N]): outputs keep the view's shape
    outIds = outs.map((o) => rec.reshape(rec.read(o.view_("compile"), "compile"), o.shape));
  } finally {
    rec.closed = true;
    for (const restore of shadowed) restore();
    enableDeferAndFuse({ setMode: false }); // the defer-and-fuse recorder is the dispatcher's hook again
    for (const o of outs) if (!placeholders.includes(o)) o.dispose();
    for (const t of placeholders) t.dispose();
    // buffers of constants read as params stay allocated: the program binds them
    for (const buf of rec.adopted) if (!rec.isParamBuffer(buf)) device.backend.free(buf);
  }
  const graph: Graph = { nodes: [...rec.b.nodes], outputs: outIds, numInputs: rec.b.numInputs, numParams: rec.params.length };
  return { graph, params: rec.params, outDyn: outIds.map((id) => rec.dyn(id)), multi, calls: rec.calls };
}
