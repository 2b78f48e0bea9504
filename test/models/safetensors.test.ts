import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { readSafetensors, writeSafetensors, writeSafetensorsIndex, ModelFormatError, SAFETENSORS_DTYPE_SIZE, type SafetensorsDtype } from "../../src/models/formats/safetensors.js";
import { f32ToBf16Bits, bf16BitsToF32, f32ToF16Bits, f16BitsToF32, f32ToFp8Bits, fp8BitsToF32 } from "../../src/models/formats/dtype-convert.js";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-st-"));
process.on("exit", () => fs.rmSync(tmp, { recursive: true, force: true }));

test("dtype conversions: bf16/f16 round to nearest even, fp8 tables", () => {
  assert.equal(f32ToBf16Bits(1), 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1 and 1+2^-7: ties to even (1).
  assert.equal(f32ToBf16Bits(1 + 2 ** -8), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up.
  assert.equal(f32ToBf16Bits(1 + 3 * 2 ** -8), 0x3f82);
  assert.equal(bf16BitsToF32(0xc040), -3);
  assert.ok(Number.isNaN(bf16BitsToF32(f32ToBf16Bits(NaN))));
  assert.equal(f32ToF16Bits(1), 0x3c00);
  assert.equal(f32ToF16Bits(65504), 0x7bff);
  assert.equal(f32ToF16Bits(65520), 0x7c00); // halfway to the next binade: rounds to inf
  assert.equal(f32ToF16Bits(2 ** -24), 0x0001); // smallest subnormal
  assert.equal(f32ToF16Bits(2 ** -25), 0x0000); // tie with 0 -> even
  assert.equal(f32ToF16Bits(1 + 2 ** -11), 0x3c00); // tie -> even
  assert.equal(f16BitsToF32(0x0001), 2 ** -24);
  assert.equal(f16BitsToF32(0xc000), -2);
  assert.equal(fp8BitsToF32(0x7e, "e4m3fn"), 448);
  assert.ok(Number.isNaN(fp8BitsToF32(0x7f, "e4m3fn")));
  assert.equal(fp8BitsToF32(0x01, "e4m3fn"), 2 ** -9);
  assert.equal(fp8BitsToF32(0x7b, "e5m2"), 57344);
  assert.equal(fp8BitsToF32(0x7c, "e5m2"), Infinity);
  assert.equal(f32ToFp8Bits(1000, "e4m3fn"), 0x7e); // saturates
  assert.equal(f32ToFp8Bits(-1.0625, "e4m3fn"), 0xb8); // tie between 1 (even code 0x38) and 1.125
  assert.equal(f32ToFp8Bits(1.5, "e5m2"), 0x3e);
  for (let c = 0; c < 256; c++) {
    const v = fp8BitsToF32(c, "e4m3fn");
    if (!Number.isNaN(v) && c !== 0x80) assert.equal(f32ToFp8Bits(v, "e4m3fn"), c);
  }
});

test("safetensors round trip, every dtype", () => {
  const file = path.join(tmp, "all.safetensors");
  const dtypes = Object.keys(SAFETENSORS_DTYPE_SIZE) as SafetensorsDtype[];
  const tensors = dtypes.map((dtype, i) => {
    const shape = [2, 3];
    const data = new Uint8Array(6 * SAFETENSORS_DTYPE_SIZE[dtype]);
    for (let j = 0; j < data.length; j++) data[j] = (j * 7 + i) & 0x7f;
    return { name: `t.${dtype}`, dtype, shape, data };
  });
  tensors.push({ name: "empty", dtype: "F32", shape: [0, 4], data: new Uint8Array(0) });
  writeSafetensors(file, tensors, { format: "pt" });
  const st = readSafetensors(file);
  assert.equal(st.tensors.length, tensors.length);
  assert.deepEqual(st.metadata, { format: "pt" });
  for (const t of tensors) {
    const info = st.get(t.name)!;
    assert.equal(info.dtype, t.dtype);
    assert.deepEqual(info.shape, t.shape);
    assert.deepEqual(st.load(t.name), t.data);
  }
  st.close();

  const f = path.join(tmp, "floats.safetensors");
  const vals = new Float32Array([1, -2, 0.5, 3.25]);
  writeSafetensors(f, [
    { name: "f32", dtype: "F32", shape: [4], data: vals },
    { name: "bf16", dtype: "BF16", shape: [4], data: Uint16Array.from(vals, f32ToBf16Bits) },
    { name: "f16", dtype: "F16", shape: [2, 2], data: Uint16Array.from(vals, f32ToF16Bits) },
    { name: "fp8", dtype: "F8_E4M3", shape: [4], data: Uint8Array.from(vals, (v) => f32ToFp8Bits(v, "e4m3fn")) },
    { name: "i64", dtype: "I64", shape: [4], data: BigInt64Array.from([1n, -2n, 0n, 3n]) },
  ]);
  const g = readSafetensors(f);
  for (const n of ["f32", "bf16", "f16", "fp8"]) assert.deepEqual(g.loadAsFloat32(n), vals, n);
  assert.deepEqual(g.loadAsFloat32("i64"), new Float32Array([1, -2, 0, 3]));
  g.close();
});

test("sharded safetensors via index", () => {
  const dir = path.join(tmp, "sharded");
  fs.mkdirSync(dir);
  writeSafetensors(path.join(dir, "model-00001-of-00002.safetensors"), [{ name: "a", dtype: "F32", shape: [2], data: new Float32Array([1, 2]) }]);
  writeSafetensors(path.join(dir, "model-00002-of-00002.safetensors"), [{ name: "b", dtype: "F32", shape: [1], data: new Float32Array([3]) }]);
  writeSafetensorsIndex(dir, { a: "model-00001-of-00002.safetensors", b: "model-00002-of-00002.safetensors" }, 12);
  const st = readSafetensors(dir);
  assert.deepEqual(st.tensors.map((t) => t.name).sort(), ["a", "b"]);
  assert.deepEqual(st.loadAsFloat32("b"), new Float32Array([3]));
  assert.ok(st.get("b")!.file.endsWith("model-00002-of-00002.safetensors"));
  st.close();
  writeSafetensorsIndex(dir, { a: "model-00001-of-00002.safetensors", c: "model-00002-of-00002.safetensors" }, 12);
  assert.throws(() => readSafetensors(dir), (e: unknown) => e instanceof ModelFormatError && /"c"/.test(e.message));
});

/** Writes a raw safetensors file: header JSON (or raw bytes) and a data region of `dataLen` bytes. */
function rawFile(name: string, header: string | Uint8Array, dataLen: number, lenOverride?: bigint): string {
  const file = path.join(tmp, name);
  const h = typeof header === "string" ? new TextEncoder().encode(header) : header;
  const buf = new Uint8Array(8 + h.length + dataLen);
  new DataView(buf.buffer).setBigUint64(0, lenOverride ?? BigInt(h.length), true);
  buf.set(h, 8);
  fs.writeFileSync(file, buf);
  return file;
}

const malformed: [string, () => string, RegExp][] = [
  ["truncated file", () => { const f = path.join(tmp, "trunc.safetensors"); fs.writeFileSync(f, new Uint8Array(5)); return f; }, /too short/],
  ["header length huge", () => rawFile("huge.safetensors", "{}", 0, 1n << 62n), /exceeds/],
  ["header length past EOF", () => rawFile("past.safetensors", "{}", 0, 1000n), /past the end/],
  ["header not JSON", () => rawFile("notjson.safetensors", "{not json", 0), /not valid UTF-8 JSON/],
  ["header not an object", () => rawFile("array.safetensors", "[1,2]", 0), /not an object/],
  ["offsets out of range", () => rawFile("oob.safetensors", JSON.stringify({ w: { dtype: "F32", shape: [4], data_offsets: [0, 16] } }), 8), /"w".*outside/],
  ["overlapping tensors", () => rawFile("overlap.safetensors", JSON.stringify({ a: { dtype: "F32", shape: [2], data_offsets: [0, 8] }, b: { dtype: "F32", shape: [2], data_offsets: [4, 12] } }), 12), /overlaps/],
  ["dtype/shape/length mismatch", () => rawFile("mismatch.safetensors", JSON.stringify({ w: { dtype: "F16", shape: [3], data_offsets: [0, 8] } }), 8), /"w".*byte length 8 != 6/],
  ["unknown dtype", () => rawFile("dtype.safetensors", JSON.stringify({ w: { dtype: "F12", shape: [1], data_offsets: [0, 2] } }), 2), /unknown dtype "F12"/],
  ["negative shape", () => rawFile("negshape.safetensors", JSON.stringify({ w: { dtype: "U8", shape: [-1], data_offsets: [0, 1] } }), 1), /shape/],
  ["huge shape", () => rawFile("hugeshape.safetensors", JSON.stringify({ w: { dtype: "F32", shape: [1e15, 1e15], data_offsets: [0, 4] } }), 4), /byte length/],
  ["bad metadata", () => rawFile("meta.safetensors", JSON.stringify({ __metadata__: { a: 1 } }), 0), /__metadata__/],
  ["invalid UTF-8 header", () => rawFile("utf8.safetensors", new Uint8Array([0x7b, 0xff, 0x7d]), 0), /UTF-8/],
];
for (const [label, make, re] of malformed) {
  test(`malformed safetensors: ${label}`, () => {
    const file = make();
    const t0 = Date.now();
    assert.throws(() => readSafetensors(file), (e: unknown) => e instanceof ModelFormatError && e.message.includes(file) && re.test(e.message));
    assert.ok(Date.now() - t0 < 1000);
  });
}

test("writeSafetensors rejects a data/shape mismatch", () => {
  assert.throws(() => writeSafetensors(path.join(tmp, "bad.safetensors"), [{ name: "w", dtype: "F32", shape: [3], data: new Float32Array(2) }]), ModelFormatError);
});
