// torch.save / torch.load for Kiln tensors: a tensor or a state dict (name -> tensor) written in torch's own format, so
// Python's torch.load(weights_only=True) reads Kiln's files and Kiln reads torch's (util/torch-pickle.ts: only tensor
// rebuilds and state dicts, never arbitrary code). Views are gathered on load; every index a view reaches is checked.
import * as fs from "node:fs";
import { DTYPE_BYTES, type DType } from "../backends/dtype.js";
import { isTensorRef, TorchFileError, unpickleTorch, type PickleValue, type TensorRef } from "../util/torch-pickle.js";
import { torchSaveBytes, type TorchTensorBytes } from "../util/torch-save-format.js";
import { readZipDirectory, ZipFormatError } from "../util/zip-directory.js";
import { resolveDevice, type DeviceLike } from "./device.js";
import { contiguous } from "./ops/shape.js";
import { fromBytes, Tensor } from "./tensor.js";

/** Each Kiln dtype's torch storage class, and back (torch-pickle.ts names storages by safetensors dtype). */
const STORAGE_OF: Record<DType, string> = {
  float32: "FloatStorage", float16: "HalfStorage", bfloat16: "BFloat16Storage", float8_e4m3fn: "Float8_e4m3fnStorage",
  float8_e5m2: "Float8_e5m2Storage", int8: "CharStorage", uint8: "ByteStorage", int32: "IntStorage", int64: "LongStorage", bool: "BoolStorage",
};
const DTYPE_OF: Record<string, DType> = {
  F32: "float32", F16: "float16", BF16: "bfloat16", F8_E4M3: "float8_e4m3fn", F8_E5M2: "float8_e5m2", I8: "int8", U8: "uint8", I32: "int32",
  I64: "int64", BOOL: "bool",
};

function tensorBytes(t: Tensor): TorchTensorBytes {
  const c = contiguous(t);
  const bytes = c.device.backend.read(c.storage.buffer, c.offset * DTYPE_BYTES[c.dtype], c.numel * DTYPE_BYTES[c.dtype]);
  if (c !== t) c.dispose();
  return { storage: STORAGE_OF[t.dtype], shape: [...t.shape], bytes };
}

/**
 * torch.save: writes a tensor, or a state dict (a Map or record of name -> tensor, e.g. `module.stateDict()`), in
 * torch's zip format (each tensor copied contiguous into a storage of its own).
 * @example kiln.save(model.stateDict(), "model.pt"); // python: torch.load("model.pt", weights_only=True)
 */
export function save(value: Tensor | ReadonlyMap<string, Tensor> | Readonly<Record<string, Tensor>>, file: string): void {
  if (value instanceof Tensor) {
    fs.writeFileSync(file, torchSaveBytes(tensorBytes(value)));
    return;
  }
  const entries = value instanceof Map ? [...(value as ReadonlyMap<string, Tensor>)] : Object.entries(value);
  const state = new Map<string, TorchTensorBytes>();
  for (const [name, t] of entries) {
    if (!(t instanceof Tensor)) throw new TorchFileError(`[save] ${name}: only tensors are saved, got ${typeof t}`);
    state.set(name, tensorBytes(t));
  }
  fs.writeFileSync(file, torchSaveBytes(state));
}

/** A tensor reference's elements gathered row-major from its storage's bytes (every index checked). */
function gather(ref: TensorRef, storage: Uint8Array, where: string): { dtype: DType; bytes: Uint8Array } {
  const dtype = DTYPE_OF[ref.storage.dtype];
  if (dtype === undefined) throw new TorchFileError(`${where}: ${ref.storage.dtype} tensors are not read`);
  const size = DTYPE_BYTES[dtype];
  const { size: shape, stride, offset } = ref;
  if (shape.length !== stride.length || shape.some((s) => s < 0) || stride.some((s) => s < 0) || offset < 0)
    throw new TorchFileError(`${where}: size [${shape.join(", ")}] and stride [${stride.join(", ")}] do not describe a view`);
  const numel = shape.reduce((a, b) => a * b, 1);
  const storageNumel = Math.min(ref.storage.numel, Math.floor(storage.length / size));
  const last = offset + shape.reduce((s, n, d) => s + (n > 0 ? (n - 1) * stride[d]! : 0), 0);
  if (numel > 0 && last >= storageNumel) throw new TorchFileError(`${where}: the view reaches element ${last} of a storage of ${storageNumel}`);
  const out = new Uint8Array(numel * size);
  const index = new Array<number>(shape.length).fill(0);
  for (let e = 0; e < numel; e++) {
    let k = offset;
    for (let d = 0; d < index.length; d++) k += index[d]! * stride[d]!;
    out.set(storage.subarray(k * size, (k + 1) * size), e * size);
    for (let d = index.length - 1; d >= 0; d--) {
      if (++index[d]! < shape[d]!) break;
      index[d] = 0;
    }
  }
  return { dtype, bytes: out };
}

/**
 * torch.load(weights_only=True): a tensor, or a state dict as a Map of name -> tensor, from a torch.save file (torch's
 * or kiln.save's). Anything else in the file (optimizer states, arbitrary objects) is refused.
 * @example const state = kiln.load("model.pt") as Map<string, Tensor>; model.loadStateDict(state);
 */
export function load(file: string, options: { device?: DeviceLike } = {}): Tensor | Map<string, Tensor> {
  const bytes = fs.readFileSync(file);
  if (bytes[0] === 0x80) throw new TorchFileError(`${file}: the legacy (pre-1.6, non-zip) torch.save format is not read`);
  let entries;
  try {
    entries = readZipDirectory((at, n) => bytes.subarray(at, at + n), bytes.length);
  } catch (e) {
    if (e instanceof ZipFormatError) throw new TorchFileError(`${file}: not a torch.save file: ${e.message}`);
    throw e;
  }
  const pkl = [...entries.keys()].find((n) => n === "data.pkl" || n.endsWith("/data.pkl"));
  if (pkl === undefined) throw new TorchFileError(`${file}: not a torch.save file (no data.pkl)`);
  const prefix = pkl.slice(0, pkl.length - "data.pkl".length);
  const read = (name: string): Uint8Array => {
    const e = entries.get(name);
    if (e === undefined) throw new TorchFileError(`${file}: ${name} is missing from the archive`);
    if (e.method !== 0) throw new TorchFileError(`${file}: ${name} is compressed (torch.save stores its entries)`);
    return bytes.subarray(e.offset, e.offset + e.size);
  };
  const order = entries.get(`${prefix}byteorder`);
  if (order !== undefined && new TextDecoder().decode(read(`${prefix}byteorder`)).trim() !== "little") throw new TorchFileError(`${file}: big-endian files are not read`);
  const device = resolveDevice(options.device);
  const toTensor = (v: PickleValue, where: string): Tensor => {
    if (!isTensorRef(v)) throw new TorchFileError(`${where}: holds something other than a tensor`);
    const { dtype, bytes: data } = gather(v, read(`${prefix}data/${v.storage.key}`), where);
    return fromBytes(data, dtype, v.size, { device });
  };
  const value = unpickleTorch(read(pkl));
  if (!(value instanceof Map)) return toTensor(value, file);
  const state = new Map<string, Tensor>();
  try {
    for (const [k, v] of value) {
      if (typeof k !== "string") throw new TorchFileError(`${file}: a state dict key that is not a string`);
      state.set(k, toTensor(v, `${file} (${k})`));
    }
  } catch (e) {
    for (const t of state.values()) t.dispose(); // nothing half-loaded stays allocated
    throw e;
  }
  return state;
}
