// The hermes tool-call parser against hand-written replies (vLLM's Hermes2ProToolParser reading).
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { partialMarkerLength, toolCallParser } from "../../src/server/tool-parsers.js";

describe("hermes tool-call parser", () => {
  const hermes = toolCallParser("hermes");

  it("reads each <tool_call> block as one call, with the text before the first as content", () => {
    const text =
      'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>\n' +
      '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>';
    assert.deepEqual(hermes.extract(text), {
      content: "Let me check.",
      calls: [
        { name: "get_weather", arguments: '{"city":"Oslo","days":2}' },
        { name: "get_time", arguments: "{}" },
      ],
    });
  });

  it("takes an unclosed last block (a reply that stopped at its end) and gives null content when none precedes", () => {
    assert.deepEqual(hermes.extract('<tool_call>{"name": "f", "arguments": {"x": [1]}}'), { content: null, calls: [{ name: "f", arguments: '{"x":[1]}' }] });
  });

  it("is null (the reply stays text) without a call, or when a call does not parse", () => {
    assert.equal(hermes.extract("no calls here"), null);
    assert.equal(hermes.extract('<tool_call>{"name": "f", "arguments": {"x": </tool_call>'), null);
    assert.equal(hermes.extract('<tool_call>{"arguments": {}}</tool_call>'), null);
  });

  it("measures a trailing prefix of the start marker (what streaming holds back)", () => {
    assert.equal(partialMarkerLength("abc <tool", "<tool_call>"), 5);
    assert.equal(partialMarkerLength("abc <", "<tool_call>"), 1);
    assert.equal(partialMarkerLength("abc", "<tool_call>"), 0);
    assert.equal(partialMarkerLength("x<tool_call", "<tool_call>"), 10);
  });
});
