// One dense tensor from the bytes torch.save() writes (vLLM's prompt_embeds arrive so, base64-encoded). The file is a
// zip archive: <archive>/data.pkl, a pickle (protocol 2) that rebuilds the tensor with
// torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks), the storage a persistent id
// ("storage", torch.FloatStorage, key, location, numel) whose bytes are <archive>/data/<key>, little-endian
// (<archive>/byteorder). Only that is read: the pickle runs on a small machine that knows those few callables and
// nothing else (no arbitrary globals, as torch.load(weights_only=True)), and every index the strides reach is checked
// against the storage, so a hostile file fails with a TorchFileError instead of reading out of bounds.
import { inflateRawSync } from "node:zlib";
import { bf16BitsToF32, f16BitsToF32 } from "../backends/dtype.js";
import { KilnError } from "../util/errors.js";

export class TorchFileError extends KilnError {
  override name = "TorchFileError";
}

export type TorchFloatDtype = "float32" | "bfloat16" | "float16";

/** A dense tensor read from a torch.save file: its values as float32, row-major. */
export interface TorchSavedTensor {
  dtype: TorchFloatDtype;
  shape: number[];
  data: Float32Array;
}

const STORAGE_DTYPES: Record<string, TorchFloatDtype> = { FloatStorage: "float32", BFloat16Storage: "bfloat16", HalfStorage: "float16" };
const ELEMENT_BYTES: Record<TorchFloatDtype, number> = { float32: 4, bfloat16: 2, float16: 2 };

/** The archive's files by name (stored or deflated entries; zip64 directories too). */
function readZip(bytes: Uint8Array): Map<string, Uint8Array> {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const fail = (why: string): never => {
    throw new TorchFileError(`not a torch.save file: ${why}`);
  };
  let eocd = -1;
  for (let i = bytes.length - 22; i >= Math.max(0, bytes.length - 22 - 65535); i--)
    if (view.getUint32(i, true) === 0x06054b50) {
      eocd = i;
      break;
    }
  if (eocd < 0) fail(bytes[0] === 0x80 ? "the legacy (pre-1.6, non-zip) format is not read; save with torch.save's default" : "no zip directory");
  let count = view.getUint16(eocd + 10, true);
  let dirOffset = view.getUint32(eocd + 16, true);
  if (dirOffset === 0xffffffff && eocd >= 20 && view.getUint32(eocd - 20, true) === 0x07064b50) {
    const z64 = Number(view.getBigUint64(eocd - 12, true));
    if (z64 + 56 > bytes.length || view.getUint32(z64, true) !== 0x06064b50) fail("a broken zip64 directory");
    count = Number(view.getBigUint64(z64 + 32, true));
    dirOffset = Number(view.getBigUint64(z64 + 48, true));
  }
  const files = new Map<string, Uint8Array>();
  let at = dirOffset;
  for (let e = 0; e < count; e++) {
    if (at + 46 > bytes.length || view.getUint32(at, true) !== 0x02014b50) fail("a broken zip directory");
    const method = view.getUint16(at + 10, true);
    const size = view.getUint32(at + 20, true);
    const nameLen = view.getUint16(at + 28, true), extraLen = view.getUint16(at + 30, true), commentLen = view.getUint16(at + 32, true);
    const local = view.getUint32(at + 42, true);
    const name = new TextDecoder().decode(bytes.subarray(at + 46, at + 46 + nameLen));
    at += 46 + nameLen + extraLen + commentLen;
    if (size === 0xffffffff || local === 0xffffffff) fail(`${name}: entries over 4 GiB are not read`);
    if (local + 30 > bytes.length || view.getUint32(local, true) !== 0x04034b50) fail(`${name}: a broken zip entry`);
    const start = local + 30 + view.getUint16(local + 26, true) + view.getUint16(local + 28, true);
    if (start + size > bytes.length) fail(`${name}: the entry runs past the end of the file`);
    const raw = bytes.subarray(start, start + size);
    if (method === 0) files.set(name, raw);
    else if (method === 8) files.set(name, new Uint8Array(inflateRawSync(raw)));
    else fail(`${name}: zip compression method ${method} is not read`);
  }
  return files;
}

type PickleValue = null | boolean | number | bigint | string | PickleValue[] | PickleGlobal | StorageRef | TensorRef | Map<PickleValue, PickleValue>;

interface PickleGlobal {
  kind: "global";
  name: string;
}
interface StorageRef {
  kind: "storage";
  dtype: TorchFloatDtype | string;
  key: string;
  numel: number;
}
interface TensorRef {
  kind: "tensor";
  storage: StorageRef;
  offset: number;
  size: number[];
  stride: number[];
}

const isGlobal = (v: PickleValue): v is PickleGlobal => typeof v === "object" && v !== null && !Array.isArray(v) && !(v instanceof Map) && v.kind === "global";

/** Runs the pickle's opcodes that a saved tensor uses; anything else is refused by name. */
function unpickle(p: Uint8Array): PickleValue {
  const view = new DataView(p.buffer, p.byteOffset, p.byteLength);
  const stack: PickleValue[] = [];
  const marks: number[] = [];
  const memo = new Map<number, PickleValue>();
  let i = 0;
  const fail = (why: string): never => {
    throw new TorchFileError(`data.pkl: ${why}`);
  };
  const need = (n: number) => (i + n <= p.length ? i : fail("truncated"));
  const line = (): string => {
    const end = p.indexOf(0x0a, i);
    if (end < 0) fail("truncated");
    const s = new TextDecoder().decode(p.subarray(i, end));
    i = end + 1;
    return s;
  };
  const text = (n: number): string => {
    need(n);
    const s = new TextDecoder().decode(p.subarray(i, i + n));
    i += n;
    return s;
  };
  const pop = (): PickleValue => (stack.length > 0 ? stack.pop()! : fail("stack underflow"));
  const popMark = (): PickleValue[] => {
    const m = marks.pop() ?? fail("no mark");
    return stack.splice(m);
  };
  const top = (): PickleValue => stack[stack.length - 1] ?? fail("stack underflow");
  const int = (v: PickleValue, what: string): number => (typeof v === "number" && Number.isSafeInteger(v) ? v : fail(`${what} is not an integer`));
  const ints = (v: PickleValue, what: string): number[] => (Array.isArray(v) ? v.map((x) => int(x, what)) : fail(`${what} is not a tuple`));
  const call = (fn: PickleValue, args: PickleValue): PickleValue => {
    if (!isGlobal(fn)) fail("a call of something that is not a known function");
    const a = Array.isArray(args) ? args : fail("call arguments are not a tuple");
    const f = (fn as PickleGlobal).name;
    if (f === "collections.OrderedDict" && a.length === 0) return new Map();
    if (f === "torch._utils._rebuild_tensor_v2" || f === "torch._utils._rebuild_tensor") {
      const s = a[0];
      if (typeof s !== "object" || s === null || Array.isArray(s) || s instanceof Map || s.kind !== "storage") fail("the tensor's storage is not a storage reference");
      return { kind: "tensor", storage: s as StorageRef, offset: int(a[1] ?? null, "storage offset"), size: ints(a[2] ?? null, "size"), stride: ints(a[3] ?? null, "stride") };
    }
    return fail(`${f} is not allowed (only a dense tensor is read, as torch.load(weights_only=True))`);
  };
  while (i < p.length) {
    const op = p[i++]!;
    switch (op) {
      case 0x80: need(1); i += 1; break; // PROTO
      case 0x95: need(8); i += 8; break; // FRAME
      case 0x63: { const module = line(); stack.push({ kind: "global", name: `${module}.${line()}` }); break; } // GLOBAL
      case 0x93: { const name = pop(), module = pop(); stack.push({ kind: "global", name: `${String(module)}.${String(name)}` }); break; } // STACK_GLOBAL
      case 0x28: marks.push(stack.length); break; // MARK
      case 0x74: stack.push(popMark()); break; // TUPLE
      case 0x29: stack.push([]); break; // EMPTY_TUPLE
      case 0x85: stack.push([pop()]); break; // TUPLE1
      case 0x86: { const b = pop(), a = pop(); stack.push([a, b]); break; } // TUPLE2
      case 0x87: { const c = pop(), b = pop(), a = pop(); stack.push([a, b, c]); break; } // TUPLE3
      case 0x5d: stack.push([]); break; // EMPTY_LIST
      case 0x61: { const v = pop(); const l = top(); if (!Array.isArray(l)) fail("APPEND to a non-list"); (l as PickleValue[]).push(v); break; }
      case 0x65: { const vs = popMark(); const l = top(); if (!Array.isArray(l)) fail("APPENDS to a non-list"); (l as PickleValue[]).push(...vs); break; }
      case 0x7d: stack.push(new Map()); break; // EMPTY_DICT
      case 0x73: { const v = pop(), k = pop(); const d = top(); if (!(d instanceof Map)) fail("SETITEM on a non-dict"); (d as Map<PickleValue, PickleValue>).set(k, v); break; }
      case 0x75: { const kv = popMark(); const d = top(); if (!(d instanceof Map)) fail("SETITEMS on a non-dict"); for (let k = 0; k + 1 < kv.length; k += 2) (d as Map<PickleValue, PickleValue>).set(kv[k]!, kv[k + 1]!); break; }
      case 0x4a: need(4); stack.push(view.getInt32(i, true)); i += 4; break; // BININT
      case 0x4b: need(1); stack.push(p[i++]!); break; // BININT1
      case 0x4d: need(2); stack.push(view.getUint16(i, true)); i += 2; break; // BININT2
      case 0x8a: { // LONG1: n little-endian two's-complement bytes
        need(1);
        const n = p[i++]!;
        need(n);
        let v = 0n;
        for (let b = n - 1; b >= 0; b--) v = (v << 8n) | BigInt(p[i + b]!);
        if (n > 0 && p[i + n - 1]! >= 0x80) v -= 1n << BigInt(8 * n);
        i += n;
        stack.push(v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v);
        break;
      }
      case 0x58: { need(4); const n = view.getUint32(i, true); i += 4; stack.push(text(n)); break; } // BINUNICODE
      case 0x8c: { need(1); const n = p[i++]!; stack.push(text(n)); break; } // SHORT_BINUNICODE
      case 0x55: { need(1); const n = p[i++]!; stack.push(text(n)); break; } // SHORT_BINSTRING
      case 0x47: need(8); stack.push(view.getFloat64(i, false)); i += 8; break; // BINFLOAT
      case 0x4e: stack.push(null); break; // NONE
      case 0x88: stack.push(true); break; // NEWTRUE
      case 0x89: stack.push(false); break; // NEWFALSE
      case 0x71: need(1); memo.set(p[i++]!, top()); break; // BINPUT
      case 0x72: need(4); memo.set(view.getUint32(i, true), top()); i += 4; break; // LONG_BINPUT
      case 0x94: memo.set(memo.size, top()); break; // MEMOIZE
      case 0x68: need(1); stack.push(memo.has(p[i]!) ? memo.get(p[i++]!)! : fail("a memo reference to nothing")); break; // BINGET
      case 0x6a: { need(4); const k = view.getUint32(i, true); i += 4; stack.push(memo.has(k) ? memo.get(k)! : fail("a memo reference to nothing")); break; } // LONG_BINGET
      case 0x51: { // BINPERSID: ("storage", storage type, key, location, numel)
        const popped = pop();
        const pid = Array.isArray(popped) ? popped : [];
        if (pid[0] !== "storage" || pid.length < 5 || !isGlobal(pid[1]!)) fail("a persistent id that is not a storage");
        const type = pid[1] as PickleGlobal;
        const short = type.name.replace(/^torch\./, "");
        stack.push({ kind: "storage", dtype: STORAGE_DTYPES[short] ?? short, key: String(pid[2]), numel: int(pid[4]!, "storage size") });
        break;
      }
      case 0x52: { const args = pop(), fn = pop(); stack.push(call(fn, args)); break; } // REDUCE
      case 0x62: pop(); break; // BUILD: a tensor's state (none for a plain tensor) changes nothing read here
      case 0x2e: return stack.length === 1 ? stack[0]! : fail("the pickle does not end with one value"); // STOP
      default:
        fail(`pickle opcode 0x${op.toString(16)} is not read`);
    }
  }
  return fail("no STOP opcode");
}

/**
 * The tensor torch.save wrote into `bytes`, as float32 values in row-major order (a strided view is gathered; bfloat16
 * and float16 widen exactly).
 * @example const { shape, data } = readTorchSavedTensor(Buffer.from(body.prompt_embeds, "base64"));
 */
export function readTorchSavedTensor(bytes: Uint8Array): TorchSavedTensor {
  const files = readZip(bytes);
  const pkl = [...files.keys()].find((n) => n === "data.pkl" || n.endsWith("/data.pkl"));
  if (pkl === undefined) throw new TorchFileError("not a torch.save file: no data.pkl in the archive");
  const prefix = pkl.slice(0, pkl.length - "data.pkl".length);
  const order = files.get(`${prefix}byteorder`);
  if (order !== undefined && new TextDecoder().decode(order).trim() !== "little") throw new TorchFileError("big-endian torch.save files are not read");
  const value = unpickle(files.get(pkl)!);
  if (typeof value !== "object" || value === null || Array.isArray(value) || value instanceof Map || value.kind !== "tensor")
    throw new TorchFileError("the file holds something other than one tensor");
  const t = value as TensorRef;
  const dtype = t.storage.dtype;
  if (!(dtype in ELEMENT_BYTES)) throw new TorchFileError(`a ${dtype} tensor: only float32, bfloat16 and float16 are read`);
  const dt = dtype as TorchFloatDtype;
  const raw = files.get(`${prefix}data/${t.storage.key}`);
  if (raw === undefined) throw new TorchFileError(`storage ${t.storage.key} is missing from the archive`);
  const storageNumel = Math.min(t.storage.numel, Math.floor(raw.length / ELEMENT_BYTES[dt]));
  if (t.size.length !== t.stride.length || t.size.some((s) => s < 0) || t.stride.some((s) => s < 0) || t.offset < 0)
    throw new TorchFileError(`size [${t.size.join(", ")}] and stride [${t.stride.join(", ")}] do not describe a dense view`);
  const numel = t.size.reduce((a, b) => a * b, 1);
  const last = t.offset + t.size.reduce((s, n, d) => s + (n > 0 ? (n - 1) * t.stride[d]! : 0), 0);
  if (numel > 0 && last >= storageNumel)
    throw new TorchFileError(`the view reaches element ${last} of a storage of ${storageNumel}`);
  const view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
  const at = (k: number): number =>
    dt === "float32" ? view.getFloat32(4 * k, true) : dt === "bfloat16" ? bf16BitsToF32(view.getUint16(2 * k, true)) : f16BitsToF32(view.getUint16(2 * k, true));
  const data = new Float32Array(numel);
  const index = new Array<number>(t.size.length).fill(0);
  for (let e = 0; e < numel; e++) {
    let k = t.offset;
    for (let d = 0; d < index.length; d++) k += index[d]! * t.stride[d]!;
    data[e] = at(k);
    for (let d = index.length - 1; d >= 0; d--) {
      if (++index[d]! < t.size[d]!) break;
      index[d] = 0;
    }
  }
  return { dtype: dt, shape: [...t.size], data };
}
