// The q4_k and q5_k kernels (native/quant-q4k.inc) vs their TS reference (src/backends/cpu/q4k-reference.ts) vs the
// f32 matmul on the dequantized weight. Bound against the dequantized weight Wdq: x is rounded per row to xq * xs
// with |x - xq*xs| <= xs/2, so |out - x @ Wdq^T| <= (xs/2) * sum_k |Wdq[n,k]| (+ f32 rounding). Against the
// reference (same integers, f32 vs f64 sums of d * S - dmin * Mn per super-block) the gap is f32 rounding of the
// two terms' magnitudes. The parent runs the suite per ISA (scalar loops, AVX2, AVX-512 VNNI) in child processes.
import { test } from "node:test";
import assert from "node:assert/strict";
import { tryLoadNativeKernels, type NativeKernels } from "../../src/backends/cpu/native.js";
import { dequantizeQ4kRef, kCodeBytes, q4kMatmulRef, quantizeQ4kRef, type KBits, type Q4kArrays } from "../../src/backends/cpu/q4k-reference.js";
import { halfToFloat, nativeTakesScheme, quantizeActivationsRef } from "../../src/backends/cpu/quant-reference.js";
import { runIsaChildren, supportedIsas } from "../helpers/isa-children.js";
import { mulberry32 } from "../../src/util/random.js";

const k = tryLoadNativeKernels();
const childIsa = process.env.KILN_Q4K_TEST_CHILD ? process.env.KILN_NATIVE_ISA : undefined;
const rand = mulberry32(4343);

function randn(n: number, scale = 1): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = scale * Math.sqrt(-2 * Math.log(Math.max(rand(), 1e-12))) * Math.cos(2 * Math.PI * rand());
  return a;
}

/** Random q4_k (q5_k) arrays: every code, 6-bit sc / m, f16 d and dmin of either sign (finite, moderate). */
function randomQ4k(n: number, kk: number, bits: KBits): Q4kArrays {
  const data = new Uint8Array((n * kk * kCodeBytes(bits)) / 256);
  for (let i = 0; i < data.length; i++) data[i] = Math.floor(rand() * 256);
  const scales = new Uint8Array((n * kk * 20) / 256);
  for (let b = 0; b < scales.length / 20; b++) {
    for (let j = 0; j < 16; j++) scales[b * 20 + 4 + j] = Math.floor(rand() * 64);
    for (const o of [0, 2]) {
      const h = (rand() < 0.5 ? 0x8000 : 0) | ((Math.floor(rand() * 8) + 8) << 10) | Math.floor(rand() * 1024); // |v| in [2^-7, 2]
      scales[b * 20 + o] = h & 0xff;
      scales[b * 20 + o + 1] = h >> 8;
    }
  }
  return { data, scales };
}

/** sum_k |x| * (|d * sc * q| + |dmin * m|): the magnitude that f32 rounding of the two super-block terms scales with. */
function termMagnitude(x: Float32Array, q: Q4kArrays, r: number, c: number, kk: number, bits: KBits): number {
  let s = 0;
  for (let i = 0; i < kk; i++) {
    const meta = ((c * kk + i) >> 8) * 20;
    const j = (i % 256) >> 5;
    const d = halfToFloat(q.scales[meta]! | (q.scales[meta + 1]! << 8));
    const dmin = halfToFloat(q.scales[meta + 2]! | (q.scales[meta + 3]! << 8));
    s += Math.abs(x[r * kk + i]!) * (Math.abs(d * q.scales[meta + 4 + j]! * ((1 << bits) - 1)) + Math.abs(dmin * q.scales[meta + 12 + j]!));
  }
  return s;
}

if (!childIsa) {
  test("q4_k and q5_k kernels: every supported ISA", { skip: k ? false : "native addon not built", timeout: 300_000 }, () => {
    runIsaChildren(import.meta.url, supportedIsas(k!, { bf16: false }), "KILN_Q4K_TEST_CHILD");
  });
} else {
  runSuite(k!, childIsa);
}

function runSuite(k: NativeKernels, isa: string): void {
  const schemes = [["q4_k", 4, 4], ["q5_k", 5, 7]] as const;
  for (const [scheme, bits, code, threads] of schemes.flatMap(([s, b, c]) => [1, 2].map((t) => [s, b, c, t] as const))) {
    const skip = nativeTakesScheme(k, scheme) ? false : `addon rejects scheme code ${code}`;
    test(`[${isa}] ${scheme} quantMatmul vs reference vs dequantized f32, M = 1..512, ${threads} thread(s)`, { skip }, () => {
      k.setNumThreads(threads);
      const shapes: [number, number][] = [[1, 256], [7, 512], [33, 256], [13, 1280], [64, 768]];
      // VNNI: M >= 5 take the tiles (pairs of 16-row blocks, 4/8/16-row tails); M = 512 on the small shapes only (time)
      const ms = [1, 2, 3, 4, 5, 8, 16, 33, 64, 130];
      for (const [n, kk] of shapes) {
        for (const q of [randomQ4k(n, kk, bits), quantizeQ4kRef(randn(n * kk, 0.05), n, kk, bits)]) {
          const wdq = dequantizeQ4kRef(q, n, kk, bits);
          for (const m of n * kk <= 4096 ? [...ms, 512] : ms) {
            const x = randn(m * kk);
            const out = new Float32Array(m * n);
            k.quantMatmul(x, q.data, q.scales, new Int32Array(0), out, m, n, kk, code);
            const ref = q4kMatmulRef(x, q, m, n, kk, bits);
            const { xs } = quantizeActivationsRef(x, m, kk);
            for (let r = 0; r < m; r++)
              for (let c = 0; c < n; c++) {
                let exact = 0;
                let wAbs = 0;
                for (let i = 0; i < kk; i++) {
                  exact += x[r * kk + i]! * wdq[c * kk + i]!;
                  wAbs += Math.abs(wdq[c * kk + i]!);
                }
                const got = out[r * n + c]!;
                const fp = 4e-6 * termMagnitude(x, q, r, c, kk, bits) + 1e-6;
                const where = `M=${m} N=${n} K=${kk} [${r},${c}]`;
                assert.ok(Math.abs(got - ref[r * n + c]!) <= fp, `${where}: ${got} vs reference ${ref[r * n + c]} (tolerance ${fp})`);
                const bound = (xs[r]! / 2) * wAbs * 1.0001 + fp;
                assert.ok(Math.abs(got - exact) <= bound, `${where}: |${got} - ${exact}| > ${bound}`);
              }
          }
        }
      }
    });
  }

  test(`[${isa}] q4_k argument checks`, () => {
    const x = new Float32Array(320);
    assert.throws(() => k.quantMatmul(x, new Uint8Array(160), new Uint8Array(25), new Int32Array(0), new Float32Array(1), 1, 1, 320, 4), /q4_k, q5_k and q6_k need K to be a multiple of 256/);
    assert.throws(() => k.quantMatmul(x, new Uint8Array(200), new Uint8Array(25), new Int32Array(0), new Float32Array(1), 1, 1, 320, 7), /q4_k, q5_k and q6_k need K to be a multiple of 256/);
    assert.throws(() => k.quantMatmul(x, new Uint8Array(159), new Uint8Array(20), new Int32Array(0), new Float32Array(1), 1, 1, 256, 7), /w has 159 elements, needs 160/);
    assert.throws(() => k.quantMatmul(x, new Uint8Array(128), new Uint8Array(19), new Int32Array(0), new Float32Array(1), 1, 1, 256, 4), /scales/);
    assert.throws(() => k.quantMatmul(x, new Uint8Array(128), new Uint16Array(10), new Int32Array(0), new Float32Array(1), 1, 1, 256, 4), /scales must be/);
    assert.throws(() => k.quantMatmul(x, new Uint8Array(128), new Uint8Array(20), new Int32Array(0), new Float32Array(1), 1, 1, 256, 99 as never), /scheme must be/);
  });
}
