// The router over HTTP against scripted fake workers: pass-through of bodies, headers and worker errors, streaming
// without buffering, failover and retries, OpenAI error objects for the router's own failures, load read from the
// workers' /metrics, flow control, /v1/models, admin routes and its own /metrics.
import assert from "node:assert/strict";
import * as net from "node:net";
import { after, afterEach, describe, it } from "node:test";
import { createRouter, type Router } from "../../src/router/index.js";
import type { RouterConfig } from "../../src/router/router-config.js";
import { deadUrl, heldStream, sample, startFakeWorker, type FakeWorker, type Handler } from "./fake-worker.js";

const routers: Router[] = [];
const workers: FakeWorker[] = [];
afterEach(async () => {
  await Promise.all(routers.splice(0).map((r) => r.close()));
});
after(async () => {
  await Promise.all(workers.map((w) => w.kill().catch(() => undefined)));
});

async function fleet(n: number): Promise<FakeWorker[]> {
  const ws = await Promise.all(Array.from({ length: n }, (_, i) => startFakeWorker(`w${i}`)));
  workers.push(...ws);
  return ws;
}

async function router(workerUrls: string[], options: Partial<RouterConfig> = {}, random?: () => number): Promise<{ r: Router; url: string }> {
  const r = createRouter({ workerUrls, port: 0, healthCheckIntervalMs: 60_000, logLevel: "critical", ...options }, { log: () => {}, ...(random ? { random } : {}) });
  routers.push(r);
  return { r, url: await r.listen() };
}

async function post(url: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; headers: Headers; text: string; json: () => unknown }> {
  const res = await fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: typeof body === "string" ? body : JSON.stringify(body) });
  const text = await res.text();
  return { status: res.status, headers: res.headers, text, json: () => JSON.parse(text) };
}

/** A fake worker handler that answers every request with this status and JSON body. */
const answer = (status: number, body: string): Handler => (_req, res) => {
  res.writeHead(status, { "content-type": "application/json" }).end(body);
  return true;
};

/** OpenAI's error object with exactly its four keys. */
function assertError(body: unknown, type: string, code: string | null): void {
  const err = (body as { error: Record<string, unknown> }).error;
  assert.deepEqual(Object.keys(err).sort(), ["code", "message", "param", "type"]);
  assert.equal(err.type, type);
  assert.equal(err.code, code);
  assert.ok(typeof err.message === "string" && err.message.length > 0);
}

describe("router over HTTP (fake workers)", () => {
  it("forwards the body byte for byte and the client's headers; the worker's status and headers come back", async () => {
    const [w0] = await fleet(1);
    const { url } = await router([w0!.url]);
    const raw = '{"model":"tiny",  "prompt": "héllo"}'; // spacing and UTF-8 kept
    const r = await post(`${url}/v1/completions`, raw, { authorization: "Bearer k", "x-request-id": "abc" });
    assert.equal(r.status, 200);
    assert.deepEqual(r.json(), { worker: "w0", path: "/v1/completions", body: raw });
    assert.equal(r.headers.get("x-worker-name"), "w0");
    assert.equal(r.headers.get("x-kiln-worker"), w0!.url);
    assert.equal(w0!.seen.at(-1)!.headers.authorization, "Bearer k");
    assert.equal(w0!.seen.at(-1)!.headers["x-request-id"], "abc");
  });

  it("a route with a trailing slash is the route (as the workers serve it): forwarded without the slash, query kept", async () => {
    const [w0] = await fleet(1);
    const { url } = await router([w0!.url]);
    const r = await post(`${url}/v1/completions/?trace=1`, { prompt: "hi" });
    assert.equal(r.status, 200);
    assert.equal((r.json() as { path: string }).path, "/v1/completions?trace=1");
    const models = await fetch(`${url}/v1/models/`);
    assert.equal(models.status, 200);
    assert.deepEqual(((await models.json()) as { data: { id: string }[] }).data.map((m) => m.id), ["tiny"]);
  });

  it("a known route asked with another method is 405 with Allow (as the workers answer), an unknown one 404", async () => {
    const [w0] = await fleet(1);
    const { url } = await router([w0!.url]);
    const get = await fetch(`${url}/v1/chat/completions`);
    assert.equal(get.status, 405);
    assert.equal(get.headers.get("allow"), "POST");
    assertError(await get.json(), "invalid_request_error", "method_not_allowed");
    const post405 = await post(`${url}/v1/models`, {});
    assert.equal(post405.status, 405);
    assert.equal(post405.headers.get("allow"), "GET");
    const messages = await fetch(`${url}/v1/messages`);
    assert.equal(messages.status, 405);
    assert.equal(((await messages.json()) as { type: string; error: { type: string } }).error.type, "invalid_request_error"); // Anthropic's shape there
    const unknown = await fetch(`${url}/v1/nothing`);
    assert.equal(unknown.status, 404);
    assertError(await unknown.json(), "not_found_error", null);
    assert.equal(w0!.seen.length, 0);
  });

  it("a body nested past the stack is routed by load and judged by the worker, not the router's 500", async () => {
    const [w0] = await fleet(1);
    const { url } = await router([w0!.url]);
    const deep = `{"prompt":${"[".repeat(20_000)}${"]".repeat(20_000)}}`;
    const r = await post(`${url}/v1/completions`, deep);
    assert.equal(r.status, 200);
    assert.equal((r.json() as { body: string }).body, deep);
    const chat = `{"messages":[{"role":"user","content":${'{"a":'.repeat(10_000)}1${"}".repeat(10_000)}}]}`;
    assert.equal((await post(`${url}/v1/chat/completions`, chat)).status, 200);
  });

  it("cache_aware: requests sharing a long prefix stick to one worker, a new prefix goes to the other", async () => {
    const ws = await fleet(2);
    const { url } = await router(ws.map((w) => w.url));
    const system = "You are a careful assistant. Answer in one short sentence, and cite nothing. ".repeat(3);
    const chat = (q: string) => ({ model: "tiny", messages: [{ role: "system", content: system }, { role: "user", content: q }] });
    const first = await post(`${url}/v1/chat/completions`, chat("What is a river?"));
    const other = await post(`${url}/v1/completions`, { model: "tiny", prompt: "Completely different text about mountains" });
    assert.equal(first.headers.get("x-kiln-routing"), "cache_miss");
    assert.equal(other.headers.get("x-kiln-routing"), "cache_miss");
    assert.notEqual(other.headers.get("x-kiln-worker"), first.headers.get("x-kiln-worker")); // the emptier tree
    for (const q of ["What is a lake?", "What is the sea?", "Why is the sky blue?"]) {
      const r = await post(`${url}/v1/chat/completions`, chat(q));
      assert.equal(r.headers.get("x-kiln-worker"), first.headers.get("x-kiln-worker"));
      assert.equal(r.headers.get("x-kiln-routing"), "cache_hit");
    }
    const metrics = await (await fetch(`${url}/metrics`)).text();
    assert.equal(sample(metrics, "vllm_router_cache_hits_total"), 3);
    assert.equal(sample(metrics, "vllm_router_cache_misses_total"), 2);
    assert.equal(sample(metrics, "vllm_router_requests_total", 'route="/v1/chat/completions"'), 4);
    assert.equal(sample(metrics, "vllm_router_processed_requests_total", `worker="${first.headers.get("x-kiln-worker")}"`), 4);
    assert.equal(sample(metrics, "kiln_router_routing_decisions_total", 'reason="cache_hit"'), 3);
  });

  it("streams SSE chunk by chunk: the first chunk reaches the client before the worker writes the second", async () => {
    const [w0] = await fleet(1);
    let release!: () => void;
    const second = new Promise<void>((resolve) => (release = resolve));
    w0!.handler = async (_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write('data: {"n":1}\n\n');
      await second; // only once the client has seen chunk 1 through the router
      res.write('data: {"n":2}\n\n');
      res.end("data: [DONE]\n\n");
      return true;
    };
    const { url } = await router([w0!.url]);
    const res = await fetch(`${url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: '{"stream":true,"messages":[]}' });
    assert.equal(res.headers.get("content-type"), "text/event-stream");
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    const timeout = setTimeout(() => release(), 5_000); // a buffering router would only answer after this
    const firstChunk = decoder.decode((await reader.read()).value);
    const early = performance.now();
    clearTimeout(timeout);
    assert.equal(firstChunk, 'data: {"n":1}\n\n');
    release();
    let rest = "";
    for (let c = await reader.read(); !c.done; c = await reader.read()) rest += decoder.decode(c.value);
    assert.equal(rest, 'data: {"n":2}\n\ndata: [DONE]\n\n');
    assert.ok(performance.now() - early < 4_000);
  });

  it("a worker's own 4xx error passes through unchanged, and is not retried", async () => {
    const ws = await fleet(2);
    const body = '{"object":"error","message":"max_tokens is too large","type":"BadRequestError","param":"max_tokens","code":400}';
    for (const w of ws) w.handler = answer(400, body);
    const { url } = await router(ws.map((w) => w.url));
    const r = await post(`${url}/v1/completions`, { prompt: "x", max_tokens: 1e9 });
    assert.equal(r.status, 400);
    assert.equal(r.text, body);
    assert.equal(ws[0]!.seen.length + ws[1]!.seen.length, 1);
  });

  it("a malformed or empty JSON body is the router's 400 (OpenAI error object); no worker sees it", async () => {
    const [w0] = await fleet(1);
    const { url } = await router([w0!.url]);
    for (const bad of ['{"prompt": "x"', "", "not json"]) {
      const r = await post(`${url}/v1/completions`, bad);
      assert.equal(r.status, 400, bad);
      assertError(r.json(), "invalid_request_error", "invalid_json");
    }
    assert.equal(w0!.seen.length, 0);
    const missing = await fetch(`${url}/v1/nope`);
    assert.equal(missing.status, 404);
    assertError(await missing.json(), "not_found_error", null);
  });

  it("a worker that cannot be reached is marked down and the request retried on another", async () => {
    const [w0, w1] = await fleet(2);
    const { r, url } = await router([w0!.url, w1!.url], { policy: "round_robin" });
    await w0!.kill(); // healthy at the last check, gone now
    for (let i = 0; i < 3; i++) {
      const res = await post(`${url}/v1/completions`, { prompt: `p${i}` });
      assert.equal(res.status, 200);
      assert.equal(res.headers.get("x-kiln-worker"), w1!.url);
    }
    assert.equal(r.pool.get(w0!.url)!.healthy, false);
    const metrics = await (await fetch(`${url}/metrics`)).text();
    assert.equal(sample(metrics, "vllm_router_retries_total"), 1); // once down, w0 is no longer tried
    assert.equal(sample(metrics, "vllm_router_worker_health", `worker="${w0!.url}"`), 0);
    assert.equal(sample(metrics, "vllm_router_worker_health", `worker="${w1!.url}"`), 1);
    assert.equal(sample(metrics, "vllm_router_active_workers"), 1);
  });

  it("--max-retries 0: an unreachable worker is the router's 502 while others are up, 503 when it was the last", async () => {
    const [w0, w1] = await fleet(2);
    const { url } = await router([w0!.url, w1!.url], { policy: "round_robin", maxRetries: 0 });
    await w0!.kill();
    const r = await post(`${url}/v1/completions`, { prompt: "x" });
    assert.equal(r.status, 502);
    assertError(r.json(), "server_error", "worker_unreachable");
    assert.equal((await post(`${url}/v1/completions`, { prompt: "x" })).status, 200); // w0 is down now: w1 only
    await w1!.kill();
    const last = await post(`${url}/v1/completions`, { prompt: "x" });
    assert.equal(last.status, 503);
    assertError(last.json(), "service_unavailable_error", "no_healthy_worker");
  });

  it("no healthy worker: 503 with OpenAI's error object, from the API, /v1/models and /health", async () => {
    const { url } = await router([await deadUrl(), await deadUrl()]);
    const r = await post(`${url}/v1/chat/completions`, { messages: [{ role: "user", content: "hi" }] });
    assert.equal(r.status, 503);
    assertError(r.json(), "service_unavailable_error", "no_healthy_worker");
    const models = await fetch(`${url}/v1/models`);
    assert.equal(models.status, 503);
    assertError(await models.json(), "service_unavailable_error", "no_healthy_worker");
    const health = await fetch(`${url}/health`);
    assert.equal(health.status, 503);
    const metrics = await (await fetch(`${url}/metrics`)).text();
    assert.equal(sample(metrics, "vllm_router_request_errors_total", 'error_type="no_healthy_worker"'), 1);
  });

  it("the last worker failing mid-request leaves none: 503; a worker's 503 is retried elsewhere, passed through when alone", async () => {
    const [w0] = await fleet(1);
    const solo = await router([w0!.url]);
    w0!.handler = answer(503, '{"error":{"message":"draining"}}');
    const passed = await post(`${solo.url}/v1/completions`, { prompt: "x" });
    assert.equal(passed.status, 503);
    assert.equal(passed.text, '{"error":{"message":"draining"}}');
    const [w1] = await fleet(1);
    const duo = await router([w0!.url, w1!.url], { policy: "round_robin" });
    const retried = await post(`${duo.url}/v1/completions`, { prompt: "x" });
    assert.equal(retried.status, 200);
    assert.equal(retried.headers.get("x-kiln-worker"), w1!.url);
    assert.equal(duo.r.pool.get(w0!.url)!.healthy, true); // a 503 says busy, not down
    await w0!.kill();
    await w1!.kill();
    const none = await post(`${duo.url}/v1/completions`, { prompt: "x" });
    assert.equal(none.status, 503);
    assertError(none.json(), "service_unavailable_error", "no_healthy_worker");
    assert.match((none.json() as { error: { message: string } }).error.message, /ECONNREFUSED/);
  });

  it("a worker that does not answer within --request-timeout-secs: 504", async () => {
    const [w0] = await fleet(1);
    let closed = false;
    w0!.handler = (req) => {
      req.socket.once("close", () => (closed = true));
      return true; // never answers
    };
    const { r, url } = await router([w0!.url], { requestTimeoutMs: 300 });
    const res = await post(`${url}/v1/completions`, { prompt: "x" });
    assert.equal(res.status, 504);
    assertError(res.json(), "server_error", "timeout");
    assert.equal(r.pool.get(w0!.url)!.inFlight, 0);
    await new Promise((resolve) => setTimeout(resolve, 50));
    assert.ok(closed, "the worker's request is cancelled");
  });

  it("a client that disconnects mid-stream cancels the worker's request and frees its slot", async () => {
    const [w0] = await fleet(1);
    let workerSawClose!: () => void;
    const sawClose = new Promise<void>((resolve) => (workerSawClose = resolve));
    w0!.handler = (_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write("data: 1\n\n");
      res.once("close", () => workerSawClose());
      return true; // streams forever
    };
    const { r, url } = await router([w0!.url]);
    const ac = new AbortController();
    const res = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: '{"prompt":"x","stream":true}', signal: ac.signal });
    await res.body!.getReader().read();
    assert.equal(r.pool.get(w0!.url)!.inFlight, 1);
    ac.abort();
    await sawClose;
    await new Promise((resolve) => setTimeout(resolve, 20));
    assert.equal(r.pool.get(w0!.url)!.inFlight, 0);
    const metrics = await (await fetch(`${url}/metrics`)).text();
    assert.equal(sample(metrics, "kiln_router_worker_broken_responses_total", `worker="${w0!.url}"`), undefined, "the client left: not the worker's failure");
  });

  it("a worker that dies mid-answer cuts the client's stream and counts as a broken response, not an answered one", async () => {
    const [w0] = await fleet(1);
    w0!.handler = (_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write("data: 1\n\n");
      setTimeout(() => res.destroy(), 20);
      return true;
    };
    const { url } = await router([w0!.url]);
    const res = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: '{"prompt":"x","stream":true}' });
    await assert.rejects(res.text());
    const metrics = await (await fetch(`${url}/metrics`)).text();
    assert.equal(sample(metrics, "kiln_router_worker_broken_responses_total", `worker="${w0!.url}"`), 1);
    assert.equal(sample(metrics, "vllm_router_processed_requests_total", `worker="${w0!.url}"`), undefined);
  });

  it("load comes from the workers' /metrics too: power_of_two and cache_aware avoid a worker reporting a long queue", async () => {
    const [w0, w1] = await fleet(2);
    w0!.running = 100; // busy with other clients' requests
    const p2 = await router([w0!.url, w1!.url], { policy: "power_of_two" }, () => 0.3);
    for (let i = 0; i < 3; i++) assert.equal((await post(`${p2.url}/v1/completions`, { prompt: "x" })).headers.get("x-kiln-worker"), w1!.url);
    const ca = await router([w0!.url, w1!.url], { balanceAbsThreshold: 10 });
    const r = await post(`${ca.url}/v1/completions`, { prompt: "some prompt" });
    assert.equal(r.headers.get("x-kiln-worker"), w1!.url);
    assert.equal(r.headers.get("x-kiln-routing"), "load_balanced");
    const listing = (await (await fetch(`${ca.url}/workers`)).json()) as { workers: { url: string; load: number; reported: { running: number } }[] };
    assert.deepEqual(listing.workers.map((w) => [w.load, w.reported.running]), [[100, 100], [0, 0]]);
  });

  it("--max-inflight-per-worker: a full worker takes no more, 429 once all are full", async () => {
    const [w0] = await fleet(1);
    let finish!: () => void;
    const held = new Promise<void>((resolve) => (finish = resolve));
    w0!.handler = async (_req, res) => {
      await held;
      res.end("{}");
      return true;
    };
    const { url } = await router([w0!.url], { maxInflightPerWorker: 1 });
    const first = post(`${url}/v1/completions`, { prompt: "a" });
    await new Promise((resolve) => setTimeout(resolve, 50));
    const second = await post(`${url}/v1/completions`, { prompt: "b" });
    assert.equal(second.status, 429);
    assertError(second.json(), "rate_limit_error", "too_many_requests");
    finish();
    assert.equal((await first).status, 200);
    assert.equal((await post(`${url}/v1/completions`, { prompt: "c" })).status, 200);
  });

  it("/v1/models lists the workers' models once each; GET /v1/responses/{id} asks each worker until one has it", async () => {
    const [w0, w1] = await fleet(2);
    w1!.model = "other";
    const { url } = await router([w0!.url, w1!.url]);
    const models = (await (await fetch(`${url}/v1/models`)).json()) as { object: string; data: { id: string }[] };
    assert.equal(models.object, "list");
    assert.deepEqual(models.data.map((m) => m.id).sort(), ["other", "tiny"]);
    // a worker answering 200 with something that is not a model list adds nothing (it was a 500: data.forEach on an object)
    for (const broken of ['{"object":"list","data":{}}', "null", '{"data":[null,{"id":7},{"id":"x"}]}']) {
      w1!.handler = (req, res) => (req.url === "/v1/models" ? (res.end(broken), true) : false);
      const got = await fetch(`${url}/v1/models`);
      assert.equal(got.status, 200, broken);
      const ids = ((await got.json()) as { data: { id: string }[] }).data.map((m) => m.id).sort();
      assert.deepEqual(ids, broken.includes('"x"') ? ["tiny", "x"] : ["tiny"]);
    }
    w0!.handler = answer(404, '{"error":{"message":"no such response"}}');
    w1!.handler = (req, res) => (req.method === "GET" ? (res.end('{"id":"resp_1","status":"completed"}'), true) : false);
    const got = await fetch(`${url}/v1/responses/resp_1`);
    assert.equal(got.status, 200);
    assert.deepEqual(await got.json(), { id: "resp_1", status: "completed" });
    w1!.handler = w0!.handler;
    const missing = await fetch(`${url}/v1/responses/resp_2`);
    assert.equal(missing.status, 404);
    assert.deepEqual(await missing.json(), { error: { message: "no such response" } }); // the worker's own answer
    // lookups by id are not routing decisions of the policy: no cache hit or miss counted
    const metrics = await (await fetch(`${url}/metrics`)).text();
    assert.equal(sample(metrics, "vllm_router_cache_misses_total"), 0);
    assert.equal(sample(metrics, "kiln_router_routing_decisions_total", 'reason="lookup"'), 4); // one per worker asked: w0 (the tie's first) then w1, twice
    assert.equal(got.headers.get("x-kiln-routing"), "lookup");
  });

  it("POST /v1/responses with previous_response_id reaches the worker that stored the previous response", async () => {
    const [w0, w1] = await fleet(2);
    const { url } = await router([w0!.url, w1!.url], { policy: "round_robin" });
    // w1 stored resp_1; w0 does not know it (kiln serve's 404 naming previous_response_id)
    w0!.handler = answer(404, '{"error":{"message":"Response with id \'resp_1\' not found.","type":"invalid_request_error","param":"previous_response_id","code":"response_not_found"}}');
    w1!.handler = answer(200, '{"id":"resp_2","status":"completed"}');
    for (let i = 0; i < 4; i++) {
      const r = await post(`${url}/v1/responses`, { model: "tiny", input: `turn ${i}`, previous_response_id: "resp_1" });
      assert.equal(r.status, 200, `request ${i}: ${r.text}`);
      assert.equal(r.headers.get("x-kiln-worker"), w1!.url);
    }
    // without previous_response_id a worker's 404 passes through as it is
    const fresh = await Promise.all([0, 1].map((i) => post(`${url}/v1/responses`, { model: "tiny", input: `new ${i}` })));
    assert.deepEqual(fresh.map((r) => r.status).sort(), [200, 404]);
  });

  it("health checks take a failing worker out after the failure threshold and back after the success threshold", async () => {
    const [w0, w1] = await fleet(2);
    const { r } = await router([w0!.url, w1!.url], { healthCheckIntervalMs: 30, healthFailureThreshold: 2, healthSuccessThreshold: 2 });
    const until = async (cond: () => boolean) => {
      for (let i = 0; i < 200 && !cond(); i++) await new Promise((resolve) => setTimeout(resolve, 10));
      assert.ok(cond());
    };
    w0!.healthStatus = 503;
    await until(() => !r.pool.get(w0!.url)!.healthy);
    assert.ok(r.pool.get(w0!.url)!.consecutiveFailures >= 2);
    w0!.healthStatus = 200;
    await until(() => r.pool.get(w0!.url)!.healthy);
    assert.equal(r.pool.get(w1!.url)!.healthy, true);
  });

  it("close() lets a response in flight finish before the router stops", async () => {
    const [w0] = await fleet(1);
    const { handler, release } = heldStream("data: 1\n\n", "data: [DONE]\n\n");
    w0!.handler = handler;
    const r = createRouter({ workerUrls: [w0!.url], port: 0, logLevel: "critical" }, { log: () => {} });
    const url = await r.listen();
    const res = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: '{"stream":true}' });
    const text = res.text();
    let closed = false;
    const closing = r.close().then(() => (closed = true));
    await new Promise((resolve) => setTimeout(resolve, 150));
    assert.equal(closed, false, "close() waits for the stream");
    assert.equal((await fetch(`${url}/health`).then((x) => x.status, () => "refused")), "refused"); // no new connections
    release();
    assert.equal(await text, "data: 1\n\ndata: [DONE]\n\n");
    await closing;
  });

  it("CORS: preflight answered by the router; only allowed origins get the header, the workers' own are dropped", async () => {
    const [w0] = await fleet(1);
    w0!.handler = (_req, res) => {
      res.writeHead(200, { "content-type": "application/json", "access-control-allow-origin": "*" }).end("{}");
      return true;
    };
    const open = await router([w0!.url]);
    const pre = await fetch(`${open.url}/v1/chat/completions`, { method: "OPTIONS", headers: { origin: "https://x.example", "access-control-request-headers": "content-type" } });
    assert.equal(pre.status, 204);
    assert.equal(pre.headers.get("access-control-allow-origin"), "*");
    assert.equal(pre.headers.get("access-control-allow-headers"), "content-type");
    const strict = await router([w0!.url], { corsAllowedOrigins: ["https://ok.example"] });
    const ok = await post(`${strict.url}/v1/completions`, { prompt: "x" }, { origin: "https://ok.example" });
    assert.equal(ok.headers.get("access-control-allow-origin"), "https://ok.example");
    const other = await post(`${strict.url}/v1/completions`, { prompt: "x" }, { origin: "https://evil.example" });
    assert.equal(other.status, 200);
    assert.equal(other.headers.get("access-control-allow-origin"), null); // the worker's "*" does not leak through
  });

  it("admin routes add, list and remove workers at run time", async () => {
    const [w0, w1] = await fleet(2);
    const { r, url } = await router([w0!.url]);
    const added = await fetch(`${url}/add_worker?url=${encodeURIComponent(`${w1!.url}/`)}`, { method: "POST" });
    assert.deepEqual(await added.json(), { url: w1!.url, added: true, healthy: true });
    assert.deepEqual(await (await fetch(`${url}/list_workers`)).json(), { urls: [w0!.url, w1!.url] });
    const bad = await fetch(`${url}/add_worker?url=ftp://x`, { method: "POST" });
    assert.equal(bad.status, 400);
    assertError(await bad.json(), "invalid_request_error", null);
    const removed = await fetch(`${url}/remove_worker?url=${encodeURIComponent(w0!.url)}`, { method: "POST" });
    assert.deepEqual(await removed.json(), { url: w0!.url, removed: true });
    assert.equal((await fetch(`${url}/remove_worker?url=${encodeURIComponent(w0!.url)}`, { method: "POST" })).status, 404);
    const res = await post(`${url}/v1/completions`, { prompt: "x" });
    assert.equal(res.headers.get("x-kiln-worker"), w1!.url);
    assert.equal(r.pool.all().length, 1);
  });

  it("a client that disconnects while sending its body is no router error and reaches no worker", async () => {
    const [w0] = await fleet(1);
    const { url } = await router([w0!.url]);
    const { port } = new URL(url);
    const sock = net.connect(Number(port), "127.0.0.1");
    await new Promise<void>((resolve) => sock.once("connect", () => resolve()));
    // promises 1000 bytes, sends 20, then goes away
    sock.write("POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"prompt\": \"abcdefg");
    await new Promise((resolve) => setTimeout(resolve, 50));
    sock.destroy();
    await new Promise((resolve) => setTimeout(resolve, 100));
    const metrics = await (await fetch(`${url}/metrics`)).text();
    assert.doesNotMatch(metrics, /^vllm_router_request_errors_total\{/m);
    assert.equal(w0!.seen.filter((r) => r.path === "/v1/completions").length, 0);
    // the router still answers
    assert.equal((await post(`${url}/v1/completions`, { prompt: "x" })).status, 200);
  });
});
