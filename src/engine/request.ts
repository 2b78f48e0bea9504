// Engine-side state of one sequence (vLLM v1 Request). A user request with n > 1 fans out into n child
// Requests (ids `${index}_${parentId}`, as vLLM's ParentRequest) that share the prompt's KV blocks through
// the prefix cache: the first child caches the prompt's full blocks when it allocates them, the others hit.
import type { IncrementalDetokenizerLike } from "../models/tokenizer-types.js";
import type { BlockHash } from "./block-pool.js";
import type { FinishReason, RequestMetrics, SamplingParams, TokenLogprobs } from "./types.js";
import { Rng } from "./rng.js";
import type { LoraRequest } from "./lora-manager.js";
import type { RequestGrammar } from "./structured-output.js";
import type { KvSnapshot } from "./kv-transfer.js";
import type { MultiModalFeature } from "./model-runner.js";

export type RequestStatus =
  | "WAITING"
  | "RUNNING"
  | "PREEMPTED"
  | "FINISHED_STOPPED" // eos, stop token or stop string
  | "FINISHED_LENGTH_CAPPED" // max_tokens or max_model_len
  | "FINISHED_ABORTED";

export const isFinished = (s: RequestStatus): boolean => s.startsWith("FINISHED_");

export function finishReasonOf(s: RequestStatus): FinishReason {
  switch (s) {
    case "FINISHED_STOPPED":
      return "stop";
    case "FINISHED_LENGTH_CAPPED":
      return "length";
    case "FINISHED_ABORTED":
      return "abort";
    default:
      return null;
  }
}

export interface RequestInit {
  requestId: string;
  prompt: string | null;
  promptTokenIds: readonly number[];
  params: SamplingParams;
  eosTokenIds: readonly number[];
  /** max_tokens resolved against max_model_len. */
  maxTokens: number;
  arrivalTime?: number;
  priority?: number;
  cacheSalt?: string | null;
  /** The LoRA adapter it runs with (vLLM's lora_request), or none. */
  lora?: LoraRequest | null;
  /** For n > 1 children: the user's request id and this sample's index. */
  parentId?: string;
  index?: number;
  /** bad_words already tokenized: each entry a token sequence. */
  badWordsTokenIds?: number[][];
  detokenizer?: IncrementalDetokenizerLike | null;
  /** The prompt's images, in prompt order (their runs of positions do not overlap). */
  mmFeatures?: readonly MultiModalFeature[];
}

export class Request {
  readonly requestId: string;
  readonly parentId: string;
  readonly index: number;
  readonly prompt: string | null;
  readonly promptTokenIds: readonly number[];
  /** prompt ++ output; KV positions index into it. */
  readonly allTokenIds: number[];
  readonly outputTokenIds: number[] = [];
  readonly params: SamplingParams;
  readonly eosTokenIds: readonly number[];
  readonly maxTokens: number;
  readonly priority: number;
  readonly arrivalTime: number;
  readonly cacheSalt: string | null;
  readonly lora: LoraRequest | null;
  readonly badWordsTokenIds: number[][];
  /** The prompt's images (none for a text prompt). */
  readonly mmFeatures: readonly MultiModalFeature[];
  /** Per-request generator when seeded; null = the engine's shared generator. */
  readonly generator: Rng | null;

  status: RequestStatus = "WAITING";
  /** Tokens whose KV is in the cache (advanced by the scheduler when it schedules them). */
  numComputedTokens = 0;
  /**
   * Async scheduling: tokens scheduled before they are sampled (the step that samples them is still
   * computing). The next step's input for such a position is filled in once the token is known.
   */
  numOutputPlaceholders = 0;
  /** Prompt tokens served from the prefix cache the first time it was scheduled; -1 before that. */
  numCachedTokens = -1;
  numPreemptions = 0;
  /** Chain hashes of the full blocks of allTokenIds (filled lazily by the KV cache manager). */
  readonly blockHashes: BlockHash[] = [];

  readonly detokenizer: IncrementalDetokenizerLike | null;
  /** Output text, truncated at a stop string once one is found. */
  outputText = "";
  stopReason: string | number | null = null;
  readonly logprobs: TokenLogprobs[] | null;
  cumulativeLogprob = 0;
  /** One entry per prompt token (null for the first), filled chunk by chunk. */
  readonly promptLogprobs: (TokenLogprobs | null)[] | null;
  readonly metrics: RequestMetrics;
  /** Speculative decoding: draft tokens proposed after the last known token, for the next step to verify. */
  specTokenIds: number[] = [];
  /**
   * Speculative decoding's back-off: after a step whose drafts were all rejected, the request decodes this many
   * steps without drafts (1, 2, 4, ... up to 16 while rejections continue; reset when a draft is kept).
   */
  specPause = { skip: 0, next: 1 };
  /** Structured output: the request's grammar matcher (masks each step's logits, advanced by each token). */
  grammar: RequestGrammar | null = null;
  /** A pooling engine: the pooled state so far (a sum of rows for MEAN), then the output once the prompt is read. */
  pooledState: Float32Array | null = null;
  pooledOutput: Float32Array | null = null;
  /** P/D disaggregation (kv-transfer.ts), a prefill engine's request: copy the prompt's K/V out when it finishes. */
  kvExport = false;
  /** Its block table when it finished (stopped or capped, not aborted), for that copy; null otherwise. */
  exportBlockTable: number[] | null = null;
  /** That copy, once taken (the engine hands it out with the request's final output). */
  kvSnapshot: KvSnapshot | null = null;
  /** A decode engine's request: K/V computed elsewhere for a prefix of the prompt, written in when first admitted. */
  kvImport: KvSnapshot | null = null;

  constructor(init: RequestInit) {
    this.requestId = init.requestId;
    this.parentId = init.parentId ?? init.requestId;
    this.index = init.index ?? 0;
    this.prompt = init.prompt;
    this.promptTokenIds = init.promptTokenIds;
    this.allTokenIds = [...init.promptTokenIds];
    this.params = init.params;
    this.eosTokenIds = init.eosTokenIds;
    this.maxTokens = init.maxTokens;
    this.priority = init.priority ?? 0;
    this.arrivalTime = init.arrivalTime ?? Date.now();
    this.cacheSalt = init.cacheSalt ?? null;
    this.lora = init.lora ?? null;
    this.badWordsTokenIds = init.badWordsTokenIds ?? [];
    this.mmFeatures = init.mmFeatures ?? [];
    this.generator = init.params.seed === null ? null : new Rng(init.params.seed);
    this.detokenizer = init.detokenizer ?? null;
    this.logprobs = init.params.logprobs === null ? null : [];
    this.promptLogprobs = init.params.promptLogprobs === null ? null : [null];
    this.metrics = {
      arrivalTime: this.arrivalTime,
      firstScheduledTime: null,
      firstTokenTime: null,
      lastTokenTime: null,
      finishedTime: null,
    };
  }

  get numPromptTokens(): number {
    return this.promptTokenIds.length;
  }

  /** Known tokens (prompt + sampled); the KV of all but the last sampled one is computed while decoding. */
  get numTokens(): number {
    return this.allTokenIds.length;
  }

  get numOutputTokens(): number {
    return this.outputTokenIds.length;
  }

  /** The LoRA adapter's id, or null. */
  get loraId(): number | null {
    return this.lora?.id ?? null;
  }

  get isFinished(): boolean {
    return isFinished(this.status);
  }

  appendOutputToken(tokenId: number): void {
    this.outputTokenIds.push(tokenId);
    this.allTokenIds.push(tokenId);
  }
}
