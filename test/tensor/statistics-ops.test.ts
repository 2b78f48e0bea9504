// var / std / varMean / stdMean / norm / amax / amin / isnan / isinf / isfinite / allclose: values against float64
// JS loops, gradients against finite differences, errors, and no leaked buffers.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import * as k from "../../src/tensor/index.js";
import type { Tensor } from "../../src/tensor/index.js";
import { OpError } from "../../src/util/errors.js";
import { assertClose, assertNoLeaks, forEachBackend, randomValues } from "./suite.js";
import { gradcheck } from "./gradcheck-helper.js";

/** Groups of x's elements that share every index outside `dims` (x of `shape`), in the kept dims' row-major order. */
function groups(x: number[], shape: number[], dims: number[]): number[][] {
  const strides = shape.map((_, i) => shape.slice(i + 1).reduce((a, b) => a * b, 1));
  const out = new Map<number, number[]>();
  x.forEach((v, e) => {
    let key = 0;
    shape.forEach((n, d) => {
      if (!dims.includes(d)) key = key * n + (Math.floor(e / strides[d]!) % n);
    });
    out.set(key, [...(out.get(key) ?? []), v]);
  });
  return [...out.entries()].sort((a, b) => a[0] - b[0]).map(([, g]) => g);
}

const meanOf = (g: number[]) => g.reduce((a, b) => a + b, 0) / g.length;
const varOf = (g: number[], correction: number) => g.reduce((a, b) => a + (b - meanOf(g)) ** 2, 0) / Math.max(0, g.length - correction);

forEachBackend((dev) => {
  const rnd = (shape: number[], seed: number, opts: { requiresGrad?: boolean } = {}) =>
    k.tensor(randomValues(shape.reduce((a, b) => a * b, 1), seed), { shape, device: dev, ...opts });
  const named = (op: string, text?: string) => (e: unknown) => e instanceof OpError && e.op === op && (text === undefined || e.message.includes(text));
  const shape = [2, 3, 4];

  describe("var / std / varMean / stdMean", () => {
    it("over dims (negative too, all when omitted) with corrections and keepdim", () => {
      const x = rnd(shape, 1);
      const v = x.toList();
      for (const [dim, dims] of [[undefined, [0, 1, 2]], [-1, [2]], [[0, 2], [0, 2]], [1, [1]]] as const) {
        for (const correction of [0, 1, 2]) {
          const g = groups(v, shape, [...dims]);
          const want = g.map((gr) => varOf(gr, correction));
          assertClose(k.var(x, dim, { correction }), want, { rtol: 1e-5, atol: 1e-6, msg: `var ${String(dim)} ${correction}` });
          assertClose(x.std(dim, { correction }), want.map(Math.sqrt), { rtol: 1e-5, atol: 1e-6 });
          const vm = k.varMean(x, dim, { correction, keepdim: true });
          const keptShape = shape.map((n, d) => (dims.includes(d as never) ? 1 : n));
          assertClose(vm.var, want, { shape: keptShape, rtol: 1e-5, atol: 1e-6 });
          assertClose(vm.mean, g.map(meanOf), { shape: keptShape, rtol: 1e-5, atol: 1e-6 });
          const sm = k.stdMean(x, dim, { correction });
          assertClose(sm.std, want.map(Math.sqrt), { rtol: 1e-5, atol: 1e-6 });
          assertClose(sm.mean, g.map(meanOf), { shape: [...sm.std.shape], rtol: 1e-5, atol: 1e-6 });
        }
      }
      assert.equal(k.var(k.tensor([1, 2, 3, 4], { device: dev })).item().toFixed(4), "1.6667");
    });
    it("a divisor of 0 gives NaN / inf as torch; integers are refused", () => {
      assert.ok(Number.isNaN(k.var(k.tensor([3], { device: dev })).item()));
      assert.equal(k.var(k.tensor([3, 5], { device: dev }), 0, { correction: 2 }).item(), Infinity);
      assert.throws(() => k.var(k.tensor(Int32Array.of(1, 2), { device: dev })), named("var", "floating point"));
    });
    it("gradients", () => {
      gradcheck("var", [{ shape: [3, 4] }], (a) => k.var(a, 1), 1, dev);
      gradcheck("var all, correction 0", [{ shape: [2, 3] }], (a) => k.var(a, undefined, { correction: 0 }), 2, dev);
      gradcheck("std", [{ shape: [2, 4] }], (a) => a.std(-1, { keepdim: true }), 3, dev);
      gradcheck("varMean", [{ shape: [3, 2] }], (a) => {
        const r = k.varMean(a, 0);
        return r.var.add(r.mean.mul(2));
      }, 4, dev);
    });
  });

  describe("norm / amax / amin", () => {
    it("vector norms for p = 2, 1, inf, -inf, 0 and any p, over dims", () => {
      const x = rnd(shape, 2);
      const v = x.toList();
      const cases: [number | "fro", (g: number[]) => number][] = [
        [2, (g) => Math.sqrt(g.reduce((a, b) => a + b * b, 0))],
        ["fro", (g) => Math.sqrt(g.reduce((a, b) => a + b * b, 0))],
        [1, (g) => g.reduce((a, b) => a + Math.abs(b), 0)],
        [Infinity, (g) => Math.max(...g.map(Math.abs))],
        [-Infinity, (g) => Math.min(...g.map(Math.abs))],
        [3, (g) => g.reduce((a, b) => a + Math.abs(b) ** 3, 0) ** (1 / 3)],
        [0.5, (g) => g.reduce((a, b) => a + Math.abs(b) ** 0.5, 0) ** 2],
      ];
      for (const [p, f] of cases) {
        assertClose(k.norm(x, p), [f(v)], { rtol: 1e-5, msg: `p=${p}` });
        assertClose(x.norm(p, [0, -1]), groups(v, shape, [0, 2]).map(f), { rtol: 1e-5, shape: [3], msg: `p=${p}` });
        assertClose(k.norm(x, p, 1, true), groups(v, shape, [1]).map(f), { rtol: 1e-5, shape: [2, 1, 4] });
      }
      assert.equal(k.norm(k.tensor([0, 2, 0, -1], { device: dev }), 0).item(), 2);
      assert.equal(k.norm(k.tensor([3, -4], { device: dev })).item(), 5);
      assert.throws(() => k.norm(k.tensor(Int32Array.of(1), { device: dev })), named("norm"));
    });
    it("amax / amin over several dims", () => {
      const x = rnd(shape, 3);
      const v = x.toList();
      assertClose(k.amax(x, [0, 2]), groups(v, shape, [0, 2]).map((g) => Math.max(...g)), { shape: [3] });
      assertClose(x.amin(-1, true), groups(v, shape, [2]).map((g) => Math.min(...g)), { shape: [2, 3, 1] });
      assertClose(x.amax(), [Math.max(...v)], { shape: [] });
      assertClose(k.amin(x, []), [Math.min(...v)], { shape: [], msg: "dim [] reduces every dim, as torch" });
    });
    it("gradients (ties in amax share the gradient evenly)", () => {
      gradcheck("norm 2", [{ shape: [2, 3], kind: "awayFromZero" }], (a) => k.norm(a, 2, 1), 1, dev);
      gradcheck("norm 1", [{ shape: [2, 3], kind: "awayFromZero" }], (a) => k.norm(a, 1), 2, dev);
      gradcheck("norm 3", [{ shape: [4], kind: "awayFromZero" }], (a) => k.norm(a, 3), 3, dev);
      gradcheck("norm inf", [{ shape: [2, 4], kind: "distinct" }], (a) => k.norm(a.add(0.05), Infinity, -1), 4, dev);
      gradcheck("amax", [{ shape: [2, 3, 2], kind: "distinct" }], (a) => k.amax(a, [0, 2]), 5, dev);
      gradcheck("amin", [{ shape: [3, 2], kind: "distinct" }], (a) => k.amin(a, 0, true), 6, dev);
      for (const p of [2, 3, 1.5]) {
        const z = k.tensor([[0, 0], [3, -4]], { device: dev, requiresGrad: true });
        k.norm(z, p, 1).sum().backward();
        const n = (3 ** p + 4 ** p) ** (1 / p);
        assertClose(z.grad!, [0, 0, (3 / n) ** (p - 1), -((4 / n) ** (p - 1))], { rtol: 1e-5, msg: `a zero norm's gradient is 0 (p=${p})` });
      }
      const x = k.tensor([1, 3, 3, 2], { device: dev, requiresGrad: true });
      k.amax(x).backward();
      assert.deepEqual(x.grad!.toList(), [0, 0.5, 0.5, 0]);
    });
  });

  describe("isnan / isinf / isfinite / allclose", () => {
    it("classify values; integers are finite", () => {
      const x = k.tensor([1, NaN, Infinity, -Infinity, 0], { device: dev });
      assert.deepEqual(k.isnan(x).toList(), [0, 1, 0, 0, 0]);
      assert.deepEqual(x.isinf().toList(), [0, 0, 1, 1, 0]);
      assert.deepEqual(k.isfinite(x).toList(), [1, 0, 0, 0, 1]);
      assert.equal(k.isnan(x).dtype, "bool");
      const i = k.tensor(Int32Array.of(1, 2), { device: dev });
      assert.deepEqual([k.isnan(i).toList(), k.isinf(i).toList(), i.isfinite().toList()], [[0, 0], [0, 0], [1, 1]]);
    });
    it("allclose: |a - b| <= atol + rtol |b|, broadcasting, infinities, NaN only with equalNan", () => {
      const a = k.tensor([1, 2, 3], { device: dev });
      assert.equal(k.allclose(a, k.tensor([1, 2, 3.00001], { device: dev })), true);
      assert.equal(k.allclose(a, k.tensor([1, 2, 3.001], { device: dev })), false);
      assert.equal(k.allclose(a, k.tensor([1, 2, 3.001], { device: dev }), 1e-3), true);
      assert.equal(k.allclose(a, k.tensor([1.1, 2, 3], { device: dev }), 0, 0.2), true);
      assert.equal(k.allclose(k.ones([2, 3], { device: dev }), k.tensor([1], { device: dev })), true);
      const inf = k.tensor([Infinity, -Infinity], { device: dev });
      assert.equal(k.allclose(inf, inf), true);
      assert.equal(k.allclose(inf, k.tensor([Infinity, Infinity], { device: dev })), false);
      const nan = k.tensor([NaN, 1], { device: dev });
      assert.equal(k.allclose(nan, nan), false);
      assert.equal(k.allclose(nan, nan, 1e-5, 1e-8, true), true);
      assert.throws(() => k.allclose(a, k.ones([2], { device: dev })), named("allclose"));
    });
  });

  it("frees every temporary (forward and backward)", () => {
    const cases: [string, (x: Tensor) => Tensor | Tensor[]][] = [
      ["var", (x) => k.var(x, 1)],
      ["std keepdim", (x) => k.std(x, [0, 1], { keepdim: true })],
      ["varMean", (x) => Object.values(k.varMean(x, -1))],
      ["stdMean", (x) => Object.values(k.stdMean(x))],
      ["norm 2", (x) => k.norm(x)],
      ["norm inf", (x) => k.norm(x, Infinity, 0)],
      ["norm p", (x) => k.norm(x, 3, 1, true)],
      ["amax", (x) => k.amax(x, [0, 1])],
    ];
    for (const [name, fn] of cases)
      assertNoLeaks(dev, name, () => {
        const x = rnd([2, 3], 1, { requiresGrad: true });
        const outs = [fn(x)].flat();
        const loss = outs[0]!.sum();
        loss.backward();
        return [x, x.grad, ...outs, loss];
      });
    assertNoLeaks(dev, "value tests", () => {
      const x = k.tensor([1, NaN, Infinity], { device: dev });
      k.allclose(x, x, 1e-5, 1e-8, true);
      return [x, k.isnan(x), k.isinf(x), k.isfinite(x), k.norm(x, 0)];
    });
  });
}, { modes: true });
