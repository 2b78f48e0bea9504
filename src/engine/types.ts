// Public types of the serving engine, shared by the engine, the offline LLM API and the server.
// Field names follow vLLM's SamplingParams / RequestOutput (camelCase here, snake_case on the wire).
import type { LoraRequest } from "./lora-manager.js";
import type { ReasoningParserName } from "./reasoning.js";
import type { StructuredOutputsParams } from "./structured-output.js";
import type { KvSnapshot } from "./kv-transfer.js";
import type { MultiModalFeature } from "./model-runner.js";
import type { ResolvedEngineArgs } from "./engine-core.js";
import type { PauseMode, SleepLevel, WakeTag, SleepStatus } from "./sleep-mode.js";

export type { StructuredOutputsParams } from "./structured-output.js";

/**
 * A per-request logits processor (vLLM v0 style): gets the generated token ids so far and the logits row and
 * edits it in place. Functions cannot cross to the engine worker: there, use engine-level processors
 * (logits-processors.ts, `--logits-processors`) steered per request by `extraArgs`.
 */
export type RequestLogitsProcessor = (outputTokenIds: readonly number[], logits: Float32Array) => void;

/** A value of SamplingParams.extraArgs: JSON-like data (it is structured-cloned to the engine worker). */
export type ExtraArgValue = string | number | boolean | null | ExtraArgValue[] | { [key: string]: ExtraArgValue };
/** vLLM `extra_args` (the server's `vllm_xargs`): free-form per-request arguments for engine-level logits processors. */
export type ExtraArgs = { [key: string]: ExtraArgValue };

/** vLLM SamplingParams. Every field is optional on input; `normalizeSamplingParams` fills defaults and validates. */
export interface SamplingParams {
  n: number; // samples per prompt (>= 1)
  temperature: number; // 0 = greedy
  topP: number; // (0, 1]
  topK: number; // -1 or 0 = off
  minP: number; // [0, 1]
  presencePenalty: number; // [-2, 2]
  frequencyPenalty: number; // [-2, 2]
  repetitionPenalty: number; // > 0, 1 = off
  seed: number | null; // per-request generator seed
  stop: string[]; // stop strings
  stopTokenIds: number[];
  ignoreEos: boolean;
  maxTokens: number | null; // null = until max_model_len
  minTokens: number;
  logprobs: number | null; // number of top logprobs per generated token (plus the sampled one)
  promptLogprobs: number | null;
  logitBias: Record<number, number> | null;
  allowedTokenIds: number[] | null;
  badWords: string[] | null;
  includeStopStrInOutput: boolean;
  skipSpecialTokens: boolean;
  spacesBetweenSpecialTokens: boolean;
  detokenize: boolean; // false: outputs carry token ids and no text (stop strings need text)
  truncatePromptTokens: number | null;
  logitsProcessors: RequestLogitsProcessor[]; // in-process engines only
  extraArgs: ExtraArgs | null;
  /** Constrains the output to a JSON schema, JSON, a regex, a choice or a grammar (vLLM structured_outputs). */
  structuredOutputs: StructuredOutputsParams | null;
  /**
   * A pooling engine's per-request PoolingParams (vLLM's): `activation` false takes a classifier's raw logits (no
   * softmax / sigmoid), `normalize` false an embedding without L2 normalization. Absent fields (or null): the
   * engine's pooler config. Refused by a generating engine.
   */
  pooling: PoolingOverrides | null;
}

/** vLLM's PoolingParams fields a request may set (SamplingParams.pooling). */
export interface PoolingOverrides {
  normalize?: boolean;
  activation?: boolean;
}

/** One entry of a logprobs list: token id -> {logprob, rank, decoded token}. */
export interface Logprob {
  logprob: number;
  rank: number; // 1 = most likely
  decodedToken: string | null; // null when the request's detokenize is false (vLLM's None)
}
export type TokenLogprobs = Map<number, Logprob>;

export type FinishReason = "stop" | "length" | "abort" | null;

/** vLLM CompletionOutput: one sample of a request. */
export interface CompletionOutput {
  index: number;
  text: string; // full text so far (or delta, when the request asked for deltas)
  tokenIds: number[];
  cumulativeLogprob: number | null;
  logprobs: TokenLogprobs[] | null;
  finishReason: FinishReason;
  stopReason: string | number | null; // the stop string or stop token id that ended it
}

/** vLLM RequestOutput. */
export interface RequestOutput {
  requestId: string;
  prompt: string | null;
  promptTokenIds: number[];
  promptLogprobs: (TokenLogprobs | null)[] | null;
  outputs: CompletionOutput[];
  finished: boolean;
  numCachedTokens: number;
  metrics?: RequestMetrics;
  /** A pooling engine's output for the prompt (vLLM's PoolingRequestOutput data: an embedding), once finished. */
  pooled?: Float32Array | null;
  /** P/D disaggregation: the prompt's K/V, on the final output of a request that asked to export it (kv-transfer.ts). */
  kvSnapshot?: KvSnapshot;
  /**
   * The engine steps whose tokens this output is the first to carry, when steps were held back (a streamInterval
   * above 1, or finalOnly; see output-pacing.ts): when each made its tokens and how many, for per-token metrics.
   * Absent: the output carries one step's tokens, made as it was delivered.
   */
  tokenSteps?: TokenStep[];
}

/** One engine step's new tokens for a request: when it produced them (ms since the epoch) and how many. */
export interface TokenStep {
  time: number;
  tokens: number;
}

export interface RequestMetrics {
  arrivalTime: number; // ms since epoch
  firstScheduledTime: number | null;
  firstTokenTime: number | null;
  lastTokenTime: number | null;
  finishedTime: number | null;
}

/** Engine-wide statistics (exported by the server as vllm:* metrics). */
export interface EngineStats {
  numRunning: number;
  numWaiting: number;
  kvCacheUsage: number; // fraction of blocks in use, [0, 1]
  numFreeBlocks: number;
  numTotalBlocks: number;
  prefixCacheQueries: number; // tokens queried
  prefixCacheHits: number; // tokens hit
  numPreemptions: number;
  /** Speculative decoding: draft runs verified, and their tokens verified and accepted (absent without it). */
  specDrafts?: number;
  specDraftTokens?: number;
  specAcceptedTokens?: number;
  /** Accepted drafts by position in their run, 0 .. num_speculative_tokens - 1 (vLLM's ..._per_pos counter). */
  specAcceptedPerPosition?: number[];
  /** LoRA (absent without it): max_loras, and the adapters of running and of waiting requests, by name. */
  lora?: { maxLoras: number; running: string[]; waiting: string[] };
  /** KV-cache events (absent without --kv-events-config): batches published, and batches and events dropped. */
  kvEvents?: { publishedBatches: number; droppedBatches: number; droppedEvents: number };
  /** Sleep mode (absent without enableSleepMode): whether the engine sleeps, at which level, and what memory is asleep. */
  sleep?: SleepStatus;
}

/** Per-request options of EngineClient.generate. */
export interface GenerateOptions {
  requestId: string;
  priority?: number;
  /** Each output carries only new text/tokens. */
  delta?: boolean;
  cacheSalt?: string;
  /** The adapter to serve it with. */
  loraRequest?: LoraRequest | null;
  /** P/D disaggregation: export the prompt's K/V when it finishes, or import a prefill engine's (kv-transfer.ts). */
  kvTransfer?: { export?: boolean; import?: KvSnapshot | null } | null;
  /** The prompt's images (an image-text model): processed pixels and the prompt positions each one fills. */
  mmFeatures?: readonly MultiModalFeature[];
  /**
   * Deliver an output every this many new tokens (and the first and the finished one): vLLM's --stream-interval.
   * Default 1: every step's.
   */
  streamInterval?: number;
  /**
   * Only the finished output matters (vLLM's RequestOutputKind.FINAL_ONLY, its server's choice for non-streaming
   * requests). Kiln still delivers the first output and, every FINAL_ONLY_FLUSH_MS, a partial one (output-pacing.ts).
   */
  finalOnly?: boolean;
}

/** What the server needs from an engine: implemented by AsyncLLM. */
export interface EngineClient {
  /** Streams outputs for one request. With `delta`, each output carries only new text/tokens; `loraRequest` names its adapter. */
  generate(
    prompt: { promptTokenIds: number[]; prompt?: string },
    params: Partial<SamplingParams>,
    options: GenerateOptions,
  ): AsyncIterable<RequestOutput>;
  /**
   * Aborts requests (vLLM's AsyncLLM.abort takes one id or many): a multi-input HTTP request passes all its ids in one
   * call, which a worker engine sends as one message. Unknown or finished ids are ignored.
   */
  abort(requestIds: string | readonly string[]): void;
  /**
   * Reads and checks a LoRA adapter in the engine (vLLM's add_lora); rejects with EngineInputError (lora_request)
   * when it cannot be served. Absent on engines without LoRA support.
   */
  addLora?(lora: LoraRequest): Promise<void>;
  /** Drops an adapter no request uses (vLLM's remove_lora); false when unknown or in use. */
  removeLora?(id: number): Promise<boolean>;
  /**
   * Drops the prefix cache (vLLM's reset_prefix_cache): every KV block no request holds loses its hash, so a repeated
   * prompt is computed again; true when that was every cached block (nothing was running).
   */
  resetPrefixCache?(): Promise<boolean>;
  /**
   * vLLM's sleep (sleep-mode.ts): resolves once asleep (mode "wait": once the requests running have finished). Rejects
   * with EngineInputError without sleep mode, or for a level 2 the engine could not wake from. Absent: no sleep mode.
   */
  sleep?(level: SleepLevel, mode: PauseMode): Promise<void>;
  /** vLLM's wake_up: wakes the tags given (null: everything); generation resumes once nothing is asleep. */
  wakeUp?(tags: readonly WakeTag[] | null): Promise<void>;
  /** Whether the engine sleeps (vLLM's is_sleeping), as of the last step or sleep call. */
  isSleeping?(): boolean;
  /** The engine's resolved arguments (block size, pool size, scheduling, ...), as /server_info reports them. */
  readonly engineArgs?: Readonly<ResolvedEngineArgs>;
  /**
   * The error that ended the engine for good (vLLM's dead_error: its worker, or a tensor-parallel rank, died), or null
   * while it serves; /health then answers 503. Absent: an engine that cannot die apart from its server.
   */
  deadError?(): Error | null;
  stats(): EngineStats;
  readonly maxModelLen: number;
  /** The engine's reasoning parser (vLLM's --reasoning-parser): its structured output starts after </think>. */
  readonly reasoningParser?: ReasoningParserName | null;
  /** A pooling engine's task ("embed": vectors, "classify": class scores); null/absent when it generates. */
  readonly poolingTask?: "embed" | "classify" | null;
  /** A classifying engine's label names, in score order. */
  readonly classLabels?: readonly string[] | null;
  /** A classifying engine's use_sep_token: a cross-encoder scores text pairs (true) or the texts joined (false). */
  readonly useSepToken?: boolean | null;
}
