// The engine compiles its decode step per batch bucket at start-up (fused kernels built by the C compiler and
// stored in the compile cache); a second start of the same model and config loads every program from the cache.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { jitUnavailableReason } from "../../src/compile/jit.js";
import type { CaptureInfo } from "../../src/engine/step-graphs.js";
import { tempPath } from "../helpers/tiny-model.js";

const fixture = path.join(path.dirname(fileURLToPath(import.meta.url)), "capture-fixture.js");

function start(cacheDir: string): { info: CaptureInfo; tokens: number[] } {
  const r = spawnSync(process.execPath, [fixture], { env: { ...process.env, KILN_CACHE_DIR: cacheDir }, encoding: "utf8", timeout: 120_000 });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout) as { info: CaptureInfo; tokens: number[] };
}

test("step graphs: a cold start compiles the fused programs, a warm start loads every one from the cache", { timeout: 240_000, skip: jitUnavailableReason() ?? false }, () => {
  const cacheDir = tempPath("kiln-capture-cache");
  try {
    const cold = start(cacheDir);
    const warm = start(cacheDir);
    assert.deepEqual(cold.info.decodeBuckets, [1, 2, 4]);
    assert.deepEqual(cold.info.mixedBuckets, [16, 32, 64, 128, 256, 512]);
    assert.ok(cold.info.programsCompiled > 0, `cold start compiled ${cold.info.programsCompiled} programs`);
    assert.equal(warm.info.programsCompiled, 0, "warm start compiled nothing");
    assert.ok(warm.info.programsFromCache >= cold.info.programsCompiled, "every program came from the cache");
    assert.equal(warm.info.kernels, cold.info.kernels);
    assert.deepEqual(warm.tokens, cold.tokens);
  } finally {
    fs.rmSync(cacheDir, { recursive: true, force: true });
  }
});
