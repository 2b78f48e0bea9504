// The new tool-call and reasoning parsers end to end through the server: a fake engine writes a given reply (see
// FakeEngineOptions.script) and the official OpenAI client reads the chat completion (whole and streamed) and the
// Responses API's output. The expected messages are the replies read by hand.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type OpenAI from "openai";
import type { ReasoningParserName } from "../../src/engine/reasoning.js";
import type { ToolCallParserName } from "../../src/server/tool-parsers.js";
import { AsyncLLM } from "../../src/engine/async-llm.js";
import { FakeModelRunner } from "../../src/engine/fake-model-runner.js";
import { createServer } from "../../src/server/index.js";
import { FakeTokenizer } from "./fake-engine.js";
import { MODEL, startTestServer, type TestServer } from "./helpers.js";

const WEATHER = {
  type: "function" as const,
  function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" }, days: { type: "integer" } } } },
};

/** A server whose engine answers the user message `ask` with `reply`. */
async function serving(
  parsers: { tool?: ToolCallParserName; reasoning?: ReasoningParserName },
  replies: Record<string, string>,
): Promise<TestServer> {
  const script = (prompt: string) => Object.entries(replies).find(([ask]) => prompt.includes(`user: ${ask}\n`))?.[1] ?? null;
  return startTestServer(parsers.tool === undefined ? {} : { toolCallParser: parsers.tool }, {
    script,
    ...(parsers.reasoning === undefined ? {} : { reasoningParser: parsers.reasoning }),
  });
}

type Message = { content: string | null; tool_calls: { id: string; type: string; function: { name: string; arguments: string } }[]; reasoning?: string | null };

async function chat(s: TestServer, ask: string, extra: Record<string, unknown> = {}): Promise<{ message: Message; finish: string }> {
  const r = await s.client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: ask }], tools: [WEATHER], ...extra } as never);
  const c = (r as OpenAI.Chat.ChatCompletion).choices[0]!;
  return { message: c.message as unknown as Message, finish: c.finish_reason };
}

/** The streamed reply put together: content, reasoning and tool calls (by index), and the finish reason. */
async function streamedChat(s: TestServer, ask: string, extra: Record<string, unknown> = {}) {
  const stream = await s.client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: ask }], tools: [WEATHER], stream: true, ...extra } as never);
  let content = "";
  let reasoning = "";
  let finish: string | null = null;
  const calls: { id?: string; name?: string; arguments: string }[] = [];
  for await (const chunk of stream as unknown as AsyncIterable<OpenAI.Chat.ChatCompletionChunk>) {
    const ch = chunk.choices[0];
    if (ch === undefined) continue;
    const d = ch.delta as OpenAI.Chat.ChatCompletionChunk.Choice.Delta & { reasoning?: string };
    content += d.content ?? "";
    reasoning += d.reasoning ?? "";
    for (const t of d.tool_calls ?? []) {
      const c = (calls[t.index] ??= { arguments: "" });
      if (t.id) c.id = t.id;
      if (t.function?.name) c.name = t.function.name;
      c.arguments += t.function?.arguments ?? "";
    }
    finish = ch.finish_reason ?? finish;
  }
  return { content, reasoning, calls, finish };
}

describe("new tool-call parsers through the server", () => {
  it("mistral: content before [TOOL_CALLS], calls with 9-character ids; streamed the same; tool_choice none keeps the text", async () => {
    const reply = 'Checking.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}]';
    const s = await serving({ tool: "mistral" }, { weather: reply, v11: '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}' });
    try {
      const { message, finish } = await chat(s, "weather");
      assert.equal(message.content, "Checking.");
      assert.equal(finish, "tool_calls");
      assert.equal(message.tool_calls.length, 1);
      assert.match(message.tool_calls[0]!.id, /^[A-Za-z0-9]{9}$/);
      assert.deepEqual(message.tool_calls[0]!.function, { name: "get_weather", arguments: '{"city": "Oslo"}' });
      assert.equal(s.engine.lastParams?.skipSpecialTokens, false); // [TOOL_CALLS] is a special token: kept in the text

      const st = await streamedChat(s, "weather");
      assert.equal(st.content, "Checking.");
      assert.equal(st.finish, "tool_calls");
      assert.equal(st.calls.length, 1);
      assert.match(st.calls[0]!.id!, /^[A-Za-z0-9]{9}$/);
      assert.deepEqual({ name: st.calls[0]!.name, arguments: st.calls[0]!.arguments }, { name: "get_weather", arguments: '{"city": "Oslo"}' });

      const v11 = await chat(s, "v11");
      assert.deepEqual(v11.message.tool_calls[0]!.function, { name: "get_weather", arguments: '{"city": "Rome"}' });
      const none = await chat(s, "weather", { tool_choice: "none" });
      assert.equal(none.message.content, reply);
      assert.deepEqual(none.message.tool_calls, []);
    } finally {
      await s.close();
    }
  });

  it("granite, phi4_mini_json, llama4_pythonic and functiongemma: calls that open the reply (or phi's functools[...]) with no content", async () => {
    const cases: [ToolCallParserName, string, string][] = [
      ["granite", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}]', '{"city": "Oslo", "days": 2}'],
      ["phi4_mini_json", 'Sure. functools[{"name": "get_weather", "parameters": {"city": "Oslo"}}]', '{"city": "Oslo"}'],
      ["llama4_pythonic", '<|python_start|>[get_weather(city="Oslo", days=2)]<|python_end|>', '{"city": "Oslo", "days": 2}'],
      ["functiongemma", "<start_function_call>call:get_weather{city:<escape>Oslo<escape>,days:<escape>2<escape>}<end_function_call>", '{"city": "Oslo", "days": 2}'],
    ];
    for (const [parser, reply, args] of cases) {
      const s = await serving({ tool: parser }, { weather: reply, hello: "Hello there." });
      try {
        const { message, finish } = await chat(s, "weather");
        assert.equal(message.content, null, parser);
        assert.equal(finish, "tool_calls", parser);
        assert.deepEqual(message.tool_calls.map((c) => c.function), [{ name: "get_weather", arguments: args }], parser);
        assert.match(message.tool_calls[0]!.id, /^chatcmpl-tool-[0-9a-f]{32}$/);
        const st = await streamedChat(s, "weather");
        assert.deepEqual([st.content, st.finish, st.calls.map((c) => [c.name, c.arguments])], ["", "tool_calls", [["get_weather", args]]], parser);
        // a reply without calls is text, streamed or not
        assert.equal((await chat(s, "hello")).message.content, "Hello there.", parser);
        assert.equal((await streamedChat(s, "hello")).content, "Hello there.", parser);
      } finally {
        await s.close();
      }
    }
  });

  it("qwen3_coder: parameters typed by the request's tool schema, in chat and in the Responses API", async () => {
    const reply = "Let me see.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    const s = await serving({ tool: "qwen3_coder" }, { weather: reply });
    try {
      const { message, finish } = await chat(s, "weather");
      assert.equal(message.content, "Let me see.\n");
      assert.equal(finish, "tool_calls");
      assert.deepEqual(message.tool_calls[0]!.function, { name: "get_weather", arguments: '{"city": "Oslo", "days": 3}' });
      const st = await streamedChat(s, "weather");
      assert.deepEqual([st.content, st.calls.map((c) => c.arguments)], ["Let me see.\n", ['{"city": "Oslo", "days": 3}']]);
      // without the schema (another tool list) the value stays text
      const untyped = await chat(s, "weather", { tools: [{ type: "function", function: { name: "other" } }] });
      assert.equal(untyped.message.tool_calls[0]!.function.arguments, '{"city": "Oslo", "days": "3"}');

      const r = await s.client.responses.create({ model: MODEL, input: "weather", tools: [{ type: "function", name: "get_weather", parameters: WEATHER.function.parameters, strict: false }] });
      const call = r.output.find((o) => o.type === "function_call") as OpenAI.Responses.ResponseFunctionToolCall;
      assert.equal(r.output_text, "Let me see.\n");
      assert.deepEqual([call.name, call.arguments], ["get_weather", '{"city": "Oslo", "days": 3}']);
    } finally {
      await s.close();
    }
  });
});

describe("new reasoning parsers through the server", () => {
  it("granite: reasoning between the thought and response phrases, whole and streamed", async () => {
    const s = await serving({ reasoning: "granite" }, { sum: "Here is my thought process: 2 and 2. Here is my response: 4", plain: "Just 4." });
    try {
      const { message } = await chat(s, "sum", { tools: undefined });
      assert.deepEqual([message.reasoning, message.content], [" 2 and 2. ", " 4"]);
      const st = await streamedChat(s, "sum", { tools: undefined });
      assert.deepEqual([st.reasoning, st.content], [" 2 and 2. ", " 4"]);
      const plain = await chat(s, "plain", { tools: undefined });
      assert.deepEqual([plain.message.reasoning, plain.message.content], [null, "Just 4."]);
      // the Responses API: a reasoning item, then the message; reasoning_tokens are its text's tokens (one a character here)
      const r = await s.client.responses.create({ model: MODEL, input: "sum" });
      assert.deepEqual(r.output.map((o) => o.type), ["reasoning", "message"]);
      assert.deepEqual((r.output[0] as OpenAI.Responses.ResponseReasoningItem).content, [{ type: "reasoning_text", text: " 2 and 2. " }]);
      assert.equal(r.output_text, " 4");
      assert.equal(r.usage!.output_tokens_details.reasoning_tokens, " 2 and 2. ".length);
    } finally {
      await s.close();
    }
  });

  it("mistral: [THINK] ... [/THINK] is the reasoning (special tokens kept), with mistral tool calls after it", async () => {
    const s = await serving(
      { reasoning: "mistral", tool: "mistral" },
      { sum: "[THINK]2 and 2[/THINK]4", weather: '[THINK]Need the weather.[/THINK][TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}]' },
    );
    try {
      const { message } = await chat(s, "sum", { tools: undefined });
      assert.deepEqual([message.reasoning, message.content], ["2 and 2", "4"]);
      assert.equal(s.engine.lastParams?.skipSpecialTokens, false);
      const st = await streamedChat(s, "sum", { tools: undefined });
      assert.deepEqual([st.reasoning, st.content], ["2 and 2", "4"]);
      const w = await chat(s, "weather");
      assert.deepEqual([w.message.reasoning, w.message.content, w.finish], ["Need the weather.", null, "tool_calls"]);
      assert.deepEqual(w.message.tool_calls[0]!.function, { name: "get_weather", arguments: '{"city": "Oslo"}' });
      const ws = await streamedChat(s, "weather");
      assert.deepEqual([ws.reasoning, ws.content, ws.finish, ws.calls[0]!.arguments], ["Need the weather.", "", "tool_calls", '{"city": "Oslo"}']);
    } finally {
      await s.close();
    }
  });
});

describe("granite reasoning and structured output over the real engine", () => {
  it("a request with structured output (response_format, tool_choice required) is a 400 naming structured_outputs", async () => {
    const tokenizer = new FakeTokenizer();
    const engine = new AsyncLLM({ runner: new FakeModelRunner(tokenizer.vocabSize), tokenizer, engineArgs: { maxModelLen: 128, numGpuBlocks: 64, reasoningParser: "granite" } });
    const app = createServer({ engine, tokenizer, servedModelNames: ["real"], maxModelLen: 128, version: "t" });
    await app.listen({ port: 0, host: "127.0.0.1" });
    const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}/v1/chat/completions`;
    const post = async (extra: Record<string, unknown>) => {
      const r = await fetch(url, {
        method: "POST", headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "real", messages: [{ role: "user", content: "hi" }], max_tokens: 4, ...extra }),
      });
      return { status: r.status, body: (await r.json()) as { error?: { param: string | null; message: string; type: string } } };
    };
    try {
      for (const extra of [{ response_format: { type: "json_object" } }, { tools: [WEATHER], tool_choice: "required" }]) {
        const r = await post(extra);
        assert.equal(r.status, 400, JSON.stringify(extra));
        assert.equal(r.body.error!.param, "structured_outputs");
        assert.match(r.body.error!.message, /cannot follow the granite reasoning parser's reasoning/);
      }
      assert.equal((await post({})).status, 200);
    } finally {
      const closing = app.close();
      app.server.closeAllConnections();
      await closing;
    }
  });
});
