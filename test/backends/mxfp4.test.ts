// MXFP4 (native/quant-mxfp4.inc, quant-reference.ts): the quantizer against hand-computed codes and scales (OCP:
// shared exponent floor(log2(amax)) - 2, nearest E2M1 with ties to even, saturation at 6), and the kernels against
// an exact f64 matmul of hand-decoded weights, with activations that the per-row int8 quantization keeps exact.
// Random-data agreement with the reference over M = 1..130 lives in quant-kernels.test.ts. Runs per ISA in children.
import { test } from "node:test";
import assert from "node:assert/strict";
import { tryLoadNativeKernels, type NativeKernels } from "../../src/backends/cpu/native.js";
import {
  dequantizeRef, e8m0ToFloat, floatToE2m1, mxfp4Exponent, nativeQuantCode, nativeTakesScheme, quantMatmulRef, quantizeWeightsRef,
} from "../../src/backends/cpu/quant-reference.js";
import { mulberry32 } from "../../src/util/random.js";
import { runIsaChildren, supportedIsas } from "../helpers/isa-children.js";

const k = tryLoadNativeKernels();
const childIsa = process.env.KILN_MXFP4_TEST_CHILD ? process.env.KILN_NATIVE_ISA : undefined;

// One 64-element row = two groups. Group 0 has amax exactly 6 * 2^-3 (e = 124, scale 2^-3) and, in units of the
// scale, every tie of E2M1's grid plus saturation-free values; group 1 has amax 7.9 (saturates to 6, e = 127).
const G0_UNITS = [6, -6, 3, 1.5, 0.5, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 5.5, -0.1, -0.75, -2.5, 4, -1];
// codes: 6 -> 7, -6 -> 15, 3 -> 5, 1.5 -> 3, 0.5 -> 1, ties: 0.25 -> 0 (0, not 0.5), 0.75 -> 2 (1, not 0.5),
// 1.25 -> 2 (1, not 1.5), 1.75 -> 4 (2), 2.5 -> 4 (2, not 3), 3.5 -> 6 (4), 5 -> 6 (4, not 6); 5.5 -> 7 (6),
// -0.1 -> 0 (+0), -0.75 -> 10, -2.5 -> 12, 4 -> 6, -1 -> 10; the remaining 14 elements are 0
const G0_CODES = [7, 15, 5, 3, 1, 0, 2, 2, 4, 4, 6, 6, 7, 0, 10, 12, 6, 10];
const G1_VALUES = [7.9, -7.9, 6.5, 0.3, -4.4];
const G1_CODES = [7, 15, 7, 1, 14]; // scale 1: 7.9, 6.5 saturate to 6; 0.3 -> 0.5; -4.4 -> -4

function handRow(): { w: Float32Array; codes: number[]; scales: number[] } {
  const w = new Float32Array(64);
  const codes = new Array<number>(64).fill(0);
  G0_UNITS.forEach((u, i) => ((w[i] = u / 8), (codes[i] = G0_CODES[i]!)));
  G1_VALUES.forEach((v, i) => ((w[32 + i] = v), (codes[32 + i] = G1_CODES[i]!)));
  return { w, codes, scales: [124, 127] };
}
/** Kiln's nibble order: byte j of a 64-element chunk holds element j (low) and 32 + j (high). */
function pack(codes: number[]): Uint8Array {
  const out = new Uint8Array(codes.length / 2);
  for (let c = 0; c < codes.length / 64; c++) for (let j = 0; j < 32; j++) out[c * 32 + j] = codes[c * 64 + j]! | (codes[c * 64 + 32 + j]! << 4);
  return out;
}

test("mxfp4 reference: shared exponent, E2M1 rounding and E8M0 decoding by hand", () => {
  assert.equal(mxfp4Exponent(6 * 2 ** -3), 124); // floor(log2(0.75)) - 2 + 127
  assert.equal(mxfp4Exponent(8), 128); // 8 = 4 * 2^1: scale 2, element 4
  assert.equal(mxfp4Exponent(Math.fround(4 * (1 - 2 ** -24))), 126); // just below 4: floor(log2) = 1 (log2f rounds to 2)
  assert.equal(mxfp4Exponent(0), 0);
  assert.equal(mxfp4Exponent(1e-40), 0); // clamped: below 2^-125
  assert.equal(floatToE2m1(6.01), 7);
  assert.equal(floatToE2m1(-100), 15);
  assert.equal(floatToE2m1(-0), 0);
  assert.equal(e8m0ToFloat(127), 1);
  assert.equal(e8m0ToFloat(0), 2 ** -127);
  const { w, codes, scales } = handRow();
  const q = quantizeWeightsRef("mxfp4", w, 1, 64);
  assert.deepEqual([...q.scales], scales);
  assert.deepEqual([...q.data], [...pack(codes)]);
  // an all-zero block: exponent 0, codes 0; dequantized back exactly
  const z = quantizeWeightsRef("mxfp4", new Float32Array(64), 1, 64);
  assert.deepEqual([...z.scales], [0, 0]);
  assert.ok(z.data.every((b) => b === 0));
  const dq = dequantizeRef("mxfp4", q, 1, 64);
  assert.deepEqual([...dq.subarray(0, 4)], [6 / 8, -6 / 8, 3 / 8, 1.5 / 8]);
  assert.deepEqual([...dq.subarray(32, 37)], [6, -6, 6, 0.5, -4]);
});

if (!childIsa) {
  test("mxfp4 kernels: every supported ISA", { skip: k ? false : "native addon not built", timeout: 120_000 }, () => {
    runIsaChildren(import.meta.url, supportedIsas(k!, { bf16: false }), "KILN_MXFP4_TEST_CHILD");
  });
} else {
  runSuite(k!, childIsa);
}

function runSuite(k: NativeKernels, isa: string): void {
  const skip = nativeTakesScheme(k, "mxfp4") ? false : "addon rejects scheme code 5";

  test(`[${isa}] mxfp4 native quantizer: hand-computed codes and scales`, { skip }, () => {
    const { w, codes, scales } = handRow();
    const data = new Uint8Array(32);
    const sc = new Uint8Array(2);
    k.quantizeWeights(w, 1, 64, nativeQuantCode("mxfp4"), data, sc, new Int32Array(0));
    assert.deepEqual([...sc], scales);
    assert.deepEqual([...data], [...pack(codes)]);
    const zero = new Uint8Array(2).fill(9);
    k.quantizeWeights(new Float32Array(64), 1, 64, nativeQuantCode("mxfp4"), data, zero, new Int32Array(0));
    assert.deepEqual([...zero], [0, 0]);
    assert.ok(data.every((b) => b === 0));
  });

  // Random codes (all 16, -0 included) and exponents; x integer with |x| <= 127 and 127 in every row, so the
  // kernel's activation quantization is exact (scale 1) and out must equal the f64 product up to f32 rounding.
  test(`[${isa}] mxfp4 quantMatmul equals the exact product, M = 1, 2, 3, 5, 16, 33; odd N`, { skip }, () => {
    const rand = mulberry32(77);
    for (const threads of [1, 2]) {
      k.setNumThreads(threads);
      for (const [n, kk] of [[7, 128], [13, 192], [67, 64], [3, 576]] as const) {
        const data = Uint8Array.from({ length: (n * kk) / 2 }, () => Math.floor(rand() * 256));
        const scales = Uint8Array.from({ length: (n * kk) / 32 }, () => 112 + Math.floor(rand() * 24));
        const wdq = dequantizeRef("mxfp4", { data, scales, rowSums: new Int32Array(0) }, n, kk);
        for (const m of [1, 2, 3, 5, 16, 33]) {
          const x = Float32Array.from({ length: m * kk }, (_, i) => (i % kk === 5 ? 127 : Math.round(rand() * 254) - 127));
          const out = new Float32Array(m * n);
          k.quantMatmul(x, data, scales, new Int32Array(0), out, m, n, kk, nativeQuantCode("mxfp4"));
          const ref = quantMatmulRef("mxfp4", x, { data, scales, rowSums: new Int32Array(0) }, m, n, kk);
          for (let r = 0; r < m; r++)
            for (let c = 0; c < n; c++) {
              let exact = 0;
              let abs = 0;
              for (let i = 0; i < kk; i++) {
                exact += x[r * kk + i]! * wdq[c * kk + i]!;
                abs += Math.abs(x[r * kk + i]! * wdq[c * kk + i]!);
              }
              const tol = 1e-6 * abs + 1e-30;
              const at = `M=${m} N=${n} K=${kk} [${r},${c}] ${threads} thread(s)`;
              assert.ok(Math.abs(out[r * n + c]! - exact) <= tol, `${at}: ${out[r * n + c]} vs exact ${exact}`);
              assert.ok(Math.abs(ref[r * n + c]! - exact) <= tol, `${at}: reference ${ref[r * n + c]} vs exact ${exact}`);
            }
        }
      }
    }
  });

  test(`[${isa}] mxfp4 argument checks`, { skip }, () => {
    const code = nativeQuantCode("mxfp4");
    assert.throws(() => k.quantMatmul(new Float32Array(96), new Uint8Array(48), new Uint8Array(3), new Int32Array(0), new Float32Array(1), 1, 1, 96, code), /multiple of 64/);
    // e8m0 scales are bytes: an f16 (Uint16Array) scales array is refused, as is a short one
    assert.throws(() => k.quantMatmul(new Float32Array(64), new Uint8Array(32), new Uint16Array(2), new Int32Array(0), new Float32Array(1), 1, 1, 64, code), /Uint8Array/);
    assert.throws(() => k.quantMatmul(new Float32Array(64), new Uint8Array(32), new Uint8Array(1), new Int32Array(0), new Float32Array(1), 1, 1, 64, code), /needs 2/);
  });
}
