// torch.save files read without torch: fixtures written by Python's own pickle and zipfile in torch.save's layout
// (test/fixtures/torch-save/make.py), values known by construction.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
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
  assert.throws(() => readTorchSavedTensor(fixture("i64.pt")), (e) => e instanceof TorchFileError && /I64 tensors are not read: only float32, bfloat16 and float16/.test(e.message));
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

test("deflated entries are read too", async () => {
  const { tensorPickle, zip } = await import("../helpers/torch-save.js");
  const values = Float32Array.from([1.5, -2, 0.25, 8]);
  const bytes = zip(
    [["archive/data.pkl", tensorPickle([2, 2])], ["archive/byteorder", Buffer.from("little")], ["archive/data/0", Buffer.from(values.buffer)]],
    new Set(["archive/data.pkl", "archive/data/0"]),
  );
  assert.ok(bytes.indexOf("_rebuild_tensor_v2") < 0, "the pickle is compressed");
  const t = readTorchSavedTensor(bytes);
  assert.deepEqual(t.shape, [2, 2]);
  assert.deepEqual([...t.data], [...values]);
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
