// gpt-oss prompts in OpenAI's Harmony format, as vLLM renders them (its harmony utils over openai-harmony's
// renderer; gpt-oss has no chat template). A prompt is a run of messages `<|start|>{header}<|message|>{text}<|end|>`
// and ends with `<|start|>assistant`, where the reply begins:
//   - a system message: model identity, knowledge cutoff, today's date, `Reasoning: {effort}` (the request's
//     reasoning_effort, medium by default) and the valid channels (analysis, commentary, final), with a line sending
//     function calls to commentary when the request has tools;
//   - a developer message, when the request has instructions (its leading system or developer message) or tools:
//     `# Instructions` and `# Tools` with the functions as a TypeScript namespace (`type name = (_: {...}) => any;`);
//   - the conversation: user messages as they are; an assistant message's reasoning as an `analysis` message and its
//     content as `final` (with tool calls: content as `commentary`, then each call `to=functions.NAME` on commentary,
//     content type json, ended by <|call|>); a tool result as `functions.NAME to=assistant` on commentary (its name
//     found from tool_call_id); a later system or developer message as developer instructions. Reasoning before the
//     last final answer is dropped (vLLM's auto_drop_analysis_messages).
// The prompt is text with the special tokens spelled out; the server encodes it with the model's tokenizer, which
// reads them as the special tokens they are (as it reads every chat template's output).
import { badRequest } from "./errors.js";
import type { Json } from "./fields.js";

/** Harmony's reasoning efforts (the system message's `Reasoning:` line). */
export const HARMONY_EFFORTS = ["low", "medium", "high"] as const;
export type HarmonyEffort = (typeof HARMONY_EFFORTS)[number];

/** openai-harmony's SystemContent defaults. */
const MODEL_IDENTITY = "You are ChatGPT, a large language model trained by OpenAI.";
const KNOWLEDGE_CUTOFF = "2024-06";

/** One Harmony message (text content only). */
export interface HarmonyMessage {
  /** system, developer, user, assistant, or a tool's name (functions.NAME) for a tool's message. */
  author: string;
  recipient: string | null;
  channel: string | null;
  contentType: string | null;
  text: string;
}

export interface HarmonyPromptOptions {
  /** The system message's reasoning effort (null: openai-harmony's default, medium). */
  reasoningEffort: HarmonyEffort | null;
  /** The system message's current date, YYYY-MM-DD (vLLM: the server's today). */
  date: string;
  /** The request's tools (OpenAI's {type: "function", function: {name, description, parameters}}), or undefined. */
  tools: unknown[] | undefined;
}

/** Today as vLLM writes it in the system message (datetime.now().strftime("%Y-%m-%d"), local time). */
export function harmonyDate(now = new Date()): string {
  const pad = (n: number) => String(n).padStart(2, "0");
  return `${now.getFullYear()}-${pad(now.getMonth() + 1)}-${pad(now.getDate())}`;
}

/** A request's reasoning_effort, checked: Harmony knows low, medium and high (vLLM refuses others, "none" included). */
export function harmonyEffort(value: unknown, param: string): HarmonyEffort | null {
  if (value === undefined || value === null) return null;
  if (typeof value === "string" && (HARMONY_EFFORTS as readonly string[]).includes(value)) return value as HarmonyEffort;
  throw badRequest(`reasoning_effort=${JSON.stringify(value)} is not supported by Harmony (gpt-oss). Supported values are: ${HARMONY_EFFORTS.join(", ")}.`, param);
}

/**
 * The Harmony prompt of chat messages in the chat API's wire shape (content a string, null or text parts;
 * assistant `reasoning` or `reasoning_content` and `tool_calls` with JSON-text arguments; tool `tool_call_id`).
 */
export function renderHarmonyPrompt(messages: readonly unknown[], options: HarmonyPromptOptions): string {
  const wire = messages.map((m, i) => wireMessage(m, `messages[${i}]`));
  // a leading system or developer message holds the instructions (vLLM's extract_instructions_from_messages)
  const first = wire[0];
  const lead = first !== undefined && (first.role === "system" || first.role === "developer");
  const instructions = lead ? first.text : null;
  const rest = lead ? wire.slice(1) : wire;
  const functions = (options.tools ?? []).map(toolDefinition);
  const out: HarmonyMessage[] = [systemMessage(options, functions.length > 0)];
  if ((instructions !== null && instructions !== "") || options.tools !== undefined) out.push(developerMessage(instructions, functions));
  // tool results name their function through the call they answer
  const callNames = new Map<string, string>();
  for (const m of rest) for (const c of m.toolCalls) callNames.set(c.id, c.name);
  out.push(...dropAnsweredReasoning(rest.flatMap((m) => conversationMessages(m, callNames))));
  return out.map(renderMessage).join("") + "<|start|>assistant";
}

/** A message's header and text as Harmony writes it; a call to a tool ends with <|call|>. */
export function renderMessage(m: HarmonyMessage): string {
  let header = m.author;
  if (m.recipient !== null && m.recipient !== "all") header += ` to=${m.recipient}`;
  if (m.channel !== null) header += `<|channel|>${m.channel}`;
  // a content type that starts with <|constrain|> keeps it as the special token, after a space
  if (m.contentType !== null) header += ` ${m.contentType}`;
  const end = m.author === "assistant" && m.recipient !== null ? "<|call|>" : "<|end|>";
  return `<|start|>${header}<|message|>${m.text}${end}`;
}

interface WireCall {
  id: string;
  name: string;
  arguments: string;
}

interface Wire {
  role: string;
  /** The content's text (text parts joined), null when absent. */
  text: string | null;
  reasoning: string | null;
  toolCalls: WireCall[];
  toolCallId: string | null;
}

const ROLES = new Set(["system", "developer", "user", "assistant", "tool"]);

function wireMessage(raw: unknown, at: string): Wire {
  if (typeof raw !== "object" || raw === null) throw badRequest(`'${at}' must be an object`, at);
  const m = raw as Json;
  if (typeof m.role !== "string" || !ROLES.has(m.role))
    throw badRequest(`'${at}.role' must be one of ${[...ROLES].join(", ")} (Harmony's roles, for gpt-oss)`, `${at}.role`);
  const reasoning = m.reasoning ?? m.reasoning_content;
  if (reasoning !== undefined && reasoning !== null && typeof reasoning !== "string")
    throw badRequest(`'${at}.reasoning' must be a string`, `${at}.reasoning`);
  const calls = Array.isArray(m.tool_calls) ? m.tool_calls : [];
  return {
    role: m.role,
    text: flattenText(m.content, `${at}.content`),
    reasoning: (reasoning as string | null | undefined) ?? null,
    toolCalls: calls.map((c: unknown, j: number) => wireCall(c, `${at}.tool_calls[${j}]`)),
    toolCallId: typeof m.tool_call_id === "string" ? m.tool_call_id : null,
  };
}

function wireCall(raw: unknown, at: string): WireCall {
  const c = (raw ?? {}) as Json;
  const fn = (c.function ?? {}) as Json;
  if (typeof fn.name !== "string") throw badRequest(`'${at}.function.name' must be a string`, `${at}.function.name`);
  const args = fn.arguments ?? "";
  // a client that sends the arguments as an object gets them as JSON text
  return { id: typeof c.id === "string" ? c.id : "", name: fn.name, arguments: typeof args === "string" ? args : JSON.stringify(args) };
}

/** Content as text: a string, or its text parts joined with nothing between them (vLLM's flatten); null when absent. */
function flattenText(content: unknown, at: string): string | null {
  if (content === undefined || content === null) return null;
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) throw badRequest(`'${at}' must be a string or a list of content parts`, at);
  return content
    .map((p: unknown, j: number) => {
      const part = p as Json | null;
      if (typeof part !== "object" || part === null || (part.type !== "text" && part.type !== undefined) || typeof part.text !== "string")
        throw badRequest(`'${at}[${j}]' must be a text part ({"type": "text", "text": ...}): gpt-oss reads text only`, at);
      return part.text;
    })
    .join("");
}

const msg = (author: string, text: string, channel: string | null = null, recipient: string | null = null, contentType: string | null = null): HarmonyMessage => ({
  author,
  recipient,
  channel,
  contentType,
  text,
});

/** One chat message as Harmony messages (vLLM's parse_chat_input_to_harmony_message). */
function conversationMessages(m: Wire, callNames: Map<string, string>): HarmonyMessage[] {
  if (m.role === "tool") {
    const name = callNames.get(m.toolCallId ?? "") ?? "";
    return [msg(`functions.${name}`, m.text ?? "", "commentary", "assistant")];
  }
  if (m.role === "system" || m.role === "developer") return m.text === null ? [] : [developerMessage(m.text, [])];
  if (m.role === "user") return [msg("user", m.text ?? "")];
  const out: HarmonyMessage[] = [];
  if (m.toolCalls.length > 0) {
    // (vLLM's order: the calls' preamble, then the reasoning, then the calls)
    if (m.text) out.push(msg("assistant", m.text, "commentary"));
    if (m.reasoning) out.push(msg("assistant", m.reasoning, "analysis"));
    for (const c of m.toolCalls) out.push(msg("assistant", c.arguments, "commentary", `functions.${c.name}`, "json"));
    return out;
  }
  if (m.reasoning) out.push(msg("assistant", m.reasoning, "analysis"));
  if (m.text) out.push(msg("assistant", m.text, "final"));
  return out;
}

/** Drops the analysis messages before the last assistant `final` one: reasoning the model already answered from. */
function dropAnsweredReasoning(msgs: HarmonyMessage[]): HarmonyMessage[] {
  let last = -1;
  for (let i = msgs.length - 1; i >= 0 && last < 0; i--) if (msgs[i]!.author === "assistant" && msgs[i]!.channel === "final") last = i;
  return msgs.filter((m, i) => !(i < last && m.channel === "analysis"));
}

function systemMessage(options: HarmonyPromptOptions, hasFunctions: boolean): HarmonyMessage {
  const sections = [
    `${MODEL_IDENTITY}\nKnowledge cutoff: ${KNOWLEDGE_CUTOFF}\nCurrent date: ${options.date}`,
    `Reasoning: ${options.reasoningEffort ?? "medium"}`,
  ];
  let channels = "# Valid channels: analysis, commentary, final. Channel must be included for every message.";
  if (hasFunctions) channels += "\nCalls to these tools must go to the commentary channel: 'functions'.";
  sections.push(channels);
  return msg("system", sections.join("\n\n"));
}

interface ToolDefinition {
  name: string;
  description: string;
  parameters: unknown;
}

function toolDefinition(raw: unknown): ToolDefinition {
  const fn = ((raw as Json | null)?.function ?? {}) as Json;
  return { name: String(fn.name), description: typeof fn.description === "string" ? fn.description : "", parameters: fn.parameters ?? null };
}

function developerMessage(instructions: string | null, functions: ToolDefinition[]): HarmonyMessage {
  const sections: string[] = [];
  if (instructions !== null) sections.push("# Instructions", instructions);
  if (functions.length > 0) sections.push(`# Tools\n\n${functionsNamespace(functions)}`);
  return msg("developer", sections.join("\n\n"));
}

/** Rust's str::lines(): split at \n (a trailing \r dropped), no empty last line for a trailing newline. */
function lines(text: string): string[] {
  if (text === "") return [];
  const out = text.split("\n").map((l) => (l.endsWith("\r") ? l.slice(0, -1) : l));
  if (text.endsWith("\n")) out.pop();
  return out;
}

/** The functions as openai-harmony's tools section writes them. */
function functionsNamespace(functions: ToolDefinition[]): string {
  const parts = ["## functions\n", "namespace functions {\n"];
  for (const f of functions) {
    for (const l of lines(f.description)) parts.push(`// ${l}`);
    parts.push(f.parameters === null ? `type ${f.name} = () => any;\n` : `type ${f.name} = (_: ${schemaType(f.parameters, "")}) => any;\n`);
  }
  parts.push("} // namespace functions");
  return parts.join("\n");
}

// ---- JSON schema as TypeScript, as openai-harmony writes a tool's parameters ----

type Schema = Record<string, unknown>;
const asSchema = (v: unknown): Schema => (typeof v === "object" && v !== null && !Array.isArray(v) ? (v as Schema) : {});
const isEnum = (s: Schema): boolean => Array.isArray(s.enum) && s.enum.length > 0;
/** serde_json's compact text of a value (a default). */
const jsonText = (v: unknown): string => JSON.stringify(v);

/**
 * A default as a comment's text: a string quoted, or bare when the schema is an enum (a top-level oneOf's variant
 * writes an enum's default as JSON text instead, as openai-harmony does).
 */
function defaultText(s: Schema, enumAsJson = false): string | null {
  if (!("default" in s)) return null;
  const d = s.default;
  if (typeof d === "string" && !isEnum(s)) return `default: "${d}"`;
  if (typeof d === "string" && !enumAsJson) return `default: ${d}`;
  return `default: ${jsonText(d)}`;
}

const nullable = (s: Schema, type: string): string => (s.nullable === true && !type.includes("null") ? `${type} | null` : type);

function schemaType(raw: unknown, indent: string): string {
  const s = asSchema(raw);
  if (Array.isArray(s.oneOf)) {
    let out = "";
    for (const v of s.oneOf) {
      const variant = asSchema(v);
      out += `\n${indent} | ${nullable(variant, schemaType(variant, `${indent}   `))}`;
      const comments = [typeof variant.description === "string" ? variant.description : null, defaultText(variant, true)].filter((c) => c !== null);
      if (comments.length > 0) out += ` // ${comments.join(" ")}`;
    }
    return out;
  }
  if (Array.isArray(s.type)) {
    const names = s.type.filter((t): t is string => typeof t === "string").map((t) => (t === "integer" ? "number" : t));
    if (names.length > 0) return names.join(" | ");
  }
  switch (s.type) {
    case "object":
      return objectType(s, indent);
    case "string": {
      const values = Array.isArray(s.enum) ? s.enum.filter((v): v is string => typeof v === "string").map((v) => `"${v}"`) : [];
      return values.length > 0 ? values.join(" | ") : "string";
    }
    case "number":
    case "integer":
      return "number";
    case "boolean":
      return "boolean";
    case "array":
      return "items" in s ? `${schemaType(s.items, indent)}[]` : "Array<any>";
    default:
      return "any";
  }
}

function objectType(s: Schema, indent: string): string {
  let out = typeof s.description === "string" ? `${indent}// ${s.description}\n` : "";
  out += "{\n";
  const required = new Set(Array.isArray(s.required) ? s.required.filter((r): r is string => typeof r === "string") : []);
  for (const [key, raw] of Object.entries(asSchema(s.properties))) {
    const p = asSchema(raw);
    const opt = required.has(key) ? "" : "?";
    if (typeof p.title === "string") out += `${indent}// ${p.title}\n${indent}//\n`;
    if (!Array.isArray(p.oneOf) && typeof p.description === "string") out += `${indent}// ${p.description}\n`;
    if (Array.isArray(p.examples) && p.examples.length > 0) {
      out += `${indent}// Examples:\n`;
      for (const ex of p.examples) if (typeof ex === "string") out += `${indent}// - "${ex}"\n`;
    }
    if (Array.isArray(p.oneOf)) {
      out += oneOfProperty(p, p.oneOf, key, opt, indent);
      continue;
    }
    out += `${indent}${key}${opt}: ${nullable(p, schemaType(p, `${indent}    `))},`;
    const d = defaultText(p);
    if (d !== null) out += ` // ${d}`;
    out += "\n";
  }
  return `${out}${indent}}`;
}

/** A property whose schema is a oneOf: its comments above it, then one `| variant` line each. */
function oneOfProperty(p: Schema, variants: unknown[], key: string, opt: string, indent: string): string {
  const desc = typeof p.description === "string" ? p.description : null;
  const firstDesc = asSchema(variants[0]).description;
  const descAbove = desc !== null && desc !== firstDesc;
  let out = descAbove ? `${indent}// ${desc}\n` : "";
  const d = defaultText(p);
  if (d !== null) out += `${indent}// ${d}\n`;
  out += `${indent}${key}${opt}:\n`;
  variants.forEach((v, i) => {
    const variant = asSchema(v);
    out += `${indent} | ${nullable(variant, schemaType(variant, `${indent}   `))}`;
    const comments: string[] = [];
    const vd = typeof variant.description === "string" ? variant.description : null;
    if (!(i === 0 && descAbove) && vd !== null && vd !== desc) comments.push(vd);
    const vdef = defaultText(variant);
    if (vdef !== null) comments.push(vdef);
    if (comments.length > 0) out += ` // ${comments.join(" ")}`;
    out += "\n";
  });
  return `${out}${indent},\n`;
}
