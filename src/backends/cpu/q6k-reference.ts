// Readable TS twin of the q6_k kernel (native/quant-q6k.inc): GGUF Q6_K super-blocks kept as they are, in the
// layout of native/quant.h. Per row, super-block b of 256 elements: 192 code bytes (GGUF's ql[128] then qh[64]),
// meta 18 bytes = f16 d, int8 sc[16]; element e stands for d * sc[e / 16] * (q - 32), q in [0, 63]. The encoder is
// a plain per-sub-block absmax fit (not llama.cpp's make_qx_quants search); llama.cpp reads its blocks like any Q6_K.
import { floatToHalf, halfToFloat, quantizeActivationsRef } from "./quant-reference.js";
import { Q6K_BLOCK, Q6K_CODE_BYTES, Q6K_META_BYTES } from "../quant-layout.js";

export { Q6K_BLOCK, Q6K_CODE_BYTES, Q6K_META_BYTES };

/** A q6_k [n, k] weight: data [n, k/256, 192] bytes, meta [n, k/256, 18] bytes. */
export interface Q6kArrays {
  data: Uint8Array;
  scales: Uint8Array;
}

function checkK(op: string, k: number): void {
  if (k % Q6K_BLOCK !== 0) throw new RangeError(`[${op}] q6_k needs in_features % 256 == 0, got ${k}`);
}

/** Code (0..63) of element e (< 256) of the super-block whose code bytes start at `o`. */
export function q6kCodeAt(data: Uint8Array, o: number, e: number): number {
  const h = e >> 7;
  const i = e & 127;
  const l = i & 31;
  const quarter = i >> 5;
  const low = data[o + h * 64 + (quarter & 1) * 32 + l]!;
  return (quarter < 2 ? low & 15 : low >> 4) | (((data[o + 128 + h * 32 + l]! >> (2 * quarter)) & 3) << 4);
}

/** Writes code q (0..63) of element e of the super-block at `o` (its bits there must be zero). */
function setCode(data: Uint8Array, o: number, e: number, q: number): void {
  const h = e >> 7;
  const i = e & 127;
  const l = i & 31;
  const quarter = i >> 5;
  data[o + h * 64 + (quarter & 1) * 32 + l]! |= (q & 15) << (quarter < 2 ? 0 : 4);
  data[o + 128 + h * 32 + l]! |= (q >> 4) << (2 * quarter);
}

/**
 * Quantizes f32 w [n, k] to q6_k. Per sub-block j of 16: s_j = amax_j / 31; per super-block d = max_j s_j / 127
 * (f16, rounded up so that every sc fits), sc_j = ceil(s_j / d) <= 127, q = round(x / (d * sc_j)) + 32 clamped to
 * [0, 63]. Error per element <= d * sc_j / 2.
 */
export function quantizeQ6kRef(w: ArrayLike<number>, n: number, k: number): Q6kArrays {
  checkK("quantize", k);
  const blocks = (n * k) / Q6K_BLOCK;
  const data = new Uint8Array(blocks * Q6K_CODE_BYTES);
  const scales = new Uint8Array(blocks * Q6K_META_BYTES);
  const sub = new Float64Array(16);
  for (let b = 0; b < blocks; b++) {
    const x0 = b * Q6K_BLOCK;
    let maxScale = 0;
    for (let j = 0; j < 16; j++) {
      let amax = 0;
      for (let e = 0; e < 16; e++) amax = Math.max(amax, Math.abs(w[x0 + j * 16 + e]!));
      sub[j] = amax / 31;
      maxScale = Math.max(maxScale, sub[j]!);
    }
    let dh = floatToHalf(maxScale / 127);
    if (halfToFloat(dh) * 127 < maxScale && dh < 0x7bff) dh++;
    const d = halfToFloat(dh);
    const meta = b * Q6K_META_BYTES;
    scales[meta] = dh & 0xff;
    scales[meta + 1] = dh >> 8;
    for (let j = 0; j < 16; j++) {
      const sc = d > 0 ? Math.min(127, Math.ceil(sub[j]! / d)) : 0;
      scales[meta + 2 + j] = sc;
      const step = d * sc;
      for (let e = 0; e < 16; e++) {
        const q = step > 0 ? Math.max(-32, Math.min(31, Math.round(w[x0 + j * 16 + e]! / step))) : 0;
        setCode(data, b * Q6K_CODE_BYTES, j * 16 + e, q + 32);
      }
    }
  }
  return { data, scales };
}

/** d and sc[j] of super-block `blk`. */
function blockScale(q: Q6kArrays, blk: number, j: number): number {
  const meta = blk * Q6K_META_BYTES;
  return halfToFloat(q.scales[meta]! | (q.scales[meta + 1]! << 8)) * ((q.scales[meta + 2 + j]! << 24) >> 24);
}

/** The f32 [n, k] weight a q6_k one stands for (same arithmetic as gguf-quant.ts's Q6_K dequantizer). */
export function dequantizeQ6kRef(q: Q6kArrays, n: number, k: number): Float32Array {
  checkK("dequantize", k);
  const out = new Float32Array(n * k);
  for (let blk = 0; blk < (n * k) / Q6K_BLOCK; blk++)
    for (let e = 0; e < Q6K_BLOCK; e++) out[blk * Q6K_BLOCK + e] = blockScale(q, blk, e >> 4) * (q6kCodeAt(q.data, blk * Q6K_CODE_BYTES, e) - 32);
  return out;
}

/**
 * out [m, n] = x @ dequant(W)^T as the kernel computes it: x quantized per row to int8 (xq, xs); per super-block the
 * exact integer S = sum_j sc[j] * sum((q - 32) * xq) over sub-block j, then out = xs * sum_b d * S.
 */
export function q6kMatmulRef(x: Float32Array, q: Q6kArrays, m: number, n: number, k: number): Float32Array {
  checkK("quant_matmul", k);
  const { xq, xs } = quantizeActivationsRef(x, m, k);
  const out = new Float32Array(m * n);
  const blocks = k / Q6K_BLOCK;
  for (let r = 0; r < m; r++)
    for (let c = 0; c < n; c++) {
      let total = 0;
      for (let b = 0; b < blocks; b++) {
        const blk = c * blocks + b;
        const meta = blk * Q6K_META_BYTES;
        let s = 0;
        for (let j = 0; j < 16; j++) {
          let isum = 0;
          for (let e = 0; e < 16; e++) isum += (q6kCodeAt(q.data, blk * Q6K_CODE_BYTES, j * 16 + e) - 32) * xq[r * k + b * Q6K_BLOCK + j * 16 + e]!;
          s += ((q.scales[meta + 2 + j]! << 24) >> 24) * isum;
        }
        total += halfToFloat(q.scales[meta]! | (q.scales[meta + 1]! << 8)) * s;
      }
      out[r * n + c] = xs[r]! * total;
    }
  return out;
}
