// vLLM's development endpoints (VLLM_SERVER_DEV_MODE=1): POST /reset_prefix_cache over the real AsyncLLM (a repeated
// prompt hits the prefix cache, and after a reset no longer does) and GET /server_info; without dev mode both 404.
import assert from "node:assert/strict";
import { after, afterEach, before, describe, it } from "node:test";
import type { FastifyInstance } from "fastify";
import { AsyncLLM } from "../../src/engine/async-llm.js";
import { FakeModelRunner } from "../../src/engine/fake-model-runner.js";
import { createServer } from "../../src/server/index.js";
import { env } from "../../src/util/env.js";
import { FakeTokenizer } from "./fake-engine.js";
import { MODEL, startTestServer, type TestServer } from "./helpers.js";

async function listen(app: FastifyInstance): Promise<string> {
  await app.listen({ port: 0, host: "127.0.0.1" });
  return `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
}

async function close(app: FastifyInstance): Promise<void> {
  const closing = app.close();
  app.server.closeAllConnections();
  await closing;
}

describe("dev mode over AsyncLLM", () => {
  let app: FastifyInstance;
  let engine: AsyncLLM;
  let url: string;
  before(async () => {
    const tokenizer = new FakeTokenizer();
    engine = new AsyncLLM({ runner: new FakeModelRunner(tokenizer.vocabSize), tokenizer, engineArgs: { maxModelLen: 128, numGpuBlocks: 64, blockSize: 16 } });
    app = createServer({
      engine, tokenizer, servedModelNames: ["real"], maxModelLen: 128, version: "t", devMode: true, enablePromptTokensDetails: true,
      apiKey: "secret-key", launchConfig: { model: "/models/real", apiKey: "<set>", tls: false },
    });
    url = await listen(app);
  });
  after(() => close(app));

  const headers = { authorization: "Bearer secret-key" };
  const complete = async (prompt: string) => {
    const res = await fetch(`${url}/v1/completions`, { method: "POST", headers: { ...headers, "content-type": "application/json" }, body: JSON.stringify({ model: "real", prompt, max_tokens: 2, ignore_eos: true }) });
    assert.equal(res.status, 200);
    return ((await res.json()) as { usage: { prompt_tokens: number; prompt_tokens_details?: { cached_tokens: number } } }).usage;
  };
  const reset = (query = "") => fetch(`${url}/reset_prefix_cache${query}`, { method: "POST", headers });

  it("POST /reset_prefix_cache: a repeated prompt hits the cache until the reset, and misses it after", async () => {
    const prompt = "a prompt of forty characters, give or ta"; // BOS + 40 tokens: two full blocks of 16
    assert.equal((await complete(prompt)).prompt_tokens_details, undefined, "a cold cache");
    assert.deepEqual((await complete(prompt)).prompt_tokens_details, { cached_tokens: 32 });
    assert.ok(engine.engine.kv.pool.numCachedBlocks > 0);
    const res = await reset();
    assert.equal(res.status, 200);
    assert.equal(await res.text(), "", "vLLM's empty 200");
    assert.equal(engine.engine.kv.pool.numCachedBlocks, 0, "nothing was running: every hash is gone");
    assert.equal((await complete(prompt)).prompt_tokens_details, undefined, "the repeat computes its prompt again");
    assert.deepEqual((await complete(prompt)).prompt_tokens_details, { cached_tokens: 32 }, "and caches it anew");
  });

  it("POST /reset_prefix_cache: vLLM's query flags that Kiln cannot honour are a 400; GET is a 405", async () => {
    for (const [query, param] of [["?reset_running_requests=true", "reset_running_requests"], ["?reset_external=1", "reset_external"], ["?reset_external=maybe", "reset_external"]]) {
      const res = await reset(query);
      assert.equal(res.status, 400, query);
      const body = (await res.json()) as { error: { param: string; type: string } };
      assert.equal(body.error.param, param);
      assert.equal(body.error.type, "invalid_request_error");
    }
    assert.equal((await reset("?reset_running_requests=false&reset_external=off")).status, 200);
    const get = await fetch(`${url}/reset_prefix_cache`, { headers });
    assert.equal(get.status, 405);
  });

  it("/metrics has vLLM's vllm:cache_config_info: the cache config as labels (Python's str of each), value 1", async () => {
    const text = await (await fetch(`${url}/metrics`)).text();
    const line = text.split("\n").find((l) => l.startsWith("vllm:cache_config_info{"));
    assert.ok(line !== undefined, "vllm:cache_config_info is exported");
    assert.ok(line.endsWith("} 1"), line);
    const labels = Object.fromEntries([...line.matchAll(/(\w+)="([^"]*)"/g)].map((m) => [m[1], m[2]]));
    // the engine's blockSize 16 and numGpuBlocks 64; the cache flags kiln serve was not given, at vLLM's defaults
    assert.deepEqual(
      [labels.block_size, labels.num_gpu_blocks, labels.enable_prefix_caching, labels.cache_dtype, labels.gpu_memory_utilization, labels.num_gpu_blocks_override, labels.engine],
      ["16", "64", "True", "auto", "0.9", "None", "0"],
    );
  });

  it("the dev routes, not under /v1, need no API key (vLLM's AuthenticationMiddleware checks /v1 only)", async () => {
    assert.equal((await fetch(`${url}/reset_prefix_cache`, { method: "POST" })).status, 200);
    assert.equal((await fetch(`${url}/server_info`)).status, 200);
    assert.equal((await fetch(`${url}/v1/models`)).status, 401);
  });

  it("GET /server_info: the configuration as JSON text (default) or as an object; no secrets", async () => {
    const text = await fetch(`${url}/server_info`, { headers });
    assert.equal(text.status, 200);
    const raw = (await text.json()) as { vllm_config: string };
    assert.equal(typeof raw.vllm_config, "string");
    assert.ok(!raw.vllm_config.includes("secret-key"), "the API key is not reported");
    const json = await fetch(`${url}/server_info?config_format=json`, { headers });
    const body = (await json.json()) as { vllm_config: Record<string, any> };
    assert.deepEqual(JSON.parse(raw.vllm_config), body.vllm_config, "the text is the object's JSON");
    const c = body.vllm_config;
    assert.equal(c.model, "real");
    assert.equal(c.max_model_len, 128);
    assert.equal(c.runner, "generate");
    assert.equal(c.engine.blockSize, 16);
    assert.equal(c.engine.numGpuBlocks, 64);
    assert.equal(c.engine.enablePrefixCaching, true);
    assert.equal(c.server.api_key_required, true);
    assert.equal(c.server.enable_prompt_tokens_details, true);
    assert.deepEqual(c.launch, { model: "/models/real", apiKey: "<set>", tls: false });
    const bad = await fetch(`${url}/server_info?config_format=yaml`, { headers });
    assert.equal(bad.status, 400);
    assert.equal(((await bad.json()) as { error: { param: string } }).error.param, "config_format");
  });
});

describe("dev mode: off, or an engine without a prefix cache reset", () => {
  let s: TestServer;
  afterEach(() => s.close());

  it("without dev mode the routes 404 like any unknown path", async () => {
    s = await startTestServer();
    for (const [method, path] of [["POST", "/reset_prefix_cache"], ["GET", "/server_info"]] as const) {
      const res = await fetch(`${s.url}${path}`, { method });
      assert.equal(res.status, 404);
      assert.deepEqual(await res.json(), { error: { message: `Route ${method} ${path} not found`, type: "not_found_error", param: null, code: null } });
    }
  });

  it("an engine that cannot reset its prefix cache answers 501", async () => {
    s = await startTestServer({ devMode: true });
    const res = await fetch(`${s.url}/reset_prefix_cache`, { method: "POST" });
    assert.equal(res.status, 501);
    assert.equal(((await res.json()) as { error: { type: string } }).error.type, "server_error");
    const info = (await (await fetch(`${s.url}/server_info?config_format=json`)).json()) as { vllm_config: Record<string, unknown> };
    assert.equal(info.vllm_config.model, MODEL);
    assert.equal(info.vllm_config.engine, null, "the fake engine reports no engine arguments");
  });
});

describe("VLLM_SERVER_DEV_MODE", () => {
  const saved = process.env.VLLM_SERVER_DEV_MODE;
  after(() => {
    if (saved === undefined) delete process.env.VLLM_SERVER_DEV_MODE;
    else process.env.VLLM_SERVER_DEV_MODE = saved;
  });

  it("is read as vLLM reads it: an integer, non-zero on; unset or empty off; anything else an error", () => {
    const read = (v: string | undefined) => {
      if (v === undefined) delete process.env.VLLM_SERVER_DEV_MODE;
      else process.env.VLLM_SERVER_DEV_MODE = v;
      return env.serverDevMode;
    };
    assert.equal(read(undefined), false);
    assert.equal(read(""), false);
    assert.equal(read("0"), false);
    assert.equal(read("1"), true);
    assert.equal(read("2"), true);
    assert.throws(() => read("true"), /VLLM_SERVER_DEV_MODE=true is not an integer/);
  });
});
