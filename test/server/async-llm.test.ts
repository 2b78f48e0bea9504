// The server over the real AsyncLLM (with the engine's deterministic fake model runner), not the fake engine.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type { FastifyInstance } from "fastify";
import OpenAI from "openai";
import { AsyncLLM } from "../../src/engine/async-llm.js";
import { FakeModelRunner } from "../../src/engine/fake-model-runner.js";
import { createServer } from "../../src/server/index.js";
import { FakeTokenizer } from "./fake-engine.js";
import { freeBlocks, waitFor } from "./helpers.js";

describe("server over AsyncLLM", () => {
  let app: FastifyInstance;
  let url: string;
  let client: OpenAI;
  let engine: AsyncLLM;
  before(async () => {
    const tokenizer = new FakeTokenizer();
    engine = new AsyncLLM({ runner: new FakeModelRunner(tokenizer.vocabSize), tokenizer, engineArgs: { maxModelLen: 128, numGpuBlocks: 256 } });
    app = createServer({ engine, tokenizer, servedModelNames: ["real"], maxModelLen: 128, version: "t" });
    await app.listen({ port: 0, host: "127.0.0.1" });
    url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
    client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "x", maxRetries: 0 });
  });
  after(async () => {
    const closing = app.close();
    app.server.closeAllConnections();
    await closing;
  });

  it("chat and streaming completions with n=2", async () => {
    const r = await client.chat.completions.create({ model: "real", messages: [{ role: "user", content: "hi" }], max_tokens: 5, ignore_eos: true } as never);
    assert.equal(r.usage!.completion_tokens, 5);
    const stream = await client.completions.create({
      model: "real", prompt: "abc", n: 2, max_tokens: 6, stream: true, stream_options: { include_usage: true }, ignore_eos: true,
    } as never) as unknown as AsyncIterable<any>;
    const finishes: string[] = [];
    let usage: any;
    for await (const chunk of stream) {
      for (const c of chunk.choices) if (c.finish_reason) finishes.push(`${c.index}:${c.finish_reason}`);
      if (chunk.usage) usage = chunk.usage;
    }
    assert.deepEqual(finishes.sort(), ["0:length", "1:length"]);
    assert.equal(usage.completion_tokens, 12);
  });

  it("an aborted stream returns its blocks", async () => {
    const start = await freeBlocks(url);
    const controller = new AbortController();
    const stream = await client.completions.create(
      { model: "real", prompt: "x".repeat(40), max_tokens: 80, stream: true, ignore_eos: true } as never, { signal: controller.signal },
    ) as unknown as AsyncIterable<unknown>;
    let n = 0;
    try {
      for await (const _ of stream) if (++n === 3) controller.abort();
    } catch {
      // APIUserAbortError, depending on timing
    }
    await waitFor(async () => (await freeBlocks(url)) === start);
  });

  it("streamInterval and finalOnly pace AsyncLLM's outputs as the worker's (output-pacing.ts)", async () => {
    const run = async (options: { streamInterval?: number; finalOnly?: boolean }, id: string) => {
      const counts: number[] = [];
      let steps = 0;
      for await (const o of engine.generate({ promptTokenIds: [3, 4, 5] }, { maxTokens: 9, ignoreEos: true }, { requestId: id, delta: true, ...options })) {
        counts.push(o.outputs[0]!.tokenIds.length);
        steps += (o.tokenSteps ?? []).reduce((a, st) => a + st.tokens, 0);
      }
      return { counts: counts.filter((n) => n > 0), steps };
    };
    assert.deepEqual(await run({}, "a1"), { counts: [1, 1, 1, 1, 1, 1, 1, 1, 1], steps: 0 });
    assert.deepEqual(await run({ streamInterval: 3 }, "a3"), { counts: [1, 3, 3, 2], steps: 9 });
    const final = await run({ finalOnly: true }, "af"); // the first token, then the rest (9 fake steps take far less than 250 ms)
    assert.deepEqual(final, { counts: [1, 8], steps: 9 });
  });

  it("engine input errors become 400s naming the param", async () => {
    const res = await fetch(`${url}/v1/completions`, {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "real", prompt: "x", seed: 2 ** 70 }),
    });
    const body = (await res.json()) as any;
    assert.equal(res.status, 400, JSON.stringify(body));
    assert.equal(body.error.param, "seed"); // an integer to the server, out of range for the engine
  });
});

describe("server over AsyncLLM whose step fails", () => {
  it("the failed step ends its streams with the error, /health answers 503 and later requests are refused, as the worker engine's", async () => {
    const tokenizer = new FakeTokenizer();
    const runner = new FakeModelRunner(tokenizer.vocabSize, {
      override: (context) => {
        if (context[0] === 5 && context.length > 4) throw new Error("the step failed");
      },
    });
    const engine = new AsyncLLM({ runner, tokenizer, engineArgs: { maxModelLen: 128, numGpuBlocks: 64 } });
    const app = createServer({ engine, tokenizer, servedModelNames: ["real"], maxModelLen: 128, version: "t" });
    await app.listen({ port: 0, host: "127.0.0.1" });
    const url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
    const complete = (prompt: number[]) =>
      fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "real", prompt, max_tokens: 4, ignore_eos: true }) });
    try {
      assert.equal((await fetch(`${url}/health`)).status, 200);
      assert.equal((await complete([6, 7])).status, 200);
      const failed = await complete([5, 6, 7]);
      assert.equal(failed.status, 500);
      assert.match(await failed.text(), /the step failed/);
      assert.equal((await fetch(`${url}/health`)).status, 503);
      assert.equal(engine.deadError()?.message, "the step failed");
      const later = await complete([6, 7]);
      assert.equal(later.status, 500, "the engine state is not trusted after a failed step");
    } finally {
      await app.close();
    }
  });
});

describe("AsyncLLM.close", () => {
  it("ends the running streams with an error, frees their blocks and refuses later requests", async () => {
    const tokenizer = new FakeTokenizer();
    const engine = new AsyncLLM({ runner: new FakeModelRunner(tokenizer.vocabSize), tokenizer, engineArgs: { maxModelLen: 128, numGpuBlocks: 64 } });
    const stream = engine.generate({ promptTokenIds: [5, 6, 7] }, { maxTokens: 100, ignoreEos: true }, { requestId: "r" })[Symbol.asyncIterator]();
    await stream.next();
    await engine.close();
    await assert.rejects(stream.next(), /the engine was closed/);
    assert.equal(engine.engine.hasUnfinishedRequests(), false);
    assert.equal(engine.stats().kvCacheUsage, 0);
    assert.throws(() => engine.generate({ promptTokenIds: [5] }, { maxTokens: 2 }, { requestId: "s" }), /the engine was closed/);
  });
});
