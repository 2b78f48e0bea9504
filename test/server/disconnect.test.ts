// Clients that go away mid-request free their KV blocks at once; fifty concurrent streams with aborts.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { freeBlocks, MODEL, startTestServer, waitFor, type TestServer } from "./helpers.js";

describe("disconnects", () => {
  let s: TestServer;
  before(async () => {
    s = await startTestServer({}, { stepDelayMs: 5, maxModelLen: 256 });
  });
  after(() => s.close());

  it("aborting a stream mid-way frees its blocks", async () => {
    const start = await freeBlocks(s.url);
    const controller = new AbortController();
    const stream = await s.client.chat.completions.create(
      { model: MODEL, messages: [{ role: "user", content: "long story" }], stream: true, ignore_eos: true, max_tokens: 200 } as never,
      { signal: controller.signal },
    );
    let n = 0;
    // The openai client ends an aborted stream quietly (or throws an AbortError, depending on timing).
    try {
      for await (const _chunk of stream as unknown as AsyncIterable<unknown>) if (++n === 5) controller.abort();
    } catch (err) {
      assert.equal((err as Error).name, "APIUserAbortError");
    }
    assert.equal(n, 5);
    await waitFor(async () => (await freeBlocks(s.url)) === start);
    assert.equal(s.engine.aborted.length, 1);
  });

  it("a non-streaming request whose client leaves is aborted too", async () => {
    const start = await freeBlocks(s.url);
    const controller = new AbortController();
    const req = s.client.completions.create({ model: MODEL, prompt: "wait", max_tokens: 200, ignore_eos: true } as never, { signal: controller.signal });
    await waitFor(() => s.engine.stats().numRunning === 1);
    assert.ok((await freeBlocks(s.url)) < start);
    controller.abort();
    await assert.rejects(req);
    await waitFor(async () => (await freeBlocks(s.url)) === start);
    assert.equal(s.engine.stats().numRunning, 0);
  });

  it("fifty concurrent streams, a fifth aborted at random points: the rest complete, blocks return", async () => {
    const start = await freeBlocks(s.url);
    let seed = 42;
    const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    const jobs = Array.from({ length: 50 }, async (_, i) => {
      const abortAt = i % 5 === 0 ? 1 + Math.floor(rand() * 15) : -1;
      const controller = new AbortController();
      const stream = await s.client.completions.create(
        { model: MODEL, prompt: `client ${i}`, max_tokens: 20, stream: true, ignore_eos: true, stream_options: { include_usage: true } } as never,
        { signal: controller.signal },
      ) as unknown as AsyncIterable<any>;
      let chunks = 0;
      let text = "";
      let finish: string | null = null;
      try {
        for await (const chunk of stream) {
          for (const c of chunk.choices) {
            text += c.text;
            finish = c.finish_reason ?? finish;
          }
          if (++chunks === abortAt) controller.abort();
        }
      } catch (err) {
        if (abortAt < 0) throw err;
      }
      if (abortAt > 0) {
        assert.equal(finish, null, "an aborted client should not see the end");
        return "aborted";
      }
      assert.equal(text.length, 20);
      assert.equal(finish, "length");
      return "done";
    });
    const results = await Promise.all(jobs);
    assert.equal(results.filter((r) => r === "done").length, 40);
    await waitFor(async () => (await freeBlocks(s.url)) === start, 5000);
    assert.equal(s.engine.stats().numRunning, 0);
  });
});
