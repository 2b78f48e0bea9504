// DistributedDataParallel: 2 ranks training a tiny model on their shards end with the parameters of one process
// trained on the concatenated global batch (within 1e-5), identical across ranks; noSync defers the averaging.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { manualSeed } from "../../src/tensor/index.js";
import { SGD } from "../../src/train/optim.js";
import { batch, batchData, LR, MOMENTUM, STEPS, TinyNet } from "./fixtures/ddp-model.js";
import { cleanup, runRanks, skipWithoutGloo } from "./run-ranks.js";

const WORLD = 2;

/** One process, rank 0's initialization, each step on every rank's micro-batches at once (mean over all rows). */
function reference(micros: number): Record<string, number[]> {
  manualSeed(100);
  const model = new TinyNet();
  const opt = new SGD(model.parameters(), { lr: LR, momentum: MOMENTUM });
  for (let step = 0; step < STEPS; step++) {
    const rows = Array.from({ length: WORLD }, (_, r) => Array.from({ length: micros }, (_, m) => batchData(step, r, m))).flat();
    const { x, y } = batch(rows);
    model.loss(x, y).backward();
    opt.step();
    opt.zeroGrad();
  }
  return Object.fromEntries(model.namedParameters().map(([n, p]) => [n, p.toList()]));
}

function assertClose(got: number[], want: number[], what: string): void {
  assert.equal(got.length, want.length, what);
  const worst = Math.max(...got.map((g, i) => Math.abs(g - want[i]!)));
  assert.ok(worst <= 1e-5, `${what}: max |diff| ${worst}`);
}

describe("DistributedDataParallel across 2 processes", { skip: skipWithoutGloo, timeout: 60_000 }, () => {
  for (const mode of ["plain", "accum"] as const) {
    it(`${mode === "plain" ? "one micro-batch per step" : "gradient accumulation under noSync, one bucket per parameter"} matches single-process training on the global batch`, async () => {
      const run = await runRanks("ddp-worker", WORLD, [mode]);
      assert.equal(run.exitCode, 0, run.log.join("\n"));
      const want = reference(mode === "accum" ? 2 : 1);
      const [r0, r1] = run.results as [Record<string, unknown>, Record<string, unknown>];
      assert.deepEqual(r0.names, ["module.l1.weight", "module.l1.bias", "module.l2.weight", "module.l2.bias"]);
      for (const [name, w] of Object.entries(want)) {
        const p0 = (r0.params as Record<string, number[]>)[name]!;
        const p1 = (r1.params as Record<string, number[]>)[name]!;
        assertClose(p0, w, `rank 0 ${name}`);
        assert.deepEqual(p1, p0, `${name} differs between the ranks`);
      }
      // every step averages once per bucket: 1 bucket (plain) or 4 (accum: one per parameter); noSync adds none
      assert.equal(r0.allReduceCount, mode === "plain" ? STEPS : STEPS * 4);
      if (mode === "accum") {
        // after the noSync backward each rank holds its own gradient; after the synchronized one, the same average
        assert.notDeepEqual(r0.localGradAfterNoSync, r1.localGradAfterNoSync);
        assert.deepEqual(r0.syncedGrad, r1.syncedGrad);
      }
      cleanup(run);
    });
  }
});
