// `kiln collect-env` (vLLM's `vllm collect-env`): what a bug report needs to know about this machine and install —
// Kiln's and Node's versions, the CPU and the kernels it dispatches to, the native addons, the C compiler compile()
// uses, memory, the caches and the environment variables Kiln (and vLLM, HF) read, secrets masked.
import { existsSync, readFileSync, readdirSync, statSync } from "node:fs";
import { arch, cpus, freemem, platform, release, totalmem } from "node:os";
import { join } from "node:path";
import { nativeLoadError, tryLoadNativeKernels } from "../backends/cpu/native.js";
import { kilnVersion, jitUnavailableReason, probeCompiler } from "../compile/jit.js";
import { glooUnavailableReason } from "../distributed/gloo-native.js";
import { env } from "../util/env.js";

/** Environment variables reported: Kiln's own, vLLM's and Hugging Face's, and the thread-count ones. */
const REPORTED_VARIABLE = /^(KILN_|VLLM_|HF_|HUGGING_FACE_|OMP_NUM_THREADS$|OPENAI_API_KEY$|NODE_OPTIONS$)/;
/** Variables whose values are credentials: reported as set, never shown. */
const SECRET = /KEY|TOKEN|SECRET|PASSWORD/;

const GiB = 2 ** 30;

/** Bytes under `dir` (0 when absent). */
function duBytes(dir: string): number {
  let total = 0;
  const walk = (d: string): void => {
    let entries;
    try {
      entries = readdirSync(d, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.isFile()) total += statSync(p, { throwIfNoEntry: false })?.size ?? 0;
    }
  };
  walk(dir);
  return total;
}

/** /proc/cpuinfo's first "flags" line, as a set (empty off Linux). */
function cpuFlags(): Set<string> {
  try {
    const line = readFileSync("/proc/cpuinfo", "utf8").split("\n").find((l) => l.startsWith("flags"));
    return new Set(line?.split(":")[1]?.trim().split(/\s+/) ?? []);
  } catch {
    return new Set();
  }
}

/** The CPU flags Kiln's kernels dispatch on, in /proc/cpuinfo's names. */
const KERNEL_FLAGS = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16"];

/** The report's lines. */
export function collectEnv(): string[] {
  const lines: string[] = [];
  const row = (name: string, value: string): void => {
    lines.push(`${`${name}:`.padEnd(28)}${value}`);
  };
  const section = (title: string): void => {
    if (lines.length > 0) lines.push("");
    lines.push(`==== ${title} ====`);
  };

  section("Kiln");
  row("Kiln version", kilnVersion());
  row("Node.js", `${process.version} (V8 ${process.versions.v8}, N-API ${process.versions.napi})`);
  row("OS", `${platform()} ${release()} ${arch()}`);
  if (existsSync("/etc/os-release")) {
    const pretty = /^PRETTY_NAME="?([^"\n]*)"?/m.exec(readFileSync("/etc/os-release", "utf8"))?.[1];
    if (pretty) row("Distribution", pretty);
  }

  section("CPU");
  const cores = cpus();
  row("Model", cores[0]?.model ?? "unknown");
  row("Logical CPUs", String(cores.length));
  const flags = cpuFlags();
  if (flags.size > 0) row("Kernel ISA flags", KERNEL_FLAGS.map((f) => `${f}${flags.has(f) ? "+" : "-"}`).join(" "));
  row("Memory", `${(totalmem() / GiB).toFixed(1)} GiB total, ${(freemem() / GiB).toFixed(1)} GiB free`);

  section("Native kernels");
  const native = tryLoadNativeKernels();
  if (native === null) row("kiln_native", `unavailable (${nativeLoadError()}): the cpu back end falls back to the reference one`);
  else {
    const f = native.features();
    // (the cpu back end sets KILN_NUM_THREADS when it starts; the addon's own default is every core)
    const threads = env.numThreads ?? native.getNumThreads();
    row("kiln_native", `loaded, ${native.isa} kernels, ${threads} threads${env.numThreads !== undefined ? " (KILN_NUM_THREADS)" : ""}${f.amx ? ", AMX" : ""}`);
  }
  const cc = probeCompiler();
  row("C compiler (KILN_CC)", cc.ok ? `${env.cc}: ${cc.version}` : cc.why);
  const jit = jitUnavailableReason();
  row("compile() JIT", jit === null ? "available" : `unavailable (${jit}): compiled programs run op by op`);
  const gloo = glooUnavailableReason();
  row("kiln_gloo", gloo === null ? "loaded (gloo process groups)" : `unavailable (${gloo}): process groups use the tcp back end`);

  section("Caches");
  row("Compile cache", `${env.cacheDir} (${(duBytes(join(env.cacheDir, "compile")) / 2 ** 20).toFixed(1)} MiB, limit KILN_CACHE_MAX_MB ${env.cacheMaxMb})`);
  row("Hugging Face cache", env.hfHome);

  section("Environment variables");
  const vars = Object.keys(process.env).filter((k) => REPORTED_VARIABLE.test(k)).sort();
  if (vars.length === 0) lines.push("(none set)");
  for (const k of vars) lines.push(`${k}=${SECRET.test(k) ? "***" : process.env[k]}`);
  return lines;
}

export function runCollectEnv(out: { write(s: string): void } = process.stdout): void {
  out.write("Collecting environment information...\n");
  out.write(`${collectEnv().join("\n")}\n`);
}
