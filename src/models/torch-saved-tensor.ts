// One dense tensor from the bytes torch.save() writes (vLLM's prompt_embeds arrive so, base64-encoded): the zip's
// data.pkl run by formats/torch-pickle.ts (a tensor rebuild over a storage; no other globals, as
// torch.load(weights_only=True)), the storage read from <archive>/data/<key> (little-endian, <archive>/byteorder), and
// every index the view's strides reach checked against the storage, so a hostile file fails with a TorchFileError
// instead of reading out of bounds.
import { inflateRawSync } from "node:zlib";
import { bf16BitsToF32, f16BitsToF32 } from "../backends/dtype.js";
import { isTensorRef, TorchFileError, unpickleTorch } from "../util/torch-pickle.js";
import { readZipDirectory, ZipFormatError } from "../util/zip-directory.js";

export { TorchFileError };

export type TorchFloatDtype = "float32" | "bfloat16" | "float16";

/** A dense tensor read from a torch.save file: its values as float32, row-major. */
export interface TorchSavedTensor {
  dtype: TorchFloatDtype;
  shape: number[];
  data: Float32Array;
}

const FLOAT_DTYPES: Record<string, TorchFloatDtype> = { F32: "float32", BF16: "bfloat16", F16: "float16" };
const ELEMENT_BYTES: Record<TorchFloatDtype, number> = { float32: 4, bfloat16: 2, float16: 2 };

/** The archive's files by name (stored or deflated entries). */
function readZip(bytes: Uint8Array): Map<string, Uint8Array> {
  if (bytes.length > 0 && bytes[0] === 0x80) throw new TorchFileError("not a torch.save file: the legacy (pre-1.6, non-zip) format is not read; save with torch.save's default");
  let entries;
  try {
    entries = readZipDirectory((at, n) => {
      if (at < 0 || at + n > bytes.length) throw new ZipFormatError("a read past the end of the file");
      return bytes.subarray(at, at + n);
    }, bytes.length);
  } catch (e) {
    if (e instanceof ZipFormatError) throw new TorchFileError(`not a torch.save file: ${e.message}`);
    throw e;
  }
  const files = new Map<string, Uint8Array>();
  for (const e of entries.values()) {
    const raw = bytes.subarray(e.offset, e.offset + e.size);
    if (e.method === 0) files.set(e.name, raw);
    else if (e.method === 8) files.set(e.name, new Uint8Array(inflateRawSync(raw)));
    else throw new TorchFileError(`not a torch.save file: ${e.name}: zip compression method ${e.method} is not read`);
  }
  return files;
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
  const t = unpickleTorch(files.get(pkl)!);
  if (!isTensorRef(t)) throw new TorchFileError("the file holds something other than one tensor");
  const dt = FLOAT_DTYPES[t.storage.dtype];
  if (dt === undefined) throw new TorchFileError(`${t.storage.dtype} tensors are not read: only float32, bfloat16 and float16`);
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
