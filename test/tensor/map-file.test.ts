// Memory-mapped weights (llama.cpp's mmap loading): a tensor over a file's bytes holds exactly those bytes,
// computes like a copied one, and writing to it never reaches the file (private copy-on-write map).
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { describe, it } from "node:test";
import { fromBytes, mapFromFile, tensor } from "../../src/tensor/index.js";
import { getBackend } from "../../src/backends/registry.js";

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-map-"));
const file = path.join(dir, "w.bin");
// 3 header bytes, then f32 [5, 7] at offset 4 (aligned) and bf16 [3] at offset 4 + 140 = 144
const values = Float32Array.from({ length: 35 }, (_, i) => (i - 17) * 0.25);
const bf16 = new Uint16Array([0x3f80, 0xc000, 0x4040]); // 1, -2, 3
const bytes = new Uint8Array(4 + 140 + 6);
bytes.set([7, 7, 7, 7], 0);
bytes.set(new Uint8Array(values.buffer), 4);
bytes.set(new Uint8Array(bf16.buffer), 144);
fs.writeFileSync(file, bytes);

describe("mapFromFile", () => {
  it("maps a file range on cpu: same bytes, same matmul result as the copied tensor", () => {
    const mapped = mapFromFile(file, 4, "float32", [5, 7], { device: "cpu" });
    assert.ok(mapped !== null, "cpu maps files");
    assert.deepEqual([...mapped.dataSync()], [...values]);
    const copied = fromBytes(bytes.slice(4, 144), "float32", [5, 7], { device: "cpu" });
    const x = tensor(Float32Array.from({ length: 14 }, (_, i) => Math.sin(i)), { shape: [2, 7], device: "cpu" });
    assert.deepEqual([...x.matmul(mapped.T).dataSync()], [...x.matmul(copied.T).dataSync()]);
    const h = mapFromFile(file, 144, "bfloat16", [3], { device: "cpu" })!;
    assert.deepEqual([...h.to("float32").dataSync()], [1, -2, 3]);
  });

  it("a write to the mapped tensor stays in memory: the file is unchanged", () => {
    const mapped = mapFromFile(file, 4, "float32", [5, 7], { device: "cpu" })!;
    mapped.mul_(2);
    assert.equal(mapped.dataSync()[0], values[0]! * 2);
    assert.deepEqual(new Uint8Array(fs.readFileSync(file)), bytes);
    const again = mapFromFile(file, 4, "float32", [5, 7], { device: "cpu" })!;
    assert.equal(again.dataSync()[0], values[0]);
  });

  it("declines what it cannot map: an offset off the element size, a device without mapFile", () => {
    assert.equal(mapFromFile(file, 2, "float32", [5, 7], { device: "cpu" }), null);
    assert.equal(mapFromFile(file, 4, "float32", [5, 7], { device: "reference" }), null);
  });

  it("a range past the end of the file is a RangeError, not a crash", () => {
    const cpu = getBackend("cpu");
    assert.throws(() => cpu.mapFile!(file, 100, 100), (e: Error) => e instanceof RangeError && /past the end of the file/.test(e.message));
    assert.throws(() => cpu.mapFile!(path.join(dir, "missing.bin"), 0, 4), /missing\.bin/);
  });
});
