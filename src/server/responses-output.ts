// A Responses API reply as OpenAI's objects: output items (reasoning, message, function_call), usage, and the response
// object that repeats the request's fields. Shared by whole replies (serving-responses.ts) and streamed ones
// (responses-stream.ts), so that both give the same items for the same reply.
import { randomBytes } from "node:crypto";
import type { FinishReason, SamplingParams } from "../engine/types.js";
import { thinkMarkers } from "../engine/reasoning.js";
import type { Json } from "./fields.js";
import type { ChatRequest } from "./protocol.js";
import { splitReasoning, type ThinkingMode } from "./reasoning-parsers.js";
import type { ResponsesRequest } from "./responses-protocol.js";
import { readReply, type ChatLogprob } from "./serving-chat.js";
import { callName, messageKind } from "./harmony-parse.js";
import { harmonyReasoningTokens, parseReply } from "./serving-chat-harmony.js";
import type { ServingContext } from "./serving-context.js";

/** What one request fixed before the engine ran: the response's identity, its echoed fields and how to read the reply. */
export interface Turn {
  ctx: ServingContext;
  id: string;
  createdAt: number;
  model: string;
  req: ResponsesRequest;
  chat: ChatRequest;
  params: Partial<SamplingParams>;
  promptLen: number;
  /** How the reasoning parser reads the reply (null: no parser). */
  thinking: ThinkingMode | null;
}

/** The response's status for the way its reply ended. */
export function statusOf(reason: FinishReason | "abort"): "completed" | "incomplete" | "failed" {
  if (reason === "length") return "incomplete";
  return reason === "abort" ? "failed" : "completed";
}

const itemId = (prefix: string): string => `${prefix}_${randomBytes(16).toString("hex")}`;

/** A message item; `logprobs` (include: message.output_text.logprobs) go on its output_text. */
export const messageItem = (id: string, text: string, status: string, logprobs: ChatLogprob[] | null = null): Json => ({
  type: "message",
  id,
  status,
  role: "assistant",
  content: [{ type: "output_text", text, annotations: [], ...(logprobs === null ? {} : { logprobs }) }],
});
export const reasoningItem = (id: string, text: string, status: string): Json => ({
  type: "reasoning",
  id,
  summary: [],
  content: [{ type: "reasoning_text", text }],
  status,
});
export const functionCallItem = (id: string, callId: string, name: string, args: string, status: string): Json => ({
  type: "function_call",
  id,
  call_id: callId,
  name,
  arguments: args,
  status,
});
export const newItemIds = {
  message: () => itemId("msg"),
  reasoning: () => itemId("rs"),
  call: () => itemId("fc"),
  callId: () => itemId("call"),
};

/**
 * A whole reply as output items, in the order the stream opens them: its reasoning, its text (none when empty) and its
 * tool calls, read for the request's tool_choice as the chat API reads them. A reply cut by max_output_tokens leaves
 * its last item incomplete.
 */
export function outputItems(turn: Turn, text: string, status: string, logprobs: ChatLogprob[] | null = null): Json[] {
  const split = turn.thinking === null ? { reasoning: null, content: text } : splitReasoning(text, turn.thinking);
  const r = readReply(turn.ctx, turn.chat, split.content ?? "");
  const items: Json[] = [];
  if (split.reasoning) items.push(reasoningItem(newItemIds.reasoning(), split.reasoning, "completed"));
  if (r.content) items.push(messageItem(newItemIds.message(), r.content, "completed", logprobs));
  for (const c of r.toolCalls ?? [])
    items.push(functionCallItem(newItemIds.call(), newItemIds.callId(), c.function.name, c.function.arguments, "completed"));
  if (status === "incomplete" && items.length > 0) items[items.length - 1]!.status = "incomplete";
  return items;
}

/**
 * A gpt-oss reply's items, one per Harmony message in order: analysis -> reasoning, final and preambles -> message,
 * a call to functions.NAME -> function_call (its text as the arguments, as vLLM's Responses API gives them; none
 * with tool_choice "none"). The message the reply was cut in counts when it has text, incomplete when cut by
 * max_output_tokens.
 */
export function harmonyOutputItems(
  turn: Turn, ids: readonly number[], finish: FinishReason | "abort", stopReason: string | number | null, status: string, logprobs: ChatLogprob[] | null = null,
): Json[] {
  const p = parseReply(turn.ctx, ids, finish, stopReason);
  const messages = p.current !== null && p.current.text === "" ? p.messages : p.all();
  const items: Json[] = [];
  let calls = 0;
  let lastIsCut = false; // the last item is the message the reply was cut in
  for (const m of messages) {
    const kind = messageKind(m);
    const before = items.length;
    if (kind === "reasoning") items.push(reasoningItem(newItemIds.reasoning(), m.text, "completed"));
    else if (kind === "content") items.push(messageItem(newItemIds.message(), m.text, "completed", logprobs));
    else if (kind === "call" && turn.chat.toolChoice.kind !== "none" && (turn.chat.parallelToolCalls || calls++ === 0))
      items.push(functionCallItem(newItemIds.call(), newItemIds.callId(), callName(m), m.text, "completed"));
    if (items.length > before) lastIsCut = m === p.current;
  }
  if (status === "incomplete" && lastIsCut) items[items.length - 1]!.status = "incomplete";
  return items;
}

/** OpenAI's usage; reasoning_tokens counts the reply's tokens before its </think> (without the markers). */
export function usageOf(turn: Turn, tokenIds: readonly number[], cached: number): Json {
  return {
    input_tokens: turn.promptLen,
    input_tokens_details: { cached_tokens: cached },
    output_tokens: tokenIds.length,
    output_tokens_details: { reasoning_tokens: reasoningTokens(turn, tokenIds) },
    total_tokens: turn.promptLen + tokenIds.length,
  };
}

function reasoningTokens(turn: Turn, ids: readonly number[]): number {
  if (turn.ctx.harmony !== null) return harmonyReasoningTokens(turn.ctx, ids);
  const parser = turn.ctx.reasoningParser;
  if (parser === null || turn.thinking === null || turn.thinking === "off") return 0;
  if (turn.thinking === "granite") {
    // text markers: the reasoning's text, as the tokenizer spells it
    const reasoning = splitReasoning(turn.ctx.tokenizer.decode([...ids]), "granite").reasoning;
    return reasoning === null ? 0 : turn.ctx.tokenizer.encode(reasoning, { addSpecialTokens: false }).length;
  }
  const m = thinkMarkers(turn.ctx.tokenizer, parser);
  if (turn.thinking === "mistral") {
    // the tokens between the first [THINK] and the first [/THINK] after it (or the end)
    const s = ids.indexOf(m.start);
    if (s < 0) return 0;
    const e = ids.indexOf(m.end, s);
    return (e < 0 ? ids.length : e) - s - 1;
  }
  if (turn.thinking === "tagged" && ids[0] !== m.start) return 0;
  const end = ids.indexOf(m.end);
  return ids.slice(0, end < 0 ? ids.length : end).filter((id) => id !== m.start).length;
}

/** The response object: its output and usage, and the request's fields as OpenAI's Response repeats them. */
export function responseObject(turn: Turn, status: string, output: Json[], usage: Json | null): Json {
  const { req, params } = turn;
  return {
    id: turn.id,
    object: "response",
    created_at: turn.createdAt,
    status,
    background: req.background,
    error: status === "failed" ? { code: "server_error", message: "The request was aborted before it finished." } : null,
    incomplete_details: status === "incomplete" ? { reason: "max_output_tokens" } : null,
    max_output_tokens: params.maxTokens ?? null,
    max_tool_calls: null,
    model: turn.model,
    output,
    parallel_tool_calls: turn.chat.parallelToolCalls,
    previous_response_id: req.previousResponseId,
    prompt: null,
    store: req.store,
    temperature: params.temperature ?? 1,
    top_p: params.topP ?? 1,
    truncation: "disabled",
    usage,
    ...req.echo,
  };
}
