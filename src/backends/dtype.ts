// Element types. Storage is always a plain ArrayBuffer on host back ends; these tables say how to read it.
import type { BinaryOp, UnaryOp } from "./backend.js";
import { OpError } from "../util/errors.js";

export type DType =
  | "float32"
  | "float16"
  | "bfloat16"
  | "float8_e4m3fn"
  | "float8_e5m2"
  | "int8"
  | "uint8"
  | "int32"
  | "int64"
  | "bool";

export const DTYPES: readonly DType[] = [
  "float32",
  "float16",
  "bfloat16",
  "float8_e4m3fn",
  "float8_e5m2",
  "int8",
  "uint8",
  "int32",
  "int64",
  "bool",
];

export const DTYPE_BYTES: Record<DType, number> = {
  float32: 4,
  float16: 2,
  bfloat16: 2,
  float8_e4m3fn: 1,
  float8_e5m2: 1,
  int8: 1,
  uint8: 1,
  int32: 4,
  int64: 8,
  bool: 1,
};

/** Whether `x` names one of DTYPES (float64 and the complex types are not among them); one property lookup. */
export function isDType(x: unknown): x is DType {
  return typeof x === "string" && Object.hasOwn(DTYPE_BYTES, x);
}

export function isFloating(d: DType): boolean {
  return d === "float32" || d === "float16" || d === "bfloat16" || d === "float8_e4m3fn" || d === "float8_e5m2";
}

export function isIntegral(d: DType): boolean {
  return d === "int8" || d === "uint8" || d === "int32" || d === "int64" || d === "bool";
}

/** PyTorch-style type promotion for binary ops (a simplified lattice: bool < ints < floats; float wins). */
export function promoteTypes(a: DType, b: DType): DType {
  if (a === b) return a;
  const fa = isFloating(a);
  const fb = isFloating(b);
  if (fa && !fb) return a;
  if (fb && !fa) return b;
  if (fa && fb) {
    // Mixed 16-bit/8-bit floats promote to float32, as torch does for f16+bf16.
    return "float32";
  }
  const rank: Record<string, number> = { bool: 0, uint8: 1, int8: 2, int32: 3, int64: 4 };
  if ((a === "uint8" && b === "int8") || (a === "int8" && b === "uint8")) return "int32";
  return rank[a]! >= rank[b]! ? a : b;
}

/**
 * The dtype a plain JS scalar takes next to a tensor of dtype `t` (torch's wrapped-number rule: a scalar only
 * raises the category bool < integer < floating, never the width within one): a boolean keeps t; an integer keeps
 * t unless t is bool (then int32, Kiln's default int); a fractional or non-finite number keeps a floating t, else
 * float32. JS cannot tell 2.0 from 2: both count as integers.
 */
export function scalarOperandDtype(t: DType, s: number | boolean): DType {
  if (typeof s === "boolean") return t;
  if (!Number.isInteger(s)) return isFloating(t) ? t : "float32";
  return t === "bool" ? "int32" : t;
}

/** torch.result_type of two operands, each a tensor's dtype or a plain scalar (where's a and b). */
export function resultType(a: DType | number | boolean, b: DType | number | boolean): DType {
  if (typeof a === "string" && typeof b === "string") return promoteTypes(a, b);
  if (typeof a === "string") return scalarOperandDtype(a, b as number | boolean);
  if (typeof b === "string") return scalarOperandDtype(b, a);
  // two scalars: the highest category, at its default dtype
  if (typeof a === "number" && !Number.isInteger(a)) return "float32";
  if (typeof b === "number" && !Number.isInteger(b)) return "float32";
  return typeof a === "number" || typeof b === "number" ? "int32" : "bool";
}

/** One operand of a binary op or where, for dtype inference: a tensor (its dtype and rank) or a JS scalar. */
export type DtypeOperand = { readonly dtype: DType; readonly ndim: number } | number | boolean;

const COMPARISON_OPS: ReadonlySet<string> = new Set(["eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or"]);

/** Whether a binary op returns bool (comparisons and the logical ops). */
export function isComparison(op: BinaryOp): boolean {
  return COMPARISON_OPS.has(op);
}

/** bool < integer < floating: a 0-d tensor or a scalar only raises this category, never the width within one. */
function category(d: DType): number {
  return d === "bool" ? 0 : isFloating(d) ? 2 : 1;
}

/**
 * torch.result_type of two tensors: a 0-d operand next to a dimensioned one only raises the category (torch's
 * dimension rule: bf16[n] * f32[] is bf16, int32[n] + int64[] int32, int32[n] * f32[] f32); otherwise promoteTypes.
 */
export function tensorResultType(a: { dtype: DType; ndim: number }, b: { dtype: DType; ndim: number }): DType {
  if (a.ndim === 0 && b.ndim > 0) return category(a.dtype) > category(b.dtype) ? a.dtype : b.dtype;
  if (b.ndim === 0 && a.ndim > 0) return category(b.dtype) > category(a.dtype) ? b.dtype : a.dtype;
  return promoteTypes(a.dtype, b.dtype);
}

/**
 * The dtype a JS scalar is materialised in (as a 0-d tensor) next to a tensor of dtype t in binary op `op`: the
 * wrapped-number rule (scalarOperandDtype), float32 for true division of integers, and float32 for arithmetic on a
 * 16-bit or 8-bit float t (torch's opmath: the scalar stays unrounded and the result is rounded once, so bf16 / 3000
 * is not bf16 / bf16(3000) = x / 3008). A comparison keeps the scalar in t's dtype, as torch's.
 */
export function binaryScalarDtype(op: BinaryOp, t: DType, s: number | boolean): DType {
  const d = scalarOperandDtype(t, s);
  if (op === "div" && !isFloating(d)) return "float32";
  return isFloating(d) && d !== "float32" && !isComparison(op) ? "float32" : d;
}

/**
 * Result dtype of eager binary(op, a, b), the one rule the eager ops and compile()'s tracer share: comparisons give
 * bool; a scalar is a 0-d tensor of binaryScalarDtype, and tensorResultType promotes; a scalar never widens a
 * floating tensor (bf16 * 2.0 stays bf16, even a 0-d bf16); true division of integers gives float32.
 */
export function binaryResultDtype(op: BinaryOp, a: DtypeOperand, b: DtypeOperand): DType {
  if (typeof a !== "object" && typeof b !== "object") throw new OpError(op, "needs at least one tensor");
  if (isComparison(op)) return "bool";
  const ta = typeof a === "object" ? a : { dtype: binaryScalarDtype(op, (b as { dtype: DType }).dtype, a), ndim: 0 };
  const tb = typeof b === "object" ? b : { dtype: binaryScalarDtype(op, ta.dtype, b), ndim: 0 };
  if (typeof a !== "object" && isFloating(tb.dtype)) return tb.dtype;
  if (typeof b !== "object" && isFloating(ta.dtype)) return ta.dtype;
  const p = tensorResultType(ta, tb);
  return op === "div" && !isFloating(p) ? "float32" : p;
}

/** Result dtype of where(cond, a, b): torch.result_type(a, b) (a scalar or a 0-d tensor raises only the category). */
export function whereResultDtype(a: DtypeOperand, b: DtypeOperand): DType {
  if (typeof a === "object" && typeof b === "object") return tensorResultType(a, b);
  return resultType(typeof a === "object" ? a.dtype : a, typeof b === "object" ? b.dtype : b);
}

const KEEP_INTEGRAL: ReadonlySet<string> = new Set(["neg", "abs", "square", "relu", "sign"]);

/** Result dtype of a unary op: logical_not gives bool; floats keep theirs; neg/abs/square/relu/sign keep an integer. */
export function unaryResultDtype(op: UnaryOp, t: DType): DType {
  if (op === "logical_not") return "bool";
  return isFloating(t) || KEEP_INTEGRAL.has(op) ? t : "float32";
}

/** Result dtype of softmax / log_softmax: a floating input keeps its dtype (bf16 stays bf16), others give float32. */
export function softmaxDtype(t: DType): DType {
  return isFloating(t) ? t : "float32";
}

/** mean's result dtype (the input's), or torch's error for an integer or bool input. */
export function meanDtype(t: DType): DType {
  if (!isFloating(t)) throw new OpError("mean", `could not infer output dtype. Input dtype must be either a floating point or complex dtype. Got: ${t}`);
  return t;
}

/** Accumulation dtype of sum / prod: floats keep theirs; bool and 8-bit integers widen to int32 (torch: int64). */
export function sumDtype(t: DType): DType {
  return t === "bool" || t === "uint8" || t === "int8" ? "int32" : t;
}

// ---- scalar conversions (f32 <-> bf16, f16 and the fp8 formats; round to nearest, ties to even) ----

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** bf16 bits -> f32 value. */
export function bf16BitsToF32(bits: number): number {
  u32[0] = (bits & 0xffff) << 16;
  return f32[0]!;
}

/** f32 value -> bf16 bits, round-to-nearest-even; NaN stays a quiet NaN. */
export function f32ToBf16Bits(x: number): number {
  f32[0] = x;
  const b = u32[0]!;
  if ((b & 0x7fffffff) > 0x7f800000) return ((b >>> 16) | 0x40) & 0xffff;
  return ((b + 0x7fff + ((b >>> 16) & 1)) >>> 16) & 0xffff;
}

/** f16 bits -> f32 value (subnormals, inf and NaN included). */
export function f16BitsToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const e = (h >>> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return sign * m * 2 ** -24;
  if (e === 31) return m ? NaN : sign * Infinity;
  return sign * (1024 + m) * 2 ** (e - 25);
}

/** f32 value -> f16 bits, round-to-nearest-even; overflow gives inf. */
export function f32ToF16Bits(x: number): number {
  f32[0] = x;
  const b = u32[0]!;
  const sign = (b >>> 16) & 0x8000;
  const exp = (b >>> 23) & 0xff;
  let mant = b & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 | (mant >>> 13) : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign; // below half the smallest subnormal
    mant |= 0x800000;
    const shift = 14 - e; // 14..24: f16 subnormal = value * 2^24
    const half = 2 ** (shift - 1);
    let r = Math.floor(mant / 2 ** shift);
    const rem = mant - r * 2 ** shift;
    if (rem > half || (rem === half && r & 1)) r++;
    return sign | r;
  }
  let r = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && r & 1)) r++; // a carry into the exponent is correct (max -> inf)
  return sign | r;
}

// fp8 formats: decoded with a 256-entry table; encoded by nearest search over the non-negative codes.
export type Fp8Format = "e4m3fn" | "e5m2";

function buildFp8Table(format: Fp8Format): Float32Array {
  const t = new Float32Array(256);
  const [eBits, mBits, bias] = format === "e4m3fn" ? [4, 3, 7] : [5, 2, 15];
  for (let code = 0; code < 256; code++) {
    const sign = code & 0x80 ? -1 : 1;
    const e = (code >>> mBits) & ((1 << eBits) - 1);
    const m = code & ((1 << mBits) - 1);
    let v: number;
    if (format === "e4m3fn" && e === 15 && m === 7) v = NaN; // e4m3fn: no inf, one NaN pattern per sign
    else if (format === "e5m2" && e === 31) v = m ? NaN : Infinity;
    else if (e === 0) v = m * 2 ** (1 - bias - mBits);
    else v = (1 + m / (1 << mBits)) * 2 ** (e - bias);
    t[code] = sign * v;
  }
  return t;
}

const FP8_TABLES: Record<Fp8Format, Float32Array> = { e4m3fn: buildFp8Table("e4m3fn"), e5m2: buildFp8Table("e5m2") };
/** Largest finite magnitude: 448 for e4m3fn, 57344 for e5m2. */
export const FP8_MAX: Record<Fp8Format, number> = { e4m3fn: 448, e5m2: 57344 };

export function fp8BitsToF32(bits: number, format: Fp8Format): number {
  return FP8_TABLES[format][bits & 0xff]!;
}

/**
 * f32 -> fp8 bits, round-to-nearest-even. Out-of-range values saturate to ±max (as quantizers clamp
 * before casting); NaN maps to NaN, and for e5m2 ±inf stays inf.
 */
export function f32ToFp8Bits(x: number, format: Fp8Format): number {
  const table = FP8_TABLES[format];
  if (Number.isNaN(x)) return 0x7f;
  const sign = x < 0 || Object.is(x, -0) ? 0x80 : 0;
  const a = Math.abs(x);
  if (format === "e5m2" && a === Infinity) return sign | 0x7c;
  const maxCode = format === "e4m3fn" ? 0x7e : 0x7b;
  if (a >= FP8_MAX[format]) return sign | maxCode;
  // Codes 0..maxCode are increasing in value: binary search for the first code with value >= a.
  let lo = 0;
  let hi = maxCode;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (table[mid]! < a) lo = mid + 1;
    else hi = mid;
  }
  if (lo > 0) {
    const below = table[lo - 1]!;
    const above = table[lo]!;
    if (a - below < above - a || (a - below === above - a && (lo - 1) % 2 === 0)) lo -= 1;
  }
  return sign | lo;
}


export const f8e4m3BitsToF32 = (b: number): number => fp8BitsToF32(b, "e4m3fn");
export const f8e5m2BitsToF32 = (b: number): number => fp8BitsToF32(b, "e5m2");
export const f32ToF8e4m3Bits = (x: number): number => f32ToFp8Bits(x, "e4m3fn");
/** Tensor casts to e5m2 overflow to inf as torch does (57344 + half an ulp rounds up to inf); quantizers saturate. */
export const f32ToF8e5m2Bits = (x: number): number => (Math.abs(x) >= 61440 && Number.isFinite(x) ? (x < 0 ? 0xfc : 0x7c) : f32ToFp8Bits(x, "e5m2"));
