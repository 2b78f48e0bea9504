// index_select's (embedding's) backward on the device (index_add_rows): the gradient rows added into a zero table in
// index order, against sums written out by hand, on every back end, along dim 0 and the other dims, in float32 and
// bfloat16; and the kernel's id checks.
import assert from "node:assert/strict";
import { it } from "node:test";
import * as k from "../../src/tensor/index.js";
import { indexAddRowsInto } from "../../src/tensor/ops/indexing.js";
import { forEachBackend, values } from "./suite.js";

forEachBackend((device) => {
  it("embedding backward: each table row gets the sum of the gradient rows that looked it up (repeats included)", () => {
    const w = k.zeros([5, 3], { device, requiresGrad: true });
    const ids = k.tensor(Int32Array.of(2, 0, 2, 4, 2, 0), { device, shape: [2, 3] });
    // gradient row i = [i + 1, 10 (i + 1), 100 (i + 1)]
    const g = k.tensor(Float32Array.from({ length: 18 }, (_, j) => (Math.floor(j / 3) + 1) * 10 ** (j % 3)), { device, shape: [2, 3, 3] });
    k.embedding(ids, w).backward(g);
    // row 0: rows 1 and 5 (2 + 6 = 8); row 2: rows 0, 2, 4 (1 + 3 + 5 = 9); row 4: row 3 (4); rows 1 and 3: nothing
    assert.deepEqual(values(w.grad!), [8, 80, 800, 0, 0, 0, 9, 90, 900, 0, 0, 0, 4, 40, 400]);
    assert.equal(w.grad!.dtype, "float32");
  });

  it("index_select backward along an inner dim: each slice gets the sum of the gradient slices that picked it", () => {
    // x [2, 3, 2], index_select(dim 1, [2, 0, 2, 2]) -> [2, 4, 2]; gradient element (a, i, b) = (a + 1) * 10 ** i + b
    const x = k.zeros([2, 3, 2], { device, requiresGrad: true });
    const idx = k.tensor(Int32Array.of(2, 0, 2, 2), { device });
    const g = k.tensor(Float32Array.from({ length: 16 }, (_, j) => (Math.floor(j / 8) + 1) * 10 ** (Math.floor(j / 2) % 4) + (j % 2)), { device, shape: [2, 4, 2] });
    k.indexSelect(x, 1, idx).backward(g);
    // a = 0: slice 0 <- i = 1 (10, 11); slice 1 <- none; slice 2 <- i = 0, 2, 3 (1 + 100 + 1000 = 1101, 1104)
    // a = 1: doubled (2 * 10 ** i) + b: slice 0 (20, 21), slice 2 (2202, 2205)
    assert.deepEqual(values(x.grad!), [10, 11, 0, 0, 1101, 1104, 20, 21, 0, 0, 2202, 2205]);
    // the last dim, in bfloat16 (sums exact in bf16's 8 bits): y [2, 2] = x[:, [1, 1, 0]]
    const y = k.zeros([2, 2], { device, dtype: "bfloat16", requiresGrad: true });
    const gy = k.tensor(Float32Array.of(1, 2, 4, 8, 16, 32), { device, shape: [2, 3] }).to("bfloat16");
    k.indexSelect(y, 1, k.tensor(Int32Array.of(1, 1, 0), { device })).backward(gy);
    assert.equal(y.grad!.dtype, "bfloat16");
    assert.deepEqual(values(y.grad!), [4, 3, 32, 24]);
  });

  it("index_add_ rows: adds in place in index order, refuses ids outside the table", () => {
    const t = k.tensor(Float32Array.of(1, 1, 2, 2, 3, 3), { device, shape: [3, 2] });
    indexAddRowsInto(t, k.tensor(Int32Array.of(2, 2, 0), { device }), k.tensor(Float32Array.of(0.5, 1, 0.25, 2, 10, 20), { device, shape: [3, 2] }));
    assert.deepEqual(values(t), [11, 21, 2, 2, 3.75, 6]);
    assert.throws(() => {
      indexAddRowsInto(t, k.tensor(Int32Array.of(3), { device }), k.tensor(Float32Array.of(1, 1), { device, shape: [1, 2] }));
      t.dataSync();
    }, /out of range/);
    assert.throws(() => indexAddRowsInto(t, k.tensor(Int32Array.of(0, 1), { device }), k.tensor(Float32Array.of(1, 1), { device, shape: [1, 2] })), /does not hold 2 rows of 2/);
  });
});
