// Graceful shutdown drains every request being handled, including one that has not reached the engine yet
// (still being parsed, tokenized or queued): its connection is not cut.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { createServer } from "../../src/server/index.js";
import { serveUntilSignal } from "../../src/server/shutdown.js";
import { FakeEngine } from "./fake-engine.js";
import { MODEL } from "./helpers.js";

describe("graceful shutdown", () => {
  it("a request still in its handler when the signal comes gets its response", async () => {
    const engine = new FakeEngine();
    const app = createServer({ engine, tokenizer: engine.tokenizer, servedModelNames: [MODEL], maxModelLen: engine.maxModelLen, version: "0.1.0-test" });
    // a handler that takes a while before anything reaches the engine (as a first structured-output compile does)
    app.get("/slow", async () => {
      await new Promise((r) => setTimeout(r, 1500));
      return { ok: true };
    });
    await app.listen({ port: 0, host: "127.0.0.1" });
    const addr = app.server.address() as { port: number };
    const stopped = serveUntilSignal(app, { signals: ["SIGUSR2"], exit: false, log: () => {} });
    const slow = fetch(`http://127.0.0.1:${addr.port}/slow`).then(
      async (r) => ({ status: r.status, body: (await r.json()) as unknown }),
      (e: Error) => ({ status: 0, body: e.message }),
    );
    // the request is in its handler, not in the engine (polled: a loaded machine may take a while to deliver it)
    for (let t = 0; t < 300 && app.kilnActive() === 0; t++) await new Promise((r) => setTimeout(r, 5));
    assert.equal(app.kilnInflight(), 0);
    assert.equal(app.kilnActive(), 1);
    process.emit("SIGUSR2", "SIGUSR2");
    assert.deepEqual(await slow, { status: 200, body: { ok: true } });
    assert.equal(await stopped, "SIGUSR2");
  });
});
