// EngineCore: the serving loop in one place. step() = scheduler.schedule() -> runner.execute() ->
// sampler.sample() -> scheduler.update(). A plain synchronous class with no I/O (it runs inside a worker
// thread with AsyncLLM talking to it by messages).
//
// Async scheduling (vLLM's --async-scheduling; on by default when the runner can dispatch): step N is
// queued on the device, step N+1 is scheduled while N computes (requests sampled by N get an output
// placeholder), then N's logits are read, sampled and applied, N+1's placeholders are filled with the
// sampled ids and N+1 is dispatched before step() returns N's outputs. Outputs are identical to the
// synchronous loop; requests that finish in N are dropped from N+1 before it runs. The text of N's tokens is
// decoded after N+1 is dispatched, except for requests with stop strings (whose text can finish them).
// When N samples on the device and every placeholder of N+1 is one of N's rows, N+1 is dispatched before N is
// read, its placeholders fed from N's sampled ids on the device (vLLM's async scheduling does the same with
// the previous step's sampled ids on the GPU): the device goes from N to N+1 without waiting for the host.
// Requests that finish in N then run in N+1 too; update() skips their rows.
// What the host spends per step then shows only in part: the JS thread used 380-480 us of CPU per token
// (SmolLM-135M Q8_0, one stream, positions 16-80, ~5 ms steps; per-thread runtime from /proc schedstat) on a machine
// whose two cores the device's two threads keep busy, yet 300 us of busy work added to every step() left the time
// per token at 1.03x (median of 12 alternating blocks of 64 tokens; blocks 0.89-1.08x) where 300 us outside the
// device's step would add 1.06x.
import type { TokenizerLike, IncrementalDetokenizerLike } from "../models/tokenizer-types.js";
import { IncrementalDetokenizer } from "./detokenizer.js";
import { EngineInputError, EngineRequestIdError } from "./errors.js";
import { KvCacheManager } from "./kv-cache-manager.js";
import { LoraManager, type LoraConfig, type LoraRequest } from "./lora-manager.js";
import { LoraError } from "../models/lora.js";
import { isPoolingType, type MultiModalFeature, type FedTokens, type ModelRunner, type PendingRunnerOutput, type PoolingType, type RunnerOutput, type ScheduledBatch } from "./model-runner.js";
import { Request, finishReasonOf } from "./request.js";
import { Rng } from "./rng.js";
import { LOGPROBS_MODES, Sampler, type LogitsProcessorInput, type LogprobsMode, type SamplingRow } from "./sampler.js";
import { normalizeSamplingParams } from "./sampling-params.js";
import { Scheduler, type RequestUpdate, type SchedulerOutput, type SchedulingPolicy } from "./scheduler.js";
import { stopHoldback } from "./stop-checker.js";
import { isModelDraftMethod, proposeNgram, resolveSpeculativeConfig, type Drafter, type NgramSpeculativeConfig, type SpeculativeConfig } from "./speculative.js";
import type { ClassifierConfig } from "../models/hf-config.js";
import {
  harmonyEnd, hasTokenMarkers, REASONING_PARSERS, textMarkersRefusal, thinkEnd, thinkMarkers, type ReasoningEnd, type ReasoningParserName,
} from "./reasoning.js";
import { harmonyReplyVocab } from "./harmony-grammar.js";
import { GrammarThread } from "./grammar-thread.js";
import { RequestGrammar, applyBitmask, structuredOutputSpec } from "./structured-output.js";
import type { KvCacheEvent } from "./kv-events.js";
import { layoutMismatch, type KvSnapshot } from "./kv-transfer.js";
import type { CompletionOutput, EngineStats, PoolingOverrides, RequestOutput, SamplingParams } from "./types.js";
import { EngineSleepingError, SleepState, WAKE_TAGS, type MemoryTag, type SleepLevel, type SleepStatus, type WakeTag } from "./sleep-mode.js";

/** Engine arguments, vLLM's names in camelCase. */
export interface EngineArgs {
  maxModelLen: number;
  /** KV blocks in the pool, including the reserved null block 0 (the lead derives it from kvCacheMemory). */
  numGpuBlocks: number;
  blockSize?: number; // 16
  maxNumSeqs?: number; // 256
  maxNumBatchedTokens?: number; // 2048
  enablePrefixCaching?: boolean; // true
  enableChunkedPrefill?: boolean; // true
  longPrefillTokenThreshold?: number; // 0 = off
  schedulingPolicy?: SchedulingPolicy; // "fcfs"
  seed?: number; // 0: the generator of unseeded requests
  maxLogprobs?: number; // 20
  /**
   * vLLM's --logprobs-mode: "raw_logprobs" (default, as vLLM v1) reports log_softmax of the model's logits, whatever
   * the request's temperature, penalties and top-k/top-p; "processed_logprobs" that of the logits after them.
   */
  logprobsMode?: LogprobsMode;
  /** EOS ids when no tokenizer is given (otherwise tokenizer.eosTokenIds). */
  eosTokenIds?: number[];
  /** Schedule the next step while the current one computes (default: when the runner has dispatch(); off with speculation). */
  asyncScheduling?: boolean;
  /** Speculative decoding (vLLM's speculative_config): n-gram drafts verified in one step. Default none. */
  speculativeConfig?: Partial<SpeculativeConfig> | null;
  /** LoRA serving (vLLM's --enable-lora with --max-loras / --max-lora-rank / --max-cpu-loras); needs runner.lora. Default none. */
  lora?: LoraConfig | null;
  /**
   * A pooling engine (vLLM's --runner pooling, embeddings): each request reads its prompt and finishes with the
   * pooled final hidden state (RequestOutput.pooled) instead of generating. Default none (a generating engine).
   */
  pooler?: PoolerConfig | null;
  /**
   * vLLM's --reasoning-parser: the model thinks between <think> and </think> first, and structured output
   * constrains only what follows (see reasoning.ts). Needs a tokenizer holding both markers as tokens. Default none.
   */
  reasoningParser?: ReasoningParserName | null;
  /**
   * vLLM's enable_kv_cache_events: the block pool records the prefix-cache blocks it stores and evicts, which
   * takeKvEvents() hands out after each step (the worker publishes them; see kv-events.ts). Default false.
   */
  enableKvCacheEvents?: boolean;
  /**
   * vLLM's enable_sleep_mode: sleep() and wakeUp() may free the KV cache (level 1) and the weights (level 2) while
   * the engine idles (sleep-mode.ts). Default false: they are refused.
   */
  enableSleepMode?: boolean;
}

/** vLLM's pooler config: how a prompt's final hidden states become one vector. */
export interface PoolerConfig {
  poolingType: PoolingType;
  /** L2-normalize the pooled vector (vLLM's default for embeddings). */
  normalize: boolean;
  /**
   * Classify (a *ForSequenceClassification model, vLLM's classify task): the pooled state goes through the model's
   * classifier head, and the request's output is its class scores instead of an embedding. Default false.
   */
  classify?: boolean;
  /** vLLM's PoolerConfig.activation for classify: softmax / sigmoid the logits (see classScores). Default true. */
  activation?: boolean;
}

/**
 * A classifier's scores from its logits, as vLLM's ClassifierPooler activates them (after HF's problem_type):
 * regression keeps the logits; multi-label takes each label's sigmoid; otherwise softmax over 2+ labels, the sigmoid
 * of a single one (a cross-encoder's relevance).
 */
export function classScores(logits: Float32Array, c: ClassifierConfig, activation: boolean): Float32Array {
  if (!activation || c.problemType === "regression") return logits;
  const sigmoid = (x: number) => 1 / (1 + Math.exp(-x));
  if (c.problemType === "multi_label_classification" || logits.length < 2) return logits.map(sigmoid);
  let max = -Infinity;
  for (const x of logits) max = Math.max(max, x);
  let sum = 0;
  const e = logits.map((x) => Math.exp(x - max));
  for (const x of e) sum += x;
  return e.map((x) => x / sum);
}

export type ResolvedEngineArgs = Required<Omit<EngineArgs, "asyncScheduling" | "speculativeConfig" | "lora" | "pooler" | "reasoningParser">> & {
  asyncScheduling: boolean | null;
  speculativeConfig: SpeculativeConfig | null;
  lora: LoraConfig | null;
  pooler: PoolerConfig | null;
  reasoningParser: ReasoningParserName | null;
};

/** Device-sampled token ids as the sampler's rows (a plain loop: Array.from with a mapper is slow on a typed array). */
function deviceSampled(ids: Int32Array): { tokenId: number; logprobs: null }[] {
  const out = new Array<{ tokenId: number; logprobs: null }>(ids.length);
  for (let i = 0; i < ids.length; i++) out[i] = { tokenId: ids[i]!, logprobs: null };
  return out;
}

/** How long an idle step waits for a grammar being compiled before it returns (ms). */
const GRAMMAR_WAIT_MS = 5;

/** Structured output: the masks of a dispatched step's sampled rows, computed while the device runs it. */
function prefetchGrammarMasks(out: SchedulerOutput): void {
  for (const s of out.scheduled) if (s.needsLogits && !s.request.isFinished) s.request.grammar?.prefetchMask();
}

export function resolveEngineArgs(a: EngineArgs): ResolvedEngineArgs {
  const r: ResolvedEngineArgs = {
    blockSize: 16,
    maxNumSeqs: 256,
    maxNumBatchedTokens: 2048,
    enablePrefixCaching: true,
    enableKvCacheEvents: false,
    enableSleepMode: false,
    enableChunkedPrefill: true,
    longPrefillTokenThreshold: 0,
    schedulingPolicy: "fcfs",
    seed: 0,
    maxLogprobs: 20,
    logprobsMode: "raw_logprobs",
    eosTokenIds: [],
    asyncScheduling: null,
    ...Object.fromEntries(Object.entries(a).filter(([, v]) => v !== undefined)),
    speculativeConfig: a.speculativeConfig ? resolveSpeculativeConfig(a.speculativeConfig) : null,
    lora: a.lora ?? null,
    pooler: a.pooler ?? null,
    reasoningParser: a.reasoningParser ?? null,
  } as unknown as ResolvedEngineArgs;
  if (r.reasoningParser !== null && !(REASONING_PARSERS as readonly string[]).includes(r.reasoningParser))
    throw new Error(`[engine] reasoningParser must be one of ${REASONING_PARSERS.join(", ")}, got ${String(r.reasoningParser)}`);
  if (r.pooler !== null) {
    if (!isPoolingType(r.pooler.poolingType))
      throw new Error(`[engine] pooler.poolingType must be LAST, MEAN or CLS, got ${String(r.pooler.poolingType)}`);
    if (r.speculativeConfig !== null) throw new Error("[engine] a pooling engine does not generate: speculativeConfig does not apply");
    if (r.asyncScheduling === true) throw new Error("[engine] a pooling engine runs without async scheduling");
    r.asyncScheduling = false; // nothing is sampled: no step to overlap with the next one's scheduling
    // MEAN and CLS read every prompt row: cached blocks would skip rows (vLLM caches prefixes only for LAST pooling)
    if (r.pooler.poolingType !== "LAST") r.enablePrefixCaching = false;
  }
  if (r.speculativeConfig !== null) {
    // the next step's drafts depend on how many of this step's were accepted (vLLM turned async off with it too)
    if (r.asyncScheduling === true) throw new Error("[engine] asyncScheduling cannot be combined with speculativeConfig");
    r.asyncScheduling = false;
  }
  const posInt = (k: keyof ResolvedEngineArgs, min = 1): void => {
    const v = r[k];
    if (typeof v !== "number" || !Number.isInteger(v) || v < min)
      throw new Error(`[engine] ${k} must be an integer >= ${min}, got ${String(v)}`);
  };
  posInt("maxModelLen");
  posInt("numGpuBlocks", 2);
  posInt("blockSize");
  posInt("maxNumSeqs");
  posInt("maxNumBatchedTokens");
  posInt("longPrefillTokenThreshold", 0);
  posInt("maxLogprobs", 0);
  // without chunked prefill a prompt is scheduled whole: a longer one than the step budget would wait forever
  if (!r.enableChunkedPrefill && r.maxNumBatchedTokens < r.maxModelLen)
    throw new Error(`[engine] maxNumBatchedTokens (${r.maxNumBatchedTokens}) must be >= maxModelLen (${r.maxModelLen}) without chunked prefill`);
  if (!LOGPROBS_MODES.includes(r.logprobsMode))
    throw new Error(`[engine] logprobsMode must be one of ${LOGPROBS_MODES.join(", ")}, got ${String(r.logprobsMode)}`);
  if (r.schedulingPolicy !== "fcfs" && r.schedulingPolicy !== "priority")
    throw new Error(`[engine] schedulingPolicy must be fcfs or priority, got ${String(r.schedulingPolicy)}`);
  return r;
}

/** One request as the engine accepts it. */
export interface EngineRequestInput {
  requestId: string;
  promptTokenIds: number[];
  prompt?: string | null;
  params?: Partial<SamplingParams>;
  priority?: number;
  cacheSalt?: string | null;
  /** The LoRA adapter to serve the request with (vLLM's lora_request); the engine must have LoRA enabled. */
  loraRequest?: LoraRequest | null;
  arrivalTime?: number;
  /**
   * As vLLM's RequestOutputKind: "cumulative" (default) returns the request's output from every step() that gave
   * it tokens; "final_only" only from the step() that finishes it (what LLM.generate reads), which spares the
   * per-step copies and text flushes of outputs nobody reads.
   */
  outputKind?: "cumulative" | "final_only";
  /**
   * P/D disaggregation (kv-transfer.ts; vLLM's kv_transfer_params): `export` copies the prompt's K/V out when the
   * request finishes (RequestOutput.kvSnapshot); `import` is K/V a prefill engine computed for (a prefix of) this
   * prompt, written into its blocks instead of computing them. Needs a runner that moves K/V.
   */
  kvTransfer?: { export?: boolean; import?: KvSnapshot | null } | null;
  /** The prompt's images (the runner must serve an image-text model: ModelRunner.supportsImages). */
  mmFeatures?: readonly MultiModalFeature[];
}

/** A user request: n > 1 fans out into n child Requests. */
interface ParentRequest {
  requestId: string;
  prompt: string | null;
  promptTokenIds: number[];
  children: Request[];
  finalOnly: boolean;
}

export interface EngineCoreOptions {
  tokenizer?: TokenizerLike | null;
  /** Detokenizer factory (default: IncrementalDetokenizer over the tokenizer). */
  createDetokenizer?: (promptTokenIds: readonly number[], params: SamplingParams) => IncrementalDetokenizerLike;
  /** Engine-level logits processors (vLLM `logits_processors`): instances, or classes built with {vocabSize}. */
  logitsProcessors?: readonly LogitsProcessorInput[];
  /** The drafter of speculativeConfig's "draft_model", "eagle" and "eagle3" methods (serving.ts builds it). */
  draft?: Drafter | null;
}

export class EngineCore {
  readonly args: ResolvedEngineArgs;
  readonly kv: KvCacheManager;
  readonly scheduler: Scheduler;
  readonly sampler: Sampler;
  private readonly parents = new Map<string, ParentRequest>();
  private readonly tokenizer: TokenizerLike | null;
  private readonly createDetokenizer: EngineCoreOptions["createDetokenizer"];
  private readonly eosTokenIds: number[];
  private readonly draft: Drafter | null;
  /** Structured output's grammar thread (made on first use). */
  private grammars: GrammarThread | null = null;
  /** Whole Harmony replies' grammar thread (harmony-grammar.ts), made on first use. */
  private replyGrammars: GrammarThread | null = null;
  /**
   * Where the reasoning ends, with a reasoning parser or a Harmony tokenizer (gpt-oss, whose replies open with
   * headers and an analysis channel): grammars wait for it.
   */
  private reasoningEndOf: ReasoningEnd | null | undefined;
  /** The LoRA adapters held and their device slots, or null without LoRA. */
  readonly lora: LoraManager | null;
  /** Whether step() pipelines scheduling with the runner's compute (see the file comment). */
  readonly asyncScheduling: boolean;
  /** Async scheduling: the step queued on the device, whose outputs the next step() collects. */
  private inflight: { out: SchedulerOutput; pending: PendingRunnerOutput } | null = null;
  /** Sleep mode: what is asleep, and whether new requests are refused. */
  private readonly sleepState = new SleepState();
  numSteps = 0;

  constructor(
    args: EngineArgs,
    readonly runner: ModelRunner,
    options: EngineCoreOptions = {},
  ) {
    this.args = resolveEngineArgs(args);
    this.tokenizer = options.tokenizer ?? null;
    const tok = this.tokenizer;
    this.createDetokenizer = options.createDetokenizer ?? (tok === null ? undefined : (ids, p) => new IncrementalDetokenizer(tok, ids, p));
    this.eosTokenIds = tok?.eosTokenIds ?? this.args.eosTokenIds;
    const parser = this.args.reasoningParser;
    if (parser !== null && tok === null) throw new Error(`[engine] reasoning parser ${parser} needs the model's tokenizer`);
    // text markers (granite) end nothing the grammar can see: structured output is refused under them (addRequest)
    this.reasoningEndOf = parser !== null ? (hasTokenMarkers(parser) ? thinkEnd(thinkMarkers(tok!, parser)) : null) : tok === null ? null : undefined;
    this.kv = new KvCacheManager({
      numBlocks: this.args.numGpuBlocks,
      blockSize: this.args.blockSize,
      enablePrefixCaching: this.args.enablePrefixCaching,
      enableKvEvents: this.args.enableKvCacheEvents,
    });
    const a = this.args;
    if (a.asyncScheduling === true && runner.dispatch === undefined)
      throw new Error("[engine] asyncScheduling needs a model runner with dispatch()");
    this.asyncScheduling = a.asyncScheduling ?? runner.dispatch !== undefined;
    const decodeToken = tok === null ? String : (id: number) => tok.idToToken(id) ?? tok.decode([id]);
    this.scheduler = new Scheduler(
      {
        maxNumSeqs: a.maxNumSeqs,
        maxNumBatchedTokens: a.maxNumBatchedTokens,
        maxModelLen: a.maxModelLen,
        longPrefillTokenThreshold: a.longPrefillTokenThreshold,
        schedulingPolicy: a.schedulingPolicy,
        enableChunkedPrefill: a.enableChunkedPrefill,
        asyncScheduling: this.asyncScheduling,
        maxLoras: a.lora?.maxLoras ?? 0,
      },
      this.kv,
      decodeToken,
    );
    this.sampler = new Sampler(runner.vocabSize, new Rng(a.seed), options.logitsProcessors, undefined, a.logprobsMode);
    if (a.lora !== null && (runner.lora === undefined || runner.lora === null))
      throw new Error("[engine] lora needs a model runner with LoRA slots (PagedModelRunner.enableLora)");
    this.lora = a.lora === null ? null : new LoraManager(runner.lora!, a.lora);
    if (a.pooler !== null && runner.supportsPooling !== true) throw new Error("[engine] pooler needs a model runner that pools (PagedModelRunner)");
    if (a.pooler?.classify === true && (runner.classify === undefined || (runner.classifier ?? null) === null))
      throw new Error("[engine] pooler.classify needs a classifier model (*ForSequenceClassification)");
    this.draft = options.draft ?? null;
    const method = a.speculativeConfig?.method;
    if (method !== undefined && isModelDraftMethod(method) && this.draft === null)
      throw new Error(`[engine] speculativeConfig's ${method} method needs its drafter (EngineCoreOptions.draft)`);
  }

  /**
   * Reads and checks a LoRA adapter ahead of its requests (vLLM's add_lora); throws EngineInputError (lora_request)
   * when it cannot be served or LoRA is not enabled.
   */
  addLora(request: LoraRequest): void {
    if (this.lora === null) throw new EngineInputError("lora_request", "LoRA is not enabled (start the engine with enableLora / --enable-lora)");
    try {
      this.lora.add(request);
    } catch (e) {
      if (e instanceof LoraError) throw new EngineInputError("lora_request", e.message);
      throw e;
    }
  }

  /** Drops a LoRA adapter no request uses (vLLM's remove_lora); false when unknown or in use. */
  removeLora(id: number): boolean {
    return this.lora?.remove(id) ?? false;
  }

  /** Drops the prefix cache (vLLM's reset_prefix_cache): blocks no request holds lose their hashes; true when that was every cached block. */
  resetPrefixCache(): boolean {
    return this.kv.resetPrefixCache();
  }

  /**
   * vLLM's sleep (sleep-mode.ts): pauses scheduling and, from level 1, frees the KV cache, at level 2 the weights too.
   * mode "abort" ends every request now (their final outputs are returned), "keep" keeps them for wake_up (from level
   * 1 they compute their KV again then); "wait" is the caller's: beginDrain(), step until idle, then sleep. Asleep
   * already: nothing changes (as vLLM's executor ignores a second sleep). Throws EngineInputError without sleep mode
   * or when level 2 could not read the weights again, before anything changes.
   */
  sleep(level: SleepLevel, mode: "abort" | "keep"): RequestOutput[] {
    this.checkSleepMode();
    if (this.sleepState.isSleeping) return [];
    if (level === 2) {
      const r = this.runner;
      const why = r.weightsReloadRefusal === undefined || r.releaseWeights === undefined ? "this model runner cannot read them again" : r.weightsReloadRefusal();
      if (why !== null) throw new EngineInputError("level", `level 2 discards the weights, and ${why}: sleep at level 1 instead`);
    }
    const outs = mode === "abort" ? this.abortRequest([...this.parents.keys()]) : [];
    outs.push(...this.drainInflight());
    if (level >= 1) {
      this.scheduler.preemptAll(); // their K/V goes with the cache
      this.kv.resetPrefixCache();
      this.runner.releaseKvCache?.();
      this.draft?.releaseKvCache(); // (the draft model's weights stay at level 2: they are not the served model's)
      if (level === 2) this.runner.releaseWeights!();
    }
    this.sleepState.fallAsleep(level);
    return outs;
  }

  /** A "wait" sleep: new requests are refused from now on while the others run to their end. */
  beginDrain(): void {
    this.checkSleepMode();
    if (!this.sleepState.isSleeping) this.sleepState.draining = true;
  }

  /**
   * vLLM's wake_up: wakes the tags given (null: everything asleep); "weights" reads a level 2 sleep's weights again,
   * "kv_cache" allocates the cache. Scheduling resumes once no memory is asleep. Tags not asleep are ignored.
   */
  wakeUp(tags: readonly WakeTag[] | null = null): void {
    this.checkSleepMode();
    const woken = (tags ?? WAKE_TAGS).filter((t): t is MemoryTag => t !== "scheduling" && this.sleepState.has(t));
    if (woken.includes("weights")) this.runner.reloadWeights?.();
    if (woken.includes("kv_cache")) {
      this.runner.restoreKvCache?.();
      this.draft?.restoreKvCache();
    }
    this.sleepState.wake(woken);
  }

  sleepStatus(): SleepStatus {
    return this.sleepState.status();
  }

  private checkSleepMode(): void {
    if (!this.args.enableSleepMode)
      throw new EngineInputError("enable_sleep_mode", "sleep mode is not enabled: start the engine with enableSleepMode (kiln serve --enable-sleep-mode)");
  }

  /** Applies the step queued on the device (async scheduling) without scheduling another. */
  private drainInflight(): RequestOutput[] {
    const current = this.inflight;
    if (current === null) return [];
    this.inflight = null;
    return this.collectOutputs(this.applyStep(current.out, current.pending.wait(), false));
  }

  get maxModelLen(): number {
    return this.args.maxModelLen;
  }

  /** What a pooling engine's requests return: "embed" (a vector), "classify" (class scores); null when it generates. */
  get poolingTask(): "embed" | "classify" | null {
    const p = this.args.pooler;
    return p === null ? null : p.classify === true ? "classify" : "embed";
  }

  /** A classifying engine's label names, in score order; null otherwise. */
  get classLabels(): string[] | null {
    return this.poolingTask === "classify" ? this.runner.classifier!.labels : null;
  }

  /** A classifying engine's use_sep_token (how a cross-encoder's score prompts are built); null otherwise. */
  get useSepToken(): boolean | null {
    return this.poolingTask === "classify" ? this.runner.classifier!.useSepToken : null;
  }

  /** A request's PoolingParams fit the engine's task (vLLM's PoolingParams.verify): activation classifies, normalize embeds. */
  private checkPoolingOverrides(o: PoolingOverrides): void {
    const c = this.args.pooler;
    if (c === null) throw new EngineInputError("pooling", "pooling parameters apply to a pooling runner only");
    const classify = c.classify === true;
    const wrong: keyof PoolingOverrides = classify ? "normalize" : "activation";
    if (o[wrong] != null)
      throw new EngineInputError(`pooling.${wrong}`, `task ${classify ? "classify" : "embed"} does not take ${wrong} (${classify ? "activation" : "normalize"} only)`);
  }

  /**
   * A request's images: a runner that reads them, each inside the prompt, in order and apart, the prompt not truncated,
   * and each no longer than a step's token budget (an image is computed in one step).
   */
  private checkMmFeatures(mm: readonly MultiModalFeature[], prompt: readonly number[], truncate: number | null): void {
    if (mm.some((f) => f.inputEmbeds === undefined) && this.runner.supportsImages !== true)
      throw new EngineInputError("multi_modal_data", "At most 0 image(s) may be provided in one prompt.");
    if (truncate !== null && prompt.length > truncate) throw new EngineInputError("truncate_prompt_tokens", "a prompt with images cannot be truncated");
    const a = this.args;
    const perStep = a.longPrefillTokenThreshold > 0 ? Math.min(a.maxNumBatchedTokens, a.longPrefillTokenThreshold) : a.maxNumBatchedTokens;
    const width = this.runner.inputEmbedsWidth ?? null;
    let end = 0;
    for (const f of mm) {
      if (f.inputEmbeds !== undefined) {
        if (width === null) throw new EngineInputError("prompt_embeds", "this engine does not take prompt embeddings (its tensor-parallel ranks are fed token ids)");
        if (a.speculativeConfig !== null) throw new EngineInputError("prompt_embeds", "prompt embeddings cannot be used with speculative decoding (drafts read the prompt's token ids)");
        if (f.inputEmbeds.length !== f.length * width)
          throw new EngineInputError("prompt_embeds", `prompt embeddings must be [${f.length}, ${width}] (the model's hidden size), got ${f.inputEmbeds.length} values`);
      } else if (f.length > perStep)
        throw new EngineInputError("max_num_batched_tokens", `an image of ${f.length} tokens is computed in one step, which takes at most ${perStep} tokens`);
      if (!Number.isInteger(f.offset) || !Number.isInteger(f.length) || f.length < 1 || f.offset < end || f.offset + f.length > prompt.length)
        throw new EngineInputError("multi_modal_data", `image positions [${f.offset}, ${f.offset + f.length}) are not inside the prompt after the previous image's`);
      end = f.offset + f.length;
    }
  }

  /**
   * Validates and queues a request. Throws {@link EngineInputError} (naming the parameter) for bad input;
   * nothing is queued then and other requests are unaffected.
   */
  addRequest(input: EngineRequestInput): void {
    const id = input.requestId;
    if (this.sleepState.refusesRequests)
      throw new EngineSleepingError(this.sleepState.isSleeping ? undefined : "The engine is falling asleep (a sleep with mode=wait): it takes no new requests");
    if (typeof id !== "string" || id.length === 0) throw new EngineInputError("request_id", "must be a non-empty string");
    const kind = input.outputKind ?? "cumulative";
    if (kind !== "cumulative" && kind !== "final_only")
      throw new EngineInputError("output_kind", `must be "cumulative" or "final_only", got ${JSON.stringify(kind)}`);
    if (this.parents.has(id)) throw new EngineRequestIdError(id, "is already in use");
    const priority = input.priority ?? 0;
    if (!Number.isInteger(priority)) throw new EngineInputError("priority", `must be an integer, got ${priority}`);
    if (priority !== 0 && this.args.schedulingPolicy !== "priority") // as vLLM refuses it
      throw new EngineInputError("priority", `Got priority ${priority} but Priority scheduling is not enabled.`);
    const vocab = this.runner.vocabSize;
    const params = normalizeSamplingParams(input.params ?? {}, { maxLogprobs: this.args.maxLogprobs, vocabSize: vocab });
    // its samples' ids (`${i}_${id}` for n > 1, as vLLM's) key the block tables: none may be a live sample's
    for (let i = 0; i < params.n; i++) {
      const live = this.scheduler.requests.get(params.n === 1 ? id : `${i}_${id}`);
      if (live !== undefined) throw new EngineRequestIdError(id, `is already in use (${JSON.stringify(live.requestId)} is sample ${live.index} of request ${JSON.stringify(live.parentId)})`);
    }
    let prompt = input.promptTokenIds;
    if (!Array.isArray(prompt) || prompt.length === 0) throw new EngineInputError("prompt", "the prompt is empty");
    for (const t of prompt)
      if (!Number.isInteger(t) || t < 0 || t >= vocab)
        throw new EngineInputError("prompt_token_ids", `token id ${t} is out of vocabulary range [0, ${vocab})`);
    const mm = input.mmFeatures ?? [];
    if (mm.length > 0) this.checkMmFeatures(mm, prompt, params.truncatePromptTokens);
    if (params.truncatePromptTokens !== null && prompt.length > params.truncatePromptTokens)
      prompt = prompt.slice(prompt.length - params.truncatePromptTokens);
    const maxLen = this.args.maxModelLen;
    if (prompt.length > maxLen)
      throw new EngineInputError("prompt", `the prompt (length ${prompt.length}) is longer than the maximum model length of ${maxLen}`);
    if (this.args.pooler !== null && params.n !== 1) throw new EngineInputError("n", `a pooling engine returns one vector per prompt, got n = ${params.n}`);
    if (params.pooling !== null) this.checkPoolingOverrides(params.pooling);
    // a pooling request only reads its prompt
    const maxTokens = this.args.pooler !== null ? 1 : Math.max(1, Math.min(params.maxTokens ?? maxLen, maxLen - prompt.length));
    // Every request must be able to finish alone, or preemption would livelock: its K/V (all tokens but the
    // last sampled one) must fit the pool.
    const usable = this.kv.pool.numUsableBlocks;
    if (this.kv.blocksFor(prompt.length) > usable)
      throw new EngineInputError(
        "prompt",
        `the prompt (length ${prompt.length}) needs ${this.kv.blocksFor(prompt.length)} KV blocks, the pool has ${usable}`,
      );
    if (this.kv.blocksFor(prompt.length + maxTokens - 1) > usable)
      throw new EngineInputError(
        "max_tokens",
        `prompt + max_tokens (${prompt.length + maxTokens}) can never fit the KV cache (${usable} blocks of ${this.kv.blockSize})`,
      );
    if (params.badWords !== null && this.tokenizer === null) throw new EngineInputError("bad_words", "bad words need a tokenizer");
    if (params.stop.length > 0 && this.createDetokenizer === undefined) throw new EngineInputError("stop", "stop strings need a tokenizer");
    const badWordsTokenIds = this.tokenizeBadWords(params.badWords);
    const spec = structuredOutputSpec(params.structuredOutputs); // checked by normalizeSamplingParams
    const refusal = spec === null || this.args.reasoningParser === null ? null : textMarkersRefusal(this.args.reasoningParser);
    if (refusal !== null) throw new EngineInputError("structured_outputs", refusal);
    const grammars = spec === null ? null : spec.harmonyReply === true ? this.harmonyReplyThread() : this.grammarThread();
    const lora = input.loraRequest ?? null;
    const kvt = input.kvTransfer ?? null;
    if (kvt !== null) this.checkKvTransfer(kvt, params.n, lora?.name ?? null);
    if (lora !== null) this.addLora(lora); // read and checked before anything is queued

    const parent: ParentRequest = {
      requestId: id,
      prompt: input.prompt ?? null,
      promptTokenIds: prompt,
      children: [],
      finalOnly: kind === "final_only",
    };
    const arrivalTime = input.arrivalTime ?? Date.now();
    for (let i = 0; i < params.n; i++) {
      // vLLM ParentRequest: child i samples with seed + i so the n samples differ but stay reproducible.
      const childParams = params.n === 1 ? params : { ...params, n: 1, seed: params.seed === null ? null : params.seed + i };
      parent.children.push(
        new Request({
          requestId: params.n === 1 ? id : `${i}_${id}`,
          parentId: id,
          index: i,
          prompt: parent.prompt,
          promptTokenIds: prompt,
          params: childParams,
          eosTokenIds: this.eosTokenIds,
          maxTokens,
          arrivalTime,
          priority: input.priority ?? 0,
          cacheSalt: input.cacheSalt ?? null,
          lora,
          badWordsTokenIds,
          // (a prompt given as embeddings has no text to continue from: its placeholder ids are not decoded)
          // (detokenize false: token ids only, as vLLM's)
          detokenizer: childParams.detokenize ? (this.createDetokenizer?.(mm.some((f) => f.inputEmbeds !== undefined) ? [] : prompt, childParams) ?? null) : null,
          ...(mm.length > 0 ? { mmFeatures: mm } : {}),
        }),
      );
    }
    for (const c of parent.children) c.kvImport = kvt?.import ?? null;
    parent.children[0]!.kvExport = kvt?.export === true;
    if (grammars !== null) {
      // a whole reply's grammar encodes the analysis itself: live from the first token
      const end = spec!.harmonyReply === true ? null : this.reasoningEnd();
      const gate = end === null ? null : { end, ended: end.endedIn(prompt) };
      // compiled on the grammar thread while other requests run: these wait for it (Request.grammar.ready)
      const matchers = grammars.matchers(spec!, parent.children.length);
      for (const [i, c] of parent.children.entries()) c.grammar = new RequestGrammar(matchers[i]!, gate);
    }
    if (lora !== null) this.lora!.acquire(lora);
    this.parents.set(id, parent);
    for (const c of parent.children) this.scheduler.addRequest(c);
  }

  /** The gate of structured output's grammars (see reasoningEndOf); Harmony's is looked up at the first grammar. */
  private reasoningEnd(): ReasoningEnd | null {
    if (this.reasoningEndOf === undefined) this.reasoningEndOf = harmonyEnd(this.tokenizer!);
    return this.reasoningEndOf;
  }

  /** Throws EngineInputError (kv_transfer_params) when this engine cannot export or import as asked. */
  private checkKvTransfer(kvt: NonNullable<EngineRequestInput["kvTransfer"]>, n: number, lora: string | null): void {
    const r = this.runner;
    const fail = (why: string) => new EngineInputError("kv_transfer_params", why);
    if (kvt.export !== true && (kvt.import ?? null) === null) return;
    if (r.kvLayout === undefined || r.readKv === undefined || r.writeKv === undefined) throw fail("this engine's model runner cannot move K/V between engines");
    if (this.args.pooler !== null) throw fail("a pooling engine neither exports nor imports K/V");
    if (kvt.export === true && n !== 1) throw fail(`a prefill for remote decode samples once per prompt, got n = ${n}`);
    const snap = kvt.import ?? null;
    if (snap === null) return;
    const why = layoutMismatch(snap.layout, r.kvLayout);
    if (why !== null) throw fail(`the remote K/V does not fit this engine's cache: ${why}`);
    if (snap.lora !== lora) throw fail(`the remote K/V was computed with adapter ${snap.lora ?? "none"}, this request runs ${lora ?? "none"}`);
  }

  /** Writes the K/V a schedule() admitted from prefill engines, before its step is dispatched. */
  private schedule(): SchedulerOutput {
    const out = this.scheduler.schedule();
    for (const m of out.kvImports)
      this.runner.writeKv!(m.blockTable, this.args.blockSize, m.snapshot.data, m.snapshot.tokenIds.length, m.from, m.to);
    return out;
  }

  /** Copies out the prompt K/V of requests that just finished with kvExport (their blocks are not reused before the next schedule()). */
  private exportKv(updates: readonly RequestUpdate[]): void {
    for (const { request: req } of updates) {
      const table = req.exportBlockTable;
      if (table === null) continue;
      req.exportBlockTable = null;
      const n = req.numPromptTokens;
      const data = this.runner.readKv!(table, this.args.blockSize, n);
      req.kvSnapshot = { layout: this.runner.kvLayout!, tokenIds: [...req.promptTokenIds], model: "", lora: req.lora?.name ?? null, data };
    }
  }

  /** The grammar thread over the tokenizer's vocabulary, started by the first structured-output request. */
  private grammarThread(): GrammarThread {
    if (this.grammars !== null) return this.grammars;
    const vocab = this.tokenizer?.grammarVocab?.();
    if (vocab === undefined) throw new EngineInputError("structured_outputs", "structured output needs the model's tokenizer");
    this.grammars = new GrammarThread(vocab, this.runner.vocabSize, this.eosTokenIds);
    return this.grammars;
  }

  /**
   * Stops the grammar threads structured-output requests started (vLLM's EngineCore.shutdown stops its compile pool):
   * each would otherwise live as long as the process. A structured-output request still running fails at its next
   * grammar call; a later one starts a new thread.
   */
  async close(): Promise<void> {
    const threads = [this.grammars, this.replyGrammars];
    this.grammars = this.replyGrammars = null;
    await Promise.all(threads.map((t) => t?.close()));
  }

  /** The grammar thread of whole Harmony replies: the vocabulary with Harmony's header tokens spelled. */
  private harmonyReplyThread(): GrammarThread {
    if (this.replyGrammars !== null) return this.replyGrammars;
    const vocab = this.tokenizer?.grammarVocab?.();
    const reply = vocab === undefined ? null : harmonyReplyVocab(this.tokenizer!, vocab, this.eosTokenIds);
    if (reply === null) throw new EngineInputError("structured_outputs", "a Harmony reply grammar needs a Harmony (gpt-oss) tokenizer");
    this.replyGrammars = new GrammarThread(reply.vocab, this.runner.vocabSize, reply.stopTokenIds);
    return this.replyGrammars;
  }

  /**
   * Reads the grammar threads' replies (compiled grammars make their requests schedulable); a request whose grammar
   * did not compile is aborted (its final output is returned).
   */
  private pollGrammars(): RequestOutput[] {
    let failed = false;
    for (const t of [this.grammars, this.replyGrammars]) if (t?.poll() === true) failed = true;
    if (!failed) return [];
    const ids = new Set<string>();
    for (const r of this.scheduler.waiting) if (r.grammar?.failure != null) ids.add(r.parentId);
    return this.abortRequest(ids);
  }

  /** Nothing to schedule: while grammars compile, waits a little for one (rather than spin through steps). */
  private idle(): RequestOutput[] {
    const t = [this.grammars, this.replyGrammars].find((g) => g?.isCompiling === true);
    t?.waitForReply(GRAMMAR_WAIT_MS);
    return [];
  }

  private tokenizeBadWords(words: string[] | null): number[][] {
    if (words === null || this.tokenizer === null) return [];
    const seqs = new Map<string, number[]>();
    for (const w of words) {
      // As vLLM: the word alone and with a leading space (how it appears mid-sentence).
      for (const text of [w, " " + w.trimStart()]) {
        const ids = this.tokenizer.encode(text, { addSpecialTokens: false });
        if (ids.length > 0) seqs.set(ids.join(","), ids);
      }
    }
    return [...seqs.values()];
  }

  /** Aborts user requests (all their samples) now: their blocks are freed at once. Returns their final outputs. */
  abortRequest(requestIds: Iterable<string>): RequestOutput[] {
    const outs: RequestOutput[] = [];
    for (const id of requestIds) {
      const parent = this.parents.get(id);
      if (parent === undefined) continue;
      this.scheduler.finishRequests(parent.children.map((c) => c.requestId));
      this.dropParent(parent);
      outs.push(this.makeOutput(parent));
    }
    return outs;
  }

  hasUnfinishedRequests(): boolean {
    return this.scheduler.hasUnfinishedRequests() || this.inflight !== null;
  }

  /** Whether step() has anything to do: unfinished requests, and scheduling not paused by a sleep. */
  hasWork(): boolean {
    return !this.sleepState.schedulingPaused && this.hasUnfinishedRequests();
  }

  /** The KV-cache events since the last call (prefix-cache blocks stored, evicted, cleared), oldest first. */
  takeKvEvents(): KvCacheEvent[] {
    return this.kv.takeEvents();
  }

  /** One engine iteration. Returns an output for every user request that got tokens or finished (final_only: finished). */
  step(): RequestOutput[] {
    if (this.sleepState.schedulingPaused) return [];
    const failed = this.pollGrammars();
    const outs = this.stepOnce();
    return failed.length === 0 ? outs : [...failed, ...outs];
  }

  private stepOnce(): RequestOutput[] {
    if (!this.asyncScheduling) {
      const schedulerOutput = this.schedule();
      if (schedulerOutput.scheduled.length === 0) return this.idle();
      return this.finishStep(schedulerOutput, this.runner.execute(this.toBatch(schedulerOutput)));
    }
    let current = this.inflight;
    this.inflight = null;
    if (current === null) {
      const out = this.schedule();
      if (out.scheduled.length === 0) return this.idle();
      current = { out, pending: this.dispatch(out) };
      prefetchGrammarMasks(out);
    }
    // Scheduled while `current` computes; its placeholders are filled once current's tokens are sampled.
    const next = this.schedule();
    const fed = this.fedTokens(current, next);
    if (fed !== undefined) {
      const batch = this.toBatch(next);
      batch.fedTokens = fed;
      const pending = this.runner.dispatch!(batch);
      const updates = this.applyStep(current.out, current.pending.wait(), true);
      this.scheduler.fillPlaceholders(next); // the host's copy of the fed ids (finished requests' rows are skipped)
      this.inflight = { out: next, pending };
      prefetchGrammarMasks(next);
      return this.collectOutputs(updates);
    }
    const updates = this.applyStep(current.out, current.pending.wait(), true);
    const ready = this.scheduler.fillPlaceholders(next);
    if (ready.scheduled.length > 0) {
      this.inflight = { out: ready, pending: this.dispatch(ready) };
      prefetchGrammarMasks(ready);
    }
    // the text of the tokens just applied is decoded while the next step computes (see Scheduler.update)
    return this.collectOutputs(updates);
  }

  /**
   * The placeholders of `next` as rows of `current`'s device-sampled ids, or undefined when one of them is not
   * (or current is sampled on the host): then next waits for current's tokens on the host.
   */
  private fedTokens(current: { out: SchedulerOutput; pending: PendingRunnerOutput }, next: SchedulerOutput): FedTokens | undefined {
    const from = current.pending.deviceTokens;
    if (from === undefined || next.scheduled.length === 0) return undefined;
    const rowOf = new Map<Request, number>();
    let row = 0;
    for (const s of current.out.scheduled) if (s.needsLogits) rowOf.set(s.request, row++);
    const at: number[] = [];
    const rows: number[] = [];
    let offset = 0;
    for (const s of next.scheduled) {
      const n = s.tokenIds.length;
      for (let j = 0; j < n; j++) {
        if (s.tokenIds[j] !== -1) continue;
        const r = rowOf.get(s.request);
        // the one placeholder a request can have is the token current samples for it (position numTokens)
        if (r === undefined || j !== n - 1 || s.startPosition + j !== s.request.numTokens) return undefined;
        at.push(offset + j);
        rows.push(r);
      }
      offset += n;
    }
    return { from, at: Int32Array.from(at), rows: Int32Array.from(rows) };
  }

  private dispatch(out: SchedulerOutput): PendingRunnerOutput {
    return this.runner.dispatch!(this.toBatch(out));
  }

  private toBatch(out: SchedulerOutput): ScheduledBatch {
    const batch = Scheduler.toBatch(out, this.args.blockSize);
    batch.sampleOnDevice = out.scheduled.every((s) => !s.needsLogits || this.sampler.isPlainGreedy(s.request));
    if (this.args.pooler !== null) {
      batch.pooling = this.args.pooler.poolingType;
      batch.sampleOnDevice = false;
    }
    if (this.draft?.hiddenStates !== undefined) batch.hiddenStates = this.draft.hiddenStates; // an EAGLE head reads them
    if (this.lora !== null) {
      // the step's adapters into device slots (behind the work already queued), and each sequence's slot
      const ids = new Set<number>();
      for (const s of out.scheduled) if (s.request.loraId !== null) ids.add(s.request.loraId);
      const slotOf = this.lora.slotsFor(ids);
      for (const s of out.scheduled) s.loraSlot = s.request.loraId === null ? -1 : slotOf.get(s.request.loraId)!;
    }
    return batch;
  }

  /** Samples a computed step's logits and applies the tokens. */
  private finishStep(out: SchedulerOutput, runnerOutput: RunnerOutput): RequestOutput[] {
    return this.collectOutputs(this.applyStep(out, runnerOutput, false));
  }

  /**
   * Samples a computed step's logits and applies the token ids (finishing requests, freeing their blocks); with
   * deferText, the text of requests without stop strings is left for collectOutputs.
   */
  private applyStep(out: SchedulerOutput, runnerOutput: RunnerOutput, deferText: boolean): RequestUpdate[] {
    if (this.args.pooler !== null) return this.applyPooling(out, runnerOutput.pooled ?? new Map(), this.args.pooler);
    const rows: SamplingRow[] = [];
    for (const s of out.scheduled) {
      if (!s.needsLogits) continue;
      rows.push(s.request);
      // a speculated request's row j samples as if drafts 0..j-1 were already its output (penalties, min_tokens,
      // bad words and logits processor functions read them)
      const k = s.numSpecTokens ?? 0;
      if (k === 0) continue;
      const drafts = s.tokenIds.slice(s.tokenIds.length - k);
      // with structured output, row j is masked by the grammar's state after those drafts (which it allows)
      const masks = s.request.grammar?.draftMasks(drafts) ?? null;
      for (let j = 1; j <= k; j++) {
        const mask = masks?.[j - 1] ?? null;
        const grammar = masks === null ? null : { applyMask: (l: Float32Array) => void (mask !== null && applyBitmask(l, mask)) };
        rows.push(Object.create(s.request, { outputTokenIds: { value: [...s.request.outputTokenIds, ...drafts.slice(0, j)] }, grammar: { value: grammar } }) as SamplingRow);
      }
    }
    const ids = runnerOutput.tokenIds;
    const sampled = ids === undefined ? this.sampler.sample(runnerOutput.logits, rows) : deviceSampled(ids);
    if (sampled.length !== rows.length) throw new Error(`[engine] the runner sampled ${sampled.length} rows, expected ${rows.length}`);
    const updates = this.scheduler.update(out, sampled, runnerOutput.promptLogits, Date.now(), deferText);
    this.exportKv(updates);
    this.numSteps++;
    if (runnerOutput.hiddenStates !== undefined) this.observeHidden(out, runnerOutput.hiddenStates);
    if (this.args.speculativeConfig !== null) this.proposeDrafts(this.args.speculativeConfig);
    return updates;
  }

  /** A pooling step: each sequence's share of its pooled state; a request whose prompt is read finishes with it. */
  private applyPooling(out: SchedulerOutput, pooled: Map<string, Float32Array>, c: PoolerConfig): RequestUpdate[] {
    const updates: RequestUpdate[] = [];
    for (const s of out.scheduled) {
      const req = s.request;
      if (req.isFinished) continue;
      const part = pooled.get(req.requestId);
      if (part !== undefined) {
        if (c.poolingType === "MEAN" && req.pooledState !== null) for (let i = 0; i < part.length; i++) req.pooledState[i] += part[i]!;
        else req.pooledState = part;
      }
      if (!s.needsLogits) continue;
      const v = req.pooledState;
      if (v === null) throw new Error(`[engine] no pooled state for ${req.requestId}`);
      if (c.poolingType === "MEAN") for (let i = 0; i < v.length; i++) v[i] = v[i]! / req.numPromptTokens;
      const own = req.params.pooling;
      if (c.classify === true) {
        req.pooledOutput = classScores(this.runner.classify!(v), this.runner.classifier!, own?.activation ?? c.activation ?? true);
      } else if (own?.normalize ?? c.normalize) {
        let ss = 0;
        for (let i = 0; i < v.length; i++) ss += v[i]! * v[i]!;
        const inv = 1 / Math.max(Math.sqrt(ss), 1e-12); // torch.nn.functional.normalize's eps
        for (let i = 0; i < v.length; i++) v[i] = v[i]! * inv;
      }
      if (c.classify !== true) req.pooledOutput = v;
      req.pooledState = null;
      req.metrics.firstTokenTime ??= Date.now();
      this.scheduler.finishRequests([req.requestId], "FINISHED_STOPPED");
      updates.push({ request: req, newTokenIds: [], finished: true });
    }
    this.numSteps++;
    return updates;
  }

  /**
   * Speculative decoding: n-gram or draft-model drafts for every running request whose sampling may be verified row
   * by row.
   */
  private proposeDrafts(c: SpeculativeConfig): void {
    const maxLen = this.args.maxModelLen;
    const wanted: { req: Request; room: number }[] = [];
    for (const req of this.scheduler.running) {
      req.specTokenIds = [];
      // only for a decode (a request still reading its prompt has nothing to draft after); room: the drafts plus
      // the token after them must fit max_tokens and max_model_len
      const decoding = req.numComputedTokens === req.numTokens - 1;
      const room = Math.min(c.numSpeculativeTokens, req.maxTokens - req.numOutputTokens - 1, maxLen - req.numTokens - 1);
      const paused = req.specPause.skip > 0;
      if (paused && decoding) req.specPause.skip--;
      if (decoding && !paused && room > 0 && this.speculable()) wanted.push({ req, room });
    }
    // a drafter reading the served model's hidden states is fed every running request's (k = 0: none to draft)
    const drafting = new Set(wanted.map((w) => w.req));
    const fed = this.draft?.hiddenStates !== undefined ? this.scheduler.running.filter((r) => !drafting.has(r)).map((req) => ({ req, room: 0 })) : [];
    const proposed = c.method !== "ngram"
      ? this.draft!.propose([...wanted, ...fed].map(({ req, room }) => ({ requestId: req.requestId, tokens: req.allTokenIds, k: room })), new Set(this.scheduler.running.map((r) => r.requestId)))
      : null;
    for (const { req, room } of wanted) {
      const drafts = proposed !== null ? proposed.get(req.requestId) ?? [] : proposeNgram(req.allTokenIds, (c as NgramSpeculativeConfig).promptLookupMin, (c as NgramSpeculativeConfig).promptLookupMax, room);
      // structured output: only the drafts its grammar allows (vLLM's validate_tokens)
      req.specTokenIds = req.grammar === null || drafts.length === 0 ? drafts : drafts.slice(0, req.grammar.validPrefix(drafts));
    }
  }

  /**
   * Hands an EAGLE drafter the served model's hidden rows [numTokens, width] of a step: each running request's rows of
   * the positions the step computed and kept (not those of rejected drafts).
   */
  private observeHidden(out: SchedulerOutput, rows: Float32Array): void {
    const width = rows.length / Math.max(1, out.scheduled.reduce((n, s) => n + s.tokenIds.length, 0));
    let at = 0;
    for (const s of out.scheduled) {
      const n = Math.min(s.tokenIds.length, s.request.numComputedTokens - s.startPosition);
      if (!s.request.isFinished && n > 0) this.draft!.observe!(s.request.requestId, s.startPosition, rows.subarray(at * width, (at + n) * width), n);
      at += s.tokenIds.length;
    }
  }

  /**
   * Whether drafts can be verified: not under engine-level logits processors (they keep per-request state across a
   * batch, so row j cannot be sampled as if drafts 0..j-1 were output).
   */
  private speculable(): boolean {
    return this.sampler.logitsProcessors.size === 0;
  }

  /** The adapters of running and of waiting requests, by name (vLLM's lora_requests_info). */
  private loraStats(lora: LoraManager): NonNullable<EngineStats["lora"]> {
    const names = (reqs: readonly Request[]): string[] => {
      const seen = new Set<string>();
      for (const r of reqs) if (r.lora !== null) seen.add(r.lora.name);
      return [...seen];
    };
    return { maxLoras: lora.config.maxLoras, running: names(this.scheduler.running), waiting: names(this.scheduler.waiting) };
  }

  private collectOutputs(updates: RequestUpdate[]): RequestOutput[] {
    const touched = new Set<ParentRequest>();
    for (const u of updates) {
      const parent = this.parents.get(u.request.parentId);
      if (parent !== undefined) touched.add(parent);
    }
    const outs: RequestOutput[] = [];
    for (const parent of touched) {
      if (parent.finalOnly && !parent.children.every((c) => c.isFinished)) continue;
      const out = this.makeOutput(parent);
      if (out.finished) this.dropParent(parent);
      outs.push(out);
    }
    return outs;
  }

  /** Forgets a finished or aborted user request (and lets go of its LoRA adapter). */
  private dropParent(parent: ParentRequest): void {
    this.parents.delete(parent.requestId);
    const loraId = parent.children[0]!.loraId; // every sample runs with the request's adapter
    if (loraId !== null) this.lora?.release(loraId);
  }

  /** Cumulative RequestOutput of a user request (text held back while a stop string may be forming). */
  private makeOutput(parent: ParentRequest): RequestOutput {
    this.scheduler.flushText(); // the text update() deferred (async scheduling), before any of it is read
    const first = parent.children[0]!;
    const outputs: CompletionOutput[] = parent.children.map((c) => {
      const hold = c.isFinished ? 0 : stopHoldback(c);
      return {
        index: c.index,
        text: hold > 0 ? c.outputText.slice(0, Math.max(0, c.outputText.length - hold)) : c.outputText,
        tokenIds: [...c.outputTokenIds],
        cumulativeLogprob: c.logprobs === null ? null : c.cumulativeLogprob,
        logprobs: c.logprobs === null ? null : [...c.logprobs],
        finishReason: finishReasonOf(c.status),
        stopReason: c.stopReason,
      };
    });
    return {
      requestId: parent.requestId,
      prompt: parent.prompt,
      promptTokenIds: parent.promptTokenIds,
      promptLogprobs: first.promptLogprobs === null ? null : [...first.promptLogprobs],
      outputs,
      finished: parent.children.every((c) => c.isFinished),
      ...(first.pooledOutput !== null ? { pooled: first.pooledOutput } : {}),
      ...(first.kvSnapshot !== null ? { kvSnapshot: first.kvSnapshot } : {}),
      numCachedTokens: Math.max(0, first.numCachedTokens),
      metrics: { ...first.metrics },
    };
  }

  stats(): EngineStats {
    return {
      numRunning: this.scheduler.numRunning,
      numWaiting: this.scheduler.numWaiting,
      kvCacheUsage: this.kv.usage,
      numFreeBlocks: this.kv.numFreeBlocks,
      numTotalBlocks: this.kv.pool.numUsableBlocks,
      prefixCacheQueries: this.kv.prefixCacheStats.queries,
      prefixCacheHits: this.kv.prefixCacheStats.hits,
      numPreemptions: this.scheduler.numPreemptions,
      ...(this.args.enableSleepMode ? { sleep: this.sleepState.status() } : {}),
      ...(this.lora !== null ? { lora: this.loraStats(this.lora) } : {}),
      ...(this.args.speculativeConfig !== null
        ? {
            specDrafts: this.scheduler.specStats.drafts,
            specDraftTokens: this.scheduler.specStats.draftTokens,
            specAcceptedTokens: this.scheduler.specStats.acceptedTokens,
            specAcceptedPerPosition: Array.from({ length: this.args.speculativeConfig.numSpeculativeTokens }, (_, j) => this.scheduler.specStats.acceptedPerPosition[j] ?? 0),
          }
        : {}),
    };
  }
}
