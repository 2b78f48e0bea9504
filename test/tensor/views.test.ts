// Views share storage as in PyTorch; in-place ops write through views; view() refuses what needs a copy.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import * as k from "../../src/tensor/index.js";
import { OpError } from "../../src/util/errors.js";
import { forEachBackend, values } from "./suite.js";

forEachBackend((dev) => {
  /** [rows, cols] float32 tensor holding 0..rows*cols-1. */
  const grid = (...shape: number[]) => k.arange(shape.reduce((a, b) => a * b, 1), undefined, 1, { device: dev, dtype: "float32" }).reshape(...shape);

  describe("views share storage", () => {
    it("view / reshape / flatten / squeeze / unsqueeze of a contiguous tensor", () => {
      const base = grid(2, 3);
      const cases = [base.view(3, 2), base.view(-1), base.reshape(6, 1), base.flatten(), base.unsqueeze(0), base.unsqueeze(-1), base.view(1, 2, 1, 3).squeeze(), base.view(1, 6).squeeze(0)];
      for (const v of cases) assert.equal(v.storage, base.storage, `[${v.shape.join(", ")}] shares storage`);
      assert.deepEqual([...base.unsqueeze(1).shape], [2, 1, 3]);
      assert.deepEqual([...base.view(1, 2, 1, 3).squeeze(2).shape], [1, 2, 3]);
      assert.deepEqual([...base.view(1, 2, 1, 3).squeeze(1).shape], [1, 2, 1, 3], "squeeze of a non-1 dim is a no-op");
      assert.deepEqual(values(base.view(3, 2)), [0, 1, 2, 3, 4, 5]);
      assert.deepEqual([...k.flatten(grid(2, 3, 4), 1).shape], [2, 12]);
      assert.deepEqual([...k.flatten(grid(2, 3, 4), 0, 1).shape], [6, 4]);
      assert.deepEqual([...k.tensor(5, { device: dev }).flatten().shape], [1]);
    });

    it("permute / transpose / T / narrow / slice with step / select / expand", () => {
      const base = grid(2, 3, 4);
      const p = base.permute(2, 0, 1);
      assert.deepEqual([...p.shape], [4, 2, 3]);
      assert.deepEqual([...p.strides], [1, 12, 4]);
      assert.equal(p.storage, base.storage);
      assert.equal(p.isContiguous, false);
      assert.deepEqual(values(p.select(0, 1)), [1, 5, 9, 13, 17, 21]);
      const g3 = grid(2, 3, 4);
      assert.deepEqual([...g3.T.shape], [4, 3, 2], "T reverses every dim, as torch's");
      assert.deepEqual([...g3.mT.shape], [2, 4, 3], "mT swaps the last two");
      assert.deepEqual(values(g3.mT.select(0, 1).select(0, 2)), values(g3.select(0, 1).select(1, 2)));
      assert.deepEqual([...grid(5).T.shape], [5]);
      const tr = grid(2, 3).T;
      assert.deepEqual(values(tr), [0, 3, 1, 4, 2, 5]);
      assert.deepEqual(values(grid(2, 3).transpose(0, 1)), [0, 3, 1, 4, 2, 5]);
      const n = base.narrow(2, 1, 2);
      assert.deepEqual([...n.shape], [2, 3, 2]);
      assert.equal(n.offset, 1);
      assert.deepEqual(values(n.select(0, 1).select(0, 2)), [21, 22]);
      assert.deepEqual(values(base.narrow(-1, -2, 2).select(0, 0).select(0, 0)), [2, 3], "negative start counts from the end");
      const r = k.arange(10, undefined, 1, { device: dev });
      assert.deepEqual(values(r.slice(0, 1, 8, 3)), [1, 4, 7]);
      assert.deepEqual(values(r.slice(0, 0, undefined, 4)), [0, 4, 8]);
      assert.deepEqual(values(r.slice(0, -3)), [7, 8, 9]);
      assert.deepEqual(values(r.slice(0, 8, 100)), [8, 9], "end clamps");
      assert.deepEqual(values(r.slice(0, 5, 2)), [], "empty when end < start");
      assert.deepEqual(values(grid(3, 4).slice(1, 1, 4, 2).slice(0, 0, 3, 2)), [1, 3, 9, 11]);
      assert.equal(grid(3, 4).select(1, -1).item !== undefined, true);
      assert.deepEqual(values(grid(3, 4).select(1, -1)), [3, 7, 11]);
      const e = k.tensor([[1], [2]], { device: dev }).expand(2, 3);
      assert.deepEqual([...e.strides], [1, 0]);
      assert.deepEqual(values(e), [1, 1, 1, 2, 2, 2]);
      assert.deepEqual(values(k.tensor([1, 2], { device: dev }).expand(2, -1)), [1, 2, 1, 2]);
      assert.deepEqual([...k.tensor([1, 2], { device: dev }).expand(3, 1, 2).shape], [3, 1, 2]);
      // a negative or fractional size is refused by expand itself (it made a view of shape [-2] that failed later)
      for (const bad of [[-2], [1.5], [2, -3]])
        assert.throws(() => k.tensor([1], { device: dev }).expand(...bad), /\[expand\] cannot expand \[1\] to .*non-negative integers/);
      for (const v of [tr, n, e, r.slice(0, 1, 8, 3)]) assert.ok(v.storage !== undefined);
      assert.equal(r.slice(0, 1, 8, 3).storage, r.storage);
    });

    it("an empty tensor views as any shape of 0 elements; flatten refuses start_dim after end_dim (torch's rules)", () => {
      const e = k.zeros([0, 3], { device: dev }).T; // non-contiguous strides, no elements
      for (const shape of [[3, 0], [0], [0, 5, 2]]) {
        const v = e.view(shape);
        assert.deepEqual([...v.shape], shape);
        assert.equal(v.storage, e.storage, `[${shape.join(", ")}] is a view`);
      }
      assert.throws(() => e.view(1), /\[view\] shape \[1\] is invalid for 0 elements/);
      assert.throws(() => grid(2, 3, 4).flatten(2, 1), /\[flatten\] flatten\(\) has invalid args: start_dim \(2\) cannot come after end_dim \(1\)/);
      assert.throws(() => grid(2, 3, 4).flatten(-1, 0), /start_dim \(-1\) cannot come after end_dim \(0\)/);
      assert.deepEqual([...grid(2, 3, 4).flatten(1, 1).shape], [2, 3, 4]);
    });

    it("contiguous returns itself when contiguous, a copy otherwise", () => {
      const base = grid(2, 3);
      assert.equal(base.contiguous(), base);
      const t = base.T;
      const c = t.contiguous();
      assert.notEqual(c.storage, base.storage);
      assert.equal(c.isContiguous, true);
      assert.deepEqual(values(c), [0, 3, 1, 4, 2, 5]);
      const cl = base.clone();
      assert.notEqual(cl.storage, base.storage);
      cl.fill_(0);
      assert.deepEqual(values(base), [0, 1, 2, 3, 4, 5], "clone does not alias");
      // a sliced view is contiguous but offset: contiguous() keeps the view
      const row = base.select(0, 1);
      assert.equal(row.isContiguous, true);
      assert.equal(row.contiguous(), row);
      assert.deepEqual(values(row), [3, 4, 5]);
    });

    it("view() of an incompatible non-contiguous tensor throws; reshape copies", () => {
      const t = grid(2, 3).T; // [3,2] strides [1,3]
      assert.throws(() => t.view(6), (e: unknown) => e instanceof OpError && e.op === "view" && /reshape/.test(e.message));
      const r = t.reshape(6);
      assert.notEqual(r.storage, t.storage);
      assert.deepEqual(values(r), [0, 3, 1, 4, 2, 5]);
      // compatible non-contiguous views do not copy: splitting / merging dims that stay contiguous
      const p = grid(2, 3, 4).permute(1, 0, 2); // [3,2,4] strides [4,12,1]
      const v = p.view(3, 2, 2, 2);
      assert.equal(v.storage, p.storage);
      assert.deepEqual([...v.strides], [4, 12, 2, 1]);
      assert.deepEqual(values(v), values(p));
      assert.throws(() => p.view(6, 4), OpError);
      const rs = p.reshape(6, 4);
      assert.deepEqual(values(rs), values(p));
      // a strided slice can split its dim
      const s = k.arange(12, undefined, 1, { device: dev }).slice(0, 0, 12, 2); // 6 elements, stride 2
      const sv = s.view(2, 3);
      assert.equal(sv.storage, s.storage);
      assert.deepEqual(values(sv), [0, 2, 4, 6, 8, 10]);
      assert.throws(() => grid(2, 3).view(4), OpError);
      assert.throws(() => grid(2, 3).view(-1, -1), OpError);
    });
  });

  describe("in-place ops write through views", () => {
    it("add_ / mul_ / sub_ / div_ on a row, a column and a strided slice", () => {
      const base = grid(3, 4);
      base.select(0, 1).add_(100);
      base.select(1, 2).mul_(-1);
      base.slice(1, 0, 4, 3).select(0, 2).add_(k.tensor([1000, 2000], { device: dev }));
      assert.deepEqual(values(base), [0, 1, -2, 3, 104, 105, -106, 107, 1008, 9, -10, 2011]);
      const c = grid(2, 2);
      const tv = c.T;
      tv.sub_(k.tensor([1, 2], { device: dev })); // broadcast along tv's rows = c's columns
      assert.deepEqual(values(c), [-1, 0, 0, 1]);
      c.div_(2);
      assert.deepEqual(values(c), [-0.5, 0, 0, 0.5]);
      const chained = grid(2).add_(1).mul_(3);
      assert.deepEqual(values(chained), [3, 6]);
    });

    it("copy_ / fill_ through views, copy_ broadcasts and converts dtype", () => {
      const base = k.zeros([2, 3], { device: dev });
      base.select(1, 0).fill_(7);
      base.narrow(1, 1, 2).select(0, 1).copy_(k.tensor([5, 6], { device: dev, dtype: "int32" }));
      assert.deepEqual(values(base), [7, 0, 0, 7, 5, 6]);
      base.narrow(0, 0, 1).copy_(k.tensor([9], { device: dev }));
      assert.deepEqual(values(base), [9, 9, 9, 7, 5, 6]);
      const bf = k.zeros([2, 2], { device: dev, dtype: "bfloat16" });
      bf.T.copy_(k.tensor([[1, 2], [3, 4]], { device: dev }));
      assert.deepEqual(values(bf), [1, 3, 2, 4]);
      assert.throws(() => base.copy_(k.zeros([4], { device: dev })), OpError);
      // expanded view: refused, as torch refuses writing where several elements share one location
      const one = k.zeros([1], { device: dev });
      assert.throws(() => one.expand(4).fill_(3), /more than one element of the written-to tensor refers to a single memory location/);
      assert.deepEqual(values(one), [0]);
    });

    it("copy_ between overlapping views of one storage raises torch's error; the same view is a no-op", () => {
      const overlap = /\[copy_\] unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location/;
      const y = k.tensor([1, 2, 3, 4], { device: dev });
      assert.throws(() => y.slice(0, 1).copy_(y.slice(0, 0, 3)), overlap);
      const z = k.tensor([[1, 2], [3, 4]], { device: dev });
      assert.throws(() => z.copy_(z.T), overlap);
      assert.throws(() => z.copy_(z.select(0, 0)), overlap, "a broadcast source inside the destination");
      const g = grid(3, 4);
      assert.throws(() => g.narrow(1, 1, 3).copy_(g.narrow(1, 0, 3)), overlap, "strided views that share elements");
      assert.deepEqual(values(y), [1, 2, 3, 4], "nothing was written");
      assert.deepEqual(values(z), [1, 2, 3, 4]);
      // the same view: nothing to do; disjoint or interleaved regions of one storage copy normally
      z.copy_(z);
      y.slice(0, 2).copy_(y.slice(0, 0, 2));
      assert.deepEqual(values(y), [1, 2, 1, 2]);
      const s = k.tensor([1, 2, 3, 4, 5, 6], { device: dev });
      s.slice(0, 0, 6, 2).copy_(s.slice(0, 1, 6, 2));
      assert.deepEqual(values(s), [2, 2, 4, 4, 6, 6]);
      g.narrow(1, 0, 2).copy_(g.narrow(1, 2, 2));
      assert.deepEqual(values(g), [2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11]);
    });

    it("maskedFill_ and indexCopy_ through views", () => {
      const base = grid(2, 3);
      base.T.maskedFill_(k.tensor([[true, false], [false, false], [false, true]], { device: dev }), -1);
      assert.deepEqual(values(base), [-1, 1, 2, 3, 4, -1]);
      const m = k.zeros([4, 2], { device: dev });
      m.indexCopy_(0, k.tensor(new Int32Array([3, 1]), { device: dev }), k.tensor([[1, 2], [3, 4]], { device: dev }));
      assert.deepEqual(values(m), [0, 0, 3, 4, 0, 0, 1, 2]);
      const w = k.zeros([2, 5], { device: dev });
      const view = w.narrow(1, 1, 3); // [2,3] view of columns 1..3
      view.indexCopy_(1, k.tensor(new Int32Array([2, 0]), { device: dev }), k.tensor([[1, 2], [3, 4]], { device: dev }));
      assert.deepEqual(values(w), [0, 2, 0, 1, 0, 0, 4, 0, 3, 0]);
      k.indexCopyInto(w, 0, k.tensor(new Int32Array([0]), { device: dev }), k.ones([1, 5], { device: dev }));
      assert.deepEqual(values(w.select(0, 0)), [1, 1, 1, 1, 1]);
    });

    it("split and chunk pieces are views of the input", () => {
      const base = k.zeros([6], { device: dev });
      const [a, b] = k.split(base, [2, 4]);
      b!.fill_(1);
      a!.add_(5);
      assert.deepEqual(values(base), [5, 5, 1, 1, 1, 1]);
      const [, c2] = k.chunk(base, 3);
      c2!.fill_(9);
      assert.deepEqual(values(base), [5, 5, 9, 9, 1, 1]);
    });
  });
}, { modes: true });
