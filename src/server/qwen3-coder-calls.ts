// vLLM's qwen3_coder tool-call parser (Qwen3-Coder, and Qwen3 models prompted the same way): calls are XML-ish
//   <tool_call>
//   <function=get_weather>
//   <parameter=city>
//   Oslo
//   </parameter>
//   </function>
//   </tool_call>
// Parameter values are bare text, turned into JSON values by the type the request's tool schema gives each
// parameter (convertParameter). As vLLM's regexes read them: a <tool_call> may be left open at the end of the reply,
// a <function=...> without </function> runs to the end, and a <parameter=...> ends at </parameter>, the next
// <parameter=, </function> or the end. Without any <tool_call>, the <function=...> blocks of the whole reply count.
// The content is the text before the first <tool_call> (or, without one, the first <function=).
import { PyDict, pyJsonDumps, type PyValue } from "./python-json.js";
import { readPythonLiteral } from "./pythonic-calls.js";
import { pyJsonLoads } from "./json-list-tool-parsers.js";
import type { ExtractedToolCalls, ToolCallParser } from "./tool-parsers.js";

const TOOL_CALL = "<tool_call>";
const FUNCTION = "<function=";

// Python's `$` (no MULTILINE) matches at the end and before a final newline: (?=\n?$) here
const TOOL_CALL_RE = /<tool_call>(.*?)<\/tool_call>|<tool_call>(.*?)(?=\n?$)/gs;
const FUNCTION_RE = /<function=(.*?)<\/function>|<function=(.*)$/gs;
const PARAMETER_RE = /<parameter=(.*?)(?:<\/parameter>|(?=<parameter=)|(?=<\/function>)|(?=\n?$))/gs;

class NotACall extends Error {}

/** The parameters' schemas of the request's tool `name` (its parameters' properties), as vLLM looks them up. */
function parameterSchemas(name: string, tools: readonly unknown[] | undefined): Record<string, unknown> {
  for (const tool of tools ?? []) {
    const t = tool as { type?: unknown; function?: { name?: unknown; parameters?: unknown } } | null;
    if (t?.type !== "function" || t.function?.name !== name) continue;
    const p = t.function.parameters;
    if (!isObject(p)) return {};
    return "properties" in p ? (isObject(p.properties) ? p.properties : {}) : p;
  }
  return {};
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

const INT = /^\s*[+-]?\d(?:_?\d)*\s*$/;
const DIGITS = "\\d(?:_?\\d)*";
const FLOAT = new RegExp(`^\\s*[+-]?(?:(?:${DIGITS})?\\.${DIGITS}(?:[eE][+-]?${DIGITS})?|${DIGITS}\\.?(?:[eE][+-]?${DIGITS})?|inf(?:inity)?|nan)\\s*$`, "i");

/** Python's float(text), or undefined when it raises. */
function pyFloat(text: string): number | undefined {
  if (!FLOAT.test(text)) return undefined;
  const t = text.trim().replace(/_/g, "").toLowerCase();
  const sign = t.startsWith("-") ? -1 : 1;
  const body = t.replace(/^[+-]/, "");
  if (body.startsWith("inf")) return sign * Infinity;
  if (body === "nan") return NaN;
  return sign * Number(body);
}

/**
 * A parameter's text as the JSON value vLLM's _convert_param_value makes of it: "null" (any case) is null; a
 * parameter the schema does not list, or whose type is a string type, stays text; integer types go through
 * Python's int(), number types through float() (a whole value becomes an int), booleans are "true" (any case) or
 * else false; objects and arrays are json.loads'd, and they and any other type fall back to ast.literal_eval, then
 * to the text. A value that does not convert stays text.
 */
export function convertParameter(value: string, name: string, schemas: Record<string, unknown>): PyValue {
  if (value.toLowerCase() === "null") return null;
  if (!Object.hasOwn(schemas, name)) return value;
  const schema = schemas[name];
  // a non-string "type" (a list such as ["integer", "null"]) prints as a Python list and matches no name below
  const type = isObject(schema) && "type" in schema ? (typeof schema.type === "string" ? schema.type.trim().toLowerCase() : "[other]") : "string";
  if (["string", "str", "text", "varchar", "char", "enum"].includes(type)) return value;
  if (["int", "uint", "long", "short", "unsigned"].some((p) => type.startsWith(p)))
    return INT.test(value) ? BigInt(value.trim().replace(/_/g, "")) : value;
  if (type.startsWith("num") || type.startsWith("float")) {
    const x = pyFloat(value);
    if (x === undefined || Number.isNaN(x)) return value; // int(nan) raises ValueError: vLLM keeps the text
    if (!Number.isFinite(x)) throw new NotACall(); // int(inf) raises OverflowError, which vLLM does not catch
    return Number.isInteger(x) ? BigInt(x) : x;
  }
  if (["boolean", "bool", "binary"].includes(type)) return value.toLowerCase() === "true";
  if (["object", "array", "arr"].includes(type) || type.startsWith("dict") || type.startsWith("list")) {
    const json = pyJsonLoads(value);
    if (json !== undefined) return json;
  }
  return readPythonLiteral(value) ?? value;
}

/** One `<function=...` block's body (after `<function=`): its name up to `>` and its parameters. */
function readFunction(body: string, tools: readonly unknown[] | undefined): { name: string; arguments: string } {
  const end = body.indexOf(">");
  if (end < 0) throw new NotACall();
  const name = body.slice(0, end);
  const schemas = parameterSchemas(name, tools);
  const args = new PyDict();
  for (const m of body.slice(end + 1).matchAll(PARAMETER_RE)) {
    const text = m[1]!;
    const at = text.indexOf(">");
    if (at < 0) throw new NotACall();
    let value = text.slice(at + 1);
    if (value.startsWith("\n")) value = value.slice(1);
    if (value.endsWith("\n")) value = value.slice(0, -1);
    const key = text.slice(0, at);
    args.set(key, convertParameter(value, key, schemas));
  }
  return { name, arguments: pyJsonDumps(args) };
}

export const qwen3Coder: ToolCallParser = {
  streamable(text: string, sent: number): number {
    let upTo = text.length;
    for (const marker of [TOOL_CALL, FUNCTION]) {
      const at = text.indexOf(marker, Math.max(0, sent - marker.length));
      upTo = Math.min(upTo, at >= 0 ? at : text.length - partialSuffix(text, marker));
    }
    return upTo;
  },
  extract(text: string, tools?: readonly unknown[]): ExtractedToolCalls | null {
    if (!text.includes(FUNCTION)) return null;
    const blocks = [...text.matchAll(TOOL_CALL_RE)].map((m) => m[1] || m[2] || "");
    const functions = (blocks.length > 0 ? blocks : [text]).flatMap((b) => [...b.matchAll(FUNCTION_RE)].map((m) => m[1] || m[2] || ""));
    if (functions.length === 0) return null;
    let calls: ExtractedToolCalls["calls"];
    try {
      calls = functions.map((f) => readFunction(f, tools));
    } catch (e) {
      if (e instanceof NotACall) return null;
      throw e;
    }
    const start = text.indexOf(TOOL_CALL);
    const content = text.slice(0, start >= 0 ? start : text.indexOf(FUNCTION));
    return { content: content || null, calls };
  },
};

function partialSuffix(text: string, marker: string): number {
  for (let n = Math.min(marker.length - 1, text.length); n > 0; n--) if (text.endsWith(marker.slice(0, n))) return n;
  return 0;
}
