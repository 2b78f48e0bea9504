// Optimizers, lr schedule and gradient clipping against hand-computed values.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import * as k from "../../src/tensor/index.js";
import { AdamW, SGD } from "../../src/train/optim.js";
import { LrSchedule } from "../../src/train/lr-schedule.js";
import { clipGradNorm } from "../../src/train/grad-clip.js";
import { Embedding, Linear, RMSNorm, StateDictError } from "../../src/nn/index.js";

const close = (a: number, b: number, tol = 1e-6, msg = "") => assert.ok(Math.abs(a - b) <= tol * Math.max(1, Math.abs(b)), `${msg} ${a} vs ${b}`);

function param(values: number[], dtype: k.DType = "float32"): k.Tensor {
  return k.tensor(values, { dtype, requiresGrad: true });
}
function setGrad(p: k.Tensor, values: number[]): void {
  p.grad = k.tensor(values, { dtype: p.dtype });
}

describe("AdamW", () => {
  test("two steps match the torch.optim.AdamW update written out by hand", () => {
    const p = param([1, -2]);
    const opt = new AdamW([p], { lr: 0.1, betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0.01 });
    setGrad(p, [0.5, 0]);
    opt.step();
    // step 1: p *= 1 - lr*wd; m = 0.1 g; v = 0.001 g^2; m_hat / sqrt(v_hat) = sign(g): p -= lr
    close(p.toList()[0]!, 1 * 0.999 - 0.1 * (0.05 / 0.1) / (Math.sqrt(0.00025 / 0.001) + 1e-8));
    close(p.toList()[1]!, -2 * 0.999); // zero grad: only the decay
    setGrad(p, [-1, 0]);
    opt.step();
    const m = 0.9 * 0.05 + 0.1 * -1;
    const v = 0.999 * 0.00025 + 0.001 * 1;
    const expected = 0.899 * 0.999 - (0.1 / (1 - 0.81)) * (m / (Math.sqrt(v) / Math.sqrt(1 - 0.999 ** 2) + 1e-8));
    close(p.toList()[0]!, expected, 1e-6, "step 2");
    assert.equal(opt.stateDict().states[0]!.step, 2);
  });

  test("params without a grad are skipped; zeroGrad drops grads", () => {
    const a = param([1]);
    const b = param([2]);
    const opt = new AdamW([a, b], { lr: 0.1, weightDecay: 0 });
    setGrad(a, [1]);
    opt.step();
    assert.equal(b.toList()[0], 2);
    assert.equal(opt.stateDict().states[1], null);
    opt.zeroGrad();
    assert.equal(a.grad, null);
  });

  test("stateDict / loadStateDict resume exactly", () => {
    const grads = [[0.3, -0.1], [0.2, 0.4], [-0.5, 0.1]];
    const ref = param([1, 2]);
    const refOpt = new AdamW([ref], { lr: 0.05 });
    for (const g of grads) {
      setGrad(ref, g);
      refOpt.step();
    }
    const p = param([1, 2]);
    const opt = new AdamW([p], { lr: 0.05 });
    setGrad(p, grads[0]!);
    opt.step();
    const saved = opt.stateDict();
    const savedParam = p.toList();
    const q = param(savedParam);
    const opt2 = new AdamW([q], { lr: 0.05 });
    opt2.loadStateDict(saved);
    for (const g of grads.slice(1)) {
      setGrad(q, g);
      opt2.step();
    }
    assert.deepEqual(q.toList(), ref.toList());
  });

  test("bfloat16 params keep float32 master weights so small updates accumulate", () => {
    const p = param([1], "bfloat16");
    const opt = new SGD([p], { lr: 1e-3 });
    for (let i = 0; i < 10; i++) {
      setGrad(p, [1]);
      opt.step();
    }
    // without a master copy every 1e-3 step rounds back to 1.0 (bf16 spacing near 1 is 2^-7)
    close(opt.stateDict().states[0]!.buffers.master![0]!, 0.99, 1e-6);
    assert.ok(Math.abs(p.toList()[0]! - 0.99) < 0.004 && p.toList()[0] !== 1);
    assert.equal(p.dtype, "bfloat16");
  });
});

describe("SGD", () => {
  test("momentum, nesterov and weight decay", () => {
    const p = param([1]);
    const opt = new SGD([p], { lr: 0.1, momentum: 0.9 });
    setGrad(p, [0.5]);
    opt.step(); // buf = 0.5
    close(p.toList()[0]!, 0.95);
    setGrad(p, [0.5]);
    opt.step(); // buf = 0.9 * 0.5 + 0.5
    close(p.toList()[0]!, 0.95 - 0.1 * 0.95);

    const n = param([1]);
    const nOpt = new SGD([n], { lr: 0.1, momentum: 0.9, nesterov: true });
    setGrad(n, [0.5]);
    nOpt.step(); // d = g + mu * buf = 0.5 + 0.45
    close(n.toList()[0]!, 1 - 0.1 * 0.95);

    const w = param([2]);
    const wOpt = new SGD([w], { lr: 0.1, weightDecay: 0.5 });
    setGrad(w, [1]);
    wOpt.step(); // d = 1 + 0.5 * 2
    close(w.toList()[0]!, 2 - 0.1 * 2);
  });
});

describe("LrSchedule (TorchTitan linear_warmup_stable_decay)", () => {
  test("linear warmup then linear decay to lrMin", () => {
    const s = new LrSchedule({ lr: 1, warmupSteps: 4, totalSteps: 14, decayType: "linear", lrMin: 0 });
    close(s.lrAt(0), 1 / 5);
    close(s.lrAt(3), 4 / 5);
    close(s.lrAt(4), 0.9); // progress (4 + 1 - 4) / 10
    close(s.lrAt(8), 0.5);
    close(s.lrAt(13), 0);
  });
  test("cosine decay with a floor, and warmup-stable-decay via decayRatio", () => {
    const s = new LrSchedule({ lr: 2, warmupSteps: 0, totalSteps: 10, decayType: "cosine", lrMin: 0.2 });
    close(s.lrAt(4), 0.2 + 1.8 * 0.5); // progress 0.5
    close(s.lrAt(9), 0.2);
    close(s.lrAt(0), 0.2 + 1.8 * 0.5 * (1 + Math.cos(Math.PI * 0.1)));
    const w = new LrSchedule({ lr: 1, warmupSteps: 4, totalSteps: 20, decayType: "linear", decayRatio: 0.5 });
    assert.equal(w.stableSteps, 6);
    close(w.lrAt(5), 1);
    close(w.lrAt(9), 1);
    close(w.lrAt(10), 0.9);
    close(w.lrAt(19), 0);
    // TorchTitan clamps warmup_steps to the run's steps: warmup 20 over 2 steps warms up over those 2
    const short = new LrSchedule({ lr: 1, warmupSteps: 20, totalSteps: 2 });
    close(short.lrAt(0), 1 / 3);
    close(short.lrAt(1), 2 / 3);
    const sq = new LrSchedule({ lr: 1, warmupSteps: 0, totalSteps: 4, decayType: "sqrt" });
    close(sq.lrAt(0), 1 - Math.sqrt(0.25));
  });
});

describe("clipGradNorm", () => {
  test("returns the global L2 norm and scales grads to maxNorm", () => {
    const a = param([0, 0]);
    const b = param([0]);
    const c = param([5]); // no grad: ignored
    setGrad(a, [3, 4]);
    setGrad(b, [12]);
    const norm = clipGradNorm([a, b, c], 6.5);
    close(norm, 13);
    const coef = 6.5 / (13 + 1e-6);
    close(a.grad!.toList()[0]!, 3 * coef);
    close(a.grad!.toList()[1]!, 4 * coef);
    close(b.grad!.toList()[0]!, 12 * coef);
    // below the threshold nothing changes; the infinity norm is the max |g|
    close(clipGradNorm([a, b], 100), 6.5, 1e-5);
    close(b.grad!.toList()[0]!, 12 * coef);
    close(clipGradNorm([a, b], 100, Infinity), 12 * coef);
  });
});

describe("nn modules trained as a PyTorch user builds them", () => {
  const stats = (xs: number[]) => {
    const m = xs.reduce((a, b) => a + b, 0) / xs.length;
    return { m, s: Math.sqrt(xs.reduce((a, b) => a + (b - m) ** 2, 0) / (xs.length - 1)) };
  };

  test("new Linear / Embedding / RMSNorm: torch's init, parameters require grad, training mode", () => {
    k.manualSeed(0);
    const l = new Linear(64, 32, true);
    // kaiming_uniform_(a=sqrt(5)): U(-1/sqrt(in), 1/sqrt(in)) for the weight and the bias; std bound/sqrt(3)
    const bound = 1 / 8;
    const w = l.weight.toList();
    assert.ok(w.every((v) => v >= -bound && v < bound), "weight within the bound");
    const ws = stats(w);
    assert.ok(Math.abs(ws.m) < 5 * (bound / Math.sqrt(3)) / Math.sqrt(w.length), `weight mean ${ws.m}`);
    assert.ok(Math.abs(ws.s - bound / Math.sqrt(3)) < 0.05 * (bound / Math.sqrt(3)), `weight std ${ws.s}`);
    const b = l.bias!.toList();
    assert.ok(b.every((v) => v >= -bound && v < bound) && new Set(b).size > 16, "bias drawn within the bound");
    assert.ok(l.weight.requiresGrad && l.bias!.requiresGrad);
    assert.equal(l.training, true);
    assert.equal(l.eval().training, false);
    assert.equal(l.train().training, true);
    const e = new Embedding(100, 20);
    const es = stats(e.weight.toList()); // N(0, 1): s.e. of the mean 0.022, of the std 0.016
    assert.ok(Math.abs(es.m) < 0.12 && Math.abs(es.s - 1) < 0.08, `embedding mean ${es.m} std ${es.s}`);
    assert.ok(e.weight.requiresGrad && e.training);
    const n = new RMSNorm(4, 1e-6);
    assert.deepEqual(n.weight.toList(), [1, 1, 1, 1]);
    assert.ok(n.weight.requiresGrad);
    // manual_seed makes the init reproducible; a bf16 layer's bias is bf16 too (torch's dtype=)
    k.manualSeed(5);
    const a1 = new Linear(3, 2, true).weight.toList();
    k.manualSeed(5);
    assert.deepEqual(new Linear(3, 2, true).weight.toList(), a1);
    const bf = new Linear(3, 2, true, { dtype: "bfloat16" });
    assert.equal(bf.weight.dtype, "bfloat16");
    assert.equal(bf.bias!.dtype, "bfloat16");
    // unallocated (torch's meta device): shape and dtype, nothing drawn
    const meta = new Linear(3, 2, true, { unallocatedParameters: true });
    assert.ok(meta.parameters().every((p) => p.isDisposed));
  });

  test("a fresh Linear trains with SGD: backward reaches its parameters", () => {
    const l = new Linear(3, 2, true);
    const opt = new SGD(l.parameters(), { lr: 0.5 });
    const before = l.weight.toList();
    const bias = l.bias!.toList();
    l.forward(k.tensor([[1, 2, 3]])).sum().backward(); // d/dW = x for every row, d/db = 1
    assert.deepEqual(l.weight.grad!.toList(), [1, 2, 3, 1, 2, 3]);
    assert.deepEqual(l.bias!.grad!.toList(), [1, 1]);
    opt.step();
    l.weight.toList().forEach((v, i) => close(v, before[i]! - 0.5 * [1, 2, 3][i % 3]!, 1e-6));
    l.bias!.toList().forEach((v, i) => close(v, bias[i]! - 0.5, 1e-6));
  });

  test("loadStateDict copies into the parameters: an optimizer built before the load keeps training them", () => {
    const model = new Linear(2, 1, true);
    const weight = model.weight;
    const opt = new SGD(model.parameters(), { lr: 0.1 });
    const ckpt = new Linear(2, 1, true);
    k.noGrad(() => {
      ckpt.weight.fill_(1);
      ckpt.bias!.fill_(0.5);
    });
    assert.deepEqual(model.loadStateDict(ckpt.stateDict()), { missingKeys: [], unexpectedKeys: [] });
    assert.equal(model.weight, weight, "the same parameter tensor");
    assert.ok(!weight.isDisposed && weight.requiresGrad && weight.gradFn === null, "still a leaf that requires grad");
    assert.deepEqual(weight.toList(), [1, 1]);
    k.noGrad(() => ckpt.weight.fill_(7));
    assert.deepEqual(weight.toList(), [1, 1], "no storage shared with the checkpoint");
    model.forward(k.ones([1, 2])).sum().backward();
    opt.step();
    model.weight.toList().forEach((v) => close(v, 0.9, 1e-6));
    close(model.bias!.toList()[0]!, 0.4, 1e-6);
    // dtype converted to the parameter's; loading a module's own state is a no-op
    const bf = new Map([["weight", k.tensor([[0.25, -3]], { dtype: "bfloat16" })], ["bias", k.tensor([2], { dtype: "bfloat16" })]]);
    model.loadStateDict(bf);
    assert.equal(model.weight.dtype, "float32");
    assert.deepEqual(model.weight.toList(), [0.25, -3]);
    model.loadStateDict(model.stateDict());
    assert.deepEqual(model.weight.toList(), [0.25, -3]);
  });

  test("loadStateDict: shape mismatch and missing / unexpected names are typed errors; strict=false reports them", () => {
    const model = new Linear(2, 1, true);
    const before = model.weight.toList();
    const wrong = new Map([["weight", k.zeros([1, 2])], ["bias", k.zeros([2])]]);
    assert.throws(() => model.loadStateDict(wrong), (e: unknown) => e instanceof StateDictError && /"bias".*\[2\].*\[1\]/.test(e.message));
    assert.deepEqual(model.weight.toList(), before, "nothing written before the error");
    assert.throws(() => model.loadStateDict(new Map([["weight", k.zeros([1, 2])]])), (e: unknown) => e instanceof StateDictError && /missing parameters: bias/.test(e.message));
    const extra = new Map([["weight", k.zeros([1, 2])], ["bias", k.zeros([1])], ["scale", k.zeros([1])]]);
    assert.throws(() => model.loadStateDict(extra), (e: unknown) => e instanceof StateDictError && /unexpected parameters: scale/.test(e.message));
    assert.deepEqual(model.loadStateDict(new Map([["weight", k.ones([1, 2])], ["other", k.ones([1])]]), false), { missingKeys: ["bias"], unexpectedKeys: ["other"] });
    assert.deepEqual(model.weight.toList(), [1, 1]);
  });

  test("an unallocated module loads with assign (torch's assign=True): the state's tensors, the module's requiresGrad", () => {
    const meta = new Linear(2, 1, true, { unallocatedParameters: true });
    const state = new Map([["weight", k.tensor([[1, 2]], { dtype: "bfloat16" })], ["bias", k.tensor([3])]]);
    assert.throws(() => meta.loadStateDict(state), (e: unknown) => e instanceof StateDictError && /unallocated.*assign/.test(e.message));
    meta.loadStateDict(state, true, true);
    assert.equal(meta.weight.dtype, "bfloat16");
    assert.ok(meta.weight.requiresGrad && !state.get("weight")!.requiresGrad);
    assert.equal(meta.weight.storage, state.get("weight")!.storage, "assigned, not copied");
    assert.deepEqual(meta.forward(k.ones([1, 2])).toList(), [6]);
  });
});
