// mseLoss / l1Loss / smoothL1Loss / huberLoss / nllLoss / binaryCrossEntropy(WithLogits) / klDiv: values against
// float64 JS formulas for every reduction, gradients against finite differences, errors, and no leaked buffers.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import * as k from "../../src/tensor/index.js";
import type { LossReduction, Tensor } from "../../src/tensor/index.js";
import { IndexOutOfRangeError, OpError } from "../../src/util/errors.js";
import { assertClose, assertNoLeaks, forEachBackend, randomValues } from "./suite.js";
import { gradcheck } from "./gradcheck-helper.js";

const reduce = (xs: number[], r: LossReduction | "batchmean", batch = 1): number[] => {
  const s = xs.reduce((a, b) => a + b, 0);
  return r === "none" ? xs : r === "sum" ? [s] : r === "mean" ? [s / xs.length] : [s / batch];
};
const REDUCTIONS = ["mean", "sum", "none"] as const;
const sigmoid = (x: number) => 1 / (1 + Math.exp(-x));
/** log(1 + exp(x)) in float64, stable. */
const softplus = (x: number) => Math.max(x, 0) + Math.log1p(Math.exp(-Math.abs(x)));

forEachBackend((dev) => {
  const rnd = (shape: number[], seed: number, lo = -1.5, hi = 1.5, opts: { requiresGrad?: boolean } = {}) =>
    k.tensor(randomValues(shape.reduce((a, b) => a * b, 1), seed, lo, hi), { shape, device: dev, ...opts });
  const i32 = (data: number[], shape?: number[]) => k.tensor(Int32Array.from(data), { device: dev, shape });
  const named = (op: string, text?: string) => (e: unknown) => e instanceof OpError && e.op === op && (text === undefined || e.message.includes(text));
  const tol = { rtol: 1e-5, atol: 1e-6 };

  describe("regression losses", () => {
    it("mse, l1, smooth l1 (beta), huber (delta) for every reduction, target broadcast", () => {
      const x = rnd([2, 3], 1);
      const y = rnd([3], 2);
      const [xv, yv] = [x.toList(), y.toList()];
      const d = xv.map((v, e) => v - yv[e % 3]!);
      const smooth = (beta: number) => d.map((v) => (beta === 0 || Math.abs(v) >= beta ? Math.abs(v) - beta / 2 : (0.5 * v * v) / beta));
      const huber = (delta: number) => d.map((v) => (Math.abs(v) < delta ? 0.5 * v * v : delta * (Math.abs(v) - delta / 2)));
      for (const reduction of REDUCTIONS) {
        assertClose(k.mseLoss(x, y, { reduction }), reduce(d.map((v) => v * v), reduction), { ...tol, msg: `mse ${reduction}` });
        assertClose(k.l1Loss(x, y, { reduction }), reduce(d.map(Math.abs), reduction), { ...tol, msg: `l1 ${reduction}` });
        for (const beta of [1, 0.5, 0])
          assertClose(k.smoothL1Loss(x, y, { beta, reduction }), reduce(smooth(beta), reduction), { ...tol, msg: `smooth l1 ${beta} ${reduction}` });
        assertClose(k.huberLoss(x, y, { delta: 0.7, reduction }), reduce(huber(0.7), reduction), { ...tol, msg: `huber ${reduction}` });
      }
      assert.equal(k.mseLoss(x, y, { reduction: "none" }).shape.join(), "2,3");
      assert.equal(k.mseLoss(k.tensor([1, 2], { device: dev }), k.tensor([1, 4], { device: dev })).item(), 2);
      assert.throws(() => k.mseLoss(x, y, { reduction: "avg" as LossReduction }), named("mse_loss", "reduction"));
      assert.throws(() => k.smoothL1Loss(x, y, { beta: -1 }), named("smooth_l1_loss"));
      assert.throws(() => k.huberLoss(x, y, { delta: 0 }), named("huber_loss"));
    });
    it("gradients (input and target)", () => {
      gradcheck("mse", [{ shape: [2, 3] }, { shape: [2, 3] }], (a, b) => k.mseLoss(a, b), 1, dev);
      gradcheck("l1", [{ shape: [2, 3], kind: "awayFromZero" }, { shape: [3] }], (a, b) => k.l1Loss(a.mul(3), b, { reduction: "sum" }), 2, dev);
      gradcheck("smoothL1", [{ shape: [2, 4] }, { shape: [2, 4] }], (a, b) => k.smoothL1Loss(a, b, { beta: 0.5, reduction: "none" }), 3, dev);
      gradcheck("huber", [{ shape: [2, 4] }, { shape: [2, 4] }], (a, b) => k.huberLoss(a.mul(2), b, { delta: 1 }), 4, dev);
    });
  });

  describe("nllLoss", () => {
    const N = 4;
    const C = 3;
    /** -sum_n w[t_n] lp[n, t_n] over kept n, and the kept total weight. */
    const nllRef = (lp: number[], targets: number[], weight: number[] | null, ignore: number) => {
      const per = targets.map((t, n) => (t === ignore ? 0 : -(weight ? weight[t]! : 1) * lp[n * C + t]!));
      const total = targets.reduce((a, t) => a + (t === ignore ? 0 : weight ? weight[t]! : 1), 0);
      return { per, total };
    };
    it("picks -logProbs[target] with ignoreIndex, class weights and every reduction; matches crossEntropy", () => {
      const logits = rnd([N, C], 3);
      const lp = k.logSoftmax(logits, 1);
      const lpv = lp.toList();
      const targets = [2, -100, 0, 1];
      const tgt = i32(targets);
      const w = [0.5, 2, 1.5];
      for (const weight of [null, w]) {
        const { per, total } = nllRef(lpv, targets, weight, -100);
        const wt = weight ? k.tensor(weight, { device: dev }) : null;
        assertClose(k.nllLoss(lp, tgt, { weight: wt, reduction: "none" }), per, { ...tol, shape: [N] });
        assertClose(k.nllLoss(lp, tgt, { weight: wt, reduction: "sum" }), [per.reduce((a, b) => a + b)], tol);
        assertClose(k.nllLoss(lp, tgt, { weight: wt }), [per.reduce((a, b) => a + b) / total], tol);
      }
      assertClose(k.nllLoss(lp, tgt), k.crossEntropy(logits, tgt).toList(), tol);
      const { per } = nllRef(lpv, [2, 1, 0, 1], null, 1);
      assertClose(k.nllLoss(lp, i32([2, 1, 0, 1]), { ignoreIndex: 1 }), [per.reduce((a, b) => a + b) / 2], tol);
      assert.equal(k.nllLoss(lp, i32([-100, -100, -100, -100])).item(), 0, "every target ignored: 0, as crossEntropy here");
    });
    it("input [C] with a 0-d target, and [N, C, d] with targets [N, d]", () => {
      const lp = k.logSoftmax(rnd([C], 4), 0);
      assertClose(k.nllLoss(lp, k.tensor(Int32Array.of(1), { device: dev, shape: [] })), [-lp.toList()[1]!], { ...tol, shape: [] });
      const x = rnd([2, C, 2], 5);
      const l3 = k.logSoftmax(x, 1);
      const v = l3.toList();
      const targets = [0, 2, -100, 1]; // [n, d] row-major
      const want = targets.map((t, e) => (t === -100 ? 0 : -v[Math.floor(e / 2) * C * 2 + t * 2 + (e % 2)]!));
      assertClose(k.nllLoss(l3, i32(targets, [2, 2]), { reduction: "none" }), want, { ...tol, shape: [2, 2] });
      assertClose(k.nllLoss(l3, i32(targets, [2, 2])), k.crossEntropy(x, i32(targets, [2, 2])).toList(), tol);
      assertClose(k.nllLoss(l3, k.tensor([0, 2, -100, 1], { device: dev, dtype: "int64", shape: [2, 2] })), [want.reduce((a, b) => a + b) / 3], tol);
    });
    it("errors", () => {
      const lp = k.zeros([N, C], { device: dev });
      assert.throws(() => k.nllLoss(lp, i32([0, 1, 3, 0])), (e: unknown) => e instanceof IndexOutOfRangeError && e.op === "nll_loss");
      assert.throws(() => k.nllLoss(lp, k.zeros([N], { device: dev })), named("nll_loss", "integer"));
      assert.throws(() => k.nllLoss(lp, i32([0, 1])), named("nll_loss", "shape"));
      assert.throws(() => k.nllLoss(lp, i32([0, 1, 0, 0]), { weight: k.ones([2], { device: dev }) }), named("nll_loss", "weight"));
      assert.throws(() => k.nllLoss(k.zeros([], { device: dev }), i32([0])), named("nll_loss", "dimensions"));
    });
    it("gradients", () => {
      const tgt = i32([2, -100, 0, 1]);
      gradcheck("nll", [{ shape: [N, C] }], (a) => k.nllLoss(a, tgt), 1, dev);
      gradcheck("nll weighted sum", [{ shape: [N, C] }], (a) => k.nllLoss(a, tgt, { weight: k.tensor([0.5, 2, 1.5], { device: dev }), reduction: "sum" }), 2, dev);
      gradcheck("nll 3-d", [{ shape: [2, C, 2] }], (a) => k.nllLoss(k.logSoftmax(a, 1), i32([0, 2, 1, 1], [2, 2])), 3, dev);
    });
  });

  describe("binary cross-entropy", () => {
    it("on probabilities: -(t log p + (1 - t) log(1 - p)), logs clamped at -100, weights, reductions", () => {
      const p = rnd([2, 3], 6, 0.02, 0.98);
      const t = rnd([2, 3], 7, 0, 1);
      const w = rnd([3], 8, 0.5, 2);
      const [pv, tv, wv] = [p.toList(), t.toList(), w.toList()];
      const per = pv.map((q, e) => -wv[e % 3]! * (tv[e]! * Math.log(q) + (1 - tv[e]!) * Math.log(1 - q)));
      for (const reduction of REDUCTIONS) assertClose(k.binaryCrossEntropy(p, t, { weight: w, reduction }), reduce(per, reduction), { rtol: 2e-5, atol: 1e-6 });
      assertClose(k.binaryCrossEntropy(k.tensor([0, 1, 0, 1], { device: dev }), k.tensor([0, 1, 1, 0], { device: dev }), { reduction: "none" }), [0, 0, 100, 100]);
      assert.throws(() => k.binaryCrossEntropy(k.tensor([1.5], { device: dev }), k.tensor([1], { device: dev })), named("binary_cross_entropy", "between 0 and 1"));
      assert.throws(() => k.binaryCrossEntropy(p, t.select(0, 0)), named("binary_cross_entropy", "same size"));
    });
    it("on logits: stable for large |x|, posWeight per class, equal to bce(sigmoid(x)) where that is exact", () => {
      const xs = [-200, -30, -2, -0.1, 0, 0.4, 3, 30, 200];
      const ts = [1, 0, 0.3, 1, 0.5, 0, 1, 1, 0];
      const x = k.tensor(xs, { device: dev });
      const t = k.tensor(ts, { device: dev });
      const per = xs.map((v, i) => (1 - ts[i]!) * v + softplus(-v));
      assertClose(k.binaryCrossEntropyWithLogits(x, t, { reduction: "none" }), per, { rtol: 1e-5, atol: 1e-6 });
      const logits = rnd([2, 3], 9, -3, 3);
      const tgt = rnd([2, 3], 10, 0, 1);
      const pw = k.tensor([1, 2, 0.5], { device: dev });
      const [lv, tv] = [logits.toList(), tgt.toList()];
      const weighted = lv.map((v, e) => (1 - tv[e]!) * v + (1 + ([1, 2, 0.5][e % 3]! - 1) * tv[e]!) * softplus(-v));
      for (const reduction of REDUCTIONS)
        assertClose(k.binaryCrossEntropyWithLogits(logits, tgt, { posWeight: pw, reduction }), reduce(weighted, reduction), { rtol: 1e-5, atol: 1e-6 });
      assertClose(k.binaryCrossEntropyWithLogits(logits, tgt), k.binaryCrossEntropy(k.sigmoid(logits), tgt).toList(), { rtol: 1e-4 });
      const probsRef = lv.map(sigmoid);
      assert.ok(probsRef.every((q) => q > 0 && q < 1));
    });
    it("gradients (input and target)", () => {
      gradcheck("bce", [{ shape: [2, 3], kind: "unit" }, { shape: [2, 3], kind: "unit" }], (p, t) => k.binaryCrossEntropy(p, t), 1, dev);
      gradcheck("bce logits", [{ shape: [2, 3] }, { shape: [2, 3], kind: "unit" }], (x, t) => k.binaryCrossEntropyWithLogits(x.mul(3), t, { posWeight: k.tensor([1, 3, 0.5], { device: dev }) }), 2, dev);
    });
  });

  describe("klDiv", () => {
    it("target * (log target - input) (0 where target is 0), logTarget, and the reductions incl. batchmean", () => {
      const input = k.logSoftmax(rnd([3, 4], 11), 1);
      const target = k.tensor([0.1, 0.2, 0.3, 0.4, 0, 0.5, 0.5, 0, 0.25, 0.25, 0.25, 0.25], { device: dev, shape: [3, 4] });
      const [iv, tv] = [input.toList(), target.toList()];
      const per = tv.map((t, e) => (t === 0 ? 0 : t * (Math.log(t) - iv[e]!)));
      for (const reduction of [...REDUCTIONS, "batchmean"] as const)
        assertClose(k.klDiv(input, target, { reduction }), reduce(per, reduction, 3), { ...tol, msg: reduction });
      // log targets: exp(t) * (t - input); a -inf target (log 0) gives NaN there, as torch's formula does
      const positive = k.softmax(rnd([3, 4], 12), 1);
      const pv = positive.toList();
      const logPer = pv.map((t, e) => t * (Math.log(t) - iv[e]!));
      assertClose(k.klDiv(input, k.log(positive), { logTarget: true, reduction: "none" }), logPer, tol);
      assert.ok(Number.isNaN(k.klDiv(k.zeros([1], { device: dev }), k.tensor([-0.5], { device: dev })).item()), "a negative target is NaN, as torch");
      assert.throws(() => k.klDiv(input, target, { reduction: "avg" as LossReduction }), named("kl_div"));
    });
    it("gradients (input and target)", () => {
      gradcheck("klDiv", [{ shape: [2, 3] }, { shape: [2, 3], kind: "unit" }], (a, t) => k.klDiv(a, t, { reduction: "batchmean" }), 1, dev);
      gradcheck("klDiv logTarget", [{ shape: [2, 3] }, { shape: [2, 3] }], (a, t) => k.klDiv(a, t, { logTarget: true, reduction: "sum" }), 2, dev);
      const zeroT = k.tensor([0, 1], { device: dev, requiresGrad: true });
      const inp = k.tensor([-1, -2], { device: dev, requiresGrad: true });
      k.klDiv(inp, zeroT, { reduction: "sum" }).backward();
      assert.ok(zeroT.grad!.toList().every(Number.isFinite), "no NaN from log(0) at a zero target");
      assertClose(inp.grad!, [0, -1]);
    });
  });

  it("frees every temporary (forward and backward)", () => {
    const tgt = i32([2, -100, 0]);
    const classWeight = k.tensor([1, 2, 3], { device: dev });
    const ones = k.ones([3], { device: dev });
    const cases: [string, (x: Tensor, y: Tensor, u: Tensor) => Tensor][] = [
      ["mse", (x, y) => k.mseLoss(x, y)],
      ["l1 none", (x, y) => k.l1Loss(x, y, { reduction: "none" })],
      ["smoothL1", (x, y) => k.smoothL1Loss(x, y, { beta: 0.5, reduction: "sum" })],
      ["huber", (x, y) => k.huberLoss(x, y)],
      ["nll", (x) => k.nllLoss(x, tgt, { weight: classWeight })],
      ["bce", (_x, _y, u) => k.binaryCrossEntropy(u, u)],
      ["bce logits", (x, _y, u) => k.binaryCrossEntropyWithLogits(x, u, { posWeight: ones, weight: ones })],
      ["klDiv", (x, _y, u) => k.klDiv(x, u, { reduction: "batchmean" })],
      ["klDiv logTarget", (x, y) => k.klDiv(x, y, { logTarget: true })],
    ];
    for (const [name, fn] of cases)
      assertNoLeaks(dev, name, () => {
        const x = rnd([3, 3], 1, -1.5, 1.5, { requiresGrad: true });
        const y = rnd([3, 3], 2, -1.5, 1.5, { requiresGrad: true });
        const u = rnd([3, 3], 3, 0.1, 0.9, { requiresGrad: true });
        const out = fn(x, y, u);
        const loss = out.sum();
        loss.backward();
        return [x, y, u, x.grad, y.grad, u.grad, out, loss];
      });
  });
}, { modes: true });
