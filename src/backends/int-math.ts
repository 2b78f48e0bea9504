// Integer semantics shared by the TS kernels, the compiler's constant folder and (spelled in C) its renderer: torch's
// on x86, with C's undefined cases made definite. A float cast to an integer truncates toward zero, and NaN, ±inf or
// a value out of range gives the type's minimum (what cvttss2si returns).
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

