// GGUF (v2/v3) reader and writer. Layout: magic "GGUF", u32 version, u64 tensor_count, u64 kv_count,
// kv pairs (string key, u32 value type, value), tensor infos (string name, u32 n_dims, u64 ne[n_dims],
// u32 ggml_type, u64 offset), padding to general.alignment (default 32), then tensor data.
// ne[0] is the fastest-varying dimension: `shape` (row-major, HF order) is ne reversed.
// Every count, length and offset is checked against the file size before anything is allocated.

import * as fs from "node:fs";
import { formatError, ModelFormatError } from "./model-format-error.js";
import { f32ToBf16, f32ToF16, bytesOf } from "./dtype-convert.js";
import { DEQUANTIZABLE, dequantize, GGML_BLOCK_LAYOUT, GgmlType, ggmlTypeName, quantizeIq4_NL, quantizeMxfp4, quantizeQ4_0, quantizeQ4_K, quantizeQ5_K, quantizeQ6_K, quantizeQ8_0, type GgmlTypeName } from "./gguf-quant.js";

export { ModelFormatError } from "./model-format-error.js";

/** gguf_type: the type tag of a metadata value. */
export const GgufValueType = {
  UINT8: 0, INT8: 1, UINT16: 2, INT16: 3, UINT32: 4, INT32: 5, FLOAT32: 6, BOOL: 7,
  STRING: 8, ARRAY: 9, UINT64: 10, INT64: 11, FLOAT64: 12,
} as const;
export type GgufValueTypeId = (typeof GgufValueType)[keyof typeof GgufValueType];

/** 64-bit integers are numbers when safe, bigint otherwise. */
export type GgufValue = number | bigint | boolean | string | GgufValue[];

/** A metadata value with an explicit GGUF type (llama.cpp checks key types, e.g. u32 for block_count). */
export interface GgufTypedValue {
  type: GgufValueTypeId;
  /** Element type when `type` is ARRAY. */
  arrayType?: GgufValueTypeId;
  value: GgufValue;
}

export const gguf = {
  u32: (value: number): GgufTypedValue => ({ type: GgufValueType.UINT32, value }),
  i32: (value: number): GgufTypedValue => ({ type: GgufValueType.INT32, value }),
  u64: (value: number | bigint): GgufTypedValue => ({ type: GgufValueType.UINT64, value }),
  f32: (value: number): GgufTypedValue => ({ type: GgufValueType.FLOAT32, value }),
  bool: (value: boolean): GgufTypedValue => ({ type: GgufValueType.BOOL, value }),
  str: (value: string): GgufTypedValue => ({ type: GgufValueType.STRING, value }),
  array: (arrayType: GgufValueTypeId, value: GgufValue[]): GgufTypedValue => ({ type: GgufValueType.ARRAY, arrayType, value }),
};

export interface GgufTensorInfo {
  name: string;
  type: GgmlTypeName;
  /** ggml order: dims[0] is the row length. */
  dims: number[];
  /** Row-major (PyTorch/HF) order: dims reversed. */
  shape: number[];
  numel: number;
  /** Absolute byte offset in the file. */
  byteOffset: number;
  byteLength: number;
}

export interface GgufFile {
  readonly path: string;
  readonly version: number;
  readonly alignment: number;
  readonly metadata: Readonly<Record<string, GgufValue>>;
  /** The stored type of each metadata key (to write it back unchanged). */
  readonly metadataTypes: Readonly<Record<string, { type: GgufValueTypeId; arrayType?: GgufValueTypeId }>>;
  readonly tensors: readonly GgufTensorInfo[];
  readonly dataOffset: number;
  get(name: string): GgufTensorInfo | undefined;
  load(name: string): Uint8Array;
  loadAsFloat32(name: string): Float32Array;
  /** Metadata values wrapped with their types, ready for writeGguf. */
  typedMetadata(): Record<string, GgufTypedValue>;
  close(): void;
}

const MAGIC = 0x46554747; // "GGUF" little-endian
const MAX_DIMS = 4;
const SCALAR_SIZE: Partial<Record<number, number>> = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 };

/** Sequential reader over a file descriptor with a refillable window; checks every length against the file size. */
class FileCursor {
  private buf = new Uint8Array(0);
  private bufStart = 0;
  pos = 0;
  private readonly decoder = new TextDecoder("utf-8");
  constructor(
    private readonly fd: number,
    readonly file: string,
    readonly size: number,
  ) {}

  fail(detail: string): never {
    throw formatError("gguf", this.file, detail);
  }
  get remaining(): number {
    return this.size - this.pos;
  }
  private view(n: number, what: string): { b: Uint8Array; o: number } {
    if (n > this.remaining) this.fail(`truncated: ${what} needs ${n} bytes at offset ${this.pos}, file is ${this.size} bytes`);
    if (this.pos < this.bufStart || this.pos + n > this.bufStart + this.buf.length) {
      const len = Math.min(Math.max(n, 1 << 20), this.size - this.pos);
      this.buf = new Uint8Array(len);
      let done = 0;
      while (done < len) {
        const r = fs.readSync(this.fd, this.buf, done, len - done, this.pos + done);
        if (r === 0) this.fail(`unexpected end of file at ${this.pos + done}`);
        done += r;
      }
      this.bufStart = this.pos;
    }
    const o = this.pos - this.bufStart;
    this.pos += n;
    return { b: this.buf, o };
  }
  private dv(n: number, what: string): { d: DataView; o: number } {
    const { b, o } = this.view(n, what);
    return { d: new DataView(b.buffer, b.byteOffset), o };
  }
  u8(what = "u8"): number { const { b, o } = this.view(1, what); return b[o]!; }
  u32(what = "u32"): number { const { d, o } = this.dv(4, what); return d.getUint32(o, true); }
  u64(what = "u64"): bigint { const { d, o } = this.dv(8, what); return d.getBigUint64(o, true); }
  boundedCount(what: string, minBytesEach: number): number {
    const n = this.u64(what);
    if (n * BigInt(minBytesEach) > BigInt(this.remaining)) this.fail(`${what} ${n} cannot fit in the remaining ${this.remaining} bytes`);
    return Number(n);
  }
  string(what: string): string {
    const n = this.u64(`${what} length`);
    if (n > BigInt(this.remaining)) this.fail(`${what} length ${n} exceeds the remaining ${this.remaining} bytes`);
    const { b, o } = this.view(Number(n), what);
    return this.decoder.decode(b.subarray(o, o + Number(n)));
  }
  scalar(type: number, what: string): GgufValue {
    const size = SCALAR_SIZE[type]!;
    const { d, o } = this.dv(size, what);
    switch (type) {
      case 0: return d.getUint8(o);
      case 1: return d.getInt8(o);
      case 2: return d.getUint16(o, true);
      case 3: return d.getInt16(o, true);
      case 4: return d.getUint32(o, true);
      case 5: return d.getInt32(o, true);
      case 6: return d.getFloat32(o, true);
      case 7: return d.getUint8(o) !== 0;
      case 10: { const v = d.getBigUint64(o, true); return v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v; }
      case 11: { const v = d.getBigInt64(o, true); return v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(v) : v; }
      default: return d.getFloat64(o, true);
    }
  }
  value(type: number, key: string, depth = 0): GgufValue {
    if (SCALAR_SIZE[type] !== undefined) return this.scalar(type, `value of "${key}"`);
    if (type === GgufValueType.STRING) return this.string(`string value of "${key}"`);
    if (type === GgufValueType.ARRAY) {
      if (depth > 2) this.fail(`metadata "${key}": arrays nested too deeply`);
      const elemType = this.u32(`array type of "${key}"`);
      const minSize = SCALAR_SIZE[elemType] ?? (elemType === GgufValueType.STRING ? 8 : elemType === GgufValueType.ARRAY ? 12 : -1);
      if (minSize < 0) this.fail(`metadata "${key}": unknown array element type ${elemType}`);
      const n = this.boundedCount(`array length of "${key}"`, minSize);
      const out: GgufValue[] = new Array(n);
      for (let i = 0; i < n; i++) out[i] = this.value(elemType, key, depth + 1);
      return out;
    }
    return this.fail(`metadata "${key}": unknown value type ${type}`);
  }
}

/**
 * Opens a GGUF file lazily: header and metadata are parsed now, tensor data on `load`.
 * @example
 *   const g = readGguf("model.gguf");
 *   const arch = g.metadata["general.architecture"];
 *   const emb = g.loadAsFloat32("token_embd.weight");
 */
export function readGguf(file: string): GgufFile {
  let fd: number;
  try {
    fd = fs.openSync(file, "r");
  } catch (e) {
    throw new ModelFormatError(`[gguf] ${file}: cannot open (${(e as Error).message})`, file);
  }
  try {
    return parseGguf(fd, file);
  } catch (e) {
    fs.closeSync(fd);
    throw e;
  }
}

function parseGguf(fd: number, file: string): GgufFile {
  const size = fs.fstatSync(fd).size;
  const c = new FileCursor(fd, file, size);
  const magic = c.u32("magic");
  if (magic !== MAGIC) c.fail(`bad magic 0x${magic.toString(16).padStart(8, "0")} (expected "GGUF")`);
  const version = c.u32("version");
  // a big-endian file (s390x's) reads its version byte-swapped here: 3 as 0x03000000
  if ((version & 0xffff) === 0 && version !== 0) c.fail(`GGUF version 0x${version.toString(16)} is a byte-swapped ${version >>> 24}: a big-endian file (only little-endian GGUF is read)`);
  if (version !== 2 && version !== 3) c.fail(`unsupported GGUF version ${version} (only 2 and 3)`);
  const tensorCount = c.boundedCount("tensor count", 8 + 4 + 4 + 8); // name length, n_dims, type, offset
  const kvCount = c.boundedCount("metadata kv count", 8 + 4 + 1);

  const metadata: Record<string, GgufValue> = {};
  const metadataTypes: Record<string, { type: GgufValueTypeId; arrayType?: GgufValueTypeId }> = {};
  for (let i = 0; i < kvCount; i++) {
    const key = c.string(`metadata key #${i}`);
    if (Object.prototype.hasOwnProperty.call(metadata, key)) c.fail(`duplicate metadata key "${key}"`);
    const type = c.u32(`type of "${key}"`);
    const before = c.pos;
    const value = c.value(type, key);
    let arrayType: GgufValueTypeId | undefined;
    if (type === GgufValueType.ARRAY) {
      const save = c.pos;
      c.pos = before;
      arrayType = c.u32() as GgufValueTypeId;
      c.pos = save;
    }
    metadata[key] = value;
    metadataTypes[key] = arrayType === undefined ? { type: type as GgufValueTypeId } : { type: type as GgufValueTypeId, arrayType };
  }

  let alignment = 32;
  if (metadata["general.alignment"] !== undefined) {
    const a = metadata["general.alignment"];
    if (typeof a !== "number" || !Number.isInteger(a) || a <= 0 || (a & (a - 1)) !== 0 || a > 1 << 20) c.fail(`general.alignment ${String(a)} is not a power of two`);
    alignment = a as number;
  }

  interface RawInfo { name: string; type: GgmlTypeName; dims: number[]; numel: number; rel: bigint; byteLength: number }
  const raw: RawInfo[] = [];
  const names = new Set<string>();
  for (let i = 0; i < tensorCount; i++) {
    const name = c.string(`tensor #${i} name`);
    const bad = (detail: string): never => { throw formatError("gguf", file, detail, name); };
    if (names.has(name)) bad("duplicate tensor name");
    names.add(name);
    const nDims = c.u32(`n_dims of ${name}`);
    if (nDims > MAX_DIMS) bad(`n_dims ${nDims} > ${MAX_DIMS}`);
    const dims: number[] = [];
    let numel = 1;
    for (let d = 0; d < nDims; d++) {
      const ne = c.u64(`dim ${d} of ${name}`);
      if (ne > BigInt(Number.MAX_SAFE_INTEGER)) bad(`dim ${d} = ${ne} is too large`);
      dims.push(Number(ne));
      numel *= Number(ne);
    }
    if (!Number.isSafeInteger(numel)) bad(`element count overflows (${dims.join("x")})`);
    const typeId = c.u32(`type of ${name}`);
    const type = ggmlTypeName(typeId);
    if (type === undefined) bad(`unknown ggml type ${typeId}`);
    const [bs, ts] = GGML_BLOCK_LAYOUT[type!];
    // a 0-d tensor is one row of one element (ggml's ne[0] = 1), so only unblocked types hold it, as the writer checks
    const rowLength = nDims > 0 ? dims[0]! : 1;
    if (rowLength % bs !== 0) bad(`row length ${rowLength} is not a multiple of the ${type} block size ${bs}`);
    const byteLength = (numel / bs) * ts;
    const rel = c.u64(`offset of ${name}`);
    if (rel % BigInt(alignment) !== 0n) bad(`offset ${rel} is not a multiple of the alignment ${alignment}`);
    raw.push({ name, type: type!, dims, numel, rel, byteLength });
  }
  const dataOffset = Math.ceil(c.pos / alignment) * alignment;
  const tensors: GgufTensorInfo[] = [];
  for (const r of raw) {
    if (BigInt(dataOffset) + r.rel + BigInt(r.byteLength) > BigInt(size)) {
      throw formatError("gguf", file, `data [${r.rel}, +${r.byteLength}) runs past the end of the file (data starts at ${dataOffset}, file is ${size} bytes)`, r.name);
    }
    tensors.push({
      name: r.name, type: r.type, dims: r.dims, shape: [...r.dims].reverse(), numel: r.numel,
      byteOffset: dataOffset + Number(r.rel), byteLength: r.byteLength,
    });
  }
  const sorted = tensors.filter((t) => t.byteLength > 0).sort((a, b) => a.byteOffset - b.byteOffset);
  for (let i = 1; i < sorted.length; i++) {
    const prev = sorted[i - 1]!;
    if (sorted[i]!.byteOffset < prev.byteOffset + prev.byteLength) throw formatError("gguf", file, `tensor data overlaps "${prev.name}"`, sorted[i]!.name);
  }

  const byName = new Map(tensors.map((t) => [t.name, t]));
  let open = true;
  const info = (name: string) => {
    const t = byName.get(name);
    if (!t) throw new ModelFormatError(`[gguf] ${file}: no tensor named "${name}"`, file, name);
    if (!open) throw new ModelFormatError(`[gguf] ${file}: file is closed`, file, name);
    return t;
  };
  const load = (name: string) => {
    const t = info(name);
    const out = new Uint8Array(new ArrayBuffer(t.byteLength));
    let done = 0;
    while (done < t.byteLength) {
      const n = fs.readSync(fd, out, done, t.byteLength - done, t.byteOffset + done);
      if (n === 0) throw formatError("gguf", file, "file shrank while reading", name);
      done += n;
    }
    return out;
  };
  return {
    path: file, version, alignment, metadata, metadataTypes, tensors, dataOffset,
    get: (name) => byName.get(name),
    load,
    loadAsFloat32(name) {
      const t = info(name);
      if (!DEQUANTIZABLE.has(t.type)) throw formatError("gguf", file, `dequantization of ${t.type} is not supported`, name);
      return dequantizeOrThrow(t, load(name), file);
    },
    typedMetadata() {
      const out: Record<string, GgufTypedValue> = {};
      for (const [k, v] of Object.entries(metadata)) out[k] = { ...metadataTypes[k]!, value: v };
      return out;
    },
    close() {
      if (open) fs.closeSync(fd);
      open = false;
    },
  };
}

function dequantizeOrThrow(t: GgufTensorInfo, bytes: Uint8Array, file: string): Float32Array {
  const out = dequantize(t.type, bytes, t.numel);
  if (!out) throw formatError("gguf", file, `dequantization of ${t.type} is not supported`, t.name);
  return out;
}

// ---------------------------------------------------------------- writer

export interface GgufWriteTensor {
  name: string;
  /** Row-major (HF) shape; written as ggml dims reversed. */
  shape: readonly number[];
  /** Storage type. With `data` (or `load`), F32/F16/BF16/Q8_0/Q4_0/Q4_K/Q5_K/Q6_K/MXFP4 are encoded here. */
  type: GgmlTypeName;
  /** f32 values to convert / quantize. */
  data?: Float32Array;
  /** f32 values produced only when the tensor is written (one tensor in memory at a time). */
  load?: () => Float32Array;
  /** Bytes already encoded in `type`. */
  raw?: Uint8Array;
  /** Bytes already encoded in `type`, produced only when the tensor is written. */
  loadRaw?: () => Uint8Array;
}

/** Encoded byte size of `t` (shape and type checked). */
function encodedSize(t: GgufWriteTensor, file: string): number {
  const numel = t.shape.reduce((a, b) => a * b, 1);
  const [bs, ts] = GGML_BLOCK_LAYOUT[t.type] ?? [0, 0];
  if (!bs) throw formatError("gguf", file, `unknown ggml type ${String(t.type)}`, t.name);
  const rowLen = t.shape.length ? t.shape[t.shape.length - 1]! : 1;
  if (rowLen % bs !== 0) throw formatError("gguf", file, `row length ${rowLen} is not a multiple of the ${t.type} block size ${bs}`, t.name);
  return (numel / bs) * ts;
}

function encodeTensor(t: GgufWriteTensor, file: string): Uint8Array {
  const numel = t.shape.reduce((a, b) => a * b, 1);
  const expected = encodedSize(t, file);
  let bytes: Uint8Array;
  const raw = t.raw ?? t.loadRaw?.();
  const data = raw ? undefined : (t.data ?? t.load?.());
  if (raw) bytes = raw;
  else if (data) {
    if (data.length !== numel) throw formatError("gguf", file, `data has ${data.length} values, shape needs ${numel}`, t.name);
    switch (t.type) {
      case "F32": bytes = bytesOf(data); break;
      case "F16": bytes = bytesOf(f32ToF16(data)); break;
      case "BF16": bytes = bytesOf(f32ToBf16(data)); break;
      case "Q8_0": bytes = quantizeQ8_0(data); break;
      case "Q4_0": bytes = quantizeQ4_0(data); break;
      case "MXFP4": bytes = quantizeMxfp4(data); break;
      case "IQ4_NL": bytes = quantizeIq4_NL(data); break;
      case "Q4_K": bytes = quantizeQ4_K(data); break;
      case "Q5_K": bytes = quantizeQ5_K(data); break;
      case "Q6_K": bytes = quantizeQ6_K(data); break;
      default: throw formatError("gguf", file, `cannot encode ${t.type} from f32 (pass raw bytes)`, t.name);
    }
  } else throw formatError("gguf", file, "tensor has neither data, load, raw nor loadRaw", t.name);
  if (bytes.byteLength !== expected) throw formatError("gguf", file, `encoded size ${bytes.byteLength} != ${expected}`, t.name);
  return bytes;
}

/** fs.writeSync may write fewer bytes than asked (large buffers): loop until all are out. */
function writeAll(fd: number, bytes: Uint8Array): void {
  for (let done = 0; done < bytes.byteLength; ) done += fs.writeSync(fd, bytes, done, bytes.byteLength - done);
}

/** Plain values get a default type: integer -> UINT32 (INT32 if negative), non-integer -> FLOAT32. */
function typed(v: GgufValue | GgufTypedValue): GgufTypedValue {
  if (typeof v === "object" && v !== null && !Array.isArray(v) && typeof v !== "bigint") return v;
  const infer = (x: GgufValue): GgufValueTypeId => {
    if (typeof x === "string") return GgufValueType.STRING;
    if (typeof x === "boolean") return GgufValueType.BOOL;
    if (typeof x === "bigint") return x < 0n ? GgufValueType.INT64 : GgufValueType.UINT64;
    if (Array.isArray(x)) return GgufValueType.ARRAY;
    if (Number.isInteger(x)) return x < 0 ? GgufValueType.INT32 : x > 0xffffffff ? GgufValueType.UINT64 : GgufValueType.UINT32;
    return GgufValueType.FLOAT32;
  };
  if (Array.isArray(v)) {
    const allNumbers = v.every((x) => typeof x === "number");
    const allInts = allNumbers && v.every((x) => Number.isInteger(x));
    const arrayType = v.length === 0 || allInts ? GgufValueType.INT32 : allNumbers ? GgufValueType.FLOAT32 : infer(v[0]!);
    return { type: GgufValueType.ARRAY, arrayType, value: v };
  }
  return { type: infer(v), value: v };
}

/** Growable little-endian byte sink. */
class ByteSink {
  buf = new Uint8Array(1 << 16);
  len = 0;
  private dv = new DataView(this.buf.buffer);
  private readonly enc = new TextEncoder();
  reserve(n: number) {
    if (this.len + n <= this.buf.length) return;
    let cap = this.buf.length;
    while (cap < this.len + n) cap *= 2;
    const next = new Uint8Array(cap);
    next.set(this.buf.subarray(0, this.len));
    this.buf = next;
    this.dv = new DataView(next.buffer);
  }
  u8(v: number) { this.reserve(1); this.dv.setUint8(this.len, v); this.len += 1; }
  u32(v: number) { this.reserve(4); this.dv.setUint32(this.len, v, true); this.len += 4; }
  u64(v: number | bigint) { this.reserve(8); this.dv.setBigUint64(this.len, BigInt(v), true); this.len += 8; }
  bytes(b: Uint8Array) { this.reserve(b.length); this.buf.set(b, this.len); this.len += b.length; }
  string(s: string) { const b = this.enc.encode(s); this.u64(b.length); this.bytes(b); }
  scalar(type: number, v: GgufValue) {
    const n = SCALAR_SIZE[type]!;
    this.reserve(n);
    const d = this.dv, o = this.len;
    switch (type) {
      case 0: d.setUint8(o, Number(v)); break;
      case 1: d.setInt8(o, Number(v)); break;
      case 2: d.setUint16(o, Number(v), true); break;
      case 3: d.setInt16(o, Number(v), true); break;
      case 4: d.setUint32(o, Number(v), true); break;
      case 5: d.setInt32(o, Number(v), true); break;
      case 6: d.setFloat32(o, Number(v), true); break;
      case 7: d.setUint8(o, v ? 1 : 0); break;
      case 10: d.setBigUint64(o, BigInt(v as number), true); break;
      case 11: d.setBigInt64(o, BigInt(v as number), true); break;
      default: d.setFloat64(o, Number(v), true);
    }
    this.len += n;
  }
  value(type: number, v: GgufValue, arrayType?: number) {
    if (type === GgufValueType.STRING) this.string(String(v));
    else if (type === GgufValueType.ARRAY) {
      if (!Array.isArray(v) || arrayType === undefined) throw new ModelFormatError("[gguf] array value without an array type");
      this.u32(arrayType);
      this.u64(v.length);
      for (const x of v) this.value(arrayType, x, Array.isArray(x) ? typed(x).arrayType : undefined);
    } else this.scalar(type, v);
  }
}

/**
 * Writes a GGUF v3 file. Metadata values may be plain (types inferred) or `gguf.u32(...)`-style typed.
 * @example writeGguf("t.gguf", { "general.architecture": gguf.str("llama") }, [{ name: "w", shape: [4, 32], type: "Q8_0", data }]);
 */
export function writeGguf(file: string, metadata: Record<string, GgufValue | GgufTypedValue>, tensors: readonly GgufWriteTensor[]): void {
  const alignmentValue = metadata["general.alignment"];
  const alignment = alignmentValue === undefined ? 32 : Number(typed(alignmentValue).value);
  const sink = new ByteSink();
  sink.u32(MAGIC);
  sink.u32(3);
  sink.u64(tensors.length);
  sink.u64(Object.keys(metadata).length);
  for (const [key, raw] of Object.entries(metadata)) {
    const t = typed(raw);
    sink.string(key);
    sink.u32(t.type);
    sink.value(t.type, t.value, t.arrayType);
  }
  const sizes = tensors.map((t) => encodedSize(t, file));
  let offset = 0;
  tensors.forEach((t, i) => {
    sink.string(t.name);
    sink.u32(t.shape.length);
    for (const d of [...t.shape].reverse()) sink.u64(d);
    sink.u32(GgmlType[t.type]);
    sink.u64(offset);
    offset += Math.ceil(sizes[i]! / alignment) * alignment;
  });
  const pad = (n: number) => (alignment - (n % alignment)) % alignment;
  sink.bytes(new Uint8Array(pad(sink.len)));
  const fd = fs.openSync(file, "w");
  try {
    writeAll(fd, sink.buf.subarray(0, sink.len));
    for (const t of tensors) {
      // encoded one at a time (a 1B-parameter export never holds every tensor at once)
      const bytes = encodeTensor(t, file);
      writeAll(fd, bytes);
      const p = pad(bytes.byteLength);
      if (p) fs.writeSync(fd, new Uint8Array(p));
    }
  } finally {
    fs.closeSync(fd);
  }
}
