// torch.save files read without torch: fixtures written by Python's own pickle and zipfile in torch.save's layout
// (test/fixtures/torch-save/make.py), values known by construction.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { deflateRawSync } from "node:zlib";
import { readTorchSavedTensor, TorchFileError } from "../../src/models/torch-saved-tensor.js";

const fixture = (name: string) => fs.readFileSync(fileURLToPath(new URL(`../../../test/fixtures/torch-save/${name}`, import.meta.url)));

test("float32 [2, 3]", () => {
  const t = readTorchSavedTensor(fixture("f32-2x3.pt"));
  assert.equal(t.dtype, "float32");
  assert.deepEqual(t.shape, [2, 3]);
  assert.deepEqual([...t.data], [-1, -0.5, 0, 0.5, 1, 1.5]);
});

test("bfloat16 [1, 2, 4] in an archive named otherwise, widened exactly", () => {
  const t = readTorchSavedTensor(fixture("bf16-1x2x4.pt"));
  assert.equal(t.dtype, "bfloat16");
  assert.deepEqual(t.shape, [1, 2, 4]);
  assert.deepEqual([...t.data], Array.from({ length: 8 }, (_, i) => i / 8 - 0.25));
});

test("a float16 transposed view at an offset is gathered in row-major order", () => {
  const t = readTorchSavedTensor(fixture("f16-transposed.pt"));
  assert.deepEqual(t.shape, [3, 2]);
  // element (i, j) = storage[1 + i + 3j], storage = 0..6
  assert.deepEqual([...t.data], [1, 4, 2, 5, 3, 6]);
});

test("refused: integer tensors, views past their storage, other files", () => {
  assert.throws(() => readTorchSavedTensor(fixture("i64.pt")), (e) => e instanceof TorchFileError && /a LongStorage tensor: only float32, bfloat16 and float16/.test(e.message));
  assert.throws(() => readTorchSavedTensor(fixture("out-of-bounds.pt")), /the view reaches element 5 of a storage of 4/);
  assert.throws(() => readTorchSavedTensor(new TextEncoder().encode("hello")), /not a torch.save file: no zip directory/);
  assert.throws(() => readTorchSavedTensor(Uint8Array.from([0x80, 0x02, 0x8a, 0x0a])), /legacy \(pre-1.6, non-zip\) format/);
});

test("a pickle calling anything but the tensor rebuild is refused (no arbitrary globals)", () => {
  // the fixture's data.pkl with torch._utils._rebuild_tensor_v2 replaced by os.system (same length kept by padding)
  const bytes = Buffer.from(fixture("f32-2x3.pt"));
  const at = bytes.indexOf("torch._utils\n_rebuild_tensor_v2\n");
  assert.ok(at > 0);
  bytes.write("os\nsystem\n".padEnd("torch._utils\n_rebuild_tensor_v2\n".length, "\n"), at, "latin1");
  // (the zip stores data.pkl uncompressed and the reader does not check CRCs, so the edit reaches the unpickler)
  assert.throws(() => readTorchSavedTensor(bytes), (e) => e instanceof TorchFileError && /data\.pkl: (os\.system is not allowed|pickle opcode)/.test(e.message));
});

test("deflated entries are read too", () => {
  // rebuild the f32 fixture with data/0 deflated: local header + central directory written by hand
  const src = readTorchSavedTensor(fixture("f32-2x3.pt"));
  assert.equal(src.data.length, 6);
  const bytes = fixture("f32-2x3.pt");
  // find archive/data/0's local header and re-encode the archive with it deflated
  const entries = ["archive/data.pkl", "archive/byteorder", "archive/data/0", "archive/version"];
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const contents = new Map<string, Uint8Array>();
  for (let i = 0; i + 30 < bytes.length; i++) {
    if (view.getUint32(i, true) !== 0x04034b50) continue;
    const n = view.getUint16(i + 26, true), x = view.getUint16(i + 28, true), size = view.getUint32(i + 18, true);
    const name = bytes.subarray(i + 30, i + 30 + n).toString();
    contents.set(name, bytes.subarray(i + 30 + n + x, i + 30 + n + x + size));
  }
  const parts: Buffer[] = [];
  const dir: Buffer[] = [];
  let offset = 0;
  for (const name of entries) {
    const raw = contents.get(name)!;
    const deflate = name.endsWith("/0");
    const data = deflate ? deflateRawSync(raw) : Buffer.from(raw);
    const nameBuf = Buffer.from(name);
    const local = Buffer.alloc(30);
    local.writeUInt32LE(0x04034b50, 0);
    local.writeUInt16LE(deflate ? 8 : 0, 8);
    local.writeUInt32LE(data.length, 18);
    local.writeUInt32LE(raw.length, 22);
    local.writeUInt16LE(nameBuf.length, 26);
    const central = Buffer.alloc(46);
    central.writeUInt32LE(0x02014b50, 0);
    central.writeUInt16LE(deflate ? 8 : 0, 10);
    central.writeUInt32LE(data.length, 20);
    central.writeUInt32LE(raw.length, 24);
    central.writeUInt16LE(nameBuf.length, 28);
    central.writeUInt32LE(offset, 42);
    parts.push(local, nameBuf, data);
    dir.push(central, nameBuf);
    offset += 30 + nameBuf.length + data.length;
  }
  const dirBytes = Buffer.concat(dir);
  const eocd = Buffer.alloc(22);
  eocd.writeUInt32LE(0x06054b50, 0);
  eocd.writeUInt16LE(entries.length, 8);
  eocd.writeUInt16LE(entries.length, 10);
  eocd.writeUInt32LE(dirBytes.length, 12);
  eocd.writeUInt32LE(offset, 16);
  const t = readTorchSavedTensor(Buffer.concat([...parts, dirBytes, eocd]));
  assert.deepEqual([...t.data], [...src.data]);
});

test("the tests' torch.save writer (test/helpers/torch-save.ts) pickles as Python does, and its files read back", async () => {
  const { tensorPickle, torchSaveFloat32 } = await import("../helpers/torch-save.js");
  // data.pkl of the Python-written fixture: stored, so its bytes sit between the local header and the next entry
  const bytes = fixture("f32-2x3.pt");
  const name = Buffer.from("archive/data.pkl");
  const at = bytes.indexOf(name) + name.length;
  const size = bytes.readUInt32LE(bytes.indexOf(name) - 30 + 18);
  assert.deepEqual(tensorPickle([2, 3]), bytes.subarray(at, at + size));
  const values = Float32Array.from({ length: 24 }, (_, i) => Math.sin(i));
  const t = readTorchSavedTensor(torchSaveFloat32(values, [2, 3, 4]));
  assert.deepEqual(t.shape, [2, 3, 4]);
  assert.deepEqual([...t.data], [...values]);
});
