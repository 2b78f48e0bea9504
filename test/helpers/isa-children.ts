// Runs a native-kernel test file once per ISA in child processes (KILN_NATIVE_ISA is read once per process).
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import type { NativeKernels } from "../../src/backends/cpu/native.js";

/**
 * The ISAs this CPU can run: scalar always, avx2/avx512/avx512-bf16 when present (`avx2: false` skips the AVX2
 * build; `bf16: false` the avx512-bf16 table, which differs from avx512 only in large-M bf16 matmuls). With
 * `amxOff` on a CPU whose AMX tiles run (features().amx), each avx512 entry is repeated as "<isa>:amx-off" (run with
 * KILN_AMX=0), so the VNNI / vdpbf16ps tiles that AMX replaces there are tested too.
 */
export function supportedIsas(k: NativeKernels, options: { avx2?: boolean; bf16?: boolean; amxOff?: boolean } = {}): string[] {
  const f = k.features();
  const isas = [
    "scalar",
    ...(options.avx2 !== false && f.avx2 && f.fma ? ["avx2"] : []),
    ...(f.avx512f ? ["avx512"] : []),
    ...(options.bf16 !== false && f.avx512f && f.avx512bf16 ? ["avx512-bf16"] : []),
  ];
  if (options.amxOff && f.amx) isas.push(...isas.filter((isa) => isa.startsWith("avx512")).map((isa) => `${isa}:amx-off`));
  return isas;
}

/**
 * Re-runs the test file at fileUrl in one child per ISA, with `childFlag=1` set, and asserts each passed. An entry
 * "<isa>:amx-off" runs that ISA with KILN_AMX=0.
 */
export function runIsaChildren(fileUrl: string, isas: string[], childFlag: string): void {
  for (const entry of isas) {
    const [isa, mode] = entry.split(":");
    // NODE_TEST_CONTEXT would make the child report to our runner instead of setting its exit code
    const { NODE_TEST_CONTEXT: _ctx, ...env } = process.env;
    const childEnv = { ...env, KILN_NATIVE_ISA: isa, [childFlag]: "1", ...(mode === "amx-off" ? { KILN_AMX: "0" } : {}) };
    const r = spawnSync(process.execPath, [fileURLToPath(fileUrl)], { env: childEnv, encoding: "utf8" });
    if (r.status !== 0) assert.fail(`ISA ${entry} failed (exit ${r.status ?? r.signal}):\n${failures(r.stdout)}\n${r.stderr}`);
  }
}

/**
 * The failing subtests of a TAP report with their diagnostics, so a long passing report cannot push the cause out
 * of a log that keeps only its head and tail; the whole report when no "not ok" line is found.
 */
function failures(tap: string): string {
  const lines = tap.split("\n");
  const out: string[] = [];
  for (let i = 0; i < lines.length; i++) {
    if (!/^\s*not ok /.test(lines[i]!)) continue;
    out.push(lines[i]!);
    // the YAML diagnostics block that follows ends at "..."
    for (let j = i + 1; j < lines.length && j < i + 80; j++) {
      out.push(lines[j]!);
      if (lines[j]!.trim() === "...") break;
    }
  }
  return out.length ? out.join("\n") : tap;
}
