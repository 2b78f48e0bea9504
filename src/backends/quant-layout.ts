// How each weight-only quant scheme lays out an [n, k] weight (native/quant.h has the byte-level layouts): the one
// place the tensor layer (quantizeWeight's buffers) and the back ends (kernel arguments, the TS reference) read.
import type { QuantScheme } from "./backend.js";

/** GGUF Q4_K super-block size, and the meta bytes Kiln keeps per super-block (d, dmin, 8 scales, 8 mins). */
export const Q4K_BLOCK = 256;
export const Q4K_META_BYTES = 20;
/** GGUF Q6_K super-block size, its code bytes (ql[128], qh[64]) and the meta bytes Kiln keeps (f16 d, int8 sc[16]). */
export const Q6K_BLOCK = 256;
/** Code bytes per super-block of q5_k: Q4_K's 128 nibble bytes, then 32 bytes of fifth bits. */
export const Q5K_CODE_BYTES = 160;
export const Q6K_CODE_BYTES = 192;
export const Q6K_META_BYTES = 18;

/** Schemes of GGUF k-quant super-blocks of 256 (meta bytes per super-block). */
export function isSuperBlockScheme(scheme: QuantScheme): boolean {
  return scheme === "q4_k" || scheme === "q5_k" || scheme === "q6_k";
}

/** Schemes with one scale per group of 32 weights. */
export function isGroupScheme(scheme: QuantScheme): boolean {
  return scheme === "int4" || scheme === "int8_g32" || scheme === "mxfp4" || scheme === "iq4_nl";
}

/** The dtype of a scheme's scales: f32 per row (int8, fp8), f16 per group (int4, int8_g32, iq4_nl), bytes (q4_k / q6_k meta, mxfp4 e8m0). */
export function quantScaleDtype(scheme: QuantScheme): "float32" | "float16" | "uint8" {
  return scheme === "mxfp4" || isSuperBlockScheme(scheme) ? "uint8" : isGroupScheme(scheme) ? "float16" : "float32";
}

/** in_features must be a multiple of this: 64 (group schemes' chunks), 256 (q4_k / q6_k super-blocks) or 1. */
export function quantKMultiple(scheme: QuantScheme): number {
  return isSuperBlockScheme(scheme) ? Q4K_BLOCK : isGroupScheme(scheme) ? 64 : 1;
}

/** Bytes of quantized data for an [n, k] weight (4-bit codes for int4, q4_k, mxfp4 and iq4_nl, 6-bit for q6_k). */
export function quantDataBytes(scheme: QuantScheme, n: number, k: number): number {
  if (scheme === "q6_k") return (n * k * Q6K_CODE_BYTES) / Q6K_BLOCK;
  if (scheme === "q5_k") return (n * k * Q5K_CODE_BYTES) / Q4K_BLOCK;
  return scheme === "int4" || scheme === "q4_k" || scheme === "mxfp4" || scheme === "iq4_nl" ? (n * k) / 2 : n * k;
}

/** Scale count for an [n, k] weight (per row, per group of 32 for int4 / int8_g32 / mxfp4 / iq4_nl, meta bytes for q4_k / q6_k). */
export function quantScaleCount(scheme: QuantScheme, n: number, k: number): number {
  if (scheme === "q6_k") return (n * k * Q6K_META_BYTES) / Q6K_BLOCK;
  return scheme === "q4_k" || scheme === "q5_k" ? (n * k * Q4K_META_BYTES) / Q4K_BLOCK : isGroupScheme(scheme) ? (n * k) / 32 : n;
}

/** Bytes per scale element: 4 (f32), 2 (f16 bits) or 1 (q4_k / q6_k meta, mxfp4 e8m0). */
export function quantScaleBytes(scheme: QuantScheme): 1 | 2 | 4 {
  const dtype = quantScaleDtype(scheme);
  return dtype === "uint8" ? 1 : dtype === "float16" ? 2 : 4;
}
