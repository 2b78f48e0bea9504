// Chat requests as the protocol layer reads them for tools: earlier turns' tool-call arguments reach the chat
// template as objects (vLLM's _postprocess_messages), and tool_choice maps to the structured output vLLM uses.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { parseChatRequest } from "../../src/server/protocol.js";
import { readReply } from "../../src/server/serving-chat.js";
import type { ServingContext } from "../../src/server/serving-context.js";

describe("chat protocol: tools", () => {
  const tool = { type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } } };

  it("parses earlier tool calls' JSON arguments into objects (empty: {}), leaving non-JSON text alone", () => {
    const call = (args: string) => ({ id: "c1", type: "function", function: { name: "get_weather", arguments: args } });
    const req = parseChatRequest(
      {
        messages: [
          { role: "user", content: "weather?" },
          { role: "assistant", content: null, tool_calls: [call('{"city": "Paris"}'), call(""), call("not json")] },
          { role: "tool", tool_call_id: "c1", content: "sunny" },
        ],
        tools: [tool],
        tool_choice: "none",
      },
      100,
    );
    const calls = req.messages[1]!.tool_calls as { function: { arguments: unknown } }[];
    assert.deepEqual(calls.map((c) => c.function.arguments), [{ city: "Paris" }, {}, "not json"]);
    assert.equal(req.messages[2]!.tool_call_id, "c1");
  });

  it("passes an earlier reply's reasoning to the template as reasoning and reasoning_content (vLLM's), for assistant turns only", () => {
    const req = parseChatRequest(
      { messages: [{ role: "user", content: "q", reasoning: "x" }, { role: "assistant", content: "a", reasoning: "because" }, { role: "user", content: "more" }] },
      100,
    );
    assert.deepEqual([req.messages[1]!.reasoning, req.messages[1]!.reasoning_content], ["because", "because"]);
    assert.equal("reasoning" in req.messages[0]!, false);
  });

  it("keeps special tokens in the reply's text with tools and any tool_choice but none (vLLM's adjust_request), unless the request says", () => {
    const msgs = [{ role: "user", content: "weather?" }];
    const skip = (extra: object) => parseChatRequest({ messages: msgs, tools: [tool], ...extra }, 100, { autoTools: true }).params.skipSpecialTokens;
    assert.equal(skip({}), false); // auto
    assert.equal(skip({ tool_choice: "required" }), false);
    assert.equal(skip({ tool_choice: { type: "function", function: { name: "get_weather" } } }), false);
    assert.equal(skip({ tool_choice: "none" }), undefined);
    assert.equal(skip({ tool_choice: "required", skip_special_tokens: true }), true);
    assert.equal(parseChatRequest({ messages: msgs }, 100).params.skipSpecialTokens, undefined);
  });

  it('maps "required" to vLLM\'s list schema with the tools\' $defs at the top, and a named function to its parameters', () => {
    const withDefs = { type: "function", function: { name: "pick", parameters: { type: "object", properties: { c: { $ref: "#/$defs/C" } }, $defs: { C: { type: "string" } } } } };
    const req = parseChatRequest({ messages: [{ role: "user", content: "x" }], tools: [tool, withDefs], tool_choice: "required" }, 100);
    const schema = req.params.structuredOutputs!.json as { $defs: unknown; items: { anyOf: { properties: { parameters: Record<string, unknown> } }[] } };
    assert.deepEqual(schema.$defs, { C: { type: "string" } });
    assert.equal("$defs" in schema.items.anyOf[1]!.properties.parameters, false);
    assert.deepEqual(req.toolChoice, { kind: "required" });
    const named = parseChatRequest({ messages: [{ role: "user", content: "x" }], tools: [tool], tool_choice: { type: "function", function: { name: "get_weather" } } }, 100);
    assert.deepEqual(named.params.structuredOutputs, { json: tool.function.parameters });
  });

  it('reads a "required" reply\'s calls with their arguments as vLLM writes them (json.dumps, ensure_ascii=False)', () => {
    const req = parseChatRequest({ messages: [{ role: "user", content: "x" }], tools: [tool], tool_choice: "required" }, 100);
    const reply = readReply({} as ServingContext, req, '[{"name":"get_weather","parameters":{"city":"Zürich","days":[1,2.0],"x":{}}},{"name": "get_weather", "parameters": {}}]');
    assert.equal(reply.content, "");
    assert.deepEqual(reply.toolCalls!.map((c) => [c.function.name, c.function.arguments]), [
      ["get_weather", '{"city": "Zürich", "days": [1, 2.0], "x": {}}'],
      ["get_weather", "{}"],
    ]);
    assert.deepEqual(readReply({} as ServingContext, req, '[{"name": "get_weather", "parameters": {"ci'), { content: '[{"name": "get_weather", "parameters": {"ci', toolCalls: null });
    for (const bad of ['[{"name": "get_weather", "parameters": {}}] x', '{"name": "get_weather"}', "[1]", '[{"parameters": {}}]'])
      assert.deepEqual(readReply({} as ServingContext, req, bad), { content: bad, toolCalls: null }, bad);
  });
});
