// Decode tokens/s of a small Mixtral-shaped bf16 model (hidden 256, 4 layers, 8 experts of 768, top 2) at batch 1
// and 8, three ways in one run: the host-routed MoE Kiln ran before (router top-k read back, experts combined on the
// host; test/helpers/host-routed-moe.ts), on-device routing eager (the moe kernel, every op dispatched from JS) and
// on-device routing in a captured decode step graph. Ratios are of times measured in this run, same machine.
// Best of 5 x 10 steps; --quick: best of 2 x 2 (a smoke run).
// Usage: node dist/bench/moe-decode.js [--quick]
import * as fs from "node:fs";
import * as path from "node:path";
import type { ScheduledBatch } from "../src/engine/model-runner.js";
import { createServingSetupSync } from "../src/engine/serving.js";
import { initModel } from "../src/models/init-model.js";
import { MoE } from "../src/nn/mlp.js";
import type { Tensor } from "../src/tensor/index.js";
import { hostRoutedForward } from "../test/helpers/host-routed-moe.js";
import { BENCH_ROOT, benchTokenizerDir } from "./bench-models.js";

const quick = process.argv.includes("--quick");
const [rounds, steps] = quick ? [2, 2] : [5, 10];

const dir = path.join(BENCH_ROOT, "mixtral-small-random-bfloat16");
if (!fs.existsSync(path.join(dir, "model.safetensors"))) {
  initModel(dir, {
    architecture: "MixtralForCausalLM", preset: "small", tokenizerDir: benchTokenizerDir(), seed: 1, dtype: "bfloat16",
    overrides: { num_local_experts: 8, num_experts_per_tok: 2 },
  });
}
const setup = createServingSetupSync({ model: dir, maxModelLen: 256, kvCacheMemory: 64 << 20, maxNumSeqs: 8, enforceEager: true });
const runner = setup.runner;
const moes = setup.loaded.model.namedModules().flatMap(([, m]) => (m instanceof MoE ? [m] : []));
const bs = 16;

/** One decode step of n sequences at position pos (each its own blocks). */
function batch(n: number, pos: number): ScheduledBatch {
  return {
    blockSize: bs,
    numTokens: n,
    finishedRequestIds: [],
    sampleOnDevice: false,
    sequences: Array.from({ length: n }, (_, i) => {
      const blockTable = Array.from({ length: Math.ceil((pos + 1) / bs) }, (_, b) => 1 + i * 5 + b);
      return {
        requestId: `r${i}`, tokenIds: [5 + i], startPosition: pos, blockTable,
        slotMapping: Int32Array.of(blockTable[Math.floor(pos / bs)]! * bs + (pos % bs)), needsLogits: true, needsPromptLogits: false,
      };
    }),
  };
}

/** Decode tokens/s at batch n: best round of `steps` steps. */
function tokensPerSecond(label: string, n: number): number {
  for (let i = 0; i < 3; i++) runner.execute(batch(n, 40 + i));
  let best = Infinity;
  for (let r = 0; r < rounds; r++) {
    const t0 = performance.now();
    for (let i = 0; i < steps; i++) runner.execute(batch(n, 50 + i));
    best = Math.min(best, (performance.now() - t0) / steps);
  }
  const tps = (n * 1000) / best;
  console.log(`batch ${n}, ${label}: ${best.toFixed(2)} ms/step, ${tps.toFixed(0)} tokens/s`);
  return tps;
}

console.log(`Mixtral-shaped bf16 (${moes.length} MoE layers, 8 experts top 2) on ${setup.loaded.model.device.backend.describe()}${quick ? " (--quick)" : ""}`);
for (const n of [1, 8]) {
  for (const m of moes) m.forward = (x: Tensor) => hostRoutedForward(m, x);
  const host = tokensPerSecond("host-routed (eager)     ", n);
  for (const m of moes) delete (m as { forward?: unknown }).forward;
  const eager = tokensPerSecond("on-device routing, eager", n);
  if (!runner.captureStepGraphs(256, { decodeBuckets: [n] })) throw new Error(`no step graph: ${runner.captureFailure}`);
  const graph = tokensPerSecond("on-device, step graph   ", n);
  runner.graphs!.dispose();
  runner.graphs = null;
  console.log(`batch ${n}: on-device eager / host-routed ${(eager / host).toFixed(2)}x, step graph / host-routed ${(graph / host).toFixed(2)}x, step graph / on-device eager ${(graph / eager).toFixed(2)}x`);
}
