// Runs a native-kernel test file once per ISA in child processes (KILN_NATIVE_ISA is read once per process).
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import type { NativeKernels } from "../../src/backends/cpu/native.js";

/**
 * The ISAs this CPU can run: scalar always, avx2/avx512/avx512-bf16 when present (`avx2: false` skips the AVX2
 * build; `bf16: false` the avx512-bf16 table, which differs from avx512 only in large-M bf16 matmuls).
 */
export function supportedIsas(k: NativeKernels, options: { avx2?: boolean; bf16?: boolean } = {}): string[] {
  const f = k.features();
  return [
    "scalar",
    ...(options.avx2 !== false && f.avx2 && f.fma ? ["avx2"] : []),
    ...(f.avx512f ? ["avx512"] : []),
    ...(options.bf16 !== false && f.avx512f && f.avx512bf16 ? ["avx512-bf16"] : []),
  ];
}

/** Re-runs the test file at fileUrl in one child per ISA, with `childFlag=1` set, and asserts each passed. */
export function runIsaChildren(fileUrl: string, isas: string[], childFlag: string): void {
  for (const isa of isas) {
    // NODE_TEST_CONTEXT would make the child report to our runner instead of setting its exit code
    const { NODE_TEST_CONTEXT: _ctx, ...env } = process.env;
    const r = spawnSync(process.execPath, [fileURLToPath(fileUrl)], { env: { ...env, KILN_NATIVE_ISA: isa, [childFlag]: "1" }, encoding: "utf8" });
    assert.equal(r.status, 0, `ISA ${isa} failed:\n${r.stdout}\n${r.stderr}`);
  }
}
