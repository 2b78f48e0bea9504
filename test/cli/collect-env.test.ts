// `kiln collect-env`: the report states this machine's facts (read here independently: process, os, /proc/cpuinfo)
// and masks credentials.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { cpus } from "node:os";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("../../..", import.meta.url)); // dist/test/cli -> package root

describe("kiln collect-env", () => {
  it("reports versions, CPU, kernels and Kiln's environment, secrets masked", () => {
    const r = spawnSync(`${root}/bin/kiln`, ["collect-env"], {
      encoding: "utf8", timeout: 60_000,
      env: { ...process.env, KILN_API_KEY: "secret123", HF_TOKEN: "hf_abc", KILN_NUM_THREADS: "1", UNRELATED_VAR: "x" },
    });
    assert.equal(r.status, 0, r.stderr);
    const out = r.stdout;
    const version = (JSON.parse(readFileSync(`${root}/package.json`, "utf8")) as { version: string }).version;
    assert.match(out, new RegExp(`^Kiln version: +${version.replace(/\./g, "\\.")}$`, "m"));
    assert.match(out, new RegExp(`^Node\\.js: +${process.version.replace(/\./g, "\\.")} `, "m"));
    assert.match(out, new RegExp(`^Logical CPUs: +${cpus().length}$`, "m"));
    if (existsSync("/proc/cpuinfo")) {
      const flags = readFileSync("/proc/cpuinfo", "utf8").split("\n").find((l) => l.startsWith("flags"))!.split(":")[1]!.trim().split(/\s+/);
      for (const f of ["avx2", "avx512f", "avx512_bf16", "amx_tile"]) assert.match(out, new RegExp(` ${f}${flags.includes(f) ? "\\+" : "-"}( |$)`, "m"), f);
    }
    assert.match(out, /^kiln_native: +(loaded, \S+ kernels, 1 threads \(KILN_NUM_THREADS\)|unavailable)/m);
    assert.match(out, /^KILN_NUM_THREADS=1$/m);
    assert.match(out, /^KILN_API_KEY=\*\*\*$/m);
    assert.match(out, /^HF_TOKEN=\*\*\*$/m);
    assert.doesNotMatch(out, /secret123|hf_abc|UNRELATED_VAR/);
  });
});
