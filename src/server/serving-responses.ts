// POST /v1/responses (OpenAI's Responses API, as vLLM serves it): the request becomes a chat request (see
// responses-protocol.ts) and runs as one; the reply comes back as output items (reasoning, message, function_call),
// whole or as OpenAI's typed server-sent events (responses-stream.ts). Stored responses (store: true, the default)
// continue with previous_response_id and are read back with GET /v1/responses/{id}. A background response (background:
// true) is answered at once as queued and runs on: GET reads its state, POST /v1/responses/{id}/cancel stops it.
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import type { FinishReason, RequestOutput } from "../engine/types.js";
import { ApiError, badRequest, toApiError } from "./errors.js";
import type { Json } from "./fields.js";
import { primeStream, streamEngineRequest } from "./engine-stream.js";
import { reasoningKeepsSpecialTokens, thinkingMode } from "./reasoning-parsers.js";
import { harmonyOutputItems, outputItems, responseObject, statusOf, usageOf, type Turn } from "./responses-output.js";
import { itemsToMessages, parseResponsesRequest, toChatRequest, type WireMessage } from "./responses-protocol.js";
import { streamResponse } from "./responses-stream.js";
import { chatPrompt } from "./chat-prompt.js";
import { chatLogprobs, servesAutoTools, type ChatLogprob } from "./serving-chat.js";
import { harmonyChatPrompt, harmonyParams } from "./serving-chat-harmony.js";
import type { ChatRequest } from "./protocol.js";
import {
  abortOnDisconnect,
  checkQueue,
  nowSeconds,
  resolveModelAndLora,
  responseIds,
  samplingParamsFor,
  type ServingContext,
} from "./serving-context.js";
import { refuseOnPoolingRunner } from "./serving-embeddings.js";

/** How many responses a server keeps (the newest; older ones are dropped and cannot be continued). vLLM keeps all. */
export const RESPONSE_STORE_CAPACITY = 1024;

/**
 * A stored response: the object returned, and its conversation (input and output as chat messages, no instructions);
 * while a background response runs, the controller that cancels it.
 */
interface Stored {
  response: Json;
  conversation: WireMessage[];
  running?: AbortController;
}

const stores = new WeakMap<ServingContext, Map<string, Stored>>();

function storeOf(ctx: ServingContext): Map<string, Stored> {
  let store = stores.get(ctx);
  if (store === undefined) stores.set(ctx, (store = new Map()));
  return store;
}

function keep(ctx: ServingContext, id: string, stored: Stored): void {
  const store = storeOf(ctx);
  store.set(id, stored);
  for (const [old, entry] of store) {
    if (store.size <= RESPONSE_STORE_CAPACITY) break;
    // a Map iterates in insertion order: the oldest first; a background response still running stays (it could no
    // longer be read or cancelled)
    if (entry.running === undefined) store.delete(old);
  }
}

const notFound = (id: string, param: string | null): ApiError =>
  new ApiError(404, `Response with id '${id}' not found.`, param, "invalid_request_error", "response_not_found");

/** Registers POST /v1/responses and GET /v1/responses/{id}. */
export function registerResponsesRoutes(app: FastifyInstance, bound: () => ServingContext): void {
  app.post("/v1/responses", (request: FastifyRequest, reply: FastifyReply) => handleResponses(bound(), request, reply));
  app.get(
    "/v1/responses/:responseId",
    async (request: FastifyRequest<{ Params: { responseId: string }; Querystring: Record<string, string> }>) => {
      const ctx = bound();
      refuseOnPoolingRunner(ctx, "Responses");
      if (request.query.stream === "true") throw badRequest("streaming a stored response is not supported: read it whole", "stream");
      const stored = storeOf(ctx).get(request.params.responseId);
      if (stored === undefined) throw notFound(request.params.responseId, null);
      return stored.response;
    },
  );
  app.post("/v1/responses/:responseId/cancel", async (request: FastifyRequest<{ Params: { responseId: string } }>) => {
    const ctx = bound();
    refuseOnPoolingRunner(ctx, "Responses");
    const stored = storeOf(ctx).get(request.params.responseId);
    if (stored === undefined) throw notFound(request.params.responseId, null);
    if (stored.response.background !== true) throw badRequest("Cannot cancel a synchronous response.", null);
    if (stored.running === undefined) throw badRequest(`Cannot cancel a response with status '${String(stored.response.status)}'.`, null);
    stored.running.abort(); // the running task sees it and stores the cancelled response
    stored.response = { ...stored.response, status: "cancelled" };
    stored.running = undefined;
    return stored.response;
  });
}

export async function handleResponses(ctx: ServingContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  refuseOnPoolingRunner(ctx, "Responses");
  const req = parseResponsesRequest(request.body);
  const { model, lora } = resolveModelAndLora(ctx, req.model);
  let earlier: WireMessage[] = [];
  if (req.previousResponseId !== null) {
    const prev = storeOf(ctx).get(req.previousResponseId);
    if (prev === undefined) throw notFound(req.previousResponseId, "previous_response_id");
    // a background response still running has no output yet: continuing would silently drop its answer
    if (prev.running !== undefined)
      throw badRequest(`Previous response '${req.previousResponseId}' is still ${String(prev.response.status)}: wait until it has finished (GET /v1/responses/{id}) or cancel it`, "previous_response_id");
    earlier = prev.conversation;
  }
  const conversation = [...earlier, ...req.input];
  if (conversation.length === 0) throw badRequest("'input' must be given: a string or a non-empty list of input items", "input");
  // instructions apply to this turn only: a continued conversation does not carry the earlier ones (as OpenAI)
  const messages = req.instructions === null ? conversation : [{ role: "system", content: req.instructions }, ...conversation];
  const chat = toChatRequest(req, messages, ctx.tokenizer.vocabSize, servesAutoTools(ctx), ctx.trustRequestChatTemplate);
  // gpt-oss: the instructions (the system message) become the Harmony developer message, reasoning.effort its system's
  const { promptText, promptTokenIds, mmFeatures } = await chatPrompt(ctx, chat, () => harmonyResponsesPrompt(chat, messages), { param: "input" });
  // as vLLM: max_output_tokens is capped by the room the prompt leaves (a prompt that leaves none is a 400 below)
  const room = ctx.maxModelLen - promptTokenIds.length;
  if (chat.maxTokens !== undefined && room > 0) chat.maxTokens = Math.min(chat.maxTokens, room);
  const sampled = samplingParamsFor(ctx, chat, promptTokenIds.length, "input");
  if (reasoningKeepsSpecialTokens(ctx.reasoningParser)) sampled.skipSpecialTokens ??= false;
  const params = ctx.harmony !== null ? harmonyParams(ctx.harmony, sampled, chat) : sampled;
  const thinking = ctx.reasoningParser === null ? null : thinkingMode(ctx.reasoningParser, chat.chatTemplateKwargs, promptText);
  // the id carries fastify's request id (the client's X-Request-Id, else random hex); engine ids must differ
  const { id, engineId } = responseIds(request, "resp", "_"); // (OpenAI's resp_ ids)
  const turn: Turn = { ctx, id, createdAt: nowSeconds(), model, req, chat, params, promptLen: promptTokenIds.length, thinking };
  // two background requests under one X-Request-Id would share an id: the first could no longer be read or cancelled
  if (req.background && storeOf(ctx).get(id)?.running !== undefined)
    throw badRequest(`a background response with id '${id}' is still running: send another X-Request-Id`, null);

  checkQueue(ctx);
  const controller = new AbortController();
  if (!req.background) abortOnDisconnect(request, reply, controller); // a background response outlives its request
  const stream = streamEngineRequest(
    ctx.engine,
    ctx.metrics,
    ctx.inflight,
    ctx.unstarted,
    {
      requestId: engineId,
      promptTokenIds,
      prompt: promptText,
      params,
      priority: chat.priority,
      ...(chat.cacheSalt ? { cacheSalt: chat.cacheSalt } : {}),
      loraRequest: lora,
      ...(mmFeatures !== null ? { mmFeatures } : {}),
      stream: req.stream,
      streamInterval: ctx.streamInterval,
    },
    controller.signal,
    ctx.requestLog,
  );
  if (req.background) return runInBackground(turn, conversation, stream, controller);
  try {
    const outputs = await primeStream(stream).catch((err: unknown) => {
      throw textFormatError(req.chatFields, err);
    });
    const response = await (req.stream ? streamResponse(turn, reply, outputs) : collectResponse(turn, outputs));
    // a response whose client left is not kept: it was cut short, and no one has its id
    if (response !== null && req.store && !controller.signal.aborted) {
      keep(ctx, id, { response, conversation: [...conversation, ...itemsToMessages(response.output as Json[], "output")] });
    }
    return req.stream ? reply : response;
  } finally {
    controller.abort(); // no-op for a finished request; frees its blocks if we leave early
  }
}

/**
 * Answers a background request with its queued response and runs it on: the stored response becomes in_progress when
 * the engine takes it, then completed / incomplete, failed (with the engine's error) or cancelled.
 */
function runInBackground(turn: Turn, conversation: WireMessage[], stream: AsyncGenerator<RequestOutput>, controller: AbortController): Json {
  const { ctx, id } = turn;
  const queued = responseObject(turn, "queued", [], null);
  const stored: Stored = { response: queued, conversation, running: controller };
  keep(ctx, id, stored);
  const finish = (response: Json) => {
    if (controller.signal.aborted && stored.running === undefined) return; // cancelled: the cancel stored its response
    stored.running = undefined;
    stored.response = response;
    stored.conversation = [...conversation, ...itemsToMessages(response.output as Json[], "output")];
  };
  void (async () => {
    try {
      const outputs = await primeStream(stream);
      if (stored.running !== undefined) stored.response = { ...stored.response, status: "in_progress" };
      finish(await collectResponse(turn, outputs));
    } catch (err) {
      const e = toApiError(textFormatError(turn.req.chatFields, err));
      finish({ ...responseObject(turn, "failed", [], null), error: { code: e.status < 500 ? "invalid_prompt" : "server_error", message: e.message } }); // (OpenAI's codes)
    } finally {
      controller.abort(); // frees the engine request's blocks if it is still running
    }
  })();
  return queued;
}

/** gpt-oss's Harmony prompt; a refusal names the Responses field (text.format for a chat request's response_format). */
function harmonyResponsesPrompt(chat: ChatRequest, messages: WireMessage[]): string {
  try {
    return harmonyChatPrompt(chat, messages, chat.chatTemplateKwargs?.reasoning_effort, "reasoning.effort");
  } catch (err) {
    if (err instanceof ApiError && err.param === "response_format") throw new ApiError(err.status, err.message, "text.format", err.type, err.code);
    throw err;
  }
}

/** An engine's refusal of the grammar that text.format asked for names text.format (the chat API names structured_outputs). */
function textFormatError(chatFields: Json, err: unknown): unknown {
  const e = toApiError(err);
  const fromTextFormat = chatFields.response_format !== undefined && chatFields.structured_outputs === undefined;
  return fromTextFormat && e.param === "structured_outputs" ? new ApiError(e.status, e.message, "text.format", e.type, e.code) : err;
}

async function collectResponse(turn: Turn, outputs: AsyncIterable<RequestOutput>): Promise<Json> {
  let text = "";
  const tokenIds: number[] = [];
  const top = turn.chat.topLogprobs;
  const logprobs: ChatLogprob[] | null = top === null ? null : [];
  let finish: FinishReason | "abort" = null;
  let stopReason: string | number | null = null;
  let cached = 0;
  for await (const out of outputs) {
    cached = out.numCachedTokens;
    const o = out.outputs[0];
    if (o === undefined || finish !== null) continue; // a finished sample may be listed again, empty
    text += o.text;
    tokenIds.push(...o.tokenIds);
    if (top !== null) logprobs!.push(...chatLogprobs(turn.ctx, o, top, false));
    finish = o.finishReason;
    stopReason = o.stopReason;
  }
  const status = statusOf(finish ?? "abort");
  const items = turn.ctx.harmony !== null ? harmonyOutputItems(turn, tokenIds, finish ?? "abort", stopReason, status, logprobs) : outputItems(turn, text, status, logprobs);
  return responseObject(turn, status, items, usageOf(turn, tokenIds, cached));
}
