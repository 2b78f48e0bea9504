// `kiln run-batch` (vLLM's run-batch) over the fake engine: each line's result equals what the same request gets from
// a server over HTTP (the fake engine is deterministic in the prompt), lines come back in input order with their
// custom_id, failures carry the server's error object and status, streamed and unsupported requests are refused as
// vLLM refuses them, a malformed input line stops the command before any model loads, input and output may be http(s)
// URLs, --enable-metrics serves /metrics while the batch runs, and an image-text model's chat lines take images.
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Writable } from "node:stream";
import { after, before, describe, it } from "node:test";
import type { EngineFactory } from "../../src/cli/engine-factory.js";
import { main } from "../../src/cli/main.js";
import { runBatch, type BatchRequestOutput } from "../../src/cli/run-batch.js";
import { parseServeArgs } from "../../src/cli/serve-args.js";
import { dataUrl, gemma3TextThenImageIds, png, tinyVisionEngine } from "../helpers/image-fixture.js";
import { FakeEngine, type FakeEngineOptions } from "../server/fake-engine.js";
import { startTestServer, type TestServer } from "../server/helpers.js";

const MODEL = "fake-model";

function factory(options: FakeEngineOptions = {}, loads = { n: 0 }): EngineFactory {
  return async (args) => {
    loads.n++;
    const engine = new FakeEngine({ maxModelLen: args.maxModelLen ?? 256, ...options });
    return { engine, tokenizer: engine.tokenizer, maxModelLen: engine.maxModelLen, modelName: MODEL, close: async () => {} };
  };
}

// temperature 0: the fake engine's greedy tokens depend on the prompt alone
const chat = (content: string, extra: object = {}) => ({ model: MODEL, messages: [{ role: "user", content }], max_tokens: 6, temperature: 0, ...extra });
const line = (custom_id: string, url: string, body: object) => JSON.stringify({ custom_id, method: "POST", url, body });

function quiet(): Writable & { text: () => string } {
  let text = "";
  const w = new Writable({ write: (c: Buffer, _e, cb) => ((text += c.toString()), cb()) }) as Writable & { text: () => string };
  w.text = () => text;
  return w;
}

describe("kiln run-batch", () => {
  const dir = mkdtempSync(join(tmpdir(), "kiln-run-batch-"));
  let http: TestServer;
  before(async () => {
    http = await startTestServer({ servedModelNames: [MODEL] });
  });
  after(() => http.close());

  const viaHttp = async (url: string, body: object) => {
    const r = await fetch(`${http.url}${url}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    return { status: r.status, json: (await r.json()) as any };
  };

  it("answers each line as the server answers it over HTTP, in input order", async () => {
    const input = join(dir, "in.jsonl"), output = join(dir, "out.jsonl");
    const requests: [string, string, object][] = [
      ["c1", "/v1/chat/completions", chat("first question")],
      ["c2", "/v1/chat/completions", chat("a second, longer question", { temperature: 0, max_tokens: 3 })],
      ["p1", "/v1/completions", { model: MODEL, prompt: "Once upon", max_tokens: 4, temperature: 0 }],
      ["bad-temp", "/v1/chat/completions", chat("x", { temperature: -1 })],
      ["bad-model", "/v1/chat/completions", { ...chat("x"), model: "nope" }],
      ["streamed", "/v1/chat/completions", chat("x", { stream: true })],
      ["models", "/v1/models", {}],
    ];
    writeFileSync(input, requests.map(([id, url, body]) => line(id, url, body)).join("\n") + "\n\n");
    const code = await main(["node", "kiln", "run-batch", "-i", input, "-o", output, "--served-model-name", MODEL], { engineFactory: factory() });
    assert.equal(code, 0);
    const out = readFileSync(output, "utf8").trim().split("\n").map((l) => JSON.parse(l) as BatchRequestOutput);
    assert.deepEqual(out.map((o) => o.custom_id), requests.map(([id]) => id));
    assert.equal(new Set(out.map((o) => o.id)).size, out.length, "ids are unique");
    for (const [i, [, url, body]] of requests.slice(0, 3).entries()) {
      const o = out[i]!;
      const ref = await viaHttp(url, body);
      assert.equal(ref.status, 200);
      assert.equal(o.error, null);
      assert.equal(o.response.status_code, 200);
      const got = o.response.body as any;
      assert.equal(got.object, ref.json.object);
      assert.deepEqual(got.choices, ref.json.choices, `line ${i + 1}: the same reply as over HTTP`);
      assert.deepEqual(got.usage, ref.json.usage);
    }
    for (const [i, status, param] of [[3, 400, "temperature"], [4, 404, "model"]] as const) {
      const o = out[i]!;
      const ref = await viaHttp(requests[i]![1], requests[i]![2]);
      assert.equal(o.response.status_code, status);
      assert.equal(ref.status, status);
      assert.equal(o.response.body, null);
      assert.deepEqual(o.error, ref.json, "the server's error object");
      assert.equal((o.error as any).error.param, param);
    }
    assert.equal(out[5]!.error, "Request must not be sent in stream mode");
    assert.equal(out[5]!.response.status_code, 400);
    assert.match(out[6]!.error as string, /^URL \/v1\/models was used\. Supported endpoints: \/v1\/chat\/completions, /);
  });

  it("serves an image-text model's chat lines with image_url parts, as kiln serve does", async () => {
    const { dir: model, setup, engine } = tinyVisionEngine();
    const real: EngineFactory = async () => ({ engine, tokenizer: setup.loaded.tokenizer, maxModelLen: 128, modelName: MODEL, close: async () => {} });
    const withImage = (url: string) => ({
      model: MODEL, max_tokens: 3, temperature: 0, return_token_ids: true,
      messages: [{ role: "user", content: [{ type: "text", text: "What is in this image?" }, { type: "image_url", image_url: { url } }] }],
    });
    const input = join(dir, "images.jsonl"), output = join(dir, "images-out.jsonl");
    writeFileSync(input, [line("img", "/v1/chat/completions", withImage(dataUrl(png(1)))), line("bad", "/v1/chat/completions", withImage("data:image/png;base64,@@@"))].join("\n"));
    const code = await main(["node", "kiln", "run-batch", "-i", input, "-o", output, model, "--served-model-name", MODEL, "--chat-template-content-format", "openai"], { engineFactory: real });
    assert.equal(code, 0);
    const [ok, bad] = readFileSync(output, "utf8").trim().split("\n").map((l) => JSON.parse(l) as BatchRequestOutput);
    assert.equal(ok!.error, null);
    assert.deepEqual((ok!.response.body as any).prompt_token_ids, gemma3TextThenImageIds(setup.loaded.tokenizer, "What is in this image?", 4));
    assert.equal((ok!.response.body as any).choices[0].message.role, "assistant");
    assert.equal(bad!.response.status_code, 400);
    assert.equal((bad!.error as any).error.param, "messages[0].content[1].image_url");
  });

  it("refuses a malformed line, naming it, before loading the model", async () => {
    const input = join(dir, "bad.jsonl");
    const loads = { n: 0 };
    for (const [text, pattern] of [
      [`${line("a", "/v1/completions", { prompt: "x" })}\n{not json`, /bad\.jsonl line 2 is not JSON/],
      [JSON.stringify({ custom_id: 7, method: "POST", url: "/v1/completions", body: {} }), /line 1: 'custom_id' must be a string/],
      [JSON.stringify({ custom_id: "a", method: "GET", url: "/v1/completions", body: {} }), /line 1: 'method' must be "POST"/],
      [JSON.stringify({ custom_id: "a", method: "POST", url: "/v1/completions", body: [] }), /line 1: 'body' must be a JSON object/],
    ] as const) {
      writeFileSync(input, text);
      await assert.rejects(runBatch(parseServeArgs(undefined, {}), { inputFile: input, outputFile: join(dir, "never.jsonl"), enableMetrics: false, metricsHost: "127.0.0.1", metricsPort: 0 }, factory({}, loads), quiet()), pattern);
    }
    assert.equal(loads.n, 0);
    const code = await main(["node", "kiln", "run-batch", "-i", join(dir, "missing.jsonl"), "-o", join(dir, "x.jsonl")], { engineFactory: factory({}, loads) });
    assert.equal(code, 2, "a usage error");
  });

  it("reads and writes http(s) URLs, and serves /metrics while it runs", async () => {
    const body = [line("u1", "/v1/completions", { model: MODEL, prompt: "abc", max_tokens: 5 }), line("u2", "/v1/completions", { model: MODEL, prompt: "abd", max_tokens: 5 })].join("\n");
    let put = "";
    const files = createServer((req, res) => {
      if (req.method === "GET" && req.url === "/in.jsonl") return void res.end(body);
      if (req.method === "PUT" && req.url === "/out.jsonl") {
        req.on("data", (c: Buffer) => (put += c.toString()));
        req.on("end", () => res.writeHead(201).end());
        return;
      }
      res.writeHead(404).end();
    });
    await new Promise<void>((r) => files.listen(0, "127.0.0.1", r));
    const base = `http://127.0.0.1:${(files.address() as { port: number }).port}`;
    const log = quiet();
    let scraped = "";
    // the fake engine pauses 40 ms per token: /metrics is read while the batch runs
    const scrape = (async () => {
      for (let i = 0; i < 100 && scraped === ""; i++) {
        await new Promise((r) => setTimeout(r, 10));
        const port = /metrics at http:\/\/127\.0\.0\.1:(\d+)\/metrics/.exec(log.text())?.[1];
        if (port !== undefined) scraped = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
      }
    })();
    try {
      const out = await runBatch(parseServeArgs(undefined, { servedModelName: [MODEL] }),
        { inputFile: `${base}/in.jsonl`, outputFile: `${base}/out.jsonl`, enableMetrics: true, metricsHost: "127.0.0.1", metricsPort: 0 },
        factory({ stepDelayMs: 40 }), log);
      await scrape;
      assert.deepEqual(put.trim().split("\n").map((l) => (JSON.parse(l) as BatchRequestOutput).custom_id), ["u1", "u2"]);
      assert.deepEqual(out.map((o) => o.response.status_code), [200, 200]);
      assert.match(scraped, /^vllm:num_requests_running/m, "Prometheus text from the batch's own server");
      await assert.rejects(
        runBatch(parseServeArgs(undefined, {}), { inputFile: `${base}/missing.jsonl`, outputFile: join(dir, "y.jsonl"), enableMetrics: false, metricsHost: "127.0.0.1", metricsPort: 0 }, factory(), quiet()),
        /missing\.jsonl: GET answered 404/,
      );
    } finally {
      files.close();
    }
  });
});
