// Hand-computed cases for every op of the public tensor API, run on every available back end.
import assert from "node:assert/strict";
import { it, describe } from "node:test";
import * as k from "../../src/tensor/index.js";
import type { DType, Tensor } from "../../src/tensor/index.js";
import { assertClose, forEachBackend, prng, values } from "./suite.js";

forEachBackend((dev) => {
  const t = (data: Parameters<typeof k.tensor>[0], opts: Parameters<typeof k.tensor>[1] = {}) => k.tensor(data, { device: dev, ...opts });
  /** Tensor from a flat float array and shape. */
  const ft = (data: number[], shape: number[], dtype: DType = "float32") => k.tensor(Float32Array.from(data), { device: dev, shape, dtype });

  describe("construction", () => {
    it("int64 tensors keep values past int32's range (torch.tensor(..., dtype=int64))", () => {
      const big = [2 ** 31, 2 ** 40 + 1, -(2 ** 35) - 3, 2 ** 53 - 1];
      assert.deepEqual(t(big, { dtype: "int64" }).toList(), big);
      assert.deepEqual(k.tensor(Float64Array.from(big), { device: dev, dtype: "int64" }).toList(), big);
      assert.deepEqual(t([2.9, -2.9, 7], { dtype: "int64" }).toList(), [2, -2, 7]); // truncated toward zero, as before
    });
    it("view / reshape / permute / expand take a size list too, as torch does (t.view([2, 3]) = t.view(2, 3))", () => {
      const a = t([1, 2, 3, 4, 5, 6]);
      const same = (x: Tensor, shape: number[], vals: number[]) => assert.deepEqual([[...x.shape], values(x)], [shape, vals]);
      same(a.view([2, 3]), [2, 3], [1, 2, 3, 4, 5, 6]);
      same(a.reshape([3, 2]), [3, 2], [1, 2, 3, 4, 5, 6]);
      same(a.view(2, 3).permute([1, 0]), [3, 2], [1, 4, 2, 5, 3, 6]);
      same(t([7]).expand([3]), [3], [7, 7, 7]);
      same(t([7]).expand([2, 3]), [2, 3], [7, 7, 7, 7, 7, 7]);
    });
    it("tensor / zeros / ones / full / arange / like", () => {
      const a = t([[1, 2, 3], [4, 5, 6]]);
      assert.deepEqual([...a.shape], [2, 3]);
      assert.equal(a.dtype, "float32");
      assert.deepEqual(values(a), [1, 2, 3, 4, 5, 6]);
      assert.deepEqual(values(k.zeros([2, 2], { device: dev })), [0, 0, 0, 0]);
      assert.deepEqual(values(k.ones([3], { device: dev, dtype: "int32" })), [1, 1, 1]);
      assert.deepEqual(values(k.full([2], 7.5, { device: dev, dtype: "bfloat16" })), [7.5, 7.5]);
      assert.deepEqual(values(k.zerosLike(a)), [0, 0, 0, 0, 0, 0]);
      assert.deepEqual(values(k.onesLike(a)), [1, 1, 1, 1, 1, 1]);
      assert.deepEqual(values(k.fullLike(a, -2)), [-2, -2, -2, -2, -2, -2]);
      const r = k.arange(5, undefined, 1, { device: dev });
      assert.equal(r.dtype, "int32");
      assert.deepEqual(values(r), [0, 1, 2, 3, 4]);
      assert.deepEqual(values(k.arange(1, 2, 0.25, { device: dev })), [1, 1.25, 1.5, 1.75]);
      assert.deepEqual(values(k.arange(5, 0, -2, { device: dev })), [5, 3, 1]);
      assert.deepEqual(values(k.arange(3, 3, 1, { device: dev })), []);
      // torch refuses a range that runs against its step, and an infinite one, rather than returning it empty
      assert.throws(() => k.arange(0, 5, -1, { device: dev }), /\[arange\] upper bound and larger bound inconsistent with step sign/);
      assert.throws(() => k.arange(5, 0, 1, { device: dev }), /inconsistent with step sign/);
      assert.throws(() => k.arange(0, Infinity, 1, { device: dev }), /\[arange\] unsupported range/);
      // any fractional argument makes the result float32, the end included (torch: arange(2.5) is [0., 1., 2.])
      for (const r2 of [k.arange(2.5, undefined, 1, { device: dev }), k.arange(0, 2.5, 1, { device: dev }), k.arange(0, 1.5, 1, { device: dev })])
        assert.equal(r2.dtype, "float32");
      assert.deepEqual(values(k.arange(2.5, undefined, 1, { device: dev })), [0, 1, 2]);
      assert.deepEqual(values(k.arange(0, 1.5, 1, { device: dev })), [0, 1]);
      const s = t(3.5);
      assert.deepEqual([...s.shape], []);
      assert.equal(s.item(), 3.5);
      assert.equal(t([true, false]).dtype, "bool");
      const fb = k.fromBytes(new Uint8Array(new Int32Array([7, -1]).buffer), "int32", [2], { device: dev });
      assert.deepEqual(values(fb), [7, -1]);
    });
  });

  describe("elementwise", () => {
    it("binary arithmetic with broadcasting", () => {
      const a = t([[1, 2, 3], [4, 5, 6]]);
      const b = t([10, 20, 30]);
      assertClose(a.add(b), [11, 22, 33, 14, 25, 36], { shape: [2, 3] });
      assertClose(a.sub(b), [-9, -18, -27, -6, -15, -24]);
      assertClose(a.mul(b), [10, 40, 90, 40, 100, 180]);
      assertClose(a.div(b), [0.1, 0.1, 0.1, 0.4, 0.25, 0.2]);
      assertClose(a.add(b, 2), [21, 42, 63, 24, 45, 66]);
      // column [2,1] against row [1,3]: an outer sum
      const col = t([[1], [2]]);
      const row = t([[10, 20, 30]]);
      assertClose(col.add(row), [11, 21, 31, 12, 22, 32], { shape: [2, 3] });
      assertClose(row.sub(col), [9, 19, 29, 8, 18, 28], { shape: [2, 3] });
      // 0-d operand and rank extension
      assertClose(k.add(t(1), a), [2, 3, 4, 5, 6, 7], { shape: [2, 3] });
      assertClose(k.mul(ft([1, 2, 3, 4], [2, 1, 2]), ft([1, 10, 100], [3, 1])), [1, 2, 10, 20, 100, 200, 3, 4, 30, 40, 300, 400], { shape: [2, 3, 2] });
    });

    it("scalar operands on either side", () => {
      const a = t([1, 2, 4]);
      assertClose(k.sub(10, a), [9, 8, 6]);
      assertClose(k.div(1, a), [1, 0.5, 0.25]);
      assertClose(a.pow(2), [1, 4, 16]);
      assertClose(k.pow(2, a), [2, 4, 16]);
      assertClose(a.maximum(2), [2, 2, 4]);
      assertClose(a.minimum(2), [1, 2, 2]);
    });

    it("pow / maximum / minimum / remainder (sign of the divisor)", () => {
      assertClose(t([2, 3, 4]).pow(t([3, 0.5, -1])), [8, Math.sqrt(3), 0.25]);
      // C's (and torch's) pow, not JS's: 1 to any power and -1 to an infinite one are 1 (the reference back end gave NaN)
      assert.deepEqual(values(t([1, 1, -1, -1, NaN, -8]).pow(t([NaN, Infinity, Infinity, -Infinity, 0, 1 / 3]))), [1, 1, 1, 1, 1, NaN]);
      assertClose(t([1, 5, -3]).maximum(t([2, 4, -4])), [2, 5, -3]);
      assertClose(t([1, 5, -3]).minimum(t([2, 4, -4])), [1, 4, -4]);
      assertClose(k.remainder(t([7, -7, 7, -7, 5.5]), t([3, 3, -3, -3, 2])), [1, 2, -2, -1, 1.5]);
      // torch: fmod(a, b), plus b where the signs differ; an infinite divisor gave NaN for every a
      assert.deepEqual(values(k.remainder(t([5, -5, 5, -5, 1, Infinity]), t([Infinity, Infinity, -Infinity, -Infinity, 0, 2]))),
        [5, Infinity, -Infinity, -5, NaN, NaN]);
      const nan = t([NaN, 1]).maximum(t([0, NaN]));
      assert.ok(values(nan).every(Number.isNaN), "maximum propagates NaN");
    });

    it("dtype promotion", () => {
      const i = t(new Int32Array([1, 2, 3]));
      assert.equal(i.add(i).dtype, "int32");
      assert.deepEqual(values(i.add(i)), [2, 4, 6]);
      assert.equal(i.div(2).dtype, "float32");
      assertClose(i.div(2), [0.5, 1, 1.5]);
      assert.equal(i.mul(1.5).dtype, "float32");
      assertClose(i.mul(1.5), [1.5, 3, 4.5]);
      assert.equal(i.add(t([0.5, 0.5, 0.5])).dtype, "float32");
      const bf = t([1, 2], { dtype: "bfloat16" });
      assert.equal(bf.mul(2.5).dtype, "bfloat16", "a scalar does not widen bf16");
      assertClose(bf.mul(2.5), [2.5, 5]);
      assert.equal(bf.add(t([1, 1], { dtype: "float16" })).dtype, "float32");
      assert.equal(bf.add(t([1, 1])).dtype, "float32");
      assert.equal(t(new Int8Array([1])).add(t(new Uint8Array([1]))).dtype, "int32");
    });

    it("an int32 operand of a float32 op is cast to float32 first, as torch's (and compiled code's) common dtype", () => {
      // 16777217 is not a float32: torch computes 16777216 + 0.5 = 16777216.5 -> 16777216 (eager gave 16777218),
      // compares 16777216 == 16777216 (eager: false) and takes sqrt / exp of 2^31, not of 2147483647
      const i = t(Int32Array.of(16777217, 2147483647));
      assert.deepEqual(values(i.add(t([0.5, 0]))), [16777216, 2 ** 31]);
      assert.deepEqual(values(i.eq(t([16777216, 2 ** 31]))), [1, 1]);
      assert.deepEqual(values(i.mul(1.5)), [25165824, 3 * 2 ** 30]);
      assert.deepEqual(values(i.sqrt()), [4096, Math.fround(Math.sqrt(2 ** 31))]);
    });

    it("bool tensors with scalars promote as torch (int32 is Kiln's default int); bool subtraction raises", () => {
      const b = t([true, false, true]);
      for (const [name, r, dtype, want] of [
        ["b + 1", b.add(1), "int32", [2, 1, 2]],
        ["b * 3", b.mul(3), "int32", [3, 0, 3]],
        ["3 * b", k.mul(3, b), "int32", [3, 0, 3]],
        ["b + 0.5", b.add(0.5), "float32", [1.5, 0.5, 1.5]],
        ["b * 2.5", b.mul(2.5), "float32", [2.5, 0, 2.5]],
        ["b * true", b.mul(true), "bool", [1, 0, 1]],
        ["b + int32", b.add(t(new Int32Array([5, 5, 5]))), "int32", [6, 5, 6]],
        ["b / 2", b.div(2), "float32", [0.5, 0, 0.5]],
      ] as const) {
        assert.equal(r.dtype, dtype, name);
        assertClose(r, want, { msg: name });
      }
      const refused = /\[sub\] Subtraction, the `-` operator, with a bool tensor is not supported/;
      assert.throws(() => b.sub(1), refused);
      assert.throws(() => k.sub(1, b), refused);
      assert.throws(() => t([1, 2, 3]).sub(b), refused);
      assert.throws(() => t([1, 2, 3]).sub(true), refused);
      assert.throws(() => b.sub(b), /with two bool tensors is not supported/);
      // an integer scalar keeps an integer tensor's dtype
      const u = t(new Uint8Array([250]));
      assert.equal(u.add(1).dtype, "uint8");
    });

    it("unary math", () => {
      const x = t([-2, -0.5, 0, 0.5, 2]);
      const X = [-2, -0.5, 0, 0.5, 2];
      assertClose(x.neg(), [2, 0.5, -0, -0.5, -2]);
      assertClose(x.exp(), X.map(Math.exp));
      assertClose(t([1, Math.E, 0.5]).log(), [0, 1, Math.log(0.5)]);
      assertClose(t([4, 9, 2]).sqrt(), [2, 3, Math.SQRT2]);
      assertClose(t([4, 0.25]).rsqrt(), [0.5, 2]);
      assertClose(x.tanh(), X.map(Math.tanh));
      assertClose(x.sigmoid(), X.map((v) => 1 / (1 + Math.exp(-v))));
      assertClose(x.silu(), X.map((v) => v / (1 + Math.exp(-v))));
      assertClose(x.relu(), [0, 0, 0, 0.5, 2]);
      assertClose(x.abs(), [2, 0.5, 0, 0.5, 2]);
      assertClose(x.square(), [4, 0.25, 0, 0.25, 4]);
      assertClose(k.reciprocal(t([2, -4, 0.5])), [0.5, -0.25, 2]);
      assertClose(k.reciprocal(t([0])), [Infinity]);
      assertClose(k.sin(x), X.map(Math.sin));
      assertClose(k.cos(x), X.map(Math.cos));
      assertClose(x.clamp(-1, 1), [-1, -0.5, 0, 0.5, 1]);
      assertClose(x.clamp(0), [0, 0, 0, 0.5, 2]);
      assertClose(x.clamp(undefined, 0), [-2, -0.5, 0, 0, 0]);
      // rounding: torch.round is half to even
      const r = t([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.6, -2.6]);
      assertClose(k.round(r), [-2, -2, -0, 0, 2, 2, 3, -3]);
      assertClose(k.floor(r), [-3, -2, -1, 0, 1, 2, 2, -3]);
      assertClose(k.ceil(r), [-2, -1, -0, 1, 2, 3, 3, -2]);
      assertClose(k.sign(t([-3, 0, 2])), [-1, 0, 1]);
      // torch's sign is (0 < x) - (x < 0): NaN gives 0 (the eager kernel gave NaN, defer-and-fuse's generated C 0)
      assert.deepEqual(values(k.sign(t([NaN, -0, -Infinity, Infinity]))), [0, 0, -1, 1]);
      const na = k.tensor([NaN, -2], { device: dev, requiresGrad: true });
      na.abs().sum().backward(); // abs' gradient is sign(x): 0 at NaN, as torch's sgn
      assert.deepEqual(values(na.grad!), [0, -1]);
      // integer inputs: math ops give float32, sign-preserving ops keep the int dtype
      const i = t(new Int32Array([-3, 4]));
      assert.equal(i.exp().dtype, "float32");
      assert.equal(i.neg().dtype, "int32");
      assert.deepEqual(values(i.abs()), [3, 4]);
    });

    it("gelu exact (erf) and tanh approximation", () => {
      // torch.nn.functional.gelu(torch.tensor([-3., -1., 0., 0.5, 1., 2., 3.], dtype=float64))
      const x = t([-3, -1, 0, 0.5, 1, 2, 3]);
      const exact = [-0.0040496642, -0.15865525393, 0, 0.34573123063, 0.84134474607, 1.95449973610, 2.99595033579];
      // f32 kernels: atol 1e-6 (|gelu| <= 3 here, f32 eps 1.2e-7 relative plus an erf approximation)
      assertClose(x.gelu(), exact, { rtol: 1e-6, atol: 1e-6 });
      // approximate="tanh"
      const approx = [-0.00363739628, -0.15880800939, 0, 0.34571400982, 0.84119199061, 1.95459769409, 2.99636261];
      assertClose(x.gelu("tanh"), approx, { rtol: 1e-6, atol: 1e-6 });
    });

    it("comparisons and logical ops produce bool", () => {
      const a = t([1, 2, 3]);
      const b = t([3, 2, 1]);
      for (const [op, want] of [
        ["eq", [0, 1, 0]], ["ne", [1, 0, 1]], ["lt", [1, 0, 0]], ["le", [1, 1, 0]], ["gt", [0, 0, 1]], ["ge", [0, 1, 1]],
      ] as const) {
        const r = (a[op] as (o: Tensor) => Tensor).call(a, b);
        assert.equal(r.dtype, "bool", op);
        assert.deepEqual(values(r), [...want], op);
      }
      assert.deepEqual(values(a.gt(1.5)), [0, 1, 1]);
      assert.deepEqual(values(t([[1], [2]]).eq(t([1, 2]))), [1, 0, 0, 1]);
      const p = t([true, true, false, false]);
      const q = t([true, false, true, false]);
      assert.deepEqual(values(k.logicalAnd(p, q)), [1, 0, 0, 0]);
      assert.deepEqual(values(k.logicalOr(p, q)), [1, 1, 1, 0]);
      assert.deepEqual(values(k.logicalNot(p)), [0, 0, 1, 1]);
      assert.equal(k.logicalNot(p).dtype, "bool");
      assert.deepEqual(values(t([NaN]).eq(t([NaN]))), [0]);
      assert.deepEqual(values(t([NaN]).ne(t([NaN]))), [1]);
      // NaN is nonzero, so true (torch: bool(nan), logical_not(nan) False); it read as false before
      const n = t([NaN, 0, -0, 2]);
      assert.deepEqual(values(n.to("bool")), [1, 0, 0, 1]);
      assert.deepEqual(values(t([NaN, 0], { dtype: "bool" })), [1, 0]);
      assert.deepEqual(values(k.logicalNot(n)), [0, 1, 1, 0]);
      assert.deepEqual(values(k.logicalAnd(n, t([1, 1, 1, NaN]))), [1, 0, 0, 1]);
      assert.deepEqual(values(k.logicalOr(n, t([0, 0, 0, 0]))), [1, 0, 0, 1]);
    });

    it("comparisons of large, broadcast and transposed float32 operands (the native kernel's sizes), NaN and -0 included", () => {
      const [R, C] = [64, 300];
      const special = [NaN, -0, 0, Infinity, -Infinity];
      const av = Float32Array.from({ length: R * C }, (_, i) => (i % 37 === 0 ? special[(i / 37) % 5]! : Math.round(Math.sin(i * 0.7) * 4) / 2));
      const bv = Float32Array.from({ length: C * R }, (_, i) => (i % 41 === 0 ? special[(i / 41) % 5]! : Math.round(Math.cos(i * 0.3) * 4) / 2));
      const row = Float32Array.from({ length: C }, (_, j) => Math.round(Math.sin(j) * 4) / 2);
      const a = t(av).reshape([R, C]);
      const bT = t(bv).reshape([C, R]).transpose(0, 1); // strided
      const r = t(row); // broadcast over rows
      const fns = {
        eq: (x: number, y: number) => x === y, ne: (x: number, y: number) => x !== y, lt: (x: number, y: number) => x < y,
        le: (x: number, y: number) => x <= y, gt: (x: number, y: number) => x > y, ge: (x: number, y: number) => x >= y,
      } as const;
      for (const [op, f] of Object.entries(fns)) {
        const call = (x: Tensor, y: Tensor | number) => (x[op as keyof typeof fns] as (o: Tensor | number) => Tensor).call(x, y);
        const got = values(call(a, bT));
        const gotRow = values(call(a, r));
        const gotScalar = values(call(a, 0.5));
        for (let i = 0; i < R; i++)
          for (let j = 0; j < C; j++) {
            const x = av[i * C + j]!;
            if (got[i * C + j] !== Number(f(x, bv[j * R + i]!))) assert.fail(`${op} [${i}, ${j}]: ${x} vs ${bv[j * R + i]}`);
            if (gotRow[i * C + j] !== Number(f(x, row[j]!))) assert.fail(`${op} row [${i}, ${j}]`);
            if (gotScalar[i * C + j] !== Number(f(x, 0.5))) assert.fail(`${op} scalar [${i}, ${j}]`);
          }
      }
    });

    it("where and maskedFill broadcast", () => {
      const cond = t([[true], [false]]);
      const a = t([[1, 2, 3]]);
      assertClose(k.where(cond, a, -1), [1, 2, 3, -1, -1, -1], { shape: [2, 3] });
      assertClose(k.where(cond, 5, a), [5, 5, 5, 1, 2, 3], { shape: [2, 3] });
      assertClose(a.where(t([true, false, true]), t([9, 9, 9])), [1, 9, 3]);
      const x = t([[1, 2], [3, 4]]);
      assertClose(x.maskedFill(t([false, true]), -Infinity), [1, -Infinity, 3, -Infinity]);
      assert.throws(() => x.maskedFill(t([0, 1]), 0), /mask must be bool/);
    });

    it("where / cat / maskedFill result dtypes follow torch.result_type", () => {
      const i = t(new Int32Array([1, 2, 3]));
      const m = t([true, false, false]);
      const w = k.where(m, i, 0.5);
      assert.equal(w.dtype, "float32");
      assertClose(w, [1, 0.5, 0.5]);
      assert.equal(k.where(m, 0.5, i).dtype, "float32");
      assert.deepEqual(values(k.where(m, 0.5, i)), [0.5, 2, 3]);
      assert.equal(k.where(m, i, 7).dtype, "int32", "an integer scalar keeps the int dtype");
      assert.deepEqual(values(k.where(m, i, 7)), [1, 7, 7]);
      const bf = t([1.5, 2.5, 3.5], { dtype: "bfloat16" });
      assert.equal(k.where(m, bf, 0.25).dtype, "bfloat16", "a float scalar does not widen bf16");
      assert.equal(k.where(m, i, t([0.5, 0.5, 0.5])).dtype, "float32");
      assert.equal(k.where(m, 1.5, 0).dtype, "float32");
      assert.equal(k.where(m, 1, 0).dtype, "int32");
      assert.equal(k.where(m, true, false).dtype, "bool");
      const c = k.cat([t(new Int32Array([1])), t([1.5])]);
      assert.equal(c.dtype, "float32");
      assertClose(c, [1, 1.5]);
      assert.equal(k.cat([t([true]), t(new Uint8Array([7]))]).dtype, "uint8");
      assert.equal(k.cat([bf, t([1])]).dtype, "float32");
      const f = i.maskedFill(m, 0);
      assert.equal(f.dtype, "int32");
      assert.deepEqual(values(f), [0, 2, 3]);
      assert.deepEqual(values(k.embedding(f, t([[1, 1], [2, 2], [3, 3], [4, 4]]))), [1, 1, 3, 3, 4, 4], "usable as ids");
      assert.equal(bf.maskedFill(m, -Infinity).dtype, "bfloat16");
      assert.equal(t([true, true]).maskedFill(t([true, false]), 0).dtype, "bool");
    });
  });

  describe("casts", () => {
    it("float -> int truncates toward zero; -> bool is nonzero; bool -> float", () => {
      const x = t([2.7, -2.7, 0.5, -0.5, 0]);
      assert.deepEqual(values(x.to("int32")), [2, -2, 0, 0, 0]);
      assert.deepEqual(values(x.to("int64")), [2, -2, 0, 0, 0]);
      assert.deepEqual(values(x.to("int8")), [2, -2, 0, 0, 0]);
      assert.deepEqual(values(x.to("bool")), [1, 1, 1, 1, 0]);
      assert.deepEqual(values(t([true, false]).to("float32")), [1, 0]);
      assert.deepEqual(values(t(new Int32Array([300, -1])).to("uint8")), [44, 255], "wraps like torch");
      assert.deepEqual(values(t(new Int32Array([200])).to("int8")), [-56]);
      // NaN, infinities and out-of-range values give the type's minimum, as torch on x86 (cvttss2si); eager gave 0
      // (and 3e9 wrapped to -1294967296) where compiled code gave -2^31
      const odd = t([NaN, Infinity, -Infinity, 3e9, -3e9, 3.5]);
      assert.deepEqual(values(odd.to("int32")), [-(2 ** 31), -(2 ** 31), -(2 ** 31), -(2 ** 31), -(2 ** 31), 3]);
      assert.deepEqual(values(odd.to("int64")), [-(2 ** 63), -(2 ** 63), -(2 ** 63), 3e9, -3e9, 3]);
      assert.deepEqual(values(t([NaN, 1e19, -2.5], { dtype: "bfloat16" }).to("int64")), [-(2 ** 63), -(2 ** 63), -2]);
      assert.deepEqual(values(odd.to("int8")), [0, 0, 0, 0, 0, 3], "the int32 result's low byte");
    });

    it("int32 mul / square / pow wrap modulo 2^32 as torch's (float64 products rounded past 2^53)", () => {
      const x = t(Int32Array.of(2147483647, 65536, 46341, -3, 1291));
      // (2^31 - 1)^2 = 2^62 - 2^32 + 1 is 1 modulo 2^32; float64 rounded it to 2^62 - 2^32, stored as 0
      const squares = [1, 0, -2147479015, 9, 1666681];
      assert.deepEqual(values(x.square()), squares);
      assert.deepEqual(values(x.mul(x)), squares);
      // ATen's powi, modulo 2^32 (Python: ((v + 2**31) % 2**32) - 2**31)
      assert.deepEqual(values(x.pow(3)), [2147483647, 0, -1932785795, -27, -2143282125]);
      assert.deepEqual(values(t(Int32Array.of(3, 2, 7, -2, 2, -1, 1)).pow(t(Int32Array.of(40, 31, 20, 31, -1, -3, -5)))),
        [689956897, -(2 ** 31), -1199696159, -(2 ** 31), 0, -1, 1]);
      assert.deepEqual(values(t([3], { dtype: "int64" }).pow(40)), [Number(BigInt.asIntN(64, 3n ** 40n))], "int64 wraps modulo 2^64");
      // prod too: torch's int product is exact modulo 2^32 ((2^31 - 1)^2 * 3 = 3; float64 gave 0)
      assert.deepEqual(values(k.prod(t(Int32Array.of(2147483647, 2147483647, 3)), 0)), [3]);
    });

    it("round trips through every dtype for small integers", () => {
      const dtypes: DType[] = ["float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8", "uint8", "int32", "int64", "bool"];
      const src = [0, 1, 2, 3, 4];
      for (const a of dtypes) {
        for (const b of dtypes) {
          const want = a === "bool" || b === "bool" ? src.map((v) => (v ? 1 : 0)) : src;
          const x = t(src, { dtype: a }).to(b);
          assert.equal(x.dtype, b);
          assert.deepEqual(values(x), want, `${a} -> ${b}`);
        }
      }
    });

    it("bfloat16 rounds to nearest even", () => {
      const u = 2 ** -7; // bf16 ulp at 1
      const x = ft([1 + u / 2, 1 + 1.5 * u, 1 + u / 2 + 2 ** -20, -(1 + u / 2), 3.0e38 * 10, 1 + u / 4, 2 ** -133], [7]);
      assertClose(x.to("bfloat16"), [1, 1 + 2 * u, 1 + u, -1, Infinity, 1, 2 ** -133], { rtol: 0, atol: 0 });
      const nan = ft([NaN], [1]).to("bfloat16");
      assert.ok(Number.isNaN(values(nan)[0]!));
      // max finite bf16 = (2 - 2^-7) * 2^127; just above half an ulp past it overflows to inf
      const max = (2 - 2 ** -7) * 2 ** 127;
      assertClose(ft([max, -max], [2]).to("bfloat16"), [max, -max], { rtol: 0, atol: 0 });
    });

    it("float16 rounds to nearest even, overflows to inf, handles subnormals", () => {
      const u = 2 ** -10;
      const x = ft([1 + u / 2, 1 + 1.5 * u, 65504, 65519, 65520, -70000, 2 ** -24, 2 ** -25, 1.5 * 2 ** -25, 2 ** -26, 3 * 2 ** -24 / 2], [11]);
      assertClose(x.to("float16"), [1, 1 + 2 * u, 65504, 65504, Infinity, -Infinity, 2 ** -24, 0, 2 ** -24, 0, 2 * 2 ** -24], { rtol: 0, atol: 0 });
    });

    it("float8_e4m3fn rounds to nearest even and saturates at 448", () => {
      // 3 mantissa bits: ulp 1/8 at 1; subnormal step 2^-9; no infinities
      const x = ft([1 + 1 / 16, 1 + 3 / 16, 1 + 1 / 16 + 1e-3, 448, 460, 1e6, -1e6, 2 ** -9, 2 ** -10, 1.5 * 2 ** -9, 432, -0.3125], [12]);
      assertClose(x.to("float8_e4m3fn"), [1, 1.25, 1.125, 448, 448, 448, -448, 2 ** -9, 0, 2 * 2 ** -9, 448, -0.3125], { rtol: 0, atol: 0 });
      assert.ok(Number.isNaN(values(ft([NaN], [1]).to("float8_e4m3fn"))[0]!));
    });

    it("float8_e5m2 rounds to nearest even (no double rounding through f16)", () => {
      // 2 mantissa bits: ulp 1/4 at 1; 1.125 is a tie; 1.125 + 2^-12 is just above it (and rounds to 1.125 in f16)
      const x = ft([1.125, 1.375, 1.125 + 2 ** -12, 57344, 61440, 1e6, 2 ** -16, 2 ** -17, 1.5 * 2 ** -17 + 2 ** -30], [9]);
      assertClose(x.to("float8_e5m2"), [1, 1.5, 1.25, 57344, Infinity, Infinity, 2 ** -16, 0, 2 ** -16], { rtol: 0, atol: 0 });
      assert.ok(Number.isNaN(values(ft([NaN], [1]).to("float8_e5m2"))[0]!));
    });
  });

  describe("reductions", () => {
    const x = () => t([[1, 5, 3], [4, 2, 6]]);
    it("sums of long rows keep float32's precision (the error does not grow with the length)", () => {
      const f = Math.fround(0.1);
      const n = 4_000_000;
      const long = k.full([n], 0.1, { device: dev });
      const s = long.sum().item();
      const m = long.mean().item();
      assert.ok(Math.abs(s - f * n) / (f * n) < 2e-6, `sum ${s} vs ${f * n}`);
      assert.ok(Math.abs(m - f) / f < 2e-6, `mean ${m}`);
      const rows = k.full([2, 1_000_003], 0.1, { device: dev }).sum(1);
      for (const v of values(rows)) assert.ok(Math.abs(v - f * 1_000_003) / (f * 1_000_003) < 2e-6, `row sum ${v}`);
      long.dispose();
    });

    it("sum / mean / prod over all, dims, keepdim, several dims", () => {
      assertClose(x().sum(), [21], { shape: [] });
      assertClose(x().sum(0), [5, 7, 9], { shape: [3] });
      assertClose(x().sum(1, true), [9, 12], { shape: [2, 1] });
      assertClose(x().sum(-1), [9, 12], { shape: [2] });
      assertClose(x().mean(), [3.5], { shape: [] });
      assertClose(x().mean(0), [2.5, 3.5, 4.5]);
      assertClose(x().mean(1, true), [3, 4], { shape: [2, 1] });
      assertClose(k.prod(x(), 1), [15, 48]);
      const c = k.arange(24, undefined, 1, { device: dev }).reshape(2, 3, 4);
      assertClose(c.sum([0, 2]), [60, 92, 124], { shape: [3] });
      assertClose(c.sum([2, 0], true), [60, 92, 124], { shape: [1, 3, 1] });
      assert.equal(c.sum().dtype, "int32");
      assert.equal(c.sum().item(), 276);
      assert.equal(t([true, true, false]).sum().item(), 2);
      // bool and 8-bit ints accumulate in int32 (torch: int64) instead of wrapping in their own dtype
      const u8 = t(new Uint8Array([200, 100, 255]));
      assert.equal(u8.sum().dtype, "int32");
      assert.equal(u8.sum().item(), 555);
      assert.equal(t(new Int8Array([100, 100])).sum().item(), 200);
      assert.equal(t(new Int8Array([-100, -100])).sum().item(), -200);
      assert.deepEqual(values(t(new Uint8Array([200, 100, 255, 1]), { shape: [2, 2] }).sum(0)), [455, 101]);
      assert.equal(t([true, true, false]).sum().dtype, "int32");
      assert.equal(k.prod(t(new Uint8Array([16, 16, 16]))).item(), 4096);
      assertClose(c.to("float32").mean([1, 2]), [5.5, 17.5]);
      assert.throws(() => c.mean([1, 2]), /\[mean\] could not infer output dtype.*Got: int32/); // as torch: integers are cast first
      assert.equal(t(5).sum().item(), 5);
    });
    it("dim = [] reduces every dim, as torch's sum(dim=[]) / mean(dim=[]) (it was the identity)", () => {
      assertClose(x().sum([]), [21], { shape: [] });
      assertClose(x().sum([], true), [21], { shape: [1, 1] });
      assertClose(x().mean([]), [3.5], { shape: [] });
      assertClose(x().mean([], true), [3.5], { shape: [1, 1] });
      assertClose(k.amax(x(), []), [6], { shape: [] });
    });
    it("a 0-d tensor takes dim 0 or -1 (torch wraps its dims as a 1-d tensor's); ops needing a dim to index refuse it", () => {
      const s = () => t(3);
      for (const dim of [0, -1]) {
        assertClose(s().sum(dim), [3], { shape: [] });
        assertClose(s().mean(dim), [3], { shape: [] }); // was NaN for dim 0: the count read a missing size
        assertClose(s().mean(dim, true), [3], { shape: [] });
        assertClose(s().amax(dim), [3], { shape: [] });
        assertClose(s().softmax(dim), [1], { shape: [] });
        assertClose(s().squeeze(dim), [3], { shape: [] });
        assertClose(s().transpose(dim, 0), [3], { shape: [] });
        assertClose(s().flip(dim), [3], { shape: [] });
        assertClose(k.roll(s(), 1, dim), [3], { shape: [] });
        assertClose(s().gather(dim, t(0, { dtype: "int32" })), [3], { shape: [] });
        assertClose(s().indexSelect(dim, t([0], { dtype: "int32" })), [3], { shape: [] });
        assertClose(k.scatter(s(), dim, t(0, { dtype: "int32" }), t(7), true), [10], { shape: [] });
      }
      for (const dim of [1, -2]) assert.throws(() => s().sum(dim), /\[sum\] dimension -?\d out of range for a 0-d tensor/);
      const g = k.tensor(3, { device: dev, requiresGrad: true });
      g.mean(-1).mul(g.gather(0, t(0, { dtype: "int32" }))).backward(); // d/dg g^2 = 2g
      assertClose(g.grad!, [6], { shape: [] });
      assert.throws(() => s().select(0, 0), /\[select\] select\(\) cannot be applied to a 0-dim tensor/);
      assert.throws(() => s().slice(0, 0, 1), /\[slice\] slice\(\) cannot be applied to a 0-dim tensor/);
      assert.throws(() => s().narrow(-1, 0, 1), /\[narrow\] narrow\(\) cannot be applied to a 0-dim tensor/);
      assert.throws(() => k.split(s(), 1), /\[split\] split expects at least a 1-dimensional tensor/);
      assert.throws(() => k.chunk(s(), 1), /\[chunk\] chunk expects at least a 1-dimensional tensor/);
      assert.throws(() => s().size(0), /\[size\] dimension specified as 0 but tensor has no dimensions/);
      assert.throws(() => s().gather(0, t(1, { dtype: "int32" })), /index 1 out of range/);
    });
    it("max / min / argmax / argmin (first index on ties)", () => {
      assertClose(x().max(), [6], { shape: [] });
      assertClose(x().max(0), [4, 5, 6]);
      assertClose(x().min(1, true), [1, 2], { shape: [2, 1] });
      assert.deepEqual(values(x().argmax(1)), [1, 2]);
      assert.deepEqual(values(x().argmin(0)), [0, 1, 0]);
      assert.equal(x().argmax().item(), 5);
      const ties = t([[2, 7, 7, 1], [0, 0, -1, -1]]);
      assert.deepEqual(values(ties.argmax(1)), [1, 0]);
      assert.deepEqual(values(ties.argmin(1)), [3, 2]);
      assert.equal(ties.argmax(1).dtype, "int32");
    });
    it("argmax / argmin take NaN as the extreme (the first NaN), as torch", () => {
      assert.equal(t([1, NaN, 3]).argmax().item(), 1);
      assert.equal(t([1, NaN, 3]).argmin().item(), 1);
      assert.equal(t([NaN, 5, NaN]).argmax().item(), 0);
      // long rows (the native kernel's vector path): the NaN after the max, and the max after the NaN
      const row = Array.from({ length: 40 }, (_, i) => i % 7);
      row[20] = 100;
      row[33] = NaN;
      const rows = ft([...row, ...row.map((v, i) => (i === 33 ? 1 : v))], [2, 40]);
      assert.deepEqual(values(rows.argmax(1)), [33, 20]);
      assert.deepEqual(values(rows.argmax(-1, true)), [33, 20]);
      assert.ok(Number.isNaN(rows.max(1).toList()[0]!), "max of the NaN row is NaN");
    });
    it("argmax over logits-sized rows (the kernel splits a lone long row between the threads)", () => {
      // torch's rule, computed here: the first NaN, else the first index of the largest value
      const expected = (r: Float32Array): number => {
        let at = 0;
        for (let i = 0; i < r.length; i++) {
          if (Number.isNaN(r[i]!)) return i;
          if (r[i]! > r[at]!) at = i;
        }
        return at;
      };
      const n = 49152 + 37; // not a multiple of the vector width or of the split
      const base = (): Float32Array => Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37) * 3);
      const cases: [string, (r: Float32Array) => void][] = [
        ["the largest in the second half", (r) => void (r[40000] = 9)],
        ["a tie across the halves: the first wins", (r) => void ((r[30000] = 9), (r[100] = 9))],
        ["a tie in one vector's lanes and the tail", (r) => void ((r[n - 3] = 9), (r[n - 40] = 9))],
        ["a NaN in the second half after the largest", (r) => void ((r[10] = 9), (r[30001] = NaN))],
        ["NaNs in both halves", (r) => void ((r[30001] = NaN), (r[20000] = NaN))],
        ["a NaN in the last elements only", (r) => void (r[n - 1] = NaN)],
        ["every value -inf", (r) => r.fill(-Infinity)],
        ["-inf but one -1e30 late", (r) => void (r.fill(-Infinity), (r[45000] = -1e30))],
      ];
      for (const [name, edit] of cases) {
        const r = base();
        edit(r);
        assert.equal(ft([...r], [n]).argmax().item(), expected(r), name);
        assert.deepEqual(values(ft([...r, ...base()], [2, n]).argmax(1)), [expected(r), expected(base())], `${name} (two rows)`);
      }
    });
    it("max / min propagate NaN, as torch", () => {
      assert.ok(Number.isNaN(t([1, NaN, 3]).max().item()), "max propagates NaN");
      assert.ok(Number.isNaN(t([1, NaN, 3]).min().item()), "min propagates NaN");
      assert.ok(Number.isNaN(t([[NaN, 1, 3]]).max(1).item()), "max(dim) propagates NaN");
    });
    it("relu and clamp keep NaN, as torch (relu(NaN) was 0)", () => {
      // 40 elements: the SIMD body of the native kernel and its tail
      const x = ft(Array.from({ length: 40 }, (_, i) => (i % 3 === 0 ? NaN : i % 3 === 1 ? -i : i)), [40]);
      const expect = (f: (v: number) => number) => x.toList().map(f);
      assertClose(x.relu(), expect((v) => (v <= 0 ? 0 : v)));
      assertClose(x.relu().add(1), expect((v) => (v <= 0 ? 0 : v) + 1), { msg: "relu in a fused chain" });
      assertClose(x.clamp(-5, 5), expect((v) => (Number.isNaN(v) ? v : Math.min(Math.max(v, -5), 5))));
    });
    it("softmax / log_softmax / logsumexp along any dim", () => {
      const v = t([[1, 2, 3], [1, 1, 1]]);
      const e = [Math.exp(1), Math.exp(2), Math.exp(3)];
      const z = e[0]! + e[1]! + e[2]!;
      assertClose(v.softmax(-1), [e[0]! / z, e[1]! / z, e[2]! / z, 1 / 3, 1 / 3, 1 / 3]);
      assertClose(v.logSoftmax(1), [1 - Math.log(z), 2 - Math.log(z), 3 - Math.log(z), -Math.log(3), -Math.log(3), -Math.log(3)]);
      const s0 = 1 / (1 + Math.exp(1));
      const s1 = 1 / (1 + Math.exp(2));
      assertClose(v.softmax(0), [0.5, 1 - s0, 1 - s1, 0.5, s0, s1], { shape: [2, 3] });
      assertClose(v.logsumexp(1), [Math.log(z), 1 + Math.log(3)], { shape: [2] });
      assertClose(v.logsumexp(0, true), [1 + Math.LN2, Math.log(Math.exp(2) + Math.E), Math.log(Math.exp(3) + Math.E)], { shape: [1, 3] });
      // large logits stay finite; -inf entries get probability 0
      assertClose(t([1000, 1000, -Infinity]).softmax(0), [0.5, 0.5, 0]);
      assertClose(t([1000, 1000]).logsumexp(0), [1000 + Math.LN2]);
    });
    it("logsumexp of rows with infinities: all -inf gives -inf, a +inf gives inf (torch), NaN stays NaN", () => {
      const v = t([[-Infinity, -Infinity], [Infinity, 1], [-Infinity, 0], [NaN, 1]]);
      assertClose(v.logsumexp(1), [-Infinity, Infinity, 0, NaN], { shape: [4] });
      assertClose(v.logsumexp(1, true), [-Infinity, Infinity, 0, NaN], { shape: [4, 1] });
      assertClose(t([-Infinity, -Infinity, -Infinity]).logsumexp(0), [-Infinity], { shape: [] });
    });
    it("logsumexp over an empty dim is -inf (torch), not an error", () => {
      const e = k.zeros([2, 0], { device: dev });
      assertClose(e.logsumexp(1), [-Infinity, -Infinity], { shape: [2] });
      assertClose(e.logsumexp(-1, true), [-Infinity, -Infinity], { shape: [2, 1] });
      assert.deepEqual([...e.logsumexp(0).shape], [0]);
    });
    it("cumsum along dims", () => {
      const v = t([[1, 2, 3], [4, 5, 6]]);
      assertClose(v.cumsum(1), [1, 3, 6, 4, 9, 15]);
      assertClose(v.cumsum(0), [1, 2, 3, 5, 7, 9], { shape: [2, 3] });
      assertClose(v.transpose(0, 1).cumsum(-1), [1, 5, 2, 7, 3, 9]);
    });
    it("cumsum of integers and bools stays integral (torch: int64; Kiln's int32), exact past float32's 2^24", () => {
      const c = k.tensor(Int32Array.of(16777216, 1, 1, -3), { device: dev }).cumsum(0);
      assert.equal(c.dtype, "int32");
      assert.deepEqual(values(c), [16777216, 16777217, 16777218, 16777215]);
      const mask = t([[true, false, true], [false, true, true]]); // position ids from an attention mask
      const pos = mask.cumsum(1);
      assert.equal(pos.dtype, "int32");
      assert.deepEqual(values(pos), [1, 1, 2, 0, 1, 2]);
      assert.equal(k.tensor(Int8Array.of(100, 100), { device: dev }).cumsum(0).toList()[1], 200, "int8 widens as sum does");
      assert.equal(t([1, 2], { dtype: "int64" }).cumsum(0).dtype, "int64");
    });
    it("sort is stable, ascending and descending; topk", () => {
      const v = t([3, 1, 2, 1, 3]);
      const a = k.sort(v);
      assert.deepEqual(values(a.values), [1, 1, 2, 3, 3]);
      assert.deepEqual(values(a.indices), [1, 3, 2, 0, 4]);
      const d = k.sort(v, -1, true);
      assert.deepEqual(values(d.values), [3, 3, 2, 1, 1]);
      assert.deepEqual(values(d.indices), [0, 4, 2, 1, 3]);
      const m = t([[3, 0], [1, 5], [2, 5]]);
      const s0 = k.sort(m, 0);
      assert.deepEqual(values(s0.values), [1, 0, 2, 5, 3, 5]);
      assert.deepEqual(values(s0.indices), [1, 0, 2, 1, 0, 2]);
      const tk = k.topk(t([[1, 9, 3, 9, 5], [5, 4, 3, 2, 1]]), 3);
      assert.deepEqual([...tk.values.shape], [2, 3]);
      assert.deepEqual(values(tk.values), [9, 9, 5, 5, 4, 3]);
      assert.deepEqual(values(tk.indices), [1, 3, 4, 0, 1, 2]);
      const lo = k.topk(t([4, 1, 3, 1]), 2, 0, false);
      assert.deepEqual(values(lo.values), [1, 1]);
      assert.deepEqual(values(lo.indices), [1, 3]);
      const s0d = k.sort(t(5)); // a 0-d tensor sorts to itself, index 0 (torch)
      assert.deepEqual([[...s0d.values.shape], values(s0d.values), values(s0d.indices)], [[], [5], [0]]);
      assert.deepEqual(values(k.topk(t(5), 1).values), [5]);
      const nan = k.sort(t([1, NaN, 0]));
      assert.deepEqual(values(nan.indices), [2, 0, 1], "NaN sorts last ascending");
    });
  });

  describe("linear algebra", () => {
    it("matmul 1-d / 2-d / batched / broadcast, bmm", () => {
      const A = t([[1, 2], [3, 4], [5, 6]]); // [3,2]
      const B = t([[1, 0, 2], [-1, 3, 1]]); // [2,3]
      assertClose(A.matmul(B), [-1, 6, 4, -1, 12, 10, -1, 18, 16], { shape: [3, 3] });
      assertClose(k.matmul(t([1, 2, 3]), t([4, 5, 6])), [32], { shape: [] });
      assertClose(k.matmul(t([1, 1]), B), [0, 3, 3], { shape: [3] });
      assertClose(k.matmul(A, t([1, -1])), [-1, -1, -1], { shape: [3] });
      // batched [2,2,2] @ [2,2,1]
      const bA = t([[[1, 2], [3, 4]], [[0, 1], [1, 0]]]);
      const bB = t([[[1], [1]], [[2], [3]]]);
      assertClose(k.bmm(bA, bB), [3, 7, 3, 2], { shape: [2, 2, 1] });
      // broadcast: [2,2,2] @ [2,1] (no batch) and [2,1,2,2] @ [3,2,2] -> [2,3,2,2]
      assertClose(bA.matmul(t([[1], [2]])), [5, 11, 2, 1], { shape: [2, 2, 1] });
      const I = t([[1, 0], [0, 1]]);
      const lhs = k.stack([I, I.mul(2)]).unsqueeze(1); // [2,1,2,2]
      const rhs = k.stack([I, I.mul(3), t([[0, 1], [1, 0]])]); // [3,2,2]
      const r = lhs.matmul(rhs);
      assert.deepEqual([...r.shape], [2, 3, 2, 2]);
      assertClose(r, [1, 0, 0, 1, 3, 0, 0, 3, 0, 1, 1, 0, 2, 0, 0, 2, 6, 0, 0, 6, 0, 2, 2, 0]);
      // non-contiguous operands
      assertClose(B.T.matmul(A.T), [-1, -1, -1, 6, 12, 18, 4, 10, 16], { shape: [3, 3] });
    });
    it("linear with bias, with bf16 weights, with 3-d input", () => {
      const x = t([[1, 2, 3], [0, -1, 1]]);
      const W = t([[0.5, -1.25, 3], [1, 0, -2]]); // [out=2, in=3]; exact in bf16
      const b = t([0.5, -1]);
      assertClose(k.linear(x, W), [7, -5, 4.25, -2], { shape: [2, 2] });
      assertClose(k.linear(x, W, b), [7.5, -6, 4.75, -3]);
      assertClose(k.linear(x, W.to("bfloat16"), b), [7.5, -6, 4.75, -3]);
      assertClose(k.linear(x.reshape(1, 2, 3), W, b), [7.5, -6, 4.75, -3], { shape: [1, 2, 2] });
      assertClose(k.linear(x.to("bfloat16"), W.to("bfloat16")), [7, -5, 4.25, -2]);
    });
  });

  describe("indexing", () => {
    it("embedding / index_select (also bf16 tables, dim 1, int64 ids)", () => {
      const W = t([[0, 1], [10, 11], [20, 21]]);
      const e = k.embedding(t(new Int32Array([0, 2, 1, 0]), { shape: [2, 2] }), W);
      assertClose(e, [0, 1, 20, 21, 10, 11, 0, 1], { shape: [2, 2, 2] });
      assertClose(k.embedding(t([2, 2], { dtype: "int64" }), W.to("bfloat16")), [20, 21, 20, 21], { shape: [2, 2] });
      assertClose(k.indexSelect(W, 1, t([1, 1, 0], { dtype: "int32" })), [1, 1, 0, 11, 11, 10, 21, 21, 20], { shape: [3, 3] });
      assertClose(W.indexSelect(0, t([2], { dtype: "int32" })), [20, 21], { shape: [1, 2] });
      assertClose(k.indexSelect(W.T, 0, t([1], { dtype: "int32" })), [1, 11, 21], { shape: [1, 3] });
    });
    it("gather / scatter / scatter_add", () => {
      const x = t([[1, 2, 3], [4, 5, 6]]);
      assertClose(x.gather(1, t([[2, 0], [1, 1]], { dtype: "int32" })), [3, 1, 5, 5], { shape: [2, 2] });
      assertClose(x.gather(0, t([[1, 0, 1]], { dtype: "int64" })), [4, 2, 6], { shape: [1, 3] });
      const src = t([[10, 20], [30, 40]]);
      const idx = t([[2, 0], [0, 0]], { dtype: "int32" });
      assertClose(k.scatter(x, 1, idx, src), [20, 2, 10, 40, 5, 6], { shape: [2, 3] });
      assertClose(k.scatter(x, 1, idx, src, true), [21, 2, 13, 74, 5, 6]);
      assertClose(k.scatter(k.zeros([3, 2], { device: dev }), 0, t([[2, 0]], { dtype: "int32" }), t([[7, 8]])), [0, 8, 0, 0, 7, 0], { shape: [3, 2] });
      assert.deepEqual(values(x), [1, 2, 3, 4, 5, 6], "scatter is out of place");
    });
    it("cat / stack / split / chunk", () => {
      const a = t([[1, 2], [3, 4]]);
      const b = t([[5, 6]]);
      assertClose(k.cat([a, b]), [1, 2, 3, 4, 5, 6], { shape: [3, 2] });
      assertClose(k.cat([a, t([[9], [8]])], 1), [1, 2, 9, 3, 4, 8], { shape: [2, 3] });
      assertClose(k.cat([a, t([[7, 7]], { dtype: "int32" })], 0), [1, 2, 3, 4, 7, 7]);
      assertClose(k.stack([t([1, 2]), t([3, 4])]), [1, 2, 3, 4], { shape: [2, 2] });
      assertClose(k.stack([t([1, 2]), t([3, 4])], -1), [1, 3, 2, 4], { shape: [2, 2] });
      assertClose(k.stack([t([1, 2]), t([3, 4])], 1), [1, 3, 2, 4], { shape: [2, 2] });
      const r = k.arange(7, undefined, 1, { device: dev });
      assert.deepEqual(k.split(r, 3).map(values), [[0, 1, 2], [3, 4, 5], [6]]);
      assert.deepEqual(k.split(r, [2, 5]).map(values), [[0, 1], [2, 3, 4, 5, 6]]);
      assert.deepEqual(k.chunk(r, 3).map(values), [[0, 1, 2], [3, 4, 5], [6]]);
      assert.deepEqual(k.chunk(t([[1, 2, 3, 4]]), 2, 1).map((c) => [...c.shape]), [[1, 2], [1, 2]]);
      assert.throws(() => k.split(r, [2, 2]), /sum/);
      // an empty dim splits / chunks into one empty piece, as torch's (chunk threw, split returned no piece)
      const nothing = k.zeros([0, 2], { device: dev });
      for (const pieces of [k.split(nothing, 3), k.split(nothing, 0), k.chunk(nothing, 4)]) assert.deepEqual(pieces.map((p) => [...p.shape]), [[0, 2]]);
      assert.deepEqual(k.chunk(nothing, 2, 1).map((p) => [...p.shape]), [[0, 1], [0, 1]]);
      assert.throws(() => k.split(r, 0), /\[split\] split size must be a positive integer, got 0/);
      // torch's legacy rule: a 1-d empty tensor (tensor([]), a cat loop's start) is skipped next to tensors of any shape
      const none = k.tensor([], { device: dev });
      assertClose(k.cat([none, a, none, b]), [1, 2, 3, 4, 5, 6], { shape: [3, 2] });
      assertClose(k.cat([a, none], 1), [1, 2, 3, 4], { shape: [2, 2] });
      assert.equal(k.cat([t([[1, 2]], { dtype: "int32" }), none]).dtype, "float32", "the skipped tensor still takes part in the dtype");
      assert.deepEqual([...k.cat([none, none]).shape], [0]);
      assert.throws(() => k.cat([a, k.zeros([0, 3], { device: dev })]), /shapes \[2, 2\] and \[0, 3\] differ outside dim 0/);
      const ga = k.tensor([[1, 2]], { device: dev, requiresGrad: true });
      k.cat([none, ga, ga]).mul(t([[1, 2], [3, 4]])).sum().backward();
      assertClose(ga.grad!, [4, 6], { shape: [1, 2] });
    });
  });

  describe("nn functional", () => {
    it("rms_norm over the last dim", () => {
      const x = t([[1, 2, 3, 4], [-2, 0, 0, 2]]);
      const w = t([1, 1, 2, 0.5]);
      const inv0 = 1 / Math.sqrt(30 / 4 + 1e-6);
      const inv1 = 1 / Math.sqrt(8 / 4 + 1e-6);
      assertClose(k.rmsNorm(x, w, 1e-6), [inv0, 2 * inv0, 6 * inv0, 2 * inv0, -2 * inv1, 0, 0, inv1], { shape: [2, 4] });
      assertClose(k.rmsNorm(x.to("bfloat16"), w, 1e-6), [inv0, 2 * inv0, 6 * inv0, 2 * inv0, -2 * inv1, 0, 0, inv1]);
    });

    it("rotary: neox (rotate_half) and gptj (interleaved), partial rotary dim", () => {
      // tables [maxPos=2, rotaryDim/2=2]; position 1 uses cos [0, .5], sin [1, .5]
      const cos = t([[1, 1], [0, 0.5]]);
      const sin = t([[0, 0], [1, 0.5]]);
      const x = t([[[1, 2, 3, 4]]]); // [T=1, H=1, D=4]
      const pos = t(new Int32Array([1]));
      // neox pairs (0,2),(1,3): (1,3) by 90deg -> (-3, 1); (2,4) with c=s=.5 -> (-1, 3)
      assertClose(k.rotaryEmbedding(x, pos, cos, sin, true), [-3, -1, 1, 3], { shape: [1, 1, 4] });
      // gptj pairs (0,1),(2,3): (1,2) -> (-2, 1); (3,4) -> (-0.5, 3.5)
      assertClose(k.rotaryEmbedding(x, pos, cos, sin, false), [-2, 1, -0.5, 3.5]);
      // two tokens, two heads, positions [1, 0]; position 0 is the identity
      const x2 = t([[[1, 2, 3, 4], [0, 1, 0, 1]], [[5, 6, 7, 8], [1, 1, 1, 1]]]);
      assertClose(k.rotaryEmbedding(x2, t(new Int32Array([1, 0])), cos, sin, true), [-3, -1, 1, 3, 0, 0, 0, 1, 5, 6, 7, 8, 1, 1, 1, 1]);
      // partial rotary: D=6, rotaryDim=4: the last two features pass through
      const x3 = t([[[1, 2, 3, 4, 9, 10]]]);
      assertClose(k.rotaryEmbedding(x3, pos, cos, sin, true), [-3, -1, 1, 3, 9, 10]);
      assertClose(k.rotaryEmbedding(x3, pos, cos, sin, false), [-2, 1, -0.5, 3.5, 9, 10]);
    });

    it("causalAttention matches a hand-written loop (GQA, keys longer than queries)", () => {
      const rnd = prng(7);
      const B = 2, Hq = 4, Hkv = 2, S = 3, Sk = 5, D = 4;
      const qd = Array.from({ length: B * Hq * S * D }, () => rnd() * 2 - 1);
      const kd = Array.from({ length: B * Hkv * Sk * D }, () => rnd() * 2 - 1);
      const vd = Array.from({ length: B * Hkv * Sk * D }, () => rnd() * 2 - 1);
      const out = k.causalAttention(ft(qd, [B, Hq, S, D]), ft(kd, [B, Hkv, Sk, D]), ft(vd, [B, Hkv, Sk, D]));
      assert.deepEqual([...out.shape], [B, Hq, S, D]);
      const want: number[] = [];
      for (let b = 0; b < B; b++)
        for (let h = 0; h < Hq; h++) {
          const kh = Math.floor(h / (Hq / Hkv));
          for (let i = 0; i < S; i++) {
            const qi = (((b * Hq + h) * S + i) * D);
            const sc: number[] = [];
            for (let j = 0; j <= i + Sk - S; j++) {
              let dot = 0;
              for (let d = 0; d < D; d++) dot += qd[qi + d]! * kd[((b * Hkv + kh) * Sk + j) * D + d]!;
              sc.push(dot / Math.sqrt(D));
            }
            const m = Math.max(...sc);
            const ex = sc.map((s) => Math.exp(s - m));
            const z = ex.reduce((a, c) => a + c, 0);
            for (let d = 0; d < D; d++) {
              let acc = 0;
              for (let j = 0; j < ex.length; j++) acc += (ex[j]! / z) * vd[((b * Hkv + kh) * Sk + j) * D + d]!;
              want.push(acc);
            }
          }
        }
      assertClose(out, want, { rtol: 1e-5, atol: 1e-6 });
    });

    it("pagedAttention matches causalAttention on ragged sequences with cached prefixes, GQA and sliding window", () => {
      const rnd = prng(11);
      const Hq = 4, Hkv = 2, D = 8, blockSize = 2, numBlocks = 16, maxBlocks = 4;
      // [total length, cached prefix, block table]: prefill+cache, plain prefill, decode; blocks non-consecutive
      const seqs = [
        { len: 5, cached: 3, table: [7, 2, 11, 0] },
        { len: 4, cached: 0, table: [4, 9, 0, 0] },
        { len: 7, cached: 6, table: [1, 13, 5, 15] },
      ];
      const gen = (n: number) => Array.from({ length: n }, () => rnd() * 2 - 1);
      const full = seqs.map((s) => ({ q: gen(s.len * Hq * D), k: gen(s.len * Hkv * D), v: gen(s.len * Hkv * D) }));
      const slotOf = (s: number, p: number) => seqs[s]!.table[Math.floor(p / blockSize)]! * blockSize + (p % blockSize);
      const slotElems = Hkv * D;
      const run = (slidingWindow: number, softcap = 0) => {
        const kc = new Float32Array(numBlocks * blockSize * slotElems).fill(NaN); // unused slots must never be read
        const vc = new Float32Array(numBlocks * blockSize * slotElems).fill(NaN);
        const q: number[] = [], kn: number[] = [], vn: number[] = [], slots: number[] = [], qStart = [0];
        seqs.forEach((s, i) => {
          for (let p = 0; p < s.len; p++) {
            const kRow = full[i]!.k.slice(p * slotElems, (p + 1) * slotElems);
            const vRow = full[i]!.v.slice(p * slotElems, (p + 1) * slotElems);
            if (p < s.cached) {
              kc.set(kRow, slotOf(i, p) * slotElems);
              vc.set(vRow, slotOf(i, p) * slotElems);
            } else {
              q.push(...full[i]!.q.slice(p * Hq * D, (p + 1) * Hq * D));
              kn.push(...kRow);
              vn.push(...vRow);
              slots.push(slotOf(i, p));
            }
          }
          qStart.push(qStart[qStart.length - 1]! + s.len - s.cached);
        });
        const T = slots.length;
        const kCache = k.tensor(kc, { device: dev, shape: [numBlocks, blockSize, Hkv, D] });
        const vCache = k.tensor(vc, { device: dev, shape: [numBlocks, blockSize, Hkv, D] });
        const out = k.pagedAttention({
          q: ft(q, [T, Hq, D]), k: ft(kn, [T, Hkv, D]), v: ft(vn, [T, Hkv, D]), kCache, vCache,
          slotMapping: t(Int32Array.from(slots)),
          blockTables: t(Int32Array.from(seqs.flatMap((s) => s.table)), { shape: [seqs.length, maxBlocks] }),
          queryStart: t(Int32Array.from(qStart)),
          seqLens: t(Int32Array.from(seqs.map((s) => s.len))),
          scale: 1 / Math.sqrt(D),
          slidingWindow,
          softcap,
        });
        assert.deepEqual([...out.shape], [T, Hq, D]);
        // the new K/V landed in their slots
        const kAfter = kCache.toList();
        seqs.forEach((s, i) => {
          for (let p = s.cached; p < s.len; p++)
            assertClose(kAfter.slice(slotOf(i, p) * slotElems, (slotOf(i, p) + 1) * slotElems), full[i]!.k.slice(p * slotElems, (p + 1) * slotElems), { msg: `k slot seq ${i} pos ${p}` });
        });
        return { out: out.toList(), qStart };
      };
      // no window: compare each sequence's rows with causalAttention over the full sequence (queries aligned to the end)
      const { out, qStart } = run(0);
      seqs.forEach((s, i) => {
        const qlen = s.len - s.cached;
        const qs = ft(full[i]!.q.slice(s.cached * Hq * D), [qlen, Hq, D]).permute(1, 0, 2).unsqueeze(0);
        const ks = ft(full[i]!.k, [s.len, Hkv, D]).permute(1, 0, 2).unsqueeze(0);
        const vs = ft(full[i]!.v, [s.len, Hkv, D]).permute(1, 0, 2).unsqueeze(0);
        const ref = k.causalAttention(qs, ks, vs).squeeze(0).permute(1, 0, 2).contiguous().toList();
        assertClose(out.slice(qStart[i]! * Hq * D, qStart[i + 1]! * Hq * D), ref, { rtol: 1e-4, atol: 1e-5, msg: `seq ${i}` });
      });
      // soft-capped scores (Gemma 2), 0.5 well under the scores' range: paged == dense, and unlike the uncapped output
      const capped = run(0, 0.5).out;
      seqs.forEach((s, i) => {
        const qlen = s.len - s.cached;
        const qs = ft(full[i]!.q.slice(s.cached * Hq * D), [qlen, Hq, D]).permute(1, 0, 2).unsqueeze(0);
        const ks = ft(full[i]!.k, [s.len, Hkv, D]).permute(1, 0, 2).unsqueeze(0);
        const vs = ft(full[i]!.v, [s.len, Hkv, D]).permute(1, 0, 2).unsqueeze(0);
        const ref = k.causalAttention(qs, ks, vs, undefined, undefined, 0.5).squeeze(0).permute(1, 0, 2).contiguous().toList();
        const rows = capped.slice(qStart[i]! * Hq * D, qStart[i + 1]! * Hq * D);
        assertClose(rows, ref, { rtol: 1e-4, atol: 1e-5, msg: `soft-capped seq ${i}` });
        if (s.len > 1) assert.ok(rows.some((x, j) => Math.abs(x - out[qStart[i]! * Hq * D + j]!) > 1e-3), `seq ${i}: the soft-cap changed nothing`);
      });
      // sliding window 2: each query sees itself and one key before it
      const win = run(2).out;
      seqs.forEach((s, i) => {
        for (let p = s.cached; p < s.len; p++)
          for (let h = 0; h < Hq; h++) {
            const kh = Math.floor(h / (Hq / Hkv));
            const qv = full[i]!.q.slice((p * Hq + h) * D, (p * Hq + h + 1) * D);
            const keys = [p - 1, p].filter((c) => c >= 0);
            const sc = keys.map((c) => qv.reduce((a, x, d) => a + x * full[i]!.k[(c * Hkv + kh) * D + d]!, 0) / Math.sqrt(D));
            const m = Math.max(...sc);
            const w = sc.map((x) => Math.exp(x - m));
            const z = w.reduce((a, b) => a + b, 0);
            const want = Array.from({ length: D }, (_, d) => keys.reduce((a, c, j) => a + (w[j]! / z) * full[i]!.v[(c * Hkv + kh) * D + d]!, 0));
            const row = qStart[i]! + p - s.cached;
            assertClose(win.slice((row * Hq + h) * D, (row * Hq + h + 1) * D), want, { rtol: 1e-4, atol: 1e-5, msg: `window seq ${i} pos ${p} head ${h}` });
          }
      });
    });

    it("siluMul and crossEntropy", () => {
      const g = t([0, 1, -1]);
      const u = t([2, 3, 4]);
      assertClose(k.siluMul(g, u), [0, 3 / (1 + Math.exp(-1)), (-4) / (1 + Math.E)]);
      const logits = t([[0, 0], [1, 3]]);
      // sample 0: -log(1/2); sample 1 (target 1): -log(e^3 / (e + e^3)); sample 2 ignored
      const l = k.crossEntropy(t([[0, 0], [1, 3], [5, 5]]), t(new Int32Array([0, 1, -100])));
      assertClose(l, [(Math.LN2 + Math.log(1 + Math.exp(-2))) / 2], { shape: [] });
      assertClose(k.crossEntropy(logits, t(new Int32Array([-100, -100]))), [0]);
    });
  });

  describe("random", () => {
    it("rand / randn are reproducible per seed and differ across seeds", () => {
      const a = k.rand([64], { device: dev, generator: new k.Generator(42) }).toList();
      const b = k.rand([64], { device: dev, generator: new k.Generator(42) }).toList();
      const c = k.rand([64], { device: dev, generator: new k.Generator(43) }).toList();
      assert.deepEqual(a, b);
      assert.notDeepEqual(a, c);
      const g = new k.Generator(42);
      const first = k.rand([32], { device: dev, generator: g }).toList();
      const second = k.rand([32], { device: dev, generator: g }).toList();
      assert.deepEqual([...first, ...second], a, "consecutive draws continue the stream");
      k.manualSeed(123);
      const n1 = k.randn([16], { device: dev }).toList();
      k.manualSeed(123);
      const n2 = k.randn([16], { device: dev }).toList();
      assert.deepEqual(n1, n2);
      const bounded = k.rand([1000], { device: dev, low: -3, high: -2, generator: new k.Generator(1) }).toList();
      assert.ok(bounded.every((v) => v >= -3 && v < -2));
    });

    it("distributions: mean and std within 5 standard errors", () => {
      const n = 100_000;
      const stats = (xs: number[]) => {
        const m = xs.reduce((a, b) => a + b, 0) / xs.length;
        const v = xs.reduce((a, b) => a + (b - m) ** 2, 0) / (xs.length - 1);
        return { m, s: Math.sqrt(v) };
      };
      // uniform [0,1): mean 1/2 (s.e. sqrt(1/12/n) ~ 9.1e-4), std sqrt(1/12) ~ 0.2887 (s.e. ~ 3e-4)
      const u = stats(k.rand([n], { device: dev, generator: new k.Generator(5) }).toList());
      assert.ok(Math.abs(u.m - 0.5) < 5 * Math.sqrt(1 / 12 / n), `uniform mean ${u.m}`);
      assert.ok(Math.abs(u.s - Math.sqrt(1 / 12)) < 0.0025, `uniform std ${u.s}`);
      // normal(2, 3): mean s.e. 3/sqrt(n) ~ 9.5e-3, std s.e. 3/sqrt(2n) ~ 6.7e-3
      const g = stats(k.randn([n], { device: dev, mean: 2, std: 3, generator: new k.Generator(6) }).toList());
      assert.ok(Math.abs(g.m - 2) < 5 * 3 / Math.sqrt(n), `normal mean ${g.m}`);
      assert.ok(Math.abs(g.s - 3) < 5 * 3 / Math.sqrt(2 * n), `normal std ${g.s}`);
    });

    it("multinomial: reproducible, frequencies follow the weights, no repeats without replacement", () => {
      const probs = t([1, 2, 0, 7]);
      const a = k.multinomial(probs, 50, true, new k.Generator(9)).toList();
      const b = k.multinomial(probs, 50, true, new k.Generator(9)).toList();
      assert.deepEqual(a, b);
      const n = 20_000;
      const draws = k.multinomial(probs, n, true, new k.Generator(10)).toList();
      const freq = [0, 0, 0, 0];
      for (const d of draws) freq[d]!++;
      assert.equal(freq[2], 0, "a zero weight is never drawn");
      // p in {.1,.2,.7}: s.e. sqrt(p(1-p)/n) <= 3.3e-3; allow 5 s.e.
      [0.1, 0.2, 0, 0.7].forEach((p, i) => assert.ok(Math.abs(freq[i]! / n - p) < 5 * Math.sqrt((p * (1 - p)) / n) + 1e-9, `category ${i}: ${freq[i]! / n}`));
      const rows = k.multinomial(t([[1, 1, 1, 1], [0, 1, 5, 1]]), 3, false, new k.Generator(3));
      assert.deepEqual([...rows.shape], [2, 3]);
      const r = rows.toList();
      assert.equal(new Set(r.slice(0, 3)).size, 3);
      assert.deepEqual([...r.slice(3, 6)].sort(), [1, 2, 3]);
      assert.throws(() => k.multinomial(probs, 5, false), /without replacement/);
    });
  });
}, { modes: true });

describe("random streams agree across back ends", () => {
  it("same seed, same numbers on reference and cpu", { skip: false }, async () => {
    const { isBackendAvailable } = await import("../../src/backends/registry.js");
    if (!isBackendAvailable("cpu")) return;
    const a = k.randn([100], { device: "reference", generator: new k.Generator(77) }).toList();
    const b = k.randn([100], { device: "cpu", generator: new k.Generator(77) }).toList();
    assert.deepEqual(a, b);
  });
});
