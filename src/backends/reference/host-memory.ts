// Host memory for the cpu and reference back ends: buffers are ArrayBuffers (off the JS heap),
// and views are read/written element by element through dtype accessors.
import type { BufferView, DeviceBuffer } from "../backend.js";
import {
  bf16BitsToF32,
  f16BitsToF32,
  f32ToBf16Bits,
  f32ToF16Bits,
  f32ToF8e4m3Bits,
  f32ToF8e5m2Bits,
  f8e4m3BitsToF32,
  f8e5m2BitsToF32,
  type DType,
} from "../dtype.js";

export class HostBuffer implements DeviceBuffer {
  freed = false;
  constructor(readonly host: ArrayBuffer) {}
  /** The memory (as `host`: nothing queues work on reference memory). */
  get raw(): ArrayBuffer {
    return this.host;
  }
  get byteLength(): number {
    return this.host.byteLength;
  }
}

export function hostOf(buffer: DeviceBuffer): ArrayBuffer {
  const host = buffer.host;
  if (!host) throw new Error("buffer is not host-visible");
  return host;
}

type Raw = Float32Array | Uint16Array | Uint8Array | Int8Array | Int32Array | BigInt64Array;

export function rawArray(buffer: DeviceBuffer, dtype: DType): Raw {
  const host = hostOf(buffer);
  switch (dtype) {
    case "float32":
      return new Float32Array(host, 0, host.byteLength >>> 2);
    case "float16":
    case "bfloat16":
      return new Uint16Array(host, 0, host.byteLength >>> 1);
    case "float8_e4m3fn":
    case "float8_e5m2":
    case "uint8":
    case "bool":
      return new Uint8Array(host);
    case "int8":
      return new Int8Array(host);
    case "int32":
      return new Int32Array(host, 0, host.byteLength >>> 2);
    case "int64":
      return new BigInt64Array(host, 0, host.byteLength >>> 3);
  }
}

export type Getter = (i: number) => number;
export type Setter = (i: number, v: number) => void;

export function getter(buffer: DeviceBuffer, dtype: DType): Getter {
  const raw = rawArray(buffer, dtype);
  switch (dtype) {
    case "float16": {
      const a = raw as Uint16Array;
      return (i) => f16BitsToF32(a[i]!);
    }
    case "bfloat16": {
      const a = raw as Uint16Array;
      return (i) => bf16BitsToF32(a[i]!);
    }
    case "float8_e4m3fn": {
      const a = raw as Uint8Array;
      return (i) => f8e4m3BitsToF32(a[i]!);
    }
    case "float8_e5m2": {
      const a = raw as Uint8Array;
      return (i) => f8e5m2BitsToF32(a[i]!);
    }
    case "int64": {
      const a = raw as BigInt64Array;
      return (i) => Number(a[i]!);
    }
    default: {
      const a = raw as Float32Array;
      return (i) => a[i]!;
    }
  }
}

export function setter(buffer: DeviceBuffer, dtype: DType): Setter {
  const raw = rawArray(buffer, dtype);
  switch (dtype) {
    case "float16": {
      const a = raw as Uint16Array;
      return (i, v) => (a[i] = f32ToF16Bits(v));
    }
    case "bfloat16": {
      const a = raw as Uint16Array;
      return (i, v) => (a[i] = f32ToBf16Bits(v));
    }
    case "float8_e4m3fn": {
      const a = raw as Uint8Array;
      return (i, v) => (a[i] = f32ToF8e4m3Bits(v));
    }
    case "float8_e5m2": {
      const a = raw as Uint8Array;
      return (i, v) => (a[i] = f32ToF8e5m2Bits(v));
    }
    case "int64": {
      const a = raw as BigInt64Array;
      return (i, v) => (a[i] = Number.isFinite(v) ? BigInt(Math.trunc(v)) : 0n); // NaN / inf: 0, as tensor() gives (a cast maps them first: castValues)
    }
    case "bool": {
      const a = raw as Uint8Array;
      return (i, v) => (a[i] = v !== 0 ? 1 : 0); // NaN is true, as torch's bool(nan)
    }
    case "int32": {
      const a = raw as Int32Array;
      return (i, v) => (a[i] = Math.trunc(v));
    }
    case "int8": {
      const a = raw as Int8Array;
      return (i, v) => (a[i] = Math.trunc(v));
    }
    case "uint8": {
      const a = raw as Uint8Array;
      return (i, v) => (a[i] = Math.trunc(v));
    }
    default: {
      const a = raw as Float32Array;
      return (i, v) => (a[i] = v);
    }
  }
}

export function numel(shape: readonly number[]): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

export function isContiguous(shape: readonly number[], strides: readonly number[]): boolean {
  let expected = 1;
  for (let d = shape.length - 1; d >= 0; d--) {
    if (shape[d] !== 1 && strides[d] !== expected) return false;
    expected *= shape[d]!;
  }
  return true;
}

/** Merges adjacent dims that are contiguous with each other (fewer, longer loops). */
function coalesce(shape: readonly number[], strides: readonly number[]): { shape: number[]; strides: number[] } {
  const s: number[] = [];
  const st: number[] = [];
  for (let d = 0; d < shape.length; d++) {
    if (shape[d] === 1) continue;
    const last = s.length - 1;
    if (last >= 0 && st[last] === strides[d]! * shape[d]!) {
      s[last] *= shape[d]!;
      st[last] = strides[d]!;
    } else {
      s.push(shape[d]!);
      st.push(strides[d]!);
    }
  }
  return { shape: s, strides: st };
}

/** Storage offset of every element of the view, in row-major logical order. */
export function offsets(v: BufferView): Int32Array {
  const n = numel(v.shape);
  const out = new Int32Array(n);
  if (n === 0) return out;
  const { shape, strides } = coalesce(v.shape, v.strides);
  const base = v.offset;
  const r = shape.length;
  if (r === 0) {
    out.fill(base);
    return out;
  }
  const inner = shape[r - 1]!;
  const innerStride = strides[r - 1]!;
  const idx = new Int32Array(r);
  let pos = base;
  let k = 0;
  for (;;) {
    for (let j = 0, p = pos; j < inner; j++, p += innerStride) out[k++] = p;
    let d = r - 2;
    while (d >= 0) {
      idx[d]!++;
      pos += strides[d]!;
      if (idx[d]! < shape[d]!) break;
      pos -= strides[d]! * shape[d]!;
      idx[d] = 0;
      d--;
    }
    if (d < 0) return out;
  }
}

/** Calls fn(storageIndex, logicalIndex) for each element of the view in row-major order. */
export function forEachIndex(view: BufferView, fn: (storageIndex: number, logical: number) => void): void {
  if (isContiguous(view.shape, view.strides)) {
    const n = numel(view.shape);
    for (let i = 0; i < n; i++) fn(view.offset + i, i);
    return;
  }
  const idx = offsets(view);
  for (let i = 0; i < idx.length; i++) fn(idx[i]!, i);
}

/** Reads a view into a dense Float64Array in row-major order (exact for every dtype but huge int64). */
export function readF64(view: BufferView): Float64Array {
  const out = new Float64Array(numel(view.shape));
  const get = getter(view.buffer, view.dtype);
  forEachIndex(view, (s, l) => (out[l] = get(s)));
  return out;
}

/** Writes dense row-major values into a view, converting to its dtype. */
export function writeDense(view: BufferView, values: ArrayLike<number>): void {
  const set = setter(view.buffer, view.dtype);
  forEachIndex(view, (s, l) => set(s, values[l]!));
}

/** Fast path: a contiguous float32 view as a Float32Array, or null. */
export function f32Contiguous(view: BufferView): Float32Array | null {
  if (view.dtype !== "float32" || !isContiguous(view.shape, view.strides)) return null;
  return new Float32Array(hostOf(view.buffer), view.offset * 4, numel(view.shape));
}

export function i32Contiguous(view: BufferView): Int32Array | null {
  if (view.dtype !== "int32" || !isContiguous(view.shape, view.strides)) return null;
  return new Int32Array(hostOf(view.buffer), view.offset * 4, numel(view.shape));
}
