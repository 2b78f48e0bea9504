// torch.save's bytes for one contiguous float32 tensor, as the Python script in test/fixtures/torch-save writes them
// (data.pkl at pickle protocol 2 calling torch._utils._rebuild_tensor_v2, the storage as a persistent id; a stored zip).
// test/models/torch-saved-tensor.test.ts checks its data.pkl against that script's, byte for byte.
import { crc32, deflateRawSync } from "node:zlib";

const utf8 = (s: string) => Buffer.from(s, "utf8");

/** BININT1 / BININT2 / BININT as pickle writes a non-negative int. */
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

const put = (k: number) => Buffer.from([0x71, k]);

/** data.pkl of a contiguous float32 tensor of `shape` in storage "0". */
export function tensorPickle(shape: readonly number[]): Buffer {
  const numel = shape.reduce((a, b) => a * b, 1);
  const strides = shape.map((_, d) => shape.slice(d + 1).reduce((a, b) => a * b, 1));
  const tuple = (xs: readonly number[], k: number): Buffer => {
    const body = Buffer.concat(xs.map(pickleInt));
    const op = xs.length === 1 ? [0x85] : xs.length === 2 ? [0x86] : xs.length === 3 ? [0x87] : null;
    return op ? Buffer.concat([body, Buffer.from(op), put(k)]) : Buffer.concat([Buffer.from([0x28]), body, Buffer.from([0x74]), put(k)]);
  };
  return Buffer.concat([
    Buffer.from([0x80, 0x02]), utf8("ctorch._utils\n_rebuild_tensor_v2\n"), put(0),
    Buffer.from([0x28, 0x28]), unicode("storage"), put(1), utf8("ctorch\nFloatStorage\n"), put(2), unicode("0"), put(3), unicode("cpu"), put(4),
    pickleInt(numel), Buffer.from([0x74]), put(5), Buffer.from([0x51]),
    pickleInt(0), tuple(shape, 6), tuple(strides, 7), Buffer.from([0x89]),
    utf8("ccollections\nOrderedDict\n"), put(8), Buffer.from([0x29, 0x52]), put(9), Buffer.from([0x74]), put(10), Buffer.from([0x52]), put(11), Buffer.from([0x2e]),
  ]);
}

/** A zip of the entries, in order: stored, but the names in `deflated` deflated. */
export function zip(entries: [string, Buffer][], deflated: ReadonlySet<string> = new Set()): Buffer {
  const parts: Buffer[] = [], dir: Buffer[] = [];
  let offset = 0;
  for (const [name, raw] of entries) {
    const n = utf8(name);
    const crc = crc32(raw);
    const method = deflated.has(name) ? 8 : 0;
    const data = method === 8 ? deflateRawSync(raw) : raw;
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

/** torch.save(tensor) of a contiguous float32 tensor with these values and shape. */
export function torchSaveFloat32(values: Float32Array, shape: readonly number[]): Buffer {
  const raw = Buffer.from(values.buffer, values.byteOffset, values.byteLength);
  return zip([["archive/data.pkl", tensorPickle(shape)], ["archive/byteorder", utf8("little")], ["archive/data/0", Buffer.from(raw)], ["archive/version", utf8("3\n")]]);
}
