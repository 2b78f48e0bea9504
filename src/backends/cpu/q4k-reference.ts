// Readable TS twin of the q4_k and q5_k kernels (native/quant-q4k.inc): GGUF Q4_K / Q5_K super-blocks kept as they
// are, in the layouts of native/quant.h. Per row, super-block b of 256 elements: codes q in [0, 15] (int4's nibble
// order, 128 bytes) or, for q5_k, [0, 31] (those 128 bytes and then 32 qh bytes: bit e / 32 of qh[e % 32] is
// element e's fifth bit), meta 20 bytes = f16 d, f16 dmin, u8 sc[8], u8 m[8]; element i (sub-block j = (i % 256) /
// 32) stands for d * sc[j] * q - dmin * m[j]. The encoder is a plain per-sub-block min/max fit (not llama.cpp's
// make_qkx2 search).
import { floatToHalf, halfToFloat, quantizeActivationsRef } from "./quant-reference.js";

/** Elements per super-block, and meta bytes per super-block. */
import { Q4K_BLOCK, Q4K_META_BYTES, Q5K_CODE_BYTES } from "../quant-layout.js";

export { Q4K_BLOCK, Q4K_META_BYTES };

/** A q4_k [n, k] weight: data [n, k/2] bytes, meta [n, k/256, 20] bytes (q5_k: data [n, k/256, 160]). */
export interface Q4kArrays {
  data: Uint8Array;
  scales: Uint8Array;
}

/** Code width: 4 (q4_k) or 5 (q5_k). */
export type KBits = 4 | 5;
/** Code bytes per super-block. */
export const kCodeBytes = (bits: KBits): number => (bits === 4 ? Q4K_BLOCK / 2 : Q5K_CODE_BYTES);

function checkK(op: string, k: number, bits: KBits): void {
  if (k % Q4K_BLOCK !== 0) throw new RangeError(`[${op}] q${bits}_k needs in_features % 256 == 0, got ${k}`);
}

/**
 * Quantizes f32 w [n, k] to q4_k (q5_k with bits 5: top = 31 where below 15). Per sub-block j of 32: lo = min(0,
 * min x), hi = max x; per super-block d = max_j (hi - lo) / top / 63 (f16, rounded up) and dmin = max_j -lo / 63
 * (f16); m = round(-lo / dmin), then sc = ceil((hi + dmin * m) / top / d) so that the top of the sub-block is not
 * clipped; q = round((x + dmin * m) / (d * sc)) clamped to [0, top]. Error per element <= d * sc / 2, or dmin / 2
 * below the stored min.
 */
export function quantizeQ4kRef(w: ArrayLike<number>, n: number, k: number, bits: KBits = 4): Q4kArrays {
  checkK("quantize", k, bits);
  const top = (1 << bits) - 1; // the largest code
  const blocks = (n * k) / Q4K_BLOCK;
  const data = new Uint8Array(blocks * kCodeBytes(bits));
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
      maxScale = Math.max(maxScale, (hi - lo) / top);
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
      const sc = d > 0 ? Math.max(0, Math.min(63, Math.ceil((subHi[j]! + dmin * m) / top / d))) : 0;
      scales[meta + 4 + j] = sc;
      scales[meta + 12 + j] = m;
      const step = d * sc;
      for (let e = 0; e < 32; e++) {
        const v = w[x0 + j * 32 + e]! + dmin * m;
        codes[j * 32 + e] = step > 0 ? Math.max(0, Math.min(top, Math.round(v / step))) : 0;
      }
    }
    // int4's nibble order: byte l of chunk c holds elements 64c + l (low) and 64c + 32 + l (high); q5_k's fifth
    // bits after them
    const o = b * kCodeBytes(bits);
    for (let c = 0; c < 4; c++)
      for (let l = 0; l < 32; l++) data[o + c * 32 + l] = (codes[c * 64 + l]! & 15) | ((codes[c * 64 + 32 + l]! & 15) << 4);
    if (bits === 5) for (let e = 0; e < Q4K_BLOCK; e++) data[o + 128 + (e % 32)]! |= (codes[e]! >> 4) << (e >> 5);
  }
  return { data, scales };
}

/** Code (0..15, q5_k 0..31) of element i of row r. */
function codeAt(data: Uint8Array, r: number, k: number, i: number, bits: KBits): number {
  const o = ((r * k + i) >> 8) * kCodeBytes(bits); // the super-block's code bytes
  const e = i % Q4K_BLOCK;
  const j = e % 64;
  const byte = data[o + Math.floor(e / 64) * 32 + (j % 32)]!;
  const nibble = j < 32 ? byte & 15 : byte >> 4;
  return bits === 4 ? nibble : nibble | (((data[o + 128 + (e % 32)]! >> (e >> 5)) & 1) << 4);
}

/** The f32 [n, k] weight a q4_k (q5_k) one stands for (same arithmetic as gguf-quant.ts's Q4_K / Q5_K dequantizers). */
export function dequantizeQ4kRef(q: Q4kArrays, n: number, k: number, bits: KBits = 4): Float32Array {
  checkK("dequantize", k, bits);
  const out = new Float32Array(n * k);
  for (let r = 0; r < n; r++)
    for (let i = 0; i < k; i++) {
      const meta = ((r * k + i) >> 8) * Q4K_META_BYTES;
      const j = (i % Q4K_BLOCK) >> 5;
      const d = halfToFloat(q.scales[meta]! | (q.scales[meta + 1]! << 8));
      const dmin = halfToFloat(q.scales[meta + 2]! | (q.scales[meta + 3]! << 8));
      out[r * k + i] = d * q.scales[meta + 4 + j]! * codeAt(q.data, r, k, i, bits) - dmin * q.scales[meta + 12 + j]!;
    }
  return out;
}

/**
 * out [m, n] = x @ dequant(W)^T as the kernel computes it: x quantized per row to int8 (xq, xs); per super-block
 * the exact integers S = sum_j sc[j] * sum(q * xq) and Mn = sum_j m[j] * sum(xq) over sub-block j, then
 * out = xs * sum_b (d * S - dmin * Mn).
 */
export function q4kMatmulRef(x: Float32Array, q: Q4kArrays, m: number, n: number, k: number, bits: KBits = 4): Float32Array {
  checkK("quant_matmul", k, bits);
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
            isum += codeAt(q.data, c, k, i, bits) * xq[r * k + i]!;
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
