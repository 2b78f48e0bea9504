// crossEntropy's input layouts and target kinds (torch's F.cross_entropy): N-d inputs [N, C, d1, ..., dk] with
// class-index targets [N, d1, ..., dk], a 1-d input [C] with a 0-d target, and class-probability targets of the
// input's shape. Losses and gradients (logits and probability targets) against a float64 reference of the formula.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import * as k from "../../src/tensor/index.js";
import { OpError } from "../../src/util/errors.js";

const IGNORE = -100;
type Reduction = "none" | "sum" | "mean";

/** Deterministic values in about [-2, 2]. */
const wave = (n: number, phase: number) => Array.from({ length: n }, (_, i) => Math.sin(i * 1.7 + phase) * 2);

/** Rows of positive numbers summing to 1 along the class dim of a [N, C, ...rest] layout. */
function probabilities(shape: number[]): number[] {
  const [N, C] = [shape[0]!, shape[1]!];
  const S = shape.slice(2).reduce((a, b) => a * b, 1);
  const raw = wave(N * C * S, 0.4).map((v) => Math.exp(v));
  for (let n = 0; n < N; n++)
    for (let s = 0; s < S; s++) {
      let total = 0;
      for (let c = 0; c < C; c++) total += raw[(n * C + c) * S + s]!;
      for (let c = 0; c < C; c++) raw[(n * C + c) * S + s]! /= total;
    }
  return raw;
}

/**
 * Float64 reference over logits in torch's layout [N, C, ...rest] (a 1-d input is N = 1, no rest): the loss of each
 * target position (n, s) in row-major order, and the gradients of sum_p w[p] * loss[p] for the logits and (probability
 * targets) the targets: scale * (softmax * sum(q) - q) and -scale * (1 - eps) * log p, q the smoothed target.
 */
function reference(logits: number[], shape: number[], target: { classes: number[] } | { probs: number[] }, eps: number) {
  const [N, C] = shape.length === 1 ? [1, shape[0]!] : [shape[0]!, shape[1]!];
  const S = shape.slice(2).reduce((a, b) => a * b, 1);
  const at = (n: number, c: number, s: number) => (n * C + c) * S + s;
  const losses: number[] = [];
  const logps: number[][] = [];
  const qs: (number[] | null)[] = [];
  for (let n = 0; n < N; n++)
    for (let s = 0; s < S; s++) {
      const row = Array.from({ length: C }, (_, c) => logits[at(n, c, s)]!);
      const m = Math.max(...row);
      const lse = m + Math.log(row.reduce((a, v) => a + Math.exp(v - m), 0));
      const logp = row.map((v) => v - lse);
      const q = "classes" in target
        ? target.classes[n * S + s] === IGNORE ? null : logp.map((_, c) => (c === target.classes[n * S + s] ? 1 - eps : 0) + eps / C)
        : logp.map((_, c) => (1 - eps) * target.probs[at(n, c, s)]! + eps / C);
      logps.push(logp);
      qs.push(q);
      losses.push(q === null ? 0 : -q.reduce((a, qc, c) => a + qc * logp[c]!, 0));
    }
  const grads = (w: number[]) => {
    const dLogits = new Array<number>(logits.length).fill(0);
    const dTargets = new Array<number>(logits.length).fill(0);
    for (let n = 0; n < N; n++)
      for (let s = 0; s < S; s++) {
        const p = n * S + s;
        const q = qs[p];
        if (q === null) continue;
        const sumQ = q.reduce((a, b) => a + b, 0);
        logps[p]!.forEach((lp, c) => {
          dLogits[at(n, c, s)] = w[p]! * (Math.exp(lp) * sumQ - q[c]!);
          dTargets[at(n, c, s)] = -w[p]! * (1 - eps) * lp;
        });
      }
    return { dLogits, dTargets };
  };
  return { losses, grads };
}

const close = (got: ArrayLike<number>, want: ArrayLike<number>, tol = 2e-5, what = "") => {
  assert.equal(got.length, want.length, `${what}: length`);
  for (let i = 0; i < want.length; i++) assert.ok(Math.abs(got[i]! - want[i]!) <= tol, `${what}[${i}] ${got[i]} vs ${want[i]}`);
};

/** Runs every reduction: values against the reference and the gradients of each (weighted for "none"). */
function checkAllReductions(shape: number[], lossShape: number[], makeTargets: () => k.Tensor, target: { classes: number[] } | { probs: number[] }, eps: number) {
  const data = wave(shape.reduce((a, b) => a * b, 1), 0);
  const ref = reference(data, shape, target, eps);
  const positions = ref.losses.length;
  const count = "classes" in target ? target.classes.filter((t) => t !== IGNORE).length : positions;
  const upstream = Array.from({ length: positions }, (_, i) => 0.5 + i * 0.25);
  for (const reduction of ["none", "sum", "mean"] as Reduction[]) {
    const what = `${JSON.stringify(shape)} ${reduction} eps ${eps}`;
    const logits = k.tensor(data, { shape, requiresGrad: true });
    const targets = makeTargets();
    const loss = k.crossEntropy(logits, targets, { reduction, labelSmoothing: eps });
    const total = ref.losses.reduce((a, b) => a + b, 0);
    let weights: number[];
    if (reduction === "none") {
      assert.deepEqual([...loss.shape], lossShape, `${what}: shape`);
      close(loss.toList(), ref.losses, 2e-5, what);
      loss.mul(k.tensor(upstream, { shape: lossShape })).sum().backward();
      weights = upstream;
    } else {
      assert.deepEqual([...loss.shape], [], `${what}: shape`);
      close([loss.item()], [reduction === "sum" ? total : total / count], 2e-5, what);
      loss.backward();
      weights = new Array<number>(positions).fill(reduction === "sum" ? 1 : 1 / count);
    }
    const want = ref.grads(weights);
    close(logits.grad!.toList(), want.dLogits, 2e-5, `${what}: dlogits`);
    if (targets.requiresGrad) close(targets.grad!.toList(), want.dTargets, 2e-5, `${what}: dtargets`);
  }
}

describe("crossEntropy targets", () => {
  for (const eps of [0, 0.2]) {
    it(`N-d input [N, C, d1] and [N, C, d1, d2] with class indices [N, d1(, d2)], label_smoothing ${eps}`, () => {
      const classes = [3, 0, IGNORE, 1, 1, 2]; // [2, 3]: one target ignored
      checkAllReductions([2, 4, 3], [2, 3], () => k.tensor(Int32Array.from(classes), { shape: [2, 3] }), { classes }, eps);
      const classes4 = [0, 2, 1, 1, 2, 0, IGNORE, 2];
      checkAllReductions([2, 3, 2, 2], [2, 2, 2], () => k.tensor(classes4, { shape: [2, 2, 2], dtype: "int64" }), { classes: classes4 }, eps);
    });

    it(`1-d input [C] with a 0-d class target, label_smoothing ${eps}`, () => {
      checkAllReductions([5], [], () => k.tensor(Int32Array.of(3), { shape: [] }), { classes: [3] }, eps);
      // an ignored target: loss 0 and no gradient (mean over no target: 0, as Kiln's 2-d mean)
      const logits = k.tensor(wave(5, 0), { requiresGrad: true });
      const loss = k.crossEntropy(logits, k.tensor(Int32Array.of(IGNORE), { shape: [] }), { labelSmoothing: eps });
      assert.deepEqual([loss.shape.length, loss.item()], [0, 0]);
      loss.backward();
      assert.deepEqual(logits.grad!.toList(), [0, 0, 0, 0, 0]);
    });

    it(`class-probability targets of the input's shape ([C], [N, C], [N, C, d1]), label_smoothing ${eps}`, () => {
      for (const [shape, lossShape] of [[[4], []], [[3, 4], [3]], [[2, 3, 2], [2, 2]]] as const) {
        const probs = probabilities(shape.length === 1 ? [1, shape[0]] : [...shape]);
        const targets = () => k.tensor(probs, { shape: [...shape], requiresGrad: true }); // differentiable, as torch's
        checkAllReductions([...shape], [...lossShape], targets, { probs }, eps);
      }
      // targets that do not sum to 1 (unnormalized soft labels) follow the same formula
      const unnormalized = wave(6, 1).map((v) => v * v);
      checkAllReductions([2, 3], [2], () => k.tensor(unnormalized, { shape: [2, 3] }), { probs: unnormalized }, eps);
    });
  }

  it("bf16 logits give a bf16 loss (class indices); probabilities promote with the targets' dtype, as torch", () => {
    const data = [[2, 0, 1], [0.5, -1, 0.25]];
    const ref = reference(data.flat(), [2, 3], { classes: [0, 2] }, 0).losses;
    const logits = k.tensor(data, { dtype: "bfloat16", requiresGrad: true });
    const loss = k.crossEntropy(logits, k.tensor(Int32Array.of(0, 2)));
    assert.equal(loss.dtype, "bfloat16");
    close([loss.item()], [(ref[0]! + ref[1]!) / 2], 4e-3);
    loss.backward();
    assert.equal(logits.grad!.dtype, "bfloat16");
    const probs = k.tensor([[1, 0, 0], [0, 0, 1]]);
    assert.equal(k.crossEntropy(logits, probs).dtype, "float32");
    assert.equal(k.crossEntropy(logits, probs.to("bfloat16")).dtype, "bfloat16");
    close([k.crossEntropy(logits, probs).item()], [(ref[0]! + ref[1]!) / 2], 4e-3);
  });

  it("target shapes and dtypes that match neither kind are typed errors naming cross_entropy", () => {
    const logits = k.zeros([2, 3, 4]);
    const refused = (re: RegExp) => (e: unknown) => e instanceof OpError && e.op === "cross_entropy" && re.test(e.message);
    assert.throws(() => k.crossEntropy(logits, k.zeros([2, 3], { dtype: "int32" })),
      refused(/expected targets of shape \[2, 4\] \(class indices\) or \[2, 3, 4\] \(class probabilities\) for logits \[2, 3, 4\], got \[2, 3\]/));
    assert.throws(() => k.crossEntropy(logits, k.zeros([2, 4])), refused(/class indices of an integer dtype, got float32/));
    assert.throws(() => k.crossEntropy(logits, k.zeros([2, 3, 4], { dtype: "int32" })),
      refused(/Expected floating point type for target with class probabilities, got int32/));
    assert.throws(() => k.crossEntropy(logits, k.zeros([2, 3, 4]), { ignoreIndex: 0 }), refused(/ignore_index is not supported for floating point target/));
    assert.throws(() => k.crossEntropy(k.zeros([]), k.zeros([], { dtype: "int32" })), refused(/Expected 1 or more dimensions \(got 0\)/));
    assert.throws(() => k.crossEntropy(k.zeros([2, 3], { dtype: "int32" }), k.zeros([2], { dtype: "int32" })), refused(/floating logits, got int32/));
    assert.throws(() => k.crossEntropy(k.zeros([4]), k.zeros([1], { dtype: "int32" })), refused(/expected targets of shape \[\] \(class indices\)/));
    // a negative ignore_index (the default) is allowed with probabilities, as torch's
    assert.equal(k.crossEntropy(logits, k.full([2, 3, 4], 1 / 3), { ignoreIndex: -1 }).item().toFixed(5), Math.log(3).toFixed(5));
  });
});
