// The native side of the compiler: runs the system C compiler on generated (or user) C source and loads
// the resulting shared library through the kiln_jit addon (dlopen/dlsym + one call ABI:
// `void entry(void** bufs, const int64_t* sizes)`). Either piece missing means "no JIT": callers fall
// back to op-by-op execution with a warning, never an error.
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { env } from "../util/env.js";

interface JitAddon {
  load(path: string): number;
  entry(lib: number, name: string): number;
  call(entry: number, bufs: (ArrayBufferView | ArrayBuffer)[], sizes?: BigInt64Array): void;
  /** The entry's code address (for enqueueing on the cpu stream); valid for the process lifetime. */
  address(entry: number): bigint;
}

function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "package.json"))) dir = dirname(dir);
  return dir;
}

let addon: JitAddon | null | undefined;
let addonError = "";

export function jitAddon(): JitAddon | null {
  if (addon !== undefined) return addon;
  const path = join(packageRoot(), "build", "Release", "kiln_jit.node");
  try {
    addon = createRequire(join(packageRoot(), "package.json"))(path) as JitAddon;
  } catch (e) {
    addon = null;
    addonError = `kiln_jit addon not loadable (${(e as Error).message.split("\n")[0]}); run node-gyp rebuild`;
  }
  return addon;
}

// Both go into every cache key (one per fused program a capture builds): read once per process.
let version: string | undefined;
export function kilnVersion(): string {
  version ??= (JSON.parse(readFileSync(join(packageRoot(), "package.json"), "utf8")) as { version: string }).version;
  return version;
}

let ccProbe: { cc: string; ok: boolean; version: string; why: string } | undefined;

/** Whether the C compiler runs; its version string goes into cache keys. */
export function probeCompiler(): { ok: boolean; version: string; why: string } {
  if (ccProbe && ccProbe.cc === env.cc) return ccProbe;
  const r = spawnSync(env.cc, ["--version"], { encoding: "utf8" });
  ccProbe =
    r.error || r.status !== 0
      ? { cc: env.cc, ok: false, version: "", why: `C compiler "${env.cc}" not usable (${r.error?.message ?? r.stderr.trim()})` }
      : { cc: env.cc, ok: true, version: r.stdout.split("\n")[0]!, why: "" };
  return ccProbe;
}

/** Why JIT execution is unavailable, or null when it is available. */
export function jitUnavailableReason(): string | null {
  const cc = probeCompiler();
  if (!cc.ok) return cc.why;
  if (!jitAddon()) return addonError;
  return null;
}

/** Flags for generated code: x86-64-v3 (AVX2+FMA) when the CPU has it; never -march=native (see binding.gyp). */
let flags: readonly string[] | undefined;
export function compilerFlags(): string[] {
  if (!flags) {
    // -fno-trapping-math lets gcc if-convert (and so vectorise) the selects in k_exp/k_tanh/where
    const f = ["-O3", "-shared", "-fPIC", "-fno-math-errno", "-fno-trapping-math", "-std=c11"];
    let cpu = "";
    try {
      cpu = readFileSync("/proc/cpuinfo", "utf8");
    } catch {
      /* not linux: portable flags */
    }
    if (process.arch === "x64" && / avx2 /.test(cpu) && / fma /.test(cpu)) f.push("-march=x86-64-v3");
    flags = f;
  }
  return [...flags];
}

/**
 * Compiles C source at srcPath into a shared library at outPath; throws with the compiler's stderr.
 * Paths are relative to `cwd` when given (the source name is recorded in the library's symbol table).
 */
export function compileC(srcPath: string, outPath: string, flags: string[], cwd?: string): void {
  const r = spawnSync(env.cc, [...flags, "-o", outPath, srcPath, "-lm"], { encoding: "utf8", ...(cwd ? { cwd } : {}) });
  if (r.error || r.status !== 0) throw new Error(`C compile failed (${env.cc}): ${r.error?.message ?? r.stderr}`);
}

/** "<cache key>#<entry>" of each code address handed out by a library loaded through the compile cache. */
const codeNames = new Map<bigint, string>();

/** The compile-cache name of generated code at `address` (for step-graph recordings), or null. */
export function codeName(address: bigint): string | null {
  return codeNames.get(address) ?? null;
}

/** A loaded library: entries looked up by name, called with buffers and optional sizes. */
export class JitLibrary {
  private readonly entries = new Map<string, number>();
  /** The compile-cache key it was loaded under (getLibrary), naming its code addresses. */
  cacheKey: string | null = null;
  constructor(
    private readonly jit: JitAddon,
    private readonly lib: number,
  ) {}
  static load(path: string): JitLibrary {
    const a = jitAddon();
    if (!a) throw new Error(addonError);
    return new JitLibrary(a, a.load(path));
  }
  private entryId(name: string): number {
    let id = this.entries.get(name);
    if (id === undefined) {
      id = this.jit.entry(this.lib, name);
      this.entries.set(name, id);
    }
    return id;
  }
  entry(name: string): (bufs: (ArrayBufferView | ArrayBuffer)[], sizes?: BigInt64Array) => void {
    const jit = this.jit;
    const eid = this.entryId(name);
    return (bufs, sizes) => jit.call(eid, bufs, sizes);
  }
  /** The entry's code address: libraries are never unloaded, so queued calls may outlive every JS reference. */
  address(name: string): bigint {
    const a = this.jit.address(this.entryId(name));
    if (this.cacheKey !== null) codeNames.set(a, `${this.cacheKey}#${name}`);
    return a;
  }
}
