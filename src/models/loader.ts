// Loads a model the way vLLM does: a Hugging Face directory (or hub id) or a GGUF file, into a CausalLM,
// with its tokenizer and generation defaults. Weights are read tensor by tensor (never whole files).
import * as fs from "node:fs";
import * as path from "node:path";
import type { DType } from "../backends/dtype.js";
import type { QuantScheme } from "../backends/backend.js";
import { KilnError, UnsupportedError } from "../util/errors.js";
import { fromBytes, fromBytesFilled, mapFromFile, tensor, type DeviceLike, type Tensor } from "../tensor/index.js";
import { resolveDevice } from "../tensor/device.js";
import { CausalLM, DEFAULT_FAMILY, type FamilySpec } from "./causal-lm.js";
import { languageModelConfig, parseHfConfig, type ModelConfig } from "./hf-config.js";
import { fusedParts, hasFusedProjections, splitFusedProjections } from "./fused-weights.js";
import { inspectModelDir, openCheckpoint, type ModelWeights } from "./model-dir.js";
import { AbsentTokenizer, absentTokenizerOf } from "./absent-tokenizer.js";
import { ModelNotFoundError, resolveModel } from "./hub.js";
import type { SafetensorsHandle } from "./formats/safetensors.js";
import { readGguf, type GgufFile } from "./formats/gguf.js";
import { ggufArchPermutesQK, ggufFamilyOf, ggufNormShift, ggufToHfConfig, ggufToHfTensorName, hfToGgufTensorName, unpermuteQK } from "./formats/gguf-mapping.js";
import { ggufToTokenizerJson } from "./formats/gguf-tokenizer.js";
import { defaultQuantFilter, installQuantizedEmbedding, installQuantizedWeight, quantizeLinears, quantizeTiedHead } from "../nn/quantized-linear.js";
import { quantizeWeight, setQuantizedShadow, type QuantizedWeight } from "../tensor/ops/linalg.js";
import { Linear } from "../nn/layers.js";
import { narrowToShard, shardedParameters, TensorParallelError, type TensorParallel } from "../nn/parallel.js";
import { directKMultiple, fitsDirectKernel, GGUF_DIRECT_SCHEME, ggufDirectRowBytes, repackGgufBlocks, type GgufDirectType } from "./formats/gguf-repack.js";
import { tryLoadNativeKernels } from "../backends/cpu/native.js";
import { nativeTakesScheme } from "../backends/cpu/quant-reference.js";
import { isSuperBlockScheme, quantDataBytes, quantScaleCount, quantScaleDtype } from "../backends/quant-layout.js";
import { GgmlType } from "./formats/gguf-quant.js";
import { env } from "../util/env.js";
import { loadGenerationConfig, parseGenerationConfig, Tokenizer, type GenerationConfig } from "./tokenizer.js";
import { resolveQuantization } from "./quantization-args.js";
import { fp8CheckpointFormat, fp8WeightLoader } from "./fp8-checkpoint.js";
import { applyHfOverrides, loadFormatMismatch, type LoadFormat } from "./load-format.js";
import { dummyParameter } from "./dummy-weights.js";
import { gptOssExpertLoader, isMxfp4Checkpoint } from "./gpt-oss-experts.js";
import { loadGemma3Vision } from "./gemma3-vision-weights.js";
import type { Gemma3Vision } from "./siglip.js";

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
  GemmaForCausalLM: DEFAULT_FAMILY, // its differences come from the config (see causal-lm.ts)
  Gemma2ForCausalLM: DEFAULT_FAMILY, // its differences come from the config (see causal-lm.ts)
  Gemma3ForCausalLM: DEFAULT_FAMILY, // its differences come from the config (see causal-lm.ts)
  GraniteForCausalLM: DEFAULT_FAMILY, // Llama with its four multipliers, from the config
  Olmo2ForCausalLM: DEFAULT_FAMILY, // its norms' placement and q/k norms over whole projections come from the config
  Phi3ForCausalLM: DEFAULT_FAMILY, // Llama with q/k/v and gate/up stored fused (see fused-weights.ts)
  SmolLM3ForCausalLM: DEFAULT_FAMILY, // Llama with NoPE layers (ModelConfig.ropeLayers)
  MixtralForCausalLM: { moeModuleName: "block_sparse_moe", expertNames: ["w1", "w3", "w2"] },
  Qwen2MoeForCausalLM: { moeModuleName: "mlp", expertNames: ["gate_proj", "up_proj", "down_proj"] }, // shared expert: from the config
  Qwen3MoeForCausalLM: { moeModuleName: "mlp", expertNames: ["gate_proj", "up_proj", "down_proj"] },
  // experts stored fused (gate_up_proj, down_proj; bf16 or MXFP4) and read as these per-expert projections
  GptOssForCausalLM: { moeModuleName: "mlp", expertNames: ["gate_proj", "up_proj", "down_proj"], routerName: "router" },
};

export interface LoadOptions {
  dtype?: DtypeArg;
  device?: DeviceLike;
  revision?: string;
  /** vLLM's --download-dir: the hub cache a hub id is looked up in (and downloaded to); default HF_HUB_CACHE's. */
  downloadDir?: string;
  /**
   * vLLM's --load-format (load-format.ts): "auto" (default), "safetensors" or "gguf" (that format or an error), or
   * "dummy": random weights of the config's shapes (dummy-weights.ts), no tensor read (a directory's config.json and
   * tokenizer are still read).
   */
  loadFormat?: LoadFormat;
  /** vLLM's --hf-overrides: config.json keys over the model's (applyHfOverrides), before the model is built. */
  hfOverrides?: Record<string, unknown> | null;
  /** vLLM's --hf-config-path: a directory whose config.json is read instead of the model's (HF directories only). */
  hfConfigPath?: string;
  /** vLLM's --ignore-patterns: glob patterns of weight files in the model directory not read (model-dir.ts). */
  ignorePatterns?: readonly string[];
  /** vLLM's --hf-token: the token a hub id is downloaded with; default HF_TOKEN's. */
  hfToken?: string;
  /**
   * vLLM's --skip-tokenizer-init: no tokenizer.json is read; the model's tokenizer is an AbsentTokenizer of its
   * config's vocabulary size and EOS ids (prompts are token ids, outputs have no text). Default false.
   */
  skipTokenizer?: boolean;
  /**
   * vLLM's --quantization: weight-only int8 (per channel), int4 or mxfp4 (groups of 32) or fp8 (e4m3, per
   * channel) for the decoder's linear layers, quantized on load; embeddings, norms and lm_head keep the model dtype.
   */
  quantization?: string | null;
  /**
   * With --quantization, also quantize the LM head (tied or not) per channel: int8 for int8/int4/mxfp4, fp8 for fp8
   * (as llama.cpp's Q8_0/Q4_0 exports do). Default true; false keeps it in the model dtype, as vLLM does.
   */
  quantizeLmHead?: boolean;
  /**
   * GGUF Q4_0 / Q8_0 / Q4_K / MXFP4 tensors of linear layers (and of a tied LM head) load straight into the int4 /
   * int8_g32 / q4_k / mxfp4 kernels' layouts, bit for bit, as llama.cpp runs them. Default true unless `quantization`
   * is given (then every tensor is dequantized and quantized to that one scheme); false dequantizes every tensor.
   */
  ggufKeepQuantized?: boolean;
  /** Progress callback: (stage, fraction in [0, 1]). */
  onProgress?: (stage: string, fraction: number) => void;
  /** Notes about how weights were loaded (e.g. a quantized tensor that had to be dequantized); default console.warn. */
  onNote?: (message: string) => void;
  /** Build the tokenizer's encoder/decoder on first use (TokenizerOptions.deferBuild); default false. */
  deferTokenizerBuild?: boolean;
  /**
   * vLLM's --tokenizer: the directory to read tokenizer.json, tokenizer_config.json and the chat template from instead
   * of the model's; generation_config.json (defaults, EOS ids) stays the model's. Default: the model's.
   */
  tokenizer?: string;
  /**
   * Load this rank's shard for tensor parallelism (CausalLMOptions.tp): each column- / row-parallel parameter is cut
   * from the full checkpoint tensor as it is read. Hugging Face safetensors directories only, without --quantization.
   */
  tp?: TensorParallel | null;
  /** Read an image-text checkpoint's vision tower and projector (LoadedModel.vision); default true. */
  loadVision?: boolean;
}

export interface LoadedModel {
  model: CausalLM;
  /** Weight quantization applied on load, or kept from a quantized GGUF (null: none). */
  quantization?: QuantScheme | null;
  config: ModelConfig;
  tokenizer: Tokenizer;
  generationConfig: GenerationConfig | null;
  /** The directory or GGUF file the weights came from. */
  path: string;
  dtype: DType;
  /** An image-text checkpoint's vision tower and projector (Gemma3ForConditionalGeneration); absent: text only. */
  vision?: Gemma3Vision;
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

/**
 * Applies --quantization to a loaded model in place. The model is returned in eval mode (as from_pretrained); its
 * parameters are the tensors setParameter installed, which do not require grad (vLLM's requires_grad=False weights).
 */
function applyQuantization(loaded: LoadedModel, options: LoadOptions): LoadedModel {
  loaded.model.eval();
  const scheme = resolveQuantization(options.quantization);
  if (!scheme) return { ...loaded, quantization: loaded.quantization ?? null };
  const headScheme: QuantScheme = scheme === "fp8" ? "fp8" : "int8";
  const withHead = options.quantizeLmHead ?? true;
  const fellBack: string[] = [];
  quantizeLinears(loaded.model, scheme, {
    onFallback: (name) => fellBack.push(name),
    filter: (name) => (name === "lm_head" ? withHead : defaultQuantFilter(name)),
    schemeFor: (name) => (name === "lm_head" ? headScheme : scheme),
    onProgress: (d, t) => options.onProgress?.(`quantizing weights (${scheme})`, d / t),
  });
  if (withHead && loaded.model.lmHead === null) quantizeTiedHead(loaded.model.model.embedTokens.weight, headScheme);
  if (fellBack.length > 0)
    process.emitWarning(
      `Kiln: --quantization ${scheme}: ${fellBack.length} layer(s) whose in_features is not a multiple of 64 run int8 instead ` +
        `(${fellBack.slice(0, 4).join(", ")}${fellBack.length > 4 ? ", ..." : ""})`,
      "KilnWarning",
    );
  return { ...loaded, quantization: scheme };
}

/** Norms, biases and attention sinks stay float32; matrices take the model dtype. */
export function paramDtype(name: string, modelDtype: DType): DType {
  return name.endsWith("norm.weight") || name.endsWith(".bias") || name.endsWith(".sinks") ? "float32" : modelDtype;
}

const SAFETENSORS_TO_DTYPE: Record<string, DType | undefined> = { F32: "float32", BF16: "bfloat16" };

/** A stored tensor's bytes as `dtype`: memory-mapped in place where the device can, else read. */
export function mapOrRead(h: SafetensorsHandle, name: string, dtype: DType, shape: readonly number[], device: DeviceLike): Tensor {
  const info = h.get(name)!;
  return mapFromFile(info.file, info.byteOffset, dtype, shape, { device }) ?? fromBytes(h.load(name), dtype, shape, { device });
}

function tensorFromSafetensors(h: SafetensorsHandle, name: string, want: DType, device: DeviceLike): Tensor {
  const info = h.get(name)!;
  if (SAFETENSORS_TO_DTYPE[info.dtype] === want) return mapOrRead(h, name, want, info.shape, device);
  const f = tensor(h.loadAsFloat32(name), { shape: info.shape, device });
  if (want === "float32") return f;
  const cast = f.to(want);
  f.dispose();
  return cast;
}

/** Loads a model from a local directory, a .gguf file, or a hub id in the local cache. */
export async function loadModel(idOrPath: string, options: LoadOptions = {}): Promise<LoadedModel> {
  resolveQuantization(options.quantization); // fail before reading weights
  checkTpLoad(options);
  const resolved = await resolveModel(idOrPath, {
    revision: options.revision,
    ...(options.downloadDir !== undefined ? { cacheDir: options.downloadDir } : {}),
    ...(options.hfToken !== undefined ? { token: options.hfToken } : {}),
  });
  return applyQuantization(resolved.kind === "gguf" ? loadGguf(resolved.path, options) : loadHfDir(resolved.path, options), options);
}

/** Loads a local directory or .gguf file synchronously (vLLM's `LLM(model=...)` is synchronous too). */
export function loadLocalModel(p: string, options: LoadOptions = {}): LoadedModel {
  const stat = fs.statSync(p, { throwIfNoEntry: false });
  if (!stat) throw new ModelNotFoundError(`model path ${path.resolve(p)} does not exist`, path.resolve(p));
  resolveQuantization(options.quantization);
  checkTpLoad(options);
  return applyQuantization(stat.isFile() ? loadGguf(p, options) : loadHfDir(p, options), options);
}

/** What a tensor-parallel load cannot do yet, refused before any weight is read. */
function checkTpLoad(options: LoadOptions): void {
  if ((options.tp?.size ?? 1) > 1 && resolveQuantization(options.quantization) !== null)
    throw new TensorParallelError(`--quantization ${options.quantization} is not supported with tensor parallelism`);
}

function readJson(file: string): Record<string, unknown> {
  try {
    return JSON.parse(fs.readFileSync(file, "utf8")) as Record<string, unknown>;
  } catch (e) {
    throw new ModelLoadError(`${file}: ${(e as Error).message}`);
  }
}

function loadHfDir(dir: string, options: LoadOptions): LoadedModel {
  const info = inspectModelDir(dir, { ignorePatterns: options.ignorePatterns });
  const format = options.loadFormat ?? "auto";
  const configPath = options.hfConfigPath !== undefined ? path.join(options.hfConfigPath, "config.json") : info.configPath;
  if (!configPath) throw new ModelLoadError(`${dir}: no config.json`);
  if (!info.weights && format !== "dummy") throw new ModelLoadError(`${dir}: no model.safetensors (or shards) found`);
  const mismatch = info.weights ? loadFormatMismatch(format, info.weights.format) : null;
  if (mismatch !== null) throw new ModelLoadError(`${dir}: ${mismatch}`);
  if (info.weights?.format === "gguf") return loadGguf(info.weights.files[0]!, options, dir);
  // before reading any weights: a model without its tokenizer fails fast
  if (options.skipTokenizer !== true && (options.tokenizer === undefined ? !info.tokenizerJsonPath : !fs.existsSync(path.join(options.tokenizer, "tokenizer.json"))))
    throw new ModelLoadError(`${options.tokenizer ?? dir}: no tokenizer.json`);
  const rawConfig = applyHfOverrides(readJson(configPath), options.hfOverrides);
  const lm = languageModelConfig(rawConfig);
  const config = parseHfConfig(lm.config);
  const dtype = resolveDtype(options.dtype ?? "auto", config);
  const note = options.onNote ?? ((m: string) => console.warn(m));
  const dummy = format === "dummy";
  // OpenAI's MXFP4 gpt-oss checkpoints: only the experts are quantized (read by gptOssExpertLoader)
  const mxfp4Experts = !dummy && isMxfp4Checkpoint(rawConfig);
  if (mxfp4Experts && config.architecture !== "GptOssForCausalLM")
    throw new UnsupportedError("load", `${dir}: quant_method "mxfp4" checkpoints are read for gpt-oss (GptOssForCausalLM) only, not ${config.architecture}`);
  const fp8Format = mxfp4Experts ? null : fp8CheckpointFormat(rawConfig);
  if (fp8Format !== null && dummy) note(`[load] ${dir}: load_format "dummy": the random weights are not fp8 (pass --quantization fp8 for fp8 kernels)`);
  const requested = resolveQuantization(options.quantization);
  if (mxfp4Experts && requested !== null && requested !== "mxfp4")
    throw new UnsupportedError("load", `${dir} is an MXFP4 checkpoint: --quantization ${requested} cannot re-quantize it (omit --quantization, or pass mxfp4)`);
  if (fp8Format !== null && !dummy && (options.tp?.size ?? 1) > 1) throw new TensorParallelError(`${dir} is an fp8 checkpoint: not supported with tensor parallelism`);
  if (fp8Format !== null && !dummy && requested !== null && requested !== "fp8")
    throw new UnsupportedError("load", `${dir} is an fp8 checkpoint: --quantization ${requested} cannot re-quantize it (omit --quantization, or pass fp8)`);
  const file = dummy ? null : openCheckpoint(info.weights as Extract<ModelWeights, { indexPath: string | null }>);
  const handle = file === null ? null : textCheckpoint(file, lm.textWeights !== null, config, dir);
  try {
    // every parameter is assigned below (or the load fails), so none is allocated first
    const tp = options.tp ?? null;
    const model = new CausalLM(config, { dtype, device: options.device, family: FAMILIES[config.architecture], unallocatedParameters: true, tp });
    const names = model.namedParameters().map(([n]) => n);
    const shards = tp === null ? new Map() : shardedParameters(model);
    const fullShape = dummy ? fullParameterShapes(model, config) : null;
    const read = (n: string): Tensor => {
      const want = paramDtype(n, dtype);
      const full = handle ? tensorFromSafetensors(handle, n, want, options.device) : dummyParameter(n, fullShape!.get(n)!, want, config.normOffset, options.device);
      const spec = shards.get(n);
      if (spec === undefined) return full;
      const shard = narrowToShard(full, spec, n);
      full.dispose();
      return shard;
    };
    // gpt-oss: the per-expert projections come from the fused expert tensors (dummy weights: each expert's own)
    const experts = handle !== null && config.architecture === "GptOssForCausalLM" ? gptOssExpertLoader(handle, model, config, dtype, options.device, note) : null;
    const missing = handle ? names.filter((n) => !handle.has(n) && experts?.has(n) !== true) : [];
    if (missing.length) throw new ModelLoadError(`${dir}: checkpoint lacks ${missing.length} parameters, e.g. ${missing.slice(0, 4).join(", ")}`);
    const fp8 = fp8Format && handle ? fp8WeightLoader(handle, model, fp8Format, dtype, options.device, note) : null;
    try {
      names.forEach((n, i) => {
        if (fp8?.take(n) !== true && experts?.take(n) !== true) model.setParameter(n, read(n));
        options.onProgress?.(dummy ? "initialising dummy weights" : "loading weights", (i + 1) / names.length);
      });
    } finally {
      experts?.finish(dir);
    }
    fp8?.finish(dir);
    const generationConfig = loadGenerationConfig(dir);
    const tokenizer = options.skipTokenizer === true
      ? absentTokenizerOf(rawConfig, generationConfig?.raw ?? null)
      : Tokenizer.fromDir(options.tokenizer ?? dir, { deferBuild: options.deferTokenizerBuild, generationConfigDir: dir });
    // an image-text checkpoint's vision tower and projector (vLLM's --limit-mm-per-prompt '{"image": 0}' skips them)
    const vision = lm.textWeights !== null && options.loadVision !== false ? loadGemma3Vision(file, rawConfig, config.hiddenSize, dtype, options.device, dir) : null;
    return {
      model, config, tokenizer, generationConfig, path: dir, dtype, quantization: fp8?.scheme() ?? experts?.scheme() ?? null,
      ...(vision !== null ? { vision } : {}),
    };
  } finally {
    handle?.close();
  }
}

/** The checkpoint's tensors under the text model's names (an image-text checkpoint's), Phi-3's fused ones split. */
function textCheckpoint(file: SafetensorsHandle, imageText: boolean, config: ModelConfig, dir: string): SafetensorsHandle {
  const text = imageText ? languageModelWeights(file, dir) : file;
  // Phi-3 stores q/k/v and gate/up fused: read as the separate projections
  return hasFusedProjections(text) ? splitFusedProjections(text, config, dir) : text;
}

/** Every parameter's full shape (a tensor-parallel model's own are its shards'): from an unallocated whole model. */
function fullParameterShapes(model: CausalLM, config: ModelConfig): Map<string, readonly number[]> {
  if (model.tp === null) return new Map(model.namedParameters().map(([n, t]) => [n, t.shape]));
  const whole = new CausalLM(config, { family: FAMILIES[config.architecture], unallocatedParameters: true });
  const shapes = new Map(whole.namedParameters().map(([n, t]) => [n, [...t.shape]]));
  for (const [, t] of whole.namedParameters()) t.dispose();
  return shapes;
}

/**
 * An image-text checkpoint's language model weights under the text model's names: `model.X` is
 * `language_model.model.X` (transformers before 4.52) or `model.language_model.X` (after), `lm_head.weight`
 * `language_model.lm_head.weight` or itself. The vision tower and projector are not read.
 */
function languageModelWeights(h: SafetensorsHandle, dir: string): SafetensorsHandle {
  const old = h.has("language_model.model.embed_tokens.weight");
  if (!old && !h.has("model.language_model.embed_tokens.weight"))
    throw new ModelLoadError(`${dir}: no language model weights (language_model.model.* or model.language_model.*) in the checkpoint`);
  const outer = (name: string): string => {
    if (name.startsWith("model.")) return old ? `language_model.${name}` : `model.language_model.${name.slice("model.".length)}`;
    return old ? `language_model.${name}` : name;
  };
  const inner = (name: string): string | null => {
    if (old) return name.startsWith("language_model.") ? name.slice("language_model.".length) : null;
    if (name.startsWith("model.language_model.")) return `model.${name.slice("model.language_model.".length)}`;
    return name === "lm_head.weight" ? name : null;
  };
  const tensors = h.tensors.flatMap((t) => {
    const name = inner(t.name);
    return name === null ? [] : [{ ...t, name }];
  });
  return {
    tensors,
    metadata: h.metadata,
    get: (name) => {
      const t = h.get(outer(name));
      return t === undefined ? undefined : { ...t, name };
    },
    has: (name) => h.has(outer(name)),
    load: (name) => h.load(outer(name)),
    loadAsFloat32: (name) => h.loadAsFloat32(outer(name)),
    close: () => h.close(),
  };
}

function loadGguf(file: string, options: LoadOptions, tokenizerDir?: string): LoadedModel {
  const mismatch = loadFormatMismatch(options.loadFormat ?? "auto", "gguf");
  if (mismatch !== null) throw new ModelLoadError(`${file}: ${mismatch}`);
  if ((options.tp?.size ?? 1) > 1) throw new TensorParallelError(`${file}: GGUF models are not supported with tensor parallelism (serve a safetensors directory)`);
  if (options.hfConfigPath !== undefined) throw new ModelLoadError(`${file}: a GGUF model's config is its metadata's (--hf-config-path serves Hugging Face directories; --hf-overrides changes a GGUF's)`);
  const g: GgufFile = readGguf(file);
  try {
    const hfConfig = applyHfOverrides(ggufToHfConfig(g.metadata, g.tensors.map((t) => t.name), (name) => g.loadAsFloat32(name)), options.hfOverrides);
    const config = parseHfConfig(hfConfig);
    const dtype = resolveDtype(options.dtype ?? "auto", config);
    const arch = String(g.metadata["general.architecture"] ?? "");
    const family = ggufFamilyOf(config.architecture);
    // every parameter is assigned below (or the load fails on the missing ones), so none is allocated first
    const model = new CausalLM(config, { dtype, device: options.device, family: FAMILIES[config.architecture], unallocatedParameters: true });
    const shapes = new Map(model.namedParameters().map(([n, t]) => [n, t.shape]));
    const wanted = new Set(shapes.keys());
    const loaded = new Set<string>();
    /** The shape the config gives GGUF tensor `hfName` (stacked experts [E, out, in], fused parts' rows summed); null: no such parameter. */
    const expectedShape = (hfName: string, fused: [string, number][] | null): readonly number[] | null => {
      if (hfName.includes("{expert}")) {
        const per = shapes.get(hfName.replace("{expert}", "0"));
        return per === undefined || config.moe === null ? null : [config.moe.numExperts, ...per];
      }
      if (fused) {
        const first = shapes.get(fused[0]![0]);
        return first === undefined ? null : [fused.reduce((n, [, r]) => n + r, 0), ...first.slice(1)];
      }
      return shapes.get(hfName) ?? null;
    };
    const direct = directQuantLoader(model, options);
    const tiedHead = config.tieWordEmbeddings && !g.get("output.weight");
    g.tensors.forEach((info, i) => {
      const hfName = ggufToHfTensorName(info.name, family);
      if (hfName === null) return; // e.g. rope_freqs: recomputed from the config
      const rows = info.shape[0]!;
      const permutes = ggufArchPermutesQK(arch) && /self_attn\.(q|k)_proj\.weight$/.test(hfName);
      const unpermute = <T extends Float32Array | Uint8Array>(d: T, r = rows): T =>
        permutes ? unpermuteQK(d, r, config.numAttentionHeads, hfName.includes("k_proj") ? config.numKeyValueHeads : undefined) : d;
      const experts = hfName.includes("{expert}") ? info.shape[0]! : 0;
      const fused = fusedParts(config, hfName); // Phi-3's qkv / gate-up: one matrix, its parts' rows in turn
      const want = expectedShape(hfName, fused);
      // (a converter that squeezed size-1 dims wrote Qwen2-MoE's [1, hidden] shared-expert gate as [hidden])
      const unit = (s: readonly number[]) => s.filter((d) => d !== 1).join();
      if (want !== null && want.join() !== info.shape.join() && unit(want) !== unit(info.shape))
        throw new ModelLoadError(`${file}: tensor ${info.name} is [${info.shape.join(", ")}], the model's config says [${want.join(", ")}] (for ${hfName})`);
      const names = experts ? Array.from({ length: experts }, (_, e) => hfName.replace("{expert}", String(e))) : fused ? fused.map(([n]) => n) : [hfName];
      // the token embedding in its own blocks, when they load quantized (a tied LM head then reads them too)
      const taken = hfName === "model.embed_tokens.weight" ? direct.embedding(info, model, paramDtype(hfName, dtype), g) : direct.take(info, names, unpermute, g, fused?.map(([, r]) => r));
      if (taken) {
        names.forEach((n) => loaded.add(n));
        options.onProgress?.("loading weights", (i + 1) / g.tensors.length);
        return;
      }
      const shift = ggufNormShift(family, hfName);
      const data = shift === 0 ? unpermute(g.loadAsFloat32(info.name)) : g.loadAsFloat32(info.name).map((x) => x - shift);
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
      if (experts) {
        // stacked experts [E, out, in] -> one matrix per expert
        const rest = info.shape.slice(1);
        const per = rest.reduce((a, b) => a * b, 1);
        names.forEach((n, e) => put(n, data.slice(e * per, (e + 1) * per), rest));
      } else if (fused) {
        const cols = info.shape[1]!;
        fused.reduce((row, [n, rows]) => (put(n, data.slice(row * cols, (row + rows) * cols), [rows, cols]), row + rows), 0);
      } else put(hfName, data, [...(want ?? info.shape)]);
      // a tied LM head reads the token embedding's own quantized blocks, as llama.cpp does
      if (tiedHead && hfName === "model.embed_tokens.weight") direct.tiedHead(info, model.model.embedTokens.weight, g);
      options.onProgress?.("loading weights", (i + 1) / g.tensors.length);
    });
    direct.finish(file);
    const missing = [...wanted].filter((n) => !loaded.has(n));
    if (missing.length) {
      const tensors = [...new Set(missing.map((n) => hfToGgufTensorName(n, family)?.name ?? n))];
      throw new ModelLoadError(`${file}: GGUF lacks ${missing.length} parameters, e.g. ${missing.slice(0, 4).join(", ")} (tensor${tensors.length > 1 ? "s" : ""} ${tensors.slice(0, 4).join(", ")})`);
    }
    let tokenizer: Tokenizer;
    let generationConfig: GenerationConfig | null = null;
    // --tokenizer, else the directory the file sits in; generation_config.json from that directory, else --tokenizer's
    const tokDir = options.tokenizer ?? tokenizerDir;
    if (tokDir && fs.existsSync(path.join(tokDir, "tokenizer.json"))) {
      const genDir = tokenizerDir ?? tokDir;
      tokenizer = Tokenizer.fromDir(tokDir, { deferBuild: options.deferTokenizerBuild, generationConfigDir: genDir });
      generationConfig = loadGenerationConfig(genDir);
    } else {
      const files = ggufToTokenizerJson(g.metadata);
      const eos = (files.tokenizerConfig as { eos_token_id?: number[] }).eos_token_id ?? [];
      generationConfig = eos.length > 0 ? parseGenerationConfig({ eos_token_id: eos }) : null;
      tokenizer = Tokenizer.fromJson(files.tokenizerJson, files.tokenizerConfig, {
        generationConfig: generationConfig?.raw ?? null,
        deferBuild: options.deferTokenizerBuild,
      });
    }
    // --skip-tokenizer-init: the file's vocabulary is not served (its EOS ids still stop generation)
    if (options.skipTokenizer === true) tokenizer = AbsentTokenizer.of({ vocabSize: config.vocabSize, eosTokenIds: tokenizer.eosTokenIds, bosTokenId: null });
    return { model, config, tokenizer, generationConfig, path: file, dtype, quantization: direct.scheme() };
  } finally {
    g.close();
  }
}

/** GGUF block types no kernel takes as they are, loaded requantized to int8_g32 (directQuantLoader's requantizes). */
const REQUANTIZED_GGUF_TYPES: ReadonlySet<string> = new Set(["Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K"]);

/**
 * GGUF tensors whose quantized blocks Kiln's kernels take as they are (Q4_0 -> int4, Q8_0 -> int8_g32, Q4_K ->
 * q4_k, Q5_K -> q5_k, Q6_K -> q6_k, IQ4_NL -> iq4_nl, MXFP4 -> mxfp4; bits moved, never dequantized; IQ4_XS -> iq4_nl
 * with each 32's scale rounded to f16, noted), the token embedding among them; matrices of the
 * REQUANTIZED_GGUF_TYPES requantized to int8_g32. Tensors it declines load as floats: other types, in_features % 64 != 0 (the
 * kernels take 64-element chunks), a native addon without the scheme, non-cpu devices.
 */
function directQuantLoader(model: CausalLM, options: LoadOptions) {
  const dev = resolveDevice(options.device);
  const native = dev.backend.name === "cpu" ? tryLoadNativeKernels() : null; // quant_matmul is cpu-only
  // --quantization asks for one format everywhere: then every tensor loads as floats and is quantized to it
  const enabled = (options.ggufKeepQuantized ?? resolveQuantization(options.quantization) === null) && native !== null;
  const linears = new Map<string, [string, Linear]>();
  for (const [name, m] of model.namedModules()) if (m instanceof Linear) linears.set(name ? `${name}.weight` : "weight", [name, m]);
  const declined = new Map<string, string[]>(); // reason -> GGUF tensor names
  // the same, for tensors whose values change on load (requantized to int8_g32, or IQ4_XS's scales rounded to f16)
  const converted = new Map<string, string[]>();
  const convert = (why: string, name: string) => {
    const names = converted.get(why) ?? [];
    if (!names.includes(name)) converted.set(why, [...names, name]); // a tied table is looked at twice
  };
  const counts = new Map<QuantScheme, number>();
  type Info = { type: string; shape: number[]; name: string };
  /** A tensor's bytes for the repack: mapped from the file (no read into a copy; KILN_NO_MMAP=1 reads them). */
  const rawBytes = (g: GgufFile, name: string): Uint8Array => {
    const t = g.get(name);
    if (!t || env.noMmap || t.byteLength === 0) return g.load(name);
    return new Uint8Array(native!.mapFile(g.path, t.byteOffset, t.byteLength));
  };
  const quantized = (type: GgufDirectType, raw: Uint8Array, n: number, k: number): QuantizedWeight => {
    const scheme = GGUF_DIRECT_SCHEME[type];
    if (native!.ggufRepack) {
      // the native repack writes the weight's memory in place: one pass, no staging arrays
      const [data, scales] = fromBytesFilled(
        [{ dtype: "uint8", shape: [n, quantDataBytes(scheme, n, k) / n] }, { dtype: quantScaleDtype(scheme), shape: [n, quantScaleCount(scheme, n, k) / n] }],
        ([d, s]) => native!.ggufRepack!(GgmlType[type], raw, n, k, d!, s!),
        { device: dev },
      );
      counts.set(scheme, (counts.get(scheme) ?? 0) + 1);
      return { scheme, outFeatures: n, inFeatures: k, data: data!, scales: scales!, rowSums: null };
    }
    const q = repackGgufBlocks(type, raw, n, k);
    const data = fromBytes(q.data, "uint8", [n, q.data.length / n], { device: dev });
    const scales =
      isSuperBlockScheme(scheme) ? fromBytes(q.scales as Uint8Array, "uint8", [n, q.scales.length / n], { device: dev })
      : q.scales instanceof Uint8Array ? fromBytes(q.scales, "uint8", [n, k / 32], { device: dev })
      : fromBytes(new Uint8Array(q.scales.buffer), "float16", [n, k / 32], { device: dev });
    counts.set(scheme, (counts.get(scheme) ?? 0) + 1);
    return { scheme, outFeatures: n, inFeatures: k, data, scales, rowSums: null };
  };
  /** The direct type of `info` when it loads quantized; null (and why, noted) when it loads as floats. */
  const directType = (info: Info): GgufDirectType | null => {
    if (!enabled || !(info.type in GGUF_DIRECT_SCHEME) || info.shape.length < 2) return null;
    const type = info.type as GgufDirectType;
    const decline = (why: string) => {
      declined.set(why, [...(declined.get(why) ?? []), info.name]);
      return null;
    };
    if (!fitsDirectKernel(type, info.shape.at(-1)!)) {
      const multiple = directKMultiple(type);
      return decline(`${type} with in_features % ${multiple} != 0 (the kernels take ${multiple}-element chunks)`);
    }
    if (!nativeTakesScheme(native!, GGUF_DIRECT_SCHEME[type])) return decline(`${type} (this native addon lacks the ${GGUF_DIRECT_SCHEME[type]} kernel)`);
    if (type === "IQ4_XS") {
      convert("IQ4_XS (no IQ4_XS kernel) run as iq4_nl, each 32 weights' scale d * (ls - 32) rounded to f16 (within 2^-11 relative)", info.name);
    }
    return type;
  };
  /**
   * Whether `info` is a block type no kernel takes as it is (Q5_0, Q4_1, Q2_K, Q3_K, ...: llama.cpp's Q3_K_M files are
   * mostly these) and loads requantized to int8_g32 instead of as floats: ~1.06 bytes per weight where f32 takes 4, each
   * element within about half a step (its group of 32's amax / 127, rounded to f16) of the file's value. When true,
   * the tensor is recorded for finish()'s note.
   */
  const requantizes = (info: Info): boolean => {
    if (!enabled || info.shape.length < 2 || !REQUANTIZED_GGUF_TYPES.has(info.type)) return false;
    if (!fitsDirectKernel("Q8_0", info.shape.at(-1)!) || !nativeTakesScheme(native!, "int8_g32")) return false;
    convert(`${info.type} (no ${info.type} kernel) requantized to int8_g32`, info.name);
    return true;
  };
  return {
    /**
     * Loads `info` (one matrix, or stacked experts) into the Linear layers `names` if it can (its blocks as they are,
     * or another block type requantized to int8_g32); false otherwise.
     */
    take(info: Info, names: string[], unpermute: <T extends Float32Array | Uint8Array>(d: T, rows: number) => T, g: GgufFile, partRows?: number[]): boolean {
      const layers = names.map((n) => linears.get(n));
      if (layers.some((l) => l === undefined)) return false;
      const type = directType(info);
      const [n, k] = info.shape.slice(-2) as [number, number];
      if (!type) {
        if (!requantizes(info)) return false;
        const floats = g.loadAsFloat32(info.name);
        layers.reduce((at, l, e) => {
          const [name, layer] = l!;
          const rows = partRows?.[e] ?? n;
          const w = tensor(unpermute(floats.subarray(at, at + rows * k), rows), { shape: [rows, k], device: dev });
          installQuantizedWeight(model, name, layer, quantizeWeight(w, "int8_g32"));
          w.dispose();
          counts.set("int8_g32", (counts.get("int8_g32") ?? 0) + 1);
          return at + rows * k;
        }, 0);
        return true;
      }
      const raw = rawBytes(g, info.name);
      const rowBytes = ggufDirectRowBytes(type, k);
      // stacked experts: n rows each; a fused matrix (partRows): its parts' rows in turn
      layers.reduce((at, l, e) => {
        const [name, layer] = l!;
        const rows = partRows?.[e] ?? n;
        installQuantizedWeight(model, name, layer, quantized(type, unpermute(raw.subarray(at, at + rows * rowBytes), rows), rows, k));
        return at + rows * rowBytes;
      }, 0);
      return true;
    },
    /**
     * Keeps the token embedding `info` in its blocks (installQuantizedEmbedding) if it can: a float32 model (a bf16
     * table rounds its rows) and a direct type; false otherwise.
     */
    embedding(info: Info, model: CausalLM, dtype: DType, g: GgufFile): boolean {
      const type = dtype === "float32" ? directType(info) : null;
      if (!type) return false;
      const [n, k] = info.shape as [number, number];
      installQuantizedEmbedding(model, "model.embed_tokens", model.model.embedTokens, quantized(type, rawBytes(g, info.name), n, k));
      return true;
    },
    /**
     * Gives a tied embedding's float table a quantized copy of its own blocks for the LM head (another block type's
     * values requantized to int8_g32).
     */
    tiedHead(info: Info, embedding: Tensor, g: GgufFile): void {
      const type = directType(info);
      if (!type) {
        if (requantizes(info)) setQuantizedShadow(embedding, quantizeWeight(embedding, "int8_g32"));
        return;
      }
      const [n, k] = info.shape as [number, number];
      setQuantizedShadow(embedding, quantized(type, rawBytes(g, info.name), n, k));
    },
    finish(file: string): void {
      const note = options.onNote ?? ((m: string) => console.warn(m));
      for (const [why, names] of declined)
        note(`[load] ${file}: ${names.length} tensor(s) ${why}; dequantized to float: ${names.slice(0, 4).join(", ")}${names.length > 4 ? ", ..." : ""}`);
      for (const [why, names] of converted) note(`[load] ${file}: ${names.length} tensor(s) ${why}: ${names.slice(0, 4).join(", ")}${names.length > 4 ? ", ..." : ""}`);
    },
    /** The scheme most tensors were loaded in (null: none quantized). */
    scheme: (): QuantScheme | null => [...counts].sort((a, b) => b[1] - a[1])[0]?.[0] ?? null,
  };
}
