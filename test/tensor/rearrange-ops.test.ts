// flip / roll / repeat / tile / repeatInterleave / pad: values against index arithmetic in plain JS, gradients
// against finite differences, errors, and no leaked buffers.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import * as k from "../../src/tensor/index.js";
import type { Tensor } from "../../src/tensor/index.js";
import { OpError } from "../../src/util/errors.js";
import { assertClose, assertNoLeaks, forEachBackend, randomValues } from "./suite.js";
import { gradcheck } from "./gradcheck-helper.js";

/** out[idx] = x[source(idx)] over out's shape (source null: `fill`), in row-major order. */
function gatherRef(x: number[], shape: number[], outShape: number[], source: (idx: number[]) => number[] | null, fill = 0): number[] {
  const strides = shape.map((_, i) => shape.slice(i + 1).reduce((a, b) => a * b, 1));
  const n = outShape.reduce((a, b) => a * b, 1);
  return Array.from({ length: n }, (_, e) => {
    const idx: number[] = [];
    let rest = e;
    for (let d = outShape.length - 1; d >= 0; d--) {
      idx.unshift(rest % outShape[d]!);
      rest = Math.floor(rest / outShape[d]!);
    }
    const src = source(idx);
    return src === null ? fill : x[src.reduce((o, i, d) => o + i * strides[d]!, 0)]!;
  });
}

const mod = (a: number, n: number) => ((a % n) + n) % n;

forEachBackend((dev) => {
  const rnd = (shape: number[], seed: number, opts: { requiresGrad?: boolean } = {}) =>
    k.tensor(randomValues(shape.reduce((a, b) => a * b, 1), seed), { shape, device: dev, ...opts });
  const named = (op: string, text?: string) => (e: unknown) => e instanceof OpError && e.op === op && (text === undefined || e.message.includes(text));
  const shape = [2, 3, 4];

  describe("flip / roll", () => {
    it("flip reverses the given dims (negative dims too)", () => {
      const x = rnd(shape, 1);
      const v = x.toList();
      assertClose(k.flip(x, [0, -1]), gatherRef(v, shape, shape, ([a, b, c]) => [1 - a!, b!, 3 - c!]), { shape });
      assertClose(x.flip(1), gatherRef(v, shape, shape, ([a, b, c]) => [a!, 2 - b!, c!]));
      assertClose(k.flip(x, []), v);
      assert.deepEqual([...k.flip(k.zeros([0, 3], { device: dev }), [0, 1]).shape], [0, 3]);
      assert.throws(() => k.flip(x, [0, -3]), named("flip", "repeated"));
      assert.throws(() => k.flip(x, [3]), named("flip", "out of range"));
    });
    it("roll shifts along dims, or the flattened tensor when dims are omitted", () => {
      const x = rnd(shape, 2);
      const v = x.toList();
      assertClose(k.roll(x, 1, 2), gatherRef(v, shape, shape, ([a, b, c]) => [a!, b!, mod(c! - 1, 4)]), { shape });
      assertClose(x.roll([-1, 5], [0, -2]), gatherRef(v, shape, shape, ([a, b, c]) => [mod(a! + 1, 2), mod(b! - 5, 3), c!]));
      assertClose(k.roll(x, 7), v.map((_, e) => v[mod(e - 7, 24)]!), { shape });
      assertClose(k.roll(x, -26), v.map((_, e) => v[mod(e + 26, 24)]!));
      assert.deepEqual(k.roll(k.tensor([1, 2, 3, 4], { device: dev }), 1).toList(), [4, 1, 2, 3]);
      assert.throws(() => k.roll(x, [1, 2], [0]), named("roll", "align"));
      assert.throws(() => k.roll(x, [1, 2]), named("roll"));
    });
    it("gradients", () => {
      gradcheck("flip", [{ shape: [2, 3] }], (a) => k.flip(a, [0, 1]), 1, dev);
      gradcheck("roll", [{ shape: [2, 3] }], (a) => k.roll(a, [1, -1], [0, 1]), 2, dev);
      gradcheck("roll flat", [{ shape: [2, 3] }], (a) => k.roll(a, 4), 3, dev);
    });
  });

  describe("repeat / tile / repeatInterleave", () => {
    it("repeat tiles each dim, adding leading dims", () => {
      const x = rnd([2, 3], 3);
      const v = x.toList();
      assertClose(k.repeat(x, 2, 1, 2), gatherRef(v, [2, 3], [2, 2, 6], ([, b, c]) => [b! % 2, c! % 3]), { shape: [2, 2, 6] });
      assertClose(x.repeat([3, 1]), gatherRef(v, [2, 3], [6, 3], ([a, b]) => [a! % 2, b!]), { shape: [6, 3] });
      assert.deepEqual([...k.repeat(x, 0, 2).shape], [0, 6]);
      assert.throws(() => k.repeat(x, 2), named("repeat", "can not be smaller"));
    });
    it("tile pads its dims with leading ones", () => {
      const x = rnd([2, 3], 4);
      const v = x.toList();
      assertClose(k.tile(x, [2]), gatherRef(v, [2, 3], [2, 6], ([a, b]) => [a!, b! % 3]), { shape: [2, 6] });
      assertClose(x.tile(2, 1, 1), gatherRef(v, [2, 3], [2, 2, 3], ([, a, b]) => [a!, b!]), { shape: [2, 2, 3] });
    });
    it("repeatInterleave repeats each element in place", () => {
      const x = rnd([2, 3], 5);
      const v = x.toList();
      assertClose(k.repeatInterleave(x, 2, -1), gatherRef(v, [2, 3], [2, 6], ([a, b]) => [a!, Math.floor(b! / 2)]), { shape: [2, 6] });
      assertClose(x.repeatInterleave(3, 0), gatherRef(v, [2, 3], [6, 3], ([a, b]) => [Math.floor(a! / 3), b!]), { shape: [6, 3] });
      assertClose(k.repeatInterleave(x, 2), v.flatMap((e) => [e, e]), { shape: [12] });
      assert.throws(() => k.repeatInterleave(x, -1), named("repeat_interleave"));
    });
    it("gradients", () => {
      gradcheck("repeat", [{ shape: [2, 3] }], (a) => k.repeat(a, 2, 2, 1), 1, dev);
      gradcheck("tile", [{ shape: [3] }], (a) => k.tile(a, [2, 2]), 2, dev);
      gradcheck("repeatInterleave", [{ shape: [2, 3] }], (a) => k.repeatInterleave(a, 3, 1), 3, dev);
    });
  });

  describe("pad", () => {
    it("constant: last dim first, a fill value, negative amounts crop, empty pads copy", () => {
      const x = rnd(shape, 6);
      const v = x.toList();
      // [1, 2] on the last dim, [0, 1] on dim 1
      const want = gatherRef(v, shape, [2, 4, 7], ([a, b, c]) => (b! < 3 && c! >= 1 && c! < 5 ? [a!, b!, c! - 1] : null), -1);
      assertClose(k.pad(x, [1, 2, 0, 1], "constant", -1), want, { shape: [2, 4, 7] });
      // crop 1 left and 2 right of the last dim, pad 2 before dim 0
      const crop = gatherRef(v, shape, [4, 3, 1], ([a, b, c]) => (a! >= 2 ? [a! - 2, b!, c! + 1] : null));
      assertClose(k.pad(x, [-1, -2, 0, 0, 2, 0]), crop, { shape: [4, 3, 1] });
      const same = k.pad(x, []);
      assertClose(same, v, { shape });
      assert.notEqual(same.storage, x.storage, "a copy");
      assert.deepEqual(k.pad(k.tensor([1, 2], { device: dev }), [1, 2]).toList(), [0, 1, 2, 0, 0]);
      assert.equal(k.pad(k.tensor(Int32Array.of(1, 2), { device: dev }), [1, 0], "constant", 7).dtype, "int32");
    });
    it("reflect / replicate / circular", () => {
      const x = k.tensor([[1, 2, 3], [4, 5, 6]], { device: dev });
      assert.deepEqual(k.pad(x, [2, 1], "reflect").toList(), [3, 2, 1, 2, 3, 2, 6, 5, 4, 5, 6, 5]);
      assert.deepEqual(k.pad(x, [1, 2], "replicate").toList(), [1, 1, 2, 3, 3, 3, 4, 4, 5, 6, 6, 6]);
      assert.deepEqual(k.pad(x, [2, 1], "circular").toList(), [2, 3, 1, 2, 3, 1, 5, 6, 4, 5, 6, 4]);
      assert.deepEqual(k.pad(x, [0, 0, 1, 1], "reflect").toList(), [4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3]);
    });
    it("errors", () => {
      const x = k.ones([2, 3], { device: dev });
      assert.throws(() => k.pad(x, [1]), named("pad", "divisible by 2"));
      assert.throws(() => k.pad(x, [1, 1, 1, 1, 1, 1]), named("pad", "too large"));
      assert.throws(() => k.pad(x, [-2, -2]), named("pad", "crops more"));
      assert.throws(() => k.pad(x, [3, 0], "reflect"), named("pad", "must be <"));
      assert.throws(() => k.pad(x, [-1, 0], "replicate"), named("pad", "negative padding"));
      assert.throws(() => k.pad(x, [1, 0], "reflect", 2), named("pad", "value"));
    });
    it("gradients", () => {
      gradcheck("pad constant", [{ shape: [2, 3] }], (a) => k.pad(a, [1, -1, 2, 0], "constant", 0.5), 1, dev);
      gradcheck("pad reflect", [{ shape: [2, 4] }], (a) => k.pad(a, [2, 3], "reflect"), 2, dev);
      gradcheck("pad replicate", [{ shape: [2, 3] }], (a) => k.pad(a, [2, 1, 1, 0], "replicate"), 3, dev);
      gradcheck("pad circular", [{ shape: [3] }], (a) => k.pad(a, [3, 2], "circular"), 4, dev);
    });
  });

  it("frees every temporary (forward and backward)", () => {
    const cases: [string, (x: Tensor) => Tensor][] = [
      ["flip", (x) => k.flip(x, [0, 1])],
      ["flip none", (x) => k.flip(x, [])],
      ["roll", (x) => k.roll(x, [1, 2], [0, 1])],
      ["roll flat", (x) => k.roll(x, 5)],
      ["repeat", (x) => k.repeat(x, 2, 1, 2)],
      ["tile", (x) => k.tile(x, [2])],
      ["repeatInterleave", (x) => k.repeatInterleave(x, 2)],
      ["pad constant", (x) => k.pad(x, [1, -1, 2, 1], "constant", 3)],
      ["pad reflect", (x) => k.pad(x, [1, 1, 1, 0], "reflect")],
      ["pad replicate", (x) => k.pad(x, [2, 0], "replicate")],
      ["pad circular", (x) => k.pad(x, [0, 2], "circular")],
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
