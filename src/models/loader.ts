// Loads a model the way vLLM does: a Hugging Face directory (or hub id) or a GGUF file, into a CausalLM,
// with its tokenizer and generation defaults. Weights are read tensor by tensor (never whole files).
import * as fs from "node:fs";
import * as path from "node:path";
import type { DType } from "../backends/dtype.js";
import type { QuantScheme } from "../backends/backend.js";
import { KilnError, UnsupportedError } from "../util/errors.js";
import { fromBytes, tensor, type DeviceLike, type Tensor } from "../tensor/index.js";
import { CausalLM, DEFAULT_FAMILY, type FamilySpec } from "./causal-lm.js";
import { parseHfConfig, type ModelConfig } from "./hf-config.js";
import { inspectModelDir } from "./model-dir.js";
import { ModelNotFoundError, resolveModel } from "./hub.js";
import { readSafetensors, type SafetensorsHandle } from "./formats/safetensors.js";
import { readGguf, type GgufFile } from "./formats/gguf.js";
import { ggufArchPermutesQK, ggufToHfConfig, ggufToHfTensorName, unpermuteQK } from "./formats/gguf-mapping.js";
import { ggufToTokenizerJson } from "./formats/gguf-tokenizer.js";
import { defaultQuantFilter, quantizeLinears, quantizeTiedHead } from "../nn/quantized-linear.js";
import { loadGenerationConfig, parseGenerationConfig, Tokenizer, type GenerationConfig } from "./tokenizer.js";

export class ModelLoadError extends KilnError {
  override name = "ModelLoadError";
}

export type DtypeArg = "auto" | "float32" | "bfloat16" | "float16" | "half" | "float" | "bf16";

/** What each architecture changes in the shared decoder (HF names of the MoE block and expert projections). */
export const FAMILIES: Record<ModelConfig["architecture"], FamilySpec> = {
  LlamaForCausalLM: DEFAULT_FAMILY,
  MistralForCausalLM: DEFAULT_FAMILY, // sliding window comes from the config
  Qwen2ForCausalLM: DEFAULT_FAMILY, // qkv bias comes from the config
  Qwen3ForCausalLM: DEFAULT_FAMILY, // q/k norm comes from the config
  MixtralForCausalLM: { moeModuleName: "block_sparse_moe", expertNames: ["w1", "w3", "w2"] },
  Qwen3MoeForCausalLM: { moeModuleName: "mlp", expertNames: ["gate_proj", "up_proj", "down_proj"] },
};

export interface LoadOptions {
  dtype?: DtypeArg;
  device?: DeviceLike;
  revision?: string;
  /**
   * vLLM's --quantization: weight-only int8 (per channel), int4 (groups of 32) or fp8 (e4m3, per channel) for
   * the decoder's linear layers, quantized on load; embeddings, norms and lm_head keep the model dtype.
   */
  quantization?: string | null;
  /**
   * With --quantization, also quantize the LM head (tied or not) per channel: int8 for int8/int4, fp8 for fp8
   * (as llama.cpp's Q8_0/Q4_0 exports do). Default true; false keeps it in the model dtype, as vLLM does.
   */
  quantizeLmHead?: boolean;
  /** Progress callback: (stage, fraction in [0, 1]). */
  onProgress?: (stage: string, fraction: number) => void;
}

export interface LoadedModel {
  model: CausalLM;
  /** Weight quantization applied on load (null: none). */
  quantization?: QuantScheme | null;
  config: ModelConfig;
  tokenizer: Tokenizer;
  generationConfig: GenerationConfig | null;
  /** The directory or GGUF file the weights came from. */
  path: string;
  dtype: DType;
}

/**
 * vLLM's --dtype: auto = the checkpoint's torch_dtype. CPU kernels compute in float32 and read float32 or
 * bfloat16 weights; float16 checkpoints under auto run in float32 (more accurate, no fp16 GEMM on cpu).
 */
export function resolveDtype(arg: DtypeArg, config: ModelConfig): DType {
  switch (arg) {
    case "auto":
      return config.torchDtype === "bfloat16" ? "bfloat16" : "float32";
    case "float32":
    case "float":
      return "float32";
    case "bfloat16":
    case "bf16":
      return "bfloat16";
    case "float16":
    case "half":
      throw new UnsupportedError("load", "--dtype float16 is not supported on cpu (no fp16 matmul kernels); use bfloat16 or float32");
    default:
      throw new ModelLoadError(`unknown --dtype "${String(arg)}" (expected auto, float32, bfloat16, float16)`);
  }
}

const QUANT_SCHEMES: readonly QuantScheme[] = ["int8", "int4", "fp8"];

/** Validates --quantization: null/undefined = none; int8, int4 and fp8 run on cpu; other vLLM methods throw. */
export function resolveQuantization(arg: string | null | undefined): QuantScheme | null {
  if (arg === null || arg === undefined || arg === "" || arg === "none") return null;
  if ((QUANT_SCHEMES as readonly string[]).includes(arg)) return arg as QuantScheme;
  throw new UnsupportedError("load", `--quantization ${arg} is not supported on cpu (supported: ${QUANT_SCHEMES.join(", ")})`);
}

/** Applies --quantization to a loaded model in place. */
function applyQuantization(loaded: LoadedModel, options: LoadOptions): LoadedModel {
  const scheme = resolveQuantization(options.quantization);
  if (!scheme) return { ...loaded, quantization: null };
  const headScheme: QuantScheme = scheme === "fp8" ? "fp8" : "int8";
  const withHead = options.quantizeLmHead ?? true;
  quantizeLinears(loaded.model, scheme, {
    filter: (name) => (name === "lm_head" ? withHead : defaultQuantFilter(name)),
    schemeFor: (name) => (name === "lm_head" ? headScheme : scheme),
    onProgress: (d, t) => options.onProgress?.(`quantizing weights (${scheme})`, d / t),
  });
  if (withHead && loaded.model.lmHead === null) quantizeTiedHead(loaded.model.model.embedTokens.weight, headScheme);
  return { ...loaded, quantization: scheme };
}

/** Norms, biases and rotary tables stay float32; matrices take the model dtype. */
function paramDtype(name: string, modelDtype: DType): DType {
  return name.endsWith("norm.weight") || name.endsWith(".bias") ? "float32" : modelDtype;
}

const SAFETENSORS_TO_DTYPE: Record<string, DType | undefined> = { F32: "float32", BF16: "bfloat16" };

function tensorFromSafetensors(h: SafetensorsHandle, name: string, want: DType, device: DeviceLike): Tensor {
  const info = h.get(name)!;
  if (SAFETENSORS_TO_DTYPE[info.dtype] === want) return fromBytes(h.load(name), want, info.shape, { device });
  const f = tensor(h.loadAsFloat32(name), { shape: info.shape, device });
  if (want === "float32") return f;
  const cast = f.to(want);
  f.dispose();
  return cast;
}

/** Loads a model from a local directory, a .gguf file, or a hub id in the local cache. */
export async function loadModel(idOrPath: string, options: LoadOptions = {}): Promise<LoadedModel> {
  resolveQuantization(options.quantization); // fail before reading weights
  const resolved = await resolveModel(idOrPath, { revision: options.revision });
  return applyQuantization(resolved.kind === "gguf" ? loadGguf(resolved.path, options) : loadHfDir(resolved.path, options), options);
}

/** Loads a local directory or .gguf file synchronously (vLLM's `LLM(model=...)` is synchronous too). */
export function loadLocalModel(p: string, options: LoadOptions = {}): LoadedModel {
  const stat = fs.statSync(p, { throwIfNoEntry: false });
  if (!stat) throw new ModelNotFoundError(`model path ${path.resolve(p)} does not exist`, path.resolve(p));
  resolveQuantization(options.quantization);
  return applyQuantization(stat.isFile() ? loadGguf(p, options) : loadHfDir(p, options), options);
}

function readJson(file: string): Record<string, unknown> {
  try {
    return JSON.parse(fs.readFileSync(file, "utf8")) as Record<string, unknown>;
  } catch (e) {
    throw new ModelLoadError(`${file}: ${(e as Error).message}`);
  }
}

function loadHfDir(dir: string, options: LoadOptions): LoadedModel {
  const info = inspectModelDir(dir);
  if (!info.configPath) throw new ModelLoadError(`${dir}: no config.json`);
  if (!info.weights) throw new ModelLoadError(`${dir}: no model.safetensors (or shards) found`);
  if (info.weights.format === "gguf") return loadGguf(info.weights.files[0]!, options, dir);
  // before reading any weights: a model without its tokenizer fails fast
  if (!info.tokenizerJsonPath) throw new ModelLoadError(`${dir}: no tokenizer.json`);
  const config = parseHfConfig(readJson(info.configPath));
  const dtype = resolveDtype(options.dtype ?? "auto", config);
  const handle = readSafetensors(info.weights.indexPath ?? info.weights.files[0]!);
  try {
    const model = new CausalLM(config, { dtype, device: options.device, family: FAMILIES[config.architecture] });
    const names = model.namedParameters().map(([n]) => n);
    const missing = names.filter((n) => !handle.has(n));
    if (missing.length) throw new ModelLoadError(`${dir}: checkpoint lacks ${missing.length} parameters, e.g. ${missing.slice(0, 4).join(", ")}`);
    names.forEach((n, i) => {
      const t = tensorFromSafetensors(handle, n, paramDtype(n, dtype), options.device);
      model.setParameter(n, t);
      options.onProgress?.("loading weights", (i + 1) / names.length);
    });
    const tokenizer = Tokenizer.fromDir(dir);
    return { model, config, tokenizer, generationConfig: loadGenerationConfig(dir), path: dir, dtype };
  } finally {
    handle.close();
  }
}

function loadGguf(file: string, options: LoadOptions, tokenizerDir?: string): LoadedModel {
  const g: GgufFile = readGguf(file);
  try {
    const hfConfig = ggufToHfConfig(g.metadata, g.tensors.map((t) => t.name));
    const config = parseHfConfig(hfConfig);
    const dtype = resolveDtype(options.dtype ?? "auto", config);
    const arch = String(g.metadata["general.architecture"] ?? "");
    const family = config.architecture === "MixtralForCausalLM" ? "mixtral" : "default";
    const model = new CausalLM(config, { dtype, device: options.device, family: FAMILIES[config.architecture] });
    const wanted = new Set(model.namedParameters().map(([n]) => n));
    const loaded = new Set<string>();
    g.tensors.forEach((info, i) => {
      const hfName = ggufToHfTensorName(info.name, family);
      if (hfName === null) return; // e.g. rope_freqs: recomputed from the config
      let data = g.loadAsFloat32(info.name);
      const rows = info.shape[0]!;
      if (ggufArchPermutesQK(arch) && /self_attn\.(q|k)_proj\.weight$/.test(hfName)) {
        const isK = hfName.includes("k_proj");
        data = unpermuteQK(data, rows, config.numAttentionHeads, isK ? config.numKeyValueHeads : undefined);
      }
      const put = (name: string, values: Float32Array, shape: number[]) => {
        if (!wanted.has(name)) {
          if (name === "lm_head.weight" && config.tieWordEmbeddings) return;
          throw new ModelLoadError(`${file}: tensor ${info.name} maps to unknown parameter ${name}`);
        }
        const f = tensor(values, { shape, device: options.device });
        const want = paramDtype(name, dtype);
        model.setParameter(name, want === "float32" ? f : f.to(want));
        if (want !== "float32") f.dispose();
        loaded.add(name);
      };
      if (hfName.includes("{expert}")) {
        // stacked experts [E, out, in] -> one matrix per expert
        const [E, ...rest] = info.shape as [number, ...number[]];
        const per = rest.reduce((a, b) => a * b, 1);
        for (let e = 0; e < E; e++) put(hfName.replace("{expert}", String(e)), data.slice(e * per, (e + 1) * per), rest);
      } else put(hfName, data, info.shape);
      options.onProgress?.("loading weights", (i + 1) / g.tensors.length);
    });
    const missing = [...wanted].filter((n) => !loaded.has(n));
    if (missing.length) throw new ModelLoadError(`${file}: GGUF lacks ${missing.length} parameters, e.g. ${missing.slice(0, 4).join(", ")}`);
    let tokenizer: Tokenizer;
    let generationConfig: GenerationConfig | null = null;
    if (tokenizerDir && fs.existsSync(path.join(tokenizerDir, "tokenizer.json"))) {
      tokenizer = Tokenizer.fromDir(tokenizerDir);
      generationConfig = loadGenerationConfig(tokenizerDir);
    } else {
      const files = ggufToTokenizerJson(g.metadata);
      const eos = (files.tokenizerConfig as { eos_token_id?: number }).eos_token_id;
      generationConfig = eos !== undefined ? parseGenerationConfig({ eos_token_id: eos }) : null;
      tokenizer = Tokenizer.fromJson(files.tokenizerJson, files.tokenizerConfig, { generationConfig: generationConfig?.raw ?? null });
    }
    return { model, config, tokenizer, generationConfig, path: file, dtype };
  } finally {
    g.close();
  }
}
