// The OpenAI-compatible endpoints, driven by the official `openai` client against the fake engine.
import assert from "node:assert/strict";
import { after, before, describe, it, test } from "node:test";
import { normalizeSamplingParams } from "../../src/engine/sampling-params.js";
import { prepareServer } from "../../src/server/index.js";
import type { PromptInput } from "../../src/server/protocol.js";
import type { ServingContext } from "../../src/server/serving-context.js";
import { poolingTokenIds } from "../../src/server/serving-embeddings.js";
import { FakeEngine } from "./fake-engine.js";
import { MODEL, metricValue, startTestServer, type TestServer } from "./helpers.js";

describe("OpenAI API", () => {
  let s: TestServer;
  before(async () => {
    s = await startTestServer();
  });
  after(() => s.close());

  it("lists models with max_model_len", async () => {
    const page = await s.client.models.list();
    assert.deepEqual(page.data.map((m) => m.id), [MODEL, "alias"]);
    const m = page.data[0] as unknown as Record<string, unknown>;
    assert.equal(m.object, "model");
    assert.equal(m.max_model_len, 256);
    // vLLM's ModelCard: root is the model as served (here none was given: the first name), one default ModelPermission
    assert.equal(m.root, MODEL);
    assert.equal(m.parent, null);
    const [perm, ...more] = m.permission as Record<string, unknown>[];
    assert.equal(more.length, 0);
    assert.match(perm!.id as string, /^modelperm-[0-9a-f]{32}$/);
    assert.deepEqual({ ...perm, id: undefined, created: undefined }, {
      id: undefined, object: "model_permission", created: undefined, allow_create_engine: false, allow_sampling: true,
      allow_logprobs: true, allow_search_indices: false, allow_view: true, allow_fine_tuning: false, organization: "*",
      group: null, is_blocking: false,
    });
  });

  it("/v1/models' root is the model path when the server was given one under another name", async () => {
    const t = await startTestServer({ modelPath: "/models/llama-3-8b" });
    try {
      const cards = (await t.client.models.list()).data as unknown as { id: string; root: string }[];
      assert.deepEqual(cards.map((c) => [c.id, c.root]), [[MODEL, "/models/llama-3-8b"], ["alias", "/models/llama-3-8b"]]);
    } finally {
      await t.close();
    }
  });

  it("a path with a trailing slash is the path without it (vLLM's Starlette redirects it there)", async () => {
    const models = await fetch(`${s.url}/v1/models/`);
    assert.equal(models.status, 200);
    assert.deepEqual(((await models.json()) as { data: { id: string }[] }).data.map((m) => m.id), [MODEL, "alias"]);
    const body = JSON.stringify({ model: MODEL, prompt: "hi", max_tokens: 2, temperature: 0 });
    const [slash, plain] = await Promise.all(["/v1/completions/", "/v1/completions"].map((p) => fetch(`${s.url}${p}`, { method: "POST", headers: { "content-type": "application/json" }, body })));
    assert.equal(slash!.status, 200);
    const text = async (r: Response) => ((await r.json()) as { choices: { text: string }[] }).choices[0]!.text;
    assert.equal(await text(slash!), await text(plain!));
    assert.equal((await fetch(`${s.url}/v1/no-such-route/`)).status, 404);
  });

  it("chat completion, non-streaming", async () => {
    const r = await s.client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "hello" }], max_tokens: 8, seed: 1 });
    assert.match(r.id, /^chatcmpl-/);
    assert.equal(r.object, "chat.completion");
    assert.equal(r.model, MODEL);
    assert.equal(r.choices.length, 1);
    const c = r.choices[0]!;
    assert.equal(c.index, 0);
    assert.equal(c.message.role, "assistant");
    assert.equal(typeof c.message.content, "string");
    assert.ok(c.finish_reason === "length" || c.finish_reason === "stop");
    assert.equal(c.logprobs, null);
    assert.equal(r.usage!.prompt_tokens, "user: hello\nassistant:".length);
    assert.ok(r.usage!.completion_tokens <= 8);
    assert.equal(r.usage!.total_tokens, r.usage!.prompt_tokens + r.usage!.completion_tokens);
  });

  it("accepts content-part arrays and max_completion_tokens", async () => {
    const r = await s.client.chat.completions.create({
      model: MODEL, messages: [{ role: "user", content: [{ type: "text", text: "hi" }] }], max_completion_tokens: 3, ignore_eos: true,
    } as never);
    assert.equal(r.usage!.completion_tokens, 3);
    assert.equal(r.choices[0]!.finish_reason, "length");
    // an assistant turn's refusal part (OpenAI's type) is its text to the template, as vLLM reads it
    const withRefusal = await s.client.chat.completions.create({
      model: MODEL, max_tokens: 1,
      messages: [{ role: "user", content: "hi" }, { role: "assistant", content: [{ type: "refusal", refusal: "I can't" }] }, { role: "user", content: "why" }],
    });
    const asText = await fetch(`${s.url}/tokenize`, {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }, { role: "assistant", content: "I can't" }, { role: "user", content: "why" }] }),
    });
    assert.equal(withRefusal.usage!.prompt_tokens, ((await asText.json()) as { count: number }).count);
  });

  it("chat streaming with include_usage", async () => {
    const stream = await s.client.chat.completions.create({
      model: MODEL, messages: [{ role: "user", content: "stream" }], max_tokens: 6, stream: true, stream_options: { include_usage: true },
      ignore_eos: true,
    } as never) as unknown as AsyncIterable<Record<string, any>>;
    const chunks: Record<string, any>[] = [];
    for await (const chunk of stream) chunks.push(chunk);
    assert.equal(chunks[0]!.object, "chat.completion.chunk");
    assert.equal(chunks[0]!.choices[0].delta.role, "assistant");
    const content = chunks.filter((c) => c.choices.length > 0);
    const last = content[content.length - 1]!;
    assert.equal(last.choices[0].finish_reason, "length");
    assert.ok(content.slice(0, -1).every((c) => c.choices[0].finish_reason === null));
    const usageChunk = chunks[chunks.length - 1]!;
    assert.deepEqual(usageChunk.choices, []);
    assert.equal(usageChunk.usage.completion_tokens, 6);
    const text = content.map((c) => c.choices[0].delta.content ?? "").join("");
    assert.equal(text.length, 6);
  });

  it("completions with n=2 and several prompts map to choice indices", async () => {
    const r = await s.client.completions.create({ model: MODEL, prompt: ["one", "two"], n: 2, max_tokens: 4, seed: 3, ignore_eos: true } as never);
    assert.match(r.id, /^cmpl-/);
    assert.equal(r.object, "text_completion");
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
    assert.ok(r.choices.every((c) => c.text.length === 4));
    assert.notEqual(r.choices[0]!.text, r.choices[1]!.text); // different samples of one prompt
    assert.equal(r.usage!.prompt_tokens, 4 + 4); // BOS + 3 chars each
    assert.equal(r.usage!.completion_tokens, 16);
  });

  it("completions streaming with include_usage and n=2", async () => {
    const stream = await s.client.completions.create({
      model: MODEL, prompt: "abc", n: 2, max_tokens: 5, stream: true, stream_options: { include_usage: true }, ignore_eos: true,
    } as never) as unknown as AsyncIterable<Record<string, any>>;
    const texts = ["", ""];
    const finishes: (string | null)[] = [null, null];
    let usage: any = null;
    for await (const chunk of stream) {
      assert.equal(chunk.object, "text_completion");
      for (const c of chunk.choices) {
        texts[c.index] += c.text;
        if (c.finish_reason) finishes[c.index] = c.finish_reason;
      }
      if (chunk.usage) usage = chunk.usage;
    }
    assert.deepEqual(finishes, ["length", "length"]);
    assert.deepEqual(texts.map((t) => t.length), [5, 5]);
    assert.equal(usage.completion_tokens, 10);
    assert.equal(usage.prompt_tokens, 4);
  });

  it("stop strings end the text before the stop string", async () => {
    const base = await s.client.completions.create({ model: MODEL, prompt: "stop test", max_tokens: 40, seed: 7, ignore_eos: true } as never);
    const text = base.choices[0]!.text;
    const stop = text.slice(10, 12);
    const r = await s.client.completions.create({ model: MODEL, prompt: "stop test", max_tokens: 40, seed: 7, ignore_eos: true, stop: [stop] } as never);
    const c = r.choices[0]! as any;
    assert.equal(c.finish_reason, "stop");
    assert.equal(c.stop_reason, stop);
    assert.equal(c.text, text.slice(0, text.indexOf(stop)));
  });

  it("same seed gives the same output, different seeds differ", async () => {
    const run = (seed: number) =>
      s.client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "seed" }], max_tokens: 16, seed, temperature: 1, ignore_eos: true } as never);
    const [a, b, c] = await Promise.all([run(11), run(11), run(12)]);
    assert.equal(a.choices[0]!.message.content, b.choices[0]!.message.content);
    assert.notEqual(a.choices[0]!.message.content, c.choices[0]!.message.content);
    // a 64-bit seed (vLLM takes int64; a random one is past 2^53) serves and reproduces; past int64 is a 400
    const raw = async (seed: string) => {
      const res = await fetch(`${s.url}/v1/completions`, {
        method: "POST", headers: { "content-type": "application/json" },
        body: `{"model": "${MODEL}", "prompt": "seed", "max_tokens": 16, "temperature": 1, "ignore_eos": true, "seed": ${seed}}`,
      });
      return { status: res.status, body: (await res.json()) as any };
    };
    for (const seed of ["9223372036854775807", "-9223372036854775808"]) {
      const x = await raw(seed);
      assert.equal(x.status, 200, JSON.stringify(x.body));
      assert.doesNotThrow(() => normalizeSamplingParams(s.engine.lastParams!), "the engine takes the seed the server sends");
      assert.equal((await raw(seed)).body.choices[0].text, x.body.choices[0].text);
    }
    // n samples take seed + i (the engine's): next to 2^53 those would round to one another
    await raw("9007199254740991");
    const near = s.engine.lastParams!.seed!;
    assert.equal(new Set([0, 1, 2].map((i) => near + i)).size, 3);
    const over = await raw("18446744073709551615");
    assert.deepEqual([over.status, over.body.error.param], [400, "seed"]);
  });

  it("chat logprobs have OpenAI's shape", async () => {
    const r = await s.client.chat.completions.create({
      model: MODEL, messages: [{ role: "user", content: "lp" }], max_tokens: 4, logprobs: true, top_logprobs: 3, ignore_eos: true,
    } as never);
    const content = r.choices[0]!.logprobs!.content!;
    assert.equal(content.length, 4);
    for (const e of content) {
      assert.equal(typeof e.token, "string");
      assert.ok(e.logprob <= 0);
      assert.deepEqual(e.bytes, [...Buffer.from(e.token)]);
      assert.equal(e.top_logprobs.length, 3);
      assert.ok(e.top_logprobs[0]!.logprob >= e.top_logprobs[1]!.logprob);
    }
    assert.equal(content.map((e) => e.token).join(""), r.choices[0]!.message.content);
  });

  it("completion logprobs have the legacy shape", async () => {
    const r = await s.client.completions.create({ model: MODEL, prompt: "lp", max_tokens: 3, logprobs: 2, ignore_eos: true } as never);
    const lp = r.choices[0]!.logprobs!;
    assert.equal(lp.tokens!.length, 3);
    assert.equal(lp.token_logprobs!.length, 3);
    assert.equal(lp.top_logprobs!.length, 3);
    assert.deepEqual(lp.text_offset, [0, 1, 2]);
    assert.ok(Object.keys(lp.top_logprobs![0]!).length >= 2);
  });

  it("accepts prompts as token ids and token id lists, with echo", async () => {
    const ids = s.engine.tokenizer.encode("xyz");
    const r = await s.client.completions.create({ model: MODEL, prompt: ids, max_tokens: 2, echo: true } as never);
    assert.ok(r.choices[0]!.text.startsWith("<s>xyz"));
    const r2 = await s.client.completions.create({ model: MODEL, prompt: [ids, ids], max_tokens: 2 } as never);
    assert.equal(r2.choices.length, 2);
    assert.equal(r2.usage!.prompt_tokens, 8);
  });

  it("truncate_prompt_tokens keeps the prompt's last tokens before the length checks, and usage counts those", async () => {
    // 301 tokens (BOS + 300 chars) on a 256-token model: served once cut to its last 100
    const long = await s.client.completions.create({
      model: MODEL, prompt: "a".repeat(300), max_tokens: 3, truncate_prompt_tokens: 100, prompt_logprobs: 0, ignore_eos: true,
    } as never);
    assert.equal(long.usage!.prompt_tokens, 100);
    assert.equal((long.choices[0] as any).prompt_logprobs.length, 100, "the engine read 100 prompt tokens");
    // a text prompt is cut as HF's tokenizer(text, truncation=True, max_length=100) cuts it (vLLM's renderer): the
    // tokenizer's BOS stays, then the text's last 99 tokens
    const kept = await s.client.completions.create({
      model: MODEL, prompt: "ab".repeat(150), max_tokens: 1, truncate_prompt_tokens: 100, return_token_ids: true,
    } as never);
    assert.deepEqual((kept.choices[0] as any).prompt_token_ids, [s.engine.tokenizer.bosTokenId, ...s.engine.tokenizer.encode("b" + "ab".repeat(49), { addSpecialTokens: false })]);
    const chat = await s.client.chat.completions.create({
      model: MODEL, messages: [{ role: "user", content: "b".repeat(300) }], max_tokens: 2, truncate_prompt_tokens: 50,
    } as never);
    assert.equal(chat.usage!.prompt_tokens, 50);
    // -1: as many as max_model_len leaves beside max_tokens (256 - 6)
    const all = await s.client.completions.create({ model: MODEL, prompt: "c".repeat(300), max_tokens: 6, truncate_prompt_tokens: -1 } as never);
    assert.equal(all.usage!.prompt_tokens, 250);
    const post = (body: unknown) =>
      fetch(`${s.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    const tooMany = await post({ model: MODEL, prompt: "c", max_tokens: 6, truncate_prompt_tokens: 251 });
    assert.equal(tooMany.status, 400);
    assert.equal(((await tooMany.json()) as any).error.param, "truncate_prompt_tokens");
  });

  it("pooling requests cut a text input as HF's truncation does: the tokenizer's BOS stays, on either side", () => {
    const tok = s.engine.tokenizer;
    const ctx = { tokenizer: tok, maxModelLen: 64 } as unknown as ServingContext;
    const cut = (side: "left" | "right", prompt: PromptInput) =>
      poolingTokenIds(ctx, [prompt], { truncate: 4, side, addSpecialTokens: true, field: "input", operation: "embedding generation" })[0];
    const text = (t: string) => tok.encode(t, { addSpecialTokens: false });
    assert.deepEqual(cut("left", { text: "abcdefg" }), [tok.bosTokenId, ...text("efg")]);
    assert.deepEqual(cut("right", { text: "abcdefg" }), [tok.bosTokenId, ...text("abc")]);
    // token ids are cut as given
    assert.deepEqual(cut("left", { tokenIds: tok.encode("abcdefg") }), text("defg"));
  });

  it("chat echo puts the final message's content before the reply when the reply takes its role (vLLM), streamed or not", async () => {
    const story = [{ role: "user", content: "hi" }, { role: "assistant", content: "Once upon" }];
    const ask = async (extra: Record<string, unknown>) => {
      const base = { model: MODEL, max_tokens: 3, seed: 5, ignore_eos: true, ...extra };
      const plain = await s.client.chat.completions.create(base as never);
      const echoed = await s.client.chat.completions.create({ ...base, echo: true } as never);
      let streamed = "";
      const chunks = await s.client.chat.completions.create({ ...base, echo: true, stream: true } as never) as unknown as AsyncIterable<Record<string, any>>;
      for await (const chunk of chunks) streamed += chunk.choices[0]?.delta.content ?? "";
      return { plain: plain.choices[0]!.message.content!, echoed: echoed.choices[0]!.message, streamed };
    };
    const cases: [Record<string, unknown>, string, string][] = [
      [{ messages: story, add_generation_prompt: false, continue_final_message: true }, "Once upon", "assistant"],
      [{ messages: story }, "Once upon", "assistant"], // a new assistant reply after an assistant message
      [{ messages: [{ role: "user", content: "tell me" }], add_generation_prompt: false }, "tell me", "user"], // the reply continues the user's turn
      [{ messages: [{ role: "user", content: "tell me" }] }, "", "assistant"], // another role: nothing to echo
    ];
    for (const [extra, echo, role] of cases) {
      const r = await ask(extra);
      assert.equal(r.echoed.role, role, JSON.stringify(extra));
      assert.equal(r.echoed.content, echo + r.plain, JSON.stringify(extra));
      assert.equal(r.streamed, echo + r.plain, JSON.stringify(extra));
    }
  });

  it("return_token_ids: the prompt's and each choice's token ids (vLLM's fields), streamed as deltas", async () => {
    const tok = s.engine.tokenizer;
    const ask = { model: MODEL, max_tokens: 5, seed: 9, n: 2, ignore_eos: true, return_token_ids: true };
    const r = await s.client.completions.create({ ...ask, prompt: "abc" } as never) as any;
    assert.equal(r.choices.length, 2);
    for (const c of r.choices) {
      assert.deepEqual(c.prompt_token_ids, tok.encode("abc"));
      assert.equal(c.token_ids.length, 5);
      assert.equal(tok.decode(c.token_ids), c.text);
    }
    const streamed: { prompt: number[][]; ids: number[] }[] = [{ prompt: [], ids: [] }, { prompt: [], ids: [] }];
    const chunks = await s.client.completions.create({ ...ask, prompt: "abc", stream: true } as never) as unknown as AsyncIterable<any>;
    for await (const chunk of chunks) {
      for (const c of chunk.choices) {
        if (c.prompt_token_ids) streamed[c.index]!.prompt.push(c.prompt_token_ids);
        streamed[c.index]!.ids.push(...c.token_ids);
      }
    }
    assert.deepEqual(streamed.map((x) => x.prompt), [[tok.encode("abc")], [tok.encode("abc")]], "prompt ids once per choice");
    assert.deepEqual(streamed.map((x) => x.ids), r.choices.map((c: any) => c.token_ids));

    const messages = [{ role: "user", content: "ids" }];
    const chat = await s.client.chat.completions.create({ ...ask, messages } as never) as any;
    assert.deepEqual(chat.prompt_token_ids, tok.encode("user: ids\nassistant:", { addSpecialTokens: false }));
    for (const c of chat.choices) assert.equal(tok.decode(c.token_ids), c.message.content);
    const chatIds: number[][] = [[], []];
    let promptIds: unknown = null;
    const chatChunks = await s.client.chat.completions.create({ ...ask, messages, stream: true } as never) as unknown as AsyncIterable<any>;
    for await (const chunk of chatChunks) {
      promptIds ??= chunk.prompt_token_ids;
      for (const c of chunk.choices) chatIds[c.index]!.push(...(c.token_ids ?? []));
    }
    assert.deepEqual(promptIds, chat.prompt_token_ids);
    assert.deepEqual(chatIds, chat.choices.map((c: any) => c.token_ids));

    const plain = await s.client.completions.create({ model: MODEL, prompt: "abc", max_tokens: 2 } as never) as any;
    assert.ok(!("token_ids" in plain.choices[0]) && !("prompt_token_ids" in plain.choices[0]));
  });

  it("continuous_usage_stats: each chunk counts its own prompt and choice (vLLM), and only with include_usage", async () => {
    const collect = async (body: Record<string, unknown>, path: "chat" | "completions") => {
      const api = path === "chat" ? s.client.chat.completions : s.client.completions;
      const chunks = await (api.create as (b: unknown) => Promise<unknown>)({ model: MODEL, max_tokens: 4, n: 2, ignore_eos: true, stream: true, ...body });
      const out: any[] = [];
      for await (const chunk of chunks as AsyncIterable<any>) out.push(chunk);
      return out;
    };
    const both = { stream_options: { include_usage: true, continuous_usage_stats: true } };
    const chat = await collect({ messages: [{ role: "user", content: "hi" }], ...both }, "chat");
    const promptLen = "user: hi\nassistant:".length;
    const seen = [0, 0];
    for (const chunk of chat.slice(0, -1)) {
      const c = chunk.choices[0];
      if (c.delta.role === undefined) seen[c.index]! += 1; // one token per chunk from the fake engine
      assert.deepEqual(chunk.usage, { prompt_tokens: promptLen, completion_tokens: seen[c.index], total_tokens: promptLen + seen[c.index]! });
    }
    assert.deepEqual(seen, [4, 4]);
    assert.equal(chat[chat.length - 1].usage.completion_tokens, 8, "the final usage chunk adds up the choices");
    const cmpl = await collect({ prompt: ["ab", "abcd"], ...both }, "completions");
    const counts = [0, 0, 0, 0];
    for (const chunk of cmpl.slice(0, -1)) {
      const c = chunk.choices[0];
      counts[c.index]! += 1;
      const prompt = c.index < 2 ? 3 : 5; // BOS + chars of the choice's own prompt
      assert.deepEqual(chunk.usage, { prompt_tokens: prompt, completion_tokens: counts[c.index], total_tokens: prompt + counts[c.index]! });
    }
    const alone = await collect({ messages: [{ role: "user", content: "hi" }], stream_options: { continuous_usage_stats: true } }, "chat");
    assert.ok(alone.every((chunk) => !("usage" in chunk)), "continuous stats need include_usage");
  });

  it("tokenize and detokenize", async () => {
    const post = (path: string, body: unknown) =>
      fetch(`${s.url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) }).then((r) => r.json() as Promise<any>);
    const t = await post("/tokenize", { model: MODEL, prompt: "hey" });
    assert.equal(t.count, 4);
    assert.equal(t.max_model_len, 256);
    assert.deepEqual(t.tokens, s.engine.tokenizer.encode("hey"));
    const d = await post("/detokenize", { tokens: t.tokens.slice(1) });
    assert.equal(d.prompt, "hey");
    const chat = await post("/tokenize", { messages: [{ role: "user", content: "x" }], add_generation_prompt: true });
    assert.equal(chat.count, "user: x\nassistant:".length);
  });

  it("health, version", async () => {
    const h = await fetch(`${s.url}/health`);
    assert.equal(h.status, 200);
    assert.equal(await h.text(), "");
    assert.deepEqual(await (await fetch(`${s.url}/version`)).json(), { version: "0.1.0-test" });
  });

  it("metrics use vLLM names with model_name", async () => {
    const text = await (await fetch(`${s.url}/metrics`)).text();
    for (const name of [
      "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries",
      "vllm:prefix_cache_hits", "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
      "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
      "vllm:request_queue_time_seconds_bucket", "kiln:kv_cache_free_blocks", "kiln:kv_cache_total_blocks",
    ]) {
      assert.ok(text.includes(name), `missing ${name}`);
    }
    assert.match(text, /vllm:generation_tokens_total\{model_name="kiln-test"\} [1-9]/);
    assert.match(text, /vllm:num_preemptions_total\{model_name="kiln-test"\} 0$/m, "a zero counter is exported as 0");
    assert.match(text, /vllm:request_success_total\{model_name="kiln-test",finished_reason="length"\} [1-9]/);
  });
});

test("logprobs -1 and top_logprobs -1 ask for the whole vocabulary (with --max-logprobs -1); an empty stream_options is unset", async () => {
  const s = await startTestServer({ maxLogprobs: -1 });
  try {
    const vocab = s.engine.tokenizer.vocabSize;
    const post = (path: string, body: object) =>
      fetch(`${s.url}/v1/${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: MODEL, max_tokens: 1, ...body }) });
    const chat = await post("chat/completions", { messages: [{ role: "user", content: "x" }], logprobs: true, top_logprobs: -1, stream_options: {} });
    assert.equal(chat.status, 200, await chat.clone().text());
    assert.equal(s.engine.lastParams?.logprobs, vocab);
    const c = (await chat.json()) as { choices: { logprobs: { content: { top_logprobs: unknown[] }[] } }[] };
    assert.ok(c.choices[0]!.logprobs.content[0]!.top_logprobs.length > 20, "more than the default 20 (the fake ranks its 27 generable tokens)");
    const comp = await post("completions", { prompt: "x", logprobs: -1 });
    assert.equal(comp.status, 200, await comp.clone().text());
    assert.equal(s.engine.lastParams?.logprobs, vocab);
  } finally {
    await s.close();
  }
});

test("per-request histograms: one observation per prompt, its choices' tokens summed, buckets 1-2-5 up to max_model_len", async () => {
  const s = await startTestServer({}, { stepDelayMs: 5 });
  try {
    // two prompts of 3 and 2 tokens, n = 2, 4 tokens per choice (EOS ignored)
    const body = { model: MODEL, prompt: [[5, 6, 7], [8, 9]], max_tokens: 4, n: 2, ignore_eos: true };
    const r = await fetch(`${s.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    assert.equal(r.status, 200, await r.clone().text());
    const text = await (await fetch(`${s.url}/metrics`)).text();
    const sum = (name: string) => metricValue(text, `${name}_sum`);
    const count = (name: string) => metricValue(text, `${name}_count`);
    assert.equal(count("vllm:request_prompt_tokens"), 2);
    assert.equal(sum("vllm:request_prompt_tokens"), 5);
    assert.equal(sum("vllm:request_generation_tokens"), 2 * 2 * 4);
    assert.equal(sum("vllm:request_max_num_generation_tokens"), 2 * 4);
    assert.equal(sum("vllm:request_params_n"), 2 * 2);
    assert.equal(sum("vllm:request_params_max_tokens"), 2 * 4);
    // 4 fake steps 5 ms apart: the decode phase (first token to last) is 3 of them, within the whole running time
    for (const phase of ["prefill", "decode", "inference"]) assert.equal(count(`vllm:request_${phase}_time_seconds`), 2, phase);
    const decode = sum("vllm:request_decode_time_seconds")!, inference = sum("vllm:request_inference_time_seconds")!;
    assert.ok(decode >= 2 * 0.014 && decode <= inference, `decode ${decode}, inference ${inference}`);
    const les = [...text.matchAll(/^vllm:request_prompt_tokens_bucket\{le="([^"]+)"/gm)].map((m) => m[1]);
    assert.deepEqual(les, ["1", "2", "5", "10", "20", "50", "100", "200", "+Inf"], "max_model_len 256 bounds the buckets");
    assert.equal(metricValue(text, "vllm:request_prompt_tokens_bucket", 'le="2"'), 1);
  } finally {
    await s.close();
  }
});

test("prepareServer: made ready before the engine exists, then bound and served like createServer", async () => {
  const server = prepareServer({ version: "0.1.0-test" });
  await server.app.ready();
  const early = await server.app.inject({ method: "POST", url: "/v1/completions", payload: { model: MODEL, prompt: "hi" } });
  assert.equal(early.statusCode, 500, "a request before bind() is an error, not a crash");
  const engine = new FakeEngine();
  const app = server.bind({ engine, tokenizer: engine.tokenizer, servedModelNames: [MODEL], maxModelLen: engine.maxModelLen });
  assert.throws(() => server.bind({ engine, tokenizer: engine.tokenizer, servedModelNames: [MODEL], maxModelLen: 8 }), /twice/);
  const r = await app.inject({ method: "POST", url: "/v1/completions", payload: { model: MODEL, prompt: "hi", max_tokens: 2 } });
  assert.equal(r.statusCode, 200, r.body);
  assert.equal((r.json() as { model: string }).model, MODEL);
  const models = await app.inject({ method: "GET", url: "/v1/models" });
  assert.equal((models.json() as { data: { max_model_len: number }[] }).data[0]!.max_model_len, engine.maxModelLen);
  await app.close();
});

test("metrics: a fresh server's engine counters are 0, as vLLM's (kiln serve's warm-up request, run before bind, is not counted)", async () => {
  const server = prepareServer({ version: "0.1.0-test" });
  const engine = new FakeEngine();
  const warmup = { promptTokenIds: engine.tokenizer.encode("Hello") };
  for await (const _ of engine.generate(warmup, { maxTokens: 2, temperature: 0 }, { requestId: "kiln-warmup" })) void _;
  assert.equal(engine.stats().prefixCacheQueries, warmup.promptTokenIds.length);
  const app = server.bind({ engine, tokenizer: engine.tokenizer, servedModelNames: [MODEL], maxModelLen: engine.maxModelLen });
  const scrape = async () => (await app.inject({ method: "GET", url: "/metrics" })).body;
  assert.equal(metricValue(await scrape(), "vllm:prefix_cache_queries_total"), 0);
  const prompt = [5, 6, 7, 8, 9];
  const r = await app.inject({ method: "POST", url: "/v1/completions", payload: { model: MODEL, prompt, max_tokens: 2 } });
  assert.equal(r.statusCode, 200, r.body);
  assert.equal(metricValue(await scrape(), "vllm:prefix_cache_queries_total"), prompt.length, "the server's requests are");
  await app.close();
});
