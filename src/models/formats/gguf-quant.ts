// ggml tensor types, their block layouts, and reference (de)quantization following ggml-quants.c.
// A row of ne0 elements is ne0/blockSize blocks of typeSize bytes each. All fields little-endian.

import { floatToE2m1, iq4NlGroup, mxfp4Exponent, MXFP4_DOUBLED } from "../../backends/cpu/quant-reference.js";
import { quantizeQ4kRef } from "../../backends/cpu/q4k-reference.js";
import { quantizeQ6kRef } from "../../backends/cpu/q6k-reference.js";
import { f16BitsToF32, f32ToF16Bits, bf16BytesToF32, f16BytesToF32 } from "./dtype-convert.js";
import { q4kToQ4_K, q5kToQ5_K, q6kToQ6_K } from "./gguf-repack.js";

/** ggml_type ids as stored in GGUF tensor infos. */
export const GgmlType = {
  F32: 0, F16: 1, Q4_0: 2, Q4_1: 3, Q5_0: 6, Q5_1: 7, Q8_0: 8, Q8_1: 9,
  Q2_K: 10, Q3_K: 11, Q4_K: 12, Q5_K: 13, Q6_K: 14, Q8_K: 15,
  IQ2_XXS: 16, IQ2_XS: 17, IQ3_XXS: 18, IQ1_S: 19, IQ4_NL: 20, IQ3_S: 21, IQ2_S: 22, IQ4_XS: 23,
  I8: 24, I16: 25, I32: 26, I64: 27, F64: 28, IQ1_M: 29, BF16: 30, TQ1_0: 34, TQ2_0: 35, MXFP4: 39,
} as const;
export type GgmlTypeName = keyof typeof GgmlType;

/** [blockSize (elements), typeSize (bytes per block)] for every type whose layout we know. */
export const GGML_BLOCK_LAYOUT: Readonly<Record<GgmlTypeName, readonly [number, number]>> = {
  F32: [1, 4], F16: [1, 2], BF16: [1, 2], F64: [1, 8], I8: [1, 1], I16: [1, 2], I32: [1, 4], I64: [1, 8],
  Q4_0: [32, 18], Q4_1: [32, 20], Q5_0: [32, 22], Q5_1: [32, 24], Q8_0: [32, 34], Q8_1: [32, 36],
  Q2_K: [256, 84], Q3_K: [256, 110], Q4_K: [256, 144], Q5_K: [256, 176], Q6_K: [256, 210], Q8_K: [256, 292],
  IQ2_XXS: [256, 66], IQ2_XS: [256, 74], IQ3_XXS: [256, 98], IQ1_S: [256, 50], IQ4_NL: [32, 18],
  IQ3_S: [256, 110], IQ2_S: [256, 82], IQ4_XS: [256, 136], IQ1_M: [256, 56], TQ1_0: [256, 54], TQ2_0: [256, 66],
  MXFP4: [32, 17],
};

const NAME_BY_ID = new Map<number, GgmlTypeName>(Object.entries(GgmlType).map(([k, v]) => [v, k as GgmlTypeName]));
export function ggmlTypeName(id: number): GgmlTypeName | undefined {
  return NAME_BY_ID.get(id);
}

/** Bytes needed for `numel` elements (numel must be a multiple of the block size). */
export function ggmlByteSize(type: GgmlTypeName, numel: number): number {
  const [bs, ts] = GGML_BLOCK_LAYOUT[type];
  return (numel / bs) * ts;
}

const f16 = (b: Uint8Array, o: number) => f16BitsToF32(b[o]! | (b[o + 1]! << 8));

/** The types loadAsFloat32 can dequantize. */
export const DEQUANTIZABLE: ReadonlySet<GgmlTypeName> = new Set<GgmlTypeName>([
  "F32", "F16", "BF16", "F64", "I8", "I16", "I32", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4",
]);

/** The 16 values of an IQ4_NL / IQ4_XS code (ggml's kvalues_iq4nl: a non-linear 4-bit grid). */
const IQ4_VALUES = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/** Dequantizes `numel` elements of `type` from raw bytes; returns null for unsupported types. */
export function dequantize(type: GgmlTypeName, src: Uint8Array, numel: number): Float32Array | null {
  const aligned = src.byteOffset % 8 === 0 ? src : src.slice();
  const y = new Float32Array(numel);
  const [bs, ts] = GGML_BLOCK_LAYOUT[type];
  const nb = numel / bs;
  switch (type) {
    case "F32": return new Float32Array(aligned.buffer, aligned.byteOffset, numel).slice();
    case "F16": return f16BytesToF32(aligned);
    case "BF16": return bf16BytesToF32(aligned);
    case "F64": return Float32Array.from(new Float64Array(aligned.buffer, aligned.byteOffset, numel));
    case "I8": return Float32Array.from(new Int8Array(aligned.buffer, aligned.byteOffset, numel));
    case "I16": return Float32Array.from(new Int16Array(aligned.buffer, aligned.byteOffset, numel));
    case "I32": return Float32Array.from(new Int32Array(aligned.buffer, aligned.byteOffset, numel));
    case "MXFP4":
      // block: u8 e (E8M0), u8 qs[16]; element j < 16 is qs[j] & 15, else qs[j - 16] >> 4; y = e2m1(code) * 2^(e-127)
      for (let i = 0; i < nb; i++) {
        const o = i * ts;
        const d = 2 ** (src[o]! - 128); // ggml's GGML_E8M0_TO_FP32_HALF: the codes' values are doubled
        for (let j = 0; j < 16; j++) {
          y[i * 32 + j] = MXFP4_DOUBLED[src[o + 1 + j]! & 15]! * d;
          y[i * 32 + 16 + j] = MXFP4_DOUBLED[src[o + 1 + j]! >> 4]! * d;
        }
      }
      return y;
    case "Q8_0":
      // block: f16 d, int8 qs[32]; y = d * q
      for (let i = 0; i < nb; i++) {
        const o = i * ts;
        const d = f16(src, o);
        for (let j = 0; j < 32; j++) y[i * 32 + j] = d * ((src[o + 2 + j]! << 24) >> 24);
      }
      return y;
    case "Q4_0":
    case "Q4_1":
      // block: f16 d, [f16 m], u8 qs[16]; low nibbles are elements 0..15, high nibbles 16..31
      for (let i = 0; i < nb; i++) {
        const o = i * ts;
        const d = f16(src, o);
        const q = type === "Q4_0" ? o + 2 : o + 4;
        const m = type === "Q4_0" ? 0 : f16(src, o + 2);
        const off = type === "Q4_0" ? -8 : 0;
        for (let j = 0; j < 16; j++) {
          const b = src[q + j]!;
          y[i * 32 + j] = ((b & 0xf) + off) * d + m;
          y[i * 32 + j + 16] = ((b >> 4) + off) * d + m;
        }
      }
      return y;
    case "Q5_0":
    case "Q5_1":
      // block: f16 d, [f16 m], u32 qh (5th bits), u8 qs[16]
      for (let i = 0; i < nb; i++) {
        const o = i * ts;
        const d = f16(src, o);
        const h = type === "Q5_0" ? o + 2 : o + 4;
        const m = type === "Q5_0" ? 0 : f16(src, o + 2);
        const off = type === "Q5_0" ? -16 : 0;
        const qh = (src[h]! | (src[h + 1]! << 8) | (src[h + 2]! << 16) | (src[h + 3]! << 24)) >>> 0;
        for (let j = 0; j < 16; j++) {
          const b = src[h + 4 + j]!;
          const xh0 = ((qh >>> j) << 4) & 0x10;
          const xh1 = (qh >>> (j + 12)) & 0x10;
          y[i * 32 + j] = (((b & 0xf) | xh0) + off) * d + m;
          y[i * 32 + j + 16] = (((b >> 4) | xh1) + off) * d + m;
        }
      }
      return y;
    case "Q2_K":
      // block: u8 scales[16] (low nibble scale, high nibble min), u8 qs[64] (2-bit), f16 d, f16 dmin
      for (let i = 0; i < nb; i++) {
        const o = i * ts;
        const d = f16(src, o + 80);
        const dmin = f16(src, o + 82);
        let yi = i * 256;
        let is = 0;
        for (let n = 0; n < 2; n++) {
          const q = o + 16 + n * 32;
          for (let shift = 0; shift < 8; shift += 2) {
            for (let half = 0; half < 2; half++) {
              const sc = src[o + is++]!;
              const dl = d * (sc & 0xf);
              const ml = dmin * (sc >> 4);
              for (let l = 0; l < 16; l++) y[yi++] = dl * ((src[q + half * 16 + l]! >> shift) & 3) - ml;
            }
          }
        }
      }
      return y;
    case "Q3_K":
      // block: u8 hmask[32], u8 qs[64] (2-bit), u8 scales[12] (16 six-bit scales, offset 32), f16 d. Element
      // 128n + 32j + l (sub-block 8n + 2j + l / 16): d * (scale - 32) * (((qs[32n + l] >> 2j) & 3) - 4 unless bit
      // 4n + j of hmask[l] is set)
      for (let i = 0; i < nb; i++) {
        const o = i * ts;
        const d = f16(src, o + 108);
        const sc = o + 96;
        const scale = (is: number): number => {
          const lo = is < 8 ? src[sc + (is % 8)]! & 15 : src[sc + (is % 8)]! >> 4;
          const hi = (src[sc + 8 + (is % 4)]! >> (2 * Math.floor(is / 4))) & 3;
          return (lo | (hi << 4)) - 32;
        };
        for (let n = 0; n < 2; n++)
          for (let j = 0; j < 4; j++)
            for (let l = 0; l < 32; l++) {
              const q = ((src[o + 32 + 32 * n + l]! >> (2 * j)) & 3) - (src[o + l]! & (1 << (4 * n + j)) ? 0 : 4);
              y[i * 256 + 128 * n + 32 * j + l] = d * scale(8 * n + 2 * j + (l >> 4)) * q;
            }
      }
      return y;
    case "IQ4_NL":
      // block: f16 d, u8 qs[16]; element j < 16 is IQ4_VALUES[qs[j] & 15], else IQ4_VALUES[qs[j - 16] >> 4], times d
      for (let i = 0; i < nb; i++) {
        const o = i * ts;
        const d = f16(src, o);
        for (let j = 0; j < 16; j++) {
          y[i * 32 + j] = d * IQ4_VALUES[src[o + 2 + j]! & 15]!;
          y[i * 32 + 16 + j] = d * IQ4_VALUES[src[o + 2 + j]! >> 4]!;
        }
      }
      return y;
    case "IQ4_XS":
      // block: f16 d, u16 scales_h, u8 scales_l[4], u8 qs[128]; sub-block b of 32: scale ls = (4 bits of scales_l,
      // 2 of scales_h) - 32, its 16 qs bytes in IQ4_NL's order
      for (let i = 0; i < nb; i++) {
        const o = i * ts;
        const d = f16(src, o);
        const scalesH = src[o + 2]! | (src[o + 3]! << 8);
        for (let b = 0; b < 8; b++) {
          const ls = ((src[o + 4 + (b >> 1)]! >> (4 * (b & 1))) & 15) | (((scalesH >> (2 * b)) & 3) << 4);
          const dl = d * (ls - 32);
          const q = o + 8 + 16 * b;
          for (let j = 0; j < 16; j++) {
            y[i * 256 + 32 * b + j] = dl * IQ4_VALUES[src[q + j]! & 15]!;
            y[i * 256 + 32 * b + 16 + j] = dl * IQ4_VALUES[src[q + j]! >> 4]!;
          }
        }
      }
      return y;
    case "Q4_K":
    case "Q5_K":
      // block: f16 d, f16 dmin, u8 scales[12] (8 packed 6-bit scale/min pairs), [u8 qh[32]], u8 qs[128]
      for (let i = 0; i < nb; i++) {
        const o = i * ts;
        const d = f16(src, o);
        const dmin = f16(src, o + 2);
        const scales = o + 4;
        const qh = o + 16;
        let q = type === "Q4_K" ? o + 16 : o + 48;
        let yi = i * 256;
        for (let j = 0, is = 0; j < 256; j += 64, is += 2) {
          const [sc1, m1] = scaleMinK4(src, scales, is);
          const [sc2, m2] = scaleMinK4(src, scales, is + 1);
          const d1 = d * sc1, mm1 = dmin * m1, d2 = d * sc2, mm2 = dmin * m2;
          const u1 = 1 << is, u2 = 2 << is; // Q5_K: bit (is) and (is+1) of qh hold the 5th bits
          for (let l = 0; l < 32; l++) {
            const hi = type === "Q5_K" && src[qh + l]! & u1 ? 16 : 0;
            y[yi++] = d1 * ((src[q + l]! & 0xf) + hi) - mm1;
          }
          for (let l = 0; l < 32; l++) {
            const hi = type === "Q5_K" && src[qh + l]! & u2 ? 16 : 0;
            y[yi++] = d2 * ((src[q + l]! >> 4) + hi) - mm2;
          }
          q += 32;
        }
      }
      return y;
    case "Q6_K":
      // block: u8 ql[128] (low 4 bits), u8 qh[64] (high 2 bits), int8 scales[16], f16 d
      for (let i = 0; i < nb; i++) {
        const o = i * ts;
        const d = f16(src, o + 208);
        for (let n = 0; n < 2; n++) {
          const ql = o + n * 64, qh = o + 128 + n * 32, sc = o + 192 + n * 8;
          const yb = i * 256 + n * 128;
          for (let l = 0; l < 32; l++) {
            const is = l >> 4;
            const h = src[qh + l]!;
            const q1 = ((src[ql + l]! & 0xf) | ((h & 3) << 4)) - 32;
            const q2 = ((src[ql + l + 32]! & 0xf) | (((h >> 2) & 3) << 4)) - 32;
            const q3 = ((src[ql + l]! >> 4) | (((h >> 4) & 3) << 4)) - 32;
            const q4 = ((src[ql + l + 32]! >> 4) | (((h >> 6) & 3) << 4)) - 32;
            const s = (k: number) => (src[sc + is + k]! << 24) >> 24;
            y[yb + l] = d * s(0) * q1;
            y[yb + l + 32] = d * s(2) * q2;
            y[yb + l + 64] = d * s(4) * q3;
            y[yb + l + 96] = d * s(6) * q4;
          }
        }
      }
      return y;
    default:
      return null;
  }
}

/** ggml's get_scale_min_k4: the j-th 6-bit (scale, min) pair packed in 12 bytes. */
function scaleMinK4(b: Uint8Array, o: number, j: number): [number, number] {
  if (j < 4) return [b[o + j]! & 63, b[o + j + 4]! & 63];
  return [(b[o + j + 4]! & 0xf) | ((b[o + j - 4]! >> 6) << 4), (b[o + j + 4]! >> 4) | ((b[o + j]! >> 6) << 4)];
}

/** C roundf: half away from zero. */
const roundf = (x: number) => Math.sign(x) * Math.round(Math.abs(x));

/** quantize_row_q8_0_ref: d = max|x| / 127 (stored as f16), q = roundf(x / d). */
export function quantizeQ8_0(x: ArrayLike<number>): Uint8Array {
  if (x.length % 32 !== 0) throw new RangeError(`Q8_0 needs a multiple of 32 elements, got ${x.length}`);
  const out = new Uint8Array((x.length / 32) * 34);
  for (let i = 0; i < x.length / 32; i++) {
    let amax = 0;
    for (let j = 0; j < 32; j++) amax = Math.max(amax, Math.abs(x[i * 32 + j]!));
    const d = Math.fround(amax / 127);
    const id = d ? Math.fround(1 / d) : 0;
    const h = f32ToF16Bits(d);
    out[i * 34] = h & 0xff;
    out[i * 34 + 1] = h >> 8;
    for (let j = 0; j < 32; j++) out[i * 34 + 2 + j] = roundf(Math.fround(x[i * 32 + j]! * id)) & 0xff;
  }
  return out;
}

/** quantize_row_q4_0_ref: d = (signed value of max magnitude) / -8, q = min(15, trunc(x/d + 8.5)). */
export function quantizeQ4_0(x: ArrayLike<number>): Uint8Array {
  if (x.length % 32 !== 0) throw new RangeError(`Q4_0 needs a multiple of 32 elements, got ${x.length}`);
  const out = new Uint8Array((x.length / 32) * 18);
  for (let i = 0; i < x.length / 32; i++) {
    let amax = 0;
    let max = 0;
    for (let j = 0; j < 32; j++) {
      const v = x[i * 32 + j]!;
      if (Math.abs(v) > amax) {
        amax = Math.abs(v);
        max = v;
      }
    }
    const d = Math.fround(max / -8);
    const id = d ? Math.fround(1 / d) : 0;
    const h = f32ToF16Bits(d);
    out[i * 18] = h & 0xff;
    out[i * 18 + 1] = h >> 8;
    const q = (v: number) => Math.min(15, Math.trunc(Math.fround(Math.fround(v * id) + 8.5)));
    for (let j = 0; j < 16; j++) out[i * 18 + 2 + j] = q(x[i * 32 + j]!) | (q(x[i * 32 + j + 16]!) << 4);
  }
  return out;
}

/**
 * IQ4_NL blocks (f16 d, u8 qs[16]) of x, rounded as Kiln's iq4_nl encoder (quant-reference.ts iq4NlGroup: d = the
 * signed value of max magnitude / -127, each element the nearest of the 16 levels), not llama.cpp's scale search;
 * llama.cpp reads it like any IQ4_NL.
 */
export function quantizeIq4_NL(x: ArrayLike<number>): Uint8Array {
  if (x.length % 32 !== 0) throw new RangeError(`IQ4_NL needs a multiple of 32 elements, got ${x.length}`);
  const out = new Uint8Array((x.length / 32) * 18);
  const codes = new Uint8Array(32);
  for (let i = 0; i < x.length / 32; i++) {
    const h = iq4NlGroup(x, i * 32, codes);
    out[i * 18] = h & 0xff;
    out[i * 18 + 1] = h >> 8;
    for (let j = 0; j < 16; j++) out[i * 18 + 2 + j] = codes[j]! | (codes[j + 16]! << 4);
  }
  return out;
}

/**
 * MXFP4 blocks (u8 e, u8 qs[16]) of x, rounded as Kiln's `--quantization mxfp4` (quant-reference.ts: OCP's
 * exponent floor(log2(amax)) - 2, nearest E2M1 with ties to even), so an MXFP4 export holds the weights Kiln runs.
 * llama.cpp's quantize_row_mxfp4_ref differs only on exact ties (it takes the smaller magnitude) and on amax a
 * few ulps below a power of two (its log2f rounds up); its dequantizer reads either the same way.
 */
export function quantizeMxfp4(x: ArrayLike<number>): Uint8Array {
  if (x.length % 32 !== 0) throw new RangeError(`MXFP4 needs a multiple of 32 elements, got ${x.length}`);
  const out = new Uint8Array((x.length / 32) * 17);
  for (let i = 0; i < x.length / 32; i++) {
    let amax = 0;
    for (let j = 0; j < 32; j++) amax = Math.max(amax, Math.abs(x[i * 32 + j]!));
    const e = mxfp4Exponent(amax);
    out[i * 17] = e;
    const code = (v: number) => floatToE2m1(Math.fround(v) * 2 ** (127 - e));
    for (let j = 0; j < 16; j++) out[i * 17 + 1 + j] = code(x[i * 32 + j]!) | (code(x[i * 32 + 16 + j]!) << 4);
  }
  return out;
}

/**
 * Q4_K super-blocks of 256: a per-sub-block min/max fit (backends/cpu/q4k-reference.ts's quantizeQ4kRef, the
 * same bits Kiln's q4_k kernel runs), not llama.cpp's make_qkx2 search; llama.cpp reads it like any Q4_K.
 */
export function quantizeQ4_K(x: ArrayLike<number>): Uint8Array {
  if (x.length % 256 !== 0) throw new RangeError(`Q4_K needs a multiple of 256 elements, got ${x.length}`);
  const blocks = x.length / 256; // blocks are independent: quantize as [blocks, 256]
  return q4kToQ4_K(quantizeQ4kRef(x, blocks, 256), blocks, 256);
}

/**
 * Q5_K super-blocks of 256: quantizeQ4_K's fit with 5-bit codes (q4k-reference.ts's quantizeQ4kRef, bits 5: the same
 * bits Kiln's q5_k kernel runs), not llama.cpp's make_qkx2 search; llama.cpp reads it like any Q5_K.
 */
export function quantizeQ5_K(x: ArrayLike<number>): Uint8Array {
  if (x.length % 256 !== 0) throw new RangeError(`Q5_K needs a multiple of 256 elements, got ${x.length}`);
  const blocks = x.length / 256;
  return q5kToQ5_K(quantizeQ4kRef(x, blocks, 256, 5), blocks, 256);
}

/**
 * Q6_K super-blocks of 256: a per-sub-block absmax fit (backends/cpu/q6k-reference.ts's quantizeQ6kRef, the same
 * bits Kiln's q6_k kernel runs), not llama.cpp's make_qx_quants search; llama.cpp reads it like any Q6_K.
 */
export function quantizeQ6_K(x: ArrayLike<number>): Uint8Array {
  if (x.length % 256 !== 0) throw new RangeError(`Q6_K needs a multiple of 256 elements, got ${x.length}`);
  const blocks = x.length / 256;
  return q6kToQ6_K(quantizeQ6kRef(x, blocks, 256), blocks, 256);
}
