// POST /v1/chat/completions: chat template -> engine -> chat.completion or chat.completion.chunk SSE.
import type { FastifyReply, FastifyRequest } from "fastify";
import type { CompletionOutput, FinishReason, RequestOutput, TokenLogprobs } from "../engine/types.js";
import type { ImageFeatureSpec } from "../models/gemma3-image-processor.js";
import { badRequest } from "./errors.js";
import { chatPrompt } from "./chat-prompt.js";
import { primeStream, streamEngineRequest } from "./engine-stream.js";
import { pyJsonLoads } from "./json-list-tool-parsers.js";
import { PyDict, pyJsonDumps } from "./python-json.js";
import { beamFinishReason, runBeamSearch } from "./serving-beam.js";
import { asJsonBody, parseChatRequest, refuseRequestLogitsProcessors, type ChatRequest } from "./protocol.js";
import type { KvSnapshot } from "../engine/kv-transfer.js";
import type { Json } from "./fields.js";
import { kvTransferField, planKvTransfer, type KvTransferPlan } from "./kv-transfer.js";
import { reasoningKeepsSpecialTokens, ReasoningStream, splitReasoning, thinkingMode, type ThinkingMode } from "./reasoning-parsers.js";
import { chatEffort, checkHarmonyToolChoice, HarmonyChatStream, harmonyChatPrompt, harmonyMessage, harmonyParams } from "./serving-chat-harmony.js";
import {
  abortOnDisconnect, checkQueue, forceUsage, clampLogprob, logprobToken, nowSeconds, promptLogprobsJson, randomId, resolveModelAndLora, responseIds,
  samplingParamsFor, SseWriter, tokenText, truncatePrompt, usageJson, type ServingContext,
} from "./serving-context.js";

export interface ChatLogprob {
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: { token: string; logprob: number; bytes: number[] }[];
}

const utf8Bytes = (s: string): number[] => Array.from(Buffer.from(s, "utf8"));

/**
 * OpenAI chat logprobs entries for newly generated tokens. `asIds` (return_tokens_as_token_ids): tokens are named
 * "token_id:<id>"; as vLLM, an entry's bytes stay its text's, and its top_logprobs' are those of the name.
 */
export function chatLogprobs(ctx: ServingContext, o: CompletionOutput, top: number, asIds: boolean): ChatLogprob[] {
  const lps = o.logprobs ?? [];
  return o.tokenIds.map((id, i) => {
    const lp: TokenLogprobs | undefined = lps[i];
    const text = tokenText(ctx, id, lp);
    const ranked = lp ? [...lp.entries()].sort((a, b) => a[1].rank - b[1].rank).slice(0, top) : [];
    return {
      token: asIds ? `token_id:${id}` : text,
      logprob: clampLogprob(lp?.get(id)?.logprob ?? -9999),
      bytes: utf8Bytes(text),
      top_logprobs: ranked.map(([tid, l]) => {
        const t = logprobToken(ctx, tid, lp, asIds);
        return { token: t, logprob: clampLogprob(l.logprob), bytes: utf8Bytes(t) };
      }),
    };
  });
}

interface Choice {
  text: string;
  numTokens: number;
  /** The generated token ids (kept for return_token_ids, and for Harmony's reading). */
  tokenIds: number[];
  logprobs: ChatLogprob[];
  finishReason: FinishReason;
  stopReason: string | number | null;
}

/** An OpenAI tool call of a chat message (arguments as JSON text). */
interface ToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

/** A reply read as a message: its content and tool calls (null when it makes none). */
interface Reply {
  content: string | null;
  toolCalls: ToolCall[] | null;
}

const call = (name: string, args: string, id?: string): ToolCall => ({ id: id ?? randomId("chatcmpl-tool"), type: "function", function: { name, arguments: args } });

/**
 * The reply as vLLM reads it for the request's tool_choice:
 *   - named function: the text (constrained to its parameters' schema) is the call's arguments; content "";
 *   - "required": the text (constrained) is a JSON list of {name, parameters}, one call each; content "";
 *   - "auto": the server's tool-call parser finds the calls, and the content is the text before them;
 *   - "none": the text.
 * A reply without complete calls (cut at max_tokens, or an auto reply with none) stays text.
 */
export function readReply(ctx: ServingContext, req: ChatRequest, text: string): Reply {
  const r = readCalls(ctx, req, text);
  // parallel_tool_calls false: the first call only (vLLM's maybe_filter_parallel_tool_calls)
  return r.toolCalls !== null && !req.parallelToolCalls ? { ...r, toolCalls: r.toolCalls.slice(0, 1) } : r;
}

function readCalls(ctx: ServingContext, req: ChatRequest, text: string): Reply {
  const tc = req.toolChoice;
  const asText: Reply = { content: text, toolCalls: null };
  switch (tc.kind) {
    case "none":
      return asText;
    case "named":
      return { content: "", toolCalls: [call(tc.name, text)] };
    case "auto": {
      const found = ctx.toolCallParser?.extract(text, req.tools) ?? null;
      return found === null ? asText : { content: found.content, toolCalls: found.calls.map((c) => call(c.name, c.arguments, c.id)) };
    }
    case "required": {
      // read as Python's json and written back by json.dumps(ensure_ascii=False), as vLLM does: {"city": "Oslo"}
      const list = pyJsonLoads(text);
      if (!Array.isArray(list)) return asText;
      const calls: ToolCall[] = [];
      for (const c of list) {
        const name = c instanceof PyDict ? c.get("name") : undefined;
        if (!(c instanceof PyDict) || typeof name !== "string") return asText;
        calls.push(call(name, pyJsonDumps(c.get("parameters") ?? new PyDict())));
      }
      return { content: "", toolCalls: calls };
    }
  }
}

/**
 * OpenAI's finish_reason "tool_calls" when an auto or "required" reply that ended normally made calls, as vLLM
 * reports them; a named function's reply keeps its own.
 */
const finishReasonOf = (req: ChatRequest, reply: Reply, reason: FinishReason | "abort"): string =>
  (req.toolChoice.kind === "auto" || (req.toolChoice.kind === "required" && reason === "stop")) && reply.toolCalls !== null
    ? "tool_calls"
    : (reason ?? "abort");

/** Whether tool_choice "auto" is served: with a tool-call parser, and for gpt-oss always (vLLM's Harmony path). */
export const servesAutoTools = (ctx: ServingContext): boolean => ctx.toolCallParser !== null || ctx.harmony !== null;

/**
 * The images of a prompt whose first `cut` tokens truncate_prompt_tokens dropped: those after the cut move with the
 * text, those wholly before it go with it, and a cut through an image's tokens is a 400 (its features are whole).
 */
function truncatedImages(images: ImageFeatureSpec[], cut: number): ImageFeatureSpec[] {
  if (cut === 0) return images;
  const through = images.find((f) => f.offset < cut && f.offset + f.length > cut);
  if (through !== undefined)
    throw badRequest(`truncate_prompt_tokens cuts the prompt inside an image's ${through.length} tokens (positions ${through.offset}..${through.offset + through.length - 1}); keep more tokens or none of the image`, "truncate_prompt_tokens");
  return images.filter((f) => f.offset >= cut).map((f) => ({ ...f, offset: f.offset - cut }));
}

export async function handleChat(ctx: ServingContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  refuseRequestLogitsProcessors(asJsonBody(request.body), ctx.logitsProcessorPattern);
  const req = forceUsage(ctx, parseChatRequest(request.body, ctx.tokenizer.vocabSize, { autoTools: servesAutoTools(ctx), trustChatTemplate: ctx.trustRequestChatTemplate }));
  const { model, lora } = resolveModelAndLora(ctx, req.model);
  const body = request.body as Json;
  if (req.images.length > 0 && req.beamSearch !== null) throw badRequest("beam search does not take images", "use_beam_search");
  const prompt = await chatPrompt(ctx, req, () => harmonyChatPrompt(req, body.messages as unknown[], chatEffort(body, req), "reasoning_effort"));
  const { promptText } = prompt;
  const promptTokenIds = truncatePrompt(ctx, req, prompt.promptTokenIds);
  const mmFeatures = prompt.mmFeatures === null ? null : truncatedImages(prompt.mmFeatures, prompt.promptTokenIds.length - promptTokenIds.length);
  const sampled = samplingParamsFor(ctx, req, promptTokenIds.length, "messages");
  if (reasoningKeepsSpecialTokens(ctx.reasoningParser)) sampled.skipSpecialTokens ??= false;
  if (ctx.harmony !== null) checkHarmonyToolChoice(ctx, req);
  const params = ctx.harmony !== null ? harmonyParams(ctx.harmony, sampled, req) : sampled;
  const thinking = replyMode(ctx, req, promptText);
  // vLLM's get_chat_request_role: --response-role for a new reply, else the role of the message it continues
  const role = req.addGenerationPrompt ? ctx.responseRole : req.messages[req.messages.length - 1]!.role;
  const { id, engineId } = responseIds(request, "chatcmpl");
  // a decode's K/V is fetched before the queue check, which must run in the tick its engine request starts
  const kvt = await planKvTransfer(ctx.kvTransfer, request.body as Json, 1);
  if (kvt !== null && req.beamSearch !== null) throw badRequest("beam search does not move K/V between servers", "kv_transfer_params");
  checkQueue(ctx);
  if (req.beamSearch !== null) {
    const disconnect = new AbortController();
    abortOnDisconnect(request, reply, disconnect);
    const { beams, usage } = await runBeamSearch(ctx, [promptTokenIds], [params], req.beamSearch.lengthPenalty, lora, disconnect.signal);
    const choices = beams[0]!.map((b, index) => {
      const { reasoning, content } = ctx.harmony !== null ? harmonyMessage(ctx, req, b.tokenIds, null, null) : reasoningOf(req, thinking, b.text);
      const message = { role, content, refusal: null, tool_calls: [], ...reasoningFields(ctx, reasoning) };
      return { index, message, logprobs: null, finish_reason: beamFinishReason(b), stop_reason: null, ...(req.returnTokenIds ? { token_ids: b.tokenIds } : {}) };
    });
    return { id, object: "chat.completion", created: nowSeconds(), model, choices, usage, ...(req.returnTokenIds ? { prompt_token_ids: promptTokenIds } : {}) };
  }

  const created = nowSeconds();
  const n = params.n ?? 1;
  const controller = new AbortController();
  abortOnDisconnect(request, reply, controller);
  const stream = streamEngineRequest(ctx.engine, ctx.metrics, ctx.inflight, ctx.unstarted,
    {
      requestId: engineId, promptTokenIds, prompt: promptText, params, priority: req.priority, ...(req.cacheSalt ? { cacheSalt: req.cacheSalt } : {}), loraRequest: lora,
      kvTransfer: kvt?.option ?? null, ...(mmFeatures !== null ? { mmFeatures } : {}), stream: req.stream, streamInterval: ctx.streamInterval,
    },
    controller.signal, ctx.requestLog);
  // echo: the final message's content goes before the reply when the reply takes that message's role (vLLM's rule:
  // a new reply after a message of --response-role, or any message the reply continues)
  const last = req.messages[req.messages.length - 1]!;
  const echoText = req.echo && last.role === role ? (last.content ?? "") : "";

  try {
    const outputs = await primeStream(stream);
    const asIds = req.returnTokensAsTokenIds ?? ctx.returnTokensAsTokenIds;
    const info = { id, created, model, n, promptTokenIds, echoText, thinking, role, asIds, kvt };
    return await (req.stream ? streamChat(ctx, req, reply, outputs, info) : collectChat(ctx, req, outputs, info));
  } finally {
    controller.abort(); // no-op for finished requests; frees blocks if we leave early
  }
}

/** How the server's reasoning parser reads the replies to this prompt (see reasoning-parsers.ts), or null without one. */
function replyMode(ctx: ServingContext, req: ChatRequest, promptText: string): ThinkingMode | null {
  return ctx.reasoningParser === null ? null : thinkingMode(ctx.reasoningParser, req.chatTemplateKwargs, promptText);
}

/** A reply's reasoning and content as the server's reasoning parser splits it (all content without one). */
function reasoningOf(req: ChatRequest, mode: ThinkingMode | null, text: string): { reasoning: string | null; content: string | null } {
  if (mode === null) return { reasoning: null, content: text };
  const s = splitReasoning(text, mode);
  return { reasoning: req.includeReasoning ? s.reasoning : null, content: s.content };
}

/** A message's (or delta's) reasoning under vLLM's name and its older one; none without a reasoning parser (or Harmony). */
const reasoningFields = (ctx: ServingContext, reasoning: string | null) =>
  ctx.reasoningParser === null && ctx.harmony === null ? {} : { reasoning, reasoning_content: reasoning };

interface ResponseInfo {
  id: string;
  created: number;
  model: string;
  n: number;
  promptTokenIds: number[];
  echoText: string;
  /** How the reasoning parser reads the replies (null: no parser). */
  thinking: ThinkingMode | null;
  /** The reply message's role. */
  role: string;
  /** Logprobs name tokens "token_id:<id>". */
  asIds: boolean;
  /** The request's kv_transfer_params, acted on. */
  kvt: KvTransferPlan | null;
}

async function collectChat(ctx: ServingContext, req: ChatRequest, outputs: AsyncIterable<RequestOutput>, info: ResponseInfo) {
  // the generated text only: it is split into reasoning and content and read for tool calls before the echo (of
  // the final message's content) goes in front of the content, as vLLM does
  const choices: Choice[] = Array.from({ length: info.n }, () => ({ text: "", numTokens: 0, tokenIds: [], logprobs: [], finishReason: null, stopReason: null }));
  let promptLogprobs: (TokenLogprobs | null)[] | null = null;
  let cached = 0;
  let kvSnapshot: KvSnapshot | undefined;
  for await (const out of outputs) {
    promptLogprobs ??= out.promptLogprobs;
    cached = out.numCachedTokens;
    kvSnapshot ??= out.kvSnapshot;
    for (const o of out.outputs) {
      const c = choices[o.index]!;
      if (c.finishReason !== null) continue; // finished samples may be listed again with empty deltas
      c.text += o.text;
      c.numTokens += o.tokenIds.length;
      if (req.returnTokenIds || ctx.harmony !== null) c.tokenIds.push(...o.tokenIds);
      if (req.topLogprobs !== null) c.logprobs.push(...chatLogprobs(ctx, o, req.topLogprobs, info.asIds));
      if (o.finishReason !== null) {
        c.finishReason = o.finishReason;
        c.stopReason = o.stopReason;
      }
    }
  }
  const completionTokens = choices.reduce((s, c) => s + c.numTokens, 0);
  return {
    id: info.id,
    object: "chat.completion",
    created: info.created,
    model: info.model,
    choices: choices.map((c, index) => {
      if (ctx.harmony !== null) {
        const h = harmonyMessage(ctx, req, c.tokenIds, c.finishReason ?? "abort", c.stopReason);
        return {
          index,
          message: { role: info.role, content: info.echoText + (h.content ?? "") || h.content, refusal: null, tool_calls: h.toolCalls, ...reasoningFields(ctx, h.reasoning) },
          logprobs: req.topLogprobs !== null ? { content: c.logprobs } : null,
          finish_reason: h.finishReason,
          stop_reason: c.stopReason,
          ...(req.returnTokenIds ? { token_ids: c.tokenIds } : {}),
        };
      }
      const { reasoning, content } = reasoningOf(req, info.thinking, c.text);
      const r = readReply(ctx, req, content ?? "");
      const text = content === null && r.toolCalls === null ? null : r.content;
      return {
        index,
        message: {
          role: info.role,
          content: info.echoText !== "" ? info.echoText + (text ?? "") : text,
          refusal: null,
          tool_calls: r.toolCalls ?? [],
          ...reasoningFields(ctx, reasoning),
        },
        logprobs: req.topLogprobs !== null ? { content: c.logprobs } : null,
        finish_reason: finishReasonOf(req, r, c.finishReason ?? "abort"),
        stop_reason: c.stopReason,
        ...(req.returnTokenIds ? { token_ids: c.tokenIds } : {}),
      };
    }),
    usage: usageJson(ctx, info.promptTokenIds.length, completionTokens, cached),
    ...kvTransferField(ctx.kvTransfer, info.kvt, kvSnapshot),
    ...(req.returnPromptLogprobs ? { prompt_logprobs: promptLogprobsJson(promptLogprobs) } : {}),
    ...(req.returnTokenIds ? { prompt_token_ids: info.promptTokenIds } : {}),
  };
}

async function streamChat(
  ctx: ServingContext, req: ChatRequest, reply: FastifyReply, outputs: AsyncIterable<RequestOutput>, info: ResponseInfo,
): Promise<FastifyReply> {
  const sse = new SseWriter(reply);
  const base = { id: info.id, object: "chat.completion.chunk", created: info.created, model: info.model };
  const usageField = req.includeUsage ? { usage: null } : {};
  let cached = 0;
  // each choice's tokens so far: continuous_usage_stats counts a chunk's own choice (as vLLM's), the final usage all
  const choiceTokens = new Array<number>(info.n).fill(0);
  const usage = () => usageJson(ctx, info.promptTokenIds.length, choiceTokens.reduce((a, b) => a + b, 0), cached);
  const chunkUsage = (index: number) =>
    req.continuousUsageStats ? { usage: usageJson(ctx, info.promptTokenIds.length, choiceTokens[index]!, cached) } : usageField;
  try {
    for (let index = 0; index < info.n; index++) {
      const delta = { role: info.role, content: info.echoText };
      // return_token_ids: the prompt's token ids ride on the role chunks, as vLLM sends them
      const promptIds = req.returnTokenIds ? { prompt_token_ids: info.promptTokenIds } : {};
      await sse.send({ ...base, choices: [{ index, delta, logprobs: null, finish_reason: null }], ...promptIds, ...chunkUsage(index) });
    }
    const done = new Set<number>(); // an engine may keep listing finished samples with empty deltas
    const tools = new ToolCallStream(ctx, req, info.n);
    const harmony = ctx.harmony === null ? null : new HarmonyChatStream(ctx, req, info.n);
    const mode = info.thinking;
    const reasoners = mode === null ? null : Array.from({ length: info.n }, () => new ReasoningStream(mode));
    for await (const out of outputs) {
      cached = out.numCachedTokens;
      for (const o of out.outputs) {
        if (done.has(o.index)) continue;
        if (o.finishReason !== null) done.add(o.index);
        choiceTokens[o.index]! += o.tokenIds.length;
        if (o.text === "" && o.finishReason === null && o.tokenIds.length === 0) continue;
        let delta: Record<string, unknown>;
        let finishReason: string | null;
        if (harmony !== null) ({ delta, finishReason } = harmony.delta(o.index, o.tokenIds, o.finishReason, o.stopReason));
        else {
          const split = reasoners?.[o.index]!.push(o.text, o.finishReason !== null) ?? { reasoning: "", content: o.text };
          ({ delta, finishReason } = tools.delta(o.index, split.content, o.finishReason));
          if (delta.content === "" && reasoners !== null) delete delta.content; // all held back, or all reasoning
          if (split.reasoning !== "" && req.includeReasoning) Object.assign(delta, reasoningFields(ctx, split.reasoning));
        }
        if (Object.keys(delta).length === 0 && o.finishReason === null && req.topLogprobs === null && !req.returnTokenIds) continue; // held back
        const choice = {
          index: o.index,
          delta,
          logprobs: req.topLogprobs !== null ? { content: chatLogprobs(ctx, o, req.topLogprobs, info.asIds) } : null,
          finish_reason: finishReason,
          ...(o.finishReason !== null ? { stop_reason: o.stopReason } : {}),
          ...(req.returnTokenIds ? { token_ids: o.tokenIds } : {}),
        };
        await sse.send({ ...base, choices: [choice], ...chunkUsage(o.index) });
      }
      if (sse.closed) break;
    }
    if (req.includeUsage) await sse.send({ ...base, choices: [], usage: usage() });
    await sse.end();
  } catch (err) {
    await sse.end(err);
  }
  return reply;
}

/**
 * Streamed tool calls. A named function's call opens with its id and name, and each text delta is an arguments
 * delta, as vLLM streams it. Replies read whole ("required" lists, and auto replies from where the parser says
 * calls may begin: see ToolCallParser.streamable) are held back and come in the sample's last chunk: its calls,
 * one tool_calls entry each, or the held text when it made none.
 */
export class ToolCallStream {
  private readonly text: string[];
  private readonly sent: number[]; // content characters of text already streamed
  private readonly opened: boolean[];

  constructor(
    private readonly ctx: ServingContext,
    private readonly req: ChatRequest,
    n: number,
  ) {
    this.text = new Array<string>(n).fill("");
    this.sent = new Array<number>(n).fill(0);
    this.opened = new Array<boolean>(n).fill(false);
  }

  delta(index: number, text: string, finish: FinishReason): { delta: Record<string, unknown>; finishReason: string | null } {
    const tc = this.req.toolChoice;
    if (tc.kind === "none") return { delta: { content: text }, finishReason: finish };
    if (tc.kind === "named") {
      if (this.opened[index]) return { delta: { tool_calls: [{ index: 0, function: { arguments: text } }] }, finishReason: finish };
      this.opened[index] = true;
      return { delta: { tool_calls: [{ index: 0, ...call(tc.name, text) }] }, finishReason: finish };
    }
    const all = (this.text[index] += text);
    const sent = this.sent[index]!;
    if (finish === null) {
      if (tc.kind === "required") return { delta: {}, finishReason: null };
      const upTo = this.ctx.toolCallParser!.streamable(all, sent);
      if (upTo <= sent) return { delta: {}, finishReason: null };
      this.sent[index] = upTo;
      return { delta: { content: all.slice(sent, upTo) }, finishReason: null };
    }
    const r = readReply(this.ctx, this.req, all);
    if (r.toolCalls === null) return { delta: { content: all.slice(sent) }, finishReason: finish };
    const rest = tc.kind === "auto" ? (r.content ?? "").slice(sent) : "";
    const delta = { ...(rest ? { content: rest } : {}), tool_calls: r.toolCalls.map((c, i) => ({ index: i, ...c })) };
    return { delta, finishReason: finishReasonOf(this.req, r, finish) };
  }
}
