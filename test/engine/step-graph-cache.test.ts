// The engine compiles its decode step per batch bucket at start-up (fused kernels built by the C compiler and
// stored in the compile cache); a second start of the same model and config loads every program from the cache
// and replays the recorded step graphs instead of tracing the model again.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import * as fs from "node:fs";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { jitUnavailableReason } from "../../src/compile/jit.js";
import type { CaptureInfo } from "../../src/engine/step-graphs.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";

const fixture = path.join(path.dirname(fileURLToPath(import.meta.url)), "capture-fixture.js");

interface Start {
  info: CaptureInfo;
  tokens: number[];
  logprob: number;
  replays: number;
}

function start(cacheDir: string): Start {
  const env = { ...process.env, KILN_CACHE_DIR: cacheDir, KILN_FIXTURE_MODEL: tinyModelDir("LlamaForCausalLM") };
  const r = spawnSync(process.execPath, [fixture], { env, encoding: "utf8", timeout: 120_000 });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout) as Start;
}

/** The step-graph recordings' entry (one per model and engine shape) under the cache directory. */
function graphEntry(cacheDir: string): string {
  const dirs = fs.readdirSync(path.join(cacheDir, "compile")).filter((d) => d.startsWith("graphs-"));
  assert.equal(dirs.length, 1, `one step-graph entry: ${dirs.join(", ")}`);
  return path.join(cacheDir, "compile", dirs[0]!);
}

/** The same completions, bit for bit, from graphs that ran (a replayed graph with a wrong buffer would differ). */
function assertSameRun(got: Start, want: Start, label: string): void {
  assert.ok(got.replays > 0, `${label}: steps ran on the step graphs`);
  assert.deepEqual(got.tokens, want.tokens, `${label}: tokens`);
  assert.equal(got.logprob, want.logprob, `${label}: cumulative logprob`);
}

test(
  "step graphs: a warm start replays the recorded graphs instead of tracing; a corrupt or misfitting recording is traced again",
  { timeout: 300_000, skip: jitUnavailableReason() ?? false },
  () => {
    const cacheDir = tempPath("kiln-graph-cache");
    try {
      const cold = start(cacheDir);
      assert.equal(cold.info.replayed, false);
      const warm = start(cacheDir);
      assert.equal(warm.info.replayed, true, "the second start replays");
      assert.equal(warm.info.kernels, cold.info.kernels);
      assertSameRun(warm, cold, "replayed");

      // a flipped byte in the stored blobs: the checksum rejects the entry, the start traces and stores it again
      const entry = graphEntry(cacheDir);
      const data = fs.readFileSync(path.join(entry, "data.bin"));
      data[data.length >> 1] ^= 0xff;
      fs.writeFileSync(path.join(entry, "data.bin"), data);
      const corrupt = start(cacheDir);
      assert.equal(corrupt.info.replayed, false, "a corrupt entry is not replayed");
      assertSameRun(corrupt, cold, "after corruption");
      assert.equal(start(cacheDir).info.replayed, true, "the rebuilt entry replays");

      // an intact entry whose weights do not match this process's (as if the numbering differed): traced again
      const json = JSON.parse(fs.readFileSync(path.join(entry, "recording.json"), "utf8")) as { buckets: { meta: { buffers: { kind: string; sample?: string }[] } }[] };
      const prior = json.buckets[0]!.meta.buffers.find((b) => b.kind === "prior")!;
      prior.sample = (prior.sample![0] === "0" ? "1" : "0") + prior.sample!.slice(1); // one hex digit flipped
      const text = JSON.stringify(json);
      fs.writeFileSync(path.join(entry, "recording.json"), text);
      const meta = JSON.parse(fs.readFileSync(path.join(entry, "meta.json"), "utf8")) as { json: string };
      meta.json = createHash("sha256").update(text).digest("hex");
      fs.writeFileSync(path.join(entry, "meta.json"), JSON.stringify(meta));
      const misfit = start(cacheDir);
      assert.equal(misfit.info.replayed, false, "a recording that does not fit is not replayed");
      assertSameRun(misfit, cold, "after a misfit");
    } finally {
      fs.rmSync(cacheDir, { recursive: true, force: true });
    }
  },
);

test("step graphs: a cold start compiles the fused programs, a warm start loads every one from the cache", { timeout: 240_000, skip: jitUnavailableReason() ?? false }, () => {
  const cacheDir = tempPath("kiln-capture-cache");
  try {
    const cold = start(cacheDir);
    const warm = start(cacheDir);
    assert.deepEqual(cold.info.decodeBuckets, [1, 2, 4]);
    assert.deepEqual(cold.info.mixedBuckets, [4, 8, 16, 32, 64, 128, 256, 512]);
    assert.ok(cold.info.programsCompiled > 0, `cold start compiled ${cold.info.programsCompiled} programs`);
    assert.equal(warm.info.programsCompiled, 0, "warm start compiled nothing");
    assert.ok(warm.info.programsFromCache >= cold.info.programsCompiled, "every program came from the cache");
    assert.equal(warm.info.kernels, cold.info.kernels);
    assert.deepEqual(warm.tokens, cold.tokens);
    assert.equal(warm.logprob, cold.logprob);
  } finally {
    fs.rmSync(cacheDir, { recursive: true, force: true });
  }
});
