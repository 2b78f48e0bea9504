// torch.optim.lr_scheduler's schedulers: lr sequences against numbers written out from torch's formulas, the
// closed form against torch's recursive step() form, SequentialLR's switching, OneCycleLR's phases and momentum,
// state-dict resume, and the trainer reading a scheduler by step index.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import * as k from "../../src/tensor/index.js";
import { Adagrad, Adam, SGD } from "../../src/train/optim.js";
import {
  ConstantLR, CosineAnnealingLR, CosineAnnealingWarmRestarts, ExponentialLR, LambdaLR, LinearLR, LrSchedulerError, MultiStepLR, OneCycleLR,
  PolynomialLR, SequentialLR, StepLR, type LRScheduler,
} from "../../src/train/lr-schedulers.js";
import { train, type TrainableModel } from "../../src/train/trainer.js";

const sgd = (lr = 1) => new SGD([k.tensor([0], { requiresGrad: true })], { lr });

/** The lr after construction and after each of n - 1 step() calls, as getLastLr() and the optimizer report them. */
function lrs(s: LRScheduler, n: number): number[] {
  const out = [s.getLastLr()];
  assert.equal(s.optimizer.lr, out[0]);
  for (let i = 1; i < n; i++) {
    s.step();
    assert.equal(s.optimizer.lr, s.getLastLr());
    assert.equal(s.lrAt(i), s.getLastLr(), `lrAt(${i}) is what step() set`);
    out.push(s.getLastLr());
  }
  return out;
}

function closeAll(got: number[], want: number[], tol = 1e-12): void {
  assert.equal(got.length, want.length);
  got.forEach((g, i) => assert.ok(Math.abs(g - want[i]!) <= tol * Math.max(1, Math.abs(want[i]!)), `epoch ${i}: ${g} vs ${want[i]} (${got.join(", ")})`));
}

describe("each scheduler's lr sequence, from torch's formulas", () => {
  test("StepLR(step_size=2, gamma=0.1) from 1.0: 1, 1, 0.1, 0.1, 0.01", () => {
    closeAll(lrs(new StepLR(sgd(), { stepSize: 2 }), 5), [1, 1, 0.1, 0.1, 0.01]);
  });
  test("MultiStepLR: gamma at each milestone, twice at a milestone listed twice", () => {
    closeAll(lrs(new MultiStepLR(sgd(), { milestones: [5, 2], gamma: 0.5 }), 7), [1, 1, 0.5, 0.5, 0.5, 0.25, 0.25]);
    closeAll(lrs(new MultiStepLR(sgd(), { milestones: [1, 3, 3] }), 5), [1, 0.1, 0.1, 0.001, 0.001]);
  });
  test("ExponentialLR, LambdaLR, ConstantLR, PolynomialLR", () => {
    closeAll(lrs(new ExponentialLR(sgd(2), 0.5), 4), [2, 1, 0.5, 0.25]);
    closeAll(lrs(new LambdaLR(sgd(), (e) => 1 / (e + 1)), 4), [1, 1 / 2, 1 / 3, 1 / 4]);
    closeAll(lrs(new ConstantLR(sgd(0.3)), 7), [0.1, 0.1, 0.1, 0.1, 0.1, 0.3, 0.3]); // factor 1/3 for total_iters 5
    closeAll(lrs(new PolynomialLR(sgd(), { totalIters: 4, power: 2 }), 6), [1, 0.5625, 0.25, 0.0625, 0, 0]);
  });
  test("LinearLR(start 0.5, end 1, total_iters 4) from 0.2, and torch's chainable form gives the same", () => {
    const got = lrs(new LinearLR(sgd(0.2), { startFactor: 0.5, totalIters: 4 }), 7);
    closeAll(got, [0.1, 0.125, 0.15, 0.175, 0.2, 0.2, 0.2]);
    // torch's get_lr(): lr_e = lr_{e-1} (1 + (end - start) / (T start + (e - 1)(end - start))) up to T
    let lr = 0.2 * 0.5;
    for (let e = 1; e < 7; e++) {
      if (e <= 4) lr *= 1 + 0.5 / (4 * 0.5 + (e - 1) * 0.5);
      assert.ok(Math.abs(lr - got[e]!) < 1e-15, `recursive epoch ${e}`);
    }
  });
  test("CosineAnnealingLR(T_max=4): the closed form, which torch's recursive step() matches, rising again after T_max", () => {
    const got = lrs(new CosineAnnealingLR(sgd(), { tMax: 4, etaMin: 0.1 }), 13);
    const c = (e: number) => 0.1 + 0.9 * (1 + Math.cos((Math.PI * e) / 4)) / 2;
    closeAll(got.slice(0, 6), [1, 0.1 + 0.9 * 0.8535533905932737, 0.55, 0.1 + 0.9 * 0.14644660940672624, 0.1, c(5)]);
    // torch's get_lr(), recursively from the previous lr (with its special case one step past each minimum)
    let lr = 1;
    for (let e = 1; e < 13; e++) {
      lr = (e - 1 - 4) % 8 === 0
        ? lr + (0.9 * (1 - Math.cos(Math.PI / 4))) / 2
        : ((1 + Math.cos((Math.PI * e) / 4)) / (1 + Math.cos((Math.PI * (e - 1)) / 4))) * (lr - 0.1) + 0.1;
      assert.ok(Math.abs(lr - got[e]!) < 1e-12, `recursive epoch ${e}: ${lr} vs ${got[e]}`);
    }
    assert.ok(Math.abs(got[8]! - 1) < 1e-12, "back at the base lr after 2 T_max");
  });
  test("CosineAnnealingWarmRestarts(T_0=2, T_mult=2): restarts at epochs 2 and 6", () => {
    const h = (t: number, T: number) => (1 + Math.cos((Math.PI * t) / T)) / 2;
    closeAll(lrs(new CosineAnnealingWarmRestarts(sgd(), { t0: 2, tMult: 2 }), 8), [1, 0.5, 1, h(1, 4), 0.5, h(3, 4), 1, h(1, 8)]);
    closeAll(lrs(new CosineAnnealingWarmRestarts(sgd(), { t0: 3 }), 5), [1, h(1, 3), h(2, 3), 1, h(1, 3)]);
  });
});

describe("SequentialLR", () => {
  test("torch's example: ConstantLR(0.1, 20) then ExponentialLR(0.9) at milestone 20, from 0.05", () => {
    const opt = sgd(0.05);
    const s = new SequentialLR(opt, [new ConstantLR(opt, { factor: 0.1, totalIters: 20 }), new ExponentialLR(opt, 0.9)], [20]);
    const got = lrs(s, 23);
    closeAll(got, [...Array<number>(20).fill(0.005), 0.05, 0.045, 0.0405]);
  });
  test("warmup then cosine: each scheduler counts its epochs from its milestone; a milestone at 0 starts with the second", () => {
    const opt = sgd(1);
    const s = new SequentialLR(opt, [new LinearLR(opt, { startFactor: 0.25, totalIters: 3 }), new CosineAnnealingLR(opt, { tMax: 2 })], [3]);
    closeAll(lrs(s, 6), [0.25, 0.5, 0.75, 1, 0.5, 0]);
    const opt2 = sgd(1);
    closeAll(lrs(new SequentialLR(opt2, [new ConstantLR(opt2, { factor: 0.5 }), new ExponentialLR(opt2, 0.5)], [0]), 3), [1, 0.5, 0.25]);
    const opt3 = sgd(1);
    assert.throws(() => new SequentialLR(opt3, [new ConstantLR(opt3), new ConstantLR(opt3)], []), (e: unknown) => e instanceof LrSchedulerError && /expects 1 milestones for 2 schedulers, got 0/.test(e.message));
    assert.throws(() => new SequentialLR(opt3, [new ConstantLR(opt3), new ConstantLR(sgd())], [2]), /scheduler 1 belongs to another optimizer/);
  });
});

describe("OneCycleLR", () => {
  test("two phases, cos: up from max_lr/25 to max_lr at step pct_start*T - 1, down to initial/final_div_factor at T - 1; beta1 the other way", () => {
    const opt = new Adam([k.tensor([0], { requiresGrad: true })], { lr: 123 });
    const s = new OneCycleLR(opt, { maxLr: 1, totalSteps: 10 });
    assert.equal(s.baseLr, 0.04, "the optimizer's own lr is replaced by max_lr / div_factor");
    const got = lrs(s, 10);
    // phase 1 ends at 0.3 * 10 - 1 = 2; phase 2 runs from 2 to 9
    const cos = (from: number, to: number, pct: number) => to + ((from - to) / 2) * (Math.cos(Math.PI * pct) + 1);
    closeAll(got, [0.04, 0.52, 1, ...[1, 2, 3, 4, 5, 6, 7].map((i) => cos(1, 4e-6, i / 7))], 1e-9);
    assert.equal(got.indexOf(Math.max(...got)), 2, "peak at step 2");
    assert.ok(Math.abs(got[9]! - 0.04 / 1e4) < 1e-15, "final lr = initial / final_div_factor");
    assert.ok(Math.abs(opt.beta1 - 0.95) < 1e-12, "beta1 back at max_momentum at the end");
    assert.ok(Math.abs(s.momentumAt(2) - 0.85) < 1e-12 && s.momentumAt(0) === 0.95);
    assert.throws(() => s.lrAt(11), /tried to step 11 times; the cycle has 10 steps/);
  });
  test("linear anneal, three phases, SGD momentum; Adagrad has no momentum to cycle", () => {
    const lin = new OneCycleLR(sgd(), { maxLr: 0.5, totalSteps: 5, pctStart: 0.4, annealStrategy: "linear", divFactor: 10, finalDivFactor: 5 });
    closeAll(lrs(lin, 5), [0.05, 0.5, 0.5 - 0.49 / 3, 0.5 - (2 * 0.49) / 3, 0.01], 1e-9); // phase 1 ends at 1
    const opt = new SGD([k.tensor([0], { requiresGrad: true })], { lr: 1, momentum: 0.9 });
    const three = new OneCycleLR(opt, { maxLr: 1, totalSteps: 10, threePhase: true, annealStrategy: "linear" });
    // phases end at 2, 2 * 0.3 * 10 - 2 = 4 and 9: up to 1, back to 0.04, down to 4e-6
    closeAll(lrs(three, 10), [0.04, 0.52, 1, 0.52, 0.04, ...[1, 2, 3, 4, 5].map((i) => 0.04 + ((4e-6 - 0.04) * i) / 5)], 1e-9);
    assert.ok(Math.abs(opt.momentum - 0.95) < 1e-12);
    assert.throws(() => new OneCycleLR(new Adagrad([k.tensor([0], { requiresGrad: true })]), { maxLr: 1, totalSteps: 10 }), /no momentum or beta1 to cycle/);
    assert.throws(() => new OneCycleLR(sgd(), { maxLr: 1 }), /needs totalSteps, or epochs and stepsPerEpoch/);
    assert.equal(new OneCycleLR(sgd(), { maxLr: 1, epochs: 3, stepsPerEpoch: 4, cycleMomentum: false }).totalSteps, 12);
  });
});

describe("state and errors", () => {
  test("stateDict -> a new scheduler -> loadStateDict continues the sequence", () => {
    const make = () => {
      const opt = sgd(1);
      return new SequentialLR(opt, [new LinearLR(opt, { startFactor: 0.5, totalIters: 2 }), new StepLR(opt, { stepSize: 2, gamma: 0.5 })], [2]);
    };
    const whole = lrs(make(), 8);
    const a = make();
    for (let i = 0; i < 3; i++) a.step();
    const saved = JSON.parse(JSON.stringify(a.stateDict())) as ReturnType<LRScheduler["stateDict"]>;
    const b = make();
    b.loadStateDict(saved);
    assert.equal(b.getLastLr(), whole[3]);
    const rest = [];
    for (let i = 4; i < 8; i++) {
      b.step();
      rest.push(b.getLastLr());
    }
    assert.deepEqual(rest, whole.slice(4));
    assert.throws(() => new StepLR(sgd(), { stepSize: 1 }).loadStateDict(saved), /\[StepLR\] cannot load a SequentialLR state/);
    // the optimizer's state keeps the base lr (torch's initial_lr): a scheduler built after loading it starts from there
    const opt = sgd(1);
    const exp = new ExponentialLR(opt, 0.5);
    exp.step();
    const fresh = sgd(1);
    fresh.loadStateDict(opt.stateDict());
    assert.equal(fresh.lr, 0.5);
    assert.equal(new ExponentialLR(fresh, 0.5).baseLr, 1);
  });
  test("torch's argument checks", () => {
    assert.throws(() => new LinearLR(sgd(), { startFactor: 0 }), (e: unknown) => e instanceof LrSchedulerError && /\[LinearLR\] startFactor must be in \(0, 1\], got 0/.test(e.message));
    assert.throws(() => new LinearLR(sgd(), { endFactor: 1.5 }), /endFactor must be in \[0, 1\], got 1.5/);
    assert.throws(() => new ConstantLR(sgd(), { factor: 2 }), /factor must be in \[0, 1\], got 2/);
    assert.throws(() => new StepLR(sgd(), { stepSize: 0 }), /stepSize must be a positive integer, got 0/);
    assert.throws(() => new OneCycleLR(sgd(), { maxLr: 1, totalSteps: 10, pctStart: 1.5 }), /pctStart must be in \[0, 1\], got 1.5/);
    assert.throws(() => new CosineAnnealingWarmRestarts(sgd(), { t0: 2, tMult: 0 }), /tMult must be an integer >= 1, got 0/);
  });
});

test("the trainer reads a scheduler by step index (lrAt) and applies OneCycleLR's momentum", async () => {
  const p = k.tensor([1, -1], { requiresGrad: true });
  const model: TrainableModel = { parameters: () => [p], loss: () => p.mul(p).sum() };
  const data = { next: () => ({ inputs: new Int32Array(1), targets: new Int32Array(1) }) };
  const opt = new SGD([p], { lr: 1, momentum: 0.9 });
  const step = new StepLR(opt, { stepSize: 2, gamma: 0.1 });
  const { history } = await train({ model, optimizer: opt, schedule: step, dataLoader: data, steps: 5 });
  closeAll(history.map((m) => m.lr), [1, 1, 0.1, 0.1, 0.01]);
  const adam = new Adam([p]);
  const cycle = new OneCycleLR(adam, { maxLr: 0.1, totalSteps: 4, pctStart: 0.5 });
  const betas: number[] = [];
  await train({ model, optimizer: adam, schedule: cycle, dataLoader: data, steps: 4, onStep: () => void betas.push(adam.beta1) });
  // phases end at steps 1 and 3: beta1 falls to 0.85 at the peak, then rises halfway (cos at pct 0.5) and back to 0.95
  closeAll(betas, [0.95, 0.85, 0.9, 0.95], 1e-9);
});
