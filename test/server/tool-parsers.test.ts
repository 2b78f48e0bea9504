// The tool-call parsers against hand-written replies, as vLLM's Hermes2ProToolParser, Llama3JsonToolParser and
// PythonicToolParser read them (arguments as Python's json.dumps writes them), and streamed replies, cut into
// deltas at every place, adding up to the whole reply's reading.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { pyFloatRepr } from "../../src/server/python-json.js";
import {
  partialMarkerLength, TOOL_CALL_PARSERS, toolCallParser, type ExtractedToolCalls, type ToolCallParser, type ToolCallParserName,
} from "../../src/server/tool-parsers.js";

describe("hermes tool-call parser", () => {
  const hermes = toolCallParser("hermes");

  it("reads each <tool_call> block as one call, with the text before the first as content", () => {
    const text =
      'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>\n' +
      '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>';
    assert.deepEqual(hermes.extract(text), {
      content: "Let me check.",
      calls: [
        { name: "get_weather", arguments: '{"city": "Oslo", "days": 2}' }, // json.dumps' separators, as vLLM writes them
        { name: "get_time", arguments: "{}" },
      ],
    });
  });

  it("takes an unclosed last block (a reply that stopped at its end) and gives null content when none precedes", () => {
    assert.deepEqual(hermes.extract('<tool_call>{"name": "f", "arguments": {"x": [1]}}'), { content: null, calls: [{ name: "f", arguments: '{"x": [1]}' }] });
  });

  it("is null (the reply stays text) without a call, or when a call does not parse", () => {
    assert.equal(hermes.extract("no calls here"), null);
    assert.equal(hermes.extract('<tool_call>{"name": "f", "arguments": {"x": </tool_call>'), null);
    assert.equal(hermes.extract('<tool_call>{"arguments": {}}</tool_call>'), null);
    // vLLM reads call["arguments"]: without them the reply is text; null is json.dumps(None)
    assert.equal(hermes.extract('<tool_call>{"name": "f"}</tool_call>'), null);
    assert.deepEqual(hermes.extract('<tool_call>{"name": "f", "arguments": null}</tool_call>'), { content: null, calls: [{ name: "f", arguments: "null" }] });
  });

  it("measures a trailing prefix of the start marker (what streaming holds back)", () => {
    assert.equal(partialMarkerLength("abc <tool", "<tool_call>"), 5);
    assert.equal(partialMarkerLength("abc <", "<tool_call>"), 1);
    assert.equal(partialMarkerLength("abc", "<tool_call>"), 0);
    assert.equal(partialMarkerLength("x<tool_call", "<tool_call>"), 10);
  });
});

describe("llama3_json tool-call parser", () => {
  const llama = toolCallParser("llama3_json");
  const one = (name: string, args: string): ExtractedToolCalls => ({ content: null, calls: [{ name, arguments: args }] });

  it("reads `;`-separated JSON calls after an optional <|python_tag|>, with either key for the arguments", () => {
    const text = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo", "days": 2}}; {"name": "get_time", "arguments": {}}';
    assert.deepEqual(llama.extract(text), {
      content: null,
      calls: [
        { name: "get_weather", arguments: '{"city": "Oslo", "days": 2}' },
        { name: "get_time", arguments: "{}" },
      ],
    });
    assert.deepEqual(llama.extract('\n {"name":"f","parameters":{"a":1}}'), one("f", '{"a": 1}')); // leading whitespace; Python's spacing
    assert.deepEqual(llama.extract('{"name": "f", "arguments": {"a": 1}, "parameters": {"b": 2}}'), one("f", '{"a": 1}'));
    assert.deepEqual(llama.extract('{"name": "f", "arguments": null}'), one("f", "null"));
    // text between and after the objects is dropped, as vLLM drops it
    assert.deepEqual(llama.extract('{"name": "f", "parameters": {}}\n\nI called f.'), one("f", "{}"));
  });

  it("writes the arguments as Python's json.dumps does: key order, ints and floats, NaN, escapes, unicode as is", () => {
    const nested =
      '{"name": "f", "parameters": {"a": {"b": [1, 2.0, 1e3, -0.5, 12345678901234567890, -0], "c": null}, "2": true, "1": false, "x": NaN, "y": -Infinity, "d": 1, "d": 2}}';
    const want = '{"a": {"b": [1, 2.0, 1000.0, -0.5, 12345678901234567890, 0], "c": null}, "2": true, "1": false, "x": NaN, "y": -Infinity, "d": 2}';
    assert.deepEqual(llama.extract(nested), one("f", want));
    const text = String.raw`{"name": "say", "parameters": {"text": "Say \"hi\"\n\u00e9 ✓ \ud83d\ude00 tab\t\u0001\/"}}`;
    assert.deepEqual(llama.extract(text), one("say", String.raw`{"text": "Say \"hi\"\né ✓ 😀 tab\t\u0001/"}`));
  });

  it("is null (the reply stays text) without calls, with text before them, or when one does not parse", () => {
    for (const text of [
      "The weather in Oslo is mild.",
      'Sure: {"name": "f", "parameters": {}}', // calls open the reply
      "<|python_tag|>print('hi')",
      '{"name": "f", "parameters": {"a": }}',
      '{"parameters": {}}', // no name
      '{"name": "f"}', // no arguments
      '{"name": 3, "parameters": {}}',
      '{"name": "f", "parameters": {}}; {oops}', // every object must be a call
      '{"name": "f", "parameters": {"a": "two\nlines"}}', // a raw newline in a JSON string
      '{"name": "f", "parameters": {"a": 1,}}', // trailing comma
      "",
    ]) {
      assert.equal(llama.extract(text), null, JSON.stringify(text));
    }
  });
});

describe("pythonic tool-call parser", () => {
  const pythonic = toolCallParser("pythonic");
  const one = (name: string, args: string): ExtractedToolCalls => ({ content: null, calls: [{ name, arguments: args }] });

  it("reads a Python list of calls with keyword arguments", () => {
    assert.deepEqual(pythonic.extract('[get_weather(city="Oslo", days=2), get_time()]'), {
      content: null,
      calls: [
        { name: "get_weather", arguments: '{"city": "Oslo", "days": 2}' },
        { name: "get_time", arguments: "{}" },
      ],
    });
    // Python's layout: newlines, trailing commas, comments, spaces around `=`
    assert.deepEqual(pythonic.extract('\n[\n  f(a=1,),\n  g(b = "x"),  # note\n]\n'), {
      content: null,
      calls: [
        { name: "f", arguments: '{"a": 1}' },
        { name: "g", arguments: '{"b": "x"}' },
      ],
    });
  });

  it("takes Python literals, nested, and writes them as json.dumps does", () => {
    const text = `[f(a={"b": [1, 2.5, True, None], 'c': {'d': False}}, e=[], g=1e3, h=0x1F, i=1_000, j=-3, k=.5, l=1., m=0o17, n=0b101, o=(7), p=-2.5e-7)]`;
    const want = '{"a": {"b": [1, 2.5, true, null], "c": {"d": false}}, "e": [], "g": 1000.0, "h": 31, "i": 1000, "j": -3, "k": 0.5, "l": 1.0, "m": 15, "n": 5, "o": 7, "p": -2.5e-07}';
    assert.deepEqual(pythonic.extract(text), one("f", want));
    // dict keys: equal keys (1 and True) share a slot; json.dumps writes non-string keys as their JSON text
    const keys = '[f(m={1: "a", 2.5: "b", True: "c", None: "d", "1": "e"})]';
    assert.deepEqual(pythonic.extract(keys), one("f", '{"m": {"1": "c", "2.5": "b", "null": "d", "1": "e"}}'));
    // JSON's names, as vLLM takes them
    assert.deepEqual(pythonic.extract("[f(a=null, b=true, c=false)]"), one("f", '{"a": null, "b": true, "c": false}'));
  });

  it("reads strings in either quote style with Python's escapes", () => {
    const text = String.raw`[say(a='it\'s', b="say \"hi\"", c='tab\there\nnl', d="\u00e9\x41\101\U0001F600", e='😀 ünï', f=r'raw\n', g="multi" 'part', h='''triple "q"''', i="back\\slash", j="\q", k=u"x")]`;
    const want = String.raw`{"a": "it's", "b": "say \"hi\"", "c": "tab\there\nnl", "d": "éAA😀", "e": "😀 ünï", "f": "raw\\n", "g": "multipart", "h": "triple \"q\"", "i": "back\\slash", "j": "\\q", "k": "x"}`;
    assert.deepEqual(pythonic.extract(text), one("say", want));
    assert.deepEqual(pythonic.extract('[f(s="""two\nlines""")]'), one("f", String.raw`{"s": "two\nlines"}`));
  });

  it("is null (the reply stays text) for anything but a list of calls with literal keyword arguments", () => {
    for (const text of [
      "The weather in Oslo is mild.",
      "Sure: [f(a=1)]", // calls open the reply
      "[f(a=1)] and some text",
      "[]",
      "[1, 2]",
      "[f]",
      "[f(1)]", // positional
      "[f(x, a=1)]",
      "[f(**kw)]",
      "[f(a=g())]",
      "[f(a=x)]",
      "[f(a=1 + 2)]",
      "[f(a=(1, 2))]",
      "[f(a={1, 2})]",
      "[f(a={x: 1})]",
      '[f(a=b"x")]',
      '[f(a=f"x")]',
      "[f(a=1, a=2)]",
      "[f(a=1)",
      "[f(a=1)]]",
      "[obj.f(a=1)]",
      "[f(a=1j)]",
      "[f(a=01)]",
      "[f(a==1)]",
      "[None(a=1)]",
      "[f(if=1)]",
      '[f(a="unterminated)]',
      "[f(a='line\nbreak')]",
      '[f(a="\\N{BULLET}")]', // needs Unicode's name table
      "(f(a=1))",
    ]) {
      assert.equal(pythonic.extract(text), null, JSON.stringify(text));
    }
  });
});

describe("Python value formatting", () => {
  it("writes floats as Python's repr", () => {
    const cases: [number, string][] = [
      [1e16, "1e+16"], [1e15, "1000000000000000.0"], [0.0001, "0.0001"], [0.00001, "1e-05"], [1.5e-7, "1.5e-07"],
      [123.456, "123.456"], [-0, "-0.0"], [0.1 + 0.2, "0.30000000000000004"], [5e-324, "5e-324"], [1e22, "1e+22"],
      [1.7976931348623157e308, "1.7976931348623157e+308"], [12345678901234567890, "1.2345678901234567e+19"], [100, "100.0"],
    ];
    for (const [x, want] of cases) assert.equal(pyFloatRepr(x), want, String(x));
  });
});

/**
 * A reply streamed as ToolCallStream streams it, cut into deltas at i and j: content goes out as far as the parser
 * allows, and the last delta brings the calls (with the rest of the content) or the held text.
 */
function streamed(parser: ToolCallParser, text: string, i: number, j: number): ExtractedToolCalls {
  let all = "";
  let content = "";
  for (const delta of [text.slice(0, i), text.slice(i, j)]) {
    all += delta;
    const upTo = parser.streamable(all, content.length);
    assert.ok(upTo >= content.length && upTo <= all.length);
    content += all.slice(content.length, upTo);
  }
  const found = parser.extract(text);
  if (found === null) return { content: content + text.slice(content.length), calls: [] };
  assert.ok((found.content ?? "").startsWith(content), `${JSON.stringify(content)} went out before the calls were read`);
  return { content: found.content ?? "", calls: found.calls };
}

describe("streamed tool calls", () => {
  // ("openai" reads no text: gpt-oss's calls are Harmony messages, read from tokens in harmony tests)
  const replies: Record<Exclude<ToolCallParserName, "openai">, string[]> = {
    hermes: ['Let me check.<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>', "a <tool no", "<tool_call>{bad}", "plain"],
    llama3_json: [
      '<|python_tag|>{"name": "f", "parameters": {"a": [1, {"b": "}"}]}}; {"name": "g", "parameters": {}}',
      ' \n{"name": "f", "arguments": {}}',
      "<|python",
      "<|pyt hon",
      "{not json}",
      " plain text {",
      "",
    ],
    pythonic: ['[f(a="]", b={"c": [1]}), g()]', "\n [f()]", "[1] is a citation", " [f(", "plain [f()]", ""],
    llama4_json: ['{"name": "f", "parameters": {"a": 1}}', "plain"],
    llama4_pythonic: ['<|python_start|>[f(a="é")]<|python_end|>', "[f()]", " [f()]", "<|python", "[1] is a citation", ""],
    mistral: [
      'Sure.[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]',
      '[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[CALL_ID]x1[ARGS]{}',
      "a [TOOL_ no",
      "[TOOL_CALLS][bad",
      "plain",
    ],
    granite: [' <|tool_call|><tool_call> [{"name": "f", "arguments": {"a": 1}}]', "<tool_call>[]", "<|tool_call|>hi", "<tool", "plain [", ""],
    phi4_mini_json: ['functools[{"name": "f", "parameters": {"a": 1}}]', "Sure functools[{bad}]", "plain"],
    qwen3_coder: [
      "Checking.\n<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
      "<function=f><parameter=a>x",
      "a <tool_call> no function",
      "<tool_call><function=bad",
      "plain <func",
    ],
    functiongemma: [
      "Sure. <start_function_call>call:f{a:<escape>1<escape>}<end_function_call>",
      "<start_function_call>call:f{}<end_function_call>",
      " Hi <start_function_call>call:f{a:<escape>x<escape>}<end_function_call>",
      "a <start_func no",
      "<start_function_call>oops",
      "plain  ",
    ],
    xlam: [
      '[{"name": "f", "arguments": {"a": 1}}]',
      'Sure: ```json\n[{"name": "f", "arguments": {"a": "é"}}]\n``` done ',
      '<think>hmm</think>[{"name": "g", "arguments": "{}"}]',
      'Hi [TOOL_CALLS][{"name": "f", "arguments": {}}]\nbye',
      'a <tool_call>[{"name": "f", "arguments": {}}]</tool_call>',
      "[1] the first point",
      "code: ```js\nx```",
      "plain ` text  ",
    ],
  };
  const withoutIds = (r: ExtractedToolCalls) => ({ content: r.content, calls: r.calls.map(({ name, arguments: a }) => ({ name, arguments: a })) });
  for (const name of TOOL_CALL_PARSERS.filter((n) => n !== "openai")) {
    it(`${name}: cut into deltas anywhere, the stream adds up to the whole reply's reading`, () => {
      const parser = toolCallParser(name);
      for (const text of replies[name]) {
        const found = parser.extract(text);
        const want = withoutIds({ content: found === null ? text : (found.content ?? ""), calls: found?.calls ?? [] });
        for (let i = 0; i <= text.length; i++) {
          for (let j = i; j <= text.length; j++) {
            assert.deepEqual(withoutIds(streamed(parser, text, i, j)), want, `${JSON.stringify(text)} cut at ${i}, ${j}`);
          }
        }
      }
    });
  }
});
