// An executable compiled graph: the pass pipeline (outputs materialized -> constant folding -> DCE ->
// fusion -> memory planning -> C rendering -> cache) and the runner. A run binds inputs, params and fresh
// output tensors to buffer slots, keeps intermediates in one planned arena, calls each generated segment
// once and enqueues back-end kernels (matmul, rotary) between segments. On a back end with a stream (cpu,
// not debug mode) each segment is a stream job too (streamCall: raw memory, buffers tracked), so segments
// and kernels run in stream order with no JS wait; otherwise segments run now through kiln_jit on
// DeviceBuffer.host, which waits for pending stream work on that buffer.
import type { BufferView, DeviceBuffer, KernelCall } from "../backends/backend.js";
import { DTYPE_BYTES } from "../backends/dtype.js";
import { canStreamCall, streamCall } from "../backends/cpu/stream-call.js";
import { runKernel } from "../tensor/dispatch.js";
import * as k from "../tensor/index.js";
import { contiguousStrides, eagerMode, Tensor, type Device } from "../tensor/index.js";
import { cacheKey, getLibrary } from "./cache.js";
import { renderable, renderProgram, stepReads } from "./codegen-c.js";
import { customOp } from "./custom-op-registry.js";
import type { OpaqueFn } from "./capture.js";
import { aliasOf, interpret } from "./interpret.js";
import { numelOf, serialize, type Graph, type NodeId } from "./ir.js";
import type { JitLibrary } from "./jit.js";
import { foldConstants } from "./passes/const-fold.js";
import { eliminateDeadCode } from "./passes/dce.js";
import { fuse, type Schedule, type Step } from "./passes/fusion.js";
import { baseOf, planMemory, type MemoryPlan } from "./passes/memory-plan.js";

let launches = 0;
/** Generated-kernel segments and custom ops launched by compiled programs (kernelsDispatched() counts the rest). */
export function compiledLaunches(): number {
  return launches;
}

/** Outputs must be written by a step: a leaf/view output gets an explicit copy (a same-dtype cast). */
function materializeOutputs(g: Graph): Graph {
  const nodes = [...g.nodes];
  const outputs = g.outputs.map((o) => {
    const kind = nodes[o]!.op.kind;
    if (kind !== "input" && kind !== "param" && kind !== "reshape" && kind !== "permute" && kind !== "const") return o;
    const n = nodes[o]!;
    nodes.push({ id: nodes.length, op: { kind: "cast", x: o }, shape: n.shape, dtype: n.dtype });
    return nodes.length - 1;
  });
  return { ...g, nodes, outputs };
}

export function optimize(g: Graph): Graph {
  // materialized again after folding: an identity (x + 0, x * 1) can forward an output to a leaf
  return eliminateDeadCode(materializeOutputs(foldConstants(materializeOutputs(g))));
}

export interface ProgramInfo {
  /** Fused kernels (loop nests) and opaque back-end kernels per run. */
  fusedKernels: number;
  opaqueKernels: number;
  /** Native calls per run into generated code (one per segment). */
  segments: number;
  arenaBytes: number;
  naiveBytes: number;
  /** True when the program runs generated code; false: op by op (fallback). */
  jit: boolean;
  cacheHit: boolean;
  source: string;
}

/** A buffer slot's binding: caller-owned memory at a byte offset. */
export interface Bound {
  buffer: DeviceBuffer;
  byteOffset: number;
}

/** A param: a tensor (Sym traces) or a buffer region (dispatch capture, defer-and-fuse). */
export type ParamBinding = Tensor | Bound;

export class Program {
  readonly info: ProgramInfo;
  private readonly slots: NodeId[] = [];
  private readonly slotOf = new Map<NodeId, number>();
  private arena: DeviceBuffer | null = null;
  private readonly segmentFns: ((bufs: Uint8Array[]) => void)[] = [];
  /** Code addresses of the segments (stream submission). */
  private readonly segmentAddresses: bigint[] = [];
  private readonly segmentOfStep = new Map<number, number>();
  /** Per segment: the slots it addresses (its b[j] is slot segmentSlots[k][j]) and those it writes. */
  private readonly segmentSlots: number[][];
  private readonly segmentWrites: Set<number>[];

  constructor(
    readonly graph: Graph,
    private readonly schedule: Schedule,
    private readonly plan: MemoryPlan,
    private readonly device: Device,
    lib: JitLibrary | null,
    segments: number[][],
    segmentSlots: number[][],
    source: string,
    cacheHit: boolean,
    private readonly calls: readonly OpaqueFn[] = [],
  ) {
    this.segmentSlots = segmentSlots;
    for (const n of graph.nodes) {
      const h = schedule.home[n.id];
      if (h === "self") {
        this.slotOf.set(n.id, this.slots.length);
        this.slots.push(n.id);
      }
    }
    this.segmentWrites = segments.map((seg) => new Set(seg.map((i) => this.slotOf.get((schedule.steps[i] as Extract<Step, { kind: "fused" }>).root)!)));
    if (lib) {
      segments.forEach((seg, i) => {
        const fn = lib.entry(`seg_${i}`);
        this.segmentFns.push((bufs) => fn(bufs));
        this.segmentAddresses.push(lib.address(`seg_${i}`));
        this.segmentOfStep.set(seg[0]!, i);
      });
    }
    this.info = {
      fusedKernels: schedule.steps.filter((s) => s.kind === "fused").length,
      opaqueKernels: schedule.steps.filter((s) => s.kind === "opaque").length,
      segments: segments.length,
      arenaBytes: plan.arenaBytes,
      naiveBytes: plan.naiveBytes,
      jit: lib !== null,
      cacheHit,
      source,
    };
  }

  slot(base: NodeId): number {
    const s = this.slotOf.get(base);
    if (s === undefined) throw new Error(`node %${base} has no buffer`);
    return s;
  }

  /**
   * Runs on inputs/params whose shapes and dtypes match the graph (compile() pads and guards). `dynSize`: the
   * real size of the bucketed dim (paged attention then runs on that many tokens).
   */
  run(inputs: Tensor[], params: readonly ParamBinding[], dynSize: number | null = null): Tensor[] {
    const g = this.graph;
    k.flushDeferred(); // inputs may be outputs of deferred eager kernels
    if (!this.info.jit) {
      const ps = params.map((p, i) => {
        if (p instanceof Tensor) return p;
        const n = g.nodes.find((x) => x.op.kind === "param" && x.op.index === i)!;
        return aliasOf(this.device, { buffer: p.buffer, dtype: n.dtype, shape: n.shape, strides: contiguousStrides(n.shape), offset: p.byteOffset / DTYPE_BYTES[n.dtype] });
      });
      const outs = interpret(g, inputs, ps, { calls: this.calls, dynSize });
      ps.forEach((p, i) => {
        if (p !== params[i] && !outs.includes(p)) p.dispose();
      });
      return outs;
    }
    const temps: Tensor[] = [];
    const bound = new Map<NodeId, Bound>();
    const bindTensor = (id: NodeId, t: Tensor) => {
      const d = t.isContiguous ? t : t.contiguous();
      if (d !== t) temps.push(d);
      bound.set(id, { buffer: d.storage.buffer, byteOffset: d.offset * DTYPE_BYTES[d.dtype] });
    };
    const outputs = new Map<NodeId, Tensor>();
    for (const n of g.nodes) {
      if (n.op.kind === "input") bindTensor(n.id, inputs[n.op.index]!);
      else if (n.op.kind === "param") {
        const p = params[n.op.index]!;
        if (p instanceof Tensor) bindTensor(n.id, p);
        else bound.set(n.id, p);
      }
    }
    for (const o of g.outputs) {
      if (outputs.has(o)) continue;
      const t = k.empty(g.nodes[o]!.shape, { dtype: g.nodes[o]!.dtype, device: this.device });
      outputs.set(o, t);
      bound.set(o, { buffer: t.storage.buffer, byteOffset: 0 });
    }
    this.execute(bound, dynSize);
    for (const t of temps) t.dispose();
    return g.outputs.map((o) => outputs.get(o)!);
  }

  /**
   * Runs generated code (jit programs only) with params and outputs bound to caller-owned dense buffers:
   * the global defer-and-fuse mode writes results straight into the eager tensors' storage.
   */
  runBound(params: Bound[], outputs: Bound[]): void {
    if (!this.info.jit) throw new Error("runBound needs a jit-compiled program");
    const bound = new Map<NodeId, Bound>();
    for (const n of this.graph.nodes) if (n.op.kind === "param") bound.set(n.id, params[n.op.index]!);
    this.graph.outputs.forEach((o, i) => bound.set(o, outputs[i]!));
    this.execute(bound, null);
  }

  /** Frees the arena (a dropped cached program). */
  dispose(): void {
    if (this.arena) this.device.backend.free(this.arena);
    this.arena = null;
  }

  private execute(bound: Map<NodeId, Bound>, dynSize: number | null): void {
    const g = this.graph;
    if (!this.arena) this.arena = this.device.backend.allocate(this.plan.arenaBytes);
    for (const [id, off] of this.plan.offsets) if (!bound.has(id)) bound.set(id, { buffer: this.arena, byteOffset: off });

    // enqueue segments on the back end's stream when it has one (never in debug mode: it runs blocking)
    const streamed = eagerMode() !== "debug" && canStreamCall(this.device.backend);
    const binding = (slot: number) => bound.get(this.slots[slot]!)!;
    const runSegment = (seg: number) => {
      const slots = this.segmentSlots[seg]!;
      if (streamed) {
        const written = this.segmentWrites[seg]!;
        const buffers = slots.map((sl) => binding(sl).buffer);
        const byteOffsets = BigInt64Array.from(slots, (sl) => BigInt(binding(sl).byteOffset));
        const reads = buffers.filter((_, j) => !written.has(slots[j]!));
        const writes = buffers.filter((_, j) => written.has(slots[j]!));
        streamCall(this.device.backend, { address: this.segmentAddresses[seg]!, buffers, byteOffsets, reads, writes });
      } else {
        this.segmentFns[seg]!(slots.map((sl) => new Uint8Array(binding(sl).buffer.host!, binding(sl).byteOffset)));
      }
    };
    const view = (id: NodeId): BufferView => {
      const n = g.nodes[id]!;
      const b = bound.get(baseOf(this.schedule, g, id))!;
      return { buffer: b.buffer, dtype: n.dtype, shape: n.shape, strides: contiguousStrides(n.shape), offset: b.byteOffset / DTYPE_BYTES[n.dtype] };
    };
    this.schedule.steps.forEach((step, i) => {
      if (step.kind === "fused") {
        const seg = this.segmentOfStep.get(i);
        if (seg !== undefined) {
          runSegment(seg);
          launches++;
        }
        return;
      }
      const n = g.nodes[step.node]!;
      const op = n.op;
      if (op.kind === "matmul") {
        const a = view(op.a);
        const K = a.shape[a.shape.length - 1]!;
        const M = numelOf(a.shape) / K;
        const b = view(op.b);
        const N = op.bTransposed ? b.shape[0]! : b.shape[1]!;
        const out = view(n.id);
        const call: KernelCall = {
          op: "matmul",
          a: { ...a, shape: [M, K], strides: [K, 1] },
          b,
          out: { ...out, shape: [M, N], strides: [N, 1] },
          batch: 1, m: M, n: N, k: K, bTransposed: op.bTransposed, strideA: 0, strideB: 0, strideOut: 0,
        };
        runKernel("matmul", this.device, call, []);
      } else if (op.kind === "quant_matmul") {
        const x = view(op.x);
        const K = x.shape[x.shape.length - 1]!;
        const M = numelOf(x.shape) / K;
        const N = n.shape[n.shape.length - 1]!;
        runKernel("quant_matmul", this.device, {
          op: "quant_matmul", scheme: op.scheme, x: { ...x, shape: [M, K], strides: [K, 1] }, w: view(op.w), scales: view(op.scales),
          rowSums: op.rowSums === null ? null : view(op.rowSums), out: view(n.id), m: M, n: N, k: K,
        }, []);
      } else if (op.kind === "rotary") {
        const [T, H, D] = n.shape as [number, number, number];
        const cos = view(op.cos);
        runKernel("rotary", this.device, {
          op: "rotary", x: view(op.x), positions: view(op.positions), cos, sin: view(op.sin), out: view(n.id),
          tokens: T, heads: H, headDim: D, rotaryDim: cos.shape[1]! * 2, neox: op.neox,
        }, []);
      } else if (op.kind === "gather_rows") {
        const table = view(op.table);
        const ids = view(op.ids);
        runKernel("embedding", this.device, {
          op: "gather_rows", table, ids, out: view(n.id), numIds: numelOf(ids.shape), dim: table.shape[1]!, rows: table.shape[0]!,
        }, []);
      } else if (op.kind === "paged_attention") {
        // padded tokens (beyond the real count) are left out: they never write the cache
        const T = n.shape[0]!;
        const rows = op.dynamicTokens && dynSize !== null ? dynSize : T;
        const head = (v: BufferView): BufferView => (rows === T || v.shape[0] !== T ? v : { ...v, shape: [rows, ...v.shape.slice(1)] });
        const q = head(view(op.q));
        const kCache = view(op.kCache);
        const blockTables = view(op.blockTables);
        runKernel("paged_attention", this.device, {
          op: "paged_attention", q, kNew: head(view(op.k)), vNew: head(view(op.v)), kCache, vCache: view(op.vCache),
          slotMapping: head(view(op.slotMapping)), blockTables, queryStart: view(op.queryStart), seqLens: view(op.seqLens),
          out: head(view(n.id)), numSeqs: numelOf(view(op.seqLens).shape), numHeads: q.shape[1]!, numKvHeads: kCache.shape[2]!,
          headDim: q.shape[2]!, blockSize: kCache.shape[1]!, maxBlocksPerSeq: blockTables.shape[1]!, scale: op.scale, slidingWindow: op.slidingWindow, softcap: op.softcap,
          bidirectional: op.bidirectional,
          ...(op.sinks !== null ? { sinks: view(op.sinks) } : {}),
          ...(op.rotary ? {
            rotary: {
              positions: head(view(op.rotary.positions)), cos: view(op.rotary.cos), sin: view(op.rotary.sin),
              rotaryDim: view(op.rotary.cos).shape[1]! * 2, neox: op.rotary.neox,
            },
          } : {}),
        }, []);
      } else if (op.kind === "call") {
        // eager code (data-dependent routing): reads the program's buffers through aliases, writes the node's slot
        const ins = op.inputs.map((id) => aliasOf(this.device, view(id)));
        const res = k.noGrad(() => this.calls[op.index]!(ins));
        const out = aliasOf(this.device, view(n.id));
        out.copy_(res);
        for (const t of [...ins, res, out]) t.dispose();
        k.flushDeferred(); // defer-and-fuse may hold the body's kernels: generated segments below read their results
        launches++;
      } else if (op.kind === "custom") {
        const host = (id: NodeId) => {
          const v = view(id);
          return { host: v.buffer.host!, byteOffset: v.offset * DTYPE_BYTES[v.dtype], shape: v.shape };
        };
        customOp(op.name).runHost(op.inputs.map(host), host(n.id));
        launches++;
      }
    });
  }
}

function hostMemoryReason(device: Device): string | null {
  const probe = device.backend.allocate(1);
  const ok = probe.host !== undefined;
  device.backend.free(probe);
  return ok ? null : `device ${device.name} has no host memory`;
}

/** Why a graph cannot be rendered to C (a dtype the renderer lacks, computed or read by a kernel), or null. */
function unrenderable(g: Graph, s: Schedule): string | null {
  for (const step of s.steps) {
    if (step.kind !== "fused") continue;
    for (const m of [...step.members, ...stepReads(g, step)]) if (!renderable(g.nodes[m]!.dtype)) return `dtype ${g.nodes[m]!.dtype} in %${m}`;
  }
  return null;
}

/**
 * Optimizes and builds a program. `jit`: null to run op by op, else the back end name for the cache key.
 * `identity` adds what the IR does not show (buckets) to the cache key.
 */
export function buildProgram(
  graph: Graph,
  device: Device,
  jitReason: string | null,
  identity: string,
  calls: readonly OpaqueFn[] = [],
): { program: Program; fallbackReason: string | null } {
  const g = optimize(graph);
  const s = fuse(g);
  const isBound = (id: NodeId) => {
    const kind = g.nodes[id]!.op.kind;
    return kind === "input" || kind === "param" || g.outputs.includes(id);
  };
  const plan = planMemory(g, s, (id) => s.home[id] === "self" && !isBound(id));
  let reason = jitReason ?? unrenderable(g, s) ?? hostMemoryReason(device);
  let lib: JitLibrary | null = null;
  let hit = false;
  let source = "";
  let segments: number[][] = [];
  let segmentSlots: number[][] = [];
  const slotIndex = new Map<NodeId, number>();
  g.nodes.forEach((n) => {
    if (s.home[n.id] === "self") slotIndex.set(n.id, slotIndex.size);
  });
  if (reason === null) {
    ({ source, segments, slots: segmentSlots } = renderProgram({ g, s, slot: (b) => slotIndex.get(b)! }));
    try {
      // the source is in the key too: a change to fusion or rendering must never load a stale library
      const r = getLibrary(cacheKey(serialize(g) + "\n" + identity + "\n" + source, device.backend.name), source);
      lib = r.lib;
      hit = r.hit;
    } catch (e) {
      reason = (e as Error).message;
    }
  }
  return { program: new Program(g, s, plan, device, lib, segments, segmentSlots, source, hit, calls), fallbackReason: reason };
}
