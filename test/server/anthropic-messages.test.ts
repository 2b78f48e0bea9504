// POST /v1/messages and /v1/messages/count_tokens through the official Anthropic client (@anthropic-ai/sdk) over the
// fake engine: at temperature 0 a reply equals the chat completions reply to the same prompt, whole and streamed;
// stop_sequences and max_tokens end it with their stop reasons; a named tool's and "any"'s constrained output, and
// an "auto" reply read by the tool-call parser, come back as tool_use blocks; a reasoning parser's thinking as
// thinking blocks; count_tokens equals /tokenize's count of the same chat; errors are Anthropic's objects.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import Anthropic from "@anthropic-ai/sdk";
import type { FastifyInstance } from "fastify";
import type { RequestOutput, SamplingParams } from "../../src/engine/types.js";
import { parseMessagesRequest } from "../../src/server/anthropic-protocol.js";
import { ApiError } from "../../src/server/errors.js";
import { createServer, type ServerOptions } from "../../src/server/index.js";
import { FakeEngine } from "./fake-engine.js";
import { freeBlocks, MODEL, startTestServer, waitFor, type TestServer } from "./helpers.js";

/** The fake engine, answering with a fixed script when one is set (the text a constrained or parsed reply needs). */
class ScriptedEngine extends FakeEngine {
  script: string | null = null;

  override async *generate(
    prompt: { promptTokenIds: number[]; prompt?: string },
    params: Partial<SamplingParams>,
    options: { requestId: string; priority?: number; delta?: boolean; cacheSalt?: string },
  ): AsyncGenerator<RequestOutput> {
    if (this.script === null) {
      yield* super.generate(prompt, params, options);
      return;
    }
    this.lastParams = params;
    const pieces = this.script.match(/[\s\S]{1,4}/g) ?? [];
    for (const [i, text] of pieces.entries()) {
      await new Promise<void>((resolve) => setImmediate(resolve));
      const last = i === pieces.length - 1;
      const tokenIds = this.tokenizer.encode(text, { addSpecialTokens: false });
      yield {
        requestId: options.requestId, prompt: prompt.prompt ?? null, promptTokenIds: prompt.promptTokenIds, promptLogprobs: null,
        outputs: [{ index: 0, text, tokenIds, cumulativeLogprob: null, logprobs: null, finishReason: last ? "stop" : null, stopReason: null }],
        finished: last, numCachedTokens: 0,
      };
    }
  }
}

async function startScripted(
  overrides: Partial<ServerOptions> = {}, reasoningParser: "deepseek_r1" | null = null,
): Promise<{ app: FastifyInstance; engine: ScriptedEngine; client: Anthropic; close: () => Promise<void> }> {
  const engine = new ScriptedEngine(reasoningParser === null ? {} : { reasoningParser });
  const app = createServer({ engine, tokenizer: engine.tokenizer, servedModelNames: [MODEL], maxModelLen: engine.maxModelLen, version: "0.1.0-test", ...overrides });
  await app.listen({ port: 0, host: "127.0.0.1" });
  const addr = app.server.address();
  if (addr === null || typeof addr === "string") throw new Error("no port");
  const client = new Anthropic({ baseURL: `http://127.0.0.1:${addr.port}`, apiKey: "unused", maxRetries: 0 });
  const close = async (): Promise<void> => {
    const closing = app.close();
    app.server.closeAllConnections();
    await closing;
  };
  return { app, engine, client, close };
}

/**
 * temperature 0, the fake engine's deterministic sampling: sent as it is, though the SDK's types no longer list
 * temperature (Anthropic deprecated it), as Anthropic's API and vLLM still take it.
 */
const greedy = { temperature: 0 } as unknown as Record<string, never>;

const weather: Anthropic.Tool = {
  name: "get_weather",
  description: "The weather in a city",
  input_schema: { type: "object", properties: { city: { type: "string" }, days: { type: "integer" } }, required: ["city"] },
};

describe("/v1/messages through the Anthropic SDK over the fake engine", () => {
  let s: TestServer;
  let anthropic: Anthropic;
  before(async () => {
    s = await startTestServer();
    anthropic = new Anthropic({ baseURL: s.url, apiKey: "unused", maxRetries: 0 });
  });
  after(() => s.close());

  const system = "You are terse.";
  const user = "Tell me a story";
  const chatOf = (maxTokens: number, stop?: string[]) =>
    s.client.chat.completions.create({
      model: MODEL, ...greedy, max_tokens: maxTokens, ...(stop ? { stop } : {}),
      messages: [{ role: "system", content: system }, { role: "user", content: user }],
    });

  it("a whole reply is the chat completions reply to the same prompt, with its usage and stop reason", async () => {
    const chat = await chatOf(40);
    const msg = await anthropic.messages.create({
      model: MODEL, max_tokens: 40, ...greedy, system, messages: [{ role: "user", content: user }],
    });
    const choice = chat.choices[0]!;
    assert.match(msg.id, /^msg_/);
    assert.equal(msg.type, "message");
    assert.equal(msg.role, "assistant");
    assert.equal(msg.model, MODEL);
    assert.deepEqual(msg.content, [{ type: "text", text: choice.message.content }]);
    assert.equal(msg.stop_reason, choice.finish_reason === "length" ? "max_tokens" : "end_turn");
    assert.equal(msg.stop_sequence, null);
    assert.deepEqual(msg.usage, { input_tokens: chat.usage!.prompt_tokens, output_tokens: chat.usage!.completion_tokens });
  });

  it("a streamed reply sends Anthropic's events in order and adds up to the chat reply", async () => {
    const chat = await chatOf(40);
    const events: Anthropic.RawMessageStreamEvent[] = [];
    const stream = await anthropic.messages.create({
      model: MODEL, max_tokens: 40, ...greedy, system: [{ type: "text", text: system }], messages: [{ role: "user", content: [{ type: "text", text: user }] }], stream: true,
    });
    for await (const e of stream) events.push(e);
    const types = events.map((e) => e.type);
    assert.equal(types[0], "message_start");
    assert.equal(types[1], "content_block_start");
    assert.deepEqual(types.slice(-3), ["content_block_stop", "message_delta", "message_stop"]);
    assert.ok(types.slice(2, -3).every((t) => t === "content_block_delta"));
    const start = events[0] as Anthropic.RawMessageStartEvent;
    assert.deepEqual([start.message.content, start.message.stop_reason, start.message.usage.input_tokens], [[], null, chat.usage!.prompt_tokens]);
    const text = events.flatMap((e) => (e.type === "content_block_delta" && e.delta.type === "text_delta" ? [e.delta.text] : [])).join("");
    assert.equal(text, chat.choices[0]!.message.content);
    const delta = events.at(-2) as Anthropic.RawMessageDeltaEvent;
    assert.equal(delta.delta.stop_reason, chat.choices[0]!.finish_reason === "length" ? "max_tokens" : "end_turn");
    assert.equal(delta.usage.output_tokens, chat.usage!.completion_tokens);

    // the SDK's own accumulator reads the same message
    const final = await anthropic.messages.stream({ model: MODEL, max_tokens: 40, ...greedy, system, messages: [{ role: "user", content: user }] }).finalMessage();
    assert.deepEqual(final.content, [{ type: "text", text: chat.choices[0]!.message.content }]);
  });

  it("max_tokens cuts the reply with stop_reason max_tokens", async () => {
    const chat = await chatOf(3);
    assert.equal(chat.choices[0]!.finish_reason, "length"); // (the fake model's reply to this prompt runs longer)
    const msg = await anthropic.messages.create({ model: MODEL, max_tokens: 3, ...greedy, system, messages: [{ role: "user", content: user }] });
    assert.equal(msg.stop_reason, "max_tokens");
    assert.equal(msg.usage.output_tokens, 3);
    assert.deepEqual(msg.content, [{ type: "text", text: chat.choices[0]!.message.content }]);
  });

  it("stop_sequences end the reply with stop_reason stop_sequence, naming it, whole and streamed", async () => {
    const full = (await chatOf(40)).choices[0]!.message.content!;
    const seq = full.slice(6, 8); // two characters of the reply: it stops before their first occurrence
    const expected = full.slice(0, full.indexOf(seq));
    const body = { model: MODEL, max_tokens: 40, ...greedy, system, stop_sequences: ["zzzzzz", seq], messages: [{ role: "user" as const, content: user }] };
    const msg = await anthropic.messages.create(body);
    assert.deepEqual([msg.stop_reason, msg.stop_sequence], ["stop_sequence", seq]);
    assert.deepEqual(msg.content, expected === "" ? [] : [{ type: "text", text: expected }]);
    const streamed = await anthropic.messages.stream(body).finalMessage();
    assert.deepEqual([streamed.stop_reason, streamed.stop_sequence], ["stop_sequence", seq]);
    assert.equal(streamed.content.map((b) => (b.type === "text" ? b.text : "")).join(""), expected);
  });

  it("count_tokens is /tokenize's count of the same chat, and the prompt /v1/messages sends", async () => {
    const messages: Anthropic.MessageParam[] = [
      { role: "user", content: "What is the weather in Paris?" },
      { role: "assistant", content: [{ type: "text", text: "Let me look." }, { type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Paris" } }] },
      { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: [{ type: "text", text: "sunny" }] }, { type: "text", text: "And tomorrow?" }] },
    ];
    const counted = await anthropic.messages.countTokens({ model: MODEL, system, messages, tools: [weather] });
    const tokenize = await fetch(`${s.url}/tokenize`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: MODEL,
        messages: [
          { role: "system", content: system },
          { role: "user", content: "What is the weather in Paris?" },
          { role: "assistant", content: "Let me look.", tool_calls: [{ id: "toolu_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } }] },
          { role: "tool", tool_call_id: "toolu_1", content: "sunny" },
          { role: "user", content: "And tomorrow?" },
        ],
        tools: [{ type: "function", function: { name: weather.name, description: weather.description, parameters: weather.input_schema } }],
      }),
    });
    const { count } = (await tokenize.json()) as { count: number };
    assert.equal(counted.input_tokens, count);
    const msg = await anthropic.messages.create({ model: MODEL, max_tokens: 2, system, messages, tools: [weather], tool_choice: { type: "none" } });
    assert.equal(msg.usage.input_tokens, count);
  });

  it("a final assistant message is continued (Anthropic's prefill), as the chat API's continue_final_message", async () => {
    const messages: Anthropic.MessageParam[] = [{ role: "user", content: user }, { role: "assistant", content: "Once upon" }];
    const counted = await anthropic.messages.countTokens({ model: MODEL, messages });
    const chat = await s.client.chat.completions.create({
      model: MODEL, max_tokens: 10, ...greedy, messages: [{ role: "user", content: user }, { role: "assistant", content: "Once upon" }],
      continue_final_message: true, add_generation_prompt: false,
    } as never);
    assert.equal(counted.input_tokens, chat.usage!.prompt_tokens);
    const msg = await anthropic.messages.create({ model: MODEL, max_tokens: 10, ...greedy, messages });
    assert.deepEqual(msg.content, [{ type: "text", text: chat.choices[0]!.message.content }]);
  });

  it("errors are Anthropic's error objects with the right status", async () => {
    const post = async (body: unknown, path = "/v1/messages", raw = false) => {
      const res = await fetch(`${s.url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: raw ? (body as string) : JSON.stringify(body) });
      return { status: res.status, body: (await res.json()) as { type: string; error: { type: string; message: string } } };
    };
    const user1 = [{ role: "user", content: "hi" }];
    const cases: [unknown, number, string, RegExp][] = [
      [{ model: MODEL, messages: user1 }, 400, "invalid_request_error", /max_tokens/],
      [{ model: MODEL, max_tokens: 0, messages: user1 }, 400, "invalid_request_error", /max_tokens/],
      [{ model: MODEL, max_tokens: 5, messages: [] }, 400, "invalid_request_error", /messages/],
      [{ model: MODEL, max_tokens: 5, messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "AAAA" } }] }] }, 400, "invalid_request_error", /image/],
      [{ model: MODEL, max_tokens: 5, messages: user1, tools: [weather] }, 400, "invalid_request_error", /enable-auto-tool-choice/],
      [{ model: MODEL, max_tokens: 5, messages: user1, tools: [weather], tool_choice: { type: "tool", name: "nope" } }, 400, "invalid_request_error", /nope/],
      [{ model: "no-such-model", max_tokens: 5, messages: user1 }, 404, "not_found_error", /no-such-model/],
      [{ model: MODEL, max_tokens: 1000, messages: user1 }, 400, "invalid_request_error", /maximum context length/],
    ];
    for (const [body, status, type, message] of cases) {
      const r = await post(body);
      assert.equal(r.status, status, JSON.stringify(body));
      assert.equal(r.body.type, "error");
      assert.equal(r.body.error.type, type);
      assert.match(r.body.error.message, message);
    }
    const malformed = await post("{not json", "/v1/messages", true);
    assert.deepEqual([malformed.status, malformed.body.type, malformed.body.error.type], [400, "error", "invalid_request_error"]);
    const count = await post({ model: MODEL, messages: [{ role: "user", content: [{ type: "image" }] }] }, "/v1/messages/count_tokens");
    assert.deepEqual([count.status, count.body.error.type], [400, "invalid_request_error"]);
    // a route Kiln does not serve under /v1/messages (the Batches API), or a wrong method: Anthropic's objects too
    const batches = await post({ requests: [] }, "/v1/messages/batches");
    assert.deepEqual([batches.status, batches.body.type, batches.body.error.type], [404, "error", "not_found_error"]);
    const get = await fetch(`${s.url}/v1/messages`);
    assert.deepEqual([get.status, ((await get.json()) as typeof batches.body).error.type], [405, "invalid_request_error"]);
    // the SDK reads them as its typed errors
    await assert.rejects(
      anthropic.messages.create({ model: "no-such-model", max_tokens: 5, messages: [{ role: "user", content: "hi" }] }),
      (err: unknown) => err instanceof Anthropic.NotFoundError && err.type === "not_found_error",
    );
  });
});

describe("/v1/messages streams that end early", () => {
  let s: TestServer;
  let anthropic: Anthropic;
  before(async () => {
    // (no random EOS: a reply that ended within 3 deltas would leave nothing to abort)
    s = await startTestServer({}, { stepDelayMs: 5, eosProbability: 0 });
    anthropic = new Anthropic({ baseURL: s.url, apiKey: "unused", maxRetries: 0 });
  });
  after(() => s.close());

  it("a client that leaves a stream aborts its engine request and frees its blocks", async () => {
    const start = await freeBlocks(s.url);
    const aborted = s.engine.aborted.length;
    const stream = await anthropic.messages.create({
      model: MODEL, max_tokens: 200, messages: [{ role: "user", content: "a long story" }], stream: true,
    });
    let deltas = 0;
    for await (const e of stream) if (e.type === "content_block_delta" && ++deltas === 3) break; // the SDK aborts the request
    await waitFor(() => s.engine.aborted.length > aborted);
    await waitFor(async () => (await freeBlocks(s.url)) === start);
  });

  it("an engine failure mid-stream ends the stream with an error event the SDK raises", async () => {
    const stream = await anthropic.messages.create({ model: MODEL, max_tokens: 50, messages: [{ role: "user", content: "FAIL_MID_STREAM" }], stream: true });
    const seen: string[] = [];
    await assert.rejects(
      (async () => {
        for await (const e of stream) seen.push(e.type);
      })(),
      (err: unknown) => err instanceof Anthropic.APIError && err.type === "api_error" && /exploded/.test(err.message),
    );
    assert.equal(seen[0], "message_start");
  });
});

describe("/v1/messages tool use and thinking over a scripted engine", () => {
  it("a named tool_choice constrains the reply to the tool's input_schema and returns its tool_use, whole and streamed", async () => {
    const t = await startScripted();
    try {
      t.engine.script = '{"city": "Paris", "days": 3}';
      const body = { model: MODEL, max_tokens: 50, messages: [{ role: "user" as const, content: "weather?" }], tools: [weather], tool_choice: { type: "tool" as const, name: "get_weather" } };
      const msg = await t.client.messages.create(body);
      assert.deepEqual(t.engine.lastParams?.structuredOutputs, { json: weather.input_schema });
      assert.equal(msg.content.length, 1);
      const block = msg.content[0] as Anthropic.ToolUseBlock;
      assert.equal(block.type, "tool_use");
      assert.match(block.id, /^toolu_/);
      assert.deepEqual([block.name, block.input], ["get_weather", { city: "Paris", days: 3 }]);
      assert.equal(msg.stop_reason, "tool_use");

      const events: Anthropic.RawMessageStreamEvent[] = [];
      const stream = t.client.messages.stream(body).on("streamEvent", (e) => events.push(e));
      const final = await stream.finalMessage();
      const streamedBlock = final.content[0] as Anthropic.ToolUseBlock;
      assert.deepEqual([final.content.length, streamedBlock.type, streamedBlock.name, streamedBlock.input], [1, "tool_use", "get_weather", { city: "Paris", days: 3 }]);
      assert.equal(final.stop_reason, "tool_use");
      const json = events.flatMap((e) => (e.type === "content_block_delta" && e.delta.type === "input_json_delta" ? [e.delta.partial_json] : []));
      assert.ok(json.length > 1, "the input streams as it is written");
      assert.equal(json.join(""), t.engine.script);
    } finally {
      await t.close();
    }
  });

  it('"any" is the chat API\'s "required": one tool_use block per call in the constrained list', async () => {
    const t = await startScripted();
    try {
      t.engine.script = '[{"name": "get_weather", "parameters": {"city": "Oslo"}}, {"name": "get_weather", "parameters": {"city": "Rome"}}]';
      const body = { model: MODEL, max_tokens: 200, messages: [{ role: "user" as const, content: "weather?" }], tools: [weather], tool_choice: { type: "any" as const } };
      const msg = await t.client.messages.create(body);
      const schema = t.engine.lastParams?.structuredOutputs?.json as { type: string; minItems: number };
      assert.deepEqual([schema.type, schema.minItems], ["array", 1]);
      assert.deepEqual(msg.content.map((b) => (b.type === "tool_use" ? [b.name, b.input] : b.type)), [["get_weather", { city: "Oslo" }], ["get_weather", { city: "Rome" }]]);
      assert.equal(msg.stop_reason, "tool_use");
      const streamed = await t.client.messages.stream(body).finalMessage();
      assert.deepEqual(streamed.content.map((b) => (b.type === "tool_use" ? [b.name, b.input] : b.type)), [["get_weather", { city: "Oslo" }], ["get_weather", { city: "Rome" }]]);
      // disable_parallel_tool_use keeps the first call (the chat API's parallel_tool_calls false)
      const one = await t.client.messages.create({ ...body, tool_choice: { type: "any", disable_parallel_tool_use: true } });
      assert.deepEqual(one.content.map((b) => (b.type === "tool_use" ? b.input : b.type)), [{ city: "Oslo" }]);
    } finally {
      await t.close();
    }
  });

  it('"auto" (the default with tools) reads the reply with the server\'s tool-call parser', async () => {
    const t = await startScripted({ toolCallParser: "hermes" });
    try {
      t.engine.script = 'Checking. <tool_call>{"name": "get_weather", "arguments": {"city": "Lima"}}</tool_call>';
      const body = { model: MODEL, max_tokens: 200, messages: [{ role: "user" as const, content: "weather?" }], tools: [weather] };
      for (const msg of [await t.client.messages.create(body), await t.client.messages.stream(body).finalMessage()]) {
        assert.deepEqual(msg.content.map((b) => (b.type === "tool_use" ? [b.name, b.input] : b.type === "text" ? b.text : b.type)), ["Checking. ", ["get_weather", { city: "Lima" }]]);
        assert.equal(msg.stop_reason, "tool_use");
      }
      t.engine.script = "No tools needed.";
      const plain = await t.client.messages.create(body);
      assert.deepEqual([plain.content, plain.stop_reason], [[{ type: "text", text: "No tools needed." }], "end_turn"]);
    } finally {
      await t.close();
    }
  });

  it("output_config.format constrains the reply to its JSON schema, as the chat API's json_schema response_format", async () => {
    const t = await startScripted();
    try {
      t.engine.script = '{"answer": 42}';
      const schema = { type: "object", properties: { answer: { type: "integer" } }, required: ["answer"] };
      const msg = await t.client.messages.create({
        model: MODEL, max_tokens: 50, messages: [{ role: "user", content: "answer?" }], output_config: { format: { type: "json_schema", schema } },
      });
      assert.deepEqual(t.engine.lastParams?.structuredOutputs, { json: schema });
      assert.deepEqual([msg.content, msg.stop_reason], [[{ type: "text", text: '{"answer": 42}' }], "end_turn"]);
    } finally {
      await t.close();
    }
  });

  it("with a reasoning parser, the reply's reasoning is a thinking block before its text, whole and streamed", async () => {
    const t = await startScripted({}, "deepseek_r1");
    try {
      t.engine.script = "<think>Paris is in France.</think>It is sunny.";
      const body = { model: MODEL, max_tokens: 200, messages: [{ role: "user" as const, content: "weather?" }] };
      const msg = await t.client.messages.create(body);
      const events: Anthropic.RawMessageStreamEvent[] = [];
      const streamed = await t.client.messages.stream(body).on("streamEvent", (e) => events.push(e)).finalMessage();
      for (const m of [msg, streamed]) {
        assert.deepEqual(m.content.map((b) => (b.type === "thinking" ? ["thinking", b.thinking] : b.type === "text" ? ["text", b.text] : [b.type])), [
          ["thinking", "Paris is in France."],
          ["text", "It is sunny."],
        ]);
        assert.equal(typeof (m.content[0] as Anthropic.ThinkingBlock).signature, "string");
      }
      const deltas = events.flatMap((e) => (e.type === "content_block_delta" ? [`${e.index}:${e.delta.type}`] : []));
      const firstText = deltas.indexOf("1:text_delta");
      assert.ok(deltas.slice(0, firstText).at(-1) === "0:signature_delta", "the thinking block ends with its signature");
    } finally {
      await t.close();
    }
  });

  it("takes the API key as x-api-key (the SDK's) or a Bearer token; a missing one is Anthropic's 401 on /v1/messages", async () => {
    const t = await startScripted({ apiKey: "sekrit" });
    try {
      t.engine.script = "ok";
      const url = `http://127.0.0.1:${(t.app.server.address() as { port: number }).port}`;
      const keyed = new Anthropic({ baseURL: url, apiKey: "sekrit", maxRetries: 0 });
      const msg = await keyed.messages.create({ model: MODEL, max_tokens: 5, messages: [{ role: "user", content: "hi" }] });
      assert.deepEqual(msg.content, [{ type: "text", text: "ok" }]);
      const body = JSON.stringify({ model: MODEL, max_tokens: 5, messages: [{ role: "user", content: "hi" }] });
      const bearer = await fetch(`${url}/v1/messages`, { method: "POST", headers: { "content-type": "application/json", authorization: "Bearer sekrit" }, body });
      assert.equal(bearer.status, 200);
      const missing = await fetch(`${url}/v1/messages`, { method: "POST", headers: { "content-type": "application/json", "x-api-key": "wrong" }, body });
      assert.equal(missing.status, 401);
      const err = (await missing.json()) as { type: string; error: { type: string } };
      assert.deepEqual([err.type, err.error.type], ["error", "authentication_error"]);
      await assert.rejects(t.client.messages.create({ model: MODEL, max_tokens: 5, messages: [{ role: "user", content: "hi" }] }), Anthropic.AuthenticationError);
      // the OpenAI routes keep OpenAI's error object, and take x-api-key too
      const chat = await fetch(`${url}/v1/models`, { headers: { "x-api-key": "sekrit" } });
      assert.equal(chat.status, 200);
      const chatMissing = await fetch(`${url}/v1/models`);
      assert.equal(((await chatMissing.json()) as { error: { type: string } }).error.type, "authentication_error");
    } finally {
      await t.close();
    }
  });
});

describe("Anthropic requests as chat requests", () => {
  it("joins the system blocks (without Claude Code's billing header), reads ctx as user and drops an assistant's thinking", () => {
    const req = parseMessagesRequest({
      model: MODEL,
      max_tokens: 8,
      system: [{ type: "text", text: "x-anthropic-billing-header: cc_version=1; h=abc" }, { type: "text", text: "Be brief. " }, { type: "text", text: "Be kind." }],
      messages: [
        { role: "ctx", content: "context" },
        { role: "assistant", content: [{ type: "thinking", thinking: "hmm", signature: "s" }, { type: "text", text: "a" }, { type: "text", text: "b" }] },
        { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_9", content: "42", is_error: false }] },
        { role: "user", content: "next" },
      ],
      top_k: 0,
      stop_sequences: ["END"],
      metadata: { user_id: "u" },
      thinking: { type: "enabled", budget_tokens: 1024 },
    });
    assert.deepEqual(req.chatBody, {
      model: MODEL,
      messages: [
        { role: "system", content: "Be brief. Be kind." },
        { role: "user", content: "context" },
        { role: "assistant", content: "a\nb" },
        { role: "tool", tool_call_id: "toolu_9", content: "42" },
        { role: "user", content: "next" },
      ],
      max_tokens: 8,
      stop: ["END"],
      stream: false,
    });
    assert.deepEqual(req.stopSequences, ["END"]);
  });

  it("refuses what it cannot serve with a 400 naming the field", () => {
    const base = { model: MODEL, max_tokens: 8 };
    const user = [{ role: "user", content: "x" }];
    const cases: [unknown, string][] = [
      [{ ...base, messages: [{ role: "user", content: [{ type: "document", source: {} }] }] }, "messages[0].content[0].type"],
      [{ ...base, messages: [{ role: "assistant", content: [{ type: "tool_use", id: "t", name: "f", input: [1] }] }] }, "messages[0].content[0].input"],
      [{ ...base, messages: [{ role: "user", content: [{ type: "tool_use", id: "t", name: "f", input: {} }] }] }, "messages[0].content[0].type"],
      [{ ...base, messages: [{ role: "tool", content: "x" }] }, "messages[0].role"],
      [{ ...base, messages: user, tools: [{ type: "web_search_20250305", name: "web_search" }] }, "tools[0].type"],
      [{ ...base, messages: user, tools: [{ name: "f" }] }, "tools[0].input_schema"],
      [{ ...base, messages: user, tool_choice: { type: "tool" } }, "tool_choice.name"],
      [{ ...base, messages: user, tool_choice: { type: "sometimes" } }, "tool_choice.type"],
      [{ ...base, messages: user, thinking: { type: "always" } }, "thinking.type"],
      [{ ...base, messages: user, stop_sequences: "END" }, "stop_sequences"],
      [{ max_tokens: 8, messages: user }, "model"],
    ];
    for (const [body, param] of cases) {
      assert.throws(() => parseMessagesRequest(body), (err: unknown) => err instanceof ApiError && err.status === 400 && err.param === param, JSON.stringify(body));
    }
  });

  it("maps tools and tool_choice to chat's, and continues a final assistant message", () => {
    const tools = [{ name: "f", description: "d", input_schema: { properties: { a: { type: "string" } } } }];
    const chatTools = [{ type: "function", function: { name: "f", description: "d", parameters: { type: "object", properties: { a: { type: "string" } } } } }];
    const choice = (tool_choice: unknown) => parseMessagesRequest({ model: MODEL, max_tokens: 8, messages: [{ role: "user", content: "x" }], tools, tool_choice }).chatBody;
    assert.deepEqual(choice(undefined).tools, chatTools);
    assert.equal(choice(undefined).tool_choice, undefined);
    assert.equal(choice({ type: "auto" }).tool_choice, "auto");
    assert.deepEqual([choice({ type: "any", disable_parallel_tool_use: true }).tool_choice, choice({ type: "any", disable_parallel_tool_use: true }).parallel_tool_calls], ["required", false]);
    assert.equal(choice({ type: "none" }).tool_choice, "none");
    assert.deepEqual(choice({ type: "tool", name: "f" }).tool_choice, { type: "function", function: { name: "f" } });
    const prefill = parseMessagesRequest({ model: MODEL, max_tokens: 8, messages: [{ role: "user", content: "x" }, { role: "assistant", content: "The" }] });
    assert.deepEqual([prefill.chatBody.add_generation_prompt, prefill.chatBody.continue_final_message], [false, true]);
    const harmony = parseMessagesRequest({ model: MODEL, max_tokens: 8, messages: [{ role: "user", content: "x" }, { role: "assistant", content: "The" }] }, { prefill: false });
    assert.equal(harmony.chatBody.continue_final_message, undefined);
  });
});
