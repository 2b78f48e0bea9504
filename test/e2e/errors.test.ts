// Every error status of a real `kiln serve`, as OpenAI's error object, without ever taking the server down.
// Server `limited`: --max-model-len 64 --max-num-seqs 1 --max-waiting-requests 1. Server `keyed`: --api-key.
import assert from "node:assert/strict";
import { after, afterEach, before, describe, it } from "node:test";
import OpenAI from "openai";
import { assertErrorBody, postRaw, startKiln, type KilnServer } from "./kiln-process.js";

let limited: KilnServer;
let keyed: KilnServer;
const KEY = "sk-kiln-e2e";
const LONG_PROMPT = "The quick brown fox jumps over the lazy dog. ".repeat(12); // well over 64 tokens

before(async () => {
  [limited, keyed] = await Promise.all([
    startKiln(["--max-model-len", "64", "--max-num-seqs", "1", "--max-waiting-requests", "1"]),
    startKiln(["--api-key", KEY]),
  ]);
});
after(async () => {
  assert.deepEqual(await Promise.all([limited.stop(), keyed.stop()]), [0, 0]);
});
afterEach(async () => {
  for (const s of [limited, keyed]) assert.equal((await fetch(`${s.url}/health`)).status, 200, "server still healthy");
});

/** Runs `fn` expecting the typed client to throw an APIError with `status`; returns it. */
async function apiError(status: number, fn: () => Promise<unknown>): Promise<InstanceType<typeof OpenAI.APIError>> {
  try {
    await fn();
  } catch (err) {
    assert.ok(err instanceof OpenAI.APIError, String(err));
    assert.equal(err.status, status, err.message);
    return err;
  }
  assert.fail(`expected HTTP ${status}`);
}

describe("kiln serve error statuses (e2e)", () => {
  it("400 for invalid fields, naming the param (also for stream requests)", async () => {
    const cases: [Record<string, unknown>, string][] = [
      [{ temperature: -1 }, "temperature"],
      [{ n: 0 }, "n"],
      [{ max_tokens: "x" }, "max_tokens"],
      [{ max_tokens: 0 }, "max_tokens"],
      [{ top_p: 1.5 }, "top_p"],
      [{ logprobs: 21 }, "logprobs"],
      [{ temperature: -1, stream: true }, "temperature"],
      [{ stream_options: { include_usage: true } }, "stream_options"],
      [{ prompt: [1, 2, 100000] }, "prompt"],
      [{ prompt: 7 }, "prompt"],
    ];
    for (const [fields, param] of cases) {
      const r = await postRaw(limited.url, "/v1/completions", { model: limited.model, prompt: "hi", max_tokens: 4, ...fields });
      assert.equal(r.status, 400, JSON.stringify(fields));
      assertErrorBody(r.body, { type: "invalid_request_error", param, code: null });
    }
    const chat = await postRaw(limited.url, "/v1/chat/completions", { model: limited.model, messages: [], max_tokens: 4 });
    assert.equal(chat.status, 400);
    assertErrorBody(chat.body, { type: "invalid_request_error", param: "messages" });
    // Through the typed client: BadRequestError carrying the same object.
    const err = await apiError(400, () => limited.client().completions.create({ model: limited.model, prompt: "hi", temperature: -1 }));
    assert.ok(err instanceof OpenAI.BadRequestError);
    assert.equal(err.param, "temperature");
    assert.equal(err.type, "invalid_request_error");
  });

  it("400 when the prompt (or prompt + max_tokens) exceeds --max-model-len 64", async () => {
    const tooLong = await postRaw(limited.url, "/v1/completions", { model: limited.model, prompt: LONG_PROMPT, max_tokens: 4 });
    assert.equal(tooLong.status, 400);
    assertErrorBody(tooLong.body, { type: "invalid_request_error", param: "prompt", message: /maximum context length is 64 tokens/ });
    const chat = await postRaw(limited.url, "/v1/chat/completions", { model: limited.model, messages: [{ role: "user", content: LONG_PROMPT }] });
    assert.equal(chat.status, 400);
    assertErrorBody(chat.body, { type: "invalid_request_error", param: "messages", message: /maximum context length is 64 tokens/ });
    const room = await postRaw(limited.url, "/v1/completions", { model: limited.model, prompt: "hi", max_tokens: 64 });
    assert.equal(room.status, 400);
    assertErrorBody(room.body, { type: "invalid_request_error", param: "max_tokens", message: /maximum context length is 64 tokens/ });
    // Without max_tokens a completion gets OpenAI's default of 16 tokens, or the rest of the context when less is left.
    const dflt = (await postRaw(limited.url, "/v1/completions", { model: limited.model, prompt: "hi", ignore_eos: true })).body as OpenAI.Completion;
    assert.equal(dflt.usage!.completion_tokens, 16);
    assert.equal(dflt.choices[0]!.finish_reason, "length");
    // An explicit null is vLLM's None: the room left (this model's generation config sets no max_new_tokens).
    const none = (await postRaw(limited.url, "/v1/completions", { model: limited.model, prompt: "hi", max_tokens: null, ignore_eos: true })).body as OpenAI.Completion;
    assert.equal(none.usage!.total_tokens, 64);
    const ids = Array.from({ length: 60 }, (_, i) => 100 + i);
    const fill = (await postRaw(limited.url, "/v1/completions", { model: limited.model, prompt: ids, ignore_eos: true })).body as OpenAI.Completion;
    assert.equal(fill.usage!.prompt_tokens, 60);
    assert.equal(fill.usage!.total_tokens, 64);
    assert.equal(fill.choices[0]!.finish_reason, "length");
  });

  it("truncate_prompt_tokens serves a prompt over --max-model-len 64 as its last tokens given directly", async () => {
    const { tokens } = (await postRaw(limited.url, "/tokenize", { model: limited.model, prompt: LONG_PROMPT })).body as { tokens: number[] };
    assert.ok(tokens.length > 64);
    const ask = { model: limited.model, max_tokens: 4, temperature: 0, ignore_eos: true };
    const cut = (await postRaw(limited.url, "/v1/completions", { ...ask, prompt: LONG_PROMPT, truncate_prompt_tokens: 20 })).body as OpenAI.Completion;
    const direct = (await postRaw(limited.url, "/v1/completions", { ...ask, prompt: tokens.slice(-20) })).body as OpenAI.Completion;
    assert.equal(cut.usage!.prompt_tokens, 20, JSON.stringify(cut));
    assert.equal(cut.choices[0]!.text, direct.choices[0]!.text);
  });

  it("401 without a valid API key; /health and /metrics stay open", async () => {
    for (const headers of [{}, { authorization: "Bearer wrong" }, { authorization: KEY }] as Record<string, string>[]) {
      const r = await postRaw(keyed.url, "/v1/completions", { model: keyed.model, prompt: "hi", max_tokens: 2 }, headers);
      assert.equal(r.status, 401, JSON.stringify(headers));
      assertErrorBody(r.body, { type: "authentication_error", param: null, code: "invalid_api_key" });
    }
    const models = await fetch(`${keyed.url}/v1/models`);
    assert.equal(models.status, 401);
    await apiError(401, () => keyed.client({ apiKey: "wrong" }).models.list());
    assert.equal((await fetch(`${keyed.url}/health`)).status, 200);
    const metrics = await fetch(`${keyed.url}/metrics`);
    assert.equal(metrics.status, 200);
    assert.match(await metrics.text(), /^kiln:kv_cache_free_blocks\{/m);
    const ok = await keyed.client({ apiKey: KEY }).completions.create({ model: keyed.model, prompt: "hi", max_tokens: 3, ignore_eos: true } as OpenAI.CompletionCreateParamsNonStreaming);
    assert.equal(ok.usage!.completion_tokens, 3);
  });

  it("404 for an unknown model and for an unknown route", async () => {
    const err = await apiError(404, () => limited.client().chat.completions.create({ model: "gpt-4o", messages: [{ role: "user", content: "hi" }] }));
    assert.ok(err instanceof OpenAI.NotFoundError);
    const r = await postRaw(limited.url, "/v1/completions", { model: "gpt-4o", prompt: "hi" });
    assert.equal(r.status, 404);
    assertErrorBody(r.body, { type: "not_found_error", param: "model", code: "model_not_found", message: /gpt-4o/ });
    const route = await fetch(`${limited.url}/v1/engines?x=1`);
    assert.equal(route.status, 404);
    assertErrorBody(await route.json(), { type: "not_found_error", param: null, message: /GET \/v1\/engines not found/ });
    const post = await postRaw(limited.url, "/v1/images/generations", { prompt: "hi" });
    assert.equal(post.status, 404);
    assertErrorBody(post.body, { type: "not_found_error" });
  });

  it("413 for a body over the 32 MiB limit", async () => {
    const r = await postRaw(limited.url, "/v1/completions", { model: limited.model, prompt: "x".repeat(33 * 2 ** 20) });
    assert.equal(r.status, 413);
    assertErrorBody(r.body, { type: "invalid_request_error", param: null, code: "request_too_large" });
    // The client, still uploading when the server answers, reads the 413 instead of a reset connection.
    const err = await apiError(413, () => limited.client().completions.create({ model: limited.model, prompt: "y".repeat(33 * 2 ** 20) }));
    assert.equal(err.code, "request_too_large");
  });

  it("400 for malformed JSON and non-object bodies; 415 for other media types", async () => {
    const bad = await fetch(`${limited.url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: '{"messages": [' });
    assert.equal(bad.status, 400);
    assertErrorBody(await bad.json(), { type: "invalid_request_error", param: null, code: "invalid_json" });
    const empty = await fetch(`${limited.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: "" });
    assert.equal(empty.status, 400);
    assertErrorBody(await empty.json(), { type: "invalid_request_error", code: "invalid_json" });
    const list = await postRaw(limited.url, "/v1/completions", [1, 2]);
    assert.equal(list.status, 400);
    assertErrorBody(list.body, { type: "invalid_request_error", param: null });
    const text = await fetch(`${limited.url}/v1/completions`, { method: "POST", headers: { "content-type": "text/plain" }, body: "hi" });
    assert.equal(text.status, 400); // fastify parses text/plain as a string: not a JSON object
    assertErrorBody(await text.json(), { type: "invalid_request_error", param: null, message: /must be a JSON object/ });
    const form = await fetch(`${limited.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/x-www-form-urlencoded" }, body: "a=1" });
    assert.equal(form.status, 415);
    assertErrorBody(await form.json(), { type: "invalid_request_error", code: "unsupported_media_type" });
  });

  it("503 once --max-waiting-requests are waiting (max-num-seqs 1); accepted requests still finish", async () => {
    const body = { model: limited.model, prompt: "hi", max_tokens: 60, ignore_eos: true };
    // One request running (its first token is out), then a burst: one more may wait, the rest are turned away.
    const running = await limited.client().completions.create({ ...body, stream: true } as OpenAI.CompletionCreateParamsStreaming);
    const it = running[Symbol.asyncIterator]();
    assert.equal((await it.next()).done, false);
    const burst = await Promise.all(Array.from({ length: 7 }, () => postRaw(limited.url, "/v1/completions", body)));
    let finish: string | null = null;
    for (let r = await it.next(); !r.done; r = await it.next()) finish = r.value.choices[0]?.finish_reason ?? finish;
    assert.equal(finish, "length");
    const ok = burst.filter((r) => r.status === 200);
    const rejected = burst.filter((r) => r.status !== 200);
    assert.ok(ok.length >= 1, "the first of the burst waits and is served");
    assert.ok(rejected.length >= 4, `only ${rejected.length} of 7 turned away`);
    for (const r of ok) assert.deepEqual((r.body as OpenAI.Completion).choices.map((c) => c.finish_reason), ["length"]);
    for (const r of rejected) {
      assert.equal(r.status, 503);
      assertErrorBody(r.body, { type: "service_unavailable_error", param: null, code: "queue_full", message: /overloaded/ });
    }
    const viaClient = await Promise.allSettled(Array.from({ length: 4 }, () => limited.client().completions.create(body as OpenAI.CompletionCreateParamsNonStreaming)));
    const errors = viaClient.filter((r) => r.status === "rejected").map((r) => (r as PromiseRejectedResult).reason as InstanceType<typeof OpenAI.APIError>);
    assert.ok(errors.length >= 1);
    for (const e of errors) {
      assert.ok(e instanceof OpenAI.InternalServerError, String(e));
      assert.equal(e.status, 503);
      assert.equal(e.code, "queue_full");
    }
    assert.equal(await limited.metric("vllm:num_requests_waiting"), 0);
    assert.equal(await limited.metric("vllm:num_requests_running"), 0);
    assert.equal((await postRaw(limited.url, "/v1/completions", { ...body, max_tokens: 4 })).status, 200);
    // one request of two prompts is two engine requests: more than the one that may wait
    const two = await postRaw(limited.url, "/v1/completions", { ...body, prompt: ["hi", "there"], max_tokens: 4 });
    assert.equal(two.status, 503);
    assertErrorBody(two.body, { type: "service_unavailable_error", code: "queue_full", message: /this request has 2 inputs/ });
  });

  it("both servers are still the same live processes", () => {
    for (const s of [limited, keyed]) assert.doesNotMatch(s.log(), /Server stopped|exited/);
  });
});
