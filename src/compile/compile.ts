// compile(fn, options): captures fn into the IR by calling it once with symbolic tensors (trace.ts) or, for
// functions written against eager Tensors (model forwards), on placeholder tensors with the dispatcher's
// kernels recorded (capture.ts); builds a program per guard signature and runs it. Guards: each tensor argument's dtype, rank and
// non-dynamic dims, each scalar argument's value. A dynamic dim is padded up to its bucket (powers of
// two by default) so any size within a bucket reuses one program; outputs are narrowed back.
import { KilnError, OpError, UnsupportedError } from "../util/errors.js";
import { env } from "../util/env.js";
import * as k from "../tensor/index.js";
import { Tensor, defaultDevice } from "../tensor/index.js";
import { captureDispatch, type OpaqueFn, type OpaqueModule } from "./capture.js";
import type { DType, Graph } from "./ir.js";
import { jitUnavailableReason } from "./jit.js";
import { buildProgram, type ParamBinding, type Program, type ProgramInfo } from "./program.js";
import { GraphBuilder, Sym } from "./trace.js";

export interface DynamicDim {
  argIndex: number;
  dim: number;
  /** Largest size accepted. */
  max: number;
  /** Explicit bucket sizes (ascending); default powers of two up to max. */
  buckets?: number[];
}

export interface CompileOptions {
  /** Dims allowed to vary; all dynamic dims of one call must currently share one size (e.g. tokens). */
  dynamic?: DynamicDim | DynamicDim[];
  /** Name used in recompile logs. */
  name?: string;
  /**
   * How fn is captured. "symbolic": called with Sym tensors (the Tensor-method subset and compile/functional.ts).
   * "dispatch": called with placeholder Tensors while the dispatcher records their kernels (any eager code whose
   * kernels the IR has: whole model forwards, paged attention included). "auto" (default): symbolic, and dispatch
   * when fn does not run on Syms.
   */
  capture?: "auto" | "symbolic" | "dispatch";
  /**
   * Modules whose forward(x) runs eagerly as one opaque step (dispatch capture): data-dependent code such as MoE
   * routing, which reads values on the host. The output has x's shape (float32).
   */
  opaque?: readonly OpaqueModule[];
}

export type CompileArg = Tensor | number | boolean;
type TraceArg = Sym | number | boolean;
type TraceResult = Sym | Sym[] | Tensor | Tensor[]; // Tensors: dispatch capture

export interface CompileStats {
  calls: number;
  /** Programs built (first compile included). */
  compiles: number;
  /** Compiles after the first (new bucket, dtype, rank, static dim or scalar value). */
  recompiles: number;
  /** Programs whose native library came from the cache (disk or this process). */
  cacheHits: number;
  /** Calls that ran op by op because no C compiler / JIT addon / renderable dtype was available. */
  fallbackCalls: number;
}

export interface CompiledFunction {
  (...args: CompileArg[]): Tensor | Tensor[];
  readonly stats: CompileStats;
  /** The program of the last call (kernel counts, arena size, generated C). */
  readonly lastInfo: ProgramInfo | null;
}

interface Entry {
  program: Program;
  params: readonly ParamBinding[];
  outDyn: number[][];
  multi: boolean;
  fallbackReason: string | null;
}

function bucketFor(spec: DynamicDim, n: number): number {
  if (n > spec.max) throw new OpError("compile", `dynamic dim ${spec.dim} of argument ${spec.argIndex} is ${n}, above max ${spec.max}`);
  if (spec.buckets) {
    const b = spec.buckets.find((x) => x >= n);
    if (b === undefined) throw new OpError("compile", `no bucket holds ${n} (buckets ${spec.buckets.join(", ")})`);
    return b;
  }
  let b = 1;
  while (b < n) b *= 2;
  return Math.min(b, spec.max);
}

let warnedFallback = false;

/**
 * Compiles a tensor function. fn receives symbolic tensors with the Tensor method names (add, mul, silu,
 * matmul, sum(-1), softmax, reshape, ...) plus the free ops of compile/functional.ts (rmsNorm, linear...).
 * @example
 * const f = compile((x, w) => rmsNorm(x, w, 1e-6).mul(2), { dynamic: { argIndex: 0, dim: 0, max: 256 } });
 * const y = f(x, w) as Tensor;
 * // a whole paged model forward (dispatch capture; MoE layers run eagerly as opaque steps):
 * const fwd = compile((ids, pos, slots, tables, qStart, lens) => model.forward(ids, { kind: "paged", positions: pos,
 *   slotMapping: slots, blockTables: tables, queryStart: qStart, seqLens: lens, kvCaches }),
 *   { dynamic: [0, 1, 2].map((argIndex) => ({ argIndex, dim: 0, max: 512 })), opaque: moeLayers });
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- traced args are Syms or scalars, typed by the caller
export function compile(fn: (...args: any[]) => TraceResult, options: CompileOptions = {}): CompiledFunction {
  const dyn = options.dynamic === undefined ? [] : Array.isArray(options.dynamic) ? options.dynamic : [options.dynamic];
  const programs = new Map<string, Entry>();
  const stats: CompileStats = { calls: 0, compiles: 0, recompiles: 0, cacheHits: 0, fallbackCalls: 0 };
  let lastInfo: ProgramInfo | null = null;
  const name = options.name ?? (fn.name || "anonymous");

  const signature = (args: CompileArg[]): { key: string; shapes: (number[] | null)[]; actual: number | null } => {
    let actual: number | null = null;
    for (const d of dyn) {
      const a = args[d.argIndex];
      if (!(a instanceof Tensor)) throw new OpError("compile", `dynamic dim ${d.dim} names argument ${d.argIndex}, which is not a tensor`);
      if (!Number.isInteger(d.dim) || d.dim < 0 || d.dim >= a.ndim)
        throw new OpError("compile", `dynamic dim ${d.dim} is out of range for argument ${d.argIndex} of rank ${a.ndim}`);
    }
    const shapes = args.map((a, i) => {
      if (!(a instanceof Tensor)) return null;
      const s = [...a.shape];
      for (const d of dyn.filter((x) => x.argIndex === i)) {
        const n = a.shape[d.dim]!;
        if (actual !== null && actual !== n) throw new OpError("compile", `dynamic dims of one call must share a size (${actual} vs ${n})`);
        actual = n;
        s[d.dim] = bucketFor(d, n);
      }
      return s;
    });
    const key = args.map((a, i) => (a instanceof Tensor ? `${a.dtype}[${shapes[i]!.join(",")}]@${a.device.name}` : `scalar:${Object.is(a, -0) ? "-0" : a}`)).join(" ");
    return { key, shapes, actual };
  };

  let mode: "symbolic" | "dispatch" | "auto" = options.capture ?? (options.opaque?.length ? "dispatch" : "auto");
  const dynAxesOf = (i: number) => dyn.filter((d) => d.argIndex === i).map((d) => d.dim);

  interface Traced {
    graph: Graph;
    params: readonly ParamBinding[];
    outDyn: number[][];
    multi: boolean;
    calls: OpaqueFn[];
  }
  const traceSymbolic = (args: CompileArg[], shapes: (number[] | null)[]): Traced => {
    const b = new GraphBuilder();
    const traceArgs: TraceArg[] = args.map((a, i) => (a instanceof Tensor ? b.input(shapes[i]!, a.dtype as DType, dynAxesOf(i)) : a));
    const res = fn(...traceArgs);
    const outs = Array.isArray(res) ? res : [res];
    for (const o of outs) if (!(o instanceof Sym) || o.builder !== b) throw new OpError("compile", "the compiled function must return traced tensors");
    const ids = outs.map((o) => o.id);
    return { graph: b.graph(ids), params: b.params, outDyn: ids.map((id) => b.dyn[id]!), multi: Array.isArray(res), calls: [] };
  };
  const traceDispatch = (args: CompileArg[], shapes: (number[] | null)[]): Traced =>
    captureDispatch(fn, args, shapes, args.map((_, i) => dynAxesOf(i)), options.opaque ?? []);

  /** auto: symbolic first; a function that fails on Syms for a reason other than a trace limit is captured at dispatch. */
  const trace = (args: CompileArg[], shapes: (number[] | null)[]): Traced => {
    if (mode === "symbolic") return traceSymbolic(args, shapes);
    if (mode === "dispatch") return traceDispatch(args, shapes);
    try {
      const t = traceSymbolic(args, shapes);
      mode = "symbolic";
      return t;
    } catch (symbolicError) {
      let t: Traced;
      try {
        t = traceDispatch(args, shapes);
      } catch (dispatchError) {
        throw symbolicError instanceof KilnError ? symbolicError : dispatchError;
      }
      mode = "dispatch";
      return t;
    }
  };

  const build = (args: CompileArg[], shapes: (number[] | null)[], key: string): Entry => {
    const t = trace(args, shapes);
    const device = args.find((a): a is Tensor => a instanceof Tensor)?.device ?? defaultDevice();
    const { program, fallbackReason } = buildProgram(t.graph, device, jitUnavailableReason(), `buckets:${key}`, t.calls);
    if (fallbackReason && !warnedFallback) {
      warnedFallback = true;
      process.emitWarning(`compile(): running op by op (${fallbackReason})`, { code: "KILN_COMPILE_FALLBACK" });
    }
    return { program, params: t.params, outDyn: t.outDyn, multi: t.multi, fallbackReason };
  };

  const call = (...args: CompileArg[]): Tensor | Tensor[] => {
    stats.calls++;
    const { key, shapes, actual } = signature(args);
    let entry = programs.get(key);
    if (!entry) {
      entry = build(args, shapes, key);
      programs.set(key, entry);
      stats.compiles++;
      if (entry.program.info.cacheHit) stats.cacheHits++;
      if (stats.compiles > 1) {
        stats.recompiles++;
        if (env.logRecompiles) console.error(`[kiln compile] recompiling ${name} (#${stats.recompiles}) for ${key}`);
      }
    }
    if (entry.fallbackReason) stats.fallbackCalls++;
    // programs record no autograd: outputs detached from tensors that require grad would give silently missing gradients
    if (k.isGradEnabled() && (args.some((a) => a instanceof Tensor && a.requiresGrad) || entry.params.some((p) => p instanceof Tensor && p.requiresGrad)))
      throw new UnsupportedError("compile", `${name}: compiled functions do not record autograd, and an argument or a captured tensor requires grad; call it inside noGrad(), or run the function eagerly to train through it`);
    // pad dynamic dims up to the bucket
    const temps: Tensor[] = [];
    const inputs = args.filter((a): a is Tensor => a instanceof Tensor).map((t) => {
      const i = args.indexOf(t);
      const want = shapes[i]!;
      if (want.every((d, j) => d === t.shape[j])) return t;
      const padded = k.zeros(want, { dtype: t.dtype, device: t.device });
      let region: Tensor = padded;
      want.forEach((d, j) => {
        if (d !== t.shape[j]) {
          const next = region.narrow(j, 0, t.shape[j]!);
          if (region !== padded) region.dispose();
          region = next;
        }
      });
      region.copy_(t);
      if (region !== padded) region.dispose();
      temps.push(padded);
      return padded;
    });
    const outs = entry.program.run(inputs, entry.params, actual);
    for (const t of temps) t.dispose();
    lastInfo = entry.program.info;
    const narrowed = outs.map((o, i) => {
      const axes = entry!.outDyn[i]!;
      if (actual === null || axes.length === 0) return o;
      let cur = o;
      for (const ax of axes) {
        if (cur.shape[ax] === actual) continue;
        const next = cur.narrow(ax, 0, actual);
        if (cur !== o) cur.dispose();
        cur = next;
      }
      if (cur !== o) o.dispose();
      return cur;
    });
    return entry.multi ? narrowed : narrowed[0]!;
  };
  Object.defineProperty(call, "stats", { get: () => ({ ...stats }) });
  Object.defineProperty(call, "lastInfo", { get: () => lastInfo });
  return call as CompiledFunction;
}
