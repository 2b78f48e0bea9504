// Scalar and bulk conversions between f32 and the narrow float formats found in weight files:
// bf16, f16, fp8 e4m3fn and fp8 e5m2. All f32 -> narrow conversions round to nearest, ties to even.
// Arrays are little-endian raw bits (Uint16Array / Uint8Array), as stored on disk.

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

// ---- bulk conversions (raw little-endian bytes -> Float32Array and back) ----

function u16View(bytes: Uint8Array): Uint16Array {
  if (bytes.byteOffset % 2 === 0) return new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >>> 1);
  return new Uint16Array(bytes.slice().buffer, 0, bytes.byteLength >>> 1);
}

export function bf16BytesToF32(bytes: Uint8Array): Float32Array {
  const src = u16View(bytes);
  const out = new Float32Array(src.length);
  const bits = new Uint32Array(out.buffer);
  for (let i = 0; i < src.length; i++) bits[i] = src[i]! << 16;
  return out;
}

export function f16BytesToF32(bytes: Uint8Array): Float32Array {
  const src = u16View(bytes);
  const out = new Float32Array(src.length);
  for (let i = 0; i < src.length; i++) out[i] = f16BitsToF32(src[i]!);
  return out;
}

export function fp8BytesToF32(bytes: Uint8Array, format: Fp8Format): Float32Array {
  const table = FP8_TABLES[format];
  const out = new Float32Array(bytes.length);
  for (let i = 0; i < bytes.length; i++) out[i] = table[bytes[i]!]!;
  return out;
}

export function f32ToBf16(values: ArrayLike<number>): Uint16Array {
  const out = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = f32ToBf16Bits(values[i]!);
  return out;
}

export function f32ToF16(values: ArrayLike<number>): Uint16Array {
  const out = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = f32ToF16Bits(values[i]!);
  return out;
}

export function f32ToFp8(values: ArrayLike<number>, format: Fp8Format): Uint8Array {
  const out = new Uint8Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = f32ToFp8Bits(values[i]!, format);
  return out;
}

/** The bytes of any typed array (a view, no copy). */
export function bytesOf(data: ArrayBufferView): Uint8Array {
  return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
}
