// GET /load and --enable-server-load-tracking (vLLM's): the requests in flight on the engine's endpoints, counted from
// their handler's start until their response ends, whether it ends in an error, a finished stream or a client gone.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { MODEL, startTestServer, waitFor, type TestServer } from "./helpers.js";

const load = async (s: TestServer): Promise<number> => {
  const res = await fetch(`${s.url}/load`);
  assert.equal(res.status, 200);
  const body = (await res.json()) as { server_load: number };
  assert.deepEqual(Object.keys(body), ["server_load"]);
  return body.server_load;
};

const post = (s: TestServer, path: string, body: object, signal?: AbortSignal) =>
  fetch(`${s.url}${path}`, { method: "POST", headers: { "content-type": "application/json", authorization: "Bearer k" }, body: JSON.stringify({ model: MODEL, ...body }), signal });

/** Starts a streamed completion of `maxTokens` slow tokens and reads its first event; returns its body reader. */
async function startStream(s: TestServer, path = "/v1/completions", extra: object = {}, signal?: AbortSignal) {
  const res = await post(s, path, { prompt: "count", max_tokens: 40, ignore_eos: true, stream: true, ...extra }, signal);
  assert.equal(res.status, 200);
  const reader = res.body!.getReader();
  await reader.read();
  return reader;
}

async function drain(reader: ReadableStreamDefaultReader<Uint8Array>): Promise<string> {
  let text = "";
  const decoder = new TextDecoder();
  for (let r = await reader.read(); !r.done; r = await reader.read()) text += decoder.decode(r.value);
  return text;
}

describe("GET /load without --enable-server-load-tracking", () => {
  let s: TestServer;
  before(async () => {
    s = await startTestServer({}, { stepDelayMs: 20 });
  });
  after(() => s.close());

  it("answers 0, as vLLM does, even with a request in flight", async () => {
    const reader = await startStream(s);
    assert.equal(s.engine.stats().numRunning, 1);
    assert.equal(await load(s), 0);
    await reader.cancel();
  });
});

describe("GET /load with --enable-server-load-tracking", () => {
  let s: TestServer;
  before(async () => {
    s = await startTestServer({ serverLoadTracking: true, apiKey: "k" }, { stepDelayMs: 20 });
  });
  after(() => s.close());

  it("counts streamed and whole requests in flight, /invocations included, and not itself; ends at 0", async () => {
    assert.equal(await load(s), 0, "GET /load does not count itself; it needs no API key (as /metrics)");
    const stream = await startStream(s);
    assert.equal(await load(s), 1);
    const whole = post(s, "/invocations", { messages: [{ role: "user", content: "hi" }], max_tokens: 10, ignore_eos: true });
    await waitFor(async () => (await load(s)) === 2);
    const viaInvocations = await startStream(s, "/invocations");
    assert.equal(await load(s), 3);
    assert.equal((await whole).status, 200);
    await waitFor(async () => (await load(s)) === 2);
    assert.match(await drain(stream), /data: \[DONE\]/);
    await drain(viaInvocations);
    await waitFor(async () => (await load(s)) === 0);
  });

  it("goes back down after errors: a 400 or 404 from the handler, an engine failure, whole or streamed", async () => {
    assert.equal((await post(s, "/v1/completions", { prompt: "x", max_tokens: 1000 })).status, 400);
    assert.equal((await post(s, "/v1/chat/completions", { model: "nope", messages: [{ role: "user", content: "x" }] })).status, 404);
    assert.equal((await post(s, "/invocations", { input: "no endpoint takes this" })).status, 400);
    assert.equal((await post(s, "/v1/completions", { prompt: s.engine.failMarker, max_tokens: 10, ignore_eos: true })).status, 500);
    const failing = await startStream(s, "/v1/completions", { prompt: s.engine.failMarker });
    assert.match(await drain(failing), /fake engine exploded[\s\S]*data: \[DONE\]/);
    assert.equal(await load(s), 0);
    const unauthorized = await fetch(`${s.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    assert.equal(unauthorized.status, 401);
    assert.equal(await load(s), 0);
  });

  it("goes back down when the client disconnects, streamed or waiting for a whole reply", async () => {
    const streamed = new AbortController();
    await startStream(s, "/v1/chat/completions", { prompt: undefined, messages: [{ role: "user", content: "go" }] }, streamed.signal);
    const whole = new AbortController();
    const pending = post(s, "/v1/completions", { prompt: "long", max_tokens: 40, ignore_eos: true }, whole.signal);
    await waitFor(async () => (await load(s)) === 2);
    streamed.abort();
    whole.abort();
    await assert.rejects(pending);
    await waitFor(async () => (await load(s)) === 0);
    await waitFor(() => s.engine.stats().numRunning === 0);
  });
});
