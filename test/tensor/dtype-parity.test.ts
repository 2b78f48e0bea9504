// Result dtypes and rounding of ops on 16-bit floats, against torch's rules written out by hand: reductions and row
// ops keep bf16 / f16, a 0-d tensor operand only raises the category, scalar arithmetic and mean run in float32 and
// round once, index_select keeps bf16.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import * as k from "../../src/tensor/index.js";
import type { DType, Tensor } from "../../src/tensor/index.js";
import { forEachBackend } from "./suite.js";

/** bf16(x): round to nearest even at 8 significant bits (normal range), as torch's bfloat16. */
function bf16(x: number): number {
  const e = Math.floor(Math.log2(Math.abs(x)));
  const ulp = 2 ** (e - 7);
  const q = x / ulp;
  const r = Math.round(q);
  return (Math.abs(q % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r) * ulp;
}

forEachBackend((dev) => {
  const t = (data: Parameters<typeof k.tensor>[0], dtype: DType) => k.tensor(data, { device: dev, dtype });

  describe("16-bit float dtypes", () => {
    for (const dt of ["bfloat16", "float16"] as const) {
      it(`${dt}: reductions, softmax and elementwise ops keep it; comparisons give bool`, () => {
        const x = t([[1, -2, 3], [0.5, 4, -1]], dt);
        const kept: [string, Tensor][] = [
          ["sum", x.sum()], ["sum dim", x.sum(1)], ["mean", x.mean()], ["mean dims", x.mean([0, 1], true)], ["prod", k.prod(x, 0)],
          ["max", x.max(1)], ["min", k.min(x)], ["cumsum", k.cumsum(x, 1)], ["logsumexp", k.logsumexp(x, 1)],
          ["softmax", x.softmax(0)], ["log_softmax", k.logSoftmax(x, 1)], ["sort", k.sort(x, 1).values], ["topk", k.topk(x, 2).values],
          ["exp", x.exp()], ["neg", x.neg()], ["clamp", x.clamp(0, 1)], ["where", k.where(x.gt(0), x, 0)], ["mul scalar", x.mul(0.5)],
          ["layer_norm", k.layerNorm(x, 3)], ["gather", x.gather(1, k.tensor(Int32Array.of(2, 0), { device: dev, shape: [2, 1] }))],
        ];
        for (const [name, r] of kept) assert.equal(r.dtype, dt, name);
        for (const r of [x.gt(0), x.eq(1), k.logicalNot(x.lt(0))]) assert.equal(r.dtype, "bool");
        // mixed 16-bit floats promote to float32, as torch's bf16 + f16
        assert.equal(x.add(t([1, 2, 3], dt === "bfloat16" ? "float16" : "bfloat16")).dtype, "float32");
        // indices are int32, Kiln's index dtype (torch: int64)
        for (const r of [x.argmax(1), k.argmin(x), k.sort(x, 1).indices]) assert.equal(r.dtype, "int32");
      });
    }

    it("mean of bf16 sums and divides in float32, rounding once (not sum rounded, then divided)", () => {
      // 3000 * bf16(0.1) = 300.29296875; rounding that sum to bf16 first (300) and dividing gave 0.099609375
      const x = k.full([3000], 0.1, { device: dev, dtype: "bfloat16" });
      assert.equal(bf16(0.1), 0.10009765625);
      assert.equal(x.mean().item(), bf16((3000 * bf16(0.1)) / 3000));
      assert.deepEqual(x.reshape(3, 1000).mean(1).toList(), [0.10009765625, 0.10009765625, 0.10009765625]);
    });

    it("arithmetic of a bf16 tensor and a JS scalar runs in float32 (torch's opmath): one rounding", () => {
      // bf16(3000) is 3008 (ties to even): 300 / bf16(3000) rounds to 0.099609375, torch's 300 / 3000 to bf16(0.1)
      assert.deepEqual(t([300], "bfloat16").div(3000).toList(), [bf16(0.1)]);
      assert.deepEqual(k.div(3000, t([30000], "bfloat16")).toList(), [bf16(3000 / bf16(30000))]);
      assert.equal(t([300], "bfloat16").div(3000).dtype, "bfloat16");
      // a comparison casts the scalar to the tensor's dtype, as torch: bf16(0.1) == 0.1
      assert.deepEqual(t([0.1, 0.2], "bfloat16").eq(0.1).toList(), [1, 0]);
    });

    it("a 0-d tensor next to a dimensioned one only raises the category (torch's dimension rule)", () => {
      const zeroD = (v: number, dtype: DType) => k.tensor(v, { device: dev, dtype });
      const cases: [string, Tensor, DType, number[]][] = [
        ["bf16[2] * f32[]", t([1.5, 2], "bfloat16").mul(zeroD(2.5, "float32")), "bfloat16", [3.75, 5]],
        ["f32[] + bf16[2]", zeroD(0.5, "float32").add(t([1, 2], "bfloat16")), "bfloat16", [1.5, 2.5]],
        ["int32[2] + int64[]", k.tensor(Int32Array.of(1, 2), { device: dev }).add(zeroD(5, "int64")), "int32", [6, 7]],
        ["int32[2] * f32[]", k.tensor(Int32Array.of(1, 2), { device: dev }).mul(zeroD(0.5, "float32")), "float32", [0.5, 1]],
        ["bool[2] + int32[]", t([true, false], "bool").add(zeroD(2, "int32")), "int32", [3, 2]],
        ["bf16[] * f32[] (both 0-d)", zeroD(1.5, "bfloat16").mul(zeroD(2, "float32")), "float32", [3]],
        ["bf16[2] * f32[1] (dimensioned)", t([1, 2], "bfloat16").mul(k.tensor([2], { device: dev })), "float32", [2, 4]],
        ["where(c, bf16[2], f32[])", k.where(t([true, false], "bool"), t([1, 2], "bfloat16"), zeroD(-1, "float32")), "bfloat16", [1, -1]],
      ];
      for (const [name, r, dtype, want] of cases) {
        assert.equal(r.dtype, dtype, name);
        assert.deepEqual(r.toList(), want, name);
      }
    });

    it("index_select keeps a bf16 table's dtype; embedding widens its rows to float32", () => {
      const table = t([[1.5, -2], [0.375, 3]], "bfloat16");
      const ids = k.tensor(Int32Array.of(1, 0, 1), { device: dev });
      const picked = k.indexSelect(table, 0, ids);
      assert.equal(picked.dtype, "bfloat16");
      assert.deepEqual(picked.toList(), [0.375, 3, 1.5, -2, 0.375, 3]);
      assert.deepEqual(k.indexSelect(table, 1, k.tensor(Int32Array.of(1), { device: dev })).toList(), [-2, 3]);
      const rows = k.embedding(ids, table);
      assert.equal(rows.dtype, "float32");
      assert.deepEqual(rows.toList(), picked.toList());
    });
  });
}, { modes: true });
