// The grammar of tool_choice "required" and named functions for gpt-oss (a whole Harmony reply that calls a
// function), compiled over the real o200k_harmony tokenizer's reply vocabulary and driven token by token: Harmony
// calls as the model writes them (analysis, preamble, either header order, json or <|constrain|>json) are taken;
// a final answer, another function, arguments off the schema and special tokens inside the JSON are refused.
import assert from "node:assert/strict";
import * as path from "node:path";
import { describe, it } from "node:test";
import { harmonyReplyVocab } from "../../src/engine/harmony-grammar.js";
import { StructuredOutputManager, structuredOutputSpec, type RequestGrammar } from "../../src/engine/structured-output.js";
import { Tokenizer } from "../../src/models/tokenizer.js";
import { harmonyToolCallTag } from "../../src/server/harmony-tool-grammar.js";

const tok = Tokenizer.fromDir(path.resolve("node_modules", "@lenml", "tokenizer-gptoss", "models"));
const id = (special: string) => tok.encode(special, { addSpecialTokens: false })[0]!;

/** Harmony text as token ids: each special token by its id, each text piece encoded on its own. */
const ids = (text: string): number[] =>
  text
    .split(/(<\|[a-z_]+\|>)/)
    .filter((p) => p !== "")
    .flatMap((p) => tok.encode(p, { addSpecialTokens: false }));

const WEATHER = {
  type: "function",
  function: {
    name: "get_weather",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"], additionalProperties: false },
  },
};
const TIME = { type: "function", function: { name: "get_time", parameters: { type: "object", properties: { tz: { enum: ["UTC", "CET"] } }, required: ["tz"] } } };

const reply = harmonyReplyVocab(tok, tok.grammarVocab(), tok.eosTokenIds)!;
const manager = new StructuredOutputManager(reply.vocab, tok.vocabSize, reply.stopTokenIds);
const grammar = (choice: { kind: "required" } | { kind: "named"; name: string }): RequestGrammar =>
  manager.matcher(structuredOutputSpec({ structuralTag: harmonyToolCallTag([WEATHER, TIME], choice), harmonyReply: true })!);

/** How many of `text`'s tokens the grammar takes in a row (all of them: the length). */
function taken(g: RequestGrammar, text: string | number[]): number {
  const list = typeof text === "string" ? ids(text) : text;
  let n = 0;
  while (n < list.length && g.accept(list[n]!)) n++;
  return n;
}

/** Which of `tokens` the grammar allows next. */
function allowed(g: RequestGrammar, tokens: number[]): boolean[] {
  const logits = new Float32Array(tok.vocabSize);
  g.applyMask(logits);
  return tokens.map((t) => logits[t] === 0);
}

const ANALYSIS = "<|channel|>analysis<|message|>Need the weather tool.<|end|><|start|>assistant";

describe("Harmony tool-call grammar (tool_choice required / named on gpt-oss)", () => {
  it("takes calls as gpt-oss writes them, after any analysis and preamble, then only a stop token", () => {
    for (const text of [
      `${ANALYSIS}<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Oslo"}`,
      `${ANALYSIS}<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{"tz": "UTC"}`,
      '<|channel|>analysis to=functions.get_weather json<|message|>{"city":"Oslo"}',
    ]) {
      const g = grammar({ kind: "required" });
      assert.equal(taken(g, text), ids(text).length, text);
      assert.deepEqual(allowed(g, [id("<|call|>"), id("<|return|>"), id("<|end|>"), id("<|start|>"), ids(" ")[0]!]), [true, true, false, false, false]);
      assert.ok(g.accept(id("<|call|>")));
      assert.ok(g.isTerminated);
      g.dispose();
    }
  });

  it("refuses a final answer, a stop before the call, arguments off the schema and other functions when one is named", () => {
    const cases: [ReturnType<typeof grammar>, string, string][] = [
      [grammar({ kind: "required" }), `${ANALYSIS}<|channel|>final<|message|>`, "<|message|>"],
      [grammar({ kind: "required" }), `${ANALYSIS}<|channel|>commentary to=functions.get_weather json<|message|>{"town"`, 'town"'],
      [grammar({ kind: "required" }), `<|channel|>commentary to=functions.get_time json<|message|>{"tz":"PST`, "PST"],
      [grammar({ kind: "required" }), `<|channel|>commentary to=functions.lookup`, ".lookup"],
      [grammar({ kind: "named", name: "get_time" }), `<|channel|>commentary to=functions.get_weather`, "_weather"],
    ];
    for (const [g, text, at] of cases) {
      const n = taken(g, text);
      assert.ok(n < ids(text).length, `${text} was taken whole`);
      const before = tok.decode(ids(text).slice(0, n), { skipSpecialTokens: false });
      assert.equal(text.slice(before.length), at, "refused where the reply leaves the grammar");
      g.dispose();
    }
    const g = grammar({ kind: "required" });
    assert.deepEqual(allowed(g, [id("<|channel|>"), id("<|return|>"), id("<|call|>"), id("<|end|>")]), [true, false, false, false], "the reply opens a message");
    g.dispose();
  });

  it("special tokens are headers only: never inside the arguments, and no byte 0x01 spells one in text", () => {
    const g = grammar({ kind: "named", name: "get_weather" });
    const head = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"';
    assert.equal(taken(g, head), ids(head).length);
    const specials = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>"].map(id);
    assert.deepEqual(allowed(g, [...specials, ...ids("\u0001"), ...ids("O")]), [...specials.map(() => false), false, true]);
    g.dispose();
  });
});
