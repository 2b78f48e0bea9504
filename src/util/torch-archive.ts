// A torch.save archive held in memory (a tensor sent base64-encoded, a .pt file read whole): its zip entries (stored
// or deflated), data.pkl run by torch-pickle.ts, its storages by key, and the bounds-checked gather of a tensor view's
// elements from its storage. (Multi-gigabyte checkpoints are located in place instead: models/formats/torch-checkpoint.ts.)
import { inflateRawSync } from "node:zlib";
import { TorchFileError, unpickleTorch, type PickleValue, type TensorRef } from "./torch-pickle.js";
import { readZipDirectory, ZipFormatError } from "./zip-directory.js";

export interface TorchArchive {
  /** data.pkl's value: a tensor reference, a state dict (Map), ... */
  value: PickleValue;
  /** The bytes of storage `key` (<archive>/data/<key>). */
  storage(key: string): Uint8Array;
}

/** Opens the archive torch.save wrote into `bytes`; TorchFileError when it is not one (or is big-endian). */
export function readTorchArchive(bytes: Uint8Array): TorchArchive {
  const fail = (why: string): never => {
    throw new TorchFileError(`not a torch.save file: ${why}`);
  };
  if (bytes.length > 0 && bytes[0] === 0x80) fail("the legacy (pre-1.6, non-zip) format is not read; save with torch.save's default");
  let entries;
  try {
    entries = readZipDirectory((at, n) => (at >= 0 && at + n <= bytes.length ? bytes.subarray(at, at + n) : fail("a read past the end of the file")), bytes.length);
  } catch (e) {
    if (e instanceof ZipFormatError) fail(e.message);
    throw e;
  }
  const file = (name: string): Uint8Array | undefined => {
    const e = entries.get(name);
    if (e === undefined) return undefined;
    const raw = bytes.subarray(e.offset, e.offset + e.size);
    if (e.method === 0) return raw;
    if (e.method === 8) return new Uint8Array(inflateRawSync(raw));
    return fail(`${name}: zip compression method ${e.method} is not read`);
  };
  const pkl = [...entries.keys()].find((n) => n === "data.pkl" || n.endsWith("/data.pkl")) ?? fail("no data.pkl in the archive");
  const prefix = pkl.slice(0, pkl.length - "data.pkl".length);
  const order = file(`${prefix}byteorder`);
  if (order !== undefined && new TextDecoder().decode(order).trim() !== "little") throw new TorchFileError("big-endian torch.save files are not read");
  return {
    value: unpickleTorch(file(pkl)!),
    storage: (key) => file(`${prefix}data/${key}`) ?? fail(`storage ${key} is missing from the archive`),
  };
}

/**
 * A view's elements (`elementBytes` each) gathered row-major from its storage's bytes, after checking that every index
 * its size, stride and offset reach lies inside the storage.
 */
export function gatherView(ref: TensorRef, storage: Uint8Array, elementBytes: number): Uint8Array {
  const { size: shape, stride, offset } = ref;
  if (shape.length !== stride.length || shape.some((s) => s < 0) || stride.some((s) => s < 0) || offset < 0)
    throw new TorchFileError(`size [${shape.join(", ")}] and stride [${stride.join(", ")}] do not describe a view`);
  const numel = shape.reduce((a, b) => a * b, 1);
  const storageNumel = Math.min(ref.storage.numel, Math.floor(storage.length / elementBytes));
  const last = offset + shape.reduce((s, n, d) => s + (n > 0 ? (n - 1) * stride[d]! : 0), 0);
  if (numel > 0 && last >= storageNumel) throw new TorchFileError(`the view reaches element ${last} of a storage of ${storageNumel}`);
  const out = new Uint8Array(numel * elementBytes);
  const index = new Array<number>(shape.length).fill(0);
  for (let e = 0; e < numel; e++) {
    let k = offset;
    for (let d = 0; d < index.length; d++) k += index[d]! * stride[d]!;
    out.set(storage.subarray(k * elementBytes, (k + 1) * elementBytes), e * elementBytes);
    for (let d = index.length - 1; d >= 0; d--) {
      if (++index[d]! < shape[d]!) break;
      index[d] = 0;
    }
  }
  return out;
}
