// Messages between WorkerEngine (the caller's thread) and engine-worker-main (the worker thread running
// EngineCore). Everything here is structured-clone data: no functions, no class instances except Error-free
// plain objects and Maps (TokenLogprobs).
import type { LoraRequest } from "./lora-manager.js";
import type { ReasoningParserName } from "./reasoning.js";
import type { KvCacheDtype } from "./paged-model-runner.js";
import type { EngineStats, FinishReason, RequestMetrics, SamplingParams, TokenLogprobs, TokenStep } from "./types.js";
import type { KvSnapshot } from "./kv-transfer.js";
import type { MultiModalFeature } from "./model-runner.js";
import type { GenerationConfig } from "../models/tokenizer.js";
import type { ServingArgs } from "./serving.js";
import type { ResolvedEngineArgs } from "./engine-core.js";
import type { PauseMode, SleepLevel, WakeTag } from "./sleep-mode.js";
import { EngineInputError, EngineRequestIdError } from "./errors.js";
import { LogitsProcessorLoadError } from "./logits-processors.js";

/**
 * workerData: the serving arguments without the progress callback (functions cannot cross threads), plus
 * the engine-level logits processors as module specifiers, which the worker imports at start-up.
 */
export type WorkerServingArgs = Omit<ServingArgs, "onProgress"> & { logitsProcessors?: string[] };

/** Main -> worker. `seq` is the caller-side stream id, unique per generate() call (request ids can be reused). */
export type ToWorker =
  /** The serving args, first message to a worker spawned without workerData (prespawnEngineWorker). */
  | { type: "start"; args: WorkerServingArgs }
  | {
      type: "add";
      seq: number;
      requestId: string;
      promptTokenIds: number[];
      params: SamplingParams; // already normalized on the caller's thread, logitsProcessors empty (extraArgs is data)
      priority: number;
      cacheSalt: string | null;
      arrivalTime: number;
      loraRequest: LoraRequest | null;
      kvTransfer: { export?: boolean; import?: KvSnapshot | null } | null;
      /** The prompt's images (their pixels cloned into the worker). */
      mmFeatures: readonly MultiModalFeature[];
      /** GenerateOptions.streamInterval and finalOnly: which steps' outputs the worker sends (output-pacing.ts). */
      streamInterval: number;
      finalOnly: boolean;
    }
  /** Every stream of one abort call, so that aborting a many-input request is one message (and one worker turn). */
  | { type: "abort"; seqs: number[] }
  | { type: "sync"; id: number }
  /** LoRA adapters (vLLM's add_lora / remove_lora): answered in the next update's replies under `id`. */
  | { type: "addLora"; id: number; lora: LoraRequest }
  | { type: "removeLora"; id: number; loraId: number }
  /** vLLM's reset_prefix_cache, between two steps: answered in the next update's replies under `id`. */
  | { type: "resetPrefixCache"; id: number }
  /** Sleep mode (sleep-mode.ts): answered once asleep (mode "wait": once the requests running have finished) / awake. */
  | { type: "sleep"; id: number; level: SleepLevel; mode: PauseMode }
  | { type: "wakeUp"; id: number; tags: WakeTag[] | null }
  /** Before termination: the worker stops what outlives a thread (tensor-parallel rank processes), then says "closed". */
  | { type: "close" };

/** The answer to a call (addLora, removeLora, resetPrefixCache), matched to it by `id`. */
export interface WorkerReply {
  id: number;
  error: WireError | null;
  value?: boolean;
}

/** An error as it crosses the thread boundary; rebuilt into the same class on the caller's side. */
export interface WireError {
  name: string;
  message: string;
  stack?: string;
  param?: string; // EngineInputError
  requestId?: string; // EngineRequestIdError
  specifier?: string; // LogitsProcessorLoadError
}

/** One sample's new tokens and text since the last update of its request. */
export interface WireCompletionDelta {
  index: number;
  text: string;
  tokenIds: number[];
  logprobs: TokenLogprobs[] | null;
  cumulativeLogprob: number | null;
  finishReason: FinishReason;
  stopReason: string | number | null;
}

/** One request's progress in one step: deltas only, so a step's message stays O(batch), not O(batch x length). */
export interface WireOutput {
  seq: number;
  finished: boolean;
  numCachedTokens: number;
  metrics?: RequestMetrics;
  /** Sent with the first update only (the prompt after truncate_prompt_tokens). */
  promptTokenIds?: number[];
  /** New prompt logprobs since the last update (null when the request did not ask for them). */
  promptLogprobs: (TokenLogprobs | null)[] | null;
  outputs: WireCompletionDelta[];
  /** A pooling engine's vector, with the finished update. */
  pooled?: Float32Array;
  /** P/D disaggregation: the prompt's K/V, with the finished update of a request that exported it. */
  kvSnapshot?: KvSnapshot;
  /** RequestOutput.tokenSteps: the steps held back since the last update of a paced request. */
  tokenSteps?: TokenStep[];
}

/** Where the caller's thread loads its own tokenizer from (the worker loads the model). */
/** `generationConfigDir`: where its generation_config.json (EOS ids) is read when not `dir` (vLLM's --tokenizer). */
export type TokenizerSource =
  | { kind: "dir"; dir: string; generationConfigDir?: string }
  | { kind: "gguf"; file: string }
  /** --skip-tokenizer-init: an AbsentTokenizer of the worker's (vocabulary size, EOS and BOS ids). */
  | { kind: "none"; vocabSize: number; eosTokenIds: number[]; bosTokenId: number | null };

/** Worker -> main. */
export type FromWorker =
  | { type: "progress"; stage: string; fraction: number }
  | {
      type: "ready";
      maxModelLen: number;
      reasoningParser: ReasoningParserName | null;
      poolingTask: "embed" | "classify" | null;
      classLabels: string[] | null;
      useSepToken: boolean | null;
      kvTokens: number;
      /** The KV cache's element type (--kv-cache-dtype resolved). */
      kvCacheDtype: KvCacheDtype;
      numBlocks: number;
      blockSize: number;
      vocabSize: number;
      maxLogprobs: number;
      /** The engine's arguments, resolved (for /server_info). */
      engineArgs: ResolvedEngineArgs;
      tokenizer: TokenizerSource;
      generationConfig: GenerationConfig | null;
      stats: EngineStats;
    }
  /** One per engine step (plus one after add errors / aborts / syncs that came in between steps). */
  | {
      type: "update";
      outputs: WireOutput[];
      errors: { seq: number; error: WireError }[];
      syncIds: number[];
      /** Answers to addLora (error or null), removeLora (value: removed) and resetPrefixCache (value: all of it dropped). */
      replies: WorkerReply[];
      stats: EngineStats;
    }
  /** The model failed to load or a step threw: every stream ends with this error. */
  | { type: "fatal"; error: WireError }
  /** The answer to "close". */
  | { type: "closed" };

export function toWireError(e: unknown): WireError {
  if (!(e instanceof Error)) return { name: "Error", message: String(e) };
  const w: WireError = { name: e.name, message: e.message, stack: e.stack };
  if (e instanceof EngineInputError) w.param = e.param;
  if (e instanceof EngineRequestIdError) w.requestId = e.requestId;
  if (e instanceof LogitsProcessorLoadError) w.specifier = e.specifier;
  return w;
}

/** Rebuilds the error class (EngineInputError keeps its `param`, so the server still answers 400; LogitsProcessorLoadError its `specifier`). */
export function fromWireError(w: WireError): Error {
  let e: Error;
  if (w.name === "EngineInputError" && w.param !== undefined) e = new EngineInputError(w.param, "");
  else if (w.name === "EngineRequestIdError" && w.requestId !== undefined) e = new EngineRequestIdError(w.requestId, "");
  else if (w.name === "LogitsProcessorLoadError" && w.specifier !== undefined) e = new LogitsProcessorLoadError(w.specifier, "");
  else {
    e = new Error();
    e.name = w.name;
  }
  e.message = w.message;
  if (w.stack !== undefined) e.stack = `${w.stack}\n    --- in the engine worker, rethrown on the caller's thread ---`;
  return e;
}
