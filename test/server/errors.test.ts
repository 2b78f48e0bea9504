// Every error path answers with OpenAI's error object and the right status, and the server stays up.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { MODEL, startTestServer, type TestServer } from "./helpers.js";

async function post(url: string, body: string | object, headers: Record<string, string> = {}) {
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, text, json: text ? (JSON.parse(text) as any) : null };
}

function assertError(r: { status: number; json: any; text: string }, status: number, param?: string | null): void {
  assert.equal(r.status, status, r.text);
  assert.equal(typeof r.json.error.message, "string");
  assert.equal(typeof r.json.error.type, "string");
  assert.ok("param" in r.json.error && "code" in r.json.error);
  if (param !== undefined) assert.equal(r.json.error.param, param);
  assert.ok(!r.text.includes("    at "), "no stack traces");
}

describe("errors", () => {
  let s: TestServer;
  const chat = () => `${s.url}/v1/chat/completions`;
  const completions = () => `${s.url}/v1/completions`;
  const msgs = [{ role: "user", content: "hi" }];
  before(async () => {
    s = await startTestServer({ bodyLimit: 64 * 1024, maxWaitingRequests: 4, trustRequestChatTemplate: true });
  });
  after(() => s.close());

  const badFields: [string, object, string][] = [
    ["temperature", { temperature: -1 }, "temperature"],
    ["temperature type", { temperature: "hot" }, "temperature"],
    ["top_p", { top_p: 0 }, "top_p"],
    ["n", { n: 0 }, "n"],
    ["max_tokens", { max_tokens: 0 }, "max_tokens"],
    ["max_tokens float", { max_tokens: 1.5 }, "max_tokens"],
    ["stop", { stop: 5 }, "stop"],
    ["empty stop string", { stop: ["x", ""] }, "stop"],
    ["presence_penalty", { presence_penalty: 3 }, "presence_penalty"],
    ["logit_bias", { logit_bias: { "99999": 1 } }, "logit_bias"],
    ["logit_bias empty key (not token 0)", { logit_bias: { "": 1 } }, "logit_bias"],
    ["logit_bias hex key", { logit_bias: { "0x10": 1 } }, "logit_bias"],
    ["top_logprobs without logprobs", { top_logprobs: 2 }, "top_logprobs"],
    ["top_logprobs range", { logprobs: true, top_logprobs: 50 }, "top_logprobs"],
    ["top_logprobs below -1", { logprobs: true, top_logprobs: -2 }, "top_logprobs"],
    ["top_logprobs -1 (the vocabulary) over --max-logprobs", { logprobs: true, top_logprobs: -1 }, "top_logprobs"],
    ["stream_options without stream", { stream_options: { include_usage: true } }, "stream_options"],
    ["min_p", { min_p: 2 }, "min_p"],
    ["repetition_penalty", { repetition_penalty: 0 }, "repetition_penalty"],
    ["stop_token_ids", { stop_token_ids: [1e9] }, "stop_token_ids"],
    ["both template flags", { add_generation_prompt: true, continue_final_message: true }, "continue_final_message"],
    ["max_tokens beyond context", { max_tokens: 1000 }, "max_tokens"],
    ["max_completion_tokens beyond context", { max_completion_tokens: 1000 }, "max_completion_tokens"],
    ["vllm_xargs type", { vllm_xargs: "x" }, "vllm_xargs"],
    ["vllm_xargs list", { vllm_xargs: [1] }, "vllm_xargs"],
    ["vllm_xargs value", { vllm_xargs: { a: { b: 1 } } }, "vllm_xargs"],
    ["vllm_xargs nested list", { vllm_xargs: { a: [[1]] } }, "vllm_xargs"],
    ["prompt_logprobs with stream", { prompt_logprobs: 1, stream: true }, "prompt_logprobs"],
    ["logprobs with beam search (it returns none)", { use_beam_search: true, logprobs: true, top_logprobs: 1 }, "logprobs"],
  ];
  for (const [name, extra, param] of badFields) {
    it(`400 for bad ${name}`, async () => assertError(await post(chat(), { model: MODEL, messages: msgs, ...extra }), 400, param));
  }

  it("400 for bad messages and prompts", async () => {
    assertError(await post(chat(), { model: MODEL, messages: [] }), 400, "messages");
    assertError(await post(chat(), { model: MODEL, messages: [{ role: "user", content: [{ type: "image_url" }] }] }), 400);
    assertError(await post(completions(), { model: MODEL }), 400, "prompt");
    assertError(await post(completions(), { model: MODEL, prompt: [1, "a"] }), 400, "prompt");
    assertError(await post(completions(), { model: MODEL, prompt: [100000] }), 400, "prompt");
    assertError(await post(completions(), { model: MODEL, prompt: "x", logprobs: 99 }), 400, "logprobs");
    assertError(await post(completions(), { model: MODEL, prompt: "x", logprobs: 0, use_beam_search: true }), 400, "logprobs");
    const vocabLogprobs = await post(completions(), { model: MODEL, prompt: "x", logprobs: -1 });
    assertError(vocabLogprobs, 400, "logprobs");
    assert.match(vocabLogprobs.json.error.message, /logprobs of \d+, which is greater than max allowed: 20/, "-1 reads as the vocabulary size");
    // a stream has nowhere to carry prompt logprobs (vLLM refuses them rather than drop them); echo's still stream
    assertError(await post(completions(), { model: MODEL, prompt: "x", stream: true, prompt_logprobs: -1 }), 400, "prompt_logprobs");
    const echo = await fetch(completions(), {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, prompt: "x", stream: true, echo: true, logprobs: 1, max_tokens: 2 }),
    });
    assert.equal(echo.status, 200);
    assert.match(await echo.text(), /"tokens":\["<s>","x"/);
    assertError(await post(chat(), { model: MODEL, messages: msgs, chat_template: "broken" }), 400, "messages");
  });

  it("400 for malformed structured output and tool choices; auto tool choice (no tool-call parser) is refused", async () => {
    const tool = { type: "function", function: { name: "get_weather", parameters: { type: "object", properties: {} } } };
    const cases: [string, object, string, RegExp][] = [
      [chat(), { response_format: { type: "json_schema" } }, "response_format", /must be given/],
      [chat(), { response_format: { type: "json_schema", json_schema: { name: "x", schema: [] } } }, "response_format", /JSON schema object/],
      [chat(), { response_format: { type: "json_schema", json_schema: { schema: {} } } }, "response_format", /name' must be a non-empty string/],
      [chat(), { response_format: { type: "json_schema", json_schema: { name: "x", schema: {}, strict: "yes" } } }, "response_format", /'response_format.json_schema.strict' must be a boolean/],
      [completions(), { response_format: { type: "json_schema", json_schema: { name: "x", schema: {}, strict: 1 } } }, "response_format", /strict' must be a boolean/],
      [chat(), { structured_outputs: { regex: "a", whitespace_pattern: " " } }, "structured_outputs", /not supported by the xgrammar backend/],
      [completions(), { guided_json: { type: "object" }, guided_whitespace_pattern: " " }, "guided_whitespace_pattern", /not supported by the xgrammar backend/],
      [chat(), { response_format: { type: "bogus" } }, "response_format", /must be one of/],
      [completions(), { response_format: { type: "structural_tag" } }, "response_format", /needs 'format'/],
      [chat(), { structured_outputs: { regexp: "a" } }, "structured_outputs", /not supported/],
      [chat(), { guided_regex: "a", structured_outputs: { regex: "b" } }, "guided_regex", /given twice/],
      // a refusal names the wire (snake_case) field the user sent
      [chat(), { response_format: { type: "json_object" }, structured_outputs: { json_object: true } }, "structured_outputs", /'json_object' is given twice/],
      [chat(), { guided_regex: "a", guided_decoding_backend: "outlines" }, "guided_decoding_backend", /xgrammar/],
      [chat(), { tools: [tool] }, "tool_choice", /"auto" tool choice/],
      [chat(), { tools: [tool], tool_choice: "auto" }, "tool_choice", /"auto" tool choice/],
      [chat(), { tools: [tool], tool_choice: "required", response_format: { type: "json_object" } }, "tool_choice", /cannot be combined/],
      [chat(), { tools: [tool], tool_choice: { type: "function", function: { name: "other" } } }, "tool_choice", /has not been passed/],
      [chat(), { tools: [tool], tool_choice: "banana" }, "tool_choice", /must be "none"/],
      [chat(), { tool_choice: "required" }, "tool_choice", /`tools` must be set/],
      [chat(), { tools: [] }, "tools", /empty/],
      [chat(), { tools: [{ type: "function" }] }, "tools", /must be/],
      [chat(), { tools: [{ type: "function", function: { name: "f", parameters: "x" } }] }, "tools", /JSON schema object/],
      [chat(), {
        tools: [
          { type: "function", function: { name: "f", parameters: { $defs: { D: { type: "string" } } } } },
          { type: "function", function: { name: "g", parameters: { $defs: { D: { type: "integer" } } } } },
        ],
        tool_choice: "required",
      }, "tools", /Tool definition 'D' has multiple schemas/],
    ];
    for (const [url, extra, param, message] of cases) {
      const body = url === chat() ? { model: MODEL, messages: msgs, max_tokens: 2, ...extra } : { model: MODEL, prompt: "hi", max_tokens: 2, ...extra };
      const r = await post(url, body);
      assertError(r, 400, param);
      assert.match(r.json.error.message, message, JSON.stringify(extra));
    }
    // Plain text: tool_choice "none" and response_format "text".
    for (const extra of [{ tools: [tool], tool_choice: "none" }, { response_format: { type: "text" } }]) {
      const r = await post(chat(), { model: MODEL, messages: msgs, max_tokens: 2, ...extra });
      assert.equal(r.status, 200, r.text);
      assert.equal(typeof r.json.choices[0].message.content, "string");
      assert.deepEqual(r.json.choices[0].message.tool_calls, []);
    }
  });

  it("400 when the prompt is longer than max_model_len", async () => {
    assertError(await post(completions(), { model: MODEL, prompt: "x".repeat(300) }), 400, "prompt");
    const client = s.client;
    await assert.rejects(
      client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "y".repeat(400) }] }),
      (e: unknown) => e instanceof OpenAI.BadRequestError && /maximum context length/.test(e.message),
    );
  });

  it("400 for malformed JSON and non-object bodies", async () => {
    assertError(await post(chat(), "{not json"), 400);
    assertError(await post(chat(), "[1,2]"), 400);
  });

  it("reads a body sent without a content type, or as application/*+json, as JSON (vLLM's FastAPI); 415 for other types", async () => {
    const body = JSON.stringify({ model: MODEL, prompt: "hi", max_tokens: 2 });
    // (fetch sends bytes with no content-type header)
    const untyped = await fetch(completions(), { method: "POST", body: new TextEncoder().encode(body) });
    assert.equal(untyped.status, 200, await untyped.clone().text());
    assert.equal(((await untyped.json()) as any).object, "text_completion");
    const typed = await post(completions(), body, { "content-type": "application/vnd.api+json; charset=utf-8" });
    assert.equal(typed.status, 200, typed.text);
    const form = await post(completions(), "a=1", { "content-type": "application/x-www-form-urlencoded" });
    assertError(form, 415);
    assert.equal(form.json.error.code, "unsupported_media_type");
  });

  it("404 for an unknown model and an unknown route", async () => {
    await assert.rejects(s.client.chat.completions.create({ model: "nope", messages: [{ role: "user", content: "x" }] }), OpenAI.NotFoundError);
    const r = await post(completions(), { model: "nope", prompt: "x" });
    assertError(r, 404, "model");
    assertError(await post(`${s.url}/v1/nothing`, {}), 404);
    const g = await fetch(`${s.url}/nowhere`);
    assert.equal(g.status, 404);
    assert.equal(((await g.json()) as any).error.type, "not_found_error");
  });

  it("405 with Allow for a known route asked with another method", async () => {
    for (const [method, path, allow] of [["GET", "/v1/chat/completions", "POST"], ["DELETE", "/v1/models", "GET"], ["PUT", "/tokenize", "POST"], ["GET", "/v1/completions/", "POST"]]) {
      const r = await fetch(`${s.url}${path}`, { method });
      assert.equal(r.status, 405, `${method} ${path}`);
      assert.equal(r.headers.get("allow"), allow);
      const body = (await r.json()) as any;
      assert.equal(body.error.code, "method_not_allowed");
      assert.equal(body.error.type, "invalid_request_error");
    }
    assert.equal((await fetch(`${s.url}/v1/models`)).status, 200, "the server still answers");
  });

  it("413 for a body over the limit", async () => {
    assertError(await post(completions(), { model: MODEL, prompt: "x".repeat(100 * 1024) }), 413);
  });

  it("503 when the waiting queue is full", async () => {
    s.engine.forcedWaiting = 4;
    try {
      const r = await post(chat(), { model: MODEL, messages: msgs });
      assertError(r, 503);
      assert.equal(r.json.error.code, "queue_full");
    } finally {
      s.engine.forcedWaiting = 0;
    }
  });

  it("an engine failing mid-stream ends the stream with an error event; the server lives on", async () => {
    const res = await fetch(chat(), {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "FAIL_MID_STREAM" }], stream: true, ignore_eos: true }),
    });
    assert.equal(res.status, 200);
    const text = await res.text();
    assert.match(text, /data: \{"error":\{"message":"Internal server error: fake engine exploded"/);
    assert.ok(text.trimEnd().endsWith("data: [DONE]"));
    const ok = await post(chat(), { model: MODEL, messages: msgs, max_tokens: 2 });
    assert.equal(ok.status, 200);
  });

  it("a non-streaming engine failure is a 500 error object", async () => {
    assertError(await post(chat(), { model: MODEL, messages: [{ role: "user", content: "FAIL_MID_STREAM" }], ignore_eos: true }), 500);
  });
});

describe("a dead engine", () => {
  it("/health and SageMaker's /ping (GET and POST) answer 503 once the engine has died, as vLLM's on EngineDeadError", async () => {
    const s = await startTestServer();
    const probes = () => Promise.all([
      fetch(`${s.url}/health`), fetch(`${s.url}/ping`), fetch(`${s.url}/ping`, { method: "POST" }),
    ].map(async (r) => (await r).status));
    try {
      assert.deepEqual(await probes(), [200, 200, 200]);
      Object.assign(s.engine, { deadError: () => new Error("[tensor_parallel] rank 1 (pid 1) exited (SIGKILL)") });
      assert.deepEqual(await probes(), [503, 503, 503]);
    } finally {
      await s.close();
    }
  });
});

describe("auth and CORS", () => {
  let s: TestServer;
  before(async () => {
    s = await startTestServer({ apiKey: "sekret", allowedOrigins: ["http://ok.example"] });
  });
  after(() => s.close());

  it("401 without or with a wrong key under /v1; other routes stay open, as vLLM's AuthenticationMiddleware leaves them", async () => {
    const bad = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: "wrong", maxRetries: 0 });
    await assert.rejects(bad.models.list(), OpenAI.AuthenticationError);
    const none = await fetch(`${s.url}/v1/models`);
    assert.equal(none.status, 401);
    assert.equal(((await none.json()) as any).error.code, "invalid_api_key");
    assert.equal((await s.client.models.list()).data.length, 2);
    for (const path of ["/health", "/metrics", "/version", "/ping", "/load"]) assert.equal((await fetch(`${s.url}${path}`)).status, 200, path);
    const open = await fetch(`${s.url}/tokenize`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: "hi" }) });
    assert.equal(open.status, 200, "/tokenize is not under /v1");
    assert.equal((await fetch(`${s.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" })).status, 401);
    // the scheme in any case, as vLLM compares it
    assert.equal((await fetch(`${s.url}/v1/models`, { headers: { authorization: "bearer sekret" } })).status, 200);
  });

  it("CORS headers for allowed origins and preflight", async () => {
    const pre = await fetch(`${s.url}/v1/chat/completions`, {
      method: "OPTIONS",
      headers: { origin: "http://ok.example", "access-control-request-method": "POST", "access-control-request-headers": "authorization" },
    });
    // Starlette's CORSMiddleware (vLLM's): 200 "OK", the origin named back, any method and the requested headers
    assert.equal(pre.status, 200);
    assert.equal(await pre.text(), "OK");
    assert.equal(pre.headers.get("access-control-allow-origin"), "http://ok.example");
    assert.equal(pre.headers.get("access-control-allow-methods"), "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT");
    assert.equal(pre.headers.get("access-control-allow-headers"), "authorization");
    assert.equal(pre.headers.get("access-control-allow-credentials"), null);
    const other = await fetch(`${s.url}/health`, { headers: { origin: "http://evil.example" } });
    assert.equal(other.headers.get("access-control-allow-origin"), null);
    const ok = await fetch(`${s.url}/health`, { headers: { origin: "http://ok.example" } });
    assert.equal(ok.headers.get("access-control-allow-origin"), "http://ok.example");
    const evil = await fetch(`${s.url}/v1/models`, { method: "OPTIONS", headers: { origin: "http://evil.example", "access-control-request-method": "GET" } });
    assert.deepEqual([evil.status, await evil.text()], [400, "Disallowed CORS origin"]);
  });

  it("--allow-credentials, --allowed-methods and --allowed-headers as Starlette's CORSMiddleware takes them", async () => {
    const c = await startTestServer({ allowedOrigins: ["*"], cors: { allowCredentials: true, allowedMethods: ["GET", "POST"], allowedHeaders: ["Authorization"] } });
    try {
      const preflight = (method: string, headers?: string) =>
        fetch(`${c.url}/v1/chat/completions`, {
          method: "OPTIONS",
          headers: { origin: "http://app.example", "access-control-request-method": method, ...(headers ? { "access-control-request-headers": headers } : {}) },
        });
      const pre = await preflight("POST", "Authorization, Content-Type");
      assert.deepEqual([pre.status, await pre.text()], [200, "OK"]);
      // credentials: the origin named back (never "*"), and the listed headers with the safelisted ones
      assert.equal(pre.headers.get("access-control-allow-origin"), "http://app.example");
      assert.equal(pre.headers.get("access-control-allow-credentials"), "true");
      assert.equal(pre.headers.get("access-control-allow-methods"), "GET, POST");
      assert.equal(pre.headers.get("access-control-allow-headers"), "accept, accept-language, authorization, content-language, content-type");
      const put = await preflight("PUT", "X-Custom");
      assert.deepEqual([put.status, await put.text()], [400, "Disallowed CORS method, headers"]);
      const simple = await fetch(`${c.url}/health`, { headers: { origin: "http://app.example" } });
      assert.equal(simple.headers.get("access-control-allow-origin"), "*");
      assert.equal(simple.headers.get("access-control-allow-credentials"), "true");
      const cookie = await fetch(`${c.url}/health`, { headers: { origin: "http://app.example", cookie: "a=b" } });
      assert.equal(cookie.headers.get("access-control-allow-origin"), "http://app.example");
    } finally {
      await c.close();
    }
  });
});
