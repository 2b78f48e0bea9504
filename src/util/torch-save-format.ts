// Writes what torch.save writes, for tensors given as raw little-endian bytes: a stored zip holding archive/data.pkl
// (pickle protocol 2: each tensor rebuilt by torch._utils._rebuild_tensor_v2 over a storage given as the persistent id
// ("storage", torch.<Kind>Storage, key, "cpu", numel)), archive/byteorder, archive/data/<key> and archive/version, so
// torch.load (weights_only=True too) reads the file back. A single tensor pickles byte for byte as torch does.
import { crc32, deflateRawSync } from "node:zlib";

/** A contiguous tensor to write: torch's storage class name (FloatStorage, BFloat16Storage, ...), shape, raw bytes. */
export interface TorchTensorBytes {
  storage: string;
  shape: readonly number[];
  bytes: Uint8Array;
}

const utf8 = (s: string) => Buffer.from(s, "utf8");

/** The pickler's smallest opcode for a non-negative int (BININT1, BININT2, BININT). */
function pickleInt(n: number): Buffer {
  if (n < 256) return Buffer.from([0x4b, n]);
  if (n < 65536) return Buffer.from([0x4d, n & 0xff, n >> 8]);
  const b = Buffer.alloc(5);
  b[0] = 0x4a;
  b.writeInt32LE(n, 1);
  return b;
}

function unicode(s: string): Buffer {
  const b = utf8(s);
  const head = Buffer.alloc(5);
  head[0] = 0x58;
  head.writeUInt32LE(b.length, 1);
  return Buffer.concat([head, b]);
}

/** Pickle opcodes with Python's memo numbering: each new object BINPUT under the next number, repeats BINGET. */
class PickleWriter {
  private readonly parts: Buffer[] = [Buffer.from([0x80, 0x02])];
  private readonly memo = new Map<string, number>();

  raw(...bytes: (Buffer | number[])[]): this {
    for (const b of bytes) this.parts.push(Buffer.isBuffer(b) ? b : Buffer.from(b));
    return this;
  }
  /** Memoizes the value just pushed (BINPUT) under the next number; `key` names it for shared(). */
  put(key?: string): this {
    const n = this.next++;
    if (key !== undefined) this.memo.set(key, n);
    return this.raw(n < 256 ? [0x71, n] : [0x72, n & 0xff, (n >> 8) & 0xff, (n >> 16) & 0xff, n >>> 24]);
  }
  private next = 0;
  /** A global or string pushed once and fetched from the memo after (as Python's pickler does). */
  shared(key: string, first: () => Buffer): this {
    const n = this.memo.get(key);
    if (n !== undefined) return this.raw(n < 256 ? [0x68, n] : [0x6a, n & 0xff, (n >> 8) & 0xff, (n >> 16) & 0xff, n >>> 24]);
    return this.raw(first()).put(key);
  }
  tuple(xs: readonly number[]): this {
    const body = xs.map(pickleInt);
    const op = xs.length === 1 ? 0x85 : xs.length === 2 ? 0x86 : xs.length === 3 ? 0x87 : -1;
    return op >= 0 ? this.raw(...body, [op]).put() : this.raw([0x28], ...body, [0x74]).put();
  }
  /** One tensor: _rebuild_tensor_v2(storage pid, 0, size, stride, False, OrderedDict()). */
  tensor(t: TorchTensorBytes, key: string): this {
    const numel = t.shape.reduce((a, b) => a * b, 1);
    const strides = t.shape.map((_, d) => t.shape.slice(d + 1).reduce((a, b) => a * b, 1));
    this.shared("g:rebuild", () => utf8("ctorch._utils\n_rebuild_tensor_v2\n"));
    this.raw([0x28, 0x28]).shared("s:storage", () => unicode("storage"));
    this.shared(`g:${t.storage}`, () => utf8(`ctorch\n${t.storage}\n`));
    this.raw(unicode(key)).put().shared("s:cpu", () => unicode("cpu"));
    this.raw(pickleInt(numel), [0x74]).put().raw([0x51]);
    this.raw(pickleInt(0)).tuple(t.shape).tuple(strides).raw([0x89]);
    this.shared("g:odict", () => utf8("ccollections\nOrderedDict\n")).raw([0x29, 0x52]).put();
    return this.raw([0x74]).put().raw([0x52]).put();
  }
  done(): Buffer {
    return Buffer.concat([...this.parts, Buffer.from([0x2e])]);
  }
}

/** data.pkl of one tensor (storage "0") or of a state dict (an OrderedDict, storages "0", "1", ... in order). */
export function torchSavePickle(value: TorchTensorBytes | ReadonlyMap<string, TorchTensorBytes>): Buffer {
  const w = new PickleWriter();
  if (!(value instanceof Map)) return w.tensor(value as TorchTensorBytes, "0").done();
  w.shared("g:odict", () => utf8("ccollections\nOrderedDict\n")).raw([0x29, 0x52]).put().raw([0x28]);
  let k = 0;
  for (const [name, t] of value as ReadonlyMap<string, TorchTensorBytes>) w.raw(unicode(name)).put().tensor(t, String(k++));
  return w.raw([0x75]).done();
}

/** A zip of the entries, in order: stored (as torch writes them), but the names in `deflated` deflated. */
export function storedZip(entries: readonly (readonly [string, Uint8Array])[], deflated: ReadonlySet<string> = new Set()): Buffer {
  const parts: Buffer[] = [], dir: Buffer[] = [];
  let offset = 0;
  for (const [name, raw] of entries) {
    const n = utf8(name);
    const crc = crc32(raw);
    const method = deflated.has(name) ? 8 : 0;
    const data = method === 8 ? deflateRawSync(raw) : Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength);
    const local = Buffer.alloc(30);
    local.writeUInt32LE(0x04034b50, 0);
    local.writeUInt16LE(20, 4);
    local.writeUInt16LE(method, 8);
    local.writeUInt32LE(crc, 14);
    local.writeUInt32LE(data.length, 18);
    local.writeUInt32LE(raw.length, 22);
    local.writeUInt16LE(n.length, 26);
    const central = Buffer.alloc(46);
    central.writeUInt32LE(0x02014b50, 0);
    central.writeUInt16LE(20, 4);
    central.writeUInt16LE(20, 6);
    central.writeUInt16LE(method, 10);
    central.writeUInt32LE(crc, 16);
    central.writeUInt32LE(data.length, 20);
    central.writeUInt32LE(raw.length, 24);
    central.writeUInt16LE(n.length, 28);
    central.writeUInt32LE(offset, 42);
    parts.push(local, n, data);
    dir.push(central, n);
    offset += 30 + n.length + data.length;
  }
  const d = Buffer.concat(dir);
  const end = Buffer.alloc(22);
  end.writeUInt32LE(0x06054b50, 0);
  end.writeUInt16LE(entries.length, 8);
  end.writeUInt16LE(entries.length, 10);
  end.writeUInt32LE(d.length, 12);
  end.writeUInt32LE(offset, 16);
  return Buffer.concat([...parts, d, end]);
}

/** The bytes torch.save writes for a tensor or a state dict (archive name "archive"). */
export function torchSaveBytes(value: TorchTensorBytes | ReadonlyMap<string, TorchTensorBytes>): Buffer {
  const tensors = value instanceof Map ? [...(value as ReadonlyMap<string, TorchTensorBytes>).values()] : [value as TorchTensorBytes];
  return storedZip([
    ["archive/data.pkl", torchSavePickle(value)],
    ["archive/byteorder", utf8("little")],
    ...tensors.map((t, i) => [`archive/data/${i}`, t.bytes] as const),
    ["archive/version", utf8("3\n")],
  ]);
}
