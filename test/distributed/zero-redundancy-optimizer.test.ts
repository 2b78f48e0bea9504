// ZeroRedundancyOptimizer over 2 gloo ranks (TinyNet under DDP, Adam): the parameters after 3 and 5 steps equal one
// process's Adam on the global batch (1e-6); each rank holds only its partition's moments (torch's sorted-greedy
// partition, by hand below); the state consolidated on rank 0 equals the single-process optimizer's, a new
// optimizer loading it continues identically, and a single-process Adam loading it continues as the reference.
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { manualSeed, noGrad, tensor } from "../../src/tensor/index.js";
import { destroyProcessGroup, initProcessGroup } from "../../src/distributed/index.js";
import { OneCycleLR } from "../../src/train/lr-schedulers.js";
import { Adam } from "../../src/train/optim.js";
import { partitionParameters, ZeroRedundancyOptimizer } from "../../src/train/zero-redundancy-optimizer.js";
import { batch, batchData, TinyNet } from "./fixtures/ddp-model.js";
import { ADAM_LR, fromJson, type StateJson } from "./fixtures/zero-state.js";
import { cleanup, runRanks, skipWithoutGloo } from "./run-ranks.js";

const WORLD = 2;
type Params = Record<string, number[]>;

/** One process, rank 0's initialization, Adam on both ranks' rows at once; params after 3 and 5 steps, state after 3. */
function reference(): { at3: Params; at5: Params; state3: StateJson; model: TinyNet } {
  manualSeed(100);
  const model = new TinyNet();
  const opt = new Adam(model.parameters(), { lr: ADAM_LR });
  const snap = (): Params => Object.fromEntries(model.namedParameters().map(([n, p]) => [n, p.toList() as number[]]));
  let at3: Params = {};
  let state3: StateJson | null = null;
  for (let step = 0; step < 5; step++) {
    const { x, y } = batch(Array.from({ length: WORLD }, (_, r) => batchData(step, r, 0)));
    model.loss(x, y).backward();
    opt.step();
    opt.zeroGrad();
    if (step === 2) {
      at3 = snap();
      const sd = opt.stateDict();
      state3 = { ...sd, states: sd.states.map((s) => (s ? { step: s.step, buffers: Object.fromEntries(Object.entries(s.buffers).map(([k, b]) => [k, Array.from(b)])) } : null)) };
    }
  }
  return { at3, at5: snap(), state3: state3!, model };
}

function assertClose(got: number[], want: number[], what: string, tol = 1e-6): void {
  assert.equal(got.length, want.length, what);
  const worst = Math.max(...got.map((g, i) => Math.abs(g - want[i]!)));
  assert.ok(worst <= tol, `${what}: max |diff| ${worst}`);
}

function assertParams(got: Params, want: Params, what: string): void {
  for (const [name, w] of Object.entries(want)) assertClose(got[name]!, w, `${what} ${name}`);
}

describe("partitionParameters (torch's sorted-greedy partition)", () => {
  it("largest first, each to the rank with the fewest elements so far, ties to the lower rank", () => {
    // TinyNet: l1.weight 32, l1.bias 8, l2.weight 16, l2.bias 2 -> 32 to rank 0; 16, 8, 2 to rank 1 (26 < 32 throughout)
    assert.deepEqual(partitionParameters([32, 8, 16, 2], 2), [[0], [1, 2, 3]]);
    assert.deepEqual(partitionParameters([5, 5, 5, 5], 2), [[0, 2], [1, 3]]);
    assert.deepEqual(partitionParameters([10, 6, 5, 4, 1], 3), [[0], [1, 4], [2, 3]]);
    assert.deepEqual(partitionParameters([3], 2), [[0], []]);
  });
});

describe("ZeroRedundancyOptimizer misuse in one process", () => {
  it("needs distinct parameters (OptimizerError) and an initialized process group (DistributedError)", () => {
    const model = new TinyNet();
    const ps = model.parameters();
    assert.throws(() => new ZeroRedundancyOptimizer([...ps, ps[0]!], Adam, {}), (e: Error) => e.name === "OptimizerError" && /appears more than once/.test(e.message));
    assert.throws(() => new ZeroRedundancyOptimizer(ps, Adam, {}), (e: Error) => e.name === "DistributedError");
  });
});

describe("ZeroRedundancyOptimizer in a world of 1", { skip: skipWithoutGloo }, () => {
  it("is the plain optimizer, and torch's lr schedulers drive it (OneCycleLR cycles the inner Adam's beta1)", () => {
    const dir = mkdtempSync(join(tmpdir(), "kiln-zero-world1-"));
    initProcessGroup({ backend: "gloo", initMethod: `file://${join(dir, "store")}`, rank: 0, worldSize: 1 });
    try {
      const trained = (zero: boolean): { params: number[][]; beta1: number } => {
        manualSeed(100);
        const model = new TinyNet();
        const opt = zero ? new ZeroRedundancyOptimizer(model.parameters(), Adam, { lr: ADAM_LR }) : new Adam(model.parameters(), { lr: ADAM_LR });
        const sched = new OneCycleLR(opt, { maxLr: 0.05, totalSteps: 4 });
        for (let step = 0; step < 3; step++) {
          const { x, y } = batch([batchData(step, 0, 0)]);
          model.loss(x, y).backward();
          opt.step();
          opt.zeroGrad();
          sched.step();
        }
        const adam = (opt instanceof ZeroRedundancyOptimizer ? opt.localOptimizer : opt) as Adam;
        return { params: model.parameters().map((p) => p.toList() as number[]), beta1: adam.beta1 };
      };
      const plain = trained(false);
      const zero = trained(true);
      assert.notEqual(plain.beta1, 0.9, "OneCycleLR moved beta1");
      assert.equal(zero.beta1, plain.beta1);
      assert.deepEqual(zero.params, plain.params);
    } finally {
      destroyProcessGroup();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("ZeroRedundancyOptimizer across 2 processes", { skip: skipWithoutGloo, timeout: 60_000 }, () => {
  it("trains as single-process Adam, keeps 1/N of the state per rank, consolidates and reloads exactly", async () => {
    const run = await runRanks("zero-worker", WORLD);
    assert.equal(run.exitCode, 0, run.log.join("\n"));
    const [r0, r1] = run.results as [Record<string, unknown>, Record<string, unknown>];
    const ref = reference();

    // the partition, and each rank's moment buffers: exp_avg + exp_avg_sq, float32, of its own params only
    assert.deepEqual(r0.partition, [[0], [1, 2, 3]]);
    assert.deepEqual([r0.localParams, r1.localParams], [1, 3]);
    assert.deepEqual([r0.stateBytes, r1.stateBytes], [32 * 2 * 4, (8 + 16 + 2) * 2 * 4]);

    // the same parameters as one process on the global batch, on both ranks
    for (const [r, res] of [r0, r1].entries()) {
      assertParams(res.paramsAt3 as Params, ref.at3, `rank ${r} step 3`);
      assertParams(res.paramsAt5 as Params, ref.at5, `rank ${r} step 5`);
    }
    assert.deepEqual(r1.paramsAt5, r0.paramsAt5, "the replicas differ");

    // the consolidated state (rank 0) is the single-process Adam's: per param its step and both moments
    const consolidated = JSON.parse(readFileSync(join(run.outDir, "consolidated.json"), "utf8")) as StateJson;
    assert.equal(consolidated.kind, "adam");
    assert.equal(consolidated.lr, ADAM_LR);
    assert.equal(consolidated.states.length, 4);
    consolidated.states.forEach((s, i) => {
      const want = ref.state3.states[i]!;
      assert.ok(s !== null, `param ${i} has a state`);
      assert.equal(s.step, want.step);
      assert.deepEqual(Object.keys(s.buffers).sort(), ["exp_avg", "exp_avg_sq"]);
      for (const b of ["exp_avg", "exp_avg_sq"]) assertClose(s.buffers[b]!, want.buffers[b]!, `param ${i} ${b}`, b === "exp_avg" ? 1e-6 : 1e-9);
    });

    // a new ZeroRedundancyOptimizer loading it continues exactly as the uninterrupted one
    assert.deepEqual(r0.paramsAt5Reloaded, r0.paramsAt5);
    assert.deepEqual(r1.paramsAt5Reloaded, r1.paramsAt5);

    // another world size: one process's plain Adam loads the consolidated state at step 3 and continues as the reference
    manualSeed(100);
    const single = new TinyNet();
    const ranked = r0.paramsAt3 as Params;
    noGrad(() => single.namedParameters().forEach(([name, p]) => p.copy_(tensor(ranked[name]!, { shape: p.shape }))));
    const adam = new Adam(single.parameters(), { lr: ADAM_LR });
    adam.loadStateDict(fromJson(consolidated));
    for (let step = 3; step < 5; step++) {
      const { x, y } = batch(Array.from({ length: WORLD }, (_, r) => batchData(step, r, 0)));
      single.loss(x, y).backward();
      adam.step();
      adam.zeroGrad();
    }
    assertParams(Object.fromEntries(single.namedParameters().map(([n, p]) => [n, p.toList() as number[]])), ref.at5, "world size 1 from the consolidated state");

    // misuse, typed as torch raises it
    for (const [what, err] of [
      ["stateDict() before consolidateStateDict()", r0.beforeConsolidate],
      ["stateDict() on a rank consolidateStateDict(0) did not target", r1.nonTarget],
      ["stateDict() after a step", r0.afterStep],
      ["consolidateStateDict(2) in a group of 2", r0.badTarget],
      ["a state of 3 params for 4", r0.wrongCount],
    ] as const) {
      const e = err as { name: string; message: string } | null;
      assert.ok(e !== null, `${what} must throw`);
      assert.equal(e.name, "OptimizerError", `${what}: ${e.message}`);
      assert.match(e.message, /\[zero_redundancy_optimizer\]/);
    }
    assert.match((r1.nonTarget as { message: string }).message, /not been consolidated on rank 1/);
    cleanup(run);
  });
});
