// safetensors reader (single file or sharded via model.safetensors.index.json) and writer.
// Layout: u64 LE header length N, N bytes of JSON header, then the data region; each header
// entry gives dtype, shape and [begin, end) offsets relative to the data region.
// Tensors are read lazily with fs.readSync into fresh (off-heap) ArrayBuffers, never whole files.

import * as fs from "node:fs";
import * as path from "node:path";
import { formatError, ModelFormatError } from "./model-format-error.js";
import { bf16BytesToF32, bytesOf, f16BytesToF32, fp8BytesToF32 } from "./dtype-convert.js";

export { ModelFormatError } from "./model-format-error.js";

export type SafetensorsDtype =
  | "F64" | "F32" | "F16" | "BF16" | "F8_E4M3" | "F8_E5M2"
  | "I64" | "I32" | "I16" | "I8" | "U64" | "U32" | "U16" | "U8" | "BOOL";

/** Bytes per element of each dtype. */
export const SAFETENSORS_DTYPE_SIZE: Readonly<Record<SafetensorsDtype, number>> = {
  F64: 8, F32: 4, F16: 2, BF16: 2, F8_E4M3: 1, F8_E5M2: 1,
  I64: 8, I32: 4, I16: 2, I8: 1, U64: 8, U32: 4, U16: 2, U8: 1, BOOL: 1,
};

export interface SafetensorsTensorInfo {
  name: string;
  dtype: SafetensorsDtype;
  shape: number[];
  /** Absolute path of the file that holds the tensor. */
  file: string;
  /** Absolute byte offset within `file`. */
  byteOffset: number;
  byteLength: number;
}

export interface SafetensorsHandle {
  readonly tensors: readonly SafetensorsTensorInfo[];
  /** `__metadata__` of every file, merged (later shards win). */
  readonly metadata: Readonly<Record<string, string>>;
  get(name: string): SafetensorsTensorInfo | undefined;
  has(name: string): boolean;
  /** The tensor's raw little-endian bytes, in a fresh ArrayBuffer. */
  load(name: string): Uint8Array;
  /** The tensor converted to f32 (floats, ints and bool; I64/U64 through Number). */
  loadAsFloat32(name: string): Float32Array;
  close(): void;
}

const MAX_HEADER_BYTES = 100 * 1024 * 1024;
const INDEX_FILE = "model.safetensors.index.json";

function isDtype(x: unknown): x is SafetensorsDtype {
  return typeof x === "string" && Object.prototype.hasOwnProperty.call(SAFETENSORS_DTYPE_SIZE, x);
}

function readExactly(fd: number, file: string, length: number, position: number): Uint8Array {
  const out = new Uint8Array(new ArrayBuffer(length));
  let done = 0;
  while (done < length) {
    const n = fs.readSync(fd, out, done, length - done, position + done);
    if (n === 0) throw formatError("safetensors", file, `unexpected end of file at byte ${position + done}`);
    done += n;
  }
  return out;
}

interface ParsedFile {
  tensors: SafetensorsTensorInfo[];
  metadata: Record<string, string>;
}

/** Reads and strictly validates one file's header. */
function parseHeader(fd: number, file: string): ParsedFile {
  const fileSize = fs.fstatSync(fd).size;
  if (fileSize < 8) throw formatError("safetensors", file, `file is ${fileSize} bytes, too short for the 8-byte header length`);
  const lenBytes = readExactly(fd, file, 8, 0);
  const headerLen = new DataView(lenBytes.buffer).getBigUint64(0, true);
  if (headerLen > BigInt(MAX_HEADER_BYTES)) throw formatError("safetensors", file, `header length ${headerLen} exceeds the 100 MB limit`);
  const n = Number(headerLen);
  if (8 + n > fileSize) throw formatError("safetensors", file, `header length ${n} runs past the end of the ${fileSize}-byte file`);
  const headerBytes = readExactly(fd, file, n, 8);
  let header: unknown;
  try {
    header = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(headerBytes));
  } catch (e) {
    throw formatError("safetensors", file, `header is not valid UTF-8 JSON (${(e as Error).message})`);
  }
  if (header === null || typeof header !== "object" || Array.isArray(header)) {
    throw formatError("safetensors", file, "header JSON is not an object");
  }
  const dataStart = 8 + n;
  const dataSize = fileSize - dataStart;
  const tensors: SafetensorsTensorInfo[] = [];
  const ranges: [number, number, string][] = [];
  let metadata: Record<string, string> = {};
  for (const [name, entry] of Object.entries(header as Record<string, unknown>)) {
    if (name === "__metadata__") {
      if (entry === null || typeof entry !== "object" || Array.isArray(entry)) throw formatError("safetensors", file, "__metadata__ is not an object");
      for (const [k, v] of Object.entries(entry)) {
        if (typeof v !== "string") throw formatError("safetensors", file, `__metadata__["${k}"] is not a string`);
      }
      metadata = entry as Record<string, string>;
      continue;
    }
    const bad = (detail: string) => formatError("safetensors", file, detail, name);
    if (entry === null || typeof entry !== "object" || Array.isArray(entry)) throw bad("entry is not an object");
    const { dtype, shape, data_offsets: offsets } = entry as Record<string, unknown>;
    if (!isDtype(dtype)) throw bad(`unknown dtype ${JSON.stringify(dtype)}`);
    if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) throw bad(`shape ${JSON.stringify(shape)} is not a list of non-negative integers`);
    if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every((o) => Number.isSafeInteger(o) && o >= 0)) {
      throw bad(`data_offsets ${JSON.stringify(offsets)} is not [begin, end]`);
    }
    const [begin, end] = offsets as [number, number];
    if (begin > end || end > dataSize) throw bad(`data_offsets [${begin}, ${end}] outside the ${dataSize}-byte data region`);
    const numel = (shape as number[]).reduce((a, b) => a * b, 1);
    const expected = numel * SAFETENSORS_DTYPE_SIZE[dtype];
    if (expected !== end - begin) throw bad(`byte length ${end - begin} != ${expected} for ${dtype}${JSON.stringify(shape)}`);
    tensors.push({ name, dtype, shape: [...(shape as number[])], file, byteOffset: dataStart + begin, byteLength: end - begin });
    if (end > begin) ranges.push([begin, end, name]);
  }
  ranges.sort((a, b) => a[0] - b[0]);
  for (let i = 1; i < ranges.length; i++) {
    if (ranges[i]![0] < ranges[i - 1]![1]) throw formatError("safetensors", file, `tensor data overlaps tensor "${ranges[i - 1]![2]}"`, ranges[i]![2]);
  }
  return { tensors, metadata };
}

/** Lists the files of a model: the index's shards, model.safetensors, or every *.safetensors. */
function resolveFiles(p: string): { files: string[]; weightMap: Record<string, string> | null; indexPath: string | null } {
  const stat = fs.statSync(p, { throwIfNoEntry: false });
  if (!stat) throw new ModelFormatError(`[safetensors] ${p}: no such file or directory`, p);
  let indexPath: string | null = null;
  if (stat.isDirectory()) {
    const idx = path.join(p, INDEX_FILE);
    if (fs.existsSync(idx)) indexPath = idx;
    else if (fs.existsSync(path.join(p, "model.safetensors"))) return { files: [path.join(p, "model.safetensors")], weightMap: null, indexPath };
    else {
      const files = fs.readdirSync(p).filter((f) => f.endsWith(".safetensors")).sort().map((f) => path.join(p, f));
      if (files.length === 0) throw new ModelFormatError(`[safetensors] ${p}: no .safetensors files in directory`, p);
      return { files, weightMap: null, indexPath };
    }
  } else if (p.endsWith(".json")) indexPath = p;
  else return { files: [path.resolve(p)], weightMap: null, indexPath };

  let index: unknown;
  try {
    index = JSON.parse(fs.readFileSync(indexPath, "utf8"));
  } catch (e) {
    throw formatError("safetensors", indexPath, `index is not valid JSON (${(e as Error).message})`);
  }
  const weightMap = (index as { weight_map?: unknown } | null)?.weight_map;
  if (weightMap === null || typeof weightMap !== "object" || Array.isArray(weightMap)) throw formatError("safetensors", indexPath, "index has no weight_map object");
  const dir = path.dirname(indexPath);
  const resolved: Record<string, string> = {};
  for (const [name, f] of Object.entries(weightMap as Record<string, unknown>)) {
    if (typeof f !== "string" || f.includes("/") || f.includes("\\") || f === ".." || f === ".") {
      throw formatError("safetensors", indexPath, `weight_map entry is not a file name: ${JSON.stringify(f)}`, name);
    }
    resolved[name] = path.join(dir, f);
  }
  return { files: [...new Set(Object.values(resolved))].sort(), weightMap: resolved, indexPath };
}

/**
 * Opens a safetensors model lazily. `p` is a .safetensors file, an index .json, or a directory.
 * @example
 *   const st = readSafetensors("/models/qwen3-0.6b");
 *   const w = st.loadAsFloat32("model.embed_tokens.weight");
 *   st.close();
 */
export function readSafetensors(p: string): SafetensorsHandle {
  const { files, weightMap, indexPath } = resolveFiles(p);
  const fds = new Map<string, number>();
  const byName = new Map<string, SafetensorsTensorInfo>();
  const metadata: Record<string, string> = {};
  const closeAll = () => {
    for (const fd of fds.values()) fs.closeSync(fd);
    fds.clear();
  };
  try {
    for (const file of files) {
      let fd: number;
      try {
        fd = fs.openSync(file, "r");
      } catch (e) {
        throw formatError("safetensors", file, `cannot open (${(e as Error).message})`);
      }
      fds.set(file, fd);
      const parsed = parseHeader(fd, file);
      Object.assign(metadata, parsed.metadata);
      for (const t of parsed.tensors) {
        if (weightMap && weightMap[t.name] !== file) continue; // index is authoritative for sharded models
        if (byName.has(t.name)) throw formatError("safetensors", file, `duplicate tensor (also in ${byName.get(t.name)!.file})`, t.name);
        byName.set(t.name, t);
      }
    }
    if (weightMap) {
      for (const [name, file] of Object.entries(weightMap)) {
        if (!byName.has(name)) throw formatError("safetensors", indexPath!, `tensor listed in the index is missing from ${file}`, name);
      }
    }
  } catch (e) {
    closeAll();
    throw e;
  }
  const tensors = [...byName.values()];
  const info = (name: string) => {
    const t = byName.get(name);
    if (!t) throw new ModelFormatError(`[safetensors] ${p}: no tensor named "${name}"`, p, name);
    return t;
  };
  const load = (name: string) => {
    const t = info(name);
    let fd = fds.get(t.file);
    if (fd === undefined) {
      fd = fs.openSync(t.file, "r");
      fds.set(t.file, fd);
    }
    return readExactly(fd, t.file, t.byteLength, t.byteOffset);
  };
  return {
    tensors,
    metadata,
    get: (name) => byName.get(name),
    has: (name) => byName.has(name),
    load,
    loadAsFloat32: (name) => toFloat32(load(name), info(name).dtype),
    close: closeAll,
  };
}

/** Converts raw little-endian bytes of `dtype` to f32. */
export function toFloat32(bytes: Uint8Array, dtype: SafetensorsDtype): Float32Array {
  const aligned = bytes.byteOffset % 8 === 0 ? bytes : bytes.slice();
  const { buffer, byteOffset } = aligned;
  const n = bytes.byteLength / SAFETENSORS_DTYPE_SIZE[dtype];
  switch (dtype) {
    case "F32": return new Float32Array(buffer, byteOffset, n);
    case "F16": return f16BytesToF32(aligned);
    case "BF16": return bf16BytesToF32(aligned);
    case "F8_E4M3": return fp8BytesToF32(aligned, "e4m3fn");
    case "F8_E5M2": return fp8BytesToF32(aligned, "e5m2");
    case "F64": return Float32Array.from(new Float64Array(buffer, byteOffset, n));
    case "I64": return Float32Array.from(new BigInt64Array(buffer, byteOffset, n), Number);
    case "U64": return Float32Array.from(new BigUint64Array(buffer, byteOffset, n), Number);
    case "I32": return Float32Array.from(new Int32Array(buffer, byteOffset, n));
    case "U32": return Float32Array.from(new Uint32Array(buffer, byteOffset, n));
    case "I16": return Float32Array.from(new Int16Array(buffer, byteOffset, n));
    case "U16": return Float32Array.from(new Uint16Array(buffer, byteOffset, n));
    case "I8": return Float32Array.from(new Int8Array(buffer, byteOffset, n));
    case "U8":
    case "BOOL": return Float32Array.from(new Uint8Array(buffer, byteOffset, n));
  }
}

export interface SafetensorsWriteTensor {
  name: string;
  dtype: SafetensorsDtype;
  shape: readonly number[];
  /** Raw little-endian bytes, or a typed array whose bytes are the tensor (e.g. Uint16Array of bf16 bits). */
  data: Uint8Array | ArrayBufferView;
}

/** A tensor whose bytes are produced only when it is written (one tensor in memory at a time). */
export interface SafetensorsLazyTensor extends Omit<SafetensorsWriteTensor, "data"> {
  data: () => ArrayBufferView;
}

/**
 * Writes a safetensors file: tensors in the given order, header padded with spaces to 8 bytes.
 * @example writeSafetensors("/tmp/m.safetensors", [{ name: "w", dtype: "F32", shape: [2], data: new Float32Array([1, 2]) }]);
 */
export function writeSafetensors(file: string, tensors: readonly (SafetensorsWriteTensor | SafetensorsLazyTensor)[], metadata?: Record<string, string>): void {
  const header: Record<string, unknown> = {};
  if (metadata && Object.keys(metadata).length > 0) header.__metadata__ = metadata;
  let offset = 0;
  const seen = new Set<string>();
  for (const t of tensors) {
    if (t.name === "__metadata__" || seen.has(t.name)) throw formatError("safetensors", file, "duplicate or reserved tensor name", t.name);
    seen.add(t.name);
    if (!isDtype(t.dtype)) throw formatError("safetensors", file, `unknown dtype ${JSON.stringify(t.dtype)}`, t.name);
    const expected = t.shape.reduce((a, b) => a * b, 1) * SAFETENSORS_DTYPE_SIZE[t.dtype];
    if (typeof t.data !== "function") checkSize(file, t, t.data, expected);
    header[t.name] = { dtype: t.dtype, shape: [...t.shape], data_offsets: [offset, offset + expected] };
    offset += expected;
  }
  let json = JSON.stringify(header);
  const jsonBytes = Buffer.byteLength(json);
  json += " ".repeat((8 - (jsonBytes % 8)) % 8);
  const headerBytes = new TextEncoder().encode(json);
  const prefix = new Uint8Array(8);
  new DataView(prefix.buffer).setBigUint64(0, BigInt(headerBytes.length), true);
  const fd = fs.openSync(file, "w");
  try {
    fs.writeSync(fd, prefix);
    fs.writeSync(fd, headerBytes);
    for (const t of tensors) {
      const data = typeof t.data === "function" ? t.data() : t.data;
      checkSize(file, t, data, t.shape.reduce((a, b) => a * b, 1) * SAFETENSORS_DTYPE_SIZE[t.dtype]);
      const bytes = bytesOf(data);
      let done = 0;
      while (done < bytes.length) done += fs.writeSync(fd, bytes, done, bytes.length - done);
    }
  } finally {
    fs.closeSync(fd);
  }
}

function checkSize(file: string, t: { name: string; dtype: string; shape: readonly number[] }, data: ArrayBufferView, expected: number): void {
  if (data.byteLength !== expected) throw formatError("safetensors", file, `data is ${data.byteLength} bytes, expected ${expected} for ${t.dtype}${JSON.stringify(t.shape)}`, t.name);
}

/** Writes `model.safetensors.index.json` for shards already written into `dir`. */
export function writeSafetensorsIndex(dir: string, weightMap: Record<string, string>, totalSize: number): void {
  fs.writeFileSync(path.join(dir, INDEX_FILE), JSON.stringify({ metadata: { total_size: totalSize }, weight_map: weightMap }, null, 2));
}
