// Anthropic's Messages API request (POST /v1/messages and /v1/messages/count_tokens, the wire shape vLLM's
// vllm/entrypoints/anthropic takes), validated and turned into the chat completions request that serves it: the
// prompt's fields (system, content blocks, tools, output_config) as models/anthropic-messages.ts converts them (the
// router tokenizes them so too), stop_sequences is stop and tool_choice auto / any / tool / none is "auto" /
// "required" / a named function / "none". Errors leave in Anthropic's shape: {"type": "error", "error": {"type", "message"}}.
import { badRequest, toApiError } from "./errors.js";
import { type Json, optBool, optInt, optNumber, optObject, optString, optStringArray } from "./fields.js";
import { asJsonBody } from "./protocol.js";
import { ChatInputError, type WireMessage } from "../models/chat-images.js";
import { contentBlock, messagesChatFields, type MessagesChatFields } from "../models/anthropic-messages.js";
import { anthropicErrorBody, type AnthropicErrorBody } from "../util/anthropic-errors.js";

export interface MessagesRequest {
  model: string;
  stream: boolean;
  /** stop_sequences: a reply stopped by one of them ends with stop_reason "stop_sequence". */
  stopSequences: string[];
  /** The chat completions request that serves it (the chat API's wire shape, as parseChatRequest reads it). */
  chatBody: Json & { messages: WireMessage[] };
  /** Where each image of the messages sits (`messages[i].content[j].source`), in order: the chat request's image params. */
  imageParams: string[];
}

/**
 * A Messages request (`count`: a count_tokens request, which has no max_tokens and samples nothing) as the chat
 * request that serves it. `prefill`: a final assistant message is continued (Anthropic's prefill) rather than
 * followed by a new turn; false where the chat path cannot continue a message (gpt-oss's Harmony prompts).
 */
export function parseMessagesRequest(raw: unknown, { count = false, prefill = true } = {}): MessagesRequest {
  const body = asJsonBody(raw);
  const model = optString(body, "model");
  if (model === undefined || model === "") throw badRequest("'model' is required", "model");
  const { chat, imageParams } = promptFields(body, prefill);
  const chatBody: MessagesRequest["chatBody"] = { model, ...chat };
  const tools = chat.tools;
  // counting renders the prompt only: the tools are in it whatever the choice, and "auto" needs no parser to count
  if (count) return { model, stream: false, stopSequences: [], chatBody: { ...chatBody, ...(tools !== undefined ? { tool_choice: "none" } : {}) }, imageParams };
  Object.assign(chatBody, parseToolChoice(body.tool_choice));

  // max_tokens is required, as Anthropic and vLLM require it
  const maxTokens = optInt(body, "max_tokens", { min: 1 });
  if (maxTokens === undefined) throw badRequest("'max_tokens' is required", "max_tokens");
  chatBody.max_tokens = maxTokens;
  for (const name of ["temperature", "top_p"]) {
    const v = optNumber(body, name);
    if (v !== undefined) chatBody[name] = v;
  }
  const topK = optInt(body, "top_k", { min: 0 });
  if (topK !== undefined && topK > 0) chatBody.top_k = topK; // Anthropic's 0 is no top-k, as chat's absent
  const stopSequences = optStringArray(body, "stop_sequences") ?? [];
  if (stopSequences.length > 0) chatBody.stop = stopSequences;
  const stream = optBool(body, "stream") ?? false;
  chatBody.stream = stream;
  optObject(body, "metadata"); // metadata.user_id: an identifier, checked and otherwise unused (as vLLM)
  checkThinking(body.thinking);
  return { model, stream, stopSequences, chatBody, imageParams };
}

/** The prompt's chat fields (models/anthropic-messages.ts); what cannot be served is a 400 naming the field. */
function promptFields(body: Json, prefill: boolean): { chat: MessagesChatFields; imageParams: string[] } {
  try {
    return messagesChatFields(body, { prefill });
  } catch (e) {
    if (e instanceof ChatInputError) throw badRequest(e.message, e.param);
    throw e;
  }
}

/** tool_choice as the chat fields that serve it; disable_parallel_tool_use is parallel_tool_calls false. */
function parseToolChoice(raw: unknown): Json {
  if (raw === undefined || raw === null) return {}; // the chat default: "auto" with tools
  const tc = contentBlock(raw, "tool_choice");
  const parallel = optBool(tc, "disable_parallel_tool_use") === true ? { parallel_tool_calls: false } : {};
  switch (tc.type) {
    case "auto":
      return { tool_choice: "auto", ...parallel };
    case "any":
      return { tool_choice: "required", ...parallel };
    case "none":
      return { tool_choice: "none" };
    case "tool": {
      const name = optString(tc, "name", { nonEmpty: true });
      if (name === undefined) throw badRequest("tool_choice.name is required when type is 'tool'", "tool_choice.name");
      return { tool_choice: { type: "function", function: { name } }, ...parallel };
    }
    default:
      throw badRequest(`'tool_choice.type' must be one of "auto", "any", "tool" or "none"`, "tool_choice.type");
  }
}

/**
 * thinking ({type: "enabled", budget_tokens} | {type: "disabled"} | {type: "adaptive"}) is checked and otherwise
 * not acted on, as vLLM takes it: whether the model thinks is its chat template's (chat_template_kwargs), and a
 * server with a reasoning parser returns the thinking as thinking blocks.
 */
function checkThinking(raw: unknown): void {
  if (raw === undefined || raw === null) return;
  const t = contentBlock(raw, "thinking");
  if (t.type !== "enabled" && t.type !== "disabled" && t.type !== "adaptive")
    throw badRequest(`'thinking.type' must be "enabled", "disabled" or "adaptive"`, "thinking.type");
  optInt(t, "budget_tokens", { min: 0 });
}

export { anthropicErrorType, isMessagesPath, type AnthropicErrorBody } from "../util/anthropic-errors.js";

/** Anything thrown on the Messages routes as its status and Anthropic's error object. */
export function anthropicError(err: unknown): { status: number; body: AnthropicErrorBody } {
  const e = toApiError(err);
  return { status: e.status, body: anthropicErrorBody(e.status, e.message) };
}
