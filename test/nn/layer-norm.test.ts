// LayerNorm (torch.nn.LayerNorm / functional.layer_norm): hand-computed values, gradients against a float64
// reference, the module's parameters and the inputs it refuses.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import * as k from "../../src/tensor/index.js";
import { LayerNorm } from "../../src/nn/index.js";
import { OpError } from "../../src/util/errors.js";

const close = (got: ArrayLike<number>, want: ArrayLike<number>, tol = 1e-5) => {
  assert.equal(got.length, want.length);
  for (let i = 0; i < want.length; i++) assert.ok(Math.abs(got[i]! - want[i]!) <= tol, `[${i}] ${got[i]} vs ${want[i]}`);
};

/** float64 layer norm of rows of n, with its backward for upstream g (the textbook formulas). */
function reference(x: number[], n: number, w: number[], b: number[], g: number[], eps: number) {
  const y: number[] = [], dx: number[] = [], dw = new Array<number>(n).fill(0), db = new Array<number>(n).fill(0);
  for (let r = 0; r < x.length / n; r++) {
    const row = x.slice(r * n, r * n + n), gr = g.slice(r * n, r * n + n);
    const mu = row.reduce((a, v) => a + v, 0) / n;
    const variance = row.reduce((a, v) => a + (v - mu) ** 2, 0) / n;
    const inv = 1 / Math.sqrt(variance + eps);
    const xhat = row.map((v) => (v - mu) * inv);
    xhat.forEach((h, i) => (y.push(h * w[i]! + b[i]!), (dw[i]! += gr[i]! * h), (db[i]! += gr[i]!)));
    const gh = gr.map((v, i) => v * w[i]!);
    const meanGh = gh.reduce((a, v) => a + v, 0) / n;
    const meanGhX = gh.reduce((a, v, i) => a + v * xhat[i]!, 0) / n;
    gh.forEach((v, i) => dx.push(inv * (v - meanGh - xhat[i]! * meanGhX)));
  }
  return { y, dx, dw, db };
}

describe("layerNorm", () => {
  it("normalises [1, 2, 3, 4] to (x - 2.5) / sqrt(1.25 + eps), then scales and shifts", () => {
    const x = k.tensor([1, 2, 3, 4]);
    const s = Math.sqrt(1.25 + 1e-5);
    close(k.layerNorm(x, 4).dataSync() as Float32Array, [-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s]);
    const w = k.tensor([1, 2, 3, 4]), b = k.tensor([0, 1, 0, -1]);
    close(k.layerNorm(x, [4], w, b).dataSync() as Float32Array, [-1.5 / s, 1 - 1 / s, 1.5 / s, 6 / s - 1]);
    // a constant row: 0 (the variance is 0, eps keeps it finite), then the bias
    close(k.layerNorm(k.tensor([5, 5, 5], { shape: [1, 3] }), 3, null, k.tensor([1, 2, 3])).dataSync() as Float32Array, [1, 2, 3]);
  });

  it("over the last two dims: one mean and variance per leading index", () => {
    const data = [1, 2, 3, 4, 10, 20, 30, 40];
    const got = k.layerNorm(k.tensor(data, { shape: [2, 2, 2] }), [2, 2]).dataSync() as Float32Array;
    const want = reference(data, 4, [1, 1, 1, 1], [0, 0, 0, 0], new Array(8).fill(0), 1e-5).y;
    close(got, want);
  });

  it("gradients of x, weight and bias equal the float64 reference's", () => {
    const n = 5, rows = 3;
    const xs = Array.from({ length: rows * n }, (_, i) => Math.sin(i * 1.7) * 3 + (i % n));
    const ws = Array.from({ length: n }, (_, i) => 0.5 + 0.3 * i);
    const bs = Array.from({ length: n }, (_, i) => 0.1 * i - 0.2);
    const gs = Array.from({ length: rows * n }, (_, i) => Math.cos(i * 0.9));
    const x = k.tensor(xs, { shape: [rows, n], requiresGrad: true });
    const w = k.tensor(ws, { requiresGrad: true }), b = k.tensor(bs, { requiresGrad: true });
    const y = k.layerNorm(x, n, w, b, 1e-3);
    y.mul(k.tensor(gs, { shape: [rows, n] })).sum().backward();
    const ref = reference(xs, n, ws, bs, gs, 1e-3);
    close(y.dataSync() as Float32Array, ref.y, 1e-5);
    close(x.grad!.dataSync() as Float32Array, ref.dx, 1e-4);
    close(w.grad!.dataSync() as Float32Array, ref.dw, 1e-4);
    close(b.grad!.dataSync() as Float32Array, ref.db, 1e-4);
  });

  it("refuses a normalized_shape that is not the input's suffix, mismatched weight or bias, integer input", () => {
    const x = k.tensor([1, 2, 3, 4, 5, 6], { shape: [2, 3] });
    assert.throws(() => k.layerNorm(x, 2), (e: unknown) => e instanceof OpError && /suffix/.test(e.message));
    assert.throws(() => k.layerNorm(x, [2, 3, 1]), OpError);
    assert.throws(() => k.layerNorm(x, [], null), OpError);
    assert.throws(() => k.layerNorm(x, 3, k.tensor([1, 1])), (e: unknown) => e instanceof OpError && /weight/.test(e.message));
    assert.throws(() => k.layerNorm(x, 3, null, k.tensor([1, 1, 1, 1])), (e: unknown) => e instanceof OpError && /bias/.test(e.message));
    assert.throws(() => k.layerNorm(k.tensor([1, 2], { dtype: "int32" }), 2), OpError);
  });
});

describe("LayerNorm module", () => {
  it("starts as weight 1 and bias 0, both trainable, named as torch's state dict", () => {
    const ln = new LayerNorm([2, 3]);
    const sd = ln.stateDict();
    assert.deepEqual([...sd.keys()].sort(), ["bias", "weight"]);
    assert.deepEqual([...(sd.get("weight")!.dataSync() as Float32Array)], [1, 1, 1, 1, 1, 1]);
    assert.deepEqual([...(sd.get("bias")!.dataSync() as Float32Array)], [0, 0, 0, 0, 0, 0]);
    assert.ok(ln.weight!.requiresGrad && ln.bias!.requiresGrad);
    const x = k.tensor([1, 2, 3, 4, 10, 20, 30, 40, 0, 1, 0, 1], { shape: [2, 2, 3] });
    close(ln.forward(x).dataSync() as Float32Array, k.layerNorm(x, [2, 3]).dataSync() as Float32Array, 0);
  });

  it("bias false and elementwiseAffine false leave out their parameters; a loaded weight is used", () => {
    assert.deepEqual([...new LayerNorm(4, 1e-5, { bias: false }).stateDict().keys()], ["weight"]);
    assert.deepEqual([...new LayerNorm(4, 1e-5, { elementwiseAffine: false }).stateDict().keys()], []);
    const ln = new LayerNorm(2, 0);
    ln.loadStateDict(new Map([["weight", k.tensor([2, 3])], ["bias", k.tensor([1, 1])]]));
    close(ln.forward(k.tensor([0, 4])).dataSync() as Float32Array, [-1, 4]);
    assert.throws(() => new LayerNorm([0]), OpError);
  });
});
