// --enable-force-include-usage (vLLM's): streamed chat and completions end with a usage chunk even when the request
// sent no stream_options; without the flag they do not. The usage counts the tokens the stream carried.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { MODEL, startTestServer, type TestServer } from "./helpers.js";

describe("--enable-force-include-usage", () => {
  let forced: TestServer, plain: TestServer;
  before(async () => {
    [forced, plain] = await Promise.all([startTestServer({ forceIncludeUsage: true }), startTestServer()]);
  });
  after(async () => {
    await Promise.all([forced.close(), plain.close()]);
  });

  it("chat: the last chunk carries usage only on the forcing server", async () => {
    for (const [server, want] of [[forced, true], [plain, false]] as const) {
      const stream = await server.client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "hi there" }], max_tokens: 5, stream: true, ignore_eos: true } as never) as unknown as AsyncIterable<{ choices: { delta?: { content?: string } }[]; usage?: { completion_tokens: number; total_tokens: number; prompt_tokens: number } | null }>;
      const chunks = [];
      for await (const c of stream) chunks.push(c);
      const last = chunks[chunks.length - 1]!;
      if (want) {
        assert.deepEqual(last.choices, []);
        assert.equal(last.usage!.completion_tokens, 5);
        assert.equal(last.usage!.total_tokens, last.usage!.prompt_tokens + 5);
      } else assert.ok(chunks.every((c) => c.usage === undefined || c.usage === null), "no usage without the flag");
    }
  });

  it("completions: the same, and a request's own include_usage still works without the flag", async () => {
    const usageOf = async (server: TestServer, extra: object) => {
      let usage: { completion_tokens: number } | null | undefined;
      const stream = await server.client.completions.create({ model: MODEL, prompt: "hello", max_tokens: 3, stream: true, ignore_eos: true, ...extra } as never) as unknown as AsyncIterable<{ usage?: { completion_tokens: number } | null }>;
      for await (const c of stream) if (c.usage) usage = c.usage;
      return usage;
    };
    assert.equal((await usageOf(forced, {}))?.completion_tokens, 3);
    assert.equal(await usageOf(plain, {}), undefined);
    assert.equal((await usageOf(plain, { stream_options: { include_usage: true } }))?.completion_tokens, 3);
  });
});
