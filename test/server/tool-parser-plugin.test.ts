// --tool-parser-plugin (vLLM's): a module registering tool-call parsers, then named by --tool-call-parser. The plugin
// here reads `CALL name {json}` (a format no built-in parser reads): `kiln serve` imports it before parsing its flags,
// and a server using its parser answers a scripted reply with the call it wrote, whole and streamed.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import OpenAIClient from "openai";
import type { EngineFactory } from "../../src/cli/engine-factory.js";
import { main } from "../../src/cli/main.js";
import { CliUsageError, type ServeArgs } from "../../src/cli/serve-args.js";
import { createServer } from "../../src/server/index.js";
import { toolCallParser } from "../../src/server/tool-parsers.js";
import { FakeEngine } from "./fake-engine.js";
import { MODEL } from "./helpers.js";

const PLUGIN = `
const MARK = "CALL ";
export const toolParsers = {
  bracket_calls: {
    streamable(text, sent) {
      const at = text.indexOf(MARK);
      return Math.max(sent, at >= 0 ? at : text.length - (MARK.length - 1)); // (a marker's start may be cut off)
    },
    extract(text) {
      const m = /CALL (\\w+) (\\{.*\\})\\s*$/s.exec(text);
      if (!m) return null;
      const content = text.slice(0, m.index);
      return { content: content === "" ? null : content, calls: [{ name: m[1], arguments: m[2] }] };
    },
  },
};
`;

describe("--tool-parser-plugin", () => {
  const dir = mkdtempSync(join(tmpdir(), "kiln-parser-plugin-"));
  const plugin = join(dir, "bracket.mjs");
  writeFileSync(plugin, PLUGIN);
  after(() => rmSync(dir, { recursive: true }));

  /** The ServeArgs `kiln serve argv` parses (the engine factory stops before anything loads), or the exit code. */
  async function serveArgs(...argv: string[]): Promise<{ code: number; args: ServeArgs | null; stderr: string }> {
    let args: ServeArgs | null = null;
    const factory: EngineFactory = async (a) => {
      args = a;
      throw new CliUsageError("stop before loading");
    };
    let stderr = "";
    const write = process.stderr.write;
    process.stderr.write = (s: string | Uint8Array) => ((stderr += String(s)), true);
    try {
      const code = await main(["node", "kiln", "serve", "m", ...argv], { engineFactory: factory });
      return { code, args, stderr };
    } finally {
      process.stderr.write = write;
    }
  }

  it("kiln serve imports the plugin before its flags, so --tool-call-parser takes the plugin's name; bad plugins are usage errors", async () => {
    const ok = await serveArgs("--tool-parser-plugin", plugin, "--enable-auto-tool-choice", "--tool-call-parser", "bracket_calls");
    assert.equal(ok.args?.toolCallParser, "bracket_calls");
    assert.deepEqual(toolCallParser("bracket_calls").extract('Sure. CALL f {"a": 1}'), { content: "Sure. ", calls: [{ name: "f", arguments: '{"a": 1}' }] });
    const unknown = await serveArgs("--enable-auto-tool-choice", "--tool-call-parser", "nope_calls");
    assert.equal(unknown.code, 2);
    assert.match(unknown.stderr, /--tool-call-parser must be one of hermes, .*bracket_calls, got "nope_calls"/);
    const missing = await serveArgs("--tool-parser-plugin", join(dir, "missing.mjs"));
    assert.match(missing.stderr, /--tool-parser-plugin .*missing\.mjs: cannot import it/);
    writeFileSync(join(dir, "bad.mjs"), "export const toolParsers = { broken: { extract() { return null; } } };\n");
    const bad = await serveArgs("--tool-parser-plugin", join(dir, "bad.mjs"));
    assert.match(bad.stderr, /--tool-parser-plugin .*bad\.mjs: tool-call parser "broken" must have streamable\(text, sent\) and extract\(text, tools\) methods/);
    writeFileSync(join(dir, "empty.mjs"), "export const other = 1;\n");
    assert.match((await serveArgs("--tool-parser-plugin", join(dir, "empty.mjs"))).stderr, /must export `toolParsers`/);
  });

  describe("a server with the plugin's parser", () => {
    const reply = 'Let me look that up. CALL get_weather {"city": "Paris"}';
    const engine = new FakeEngine({ script: () => reply });
    let client: OpenAIClient;
    let close: () => Promise<void>;
    before(async () => {
      const app = createServer({ engine, tokenizer: engine.tokenizer, servedModelNames: [MODEL], maxModelLen: engine.maxModelLen, version: "0.1.0-test", toolCallParser: "bracket_calls" });
      await app.listen({ port: 0, host: "127.0.0.1" });
      client = new OpenAIClient({ baseURL: `http://127.0.0.1:${(app.server.address() as { port: number }).port}/v1`, apiKey: "unused", maxRetries: 0 });
      close = async () => {
        const c = app.close();
        app.server.closeAllConnections();
        await c;
      };
    });
    after(() => close());
    const tools = [{ type: "function" as const, function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } } }];

    it("answers the scripted reply with its call, whole and streamed", async () => {
      const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "weather?" }], tools, max_tokens: 64 });
      const m = r.choices[0]!.message;
      assert.equal(m.content, "Let me look that up. ");
      assert.deepEqual(m.tool_calls?.map((c) => [c.type, c.type === "function" ? c.function.name : "", c.type === "function" ? JSON.parse(c.function.arguments) : null]), [["function", "get_weather", { city: "Paris" }]]);
      assert.equal(r.choices[0]!.finish_reason, "tool_calls");
      const stream = await client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "weather?" }], tools, max_tokens: 64, stream: true });
      let content = "";
      let args = "";
      for await (const c of stream) {
        content += c.choices[0]?.delta.content ?? "";
        for (const t of c.choices[0]?.delta.tool_calls ?? []) args += t.function?.arguments ?? "";
      }
      assert.equal(content, "Let me look that up. ");
      assert.deepEqual(JSON.parse(args), { city: "Paris" });
    });
  });
});
