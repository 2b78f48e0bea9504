// Decode step of the SmolLM-135M-shaped bf16 model at batch 1 and 32, three ways: eager (every op dispatched
// from JS, --enforce-eager), a step graph captured op by op (unfused), and a step graph captured under
// defer-and-fuse (elementwise chains as generated C kernels) — what `kiln serve` runs. Best of 5 x 10 steps.
// Usage: npm run bench:step
import type { ScheduledBatch } from "../src/engine/model-runner.js";
import { createServingSetupSync } from "../src/engine/serving.js";
import { benchModelDir } from "./bench-models.js";
const setup = createServingSetupSync({
  model: benchModelDir("bfloat16"),
  maxModelLen: 256,
  kvCacheMemory: 256 << 20,
  maxNumSeqs: 32,
  enforceEager: true,
});
const runner = setup.runner;
const bs = 16;
function batch(n: number, pos: number): ScheduledBatch {
  return {
    blockSize: bs,
    numTokens: n,
    finishedRequestIds: [],
    sampleOnDevice: false,
    sequences: Array.from({ length: n }, (_, i) => {
      const blockTable = Array.from({ length: Math.ceil((pos + 1) / bs) }, (_, b) => 1 + i * 5 + b);
      const p = pos;
      return {
        requestId: `r${i}`,
        tokenIds: [5 + i],
        startPosition: p,
        blockTable,
        slotMapping: Int32Array.of(blockTable[Math.floor(p / bs)]! * bs + (p % bs)),
        needsLogits: true,
        needsPromptLogits: false,
      };
    }),
  };
}
function time(label: string, n: number): number {
  for (let i = 0; i < 5; i++) runner.execute(batch(n, 40 + i));
  const ts: number[] = [];
  for (let r = 0; r < 5; r++) {
    const t0 = performance.now();
    for (let i = 0; i < 10; i++) runner.execute(batch(n, 50 + i));
    ts.push((performance.now() - t0) / 10);
  }
  ts.sort((a, b) => a - b);
  console.log(`${label} batch ${n}: ${ts[0].toFixed(2)} ms (median ${ts[2].toFixed(2)})`);
  return ts[0];
}
const res: Record<string, number> = {};
for (const n of [1, 32]) {
  runner.graphs?.dispose();
  runner.graphs = null;
  res[`eager${n}`] = time("eager (JS dispatch)   ", n);
  runner.captureStepGraphs(256, { decodeBuckets: [n], fuse: false });
  res[`unfused${n}`] = time(`graph, unfused (${runner.graphs!.info!.kernels} kernels)`, n);
  runner.graphs!.dispose();
  runner.graphs = null;
  runner.captureStepGraphs(256, { decodeBuckets: [n], fuse: true });
  res[`fused${n}`] = time(`graph, fused (${runner.graphs!.info!.kernels} kernels)  `, n);
  console.log(
    `batch ${n}: fused/unfused graph ${(res[`fused${n}`]! / res[`unfused${n}`]!).toFixed(2)}, fused graph vs eager ${(res[`eager${n}`]! / res[`fused${n}`]!).toFixed(2)}x faster`,
  );
}
