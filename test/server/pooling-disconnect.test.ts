// A client that leaves a many-input pooling request (/v1/embeddings, /v1/score, /v1/rerank) aborts all its engine
// requests with one engine.abort call, which a worker engine sends as one message (test/engine/worker-engine.test.ts):
// one message per input let the worker run engine steps between them (an abort of ~3000 inputs held the next
// request ~3 s).
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { MODEL, startTestServer, waitFor, type TestServer } from "./helpers.js";

describe("pooling requests whose client leaves", () => {
  let s: TestServer;
  before(async () => {
    // each fake step waits 1 s: the requests are still running when the client goes
    s = await startTestServer({ runner: "pooling" }, { stepDelayMs: 1000 });
  });
  after(() => s.close());

  const docs = Array.from({ length: 40 }, (_, i) => `document ${i}`);
  const cases: [string, Record<string, unknown>, number][] = [
    ["/v1/embeddings", { input: docs }, 40],
    ["/v1/score", { text_1: "query", text_2: docs }, 41],
    ["/v1/rerank", { query: "query", documents: docs }, 41],
  ];
  for (const [path, body, inputs] of cases) {
    it(`${path}: one abort call for all ${inputs} engine requests`, async () => {
      const calls = s.engine.abortCalls.length;
      const controller = new AbortController();
      const res = fetch(`${s.url}${path}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: MODEL, ...body }),
        signal: controller.signal,
      });
      await waitFor(() => s.engine.stats().numRunning === inputs);
      controller.abort();
      await assert.rejects(res);
      await waitFor(() => s.engine.stats().numRunning === 0 && s.app.kilnInflight() === 0);
      assert.equal(s.engine.abortCalls.length, calls + 1, "one engine.abort call");
      assert.equal(s.engine.abortCalls.at(-1)!.length, inputs);
    });
  }
});
