// defineOp() user kernels in eager and compiled mode; withDeferAndFuse() matches strict with fewer kernels.
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import * as k from "../../src/tensor/index.js";
import { compile, compiledLaunches, defineOp, jitUnavailableReason, withDeferAndFuse, type Sym } from "../../src/compile/index.js";
import { assertClose } from "../tensor/suite.js";
import { OpError } from "../../src/util/errors.js";

process.env.KILN_CACHE_DIR = mkdtempSync(join(tmpdir(), "kiln-custom-test-"));
const hasJit = jitUnavailableReason() === null;

// softplus in C (compiled + cached like generated code) with a TS reference
const softplus = defineOp({
  name: "test_softplus",
  shape: ([s]) => s!,
  kernels: {
    cpu: `#include <stdint.h>
#include <math.h>
void test_softplus(void** b, const int64_t* n) {
  const float* x = (const float*)b[0]; float* out = (float*)b[1];
  for (int64_t i = 0; i < n[1]; i++) out[i] = log1pf(expf(x[i]));
}`,
    reference: ([x], out) => x!.forEach((v, i) => (out[i] = Math.log1p(Math.exp(v)))),
  },
});
// a TS-only custom op taking two inputs
const scaledAdd = defineOp({
  name: "test_scaled_add",
  shape: ([a]) => a!,
  kernels: { reference: ([a, b], out) => a!.forEach((v, i) => (out[i] = v + 2 * b![i]!)) },
});

const xs = Float32Array.from({ length: 24 }, (_, i) => Math.sin(i) * 3);
const expectSoftplus = Array.from(xs, (v) => Math.log1p(Math.exp(v)));

describe("custom ops", () => {
  it("run eagerly (C kernel when a compiler exists)", () => {
    const x = k.tensor(xs, { shape: [4, 6] });
    assertClose(softplus(x), expectSoftplus, { rtol: 1e-5, atol: 1e-6 });
    const y = k.ones([4, 6]);
    assertClose(scaledAdd(x, y), Array.from(xs, (v) => v + 2));
  });

  it("run inside compiled graphs, between fused kernels", () => {
    const x = k.tensor(xs, { shape: [4, 6] });
    const f = compile((a: Sym) => scaledAdd(softplus(a.mul(1)).add(1), a).mul(0.5));
    const expected = expectSoftplus.map((v, i) => (v + 1 + 2 * xs[i]!) * 0.5);
    assertClose(f(x) as k.Tensor, expected, { rtol: 1e-5, atol: 1e-5 });
    if (hasJit) assert.equal(f.lastInfo!.opaqueKernels, 2);
  });

  it("read an integer input as float32 inside compiled graphs too, as eagerly (it read the int32 bits)", () => {
    const ints = k.tensor(Int32Array.of(-2, 0, 3));
    const f = compile((a: Sym) => scaledAdd(a, a));
    assert.deepEqual(scaledAdd(ints, ints).toList(), [-6, 0, 9]);
    assert.deepEqual((f(ints) as k.Tensor).toList(), [-6, 0, 9]);
  });

  it("autograd: a backward formula is used; without one backward() throws instead of dropping the gradient", () => {
    const cube = defineOp({
      name: "test_cube",
      shape: ([s]) => s!,
      kernels: { reference: ([x], out) => x!.forEach((v, i) => (out[i] = v * v * v)) },
      backward: { saves: "inputs", grad: (g, ctx) => [g.mul(ctx.inputs[0]!.square().mul(3))] },
    });
    const x = k.tensor([1, -2, 0.5], { requiresGrad: true });
    cube(x).sum().backward();
    assert.deepEqual(x.grad!.toList(), [3, 12, 0.75]);
    const y = k.tensor([1, 2], { requiresGrad: true });
    const out = scaledAdd(y, y).add(y); // d/dy = 3 through scaledAdd, which has no formula: it read 1 (scaledAdd's share lost)
    assert.equal(out.requiresGrad, true);
    assert.throws(() => out.sum().backward(), /\[test_scaled_add\] has no backward formula/);
    assert.equal(k.noGrad(() => scaledAdd(y, y)).requiresGrad, false);
  });

  it("an op of another dtype gets its TS kernel's float32 values converted; a C kernel that does not build is an OpError naming the op", () => {
    const halve = defineOp({ name: "test_halve_i32", dtype: "int32", shape: ([s]) => s!, kernels: { cpu: ([x], out) => x!.forEach((v, i) => (out[i] = v / 2)), reference: () => assert.fail("cpu runs") } });
    const h = halve(k.tensor([3, -5, 8]));
    assert.equal(h.dtype, "int32");
    assert.deepEqual(h.toList(), [1, -2, 4]); // truncated toward zero, as .to("int32")
    if (!hasJit) return;
    const broken = defineOp({ name: "test_broken_c", shape: ([s]) => s!, kernels: { cpu: "void test_broken_c(void** b, const int64_t* n) { syntax error }", reference: () => undefined } });
    assert.throws(() => broken(k.tensor([1])), (e: unknown) => e instanceof OpError && /\[test_broken_c\] its C kernel \(entry test_broken_c\) cannot be built or found: C compile failed/.test((e as Error).message));
    const misnamed = defineOp({ name: "test_misnamed_c", shape: ([s]) => s!, kernels: { cpu: "#include <stdint.h>\nvoid other(void** b, const int64_t* n) {}", reference: () => undefined } });
    assert.throws(() => misnamed(k.tensor([1])), (e: unknown) => e instanceof OpError && /\[test_misnamed_c\] its C kernel \(entry test_misnamed_c\) cannot be built or found/.test((e as Error).message));
  });

  it("refuses a built-in op's name, whose gradient it would have replaced", () => {
    const def = { shape: ([s]: number[][]) => s!, kernels: { reference: ([x]: Float32Array[], out: Float32Array) => out.set(x!) } };
    assert.throws(() => defineOp({ name: "mul", ...def, backward: { saves: "none", grad: (g) => [g.mul(1000)] } }), /\[defineOp\] "mul" is the name of a built-in op/);
    const x = k.tensor([1, 2], { requiresGrad: true });
    x.mul(3).sum().backward();
    assert.deepEqual(x.grad!.toList(), [3, 3]);
  });
});

describe("defer-and-fuse scope", () => {
  const chain = (t: any) => t.mul(2).add(1).silu().mul(t).sub(0.5).tanh();  

  it("gives the strict result with fewer kernels", () => {
    const x = k.tensor(Float32Array.from({ length: 4096 }, (_, i) => Math.cos(i)), { shape: [64, 64] });
    const k0 = k.kernelsDispatched();
    const strict = chain(x) as k.Tensor;
    const strictKernels = k.kernelsDispatched() - k0;
    const expected = strict.dataSync() as Float32Array;

    const d0 = k.kernelsDispatched();
    const l0 = compiledLaunches();
    const lazy = withDeferAndFuse((lazy) => chain(lazy(x)).toTensor() as k.Tensor);
    const deferredKernels = k.kernelsDispatched() - d0 + (compiledLaunches() - l0);
    assertClose(lazy, expected, { rtol: 1e-5, atol: 1e-6 });
    assert.ok(strictKernels >= 6, `strict ran ${strictKernels} kernels`);
    if (hasJit) assert.ok(deferredKernels <= 1, `defer-and-fuse ran ${deferredKernels} kernels`);
  });

  it("reuses realized values and flushes only what a read needs", () => {
    const x = k.tensor([1, 2, 3, 4]);
    withDeferAndFuse((lazy) => {
      const a = lazy(x).mul(3);
      assert.deepEqual(a.toList(), [3, 6, 9, 12]);
      const b = a.add(1).sum();
      assert.equal(b.item(), 34);
      assert.deepEqual(a.toList(), [3, 6, 9, 12]);
    });
  });
});
