// Fused decode-path kernels against their unfused sequences: rotary fused into paged attention's KV write (every
// back end), rms_norm and silu·mul fused with the quantized linears' activation quantization (cpu: quantized weights
// are cpu-only).
// Fusion must not change numerics: the fused results are compared bit for bit.
import assert from "node:assert/strict";
import { it } from "node:test";
import * as k from "../../src/tensor/index.js";
import type { Tensor } from "../../src/tensor/index.js";
import { forEachBackend, prng, values } from "./suite.js";
import { quantizeActivationsRef } from "../../src/backends/cpu/quant-reference.js";
import { quantizedLinear, quantizeWeight, disposeQuantizedWeight } from "../../src/tensor/ops/linalg.js";
import type { QuantScheme } from "../../src/backends/backend.js";

function randn(rand: () => number, n: number): Float32Array {
  return Float32Array.from({ length: n }, () => rand() * 2 - 1);
}

function assertSame(actual: Tensor, expected: Tensor, msg: string): void {
  const a = values(actual);
  const e = values(expected);
  assert.equal(a.length, e.length, msg);
  for (let i = 0; i < a.length; i++) if (a[i] !== e[i]) assert.fail(`${msg}: element ${i} differs (${a[i]} vs ${e[i]})`);
}

forEachBackend((device) => {
  // D 64 takes the native grouped-KV path (4 AVX-512 vectors), D 40 the per-head path; rotaryDim < D is partial rotary
  const cases = [
    { Hq: 6, Hkv: 2, D: 64, rotaryDim: 64, neox: true },
    { Hq: 4, Hkv: 4, D: 64, rotaryDim: 32, neox: false },
    { Hq: 4, Hkv: 1, D: 40, rotaryDim: 24, neox: true },
  ];
  for (const { Hq, Hkv, D, rotaryDim, neox } of cases) {
    it(`paged attention with fused rotary equals rotary + paged attention (Hq ${Hq} Hkv ${Hkv} D ${D} rd ${rotaryDim} neox ${neox})`, () => {
      const rand = prng(7 + D + rotaryDim);
      const blockSize = 4;
      const numBlocks = 12;
      // two sequences: one decoding a token after 9 cached ones, one prefilling 5 new tokens from position 2
      const lens = [10, 7];
      const newTok = [1, 5];
      const T = newTok[0]! + newTok[1]!;
      const tables = Int32Array.from([3, 7, 1, 0, 5, 9, 2, 0]);
      const maxBlocks = 4;
      const positions: number[] = [];
      const slots: number[] = [];
      lens.forEach((len, s) => {
        for (let j = len - newTok[s]!; j < len; j++) {
          positions.push(j);
          slots.push(tables[s * maxBlocks + Math.floor(j / blockSize)]! * blockSize + (j % blockSize));
        }
      });
      const maxPos = 32;
      const half = rotaryDim / 2;
      const cos = k.tensor(Float32Array.from({ length: maxPos * half }, (_, i) => Math.cos(i * 0.37)), { device, shape: [maxPos, half] });
      const sin = k.tensor(Float32Array.from({ length: maxPos * half }, (_, i) => Math.sin(i * 0.37)), { device, shape: [maxPos, half] });
      const q = k.tensor(randn(rand, T * Hq * D), { device, shape: [T, Hq, D] });
      const kn = k.tensor(randn(rand, T * Hkv * D), { device, shape: [T, Hkv, D] });
      const vn = k.tensor(randn(rand, T * Hkv * D), { device, shape: [T, Hkv, D] });
      const cacheData = randn(rand, numBlocks * blockSize * Hkv * D * 2);
      const pos = k.tensor(Int32Array.from(positions), { device });
      const run = (fused: boolean) => {
        const shape = [numBlocks, blockSize, Hkv, D];
        const kCache = k.tensor(cacheData.subarray(0, cacheData.length / 2), { device, shape });
        const vCache = k.tensor(cacheData.subarray(cacheData.length / 2), { device, shape });
        const qr = fused ? q : k.rotaryEmbedding(q, pos, cos, sin, neox);
        const kr = fused ? kn : k.rotaryEmbedding(kn, pos, cos, sin, neox);
        const out = k.pagedAttention({
          q: qr, k: kr, v: vn, kCache, vCache,
          slotMapping: k.tensor(Int32Array.from(slots), { device }),
          blockTables: k.tensor(tables, { device, shape: [2, maxBlocks] }),
          queryStart: k.tensor(Int32Array.from([0, newTok[0]!, T]), { device }),
          seqLens: k.tensor(Int32Array.from(lens), { device }),
          scale: 1 / Math.sqrt(D),
          rotary: fused ? { positions: pos, cos, sin, neox } : null,
        });
        return { out, kCache, vCache };
      };
      const unfused = run(false);
      const fused = run(true);
      assertSame(fused.out, unfused.out, "attention output");
      assertSame(fused.kCache, unfused.kCache, "k cache (rotated rows written)");
      assertSame(fused.vCache, unfused.vCache, "v cache");
    });
  }

  it("paged attention's fused rotary rejects positions outside the tables", () => {
    const D = 8;
    const t = (data: number[] | Float32Array, shape?: number[]) => k.tensor(data instanceof Float32Array ? data : Int32Array.from(data), { device, shape });
    const ones = (n: number) => new Float32Array(n).fill(1);
    assert.throws(() =>
      k.pagedAttention({
        q: t(ones(D), [1, 1, D]), k: t(ones(D), [1, 1, D]), v: t(ones(D), [1, 1, D]),
        kCache: t(ones(4 * D), [1, 4, 1, D]), vCache: t(ones(4 * D), [1, 4, 1, D]),
        slotMapping: t([0]), blockTables: t([0], [1, 1]), queryStart: t([0, 1]), seqLens: t([1]), scale: 1,
        rotary: { positions: t([9]), cos: t(ones(4 * 4), [4, 4]), sin: t(ones(4 * 4), [4, 4]), neox: true },
      }).dataSync(),
    /position 9 out of range/);
  });
});

forEachBackend((device) => {
  it("rmsNormQuantized writes rms_norm's output and its rows quantized as quant_matmul quantizes them", () => {
    const rand = prng(3);
    const [rows, n] = [5, 100]; // not a multiple of 16: the vector quantizer's masked tail
    const x = k.tensor(randn(rand, rows * n).map((v) => v * 4), { device, shape: [rows, n] });
    const w = k.tensor(randn(rand, n), { device });
    const plain = k.rmsNorm(x, w, 1e-6);
    const { out, xq } = k.rmsNormQuantized(x, w, 1e-6);
    assertSame(out, plain, "normalised rows");
    const want = quantizeActivationsRef(Float32Array.from(values(plain)), rows, n);
    assert.deepEqual(Array.from(xq.data.dataSync() as Int8Array), Array.from(want.xq), "int8 rows");
    assert.deepEqual(values(xq.scales), Array.from(want.xs), "row scales");
  });
});

forEachBackend((device) => {
  it("addRmsNorm: sum = x + residual and rms_norm(sum), bit for bit add() then rmsNorm(), and quantized as rmsNormQuantized", () => {
    const rand = prng(11);
    const [rows, n] = [4, 100];
    const x = k.tensor(randn(rand, rows * n).map((v) => v * 3), { device, shape: [rows, n] });
    const r = k.tensor(randn(rand, rows * n).map((v) => v * 7), { device, shape: [rows, n] });
    const w = k.tensor(randn(rand, n), { device });
    const sum = k.add(x, r);
    const plain = k.rmsNorm(sum, w, 1e-5);
    const fused = k.addRmsNorm(x, r, w, 1e-5, false);
    assertSame(fused.sum, sum, "sum");
    assertSame(fused.out, plain, "normalised rows");
    assert.equal(fused.xq, null);
    const quantized = k.addRmsNorm(x, r, w, 1e-5, true);
    const want = k.rmsNormQuantized(sum, w, 1e-5);
    assertSame(quantized.out, plain, "normalised rows (quantized variant)");
    assert.deepEqual(Array.from(quantized.xq!.data.dataSync() as Int8Array), Array.from(want.xq.data.dataSync() as Int8Array), "int8 rows");
    assertSame(quantized.xq!.scales, want.xq.scales, "row scales");
  });

  it("addRmsNorm by hand: [1, 2] + [2, 2] = [3, 4], normed by sqrt((9 + 16) / 2)", () => {
    const f = k.addRmsNorm(
      k.tensor(Float32Array.of(1, 2), { device, shape: [1, 2] }), k.tensor(Float32Array.of(2, 2), { device, shape: [1, 2] }),
      k.tensor(Float32Array.of(1, 0.5), { device }), 0, false,
    );
    assert.deepEqual(values(f.sum), [3, 4]);
    const inv = 1 / Math.sqrt(12.5);
    const got = values(f.out);
    assert.ok(Math.abs(got[0]! - 3 * inv) < 1e-6 && Math.abs(got[1]! - 4 * inv * 0.5) < 1e-6, `got ${got.join(", ")}`);
  });

  it("addRmsNorm refuses operands of two shapes or not float32", () => {
    const a = k.tensor(new Float32Array(6), { device, shape: [2, 3] });
    const w = k.tensor(new Float32Array(3), { device });
    assert.throws(() => k.addRmsNorm(a, k.tensor(new Float32Array(3), { device, shape: [1, 3] }), w, 1e-6, false), /add_rms_norm.*differ/);
    assert.throws(() => k.addRmsNorm(a, a.to("bfloat16"), w, 1e-6, false), /add_rms_norm.*float32/);
    assert.throws(() => k.addRmsNorm(a, a, k.tensor(new Float32Array(4), { device }), 1e-6, false), /add_rms_norm.*weight/);
  });
});

forEachBackend((device) => {
  it("siluMulQuantized writes silu(gate) * up and its rows quantized as quant_matmul quantizes them", () => {
    const rand = prng(5);
    const [rows, n] = [3, 170];
    const gate = k.tensor(randn(rand, rows * n).map((v) => v * 5), { device, shape: [rows, n] });
    const up = k.tensor(randn(rand, rows * n).map((v) => v * 2), { device, shape: [rows, n] });
    const plain = k.siluMul(gate, up);
    const { out, xq } = k.siluMulQuantized(gate, up);
    assertSame(out, plain, "silu(gate) * up");
    const want = quantizeActivationsRef(Float32Array.from(values(plain)), rows, n);
    assert.deepEqual(Array.from(xq.data.dataSync() as Int8Array), Array.from(want.xq), "int8 rows");
    assert.deepEqual(values(xq.scales), Array.from(want.xs), "row scales");
  });
});

forEachBackend((device) => {
  if (device !== "cpu") return; // quantizeWeight: weight-only quantized linears run on cpu only
  const schemes: QuantScheme[] = ["int8", "int4", "int8_g32", "mxfp4", "fp8"];
  for (const scheme of schemes) {
    // K 96 (not a multiple of 64) for the per-channel schemes; M spans the small-M kernels and the packed tiles
    for (const K of scheme === "int8" || scheme === "fp8" ? [96, 128] : [128]) {
      it(`quantized linear on rmsNormQuantized's rows == on rms_norm's output (${scheme}, K ${K})`, () => {
        const rand = prng(11 + K);
        const N = 48;
        const weight = quantizeWeight(k.tensor(randn(rand, N * K), { device, shape: [N, K] }), scheme);
        const bias = k.tensor(randn(rand, N), { device });
        const w = k.tensor(randn(rand, K), { device });
        for (const M of [1, 2, 3, 4, 5, 8, 17]) {
          const x = k.tensor(randn(rand, M * K).map((v) => v * 3), { device, shape: [M, K] });
          const normed = k.rmsNorm(x, w, 1e-5);
          const unfused = quantizedLinear(normed, weight, bias);
          const { out, xq } = k.rmsNormQuantized(x, w, 1e-5);
          const fused = quantizedLinear(out, weight, bias, xq);
          assertSame(fused, unfused, `${scheme} M ${M}`);
          if (scheme !== "fp8") {
            // the kernel reads xq, not x: another x's quantization changes the result (fp8 dots f32 x, ignores xq)
            const other = k.rmsNormQuantized(k.tensor(randn(rand, M * K), { device, shape: [M, K] }), w, 1e-5);
            const wrong = values(quantizedLinear(out, weight, bias, other.xq));
            assert.notDeepEqual(wrong, values(unfused), `${scheme} M ${M}: xq was not read`);
          }
          // silu·mul fused with the same quantization (the down projection's input)
          const h = k.siluMul(x, normed);
          const hq = k.siluMulQuantized(x, normed);
          assertSame(quantizedLinear(hq.out, weight, bias, hq.xq), quantizedLinear(h, weight, bias), `${scheme} M ${M} silu·mul`);
          for (const t of [x, normed, unfused, out, xq.data, xq.scales, fused, h, hq.out, hq.xq.data, hq.xq.scales]) t.dispose();
        }
        disposeQuantizedWeight(weight);
      });
    }
  }
});
