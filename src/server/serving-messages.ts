// POST /v1/messages and POST /v1/messages/count_tokens (Anthropic's Messages API, as vLLM serves it next to OpenAI's):
// the request becomes a chat request (anthropic-protocol.ts) and runs as one, through the chat template, sampling,
// stop strings, tool-call parser and reasoning parser of the chat path; the reply comes back as an Anthropic message
// (thinking, text and tool_use content blocks), whole or as Anthropic's server-sent events (messages-stream.ts).
// Errors on these routes, the request's body included, leave as Anthropic's error objects (server.ts's error handler).
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import type { FinishReason, RequestOutput } from "../engine/types.js";
import { parseMessagesRequest, type MessagesRequest } from "./anthropic-protocol.js";
import { messageObject, stopReasonOf, thinkingSignature, toolUseId, type ContentBlock, type MessageTurn } from "./messages-output.js";
import { ApiError, badRequest, toApiError } from "./errors.js";
import { chatPrompt, type ChatPrompt } from "./chat-prompt.js";
import type { Json } from "./fields.js";
import { primeStream, streamEngineRequest } from "./engine-stream.js";
import { streamMessage } from "./messages-stream.js";
import { parseChatRequest, type ChatRequest } from "./protocol.js";
import { splitReasoning, thinkingMode } from "./reasoning-parsers.js";
import { readReply, servesAutoTools } from "./serving-chat.js";
import { chatEffort, harmonyChatPrompt, harmonyMessage, harmonyParams } from "./serving-chat-harmony.js";
import { abortOnDisconnect, checkQueue, resolveModelAndLora, responseIds, samplingParamsFor, type ServingContext } from "./serving-context.js";
import { refuseOnPoolingRunner } from "./serving-embeddings.js";

/** Registers POST /v1/messages and /v1/messages/count_tokens (their errors are Anthropic's objects: see server.ts). */
export function registerMessagesRoutes(app: FastifyInstance, bound: () => ServingContext): void {
  app.post("/v1/messages", (request: FastifyRequest, reply: FastifyReply) => handleMessages(bound(), request, reply));
  app.post("/v1/messages/count_tokens", (request: FastifyRequest) => countTokens(bound(), request));
}

/** The chat request that serves it; its images' errors name their blocks (`messages[i].content[j].source`). */
function chatRequestOf(ctx: ServingContext, req: MessagesRequest): ChatRequest {
  const chat = parseChatRequest(req.chatBody, ctx.tokenizer.vocabSize, { autoTools: servesAutoTools(ctx), trustChatTemplate: ctx.trustRequestChatTemplate });
  chat.images = chat.images.map((img, k) => ({ ...img, param: req.imageParams[k]! }));
  return chat;
}

/**
 * The request's prompt, as the chat API renders the same chat request (gpt-oss: the Harmony prompt); Anthropic's
 * error object has no param, so an image's error message names its block.
 */
async function messagesPrompt(ctx: ServingContext, req: MessagesRequest, chat: ChatRequest): Promise<ChatPrompt> {
  try {
    return await chatPrompt(ctx, chat, () => harmonyChatPrompt(chat, req.chatBody.messages, chatEffort(req.chatBody, chat), "output_config.effort"));
  } catch (err) {
    const e = toApiError(err);
    if (e.param === null || !req.imageParams.includes(e.param)) throw err;
    throw badRequest(`${e.param}: ${e.message}`, e.param);
  }
}

/** count_tokens: the prompt's length in tokens, as /v1/messages would send it, images expanded (vLLM also reports it as context_management's). */
async function countTokens(ctx: ServingContext, request: FastifyRequest): Promise<Json> {
  refuseOnPoolingRunner(ctx, "Messages");
  const req = parseMessagesRequest(request.body, { count: true, prefill: ctx.harmony === null });
  resolveModelAndLora(ctx, req.model);
  const n = (await messagesPrompt(ctx, req, chatRequestOf(ctx, req))).promptTokenIds.length;
  return { input_tokens: n, context_management: { original_input_tokens: n } };
}

async function handleMessages(ctx: ServingContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  refuseOnPoolingRunner(ctx, "Messages");
  const req = parseMessagesRequest(request.body, { prefill: ctx.harmony === null });
  const { model, lora } = resolveModelAndLora(ctx, req.model);
  const chat = chatRequestOf(ctx, req);
  const { promptText, promptTokenIds, mmFeatures } = await messagesPrompt(ctx, req, chat);
  const sampled = samplingParamsFor(ctx, chat, promptTokenIds.length, "messages");
  const params = ctx.harmony !== null ? harmonyParams(ctx.harmony, sampled, chat) : sampled;
  const thinking = ctx.reasoningParser === null ? null : thinkingMode(ctx.reasoningParser, chat.chatTemplateKwargs, promptText);
  const { id, engineId } = responseIds(request, "msg", "_"); // (Anthropic's msg_ ids, carrying the request id)
  const turn: MessageTurn = { ctx, id, model, req, chat, params, promptLen: promptTokenIds.length, thinking };

  checkQueue(ctx);
  const controller = new AbortController();
  abortOnDisconnect(request, reply, controller);
  const stream = streamEngineRequest(ctx.engine, ctx.metrics, ctx.inflight, ctx.unstarted,
    { requestId: engineId, promptTokenIds, prompt: promptText, params, priority: chat.priority, loraRequest: lora, ...(mmFeatures !== null ? { mmFeatures } : {}), stream: req.stream, streamInterval: ctx.streamInterval },
    controller.signal, ctx.requestLog);
  try {
    const outputs = await primeStream(stream);
    if (req.stream) {
      await streamMessage(turn, reply, outputs);
      return reply;
    }
    return await collectMessage(turn, outputs);
  } finally {
    controller.abort(); // no-op for a finished request; frees its blocks if we leave early
  }
}

async function collectMessage(turn: MessageTurn, outputs: AsyncIterable<RequestOutput>): Promise<Json> {
  let text = "";
  const tokenIds: number[] = [];
  let finish: FinishReason = null;
  let stopReason: string | number | null = null;
  for await (const out of outputs) {
    const o = out.outputs[0];
    if (o === undefined || finish !== null) continue; // a finished sample may be listed again, empty
    text += o.text;
    tokenIds.push(...o.tokenIds);
    finish = o.finishReason;
    stopReason = o.stopReason;
  }
  // the engine ended it without finishing (a shutdown's drain ran out): no message to give
  if (finish === null || finish === "abort") throw new ApiError(500, "The request was aborted before its reply was complete", null, "server_error");
  const content = replyBlocks(turn, text, tokenIds, finish, stopReason);
  const toolUse = content.some((b) => b.type === "tool_use");
  return messageObject(turn, content, stopReasonOf(turn, finish, stopReason, toolUse), tokenIds.length);
}

/**
 * A whole reply's content blocks: its reasoning as a thinking block, its text, and its tool calls as tool_use blocks,
 * read for the request's tool_choice as the chat API reads them. A call whose arguments are not a JSON object (one
 * cut by max_tokens) stays text.
 */
function replyBlocks(turn: MessageTurn, text: string, tokenIds: number[], finish: FinishReason, stopReason: string | number | null): ContentBlock[] {
  const { ctx, chat } = turn;
  let reasoning: string | null;
  let content: string | null;
  let calls: { function: { name: string; arguments: string } }[];
  if (ctx.harmony !== null) {
    ({ reasoning, content, toolCalls: calls } = harmonyMessage(ctx, chat, tokenIds, finish, stopReason));
  } else {
    const split = turn.thinking === null ? { reasoning: null, content: text } : splitReasoning(text, turn.thinking);
    const r = readReply(ctx, chat, split.content ?? "");
    reasoning = chat.includeReasoning ? split.reasoning : null;
    content = r.content;
    calls = r.toolCalls ?? [];
  }
  const blocks: ContentBlock[] = [];
  if (reasoning) blocks.push({ type: "thinking", thinking: reasoning, signature: thinkingSignature() });
  if (content) blocks.push({ type: "text", text: content });
  for (const c of calls) {
    const input = jsonObject(c.function.arguments);
    blocks.push(input !== null ? { type: "tool_use", id: toolUseId(), name: c.function.name, input } : { type: "text", text: c.function.arguments });
  }
  return blocks;
}

function jsonObject(text: string): Json | null {
  try {
    const v: unknown = JSON.parse(text);
    return typeof v === "object" && v !== null && !Array.isArray(v) ? (v as Json) : null;
  } catch {
    return null;
  }
}
