// FP8 checkpoints, as vLLM reads them: config.json's quantization_config names the method, and each quantized
// Linear stores `weight` as F8_E4M3 [out, in] next to its scale, w = code * scale:
//   quant_method "fp8" (AutoFP8, llm-compressor's legacy format): `weight_scale`, one f32 per tensor ([] or [1]);
//     with weight_block_size [bn, bk] (DeepSeek-V3 style) `weight_scale_inv` [ceil(out/bn), ceil(in/bk)] instead;
//   quant_method "compressed-tensors", format "float-quantized", weights {num_bits: 8, type: "float"}: strategy
//     "tensor" (`weight_scale` [1]), "channel" ([out, 1]) or "block" (block_structure [bn, bk]).
// Per-tensor and per-channel weights load into Kiln's fp8 kernel as they are: the codes memory-mapped from the
// file, never dequantized, and one f32 scale per output row (a per-tensor scale repeated). Block-scaled weights
// have no per-row form, so they are dequantized on load to the model dtype, with a note. Activation scales
// (`input_scale`, static activation schemes) are ignored: the kernel is weight-only and reads f32 activations.
import { resolveDevice, type DeviceLike } from "../tensor/device.js";
import { tensor, type Tensor } from "../tensor/index.js";
import type { QuantizedWeight } from "../tensor/ops/linalg.js";
import { installQuantizedWeight } from "../nn/quantized-linear.js";
import { Linear } from "../nn/layers.js";
import type { Module } from "../nn/module.js";
import { tryLoadNativeKernels } from "../backends/cpu/native.js";
import { nativeTakesScheme } from "../backends/cpu/quant-reference.js";
import type { DType } from "../backends/dtype.js";
import { fp8BytesToF32 } from "./formats/dtype-convert.js";
import type { SafetensorsHandle } from "./formats/safetensors.js";
import { UnsupportedError } from "../util/errors.js";
import { mapOrRead, ModelLoadError } from "./loader.js";

export interface Fp8CheckpointFormat {
  method: "fp8" | "compressed-tensors";
  /** [rows, cols] of one scale block, or null for per-tensor / per-channel scales. */
  blockSize: [number, number] | null;
}

type Json = Record<string, unknown>;

const isObject = (x: unknown): x is Json => x !== null && typeof x === "object" && !Array.isArray(x);

function blockOf(x: unknown, where: string): [number, number] | null {
  if (x === null || x === undefined) return null;
  if (Array.isArray(x) && x.length === 2 && x.every((d) => Number.isInteger(d) && (d as number) > 0)) return [x[0] as number, x[1] as number];
  throw new ModelLoadError(`${where} must be [rows, cols] of positive integers, got ${JSON.stringify(x)}`);
}

/**
 * The FP8 layout config.json declares, null for an unquantized checkpoint. Throws UnsupportedError for the
 * quantization methods Kiln does not read (GPTQ, AWQ, bitsandbytes, ...), which would otherwise load wrong weights.
 */
export function fp8CheckpointFormat(config: Json): Fp8CheckpointFormat | null {
  const qc = config.quantization_config;
  if (qc === undefined || qc === null) return null;
  if (!isObject(qc)) throw new ModelLoadError(`config.json: quantization_config must be an object`);
  const method = qc.quant_method;
  const unsupported = (what: string) =>
    new UnsupportedError("load", `${what} checkpoints are not supported on cpu (Kiln reads quant_method "fp8" and compressed-tensors 8-bit float weights; GGUF Q8_0 / Q4_0 files; or quantizes on load with --quantization)`);
  if (method === "fp8") return { method, blockSize: blockOf(qc.weight_block_size, "quantization_config.weight_block_size") };
  if (method !== "compressed-tensors") throw unsupported(`quant_method ${JSON.stringify(method)}`);
  const groups = isObject(qc.config_groups) ? Object.values(qc.config_groups) : [];
  const weights = groups.map((g) => (isObject(g) && isObject(g.weights) ? g.weights : null));
  if (weights.length === 0 || weights.some((w) => w === null || w.type !== "float" || w.num_bits !== 8))
    throw unsupported(`compressed-tensors (format ${JSON.stringify(qc.format)}, weights other than 8-bit float)`);
  const block = weights.find((w) => w!.strategy === "block");
  for (const w of weights)
    if (!["tensor", "channel", "block"].includes(String(w!.strategy))) throw unsupported(`compressed-tensors fp8 with strategy ${JSON.stringify(w!.strategy)}`);
  return { method, blockSize: block ? blockOf(block.block_structure, "compressed-tensors block_structure") : null };
}

/**
 * Loads the F8_E4M3 Linear weights of an FP8 checkpoint into `model`. take(name) handles one parameter (true) or
 * leaves it to the float path (false: not an fp8 Linear weight).
 */
export function fp8WeightLoader(handle: SafetensorsHandle, model: Module, format: Fp8CheckpointFormat, dtype: DType, device: DeviceLike | undefined, note: (m: string) => void) {
  const dev = resolveDevice(device);
  const native = dev.backend.name === "cpu" ? tryLoadNativeKernels() : null;
  const direct = format.blockSize === null && native !== null && nativeTakesScheme(native, "fp8");
  const linears = new Map<string, [string, Linear]>();
  for (const [name, m] of model.namedModules()) if (m instanceof Linear) linears.set(`${name}.weight`, [name, m]);
  const dequantized: string[] = [];
  let quantized = 0;

  return {
    take(name: string): boolean {
      const info = handle.get(name);
      const entry = linears.get(name);
      if (info === undefined || info.dtype !== "F8_E4M3" || entry === undefined) return false;
      const [moduleName, layer] = entry;
      const [n, k] = [layer.outFeatures, layer.inFeatures];
      if (info.shape.length !== 2 || info.shape[0] !== n || info.shape[1] !== k)
        throw new ModelLoadError(`${name} is [${info.shape.join(", ")}], the model's layer is [${n}, ${k}]`);
      const scales = fp8Scales(handle, name, n, k, format);
      if (!direct) {
        const w = dequantizeFp8(handle.load(name), scales, n, k, format);
        const f = tensor(w, { shape: [n, k], device: dev });
        model.setParameter(name, dtype === "float32" ? f : castAndFree(f, dtype));
        dequantized.push(name);
        return true;
      }
      const data = mapOrRead(handle, name, "uint8", [n, k], dev);
      const q: QuantizedWeight = { scheme: "fp8", outFeatures: n, inFeatures: k, data, scales: tensor(scales, { device: dev }), rowSums: null };
      installQuantizedWeight(model, moduleName, layer, q);
      quantized++;
      return true;
    },
    finish(where: string): void {
      if (dequantized.length > 0) {
        const why = format.blockSize !== null ? `block-scaled fp8 ([${format.blockSize.join(", ")}] blocks; the fp8 kernel takes one scale per row)` : "fp8 (no native fp8 kernel on this device)";
        note(`[load] ${where}: ${dequantized.length} ${why} weight(s) dequantized to ${dtype}: ${dequantized.slice(0, 3).join(", ")}${dequantized.length > 3 ? ", ..." : ""}`);
      }
    },
    /** "fp8" once any weight runs the fp8 kernel. */
    scheme: (): "fp8" | null => (quantized > 0 ? "fp8" : null),
  };
}

/** The scales of F8_E4M3 weight `name` [n, k]: one per block, or one per row (a per-tensor scale repeated). */
function fp8Scales(handle: SafetensorsHandle, name: string, n: number, k: number, format: Fp8CheckpointFormat): Float32Array {
  const scaleName = [`${name}_scale`, `${name}_scale_inv`].find((s) => handle.has(s));
  if (scaleName === undefined) throw new ModelLoadError(`${name} is F8_E4M3 but the checkpoint has no ${name}_scale (or _scale_inv)`);
  const s = handle.loadAsFloat32(scaleName);
  if (format.blockSize !== null) {
    const [bn, bk] = format.blockSize;
    const want = Math.ceil(n / bn) * Math.ceil(k / bk);
    if (s.length !== want) throw new ModelLoadError(`${scaleName} has ${s.length} scales; blocks of [${bn}, ${bk}] over [${n}, ${k}] need ${want}`);
    return s;
  }
  if (s.length === 1) return new Float32Array(n).fill(s[0]!);
  if (s.length === n) return s;
  throw new ModelLoadError(`${scaleName} has ${s.length} scales; [${n}, ${k}] takes 1 (per tensor) or ${n} (per channel)`);
}

/** f32 weights from codes and per-row or per-block scales. */
function dequantizeFp8(codes: Uint8Array, scales: Float32Array, n: number, k: number, format: Fp8CheckpointFormat): Float32Array {
  const w = fp8BytesToF32(codes, "e4m3fn");
  const [bn, bk] = format.blockSize ?? [1, k];
  const cols = Math.ceil(k / bk);
  for (let r = 0; r < n; r++)
    for (let c = 0; c < k; c++) w[r * k + c]! *= scales[Math.floor(r / bn) * cols + Math.floor(c / bk)]!;
  return w;
}

/**
 * An FP8 checkpoint's tensor as f32: an F8_E4M3 [n, k] weight dequantized (code * its scale), as llama.cpp's
 * convert_hf_to_gguf reads one; any other tensor as stored.
 */
export function loadFp8CheckpointTensor(handle: SafetensorsHandle, name: string, format: Fp8CheckpointFormat): Float32Array {
  const info = handle.get(name);
  if (info?.dtype !== "F8_E4M3") return handle.loadAsFloat32(name);
  if (info.shape.length !== 2) throw new ModelLoadError(`${name} is F8_E4M3 [${info.shape.join(", ")}]; fp8 weights are [out, in]`);
  const [n, k] = info.shape as [number, number];
  return dequantizeFp8(handle.load(name), fp8Scales(handle, name, n, k, format), n, k, format);
}

/** An FP8 checkpoint's scale tensors (weight scales, folded into their weights; activation scales, unused). */
export function isFp8ScaleTensor(name: string): boolean {
  return /\.(weight_scale|weight_scale_inv|input_scale)$/.test(name);
}

function castAndFree(f: Tensor, dtype: DType): Tensor {
  const c = f.to(dtype);
  f.dispose();
  return c;
}
