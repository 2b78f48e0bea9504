// loraApply (multi-LoRA BGMV): hand-computed values and shape errors on every back end; the native kernel against the
// TS reference on every ISA the machine runs (one child process each: the addon reads KILN_NATIVE_ISA once); a
// step-graph capture replayed with new x and slots.
import assert from "node:assert/strict";
import { describe, it, test } from "node:test";
import * as k from "../../src/tensor/index.js";
import type { Tensor } from "../../src/tensor/index.js";
import type { CpuBackend } from "../../src/backends/cpu/cpu-backend.js";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { OpError } from "../../src/util/errors.js";
import { runIsaChildren, supportedIsas } from "../helpers/isa-children.js";
import { assertClose, forEachBackend, prng, values } from "./suite.js";

const native = tryLoadNativeKernels();
const skip = !native && "native kernels not built";
const childIsa = process.env.KILN_LORA_TEST_CHILD ? process.env.KILN_NATIVE_ISA : undefined;

/** One loraApply problem as host data: base [T, N], x [T, K], a [S, R, K], b [S, R, N], scales [S], slots [T]. */
interface Problem {
  T: number; N: number; K: number; R: number; S: number;
  base: Float32Array; x: Float32Array; a: Float32Array; b: Float32Array; scales: Float32Array; slots: Int32Array;
}

/** n uniform values in [-1, 1) from `rand`. */
const uniform = (rand: () => number, n: number) => Float32Array.from({ length: n }, () => rand() * 2 - 1);

function problem(T: number, N: number, K: number, R: number, S: number, slots: number[], seed: number): Problem {
  const rand = prng(seed);
  const fill = (n: number) => uniform(rand, n);
  assert.equal(slots.length, T);
  return {
    T, N, K, R, S, base: fill(T * N), x: fill(T * K), a: fill(S * R * K), b: fill(S * R * N),
    scales: Float32Array.from({ length: S }, (_, i) => 0.25 + 0.5 * i), slots: Int32Array.from(slots),
  };
}

function tensors(p: Problem, device: string): Tensor[] {
  const f = (data: Float32Array, shape: number[]) => k.tensor(data, { device, shape });
  return [
    f(p.base, [p.T, p.N]), f(p.x, [p.T, p.K]), f(p.a, [p.S, p.R, p.K]), f(p.b, [p.S, p.R, p.N]), f(p.scales, [p.S]),
    k.tensor(p.slots, { device, shape: [p.T] }),
  ];
}

function apply(p: Problem, device: string): number[] {
  const ts = tensors(p, device);
  const [base, x, a, b, scales, slots] = ts as [Tensor, Tensor, Tensor, Tensor, Tensor, Tensor];
  const out = k.loraApply(base, x, a, b, scales, slots);
  assert.deepEqual([...out.shape], [p.T, p.N]);
  const got = values(out);
  for (const t of [...ts, out]) t.dispose();
  return got;
}

/**
 * The sum of the magnitudes of every term of each output (|base| + |scale| sum_r |b| sum_k |a x|): float32 rounding
 * errors are a small multiple of eps times this, however the kernel orders its sums.
 */
function magnitudes(p: Problem): Float64Array {
  const mag = Float64Array.from(p.base, Math.abs);
  for (let t = 0; t < p.T; t++) {
    const s = p.slots[t]!;
    if (s < 0 || s >= p.S) continue;
    for (let r = 0; r < p.R; r++) {
      let u = 0;
      for (let i = 0; i < p.K; i++) u += Math.abs(p.a[(s * p.R + r) * p.K + i]! * p.x[t * p.K + i]!);
      for (let n = 0; n < p.N; n++) mag[t * p.N + n] += Math.abs(p.scales[s]! * p.b[(s * p.R + r) * p.N + n]!) * u;
    }
  }
  return mag;
}

function assertNativeMatchesReference(p: Problem, what: string): void {
  const got = apply(p, "cpu");
  const want = apply(p, "reference");
  const mag = magnitudes(p);
  for (let i = 0; i < want.length; i++) {
    const err = Math.abs(got[i]! - want[i]!);
    if (!(err <= 1e-6 * mag[i]! + 1e-7)) assert.fail(`${what}: element ${i}: got ${got[i]}, want ${want[i]} (|err| ${err})`);
  }
  // rows without an adapter are base's, bit for bit
  for (let t = 0; t < p.T; t++) {
    const s = p.slots[t]!;
    if (s >= 0 && s < p.S && p.R > 0) continue;
    assert.deepEqual(got.slice(t * p.N, (t + 1) * p.N), Array.from(p.base.subarray(t * p.N, (t + 1) * p.N)), `${what}: row ${t}`);
  }
}

// ---------------------------------------------------------------- child: native vs reference on one ISA
if (childIsa) {
  describe(`loraApply native (${childIsa}) vs reference`, () => {
    const mixed = (T: number, S: number, seed: number) => {
      const rand = prng(seed);
      return Array.from({ length: T }, () => Math.floor(rand() * (S + 2)) - 1); // -1 .. S (S: out of range)
    };
    // slots 0, 1, ... in runs of `length` tokens (sequences of a prefill), every 97th token without an adapter
    const runs = (T: number, length: number) => Array.from({ length: T }, (_, i) => (i % 97 === 5 ? -1 : Math.floor(i / length)));
    const cases: { name: string; T: number; N: number; K: number; R: number; S: number; slots: number[] }[] = [
      { name: "decode, one token", T: 1, N: 17, K: 33, R: 4, S: 2, slots: [1] },
      { name: "decode, no adapter", T: 1, N: 40, K: 16, R: 8, S: 2, slots: [-1] },
      { name: "decode, two tokens", T: 2, N: 100, K: 67, R: 8, S: 3, slots: [2, -1] },
      { name: "decode, a run of one slot and an out-of-range one", T: 3, N: 31, K: 5, R: 3, S: 2, slots: [0, 0, 7] },
      { name: "decode, four slots", T: 4, N: 1000, K: 257, R: 16, S: 3, slots: [0, 2, -1, 1] },
      { name: "decode, threaded", T: 4, N: 4100, K: 1030, R: 16, S: 3, slots: [1, 1, -2147483648, 2147483647] },
      { name: "decode, one token threaded", T: 1, N: 8200, K: 2050, R: 24, S: 2, slots: [1] },
      {
        name: "prefill, runs of slots",
        T: 64, N: 320, K: 192, R: 16, S: 3,
        slots: Array.from({ length: 64 }, (_, i) => (i < 19 ? 0 : i < 22 ? -1 : i < 39 ? 2 : i === 39 ? 7 : i < 50 ? 1 : (i % 3) - 1)),
      },
      // 32 token groups: the kernel's one-pass prefill path on up to 16 threads
      { name: "prefill, long", T: 512, N: 96, K: 80, R: 8, S: 4, slots: runs(512, 110) },
      { name: "prefill, random slots", T: 37, N: 65, K: 48, R: 5, S: 3, slots: mixed(37, 3, 5) },
      { name: "prefill, large rank", T: 21, N: 130, K: 77, R: 64, S: 2, slots: mixed(21, 2, 6) },
      { name: "rank 0", T: 2, N: 5, K: 3, R: 0, S: 1, slots: [0, 0] },
      { name: "K 0", T: 2, N: 9, K: 0, R: 2, S: 1, slots: [0, -1] },
      { name: "no slots", T: 3, N: 9, K: 4, R: 2, S: 0, slots: [0, -1, 1] },
      { name: "no tokens", T: 0, N: 9, K: 4, R: 2, S: 2, slots: [] },
    ];
    for (const [i, c] of cases.entries())
      it(`${c.name} (T ${c.T} N ${c.N} K ${c.K} R ${c.R} S ${c.S})`, () =>
        assertNativeMatchesReference(problem(c.T, c.N, c.K, c.R, c.S, c.slots, 100 + i), c.name));
  });
} else {
  test("loraApply native kernel matches the reference on every supported ISA", { skip }, () => {
    runIsaChildren(import.meta.url, supportedIsas(native!, { bf16: false }), "KILN_LORA_TEST_CHILD");
  });
  forEachBackend(suite);
  test("loraApply in a step-graph replay reads new x and slots", { skip }, replayTest);
}

// ---------------------------------------------------------------- every back end: values, layouts, errors
function suite(device: string): void {
  const f = (data: number[], shape: number[]) => k.tensor(Float32Array.from(data), { device, shape });
  const ids = (...xs: number[]) => k.tensor(Int32Array.from(xs), { device });

  /** T 3, N 2, K 2, R 1, S 2: slot 1, no adapter, slot 0. */
  function tiny() {
    return {
      base: f([1, 2, 3, 4, 5, 6], [3, 2]),
      x: f([2, 1, 3, 4, 3, 1], [3, 2]),
      a: f([1, 1, 2, -1], [2, 1, 2]), // a[0] = [[1, 1]], a[1] = [[2, -1]]
      b: f([1, 2, -1, 3], [2, 1, 2]), // b[0] = [[1, 2]], b[1] = [[-1, 3]]
      scales: f([0.5, 2], [2]),
      slots: ids(1, -1, 0),
    };
  }

  it("hand-computed values; base is preserved", () => {
    const { base, x, a, b, scales, slots } = tiny();
    const out = k.loraApply(base, x, a, b, scales, slots);
    // row 0, slot 1: u = 2*2 - 1*1 = 3, delta = 2 * 3 * [-1, 3] = [-6, 18]
    // row 1, slot -1: base
    // row 2, slot 0: u = 3 + 1 = 4, delta = 0.5 * 4 * [1, 2] = [2, 4]
    assertClose(out, [-5, 20, 3, 4, 7, 10], { atol: 0, rtol: 0, shape: [3, 2] });
    assert.deepEqual(values(base), [1, 2, 3, 4, 5, 6]);
    for (const t of [base, x, a, b, scales, slots, out]) t.dispose();
  });

  it("strided and non-float32 inputs are read as contiguous float32", () => {
    const { base, x, a, b, scales, slots } = tiny();
    const xT = f([2, 3, 3, 1, 4, 1], [2, 3]); // x transposed
    const xStrided = k.transpose(xT, 0, 1);
    const aHalf = a.to("float16"); // small integers: exact in float16
    const out = k.loraApply(base, xStrided, aHalf, b, scales, slots);
    assertClose(out, [-5, 20, 3, 4, 7, 10], { atol: 0, rtol: 0 });
    for (const t of [base, x, a, b, scales, slots, xT, xStrided, aHalf, out]) t.dispose();
  });

  it("no tokens", () => {
    const out = k.loraApply(f([], [0, 3]), f([], [0, 2]), f([1, 1], [1, 1, 2]), f([1, 1, 1], [1, 1, 3]), f([1], [1]), ids());
    assert.deepEqual([...out.shape], [0, 3]);
    out.dispose();
  });

  it("shape, dtype and autograd errors name the op", () => {
    const { base, x, a, b, scales, slots } = tiny();
    const err = (re: RegExp) => (e: unknown) => e instanceof OpError && e.op === "lora_apply" && re.test(e.message);
    assert.throws(() => k.loraApply(base.reshape(6), x, a, b, scales, slots), err(/expects base \[T, N\]/));
    assert.throws(() => k.loraApply(base, x.narrow(0, 0, 2), a, b, scales, slots), err(/x \[2, 2\] has 2 rows/));
    assert.throws(() => k.loraApply(base, x, f([1, 2, 3, 4, 5, 6], [2, 1, 3]), b, scales, slots), err(/a \[2, 1, 3\] must be \[S, R, 2\]/));
    assert.throws(() => k.loraApply(base, x, a, f([1, 2, 3, 4, 5, 6], [2, 1, 3]), scales, slots), err(/b \[2, 1, 3\] must be \[2, 1, 2\]/));
    assert.throws(() => k.loraApply(base, x, a, b, f([1], [1]), slots), err(/one entry per slot \(2\)/));
    assert.throws(() => k.loraApply(base, x, a, b, scales, ids(0, 1)), err(/one entry per row of base \(3\)/));
    assert.throws(() => k.loraApply(base, x, a, b, scales, f([1, -1, 0], [3])), err(/slots must be int32, got float32/));
    const xInt = k.tensor(Int32Array.from([2, 1, 3, 4, 3, 1]), { device, shape: [3, 2] });
    assert.throws(() => k.loraApply(base, xInt, a, b, scales, slots), err(/x must be a floating dtype, got int32/));
    const aGrad = k.tensor(Float32Array.from([1, 1, 2, -1]), { device, shape: [2, 1, 2], requiresGrad: true });
    assert.throws(() => k.loraApply(base, x, aGrad, b, scales, slots), err(/inference-only/));
    const out = k.noGrad(() => k.loraApply(base, x, aGrad, b, scales, slots)); // fine without autograd
    assertClose(out, [-5, 20, 3, 4, 7, 10], { atol: 0, rtol: 0 });
    for (const t of [base, x, a, b, scales, slots, xInt, aGrad, out]) t.dispose();
  });
}

// ---------------------------------------------------------------- cpu step graphs
async function replayTest(): Promise<void> {
  const be = k.device("cpu").backend as CpuBackend;
  const p = problem(5, 70, 24, 4, 3, [0, 1, 2, -1, 1], 11);
  const ts = tensors(p, "cpu");
  const [base, x, a, b, scales, slots] = ts as [Tensor, Tensor, Tensor, Tensor, Tensor, Tensor];
  const put = (t: Tensor, data: Int32Array | Float32Array) =>
    be.writeAsync(t.storage.buffer, t.offset * 4, new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
  await be.synchronize();
  be.beginCapture();
  let out: Tensor;
  try {
    out = k.loraApply(base, x, a, b, scales, slots);
  } catch (e) {
    be.abortCapture();
    throw e;
  }
  const graph = be.endCapture();
  assert.equal(graph.kernels, 1);
  const steps = [
    { x: p.x, slots: [0, 1, 2, -1, 1] },
    { x: uniform(prng(12), 5 * 24), slots: [2, 2, -1, 9, 0] },
  ];
  const outputs: number[][] = [];
  for (const step of steps) {
    put(x, step.x);
    put(slots, Int32Array.from(step.slots));
    graph.launch();
    const got = values(out);
    const want = apply({ ...p, x: step.x, slots: Int32Array.from(step.slots) }, "reference");
    assertClose(got, want, { rtol: 1e-5, atol: 1e-5 });
    outputs.push(got);
  }
  assert.notDeepEqual(outputs[0], outputs[1]);
  graph.dispose();
  for (const t of [...ts, out]) t.dispose();
}
