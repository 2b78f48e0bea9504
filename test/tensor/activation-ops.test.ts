// lerp / softplus / logSigmoid / hardtanh / leakyRelu / elu / clampMin / clampMax / dropout: values against float64
// JS formulas, gradients against finite differences, dropout's mask statistics and reproducibility, no leaks.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import * as k from "../../src/tensor/index.js";
import type { Tensor } from "../../src/tensor/index.js";
import { OpError } from "../../src/util/errors.js";
import { assertClose, assertNoLeaks, forEachBackend, randomValues } from "./suite.js";
import { gradcheck } from "./gradcheck-helper.js";

const softplusRef = (x: number, beta = 1, threshold = 20) => (beta * x > threshold ? x : Math.log1p(Math.exp(beta * x)) / beta);

forEachBackend((dev) => {
  const t = (data: number[]) => k.tensor(data, { device: dev });
  const rnd = (shape: number[], seed: number, opts: { requiresGrad?: boolean } = {}) =>
    k.tensor(randomValues(shape.reduce((a, b) => a * b, 1), seed, -3, 3), { shape, device: dev, ...opts });
  const named = (op: string, text?: string) => (e: unknown) => e instanceof OpError && e.op === op && (text === undefined || e.message.includes(text));

  describe("elementwise extras", () => {
    it("lerp broadcasts a, b and a scalar or tensor weight", () => {
      const a = rnd([2, 3], 1);
      const b = rnd([3], 2);
      const w = rnd([2, 1], 3);
      const [av, bv, wv] = [a.toList(), b.toList(), w.toList()];
      assertClose(k.lerp(a, b, 0.25), av.map((x, e) => x + 0.25 * (bv[e % 3]! - x)), { shape: [2, 3], atol: 1e-6 });
      assertClose(a.lerp(b, w), av.map((x, e) => x + wv[Math.floor(e / 3)]! * (bv[e % 3]! - x)), { atol: 1e-6 });
      assert.deepEqual(k.lerp(t([0, 10]), t([10, 20]), 0.5).toList(), [5, 15]);
    });
    it("log1p keeps the precision of tiny x; log1p(-1) = -inf, log1p(inf) = inf, below -1 NaN", () => {
      const xs = [1e-10, -3e-8, 1e-5, -0.5, 0, 2, 1e30, -1, Infinity, -2];
      assertClose(k.log1p(t(xs)), xs.map(Math.log1p), { rtol: 1e-6, atol: 0 });
      assertClose(k.log1p(k.tensor(Int32Array.of(0, 1), { device: dev })), [0, Math.LN2], { rtol: 1e-6 });
    });
    it("softplus (beta, threshold) and logSigmoid, stable and precise for large |x|", () => {
      const xs = [-80, -30, -5, -1, -1e-3, 0, 0.5, 3, 19.9, 20.1, 50, 1000];
      // relative precision down to float32's smallest normal numbers (exp(-160) underflows to 0, as in torch)
      const tiny = { rtol: 1e-5, atol: 1e-37 };
      assertClose(k.softplus(t(xs)), xs.map((x) => softplusRef(x)), tiny);
      assertClose(k.softplus(t(xs), 2, 5), xs.map((x) => softplusRef(x, 2, 5)), tiny);
      assertClose(k.logSigmoid(t(xs)), xs.map((x) => -softplusRef(-x, 1, Infinity)), tiny);
      assertClose(k.logSigmoid(t([-1e4])), [-1e4]);
    });
    it("hardtanh, leakyRelu, elu, clampMin, clampMax", () => {
      const xs = [-3, -1, -0.5, 0, 0.5, 1, 2, 100];
      const x = t(xs);
      assertClose(k.hardtanh(x), xs.map((v) => Math.min(1, Math.max(-1, v))));
      assertClose(k.hardtanh(x, -0.5, 2), xs.map((v) => Math.min(2, Math.max(-0.5, v))));
      assertClose(k.leakyRelu(x), xs.map((v) => (v > 0 ? v : 0.01 * v)));
      assertClose(k.leakyRelu(x, 0.2), xs.map((v) => (v > 0 ? v : 0.2 * v)));
      assertClose(k.elu(x), xs.map((v) => (v > 0 ? v : Math.expm1(v))), { atol: 1e-6 });
      assertClose(k.elu(x, 0.5), xs.map((v) => (v > 0 ? v : 0.5 * Math.expm1(v))), { atol: 1e-6 });
      assertClose(x.clampMin(0.5), xs.map((v) => Math.max(v, 0.5)));
      assertClose(k.clampMax(x, 0.5), xs.map((v) => Math.min(v, 0.5)));
      assert.throws(() => k.hardtanh(x, 1, -1), named("hardtanh"));
    });
    it("gradients (at kinks as torch: leakyRelu slope at 0, elu alpha at 0, softplus 1/2 at 0)", () => {
      gradcheck("lerp", [{ shape: [2, 3] }, { shape: [3] }, { shape: [2, 1] }], (a, b, w) => k.lerp(a, b, w), 1, dev);
      gradcheck("log1p", [{ shape: [2, 5], kind: "positive" }], (a) => k.log1p(a.sub(0.4)), 7, dev);
      gradcheck("softplus", [{ shape: [2, 5] }], (a) => k.softplus(a.mul(4), 1.5, 3), 2, dev);
      gradcheck("logSigmoid", [{ shape: [8] }], (a) => k.logSigmoid(a.mul(10)), 3, dev);
      gradcheck("hardtanh", [{ shape: [10], kind: "distinct" }], (a) => k.hardtanh(a, -0.22, 0.33), 4, dev);
      gradcheck("leakyRelu", [{ shape: [2, 4], kind: "awayFromZero" }], (a) => k.leakyRelu(a, 0.1), 5, dev);
      gradcheck("elu", [{ shape: [2, 4], kind: "awayFromZero" }], (a) => k.elu(a, 0.7), 6, dev);
      const zero = k.zeros([3], { device: dev, requiresGrad: true });
      const sum = (x: Tensor) => x.sum();
      sum(k.leakyRelu(zero, 0.3)).backward();
      assertClose(zero.grad!, [0.3, 0.3, 0.3]);
      const z2 = k.zeros([1], { device: dev, requiresGrad: true });
      sum(k.elu(z2, 0.7)).backward();
      assertClose(z2.grad!, [0.7]);
      const z3 = k.zeros([1], { device: dev, requiresGrad: true });
      sum(k.softplus(z3)).backward();
      assertClose(z3.grad!, [0.5]);
      const big = k.tensor([100, -100], { device: dev, requiresGrad: true });
      sum(k.elu(big)).backward();
      assertClose(big.grad!, [1, Math.exp(-100)], { msg: "no NaN from the unused exp branch" });
    });
  });

  describe("dropout", () => {
    const n = 20000;
    it("keeps about 1 - p of the elements, scaled by 1 / (1 - p); a fixed seed reproduces the mask", () => {
      const x = rnd([n], 7);
      const xv = x.toList();
      for (const p of [0.1, 0.5, 0.8]) {
        const out = k.dropout(x, p, true, new k.Generator(42)).toList();
        const kept = out.filter((v) => v !== 0).length / n;
        assert.ok(Math.abs(kept - (1 - p)) < 4 * Math.sqrt((p * (1 - p)) / n), `p=${p}: kept ${kept}`);
        out.forEach((v, i) => {
          if (v !== 0) assert.ok(Math.abs(v - xv[i]! / (1 - p)) <= 1e-6 * Math.abs(xv[i]! / (1 - p)), `p=${p} [${i}]`);
        });
        assert.deepEqual(k.dropout(x, p, true, new k.Generator(42)).toList(), out, "same seed, same mask");
        assert.notDeepEqual(k.dropout(x, p, true, new k.Generator(43)).toList(), out);
      }
      k.manualSeed(5);
      const first = k.dropout(x, 0.5).toList();
      k.manualSeed(5);
      assert.deepEqual(k.dropout(x, 0.5).toList(), first, "the global generator, reseeded");
    });
    it("the gradient is the same mask / (1 - p)", () => {
      const x = rnd([4000], 8, { requiresGrad: true });
      const p = 0.3;
      const out = k.dropout(x, p, true, new k.Generator(9));
      out.sum().backward();
      const ov = out.toList();
      const xv = x.toList();
      x.grad!.toList().forEach((g, i) => assert.ok(Math.abs(g - (ov[i] === 0 && xv[i] !== 0 ? 0 : 1 / (1 - p))) < 1e-6, `[${i}]`));
    });
    it("p = 0 or eval is an alias of x, p = 1 zeros, p outside [0, 1] throws", () => {
      const x = rnd([5], 9, { requiresGrad: true });
      for (const y of [k.dropout(x, 0), k.dropout(x, 0.7, false)]) {
        assert.equal(y.storage, x.storage, "shares x's storage");
        assert.deepEqual(y.toList(), x.toList());
        assert.equal(y.requiresGrad, true);
        y.dispose();
        assert.equal(x.isDisposed, false);
      }
      const z = k.dropout(x, 1);
      assert.deepEqual(z.toList().map(Math.abs), [0, 0, 0, 0, 0]);
      z.sum().backward();
      assert.deepEqual(x.grad!.toList(), [0, 0, 0, 0, 0]);
      const bf = k.dropout(x.detach().to("bfloat16"), 0.5);
      assert.equal(bf.dtype, "bfloat16");
      assert.throws(() => k.dropout(x, 1.5), named("dropout", "between 0 and 1"));
      assert.throws(() => k.dropout(x, -0.1), named("dropout"));
    });
  });

  it("frees every temporary (forward and backward)", () => {
    const cases: [string, (x: Tensor) => Tensor][] = [
      ["lerp", (x) => k.lerp(x, x, 0.3)],
      ["lerp tensor weight", (x) => k.lerp(x, x, x)],
      ["log1p", (x) => k.log1p(x)],
      ["softplus", (x) => k.softplus(x, 2)],
      ["logSigmoid", (x) => k.logSigmoid(x)],
      ["hardtanh", (x) => k.hardtanh(x)],
      ["leakyRelu", (x) => k.leakyRelu(x)],
      ["elu", (x) => k.elu(x)],
      ["clampMin", (x) => k.clampMin(x, 0)],
      ["dropout", (x) => k.dropout(x, 0.4, true, new k.Generator(1))],
      ["dropout eval", (x) => k.dropout(x, 0.4, false)],
      ["dropout p=1", (x) => k.dropout(x, 1)],
    ];
    for (const [name, fn] of cases)
      assertNoLeaks(dev, name, () => {
        const x = rnd([2, 3], 1, { requiresGrad: true });
        const out = fn(x);
        const loss = out.sum();
        loss.backward();
        return [x, x.grad, out, loss];
      });
  });
}, { modes: true });
