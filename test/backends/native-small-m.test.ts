// Small-M matmul (decode: x[M,K] @ W[N,K]^T, M = 1..128, f32 or bf16 W) against a float64 reference, and
// against the M = 1 (GEMV) path row by row so batched and single-stream decode agree. M = 1 also over long N
// (one prefetched contiguous share per thread, shares ending inside a tile, odd tile counts).
// K and N with tails (577, 100, 37), misaligned x, the aTransposed and batched entry points.
// The parent process runs the suite once per ISA the machine supports, each in a child process.
import { test } from "node:test";
import assert from "node:assert/strict";
import { tryLoadNativeKernels, type NativeKernels } from "../../src/backends/cpu/native.js";
import { runIsaChildren, supportedIsas } from "../helpers/isa-children.js";
import { mulberry32 } from "../../src/util/random.js";
import { bf16BitsToF32, f32ToBf16Bits } from "../../src/backends/dtype.js";

const k = tryLoadNativeKernels();
const childIsa = process.env.KILN_NATIVE_TEST_CHILD ? process.env.KILN_NATIVE_ISA : undefined;

const rand = mulberry32(987654321); // deterministic inputs so failures reproduce
function randArray(n: number): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = 2 * rand() - 1;
  return a;
}
const bf16Round = f32ToBf16Bits; // round to nearest even
const bf16Value = bf16BitsToF32;

interface Weights { raw: Float32Array | Uint16Array; values: Float32Array; dtype: 0 | 1 }
function weights(N: number, K: number, dtype: 0 | 1): Weights {
  const w = randArray(N * K);
  if (dtype === 0) return { raw: w, values: w, dtype };
  const raw = new Uint16Array(w.length);
  const values = new Float32Array(w.length);
  for (let i = 0; i < w.length; i++) { raw[i] = bf16Round(w[i]!); values[i] = bf16Value(raw[i]!); }
  return { raw, values, dtype };
}

// |got - ref| <= rel * max(|ref|, sum|x*w| / sqrt(K)): relative to the result, or to the typical size
// of a sum of K random-sign terms when the result cancels towards 0.
// On avx512-bf16, bf16 products with M >= k.bf16DotMinM round x to bf16 (native-bf16-gemm.test.ts tests
// that kernel); here the reference rounds x likewise, except for products that always stay exact (`exact`: x
// stored [K,M]).
function check(got: Float32Array, x0: Float32Array, w: Weights, M: number, N: number, K: number, what: string, exact = false): void {
  const dotMinM = k!.bf16DotMinM ?? 0;
  const x = !exact && w.dtype === 1 && dotMinM > 0 && M >= dotMinM ? x0.map((v) => bf16Value(bf16Round(v))) : x0;
  for (let m = 0; m < M; m++)
    for (let n = 0; n < N; n++) {
      let dot = 0, abs = 0;
      for (let kk = 0; kk < K; kk++) {
        const p = x[m * K + kk]! * w.values[n * K + kk]!;
        dot += p;
        abs += Math.abs(p);
      }
      const g = got[m * N + n]!;
      const tol = 1e-4 * Math.max(Math.abs(dot), abs / Math.sqrt(K));
      if (!(Math.abs(g - dot) <= tol)) assert.fail(`${what} at [${m},${n}]: got ${g}, want ${dot} (tol ${tol})`);
    }
}

if (!childIsa) {
  test("native small-M matmul: every supported ISA", { skip: k ? false : "native addon not built" }, () => {
    runIsaChildren(import.meta.url, supportedIsas(k!), "KILN_NATIVE_TEST_CHILD");
  });
} else {
  runSuite(k!, childIsa);
}

function runSuite(k: NativeKernels, isa: string): void {
  const Ms = [1, 2, 3, 5, 6, 7, 8, 13, 31, 32, 33, 64, 97, 128]; // the small-M kernels cover 1..128
  for (const threads of [1, 2])
    for (const dtype of [0, 1] as const)
      test(`[${isa}] x[M,K] @ W^T vs float64, ${dtype ? "bf16" : "f32"} W, ${threads} thread(s)`, () => {
        k.setNumThreads(threads);
        for (const [N, K] of [[37, 577], [64, 100], [53, 576]] as const) {
          const w = weights(N, K, dtype);
          for (const M of Ms) {
            const x = randArray(M * K);
            const out = new Float32Array(M * N).fill(NaN);
            k.matmul(x, w.raw, out, M, N, K, true, dtype, 1, 0, 0, 0);
            check(out, x, w, M, N, K, `M=${M} N=${N} K=${K}`);
          }
        }
      });

  test(`[${isa}] M = 1 over long and odd N (per-thread shares, prefetch bounds, misaligned x)`, () => {
    for (const threads of [1, 2])
      for (const dtype of [0, 1] as const)
        for (const [N, K] of [[2053, 577], [4096, 64], [9, 1536], [7, 16]] as const) {
          k.setNumThreads(threads);
          const w = weights(N, K, dtype);
          const backing = randArray(K + 1);
          for (const x of [backing.subarray(0, K), backing.subarray(1)]) {
            const out = new Float32Array(N + 1).fill(NaN);
            k.matmul(x, w.raw, out, 1, N, K, true, dtype, 1, 0, 0, 0);
            check(out, x, w, 1, N, K, `${threads}T dtype ${dtype} N=${N} K=${K}`);
            assert.ok(Number.isNaN(out[N]!), "wrote past the output");
          }
        }
  });

  test(`[${isa}] batched rows agree with the single-row (GEMV) path`, () => {
    k.setNumThreads(2);
    for (const dtype of [0, 1] as const) {
      // bf16 on avx512-bf16: the largest M that batched decode runs in exact f32 (larger M rounds x)
      const dotMinM = k.bf16DotMinM ?? 0;
      const N = 45, K = 577, M = dtype === 1 && dotMinM > 0 ? Math.min(32, dotMinM - 1) : 32;
      const w = weights(N, K, dtype);
      const x = randArray(M * K);
      const out = new Float32Array(M * N);
      k.matmul(x, w.raw, out, M, N, K, true, dtype, 1, 0, 0, 0);
      const row = new Float32Array(N);
      for (let m = 0; m < M; m++) {
        k.matmul(x.subarray(m * K, (m + 1) * K), w.raw, row, 1, N, K, true, dtype, 1, 0, 0, 0);
        for (let n = 0; n < N; n++) {
          let abs = 0;
          for (let kk = 0; kk < K; kk++) abs += Math.abs(x[m * K + kk]! * w.values[n * K + kk]!);
          const d = Math.abs(out[m * N + n]! - row[n]!);
          assert.ok(d <= 1e-5 * abs / Math.sqrt(K), `dtype ${dtype} [${m},${n}]: batched ${out[m * N + n]} vs single ${row[n]}`);
        }
      }
    }
  });

  test(`[${isa}] misaligned x, aTransposed and batched calls`, () => {
    k.setNumThreads(2);
    const M = 13, N = 37, K = 576;
    for (const dtype of [0, 1] as const) {
      const w = weights(N, K, dtype);
      // x at a 4-byte offset: not 64-byte aligned
      const backing = randArray(M * K + 1);
      const x = backing.subarray(1);
      const out = new Float32Array(M * N);
      k.matmul(x, w.raw, out, M, N, K, true, dtype, 1, 0, 0, 0);
      check(out, x, w, M, N, K, "misaligned x");
      // A stored [K,M]
      const xT = new Float32Array(K * M);
      for (let m = 0; m < M; m++) for (let kk = 0; kk < K; kk++) xT[kk * M + m] = x[m * K + kk]!;
      out.fill(NaN);
      k.matmul(xT, w.raw, out, M, N, K, true, dtype, 1, 0, 0, 0, true);
      check(out, x, w, M, N, K, "aTransposed", true);
      // two batch items sharing W, padded output stride
      const x2 = randArray(2 * M * K);
      const out2 = new Float32Array(2 * (M * N + 5)).fill(NaN);
      k.matmul(x2, w.raw, out2, M, N, K, true, dtype, 2, M * K, 0, M * N + 5);
      for (let b = 0; b < 2; b++)
        check(out2.subarray(b * (M * N + 5)), x2.subarray(b * M * K), w, M, N, K, `batch item ${b}`);
    }
  });
}
