// PyTorch checkpoints (pytorch_model.bin, its shards by pytorch_model.bin.index.json, a PEFT adapter_model.bin): the
// state dict torch.save wrote, opened lazily behind the safetensors handle's interface, so the loaders read it as they
// read safetensors. Each tensor is located inside its zip archive (torch stores entries uncompressed, so a tensor's
// bytes are a range of the file: memory-mapped like a safetensors tensor's); the pickle is run by torch-pickle.ts
// (weights_only's rules). Tensors must be contiguous views of their storage (state dicts are); tied weights share one
// storage and are read twice.
import * as fs from "node:fs";
import * as path from "node:path";
import { isTensorRef, TorchFileError, unpickleTorch, type PickleValue } from "../../util/torch-pickle.js";
import { readZipDirectory, ZipFormatError } from "../../util/zip-directory.js";
import {
  ModelFormatError, SAFETENSORS_DTYPE_SIZE, toFloat32, type SafetensorsDtype, type SafetensorsHandle, type SafetensorsTensorInfo,
} from "./safetensors.js";

const INDEX_FILE = "pytorch_model.bin.index.json";

function readRange(fd: number, position: number, length: number): Uint8Array {
  const out = new Uint8Array(length);
  let done = 0;
  while (done < length) {
    const n = fs.readSync(fd, out, done, length - done, position + done);
    if (n === 0) throw new ZipFormatError(`unexpected end of file at byte ${position + done}`);
    done += n;
  }
  return out;
}

/** One .bin file's tensors as safetensors-style entries (the file's byte ranges). */
function fileTensors(file: string): SafetensorsTensorInfo[] {
  const fail = (why: string, tensor?: string): never => {
    throw new ModelFormatError(`[pytorch] ${file}${tensor ? ` (${tensor})` : ""}: ${why}`, file, tensor);
  };
  const fd = fs.openSync(file, "r");
  try {
    const size = fs.fstatSync(fd).size;
    if (size > 0 && readRange(fd, 0, 1)[0] === 0x80) fail("the legacy (pre-1.6, non-zip) torch.save format is not read: save it again with a recent torch, or as safetensors");
    const entries = readZipDirectory((at, n) => readRange(fd, at, n), size);
    const pkl = [...entries.keys()].find((n) => n === "data.pkl" || n.endsWith("/data.pkl")) ?? fail("no data.pkl: not a torch.save archive");
    const prefix = pkl.slice(0, pkl.length - "data.pkl".length);
    const order = entries.get(`${prefix}byteorder`);
    if (order !== undefined && new TextDecoder().decode(readRange(fd, order.offset, order.size)).trim() !== "little") fail("big-endian checkpoints are not read");
    const pklEntry = entries.get(pkl)!;
    if (pklEntry.method !== 0) fail("a compressed data.pkl is not read");
    const state = unpickleTorch(readRange(fd, pklEntry.offset, pklEntry.size));
    if (!(state instanceof Map)) fail("the file holds no state dict (a dict of tensors)");
    const out: SafetensorsTensorInfo[] = [];
    for (const [key, value] of state as Map<PickleValue, PickleValue>) {
      const name = typeof key === "string" ? key : fail(`a state dict key that is not a string: ${String(key)}`);
      if (!isTensorRef(value)) continue; // (non-tensor entries, e.g. a step count, are not weights)
      const dtype = value.storage.dtype;
      if (!(dtype in SAFETENSORS_DTYPE_SIZE)) fail(`a ${dtype} tensor is not read`, name);
      const bytes = SAFETENSORS_DTYPE_SIZE[dtype as SafetensorsDtype];
      const { size: shape, stride, offset } = value;
      // contiguous: stride[d] = product of the later sizes (size-1 dims may have any stride)
      let expect = 1;
      for (let d = shape.length - 1; d >= 0; d--) {
        if (shape[d] !== 1 && stride[d] !== expect) fail(`a non-contiguous view (size [${shape.join(", ")}], stride [${stride.join(", ")}]) is not read`, name);
        expect *= shape[d]!;
      }
      const numel = expect;
      if (offset < 0 || offset + numel > value.storage.numel) fail(`the view reaches past its storage of ${value.storage.numel} elements`, name);
      const entry = entries.get(`${prefix}data/${value.storage.key}`) ?? fail(`storage ${value.storage.key} is missing from the archive`, name);
      if (entry.method !== 0) fail("a compressed storage is not read", name);
      if ((offset + numel) * bytes > entry.size) fail("the storage entry is shorter than its tensor", name);
      out.push({ name, dtype: dtype as SafetensorsDtype, shape: [...shape], file, byteOffset: entry.offset + offset * bytes, byteLength: numel * bytes });
    }
    return out;
  } catch (e) {
    if (e instanceof ZipFormatError || e instanceof TorchFileError) throw new ModelFormatError(`[pytorch] ${file}: ${e.message}`, file);
    throw e;
  } finally {
    fs.closeSync(fd);
  }
}

/** The .bin files behind `p` (a .bin file, its index .json, or a directory holding either) and the index's map. */
function resolveFiles(p: string): { files: string[]; weightMap: Record<string, string> | null } {
  const stat = fs.statSync(p, { throwIfNoEntry: false });
  if (!stat) throw new ModelFormatError(`[pytorch] ${p}: no such file or directory`, p);
  let index = p.endsWith(".json") ? p : null;
  if (stat.isDirectory()) {
    if (fs.existsSync(path.join(p, INDEX_FILE))) index = path.join(p, INDEX_FILE);
    else if (fs.existsSync(path.join(p, "pytorch_model.bin"))) return { files: [path.join(p, "pytorch_model.bin")], weightMap: null };
    else throw new ModelFormatError(`[pytorch] ${p}: no pytorch_model.bin or ${INDEX_FILE}`, p);
  }
  if (index === null) return { files: [path.resolve(p)], weightMap: null };
  let parsed: { weight_map?: unknown };
  try {
    parsed = JSON.parse(fs.readFileSync(index, "utf8")) as { weight_map?: unknown };
  } catch (e) {
    throw new ModelFormatError(`[pytorch] ${index}: not valid JSON (${(e as Error).message})`, index);
  }
  const map = parsed.weight_map;
  if (map === null || typeof map !== "object" || Array.isArray(map)) throw new ModelFormatError(`[pytorch] ${index}: no weight_map object`, index);
  const weightMap: Record<string, string> = {};
  for (const [name, f] of Object.entries(map as Record<string, unknown>)) {
    if (typeof f !== "string" || f.includes("/") || f.includes("\\") || f === "." || f === "..")
      throw new ModelFormatError(`[pytorch] ${index}: weight_map entry of ${name} is not a file name: ${JSON.stringify(f)}`, index, name);
    weightMap[name] = path.join(path.dirname(index), f);
  }
  return { files: [...new Set(Object.values(weightMap))].sort(), weightMap };
}

/**
 * Opens a PyTorch checkpoint with the safetensors handle's interface (`p`: a .bin file, pytorch_model.bin.index.json,
 * or a directory holding either).
 * @example const h = readTorchCheckpoint("/models/gpt2"); h.loadAsFloat32("transformer.wte.weight");
 */
export function readTorchCheckpoint(p: string): SafetensorsHandle {
  const { files, weightMap } = resolveFiles(p);
  const byName = new Map<string, SafetensorsTensorInfo>();
  for (const file of files) {
    for (const t of fileTensors(file)) {
      if (weightMap && weightMap[t.name] !== file) continue;
      if (byName.has(t.name)) throw new ModelFormatError(`[pytorch] ${file}: tensor ${t.name} is also in ${byName.get(t.name)!.file}`, file, t.name);
      byName.set(t.name, t);
    }
  }
  for (const [name, file] of Object.entries(weightMap ?? {}))
    if (!byName.has(name)) throw new ModelFormatError(`[pytorch] ${file}: tensor ${name}, listed in the index, is missing`, file, name);
  const info = (name: string) => byName.get(name) ?? (() => {
    throw new ModelFormatError(`[pytorch] ${p}: no tensor named "${name}"`, p, name);
  })();
  const load = (name: string): Uint8Array => {
    const t = info(name);
    const fd = fs.openSync(t.file, "r");
    try {
      return readRange(fd, t.byteOffset, t.byteLength);
    } finally {
      fs.closeSync(fd);
    }
  };
  return {
    tensors: [...byName.values()],
    metadata: {},
    get: (name) => byName.get(name),
    has: (name) => byName.has(name),
    load,
    loadAsFloat32: (name) => toFloat32(load(name), info(name).dtype),
    close: () => undefined,
  };
}
