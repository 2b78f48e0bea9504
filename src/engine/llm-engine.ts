// The offline API (vLLM's `LLM`): add every prompt, run engine steps until all finish, return the final
// outputs in input order.
import type { LoraRequest } from "./lora-manager.js";
import type { ChatMessage, ChatTemplateOptions, TokenizerLike } from "../models/tokenizer-types.js";
import {
  checkImageCount, DEFAULT_IMAGE_LIMIT, imageChatPrompt, loadChatImages, loadChatImagesSync, readChatMessages, type ChatImage, type ChatInputMessage,
} from "../models/chat-images.js";
import { withMmProcessorKwargs, type Gemma3ImageInputSpec } from "../models/gemma3-image-processor.js";
import { applyMmProcessorKwargs, MmProcessorKwargsError, PAN_AND_SCAN_DEFAULTS } from "../models/gemma3-pan-and-scan.js";
import { gemma3ImageInputSpec } from "../models/gemma3-vision-weights.js";
import { BeamSearchInstance, checkBeamSearchParams, type BeamSearchParams, type BeamSearchResult } from "./beam-search.js";
import { EngineCore, type EngineArgs } from "./engine-core.js";
import { EngineInputError } from "./errors.js";
import { KilnError } from "../util/errors.js";
import type { LogitsProcessorInput } from "./logits-processors.js";
import type { ModelRunner, MultiModalFeature } from "./model-runner.js";
import { promptEmbedsInput } from "./prompt-embeds.js";
import { generationConfigSourceError, generationDefaults, generationOverrideError } from "./sampling-params.js";
import { cosineSimilarity, crossEncoderLabelsError, crossEncoderPromptIds, scorePairingError, scorePairs } from "./scoring.js";
import { createServingSetupSync, type ServingArgs } from "./serving.js";
import type { PoolingOverrides, RequestOutput, SamplingParams } from "./types.js";
import type { SleepLevel, WakeTag } from "./sleep-mode.js";

/** One prompt's embedding (vLLM's EmbeddingRequestOutput, its outputs.embedding as `embedding`). */
export interface EmbeddingOutput {
  requestId: string;
  prompt: string | null;
  promptTokenIds: number[];
  embedding: Float32Array;
}

/** One prompt's classification (vLLM's ClassificationRequestOutput): class probabilities and the best label. */
export interface ClassificationOutput {
  requestId: string;
  prompt: string | null;
  promptTokenIds: number[];
  probs: Float32Array;
  label: string;
}

/** One text pair's score (vLLM's ScoringRequestOutput, its outputs.score as `score`): both prompts' ids, text_1's first. */
export interface ScoringOutput {
  requestId: string;
  promptTokenIds: number[];
  score: number;
}

/**
 * A prompt's text (a string, or vLLM's TextPrompt `{ prompt }`), or its token ids (with its images' features for an
 * image-text model: EngineRequestInput.mmFeatures), or its input embeddings (vLLM's EmbedsPrompt: `promptEmbeds`
 * [seq * hidden] float32, the rows the model's embedding layer would give; `LLM.generate([{ promptEmbeds }])`).
 */
export type PromptInput =
  | string
  | { prompt: string; promptTokenIds?: undefined }
  | { promptTokenIds: number[]; prompt?: string; mmFeatures?: readonly MultiModalFeature[] }
  | { promptEmbeds: Float32Array; hiddenSize: number };

/**
 * Either a model path with vLLM-named engine arguments, or pre-built parts (tests, custom runners); both take
 * engine-level `logitsProcessors` (vLLM `logits_processors`): instances or classes (load module specifiers
 * with `await loadLogitsProcessors([...])`).
 */
export type LLMOptions = (
  | (ServingArgs & GenerationConfigArgs)
  | { runner: ModelRunner; tokenizer: TokenizerLike | null; engineArgs: EngineArgs; imageInput?: Gemma3ImageInputSpec | null; limitMmPerPrompt?: Record<string, number>; mmProcessorKwargs?: Record<string, unknown> | null; interleaveMmStrings?: boolean }
) & {
  logitsProcessors?: readonly LogitsProcessorInput[];
};

/**
 * vLLM's generation_config and override_generation_config engine arguments: where generate() and chat() take their
 * default sampling params ("auto": the model's generation_config.json, "vllm": none, or a directory's), and keys
 * over them (generation_config.json's names: {"temperature": 0.5, "max_new_tokens": 64}; null unsets one).
 */
export interface GenerationConfigArgs {
  generationConfig?: string;
  overrideGenerationConfig?: Record<string, unknown>;
}

/** The generation config arguments, checked; a bad one is an EngineInputError before anything loads. */
function checkGenerationConfigArgs(a: GenerationConfigArgs): { mode: string; override: Record<string, unknown> } {
  const mode = a.generationConfig ?? "auto";
  const sourceError = typeof mode === "string" ? generationConfigSourceError(mode) : `must be a string, got ${typeof mode}`;
  if (sourceError !== null) throw new EngineInputError("generation_config", sourceError);
  const override = a.overrideGenerationConfig ?? {};
  if (typeof override !== "object" || override === null || Array.isArray(override))
    throw new EngineInputError("override_generation_config", "must be an object of generation_config.json keys");
  const overrideError = generationOverrideError(override);
  if (overrideError !== null) throw new EngineInputError("override_generation_config", overrideError);
  return { mode, override };
}

/**
 * One chat() call's options besides sampling: a LoRA adapter, and mm_processor_kwargs over the LLM's (vLLM's
 * LLM.chat mm_processor_kwargs; Gemma 3: the pan-and-scan keys).
 */
export interface ChatCallOptions {
  loraRequest?: LoraRequest | null;
  mmProcessorKwargs?: Record<string, unknown> | null;
}

/**
 * An image input with mm_processor_kwargs over its processor's settings; a bad key or value is an EngineInputError,
 * a text-only model's (null) too.
 */
function imageInputWith(spec: Gemma3ImageInputSpec | null, kwargs: Record<string, unknown> | null | undefined): Gemma3ImageInputSpec | null {
  try {
    if (spec === null) {
      applyMmProcessorKwargs(PAN_AND_SCAN_DEFAULTS, kwargs);
      return null;
    }
    return withMmProcessorKwargs(spec, kwargs);
  } catch (e) {
    if (e instanceof MmProcessorKwargsError) throw new EngineInputError("mm_processor_kwargs", e.message);
    throw e;
  }
}

/**
 * Options of LLM.embed / classify / score: truncatePromptTokens keeps each prompt's last tokens; pooling is vLLM's
 * PoolingParams (normalize false: embeddings without L2 normalization; activation false: a classifier's raw logits).
 */
export interface PoolingOptions {
  truncatePromptTokens?: number;
  pooling?: PoolingOverrides;
}

/**
 * Offline batched generation.
 *
 * @example
 * const llm = new LLM({ runner, tokenizer, engineArgs: { maxModelLen: 2048, numGpuBlocks: 512 } });
 * const [out] = llm.generate(["Hello"], { temperature: 0, maxTokens: 8 });
 * console.log(out!.outputs[0]!.text);
 */
export class LLM {
  readonly engine: EngineCore;
  private readonly tokenizer: TokenizerLike | null;
  private nextId = 0;
  private readonly defaults: Partial<SamplingParams>;
  /** An image-text model's image input (chat() takes images); null for a text-only model. */
  private readonly imageInput: Gemma3ImageInputSpec | null;
  /** The most images one chat may hold (--limit-mm-per-prompt's image count). */
  private readonly imageLimit: number;
  /** Whether a "string" content format writes a message's images in their place (--interleave-mm-strings). */
  private readonly interleaveMmStrings: boolean;

  constructor(options: LLMOptions) {
    this.interleaveMmStrings = options.interleaveMmStrings ?? false;
    if ("model" in options) {
      // new LLM({ model: "path/to/dir", maxModelLen: 512 }): load and size the KV cache like vLLM
      // (KV-cache events are published by the serving engine's worker thread: recorded here, nothing would take them)
      if (options.kvEventsConfig != null) throw new EngineInputError("kv_events_config", "KV-cache events are published by `kiln serve` (its engine worker), not by LLM");
      const { generationConfig, overrideGenerationConfig, ...servingArgs } = options;
      const gen = checkGenerationConfigArgs({ generationConfig, overrideGenerationConfig });
      const s = createServingSetupSync(servingArgs);
      this.tokenizer = s.loaded.tokenizer;
      this.defaults = generationDefaults(gen.mode, s.loaded.generationConfig, gen.override) ?? {};
      this.engine = new EngineCore(s.engineArgs, s.runner, { tokenizer: s.loaded.tokenizer, logitsProcessors: options.logitsProcessors, draft: s.draft });
      const spec = s.loaded.vision !== undefined ? gemma3ImageInputSpec(s.loaded.path, s.loaded.tokenizer) : null;
      this.imageInput = imageInputWith(spec, options.mmProcessorKwargs);
      this.imageLimit = options.limitMmPerPrompt?.image ?? DEFAULT_IMAGE_LIMIT;
      return;
    }
    this.tokenizer = options.tokenizer;
    this.defaults = {};
    this.imageInput = imageInputWith(options.imageInput ?? null, options.mmProcessorKwargs);
    this.imageLimit = options.limitMmPerPrompt?.image ?? DEFAULT_IMAGE_LIMIT;
    this.engine = new EngineCore(options.engineArgs, options.runner, {
      tokenizer: options.tokenizer,
      logitsProcessors: options.logitsProcessors,
    });
  }

  /**
   * The sampling params generate() and chat() use when given none (vLLM's get_default_sampling_params): the
   * model's generation_config.json defaults (or generationConfig's, with overrideGenerationConfig over them) over
   * SamplingParams' own, for a model loaded from a path.
   */
  getDefaultSamplingParams(): Partial<SamplingParams> {
    return { ...this.defaults };
  }

  /** Stops the grammar threads the LLM's structured-output requests started (EngineCore.close); it can still generate. */
  close(): Promise<void> {
    return this.engine.close();
  }

  /**
   * vLLM's LLM.sleep: level 1 frees the KV cache, level 2 the weights too (read again by wakeUp); between generate()
   * calls no request is running. Needs enableSleepMode.
   */
  sleep(level: SleepLevel = 1): void {
    this.engine.sleep(level, "abort");
  }

  /** vLLM's LLM.wake_up: wakes `tags` ("weights", "kv_cache"; default everything asleep). */
  wakeUp(tags: readonly WakeTag[] | null = null): void {
    this.engine.wakeUp(tags);
  }

  /**
   * Generates for every prompt (one prompt, not in a list, is a list of one: vLLM's generate("text")). `params` is one
   * set for all prompts or one per prompt (default:
   * getDefaultSamplingParams()). `options.loraRequest` serves them with a LoRA adapter (one for all or one per
   * prompt; vLLM's lora_request; the LLM needs enableLora). Throws an EngineInputError for an invalid prompt or parameter before running
   * anything.
   */
  generate(
    prompts: PromptInput | PromptInput[],
    params: Partial<SamplingParams> | Partial<SamplingParams>[] = this.getDefaultSamplingParams(),
    options: { priority?: number[]; loraRequest?: LoraRequest | (LoraRequest | null)[] | null } = {},
  ): RequestOutput[] {
    if (this.engine.args.pooler !== null) throw new Error("[LLM.generate] this LLM pools (runner: \"pooling\"): use embed()");
    return this.run(Array.isArray(prompts) ? prompts : [prompts], params, options);
  }

  /** A prompt as the engine takes it: text is tokenized here; anything but a PromptInput is an EngineInputError. */
  private engineInput(p: PromptInput): { prompt: string | null; promptTokenIds: number[]; mmFeatures?: readonly MultiModalFeature[] } {
    if (typeof p === "string") return { prompt: p, promptTokenIds: this.requireTokenizer().encode(p) };
    if (typeof p !== "object" || p === null)
      throw new EngineInputError("prompt", `must be a string or an object with prompt, promptTokenIds or promptEmbeds, got ${p === null ? "null" : typeof p}`);
    if ("promptEmbeds" in p) return { prompt: null, ...promptEmbedsInput(p.promptEmbeds, p.hiddenSize) };
    if (p.promptTokenIds === undefined) {
      if (typeof p.prompt !== "string") throw new EngineInputError("prompt", "an object prompt needs prompt (text), promptTokenIds or promptEmbeds");
      return { prompt: p.prompt, promptTokenIds: this.requireTokenizer().encode(p.prompt) };
    }
    return { prompt: p.prompt ?? null, promptTokenIds: p.promptTokenIds, ...(p.mmFeatures ? { mmFeatures: p.mmFeatures } : {}) };
  }

  /** Adds every prompt, steps until all finish, and returns their final outputs in input order. */
  private run(
    prompts: PromptInput[],
    params: Partial<SamplingParams> | Partial<SamplingParams>[],
    options: { priority?: number[]; loraRequest?: LoraRequest | (LoraRequest | null)[] | null },
  ): RequestOutput[] {
    // a list is one per prompt (vLLM: "The lengths of prompts and sampling_params must be the same.")
    const perPrompt = (param: string, list: readonly unknown[], what: string): void => {
      if (list.length !== prompts.length) throw new EngineInputError(param, `got ${list.length} ${what} for ${prompts.length} prompts; give one per prompt, or one for all`);
    };
    if (Array.isArray(params)) perPrompt("sampling_params", params, "SamplingParams");
    if (Array.isArray(options.loraRequest)) perPrompt("lora_request", options.loraRequest, "LoRA requests");
    if (options.priority !== undefined) perPrompt("priority", options.priority, "priorities");
    const ids: string[] = [];
    try {
      prompts.forEach((p, i) => {
        const requestId = String(this.nextId++);
        const input = this.engineInput(p);
        const sp = Array.isArray(params) ? params[i]! : params;
        const lora = Array.isArray(options.loraRequest) ? options.loraRequest[i] : options.loraRequest;
        this.engine.sampler.validateParams(sp);
        this.engine.addRequest({
          requestId,
          ...input,
          params: sp,
          priority: options.priority?.[i] ?? 0,
          loraRequest: lora ?? null,
          outputKind: "final_only",
        });
        ids.push(requestId);
      });
      const final = new Map<string, RequestOutput>();
      while (this.engine.hasUnfinishedRequests()) {
        for (const out of this.engine.step()) if (out.finished) final.set(out.requestId, out);
      }
      return ids.map((id) => final.get(id)!);
    } catch (e) {
      // a failed step (a logits processor that throws) leaves its requests scheduled but never sampled: left in the
      // engine they would stall every later call
      this.engine.abortRequest(ids);
      throw e;
    }
  }

  /**
   * Embeddings of every prompt (vLLM's LLM.embed), from an LLM made with runner "pooling": each prompt's final hidden
   * states pooled as the pooler config says (default LAST, L2-normalized). Throws EngineInputError for an invalid
   * prompt before running anything.
   *
   * @example
   * const llm = new LLM({ model: "models/kiln-default", runner: "pooling" });
   * const [e] = llm.embed(["The city"]); // e.embedding: Float32Array of hidden_size values
   */
  embed(prompts: PromptInput[], options: PoolingOptions = {}): EmbeddingOutput[] {
    if (this.engine.poolingTask !== "embed") throw new Error(`[LLM.embed] this LLM ${this.engine.poolingTask === "classify" ? "classifies: use classify()" : 'generates: make it with runner: "pooling" to embed'}`);
    return this.embedOrClassify(prompts, options).map((out) => ({
      requestId: out.requestId,
      prompt: out.prompt,
      promptTokenIds: out.promptTokenIds,
      embedding: out.pooled!,
    }));
  }

  /** The pooling engine's outputs for the prompts (their `pooled`: embeddings or class scores). */
  private embedOrClassify(prompts: PromptInput[], options: PoolingOptions): RequestOutput[] {
    const params = {
      maxTokens: 1,
      ...(options.truncatePromptTokens !== undefined ? { truncatePromptTokens: options.truncatePromptTokens } : {}),
      ...(options.pooling !== undefined ? { pooling: options.pooling } : {}),
    };
    return this.run(prompts, params, {});
  }

  /**
   * Class probabilities of every prompt (vLLM's LLM.classify) from a sequence classifier (*ForSequenceClassification,
   * which pools on its own): the last token's final hidden state through the model's classification head, softmax
   * over its labels (sigmoid for a single label), with the best label's name. Throws EngineInputError for an invalid
   * prompt before running anything.
   *
   * @example
   * const llm = new LLM({ model: "path/to/Qwen3ForSequenceClassification-dir" });
   * const [c] = llm.classify(["What a lovely day"]); // c.label: "positive", c.probs: Float32Array of num_labels
   */
  classify(prompts: PromptInput[], options: PoolingOptions = {}): ClassificationOutput[] {
    const labels = this.engine.classLabels;
    if (labels === null) throw new Error("[LLM.classify] this LLM is not a classifier (a *ForSequenceClassification model)");
    return this.embedOrClassify(prompts, options).map((out) => {
      const probs = out.pooled!;
      let best = 0;
      for (let i = 1; i < probs.length; i++) if (probs[i]! > probs[best]!) best = i;
      return { requestId: out.requestId, prompt: out.prompt, promptTokenIds: out.promptTokenIds, probs, label: labels[best]! };
    });
  }

  /**
   * Scores text pairs (vLLM's LLM.score) with an LLM made with runner "pooling": each text is embedded once and a pair
   * scores the cosine similarity of its two embeddings. A sequence classifier with one label (a cross-encoder) reads
   * each pair of texts as one prompt (see crossEncoderPromptIds) and a pair scores its classifier output. text1 and
   * text2 pair up 1:1, 1:N or N:N (one score per text2); other counts throw EngineInputError before running anything.
   *
   * @example
   * const llm = new LLM({ model: "models/kiln-default", runner: "pooling" });
   * const [paris, berlin] = llm.score("The capital of France", ["Paris", "Berlin"]); // paris.score: in [-1, 1]
   */
  score(text1: PromptInput | PromptInput[], text2: PromptInput | PromptInput[], options: PoolingOptions = {}): ScoringOutput[] {
    if (this.engine.args.pooler === null) throw new Error('[LLM.score] this LLM generates: make it with runner: "pooling" to score');
    const first = Array.isArray(text1) ? text1 : [text1];
    const second = Array.isArray(text2) ? text2 : [text2];
    const why = scorePairingError(first.length, second.length);
    if (why !== null) throw new EngineInputError(first.length === 0 ? "text_1" : "text_2", why);
    if (this.engine.classLabels !== null) return this.crossEncode(first, second, options);
    const embeddings = this.embed([...first, ...second], options);
    return scorePairs(first.length, second.length).map(([i, j]) => {
      const a = embeddings[i]!;
      const b = embeddings[first.length + j]!;
      return { requestId: `${a.requestId}_${b.requestId}`, promptTokenIds: [...a.promptTokenIds, ...b.promptTokenIds], score: cosineSimilarity(a.embedding, b.embedding) };
    });
  }

  /** LLM.score on a classifier: each pair's prompt classified, its one score (vLLM: num_labels 1 only, texts only). */
  private crossEncode(first: PromptInput[], second: PromptInput[], options: PoolingOptions): ScoringOutput[] {
    const why = crossEncoderLabelsError(this.engine.classLabels!.length);
    if (why !== null) throw new KilnError(`[LLM.score] Score API is ${why}`);
    const text = (p: PromptInput, param: string): string => {
      if (typeof p !== "string") throw new EngineInputError(param, "a cross-encoder scores texts, not token ids");
      return p;
    };
    const useSepToken = this.engine.useSepToken ?? true;
    const prompts = scorePairs(first.length, second.length).map(([i, j]) => ({
      promptTokenIds: crossEncoderPromptIds(this.requireTokenizer(), text(first[i]!, "text_1"), text(second[j]!, "text_2"), { useSepToken, addSpecialTokens: true }),
    }));
    return this.embedOrClassify(prompts, options).map((out) => ({ requestId: out.requestId, promptTokenIds: out.promptTokenIds, score: out.pooled![0]! }));
  }

  /**
   * Beam search (vLLM's LLM.beam_search): the beamWidth best continuations of each prompt, best first, each with its
   * generated token ids, text and cumulative logprob. Runs rounds of one-token steps (see beam-search.ts).
   *
   * @example
   * const [beams] = llm.beamSearch(["The city"], { beamWidth: 4, maxTokens: 16 });
   * console.log(beams![0]!.text);
   */
  beamSearch(prompts: PromptInput[], params: BeamSearchParams, options: { loraRequest?: LoraRequest | null } = {}): (BeamSearchResult & { text: string })[][] {
    checkBeamSearchParams(params);
    if (this.engine.args.pooler !== null) throw new Error("[LLM.beamSearch] this LLM pools (runner: \"pooling\")");
    const eos = this.tokenizer?.eosTokenIds ?? this.engine.args.eosTokenIds;
    const idsOf = (p: PromptInput): number[] => {
      if (typeof p === "object" && p !== null && "promptEmbeds" in p) throw new EngineInputError("prompt_embeds", "beam search is not supported with prompt embeddings");
      return this.engineInput(p).promptTokenIds;
    };
    const searches = prompts.map((p) => new BeamSearchInstance(idsOf(p), params, eos));
    for (let t = 0; t < params.maxTokens; t++) {
      const live = searches.filter((s) => s.beams.length > 0);
      if (live.length === 0) break;
      const beams = live.flatMap((s) => s.beams);
      const outs = this.run(beams.map((b) => ({ promptTokenIds: b.tokens })), live[0]!.roundParams, options);
      let k = 0;
      for (const s of live) s.advance(s.beams.map(() => outs[k++]!.outputs[0]!.logprobs?.[0] ?? null));
    }
    return searches.map((s) => s.finish().map((r) => ({ ...r, text: this.tokenizer?.decode(r.tokenIds, { skipSpecialTokens: true }) ?? "" })));
  }

  /**
   * Chat: one conversation or a list of them, rendered with the tokenizer's chat template (content format "auto" unless
   * `chatOptions` says, as vLLM's LLM.chat). A message's content may be content parts, images among them as the
   * server takes them (image_url parts: data: URLs; http(s) URLs need chatAsync), or an image's file bytes or RGB
   * pixels ({type: "image", image}). A bad image throws a ChatInputError naming its part. `params` is one set for all
   * conversations or one per conversation (as vLLM's list of SamplingParams).
   *
   * @example
   * const [out] = llm.chat([{ role: "user", content: [{ type: "text", text: "What is this?" }, { type: "image", image: pngBytes }] }]);
   */
  chat(
    messages: ChatInputMessage[] | ChatInputMessage[][],
    params: Partial<SamplingParams> | Partial<SamplingParams>[] = this.getDefaultSamplingParams(),
    chatOptions: ChatTemplateOptions = {},
    options: ChatCallOptions = {},
  ): RequestOutput[] {
    const chats = this.readChats(messages);
    const spec = imageInputWith(this.imageInput, options.mmProcessorKwargs);
    const prompts = chats.map((c) => this.chatPrompt(c, spec, spec === null ? [] : loadChatImagesSync(c.images, spec.processor), chatOptions));
    return this.generate(prompts, params, options);
  }

  /** chat(), fetching http(s) images first (each within 5 s, as the server fetches them). */
  async chatAsync(
    messages: ChatInputMessage[] | ChatInputMessage[][],
    params: Partial<SamplingParams> | Partial<SamplingParams>[] = this.getDefaultSamplingParams(),
    chatOptions: ChatTemplateOptions = {},
    options: ChatCallOptions = {},
  ): Promise<RequestOutput[]> {
    const spec = imageInputWith(this.imageInput, options.mmProcessorKwargs);
    const prompts: PromptInput[] = [];
    for (const c of this.readChats(messages))
      prompts.push(this.chatPrompt(c, spec, spec === null ? [] : await loadChatImages(c.images, spec.processor), chatOptions));
    return this.generate(prompts, params, options);
  }

  /** Each conversation's template messages and images, the images counted against the model's limit. */
  private readChats(messages: ChatInputMessage[] | ChatInputMessage[][]): { messages: ChatMessage[]; images: ChatImage[] }[] {
    const batched = messages.length > 0 && Array.isArray(messages[0]);
    const conversations = (batched ? messages : [messages]) as ChatInputMessage[][];
    return conversations.map((conv, c) => {
      const chat = readChatMessages(conv, batched ? `messages[${c}]` : "messages");
      checkImageCount(chat.images, this.imageInput, this.imageLimit);
      return chat;
    });
  }

  /** A conversation's prompt: the template's text (the template already carries BOS), its images (then crops) expanded. */
  private chatPrompt(
    chat: { messages: ChatMessage[]; images: ChatImage[] }, spec: Gemma3ImageInputSpec | null, pixels: Float32Array[][], chatOptions: ChatTemplateOptions,
  ): PromptInput {
    const tok = this.requireTokenizer();
    const render = (messages: ChatMessage[]) => tok.applyChatTemplate(messages, { addGenerationPrompt: true, contentFormat: "auto", ...chatOptions });
    const encode = (text: string) => tok.encode(text, { addSpecialTokens: false });
    if (chat.images.length === 0) {
      const text = render(chat.messages);
      return { prompt: text, promptTokenIds: encode(text) };
    }
    const p = imageChatPrompt(chat.messages, pixels, spec!, { render, encode, param: "messages", interleave: this.interleaveMmStrings });
    return { prompt: p.promptText, promptTokenIds: p.promptTokenIds, mmFeatures: p.features };
  }

  private requireTokenizer(): TokenizerLike {
    if (this.tokenizer === null) throw new Error("[LLM] text prompts and chat need a tokenizer");
    return this.tokenizer;
  }
}

