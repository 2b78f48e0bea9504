// vLLM's `serve` flags whose effect shows over HTTP, through one real `kiln serve` started with all of them (part from
// a --config YAML file): HTTPS (--ssl-keyfile/--ssl-certfile), --root-path, --enable-request-id-headers,
// --response-role, --return-tokens-as-token-ids, --max-logprobs, --tokenizer, --override-generation-config,
// --enable-server-load-tracking, --stream-interval; and VLLM_SERVER_DEV_MODE=1's endpoints.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { X509Certificate } from "node:crypto";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import type { IncomingHttpHeaders } from "node:http";
import { request as httpsRequest } from "node:https";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TLSSocket } from "node:tls";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";
import { tinyModelDir } from "../helpers/tiny-model.js";
import { startKiln, type KilnServer } from "./kiln-process.js";

const root = fileURLToPath(new URL("../../..", import.meta.url)); // dist/test/e2e -> package root
const KEY = join(root, "test/fixtures/tls-key.pem");
const CERT = join(root, "test/fixtures/tls-cert.pem");
const ROLE = "bot";
const MAX_LOGPROBS = 5;

interface Reply {
  status: number;
  headers: IncomingHttpHeaders;
  text: string;
  body: any;
  /** The certificate the server presented (DER). */
  peer: Buffer;
}

let server: KilnServer;
let dir: string;

/** One HTTPS request (the server's certificate is self-signed: it is checked against the fixture below instead). */
function call(path: string, body?: unknown, headers: Record<string, string> = {}): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = httpsRequest(new URL(path, server.url), {
      method: body === undefined ? "GET" : "POST",
      headers: { "content-type": "application/json", ...headers },
      rejectUnauthorized: false,
      agent: false,
    }, (res) => {
      const peer = (res.socket as TLSSocket).getPeerCertificate().raw;
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (d: string) => (text += d));
      res.on("end", () => {
        let parsed: unknown = null;
        try {
          parsed = text ? JSON.parse(text) : null;
        } catch {
          parsed = null; // an event stream
        }
        resolve({ status: res.statusCode!, headers: res.headers, text, body: parsed, peer });
      });
    });
    req.on("error", reject);
    req.end(body === undefined ? undefined : JSON.stringify(body));
  });
}

const USER = [{ role: "user", content: "Tell me about the river." }];
const chat = (extra: Record<string, unknown> = {}, headers: Record<string, string> = {}) =>
  call("/v1/chat/completions", { model: server.model, messages: USER, max_tokens: 4, temperature: 0, ignore_eos: true, ...extra }, headers);
const complete = (extra: Record<string, unknown> = {}, headers: Record<string, string> = {}) =>
  call("/v1/completions", { model: server.model, prompt: "The river ran", max_tokens: 4, temperature: 0, ignore_eos: true, ...extra }, headers);
const detokenize = async (ids: number[]): Promise<string> => ((await call("/detokenize", { tokens: ids })).body as { prompt: string }).prompt;
const idOf = (token: string): number => {
  const m = /^token_id:(\d+)$/.exec(token);
  assert.ok(m, `expected token_id:<id>, got ${JSON.stringify(token)}`);
  return Number(m[1]);
};

describe("kiln serve: vLLM serve flags (e2e, HTTPS)", () => {
  before(async () => {
    // the model without its tokenizer files, and those (with a chat template of their own) in another directory
    dir = mkdtempSync(join(tmpdir(), "kiln-serve-flags-"));
    const tiny = tinyModelDir("LlamaForCausalLM");
    const model = join(dir, "model");
    const tok = join(dir, "tokenizer");
    mkdirSync(model);
    mkdirSync(tok);
    for (const f of ["config.json", "model.safetensors", "generation_config.json"]) copyFileSync(join(tiny, f), join(model, f));
    for (const f of ["tokenizer.json", "tokenizer_config.json"]) copyFileSync(join(tiny, f), join(tok, f));
    // the tokenizer holds one id past the model's vocabulary (as Gemma 3 1B's does): "Hello", which the start-up
    // warm-up used to encode and fail on
    const tokJson = JSON.parse(readFileSync(join(tok, "tokenizer.json"), "utf8")) as { added_tokens: object[] };
    const vocab = (JSON.parse(readFileSync(join(model, "config.json"), "utf8")) as { vocab_size: number }).vocab_size;
    tokJson.added_tokens.push({ id: vocab, content: "Hello", single_word: false, lstrip: false, rstrip: false, normalized: false, special: false });
    writeFileSync(join(tok, "tokenizer.json"), JSON.stringify(tokJson));
    writeFileSync(join(tok, "chat_template.jinja"), "TOKDIR{% for m in messages %} {{ m.role }}: {{ m.content }}{% endfor %}{% if add_generation_prompt %} bot:{% endif %}");
    // vLLM's --config: flag names (snake or kebab case); the command line's --port 0 wins over the file's port
    const config = join(dir, "serve.yaml");
    writeFileSync(config, [
      "port: 1",
      `response_role: ${ROLE}`,
      "return-tokens-as-token-ids: true",
      `max_logprobs: ${MAX_LOGPROBS}`,
      "override_generation_config: {max_new_tokens: 3}",
      "long_prefill_token_threshold: 8",
      "trust_remote_code: yes",
      "stream_interval: 4",
      "",
    ].join("\n"));
    server = await startKiln([
      "--config", config, "--tokenizer", tok, "--enable-request-id-headers", "--ssl-keyfile", KEY, "--ssl-certfile", CERT,
      "--root-path", "/kiln/", "--uvicorn-log-level", "warning", "--disable-uvicorn-access-log", "--disable-fastapi-docs",
      "--enable-server-load-tracking",
    ], model, { VLLM_SERVER_DEV_MODE: "1" });
  });
  after(async () => {
    assert.equal(await server.stop(), 0);
    rmSync(dir, { recursive: true, force: true });
  });

  it("serves HTTPS with --ssl-certfile's certificate, and under --root-path as well as without it", async () => {
    assert.match(server.url, /^https:\/\//);
    const models = await call("/v1/models");
    assert.equal(models.status, 200);
    assert.deepEqual(models.peer, new X509Certificate(readFileSync(CERT)).raw);
    const prefixed = await call("/kiln/v1/models");
    assert.equal(prefixed.status, 200);
    assert.deepEqual(prefixed.body.data.map((m: { id: string }) => m.id), models.body.data.map((m: { id: string }) => m.id));
    assert.equal((await call("/kiln/health")).status, 200);
    await assert.rejects(fetch(server.url.replace("https:", "http:") + "/health"), "plain HTTP is not served");
  });

  it("--tokenizer with ids past the model's vocabulary: the server starts, and a prompt using one is a 400 naming it", async () => {
    const r = await complete({ prompt: "Hello river" });
    assert.equal(r.status, 400);
    assert.equal(r.body.error.type, "invalid_request_error");
    assert.match(r.body.error.message, /token id 512 is out of vocabulary range \[0, 512\)/);
    assert.equal((await complete()).status, 200);
  });

  it("--enable-request-id-headers: X-Request-Id is the client's, else the generated id of the response", async () => {
    const named = await chat({}, { "X-Request-Id": "req-abc" });
    assert.equal(named.status, 200);
    assert.equal(named.headers["x-request-id"], "req-abc");
    assert.equal(named.body.id, "chatcmpl-req-abc", "vLLM's id: the prefix and the client's request id");
    const generated = await complete();
    assert.match(String(generated.headers["x-request-id"]), /^[0-9a-f]{32}$/);
    assert.equal(generated.body.id, `cmpl-${generated.headers["x-request-id"]}`);
    const stream = await chat({ stream: true }, { "X-Request-Id": "req-stream" });
    assert.equal(stream.headers["x-request-id"], "req-stream");
    assert.match(stream.text, /"id":"chatcmpl-req-stream"/);
    assert.match(String((await call("/health")).headers["x-request-id"]), /^[0-9a-f]{32}$/);
    const refused = await chat({ logprobs: true, top_logprobs: MAX_LOGPROBS + 1 }, { "X-Request-Id": "req-400" });
    assert.equal(refused.status, 400);
    assert.equal(refused.headers["x-request-id"], "req-400");
    // clients may send one id twice at once: both requests run
    const twice = await Promise.all([complete({}, { "X-Request-Id": "same" }), complete({}, { "X-Request-Id": "same" })]);
    assert.deepEqual(twice.map((r) => [r.status, r.body.id]), [[200, "cmpl-same"], [200, "cmpl-same"]]);
  });

  it("--response-role (from --config) names a new reply's role; a continued message keeps its own", async () => {
    assert.equal((await chat()).body.choices[0].message.role, ROLE);
    const stream = await chat({ stream: true });
    assert.match(stream.text, new RegExp(`"delta":\\{"role":"${ROLE}"`));
    const continued = await chat({
      messages: [...USER, { role: "assistant", content: "The river" }], add_generation_prompt: false, continue_final_message: true,
    });
    assert.equal(continued.body.choices[0].message.role, "assistant");
  });

  it("--return-tokens-as-token-ids (from --config): logprobs name tokens token_id:<id>, unless the request says no", async () => {
    const r = await chat({ logprobs: true, top_logprobs: 2 });
    assert.equal(r.status, 200, r.text);
    const content = r.body.choices[0].logprobs.content as { token: string; bytes: number[]; top_logprobs: { token: string; bytes: number[] }[] }[];
    assert.equal(content.length, 4);
    const ids = content.map((e) => idOf(e.token));
    // as vLLM: an entry's bytes are its text's; a top_logprobs entry's are those of its "token_id:<id>" name
    assert.equal(Buffer.from(content.flatMap((e) => e.bytes)).toString("utf8"), await detokenize(ids));
    for (const e of content) {
      assert.equal(e.top_logprobs.length, 2);
      for (const t of e.top_logprobs) assert.deepEqual(t.bytes, [...Buffer.from(`token_id:${idOf(t.token)}`)]);
    }
    const c = await complete({ logprobs: 2 });
    const lp = c.body.choices[0].logprobs as { tokens: string[]; top_logprobs: Record<string, number>[]; text_offset: number[] };
    const cIds = lp.tokens.map(idOf);
    assert.equal(await detokenize(cIds), c.body.choices[0].text);
    for (const top of lp.top_logprobs) for (const k of Object.keys(top)) idOf(k);
    assert.equal(lp.text_offset[0], 0, "offsets still count the text's characters");
    const plain = await complete({ logprobs: 2, return_tokens_as_token_ids: false });
    assert.ok(plain.body.choices[0].logprobs.tokens.every((t: string) => !t.startsWith("token_id:")));
  });

  it(`--max-logprobs ${MAX_LOGPROBS}: more is refused with vLLM's 400`, async () => {
    const sample = `Requested sample logprobs of ${MAX_LOGPROBS + 1}, which is greater than max allowed: ${MAX_LOGPROBS} (parameter=logprobs, value=${MAX_LOGPROBS + 1})`;
    for (const [r, param] of [[await chat({ logprobs: true, top_logprobs: MAX_LOGPROBS + 1 }), "top_logprobs"], [await complete({ logprobs: MAX_LOGPROBS + 1 }), "logprobs"]] as const) {
      assert.equal(r.status, 400);
      assert.deepEqual(r.body.error, { message: sample, type: "invalid_request_error", param, code: null });
    }
    const prompt = await complete({ prompt_logprobs: MAX_LOGPROBS + 1 });
    assert.equal(prompt.status, 400);
    assert.equal(prompt.body.error.message,
      `Requested prompt logprobs of ${MAX_LOGPROBS + 1}, which is greater than max allowed: ${MAX_LOGPROBS} (parameter=prompt_logprobs, value=${MAX_LOGPROBS + 1})`);
    assert.equal(prompt.body.error.param, "prompt_logprobs");
    assert.equal((await chat({ logprobs: true, top_logprobs: MAX_LOGPROBS })).status, 200);
  });

  it("--tokenizer: the tokenizer and its chat template come from their own directory", async () => {
    assert.ok(!existsSync(join(server.model, "tokenizer.json")), "the model directory has no tokenizer");
    const t = await call("/tokenize", { messages: USER });
    assert.equal(t.status, 200);
    assert.equal(await detokenize(t.body.tokens), "TOKDIR user: Tell me about the river. bot:");
    assert.equal((await chat()).status, 200);
  });

  it("--override-generation-config (from --config): max_new_tokens 3 is the default max_tokens", async () => {
    const dflt = await chat({ max_tokens: undefined, messages: [{ role: "user", content: "a longer prompt than eight tokens, so that it is chunked" }] });
    assert.equal(dflt.body.usage.completion_tokens, 3);
    assert.equal(dflt.body.choices[0].finish_reason, "length");
    assert.equal((await chat({ max_tokens: 5 })).body.usage.completion_tokens, 5);
  });

  it("--enable-server-load-tracking serves /load; VLLM_SERVER_DEV_MODE=1 /server_info and /reset_prefix_cache", async () => {
    assert.equal((await complete()).status, 200);
    assert.deepEqual((await call("/load")).body, { server_load: 0 }, "the completion is no longer counted");
    const info = await call("/server_info?config_format=json");
    assert.equal(info.status, 200);
    const c = info.body.vllm_config;
    assert.equal(c.server.enable_server_load_tracking, true);
    assert.equal(c.server.root_path, "/kiln");
    assert.equal(c.launch.tls, true, "whether HTTPS is on, not its key");
    assert.equal(c.launch.responseRole, ROLE);
    assert.equal(c.engine.blockSize, 16, "the worker engine's resolved arguments");
    const text = await call("/server_info");
    assert.ok(!text.body.vllm_config.includes("PRIVATE KEY"));
    const reset = await call("/reset_prefix_cache", {});
    assert.equal(reset.status, 200);
  });

  it("--stream-interval 4 (from --config): a streamed completion comes 4 tokens a chunk after the first; metrics count every token", async () => {
    const metric = async (name: string): Promise<number> => {
      const line = (await call("/metrics")).text.split("\n").find((l) => l.startsWith(`${name}{`));
      assert.ok(line, `${name} missing`);
      return Number(line.slice(line.lastIndexOf(" ") + 1));
    };
    const body = { max_tokens: 10, logprobs: 1, return_tokens_as_token_ids: true };
    const streamed = await complete({ ...body, stream: true });
    assert.equal(streamed.status, 200);
    const chunks = streamed.text.split("\n\n").filter((e) => e.startsWith("data: {")).map((e) => JSON.parse(e.slice(6)));
    const perChunk = chunks.map((c) => (c.choices[0]?.logprobs?.tokens ?? []) as string[]).filter((t) => t.length > 0);
    assert.deepEqual(perChunk.map((t) => t.length), [1, 4, 4, 1]);
    // the same greedy reply unstreamed (the engine sends its final output only, and token timings for the metrics)
    const [tokens0, itl0, ttft0] = [await metric("vllm:generation_tokens_total"), await metric("vllm:inter_token_latency_seconds_count"), await metric("vllm:time_to_first_token_seconds_count")];
    const whole = await complete(body);
    assert.deepEqual(whole.body.choices[0].logprobs.tokens, perChunk.flat());
    assert.equal(whole.body.choices[0].text, chunks.map((c) => c.choices[0]?.text ?? "").join(""));
    assert.equal(await metric("vllm:generation_tokens_total"), tokens0 + 10);
    assert.equal(await metric("vllm:inter_token_latency_seconds_count"), itl0 + 9, "one inter-token latency per token after the first");
    assert.equal(await metric("vllm:time_to_first_token_seconds_count"), ttft0 + 1);
  });

  it("--no-enable-chunked-prefill with a step budget below max_model_len stops the start-up, naming both", () => {
    const r = spawnSync(process.execPath, [`${root}/bin/kiln`, "serve", tinyModelDir("LlamaForCausalLM"), "--port", "0",
      "--no-enable-chunked-prefill", "--max-num-batched-tokens", "16"], { encoding: "utf8", timeout: 30_000 });
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /max_num_batched_tokens \(16\) is smaller than max_model_len/);
  });
});
