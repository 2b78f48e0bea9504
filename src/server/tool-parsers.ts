// Tool-call parsers for tool_choice "auto" (vLLM's --tool-call-parser): they find the tool calls a model wrote in
// its reply text, in one of vLLM's formats:
//   - hermes (Hermes 2 Pro, Qwen 2.5 / Qwen 3 and other ChatML models): `<tool_call>{"name": ..., "arguments":
//     {...}}</tool_call>` blocks, after optional text;
//   - llama3_json (Llama 3.1 / 3.2 / 4 JSON calls): an optional `<|python_tag|>`, then `{"name": ..., "parameters":
//     {...}}` objects ("arguments" is taken too), usually separated by `;`;
//   - pythonic (Llama 3.2 / 4 and other models trained on Python calls): `[get_weather(city="Oslo"), get_time()]`;
//     llama4_pythonic is Llama 4's variant (an optional `<|python_start|>`, ASCII-escaped arguments);
//   - mistral, granite, phi4_mini_json (JSON lists behind a marker: json-list-tool-parsers.ts) and qwen3_coder
//     (`<function=NAME><parameter=P>value</parameter></function>`, typed by the tool's schema: qwen3-coder-calls.ts);
//   - functiongemma (FunctionGemma): `<start_function_call>call:NAME{key:<escape>value<escape>}<end_function_call>`.
// llama3_json and pythonic calls open the reply (after whitespace): vLLM's streamed reading only finds them there.
import { PyDict, pyJsonDecode, pyJsonDumps, pyJsonDumpsAscii, type PyValue } from "./python-json.js";
import { readPythonCalls } from "./pythonic-calls.js";
import { jsonListToolParsers } from "./json-list-tool-parsers.js";
import { qwen3Coder } from "./qwen3-coder-calls.js";
import { functionGemma } from "./functiongemma-calls.js";
import type { TokenizerLike } from "../models/tokenizer-types.js";

/**
 * vLLM's --tool-call-parser names that Kiln implements. "openai" is gpt-oss's: its calls are Harmony messages read
 * from the reply's tokens (serving-chat-harmony.ts), not from text, and it serves Harmony models only.
 */
export const TOOL_CALL_PARSERS = [
  "hermes", "llama3_json", "llama4_json", "pythonic", "llama4_pythonic", "mistral", "granite", "phi4_mini_json", "qwen3_coder", "functiongemma", "xlam", "openai",
] as const;
export type ToolCallParserName = (typeof TOOL_CALL_PARSERS)[number];

/**
 * Calls found in a reply: the text before them (null when none) and each call's name and arguments (JSON text),
 * with the call's id when the parser makes its own (mistral's 9 characters; else the server's chatcmpl-tool-...).
 */
export interface ExtractedToolCalls {
  content: string | null;
  calls: { name: string; arguments: string; id?: string }[];
}

export interface ToolCallParser {
  /**
   * How much of a streamed reply's text so far can go out as content: the rest is, or may turn out to be, calls
   * and is held back until the reply ends. `sent` characters went out already (the answer is never less).
   */
  streamable(text: string, sent: number): number;
  /**
   * The calls in a whole reply, or null when it holds none (or a call that does not parse): it is text then.
   * `tools` are the request's (qwen3_coder types parameter values by their schemas).
   */
  extract(text: string, tools?: readonly unknown[]): ExtractedToolCalls | null;
}

const START = "<tool_call>";
const END = "</tool_call>";

/** vLLM's Hermes2ProToolParser reading: each <tool_call> block (the last may be unclosed) is one JSON call. */
const hermes: ToolCallParser = {
  streamable(text: string, sent: number): number {
    const at = text.indexOf(START, Math.max(0, sent - START.length));
    return at >= 0 ? at : text.length - partialMarkerLength(text, START);
  },
  extract(text: string): ExtractedToolCalls | null {
    const first = text.indexOf(START);
    if (first < 0) return null;
    const calls: { name: string; arguments: string }[] = [];
    let at = first;
    while (at >= 0) {
      const bodyStart = at + START.length;
      const end = text.indexOf(END, bodyStart);
      const body = text.slice(bodyStart, end < 0 ? undefined : end).trim();
      // read as Python's json.loads reads it, written back as its json.dumps writes it (vLLM's arguments text)
      let call: PyValue;
      try {
        const read = pyJsonDecode(body, 0);
        if (read.end !== body.length) return null;
        call = read.value;
      } catch {
        return null;
      }
      if (!(call instanceof PyDict)) return null;
      const name = call.get("name");
      // (vLLM indexes call["arguments"]: a call without them leaves the reply text; null is written "null")
      if (typeof name !== "string" || !call.has("arguments")) return null;
      calls.push({ name, arguments: pyJsonDumps(call.get("arguments")!) });
      at = end < 0 ? -1 : text.indexOf(START, end + END.length);
    }
    const content = text.slice(0, first);
    return { content: content.length > 0 ? content : null, calls };
  },
};

const PYTHON_TAG = "<|python_tag|>";

/**
 * For calls that open the reply: all of it is held while it is blank or starts (after whitespace) with one of
 * `openers` or a prefix of one; otherwise it is text from the first character.
 */
function heldFromStart(text: string, openers: readonly string[]): number {
  const first = text.search(/\S/);
  if (first < 0) return 0;
  const rest = text.slice(first, first + Math.max(...openers.map((o) => o.length)));
  return openers.some((o) => rest.startsWith(o) || o.startsWith(rest)) ? 0 : text.length;
}

/**
 * vLLM's Llama3JsonToolParser reading of a reply that opens with `<|python_tag|>` or `{`: every `{` outside the
 * objects already read starts a JSON object with a "name" and "arguments" (or "parameters"), one call each; the
 * text between them (the `;` separators) is dropped. One that does not parse, or lacks those keys, makes the whole
 * reply text. Arguments are re-serialized as Python's json.dumps(ensure_ascii=False) writes them.
 */
const llama3Json: ToolCallParser = {
  streamable: (text) => heldFromStart(text, ["{", PYTHON_TAG]),
  extract(text: string): ExtractedToolCalls | null {
    let at = text.search(/\S/);
    if (at < 0) return null;
    if (text.startsWith(PYTHON_TAG, at)) at += PYTHON_TAG.length;
    else if (text[at] !== "{") return null;
    const calls: { name: string; arguments: string }[] = [];
    for (let open = text.indexOf("{", at); open >= 0; open = text.indexOf("{", at)) {
      let call: PyValue;
      try {
        ({ value: call, end: at } = pyJsonDecode(text, open));
      } catch {
        return null;
      }
      if (!(call instanceof PyDict)) return null;
      const name = call.get("name");
      const args = call.has("arguments") ? call.get("arguments") : call.get("parameters");
      if (typeof name !== "string" || args === undefined) return null;
      calls.push({ name, arguments: pyJsonDumps(args) });
    }
    return calls.length > 0 ? { content: null, calls } : null;
  },
};

/**
 * vLLM's PythonicToolParser reading: a reply that is one Python list of calls with literal keyword arguments (see
 * pythonic-calls.ts), each call's arguments as Python's json.dumps(ensure_ascii=False) writes the dict of them.
 */
const pythonic: ToolCallParser = {
  streamable: (text) => heldFromStart(text, ["["]),
  extract(text: string): ExtractedToolCalls | null {
    const calls = readPythonCalls(text);
    return calls === null ? null : { content: null, calls: calls.map((c) => ({ name: c.name, arguments: pyJsonDumps(c.args) })) };
  },
};

const PYTHON_START = "<|python_start|>";

/**
 * vLLM's Llama4PythonicToolParser reading: the pythonic list, opening the reply at its first character (after an
 * optional `<|python_start|>`, with every `<|python_end|>` dropped), its arguments as Python's json.dumps writes
 * them by default (non-ASCII as \uXXXX escapes).
 */
const llama4Pythonic: ToolCallParser = {
  streamable(text: string): number {
    return ["[", PYTHON_START].some((o) => text.startsWith(o) || o.startsWith(text)) ? 0 : text.length;
  },
  extract(text: string): ExtractedToolCalls | null {
    if (text.startsWith(PYTHON_START)) text = text.slice(PYTHON_START.length).replaceAll("<|python_end|>", "");
    const calls = text.startsWith("[") ? readPythonCalls(text) : null;
    return calls === null ? null : { content: null, calls: calls.map((c) => ({ name: c.name, arguments: pyJsonDumpsAscii(c.args) })) };
  },
};

/** Parsers registered by --tool-parser-plugin modules (vLLM's ToolParserManager.register_module), by name. */
const pluginParsers = new Map<string, ToolCallParser>();

/**
 * Registers a tool-call parser under `name` (a plugin's; vLLM's ToolParserManager.register_module): served with
 * --tool-call-parser name, in place of a built-in of that name. Throws TypeError for an object without
 * streamable() and extract().
 */
export function registerToolCallParser(name: string, parser: ToolCallParser): void {
  if (typeof name !== "string" || name.trim() === "") throw new TypeError(`a tool-call parser's name must be a non-empty string, got ${JSON.stringify(name)}`);
  const p = parser as Partial<ToolCallParser> | null;
  if (typeof p?.streamable !== "function" || typeof p.extract !== "function")
    throw new TypeError(`tool-call parser ${JSON.stringify(name)} must have streamable(text, sent) and extract(text, tools) methods`);
  pluginParsers.set(name, parser);
}

/** Every --tool-call-parser name served: the built-ins and the plugins' parsers. */
export function toolCallParserNames(): string[] {
  return [...new Set([...TOOL_CALL_PARSERS, ...pluginParsers.keys()])];
}

/** The text parser of `name` (a plugin's first); "openai" reads no text (Harmony replies are read by channel instead). */
export function toolCallParser(name: string): ToolCallParser {
  const plugin = pluginParsers.get(name);
  if (plugin !== undefined) return plugin;
  if (!(TOOL_CALL_PARSERS as readonly string[]).includes(name)) throw new Error(`unknown tool-call parser ${JSON.stringify(name)} (known: ${toolCallParserNames().join(", ")})`);
  const builtin = name as ToolCallParserName;
  switch (builtin) {
    case "openai":
      return { streamable: (text) => text.length, extract: () => null };
    case "hermes":
      return hermes;
    case "llama3_json":
    case "llama4_json": // vLLM registers Llama3JsonToolParser under both names
      return llama3Json;
    case "pythonic":
      return pythonic;
    case "llama4_pythonic":
      return llama4Pythonic;
    case "mistral":
    case "granite":
    case "phi4_mini_json":
    case "xlam":
      return jsonListToolParsers[builtin];
    case "qwen3_coder":
      return qwen3Coder;
    case "functiongemma":
      return functionGemma;
  }
}

/** Markers a parser needs as single tokens of the model's tokenizer (vLLM's parsers refuse to start without them). */
const PARSER_TOKENS: Partial<Record<ToolCallParserName, readonly string[]>> = {
  mistral: ["[TOOL_CALLS]"],
  qwen3_coder: ["<tool_call>", "</tool_call>"],
};

/** The markers of parser `name` that `tokenizer` does not hold as single tokens (none: the parser can serve it). */
export function missingParserTokens(name: string, tokenizer: TokenizerLike): string[] {
  if (pluginParsers.has(name)) return [];
  return (PARSER_TOKENS[name as ToolCallParserName] ?? []).filter((marker) => {
    const ids = tokenizer.encode(marker, { addSpecialTokens: false });
    return !(ids.length === 1 && tokenizer.idToToken(ids[0]!) === marker);
  });
}

/** How much of `text`'s end could be the start of `marker` (the length to hold back while streaming). */
export function partialMarkerLength(text: string, marker: string): number {
  for (let n = Math.min(marker.length - 1, text.length); n > 0; n--) if (text.endsWith(marker.slice(0, n))) return n;
  return 0;
}
