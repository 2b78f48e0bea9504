// Anthropic's Messages API request (POST /v1/messages and /v1/messages/count_tokens, the wire shape vLLM's
// vllm/entrypoints/anthropic takes), validated and turned into the chat completions request that serves it: system
// becomes a system message, content blocks become chat messages (a tool_use block an assistant tool call, a
// tool_result block a tool message, an image block an image_url part), stop_sequences is stop, tools are function tools (input_schema their
// parameters) and tool_choice auto / any / tool / none is "auto" / "required" / a named function / "none". Errors
// leave in Anthropic's shape: {"type": "error", "error": {"type", "message"}}.
import { ApiError, badRequest, toApiError } from "./errors.js";
import { type Json, optBool, optInt, optNumber, optObject, optString, optStringArray } from "./fields.js";
import { asJsonBody } from "./protocol.js";
import type { WireMessage, WirePart } from "./responses-protocol.js";
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
  const imageParams: string[] = [];
  const messages = [...systemMessages(body), ...chatMessages(body.messages, imageParams)];
  const chatBody: Json & { messages: WireMessage[] } = { model, messages };
  const last = messages[messages.length - 1]!;
  if (prefill && last.role === "assistant" && last.tool_calls === undefined) {
    Object.assign(chatBody, { add_generation_prompt: false, continue_final_message: true });
  }
  const kwargs = optObject(body, "chat_template_kwargs"); // (vLLM's extension)
  if (kwargs !== undefined) chatBody.chat_template_kwargs = kwargs;
  const tools = parseTools(body.tools);
  if (tools !== undefined) chatBody.tools = tools;
  applyOutputConfig(body, chatBody); // (its effort may change the prompt: gpt-oss's Harmony system message)
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

/**
 * The system prompt: `system` (a string, or text blocks), then any system-role messages' text, joined as vLLM joins
 * them (with nothing between). Claude Code's x-anthropic-billing-header block is left out, as vLLM leaves it out: it
 * changes with each request and would defeat prefix caching.
 */
function systemMessages(body: Json): WireMessage[] {
  const parts = [...systemText(body.system, "system")];
  if (Array.isArray(body.messages)) {
    body.messages.forEach((m: unknown, i) => {
      const msg = m as Json | null;
      if (msg?.role === "system") parts.push(...systemText(msg.content, `messages[${i}].content`));
    });
  }
  return parts.length > 0 ? [{ role: "system", content: parts.join("") }] : [];
}

function systemText(raw: unknown, at: string): string[] {
  if (raw === undefined || raw === null) return [];
  if (typeof raw === "string") return raw === "" ? [] : [raw];
  if (!Array.isArray(raw)) throw badRequest(`'${at}' must be a string or a list of text blocks`, at);
  return raw.flatMap((b: unknown, j) => {
    const text = textBlock(b, `${at}[${j}]`);
    return text === "" || text.startsWith("x-anthropic-billing-header") ? [] : [text];
  });
}

/** A {type: "text", text} block's text; any other block is a 400 naming it. */
function textBlock(raw: unknown, at: string): string {
  const b = block(raw, at);
  if (b.type !== "text") throw unsupportedBlock(b.type, at);
  if (typeof b.text !== "string") throw badRequest(`'${at}.text' must be a string`, `${at}.text`);
  return b.text;
}

function block(raw: unknown, at: string): Json {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw badRequest(`'${at}' must be a content block object`, at);
  return raw as Json;
}

const unsupportedBlock = (type: unknown, at: string): ApiError =>
  badRequest(
    type === "image"
      ? "image blocks are taken in a user message's content only"
      : type === "document"
        ? "document content is not supported"
        : `content block type ${JSON.stringify(type)} is not supported here`,
    `${at}.type`,
  );

/**
 * An image block's source as the chat API's image_url part, as vLLM maps it: base64 data as a data: URL of its
 * media_type, a url as it is (a file_id source is refused: Kiln has no Files API).
 */
function imagePart(b: Json, at: string): WirePart {
  const source = b.source as Json | null | undefined;
  if (typeof source !== "object" || source === null || Array.isArray(source)) throw badRequest(`'${at}.source' must be an object`, `${at}.source`);
  if (source.type === "base64") {
    const mediaType = source.media_type;
    if (typeof mediaType !== "string" || !mediaType.startsWith("image/"))
      throw badRequest(`'${at}.source.media_type' must be an image media type (image/png, image/jpeg, ...)`, `${at}.source.media_type`);
    if (typeof source.data !== "string" || source.data === "") throw badRequest(`'${at}.source.data' must be base64 image data`, `${at}.source.data`);
    return { type: "image_url", image_url: { url: `data:${mediaType};base64,${source.data}` } };
  }
  if (source.type === "url") {
    if (typeof source.url !== "string" || source.url === "") throw badRequest(`'${at}.source.url' must be a non-empty string`, `${at}.source.url`);
    return { type: "image_url", image_url: { url: source.url } };
  }
  throw badRequest(`image source type ${JSON.stringify(source.type)} is not supported (only "base64" and "url")`, `${at}.source.type`);
}

/**
 * user and assistant messages as chat messages. A user message's tool_result blocks become tool messages (before its
 * text, as vLLM orders them); an assistant message's tool_use blocks become its tool calls, and its thinking blocks
 * are left out of the prompt (as a chat request's earlier reasoning is). A user message's image blocks make its
 * content the chat API's parts (text and image_url, in order; each image's param pushed to `imageParams`). Claude
 * Code's non-standard "ctx" and "msg" roles are read as user, as vLLM reads them; system messages went into the system
 * prompt.
 */
function chatMessages(raw: unknown, imageParams: string[]): WireMessage[] {
  if (!Array.isArray(raw) || raw.length === 0) throw badRequest("'messages' must be a non-empty list", "messages");
  const out: WireMessage[] = [];
  raw.forEach((m: unknown, i) => {
    const at = `messages[${i}]`;
    if (typeof m !== "object" || m === null || Array.isArray(m)) throw badRequest(`'${at}' must be an object`, at);
    const msg = m as Json;
    const role = msg.role === "ctx" || msg.role === "msg" ? "user" : msg.role;
    if (role === "system") return;
    if (role !== "user" && role !== "assistant") throw badRequest(`'${at}.role' must be "user" or "assistant"`, `${at}.role`);
    const content = msg.content;
    if (typeof content === "string") {
      out.push({ role, content });
      return;
    }
    if (!Array.isArray(content)) throw badRequest(`'${at}.content' must be a string or a list of content blocks`, `${at}.content`);
    const parts: WirePart[] = [];
    const calls: NonNullable<WireMessage["tool_calls"]> = [];
    content.forEach((raw: unknown, j) => {
      const bat = `${at}.content[${j}]`;
      const b = block(raw, bat);
      if (b.type === "text") parts.push({ type: "text", text: textBlock(b, bat) });
      else if (role === "user" && b.type === "image") {
        parts.push(imagePart(b, bat));
        imageParams.push(`${bat}.source`);
      }
      else if (role === "user" && b.type === "tool_result") out.push(toolResult(b, bat));
      else if (role === "assistant" && b.type === "tool_use") calls.push(toolUse(b, bat));
      else if (role !== "assistant" || (b.type !== "thinking" && b.type !== "redacted_thinking")) throw unsupportedBlock(b.type, bat);
    });
    // a user message of tool results only adds no user turn (as vLLM), nor does an assistant's thinking alone
    if (parts.length === 0 && calls.length === 0) return;
    if (parts.some((p) => p.type === "image_url")) {
      out.push({ role, content: parts });
      return;
    }
    const text = parts.flatMap((p) => (p.type === "text" ? [p.text] : [])).join("\n"); // (text parts join with newlines on the chat path)
    out.push(calls.length > 0 ? { role, content: text === "" ? null : text, tool_calls: calls } : { role, content: text });
  });
  if (out.length === 0) throw badRequest("'messages' holds no user or assistant content", "messages");
  return out;
}

function toolUse(b: Json, at: string): NonNullable<WireMessage["tool_calls"]>[number] {
  const id = optString(b, "id", { nonEmpty: true });
  const name = optString(b, "name", { nonEmpty: true });
  if (id === undefined || name === undefined) throw badRequest(`'${at}' must have an id and a name`, at);
  const input = b.input ?? {};
  if (typeof input !== "object" || Array.isArray(input)) throw badRequest(`'${at}.input' must be an object`, `${at}.input`);
  return { id, type: "function", function: { name, arguments: JSON.stringify(input) } };
}

/** A tool_result block as a tool message: its content a string or text blocks (joined with newlines, as vLLM). */
function toolResult(b: Json, at: string): WireMessage {
  const id = optString(b, "tool_use_id", { nonEmpty: true });
  if (id === undefined) throw badRequest(`'${at}.tool_use_id' is required`, `${at}.tool_use_id`);
  const c = b.content;
  let text: string;
  if (c === undefined || c === null) text = "";
  else if (typeof c === "string") text = c;
  else if (Array.isArray(c)) text = c.map((x: unknown, k) => textBlock(x, `${at}.content[${k}]`)).join("\n");
  else throw badRequest(`'${at}.content' must be a string or a list of text blocks`, `${at}.content`);
  optBool(b, "is_error"); // checked; the prompt carries the result's text only (as vLLM)
  return { role: "tool", tool_call_id: id, content: text };
}

/** Custom tools ({name, description, input_schema}) as chat function tools; Anthropic's server tools are refused. */
function parseTools(raw: unknown): Json[] | undefined {
  if (raw === undefined || raw === null) return undefined;
  if (!Array.isArray(raw)) throw badRequest("'tools' must be a list", "tools");
  if (raw.length === 0) return undefined;
  return raw.map((t: unknown, i) => {
    const at = `tools[${i}]`;
    const tool = block(t, at);
    if (tool.type !== undefined && tool.type !== null && tool.type !== "custom")
      throw badRequest(`tool type ${JSON.stringify(tool.type)} is not supported: only custom tools (name, description, input_schema)`, `${at}.type`);
    const name = optString(tool, "name", { nonEmpty: true });
    if (name === undefined) throw badRequest(`'${at}.name' is required`, `${at}.name`);
    const description = optString(tool, "description");
    const schema = tool.input_schema;
    if (typeof schema !== "object" || schema === null || Array.isArray(schema))
      throw badRequest(`'${at}.input_schema' must be a JSON schema object`, `${at}.input_schema`);
    // a schema without a type is an object's, as vLLM reads it
    const parameters = "type" in schema ? schema : { type: "object", ...schema };
    return { type: "function", function: { name, ...(description !== undefined ? { description } : {}), parameters } };
  });
}

/** tool_choice as the chat fields that serve it; disable_parallel_tool_use is parallel_tool_calls false. */
function parseToolChoice(raw: unknown): Json {
  if (raw === undefined || raw === null) return {}; // the chat default: "auto" with tools
  const tc = block(raw, "tool_choice");
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
  const t = block(raw, "thinking");
  if (t.type !== "enabled" && t.type !== "disabled" && t.type !== "adaptive")
    throw badRequest(`'thinking.type' must be "enabled", "disabled" or "adaptive"`, "thinking.type");
  optInt(t, "budget_tokens", { min: 0 });
}

/**
 * output_config (as vLLM maps it): format {type: "json_schema", schema} is the chat API's json_schema
 * response_format; effort reaches the chat template as reasoning_effort (and gpt-oss's Harmony prompt).
 */
function applyOutputConfig(body: Json, chatBody: Json): void {
  const oc = optObject(body, "output_config");
  if (oc === undefined) return;
  const format = optObject(oc, "format");
  if (format !== undefined) {
    if (format.type !== undefined && format.type !== "json_schema")
      throw badRequest(`'output_config.format.type' must be "json_schema"`, "output_config.format.type");
    const schema = format.schema;
    if (typeof schema !== "object" || schema === null || Array.isArray(schema))
      throw badRequest("'output_config.format.schema' must be a JSON schema object", "output_config.format.schema");
    chatBody.response_format = { type: "json_schema", json_schema: { name: "json_schema", schema } };
  }
  const effort = optString(oc, "effort");
  if (effort !== undefined) chatBody.chat_template_kwargs = { ...(chatBody.chat_template_kwargs as Json | undefined), reasoning_effort: effort };
}

export { anthropicErrorType, isMessagesPath, type AnthropicErrorBody } from "../util/anthropic-errors.js";

/** Anything thrown on the Messages routes as its status and Anthropic's error object. */
export function anthropicError(err: unknown): { status: number; body: AnthropicErrorBody } {
  const e = toApiError(err);
  return { status: e.status, body: anthropicErrorBody(e.status, e.message) };
}
