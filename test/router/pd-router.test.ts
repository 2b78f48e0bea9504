// P/D disaggregation over HTTP against fake prefill and decode workers: the exact bodies each worker receives
// (the prefill's rewritten as vLLM's P/D proxy does, the decode's the client's original plus the prefill's
// kv_transfer_params), streaming through the decode worker, a prefill worker's error passed through, failover within
// each pool, the decode without kv_transfer_params when the prefill gives none, and roles in /workers and /metrics.
import assert from "node:assert/strict";
import { after, afterEach, describe, it } from "node:test";
import { decodeBody, prefillBody } from "../../src/router/pd-proxy.js";
import { createRouter, type Router } from "../../src/router/index.js";
import type { RouterConfig } from "../../src/router/router-config.js";
import { fakeKvParams, prefillAnswer, sample, startFakeWorker, type FakeWorker } from "./fake-worker.js";

const routers: Router[] = [];
const workers: FakeWorker[] = [];
afterEach(async () => {
  await Promise.all(routers.splice(0).map((r) => r.close()));
});
after(async () => {
  await Promise.all(workers.map((w) => w.kill().catch(() => undefined)));
});

const PREFILL_KV = { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null };

/** `p` prefill workers answering with fakeKvParams(name), and `d` echoing decode workers. */
async function pdFleet(p: number, d: number): Promise<{ prefills: FakeWorker[]; decodes: FakeWorker[] }> {
  const prefills = await Promise.all(Array.from({ length: p }, (_, i) => startFakeWorker(`p${i}`)));
  const decodes = await Promise.all(Array.from({ length: d }, (_, i) => startFakeWorker(`d${i}`)));
  for (const w of prefills) w.handler = prefillAnswer(fakeKvParams(w.name));
  workers.push(...prefills, ...decodes);
  return { prefills, decodes };
}

async function pdRouter(prefills: FakeWorker[], decodes: FakeWorker[], options: Partial<RouterConfig> = {}): Promise<{ r: Router; url: string }> {
  const r = createRouter({
    pdDisaggregation: true, prefillUrls: prefills.map((w) => ({ url: w.url, bootstrapPort: null })), decodeUrls: decodes.map((w) => w.url),
    policy: "round_robin", port: 0, healthCheckIntervalMs: 60_000, logLevel: "critical", ...options,
  }, { log: () => {} });
  routers.push(r);
  return { r, url: await r.listen() };
}

async function post(url: string, body: string, headers: Record<string, string> = {}): Promise<{ status: number; headers: Headers; text: string }> {
  const res = await fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

const metricsOf = async (url: string): Promise<string> => (await fetch(`${url}/metrics`)).text();

describe("P/D disaggregation (fake prefill and decode workers)", () => {
  it("the prefill worker gets the rewritten body, the decode worker the original plus the prefill's kv_transfer_params", async () => {
    const { prefills: [p0], decodes: [d0] } = await pdFleet(1, 1);
    const { url } = await pdRouter([p0!], [d0!]);
    const raw = '{"model":"tiny",  "prompt": "héllo", "max_tokens": 32, "n": 2, "best_of": 2, "min_tokens": 4, "seed": 9007199254740993}\n';
    const r = await post(`${url}/v1/completions`, raw, { authorization: "Bearer k", "x-request-id": "req-7" });
    assert.equal(r.status, 200);
    assert.deepEqual(JSON.parse(p0!.seen[0]!.body), {
      model: "tiny", prompt: "héllo", max_tokens: 1, n: 1, best_of: 1, seed: 9007199254740992, stream: false, kv_transfer_params: PREFILL_KV,
    });
    // the client's bytes, then the prefill's parameters as the last key (the seed past 2^53 stays exact)
    const expected = `{"model":"tiny",  "prompt": "héllo", "max_tokens": 32, "n": 2, "best_of": 2, "min_tokens": 4, "seed": 9007199254740993,"kv_transfer_params":${JSON.stringify(fakeKvParams("p0"))}}`;
    assert.equal(d0!.seen[0]!.body, expected);
    // the client sees the decode worker's answer only
    assert.deepEqual(JSON.parse(r.text), { worker: "d0", path: "/v1/completions", body: expected });
    assert.equal(r.headers.get("x-kiln-worker"), d0!.url);
    assert.equal(r.headers.get("x-kiln-prefill-worker"), p0!.url);
    assert.equal(r.headers.get("x-phase"), null);
    for (const w of [p0!, d0!]) {
      assert.equal(w.seen[0]!.headers.authorization, "Bearer k");
      assert.equal(w.seen[0]!.headers["x-request-id"], "req-7"); // both halves of the request carry one id
    }
    assert.equal(p0!.seen[0]!.headers["accept-encoding"], "identity");
  });

  it("chat: max_completion_tokens and stream_options are rewritten for the prefill; the decode stream reaches the client chunk by chunk", async () => {
    const { prefills: [p0], decodes: [d0] } = await pdFleet(1, 1);
    let release!: () => void;
    const second = new Promise<void>((resolve) => (release = resolve));
    d0!.handler = async (_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write('data: {"n":1}\n\n');
      await second; // only once the client has seen chunk 1 through the router
      res.end('data: {"n":2}\n\ndata: [DONE]\n\n');
      return true;
    };
    const { url } = await pdRouter([p0!], [d0!]);
    const body = { model: "tiny", messages: [{ role: "user", content: "hi" }], max_completion_tokens: 64, stream: true, stream_options: { include_usage: true } };
    const res = await fetch(`${url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    assert.equal(res.headers.get("content-type"), "text/event-stream");
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    const timeout = setTimeout(() => release(), 5_000); // a buffering router would only answer after this
    assert.equal(decoder.decode((await reader.read()).value), 'data: {"n":1}\n\n');
    clearTimeout(timeout);
    release();
    let rest = "";
    for (let c = await reader.read(); !c.done; c = await reader.read()) rest += decoder.decode(c.value);
    assert.equal(rest, 'data: {"n":2}\n\ndata: [DONE]\n\n');
    assert.deepEqual(JSON.parse(p0!.seen[0]!.body), {
      model: "tiny", messages: [{ role: "user", content: "hi" }], max_completion_tokens: 1, stream: false, max_tokens: 1, kv_transfer_params: PREFILL_KV,
    });
    assert.equal(p0!.seen[0]!.path, "/v1/chat/completions");
    assert.deepEqual(JSON.parse(d0!.seen[0]!.body), { ...body, kv_transfer_params: fakeKvParams("p0") });
  });

  it("a prefill worker's own 4xx error passes through unchanged, and no decode request is made", async () => {
    const { prefills: [p0], decodes: [d0] } = await pdFleet(1, 1);
    const error = '{"object":"error","message":"max_tokens is too large","type":"BadRequestError","param":"max_tokens","code":400}';
    p0!.handler = (_req, res) => (res.writeHead(400, { "content-type": "application/json", "x-worker": "p0" }).end(error), true);
    const { url } = await pdRouter([p0!], [d0!]);
    const r = await post(`${url}/v1/completions`, '{"prompt":"x","max_tokens":1e9}');
    assert.equal(r.status, 400);
    assert.equal(r.text, error);
    assert.equal(r.headers.get("x-worker"), "p0");
    assert.equal(d0!.seen.length, 0);
    const metrics = await metricsOf(url);
    assert.equal(sample(metrics, "vllm_router_pd_prefill_errors_total", `worker="${p0!.url}"`), 1);
    assert.equal(sample(metrics, "vllm_router_pd_decode_requests_total"), undefined);
  });

  it("a prefill worker that is down or answers 503 hands the request to another; none left is the router's 503", async () => {
    const { prefills: [p0, p1], decodes: [d0] } = await pdFleet(2, 1);
    const { r, url } = await pdRouter([p0!, p1!], [d0!]);
    await p0!.kill(); // healthy at the last check, gone now
    const first = await post(`${url}/v1/completions`, '{"prompt":"a"}');
    assert.equal(first.status, 200);
    assert.equal(first.headers.get("x-kiln-prefill-worker"), p1!.url);
    assert.equal(r.prefill!.pool.get(p0!.url)!.healthy, false);
    assert.deepEqual(JSON.parse(d0!.seen[0]!.body), { prompt: "a", kv_transfer_params: fakeKvParams("p1") });

    const [p2] = await pdFleet(1, 0).then((f) => f.prefills);
    p1!.handler = (_req, res) => (res.writeHead(503, { "content-type": "application/json" }).end('{"error":{"message":"draining"}}'), true);
    const busy = await pdRouter([p1!, p2!], [d0!]);
    const retried = await post(`${busy.url}/v1/completions`, '{"prompt":"b"}');
    assert.equal(retried.status, 200);
    assert.equal(retried.headers.get("x-kiln-prefill-worker"), p2!.url);
    assert.equal(sample(await metricsOf(busy.url), "vllm_router_retries_total"), 1);

    await p1!.kill();
    const none = await post(`${url}/v1/completions`, '{"prompt":"c"}');
    assert.equal(none.status, 503);
    const err = (JSON.parse(none.text) as { error: Record<string, unknown> }).error;
    assert.deepEqual(Object.keys(err).sort(), ["code", "message", "param", "type"]);
    assert.equal(err.type, "service_unavailable_error");
    assert.equal(err.code, "no_healthy_worker");
    assert.match(String(err.message), /2 prefill worker\(s\) configured, 0 healthy/);
    assert.equal(d0!.seen.length, 2); // the first request's decode and the retried one's: none for the failure
    const metrics = await metricsOf(url);
    assert.equal(sample(metrics, "vllm_router_pd_errors_total", 'phase="prefill",error_type="no_healthy_worker"'), 1);
    assert.equal(sample(metrics, "vllm_router_request_errors_total", 'error_type="no_healthy_worker"'), 1);
  });

  it("a prefill answer without kv_transfer_params (absent or null) sends the client's body to decode unchanged", async () => {
    const { prefills: [p0], decodes: [d0] } = await pdFleet(1, 1);
    const { url } = await pdRouter([p0!], [d0!]);
    const raw = '{"prompt":"stop early","max_tokens":8}';
    for (const kv of [undefined, null]) {
      p0!.handler = prefillAnswer(kv);
      const r = await post(`${url}/v1/completions`, raw);
      assert.equal(r.status, 200);
      assert.equal(d0!.seen.at(-1)!.body, raw);
    }
    // a client's own kv_transfer_params do not reach the decode worker: the router owns the field in P/D mode
    await post(`${url}/v1/completions`, '{"prompt":"x","kv_transfer_params":{"do_remote_prefill":true}}');
    assert.deepEqual(JSON.parse(p0!.seen.at(-1)!.body), { prompt: "x", kv_transfer_params: PREFILL_KV, stream: false, max_tokens: 1 });
    assert.equal(d0!.seen.at(-1)!.body, '{"prompt":"x"}');
    const metrics = await metricsOf(url);
    assert.equal(sample(metrics, "kiln_router_pd_missing_kv_transfer_params_total"), 3);
    assert.equal(sample(metrics, "vllm_router_pd_requests_total", 'route="/v1/completions"'), 3);
    assert.equal(sample(metrics, "vllm_router_pd_prefill_requests_total", `worker="${p0!.url}"`), 3);
    assert.equal(sample(metrics, "vllm_router_pd_decode_requests_total", `worker="${d0!.url}"`), 3);
    assert.equal(sample(metrics, "kiln_router_pd_prefill_duration_seconds_count"), 3);
  });

  it("decode failover: an unreachable decode worker is replaced by another with the same kv_transfer_params; none left is 503", async () => {
    const { prefills: [p0], decodes: [d0, d1] } = await pdFleet(1, 2);
    const { r, url } = await pdRouter([p0!], [d0!, d1!]);
    await d0!.kill();
    const ok = await post(`${url}/v1/completions`, '{"prompt":"a"}');
    assert.equal(ok.status, 200);
    assert.equal(ok.headers.get("x-kiln-worker"), d1!.url);
    assert.deepEqual(JSON.parse(d1!.seen[0]!.body), { prompt: "a", kv_transfer_params: fakeKvParams("p0") });
    assert.equal(r.pool.get(d0!.url)!.healthy, false);
    await d1!.kill();
    const none = await post(`${url}/v1/completions`, '{"prompt":"b"}');
    assert.equal(none.status, 503);
    assert.match(none.text, /2 decode worker\(s\) configured, 0 healthy/);
    assert.equal(sample(await metricsOf(url), "vllm_router_pd_errors_total", 'phase="decode",error_type="no_healthy_worker"'), 1);
    assert.equal(r.prefill!.pool.get(p0!.url)!.inFlight, 0);
  });

  it("a prefill that breaks off its answer: decode without kv_transfer_params; one that never answers: 504; a client gone: no decode", async () => {
    const { prefills: [p0], decodes: [d0] } = await pdFleet(1, 1);
    p0!.handler = (_req, res) => {
      res.writeHead(200, { "content-type": "application/json", "content-length": "100" }).write('{"id":"cmpl-p","kv_transfer_par');
      setTimeout(() => res.destroy(), 20); // the worker dies mid-answer
      return true;
    };
    const { url } = await pdRouter([p0!], [d0!], { requestTimeoutMs: 400 });
    const cut = await post(`${url}/v1/completions`, '{"prompt":"a"}');
    assert.equal(cut.status, 200);
    assert.equal(d0!.seen.at(-1)!.body, '{"prompt":"a"}');
    assert.equal(sample(await metricsOf(url), "vllm_router_pd_prefill_errors_total", `worker="${p0!.url}"`), 1);

    let prefillClosed!: () => void;
    const closed = new Promise<void>((resolve) => (prefillClosed = resolve));
    p0!.handler = (_req, res) => (res.once("close", () => prefillClosed()), true); // never answers
    const slow = await post(`${url}/v1/completions`, '{"prompt":"b"}');
    assert.equal(slow.status, 504);
    assert.equal((JSON.parse(slow.text) as { error: { code: string } }).error.code, "timeout");
    await closed; // the prefill request is cancelled
    assert.equal(sample(await metricsOf(url), "vllm_router_pd_errors_total", 'phase="prefill",error_type="timeout"'), 1);

    const ac = new AbortController();
    const gone = fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: '{"prompt":"c"}', signal: ac.signal });
    await new Promise((resolve) => setTimeout(resolve, 50));
    ac.abort();
    await gone.catch(() => undefined);
    await new Promise((resolve) => setTimeout(resolve, 50));
    assert.equal(d0!.seen.length, 1); // only the first request's decode
  });

  it("other routes, and completions whose body is not a JSON object, go to a decode worker whole", async () => {
    const { prefills: [p0], decodes: [d0] } = await pdFleet(1, 1);
    const { url } = await pdRouter([p0!], [d0!]);
    for (const [path, body] of [["/v1/embeddings", '{"input":"x"}'], ["/tokenize", '{"prompt":"x"}'], ["/v1/completions", '["not","an","object"]']] as const) {
      const r = await post(`${url}${path}`, body);
      assert.equal(r.status, 200, path);
      assert.deepEqual(JSON.parse(r.text), { worker: "d0", path, body });
    }
    assert.equal(p0!.seen.length, 0);
  });

  it("each pool has its policy and its health; /workers, /list_workers, /health and /metrics name the roles", async () => {
    const { prefills: [p0, p1], decodes: [d0] } = await pdFleet(2, 1);
    const { url } = await pdRouter([p0!, p1!], [d0!], { prefillUrls: [{ url: p0!.url, bootstrapPort: 9000 }, { url: p1!.url, bootstrapPort: null }], prefillPolicy: "round_robin", decodePolicy: "power_of_two" });
    const used = [];
    for (let i = 0; i < 4; i++) used.push((await post(`${url}/v1/completions`, `{"prompt":"${i}"}`)).headers.get("x-kiln-prefill-worker"));
    assert.deepEqual(used, [p0!.url, p1!.url, p0!.url, p1!.url]);
    const listing = (await (await fetch(`${url}/workers`)).json()) as Record<string, unknown> & { workers: Record<string, unknown>[] };
    assert.equal(listing.pd_disaggregation, true);
    assert.equal(listing.prefill_policy, "round_robin");
    assert.equal(listing.decode_policy, "power_of_two");
    assert.deepEqual(listing.workers.map((w) => [w.url, w.role, w.bootstrap_port, w.healthy]), [
      [p0!.url, "prefill", 9000, true], [p1!.url, "prefill", null, true], [d0!.url, "decode", undefined, true],
    ]);
    assert.deepEqual(await (await fetch(`${url}/list_workers`)).json(), { urls: [p0!.url, p1!.url, d0!.url], prefill: [p0!.url, p1!.url], decode: [d0!.url] });
    assert.deepEqual(await (await fetch(`${url}/health`)).json(), { status: "ok", healthy_workers: 3, workers: 3, healthy_prefill_workers: 2, healthy_decode_workers: 1 });
    const metrics = await metricsOf(url);
    assert.equal(sample(metrics, "vllm_router_worker_health", `worker="${p1!.url}",role="prefill"`), 1);
    assert.equal(sample(metrics, "vllm_router_worker_health", `worker="${d0!.url}",role="decode"`), 1);
    assert.equal(sample(metrics, "vllm_router_active_workers"), 3);
    assert.equal(sample(metrics, "vllm_router_pd_prefill_requests_total", `worker="${p1!.url}"`), 2);
    assert.equal(sample(metrics, "vllm_router_pd_decode_requests_total", `worker="${d0!.url}"`), 4);
  });

  it("admin routes take a role with P/D: a worker joins the prefill or the decode pool, never both", async () => {
    const { prefills: [p0, p1], decodes: [d0] } = await pdFleet(2, 1);
    const { r, url } = await pdRouter([p0!], [d0!]);
    const add = (q: string) => fetch(`${url}/add_worker?${q}`, { method: "POST" });
    const noRole = await add(`url=${encodeURIComponent(p1!.url)}`);
    assert.equal(noRole.status, 400);
    assert.equal(((await noRole.json()) as { error: { param: string } }).error.param, "role");
    assert.deepEqual(await (await add(`url=${encodeURIComponent(p1!.url)}&role=prefill`)).json(), { url: p1!.url, role: "prefill", added: true, healthy: true });
    assert.equal((await add(`url=${encodeURIComponent(p1!.url)}&role=decode`)).status, 400); // already a prefill worker
    assert.deepEqual(r.prefill!.pool.all().map((w) => w.url), [p0!.url, p1!.url]);
    const removed = await fetch(`${url}/remove_worker?url=${encodeURIComponent(p0!.url)}`, { method: "POST" });
    assert.deepEqual(await removed.json(), { url: p0!.url, removed: true });
    const res = await post(`${url}/v1/completions`, '{"prompt":"x"}');
    assert.equal(res.headers.get("x-kiln-prefill-worker"), p1!.url);
  });

  it("/health is 503 while either role has no healthy worker", async () => {
    const { prefills: [p0], decodes: [d0] } = await pdFleet(1, 1);
    p0!.healthStatus = 503;
    const { url } = await pdRouter([p0!], [d0!]);
    const health = await fetch(`${url}/health`);
    assert.equal(health.status, 503);
    assert.match(((await health.json()) as { error: { message: string } }).error.message, /1 prefill worker\(s\) configured, none healthy/);
  });
});

describe("P/D request bodies", () => {
  it("prefillBody sets the one-token, unstreamed prefill and keeps everything else", () => {
    const body = { model: "m", prompt: "p", max_tokens: 9, max_completion_tokens: 9, stream: true, stream_options: { include_usage: true }, n: 3, best_of: 3, min_tokens: 2, temperature: 0.5 };
    assert.deepEqual(prefillBody(body), { model: "m", prompt: "p", max_tokens: 1, max_completion_tokens: 1, stream: false, n: 1, best_of: 1, temperature: 0.5, kv_transfer_params: PREFILL_KV });
    assert.equal(body.max_tokens, 9); // the client's body is not changed
    assert.deepEqual(prefillBody({}), { stream: false, max_tokens: 1, kv_transfer_params: PREFILL_KV });
  });

  it("decodeBody appends kv_transfer_params to the client's bytes, or replaces the client's own", () => {
    const kv = { remote_block_ids: [1], remote_engine_id: "e" };
    const text = (raw: string, k: Record<string, unknown> | null) => decodeBody(Buffer.from(raw), JSON.parse(raw) as Record<string, unknown>, k).toString();
    assert.equal(text("{}", kv), '{"kv_transfer_params":{"remote_block_ids":[1],"remote_engine_id":"e"}}');
    assert.equal(text(' { } \n', kv), ' {"kv_transfer_params":{"remote_block_ids":[1],"remote_engine_id":"e"}}');
    assert.equal(text('{"a":{"b":"}"}}', kv), '{"a":{"b":"}"},"kv_transfer_params":{"remote_block_ids":[1],"remote_engine_id":"e"}}');
    assert.equal(text('{"a":1}', null), '{"a":1}');
    assert.equal(text('{"kv_transfer_params":{"x":1},"a":1}', kv), '{"a":1,"kv_transfer_params":{"remote_block_ids":[1],"remote_engine_id":"e"}}');
    assert.equal(text('{"kv_transfer_params":null,"a":1}', null), '{"a":1}');
  });
});
