// Scalar and bulk conversions between f32 and the narrow float formats found in weight files:
// bf16, f16, fp8 e4m3fn and fp8 e5m2. All f32 -> narrow conversions round to nearest, ties to even.
// Arrays are little-endian raw bits (Uint16Array / Uint8Array), as stored on disk.

// The scalar conversions live with the runtime's dtypes (backends/dtype.ts); weight files use the same ones.
import { bf16BitsToF32, f16BitsToF32, f32ToBf16Bits, f32ToF16Bits, f32ToFp8Bits, fp8BitsToF32, FP8_MAX, type Fp8Format } from "../../backends/dtype.js";
export { bf16BitsToF32, f16BitsToF32, f32ToBf16Bits, f32ToF16Bits, f32ToFp8Bits, fp8BitsToF32, FP8_MAX, type Fp8Format };

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
  const out = new Float32Array(bytes.length);
  for (let i = 0; i < bytes.length; i++) out[i] = fp8BitsToF32(bytes[i]!, format);
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
