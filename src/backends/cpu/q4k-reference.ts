// Readable TS twin of the q4_k kernel (native/quant-q4k.inc): GGUF Q4_K super-blocks kept as they are, in the
// layout of native/quant.h. Per row, super-block b of 256 elements: codes q in [0, 15] (int4's nibble order),
// meta 20 bytes = f16 d, f16 dmin, u8 sc[8], u8 m[8]; element i (sub-block j = (i % 256) / 32) stands for
// d * sc[j] * q - dmin * m[j]. The encoder is a plain per-sub-block min/max fit (not llama.cpp's make_qkx2 search).
import { floatToHalf, halfToFloat, quantizeActivationsRef } from "./quant-reference.js";

/** Elements per super-block, and meta bytes per super-block. */
import { Q4K_BLOCK, Q4K_META_BYTES } from "../quant-layout.js";

export { Q4K_BLOCK, Q4K_META_BYTES };

/** A q4_k [n, k] weight: data [n, k/2] bytes, meta [n, k/256, 20] bytes. */
export interface Q4kArrays {
  data: Uint8Array;
  scales: Uint8Array;
}

function checkK(op: string, k: number): void {
  if (k % Q4K_BLOCK !== 0) throw new RangeError(`[${op}] q4_k needs in_features % 256 == 0, got ${k}`);
}

/**
 * Quantizes f32 w [n, k] to q4_k. Per sub-block j of 32: lo = min(0, min x), hi = max x; per super-block
 * d = max_j (hi - lo) / 15 / 63 (f16, rounded up) and dmin = max_j -lo / 63 (f16); m = round(-lo / dmin), then
 * sc = ceil((hi + dmin * m) / 15 / d) so that the top of the sub-block is not clipped; q = round((x + dmin * m) /
 * (d * sc)) clamped to [0, 15]. Error per element <= d * sc / 2, or dmin / 2 below the stored min.
 */
export function quantizeQ4kRef(w: ArrayLike<number>, n: number, k: number): Q4kArrays {
  checkK("quantize", k);
  const blocks = (n * k) / Q4K_BLOCK;
  const data = new Uint8Array((n * k) / 2);
  const scales = new Uint8Array(blocks * Q4K_META_BYTES);
  const subHi = new Float64Array(8);
  const subMin = new Float64Array(8);
  const codes = new Uint8Array(Q4K_BLOCK);
  for (let b = 0; b < blocks; b++) {
    const x0 = b * Q4K_BLOCK;
    let maxScale = 0;
    let maxMin = 0;
    for (let j = 0; j < 8; j++) {
      let lo = 0; // the min is never positive (w = d*sc*q - dmin*m with m >= 0)
      let hi = -Infinity;
      for (let e = 0; e < 32; e++) {
        const v = w[x0 + j * 32 + e]!;
        lo = Math.min(lo, v);
        hi = Math.max(hi, v);
      }
      subHi[j] = hi;
      subMin[j] = -lo;
      maxScale = Math.max(maxScale, (hi - lo) / 15);
      maxMin = Math.max(maxMin, -lo);
    }
    let dh = floatToHalf(maxScale / 63);
    if (halfToFloat(dh) * 63 < maxScale && dh < 0x7bff) dh++; // round up: sc <= 63 covers the widest sub-block
    const dminh = floatToHalf(maxMin / 63);
    const d = halfToFloat(dh);
    const dmin = halfToFloat(dminh);
    const meta = b * Q4K_META_BYTES;
    scales[meta] = dh & 0xff;
    scales[meta + 1] = dh >> 8;
    scales[meta + 2] = dminh & 0xff;
    scales[meta + 3] = dminh >> 8;
    for (let j = 0; j < 8; j++) {
      const m = dmin > 0 ? Math.min(63, Math.round(subMin[j]! / dmin)) : 0;
      const sc = d > 0 ? Math.max(0, Math.min(63, Math.ceil((subHi[j]! + dmin * m) / 15 / d))) : 0;
      scales[meta + 4 + j] = sc;
      scales[meta + 12 + j] = m;
      const step = d * sc;
      for (let e = 0; e < 32; e++) {
        const v = w[x0 + j * 32 + e]! + dmin * m;
        codes[j * 32 + e] = step > 0 ? Math.max(0, Math.min(15, Math.round(v / step))) : 0;
      }
    }
    // int4's nibble order: byte l of chunk c holds elements 64c + l (low) and 64c + 32 + l (high)
    const o = b * (Q4K_BLOCK / 2);
    for (let c = 0; c < 4; c++)
      for (let l = 0; l < 32; l++) data[o + c * 32 + l] = codes[c * 64 + l]! | (codes[c * 64 + 32 + l]! << 4);
  }
  return { data, scales };
}

/** Code (0..15) of element i of row r. */
function codeAt(data: Uint8Array, r: number, k: number, i: number): number {
  const j = i % 64;
  const byte = data[(r * k) / 2 + Math.floor(i / 64) * 32 + (j % 32)]!;
  return j < 32 ? byte & 15 : byte >> 4;
}

/** The f32 [n, k] weight a q4_k one stands for (same arithmetic as gguf-quant.ts's Q4_K dequantizer). */
export function dequantizeQ4kRef(q: Q4kArrays, n: number, k: number): Float32Array {
  checkK("dequantize", k);
  const out = new Float32Array(n * k);
  for (let r = 0; r < n; r++)
    for (let i = 0; i < k; i++) {
      const meta = ((r * k + i) >> 8) * Q4K_META_BYTES;
      const j = (i % Q4K_BLOCK) >> 5;
      const d = halfToFloat(q.scales[meta]! | (q.scales[meta + 1]! << 8));
      const dmin = halfToFloat(q.scales[meta + 2]! | (q.scales[meta + 3]! << 8));
      out[r * k + i] = d * q.scales[meta + 4 + j]! * codeAt(q.data, r, k, i) - dmin * q.scales[meta + 12 + j]!;
    }
  return out;
}

/**
 * out [m, n] = x @ dequant(W)^T as the kernel computes it: x quantized per row to int8 (xq, xs); per super-block
 * the exact integers S = sum_j sc[j] * sum(q * xq) and Mn = sum_j m[j] * sum(xq) over sub-block j, then
 * out = xs * sum_b (d * S - dmin * Mn).
 */
export function q4kMatmulRef(x: Float32Array, q: Q4kArrays, m: number, n: number, k: number): Float32Array {
  checkK("quant_matmul", k);
  const { xq, xs } = quantizeActivationsRef(x, m, k);
  const out = new Float32Array(m * n);
  for (let r = 0; r < m; r++)
    for (let c = 0; c < n; c++) {
      let total = 0;
      for (let b = 0; b < k / Q4K_BLOCK; b++) {
        const meta = ((c * k) / Q4K_BLOCK + b) * Q4K_META_BYTES;
        let s = 0;
        let mins = 0;
        for (let j = 0; j < 8; j++) {
          let isum = 0;
          let xsum = 0;
          for (let e = 0; e < 32; e++) {
            const i = b * Q4K_BLOCK + j * 32 + e;
            isum += codeAt(q.data, c, k, i) * xq[r * k + i]!;
            xsum += xq[r * k + i]!;
          }
          s += q.scales[meta + 4 + j]! * isum;
          mins += q.scales[meta + 12 + j]! * xsum;
        }
        total += halfToFloat(q.scales[meta]! | (q.scales[meta + 1]! << 8)) * s - halfToFloat(q.scales[meta + 2]! | (q.scales[meta + 3]! << 8)) * mins;
      }
      out[r * n + c] = xs[r]! * total;
    }
  return out;
}
