// State and checks shared by the chat and completions handlers.
import type { ToolCallParser } from "./tool-parsers.js";
import type { ReasoningParserName } from "./reasoning-parsers.js";
import type { HarmonyServing } from "./serving-chat-harmony.js";
import { randomBytes } from "node:crypto";
import type { FastifyReply, FastifyRequest } from "fastify";
import type { EngineClient, SamplingParams, TokenLogprobs } from "../engine/types.js";
import type { LoraRequest } from "../engine/lora-manager.js";
import { EngineSleepingError } from "../engine/sleep-mode.js";
import type { TokenizerLike } from "../models/tokenizer-types.js";
import { ApiError, badRequest, toApiError } from "./errors.js";
import type { InflightSet, UnstartedSet } from "./engine-stream.js";
import type { ServerMetrics } from "./metrics.js";
import type { CommonRequest } from "./protocol.js";
import type { KvTransferService } from "./kv-transfer.js";
import type { RequestLog } from "./request-log.js";
import type { MediaAccess } from "../models/chat-images.js";
import type { Gemma3ImageInputSpec } from "../models/gemma3-image-processor.js";

export interface ServingContext {
  engine: EngineClient;
  /** vLLM's request logger (--enable-log-requests), or null. */
  requestLog: RequestLog | null;
  tokenizer: TokenizerLike;
  metrics: ServerMetrics;
  servedModelNames: string[];
  /** The model as the server was given it (vLLM's `root` of /v1/models' cards). */
  modelPath: string;
  maxModelLen: number;
  maxWaitingRequests: number | undefined;
  /** A streamed reply's tokens per chunk (vLLM's --stream-interval). */
  streamInterval: number;
  generationDefaults: Partial<SamplingParams>;
  chatTemplate: string | undefined;
  /** A request may bring its own chat template (vLLM --trust-request-chat-template); else such requests get a 400. */
  trustRequestChatTemplate: boolean;
  /** vLLM --exclude-tools-when-tool-choice-none: tool_choice "none" renders the template without the tools. */
  excludeToolsWhenToolChoiceNone: boolean;
  /** tool_choice "auto" is served with it; null: refused (as vLLM without --enable-auto-tool-choice). */
  toolCallParser: ToolCallParser | null;
  /** Splits replies into reasoning and content (vLLM --reasoning-parser); null: replies are all content. */
  reasoningParser: ReasoningParserName | null;
  /** A gpt-oss model: prompts in Harmony format, replies read by channel (serving-chat-harmony.ts); null for others. */
  harmony: HarmonyServing | null;
  /** Default of structured output's disableAnyWhitespace. */
  disableAnyWhitespace: boolean;
  /** Whether usage reports the prompt tokens read from the prefix cache (vLLM --enable-prompt-tokens-details). */
  enablePromptTokensDetails: boolean;
  /** Whether /v1/completions takes prompt_embeds (vLLM --enable-prompt-embeds). */
  enablePromptEmbeds: boolean;
  /**
   * LoRA adapters served as models of their own (--lora-modules, /v1/load_lora_adapter), by name; null when LoRA
   * is not enabled.
   */
  loraModules: Map<string, LoraModule> | null;
  /** The largest LoRA id given so far (ids are never reused). */
  lastLoraId: number;
  /** A pooling engine's task: "embed" serves /v1/embeddings, /score and /rerank, "classify" /classify; null: it generates. */
  poolingTask: "embed" | "classify" | null;
  /** A classifier's label names, in score order (null unless poolingTask is "classify"). */
  classLabels: string[] | null;
  /** A classifier's use_sep_token: its /score and /rerank prompts are text pairs (true) or the texts joined (false). */
  useSepToken: boolean;
  /** The most logprobs / prompt_logprobs a request may ask (vLLM --max-logprobs, resolved: -1 is the vocabulary size). */
  maxLogprobs: number;
  /** The chat reply's role when add_generation_prompt is true (vLLM --response-role). */
  responseRole: string;
  /** Logprobs name tokens "token_id:<id>" unless a request says otherwise (vLLM --return-tokens-as-token-ids). */
  returnTokensAsTokenIds: boolean;
  /** Streams end with a usage chunk even without stream_options.include_usage (vLLM --enable-force-include-usage). */
  forceIncludeUsage: boolean;
  /** vLLM --logits-processor-pattern (a request's logits_processors get a 400 naming it), or null. */
  logitsProcessorPattern: string | null;
  /** vLLM --skip-tokenizer-init: no tokenizer; completions take token ids only (refuseWithoutTokenizer). */
  skipTokenizerInit: boolean;
  /** P/D disaggregation's side channel (--kv-transfer-config), or null. */
  kvTransfer: KvTransferService | null;
  /** The launch arguments /server_info reports (kiln serve's, secrets left out), or null. */
  launchConfig: Record<string, unknown> | null;
  inflight: InflightSet;
  unstarted: UnstartedSet;
  /** An image-text model's image input (Gemma 3), or null: requests with images get vLLM's "At most 0 image(s)" 400. */
  imageInput: Gemma3ImageInputSpec | null;
  /** The most images one prompt may carry (vLLM --limit-mm-per-prompt; default 999). */
  imageLimit: number;
  /** Where image URLs may point besides data: (vLLM's --allowed-local-media-path, --allowed-media-domains). */
  mediaAccess: MediaAccess;
  /** Whether a "string" content format writes a message's images where its parts put them (--interleave-mm-strings). */
  interleaveMmStrings: boolean;
}

/**
 * OpenAI's usage object. With --enable-prompt-tokens-details and some prompt tokens read from the prefix cache, it
 * carries prompt_tokens_details.cached_tokens (as vLLM: only when there are some).
 */
export function usageJson(ctx: ServingContext, prompt: number, completion: number, cached: number) {
  const details = ctx.enablePromptTokensDetails && cached > 0 ? { prompt_tokens_details: { cached_tokens: cached } } : {};
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion, ...details };
}

/** A chat or completions request with --enable-force-include-usage applied: its stream ends with usage, as vLLM's should_include_usage. */
export function forceUsage<R extends CommonRequest>(ctx: ServingContext, req: R): R {
  return ctx.forceIncludeUsage && !req.includeUsage ? { ...req, includeUsage: true } : req;
}

export const randomId = (prefix: string): string => `${prefix}-${randomBytes(16).toString("hex")}`;
export const nowSeconds = (): number => Math.floor(Date.now() / 1000);

/**
 * A chat or completions response's id as vLLM makes it, `${prefix}-${request id}` (fastify's request.id: the client's
 * X-Request-Id, else a random hex), and its engine request id: the same, unless the client named it (clients may send
 * one id twice at once, and the engine's ids must differ).
 */
export function responseIds(request: FastifyRequest, prefix: string, separator = "-"): { id: string; engineId: string } {
  const id = `${prefix}${separator}${request.id}`;
  return { id, engineId: request.headers["x-request-id"] ? `${id}-${randomBytes(4).toString("hex")}` : id };
}

/** A logprobs entry's token: its text, or "token_id:<id>" (vLLM's return_tokens_as_token_ids). */
export const logprobToken = (ctx: ServingContext, id: number, lp: TokenLogprobs | null | undefined, asIds: boolean): string =>
  asIds ? `token_id:${id}` : tokenText(ctx, id, lp);

/** A LoRA adapter the server serves under its name (vLLM's LoRAModulePath): the engine's LoRARequest and its base model. */
export interface LoraModule {
  request: LoraRequest;
  /** The served base model name it reports as parent in /v1/models. */
  baseModelName: string;
}

/**
 * The model name to answer with, and the LoRA adapter a request for it runs with (null for the base model);
 * 404 for a name that is not served (absent means the first served name).
 */
export function resolveModelAndLora(ctx: ServingContext, model: string | undefined): { model: string; lora: LoraRequest | null } {
  const lora = model === undefined ? undefined : ctx.loraModules?.get(model);
  if (lora !== undefined) return { model: model!, lora: lora.request };
  return { model: resolveModel(ctx, model), lora: null };
}

/** The model name to answer with; 404 for a name that is not served (absent means the first served name). */
export function resolveModel(ctx: ServingContext, model: string | undefined): string {
  if (model === undefined || model === "") return ctx.servedModelNames[0]!;
  if (ctx.loraModules?.has(model) === true) return model;
  if (!ctx.servedModelNames.includes(model)) {
    throw new ApiError(404, `The model \`${model}\` does not exist.`, "model", "not_found_error", "model_not_found");
  }
  return model;
}

/**
 * 503 when the `count` engine requests a request adds (one per input of a multi-input request) would make more than
 * --max-waiting-requests wait. Call it in the same tick as the engine requests are streamed, so that concurrent
 * arrivals see each other in `ctx.unstarted`.
 */
export function checkQueue(ctx: ServingContext, count = 1): void {
  if (ctx.engine.isSleeping?.() === true) throw toApiError(new EngineSleepingError()); // (sleep mode: until POST /wake_up)
  const max = ctx.maxWaitingRequests;
  if (max === undefined) return;
  const waiting = Math.max(ctx.engine.stats().numWaiting, ctx.unstarted.size); // the engine's count may lag
  if (waiting + count <= max) return;
  const message = count > max
    ? `The server is overloaded: this request has ${count} inputs, more than may wait at once (max ${max}). Send fewer inputs per request.`
    : `The server is overloaded: ${waiting} requests are waiting (max ${max})${count > 1 ? ` and this one adds ${count}` : ""}. Retry later.`;
  throw new ApiError(503, message, null, "service_unavailable_error", "queue_full");
}

/**
 * The prompt the engine reads under truncate_prompt_tokens: its last N tokens, cut before the length checks (as
 * vLLM's renderer cuts it), so that a prompt longer than the context is served; a text prompt is encoded and cut as
 * `encodeTruncated` cuts it (the tokenizer's BOS stays). N may be at most max_model_len less the requested max_tokens
 * (a 400 otherwise); -1 is that most.
 */
export function truncatePrompt(
  ctx: ServingContext, req: CommonRequest, prompt: number[] | { text: string; addSpecialTokens: boolean },
): number[] {
  const keep = req.truncatePromptTokens;
  const cut = (n: number | undefined): number[] => Array.isArray(prompt)
    ? (n === undefined ? prompt : cutTokens(prompt, n, "left"))
    : encodeTruncated(ctx.tokenizer, prompt.text, prompt.addSpecialTokens, n, "left");
  if (keep === undefined) return cut(undefined);
  const maxInput = ctx.maxModelLen - (req.maxTokens ?? req.maxTokensDefault ?? 0);
  if (keep > maxInput)
    throw badRequest(
      `truncate_prompt_tokens (${keep}) cannot be greater than max_model_len - max_tokens = ${maxInput}. Please request a smaller truncation size.`,
      "truncate_prompt_tokens");
  const n = keep === -1 ? maxInput : keep;
  if (n < 1) throw badRequest(`truncate_prompt_tokens ${keep} leaves no prompt`, "truncate_prompt_tokens");
  return cut(n);
}

/** The first `keep` ids (side "right") or the last (side "left"), as HF's truncation_side names them. */
export function cutTokens(ids: number[], keep: number, side: "left" | "right"): number[] {
  if (ids.length <= keep) return ids;
  return side === "left" ? ids.slice(ids.length - keep) : ids.slice(0, keep);
}

/**
 * A text's ids as HF's `tokenizer(text, add_special_tokens, truncation=True, max_length=keep)` gives them (vLLM's
 * renderer encodes text prompts so): the special tokens the tokenizer adds (a BOS, Bert's [CLS] and [SEP]) stay, and
 * only the text's own tokens are cut to make `keep` in all. undefined: no cut.
 */
export function encodeTruncated(
  tokenizer: TokenizerLike, text: string, addSpecialTokens: boolean, keep: number | undefined, side: "left" | "right",
): number[] {
  const all = tokenizer.encode(text, { addSpecialTokens });
  if (keep === undefined || all.length <= keep) return all;
  const body = addSpecialTokens ? tokenizer.encode(text, { addSpecialTokens: false }) : all;
  // where the text's tokens sit among the added ones (usually after a BOS)
  let start = -1;
  for (let s = 0; s + body.length <= all.length && start < 0; s++) if (body.every((t, i) => all[s + i] === t)) start = s;
  if (start < 0) return cutTokens(all, keep, side);
  const added = all.length - body.length;
  return [...all.slice(0, start), ...cutTokens(body, Math.max(0, keep - added), side), ...all.slice(start + body.length)];
}

/**
 * Final sampling params for one prompt: generation defaults under the request's values, and max_tokens
 * checked against max_model_len (default: the endpoint's default and the generation config's max_new_tokens, capped by
 * whatever room the prompt leaves).
 */
export function samplingParamsFor(ctx: ServingContext, req: CommonRequest, promptLen: number, promptParam: string): Partial<SamplingParams> {
  const room = ctx.maxModelLen - promptLen;
  if (room <= 0) {
    throw badRequest(
      `This model's maximum context length is ${ctx.maxModelLen} tokens. However, your request has ${promptLen} input tokens. ` +
        "Please reduce the length of the input.", promptParam);
  }
  if (req.maxTokens !== undefined && req.maxTokens > room) {
    throw badRequest(
      `This model's maximum context length is ${ctx.maxModelLen} tokens. However, you requested ${promptLen + req.maxTokens} tokens ` +
        `(${promptLen} in the input, ${req.maxTokens} in the completion). Please reduce the length of the input or completion.`,
      req.maxTokensParam);
  }
  const maxTokens = req.maxTokens ?? Math.min(room, ctx.generationDefaults.maxTokens ?? room, req.maxTokensDefault ?? room);
  const params = { ...ctx.generationDefaults, ...req.params, maxTokens };
  // vLLM's check and text (SamplingParams._validate_logprobs), with VLLMValidationError's (parameter=, value=) suffix
  // (the error's param names the request's field: chat and Responses requests ask sample logprobs as top_logprobs)
  const sampleField = promptParam === "messages" || promptParam === "input" ? "top_logprobs" : "logprobs";
  for (const [name, field, kind, n] of [["logprobs", sampleField, "sample", params.logprobs], ["prompt_logprobs", "prompt_logprobs", "prompt", params.promptLogprobs]] as const) {
    if (typeof n === "number" && n > ctx.maxLogprobs)
      throw badRequest(`Requested ${kind} logprobs of ${n}, which is greater than max allowed: ${ctx.maxLogprobs} (parameter=${name}, value=${n})`, field);
  }
  const so = params.structuredOutputs;
  if (so !== undefined && so !== null && so.disableAnyWhitespace === undefined && ctx.disableAnyWhitespace)
    params.structuredOutputs = { ...so, disableAnyWhitespace: true };
  if ((params.minTokens ?? 0) > maxTokens) throw badRequest(`'min_tokens' must be <= max_tokens (${maxTokens})`, "min_tokens");
  return params;
}

/** Token text for logprobs: the engine's decoded token, else the tokenizer's. */
export function tokenText(ctx: ServingContext, id: number, lp: TokenLogprobs | null | undefined): string {
  const own = lp?.get(id)?.decodedToken;
  if (own != null) return own;
  return ctx.tokenizer.decode([id], { skipSpecialTokens: false });
}

/** vLLM clamps -inf logprobs so that JSON can carry them. */
export const clampLogprob = (x: number): number => (Number.isFinite(x) ? x : -9999);

/**
 * vLLM's prompt_logprobs field: per prompt token, null for the first, else {token id: {logprob, rank, decoded_token}}
 * for the token itself and the prompt_logprobs most likely ones.
 */
export function promptLogprobsJson(lps: readonly (TokenLogprobs | null)[] | null): (Record<string, object> | null)[] | null {
  if (lps === null) return null;
  return lps.map((lp) => {
    if (lp === null) return null;
    const entry: Record<string, object> = {};
    for (const [id, l] of lp) entry[String(id)] = { logprob: clampLogprob(l.logprob), rank: l.rank, decoded_token: l.decodedToken };
    return entry;
  });
}

/** Aborts `controller` when the client goes away before the response is complete. */
export function abortOnDisconnect(request: FastifyRequest, reply: FastifyReply, controller: AbortController): void {
  const res = reply.raw;
  const onClose = (): void => {
    if (!res.writableFinished) controller.abort();
  };
  res.once("close", onClose);
  request.raw.once("aborted", () => controller.abort());
}

/** Server-sent events on the raw response (the reply is hijacked: fastify no longer touches it). */
export class SseWriter {
  private started = false;
  constructor(private readonly reply: FastifyReply) {}

  get closed(): boolean {
    return this.reply.raw.destroyed || this.reply.raw.writableEnded;
  }

  private start(): void {
    if (this.started) return;
    this.started = true;
    this.reply.hijack();
    this.reply.raw.writeHead(200, {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      connection: "keep-alive",
      "x-accel-buffering": "no",
    });
  }

  /** Writes one `data:` event (named by an `event:` line when `event` is given), waiting for the socket to drain when it is backed up. */
  async send(payload: unknown, event?: string): Promise<void> {
    this.start();
    if (this.closed) return;
    const data = `data: ${typeof payload === "string" ? payload : JSON.stringify(payload)}\n\n`;
    const ok = this.reply.raw.write(event === undefined ? data : `event: ${event}\n${data}`);
    if (!ok && !this.closed) {
      await new Promise<void>((resolve) => {
        const done = (): void => {
          this.reply.raw.off("drain", done);
          this.reply.raw.off("close", done);
          resolve();
        };
        this.reply.raw.once("drain", done);
        this.reply.raw.once("close", done);
      });
    }
  }

  /** Ends the stream with no closing event (OpenAI's Responses API sends no [DONE]). */
  close(): void {
    this.start();
    if (!this.closed) this.reply.raw.end();
  }

  /** Ends the stream; an error becomes one `data: {"error": ...}` event, as vLLM sends it. */
  async end(err?: unknown): Promise<void> {
    this.start();
    if (err !== undefined) await this.send(toApiError(err).toBody());
    await this.send("[DONE]");
    if (!this.closed) this.reply.raw.end();
  }
}
