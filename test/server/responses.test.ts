// POST /v1/responses over the fake engine: clients that leave abort the engine request (and nothing is stored), an
// engine failure mid-stream ends the stream with an `error` event, ids carry X-Request-Id, unserved fields get 400s
// naming them, and a pooling server refuses the API as it refuses chat.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type OpenAI from "openai";
import { freeBlocks, MODEL, startTestServer, waitFor, type TestServer } from "./helpers.js";

type Event = OpenAI.Responses.ResponseStreamEvent;

describe("/v1/responses over the fake engine", () => {
  let s: TestServer;
  before(async () => {
    s = await startTestServer({}, { stepDelayMs: 5 });
  });
  after(() => s.close());

  const post = (body: unknown, headers: Record<string, string> = {}, signal?: AbortSignal) =>
    fetch(`${s.url}/v1/responses`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify(body),
      signal,
    });

  it("a client that leaves a stream aborts its engine request, frees its blocks, and its response is not stored", async () => {
    const start = await freeBlocks(s.url);
    const aborted = s.engine.aborted.length;
    const controller = new AbortController();
    const stream = await s.client.responses.create(
      {
        model: MODEL,
        input: "a long story",
        max_output_tokens: 200,
        ignore_eos: true,
        stream: true,
      } as OpenAI.Responses.ResponseCreateParamsStreaming,
      { signal: controller.signal, headers: { "x-request-id": "left-stream" } },
    );
    let deltas = 0;
    try {
      for await (const ev of stream) if (ev.type === "response.output_text.delta" && ++deltas === 5) controller.abort();
    } catch (err) {
      assert.equal((err as Error).name, "APIUserAbortError");
    }
    assert.equal(deltas, 5);
    await waitFor(async () => (await freeBlocks(s.url)) === start);
    assert.equal(s.engine.aborted.length, aborted + 1);
    assert.equal((await fetch(`${s.url}/v1/responses/resp_left-stream`)).status, 404);
  });

  it("a client that leaves a whole response aborts it too", async () => {
    const controller = new AbortController();
    const res = post(
      { model: MODEL, input: "wait", max_output_tokens: 200, ignore_eos: true },
      { "x-request-id": "left-whole" },
      controller.signal,
    );
    await waitFor(() => s.engine.stats().numRunning === 1);
    controller.abort();
    await assert.rejects(res);
    await waitFor(() => s.engine.stats().numRunning === 0 && s.app.kilnInflight() === 0);
    assert.equal((await fetch(`${s.url}/v1/responses/resp_left-whole`)).status, 404);
  });

  it("the response id carries the client's X-Request-Id; a finished response is stored under it", async () => {
    const res = await post({ model: MODEL, input: "hi", max_output_tokens: 3, ignore_eos: true }, { "x-request-id": "abc123" });
    assert.equal(res.status, 200);
    const body = (await res.json()) as { id: string; output: unknown[]; usage: { input_tokens: number; output_tokens: number } };
    assert.equal(body.id, "resp_abc123");
    assert.equal(body.usage.input_tokens, "user: hi\nassistant:".length); // the fake tokenizer: one token a character
    assert.equal(body.usage.output_tokens, 3);
    const got = await s.client.responses.retrieve("resp_abc123");
    assert.deepEqual(got.output, body.output);
  });

  it("an engine failure mid-stream ends the stream with an error event", async () => {
    const events: Event[] = [];
    const stream = await s.client.responses.create({
      model: MODEL,
      input: "FAIL_MID_STREAM",
      max_output_tokens: 20,
      ignore_eos: true,
      stream: true,
    } as OpenAI.Responses.ResponseCreateParamsStreaming);
    for await (const ev of stream) events.push(ev);
    const last = events.at(-1) as OpenAI.Responses.ResponseErrorEvent;
    assert.equal(last.type, "error");
    assert.match(last.message, /exploded/);
    assert.equal(last.sequence_number, events.length - 1);
    assert.ok(!events.some((e) => e.type === "response.completed" || e.type === "response.incomplete"));
  });

  it("background: answered at once as queued, runs on, and reads back as the synchronous reply would", async () => {
    const body = { model: MODEL, input: "a background story", max_output_tokens: 12, ignore_eos: true, temperature: 0 };
    const queued = await s.client.responses.create({ ...body, background: true } as OpenAI.Responses.ResponseCreateParamsNonStreaming);
    assert.equal(queued.status, "queued");
    assert.equal(queued.background, true);
    assert.deepEqual(queued.output, []);
    let done = queued;
    await waitFor(async () => ["completed", "incomplete"].includes((done = await s.client.responses.retrieve(queued.id)).status!));
    const sync = await s.client.responses.create(body as OpenAI.Responses.ResponseCreateParamsNonStreaming);
    assert.equal(done.status, sync.status);
    assert.equal(done.output_text, sync.output_text);
    assert.equal(done.output_text.length, 12); // the fake engine: one character a token
    assert.deepEqual(done.usage, sync.usage);
    // it continues like any stored response
    const next = await s.client.responses.create({ model: MODEL, input: "go on", previous_response_id: queued.id, max_output_tokens: 2, ignore_eos: true } as OpenAI.Responses.ResponseCreateParamsNonStreaming);
    assert.equal(next.status, "incomplete");
    await assert.rejects(s.client.responses.cancel(queued.id), (e: { status?: number }) => e.status === 400); // finished
  });

  it("background: cancel stops the engine request, frees its blocks and leaves the response cancelled", async () => {
    const start = await freeBlocks(s.url);
    const aborted = s.engine.aborted.length;
    const queued = await s.client.responses.create(
      { model: MODEL, input: "a long one", max_output_tokens: 500, ignore_eos: true, background: true } as OpenAI.Responses.ResponseCreateParamsNonStreaming,
      { headers: { "x-request-id": "bg-once" } },
    );
    await waitFor(async () => (await s.client.responses.retrieve(queued.id)).status === "in_progress");
    // a second background request under the same X-Request-Id would take the running one's id: refused
    const twin = await post({ model: MODEL, input: "again", background: true }, { "x-request-id": "bg-once" });
    assert.equal(twin.status, 400);
    assert.match(((await twin.json()) as { error: { message: string } }).error.message, /still running/);
    // a running response has no output to continue from yet: refused, not continued without its answer
    await assert.rejects(
      s.client.responses.create({ model: MODEL, input: "go on", previous_response_id: queued.id, max_output_tokens: 2 } as OpenAI.Responses.ResponseCreateParamsNonStreaming),
      (e: { status?: number; error?: { param?: string }; message?: string }) => e.status === 400 && e.error?.param === "previous_response_id" && /in_progress/.test(e.message ?? ""),
    );
    const cancelled = await s.client.responses.cancel(queued.id);
    assert.equal(cancelled.status, "cancelled");
    await waitFor(async () => (await freeBlocks(s.url)) === start);
    assert.equal(s.engine.aborted.length, aborted + 1);
    assert.equal((await s.client.responses.retrieve(queued.id)).status, "cancelled");
    await assert.rejects(s.client.responses.cancel(queued.id), (e: { status?: number; message?: string }) => e.status === 400 && /cancelled/.test(e.message ?? ""));
    // only background responses can be cancelled, and only known ones
    const sync = await s.client.responses.create({ model: MODEL, input: "hi", max_output_tokens: 2, ignore_eos: true } as OpenAI.Responses.ResponseCreateParamsNonStreaming);
    await assert.rejects(s.client.responses.cancel(sync.id), (e: { status?: number; message?: string }) => e.status === 400 && /synchronous/.test(e.message ?? ""));
    await assert.rejects(s.client.responses.cancel("resp_nope"), (e: { status?: number }) => e.status === 404);
  });
});

describe("/v1/responses refusals", () => {
  let s: TestServer;
  before(async () => {
    s = await startTestServer();
  });
  after(() => s.close());

  it("refuses what it does not serve with OpenAI's error object naming the field", async () => {
    const tools = [{ type: "function", name: "f", parameters: { type: "object" } }];
    const cases: [Record<string, unknown>, number, string | null, RegExp][] = [
      [{ model: "nope", input: "x" }, 404, "model", /does not exist/],
      [{ input: "x", tools: [{ type: "web_search" }] }, 400, "tools[0].type", /not supported/],
      // (a text-only model: vLLM's words)
      [
        { input: [{ role: "user", content: [{ type: "input_image", image_url: "http://x/y.png" }] }] },
        400,
        "input[0].content[0].image_url",
        /^At most 0 image\(s\) may be provided in one prompt\.$/,
      ],
      [{ input: [{ role: "user", content: [{ type: "input_file", file_id: "f" }] }] }, 400, "input[0].content[0].type", /input_file/],
      [{ input: [{ type: "item_reference", id: "msg_1" }] }, 400, "input[0].type", /item_reference/],
      [{ input: [{ type: "function_call_output", output: "1" }] }, 400, "input[0].call_id", /call_id/],
      [{ input: "x", background: true, store: false }, 400, "background", /store/],
      [{ input: "x", background: true, stream: true }, 400, "stream", /background/],
      [{ input: "x", conversation: "conv_1" }, 400, "conversation", /conversation/],
      [{ input: "x", include: ["reasoning.encrypted_content"] }, 400, "include[0]", /include/],
      [{ input: "x", include: "message.output_text.logprobs" }, 400, "include", /list/],
      [{ input: "x", top_logprobs: 2 }, 400, "top_logprobs", /include/],
      [{ input: "x", include: ["message.output_text.logprobs"], top_logprobs: 21 }, 400, "top_logprobs", /max allowed: 20/],
      [{ input: "x", truncation: "auto" }, 400, "truncation", /truncation/],
      [{ input: "x", reasoning: { summary: "auto" } }, 400, "reasoning.summary", /summar/],
      [{ input: "x", text: { format: { type: "xml" } } }, 400, "text.format.type", /text\.format/],
      [{ input: "x", text: { format: { type: "json_schema", schema: {} } } }, 400, "text.format.name", /name/],
      [{ input: "x", text: { format: { type: "json_schema", name: "x", schema: {}, strict: "yes" } } }, 400, "text.format.strict", /'text\.format\.strict' must be a boolean/],
      [{ input: "x", tool_choice: { type: "web_search_preview" } }, 400, "tool_choice", /tool_choice/],
      [{ input: "x", tool_choice: "required" }, 400, "tool_choice", /tools/],
      [{ input: "x", tools, tool_choice: "auto" }, 400, "tool_choice", /enable-auto-tool-choice/],
      [{ input: "x", tools, tool_choice: { type: "function", name: "g" } }, 400, "tool_choice", /'g'/],
      [{ input: "x", max_output_tokens: 0 }, 400, "max_output_tokens", /max_output_tokens/],
      [{ input: "x", max_tokens: 5 }, 400, "max_tokens", /max_output_tokens/],
      [{ messages: [{ role: "user", content: "x" }] }, 400, "messages", /input/],
      [{ input: "x", service_tier: "flex" }, 400, "service_tier", /flex/],
      [{ input: "x", metadata: { k: 1 } }, 400, "metadata", /metadata/],
      [{ input: "x", stream_options: {} }, 400, "stream_options", /stream/],
      [{ input: [] }, 400, "input", /input/],
      [{ input: "x ".repeat(200) }, 400, "input", /maximum context length/],
      [{ input: "x", previous_response_id: "resp_nope" }, 404, "previous_response_id", /not found/],
    ];
    for (const [body, status, param, message] of cases) {
      const res = await fetch(`${s.url}/v1/responses`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: MODEL, ...body }),
      });
      assert.equal(res.status, status, JSON.stringify(body));
      const err = ((await res.json()) as { error: { type: string; param: string | null; message: string } }).error;
      assert.equal(err.type, status === 404 && param === "model" ? "not_found_error" : "invalid_request_error", JSON.stringify(body));
      assert.equal(err.param, param, JSON.stringify(body));
      assert.match(err.message, message);
    }
    const streamed = await fetch(`${s.url}/v1/responses/resp_x?stream=true`);
    assert.equal(streamed.status, 400);
  });

  it("caps max_output_tokens by the room the prompt leaves, as vLLM does", async () => {
    const input = "x".repeat(200);
    const r = await s.client.responses.create({
      model: MODEL,
      input,
      max_output_tokens: 100_000,
      ignore_eos: true,
    } as OpenAI.Responses.ResponseCreateParamsNonStreaming);
    const promptLen = `user: ${input}\nassistant:`.length; // the fake tokenizer: one token a character
    assert.equal(r.usage!.input_tokens, promptLen);
    assert.equal(r.max_output_tokens, 256 - promptLen);
    assert.equal(r.usage!.output_tokens, 256 - promptLen);
    assert.equal(r.status, "incomplete");
  });
});

describe("/v1/responses on a pooling server", () => {
  let s: TestServer;
  before(async () => {
    s = await startTestServer({ runner: "pooling" });
  });
  after(() => s.close());

  it("is refused with 400, as chat is", async () => {
    for (const [method, path] of [
      ["POST", "/v1/responses"],
      ["GET", "/v1/responses/resp_x"],
    ] as const) {
      const res = await fetch(`${s.url}${path}`, {
        method,
        ...(method === "POST"
          ? { headers: { "content-type": "application/json" }, body: JSON.stringify({ model: MODEL, input: "x" }) }
          : {}),
      });
      assert.equal(res.status, 400);
      const err = ((await res.json()) as { error: { message: string; type: string } }).error;
      assert.equal(err.type, "invalid_request_error");
      assert.match(err.message, /does not support Responses API/);
    }
  });
});
