// vLLM `serve` flags whose effect shows over HTTP, through one real `kiln serve` on a model directory without its
// weights: --load-format dummy (random weights; the checkpoint is junk), --hf-overrides (the config's length is the
// served max_model_len), --uds (HTTP over a Unix socket), --default-chat-template-kwargs and the content format
// detected from --chat-template, and -O's capture size (the step graphs it compiles).
import assert from "node:assert/strict";
import { copyFileSync, existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { request } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { tinyModelDir } from "../helpers/tiny-model.js";
import { launchKiln, type KilnProcess } from "./kiln-process.js";

// content as OpenAI parts (the template loops over them) and a variable the server's defaults give
const TEMPLATE = "{{ greeting }}|{% for m in messages %}{{ m.role }}:{% for p in m['content'] %}{{ p['text'] }}{% endfor %};{% endfor %}";

let dir: string;
let socket: string;
let server: KilnProcess;

/** One HTTP request over the server's Unix socket; the parsed JSON reply. */
function call(path: string, body?: unknown): Promise<{ status: number; body: any }> {
  return new Promise((resolve, reject) => {
    const req = request({ socketPath: socket, path, method: body === undefined ? "GET" : "POST", headers: { "content-type": "application/json" } }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (d: string) => (text += d));
      res.on("end", () => resolve({ status: res.statusCode!, body: JSON.parse(text) }));
    });
    req.on("error", reject);
    req.end(body === undefined ? undefined : JSON.stringify(body));
  });
}

/** The chat prompt the server renders for `messages` (through /tokenize and /detokenize). */
async function rendered(body: Record<string, unknown>): Promise<string> {
  const t = await call("/tokenize", { model: "m", ...body });
  assert.equal(t.status, 200, JSON.stringify(t.body));
  const d = await call("/detokenize", { model: "m", tokens: t.body.tokens });
  return d.body.prompt as string;
}

describe("kiln serve --load-format dummy --hf-overrides --uds --default-chat-template-kwargs -O", () => {
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "kiln-load-flags-"));
    const model = tinyModelDir("LlamaForCausalLM");
    for (const f of ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"]) copyFileSync(join(model, f), join(dir, f));
    writeFileSync(join(dir, "model.safetensors"), "not a safetensors file");
    socket = join(dir, "kiln.sock");
    server = await launchKiln([
      "serve", dir, "--served-model-name", "m", "--load-format", "dummy", "--hf-overrides", '{"max_position_embeddings": 96}', "--uds", socket,
      "--chat-template", TEMPLATE, "--default-chat-template-kwargs", '{"greeting": "hello"}', "-O", '{"max_cudagraph_capture_size": 4}',
      "--kv-cache-memory", "4MiB",
    ], /Kiln serving m at (unix:\S+)/, 60_000);
  });
  after(async () => {
    await server?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it("listens on the socket only, serving the overridden model length", async () => {
    assert.equal(server.url, `unix:${socket}`);
    const models = await call("/v1/models");
    assert.equal(models.status, 200);
    assert.equal(models.body.data[0].max_model_len, 96);
  });

  it("generates with random weights (the junk checkpoint was never read)", async () => {
    const r = await call("/v1/completions", { model: "m", prompt: "The jury said", max_tokens: 5, temperature: 0, ignore_eos: true });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.usage.completion_tokens, 5);
    assert.match(server.log(), /initialising dummy weights/);
  });

  it("renders chats with the default kwargs under the request's, content as the template's parts", async () => {
    const messages = [{ role: "user", content: "abc" }];
    assert.equal(await rendered({ messages }), "hello|user:abc;");
    assert.equal(await rendered({ messages, chat_template_kwargs: { greeting: "yo" } }), "yo|user:abc;");
    const chat = await call("/v1/chat/completions", { model: "m", messages, max_tokens: 3, temperature: 0 });
    assert.equal(chat.status, 200, JSON.stringify(chat.body));
    assert.equal(chat.body.usage.prompt_tokens, (await call("/tokenize", { model: "m", messages })).body.count);
  });

  it("captures step graphs up to -O's max_cudagraph_capture_size", () => {
    assert.match(server.log(), /step graphs: decode batch sizes 1,2,4, mixed token counts 4;/);
  });

  it("removes its socket when it stops", async () => {
    assert.equal(await server.stop(), 0);
    assert.equal(existsSync(socket), false);
  });
});
