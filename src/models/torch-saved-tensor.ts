// One dense float tensor from the bytes torch.save() writes (vLLM's prompt_embeds arrive so, base64-encoded): read by
// util/torch-archive.ts (data.pkl run by a machine that knows only a tensor rebuild, as torch.load(weights_only=True);
// the view bounds-checked against its storage), widened to float32.
import { bf16BitsToF32, f16BitsToF32 } from "../backends/dtype.js";
import { gatherView, readTorchArchive } from "../util/torch-archive.js";
import { isTensorRef, TorchFileError } from "../util/torch-pickle.js";

export { TorchFileError };

export type TorchFloatDtype = "float32" | "bfloat16" | "float16";

/** A dense tensor read from a torch.save file: its values as float32, row-major. */
export interface TorchSavedTensor {
  dtype: TorchFloatDtype;
  shape: number[];
  data: Float32Array;
}

const FLOAT_DTYPES: Record<string, TorchFloatDtype> = { F32: "float32", BF16: "bfloat16", F16: "float16" };

/**
 * The tensor torch.save wrote into `bytes`, as float32 values in row-major order (a strided view is gathered; bfloat16
 * and float16 widen exactly).
 * @example const { shape, data } = readTorchSavedTensor(Buffer.from(body.prompt_embeds, "base64"));
 */
export function readTorchSavedTensor(bytes: Uint8Array): TorchSavedTensor {
  const archive = readTorchArchive(bytes);
  const t = archive.value;
  if (!isTensorRef(t)) throw new TorchFileError("the file holds something other than one tensor");
  const dtype = FLOAT_DTYPES[t.storage.dtype];
  if (dtype === undefined) throw new TorchFileError(`${t.storage.dtype} tensors are not read: only float32, bfloat16 and float16`);
  const raw = gatherView(t, archive.storage(t.storage.key), dtype === "float32" ? 4 : 2);
  const view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
  const data = new Float32Array(raw.length / (dtype === "float32" ? 4 : 2));
  for (let i = 0; i < data.length; i++)
    data[i] = dtype === "float32" ? view.getFloat32(4 * i, true) : (dtype === "bfloat16" ? bf16BitsToF32 : f16BitsToF32)(view.getUint16(2 * i, true));
  return { dtype, shape: [...t.size], data };
}
