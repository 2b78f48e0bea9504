// Element types. Storage is always a plain ArrayBuffer on host back ends; these tables say how to read it.

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

// ---- scalar conversions (f32 <-> 16-bit and 8-bit floats) ----

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** float32 -> bfloat16 bits, round to nearest even; NaN stays NaN. */
export function f32ToBf16Bits(x: number): number {
  f32[0] = x;
  const bits = u32[0]!;
  if ((bits & 0x7fffffff) > 0x7f800000) return ((bits >>> 16) | 0x40) & 0xffff;
  return ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16) & 0xffff;
}

export function bf16BitsToF32(h: number): number {
  u32[0] = h << 16;
  return f32[0]!;
}

/** float32 -> IEEE half bits, round to nearest even. */
export function f32ToF16Bits(x: number): number {
  f32[0] = x;
  const bits = u32[0]!;
  const sign = (bits >>> 16) & 0x8000;
  const exp = (bits >>> 23) & 0xff;
  let mant = bits & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  let e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    const half = 1 << (shift - 1);
    let r = mant >>> shift;
    const rem = mant & ((1 << shift) - 1);
    if (rem > half || (rem === half && (r & 1))) r++;
    return sign | r;
  }
  let r = mant >>> 13;
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && (r & 1))) {
    r++;
    if (r === 0x400) {
      r = 0;
      e++;
      if (e >= 0x1f) return sign | 0x7c00;
    }
  }
  return sign | (e << 10) | r;
}

export function f16BitsToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant ? NaN : sign * Infinity;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

/** OCP float8 e4m3fn: no infinities, 0x7f/0xff are NaN, max 448. */
export function f8e4m3BitsToF32(b: number): number {
  const sign = b & 0x80 ? -1 : 1;
  const exp = (b >>> 3) & 0xf;
  const mant = b & 0x7;
  if (exp === 0xf && mant === 0x7) return NaN;
  if (exp === 0) return sign * mant * 2 ** -9;
  return sign * (1 + mant / 8) * 2 ** (exp - 7);
}

export function f8e5m2BitsToF32(b: number): number {
  return f16BitsToF32(b << 8);
}

/** Rounds to the nearest representable value (ties to even), saturating to +-448. */
export function f32ToF8e4m3Bits(x: number): number {
  if (Number.isNaN(x)) return 0x7f;
  const sign = x < 0 || Object.is(x, -0) ? 0x80 : 0;
  let a = Math.abs(x);
  if (a >= 448) return sign | 0x7e;
  let best = 0;
  let bestErr = Infinity;
  // 127 finite magnitudes: a direct search is exact and fast enough for a storage-only dtype.
  for (let code = 0; code < 0x7f; code++) {
    const v = f8e4m3BitsToF32(code);
    const err = Math.abs(v - a);
    if (err < bestErr || (err === bestErr && (code & 1) === 0)) {
      best = code;
      bestErr = err;
    }
  }
  a = best;
  return sign | a;
}

/** float32 -> e5m2 bits (f16's exponent, 2 mantissa bits), round to nearest even straight from f32 (no double rounding). */
export function f32ToF8e5m2Bits(x: number): number {
  f32[0] = x;
  const bits = u32[0]!;
  const sign = (bits >>> 24) & 0x80;
  const exp = (bits >>> 23) & 0xff;
  let mant = bits & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c | (mant ? 0x02 : 0);
  let e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c;
  if (e <= 0) {
    if (e < -2) return sign;
    mant |= 0x800000;
    const shift = 22 - e;
    const half = 1 << (shift - 1);
    let r = mant >>> shift;
    const rem = mant & ((1 << shift) - 1);
    if (rem > half || (rem === half && (r & 1))) r++;
    return sign | r;
  }
  let r = mant >>> 21;
  const rem = mant & 0x1fffff;
  if (rem > 0x100000 || (rem === 0x100000 && (r & 1))) {
    r++;
    if (r === 0x4) {
      r = 0;
      e++;
      if (e >= 0x1f) return sign | 0x7c;
    }
  }
  return sign | (e << 2) | r;
}
