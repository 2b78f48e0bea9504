// torch.save / torch.load for Kiln tensors: a tensor or a state dict (name -> tensor) written in torch's own format, so
// Python's torch.load(weights_only=True) reads Kiln's files and Kiln reads torch's (util/torch-pickle.ts: only tensor
// rebuilds and state dicts, never arbitrary code). Views are gathered on load; every index a view reaches is checked.
import * as fs from "node:fs";
import { DTYPE_BYTES, type DType } from "../backends/dtype.js";
import { gatherView, readTorchArchive } from "../util/torch-archive.js";
import { isTensorRef, TorchFileError, type PickleValue } from "../util/torch-pickle.js";
import { torchSaveBytes, type TorchTensorBytes } from "../util/torch-save-format.js";
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

/**
 * torch.load(weights_only=True): a tensor, or a state dict as a Map of name -> tensor, from a torch.save file (torch's
 * or kiln.save's). Anything else in the file (optimizer states, arbitrary objects) is refused.
 * @example const state = kiln.load("model.pt") as Map<string, Tensor>; model.loadStateDict(state);
 */
export function load(file: string, options: { device?: DeviceLike } = {}): Tensor | Map<string, Tensor> {
  let archive;
  try {
    archive = readTorchArchive(fs.readFileSync(file));
  } catch (e) {
    if (e instanceof TorchFileError) throw new TorchFileError(`${file}: ${e.message}`);
    throw e;
  }
  const device = resolveDevice(options.device);
  const toTensor = (v: PickleValue, where: string): Tensor => {
    if (!isTensorRef(v)) throw new TorchFileError(`${where}: holds something other than a tensor`);
    const dtype = DTYPE_OF[v.storage.dtype];
    if (dtype === undefined) throw new TorchFileError(`${where}: ${v.storage.dtype} tensors are not read`);
    try {
      return fromBytes(gatherView(v, archive.storage(v.storage.key), DTYPE_BYTES[dtype]), dtype, v.size, { device });
    } catch (e) {
      if (e instanceof TorchFileError) throw new TorchFileError(`${where}: ${e.message}`);
      throw e;
    }
  };
  const value = archive.value;
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
