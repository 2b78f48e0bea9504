// The Responses API's request (POST /v1/responses, OpenAI's wire shape as vLLM takes it), validated and turned into
// the chat request that serves it: input items become chat messages (instructions a system message before them),
// max_output_tokens is max_tokens, text.format is response_format, function tools are chat tools and input_image parts
// are image_url parts. What Kiln does not serve (built-in tools, files, ...) is a 400 naming the field, never ignored.
import { ApiError, badRequest } from "./errors.js";
import { type Json, optBool, optInt, optObject, optString } from "./fields.js";
import { asJsonBody, parseChatRequest, type ChatRequest } from "./protocol.js";

import type { WireMessage, WirePart } from "../models/chat-images.js";

export type { WireMessage, WirePart };

export interface ResponsesRequest {
  model: string | undefined;
  stream: boolean;
  /** Answer at once with a queued response that runs on (needs store; read it back with GET, stop it with cancel). */
  background: boolean;
  /** Keep the response and its conversation for previous_response_id and GET /v1/responses/{id} (default true, as OpenAI). */
  store: boolean;
  previousResponseId: string | null;
  instructions: string | null;
  /** The input items as chat messages, in order. */
  input: WireMessage[];
  /** Where each image of `input` sits (`input[i].content[j].image_url`), in order: the chat request's image params. */
  imageParams: string[];
  /** The request's fields that the response object repeats (tools, tool_choice, text, reasoning, metadata, ...). */
  echo: Json;
  /** The chat completions fields that serve the request, all but messages. */
  chatFields: Json;
}

/** Fields that pass to the chat request as they are: OpenAI's sampling fields, and vLLM's extensions (as on chat). */
const CHAT_PASSTHROUGH = (
  "temperature top_p top_k min_p seed stop stop_token_ids ignore_eos min_tokens repetition_penalty presence_penalty frequency_penalty " +
  "logit_bias bad_words vllm_xargs skip_special_tokens include_stop_str_in_output structured_outputs priority cache_salt user " +
  "parallel_tool_calls chat_template"
).split(" ");

/** OpenAI Responses fields Kiln does not serve: a value other than absent, null, false, 0 or [] is a 400 naming the field. */
const UNSUPPORTED: Record<string, string> = {
  conversation: "conversation objects are not supported: continue a conversation with previous_response_id",
  prompt: "prompt templates are not supported",
  max_tool_calls: "max_tool_calls is not supported (Kiln runs no built-in tools)",
};

/** Chat completions fields sent to /v1/responses, and what the Responses API takes instead (null: nothing). */
const CHAT_ONLY: Record<string, string | null> = {
  messages: "input",
  max_tokens: "max_output_tokens",
  max_completion_tokens: "max_output_tokens",
  response_format: "text.format",
  n: null,
  logprobs: null,
  echo: null,
  use_beam_search: null,
  prompt_logprobs: null,
};

/** Chat request params renamed back to the Responses fields they came from, in errors. */
const RESPONSES_PARAM: Record<string, string> = { messages: "input", max_tokens: "max_output_tokens", response_format: "text.format" };

export function parseResponsesRequest(raw: unknown): ResponsesRequest {
  const body = asJsonBody(raw);
  refuseUnservedFields(body);
  const stream = optBool(body, "stream") ?? false;
  if (optObject(body, "stream_options") !== undefined && !stream)
    throw badRequest("Stream options can only be defined when `stream=True`.", "stream_options");
  const store = optBool(body, "store") ?? true;
  const background = optBool(body, "background") ?? false;
  if (background && !store) throw badRequest("background can only be used when `store` is true", "background");
  if (background && stream) throw badRequest("streaming a background response is not supported: poll GET /v1/responses/{id}", "stream");
  const tools = parseTools(body.tools);
  const toolChoice = parseToolChoice(body.tool_choice, tools.chat !== undefined);
  const text = parseText(body.text);
  const reasoning = parseReasoning(body.reasoning);
  const maxOutputTokens = optInt(body, "max_output_tokens", { min: 1 });
  const instructions = optString(body, "instructions") ?? null;
  const serviceTier = optString(body, "service_tier") ?? "auto";
  if (serviceTier !== "auto" && serviceTier !== "default")
    throw badRequest(`service_tier ${JSON.stringify(serviceTier)} is not supported (only "auto" and "default")`, "service_tier");

  const chatFields: Json = { stream };
  // include: ["message.output_text.logprobs"] puts each output token's logprob (and top_logprobs alternatives) on the
  // message's output_text, as OpenAI and vLLM do
  if (parseInclude(body.include)) Object.assign(chatFields, { logprobs: true, top_logprobs: optInt(body, "top_logprobs", { min: 0 }) ?? 0 });
  else if ((optInt(body, "top_logprobs", { min: 0 }) ?? 0) > 0)
    throw badRequest("top_logprobs needs include: [\"message.output_text.logprobs\"]", "top_logprobs");
  for (const name of CHAT_PASSTHROUGH) if (body[name] !== undefined) chatFields[name] = body[name];
  if (maxOutputTokens !== undefined) chatFields.max_tokens = maxOutputTokens;
  if (text.responseFormat !== undefined) chatFields.response_format = text.responseFormat;
  if (tools.chat !== undefined) chatFields.tools = tools.chat;
  if (toolChoice.chat !== undefined) chatFields.tool_choice = toolChoice.chat;
  // reasoning.effort reaches the chat template as `reasoning_effort` (as vLLM passes it), over chat_template_kwargs
  const kwargs = optObject(body, "chat_template_kwargs");
  if (kwargs !== undefined || reasoning.effort !== undefined)
    chatFields.chat_template_kwargs = { ...kwargs, ...(reasoning.effort !== undefined ? { reasoning_effort: reasoning.effort } : {}) };

  const echo: Json = {
    instructions,
    metadata: parseMetadata(body.metadata),
    reasoning: reasoning.echo,
    service_tier: serviceTier,
    text: text.echo,
    tool_choice: toolChoice.echo,
    tools: tools.echo,
    user: optString(body, "user") ?? null,
  };
  for (const name of ["prompt_cache_key", "safety_identifier"]) {
    const v = optString(body, name); // identifiers, as `user`: echoed, they change nothing here (prefix caching is automatic)
    if (v !== undefined) echo[name] = v;
  }
  return {
    model: optString(body, "model"),
    stream,
    background,
    store,
    previousResponseId: optString(body, "previous_response_id", { nonEmpty: true }) ?? null,
    instructions,
    ...parseInput(body.input),
    echo,
    chatFields,
  };
}

/** The chat request that serves `req` over `messages`; its errors name the Responses fields. */
export function toChatRequest(req: ResponsesRequest, messages: WireMessage[], vocabSize: number, autoTools: boolean, trustChatTemplate: boolean): ChatRequest {
  try {
    const chat = parseChatRequest({ ...req.chatFields, messages }, vocabSize, { autoTools, trustChatTemplate });
    // the images' errors name their input parts; an earlier turn's images (first) came with previous_response_id
    const earlier = chat.images.length - req.imageParams.length;
    chat.images = chat.images.map((img, k) => ({ ...img, param: k < earlier ? "previous_response_id" : req.imageParams[k - earlier]! }));
    return chat;
  } catch (err) {
    const param = err instanceof ApiError ? err.param : null;
    const base = param?.match(/^[a-z_]+/)?.[0];
    if (param === null || base === undefined || !(base in RESPONSES_PARAM)) throw err;
    const e = err as ApiError;
    throw new ApiError(e.status, e.message, RESPONSES_PARAM[base]! + param.slice(base.length), e.type, e.code);
  }
}

/** Whether `include` asks for the output's logprobs, its one item Kiln serves; another item is a 400 naming it. */
function parseInclude(raw: unknown): boolean {
  if (raw === undefined || raw === null) return false;
  if (!Array.isArray(raw)) throw badRequest("'include' must be a list of strings", "include");
  raw.forEach((v, i) => {
    if (v !== "message.output_text.logprobs")
      throw badRequest(`include item ${JSON.stringify(v)} is not supported (only "message.output_text.logprobs": Kiln returns no encrypted reasoning or built-in tool results)`, `include[${i}]`);
  });
  return raw.length > 0;
}

function refuseUnservedFields(body: Json): void {
  for (const [name, why] of Object.entries(UNSUPPORTED)) {
    const v = body[name];
    const unset = v === undefined || v === null || v === false || v === 0 || (Array.isArray(v) && v.length === 0);
    if (!unset) throw badRequest(why, name);
  }
  for (const [name, instead] of Object.entries(CHAT_ONLY)) {
    if (body[name] === undefined) continue;
    throw badRequest(`'${name}' is a chat completions field, not a Responses API one${instead === null ? "" : `: use '${instead}'`}`, name);
  }
  const truncation = optString(body, "truncation");
  if (truncation !== undefined && truncation !== "disabled")
    throw badRequest(
      `truncation ${JSON.stringify(truncation)} is not supported: an input longer than the model's context is a 400`,
      "truncation",
    );
}

function parseInput(input: unknown): { input: WireMessage[]; imageParams: string[] } {
  if (input === undefined || input === null) return { input: [], imageParams: [] };
  if (typeof input === "string") return { input: [{ role: "user", content: input }], imageParams: [] };
  if (!Array.isArray(input)) throw badRequest("'input' must be a string or a list of input items", "input");
  const imageParams: string[] = [];
  return { input: itemsToMessages(input, "input", imageParams), imageParams };
}

/**
 * Input items (or a stored response's output items) as chat messages: a message item is one message (the developer
 * role read as system), function_call items join the assistant message before them as its tool_calls, and a
 * function_call_output is a tool message. Reasoning items are left out of the prompt, as vLLM leaves them. Each
 * input_image part's param is pushed to `imageParams`.
 */
export function itemsToMessages(items: readonly unknown[], param: string, imageParams: string[] = []): WireMessage[] {
  const out: WireMessage[] = [];
  items.forEach((raw, i) => {
    const at = `${param}[${i}]`;
    if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw badRequest(`'${at}' must be an object`, at);
    const item = raw as Json;
    const type = item.type ?? "message";
    if (type === "message") out.push(messageOf(item, at, imageParams));
    else if (type === "function_call") {
      const call = {
        id: requiredString(item, "call_id", at),
        type: "function" as const,
        function: { name: requiredString(item, "name", at), arguments: stringField(item, "arguments", at) },
      };
      const last = out[out.length - 1];
      if (last?.role === "assistant") (last.tool_calls ??= []).push(call);
      else out.push({ role: "assistant", content: null, tool_calls: [call] });
    } else if (type === "function_call_output") {
      out.push({ role: "tool", tool_call_id: requiredString(item, "call_id", at), content: partsText(item.output, `${at}.output`) });
    } else if (type !== "reasoning") {
      throw badRequest(
        `input item type ${JSON.stringify(type)} is not supported (only message, function_call, function_call_output and reasoning items)`,
        `${at}.type`,
      );
    }
  });
  return out;
}

const ROLES = new Set(["user", "assistant", "system", "developer"]);

function messageOf(item: Json, at: string, imageParams: string[]): WireMessage {
  const role = item.role;
  if (typeof role !== "string" || !ROLES.has(role))
    throw badRequest(`'${at}.role' must be one of user, assistant, system or developer`, `${at}.role`);
  return { role: role === "developer" ? "system" : role, content: partsContent(item.content, `${at}.content`, imageParams) };
}

/**
 * A message's content: a string, or input_text / output_text / input_image parts; the chat API's text and image_url
 * parts when it holds an image (vLLM's conversion; `detail` is accepted), else the texts joined with newlines.
 */
function partsContent(content: unknown, at: string, imageParams: string[]): string | WirePart[] {
  if (!Array.isArray(content) || !content.some((p) => (p as Json | null)?.type === "input_image")) return partsText(content, at);
  return content.map((part: unknown, j): WirePart => {
    const pat = `${at}[${j}]`;
    const p = contentPart(part, pat);
    if (p.type !== "input_image") return { type: "text", text: partText(p, pat) };
    if (p.file_id != null) throw badRequest("input_image file_id is not supported (Kiln has no Files API): send image_url", `${pat}.file_id`);
    if (typeof p.image_url !== "string" || p.image_url === "") throw badRequest(`'${pat}.image_url' must be a data: or http(s) URL`, `${pat}.image_url`);
    if (p.detail != null && typeof p.detail !== "string") throw badRequest(`'${pat}.detail' must be a string`, `${pat}.detail`);
    imageParams.push(`${pat}.image_url`); // (detail low / high / auto: Gemma 3 reads every image at its one size)
    return { type: "image_url", image_url: { url: p.image_url } };
  });
}

/** A string, or a list of input_text / output_text parts (joined with newlines, as chat content parts are). */
function partsText(content: unknown, at: string): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) throw badRequest(`'${at}' must be a string or a list of content parts`, at);
  return content.map((part: unknown, j) => partText(contentPart(part, `${at}[${j}]`), `${at}[${j}]`)).join("\n");
}

function contentPart(part: unknown, at: string): Json {
  if (typeof part !== "object" || part === null) throw badRequest(`'${at}' must be an object`, at);
  return part as Json;
}

function partText(p: Json, at: string): string {
  if (p.type !== "input_text" && p.type !== "output_text")
    throw badRequest(`content part type ${JSON.stringify(p.type)} is not supported (only input_text, output_text and input_image: no files or audio)`, `${at}.type`);
  return stringField(p, "text", at);
}

function stringField(o: Json, name: string, at: string): string {
  if (typeof o[name] !== "string") throw badRequest(`'${at}.${name}' must be a string`, `${at}.${name}`);
  return o[name] as string;
}

function requiredString(o: Json, name: string, at: string): string {
  const v = stringField(o, name, at);
  if (v.length === 0) throw badRequest(`'${at}.${name}' must not be empty`, `${at}.${name}`);
  return v;
}

/** Function tools ({type: "function", name, description, parameters, strict}; the chat shape is taken too, as vLLM takes it). */
function parseTools(raw: unknown): { chat: Json[] | undefined; echo: Json[] } {
  if (raw === undefined || raw === null) return { chat: undefined, echo: [] };
  if (!Array.isArray(raw)) throw badRequest("'tools' must be a list", "tools");
  const echo = raw.map((t: unknown, i) => {
    const at = `tools[${i}]`;
    const tool = t as Json | null;
    if (typeof tool !== "object" || tool === null) throw badRequest(`'${at}' must be an object`, at);
    if (tool.type !== "function")
      throw badRequest(
        `tool type ${JSON.stringify(tool.type)} is not supported: only function tools (no built-in tools such as web_search or file_search)`,
        `${at}.type`,
      );
    const fn = tool.name === undefined && typeof tool.function === "object" && tool.function !== null ? (tool.function as Json) : tool;
    const name = requiredString(fn, "name", at);
    const parameters = fn.parameters ?? null;
    if (parameters !== null && (typeof parameters !== "object" || Array.isArray(parameters)))
      throw badRequest(`'${at}.parameters' must be a JSON schema object`, `${at}.parameters`);
    if (fn.description != null && typeof fn.description !== "string")
      throw badRequest(`'${at}.description' must be a string`, `${at}.description`);
    if (fn.strict != null && typeof fn.strict !== "boolean") throw badRequest(`'${at}.strict' must be a boolean`, `${at}.strict`);
    return { type: "function", name, description: fn.description ?? null, parameters, strict: fn.strict ?? null };
  });
  const chat = echo.map((f) => ({
    type: "function",
    function: {
      name: f.name,
      ...(f.description !== null ? { description: f.description } : {}),
      ...(f.parameters !== null ? { parameters: f.parameters } : {}),
    },
  }));
  return { chat: chat.length > 0 ? chat : undefined, echo };
}

/** "none", "auto", "required" or {type: "function", name}; "auto" and "none" without tools are no tool choice at all. */
function parseToolChoice(raw: unknown, hasTools: boolean): { chat: unknown; echo: unknown } {
  if (raw === undefined || raw === null) return { chat: undefined, echo: "auto" };
  if (raw === "none" || raw === "auto" || raw === "required") return { chat: raw === "required" || hasTools ? raw : undefined, echo: raw };
  const o = raw as Json;
  if (typeof raw === "object" && !Array.isArray(raw) && o.type === "function" && typeof o.name === "string")
    return { chat: { type: "function", function: { name: o.name } }, echo: { type: "function", name: o.name } };
  throw badRequest(
    `'tool_choice' must be "none", "auto", "required" or {"type": "function", "name": ...} (no built-in, MCP, custom or allowed_tools choices)`,
    "tool_choice",
  );
}

/** text.format as the chat API's response_format; text.verbosity is a hint Kiln cannot follow beyond its default. */
function parseText(raw: unknown): { echo: Json; responseFormat: Json | undefined } {
  if (raw === undefined || raw === null) return { echo: { format: { type: "text" } }, responseFormat: undefined };
  if (typeof raw !== "object" || Array.isArray(raw)) throw badRequest("'text' must be an object", "text");
  const text = raw as Json;
  const verbosity = optString(text, "verbosity");
  if (verbosity !== undefined && verbosity !== "medium")
    throw badRequest(`text.verbosity ${JSON.stringify(verbosity)} is not supported`, "text.verbosity");
  const format = (text.format ?? { type: "text" }) as Json;
  if (typeof format !== "object" || Array.isArray(format)) throw badRequest("'text.format' must be an object", "text.format");
  const echo = { format, ...(verbosity !== undefined ? { verbosity } : {}) };
  switch (format.type) {
    case "text":
      return { echo, responseFormat: undefined };
    case "json_object":
      return { echo, responseFormat: { type: "json_object" } };
    case "json_schema": {
      const name = requiredString(format, "name", "text.format");
      const schema = format.schema;
      if (typeof schema !== "object" || schema === null || Array.isArray(schema))
        throw badRequest("'text.format.schema' must be a JSON schema object", "text.format.schema");
      if (format.strict != null && typeof format.strict !== "boolean") throw badRequest("'text.format.strict' must be a boolean", "text.format.strict");
      return {
        echo,
        responseFormat: { type: "json_schema", json_schema: { name, schema, ...(format.strict != null ? { strict: format.strict } : {}) } },
      };
    }
    default:
      throw badRequest("'text.format.type' must be one of 'text', 'json_object' or 'json_schema'", "text.format.type");
  }
}

const EFFORTS = ["minimal", "low", "medium", "high"];

/** reasoning: effort goes to the chat template; summaries are not written (a 400 when asked). */
function parseReasoning(raw: unknown): { echo: Json | null; effort: string | undefined } {
  if (raw === undefined || raw === null) return { echo: null, effort: undefined };
  if (typeof raw !== "object" || Array.isArray(raw)) throw badRequest("'reasoning' must be an object", "reasoning");
  const r = raw as Json;
  for (const name of ["summary", "generate_summary"])
    if (r[name] != null)
      throw badRequest("reasoning summaries are not supported (the reasoning itself comes back as a reasoning item)", `reasoning.${name}`);
  const effort = optString(r, "effort");
  if (effort !== undefined && !EFFORTS.includes(effort))
    throw badRequest(`'reasoning.effort' must be one of ${EFFORTS.join(", ")}`, "reasoning.effort");
  return { echo: { effort: effort ?? null, summary: null }, effort };
}

/** OpenAI's metadata: up to 16 string values, keys up to 64 characters, values up to 512. */
function parseMetadata(raw: unknown): Record<string, string> | null {
  if (raw === undefined || raw === null) return null;
  if (typeof raw !== "object" || Array.isArray(raw)) throw badRequest("'metadata' must be an object of strings", "metadata");
  const entries = Object.entries(raw as Json);
  if (entries.length > 16) throw badRequest("'metadata' may hold at most 16 keys", "metadata");
  for (const [k, v] of entries) {
    if (k.length > 64) throw badRequest(`'metadata' key ${JSON.stringify(k.slice(0, 16))}... is longer than 64 characters`, "metadata");
    if (typeof v !== "string" || v.length > 512) throw badRequest(`'metadata.${k}' must be a string of at most 512 characters`, "metadata");
  }
  return raw as Record<string, string>;
}
