// Integer semantics shared by the TS kernels, the compiler's constant folder and (spelled in C) its renderer: torch's
// on x86, with C's undefined cases made definite. Integer arithmetic wraps modulo 2^width; a float cast to an integer
// truncates toward zero, and NaN, ±inf or a value out of range gives the type's minimum (what cvttss2si returns).
import type { DType } from "./dtype.js";

/**
 * A float value cast to an integer dtype: truncated toward zero; NaN, ±inf and values outside int32 (int64 for
 * int64) give -2^31 (-2^63), as torch on x86 (torch.tensor(nan).int() is -2147483648). 8-bit dtypes take the int32
 * result's low byte, as a typed array stores it.
 */
export function floatToInt(v: number, dtype: DType): number {
  const limit = dtype === "int64" ? 2 ** 63 : 2 ** 31;
  return v >= -limit && v < limit ? Math.trunc(v) : -limit;
}

/** Whether integer results of this dtype fit int32 arithmetic that wraps (Math.imul): int32 and the 8-bit types. */
export function wrapsInInt32(dtype: DType): boolean {
  return dtype === "int32" || dtype === "int8" || dtype === "uint8";
}

/**
 * torch's integer pow (ATen's powi) in int32 arithmetic, wrapping modulo 2^32: a negative exponent gives 0, except
 * 1 (1) and -1 (±1 by the exponent's parity). Operands are read as int32 (torch casts them to the result dtype).
 */
export function powInt32(a: number, b: number): number {
  a |= 0;
  b |= 0;
  if (b < 0) return a === 1 ? 1 : a === -1 ? (b & 1 ? -1 : 1) : 0;
  let result = 1;
  for (; b !== 0; b >>>= 1) {
    if (b & 1) result = Math.imul(result, a);
    a = Math.imul(a, a);
  }
  return result;
}

/** powInt32's rule in int64 arithmetic (wrapping modulo 2^64), as a number: exact while the result is within 2^53. */
export function powInt64(a: number, b: number): number {
  if (b < 0) return a === 1 ? 1 : a === -1 ? (b % 2 ? -1 : 1) : 0;
  let base = BigInt(a);
  let result = 1n;
  for (let e = BigInt(b); e !== 0n; e >>= 1n) {
    if (e & 1n) result = BigInt.asIntN(64, result * base);
    base = BigInt.asIntN(64, base * base);
  }
  return Number(result);
}

/**
 * The integer form of mul / pow for a result dtype, or undefined where the float64 formula is exact: int32 and 8-bit
 * results wrap (Math.imul; 2147483647 * 2147483647 rounds in float64), int64 pow wraps modulo 2^64.
 */
export function integerBinary(fn: string, dtype: DType): ((a: number, b: number) => number) | undefined {
  if (fn === "mul" && wrapsInInt32(dtype)) return Math.imul;
  if (fn === "pow") return wrapsInInt32(dtype) ? powInt32 : dtype === "int64" ? powInt64 : undefined;
  return undefined;
}
