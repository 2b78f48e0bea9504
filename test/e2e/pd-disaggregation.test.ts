// `kiln serve --kv-transfer-config`: P/D disaggregation as vLLM's NixlConnector proxy drives it. The prefill server
// answers a max_tokens 1 request carrying {"do_remote_decode": true} with kv_transfer_params naming its side channel;
// the decode server given them pulls the prompt's K/V and computes only the last prompt token (cached_tokens says how
// many it did not compute), and its greedy reply equals one server's. A snapshot is served once; a decode whose
// snapshot is gone computes the prompt itself; what cannot be acted on is a 400 naming kv_transfer_params.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { assertErrorBody, launchKiln, postRaw, startKiln, type KilnServer } from "./kiln-process.js";

type Json = Record<string, unknown>;
const PROMPT = "The jury said that the city of Atlanta was well run, and that the election was fair in every way";

describe("kiln serve --kv-transfer-config (prefill/decode disaggregation)", () => {
  let p: KilnServer, d: KilnServer, plain: KilnServer;
  const kv = (role: string) => ["--kv-transfer-config", JSON.stringify({ kv_connector: "NixlConnector", kv_role: role }), "--enable-prompt-tokens-details"];
  before(async () => {
    [p, d, plain] = await Promise.all([startKiln(["--max-model-len", "256", ...kv("kv_producer")]), startKiln(["--max-model-len", "256", ...kv("kv_both")]), startKiln(["--max-model-len", "256"])]);
  });
  after(async () => {
    await Promise.all([p, d, plain].map((s) => s?.stop()));
  });

  const body = (server: KilnServer, extra: Json = {}): Json => ({ model: server.model, prompt: PROMPT, max_tokens: 12, temperature: 0, ignore_eos: true, ...extra });
  const prefill = async (extra: Json = {}): Promise<Json> => {
    const r = await postRaw(p.url, "/v1/completions", body(p, {
      max_tokens: 1, stream: false,
      kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null },
      ...extra,
    }));
    assert.equal(r.status, 200, JSON.stringify(r.body));
    return r.body as Json;
  };

  it("a decode server given the prefill's kv_transfer_params replies as one server, computing one prompt token", { timeout: 60_000 }, async () => {
    const want = (await postRaw(plain.url, "/v1/completions", body(plain))).body as { choices: { text: string }[]; usage: Json };
    const pre = await prefill();
    const params = pre.kv_transfer_params as Json;
    assert.equal(params.do_remote_prefill, true);
    assert.equal(params.remote_host, "127.0.0.1");
    assert.equal(typeof params.remote_port, "number");
    assert.equal(typeof params.remote_request_id, "string");
    const r = await postRaw(d.url, "/v1/completions", body(d, { kv_transfer_params: params }));
    assert.equal(r.status, 200, JSON.stringify(r.body));
    const got = r.body as { choices: { text: string }[]; usage: { prompt_tokens: number; prompt_tokens_details?: { cached_tokens: number } }; kv_transfer_params: unknown };
    assert.equal(got.choices[0]!.text, want.choices[0]!.text);
    assert.equal(got.usage.prompt_tokens_details?.cached_tokens, got.usage.prompt_tokens - 1, "all but the last prompt token came from the prefill");
    assert.equal(got.kv_transfer_params, null);
    // served once: the same params again find nothing, and the decode computes the prompt itself (same reply)
    const again = await postRaw(d.url, "/v1/completions", body(d, { kv_transfer_params: params, cache_salt: "fresh" }));
    assert.equal(again.status, 200, JSON.stringify(again.body));
    assert.equal((again.body as typeof got).choices[0]!.text, want.choices[0]!.text);
    assert.equal((again.body as typeof got).usage.prompt_tokens_details, undefined, "nothing was imported or cached");
    assert.equal(await p.metric("kiln:kv_transfer_exported_total"), 1);
    assert.equal(await p.metric("kiln:kv_transfer_served_total"), 1);
    assert.equal(await d.metric("kiln:kv_transfer_imported_total"), 1);
    assert.equal(await d.metric("kiln:kv_transfer_import_failures_total"), 1, "the second fetch found nothing");
  });

  it("chat: the decode streams its reply through the openai client, equal to one server's", { timeout: 60_000 }, async () => {
    const messages = [{ role: "user" as const, content: PROMPT }];
    const want = await plain.client().chat.completions.create({ model: plain.model, messages, max_tokens: 10, temperature: 0 });
    const pre = await postRaw(p.url, "/v1/chat/completions", {
      model: p.model, messages, max_tokens: 1, temperature: 0, kv_transfer_params: { do_remote_decode: true },
    });
    assert.equal(pre.status, 200, JSON.stringify(pre.body));
    // kv_transfer_params is vLLM's extension field: the client sends what it is given
    const request = { model: d.model, messages, max_tokens: 10, temperature: 0, stream: true as const, kv_transfer_params: (pre.body as Json).kv_transfer_params };
    const stream = await d.client().chat.completions.create(request as Omit<typeof request, "kv_transfer_params">);
    let text = "";
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? "";
    assert.equal(text, want.choices[0]!.message.content);
  });

  it("through kiln router --pd-disaggregation: the client's requests are served as by one server", { timeout: 60_000 }, async () => {
    const router = await launchKiln(["router", "--pd-disaggregation", "--prefill", p.url, "--decode", d.url, "--port", "0"], /Kiln router at (http:\/\/\S+)\/v1/, 20_000);
    try {
      const client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: "unused", maxRetries: 0, timeout: 60_000 });
      const prompt = `${PROMPT}, said the foreman`;
      const want = await plain.client().completions.create({ model: plain.model, prompt, max_tokens: 12, temperature: 0 });
      const got = await client.completions.create({ model: d.model, prompt, max_tokens: 12, temperature: 0 });
      assert.equal(got.choices[0]!.text, want.choices[0]!.text);
      const usage = got.usage as { prompt_tokens: number; prompt_tokens_details?: { cached_tokens: number } };
      assert.equal(usage.prompt_tokens_details?.cached_tokens, usage.prompt_tokens - 1, "the decode server read the prefill's K/V");
      const messages = [{ role: "user" as const, content: prompt }];
      const wantChat = await plain.client().chat.completions.create({ model: plain.model, messages, max_tokens: 8, temperature: 0 });
      let text = "";
      for await (const chunk of await client.chat.completions.create({ model: d.model, messages, max_tokens: 8, temperature: 0, stream: true }))
        text += chunk.choices[0]?.delta?.content ?? "";
      assert.equal(text, wantChat.choices[0]!.message.content);
    } finally {
      await router.stop();
    }
  });

  it("what cannot be acted on is a 400 naming kv_transfer_params", { timeout: 60_000 }, async () => {
    const cases: [KilnServer, Json, RegExp][] = [
      [plain, { kv_transfer_params: { do_remote_decode: true } }, /--kv-transfer-config/],
      [p, { kv_transfer_params: { do_remote_prefill: true, remote_host: "127.0.0.1", remote_port: 1, remote_request_id: "x" } }, /kv_producer/],
      [d, { kv_transfer_params: { do_remote_decode: true }, stream: true }, /cannot be streamed/],
      [d, { kv_transfer_params: { do_remote_decode: true }, prompt: ["a", "b"] }, /one prompt/],
      [d, { kv_transfer_params: { do_remote_prefill: true, remote_host: "127.0.0.1" } }, /remote_port/],
      [d, { kv_transfer_params: "yes" }, /must be an object/],
    ];
    for (const [server, extra, message] of cases) {
      const r = await postRaw(server.url, "/v1/completions", body(server, extra));
      assert.equal(r.status, 400, JSON.stringify(r.body));
      assertErrorBody(r.body, { type: "invalid_request_error", param: "kv_transfer_params", message });
    }
    // an unreachable prefill server: the decode computes the prompt itself
    const r = await postRaw(d.url, "/v1/completions", body(d, { kv_transfer_params: { do_remote_prefill: true, remote_host: "127.0.0.1", remote_port: 1, remote_request_id: "gone" } }));
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.match(d.log(), /K\/V of gone from 127\.0\.0\.1:1 not loaded/);
  });
});
