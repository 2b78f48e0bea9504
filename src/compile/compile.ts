// compile(fn, options): captures fn into the IR by calling it once with symbolic tensors (trace.ts),
// builds a program per guard signature and runs it. Guards: each tensor argument's dtype, rank and
// non-dynamic dims, each scalar argument's value. A dynamic dim is padded up to its bucket (powers of
// two by default) so any size within a bucket reuses one program; outputs are narrowed back.
import { OpError } from "../util/errors.js";
import { env } from "../util/env.js";
import * as k from "../tensor/index.js";
import { Tensor, defaultDevice } from "../tensor/index.js";
import type { DType } from "./ir.js";
import { jitUnavailableReason } from "./jit.js";
import { buildProgram, type Program, type ProgramInfo } from "./program.js";
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
}

export type CompileArg = Tensor | number | boolean;
type TraceArg = Sym | number | boolean;
type TraceResult = Sym | Sym[];

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
  params: Tensor[];
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
    const key = args.map((a, i) => (a instanceof Tensor ? `${a.dtype}[${shapes[i]!.join(",")}]@${a.device.name}` : `scalar:${a}`)).join(" ");
    return { key, shapes, actual };
  };

  const build = (args: CompileArg[], shapes: (number[] | null)[], key: string): Entry => {
    const b = new GraphBuilder();
    const traceArgs: TraceArg[] = args.map((a, i) => {
      if (!(a instanceof Tensor)) return a;
      const dims = dyn.filter((d) => d.argIndex === i).map((d) => d.dim);
      return b.input(shapes[i]!, a.dtype as DType, dims);
    });
    const res = fn(...traceArgs);
    const outs = Array.isArray(res) ? res : [res];
    for (const o of outs) if (!(o instanceof Sym) || o.builder !== b) throw new OpError("compile", "the compiled function must return traced tensors");
    const device = args.find((a): a is Tensor => a instanceof Tensor)?.device ?? defaultDevice();
    const { program, fallbackReason } = buildProgram(b.graph(outs.map((o) => o.id)), device, jitUnavailableReason(), `buckets:${key}`);
    if (fallbackReason && !warnedFallback) {
      warnedFallback = true;
      process.emitWarning(`compile(): running op by op (${fallbackReason})`, { code: "KILN_COMPILE_FALLBACK" });
    }
    return { program, params: b.params, outDyn: outs.map((o) => b.dyn[o.id]!), multi: Array.isArray(res), fallbackReason };
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
    const outs = entry.program.run(inputs, entry.params);
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
