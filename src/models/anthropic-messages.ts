// Anthropic's Messages API request as the chat request that serves it: the part of the conversion that decides the
// prompt (vLLM's vllm/entrypoints/anthropic), below both the server, which validates the rest and serves it
// (server/anthropic-protocol.ts), and the router, which tokenizes it as the server will (router/request-tokens.ts).
// system becomes a system message, content blocks become chat messages (a tool_use block an assistant tool call, a
// tool_result block a tool message, an image block an image_url part), tools are function tools (input_schema their
// parameters), output_config's format the json_schema response_format and its effort the template's reasoning_effort.
// What cannot be served is a ChatInputError naming the field (the server's 400).
import { ChatInputError, type WireMessage, type WirePart } from "./chat-images.js";

type Json = Record<string, unknown>;


/** The chat request fields a Messages request's prompt comes from (the chat API's wire names). */
export type MessagesChatFields = {
  messages: WireMessage[];
  /** Set (false, true) when a final assistant message is continued (Anthropic's prefill). */
  add_generation_prompt?: boolean;
  continue_final_message?: boolean;
  chat_template_kwargs?: Json;
  tools?: Json[];
  response_format?: Json;
};

const invalid = (message: string, param: string): ChatInputError => new ChatInputError(param, message);

// field readers with the server's words (server/fields.ts): null and absent are undefined
function optString(body: Json, name: string, { nonEmpty = false } = {}): string | undefined {
  const v = body[name];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "string") throw invalid(`'${name}' must be a string`, name);
  if (nonEmpty && v.length === 0) throw invalid(`'${name}' must not be empty`, name);
  return v;
}

function optObject(body: Json, name: string): Json | undefined {
  const v = body[name];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "object" || Array.isArray(v)) throw invalid(`'${name}' must be an object`, name);
  return v as Json;
}

function optBool(body: Json, name: string): boolean | undefined {
  const v = body[name];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "boolean") throw invalid(`'${name}' must be a boolean`, name);
  return v;
}

/**
 * The chat fields of a Messages request's prompt, and where each image of its messages sits
 * (`messages[i].content[j].source`, in order). `prefill`: a final assistant message is continued rather than followed
 * by a new turn; false where the chat path cannot continue a message (gpt-oss's Harmony prompts).
 * @example messagesChatFields({ system: "Be brief.", messages: [{ role: "user", content: "Hi" }] }).chat.messages
 * // [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" }]
 */
export function messagesChatFields(body: Json, { prefill = true } = {}): { chat: MessagesChatFields; imageParams: string[] } {
  const imageParams: string[] = [];
  const messages = [...systemMessages(body), ...chatMessages(body.messages, imageParams)];
  const chat: MessagesChatFields = { messages };
  const last = messages[messages.length - 1]!;
  if (prefill && last.role === "assistant" && last.tool_calls === undefined) Object.assign(chat, { add_generation_prompt: false, continue_final_message: true });
  const kwargs = optObject(body, "chat_template_kwargs"); // (vLLM's extension)
  if (kwargs !== undefined) chat.chat_template_kwargs = kwargs;
  const tools = parseTools(body.tools);
  if (tools !== undefined) chat.tools = tools;
  applyOutputConfig(body, chat); // (its effort may change the prompt: gpt-oss's Harmony system message)
  return { chat, imageParams };
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
  if (!Array.isArray(raw)) throw invalid(`'${at}' must be a string or a list of text blocks`, at);
  return raw.flatMap((b: unknown, j) => {
    const text = textBlock(b, `${at}[${j}]`);
    return text === "" || text.startsWith("x-anthropic-billing-header") ? [] : [text];
  });
}

/** A {type: "text", text} block's text; any other block is a 400 naming it. */
function textBlock(raw: unknown, at: string): string {
  const b = contentBlock(raw, at);
  if (b.type !== "text") throw unsupportedBlock(b.type, at);
  if (typeof b.text !== "string") throw invalid(`'${at}.text' must be a string`, `${at}.text`);
  return b.text;
}

/** `raw` as a content block object (or a 400 naming `at`). */
export function contentBlock(raw: unknown, at: string): Json {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw invalid(`'${at}' must be a content block object`, at);
  return raw as Json;
}

const unsupportedBlock = (type: unknown, at: string): ChatInputError =>
  invalid(
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
  if (typeof source !== "object" || source === null || Array.isArray(source)) throw invalid(`'${at}.source' must be an object`, `${at}.source`);
  if (source.type === "base64") {
    const mediaType = source.media_type;
    if (typeof mediaType !== "string" || !mediaType.startsWith("image/"))
      throw invalid(`'${at}.source.media_type' must be an image media type (image/png, image/jpeg, ...)`, `${at}.source.media_type`);
    if (typeof source.data !== "string" || source.data === "") throw invalid(`'${at}.source.data' must be base64 image data`, `${at}.source.data`);
    return { type: "image_url", image_url: { url: `data:${mediaType};base64,${source.data}` } };
  }
  if (source.type === "url") {
    if (typeof source.url !== "string" || source.url === "") throw invalid(`'${at}.source.url' must be a non-empty string`, `${at}.source.url`);
    return { type: "image_url", image_url: { url: source.url } };
  }
  throw invalid(`image source type ${JSON.stringify(source.type)} is not supported (only "base64" and "url")`, `${at}.source.type`);
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
  if (!Array.isArray(raw) || raw.length === 0) throw invalid("'messages' must be a non-empty list", "messages");
  const out: WireMessage[] = [];
  raw.forEach((m: unknown, i) => {
    const at = `messages[${i}]`;
    if (typeof m !== "object" || m === null || Array.isArray(m)) throw invalid(`'${at}' must be an object`, at);
    const msg = m as Json;
    const role = msg.role === "ctx" || msg.role === "msg" ? "user" : msg.role;
    if (role === "system") return;
    if (role !== "user" && role !== "assistant") throw invalid(`'${at}.role' must be "user" or "assistant"`, `${at}.role`);
    const content = msg.content;
    if (typeof content === "string") {
      out.push({ role, content });
      return;
    }
    if (!Array.isArray(content)) throw invalid(`'${at}.content' must be a string or a list of content blocks`, `${at}.content`);
    const parts: WirePart[] = [];
    const calls: NonNullable<WireMessage["tool_calls"]> = [];
    content.forEach((raw: unknown, j) => {
      const bat = `${at}.content[${j}]`;
      const b = contentBlock(raw, bat);
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
  if (out.length === 0) throw invalid("'messages' holds no user or assistant content", "messages");
  return out;
}

function toolUse(b: Json, at: string): NonNullable<WireMessage["tool_calls"]>[number] {
  const id = optString(b, "id", { nonEmpty: true });
  const name = optString(b, "name", { nonEmpty: true });
  if (id === undefined || name === undefined) throw invalid(`'${at}' must have an id and a name`, at);
  const input = b.input ?? {};
  if (typeof input !== "object" || Array.isArray(input)) throw invalid(`'${at}.input' must be an object`, `${at}.input`);
  return { id, type: "function", function: { name, arguments: JSON.stringify(input) } };
}

/** A tool_result block as a tool message: its content a string or text blocks (joined with newlines, as vLLM). */
function toolResult(b: Json, at: string): WireMessage {
  const id = optString(b, "tool_use_id", { nonEmpty: true });
  if (id === undefined) throw invalid(`'${at}.tool_use_id' is required`, `${at}.tool_use_id`);
  const c = b.content;
  let text: string;
  if (c === undefined || c === null) text = "";
  else if (typeof c === "string") text = c;
  else if (Array.isArray(c)) text = c.map((x: unknown, k) => textBlock(x, `${at}.content[${k}]`)).join("\n");
  else throw invalid(`'${at}.content' must be a string or a list of text blocks`, `${at}.content`);
  optBool(b, "is_error"); // checked; the prompt carries the result's text only (as vLLM)
  return { role: "tool", tool_call_id: id, content: text };
}

/** Custom tools ({name, description, input_schema}) as chat function tools; Anthropic's server tools are refused. */
function parseTools(raw: unknown): Json[] | undefined {
  if (raw === undefined || raw === null) return undefined;
  if (!Array.isArray(raw)) throw invalid("'tools' must be a list", "tools");
  if (raw.length === 0) return undefined;
  return raw.map((t: unknown, i) => {
    const at = `tools[${i}]`;
    const tool = contentBlock(t, at);
    if (tool.type !== undefined && tool.type !== null && tool.type !== "custom")
      throw invalid(`tool type ${JSON.stringify(tool.type)} is not supported: only custom tools (name, description, input_schema)`, `${at}.type`);
    const name = optString(tool, "name", { nonEmpty: true });
    if (name === undefined) throw invalid(`'${at}.name' is required`, `${at}.name`);
    const description = optString(tool, "description");
    const schema = tool.input_schema;
    if (typeof schema !== "object" || schema === null || Array.isArray(schema))
      throw invalid(`'${at}.input_schema' must be a JSON schema object`, `${at}.input_schema`);
    // a schema without a type is an object's, as vLLM reads it
    const parameters = "type" in schema ? schema : { type: "object", ...schema };
    return { type: "function", function: { name, ...(description !== undefined ? { description } : {}), parameters } };
  });
}

/**
 * output_config (as vLLM maps it): format {type: "json_schema", schema} is the chat API's json_schema
 * response_format; effort reaches the chat template as reasoning_effort (and gpt-oss's Harmony prompt).
 */
function applyOutputConfig(body: Json, chat: MessagesChatFields): void {
  const oc = optObject(body, "output_config");
  if (oc === undefined) return;
  const format = optObject(oc, "format");
  if (format !== undefined) {
    if (format.type !== undefined && format.type !== "json_schema")
      throw invalid(`'output_config.format.type' must be "json_schema"`, "output_config.format.type");
    const schema = format.schema;
    if (typeof schema !== "object" || schema === null || Array.isArray(schema))
      throw invalid("'output_config.format.schema' must be a JSON schema object", "output_config.format.schema");
    chat.response_format = { type: "json_schema", json_schema: { name: "json_schema", schema } };
  }
  const effort = optString(oc, "effort");
  if (effort !== undefined) chat.chat_template_kwargs = { ...chat.chat_template_kwargs, reasoning_effort: effort };
}
