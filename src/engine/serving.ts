// Builds a serving engine from a model path and vLLM-named engine arguments: loads the model, sizes the
// paged KV cache from --kv-cache-memory (or a share of free memory), and wires runner + tokenizer + engine.
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { loadLocalModel, loadModel, type DtypeArg, type LoadedModel, type LoadOptions } from "../models/loader.js";
import { EngineInputError } from "./errors.js";
import type { EngineArgs, PoolerConfig } from "./engine-core.js";
import { isPoolingType, type HiddenStatesRequest, type PoolingType } from "./model-runner.js";
import { hasTokenMarkers, REASONING_PARSERS, thinkMarkers, type ReasoningParserName } from "./reasoning.js";
import { hugePageWeightBudget, KV_TENSOR_DTYPE, PagedModelRunner, kvBytesPerBlock, type KvCacheDtype } from "./paged-model-runner.js";
import type { KvEventsConfig } from "./kv-events.js";
import type { LogprobsMode } from "./sampler.js";
import { decodeBuckets, mixedBuckets } from "./step-graphs.js";
import { stepGraphCacheKey } from "./step-graph-cache.js";
import { defaultDevice } from "../tensor/device.js";
import { weightTensors } from "../nn/quantized-linear.js";
import {
  resolveSpeculativeConfig, type DraftModelSpeculativeConfig, type Drafter, type EagleSpeculativeConfig, type NgramSpeculativeConfig, type SpeculativeConfig,
} from "./speculative.js";
import { DraftModelProposer } from "./draft-model.js";
import { EagleProposer, eagleHiddenStates } from "./eagle.js";
import { loadEagleHead, readEagleHeadConfig } from "../models/eagle-head.js";
import { env } from "../util/env.js";
import { camelCaseHint } from "../util/names.js";
import { isGgufModel, resolveModel } from "../models/hub.js";
import { checkTensorParallelConfig } from "../models/causal-lm.js";
import { languageModelConfig, parseHfConfig } from "../models/hf-config.js";
import { applyMmProcessorKwargs, MmProcessorKwargsError, PAN_AND_SCAN_DEFAULTS } from "../models/gemma3-pan-and-scan.js";
import { applyHfOverrides, isLoadFormat, LOAD_FORMATS, type LoadFormat } from "../models/load-format.js";
import { startTensorParallel, type TpLeader } from "./tensor-parallel.js";

/** Engine arguments with vLLM's names (camelCase), as `kiln serve` flags and `new LLM({...})` take them. */
export interface ServingArgs {
  model: string;
  /**
   * vLLM's --limit-mm-per-prompt, parsed: the most items of each modality one prompt may carry (default 999 each, as
   * vLLM). {"image": 0} serves an image-text checkpoint text-only, its vision tower left unread.
   */
  limitMmPerPrompt?: Record<string, number>;
  /**
   * vLLM's --mm-processor-kwargs: the image processor's settings over preprocessor_config.json's (Gemma 3: the
   * pan-and-scan keys, e.g. {"do_pan_and_scan": true}); an unknown key or a wrong type is an EngineInputError.
   */
  mmProcessorKwargs?: Record<string, unknown> | null;
  /** vLLM's --interleave-mm-strings: a "string" chat content format writes a message's images in their place (LLM.chat). */
  interleaveMmStrings?: boolean;
  /**
   * vLLM's --kv-events-config, parsed (kv-events.ts): the engine records its prefix-cache blocks stored and evicted
   * and the worker publishes each step's batch over NATS. Default none.
   */
  kvEventsConfig?: KvEventsConfig | null;
  dtype?: DtypeArg;
  /** vLLM's --quantization: "int8" | "int4" | "mxfp4" | "fp8" weight-only quantization of the linear layers on load. */
  quantization?: string | null;
  maxModelLen?: number;
  maxNumSeqs?: number;
  maxNumBatchedTokens?: number;
  blockSize?: number;
  /** KV cache size in bytes; default: min(4 GiB, gpuMemoryUtilization of free memory). */
  kvCacheMemory?: number;
  /**
   * vLLM's --kv-cache-dtype: "auto" (default) = the model's dtype where the cache takes it (bfloat16), else float32;
   * "fp8" is "fp8_e4m3", as in vLLM.
   */
  kvCacheDtype?: "auto" | "fp8" | KvCacheDtype;
  /** Share of free host memory the KV cache may take when kvCacheMemory is not given (default 0.25 on cpu). */
  gpuMemoryUtilization?: number;
  /** vLLM's num_gpu_blocks_override: the KV cache's block count (block 0, the null block, included) instead of the sized one. */
  numGpuBlocksOverride?: number;
  enablePrefixCaching?: boolean;
  seed?: number;
  schedulingPolicy?: "fcfs" | "priority";
  /** vLLM's --logprobs-mode (EngineArgs.logprobsMode); default raw_logprobs. */
  logprobsMode?: LogprobsMode;
  /** Skip capturing the decode step graphs at start-up: every step runs op by op (vLLM's --enforce-eager). */
  enforceEager?: boolean;
  /** vLLM's --async-scheduling: schedule step N+1 while step N computes (default on). */
  asyncScheduling?: boolean;
  /**
   * vLLM's speculative_config: `{ method: "ngram", numSpeculativeTokens, promptLookupMax, promptLookupMin }` (n-gram
   * drafts verified in one step) or `{ model, numSpeculativeTokens }` (a draft model's greedy drafts; method
   * "draft_model"); either turns async scheduling off. Default none.
   */
  speculativeConfig?: Partial<NgramSpeculativeConfig> | Partial<DraftModelSpeculativeConfig> | Partial<EagleSpeculativeConfig> | null;
  /** Largest decode batch captured as a step graph; default min(maxNumSeqs, 32). */
  maxCaptureSize?: number;
  /** Largest token count of the captured mixed (prefill) steps (vLLM's max_cudagraph_capture_size); default 512, 0 = none. */
  maxCaptureTokens?: number;
  revision?: string;
  /** vLLM's --download-dir: the hub cache a hub id is looked up in (and downloaded to); default HF_HUB_CACHE's. */
  downloadDir?: string;
  /**
   * vLLM's --load-format: "auto" (default), "safetensors", "gguf", or "dummy" (random weights of the config's shapes,
   * no checkpoint tensor read; models/dummy-weights.ts).
   */
  loadFormat?: LoadFormat;
  /** vLLM's --hf-overrides: config.json keys over the model's before it is built (models/load-format.ts applyHfOverrides). */
  hfOverrides?: Record<string, unknown> | null;
  /** vLLM's --hf-config-path: a directory whose config.json is read instead of the model's. Default: the model's. */
  hfConfigPath?: string;
  /** vLLM's --ignore-patterns: glob patterns of weight files in the model directory not read (models/model-dir.ts). */
  ignorePatterns?: string[];
  /** vLLM's --hf-token: the token a hub id is downloaded with. Default: HF_TOKEN's. */
  hfToken?: string;
  /** vLLM's --skip-tokenizer-init: no tokenizer is read (models/absent-tokenizer.ts); prompts are token ids. Default false. */
  skipTokenizerInit?: boolean;
  /**
   * vLLM's --disable-sliding-window: a model with a sliding window serves at most that many tokens (max_model_len is
   * capped to it), where full attention and the window's attend to the same tokens.
   */
  disableSlidingWindow?: boolean;
  /** vLLM's --enable-lora: serve LoRA adapters (requests name them; see EngineRequestInput.loraRequest). Default off. */
  enableLora?: boolean;
  /** vLLM's --max-loras: adapters in one step (device slots); default 1. */
  maxLoras?: number;
  /** vLLM's --max-lora-rank: the largest adapter rank served; default 16. */
  maxLoraRank?: number;
  /** vLLM's --max-cpu-loras: adapters kept in host memory while unused; default maxLoras. */
  maxCpuLoras?: number | null;
  /**
   * vLLM's --runner: "generate" (default) or "pooling" (embeddings: every request returns its prompt's pooled final
   * hidden state; see poolerConfig).
   */
  runner?: "generate" | "pooling";
  /**
   * vLLM's --pooler-config for a pooling runner: poolingType LAST | MEAN | CLS and normalize. Default: the model
   * directory's sentence-transformers pooling (resolvePooler) where it has one, else LAST with normalize (vLLM's
   * default for decoder models turned into embedding models).
   */
  poolerConfig?: Partial<PoolerConfig> | null;
  /**
   * vLLM's --reasoning-parser: structured output starts after the model's </think> (EngineArgs.reasoningParser); the
   * tokenizer must hold <think> and </think> as tokens. Default none.
   */
  reasoningParser?: ReasoningParserName | null;
  /**
   * vLLM's --tokenizer: a directory holding tokenizer.json (tokenizer_config.json, chat template) to use instead of
   * the model's; the model's generation_config.json still gives the generation defaults and EOS ids. Default: the model's.
   */
  tokenizer?: string;
  /** vLLM's --max-logprobs: the largest logprobs / prompt_logprobs a request may ask; -1 = the vocabulary size. Default 20. */
  maxLogprobs?: number;
  /**
   * vLLM's --enable-chunked-prefill (default on): a long prompt is computed over several steps. Off, a prompt is
   * computed in one step, so max_num_batched_tokens defaults to max(max_model_len, 2048) and must be >= max_model_len.
   */
  enableChunkedPrefill?: boolean;
  /** vLLM's --long-prefill-token-threshold: a prompt computes at most this many tokens a step (0 = no cap, the default). */
  longPrefillTokenThreshold?: number;
  /**
   * vLLM's --tensor-parallel-size: the model's heads, KV heads and MLP features are split over this many ranks (rank 0
   * here, the others processes it spawns; see tensor-parallel.ts). Greater than 1 needs the async setup
   * (createServingSetup: `kiln serve`, WorkerEngine) and runs eagerly. Default 1.
   */
  tensorParallelSize?: number;
  /**
   * vLLM's --enable-sleep-mode: the engine may sleep (EngineArgs.enableSleepMode, sleep-mode.ts), freeing its KV cache
   * (level 1) and weights (level 2: read again from the checkpoint on wake-up). Default off.
   */
  enableSleepMode?: boolean;
  onProgress?: (stage: string, fraction: number) => void;
}

export interface ServingSetup {
  loaded: LoadedModel;
  runner: PagedModelRunner;
  engineArgs: EngineArgs;
  /** KV capacity in tokens (reported at start-up, as vLLM does). */
  kvTokens: number;
  /** The other tensor-parallel ranks (shut them down with the engine), or null. */
  tp: TpLeader | null;
  /** The drafter of speculativeConfig's draft_model, eagle and eagle3 methods, or null. */
  draft: Drafter | null;
}

const DEFAULT_KV_CAP = 4 * 1024 ** 3;

/**
 * min(4 GiB, utilization x free memory), rounded down to whole GiB above 1 GiB: free memory moves by tens of MiB
 * between starts, and a KV cache of another size would key another step-graph cache entry (no replay).
 */
function defaultKvBudget(utilization: number): number {
  const b = Math.min(DEFAULT_KV_CAP, os.freemem() * utilization);
  return b >= 2 ** 30 ? Math.floor(b / 2 ** 30) * 2 ** 30 : b;
}

/** --kv-cache-dtype's values (vLLM's names). */
export const KV_CACHE_DTYPES = ["auto", "float32", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"] as const;

/** ServingArgs' keys (the compiler keeps this list whole), and LLM's and WorkerEngine's own logitsProcessors. */
const SERVING_ARG_KEYS: Record<keyof ServingArgs | "logitsProcessors", true> = {
  model: true, kvEventsConfig: true, dtype: true, quantization: true, maxModelLen: true, maxNumSeqs: true, maxNumBatchedTokens: true,
  blockSize: true, kvCacheMemory: true, kvCacheDtype: true, gpuMemoryUtilization: true, numGpuBlocksOverride: true, enablePrefixCaching: true,
  seed: true, schedulingPolicy: true, logprobsMode: true, enforceEager: true, asyncScheduling: true, speculativeConfig: true, maxCaptureSize: true,
  maxCaptureTokens: true, revision: true, onProgress: true, logitsProcessors: true, enableLora: true, maxLoras: true,
  maxLoraRank: true, maxCpuLoras: true, runner: true, poolerConfig: true, reasoningParser: true, tokenizer: true, maxLogprobs: true,
  enableChunkedPrefill: true, longPrefillTokenThreshold: true, tensorParallelSize: true, downloadDir: true, loadFormat: true, hfOverrides: true,
  hfConfigPath: true, ignorePatterns: true, hfToken: true, skipTokenizerInit: true, disableSlidingWindow: true, enableSleepMode: true, limitMmPerPrompt: true,
  mmProcessorKwargs: true, interleaveMmStrings: true,
};
const isServingArg = (k: string): boolean => Object.hasOwn(SERVING_ARG_KEYS, k);

/**
 * The arguments a user gets wrong, each named in its own EngineInputError (snake_case, as vLLM's flags) before
 * anything loads: unknown keys (a snake_case key names its camelCase form), and sizes out of range.
 */
function checkServingArgs(args: ServingArgs): void {
  for (const k of Object.keys(args))
    if (!isServingArg(k)) throw new EngineInputError(k, `'${k}' is not an engine argument${camelCaseHint(k, isServingArg)}`);
  const positiveInt = (value: number | undefined, name: string, min = 1): void => {
    if (value !== undefined && (!Number.isInteger(value) || value < min))
      throw new EngineInputError(name, `${name} must be an integer >= ${min}, got ${value}`);
  };
  try {
    applyMmProcessorKwargs(PAN_AND_SCAN_DEFAULTS, args.mmProcessorKwargs);
  } catch (e) {
    if (e instanceof MmProcessorKwargsError) throw new EngineInputError("mm_processor_kwargs", e.message);
    throw e;
  }
  positiveInt(args.maxModelLen, "max_model_len");
  positiveInt(args.maxNumSeqs, "max_num_seqs");
  positiveInt(args.maxNumBatchedTokens, "max_num_batched_tokens");
  positiveInt(args.kvCacheMemory, "kv_cache_memory");
  positiveInt(args.numGpuBlocksOverride, "num_gpu_blocks_override", 2);
  positiveInt(args.maxCaptureSize, "max_capture_size", 0);
  positiveInt(args.maxCaptureTokens, "max_capture_tokens", 0);
  positiveInt(args.maxLoras, "max_loras");
  positiveInt(args.maxLoraRank, "max_lora_rank");
  positiveInt(args.maxCpuLoras ?? undefined, "max_cpu_loras");
  positiveInt(args.maxLogprobs, "max_logprobs", -1);
  positiveInt(args.longPrefillTokenThreshold, "long_prefill_token_threshold", 0);
  positiveInt(args.tensorParallelSize, "tensor_parallel_size");
  if (args.schedulingPolicy !== undefined && args.schedulingPolicy !== "fcfs" && args.schedulingPolicy !== "priority")
    throw new EngineInputError("scheduling_policy", `scheduling_policy must be "fcfs" or "priority", got ${JSON.stringify(args.schedulingPolicy)}`);
  // (the generator of unseeded requests: a non-integer seed was folded into another one silently)
  if (args.seed !== undefined && !Number.isSafeInteger(args.seed)) throw new EngineInputError("seed", `seed must be an integer, got ${JSON.stringify(args.seed)}`);
  if ((args.tensorParallelSize ?? 1) > 1) {
    // what the split does not cover yet, named before any rank starts
    const refuse = (param: string, what: string): never => {
      throw new EngineInputError(param, `${what} is not supported with tensor_parallel_size > 1`);
    };
    if (args.quantization != null) refuse("quantization", `quantization ${args.quantization}`);
    if (args.enableLora === true) refuse("enable_lora", "LoRA");
    if (args.speculativeConfig) refuse("speculative_config", "speculative decoding");
    if (args.runner === "pooling") refuse("runner", "the pooling runner");
    if (args.enableSleepMode === true) refuse("enable_sleep_mode", "sleep mode");
  }
  // vLLM's quantization "gguf" names a GGUF model's own block types, which Kiln keeps without it
  if (args.quantization === "gguf" && !isGgufModel(args.model))
    throw new EngineInputError("quantization", `quantization "gguf" needs a GGUF model (a .gguf file), got ${JSON.stringify(args.model)}`);
  if (args.loadFormat !== undefined && !isLoadFormat(args.loadFormat))
    throw new EngineInputError("load_format", `load_format must be one of ${LOAD_FORMATS.join(", ")}, got ${JSON.stringify(args.loadFormat)}`);
  const o = args.hfOverrides;
  if (o != null && (typeof o !== "object" || Array.isArray(o))) throw new EngineInputError("hf_overrides", `hf_overrides must be an object, got ${JSON.stringify(o)}`);
  if (args.tokenizer !== undefined && !fs.existsSync(path.join(args.tokenizer, "tokenizer.json")))
    throw new EngineInputError("tokenizer", `tokenizer ${JSON.stringify(args.tokenizer)} is not a directory holding tokenizer.json`);
  if (args.maxCpuLoras != null && args.maxCpuLoras < (args.maxLoras ?? 1))
    throw new EngineInputError("max_cpu_loras", `max_cpu_loras (${args.maxCpuLoras}) must be >= max_loras (${args.maxLoras ?? 1})`);
  const bs = args.blockSize;
  if (bs !== undefined && (!Number.isInteger(bs) || bs < 1 || (bs & (bs - 1)) !== 0))
    throw new EngineInputError("block_size", `block_size must be a power of two, got ${bs}`);
  const u = args.gpuMemoryUtilization;
  if (u !== undefined && !(u > 0 && u <= 1))
    throw new EngineInputError("gpu_memory_utilization", `gpu_memory_utilization must be in (0, 1], got ${u}`);
  checkKvCacheDtype(args.kvCacheDtype);
  if (args.runner !== undefined && args.runner !== "generate" && args.runner !== "pooling")
    throw new EngineInputError("runner", `runner must be "generate" or "pooling", got ${JSON.stringify(args.runner)}`);
  if (args.reasoningParser != null && !(REASONING_PARSERS as readonly string[]).includes(args.reasoningParser))
    throw new EngineInputError("reasoning_parser", `reasoning_parser must be one of ${REASONING_PARSERS.join(", ")}, got ${JSON.stringify(args.reasoningParser)}`);
  if (args.poolerConfig != null) {
    if (args.runner !== "pooling") throw new EngineInputError("pooler_config", 'pooler_config needs runner "pooling"');
    const t = args.poolerConfig.poolingType;
    if (t !== undefined && !isPoolingType(t))
      throw new EngineInputError("pooler_config", `pooling_type must be LAST, MEAN or CLS, got ${JSON.stringify(t)}`);
    if (args.poolerConfig.normalize !== undefined && typeof args.poolerConfig.normalize !== "boolean")
      throw new EngineInputError("pooler_config", `normalize must be a boolean, got ${JSON.stringify(args.poolerConfig.normalize)}`);
  }
  if (args.runner === "pooling" && args.speculativeConfig) throw new EngineInputError("speculative_config", "a pooling runner does not generate: speculative decoding does not apply");
  if (args.runner === "pooling" && args.enableLora) throw new EngineInputError("enable_lora", "LoRA is served with the generate runner only");
  if (args.speculativeConfig) {
    try {
      resolveSpeculativeConfig(args.speculativeConfig);
    } catch (e) {
      throw new EngineInputError("speculative_config", (e as Error).message.replace("[engine] speculativeConfig: ", ""));
    }
    if (args.asyncScheduling === true) throw new EngineInputError("async_scheduling", "async scheduling cannot be combined with speculative decoding");
  }
}

/** Throws the typed error for a kv_cache_dtype that is not one of KV_CACHE_DTYPES (checked before any weight loads). */
function checkKvCacheDtype(arg: ServingArgs["kvCacheDtype"]): void {
  const want: string = arg ?? "auto";
  if (!(KV_CACHE_DTYPES as readonly string[]).includes(want))
    throw new EngineInputError("kv_cache_dtype", `kv_cache_dtype must be one of ${KV_CACHE_DTYPES.join(", ")}, got ${JSON.stringify(want)}`);
}

/** vLLM's default --limit-mm-per-prompt for every modality. */
export const DEFAULT_MM_LIMIT = 999;

/** The KV cache's element type for --kv-cache-dtype (auto: bfloat16 for a bfloat16 model, else float32; fp8: e4m3). */
export function resolveKvCacheDtype(loaded: LoadedModel, arg: ServingArgs["kvCacheDtype"]): KvCacheDtype {
  checkKvCacheDtype(arg);
  const want = arg ?? "auto";
  if (want === "fp8") return "fp8_e4m3";
  if (want !== "auto") return want;
  return loaded.dtype === "bfloat16" ? "bfloat16" : "float32";
}

/** The model's length: max_position_embeddings, capped to the sliding window with disable_sliding_window (vLLM's rule). */
function derivedMaxModelLen(loaded: LoadedModel, args: ServingArgs): number {
  const window = args.disableSlidingWindow === true ? loaded.config.slidingWindow : null;
  return Math.min(loaded.config.maxPositionEmbeddings, window ?? Infinity);
}

export function sizeKvCache(
  loaded: LoadedModel,
  args: ServingArgs,
): { numBlocks: number; maxModelLen: number; blockSize: number; kvCacheDtype: KvCacheDtype } {
  const blockSize = args.blockSize ?? 16;
  if (!Number.isInteger(blockSize) || blockSize <= 0 || blockSize > 1024) throw new EngineInputError("block_size", `block_size must be an integer in [1, 1024], got ${blockSize}`);
  const maxModelLen = args.maxModelLen ?? derivedMaxModelLen(loaded, args);
  const derived = derivedMaxModelLen(loaded, args);
  if (maxModelLen > derived) {
    const what = derived < loaded.config.maxPositionEmbeddings
      ? `the model's sliding window ${loaded.config.slidingWindow}, which disable_sliding_window caps it to`
      : `the model's max_position_embeddings ${loaded.config.maxPositionEmbeddings}`;
    if (!env.allowLongMaxModelLen)
      throw new EngineInputError("max_model_len", `max_model_len ${maxModelLen} exceeds ${what} (set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 to allow it, with extreme caution)`);
    process.stderr.write(`warning: max_model_len ${maxModelLen} exceeds ${what}; allowed by VLLM_ALLOW_LONG_MAX_MODEL_LEN: positions past it were never trained and may give garbage\n`);
  }
  const kvCacheDtype = resolveKvCacheDtype(loaded, args.kvCacheDtype);
  const perBlock = kvBytesPerBlock(loaded.model, blockSize, kvCacheDtype);
  const budget = args.kvCacheMemory ?? defaultKvBudget(args.gpuMemoryUtilization ?? 0.25);
  const maxNumSeqs = args.maxNumSeqs ?? 256;
  // never more than every sequence at full length needs (+1: block 0 is the engine's null block)
  const needed = maxNumSeqs * Math.ceil(maxModelLen / blockSize) + 1;
  // vLLM's override replaces the sized count whatever the memory (it is there to test preemption)
  const numBlocks = args.numGpuBlocksOverride ?? Math.min(Math.floor(budget / perBlock), needed);
  if (args.numGpuBlocksOverride !== undefined && (numBlocks - 1) * blockSize < maxModelLen)
    throw new EngineInputError(
      "num_gpu_blocks_override",
      `num_gpu_blocks_override ${numBlocks} (${(numBlocks - 1) * blockSize} tokens after the null block) cannot hold one sequence of max_model_len ${maxModelLen}`,
    );
  if (numBlocks < 2 || (numBlocks - 1) * blockSize < maxModelLen) {
    throw new EngineInputError(
      "kv_cache_memory",
      `the KV cache (${(budget / 2 ** 20).toFixed(1)} MiB, ${Math.max(numBlocks - 1, 0) * blockSize} tokens) cannot hold one sequence of max_model_len ${maxModelLen}; raise --kv-cache-memory or lower --max-model-len`,
    );
  }
  return { numBlocks, maxModelLen, blockSize, kvCacheDtype };
}

/**
 * The pooler of a pooling runner: the given fields over the model directory's sentence-transformers pooling (as
 * vLLM reads it: modules.json's Pooling module, its config.json's pooling_mode_*, and a Normalize module), over
 * LAST + normalize. A pooling mode Kiln does not have (max, weighted mean) is an EngineInputError.
 */
export function resolvePooler(modelPath: string, given: Partial<PoolerConfig>, classifier = false): PoolerConfig {
  let poolingType: PoolingType = "LAST";
  let normalize = !classifier; // a classifier's head reads the last token's state as it is
  const readJson = (f: string): unknown => {
    try {
      return JSON.parse(fs.readFileSync(path.join(modelPath, f), "utf8"));
    } catch {
      return undefined;
    }
  };
  const modules = readJson("modules.json");
  if (Array.isArray(modules)) {
    const typed = modules as { type?: unknown; path?: unknown }[];
    const ofType = (re: RegExp) => typed.find((m) => typeof m.type === "string" && re.test(m.type));
    normalize = ofType(/Normalize$/) !== undefined;
    const pool = ofType(/Pooling$/);
    const st = pool === undefined ? undefined : (readJson(path.join(String(pool.path ?? ""), "config.json")) as Record<string, unknown> | undefined);
    if (st !== undefined) {
      const on = Object.entries(st).filter(([k, v]) => k.startsWith("pooling_mode_") && v === true).map(([k]) => k.slice("pooling_mode_".length));
      const types: Record<string, PoolingType> = { lasttoken: "LAST", mean_tokens: "MEAN", cls_token: "CLS" };
      const known = on.filter((m) => m in types);
      if (given.poolingType === undefined && on.length > 0 && known.length === 0)
        throw new EngineInputError("pooler_config", `the model's sentence-transformers pooling (${on.join(", ")}) is not supported: LAST, MEAN or CLS (pass --pooler-config)`);
      if (known.length > 0) poolingType = types[known[0]!]!;
    }
  }
  return { poolingType: given.poolingType ?? poolingType, normalize: given.normalize ?? normalize, ...(given.activation !== undefined ? { activation: given.activation } : {}) };
}

/** Sizes and mtimes of the model's files: replacing a checkpoint changes the step-graph cache key. */
function modelStamp(modelPath: string): string[] {
  const st = fs.statSync(modelPath, { throwIfNoEntry: false });
  if (!st) return [];
  if (!st.isDirectory()) return [`${path.basename(modelPath)}:${st.size}:${st.mtimeMs}`];
  return fs
    .readdirSync(modelPath)
    .sort()
    .map((f) => {
      const s = fs.statSync(path.join(modelPath, f), { throwIfNoEntry: false });
      return `${f}:${s?.size ?? 0}:${s?.mtimeMs ?? 0}`;
    });
}

/**
 * The step-graph cache entry for this model and engine shape: everything the captured kernels and the buffers
 * they point into depend on (see step-graph-cache.ts), with `mark` taken before the model was loaded.
 */
function stepGraphCache(loaded: LoadedModel, mark: number | undefined, shape: object): { key: string; mark: number } | undefined {
  if (mark === undefined) return undefined;
  const model = loaded.model;
  const identity = {
    path: path.resolve(loaded.path),
    files: modelStamp(loaded.path),
    dtype: loaded.dtype,
    quantization: loaded.quantization ?? null,
    config: loaded.config,
    parameters: model.namedParameters().map(([n, t]) => `${n}:${t.dtype}:${t.shape.join("x")}`),
    backend: model.device.backend.describe(),
    noMmap: env.noMmap,
    shape,
  };
  return { key: stepGraphCacheKey(identity), mark };
}

/** The loaded model made ready to serve max_model_len tokens. */
function prepareWeights(loaded: LoadedModel, maxModelLen: number): void {
  loaded.model.setContextLength(maxModelLen); // longrope's factor set (before any step graph reads the tables)
  // every decode step reads every weight: keep them on huge pages (after sizing the KV cache from free memory, which
  // the copies' old memory would lower until collected; before any step graph points at them)
  loaded.model.device.backend.moveToHugePages?.(weightTensors(loaded.model).map((t) => t.storage.buffer), { maxBytes: hugePageWeightBudget() });
}

/** How a draft model is read: in the served model's dtype, its own tokenizer and config, nothing else overridden. */
function draftLoadOptions(args: ServingArgs): Pick<LoadOptions, "dtype" | "downloadDir" | "deferTokenizerBuild"> {
  return { dtype: args.dtype, downloadDir: args.downloadDir, deferTokenizerBuild: true };
}

/** A draft model that cannot be read, named as speculative_config's. */
function draftLoadError(e: unknown): never {
  throw new EngineInputError("speculative_config", `draft model: ${(e as Error).message}`);
}

/** The speculative config, resolved (null without one). */
function speculation(args: ServingArgs): SpeculativeConfig | null {
  return args.speculativeConfig ? resolveSpeculativeConfig(args.speculativeConfig) : null;
}

/** An EAGLE method's head directory and the served model's hidden rows it reads (read before the served model's capture). */
interface EagleSpec {
  config: EagleSpeculativeConfig;
  dir: string;
  hiddenStates: HiddenStatesRequest;
}

/** A head that cannot serve, named as speculative_config's. */
function eagleError(dir: string, m: string): never {
  throw new EngineInputError("speculative_config", `EAGLE head ${dir}: ${m}`);
}

/** Reads the head's config.json (refusing one that does not fit the served model): which hidden rows the served model's graphs return. */
function eagleSpec(c: EagleSpeculativeConfig, dir: string, loaded: LoadedModel): EagleSpec {
  try {
    return { config: c, dir, hiddenStates: eagleHiddenStates(readEagleHeadConfig(dir, c.method, loaded.config)) };
  } catch (e) {
    return eagleError(dir, (e as Error).message);
  }
}

/**
 * The setup with an EAGLE head's proposer: the head (in the served model's dtype, sharing its embeddings) over its own
 * KV cache of as many blocks as the served model's, its steps captured as step graphs (unless enforceEager): the draft
 * steps for the requests' batch sizes, the feed steps as mixed steps. Refuses a head that does not fit the served model.
 */
function withEagle(s: ServingSetup, { config: c, dir }: EagleSpec, args: ServingArgs): ServingSetup {
  const a = s.engineArgs;
  const fail = (m: string): never => eagleError(dir, m);
  if (s.tp !== null) fail("EAGLE heads are not supported with tensor parallelism yet");
  let proposer: EagleProposer | null = null;
  try {
    const head = loadEagleHead(dir, c.method, s.loaded.model, s.loaded.dtype);
    if (head.config.layer.maxPositionEmbeddings < a.maxModelLen!)
      fail(`it has ${head.config.layer.maxPositionEmbeddings} positions, fewer than max_model_len ${a.maxModelLen} (lower --max-model-len)`);
    proposer = new EagleProposer(head, a.blockSize!, a.numGpuBlocks!, a.maxNumBatchedTokens!, KV_TENSOR_DTYPE[s.runner.kvCacheDtype]);
  } catch (e) {
    if (e instanceof EngineInputError) throw e;
    fail((e as Error).message);
  }
  if (args.enforceEager !== true) {
    args.onProgress?.("compiling the EAGLE head's step graphs", 0);
    proposer!.captureStepGraphs(a.maxModelLen!, {
      decodeBuckets: decodeBuckets(args.maxNumSeqs ?? 256, args.maxCaptureSize), mixedBuckets: mixedBuckets(a.maxNumBatchedTokens!, args.maxCaptureTokens), fuse: true,
    });
    args.onProgress?.("compiling the EAGLE head's step graphs", 1);
  }
  return { ...s, draft: proposer };
}

/** The setup with its draft model's proposer. */
function withDraft(s: ServingSetup, draft: LoadedModel, args: ServingArgs): ServingSetup {
  const a = s.engineArgs;
  const kv = { numBlocks: a.numGpuBlocks, blockSize: a.blockSize!, kvCacheDtype: s.runner.kvCacheDtype, maxModelLen: a.maxModelLen };
  return { ...s, draft: draftProposer(draft, s.loaded, kv, a.maxNumBatchedTokens!, args) };
}

/**
 * The draft model's proposer: its own paged KV cache of as many blocks as the served model's (the draft's per-token
 * K/V is smaller for a smaller model), its steps captured as step graphs as the served model's are (unless
 * enforceEager): decodes of the requests' batch sizes, and the catch-up steps as mixed steps. Refuses a draft whose
 * vocabulary differs, or whose positions stop short of max_model_len.
 */
function draftProposer(
  draft: LoadedModel, loaded: LoadedModel, kv: { numBlocks: number; blockSize: number; kvCacheDtype: KvCacheDtype; maxModelLen: number }, maxTokensPerStep: number,
  args: ServingArgs,
): DraftModelProposer {
  const fail = (m: string): never => {
    throw new EngineInputError("speculative_config", `draft model ${draft.path}: ${m}`);
  };
  if (draft.config.classifier !== null) fail("it is a classifier, not a language model");
  if (draft.config.vocabSize !== loaded.config.vocabSize)
    fail(`its vocabulary has ${draft.config.vocabSize} tokens, the served model's ${loaded.config.vocabSize}: a draft model must share the served model's tokenizer`);
  if (draft.config.maxPositionEmbeddings < kv.maxModelLen && !env.allowLongMaxModelLen)
    fail(`it has ${draft.config.maxPositionEmbeddings} positions, fewer than max_model_len ${kv.maxModelLen} (lower --max-model-len)`);
  prepareWeights(draft, kv.maxModelLen);
  const runner = new PagedModelRunner(draft.model, { numBlocks: kv.numBlocks, blockSize: kv.blockSize, dtype: kv.kvCacheDtype });
  if (args.enforceEager !== true) {
    args.onProgress?.("compiling the draft model's step graphs", 0);
    const decode = decodeBuckets(args.maxNumSeqs ?? 256, args.maxCaptureSize);
    runner.captureStepGraphs(kv.maxModelLen, { decodeBuckets: decode, mixedBuckets: mixedBuckets(maxTokensPerStep, args.maxCaptureTokens), fuse: true });
    args.onProgress?.("compiling the draft model's step graphs", 1);
  }
  return new DraftModelProposer(runner, kv.blockSize, kv.numBlocks, maxTokensPerStep);
}

/** `hiddenStates`: the hidden rows the served model's step graphs also return (for an EAGLE head), absent for none. */
function setup(loaded: LoadedModel, args: ServingArgs, mark?: number, tp: TpLeader | null = null, hiddenStates?: HiddenStatesRequest): ServingSetup {
  if (args.reasoningParser != null && hasTokenMarkers(args.reasoningParser)) {
    try {
      thinkMarkers(loaded.tokenizer, args.reasoningParser);
    } catch (e) {
      throw new EngineInputError("reasoning_parser", (e as Error).message.replace("[engine] ", ""));
    }
  }
  args.onProgress?.("sizing KV cache", 0);
  const { numBlocks, maxModelLen, blockSize, kvCacheDtype } = sizeKvCache(loaded, args);
  prepareWeights(loaded, maxModelLen);
  const runner = new PagedModelRunner(loaded.model, { numBlocks, blockSize, dtype: kvCacheDtype });
  if (loaded.vision !== undefined) {
    if (tp !== null) throw new EngineInputError("tensor_parallel_size", "image inputs are not supported with tensor parallelism (serve with --limit-mm-per-prompt '{\"image\": 0}')");
    runner.vision = loaded.vision;
  }
  // sleep level 2 reads the checkpoint again on wake-up (random weights would come back other ones)
  if (args.enableSleepMode === true && args.loadFormat !== "dummy" && tp === null) {
    runner.weightLoader = () => {
      const again = loadLocalModel(loaded.path, { ...loadOptions(args), deferTokenizerBuild: true, loadVision: false }); // (the vision tower stays)
      prepareWeights(again, maxModelLen);
      return again.model;
    };
  }
  if (tp !== null) {
    // every rank allocates the same number of blocks of its own KV heads; each eager step's inputs go to every rank
    tp.broadcastKvSpec({ numBlocks, blockSize, kvCacheDtype, maxModelLen });
    runner.onStepInputs = (inputs) => tp.broadcastStep(inputs);
  }
  args.onProgress?.("sizing KV cache", 1);
  const chunkedPrefill = args.enableChunkedPrefill ?? true;
  // without chunked prefill a prompt runs in one step: the budget must hold the longest one (vLLM's SchedulerConfig)
  const maxNumBatchedTokens = args.maxNumBatchedTokens ?? (chunkedPrefill ? Math.max(2048, Math.min(maxModelLen, 8192)) : Math.max(maxModelLen, 2048));
  if (!chunkedPrefill && maxNumBatchedTokens < maxModelLen)
    throw new EngineInputError(
      "max_num_batched_tokens",
      `max_num_batched_tokens (${maxNumBatchedTokens}) is smaller than max_model_len (${maxModelLen}): without chunked prefill a prompt ` +
        "is computed in one step, so longer ones could never run. Increase max_num_batched_tokens, decrease max_model_len or enable chunked prefill.",
    );
  const lora = args.enableLora === true ? { maxLoras: args.maxLoras ?? 1, maxLoraRank: args.maxLoraRank ?? 16, maxCpuLoras: args.maxCpuLoras ?? null } : null;
  if (lora !== null) runner.enableLora(lora.maxLoras, lora.maxLoraRank); // before the capture: the graphs read the slots
  // a sequence classifier pools (vLLM's auto runner): its requests return class scores
  const classifier = loaded.config.classifier !== null;
  if (classifier && args.runner === "generate")
    throw new EngineInputError("runner", `${loaded.config.architecture.replace(/ForCausalLM$/, "ForSequenceClassification")} classifies: serve it with the pooling runner (--runner pooling)`);
  if (classifier && lora !== null) throw new EngineInputError("enable_lora", "LoRA is served with the generate runner only");
  const pooler = args.runner === "pooling" || classifier
    ? { ...resolvePooler(loaded.path, args.poolerConfig ?? {}, classifier), ...(classifier ? { classify: true } : {}) }
    : null;
  // the step graphs cannot hold the all-reduces (host calls between kernels): tensor parallelism runs eagerly
  if (tp !== null && args.enforceEager !== true)
    process.emitWarning(`Kiln: tensor_parallel_size ${tp.tp.size} runs eagerly (as --enforce-eager): step graphs cannot include the all-reduces`, "KilnWarning");
  // a pooling engine's steps (prompts only) run eagerly: no step graphs to capture
  if (args.enforceEager !== true && pooler === null && tp === null) {
    const stage = "compiling step graphs";
    args.onProgress?.(stage, 0);
    const decode = decodeBuckets(args.maxNumSeqs ?? 256, args.maxCaptureSize);
    // speculated decodes are mixed steps with 1 + k sampled rows per request
    const k = speculation(args)?.numSpeculativeTokens ?? 0;
    // and one stream's speculated decode gets a step of exactly 1 + k tokens (not padded to the next power of two)
    const mixed = mixedBuckets(maxNumBatchedTokens, args.maxCaptureTokens);
    if (k > 0 && mixed.length > 0 && 1 + k <= mixed[mixed.length - 1]! && !mixed.includes(1 + k)) mixed.push(1 + k);
    const buckets = {
      decodeBuckets: decode,
      mixedBuckets: mixed.sort((a, b) => a - b),
      ...(k > 0 ? { mixedRows: Math.max(1, ...decode) * (1 + k) } : {}),
    };
    // the slots' shape is part of the capture; max_cpu_loras (host memory) is not
    const loraSlots = lora === null ? null : { maxLoras: lora.maxLoras, maxLoraRank: lora.maxLoraRank };
    // (random weights are allocated where a checkpoint's are mapped from its file: another layout to record)
    const dummy = args.loadFormat === "dummy" ? { dummyWeights: true } : {};
    const hidden = hiddenStates === undefined ? {} : { hiddenStates };
    const cache = stepGraphCache(loaded, mark, { ...buckets, numBlocks, blockSize, kvCacheDtype, maxModelLen, fuse: true, lora: loraSlots, ...dummy, ...hidden });
    runner.captureStepGraphs(maxModelLen, {
      ...buckets,
      ...hidden,
      onProgress: (p) => args.onProgress?.(stage, p.done / p.total),
      fuse: true,
      ...(cache ? { cache } : {}),
    });
    const info = runner.graphs?.info;
    if (info)
      args.onProgress?.(
        `step graphs: decode batch sizes ${info.decodeBuckets.join(",")}, mixed token counts ${info.mixedBuckets.join(",") || "none"}; ` +
          `${info.kernels} kernels, ${info.programsCompiled} fused programs compiled + ${info.programsFromCache} from the compile cache` +
          `${info.replayed ? ", graphs replayed from the compile cache" : ""} in ${info.seconds.toFixed(2)} s`,
        1,
      );
  }
  const engineArgs: EngineArgs = {
    maxModelLen,
    numGpuBlocks: numBlocks,
    blockSize,
    maxNumSeqs: args.maxNumSeqs,
    maxNumBatchedTokens,
    enablePrefixCaching: args.enablePrefixCaching ?? true,
    enableKvCacheEvents: args.kvEventsConfig != null,
    enableSleepMode: args.enableSleepMode === true,
    enableChunkedPrefill: chunkedPrefill,
    longPrefillTokenThreshold: args.longPrefillTokenThreshold,
    maxLogprobs: args.maxLogprobs === -1 ? runner.vocabSize : args.maxLogprobs,
    seed: args.seed,
    schedulingPolicy: args.schedulingPolicy,
    logprobsMode: args.logprobsMode,
    asyncScheduling: args.asyncScheduling,
    speculativeConfig: args.speculativeConfig ?? null,
    eosTokenIds: loaded.tokenizer.eosTokenIds,
    reasoningParser: args.reasoningParser ?? null,
    lora,
    pooler,
  };
  return { loaded, runner, engineArgs, kvTokens: (numBlocks - 1) * blockSize, tp, draft: null };
}

/** Loads a local model directory or GGUF file synchronously and builds the engine pieces. */
export function createServingSetupSync(args: ServingArgs): ServingSetup {
  checkServingArgs(args);
  if ((args.tensorParallelSize ?? 1) > 1)
    throw new EngineInputError(
      "tensor_parallel_size",
      "the synchronous LLM runs one rank: serve tensor-parallel with `kiln serve --tensor-parallel-size N` or WorkerEngine.create",
    );
  const spec = speculation(args);
  // (a drafter that is not there is refused before the served model loads and compiles, as vLLM reads its config first)
  if ((spec?.method === "draft_model" || spec?.method === "eagle" || spec?.method === "eagle3") && !fs.existsSync(spec.model))
    throw new EngineInputError("speculative_config", `${spec.method === "draft_model" ? "draft model" : "EAGLE head"}: ${spec.model} does not exist`);
  const mark = defaultDevice().backend.allocationMark?.(); // step-graph recordings name weights relative to it
  const loaded = loadLocalModel(args.model, { ...loadOptions(args), onProgress: args.onProgress });
  const eagle = spec?.method === "eagle" || spec?.method === "eagle3" ? eagleSpec(spec, spec.model, loaded) : null;
  const s = setup(loaded, args, mark, null, eagle?.hiddenStates);
  // (drafters are loaded after the served model's step graphs are captured: their recordings place its buffers relative to `mark`)
  if (eagle !== null) return withEagle(s, eagle, args);
  if (spec?.method !== "draft_model") return s;
  let draft: LoadedModel;
  try {
    draft = loadLocalModel(spec.model, draftLoadOptions(args));
  } catch (e) {
    draftLoadError(e);
  }
  return withDraft(s, draft, args);
}

/**
 * Like createServingSetupSync, but also resolves hub ids through the local HF cache (or a download).
 * `deferTokenizerBuild`: for a caller that needs only the tokenizer's EOS ids before its first request.
 */
export async function createServingSetup(args: ServingArgs, load: Pick<LoadOptions, "deferTokenizerBuild"> = {}): Promise<ServingSetup> {
  checkServingArgs(args);
  if ((args.tensorParallelSize ?? 1) > 1) return createTensorParallelSetup(args, args.tensorParallelSize!, load);
  const spec = speculation(args);
  // (a drafter that cannot be found is refused before the served model loads and compiles, as vLLM reads its config first)
  const eagleDir = spec?.method === "eagle" || spec?.method === "eagle3" ? await resolveEagleDir(spec.model, args) : null;
  const draftPath = spec?.method === "draft_model" ? (await resolveModel(spec.model, cacheDirOption(args)).catch(draftLoadError)).path : null;
  const mark = defaultDevice().backend.allocationMark?.(); // step-graph recordings name weights relative to it
  const loaded = await loadModel(args.model, { ...loadOptions(args), onProgress: args.onProgress, deferTokenizerBuild: load.deferTokenizerBuild });
  const eagle = eagleDir !== null ? eagleSpec(spec as EagleSpeculativeConfig, eagleDir, loaded) : null;
  const s = setup(loaded, args, mark, null, eagle?.hiddenStates);
  if (eagle !== null) return withEagle(s, eagle, args);
  if (draftPath === null) return s;
  return withDraft(s, await loadModel(draftPath, draftLoadOptions(args)).catch(draftLoadError), args);
}

/** --download-dir as the hub cache for resolveModel. */
function cacheDirOption(args: ServingArgs): { cacheDir?: string } {
  return args.downloadDir !== undefined ? { cacheDir: args.downloadDir } : {};
}

/** An EAGLE head's directory: a local one, or a hub id resolved through the local HF cache (or a download). */
async function resolveEagleDir(idOrPath: string, args: ServingArgs): Promise<string> {
  if (fs.existsSync(idOrPath)) return idOrPath;
  try {
    return (await resolveModel(idOrPath, cacheDirOption(args))).path;
  } catch (e) {
    throw new EngineInputError("speculative_config", `EAGLE head: ${(e as Error).message}`);
  }
}

/** How the model is read (shared by every rank: the spawned tensor-parallel ones get it serialized). */
function loadOptions(
  args: ServingArgs,
): Pick<LoadOptions, "dtype" | "quantization" | "revision" | "downloadDir" | "tokenizer" | "loadFormat" | "hfOverrides" | "loadVision" | "hfConfigPath" | "ignorePatterns" | "hfToken" | "skipTokenizer"> {
  return {
    hfConfigPath: args.hfConfigPath,
    ignorePatterns: args.ignorePatterns,
    hfToken: args.hfToken,
    skipTokenizer: args.skipTokenizerInit,
    loadVision: (args.limitMmPerPrompt?.image ?? DEFAULT_MM_LIMIT) > 0,
    dtype: args.dtype,
    quantization: args.quantization === "gguf" ? null : args.quantization, // a GGUF model's own block types (checkServingArgs)
    revision: args.revision,
    downloadDir: args.downloadDir,
    tokenizer: args.tokenizer,
    loadFormat: args.loadFormat,
    hfOverrides: args.hfOverrides,
  };
}

/**
 * Tensor-parallel setup: checks that the model splits (num_attention_heads, num_key_value_heads and
 * intermediate_size divisible by `size`; a Hugging Face directory) before spawning the other ranks, then loads this
 * rank's shard while they load theirs. Any failure stops the ranks.
 */
async function createTensorParallelSetup(args: ServingArgs, size: number, load: Pick<LoadOptions, "deferTokenizerBuild">): Promise<ServingSetup> {
  const resolved = await resolveModel(args.model, { revision: args.revision, ...(args.downloadDir !== undefined ? { cacheDir: args.downloadDir } : {}) });
  if (resolved.kind !== "dir" || !fs.existsSync(path.join(resolved.path, "config.json")))
    throw new EngineInputError("tensor_parallel_size", `${args.model}: tensor parallelism serves Hugging Face safetensors directories (not GGUF files)`);
  const raw = applyHfOverrides(JSON.parse(fs.readFileSync(path.join(args.hfConfigPath ?? resolved.path, "config.json"), "utf8")) as Record<string, unknown>, args.hfOverrides);
  const config = parseHfConfig(languageModelConfig(raw).config);
  try {
    checkTensorParallelConfig(config, size);
  } catch (e) {
    throw new EngineInputError("tensor_parallel_size", (e as Error).message.replace("[tensor_parallel] ", ""));
  }
  args.onProgress?.(`starting ${size - 1} tensor-parallel rank(s)`, 0);
  const { dtype, tokenizer, loadFormat, hfOverrides, hfConfigPath, ignorePatterns, skipTokenizer } = loadOptions(args);
  const readAs = { hfConfigPath, ignorePatterns: ignorePatterns === undefined ? undefined : [...ignorePatterns], skipTokenizer };
  const tp = await startTensorParallel({ model: resolved.path, dtype, tokenizer, loadFormat, hfOverrides: hfOverrides ?? undefined, ...readAs }, size);
  args.onProgress?.(`starting ${size - 1} tensor-parallel rank(s)`, 1);
  try {
    const loaded = await loadModel(resolved.path, {
      dtype,
      tokenizer,
      loadFormat,
      hfOverrides,
      ...readAs,
      onProgress: args.onProgress,
      deferTokenizerBuild: load.deferTokenizerBuild,
      tp: tp.tp,
    });
    return setup(loaded, args, undefined, tp);
  } catch (e) {
    const err = tp.explain(e);
    await tp.shutdown(500);
    throw err;
  }
}
