// The avx512-bf16 table's large-M bf16 GEMM (native/gemm-bf16-impl.inc: x[M,K] @ W[N,K]^T with the
// activations rounded to bf16 and vdpbf16ps products, f32 accumulation) against two references:
// - the same math in TS (x rounded to bf16, nearest even; sums of exact products): tight tolerance,
//   far below the effect of the rounding itself (so a kernel that skipped or truncated it would fail);
// - the exact f32 product: loose tolerance, bounded by the rounding (|x - bf16(x)| <= 2^-9 |x|).
// M around the threshold (just below it the exact f32 path must still run), N and K tails (odd K: the
// last K-pair is half padding), 1 and 2 threads, batched calls. Runs only where the CPU has avx512_bf16. Where AMX
// runs (features().amx), K % 32 == 0 takes the AMX tiles (native/gemm-bf16-amx.inc), and the file runs again in a
// child with KILN_AMX=0 for the vdpbf16ps tiles.
import { test } from "node:test";
import assert from "node:assert/strict";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { mulberry32 } from "../../src/util/random.js";
import { bf16BitsToF32, f32ToBf16Bits } from "../../src/backends/dtype.js";
import { FP8_E4M3 } from "../../src/backends/cpu/quant-reference.js";
import { runIsaChildren } from "../helpers/isa-children.js";

const k = tryLoadNativeKernels();
const minM = k?.bf16DotMinM ?? 0;
const skip = !k ? "native addon not built" : k.isa !== "avx512-bf16" || minM <= 0 ? `no vdpbf16ps GEMM on ISA ${k.isa}` : false;
const amxChild = process.env.KILN_BF16_TEST_CHILD === "1";
if (!amxChild && !skip)
  test("bf16 GEMM: the same checks with AMX off (KILN_AMX=0)", { skip: k!.features().amx ? false : "no AMX here", timeout: 120_000 }, () =>
    runIsaChildren(import.meta.url, ["avx512-bf16:amx-off"], "KILN_BF16_TEST_CHILD"));

const rand = mulberry32(4242); // deterministic inputs so failures reproduce
function randArray(n: number): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = 2 * rand() - 1;
  return a;
}
/** f32 -> nearest bf16 (ties to even) -> f32. */
const bf16 = (x: number): number => bf16BitsToF32(f32ToBf16Bits(x));

interface Case { M: number; N: number; K: number }
interface Result { out: Float32Array; x: Float32Array; w: Float32Array }

/** Runs the native matmul on random x [M,K] and bf16 W [N,K]; w holds W's values as f32. */
function run({ M, N, K }: Case): Result {
  const x = randArray(M * K);
  const wRaw = new Uint16Array(N * K);
  k!.f32ToBf16(randArray(N * K), wRaw, N * K);
  const w = new Float32Array(N * K);
  k!.bf16ToF32(wRaw, w, N * K);
  const out = new Float32Array(M * N).fill(NaN);
  k!.matmul(x, wRaw, out, M, N, K, true, 1, 1, 0, 0, 0);
  return { out, x, w };
}

/**
 * Compares out with sum_k round(x)[m,k] * w[n,k] (round = bf16 or identity), in float64. tight: f32
 * accumulation of K random-sign terms errs ~2^-24 * rms(p) * K / sqrt(2); allow 2^-20 * rms(p) * K.
 * Loose (round = identity against a bf16-rounding kernel): |sum p_k d_k| <= 2^-9 * sum |p_k|; allow 2^-8.
 */
function compare(r: Result, { M, N, K }: Case, round: (v: number) => number, tight: boolean, what: string): void {
  const xr = r.x.map(round);
  for (let m = 0; m < M; m++)
    for (let n = 0; n < N; n++) {
      let dot = 0, abs = 0, sq = 0;
      for (let kk = 0; kk < K; kk++) {
        const p = xr[m * K + kk]! * r.w[n * K + kk]!;
        dot += p;
        abs += Math.abs(p);
        sq += p * p;
      }
      const tol = tight ? 2 ** -20 * Math.sqrt(sq / K) * K : 2 ** -8 * abs;
      const got = r.out[m * N + n]!;
      if (!(Math.abs(got - dot) <= tol + 1e-30))
        assert.fail(`${what} M=${M} N=${N} K=${K} at [${m},${n}]: got ${got}, want ${dot} (|err| ${Math.abs(got - dot)} > ${tol})`);
    }
}

const shapes: Case[] = [
  // around the threshold, odd and small N / K (K = 1: one half-padded pair), tails of the 32-column panels; on the
  // vdpbf16ps tiles (minM 24) panels of 12 (M = 24), 13 (25, 38, 64), 10 (29) and 11 (31) rows, 14 at M = 513 below
  ...[0, 1, 5, 7, 14, 40].map((dm) => ({ M: minM + dm, N: 33, K: 63 })),
  { M: minM, N: 1, K: 1 },
  { M: minM + 3, N: 17, K: 3 },
  { M: 45, N: 95, K: 577 },
  { M: 100, N: 64, K: 64 },
  { M: 130, N: 200, K: 1537 },
  { M: 513, N: 70, K: 96 },
  // K % 32 == 0 (the AMX tiles where they run): odd and even numbers of 16-row blocks and weight blocks, partial ones
  { M: minM, N: 16, K: 32 },
  { M: 47, N: 33, K: 576 },
  { M: 64, N: 48, K: 2048 },
];

for (const threads of [1, 2]) {
  test(`bf16 GEMM vs bf16-rounded reference (tight) and f32 (loose), ${threads} thread(s)`, { skip }, () => {
    k!.setNumThreads(threads);
    for (const c of shapes) {
      const r = run(c);
      compare(r, c, bf16, true, "vs bf16-rounded x");
      compare(r, c, (v) => v, false, "vs exact f32");
    }
  });
}

test("bf16 GEMM: M below the threshold stays exact f32", { skip }, () => {
  k!.setNumThreads(2);
  for (const c of [{ M: minM - 1, N: 45, K: 577 }, { M: 2, N: 33, K: 63 }]) compare(run(c), c, (v) => v, true, "exact path");
});

test("bf16 GEMM: batched calls with a shared W and padded output strides; aTransposed stays exact", { skip }, () => {
  k!.setNumThreads(2);
  const c = { M: minM + 9, N: 37, K: 130 };
  const x = randArray(2 * c.M * c.K);
  const wRaw = new Uint16Array(c.N * c.K);
  k!.f32ToBf16(randArray(c.N * c.K), wRaw, wRaw.length);
  const w = new Float32Array(wRaw.length);
  k!.bf16ToF32(wRaw, w, w.length);
  const so = c.M * c.N + 5;
  const out = new Float32Array(2 * so).fill(NaN);
  k!.matmul(x, wRaw, out, c.M, c.N, c.K, true, 1, 2, c.M * c.K, 0, so);
  for (let b = 0; b < 2; b++)
    compare({ out: out.subarray(b * so), x: x.subarray(b * c.M * c.K), w }, c, bf16, true, `batch item ${b}`);
  // A stored [K,M] (the linear weight gradient's g^T @ x) takes the exact packed f32 path
  const x0 = x.subarray(0, c.M * c.K);
  const xT = new Float32Array(c.K * c.M);
  for (let m = 0; m < c.M; m++) for (let kk = 0; kk < c.K; kk++) xT[kk * c.M + m] = x0[m * c.K + kk]!;
  const outT = new Float32Array(c.M * c.N).fill(NaN);
  k!.matmul(xT, wRaw, outT, c.M, c.N, c.K, true, 1, 1, 0, 0, 0, true);
  compare({ out: outT, x: x0, w }, c, (v) => v, true, "aTransposed");
});

// fp8 weights (quantMatmul scheme 2: e4m3fn codes [N,K], f32 row scales) at M >= fp8DotMinM take the same tiles, the
// codes read as their bf16 values while W's panels are packed and each output column times its row's scale.
const fp8MinM = k?.fp8DotMinM ?? 0;
const fp8Skip = skip || (fp8MinM <= 0 ? "no fp8 route to the vdpbf16ps tiles in this addon" : false);

/** Random fp8 codes (every code but the two NaNs, 0x7f and 0xff) and row scales. */
function fp8Weights(N: number, K: number): { codes: Uint8Array; scales: Float32Array } {
  const codes = new Uint8Array(N * K), scales = new Float32Array(N);
  for (let n = 0; n < N; n++) scales[n] = 2 ** (4 * rand() - 2) * (rand() < 0.5 ? 1 : 1.37);
  for (let i = 0; i < N * K; i++) {
    let c = Math.floor(rand() * 256);
    if ((c & 0x7f) === 0x7f) c = 0;
    codes[i] = c;
  }
  return { codes, scales };
}

/** out[m,n] against sum_k round(x[m,k]) * value(code[n,k]), times scale[n], in float64 (tolerances as compare's). */
function compareFp8(out: Float32Array, x: Float32Array, codes: Uint8Array, scales: Float32Array, { M, N, K }: Case,
                    round: (v: number) => number, tight: boolean, what: string): void {
  for (let m = 0; m < M; m++)
    for (let n = 0; n < N; n++) {
      let dot = 0, abs = 0, sq = 0;
      for (let kk = 0; kk < K; kk++) {
        const p = round(x[m * K + kk]!) * FP8_E4M3[codes[n * K + kk]!]! * scales[n]!;
        dot += p;
        abs += Math.abs(p);
        sq += p * p;
      }
      const tol = tight ? 2 ** -20 * Math.sqrt(sq / K) * K : 2 ** -8 * abs;
      const got = out[m * N + n]!;
      if (!(Math.abs(got - dot) <= tol + 1e-30))
        assert.fail(`${what} M=${M} N=${N} K=${K} at [${m},${n}]: got ${got}, want ${dot} (|err| ${Math.abs(got - dot)} > ${tol})`);
    }
}

for (const threads of [1, 2]) {
  test(`fp8 quantMatmul at M >= fp8DotMinM: bf16-rounded x (tight), f32 (loose), ${threads} thread(s)`, { skip: fp8Skip }, () => {
    k!.setNumThreads(threads);
    const cases: Case[] = [
      ...[0, 1, 5, 8, 13, 40].map((dm) => ({ M: fp8MinM + dm, N: 33, K: 63 })),
      { M: fp8MinM, N: 1, K: 1 },
      { M: 45, N: 95, K: 577 },
      { M: 130, N: 200, K: 1537 },
      { M: 513, N: 70, K: 96 },
      { M: 64, N: 48, K: 576 },
    ];
    for (const c of cases) {
      const { codes, scales } = fp8Weights(c.N, c.K);
      const x = randArray(c.M * c.K);
      const out = new Float32Array(c.M * c.N).fill(NaN);
      k!.quantMatmul(x, codes, scales, new Int32Array(0), out, c.M, c.N, c.K, 2);
      compareFp8(out, x, codes, scales, c, bf16, true, "fp8 vs bf16-rounded x");
      compareFp8(out, x, codes, scales, c, (v) => v, false, "fp8 vs exact f32");
    }
  });
}

test("fp8 quantMatmul on the vdpbf16ps tiles: every code's value exactly; below fp8DotMinM x stays f32", { skip: fp8Skip }, () => {
  k!.setNumThreads(2);
  // row m of x is one-hot at column m, so out[m, n] is code[n, m]'s value times scale[n]: one product term, exact.
  // Row 0 of W holds the 256 codes in order, row 1 the same reversed (the other half of a 32-row panel).
  const M = 256, N = 2, K = 256;
  const codes = new Uint8Array(N * K);
  for (let c = 0; c < 256; c++) codes[c] = (c & 0x7f) === 0x7f ? 0 : c;
  for (let c = 0; c < 256; c++) codes[K + c] = codes[255 - c]!;
  const scales = Float32Array.of(1, 0.5);
  const x = new Float32Array(M * K);
  for (let m = 0; m < M; m++) x[m * K + m] = 1;
  const out = new Float32Array(M * N).fill(NaN);
  k!.quantMatmul(x, codes, scales, new Int32Array(0), out, M, N, K, 2);
  for (let m = 0; m < M; m++)
    for (let n = 0; n < N; n++)
    { // (a sum that starts at +0 keeps -0's term as +0: compared with ===)
      const got = out[m * N + n]!, want = FP8_E4M3[codes[n * K + m]!]! * scales[n]!;
      assert.ok(got === want, `code 0x${codes[n * K + m]!.toString(16)} (row ${n}): ${got} vs ${want}`);
    }
  // just below the threshold: unrounded x (a value bf16 would round: 1 + 2^-12)
  const c = { M: fp8MinM - 1, N: 9, K: 70 };
  const w = fp8Weights(c.N, c.K);
  const xs = randArray(c.M * c.K).map((v) => v * (1 + 2 ** -12));
  const o = new Float32Array(c.M * c.N).fill(NaN);
  k!.quantMatmul(xs, w.codes, w.scales, new Int32Array(0), o, c.M, c.N, c.K, 2);
  compareFp8(o, xs, w.codes, w.scales, c, (v) => v, true, "fp8 below the threshold");
});
