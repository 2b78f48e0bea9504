// The seam between the CLI and model loading: turns ServeArgs into a running engine + tokenizer.
// The worker path imports only what the main thread needs (WorkerEngine, the tokenizer): the model, tensor and
// engine-core modules load in the worker, so start-up does not pay for them twice. The in-process path imports
// them when it runs.
import type { EngineClient, SamplingParams } from "../engine/types.js";
import type { TokenizerLike } from "../models/tokenizer-types.js";
import type { ServeArgs } from "./serve-args.js";
import type { KvCacheDtype } from "../engine/paged-model-runner.js";
import type { ServingArgs } from "../engine/serving.js";
import { generationDefaults } from "../engine/sampling-params.js";
import { WorkerEngine } from "../engine/worker-engine.js";
import { env } from "../util/env.js";
import type { DtypeArg } from "../models/loader.js";
import { resolveQuantization } from "../models/quantization-args.js";
import type { GenerationConfig } from "../models/tokenizer.js";


/** Reports start-up stages ("loading weights", "sizing KV cache", "warm-up") and optional progress in [0, 1]. */
export type ProgressFn = (stage: string, fraction?: number) => void;

export interface LoadedEngine {
  engine: EngineClient;
  tokenizer: TokenizerLike;
  maxModelLen: number;
  modelName: string;
  /** Default sampling params from generation_config.json (per --generation-config). */
  generationDefaults?: Partial<SamplingParams>;
  close(): Promise<void>;
}

/**
 * `whileLoading` is called once the engine loads off the caller's thread (the worker is spawned), so the
 * caller can use its thread meanwhile without delaying the worker's start (e.g. import the HTTP server).
 */
export type EngineFactory = (args: ServeArgs, progress: ProgressFn, whileLoading?: () => void) => Promise<LoadedEngine>;

/**
 * Loads the model, sizes the paged KV cache, warms the step up and returns the streaming engine: a
 * WorkerEngine (the engine core in a worker thread), or the in-process AsyncLLM with KILN_ENGINE_IN_PROCESS=1.
 */
export const createEngineFromArgs: EngineFactory = async (args, progress, whileLoading) => {
  resolveQuantization(args.quantization); // unsupported methods fail before any weight is read
  progress("loading weights", 0);
  const servingArgs = servingArgsOf(args, progress);
  const specs = args.logitsProcessors;
  const loaded = env.engineInProcess ? await inProcessEngine(servingArgs, specs) : await workerEngine(servingArgs, specs, whileLoading);
  progress(`KV cache (${loaded.kvCacheDtype}): ${loaded.numBlocks - 1} blocks of ${loaded.blockSize} tokens = ${loaded.kvTokens} tokens`, 1);
  progress("warm-up", 0);
  // (ids the model has: a --tokenizer larger than the model's vocabulary may encode the word past it)
  const hello = args.skipTokenizerInit ? [] : loaded.tokenizer.encode("Hello").filter((id) => id < loaded.vocabSize);
  const warmup = loaded.engine.generate({ promptTokenIds: hello.length > 0 ? hello : [0] }, { maxTokens: 2, temperature: 0 }, { requestId: "kiln-warmup" });
  for await (const _ of warmup) void _;
  progress("warm-up", 1);
  return {
    engine: loaded.engine,
    tokenizer: loaded.tokenizer,
    maxModelLen: loaded.engine.maxModelLen,
    modelName: args.model,
    generationDefaults: generationDefaults(args.generationConfig, loaded.generationConfig, args.overrideGenerationConfig),
    close: loaded.close,
  };
};

/** The engine arguments (vLLM's names, camelCase) of `kiln serve`'s flags. */
export function servingArgsOf(args: ServeArgs, progress: ProgressFn): ServingArgs {
  return {
    model: args.model,
    dtype: args.dtype as DtypeArg,
    quantization: args.quantization,
    maxModelLen: args.maxModelLen ?? undefined,
    maxNumSeqs: args.maxNumSeqs ?? undefined,
    maxNumBatchedTokens: args.maxNumBatchedTokens ?? undefined,
    blockSize: args.blockSize ?? undefined,
    kvCacheMemory: args.kvCacheMemoryBytes ?? undefined,
    kvCacheDtype: args.kvCacheDtype,
    ...(args.numGpuBlocksOverride !== null ? { numGpuBlocksOverride: args.numGpuBlocksOverride } : {}),
    gpuMemoryUtilization: args.kvCacheMemoryBytes === null ? Math.min(args.gpuMemoryUtilization, 0.25) : undefined,
    enablePrefixCaching: args.enablePrefixCaching ?? undefined,
    seed: args.seed,
    schedulingPolicy: args.schedulingPolicy,
    logprobsMode: args.logprobsMode,
    enforceEager: args.enforceEager,
    ...(args.enableSleepMode ? { enableSleepMode: true } : {}),
    // vLLM's one capture size (tokens) caps both kinds of step graph: decode batches and mixed steps
    ...(args.maxCaptureSize !== null ? { maxCaptureSize: args.maxCaptureSize, maxCaptureTokens: args.maxCaptureSize } : {}),
    asyncScheduling: args.asyncScheduling ?? undefined,
    loadFormat: args.loadFormat,
    ...(args.hfOverrides !== null ? { hfOverrides: args.hfOverrides } : {}),
    ...(args.hfConfigPath !== null ? { hfConfigPath: args.hfConfigPath } : {}),
    ...(args.hfToken !== null ? { hfToken: args.hfToken } : {}),
    ignorePatterns: args.ignorePatterns,
    ...(args.skipTokenizerInit ? { skipTokenizerInit: true } : {}),
    ...(args.revision !== null ? { revision: args.revision } : {}),
    ...(args.downloadDir !== null ? { downloadDir: args.downloadDir } : {}),
    ...(args.disableSlidingWindow ? { disableSlidingWindow: true } : {}),
    ...(args.speculativeConfig !== null ? { speculativeConfig: args.speculativeConfig } : {}),
    ...(args.kvEventsConfig !== null ? { kvEventsConfig: args.kvEventsConfig } : {}),
    ...(args.enableLora
      ? { enableLora: true, maxLoras: args.maxLoras ?? undefined, maxLoraRank: args.maxLoraRank ?? undefined, maxCpuLoras: args.maxCpuLoras ?? undefined }
      : {}),
    ...(args.runner === "pooling" ? { runner: "pooling" as const, poolerConfig: args.poolerConfig } : {}),
    // (gpt-oss's openai_gptoss is read by the server: the engine has no <think> markers to gate structured output on)
    ...(args.reasoningParser !== null && args.reasoningParser !== "openai_gptoss" ? { reasoningParser: args.reasoningParser } : {}),
    ...(args.tokenizer !== null ? { tokenizer: args.tokenizer } : {}),
    maxLogprobs: args.maxLogprobs,
    enableChunkedPrefill: args.enableChunkedPrefill ?? undefined,
    longPrefillTokenThreshold: args.longPrefillTokenThreshold ?? undefined,
    ...(args.tensorParallelSize > 1 ? { tensorParallelSize: args.tensorParallelSize } : {}),
    ...(args.limitMmPerPrompt !== null ? { limitMmPerPrompt: args.limitMmPerPrompt } : {}),
    ...(args.mmProcessorKwargs !== null ? { mmProcessorKwargs: args.mmProcessorKwargs } : {}),
    ...(args.interleaveMmStrings ? { interleaveMmStrings: true } : {}),
    onProgress: (stage, f) => progress(stage, f),
  };
}

interface StartedEngine {
  engine: EngineClient;
  tokenizer: TokenizerLike;
  generationConfig: GenerationConfig | null;
  numBlocks: number;
  blockSize: number;
  kvTokens: number;
  kvCacheDtype: KvCacheDtype;
  /** The model's vocabulary (a --tokenizer may hold more ids: requests using those get a 400). */
  vocabSize: number;
  close(): Promise<void>;
}

async function workerEngine(servingArgs: ServingArgs, logitsProcessors: string[], whileLoading?: () => void): Promise<StartedEngine> {
  const starting = WorkerEngine.create({ ...servingArgs, logitsProcessors }); // spawns the worker synchronously
  whileLoading?.();
  const engine = await starting;
  const { tokenizer, generationConfig, numBlocks, blockSize, kvTokens, kvCacheDtype, vocabSize } = engine;
  return { engine, tokenizer, generationConfig, numBlocks, blockSize, kvTokens, kvCacheDtype, vocabSize, close: () => engine.close() };
}

async function inProcessEngine(servingArgs: ServingArgs, specs: string[]): Promise<StartedEngine> {
  // the events are published from the engine worker's step loop
  if (servingArgs.kvEventsConfig != null) throw new Error("--kv-events-config needs the engine worker thread (unset KILN_ENGINE_IN_PROCESS)");
  const [{ AsyncLLM }, { createServingSetup }, { instantiateLogitsProcessors, loadLogitsProcessors }] = await Promise.all([
    import("../engine/async-llm.js"),
    import("../engine/serving.js"),
    import("../engine/logits-processors.js"),
  ]);
  const exports = await loadLogitsProcessors(specs); // before the model, as the worker does
  const { loaded, runner, engineArgs, kvTokens, tp, draft } = await createServingSetup(servingArgs);
  const logitsProcessors = instantiateLogitsProcessors(exports, { vocabSize: runner.vocabSize }, specs);
  const engine = new AsyncLLM({ runner, tokenizer: loaded.tokenizer, engineArgs, logitsProcessors, draft });
  // a tensor-parallel rank that dies while the engine idles fails it now (as the worker engine's), not at the next request
  tp?.onFailure((err) => {
    engine.fail(err);
    void tp.shutdown(0, false); // the surviving ranks, if any
  });
  return {
    engine,
    tokenizer: loaded.tokenizer,
    generationConfig: loaded.generationConfig,
    numBlocks: engineArgs.numGpuBlocks,
    blockSize: engineArgs.blockSize ?? 16,
    kvTokens,
    kvCacheDtype: runner.kvCacheDtype,
    vocabSize: runner.vocabSize,
    close: async () => {
      await engine.close(); // its grammar threads
      await tp?.shutdown(); // the other tensor-parallel ranks, if any
      runner.dispose();
      draft?.dispose();
    },
  };
}

