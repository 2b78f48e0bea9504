// GGUF quantized blocks <-> Kiln's quant_matmul layouts (native/quant.h), moving bits only: no float round trip,
// so a repacked weight dequantizes to exactly what gguf-quant.ts's dequantize gives.
//   Q4_0 block (18 bytes, 32 elements): f16 d, u8 qs[16]; element j is qs[j] & 15 (j < 16) or qs[j-16] >> 4,
//        value (u - 8) * d.
//   Kiln int4 row: per 64-element chunk, 32 bytes with element j in the low nibble and 32 + j in the high nibble
//        (u = q + 8 as in Q4_0), and f16 scales [K/32], one per group of 32 = one Q4_0 block's d.
// So a chunk is two consecutive Q4_0 blocks: their nibbles are interleaved, their d's copied.
//   Q8_0 block (34 bytes, 32 elements): f16 d, int8 qs[32], value q * d.
//   Kiln int8_g32 row: int8 codes [K] as they are, f16 scales [K/32]: the blocks' two fields pulled apart.
//   MXFP4 block (17 bytes, 32 elements): u8 e (E8M0), u8 qs[16] in Q4_0's nibble order, each nibble an E2M1 code.
//   Kiln mxfp4 row: int4's nibble order, e8m0 bytes [K/32]: as Q4_0 -> int4, with one scale byte per block.
//   Q4_K super-block (144 bytes, 256 elements): f16 d, f16 dmin, u8 scales[12] (8 six-bit sub-block scales and 8
//        six-bit mins, packed as ggml's get_scale_min_k4 reads them), u8 qs[128] (byte l of 32-byte chunk c holds
//        element 64c + l in its low nibble, 64c + 32 + l in its high one: int4's order already).
//   Kiln q4_k row: qs of every super-block as they are [K/2], meta [K/256][20] = d, dmin, sc[8], m[8] unpacked.
//   Q5_K super-block (176 bytes, 256 elements): f16 d, f16 dmin, u8 scales[12] (as Q4_K's), u8 qh[32] (bit 2c of
//        qh[l] is the fifth bit of element 64c + l, bit 2c + 1 that of 64c + 32 + l), u8 qs[128] (as Q4_K's).
//   Kiln q5_k row: per super-block qs[128] then qh[32] [K/256][160], meta as q4_k's.
//   Q6_K super-block (210 bytes, 256 elements): u8 ql[128], u8 qh[64], int8 scales[16], f16 d.
//   Kiln q6_k row: ql and qh of every super-block as they are [K/256][192], meta [K/256][18] = d, scales[16].
import { Q4K_BLOCK, Q4K_META_BYTES, Q6K_BLOCK, Q6K_CODE_BYTES, Q6K_META_BYTES, quantKMultiple } from "../../backends/quant-layout.js";
import { floatToHalf, halfToFloat } from "../../backends/cpu/quant-reference.js";

/** Kiln int4 weight [n, k]: data [n, k/2] bytes, scales [n, k/32] f16 bits. */
export interface Int4Arrays {
  data: Uint8Array;
  scales: Uint16Array;
}

/** Whether rows of k elements fit the group-32 kernels (int4, int8_g32): they take whole 64-element chunks. */
export function fitsGroupKernels(k: number): boolean {
  return k % 64 === 0;
}

/** Kiln mxfp4 weight [n, k]: data [n, k/2] bytes (E2M1 codes), scales [n, k/32] E8M0 bytes. */
export interface Mxfp4Arrays {
  data: Uint8Array;
  scales: Uint8Array;
}

/** Two consecutive GGUF 4-bit blocks' qs (16 bytes each, at a and b) -> one Kiln 64-element chunk of 32 bytes at o. */
function chunkFromBlocks(src: Uint8Array, a: number, b: number, data: Uint8Array, o: number): void {
  for (let j = 0; j < 16; j++) {
    const qa = src[a + j]!;
    const qb = src[b + j]!;
    data[o + j] = (qa & 15) | ((qb & 15) << 4); // elements j and 32 + j
    data[o + 16 + j] = (qa >> 4) | (qb & 0xf0); // elements 16 + j and 48 + j
  }
}
/** The inverse of chunkFromBlocks. */
function blocksFromChunk(data: Uint8Array, o: number, out: Uint8Array, a: number, b: number): void {
  for (let j = 0; j < 16; j++) {
    const lo = data[o + j]!; // elements j | 32 + j
    const hi = data[o + 16 + j]!; // elements 16 + j | 48 + j
    out[a + j] = (lo & 15) | ((hi & 15) << 4);
    out[b + j] = (lo >> 4) | (hi & 0xf0);
  }
}

/** MXFP4 bytes of an [n, k] tensor (k % 64 == 0) -> Kiln mxfp4 data and scales. */
export function mxfp4ToKiln(src: Uint8Array, n: number, k: number): Mxfp4Arrays {
  if (!fitsGroupKernels(k)) throw new RangeError(`[mxfp4ToKiln] mxfp4 needs k % 64 == 0, got ${k}`);
  if (src.byteLength !== (n * k * 17) / 32) throw new RangeError(`[mxfp4ToKiln] ${src.byteLength} bytes are not MXFP4 [${n}, ${k}]`);
  const data = new Uint8Array((n * k) / 2);
  const scales = new Uint8Array((n * k) / 32);
  for (let c = 0; c < (n * k) / 64; c++) {
    scales[2 * c] = src[c * 34]!;
    scales[2 * c + 1] = src[c * 34 + 17]!;
    chunkFromBlocks(src, c * 34 + 1, c * 34 + 18, data, c * 32);
  }
  return { data, scales };
}

/** Kiln mxfp4 data and scales of an [n, k] weight -> MXFP4 bytes (the inverse of mxfp4ToKiln). */
export function kilnToMxfp4(q: Mxfp4Arrays, n: number, k: number): Uint8Array {
  if (!fitsGroupKernels(k)) throw new RangeError(`[kilnToMxfp4] mxfp4 needs k % 64 == 0, got ${k}`);
  const out = new Uint8Array((n * k * 17) / 32);
  for (let c = 0; c < (n * k) / 64; c++) {
    out[c * 34] = q.scales[2 * c]!;
    out[c * 34 + 17] = q.scales[2 * c + 1]!;
    blocksFromChunk(q.data, c * 32, out, c * 34 + 1, c * 34 + 18);
  }
  return out;
}

/** Q4_0 bytes of an [n, k] tensor (k % 64 == 0) -> Kiln int4 data and scales. */
export function q4_0ToInt4(src: Uint8Array, n: number, k: number): Int4Arrays {
  if (!fitsGroupKernels(k)) throw new RangeError(`[q4_0ToInt4] int4 needs k % 64 == 0, got ${k}`);
  if (src.byteLength !== (n * k * 18) / 32) throw new RangeError(`[q4_0ToInt4] ${src.byteLength} bytes are not Q4_0 [${n}, ${k}]`);
  const data = new Uint8Array((n * k) / 2);
  const scales = new Uint16Array((n * k) / 32);
  const blocks = (n * k) / 64; // pairs of Q4_0 blocks, i.e. Kiln chunks (rows are whole chunks)
  for (let c = 0; c < blocks; c++) {
    const a = c * 36; // block 2c: elements 0..31 of the chunk
    const b = a + 18; // block 2c + 1: elements 32..63
    scales[2 * c] = src[a]! | (src[a + 1]! << 8);
    scales[2 * c + 1] = src[b]! | (src[b + 1]! << 8);
    chunkFromBlocks(src, a + 2, b + 2, data, c * 32);
  }
  return { data, scales };
}

/**
 * IQ4_NL bytes of an [n, k] tensor (k % 64 == 0) -> Kiln iq4_nl data and scales: the block is Q4_0's (f16 d, 16
 * bytes of codes in its nibble order, each code an index into IQ4_NL_VALUES), so the repack is q4_0ToInt4's.
 */
export function iq4_nlToKiln(src: Uint8Array, n: number, k: number): Int4Arrays {
  if (!fitsGroupKernels(k)) throw new RangeError(`[iq4_nlToKiln] iq4_nl needs k % 64 == 0, got ${k}`);
  if (src.byteLength !== (n * k * 18) / 32) throw new RangeError(`[iq4_nlToKiln] ${src.byteLength} bytes are not IQ4_NL [${n}, ${k}]`);
  return q4_0ToInt4(src, n, k);
}

/**
 * IQ4_XS bytes of an [n, k] tensor (k % 256 == 0) -> Kiln iq4_nl data and scales. A super-block of 256 (136 bytes:
 * f16 d, u16 scales_h, u8 scales_l[4], qs[128]) holds 8 sub-blocks of 32 with IQ4_NL's codes; sub-block j's scale is
 * d * (ls_j - 32), ls_j 6 bits (the low 4 from scales_l, the high 2 from scales_h), exact in f32 and rounded to f16
 * here (within 2^-11 relative): iq4_nl keeps an f16 scale per 32.
 */
export function iq4_xsToIq4Nl(src: Uint8Array, n: number, k: number): Int4Arrays {
  if (k % 256 !== 0) throw new RangeError(`[iq4_xsToIq4Nl] IQ4_XS needs k % 256 == 0, got ${k}`);
  if (src.byteLength !== (n * k * 136) / 256) throw new RangeError(`[iq4_xsToIq4Nl] ${src.byteLength} bytes are not IQ4_XS [${n}, ${k}]`);
  const data = new Uint8Array((n * k) / 2);
  const scales = new Uint16Array((n * k) / 32);
  for (let b = 0; b < (n * k) / 256; b++) {
    const o = b * 136;
    const d = halfToFloat(src[o]! | (src[o + 1]! << 8));
    const scalesH = src[o + 2]! | (src[o + 3]! << 8);
    for (let j = 0; j < 8; j++) {
      const ls = ((src[o + 4 + (j >> 1)]! >> (4 * (j & 1))) & 15) | (((scalesH >> (2 * j)) & 3) << 4);
      scales[b * 8 + j] = floatToHalf(Math.fround(d * (ls - 32)));
    }
    for (let p = 0; p < 4; p++) chunkFromBlocks(src, o + 8 + 32 * p, o + 8 + 32 * p + 16, data, b * 128 + 32 * p);
  }
  return { data, scales };
}

/** Kiln int4 data and scales of an [n, k] weight -> Q4_0 bytes (the inverse of q4_0ToInt4). */
export function int4ToQ4_0(q: Int4Arrays, n: number, k: number): Uint8Array {
  if (!fitsGroupKernels(k)) throw new RangeError(`[int4ToQ4_0] int4 needs k % 64 == 0, got ${k}`);
  const out = new Uint8Array((n * k * 18) / 32);
  for (let c = 0; c < (n * k) / 64; c++) {
    const a = c * 36;
    const b = a + 18;
    out[a] = q.scales[2 * c]! & 0xff;
    out[a + 1] = q.scales[2 * c]! >> 8;
    out[b] = q.scales[2 * c + 1]! & 0xff;
    out[b + 1] = q.scales[2 * c + 1]! >> 8;
    blocksFromChunk(q.data, c * 32, out, a + 2, b + 2);
  }
  return out;
}

/** Kiln int8_g32 weight [n, k]: int8 codes [n, k] (as bytes), scales [n, k/32] f16 bits. */
export interface Int8G32Arrays {
  data: Uint8Array;
  scales: Uint16Array;
}

/** Q8_0 bytes of an [n, k] tensor (k % 64 == 0, as the kernel takes 64-element chunks) -> int8_g32 arrays. */
export function q8_0ToInt8G32(src: Uint8Array, n: number, k: number): Int8G32Arrays {
  if (k % 64 !== 0) throw new RangeError(`[q8_0ToInt8G32] int8_g32 needs k % 64 == 0, got ${k}`);
  if (src.byteLength !== (n * k * 34) / 32) throw new RangeError(`[q8_0ToInt8G32] ${src.byteLength} bytes are not Q8_0 [${n}, ${k}]`);
  const data = new Uint8Array(n * k);
  const scales = new Uint16Array((n * k) / 32);
  for (let b = 0; b < (n * k) / 32; b++) {
    scales[b] = src[b * 34]! | (src[b * 34 + 1]! << 8);
    data.set(src.subarray(b * 34 + 2, b * 34 + 34), b * 32);
  }
  return { data, scales };
}

/** int8_g32 arrays of an [n, k] weight -> Q8_0 bytes (the inverse of q8_0ToInt8G32). */
export function int8G32ToQ8_0(q: Int8G32Arrays, n: number, k: number): Uint8Array {
  const out = new Uint8Array((n * k * 34) / 32);
  for (let b = 0; b < (n * k) / 32; b++) {
    out[b * 34] = q.scales[b]! & 0xff;
    out[b * 34 + 1] = q.scales[b]! >> 8;
    out.set(q.data.subarray(b * 32, b * 32 + 32), b * 34 + 2);
  }
  return out;
}

/** Kiln q4_k weight [n, k]: data [n, k/2] bytes (unsigned codes), meta [n, k/256 * 20] bytes (d, dmin, sc[8], m[8]). */
export interface Q4kArrays {
  data: Uint8Array;
  scales: Uint8Array;
}

const Q4K_BYTES = 144;

const Q5K_BYTES = 176;

/**
 * Q4_K (bits 4) or Q5_K (bits 5) bytes of an [n, k] tensor (k % 256 == 0, as GGUF guarantees) -> Kiln q4_k / q5_k
 * data and meta: d, dmin and the 12 packed scale bytes unpacked (ggml's get_scale_min_k4), codes moved as they are.
 */
function kToKiln(src: Uint8Array, n: number, k: number, bits: 4 | 5, op: string): Q4kArrays {
  if (k % Q4K_BLOCK !== 0) throw new RangeError(`[${op}] q${bits}_k needs k % 256 == 0, got ${k}`);
  const blocks = (n * k) / Q4K_BLOCK;
  const [srcBytes, codeBytes] = bits === 4 ? [Q4K_BYTES, 128] : [Q5K_BYTES, 160];
  if (src.byteLength !== blocks * srcBytes) throw new RangeError(`[${op}] ${src.byteLength} bytes are not Q${bits}_K [${n}, ${k}]`);
  const data = new Uint8Array(blocks * codeBytes);
  const scales = new Uint8Array(blocks * Q4K_META_BYTES);
  for (let b = 0; b < blocks; b++) {
    const o = b * srcBytes;
    const m = b * Q4K_META_BYTES;
    scales.set(src.subarray(o, o + 4), m); // d, dmin
    const p = o + 4; // scales[12]
    for (let j = 0; j < 4; j++) {
      scales[m + 4 + j] = src[p + j]! & 63;
      scales[m + 12 + j] = src[p + j + 4]! & 63;
      scales[m + 8 + j] = (src[p + j + 8]! & 15) | ((src[p + j]! >> 6) << 4);
      scales[m + 16 + j] = (src[p + j + 8]! >> 4) | ((src[p + j + 4]! >> 6) << 4);
    }
    if (bits === 4) data.set(src.subarray(o + 16, o + Q4K_BYTES), b * 128);
    else {
      data.set(src.subarray(o + 48, o + Q5K_BYTES), b * 160); // qs
      data.set(src.subarray(o + 16, o + 48), b * 160 + 128); // qh
    }
  }
  return { data, scales };
}

/** The inverse of kToKiln (sc, m must be < 64). */
function kilnToK(q: Q4kArrays, n: number, k: number, bits: 4 | 5, op: string): Uint8Array {
  if (k % Q4K_BLOCK !== 0) throw new RangeError(`[${op}] q${bits}_k needs k % 256 == 0, got ${k}`);
  const blocks = (n * k) / Q4K_BLOCK;
  const [outBytes, codeBytes] = bits === 4 ? [Q4K_BYTES, 128] : [Q5K_BYTES, 160];
  const out = new Uint8Array(blocks * outBytes);
  for (let b = 0; b < blocks; b++) {
    const o = b * outBytes;
    const m = b * Q4K_META_BYTES;
    out.set(q.scales.subarray(m, m + 4), o);
    const p = o + 4;
    for (let j = 0; j < 4; j++) {
      const scHi = q.scales[m + 8 + j]!; // sub-blocks 4..7: low 4 bits in scales[8..11], top 2 bits above j's
      const mHi = q.scales[m + 16 + j]!;
      out[p + j] = q.scales[m + 4 + j]! | ((scHi >> 4) << 6);
      out[p + j + 4] = q.scales[m + 12 + j]! | ((mHi >> 4) << 6);
      out[p + j + 8] = (scHi & 15) | ((mHi & 15) << 4);
    }
    const c = b * codeBytes;
    if (bits === 4) out.set(q.data.subarray(c, c + 128), o + 16);
    else {
      out.set(q.data.subarray(c + 128, c + 160), o + 16); // qh
      out.set(q.data.subarray(c, c + 128), o + 48); // qs
    }
  }
  return out;
}

/** Q4_K bytes of an [n, k] tensor (k % 256 == 0, as GGUF guarantees) -> Kiln q4_k data and meta. */
export function q4_KToQ4k(src: Uint8Array, n: number, k: number): Q4kArrays {
  return kToKiln(src, n, k, 4, "q4_KToQ4k");
}

/** Kiln q4_k data and meta of an [n, k] weight -> Q4_K bytes (the inverse of q4_KToQ4k; sc, m must be < 64). */
export function q4kToQ4_K(q: Q4kArrays, n: number, k: number): Uint8Array {
  return kilnToK(q, n, k, 4, "q4kToQ4_K");
}

/** Q5_K bytes of an [n, k] tensor -> Kiln q5_k data [n, k/256*160] and meta (q4_k's). */
export function q5_KToQ5k(src: Uint8Array, n: number, k: number): Q4kArrays {
  return kToKiln(src, n, k, 5, "q5_KToQ5k");
}

/** Kiln q5_k data and meta of an [n, k] weight -> Q5_K bytes (the inverse of q5_KToQ5k). */
export function q5kToQ5_K(q: Q4kArrays, n: number, k: number): Uint8Array {
  return kilnToK(q, n, k, 5, "q5kToQ5_K");
}

/** Kiln q6_k weight [n, k]: data [n, k/256 * 192] bytes (ql, qh), meta [n, k/256 * 18] bytes (d, sc[16]). */
export interface Q6kArrays {
  data: Uint8Array;
  scales: Uint8Array;
}

const Q6K_BYTES = 210;

/** Q6_K bytes of an [n, k] tensor (k % 256 == 0, as GGUF guarantees) -> Kiln q6_k data and meta. */
export function q6_KToQ6k(src: Uint8Array, n: number, k: number): Q6kArrays {
  if (k % Q6K_BLOCK !== 0) throw new RangeError(`[q6_KToQ6k] q6_k needs k % 256 == 0, got ${k}`);
  const blocks = (n * k) / Q6K_BLOCK;
  if (src.byteLength !== blocks * Q6K_BYTES) throw new RangeError(`[q6_KToQ6k] ${src.byteLength} bytes are not Q6_K [${n}, ${k}]`);
  const data = new Uint8Array(blocks * Q6K_CODE_BYTES);
  const scales = new Uint8Array(blocks * Q6K_META_BYTES);
  for (let b = 0; b < blocks; b++) {
    const o = b * Q6K_BYTES;
    const m = b * Q6K_META_BYTES;
    data.set(src.subarray(o, o + Q6K_CODE_BYTES), b * Q6K_CODE_BYTES);
    scales[m] = src[o + 208]!; // d
    scales[m + 1] = src[o + 209]!;
    scales.set(src.subarray(o + 192, o + 208), m + 2);
  }
  return { data, scales };
}

/** Kiln q6_k data and meta of an [n, k] weight -> Q6_K bytes (the inverse of q6_KToQ6k). */
export function q6kToQ6_K(q: Q6kArrays, n: number, k: number): Uint8Array {
  if (k % Q6K_BLOCK !== 0) throw new RangeError(`[q6kToQ6_K] q6_k needs k % 256 == 0, got ${k}`);
  const blocks = (n * k) / Q6K_BLOCK;
  const out = new Uint8Array(blocks * Q6K_BYTES);
  for (let b = 0; b < blocks; b++) {
    const o = b * Q6K_BYTES;
    const m = b * Q6K_META_BYTES;
    out.set(q.data.subarray(b * Q6K_CODE_BYTES, (b + 1) * Q6K_CODE_BYTES), o);
    out.set(q.scales.subarray(m + 2, m + Q6K_META_BYTES), o + 192);
    out[o + 208] = q.scales[m]!;
    out[o + 209] = q.scales[m + 1]!;
  }
  return out;
}

/** The GGUF block types Kiln's kernels run as they are, and the quant_matmul scheme each becomes. */
export const GGUF_DIRECT_SCHEME = { Q4_0: "int4", Q8_0: "int8_g32", Q4_K: "q4_k", Q5_K: "q5_k", Q6_K: "q6_k", IQ4_NL: "iq4_nl", IQ4_XS: "iq4_nl", MXFP4: "mxfp4" } as const;
export type GgufDirectType = keyof typeof GGUF_DIRECT_SCHEME;

/**
 * Bytes per row of an [n, k] tensor of a direct type (per 32 elements Q4_0 and IQ4_NL: 18, Q8_0: 34, MXFP4: 17; per 256 Q4_K:
 * 144, Q5_K: 176, Q6_K: 210, IQ4_XS: 136).
 */
export function ggufDirectRowBytes(type: GgufDirectType, k: number): number {
  if (type === "Q4_K" || type === "Q5_K" || type === "Q6_K" || type === "IQ4_XS") return (k / 256) * { Q4_K: Q4K_BYTES, Q5_K: Q5K_BYTES, Q6_K: Q6K_BYTES, IQ4_XS: 136 }[type];
  return (k / 32) * { Q4_0: 18, IQ4_NL: 18, Q8_0: 34, MXFP4: 17 }[type];
}

/** What in_features of `type` must be a multiple of: its kernel's chunk (64 or 256), or IQ4_XS's super-block (256). */
export function directKMultiple(type: GgufDirectType): number {
  return type === "IQ4_XS" ? 256 : quantKMultiple(GGUF_DIRECT_SCHEME[type]);
}

/** Whether rows of k elements of `type` fit its kernel (group kernels: 64-element chunks; q4_k and q6_k: 256). */
export function fitsDirectKernel(type: GgufDirectType, k: number): boolean {
  return k % directKMultiple(type) === 0;
}

/**
 * GGUF blocks of an [n, k] tensor -> the data and scales of its Kiln scheme (int4 / iq4_nl / q4_k / mxfp4 data is
 * [n, k/2]); scales are f16 bits (Uint16Array) [n, k/32], q4_k's / q5_k's meta bytes [n, k/256*20], q6_k's [n, k/256*18], or
 * mxfp4's E8M0 bytes [n, k/32]. q5_k's data is [n, k/256*160], q6_k's [n, k/256*192]. The TS twin of the native
 * ggufRepack, which the loader runs (in place, into the weights' memory).
 */
export function repackGgufBlocks(type: GgufDirectType, src: Uint8Array, n: number, k: number): Int4Arrays | Int8G32Arrays | Mxfp4Arrays | Q4kArrays | Q6kArrays {
  if (type === "MXFP4") return mxfp4ToKiln(src, n, k);
  if (type === "Q6_K") return q6_KToQ6k(src, n, k);
  if (type === "Q5_K") return q5_KToQ5k(src, n, k);
  if (type === "IQ4_NL") return iq4_nlToKiln(src, n, k);
  if (type === "IQ4_XS") return iq4_xsToIq4Nl(src, n, k);
  return type === "Q4_0" ? q4_0ToInt4(src, n, k) : type === "Q8_0" ? q8_0ToInt8G32(src, n, k) : q4_KToQ4k(src, n, k);
}
