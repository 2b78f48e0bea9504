// The text a request is routed by: what the worker will turn into its prompt, serialized so that a request whose
// prompt extends another's (a conversation's next turn, a shared system prompt or few-shot block) gets a text that
// extends the other's text. The router has no tokenizer or chat template: the text approximates the prompt, which is
// all the approximate prefix tree needs. An image stands in it as a short hash of its bytes' source (a data: URL's or
// Anthropic's base64 data, else its URL), so the same image and prompt go to the worker that has them cached and
// another image diverges there.
import { createHash } from "node:crypto";

type Json = unknown;

const isRecord = (v: Json): v is Record<string, Json> => typeof v === "object" && v !== null && !Array.isArray(v);

/**
 * Where an image part's bytes come from: chat's image_url (a URL, or {url}), Responses' input_image (image_url or
 * file_id), Anthropic's image block (its source's data, url or file_id); undefined for any other part.
 */
function imageSource(part: Record<string, Json>): Json {
  if (part.type === "image_url") return isRecord(part.image_url) ? part.image_url.url : part.image_url;
  if (part.type === "input_image") return part.image_url ?? part.file_id;
  if (part.type === "image" && isRecord(part.source)) return part.source.data ?? part.source.url ?? part.source.file_id;
  return undefined;
}

/** An image's place in the text: "[image:<16 hex of sha256>]" of its source (a data: URL by its base64 data alone). */
function imageText(source: Json): string {
  const s = typeof source === "string" ? source : JSON.stringify(source ?? null);
  const data = s.startsWith("data:") ? s.slice(s.indexOf(",") + 1) : s;
  return `[image:${createHash("sha256").update(data).digest("hex").slice(0, 16)}]`;
}

/** A message's content: a string, or the text of its parts (images by their hash, other parts by their type). */
function contentText(content: Json): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return content == null ? "" : JSON.stringify(content);
  return content
    .map((part) => {
      if (typeof part === "string") return part;
      if (!isRecord(part)) return "";
      if (typeof part.text === "string") return part.text;
      const image = imageSource(part);
      if (image !== undefined) return imageText(image);
      return `[${typeof part.type === "string" ? part.type : "part"}]`;
    })
    .join("");
}

/** Chat messages as "<role>\n<content>\n" per message, tool calls as their JSON; a prefix of turns gives a prefix of text. */
export function messagesText(messages: Json): string {
  if (!Array.isArray(messages)) return "";
  let out = "";
  for (const m of messages) {
    if (!isRecord(m)) continue;
    out += `${typeof m.role === "string" ? m.role : "user"}\n${contentText(m.content)}`;
    if (m.tool_calls !== undefined) out += JSON.stringify(m.tool_calls);
    out += "\n";
  }
  return out;
}

/** An Anthropic content block's text: text, thinking, a tool call as its JSON, a tool result's content, an image's hash; others by type. */
function anthropicBlockText(block: Json): string {
  if (typeof block === "string") return block;
  if (!isRecord(block)) return "";
  if (typeof block.text === "string") return block.text;
  if (block.type === "thinking" && typeof block.thinking === "string") return block.thinking;
  if (block.type === "tool_use") return JSON.stringify({ name: block.name, input: block.input });
  if (block.type === "tool_result") return typeof block.content === "string" ? block.content : anthropicContentText(block.content);
  const image = imageSource(block);
  if (image !== undefined) return imageText(image);
  return `[${typeof block.type === "string" ? block.type : "block"}]`;
}

function anthropicContentText(content: Json): string {
  if (typeof content === "string") return content;
  return Array.isArray(content) ? content.map(anthropicBlockText).join("") : "";
}

/**
 * Anthropic's Messages request: its system prompt (a string or text blocks) as a system turn, then the messages and
 * their content blocks, in messagesText's form: a conversation's next turn extends its text, as a chat's does.
 */
export function anthropicMessagesText(body: Record<string, Json>): string {
  const system = body.system === undefined ? "" : `system\n${anthropicContentText(body.system)}\n`;
  const messages = Array.isArray(body.messages) ? body.messages : [];
  return system + messagesText(messages.filter(isRecord).map((m) => ({ role: m.role, content: anthropicContentText(m.content) })));
}

/** A prompt or input: a string, token ids ("1,2,3"), or a batch of those (joined by newlines). */
export function promptText(prompt: Json): string {
  if (typeof prompt === "string") return prompt;
  if (!Array.isArray(prompt)) return "";
  if (prompt.every((x) => typeof x === "number")) return prompt.join(",");
  return prompt.map(promptText).join("\n");
}

/** Responses API input: a string, or items (messages and their content parts) in order, after the instructions. */
function responsesText(body: Record<string, Json>): string {
  const instructions = typeof body.instructions === "string" ? `system\n${body.instructions}\n` : "";
  const input = body.input;
  if (typeof input === "string") return `${instructions}user\n${input}\n`;
  return instructions + messagesText(Array.isArray(input) ? input.filter(isRecord).map((it) => ({ role: it.role ?? it.type, content: it.content ?? it.output ?? "" })) : []);
}

/**
 * The routing text of a parsed request body for an API path ("" when it has none: the policy balances load only).
 * @example routingText("/v1/completions", { prompt: "Once upon" }) // "Once upon"
 */
export function routingText(path: string, body: Json): string {
  try {
    return bodyText(path, body);
  } catch (e) {
    if (e instanceof RangeError) return ""; // nested past the stack (a malformed body): routed by load, the worker judges it
    throw e;
  }
}

function bodyText(path: string, body: Json): string {
  if (!isRecord(body)) return "";
  if (path === "/v1/messages") return anthropicMessagesText(body);
  // counting computes no K/V: balanced by load, and no worker recorded as holding the prompt
  if (path === "/v1/messages/count_tokens") return "";
  if (Array.isArray(body.messages)) return messagesText(body.messages); // chat, and /tokenize with messages
  if (path.endsWith("/responses")) return responsesText(body);
  for (const key of ["prompt", "input", "text", "query"]) {
    if (body[key] !== undefined) return promptText(body[key]);
  }
  return "";
}
