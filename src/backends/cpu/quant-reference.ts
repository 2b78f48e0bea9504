// Readable TS twins of the quantized kernels (native/quant-impl.inc): weight quantization, dequantization and
// the quantized matmul with the same per-row int8 activation quantization, so tests can compare exactly what
// the native code computes. Layouts are documented in native/quant.h.
import type { QuantScheme } from "../backend.js";
import type { NativeKernels } from "./native.js";
import { dequantizeQ4kRef, q4kMatmulRef, quantizeQ4kRef } from "./q4k-reference.js";
import { dequantizeQ6kRef, q6kMatmulRef, quantizeQ6kRef } from "./q6k-reference.js";
import { quantizeActivationsRef, roundHalfEven } from "../quant-activations.js";
export { quantizeActivationsRef, roundHalfEven };
import { isGroupScheme, quantDataBytes, quantKMultiple, quantScaleBytes, quantScaleCount, quantScaleDtype } from "../quant-layout.js";

export { isGroupScheme, quantDataBytes, quantKMultiple, quantScaleBytes, quantScaleCount, quantScaleDtype };

/** Native scheme codes of quantMatmul / quantizeWeights. */
export const QUANT_SCHEME_CODE: Record<QuantScheme, 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 | 8> = { int8: 0, int4: 1, fp8: 2, int8_g32: 3, q4_k: 4, mxfp4: 5, q6_k: 6, q5_k: 7, iq4_nl: 8 };

/** QUANT_SCHEME_CODE as native.ts types the scheme argument. */
export function nativeQuantCode(scheme: QuantScheme): Parameters<NativeKernels["quantMatmul"]>[8] {
  return QUANT_SCHEME_CODE[scheme] as Parameters<NativeKernels["quantMatmul"]>[8];
}

const nativeSchemes = new WeakMap<object, Map<QuantScheme, boolean>>();
/**
 * Whether this build of the native addon takes `scheme` (an addon older than quant.h's int8_g32 rejects code 3):
 * probed once per kernels object with a 1x64 call; without it, the host path (this file's reference) runs.
 * `k` must be the synchronous kernels (tryLoadNativeKernels()), never the stream launcher: a queued probe would
 * write its scratch arrays after they may have been garbage-collected (heap corruption).
 */
export function nativeTakesScheme(k: NativeKernels, scheme: QuantScheme): boolean {
  let known = nativeSchemes.get(k);
  if (!known) nativeSchemes.set(k, (known = new Map()));
  let ok = known.get(scheme);
  if (ok === undefined) {
    try {
      const kk = Math.max(64, quantKMultiple(scheme));
      const scales = newQuantScales(scheme, 1, kk);
      k.quantMatmul(new Float32Array(kk), new Uint8Array(kk), scales, new Int32Array(1), new Float32Array(1), 1, 1, kk, nativeQuantCode(scheme));
      ok = true;
    } catch {
      ok = false;
    }
    known.set(scheme, ok);
  }
  return ok;
}

/** A zeroed scales array of an [n, k] weight, typed as the kernels take it (f16 as bits). */
export function newQuantScales(scheme: QuantScheme, n: number, k: number): Float32Array | Uint16Array | Uint8Array {
  return newScales(scheme, quantScaleCount(scheme, n, k));
}

/**
 * A quantized [n, k] weight as plain arrays: data bytes, scales (f32 per row, f16 bits per group, q4_k's meta
 * bytes per super-block, or e8m0 bytes per group for mxfp4), rowSums (int8).
 */
export interface QuantizedArrays {
  data: Uint8Array;
  scales: Float32Array | Uint16Array | Uint8Array;
  rowSums: Int32Array;
}

/** A scales array of `count` elements of the scheme's type (views `buffer` when given). */
export function newScales(scheme: QuantScheme, count: number, buffer?: ArrayBuffer): Float32Array | Uint16Array | Uint8Array {
  const bytes = quantScaleBytes(scheme);
  if (buffer) return bytes === 1 ? new Uint8Array(buffer) : bytes === 2 ? new Uint16Array(buffer) : new Float32Array(buffer);
  return bytes === 1 ? new Uint8Array(count) : bytes === 2 ? new Uint16Array(count) : new Float32Array(count);
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** f16 bits -> number. */
export function halfToFloat(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return sign * m * 2 ** -24;
  if (e === 31) return m ? NaN : sign * Infinity;
  return sign * (1 + m / 1024) * 2 ** (e - 15);
}
/** number -> f16 bits, round to nearest even (as native floatToHalf). */
export function floatToHalf(x: number): number {
  f32[0] = x;
  const sign = (u32[0]! >>> 16) & 0x8000;
  const a = Math.abs(Math.fround(x));
  if (!(a < 65520)) return sign | 0x7c00;
  if (a < 6.103515625e-5) return sign | Math.round(roundHalfEven(a * 16777216));
  f32[0] = a;
  const bits = u32[0]!;
  const mant = bits & 0x7fffff;
  const exp = (bits >>> 23) - 112;
  let h = (exp << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && h & 1)) h++;
  return sign | h;
}

/** e4m3fn code -> value (no infinities; 0x7f / 0xff are NaN). */
export const FP8_E4M3: Float32Array = (() => {
  const t = new Float32Array(256);
  for (let i = 0; i < 256; i++) {
    const e = (i >> 3) & 15;
    const m = i & 7;
    let v = e === 0 ? m * 2 ** -9 : (1 + m / 8) * 2 ** (e - 7);
    if (e === 15 && m === 7) v = NaN;
    t[i] = i & 0x80 ? -v : v;
  }
  return t;
})();
const F32_BITS = new Uint32Array(1);
const F32_VIEW = new Float32Array(F32_BITS.buffer);
/**
 * The nearest float8 e4m3fn code for |x| <= 448 (larger magnitudes take 448), a tie going to the even code; NaN and
 * zeros give code 0. x is taken as a float32 (Math.fround). From its bits, as native/quant-impl.inc: the mantissa
 * rounded to 3 bits, to nearest even (a carry moves up the exponent), or x * 2^9 so rounded to an integer below e4m3's
 * smallest normal 2^-6.
 */
export function floatToFp8(x: number): number {
  const sign = x < 0 ? 0x80 : 0;
  F32_VIEW[0] = Math.abs(x);
  const a = F32_VIEW[0]!;
  if (!(a > 0)) return sign;
  if (a < 2 ** -6) return sign | roundHalfEven(a * 512);
  const u = F32_BITS[0]!;
  let e = (u >>> 23) - 127 + 7;
  let m = (u >>> 20) & 7;
  const rest = u & 0xfffff;
  if (rest > 0x80000 || (rest === 0x80000 && (m & 1) === 1)) m++;
  if (m === 8) {
    m = 0;
    e++;
  }
  return sign | (e > 15 ? 126 : Math.min(126, (e << 3) | m));
}

// ---- IQ4_NL (GGUF): 4-bit indices into 16 non-linear int8 levels, f16 scales per 32, int4's nibble order

/** ggml's kvalues_iq4nl: the value of each IQ4_NL code (w = value * scale). */
export const IQ4_NL_VALUES: Int8Array = Int8Array.from([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]);

/**
 * IQ4_NL codes of f32 w [n, k]: per group of 32, the scale d = (the largest-magnitude element) / -127 (so it lands on
 * the -127 level) and each element the nearest level of x / d (ties to the lower code). A plain encoder for tests and
 * exports, not llama.cpp's (which searches scales for the least weighted error).
 */
function quantizeIq4NlRef(w: Float32Array, n: number, k: number): { data: Uint8Array; scales: Uint16Array } {
  if (k % 64 !== 0) throw new RangeError(`[quantize] iq4_nl needs in_features % 64 == 0, got ${k}`);
  const data = new Uint8Array((n * k) / 2);
  const scales = new Uint16Array((n * k) / 32);
  const codes = new Uint8Array(32);
  for (let g = 0; g < (n * k) / 32; g++) {
    scales[g] = iq4NlGroup(w, g * 32, codes);
    const base = (g >> 1) * 32; // the group's chunk; odd groups take the high nibbles
    for (let i = 0; i < 32; i++) data[base + i]! |= codes[i]! << (g & 1 ? 4 : 0);
  }
  return { data, scales };
}

/** One IQ4_NL group of x[at .. at + 32) (quantizeIq4NlRef's rule): its codes into `codes`; returns the scale's f16 bits. */
export function iq4NlGroup(x: ArrayLike<number>, at: number, codes: Uint8Array): number {
  let mx = 0;
  for (let i = 0; i < 32; i++) if (Math.abs(x[at + i]!) > Math.abs(mx)) mx = x[at + i]!;
  const bits = floatToHalf(Math.fround(mx / -127));
  const d = halfToFloat(bits);
  for (let i = 0; i < 32; i++) {
    const v = d !== 0 ? x[at + i]! / d : 0;
    let best = 0;
    for (let c = 1; c < 16; c++) if (Math.abs(v - IQ4_NL_VALUES[c]!) < Math.abs(v - IQ4_NL_VALUES[best]!)) best = c;
    codes[i] = best;
  }
  return bits;
}

// ---- MXFP4 (OCP Microscaling): E2M1 codes, bit 3 sign, bits 2..1 exponent, bit 0 mantissa; E8M0 scales

/** Doubled E2M1 value of each code (integers; llama.cpp's kvalues_mxfp4): value = MXFP4_DOUBLED[code] / 2. */
export const MXFP4_DOUBLED: Int8Array = Int8Array.from([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]);

/** E8M0 byte -> 2^(e - 127) (e = 0 is the f32 subnormal 2^-127; 255, NaN in the spec, is never written). */
export function e8m0ToFloat(e: number): number {
  return 2 ** (e - 127);
}

/**
 * OCP's shared exponent of a block of max magnitude amax: floor(log2(amax)) - 2 (E2M1's largest exponent), biased
 * by 127 and clamped to [0, 254]; 0 for an all-zero block. Exact (no log2 rounding), as native mxfp4Exponent.
 */
export function mxfp4Exponent(amax: number): number {
  if (!(amax > 0) || !Number.isFinite(amax)) return 0;
  let ex = Math.floor(Math.log2(amax));
  if (2 ** ex > amax) ex--; // log2 rounded up just below a power of two
  else if (2 ** (ex + 1) <= amax) ex++;
  return Math.min(254, Math.max(0, ex - 2 + 127));
}

/** Nearest E2M1 code of v, ties to the even code (mantissa bit 0), saturating at +-6; zero is code 0. */
export function floatToE2m1(v: number): number {
  const a = Math.abs(v);
  let best = 0;
  let bestErr = a;
  for (let c = 1; c < 8; c++) {
    const err = Math.abs(a - MXFP4_DOUBLED[c]! / 2);
    if (err < bestErr || (err === bestErr && (c & 1) === 0)) {
      best = c;
      bestErr = err;
    }
  }
  return best !== 0 && v < 0 ? best | 8 : best;
}

/** Quantizes f32 w [n, k] (reference for the native quantizeWeights). */
export function quantizeWeightsRef(scheme: QuantScheme, w: Float32Array, n: number, k: number): QuantizedArrays {
  const data = new Uint8Array(quantDataBytes(scheme, n, k));
  const rowSums = new Int32Array(scheme === "int8" ? n : 0);
  if (scheme === "mxfp4") {
    // per group of 32: e = mxfp4Exponent(amax), codes = nearest E2M1 of x / 2^(e - 127); int4's nibble order
    if (k % 64 !== 0) throw new RangeError(`[quantize] mxfp4 needs in_features % 64 == 0, got ${k}`);
    const scales = new Uint8Array((n * k) / 32);
    for (let g = 0; g < (n * k) / 32; g++) {
      let amax = 0;
      for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(w[g * 32 + i]!));
      const e = mxfp4Exponent(amax);
      scales[g] = e;
      const base = (g >> 1) * 32; // the group's chunk; odd groups take the high nibbles
      for (let i = 0; i < 32; i++) data[base + i]! |= floatToE2m1(w[g * 32 + i]! * 2 ** (127 - e)) << (g & 1 ? 4 : 0);
    }
    return { data, scales, rowSums };
  }
  if (scheme === "q4_k" || scheme === "q5_k") return { ...quantizeQ4kRef(w, n, k, scheme === "q4_k" ? 4 : 5), rowSums };
  if (scheme === "q6_k") return { ...quantizeQ6kRef(w, n, k), rowSums };
  if (scheme === "iq4_nl") return { ...quantizeIq4NlRef(w, n, k), rowSums };
  if (scheme === "int4") {
    if (k % 64 !== 0) throw new RangeError(`[quantize] int4 needs in_features % 64 == 0, got ${k}`);
    const scales = new Uint16Array((n * k) / 32);
    const v = new Uint8Array(64);
    for (let r = 0; r < n; r++) {
      for (let c = 0; c < k / 64; c++) {
        for (let g = 0; g < 2; g++) {
          const base = r * k + c * 64 + g * 32;
          let amax = 0;
          let mx = 0;
          for (let i = 0; i < 32; i++) {
            if (Math.abs(w[base + i]!) <= amax) continue;
            amax = Math.abs(w[base + i]!);
            mx = w[base + i]!;
          }
          // llama.cpp's quantize_row_q4_0_ref, step for step (so a Q4_0 export holds these exact bits):
          // d = max / -8 in f32, id = 1/d from the unrounded d, u = min(15, trunc(x * id + 8.5)), d stored as f16
          const d = Math.fround(mx / -8);
          const id = d !== 0 ? Math.fround(1 / d) : 0;
          scales[(r * k) / 32 + c * 2 + g] = floatToHalf(d);
          for (let i = 0; i < 32; i++) v[g * 32 + i] = Math.min(15, Math.trunc(Math.fround(Math.fround(w[base + i]! * id) + 8.5)));
        }
        for (let j = 0; j < 32; j++) data[(r * k) / 2 + c * 32 + j] = v[j]! | (v[j + 32]! << 4);
      }
    }
    return { data, scales, rowSums };
  }
  if (scheme === "int8_g32") {
    // llama.cpp's quantize_row_q8_0_ref: d = amax / 127 in f32, id = 1/d, q = roundf(x * id) (half away from 0)
    if (k % 64 !== 0) throw new RangeError(`[quantize] int8_g32 needs in_features % 64 == 0, got ${k}`);
    const scales = new Uint16Array((n * k) / 32);
    for (let g = 0; g < (n * k) / 32; g++) {
      let amax = 0;
      for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(w[g * 32 + i]!));
      const d = Math.fround(amax / 127);
      const id = d !== 0 ? Math.fround(1 / d) : 0;
      scales[g] = floatToHalf(d);
      for (let i = 0; i < 32; i++) {
        const x = Math.fround(w[g * 32 + i]! * id);
        data[g * 32 + i] = (Math.sign(x) * Math.round(Math.abs(x))) & 0xff;
      }
    }
    return { data, scales, rowSums };
  }
  const scales = new Float32Array(n);
  const limit = scheme === "int8" ? 127 : 448;
  for (let r = 0; r < n; r++) {
    let amax = 0;
    for (let i = 0; i < k; i++) amax = Math.max(amax, Math.abs(w[r * k + i]!));
    scales[r] = Math.fround(amax / limit);
    const inv = amax > 0 ? Math.fround(limit / amax) : 0;
    let sum = 0;
    for (let i = 0; i < k; i++) {
      const x = Math.fround(w[r * k + i]! * inv);
      if (scheme === "int8") {
        const q = Math.min(127, Math.max(-127, roundHalfEven(x)));
        data[r * k + i] = q & 0xff;
        sum += q;
      } else data[r * k + i] = floatToFp8(x);
    }
    if (scheme === "int8") rowSums[r] = sum;
  }
  return { data, scales, rowSums };
}

/** The f32 [n, k] weight a quantized one stands for. */
export function dequantizeRef(scheme: QuantScheme, q: QuantizedArrays, n: number, k: number): Float32Array {
  if (scheme === "q4_k" || scheme === "q5_k") return dequantizeQ4kRef({ data: q.data, scales: q.scales as Uint8Array }, n, k, scheme === "q4_k" ? 4 : 5);
  if (scheme === "q6_k") return dequantizeQ6kRef({ data: q.data, scales: q.scales as Uint8Array }, n, k);
  const out = new Float32Array(n * k);
  for (let r = 0; r < n; r++) {
    for (let i = 0; i < k; i++) {
      let v: number;
      if (scheme === "int8") v = ((q.data[r * k + i]! << 24) >> 24) * q.scales[r]!;
      else if (scheme === "int8_g32") v = ((q.data[r * k + i]! << 24) >> 24) * halfToFloat(q.scales[(r * k + i) >> 5]!);
      else if (scheme === "fp8") v = FP8_E4M3[q.data[r * k + i]!]! * q.scales[r]!;
      else if (scheme === "mxfp4") {
        const byte = q.data[(r * k) / 2 + Math.floor(i / 64) * 32 + (i % 32)]!;
        v = (MXFP4_DOUBLED[i % 64 < 32 ? byte & 15 : byte >> 4]! / 2) * e8m0ToFloat(q.scales[(r * k + i) >> 5]!);
      } else if (scheme === "iq4_nl") {
        const byte = q.data[(r * k) / 2 + Math.floor(i / 64) * 32 + (i % 32)]!;
        v = IQ4_NL_VALUES[i % 64 < 32 ? byte & 15 : byte >> 4]! * halfToFloat(q.scales[(r * k + i) >> 5]!);
      } else {
        const c = Math.floor(i / 64);
        const j = i % 64;
        const byte = q.data[(r * k) / 2 + c * 32 + (j % 32)]!;
        const u = j < 32 ? byte & 15 : byte >> 4;
        v = (u - 8) * halfToFloat(q.scales[(r * k) / 32 + Math.floor(i / 32)]!);
      }
      out[r * k + i] = v;
    }
  }
  return out;
}


/**
 * out [m, n] = x @ dequant(W)^T computed like the kernel: int8/int4/int8_g32 quantize x per row and take exact
 * integer dots (per group for int4 and int8_g32); fp8 dots f32 x with the decoded weights.
 */
export function quantMatmulRef(
  scheme: QuantScheme, x: Float32Array, q: QuantizedArrays, m: number, n: number, k: number,
  /** x already quantized (quantizeActivationsRef's result): used instead of quantizing x */
  pre?: { xq: Int8Array; xs: Float32Array },
): Float32Array {
  // (the k-quants quantize x themselves: the same bits as `pre`)
  if (scheme === "q4_k" || scheme === "q5_k") return q4kMatmulRef(x, { data: q.data, scales: q.scales as Uint8Array }, m, n, k, scheme === "q4_k" ? 4 : 5);
  if (scheme === "q6_k") return q6kMatmulRef(x, { data: q.data, scales: q.scales as Uint8Array }, m, n, k);
  const out = new Float32Array(m * n);
  if (scheme === "fp8") {
    const w = dequantizeRef(scheme, { ...q, scales: new Float32Array(n).fill(1) }, n, k);
    for (let r = 0; r < m; r++)
      for (let c = 0; c < n; c++) {
        let s = 0;
        for (let i = 0; i < k; i++) s += x[r * k + i]! * w[c * k + i]!;
        out[r * n + c] = s * q.scales[c]!;
      }
    return out;
  }
  const { xq, xs } = pre ?? quantizeActivationsRef(x, m, k);
  if (scheme === "int8") {
    for (let r = 0; r < m; r++)
      for (let c = 0; c < n; c++) {
        let dot = 0;
        for (let i = 0; i < k; i++) dot += xq[r * k + i]! * ((q.data[c * k + i]! << 24) >> 24);
        out[r * n + c] = Math.fround(xs[r]! * q.scales[c]!) * dot;
      }
    return out;
  }
  const w = dequantizeRef(scheme, q, n, k); // q * d per element (int4, int8_g32, mxfp4, iq4_nl); group sums stay exact in f64
  for (let r = 0; r < m; r++)
    for (let c = 0; c < n; c++) {
      let s = 0;
      for (let i = 0; i < k; i++) s += xq[r * k + i]! * w[c * k + i]!;
      out[r * n + c] = xs[r]! * s;
    }
  return out;
}
