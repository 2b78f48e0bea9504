// The global defer-and-fuse eager mode: a recorder installed into tensor/dispatch.ts (setDeferHook) when
// this module is imported. Under setEagerMode("defer-and-fuse") it takes float32 elementwise KernelCalls
// (unary, binary, where, copy, fill) and turns each into IR nodes, keyed by the buffer regions they read
// and write; at the next sync point (a host read, a kernel it does not take, Storage.release of nothing
// pending) flush() builds one graph of the pending calls, runs the usual passes and C codegen (programs
// cached by graph text, libraries on disk) and writes the results straight into the eager tensors'
// buffers. Regions still owned by a tensor are graph outputs; buffers freed while pending (disposed
// intermediates) are not, so they live in the arena or inline. Anything it cannot represent runs eagerly
// after a flush, so results always equal strict mode's.
import type { BufferView, DeviceBuffer, KernelCall, UnaryOp, BinaryOp } from "../backends/backend.js";
import { countLaunches } from "../tensor/dispatch.js";
import { setDeferHook, setEagerMode, type DeferHook, type Device } from "../tensor/index.js";
import { numelOf, serialize, type Graph, type Node, type NodeId, type Op } from "./ir.js";
import { jitUnavailableReason } from "./jit.js";
import { buildProgram, compiledLaunches, type Bound, type Program } from "./program.js";
import { analyzeRead, isDense, strip, type ReadPlan } from "./buffer-views.js";

const FLOAT_UNARY: ReadonlySet<UnaryOp> = new Set<UnaryOp>([
  "neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "silu", "gelu", "gelu_tanh", "abs", "reciprocal",
  "sin", "cos", "square", "relu", "floor", "ceil", "round", "sign",
]);
const FLOAT_BINARY: ReadonlySet<BinaryOp> = new Set<BinaryOp>(["add", "sub", "mul", "div", "pow", "maximum", "minimum", "remainder"]);
/** Pending calls per batch before a flush (bounds graph size and so compile time). */
const MAX_CALLS = 256;
/** Programs kept in memory (each holds an arena); the oldest is dropped beyond this. */
const MAX_PROGRAMS = 512;

interface Written {
  offset: number;
  numel: number;
  node: NodeId;
}

/** What pending work does with one buffer. */
interface BufferUse {
  index: number;
  reads: [number, number][]; // leaf reads [start, end) of earlier calls
  writes: Written[]; // latest value of each written region
}

const overlaps = (a0: number, a1: number, b0: number, b1: number) => a0 < b1 && b0 < a1;

class Batch {
  device: Device | null = null;
  readonly nodes: Node[] = [];
  readonly params: Bound[] = [];
  readonly paramIds = new Map<string, NodeId>();
  readonly uses = new Map<DeviceBuffer, BufferUse>();
  readonly freed: DeviceBuffer[] = [];
  readonly calls: KernelCall[] = [];

  push(op: Op, shape: readonly number[], dtype: Node["dtype"]): NodeId {
    const id = this.nodes.length;
    this.nodes.push({ id, op, shape: [...shape], dtype });
    return id;
  }

  use(b: DeviceBuffer): BufferUse {
    let u = this.uses.get(b);
    if (!u) this.uses.set(b, (u = { index: this.uses.size, reads: [], writes: [] }));
    return u;
  }

  /** True when reading `v` depends on pending writes in a way the graph cannot express. */
  readHazard(v: BufferView, p: ReadPlan): boolean {
    const u = this.uses.get(v.buffer);
    if (!u) return false;
    return u.writes.some((w) => overlaps(w.offset, w.offset + w.numel, p.offset, p.offset + p.numel) && !(w.offset === p.offset && w.numel === p.numel));
  }

  /** True when writing `v` would clobber a value pending work still reads as a leaf, or part of a pending write. */
  writeHazard(v: BufferView): boolean {
    const u = this.uses.get(v.buffer);
    if (!u) return false;
    const s = v.offset;
    const e = s + numelOf(v.shape);
    if (u.reads.some(([a, b]) => overlaps(a, b, s, e))) return true;
    return u.writes.some((w) => overlaps(w.offset, w.offset + w.numel, s, e) && !(w.offset === s && w.numel === e - s));
  }

  /** The node reading `v` as planned: a pending value (reshaped/permuted as needed) or a param leaf. */
  read(v: BufferView, p: ReadPlan, newReads: [DeviceBuffer, number, number][]): NodeId {
    const u = this.use(v.buffer);
    const w = u.writes.find((x) => x.offset === p.offset && x.numel === p.numel);
    let base: NodeId;
    const memShape = p.perm ? p.perm.memShape : p.shape;
    if (w) {
      base = w.node;
      const n = this.nodes[base]!;
      if (p.perm || strip(n.shape) !== strip(memShape)) base = this.push({ kind: "reshape", x: base }, memShape, v.dtype);
    } else {
      const key = `${u.index}:${p.offset}:${memShape.join(",")}:${v.dtype}`;
      const known = this.paramIds.get(key);
      if (known !== undefined) base = known;
      else {
        base = this.push({ kind: "param", index: this.params.length }, memShape, v.dtype);
        this.params.push({ buffer: v.buffer, byteOffset: p.offset * (v.dtype === "bool" ? 1 : 4) });
        this.paramIds.set(key, base);
      }
      newReads.push([v.buffer, p.offset, p.offset + p.numel]);
    }
    if (p.perm) return this.push({ kind: "permute", x: base, dims: p.perm.dims }, v.shape, v.dtype);
    return base;
  }

  write(v: BufferView, node: NodeId): void {
    const u = this.use(v.buffer);
    const n = numelOf(v.shape);
    u.writes = u.writes.filter((w) => !(w.offset === v.offset && w.numel === n));
    u.writes.push({ offset: v.offset, numel: n, node });
  }
}

let batch = new Batch();
let flushing = false;
const programs = new Map<string, Program>();
let disabledReason: string | null | undefined;
let warnedFallback = false;
const hostVisible = new WeakMap<Device, boolean>();

/** Whether the device's buffers are host memory (generated code needs it); probed once per device. */
function hasHostMemory(device: Device): boolean {
  let ok = hostVisible.get(device);
  if (ok === undefined) {
    const probe = device.backend.allocate(1);
    ok = probe.host !== undefined;
    device.backend.free(probe);
    hostVisible.set(device, ok);
  }
  return ok;
}

function inputsOf(call: KernelCall): BufferView[] | null {
  switch (call.op) {
    case "unary":
      return FLOAT_UNARY.has(call.fn) ? [call.x] : null;
    case "binary":
      return FLOAT_BINARY.has(call.fn) ? [call.a, call.b] : null;
    case "where":
      return call.cond.dtype === "bool" ? [call.cond, call.a, call.b] : null;
    case "copy":
      return [call.x];
    case "fill":
      return [];
    default:
      return null;
  }
}

function record(_op: string, device: Device, call: KernelCall, _outputs: unknown[]): boolean {
  if (flushing) return false;
  if (disabledReason === undefined) {
    disabledReason = jitUnavailableReason();
    if (disabledReason) process.emitWarning(`defer-and-fuse runs ops eagerly: ${disabledReason}`, "KilnWarning");
  }
  if (disabledReason) return false;
  const ins = inputsOf(call);
  if (!ins) return false;
  const out = (call as { out: BufferView }).out;
  if (out.dtype !== "float32" || !isDense(out) || numelOf(out.shape) === 0 || !hasHostMemory(device)) return false;
  const plans: ReadPlan[] = [];
  for (let i = 0; i < ins.length; i++) {
    const v = ins[i]!;
    const cond = call.op === "where" && i === 0;
    if (v.dtype !== (cond ? "bool" : "float32") || v.shape.join() !== out.shape.join()) return false;
    const p = analyzeRead(v);
    if (!p) return false;
    plans.push(p);
  }
  // hazards the graph cannot express: run what is pending first, then record into a fresh batch
  if ((batch.device && batch.device !== device) || batch.writeHazard(out) || ins.some((v, i) => batch.readHazard(v, plans[i]!))) flush();
  batch.device = device;
  const newReads: [DeviceBuffer, number, number][] = [];
  const x = ins.map((v, i) => batch.read(v, plans[i]!, newReads));
  let node: NodeId;
  switch (call.op) {
    case "unary":
      node = batch.push({ kind: "unary", fn: call.fn, x: x[0]! }, out.shape, "float32");
      break;
    case "binary":
      node = batch.push({ kind: "binary", fn: call.fn, a: x[0]!, b: x[1]! }, out.shape, "float32");
      break;
    case "where":
      node = batch.push({ kind: "where", cond: x[0]!, a: x[1]!, b: x[2]! }, out.shape, "float32");
      break;
    case "copy":
      node = batch.push({ kind: "cast", x: x[0]! }, out.shape, "float32");
      break;
    case "fill": {
      // a scalar const cast to the shape: const folding never forwards through it
      const c = batch.push({ kind: "const", value: call.value }, [], "float32");
      node = batch.push({ kind: "cast", x: c }, out.shape, "float32");
      break;
    }
    default:
      return false;
  }
  for (const [b, s, e] of newReads) batch.use(b).reads.push([s, e]);
  batch.write(out, node);
  batch.calls.push(call);
  if (batch.calls.length >= MAX_CALLS) flush();
  return true;
}

function flush(): void {
  if (flushing || batch.calls.length === 0) return;
  const b = batch;
  batch = new Batch();
  flushing = true;
  try {
    const device = b.device!;
    const freed = new Set(b.freed);
    const outputs: NodeId[] = [];
    const outBinds: Bound[] = [];
    for (const [buffer, u] of b.uses) {
      if (freed.has(buffer)) continue;
      for (const w of u.writes) {
        outputs.push(w.node);
        outBinds.push({ buffer, byteOffset: w.offset * 4 });
      }
    }
    if (outputs.length === 0) return; // every result was disposed unread
    const graph: Graph = { nodes: b.nodes, outputs, numInputs: 0, numParams: b.params.length };
    const key = `${device.name}\n${serialize(graph)}`;
    let program = programs.get(key);
    if (!program) {
      const built = buildProgram(graph, device, null, "defer-and-fuse");
      program = built.program;
      if (!program.info.jit) {
        if (!warnedFallback) {
          warnedFallback = true;
          process.emitWarning(`defer-and-fuse runs ops eagerly: ${built.fallbackReason}`, "KilnWarning");
        }
        for (const call of b.calls) device.backend.run(call);
        countLaunches(b.calls.length);
        return;
      }
      if (programs.size >= MAX_PROGRAMS) {
        const [oldKey, old] = programs.entries().next().value as [string, Program];
        programs.delete(oldKey);
        old.dispose();
      }
      programs.set(key, program);
    } else {
      programs.delete(key); // most recently used last
      programs.set(key, program);
    }
    const before = compiledLaunches();
    program.runBound(b.params, outBinds);
    countLaunches(compiledLaunches() - before);
  } finally {
    for (const buf of b.freed) b.device!.backend.free(buf);
    flushing = false;
  }
}

const hook: DeferHook = {
  record,
  flush,
  hasPending: () => batch.calls.length > 0,
  adoptFree(_device, buffer) {
    if (flushing || !batch.uses.has(buffer)) return false;
    batch.freed.push(buffer);
    return true;
  },
};

/**
 * Installs the defer-and-fuse recorder (importing "kiln/compile" already does) and, unless `setMode` is
 * false, switches the process to that eager mode.
 * @example
 * enableDeferAndFuse(); const y = x.mul(2).add(1).silu(); y.dataSync(); // one fused launch
 */
export function enableDeferAndFuse(options: { setMode?: boolean } = {}): void {
  setDeferHook(hook);
  if (options.setMode !== false) setEagerMode("defer-and-fuse");
}

/** Programs built for deferred batches (tests and benchmarks watch recompiles with it). */
export function deferredPrograms(): number {
  return programs.size;
}

setDeferHook(hook);
