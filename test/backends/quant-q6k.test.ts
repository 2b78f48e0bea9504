// The q6_k kernel (native/quant-q6k.inc) vs its TS reference (src/backends/cpu/q6k-reference.ts) vs the f32 matmul
// on the dequantized weight. Bound against the dequantized weight Wdq: x is rounded per row to xq * xs with
// |x - xq*xs| <= xs/2, so |out - x @ Wdq^T| <= (xs/2) * sum_k |Wdq[n,k]| (+ f32 rounding). Against the reference
// (the same integers per super-block, summed times d in f32 lanes vs f64) the gap is f32 rounding of the blocks'
// magnitudes. The parent runs the suite per ISA (scalar loops, AVX2, AVX-512 VNNI) in child processes.
import { test } from "node:test";
import assert from "node:assert/strict";
import { tryLoadNativeKernels, type NativeKernels } from "../../src/backends/cpu/native.js";
import { dequantizeQ6kRef, q6kMatmulRef, quantizeQ6kRef, type Q6kArrays } from "../../src/backends/cpu/q6k-reference.js";
import { halfToFloat, nativeTakesScheme, quantizeActivationsRef } from "../../src/backends/cpu/quant-reference.js";
import { runIsaChildren, supportedIsas } from "../helpers/isa-children.js";
import { mulberry32 } from "../../src/util/random.js";

const k = tryLoadNativeKernels();
const childIsa = process.env.KILN_Q6K_TEST_CHILD ? process.env.KILN_NATIVE_ISA : undefined;
const rand = mulberry32(6464);

function randn(n: number, scale = 1): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = scale * Math.sqrt(-2 * Math.log(Math.max(rand(), 1e-12))) * Math.cos(2 * Math.PI * rand());
  return a;
}

/** Random q6_k arrays: every code, int8 sub-block scales over their whole range (-128 included), f16 d of either sign. */
function randomQ6k(n: number, kk: number): Q6kArrays {
  const data = new Uint8Array((n * kk * 192) / 256);
  for (let i = 0; i < data.length; i++) data[i] = Math.floor(rand() * 256);
  const scales = new Uint8Array((n * kk * 18) / 256);
  for (let b = 0; b < scales.length / 18; b++) {
    for (let j = 0; j < 16; j++) scales[b * 18 + 2 + j] = Math.floor(rand() * 256);
    scales[b * 18 + 2 + (b % 16)] = 0x80; // -128 somewhere in each block
    const h = (rand() < 0.5 ? 0x8000 : 0) | ((Math.floor(rand() * 8) + 4) << 10) | Math.floor(rand() * 1024); // |d| in [2^-11, 2^-3]
    scales[b * 18] = h & 0xff;
    scales[b * 18 + 1] = h >> 8;
  }
  return { data, scales };
}

/** sum_k |x| * |d * sc| * 32: the magnitude f32 rounding of the super-block terms scales with. */
function termMagnitude(x: Float32Array, q: Q6kArrays, r: number, c: number, kk: number): number {
  let s = 0;
  for (let i = 0; i < kk; i++) {
    const meta = ((c * kk + i) >> 8) * 18;
    const d = halfToFloat(q.scales[meta]! | (q.scales[meta + 1]! << 8));
    s += Math.abs(x[r * kk + i]!) * Math.abs(d * ((q.scales[meta + 2 + ((i % 256) >> 4)]! << 24) >> 24) * 32);
  }
  return s;
}

if (!childIsa) {
  test("q6_k kernel: every supported ISA", { skip: k ? false : "native addon not built", timeout: 300_000 }, () => {
    runIsaChildren(import.meta.url, supportedIsas(k!, { bf16: false }), "KILN_Q6K_TEST_CHILD");
  });
} else {
  runSuite(k!, childIsa);
}

function runSuite(k: NativeKernels, isa: string): void {
  const skip = nativeTakesScheme(k, "q6_k") ? false : "addon rejects scheme code 6";
  for (const threads of [1, 2]) {
    test(`[${isa}] q6_k quantMatmul vs reference vs dequantized f32, M = 1..512, ${threads} thread(s)`, { skip }, () => {
      k.setNumThreads(threads);
      const shapes: [number, number][] = [[1, 256], [7, 512], [33, 256], [13, 1280], [64, 768]];
      const ms = [1, 2, 3, 4, 5, 8, 9, 16, 33, 130];
      for (const [n, kk] of shapes) {
        for (const q of [randomQ6k(n, kk), quantizeQ6kRef(randn(n * kk, 0.05), n, kk)]) {
          const wdq = dequantizeQ6kRef(q, n, kk);
          for (const m of n * kk <= 4096 ? [...ms, 512] : ms) {
            const x = randn(m * kk);
            const out = new Float32Array(m * n);
            k.quantMatmul(x, q.data, q.scales, new Int32Array(0), out, m, n, kk, 6);
            const ref = q6kMatmulRef(x, q, m, n, kk);
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
                const fp = 4e-6 * termMagnitude(x, q, r, c, kk) + 1e-6;
                const where = `M=${m} N=${n} K=${kk} [${r},${c}]`;
                if (!(Math.abs(got - ref[r * n + c]!) <= fp)) assert.fail(`${where}: ${got} vs reference ${ref[r * n + c]} (tolerance ${fp})`);
                const bound = (xs[r]! / 2) * wAbs * 1.0001 + fp;
                if (!(Math.abs(got - exact) <= bound)) assert.fail(`${where}: |${got} - ${exact}| > ${bound}`);
              }
          }
        }
      }
    });
  }

  test(`[${isa}] q6_k: pre-quantized x (xq, xs) gives the bits of x quantized in the kernel`, { skip }, () => {
    const [n, kk] = [19, 512];
    const q = randomQ6k(n, kk);
    for (const m of [1, 3, 8]) {
      const x = randn(m * kk);
      const { xq, xs } = quantizeActivationsRef(x, m, kk);
      const a = new Float32Array(m * n);
      const b = new Float32Array(m * n);
      k.quantMatmul(x, q.data, q.scales, new Int32Array(0), a, m, n, kk, 6);
      k.quantMatmul(new Float32Array(m * kk), q.data, q.scales, new Int32Array(0), b, m, n, kk, 6, xq, xs);
      assert.deepEqual(b, a, `M=${m}`);
    }
  });

  test(`[${isa}] q6_k argument checks`, () => {
    const x = new Float32Array(320);
    assert.throws(() => k.quantMatmul(x, new Uint8Array(240), new Uint8Array(23), new Int32Array(0), new Float32Array(1), 1, 1, 320, 6), /q4_k, q5_k and q6_k need K to be a multiple of 256/);
    assert.throws(() => k.quantMatmul(x, new Uint8Array(191), new Uint8Array(18), new Int32Array(0), new Float32Array(1), 1, 1, 256, 6), /w has 191 elements, needs 192/);
    assert.throws(() => k.quantMatmul(x, new Uint8Array(192), new Uint8Array(17), new Int32Array(0), new Float32Array(1), 1, 1, 256, 6), /scales/);
    assert.throws(() => k.quantMatmul(x, new Uint8Array(192), new Uint16Array(9), new Int32Array(0), new Float32Array(1), 1, 1, 256, 6), /scales must be/);
    assert.throws(() => k.quantizeWeights(new Float32Array(256), 1, 256, 6, new Uint8Array(192), new Uint8Array(18), new Int32Array(0)), /no native quantizer/);
  });
}
