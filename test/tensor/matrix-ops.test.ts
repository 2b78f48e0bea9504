// tril / triu / diagonal / diag / trace / outer / addmm / baddbmm / einsum: values against plain JS loops,
// gradients against finite differences, errors, and no leaked buffers.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import * as k from "../../src/tensor/index.js";
import type { Tensor } from "../../src/tensor/index.js";
import { OpError } from "../../src/util/errors.js";
import { assertClose, assertNoLeaks, forEachBackend, randomValues } from "./suite.js";
import { gradcheck } from "./gradcheck-helper.js";

/** Row-major strides of a shape. */
const stridesOf = (shape: readonly number[]) => shape.map((_, i) => shape.slice(i + 1).reduce((a, b) => a * b, 1));

/**
 * einsum by brute force: every assignment of every label, products of the operands' entries summed into the output
 * (explicit letter-only equations; a repeated label reads a diagonal by construction).
 */
function einsumRef(equation: string, data: ArrayLike<number>[], shapes: number[][]): { values: number[]; shape: number[] } {
  const [lhs, rhs] = equation.split("->") as [string, string];
  const terms = lhs.split(",");
  const size = new Map<string, number>();
  terms.forEach((term, i) => [...term].forEach((l, d) => size.set(l, Math.max(size.get(l) ?? 1, shapes[i]![d]!))));
  const labels = [...size.keys()];
  const outShape = [...rhs].map((l) => size.get(l)!);
  const outStrides = stridesOf(outShape);
  const values = new Array<number>(outShape.reduce((a, b) => a * b, 1)).fill(0);
  const at = new Map<string, number>();
  const visit = (li: number): void => {
    if (li < labels.length) {
      for (let v = 0; v < size.get(labels[li]!)!; v++) {
        at.set(labels[li]!, v);
        visit(li + 1);
      }
      return;
    }
    let p = 1;
    terms.forEach((term, i) => {
      const st = stridesOf(shapes[i]!);
      // a size-1 dim broadcasts: it reads index 0
      p *= data[i]![[...term].reduce((o, l, d) => o + (shapes[i]![d] === 1 ? 0 : at.get(l)!) * st[d]!, 0)]!;
    });
    values[[...rhs].reduce((o, l, d) => o + at.get(l)! * outStrides[d]!, 0)]! += p;
  };
  visit(0);
  return { values, shape: outShape };
}

forEachBackend((dev) => {
  const rnd = (shape: number[], seed: number, opts: { requiresGrad?: boolean } = {}) =>
    k.tensor(randomValues(shape.reduce((a, b) => a * b, 1), seed), { shape, device: dev, ...opts });
  const named = (op: string, text?: string) => (e: unknown) => e instanceof OpError && e.op === op && (text === undefined || e.message.includes(text));

  describe("tril / triu", () => {
    it("keep the band j - i <= d (tril) or >= d (triu) of each matrix in a batch", () => {
      const shape = [2, 3, 4];
      const x = rnd(shape, 1);
      const data = x.toList();
      for (const d of [-1, 0, 2, 5, -4]) {
        const lower = data.map((v, e) => ((e % 4) - Math.floor(e / 4) % 3 <= d ? v : 0));
        const upper = data.map((v, e) => ((e % 4) - Math.floor(e / 4) % 3 >= d ? v : 0));
        assertClose(k.tril(x, d), lower, { shape, msg: `tril ${d}` });
        assertClose(x.triu(d), upper, { shape, msg: `triu ${d}` });
      }
      assertClose(k.tril(k.tensor([[1, 2], [3, 4]], { device: dev })), [1, 0, 3, 4]);
    });
    it("keep the dtype, refuse fewer than 2 dims", () => {
      const i = k.tensor(Int32Array.of(1, 2, 3, 4), { shape: [2, 2], device: dev });
      assert.equal(k.triu(i).dtype, "int32");
      assert.deepEqual(k.triu(i).toList(), [1, 2, 0, 4]);
      assert.throws(() => k.tril(k.ones([3], { device: dev })), (e: unknown) => e instanceof OpError && e.message === "[tril] expects at least 2 dims, got [3]");
      assert.throws(() => k.triu(k.ones([], { device: dev })), named("triu"));
    });
    it("gradients", () => {
      gradcheck("tril", [{ shape: [2, 3, 3] }], (a) => k.tril(a, -1), 1, dev);
      gradcheck("triu", [{ shape: [3, 4] }], (a) => a.triu(1), 2, dev);
    });
  });

  describe("diagonal / diag / trace", () => {
    it("diagonal of any two dims with offsets, moved last (a view)", () => {
      const x = rnd([3, 4], 3);
      const v = x.toList();
      for (const off of [-3, -2, -1, 0, 1, 2, 3, 4]) {
        const want: number[] = [];
        for (let i = 0; i < 3; i++) if (i + off >= 0 && i + off < 4) want.push(v[i * 4 + i + off]!);
        assertClose(k.diagonal(x, off), want, { msg: `offset ${off}`, shape: [want.length] });
      }
      const b = rnd([2, 3, 4], 4);
      const bv = b.toList();
      // dims (2, 1): entries b[n, i + off... ] with dim1 = 2 (rows) and dim2 = 1 (cols): b[n, j, i] with j = i + 1
      const got = b.diagonal(1, -1, 1);
      const want: number[] = [];
      for (let n = 0; n < 2; n++) for (let i = 0; i < 4; i++) if (i + 1 < 3) want.push(bv[n * 12 + (i + 1) * 4 + i]!);
      assertClose(got, want, { shape: [2, 2] });
      assert.equal(k.diagonal(x).storage, x.storage, "a view of a contiguous input");
      assert.throws(() => k.diagonal(x, 0, 1, -1), named("diagonal", "cannot be identical"));
      assert.throws(() => k.diagonal(k.ones([3], { device: dev })), named("diagonal", "at least 2 dims"));
    });
    it("diag: 1-d to a matrix with offsets, 2-d to its diagonal; trace", () => {
      assert.deepEqual(k.diag(k.tensor([1, 2], { device: dev })).toList(), [1, 0, 0, 2]);
      assertClose(k.diag(k.tensor([1, 2], { device: dev }), 1), [0, 1, 0, 0, 0, 2, 0, 0, 0], { shape: [3, 3] });
      assertClose(k.diag(k.tensor([1, 2], { device: dev }), -2), [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 2, 0, 0], { shape: [4, 4] });
      const m = k.tensor([[1, 2, 3], [4, 5, 6]], { device: dev });
      assert.deepEqual(m.diag().toList(), [1, 5]);
      assert.deepEqual(m.diag(1).toList(), [2, 6]);
      assert.deepEqual(m.diag(-1).toList(), [4]);
      assert.equal(m.trace().item(), 6);
      assert.throws(() => k.diag(k.ones([2, 2, 2], { device: dev })), named("diag"));
    });
    it("gradients", () => {
      gradcheck("diagonal", [{ shape: [3, 4] }], (a) => a.diagonal(-1), 1, dev);
      gradcheck("diagonal batched", [{ shape: [2, 3, 3] }], (a) => k.diagonal(a, 1, 2, 1), 2, dev);
      gradcheck("diag 1-d", [{ shape: [3] }], (a) => k.diag(a, -1), 3, dev);
      gradcheck("trace", [{ shape: [3, 3] }], (a) => a.trace(), 4, dev);
    });
  });

  describe("outer / addmm / baddbmm", () => {
    it("outer", () => {
      assertClose(k.outer(k.tensor([1, 2], { device: dev }), k.tensor([3, 4, 5], { device: dev })), [3, 4, 5, 6, 8, 10], { shape: [2, 3] });
      assert.throws(() => k.outer(k.ones([2, 1], { device: dev }), k.ones([2], { device: dev })), named("outer"));
    });
    it("addmm = beta * input + alpha * a @ b with a broadcast input; beta = 0 ignores NaN", () => {
      const a = rnd([2, 3], 5);
      const b = rnd([3, 4], 6);
      const bias = rnd([4], 7);
      const [av, bv, cv] = [a.toList(), b.toList(), bias.toList()];
      const want = (beta: number, alpha: number) => Array.from({ length: 8 }, (_, e) => {
        const [i, j] = [Math.floor(e / 4), e % 4];
        let s = 0;
        for (let q = 0; q < 3; q++) s += av[i * 3 + q]! * bv[q * 4 + j]!;
        return beta * cv[j]! + alpha * s;
      });
      assertClose(k.addmm(bias, a, b), want(1, 1), { shape: [2, 4], rtol: 1e-5, atol: 1e-5 });
      assertClose(bias.addmm(a, b, { beta: 0.5, alpha: -2 }), want(0.5, -2), { rtol: 1e-5, atol: 1e-5 });
      const nan = k.full([2, 4], NaN, { device: dev });
      assertClose(k.addmm(nan, a, b, { beta: 0 }), want(0, 1), { rtol: 1e-5, atol: 1e-5 });
      assert.throws(() => k.addmm(k.ones([3], { device: dev }), a, b), named("addmm", "cannot be broadcast"));
      assert.throws(() => k.addmm(bias, a, k.ones([3], { device: dev })), named("addmm", "2-d"));
    });
    it("baddbmm", () => {
      const b1 = rnd([2, 2, 3], 8);
      const b2 = rnd([2, 3, 2], 9);
      const input = rnd([2, 1, 2], 10);
      const ref = einsumRef("bij,bjk->bik", [b1.toList(), b2.toList()], [[2, 2, 3], [2, 3, 2]]).values;
      const inp = input.toList();
      const want = ref.map((v, e) => 3 * inp[Math.floor(e / 4) * 2 + (e % 2)]! + 0.5 * v);
      assertClose(k.baddbmm(input, b1, b2, { beta: 3, alpha: 0.5 }), want, { shape: [2, 2, 2], rtol: 1e-5, atol: 1e-5 });
      assert.throws(() => k.baddbmm(input, b1.select(0, 0), b2), named("baddbmm"));
    });
    it("gradients", () => {
      gradcheck("outer", [{ shape: [3] }, { shape: [4] }], (a, b) => k.outer(a, b), 1, dev);
      gradcheck("addmm", [{ shape: [1, 4] }, { shape: [2, 3] }, { shape: [3, 4] }], (c, a, b) => k.addmm(c, a, b, { beta: 0.5, alpha: 2 }), 2, dev);
      gradcheck("baddbmm", [{ shape: [2] }, { shape: [2, 2, 3] }, { shape: [2, 3, 2] }], (c, a, b) => k.baddbmm(c, a, b, { alpha: -1 }), 3, dev);
    });
  });

  describe("einsum", () => {
    const check = (eq: string, refEq: string, shapes: number[][], seed = 1) => {
      const xs = shapes.map((s, i) => rnd(s, seed + i));
      const ref = einsumRef(refEq, xs.map((x) => x.toList()), shapes);
      assertClose(k.einsum(eq, ...xs), ref.values, { shape: ref.shape, rtol: 1e-4, atol: 1e-5, msg: eq });
    };
    it("explicit outputs: matmul, batch, transpose, traces, diagonals, outer, sums", () => {
      check("ij,jk->ik", "ij,jk->ik", [[2, 3], [3, 4]]);
      check("bij,bjk->bik", "bij,bjk->bik", [[2, 2, 3], [2, 3, 4]]);
      check("ij->ji", "ij->ji", [[2, 3]]);
      check("ii->", "ii->", [[3, 3]]);
      check("ii->i", "ii->i", [[3, 3]]);
      check("iij->ji", "iij->ji", [[2, 2, 3]]);
      check("i,j->ij", "i,j->ij", [[2], [3]]);
      check("ij->", "ij->", [[2, 3]]);
      check("ij->j", "ij->j", [[2, 3]]);
      check("bhqd,bhkd->bhqk", "bhqd,bhkd->bhqk", [[1, 2, 3, 4], [1, 2, 2, 4]]);
      check("ij,jk,kl->il", "ij,jk,kl->il", [[2, 3], [3, 2], [2, 4]]);
      check("ab,cd,bd->ac", "ab,cd,bd->ac", [[2, 3], [4, 2], [3, 2]]);
      check("i,i->", "i,i->", [[5], [5]]);
      check("ijk,ik->j", "ijk,ik->j", [[2, 3, 2], [2, 2]]);
      check("  ij , jk -> ki ", "ij,jk->ki", [[2, 3], [3, 2]]);
    });
    it("implicit outputs: the labels used once, alphabetical (upper case first)", () => {
      check("ij,jk", "ij,jk->ik", [[2, 3], [3, 4]]);
      check("ba", "ba->ab", [[2, 3]]);
      check("ii", "ii->", [[3, 3]]);
      check("i,i", "i,i->", [[4], [4]]);
      check("bA,Ac", "bA,Ac->bc", [[2, 3], [3, 2]]);
      check("aB", "aB->Ba", [[2, 3]]);
    });
    it("ellipsis: batch dims broadcast, kept first in implicit mode, summed when the output omits them", () => {
      check("...ij,...jk->...ik", "aij,ajk->aik", [[2, 3, 4], [2, 4, 2]]);
      check("...ij,jk", "aij,jk->aik", [[2, 3, 4], [4, 2]]);
      check("...ij,...jk", "abij,bjk->abik", [[2, 1, 2, 3], [3, 3, 2]]);
      check("i...->...", "ia->a", [[3, 2]]);
      check("...ij->ij", "aij->ij", [[2, 3, 2]]);
      check("...,...->...", "a,a->a", [[3], [3]]);
      check("b...i,bi->b...", "bxi,bi->bx", [[2, 3, 4], [2, 4]]);
    });
    it("operands as one array, and 0-d operands", () => {
      const a = rnd([2, 3], 1);
      const b = rnd([3], 2);
      assertClose(k.einsum("ij,j->i", [a, b]), k.matmul(a, b).toList(), { rtol: 1e-5 });
      const s = k.tensor(2, { device: dev });
      assertClose(k.einsum(",ij->ij", s, a), a.mul(2).toList());
      const same = k.einsum("ij->ij", a);
      assert.notEqual(same, a);
      same.dispose();
      assert.equal(a.isDisposed, false, "the result is never an operand itself");
    });
    it("errors name einsum", () => {
      const a = k.ones([2, 3], { device: dev });
      assert.throws(() => k.einsum("ij,jk->ik", a), named("einsum", "2 operand terms but 1"));
      assert.throws(() => k.einsum("ijk->i", a), named("einsum", "3 subscripts for a 2-d operand"));
      assert.throws(() => k.einsum("i1->i", a), named("einsum", "invalid subscript"));
      assert.throws(() => k.einsum("ij->k", a), named("einsum", "does not appear"));
      assert.throws(() => k.einsum("ij->ii", a), named("einsum", "more than once"));
      assert.throws(() => k.einsum("ij,ij->i", a, k.ones([3, 3], { device: dev })), named("einsum", "does not broadcast"));
      assert.throws(() => k.einsum("ii->i", a), named("einsum", "sizes don't match"));
      assert.throws(() => k.einsum("i->i->i", a), named("einsum"));
      assert.throws(() => k.einsum("...i...->i", a), named("einsum", "more than one ellipsis"));
    });
    it("gradients", () => {
      gradcheck("einsum matmul", [{ shape: [2, 3] }, { shape: [3, 2] }], (a, b) => k.einsum("ij,jk->ik", a, b), 1, dev);
      gradcheck("einsum diagonal", [{ shape: [3, 3] }], (a) => k.einsum("ii->i", a), 2, dev);
      gradcheck("einsum three", [{ shape: [2, 3] }, { shape: [3, 2] }, { shape: [2, 2] }], (a, b, c) => k.einsum("ij,jk,kl->li", a, b, c), 3, dev);
      gradcheck("einsum ellipsis broadcast", [{ shape: [2, 1, 2, 3] }, { shape: [2, 3, 2] }], (a, b) => k.einsum("...ij,...jk", a, b), 4, dev);
    });
  });

  it("frees every temporary (forward and backward)", () => {
    const cases: [string, (...xs: Tensor[]) => Tensor, number[][]][] = [
      ["tril", (a) => k.tril(a, 1), [[3, 4]]],
      ["diagonal", (a) => k.diagonal(a, 1, 0, 1), [[3, 4]]],
      ["diag", (a) => k.diag(a, 1), [[3]]],
      ["trace", (a) => k.trace(a), [[3, 3]]],
      ["outer", (a, b) => k.outer(a, b), [[2], [3]]],
      ["addmm", (c, a, b) => k.addmm(c, a, b, { beta: 2, alpha: 3 }), [[4], [2, 3], [3, 4]]],
      ["baddbmm", (c, a, b) => k.baddbmm(c, a, b), [[1], [2, 2, 3], [2, 3, 2]]],
      ["einsum", (a, b, c) => k.einsum("ij,jk,kk->ik", a, b, c), [[2, 3], [3, 2], [2, 2]]],
      ["einsum ellipsis", (a, b) => k.einsum("...ij,...jk", a, b), [[2, 1, 2, 3], [3, 3, 2]]],
      ["einsum identity", (a) => k.einsum("ij", a), [[2, 3]]],
    ];
    for (const [name, fn, shapes] of cases)
      assertNoLeaks(dev, name, () => {
        const xs = shapes.map((s, i) => rnd(s, i + 1, { requiresGrad: true }));
        const out = fn(...xs);
        const loss = out.sum();
        loss.backward();
        return [...xs, ...xs.map((x) => x.grad), out, loss];
      });
  });
}, { modes: true });
