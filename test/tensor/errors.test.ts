// Typed errors that name the op: shapes, indices, debug-mode non-finite checks, unknown back ends.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { describe, it } from "node:test";
import * as k from "../../src/tensor/index.js";
import { getBackend } from "../../src/backends/registry.js";
import { BackendUnavailableError, IndexOutOfRangeError, NonFiniteError, OpError } from "../../src/util/errors.js";
import { forEachBackend } from "./suite.js";

/** Matches an error of class `cls` whose op is `op` and whose message starts with `[op]` and matches `re`. */
function opError(cls: new (...args: never[]) => OpError, op: string, re?: RegExp) {
  return (e: unknown) => {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${(e as Error)?.name}: ${(e as Error)?.message}`);
    assert.equal(e.op, op);
    assert.ok(e.message.startsWith(`[${op}] `), e.message);
    if (re) assert.match(e.message, re);
    return true;
  };
}

forEachBackend((dev) => {
  const t = (data: Parameters<typeof k.tensor>[0], opts: Parameters<typeof k.tensor>[1] = {}) => k.tensor(data, { device: dev, ...opts });
  const ids = (...xs: number[]) => t(Int32Array.from(xs));

  describe("shape errors", () => {
    it("matmul / bmm / linear mismatches", () => {
      assert.throws(() => k.matmul(k.zeros([2, 3], { device: dev }), k.zeros([4, 2], { device: dev })), opError(OpError, "matmul", /cannot be multiplied \(3 != 4\)/));
      assert.throws(() => k.matmul(t(1), t([1])), opError(OpError, "matmul"));
      assert.throws(() => k.bmm(k.zeros([2, 2, 2], { device: dev }), k.zeros([3, 2, 2], { device: dev })), opError(OpError, "bmm"));
      assert.throws(() => k.matmul(k.zeros([2, 2, 3], { device: dev }), k.zeros([3, 3, 1], { device: dev })),
        opError(OpError, "matmul", /batch dimensions of \[2, 2, 3\] and \[3, 3, 1\] cannot be broadcast \(\[2\] vs \[3\]\)/));
      assert.throws(() => k.linear(k.zeros([2, 3], { device: dev }), k.zeros([4, 5], { device: dev })), opError(OpError, "linear"));
    });
    it("broadcast failures name the op", () => {
      assert.throws(() => k.zeros([2, 3], { device: dev }).add(k.zeros([4], { device: dev })), opError(OpError, "add", /\[2, 3\] and \[4\] cannot be broadcast/));
      assert.throws(() => k.zeros([2], { device: dev }).lt(k.zeros([3], { device: dev })), opError(OpError, "lt"));
      assert.throws(() => k.where(t([true, false]), k.zeros([3], { device: dev }), 0), opError(OpError, "where"));
      assert.throws(() => k.zeros([3], { device: dev }).expand(2, 4), opError(OpError, "expand"));
    });
    it("a dtype Kiln does not store (float64 from plain JS, a cast to it) names the ones it has", () => {
      const float64 = "float64" as k.DType;
      assert.throws(() => t([1, 2], { dtype: float64 }), opError(OpError, "dtype", /"float64" is not a dtype Kiln stores \(float32, .*bool\)/));
      assert.throws(() => k.zeros([2], { device: dev, dtype: float64 }), opError(OpError, "dtype"));
      assert.throws(() => t([1]).to(float64), opError(OpError, "dtype"));
    });
    it("invalid views and dims", () => {
      assert.throws(() => k.zeros([2, 3], { device: dev }).view(4), opError(OpError, "view", /invalid for 6 elements/));
      assert.throws(() => k.zeros([2, 3], { device: dev }).T.view(6), opError(OpError, "view", /reshape/));
      assert.throws(() => k.zeros([2, 3], { device: dev }).reshape(-1, 4), opError(OpError, "reshape"));
      assert.throws(() => k.zeros([2, 3], { device: dev }).sum(2), opError(OpError, "sum", /dimension 2 out of range/));
      assert.throws(() => k.zeros([2, 3], { device: dev }).permute(0, 0), opError(OpError, "permute"));
      assert.throws(() => k.zeros([2, 3], { device: dev }).narrow(1, 2, 2), opError(OpError, "narrow"));
      assert.throws(() => k.cat([k.zeros([2, 3], { device: dev }), k.zeros([2, 4], { device: dev })]), opError(OpError, "cat"));
      assert.throws(() => k.stack([k.zeros([2], { device: dev }), k.zeros([2], { device: dev }), k.zeros([3], { device: dev })]),
        opError(OpError, "stack", /expects each tensor to be equal size, but got \[2\] at entry 0 and \[3\] at entry 2/));
      assert.throws(() => k.topk(k.zeros([3], { device: dev }), 4), opError(OpError, "topk"));
      assert.throws(() => k.empty([2, -1], { device: dev }), opError(OpError, "empty"));
      assert.throws(() => t([[1, 2], [3]]), opError(OpError, "tensor", /ragged/));
    });
  });

  describe("argument errors torch raises", () => {
    const z = (...shape: number[]) => k.zeros(shape, { device: dev });
    it("dims must be integers and a dim list must not repeat one", () => {
      assert.throws(() => z(2, 3).sum(0.5), opError(OpError, "sum", /dimension 0.5 .*integer/));
      assert.throws(() => z(2, 3).transpose(0, 1.5), opError(OpError, "transpose"));
      assert.throws(() => z(2, 3).sum([0, -2]), opError(OpError, "sum", /dim 0 appears multiple times in the list of dims/));
      assert.throws(() => z(2, 3).mean([1, 1]), opError(OpError, "mean", /dim 1 appears multiple times/));
    });
    it("chunk / split / cat / topk check their sizes", () => {
      assert.throws(() => k.chunk(z(4), 0), opError(OpError, "chunk", /chunks.*greater than 0, got 0/));
      assert.throws(() => k.chunk(z(4), 1.5), opError(OpError, "chunk"));
      assert.throws(() => k.split(z(3), [-1, 4]), opError(OpError, "split", /non-negative/));
      assert.throws(() => k.split(z(3), 1.5), opError(OpError, "split"));
      assert.throws(() => k.cat([t(1), t(2)]), opError(OpError, "cat", /zero-dimensional tensor \(at position 0\) cannot be concatenated/));
      assert.throws(() => k.topk(z(3), 1.5), opError(OpError, "topk"));
    });
    it("backward's grad must have exactly the output's shape, as torch.autograd.backward checks", () => {
      const a = k.ones([2, 2], { device: dev, requiresGrad: true });
      assert.throws(() => a.mul(2).backward(k.ones([4], { device: dev })), opError(OpError, "backward", /grad has a shape of \[4\] and the output has a shape of \[2, 2\]/));
      // one the output would broadcast to is refused too (torch's "Mismatch in shape"), not summed back
      assert.throws(() => a.mul(2).backward(k.ones([3, 2, 2], { device: dev })), opError(OpError, "backward", /Mismatch in shape: grad has a shape of \[3, 2, 2\]/));
      assert.throws(() => a.mul(2).backward(k.ones([1, 2], { device: dev })), opError(OpError, "backward", /Mismatch in shape/));
      assert.equal(a.grad, null, "a refused backward leaves no gradient");
      a.mul(2).backward(k.full([2, 2], 3, { device: dev }));
      assert.deepEqual(a.grad!.toList(), [6, 6, 6, 6]);
    });
    it("cross_entropy targets of another shape than the logits must be class indices; scatter's src must cover index and may be larger in any dim", () => {
      assert.throws(() => k.crossEntropy(z(2, 3), t([1, 2])), opError(OpError, "cross_entropy", /integer dtype, got float32/));
      const idx = (data: number[], shape: number[]) => k.tensor(Int32Array.from(data), { device: dev, shape });
      assert.throws(() => k.scatter(z(2, 3), 1, idx([0, 1, 2, 0], [2, 2]), t([[1], [4]])), opError(OpError, "scatter", /src \[2, 1\] is smaller than index \[2, 2\] at dim 1/));
      // src [2, 3, 1] against index [2, 2, 1] along dim 2: out[i][j][0] = src[i][j][0] for j < 2 (src[i][2] unused)
      const src = t([[[1], [2], [3]], [[4], [5], [6]]]);
      assert.deepEqual(k.scatter(z(2, 2, 2), 2, idx([0, 1, 1, 0], [2, 2, 1]), src).toList(), [1, 0, 0, 2, 0, 4, 5, 0]);
      assert.deepEqual(k.scatter(z(2, 2), 0, idx([1, 0], [1, 2]), t([[7, 8], [9, 9]])).toList(), [0, 8, 7, 0]);
    });
    it("where's condition must be bool, as torch's (a float or int condition was read as nonzero)", () => {
      assert.throws(() => k.where(t([1, 0]), t([1, 2]), t([3, 4])), opError(OpError, "where", /condition to be a boolean tensor, but got float32/));
      assert.throws(() => k.where(k.tensor(Int32Array.of(1, 0), { device: dev }), 1, 0), opError(OpError, "where", /got int32/));
    });
    it("negating a bool tensor and integers to negative integer powers are refused", () => {
      assert.throws(() => t([true, false]).neg(), opError(OpError, "neg", /bool tensor is not supported.*logical_not/));
      assert.throws(() => k.tensor(Int32Array.of(2, 3), { device: dev }).pow(-1), opError(OpError, "pow", /Integers to negative integer powers are not allowed/));
      assert.deepEqual(k.tensor(Int32Array.of(2, 3), { device: dev }).pow(2).toList(), [4, 9]);
      assert.deepEqual(k.tensor(Int32Array.of(2), { device: dev }).pow(-0.5).toList(), [Math.fround(Math.SQRT1_2)]);
    });
  });

  describe("integer division by zero and mismatched dtypes", () => {
    const zeroDivision = (dtype: string) => opError(OpError, "remainder", new RegExp(`ZeroDivisionError: integer division by zero \\(${dtype} on ${dev}\\)`));
    it("an integer remainder by zero is torch's ZeroDivisionError; floats keep NaN and true division inf", () => {
      const a = ids(5, -5, 7);
      assert.throws(() => k.remainder(a, ids(2, 0, 3)), zeroDivision("int32"));
      assert.throws(() => k.remainder(a, 0), zeroDivision("int32"));
      assert.throws(() => k.remainder(a, false), zeroDivision("int32")); // a JS boolean divisor is 0 or 1
      assert.throws(() => k.remainder(7, ids(1, 0)), zeroDivision("int32"));
      assert.throws(() => k.remainder(a, t([3, 0, 1], { dtype: "int64" })), zeroDivision("int64"));
      assert.throws(() => k.remainder(t([true]), t([false])), zeroDivision("bool"));
      // Python's modulo takes the divisor's sign: 5 % 2 = 1, -5 % -3 = -2, 7 % -4 = -1
      assert.deepEqual(k.remainder(a, ids(2, -3, -4)).toList(), [1, -2, -1]);
      // a float operand makes the op float: x % 0 is NaN, x / 0 is +-inf (0 / 0 NaN), integers included
      assert.deepEqual(k.remainder(a, t([0, 0, 0])).toList(), [NaN, NaN, NaN]);
      assert.deepEqual(k.remainder(t([5, -5, 0]), 0).toList(), [NaN, NaN, NaN]);
      assert.deepEqual(k.div(t([5, -5, 0]), 0).toList(), [Infinity, -Infinity, NaN]);
      assert.deepEqual(k.div(a, 0).toList(), [Infinity, -Infinity, Infinity]);
    });
    it("scatter / scatter_add / index_copy_ take src of self's dtype, as torch's (no silent cast)", () => {
      const index = k.tensor(Int32Array.of(2, 0), { device: dev, shape: [1, 2] });
      const self = (dtype: "float32" | "bfloat16") => k.zeros([1, 3], { device: dev, dtype });
      assert.throws(() => k.scatter(self("float32"), 1, index, t([[1, 2]], { dtype: "bfloat16" })),
        opError(OpError, "scatter", /Expected self.dtype to be equal to src.dtype \(self float32, src bfloat16\)/));
      assert.throws(() => k.scatter(self("bfloat16"), 1, index, t([[1, 2]]), true),
        opError(OpError, "scatter_add", /Expected self.dtype to be equal to src.dtype \(self bfloat16, src float32\)/));
      assert.throws(() => k.scatter(self("float32"), 1, index, t([[1, 2]], { dtype: "int32" })), opError(OpError, "scatter", /src int32/));
      assert.throws(() => self("float32").indexCopy_(0, ids(0), t([[1, 2, 3]], { dtype: "int32" })),
        opError(OpError, "index_copy_", /same dtype, but got \(self\) float32 and \(source\) int32/));
      // matching dtypes, bf16 included
      assert.deepEqual(k.scatter(self("bfloat16"), 1, index, t([[1.5, 2]], { dtype: "bfloat16" }), true).toList(), [2, 0, 1.5]);
      assert.deepEqual(k.scatter(k.zeros([1, 3], { device: dev, dtype: "int32" }), 1, index, t([[4, 5]], { dtype: "int32" })).toList(), [5, 0, 4]);
    });
  });

  describe("index errors", () => {
    it("out-of-range indices raise IndexOutOfRangeError naming the op", () => {
      const w = k.zeros([3, 2], { device: dev });
      assert.throws(() => k.embedding(ids(0, 3), w), opError(IndexOutOfRangeError, "embedding", /3 out of range/));
      assert.throws(() => k.embedding(ids(-1), w), opError(IndexOutOfRangeError, "embedding"));
      assert.throws(() => k.indexSelect(w, 0, ids(5)), opError(IndexOutOfRangeError, "index_select"));
      assert.throws(() => k.indexSelect(w, 1, ids(2)), opError(IndexOutOfRangeError, "index_select"));
      assert.throws(() => w.gather(1, t(new Int32Array([0, 2]), { shape: [1, 2] })), opError(IndexOutOfRangeError, "gather"));
      assert.throws(() => k.scatter(w, 0, t(new Int32Array([3, 0]), { shape: [1, 2] }), k.ones([1, 2], { device: dev })), opError(IndexOutOfRangeError, "scatter"));
      assert.throws(() => w.indexCopy_(0, ids(3), k.ones([1, 2], { device: dev })), opError(IndexOutOfRangeError, "index_copy_"));
      assert.throws(() => w.select(0, 3), opError(IndexOutOfRangeError, "select"));
      const cos = k.ones([2, 1], { device: dev });
      assert.throws(() => k.rotaryEmbedding(k.zeros([1, 1, 2], { device: dev }), ids(2), cos, cos), opError(IndexOutOfRangeError, "rotary", /position 2/));
      assert.throws(() => k.indexSelect(w, 0, t([0.5])), opError(OpError, "index_select", /integer/));
      // int64 ids past int32's range do not wrap around to a valid row (2^32 + 1 would read row 1)
      const far = t([1, 2 ** 32 + 1], { dtype: "int64" });
      assert.throws(() => k.indexSelect(w, 0, far), opError(IndexOutOfRangeError, "index_select", /4294967297 out of range/));
      assert.throws(() => k.embedding(far, w), opError(IndexOutOfRangeError, "embedding", /4294967297/));
      assert.throws(() => w.gather(0, t([[-(2 ** 32)]], { dtype: "int64" })), opError(IndexOutOfRangeError, "gather", /-4294967296/));
      assert.deepEqual(k.indexSelect(k.tensor([[1, 2], [3, 4]], { device: dev }), 0, t([1], { dtype: "int64" })).toList(), [3, 4]);
      const logits = k.zeros([2, 4], { device: dev });
      assert.throws(() => k.crossEntropy(logits, ids(1, 5)), opError(IndexOutOfRangeError, "cross_entropy", /target 5 out of range for 4 classes/));
      assert.throws(() => k.crossEntropy(logits, ids(-1, 0)), opError(IndexOutOfRangeError, "cross_entropy", /target -1 out of range for 4 classes/));
      assert.ok(Math.abs(k.crossEntropy(logits, ids(-100, 3)).item() - Math.log(4)) < 1e-6, "ignore_index is not a class");
    });
  });

  describe("debug mode", () => {
    it("log(-1) raises NonFiniteError naming the op; strict mode returns NaN", () => {
      const x = t([1, -1]);
      assert.ok(Number.isNaN(x.log().toList()[1]!));
      assert.throws(() => k.withEagerMode("debug", () => x.log()), opError(NonFiniteError, "log", /NaN at flat index 1/));
      assert.throws(() => k.withEagerMode("debug", () => x.sqrt()), opError(NonFiniteError, "sqrt"));
      assert.throws(() => k.withEagerMode("debug", () => k.reciprocal(t([0]))), opError(NonFiniteError, "reciprocal", /Infinity/));
      assert.throws(() => k.withEagerMode("debug", () => x.div(t([0, 1]))), opError(NonFiniteError, "div"));
      assert.equal(k.eagerMode(), "strict", "the mode is restored after a throw");
    });
    it("finite work and masked attention pass the checks", () => {
      const out = k.withEagerMode("debug", () => {
        const q = k.randn([1, 2, 3, 4], { device: dev, generator: new k.Generator(1) });
        return k.causalAttention(q, q, q).sum().item();
      });
      assert.ok(Number.isFinite(out));
    });
  });

  describe("devices", () => {
    it("ops refuse tensors on different devices", () => {
      const other = dev === "reference" ? null : k.zeros([2], { device: "reference" });
      if (other) assert.throws(() => k.zeros([2], { device: dev }).add(other), opError(OpError, "add", /different devices/));
    });
  });
});

describe("back-end registry", () => {
  it("a misspelled KILN_NATIVE_ISA is refused naming the values (the addon took it for the scalar path)", () => {
    const script = `import(${JSON.stringify(new URL("../../src/tensor/index.js", import.meta.url).href)}).then((k) => console.log(k.tensor([1, 2]).add(1).toList()))`;
    const run = (isa: string) => spawnSync(process.execPath, ["--input-type=module", "-e", script], { env: { ...process.env, KILN_NATIVE_ISA: isa }, encoding: "utf8" });
    const bad = run("AVX2");
    assert.notEqual(bad.status, 0);
    assert.match(bad.stderr, /KILN_NATIVE_ISA=AVX2 is not one of avx512-bf16, avx512, avx2, scalar/);
    const good = run("scalar");
    assert.equal(good.status, 0, good.stderr);
    assert.match(good.stdout, /\[ 2, 3 \]/);
  });

  it("an unknown back end raises BackendUnavailableError naming it", () => {
    assert.throws(() => getBackend("tpu-nope"), (e: unknown) => e instanceof BackendUnavailableError && e.backend === "tpu-nope" && /known: reference, cpu/.test(e.message));
    assert.throws(() => k.device("tpu-nope"), BackendUnavailableError);
    assert.throws(() => k.zeros([1], { device: "tpu-nope" }), BackendUnavailableError);
    assert.throws(() => k.setDefaultDevice("tpu-nope"), BackendUnavailableError);
  });
  it("eager modes are validated", () => {
    assert.throws(() => k.setEagerMode("fast" as k.EagerMode), /unknown eager mode/);
  });
});
