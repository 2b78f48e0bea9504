// torch.optim's Adam, AdamW (amsgrad), RMSprop, Adagrad, Adamax, NAdam and RAdam against float64 references written
// here from torch's documented algorithms (the algorithm boxes of the torch.optim pages), not from the code under
// test: several steps on a small vector with given gradients; exact resume through stateDict(); torch's checks.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import * as k from "../../src/tensor/index.js";
import { Adagrad, Adam, Adamax, AdamW, NAdam, OptimizerError, RAdam, RMSprop, SGD, type Optimizer } from "../../src/train/optim.js";
import { loadCheckpoint, saveCheckpoint } from "../../src/train/checkpoint.js";

const X0 = [1, -2, 0.5, 3, -0.25];
// gradients of mixed sign and size, one step each (given, not computed from the params)
const GRADS = Array.from({ length: 10 }, (_, t) => X0.map((_, i) => Math.sin(1.7 * t + 2.3 * i) * (1 + 0.5 * i) + 0.1 * (t % 3)));

const zeros = (): number[] => X0.map(() => 0);
const relClose = (a: number, b: number, tol: number, msg: string) => assert.ok(Math.abs(a - b) <= tol * Math.max(1, Math.abs(b)), `${msg}: ${a} vs ${b}`);

/** A reference: one step of the documented algorithm on float64 params p (in place) with gradient g at step t (1-based). */
type RefStep = (p: number[], g: number[], t: number) => void;

function runRef(step: RefStep, grads = GRADS): number[][] {
  const p = [...X0];
  return grads.map((g, i) => {
    step(p, g, i + 1);
    return [...p];
  });
}

function param(values: number[]): k.Tensor {
  return k.tensor(values, { requiresGrad: true });
}

function runKiln(make: (p: k.Tensor) => Optimizer, grads = GRADS): number[][] {
  const p = param(X0);
  const opt = make(p);
  return grads.map((g) => {
    p.grad = k.tensor(g);
    opt.step();
    opt.zeroGrad();
    return p.toList();
  });
}

// ---------------------------------------------------------------- the references, from torch's algorithm boxes

function adamRef(o: { lr: number; b1: number; b2: number; eps: number; wd: number; amsgrad: boolean; decoupled: boolean }): RefStep {
  const m = zeros(), v = zeros(), vmax = zeros();
  return (p, g, t) => {
    for (let i = 0; i < p.length; i++) {
      if (o.decoupled) p[i]! -= o.lr * o.wd * p[i]!; // AdamW: theta <- theta - gamma lambda theta
      const gi = o.decoupled ? g[i]! : g[i]! + o.wd * p[i]!;
      m[i] = o.b1 * m[i]! + (1 - o.b1) * gi;
      v[i] = o.b2 * v[i]! + (1 - o.b2) * gi * gi;
      const mHat = m[i]! / (1 - o.b1 ** t);
      vmax[i] = Math.max(vmax[i]!, v[i]!);
      const vHat = (o.amsgrad ? vmax[i]! : v[i]!) / (1 - o.b2 ** t);
      p[i]! -= (o.lr * mHat) / (Math.sqrt(vHat) + o.eps);
    }
  };
}

function rmspropRef(o: { lr: number; alpha: number; eps: number; wd: number; momentum: number; centered: boolean }): RefStep {
  const v = zeros(), gAve = zeros(), b = zeros();
  return (p, g) => {
    for (let i = 0; i < p.length; i++) {
      const gi = g[i]! + o.wd * p[i]!;
      v[i] = o.alpha * v[i]! + (1 - o.alpha) * gi * gi;
      let vTilde = v[i]!;
      if (o.centered) {
        gAve[i] = gAve[i]! * o.alpha + (1 - o.alpha) * gi;
        vTilde -= gAve[i]! ** 2;
      }
      if (o.momentum > 0) {
        b[i] = o.momentum * b[i]! + gi / (Math.sqrt(vTilde) + o.eps);
        p[i]! -= o.lr * b[i]!;
      } else p[i]! -= (o.lr * gi) / (Math.sqrt(vTilde) + o.eps);
    }
  };
}

function adagradRef(o: { lr: number; lrDecay: number; wd: number; init: number; eps: number }): RefStep {
  const sum = X0.map(() => o.init);
  return (p, g, t) => {
    const clr = o.lr / (1 + (t - 1) * o.lrDecay);
    for (let i = 0; i < p.length; i++) {
      const gi = g[i]! + o.wd * p[i]!;
      sum[i]! += gi * gi;
      p[i]! -= (clr * gi) / (Math.sqrt(sum[i]!) + o.eps);
    }
  };
}

function adamaxRef(o: { lr: number; b1: number; b2: number; eps: number; wd: number }): RefStep {
  const m = zeros(), u = zeros();
  return (p, g, t) => {
    for (let i = 0; i < p.length; i++) {
      const gi = g[i]! + o.wd * p[i]!;
      m[i] = o.b1 * m[i]! + (1 - o.b1) * gi;
      u[i] = Math.max(o.b2 * u[i]!, Math.abs(gi) + o.eps);
      p[i]! -= (o.lr * m[i]!) / ((1 - o.b1 ** t) * u[i]!);
    }
  };
}

function nadamRef(o: { lr: number; b1: number; b2: number; eps: number; wd: number; psi: number; decoupled: boolean }): RefStep {
  const m = zeros(), v = zeros();
  const mu = (t: number) => o.b1 * (1 - 0.5 * 0.96 ** (t * o.psi));
  const prod = (t: number) => Array.from({ length: t }, (_, i) => mu(i + 1)).reduce((a, b) => a * b, 1);
  return (p, g, t) => {
    for (let i = 0; i < p.length; i++) {
      if (o.decoupled) p[i]! -= o.lr * o.wd * p[i]!;
      const gi = o.decoupled ? g[i]! : g[i]! + o.wd * p[i]!;
      m[i] = o.b1 * m[i]! + (1 - o.b1) * gi;
      v[i] = o.b2 * v[i]! + (1 - o.b2) * gi * gi;
      const mHat = (mu(t + 1) * m[i]!) / (1 - prod(t + 1)) + ((1 - mu(t)) * gi) / (1 - prod(t));
      const vHat = v[i]! / (1 - o.b2 ** t);
      p[i]! -= (o.lr * mHat) / (Math.sqrt(vHat) + o.eps);
    }
  };
}

function radamRef(o: { lr: number; b1: number; b2: number; eps: number; wd: number; decoupled: boolean }): RefStep {
  const m = zeros(), v = zeros();
  const rhoInf = 2 / (1 - o.b2) - 1;
  return (p, g, t) => {
    for (let i = 0; i < p.length; i++) {
      if (o.decoupled) p[i]! -= o.lr * o.wd * p[i]!;
      const gi = o.decoupled ? g[i]! : g[i]! + o.wd * p[i]!;
      m[i] = o.b1 * m[i]! + (1 - o.b1) * gi;
      v[i] = o.b2 * v[i]! + (1 - o.b2) * gi * gi;
      const mHat = m[i]! / (1 - o.b1 ** t);
      const rhoT = rhoInf - (2 * t * o.b2 ** t) / (1 - o.b2 ** t);
      if (rhoT > 5) {
        const l = Math.sqrt(1 - o.b2 ** t) / (Math.sqrt(v[i]!) + o.eps);
        const r = Math.sqrt(((rhoT - 4) * (rhoT - 2) * rhoInf) / ((rhoInf - 4) * (rhoInf - 2) * rhoT));
        p[i]! -= o.lr * mHat * r * l;
      } else p[i]! -= o.lr * mHat;
    }
  };
}

// ---------------------------------------------------------------- the cases

interface Case {
  name: string;
  make: (p: k.Tensor) => Optimizer;
  ref: () => RefStep;
}

const adam = { lr: 0.05, b1: 0.9, b2: 0.999, eps: 1e-8 };
const CASES: Case[] = [
  { name: "Adam (defaults but lr)", make: (p) => new Adam([p], { lr: 0.05 }), ref: () => adamRef({ ...adam, wd: 0, amsgrad: false, decoupled: false }) },
  { name: "Adam L2 weight decay, amsgrad", make: (p) => new Adam([p], { lr: 0.05, betas: [0.8, 0.99], weightDecay: 0.1, amsgrad: true }), ref: () => adamRef({ ...adam, b1: 0.8, b2: 0.99, wd: 0.1, amsgrad: true, decoupled: false }) },
  { name: "AdamW amsgrad", make: (p) => new AdamW([p], { lr: 0.05, weightDecay: 0.1, amsgrad: true }), ref: () => adamRef({ ...adam, wd: 0.1, amsgrad: true, decoupled: true }) },
  { name: "RMSprop (defaults)", make: (p) => new RMSprop([p]), ref: () => rmspropRef({ lr: 1e-2, alpha: 0.99, eps: 1e-8, wd: 0, momentum: 0, centered: false }) },
  { name: "RMSprop centered, momentum, weight decay", make: (p) => new RMSprop([p], { lr: 0.02, alpha: 0.9, momentum: 0.8, centered: true, weightDecay: 0.05 }), ref: () => rmspropRef({ lr: 0.02, alpha: 0.9, eps: 1e-8, wd: 0.05, momentum: 0.8, centered: true }) },
  { name: "Adagrad (defaults)", make: (p) => new Adagrad([p]), ref: () => adagradRef({ lr: 1e-2, lrDecay: 0, wd: 0, init: 0, eps: 1e-10 }) },
  { name: "Adagrad lr_decay, weight decay, initial accumulator", make: (p) => new Adagrad([p], { lr: 0.1, lrDecay: 0.05, weightDecay: 0.1, initialAccumulatorValue: 0.5, eps: 1e-6 }), ref: () => adagradRef({ lr: 0.1, lrDecay: 0.05, wd: 0.1, init: 0.5, eps: 1e-6 }) },
  { name: "Adamax", make: (p) => new Adamax([p], { weightDecay: 0.1 }), ref: () => adamaxRef({ lr: 2e-3, b1: 0.9, b2: 0.999, eps: 1e-8, wd: 0.1 }) },
  { name: "Adamax, an eps that counts", make: (p) => new Adamax([p], { lr: 0.05, betas: [0.8, 0.9], eps: 0.5 }), ref: () => adamaxRef({ lr: 0.05, b1: 0.8, b2: 0.9, eps: 0.5, wd: 0 }) },
  { name: "RMSprop, an eps that counts", make: (p) => new RMSprop([p], { eps: 0.3 }), ref: () => rmspropRef({ lr: 1e-2, alpha: 0.99, eps: 0.3, wd: 0, momentum: 0, centered: false }) },
  { name: "NAdam (defaults)", make: (p) => new NAdam([p]), ref: () => nadamRef({ lr: 2e-3, b1: 0.9, b2: 0.999, eps: 1e-8, wd: 0, psi: 4e-3, decoupled: false }) },
  { name: "NAdam L2 weight decay, momentum_decay", make: (p) => new NAdam([p], { lr: 0.05, weightDecay: 0.1, momentumDecay: 0.5 }), ref: () => nadamRef({ ...adam, wd: 0.1, psi: 0.5, decoupled: false }) },
  { name: "NAdam decoupled weight decay", make: (p) => new NAdam([p], { lr: 0.05, weightDecay: 0.1, decoupledWeightDecay: true }), ref: () => nadamRef({ ...adam, wd: 0.1, psi: 4e-3, decoupled: true }) },
  { name: "RAdam (defaults; rectified from step 6)", make: (p) => new RAdam([p]), ref: () => radamRef({ lr: 1e-3, b1: 0.9, b2: 0.999, eps: 1e-8, wd: 0, decoupled: false }) },
  { name: "RAdam L2 weight decay", make: (p) => new RAdam([p], { lr: 0.05, weightDecay: 0.1 }), ref: () => radamRef({ ...adam, wd: 0.1, decoupled: false }) },
  { name: "RAdam decoupled weight decay", make: (p) => new RAdam([p], { lr: 0.05, weightDecay: 0.1, decoupledWeightDecay: true }), ref: () => radamRef({ ...adam, wd: 0.1, decoupled: true }) },
];

describe("each optimizer follows torch's documented algorithm (float64 reference, 10 steps)", () => {
  for (const c of CASES) {
    test(c.name, () => {
      const want = runRef(c.ref());
      const got = runKiln(c.make);
      want.forEach((row, t) => row.forEach((w, i) => relClose(got[t]![i]!, w, 1e-6, `${c.name} step ${t + 1} param ${i}`)));
    });
  }
});

describe("stateDict -> a new optimizer -> loadStateDict continues bit-for-bit", () => {
  for (const c of CASES) {
    test(c.name, () => {
      const whole = runKiln(c.make).at(-1)!;
      const p = param(X0);
      const opt = c.make(p);
      for (const g of GRADS.slice(0, 4)) {
        p.grad = k.tensor(g);
        opt.step();
      }
      const saved = opt.stateDict();
      const q = param(p.toList());
      const opt2 = c.make(q);
      opt2.loadStateDict(saved);
      for (const g of GRADS.slice(4)) {
        q.grad = k.tensor(g);
        opt2.step();
      }
      assert.deepEqual(q.toList(), whole);
    });
  }
  test("through a checkpoint directory (saveCheckpoint / loadCheckpoint), every optimizer resumes bit-for-bit", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-optimizers-"));
    try {
      for (const c of CASES) {
        const whole = runKiln(c.make).at(-1)!;
        const p = param(X0);
        const opt = c.make(p);
        for (const g of GRADS.slice(0, 4)) {
          p.grad = k.tensor(g);
          opt.step();
        }
        const saved = saveCheckpoint(dir, { step: 4, params: [["p", p]], optimizer: opt.stateDict() });
        const q = param(X0);
        const loaded = loadCheckpoint(saved, [["p", q]]);
        const opt2 = c.make(q);
        opt2.loadStateDict(loaded.optimizer);
        for (const g of GRADS.slice(4)) {
          q.grad = k.tensor(g);
          opt2.step();
        }
        assert.deepEqual(q.toList(), whole, c.name);
      }
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
  test("a save removes the folders of saves killed mid-write (their process gone), not a running one's", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-ckpt-tmp-"));
    try {
      const dead = spawnSync(process.execPath, ["-e", ""]).pid!; // exited and reaped
      const killed = path.join(dir, `step-00000002.tmp-${dead}`);
      const running = path.join(dir, `step-00000003.tmp-${process.ppid}`);
      for (const d of [killed, running]) fs.mkdirSync(d);
      fs.writeFileSync(path.join(killed, "model.safetensors"), "half");
      const p = param(X0);
      saveCheckpoint(dir, { step: 4, params: [["p", p]], optimizer: new SGD([p], { lr: 0.1 }).stateDict() });
      assert.deepEqual(fs.readdirSync(dir).sort(), ["step-00000003.tmp-" + process.ppid, "step-00000004"]);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
  test("bfloat16 params: the new optimizers keep float32 master weights too", () => {
    const p = k.tensor([1, -1], { dtype: "bfloat16", requiresGrad: true });
    const opt = new NAdam([p], { lr: 1e-3 });
    for (let i = 0; i < 5; i++) {
      p.grad = k.tensor([1, -1], { dtype: "bfloat16" });
      opt.step();
    }
    const master = opt.stateDict().states[0]!.buffers.master!;
    assert.ok(master[0]! < 0.999 && master[0]! > 0.98 && master[1]! > -0.999, `master ${master.join(", ")}`);
    assert.equal(p.dtype, "bfloat16");
  });
  test("a state of another algorithm or other buffers (amsgrad) is refused", () => {
    const p = param(X0);
    const adam = new Adam([p], { amsgrad: true });
    p.grad = k.tensor(GRADS[0]!);
    adam.step();
    assert.throws(() => new AdamW([p]).loadStateDict(adam.stateDict()), (e: unknown) => e instanceof OptimizerError && /\[adamw\] cannot load a state saved by adam/.test(e.message));
    assert.throws(() => new Adam([p]).loadStateDict(adam.stateDict()), /holds buffers exp_avg, exp_avg_sq, max_exp_avg_sq, this optimizer's hyper-parameters use exp_avg, exp_avg_sq/);
  });
});

describe("first steps by hand", () => {
  test("Adam: m^ = g, v^ = g^2, so the first step moves each param by lr (L2 decay folded into g)", () => {
    const p = param([1, -2]);
    const opt = new Adam([p], { lr: 0.1, weightDecay: 0.1 });
    p.grad = k.tensor([0.5, 0]);
    opt.step();
    const [a, b] = p.toList();
    relClose(a!, 1 - (0.1 * 0.6) / (0.6 + 1e-8), 1e-7, "g = 0.5 + 0.1 * 1 = 0.6");
    relClose(b!, -2 + (0.1 * 0.2) / (0.2 + 1e-8), 1e-7, "g = 0 + 0.1 * -2 = -0.2");
    // step 2: m = 0.9 * 0.06 + 0.1 g, v = 0.999 * 0.00036 + 0.001 g^2 for g = -1 + 0.1 p
    p.grad = k.tensor([-1, 0]);
    opt.step();
    const g = -1 + 0.1 * a!;
    const m = 0.9 * 0.06 + 0.1 * g;
    const v = 0.999 * 0.00036 + 0.001 * g * g;
    relClose(p.toList()[0]!, a! - (0.1 * (m / (1 - 0.81))) / (Math.sqrt(v / (1 - 0.999 ** 2)) + 1e-8), 1e-6, "step 2");
  });

  test("RMSprop: v = 0.01 g^2, so the first step is lr g / (|g| / 10): 10 lr; centered divides by sqrt(v - (0.01 g)^2)", () => {
    const p = param([1]);
    new RMSprop([p]).step(); // no grad: nothing moves
    p.grad = k.tensor([0.5]);
    new RMSprop([p], { lr: 0.01 }).step();
    relClose(p.toList()[0]!, 1 - (0.01 * 0.5) / (0.05 + 1e-8), 1e-7, "plain: 0.9"); // v = 0.0025
    const c = param([1]);
    c.grad = k.tensor([0.5]);
    new RMSprop([c], { lr: 0.01, centered: true }).step();
    relClose(c.toList()[0]!, 1 - (0.01 * 0.5) / (Math.sqrt(0.0025 - 0.005 ** 2) + 1e-8), 1e-7, "centered: 1 - 0.100504");
    assert.ok(Math.abs(c.toList()[0]! - (1 - 0.100504)) < 1e-6);
  });

  test("maximize ascends: the same trajectory as the negated gradients", () => {
    const up = runKiln((p) => new RMSprop([p], { momentum: 0.5, maximize: true }));
    const down = runKiln((p) => new RMSprop([p], { momentum: 0.5 }), GRADS.map((g) => g.map((x) => -x)));
    assert.deepEqual(up, down);
  });
});

test("bad hyper-parameters throw OptimizerError naming the value (torch's checks)", () => {
  const p = param([1]);
  const bad: [() => unknown, RegExp][] = [
    [() => new Adam([p], { lr: -0.1 }), /\[adam\] invalid lr: -0.1 \(must be >= 0\)/],
    [() => new Adam([p], { eps: -1e-8 }), /\[adam\] invalid eps: -1e-8/],
    [() => new AdamW([p], { betas: [1, 0.999] }), /\[adamw\] invalid beta1 \(betas\[0\]\): 1 \(must be in \[0, 1\)\)/],
    [() => new Adam([p], { betas: [0.9, -0.1] }), /invalid beta2 \(betas\[1\]\): -0.1/],
    [() => new Adam([p], { weightDecay: -1 }), /invalid weight_decay: -1/],
    [() => new RMSprop([p], { alpha: -0.5 }), /\[rmsprop\] invalid alpha: -0.5/],
    [() => new RMSprop([p], { momentum: -0.9 }), /\[rmsprop\] invalid momentum: -0.9/],
    [() => new Adagrad([p], { lrDecay: -0.1 }), /\[adagrad\] invalid lr_decay: -0.1/],
    [() => new Adagrad([p], { initialAccumulatorValue: -1 }), /\[adagrad\] invalid initial_accumulator_value: -1/],
    [() => new NAdam([p], { momentumDecay: -4e-3 }), /\[nadam\] invalid momentum_decay: -0.004/],
    [() => new RAdam([p], { betas: [0.9, 1.5] }), /\[radam\] invalid beta2 \(betas\[1\]\): 1.5/],
    [() => new Adamax([p], { lr: NaN }), /\[adamax\] invalid lr: NaN/],
    [() => new SGD([p], { momentum: -1 }), /\[sgd\] invalid momentum: -1/],
  ];
  for (const [fn, re] of bad) assert.throws(fn, (e: unknown) => e instanceof OptimizerError && re.test(e.message), String(re));
});
