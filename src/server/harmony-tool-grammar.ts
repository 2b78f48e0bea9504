// tool_choice "required" and named functions for gpt-oss, as vLLM constrains them (its Harmony structural tag,
// vllm/parser/harmony.py): a grammar over the whole reply, which may open with an analysis message and a commentary
// preamble (each `{header}<|message|>{text}<|end|><|start|>assistant`) and then must call one function:
//   ` to=functions.NAME<|channel|>CHANNEL{constrain}<|message|>` or `<|channel|>CHANNEL to=functions.NAME{constrain}<|message|>`
// on any of Harmony's channels, `{constrain}` " json" or " <|constrain|>json", then the arguments as JSON following
// the function's parameters schema (any JSON when the tool says strict: false), ended by a stop token (<|call|>);
// structured_outputs.disable_any_whitespace writes the JSON without free whitespace, as it does other tool calls.
// "required" offers every function tool, a named function only that one; one call either way (vLLM's tag too).
// The grammar is a structural tag over the reply vocabulary of engine/harmony-grammar.ts (Harmony's tokens spelled).
import { harmonySpelling as t } from "../engine/harmony-grammar.js";
import { jsonSchemaEbnf } from "../engine/structured-output.js";
import type { Json } from "./fields.js";
import type { ToolChoice } from "./protocol.js";

type Format = Record<string, unknown>;

const CHANNELS = ["commentary", "analysis", "final"];
const CONSTRAINS = [" json", ` ${t("constrain")}json`];
const NEXT = `${t("start")}assistant`;

/** A message on `channel` with any text, and the next message's start. */
const freeMessage = (channel: string): Format[] => [
  { type: "tag", begin: `${t("channel")}${channel}${t("message")}`, content: { type: "any_text" }, end: t("end") },
  { type: "const_string", value: NEXT },
];

/** vLLM's get_function_parameters: a strict: false tool takes any JSON, else its parameters (none: any JSON). */
function argumentsSchema(fn: Json): unknown {
  if (fn.strict === false) return {};
  return typeof fn.parameters === "object" && fn.parameters !== null ? fn.parameters : {};
}

/** Every header a call of `fn` may open with, each followed by its arguments. */
function callFormats(fn: Json, anyWhitespace: boolean): Format[] {
  const name = String(fn.name);
  const schema = argumentsSchema(fn);
  // (a structural tag's json_schema format takes any whitespace)
  const args = anyWhitespace ? { type: "json_schema", json_schema: schema } : { type: "grammar", grammar: jsonSchemaEbnf(schema, false) };
  const begins = CHANNELS.flatMap((ch) =>
    CONSTRAINS.flatMap((c) => [`${t("channel")}${ch} to=functions.${name}${c}${t("message")}`, ` to=functions.${name}${t("channel")}${ch}${c}${t("message")}`]),
  );
  return begins.map((begin) => ({ type: "sequence", elements: [{ type: "const_string", value: begin }, args] }));
}

/**
 * The structural tag (JSON text) of a Harmony reply that calls one of the request's function tools ("required")
 * or the named one, as the engine's StructuredOutputsParams.structuralTag with harmonyReply.
 */
export function harmonyToolCallTag(tools: readonly unknown[], choice: Extract<ToolChoice, { kind: "required" | "named" }>, anyWhitespace = true): string {
  const functions = tools
    .map((tool) => (tool as Json).function as Json)
    .filter((fn) => choice.kind === "required" || fn.name === choice.name);
  const call: Format = { type: "or", elements: functions.flatMap((fn) => callFormats(fn, anyWhitespace)) };
  // vLLM's optional analysis then optional preamble, written out (this xgrammar has no "optional" format)
  const analysis = freeMessage("analysis");
  const preamble = freeMessage("commentary");
  const format: Format = {
    type: "or",
    elements: [[...analysis, ...preamble, call], [...analysis, call], [...preamble, call], [call]].map((elements) =>
      elements.length === 1 ? elements[0] : { type: "sequence", elements },
    ),
  };
  return JSON.stringify({ type: "structural_tag", format });
}
