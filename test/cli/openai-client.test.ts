// `kiln chat --url` and `kiln complete` (vLLM's `vllm chat` / `vllm complete`): what they send, checked against a
// recording HTTP server, and what they print, checked against the official `openai` client's replies from a real
// `kiln serve` (fake engine: its tokens are a hash of the context, so equal requests get equal replies).
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";
import { spawnServe, type ServeChild } from "./serve-child.js";

const root = fileURLToPath(new URL("../../..", import.meta.url)); // dist/test/cli -> package root

interface Run {
  status: number | null;
  stdout: string;
  stderr: string;
}

/** `kiln ...args` as a child (asynchronously: the recording server below runs in this process). */
function kiln(args: string[], { input = "", env = {} }: { input?: string; env?: Record<string, string> } = {}): Promise<Run> {
  const child = spawn(`${root}/bin/kiln`, args, { env: { ...process.env, OPENAI_API_KEY: "", ...env } });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d) => (stdout += d));
  child.stderr.on("data", (d) => (stderr += d));
  child.stdin.end(input);
  return new Promise((resolve) => child.on("close", (status) => resolve({ status, stdout, stderr })));
}

interface Recorded {
  method: string;
  url: string;
  authorization: string | undefined;
  body: Record<string, unknown> | null;
}

/** An OpenAI-style server that records each request and streams two text pieces (or fails as told). */
async function recordingServer(): Promise<{ server: Server; url: string; requests: Recorded[]; fail: { status: number } | null }> {
  const state = { requests: [] as Recorded[], fail: null as { status: number } | null };
  const read = (req: IncomingMessage): Promise<string> => new Promise((resolve) => {
    let s = "";
    req.on("data", (d) => (s += d));
    req.on("end", () => resolve(s));
  });
  const server = createServer(async (req, res) => {
    const text = await read(req);
    state.requests.push({ method: req.method!, url: req.url!, authorization: req.headers.authorization, body: text ? (JSON.parse(text) as Record<string, unknown>) : null });
    if (state.fail) {
      res.writeHead(state.fail.status, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { message: "Incorrect API key provided", type: "invalid_request_error", code: null } }));
      return;
    }
    if (req.url === "/v1/models") {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ object: "list", data: [{ id: "first-model", object: "model" }, { id: "second", object: "model" }] }));
      return;
    }
    res.writeHead(200, { "content-type": "text/event-stream" });
    const chat = req.url === "/v1/chat/completions";
    const piece = (t: string) => ({ choices: [chat ? { index: 0, delta: { content: t } } : { index: 0, text: t }] });
    for (const chunk of [piece("Hello"), piece(", world"), { choices: [], usage: { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 } }])
      res.write(`data: ${JSON.stringify(chunk)}\n\n`);
    res.end("data: [DONE]\n\n");
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const out = { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, requests: state.requests, get fail() { return state.fail; }, set fail(f) { state.fail = f; } };
  return out;
}

describe("kiln complete / kiln chat --url (vllm complete / vllm chat)", () => {
  let rec: Awaited<ReturnType<typeof recordingServer>>;
  before(async () => {
    rec = await recordingServer();
  });
  after(() => rec.server.close());

  it("complete --quick asks the server's first model, streams, and sends only the flags given", async () => {
    rec.requests.length = 0;
    const r = await kiln(["complete", "--url", rec.url, "-q", "Once upon", "--max-tokens", "5"]);
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout, "Using model: first-model\nHello, world\n");
    assert.deepEqual(rec.requests.map((q) => `${q.method} ${q.url}`), ["GET /v1/models", "POST /v1/completions"]);
    assert.deepEqual(rec.requests[1]!.body, { model: "first-model", prompt: "Once upon", max_tokens: 5, stream: true });
    assert.equal(rec.requests[1]!.authorization, undefined);
  });

  it("--model-name skips the model list; --api-key (else OPENAI_API_KEY) is the bearer token; --stats asks for usage and prints it", async () => {
    rec.requests.length = 0;
    const r = await kiln(["complete", "--url", rec.url, "--model-name", "second", "--stats", "-q", "x"], { env: { OPENAI_API_KEY: "from-env" } });
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(rec.requests.map((q) => q.url), ["/v1/completions"]);
    assert.equal(rec.requests[0]!.authorization, "Bearer from-env");
    assert.deepEqual(rec.requests[0]!.body, { model: "second", prompt: "x", stream: true, stream_options: { include_usage: true } });
    assert.match(r.stdout, /^Using model: second\nHello, world\nTTFT: \d+\.\d\d ms\nTPS:  \d+\.\d\d tokens\/s \(4 tokens in \d+\.\d\ds\)\n$/);
    rec.requests.length = 0;
    const keyed = await kiln(["chat", "--api-key", "k1", "--url", rec.url, "-q", "hi"], { env: { OPENAI_API_KEY: "from-env" } });
    assert.equal(keyed.status, 0, keyed.stderr);
    assert.equal(rec.requests.at(-1)!.authorization, "Bearer k1");
  });

  it("chat keeps the conversation, system prompt first, reading lines until the input ends", async () => {
    rec.requests.length = 0;
    const r = await kiln(["chat", "--url", rec.url, "--system-prompt", "Be brief.", "--temperature", "0"], { input: "first\nsecond\n" });
    assert.equal(r.status, 0, r.stderr);
    const posts = rec.requests.filter((q) => q.method === "POST").map((q) => q.body);
    assert.deepEqual(posts, [
      { model: "first-model", temperature: 0, stream: true, messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "first" }] },
      {
        model: "first-model", temperature: 0, stream: true,
        messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "first" }, { role: "assistant", content: "Hello, world" }, { role: "user", content: "second" }],
      },
    ]);
    assert.equal((r.stdout.match(/Hello, world\n/g) ?? []).length, 2, r.stdout);
  });

  it("a server error is printed with its message (exit 1); an unreachable server names the URL", async () => {
    rec.fail = { status: 401 };
    try {
      const r = await kiln(["complete", "--url", rec.url, "-q", "x"]);
      assert.equal(r.status, 1);
      assert.match(r.stderr, /kiln: error: .*\/v1\/models answered 401: Incorrect API key provided/);
    } finally {
      rec.fail = null;
    }
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, "127.0.0.1", resolve));
    const port = (closed.address() as AddressInfo).port;
    await new Promise((resolve) => closed.close(resolve));
    const down = await kiln(["chat", "--url", `http://127.0.0.1:${port}/v1`, "-q", "x"]);
    assert.equal(down.status, 1);
    assert.match(down.stderr, new RegExp(`cannot reach http://127\\.0\\.0\\.1:${port}/v1/models: ECONNREFUSED`));
  });

  it("refuses engine flags with --url, and --stats without it, as usage errors", async () => {
    const r = await kiln(["chat", "--url", rec.url, "--dtype", "float32", "--max-model-len", "64", "-q", "x"]);
    assert.equal(r.status, 2);
    assert.match(r.stderr, /--dtype, --max-model-len configure a model loaded here: with --url the server's model answers/);
    const stats = await kiln(["chat", "--stats", "-q", "x"]);
    assert.equal(stats.status, 2);
    assert.match(stats.stderr, /--stats times a server's replies: give its --url/);
    const bad = await kiln(["complete", "--url", rec.url, "--max-tokens", "0", "-q", "x"]);
    assert.equal(bad.status, 2);
    assert.match(bad.stderr, /--max-tokens must be an integer >= 1/);
  });
});

describe("kiln chat --url against kiln serve", () => {
  let serve: ServeChild;
  before(async () => {
    // greedy by default: the fake engine samples at random otherwise, and vLLM's clients send no temperature
    serve = await spawnServe(["--host", "127.0.0.1", "--port", "0", "--override-generation-config", '{"temperature": 0}']);
  });
  after(() => serve.child.kill("SIGKILL"));

  it("prints the replies the openai client gets for the same conversation", async () => {
    const r = await kiln(["chat", "--url", `${serve.url}/v1`, "--system", "sys", "--max-tokens", "12"], { input: "hello\nagain\n" });
    assert.equal(r.status, 0, r.stderr);
    const client = new OpenAI({ baseURL: `${serve.url}/v1`, apiKey: "unused" });
    const model = (await client.models.list()).data[0]!.id;
    const ask = async (messages: OpenAI.ChatCompletionMessageParam[]) =>
      (await client.chat.completions.create({ model, messages, max_tokens: 12 })).choices[0]!.message.content!;
    const first = await ask([{ role: "system", content: "sys" }, { role: "user", content: "hello" }]);
    const second = await ask([{ role: "system", content: "sys" }, { role: "user", content: "hello" }, { role: "assistant", content: first }, { role: "user", content: "again" }]);
    assert.ok(first.length > 0 && first !== second, `${first} / ${second}`);
    assert.equal(r.stdout, `Using model: ${model}\nPlease enter a message for the chat model (/reset clears the conversation, /exit or Ctrl-D quits):\n> ${first}\n> ${second}\n> \n`);
  });

  it("complete --quick prints the completion the openai client gets", async () => {
    const r = await kiln(["complete", "--url", `${serve.url}/v1`, "--max-tokens", "9", "-q", "The jury"]);
    assert.equal(r.status, 0, r.stderr);
    const client = new OpenAI({ baseURL: `${serve.url}/v1`, apiKey: "unused" });
    const model = (await client.models.list()).data[0]!.id;
    const text = (await client.completions.create({ model, prompt: "The jury", max_tokens: 9 })).choices[0]!.text;
    assert.equal(r.stdout, `Using model: ${model}\n${text}\n`);
  });

  it("kiln bench serve takes vLLM's command line (openai-chat backend, --host/--port, --goodput)", async () => {
    const port = new URL(serve.url).port;
    const r = await kiln(["bench", "serve", "--backend", "openai-chat", "--host", "127.0.0.1", "--port", port, "--dataset-name", "random",
      "--random-input-len", "8", "--random-output-len", "4", "--num-prompts", "3", "--ignore-eos", "--goodput", "e2el:600000", "--disable-tqdm"]);
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^Successful requests: +3$/m);
    assert.match(r.stdout, /^Total generated tokens: +12$/m);
    assert.match(r.stdout, /^Request goodput \(req\/s\): +\d/m);
  });
});
