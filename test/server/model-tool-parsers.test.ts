// The mistral, granite, phi4_mini_json, qwen3_coder, functiongemma, llama4_pythonic, llama4_json and xlam tool-call parsers against
// hand-written replies, as vLLM's parsers of those names read them (the expected calls, content and converted
// parameter values are written out by hand). Streaming each reply cut anywhere is checked with the other parsers in
// tool-parsers.test.ts.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { describe, it } from "node:test";
import { missingParserTokens, toolCallParser, type ExtractedToolCalls } from "../../src/server/tool-parsers.js";
import { Tokenizer } from "../../src/models/tokenizer.js";
import { loadCorpus } from "../../src/train/corpus.js";
import { saveTokenizer, trainBpeTokenizer } from "../../src/train/bpe-trainer.js";
import { testTokenizerDir } from "../helpers/tiny-model.js";
import { convertParameter } from "../../src/server/qwen3-coder-calls.js";

const withoutIds = (r: ExtractedToolCalls | null) => r && { content: r.content, calls: r.calls.map(({ name, arguments: a }) => ({ name, arguments: a })) };

describe("mistral tool-call parser", () => {
  const mistral = toolCallParser("mistral");

  it("reads the JSON list after [TOOL_CALLS], with the text before it as content and 9-character ids", () => {
    const r = mistral.extract('Let me look.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Zürich", "days":2}}, {"name": "now", "arguments": {}}]');
    assert.deepEqual(withoutIds(r), {
      content: "Let me look.",
      calls: [
        { name: "get_weather", arguments: '{"city": "Zürich", "days": 2}' }, // json.dumps(ensure_ascii=False) spacing
        { name: "now", arguments: "{}" },
      ],
    });
    for (const c of r!.calls) assert.match(c.id!, /^[A-Za-z0-9]{9}$/);
    assert.notEqual(r!.calls[0]!.id, r!.calls[1]!.id);
  });

  it("falls back to the first [{...}] when the list has text around it, as vLLM's regex does", () => {
    assert.deepEqual(withoutIds(mistral.extract('[TOOL_CALLS] calls: [{"name": "f", "arguments": {"a": [1]}}] done')), {
      content: null,
      calls: [{ name: "f", arguments: '{"a": [1]}' }],
    });
  });

  it("reads the v11 form: one call per [TOOL_CALLS], name then [ARGS] (or the first {), arguments as written", () => {
    const r = mistral.extract('Sure [TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]now[CALL_ID]a1b2c3d4e[ARGS]{}[TOOL_CALLS]add{"a":1,"b":2}');
    assert.deepEqual(withoutIds(r), {
      content: "Sure ",
      calls: [
        { name: "get_weather", arguments: '{"city": "Oslo"}' },
        { name: "now", arguments: "{}" },
        { name: "add", arguments: '{"a":1,"b":2}' }, // unchanged: v11 arguments are returned as the model wrote them
      ],
    });
    // vLLM returns wrongly formatted v11 arguments as calls too, so that the model sees the call it tried
    assert.deepEqual(withoutIds(mistral.extract("[TOOL_CALLS]f[ARGS]{oops")), { content: null, calls: [{ name: "f", arguments: "{oops" }] });
  });

  it("leaves replies without calls, or with a list that does not read as calls, as text", () => {
    assert.equal(mistral.extract("no calls"), null);
    assert.equal(mistral.extract('[TOOL_CALLS][{"name": "f", "arguments": {'), null); // cut by max_tokens
    assert.equal(mistral.extract('[TOOL_CALLS][{"name": "f"}]'), null); // no arguments
    assert.equal(mistral.extract('[TOOL_CALLS][{"name": "f", "arguments": {}}][TOOL_CALLS][]'), null); // the list form has one marker
    assert.equal(mistral.extract("[TOOL_CALLS]"), null);
    assert.equal(mistral.extract("[TOOL_CALLS]just words"), null);
  });

  it("streams the text before [TOOL_CALLS] and holds a possible start of it", () => {
    assert.equal(mistral.streamable("Hello [TOOL", 0), 6);
    assert.equal(mistral.streamable("Hello [TOOL_CALLS][{", 3), 6);
    assert.equal(mistral.streamable("Hello [x", 0), 8);
  });
});

describe("granite tool-call parser", () => {
  const granite = toolCallParser("granite");

  it("reads the reply as <|tool_call|> and/or <tool_call>, then a JSON list; no content", () => {
    const want = { content: null, calls: [{ name: "f", arguments: '{"x": 1.0, "y": "ü"}' }, { name: "g", arguments: '"raw"' }] };
    const list = '[{"name": "f", "arguments": {"x": 1.0, "y": "ü"}}, {"name": "g", "arguments": "raw"}]';
    assert.deepEqual(granite.extract(`<|tool_call|>${list}`), want);
    assert.deepEqual(granite.extract(`\n<tool_call> ${list}\n`), want);
    assert.deepEqual(granite.extract(`<|tool_call|><tool_call>${list}`), want);
    assert.deepEqual(granite.extract(list), want); // the markers are optional
  });

  it("leaves everything else as text", () => {
    assert.equal(granite.extract('Sure. <|tool_call|>[{"name": "f", "arguments": {}}]'), null); // calls must open the reply
    assert.equal(granite.extract('<|tool_call|> <tool_call>[{"name": "f", "arguments": {}}]'), null); // vLLM strips no space between them
    assert.equal(granite.extract('<|tool_call|>[{"name": "f", "parameters": {}}]'), null); // granite's key is "arguments"
    assert.equal(granite.extract('<|tool_call|>{"name": "f", "arguments": {}}'), null); // not a list
    assert.equal(granite.extract('<|tool_call|>[{"name": "f", "arguments": {}}] and more'), null);
  });

  it("holds a reply while it may still open with calls", () => {
    for (const held of ["", "  ", "<|tool", "<|tool_call|>", "<|tool_call|><tool", "<tool_call>\n", "[", ' <tool_call>[{"na'])
      assert.equal(granite.streamable(held, 0), 0, JSON.stringify(held));
    for (const text of ["Hi", "<|tool_call|>hi", "<tool_call>x", "<|tool_call|> <tool_call>["]) assert.equal(granite.streamable(text, 0), text.length, text);
  });
});

describe("phi4_mini_json tool-call parser", () => {
  const phi = toolCallParser("phi4_mini_json");

  it("reads functools[...] anywhere, with arguments or parameters; the reply has no content", () => {
    assert.deepEqual(phi.extract('Sure. functools[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "parameters": {"b": null}}]'), {
      content: null,
      calls: [
        { name: "f", arguments: '{"a": 1}' },
        { name: "g", arguments: '{"b": null}' },
      ],
    });
  });

  it("stops at the first ] as vLLM's lazy regex does, so a list inside the arguments makes it text", () => {
    assert.equal(phi.extract('functools[{"name": "f", "arguments": {"a": [1, 2]}}]'), null);
    assert.equal(phi.extract("no calls"), null);
    assert.equal(phi.extract('functools[{"arguments": {}}]'), null);
  });

  it("holds the whole streamed reply (vLLM streams none of it)", () => {
    assert.equal(phi.streamable("Hello there", 0), 0);
  });
});

describe("qwen3_coder tool-call parser", () => {
  const coder = toolCallParser("qwen3_coder");
  const tools = [
    {
      type: "function",
      function: {
        name: "get_weather",
        parameters: {
          type: "object",
          properties: {
            city: { type: "string" }, days: { type: "integer" }, scale: { type: "number" }, metric: { type: "boolean" },
            opts: { type: "object" }, tags: { type: "array" }, extra: { type: ["string", "null"] },
          },
        },
      },
    },
  ];

  it("reads <tool_call><function=...> blocks, each <parameter=...> typed by the tool's schema", () => {
    const text =
      "I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n 3 \n</parameter>\n" +
      '<parameter=scale>\n2.50\n</parameter>\n<parameter=metric>\nTRUE\n</parameter>\n<parameter=opts>\n{"unit": "C"}\n</parameter>\n' +
      "<parameter=tags>\n['a', 'b']\n</parameter>\n<parameter=extra>\n{'k': (1)}\n</parameter>\n<parameter=note>\n42\n</parameter>\n</function>\n</tool_call>" +
      "\n<tool_call>\n<function=now>\n</function>\n</tool_call>";
    assert.deepEqual(coder.extract(text, tools), {
      content: "I'll check.\n",
      calls: [
        {
          name: "get_weather",
          // days through int() (spaces allowed), scale through float(), metric any case, opts json.loads, tags by
          // ast.literal_eval after json.loads fails, extra (a list type) by literal_eval, note (not in the schema) text
          arguments: '{"city": "New York", "days": 3, "scale": 2.5, "metric": true, "opts": {"unit": "C"}, "tags": ["a", "b"], "extra": {"k": 1}, "note": "42"}',
        },
        { name: "now", arguments: "{}" },
      ],
    });
  });

  it("takes an unclosed block, parameters ended by the next one or the end, and <function= without <tool_call>", () => {
    assert.deepEqual(coder.extract("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n2\n", tools), {
      content: null,
      calls: [{ name: "get_weather", arguments: '{"city": "Oslo", "days": 2}' }],
    });
    assert.deepEqual(coder.extract("Text <function=f><parameter=a>x</parameter></function>"), {
      content: "Text ",
      calls: [{ name: "f", arguments: '{"a": "x"}' }], // without tools every value is text
    });
  });

  it("leaves replies without a function, or with a name or parameter missing its >, as text", () => {
    assert.equal(coder.extract("<tool_call>\n{\"name\": \"f\"}\n</tool_call>"), null);
    assert.equal(coder.extract("<tool_call><function=f"), null);
    assert.equal(coder.extract("<tool_call><function=f><parameter=a</function></tool_call>"), null);
    assert.equal(coder.extract("<tool_call>x</tool_call> then <function=f></function>"), null); // the blocks hold no function
  });

  it("converts values as vLLM's _convert_param_value does", () => {
    const s = { i: { type: "integer" }, n: { type: "number" }, b: { type: "bool" }, o: { type: "object" }, a: { type: "any" }, u: { description: "no type" } };
    const cases: [string, string, unknown][] = [
      ["i", "1_000", 1000n], ["i", "-7", -7n], ["i", "1.5", "1.5"], ["i", "NULL", null],
      ["n", "2.0", 2n], ["n", "1e3", 1000n], ["n", "-0.25", -0.25], ["n", "nan", "nan"], ["n", "abc", "abc"],
      ["b", "yes", false], ["b", "False", false], ["b", "true", true],
      ["o", "[1, 2]", [1n, 2n]], ["o", "not json", "not json"],
      ["a", "True", true], ["a", "true", "true"], ["a", "-3", -3n], ["a", "'q'", "q"], ["a", "x + 1", "x + 1"],
      ["u", "5", "5"], // no type: a string
    ];
    for (const [name, value, want] of cases) assert.deepEqual(convertParameter(value, name, s), want, `${name}=${value}`);
    // float("inf") cannot become an int: vLLM's extraction fails and the reply stays text
    assert.equal(coder.extract("<function=f><parameter=n>inf</parameter></function>", [{ type: "function", function: { name: "f", parameters: { properties: s } } }]), null);
  });

  it("streams the text before <tool_call> or <function= and holds a possible start of either", () => {
    assert.equal(coder.streamable("Hi <tool", 0), 3);
    assert.equal(coder.streamable("Hi <func", 0), 3);
    assert.equal(coder.streamable("Hi <function=f>", 0), 3);
    assert.equal(coder.streamable("Hi <b>", 0), 6);
  });
});

describe("llama4_pythonic and llama4_json tool-call parsers", () => {
  const l4 = toolCallParser("llama4_pythonic");

  it("reads a pythonic list at the reply's first character, after an optional <|python_start|>, ASCII-escaped", () => {
    assert.deepEqual(l4.extract('<|python_start|>[get_weather(city="Zürich"), now()]<|python_end|>'), {
      content: null,
      calls: [
        { name: "get_weather", arguments: '{"city": "Z\\u00fcrich"}' }, // json.dumps' default ensure_ascii
        { name: "now", arguments: "{}" },
      ],
    });
    assert.equal(l4.extract(' [now()]'), null); // Python's ast reads leading space as an indentation error
    assert.equal(l4.extract("[now] is a list"), null);
    assert.equal(toolCallParser("pythonic").extract(' [now()]')!.calls[0]!.name, "now"); // (pythonic takes it)
  });

  it("llama4_json is llama3_json", () => {
    assert.equal(toolCallParser("llama4_json"), toolCallParser("llama3_json"));
  });
});

describe("functiongemma tool-call parser", () => {
  const fg = toolCallParser("functiongemma");

  it("reads each call's name and <escape>d arguments (JSON where they parse), with the stripped text before as content", () => {
    const text =
      "  Let me check. \n<start_function_call>call:get_weather{city:<escape>New York<escape>,days:<escape>2<escape>,metric:<escape>true<escape>," +
      "note:<escape>null<escape>}<end_function_call><start_function_call>call:now{}<end_function_call>";
    assert.deepEqual(fg.extract(text), {
      content: "Let me check.",
      calls: [
        { name: "get_weather", arguments: '{"city": "New York", "days": 2, "metric": true, "note": null}' },
        { name: "now", arguments: "{}" },
      ],
    });
    // a call cut at the end runs to it; no text before: null content
    assert.deepEqual(fg.extract("<start_function_call>call:f{a:<escape>x<escape>"), { content: null, calls: [{ name: "f", arguments: '{"a": "x"}' }] });
  });

  it("leaves replies without a well-formed call as text", () => {
    assert.equal(fg.extract("no calls"), null);
    assert.equal(fg.extract("<start_function_call>get_weather{}<end_function_call>"), null); // no call: prefix
  });

  it("streams the content as far as it is sure: no leading or trailing whitespace, nothing from the marker on", () => {
    assert.equal(fg.streamable("Hi there <start_fun", 0), 8);
    assert.equal(fg.streamable(" Hi", 0), 0);
    assert.equal(fg.streamable("Hi  ", 2), 2);
  });
});

describe("tool-call parsers' tokens", () => {
  it("mistral needs [TOOL_CALLS] and qwen3_coder <tool_call> and </tool_call> as single tokens, as vLLM checks at start", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-tool-tokens-"));
    try {
      const specials = ["<|endoftext|>", "[TOOL_CALLS]", "<tool_call>"];
      saveTokenizer(dir, trainBpeTokenizer(loadCorpus({ source: "brown", maxDocs: 20 }), { vocabSize: 300, specialTokens: specials }));
      const tok = Tokenizer.fromDir(dir);
      assert.deepEqual(missingParserTokens("mistral", tok), []);
      assert.deepEqual(missingParserTokens("qwen3_coder", tok), ["</tool_call>"]);
      assert.deepEqual(missingParserTokens("granite", tok), []); // granite's markers are read from text
      assert.deepEqual(missingParserTokens("mistral", Tokenizer.fromDir(testTokenizerDir())), ["[TOOL_CALLS]"]);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("xlam tool-call parser", () => {
  const xlam = toolCallParser("xlam");

  it("reads a reply that is one JSON list of calls: object arguments as json.dumps writes them (ASCII escapes), string ones as they are", () => {
    const r = xlam.extract('[{"name": "get_weather", "arguments": {"city": "Zürich","days":2}}, {"name": "now", "arguments": "{}"}]');
    assert.deepEqual(withoutIds(r), {
      content: null,
      calls: [{ name: "get_weather", arguments: '{"city": "Z\\u00fcrich", "days": 2}' }, { name: "now", arguments: "{}" }],
    });
    assert.match(r!.calls[0]!.id!, /^call_0_[0-9a-f]{32}$/);
    assert.match(r!.calls[1]!.id!, /^call_1_[0-9a-f]{32}$/);
    // items without a name and arguments are skipped, as vLLM skips them
    assert.deepEqual(withoutIds(xlam.extract('[{"name": "f"}, {"name": "g", "arguments": {}}]')), { content: null, calls: [{ name: "g", arguments: "{}" }] });
  });

  it("reads the calls after </think>, with the reply up to it as content", () => {
    assert.deepEqual(withoutIds(xlam.extract('<think>I should look.</think>\n[{"name": "f", "arguments": {"q": "x"}}]')), {
      content: "<think>I should look.</think>",
      calls: [{ name: "f", arguments: '{"q": "x"}' }],
    });
    // a block after </think> counts too; what follows it is dropped with it
    assert.deepEqual(withoutIds(xlam.extract('<think>.</think> ok ```json\n[{"name": "f", "arguments": {}}]\n``` end')), {
      content: "<think>.</think>",
      calls: [{ name: "f", arguments: "{}" }],
    });
  });

  it("reads a ```json block, [TOOL_CALLS] to the line's end, or <tool_call> tags; the text around them is content", () => {
    assert.deepEqual(withoutIds(xlam.extract('Let me check.\n```json\n[{"name": "f", "arguments": {"a": 1}}]\n```\nOne moment.')), {
      content: "Let me check.\n\nOne moment.",
      calls: [{ name: "f", arguments: '{"a": 1}' }],
    });
    assert.deepEqual(withoutIds(xlam.extract('Sure [TOOL_CALLS][{"name": "f", "arguments": {}}]\nthen more')), {
      content: "Sure \nthen more",
      calls: [{ name: "f", arguments: "{}" }],
    });
    assert.deepEqual(withoutIds(xlam.extract('<tool_call>[{"name": "f", "arguments": {}}]</tool_call>  ')), { content: null, calls: [{ name: "f", arguments: "{}" }] });
    // the first block that reads as JSON: a ```js block that does not is skipped for the later one
    assert.deepEqual(withoutIds(xlam.extract('```js\nf(1)\n``` and ```[{"name": "f", "arguments": {}}]```')), {
      content: " and", // (vLLM's re.sub drops every ``` block, then strips)
      calls: [{ name: "f", arguments: "{}" }],
    });
  });

  it("leaves as text: replies without a list of calls, a list cut short, arguments of another type", () => {
    assert.equal(xlam.extract("no calls"), null);
    assert.equal(xlam.extract("[1, 2] is a list"), null);
    assert.equal(xlam.extract('[{"name": "f", "arguments": {'), null); // cut by max_tokens
    assert.equal(xlam.extract('{"name": "f", "arguments": {}}'), null); // one object, not a list
    assert.equal(xlam.extract('[{"name": "f", "arguments": [1]}]'), null);
    assert.equal(xlam.extract('```json\n{"a": 1}\n```'), null);
  });

  it("streams text up to a marker and holds a reply that opens like calls", () => {
    assert.equal(xlam.streamable("Hello there ``", 0), 11);
    assert.equal(xlam.streamable("Hello <tool", 0), 5);
    assert.equal(xlam.streamable("Hello </think>[", 0), 5);
    assert.equal(xlam.streamable("  [{", 0), 0);
    assert.equal(xlam.streamable("<tool_c", 0), 0);
    assert.equal(xlam.streamable("Plain words", 0), 11);
  });
});
