// End to end through the official `openai` client against a real `kiln serve` on a tiny random Llama:
// models, chat, completions, streaming usage, n, stop strings, seeds, logprobs, token-id prompts, greedy.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import type OpenAI from "openai";
import { Tokenizer } from "../../src/models/tokenizer.js";
import { thinkTokenizerDir, tinyModelDir } from "../helpers/tiny-model.js";
import { postRaw, startKiln, type KilnServer } from "./kiln-process.js";

let server: KilnServer;
let client: OpenAI;
// vLLM extensions the typed client does not know; it passes unknown body fields through.
type Extra<T> = T & { ignore_eos?: boolean; include_stop_str_in_output?: boolean };
const USER = [{ role: "user" as const, content: "Tell me a story about the river." }];

/** A streamed chat request's text, its tool calls (each index's name and arguments) and its finish reason. */
async function streamedCalls(c: OpenAI, params: object): Promise<{ content: string; calls: { name?: string; arguments?: string }[]; finish: string | null }> {
  const stream = await c.chat.completions.create({ ...params, stream: true } as OpenAI.ChatCompletionCreateParamsStreaming);
  let content = "";
  const calls: { name?: string; arguments?: string }[] = [];
  let finish: string | null = null;
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (choice === undefined) continue;
    content += choice.delta.content ?? "";
    for (const t of choice.delta.tool_calls ?? []) calls[t.index] = { name: t.function?.name, arguments: t.function?.arguments };
    finish = choice.finish_reason ?? finish;
  }
  return { content, calls, finish };
}

async function tokenize(prompt: string): Promise<number[]> {
  const r = await postRaw(server.url, "/tokenize", { prompt });
  assert.equal(r.status, 200);
  return (r.body as { tokens: number[] }).tokens;
}

async function complete(prompt: string | string[] | number[] | number[][], extra: Record<string, unknown> = {}) {
  return client.completions.create({ model: server.model, prompt, max_tokens: 12, temperature: 0, ignore_eos: true, ...extra } as Extra<OpenAI.CompletionCreateParamsNonStreaming>);
}

before(async () => {
  server = await startKiln(["--trust-request-chat-template"]);
  client = server.client();
});
after(async () => {
  assert.equal(await server.stop(), 0);
});

describe("kiln serve + openai client (e2e)", () => {
  it("use_beam_search returns the offline beam search's n beams; one beam is greedy decoding", async () => {
    const { LLM } = await import("../../src/engine/llm-engine.js");
    const prompt = "The river ran by the";
    const beams = new LLM({ model: server.model, maxModelLen: 64, kvCacheMemory: 1 << 20, enforceEager: true }).beamSearch([prompt], { beamWidth: 3, maxTokens: 6, ignoreEos: true });
    const r = await complete(prompt, { use_beam_search: true, n: 3, max_tokens: 6 });
    assert.deepEqual(r.choices.map((ch) => ch.text), beams[0]!.map((b) => b.text));
    assert.deepEqual(r.choices.map((ch) => ch.finish_reason), ["length", "length", "length"]);
    assert.equal(r.usage!.completion_tokens, 18);
    const greedy = await complete(prompt, { max_tokens: 6 });
    assert.equal((await complete(prompt, { use_beam_search: true, n: 1, max_tokens: 6 })).choices[0]!.text, greedy.choices[0]!.text);
    const chat = await client.chat.completions.create({ model: server.model, messages: [{ role: "user", content: prompt }], max_tokens: 5, n: 2, use_beam_search: true } as Extra<OpenAI.ChatCompletionCreateParamsNonStreaming>);
    assert.equal(chat.choices.length, 2);
    const refused = await postRaw(server.url, "/v1/completions", { model: server.model, prompt, use_beam_search: true, stream: true });
    assert.equal(refused.status, 400);
  });

  it("lists the served model", async () => {
    const page = await client.models.list();
    assert.equal(page.data.length, 1);
    const m = page.data[0]! as OpenAI.Model & { max_model_len: number };
    assert.equal(m.id, server.model);
    assert.equal(m.object, "model");
    assert.equal(m.owned_by, "kiln");
    assert.equal(m.max_model_len, 512); // max_position_embeddings of the tiny config
  });

  it("chat completion: shape, usage and greedy determinism", async () => {
    const req = { model: server.model, messages: USER, max_tokens: 10, temperature: 0, ignore_eos: true } as Extra<OpenAI.ChatCompletionCreateParamsNonStreaming>;
    const [a, b] = [await client.chat.completions.create(req), await client.chat.completions.create(req)];
    assert.match(a.id, /^chatcmpl-[0-9a-f]{32}$/);
    assert.equal(a.object, "chat.completion");
    assert.equal(a.model, server.model);
    assert.equal(a.choices.length, 1);
    assert.equal(a.choices[0]!.index, 0);
    assert.equal(a.choices[0]!.message.role, "assistant");
    assert.equal(a.choices[0]!.finish_reason, "length");
    const promptTokens = (await postRaw(server.url, "/tokenize", { messages: USER, add_generation_prompt: true })).body as { count: number };
    assert.deepEqual(a.usage, { prompt_tokens: promptTokens.count, completion_tokens: 10, total_tokens: promptTokens.count + 10 });
    assert.equal(b.choices[0]!.message.content, a.choices[0]!.message.content);
    assert.notEqual(a.id, b.id);
  });

  it("text completion: shape, usage, and greedy equals greedy", async () => {
    const ids = await tokenize("The river ran");
    const a = await complete("The river ran");
    const b = await complete("The river ran");
    assert.match(a.id, /^cmpl-[0-9a-f]{32}$/);
    assert.equal(a.object, "text_completion");
    assert.equal(a.choices.length, 1);
    assert.equal(a.choices[0]!.finish_reason, "length");
    assert.equal(a.choices[0]!.logprobs, null);
    assert.deepEqual(a.usage, { prompt_tokens: ids.length, completion_tokens: 12, total_tokens: ids.length + 12 });
    assert.equal(b.choices[0]!.text, a.choices[0]!.text);
    assert.ok(a.choices[0]!.text.length > 0);
  });

  it("chat streaming with include_usage: role first, same text as non-streaming, usage chunk last", async () => {
    const base = { model: server.model, messages: USER, max_tokens: 9, temperature: 0, ignore_eos: true };
    const whole = await client.chat.completions.create(base as Extra<OpenAI.ChatCompletionCreateParamsNonStreaming>);
    const stream = await client.chat.completions.create({ ...base, stream: true, stream_options: { include_usage: true } } as Extra<OpenAI.ChatCompletionCreateParamsStreaming>);
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    for await (const c of stream) chunks.push(c);
    assert.ok(chunks.length >= 3);
    assert.equal(chunks[0]!.choices[0]!.delta.role, "assistant");
    assert.equal(new Set(chunks.map((c) => c.id)).size, 1);
    for (const c of chunks) assert.equal(c.object, "chat.completion.chunk");
    const last = chunks.at(-1)!;
    assert.deepEqual(last.choices, []);
    assert.deepEqual(last.usage, whole.usage);
    for (const c of chunks.slice(0, -1)) assert.equal(c.usage, null);
    const finishes = chunks.flatMap((c) => c.choices.map((ch) => ch.finish_reason)).filter((r) => r !== null);
    assert.deepEqual(finishes, ["length"]);
    assert.equal(chunks.map((c) => c.choices[0]?.delta.content ?? "").join(""), whole.choices[0]!.message.content);
  });

  it("completions streaming on the wire: usage chunk, then data: [DONE]", async () => {
    const res = await fetch(`${server.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: server.model, prompt: "The river ran", max_tokens: 7, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true } }),
    });
    assert.equal(res.status, 200);
    assert.match(res.headers.get("content-type")!, /^text\/event-stream/);
    const events = (await res.text()).split("\n\n").filter((e) => e.length > 0);
    for (const e of events) assert.ok(e.startsWith("data: "), e);
    assert.equal(events.at(-1), "data: [DONE]");
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e.slice(6)) as OpenAI.Completion);
    const usage = chunks.at(-1)!;
    assert.deepEqual(usage.choices, []);
    const promptLen = (await tokenize("The river ran")).length;
    assert.deepEqual(usage.usage, { prompt_tokens: promptLen, completion_tokens: 7, total_tokens: promptLen + 7 });
    const text = chunks.slice(0, -1).map((c) => c.choices[0]!.text).join("");
    assert.equal(text, (await complete("The river ran", { max_tokens: 7 })).choices[0]!.text);
    assert.equal(chunks.at(-2)!.choices[0]!.finish_reason, "length");
  });

  it("n=2: two indexed choices, seeded samples differ, usage counts both", async () => {
    const r = await complete("Once upon a time", { n: 2, temperature: 1, seed: 11, max_tokens: 10 });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
    assert.deepEqual(r.choices.map((c) => c.finish_reason), ["length", "length"]);
    assert.equal(r.usage!.completion_tokens, 20);
    assert.notEqual(r.choices[0]!.text, r.choices[1]!.text);
    const again = await complete("Once upon a time", { n: 2, temperature: 1, seed: 11, max_tokens: 10 });
    assert.deepEqual(again.choices.map((c) => c.text), r.choices.map((c) => c.text));

    const chat = await client.chat.completions.create({ model: server.model, messages: USER, n: 2, max_tokens: 5, temperature: 1, seed: 3, ignore_eos: true } as Extra<OpenAI.ChatCompletionCreateParamsNonStreaming>);
    assert.deepEqual(chat.choices.map((c) => [c.index, c.message.role, c.finish_reason]), [[0, "assistant", "length"], [1, "assistant", "length"]]);
    assert.equal(chat.usage!.completion_tokens, 10);
  });

  it("stop strings cut the text before the stop (or include it on request)", async () => {
    const full = (await complete("The river ran", { max_tokens: 24 })).choices[0]!.text;
    // An ASCII 2-character stop well inside the text, so that byte-level partial characters cannot blur it.
    let at = -1;
    for (let k = 3; k + 2 <= full.length; k++) {
      if (/^[ -~]{2}$/.test(full.slice(k, k + 2)) && full.indexOf(full.slice(k, k + 2)) === k && !full.slice(0, k).includes("\uFFFD")) {
        at = k;
        break;
      }
    }
    assert.ok(at > 0, `no usable stop string in ${JSON.stringify(full)}`);
    const stop = full.slice(at, at + 2);
    const cut = await complete("The river ran", { max_tokens: 24, stop });
    assert.equal(cut.choices[0]!.text, full.slice(0, at));
    assert.equal(cut.choices[0]!.finish_reason, "stop");
    assert.equal((cut.choices[0] as { stop_reason?: unknown }).stop_reason, stop);
    assert.ok(cut.usage!.completion_tokens < 24);
    const kept = await complete("The river ran", { max_tokens: 24, stop: ["\u0000never", stop], include_stop_str_in_output: true });
    assert.equal(kept.choices[0]!.text, full.slice(0, at + 2));
    assert.equal(kept.choices[0]!.finish_reason, "stop");
  });

  it("seed: same seed gives the same text at temperature 1 (also under concurrency); other seeds differ", async () => {
    const seeded = (seed: number) => complete("Once upon a time", { temperature: 1, seed, max_tokens: 16 }).then((r) => r.choices[0]!.text);
    const first = await seeded(42);
    // The same seed while other requests share the batch.
    const [again, , , other1, other2, other3] = await Promise.all([seeded(42), complete("noise", { temperature: 1 }), complete("more noise", { temperature: 1 }), seeded(1), seeded(2), seeded(3)]);
    assert.equal(again, first);
    assert.equal(await seeded(42), first);
    const distinct = new Set([first, other1, other2, other3]);
    assert.ok(distinct.size >= 2, `four seeds gave ${distinct.size} distinct texts`);
  });

  it("chat logprobs: one entry per token, sorted top_logprobs, all <= 0, greedy picks the top", async () => {
    const r = await client.chat.completions.create({ model: server.model, messages: USER, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 3, ignore_eos: true } as Extra<OpenAI.ChatCompletionCreateParamsNonStreaming>);
    const content = r.choices[0]!.logprobs!.content!;
    assert.equal(content.length, 6);
    assert.equal(r.usage!.completion_tokens, 6);
    for (const e of content) {
      assert.ok(e.logprob <= 0 && e.logprob > -9999, `logprob ${e.logprob}`);
      assert.deepEqual(e.bytes, [...Buffer.from(e.token, "utf8")]);
      assert.equal(e.top_logprobs.length, 3);
      const lps = e.top_logprobs.map((t) => t.logprob);
      assert.deepEqual(lps, [...lps].sort((x, y) => y - x), "top_logprobs sorted, most likely first");
      for (const t of e.top_logprobs) assert.ok(t.logprob <= 0);
      assert.ok(Math.abs(e.logprob - lps[0]!) < 1e-9, "greedy samples the most likely token");
      assert.ok(Math.exp(lps[0]!) + Math.exp(lps[1]!) + Math.exp(lps[2]!) <= 1 + 1e-9);
    }
    const sampled = await client.chat.completions.create({ model: server.model, messages: USER, max_tokens: 6, temperature: 1, seed: 5, logprobs: true });
    for (const e of sampled.choices[0]!.logprobs!.content!) {
      assert.ok(e.logprob <= 0);
      assert.deepEqual(e.top_logprobs, []);
    }
  });

  it("completions logprobs: parallel lists, offsets into the text, sampled token listed", async () => {
    const r = await complete("The river ran", { max_tokens: 6, logprobs: 2 });
    const lp = r.choices[0]!.logprobs!;
    assert.equal(lp.tokens!.length, 6);
    assert.equal(lp.token_logprobs!.length, 6);
    assert.equal(lp.top_logprobs!.length, 6);
    assert.equal(lp.text_offset!.length, 6);
    assert.equal(lp.text_offset![0], 0);
    for (let i = 0; i < 6; i++) {
      const own = lp.token_logprobs![i]!;
      const top = lp.top_logprobs![i]!;
      assert.ok(own <= 0);
      if (i > 0) assert.equal(lp.text_offset![i], lp.text_offset![i - 1]! + lp.tokens![i - 1]!.length);
      const values = Object.values(top);
      // 2 ranked entries plus the sampled one, fewer when token texts coincide (byte-level pieces decode to U+FFFD).
      assert.ok(values.length >= 1 && values.length <= 3, JSON.stringify(top));
      for (const v of values) assert.ok(v <= 0);
      assert.equal(top[lp.tokens![i]!], own);
      assert.ok(Math.abs(Math.max(...values) - own) < 1e-9, "greedy samples the most likely token");
    }
  });

  it("echo with max_tokens 0 scores the prompt without generating; prompt_logprobs come back as vLLM returns them", async () => {
    const ids = await tokenize("The river ran to the sea");
    const r = await complete("The river ran to the sea", { max_tokens: 0, echo: true, logprobs: 1, prompt_logprobs: 1 });
    const c = r.choices[0]! as OpenAI.CompletionChoice & { prompt_logprobs: (Record<string, { logprob: number; rank: number; decoded_token: string }> | null)[] };
    assert.equal(c.text, "The river ran to the sea");
    assert.equal(r.usage!.completion_tokens, 0);
    assert.equal(r.usage!.prompt_tokens, ids.length);
    const lp = c.logprobs!;
    assert.equal(lp.tokens!.length, ids.length);
    assert.equal(lp.token_logprobs![0], null);
    assert.equal(c.prompt_logprobs.length, ids.length);
    assert.equal(c.prompt_logprobs[0], null);
    for (let i = 1; i < ids.length; i++) {
      const own = c.prompt_logprobs[i]![String(ids[i])]!;
      assert.ok(own.logprob <= 0 && own.rank >= 1, JSON.stringify(own));
      assert.ok(Math.abs(lp.token_logprobs![i]! - own.logprob) < 1e-6, "the echo's logprobs are the prompt's");
    }
    // The same scores whatever the sampling settings (raw logprobs) and whether or not a completion follows.
    const hot = await complete("The river ran to the sea", { max_tokens: 2, echo: true, logprobs: 1, temperature: 1.5, top_k: 2, seed: 1 });
    for (let i = 1; i < ids.length; i++) assert.ok(Math.abs(hot.choices[0]!.logprobs!.token_logprobs![i]! - lp.token_logprobs![i]!) < 1e-5);
    // text_offset counts characters (code points, Python's len, as vLLM does), not UTF-16 units: "😀" is one.
    const wide = "😀 日本 river";
    const w = (await complete(wide, { max_tokens: 0, echo: true, logprobs: 0 })).choices[0]!;
    const last = w.logprobs!.tokens!.at(-1)!;
    assert.ok(wide.endsWith(last) && /^[ -~]+$/.test(last), last);
    assert.equal(w.logprobs!.text_offset!.at(-1)! + [...last].length, [...wide].length, JSON.stringify(w.logprobs!.text_offset));
    const bad = await postRaw(server.url, "/v1/completions", { model: server.model, prompt: "x", max_tokens: 0 });
    assert.equal(bad.status, 400, "max_tokens 0 needs echo");
    const chat = await postRaw(server.url, "/v1/chat/completions", { model: server.model, messages: USER, max_tokens: 1, prompt_logprobs: 0 });
    const pl = (chat.body as { prompt_logprobs: unknown[]; usage: { prompt_tokens: number } });
    assert.equal(pl.prompt_logprobs.length, pl.usage.prompt_tokens);
    assert.equal(pl.prompt_logprobs[0], null);
  });

  it("prompt as token ids and as a list of token id lists", async () => {
    const [a, b] = [await tokenize("The river ran"), await tokenize("Once upon a time")];
    const [textA, textB] = [(await complete("The river ran")).choices[0]!.text, (await complete("Once upon a time")).choices[0]!.text];
    const single = await complete(a);
    assert.equal(single.choices[0]!.text, textA);
    assert.equal(single.usage!.prompt_tokens, a.length);
    const batch = await complete([a, b]);
    assert.deepEqual(batch.choices.map((c) => [c.index, c.text]), [[0, textA], [1, textB]]);
    assert.deepEqual(batch.usage, { prompt_tokens: a.length + b.length, completion_tokens: 24, total_tokens: a.length + b.length + 24 });
    const strings = await complete(["The river ran", "Once upon a time"]);
    assert.deepEqual(strings.choices.map((c) => c.text), [textA, textB]);
  });

  it("/tokenize return_token_strs spells the tokens as tokenizer.json's vocabulary does (HF's convert_ids_to_tokens)", async () => {
    const json = JSON.parse(readFileSync(join(server.model, "tokenizer.json"), "utf8")) as {
      model: { vocab: Record<string, number> }; added_tokens: { id: number; content: string }[];
    };
    const spelling = new Map<number, string>([...Object.entries(json.model.vocab).map(([t, id]) => [id, t] as const), ...json.added_tokens.map((t) => [t.id, t.content] as const)]);
    const r = (await postRaw(server.url, "/tokenize", { prompt: "Hello world, the river", return_token_strs: true })).body as { tokens: number[]; token_strs: string[] };
    assert.ok(r.tokens.length > 2);
    assert.deepEqual(r.token_strs, r.tokens.map((id) => spelling.get(id)));
    assert.ok(r.token_strs.some((t) => t.startsWith("\u0120")), "byte-level spellings, not decoded text");
    const chat = (await postRaw(server.url, "/tokenize", { messages: USER, return_token_strs: true })).body as { tokens: number[]; token_strs: string[] };
    assert.deepEqual(chat.token_strs, chat.tokens.map((id) => spelling.get(id)));
    const plain = (await postRaw(server.url, "/tokenize", { prompt: "Hello" })).body as { token_strs: unknown };
    assert.equal(plain.token_strs, null);
  });

  it("/health and /version answer", async () => {
    assert.equal((await fetch(`${server.url}/health`)).status, 200);
    const v = (await (await fetch(`${server.url}/version`)).json()) as { version: string };
    assert.match(v.version, /^\d+\.\d+\.\d+/);
  });
});

describe("structured output and tool calls through the openai client (e2e)", () => {
  const WEATHER = {
    type: "object",
    properties: { city: { type: "string", enum: ["Paris", "Oslo"] }, unit: { type: "string", enum: ["C", "F"] }, days: { type: "integer", enum: [1, 2, 3] } },
    required: ["city", "unit", "days"],
  };
  const tools = [
    { type: "function" as const, function: { name: "get_weather", parameters: WEATHER } },
    { type: "function" as const, function: { name: "get_time", parameters: { type: "object", properties: { zone: { type: "string", enum: ["UTC", "CET"] } }, required: ["zone"] } } },
  ];
  // vLLM's structured_outputs field (the typed client passes it through): compact JSON, so a random model finishes
  const compact = { structured_outputs: { disable_any_whitespace: true } };
  const checkWeather = (args: unknown): void => {
    const a = args as Record<string, unknown>;
    assert.deepEqual(Object.keys(a), ["city", "unit", "days"]);
    assert.ok(["Paris", "Oslo"].includes(a.city as string) && ["C", "F"].includes(a.unit as string) && [1, 2, 3].includes(a.days as number));
  };
  const chat = (extra: object) =>
    client.chat.completions.create({ model: server.model, messages: USER, max_tokens: 120, seed: 5, temperature: 1, ...compact, ...extra } as OpenAI.ChatCompletionCreateParamsNonStreaming);

  it("response_format json_schema: the content parses and follows the schema", async () => {
    const r = await chat({ response_format: { type: "json_schema", json_schema: { name: "weather", schema: WEATHER } } });
    assert.equal(r.choices[0]!.finish_reason, "stop");
    checkWeather(JSON.parse(r.choices[0]!.message.content!));
  });

  it("a named tool_choice returns one call of that function with schema-valid arguments, streamed the same", async () => {
    const named = { tools, tool_choice: { type: "function", function: { name: "get_weather" } } };
    const r = await chat(named);
    const m = r.choices[0]!.message;
    assert.equal(m.content, "");
    assert.equal(m.tool_calls!.length, 1);
    const call = m.tool_calls![0]! as OpenAI.ChatCompletionMessageFunctionToolCall;
    assert.match(call.id, /^chatcmpl-tool-[0-9a-f]{32}$/);
    assert.equal(call.function.name, "get_weather");
    checkWeather(JSON.parse(call.function.arguments));
    const stream = await client.chat.completions.create({ model: server.model, messages: USER, max_tokens: 120, seed: 5, temperature: 1, ...compact, ...named, stream: true } as OpenAI.ChatCompletionCreateParamsStreaming);
    let args = "";
    let name: string | undefined;
    for await (const c of stream) for (const t of c.choices[0]?.delta.tool_calls ?? []) {
      name ??= t.function?.name;
      args += t.function?.arguments ?? "";
    }
    assert.equal(name, "get_weather");
    assert.equal(args, call.function.arguments);
  });

  it('tool_choice "required" returns calls of the given tools, each with its own schema\'s arguments', async () => {
    const r = await chat({ tools, tool_choice: "required" });
    assert.equal(r.choices[0]!.finish_reason, "tool_calls"); // as vLLM reports a required reply that ended normally
    const calls = r.choices[0]!.message.tool_calls! as OpenAI.ChatCompletionMessageFunctionToolCall[];
    assert.ok(calls.length >= 1, JSON.stringify(r.choices[0]));
    for (const c of calls) {
      const args = JSON.parse(c.function.arguments) as Record<string, unknown>;
      if (c.function.name === "get_weather") checkWeather(args);
      else {
        assert.equal(c.function.name, "get_time");
        assert.ok(["UTC", "CET"].includes(args.zone as string));
      }
    }
  });

  it('"required" with $defs in a tool\'s parameters, and a tool whose parameters are {}: arguments are objects', async () => {
    const defsTools = [
      { type: "function" as const, function: { name: "pick", parameters: { type: "object", properties: { c: { $ref: "#/$defs/City" } }, required: ["c"], $defs: { City: { type: "string", enum: ["Paris", "Rome"] } } } } },
      { type: "function" as const, function: { name: "noop", parameters: {} } },
    ];
    for (const seed of [1, 2, 3]) {
      const r = await chat({ tools: defsTools, tool_choice: "required", seed });
      const calls = r.choices[0]!.message.tool_calls! as OpenAI.ChatCompletionMessageFunctionToolCall[];
      assert.ok(calls.length >= 1, JSON.stringify(r.choices[0]));
      for (const c of calls) {
        const args = JSON.parse(c.function.arguments) as Record<string, unknown>;
        assert.equal(typeof args, "object");
        assert.ok(args !== null && !Array.isArray(args));
        if (c.function.name === "pick") assert.ok(["Paris", "Rome"].includes(args.c as string), c.function.arguments);
        else assert.equal(c.function.name, "noop");
      }
    }
  });

  it("/tokenize renders the tools with the chat template, whatever the server's tool choice", async () => {
    const messages = [{ role: "user", content: "hi" }];
    // the built-in template ignores tools: this one writes their names before the messages
    const chat_template = "{% for t in tools or [] %}{{ t.function.name }} {% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}";
    const plain = (await postRaw(server.url, "/tokenize", { messages, chat_template })).body as { count: number };
    const r = await postRaw(server.url, "/tokenize", { messages, tools, chat_template });
    assert.equal(r.status, 200);
    assert.ok((r.body as { count: number }).count >= plain.count);
    const names = (await postRaw(server.url, "/tokenize", { messages: [{ role: "user", content: "get_weather get_time hi" }], chat_template })).body as { tokens: number[] };
    assert.deepEqual((r.body as { tokens: number[] }).tokens, names.tokens);
  });

  it("completions take guided_choice and guided_regex; a bad schema is a 400 naming structured_outputs", async () => {
    const c = await complete("The river", { guided_choice: ["north", "south"], ignore_eos: false, max_tokens: 8 });
    assert.ok(["north", "south"].includes(c.choices[0]!.text), c.choices[0]!.text);
    const g = await complete("The river", { guided_regex: "[0-9]{4}-[0-9]{2}", ignore_eos: false, max_tokens: 16 });
    assert.match(g.choices[0]!.text, /^[0-9]{4}-[0-9]{2}$/);
    await assert.rejects(chat({ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "nope" } } } }), (e: unknown) => {
      const err = e as { status: number; error: { param: string; message: string } };
      assert.equal(err.status, 400);
      assert.equal(err.error.param, "structured_outputs");
      assert.match(err.error.message, /Unsupported type "nope"/);
      return true;
    });
  });
});

describe("tool_choice auto with --enable-auto-tool-choice --tool-call-parser hermes (e2e)", () => {
  let auto: KilnServer;
  let c: OpenAI;
  before(async () => {
    auto = await startKiln(["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]);
    c = auto.client();
  });
  after(async () => {
    assert.equal(await auto.stop(), 0);
  });
  const tools = [{ type: "function" as const, function: { name: "get_time", parameters: { type: "object", properties: { zone: { type: "string" } } } } }];
  // The random model is steered into a hermes-format reply by a regex, so the parser has calls to find.
  const steer = { structured_outputs: { regex: 'Checking\\. <tool_call>\\{"name": "get_time", "arguments": \\{"zone": "(UTC|CET)"\\}\\}</tool_call>' } };
  const req = { model: "x", messages: USER, tools, max_tokens: 80, seed: 2, temperature: 1, ...steer };

  it("the calls the model wrote come back as tool_calls, the text before them as content, finish_reason tool_calls", async () => {
    const r = await c.chat.completions.create({ ...req, model: auto.model } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    const ch = r.choices[0]!;
    assert.equal(ch.finish_reason, "tool_calls");
    assert.equal(ch.message.content, "Checking. ");
    const calls = ch.message.tool_calls as OpenAI.ChatCompletionMessageFunctionToolCall[];
    assert.equal(calls.length, 1);
    assert.equal(calls[0]!.function.name, "get_time");
    assert.match(calls[0]!.function.arguments, /^\{"zone": "(UTC|CET)"\}$/); // as vLLM's json.dumps writes it
    // streamed: the content before the marker streams as text, the call comes whole in the last chunk
    const { content, calls: streamed, finish } = await streamedCalls(c, { ...req, model: auto.model });
    assert.equal(content, "Checking. ");
    assert.deepEqual(streamed, [{ name: "get_time", arguments: calls[0]!.function.arguments }]);
    assert.equal(finish, "tool_calls");
  });

  it("a reply without calls stays text; tool_choice none is plain text", async () => {
    const r = await c.chat.completions.create({ ...req, model: auto.model, structured_outputs: { choice: ["No tools needed."] } } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    assert.equal(r.choices[0]!.message.content, "No tools needed.");
    assert.deepEqual(r.choices[0]!.message.tool_calls, []);
    assert.equal(r.choices[0]!.finish_reason, "stop");
  });
});

// Llama 3.x's formats: calls open the reply, come back with content null, and carry Python's json.dumps spacing.
const openingFormats = [
  { parser: "llama3_json", regex: '<\\|python_tag\\|>\\{"name": "get_time", "parameters": \\{"zone": "(UTC|CET)"\\}\\}; \\{"name": "get_date", "parameters": \\{\\}\\}' },
  { parser: "pythonic", regex: '\\[get_time\\(zone="(UTC|CET)"\\), get_date\\(\\)\\]' },
];
for (const { parser, regex } of openingFormats) {
  describe(`tool_choice auto with --enable-auto-tool-choice --tool-call-parser ${parser} (e2e)`, () => {
    let auto: KilnServer;
    let c: OpenAI;
    before(async () => {
      auto = await startKiln(["--enable-auto-tool-choice", "--tool-call-parser", parser]);
      c = auto.client();
    });
    after(async () => {
      assert.equal(await auto.stop(), 0);
    });
    const parameters = { type: "object", properties: { zone: { type: "string" } } };
    const tools = ["get_time", "get_date"].map((name) => ({ type: "function" as const, function: { name, parameters } }));
    // the random model is steered into the parser's format by a regex
    const req = { model: "x", messages: USER, tools, max_tokens: 200, seed: 2, temperature: 1, structured_outputs: { regex } };

    it("the calls come back as tool_calls (content null, finish_reason tool_calls), streamed or not", async () => {
      const r = await c.chat.completions.create({ ...req, model: auto.model } as OpenAI.ChatCompletionCreateParamsNonStreaming);
      const ch = r.choices[0]!;
      assert.equal(ch.finish_reason, "tool_calls");
      assert.equal(ch.message.content, null);
      const calls = (ch.message.tool_calls as OpenAI.ChatCompletionMessageFunctionToolCall[]).map((t) => t.function);
      assert.equal(calls.length, 2);
      assert.equal(calls[0]!.name, "get_time");
      assert.match(calls[0]!.arguments, /^\{"zone": "(UTC|CET)"\}$/);
      assert.deepEqual(calls[1], { name: "get_date", arguments: "{}" });
      // streamed: nothing goes out as content (the reply opens with the calls); the calls come in the last chunk
      const { content, calls: streamed, finish } = await streamedCalls(c, { ...req, model: auto.model });
      assert.equal(content, "");
      assert.deepEqual(streamed, calls);
      assert.equal(finish, "tool_calls");
      // parallel_tool_calls false: the first call only, streamed or not (as vLLM filters them)
      const one = await c.chat.completions.create({ ...req, model: auto.model, parallel_tool_calls: false } as OpenAI.ChatCompletionCreateParamsNonStreaming);
      assert.deepEqual((one.choices[0]!.message.tool_calls as OpenAI.ChatCompletionMessageFunctionToolCall[]).map((t) => t.function), [calls[0]]);
      assert.deepEqual((await streamedCalls(c, { ...req, model: auto.model, parallel_tool_calls: false })).calls, [calls[0]]);
    });

    it("a reply that is no call stays text", async () => {
      const noCall = { ...req, model: auto.model, structured_outputs: { choice: ["[1] says no."] } };
      const r = await c.chat.completions.create(noCall as OpenAI.ChatCompletionCreateParamsNonStreaming);
      assert.equal(r.choices[0]!.message.content, "[1] says no.");
      assert.deepEqual(r.choices[0]!.message.tool_calls, []);
      assert.equal(r.choices[0]!.finish_reason, "stop");
    });
  });
}

describe("kiln serve --speculative-config (e2e)", () => {
  let spec: KilnServer;
  before(async () => {
    spec = await startKiln(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}']);
  });
  after(async () => {
    assert.equal(await spec.stop(), 0);
  });

  it("greedy completions equal the plain server's (float32 weights); drafts are counted in /metrics", async () => {
    const prompt = "the river ran, the river ran, the river ran, the river";
    const body = { prompt, max_tokens: 40, temperature: 0, ignore_eos: true };
    const plain = await complete(prompt, { max_tokens: 40 });
    const r = await spec.client().completions.create({ model: spec.model, ...body } as Extra<OpenAI.CompletionCreateParamsNonStreaming>);
    assert.equal(r.choices[0]!.text, plain.choices[0]!.text);
    assert.ok((await spec.metric("vllm:spec_decode_num_drafts_total")) > 0);
    const drafted = await spec.metric("vllm:spec_decode_num_draft_tokens_total");
    const accepted = await spec.metric("vllm:spec_decode_num_accepted_tokens_total");
    assert.ok(drafted > 0 && accepted >= 0 && accepted <= drafted, `${accepted} of ${drafted}`);
    // vLLM's per-position counter: one series per draft position, adding up to the accepted tokens
    const perPosition = await Promise.all([0, 1, 2].map((p) => spec.metric("vllm:spec_decode_num_accepted_tokens_per_pos_total", `position="${p}"`)));
    assert.equal(perPosition.reduce((a, b) => a + b, 0), accepted);
    assert.ok(perPosition[0]! >= perPosition[1]! && perPosition[1]! >= perPosition[2]!, JSON.stringify(perPosition));
  });
});

describe("kiln serve --reasoning-parser qwen3 (e2e)", () => {
  let thinker: KilnServer;
  let c: OpenAI;
  let endId: number;
  before(async () => {
    // the tiny model over a tokenizer holding <think> and </think> as tokens (as Qwen3's does)
    thinker = await startKiln(["--reasoning-parser", "qwen3"], tinyModelDir("LlamaForCausalLM", { tokenizerDir: thinkTokenizerDir() }));
    c = thinker.client();
    endId = Tokenizer.fromDir(thinkTokenizerDir()).encode("</think>", { addSpecialTokens: false })[0]!;
  });
  after(async () => {
    assert.equal(await thinker.stop(), 0);
  });
  // A prompt whose assistant turn is continued from "</think>" has ended the reasoning: the grammar holds from the
  // first token, and steers the random model into a reply with a thinking part for the parser to find.
  const closed = [...USER, { role: "assistant" as const, content: "</think>" }];
  const steer = { structured_outputs: { regex: "<think>(plan|check) [a-z]{2,6}</think>Answer: (yes|no)" } };
  const req = { messages: closed, continue_final_message: true, add_generation_prompt: false, max_tokens: 60, seed: 3, temperature: 1, ...steer };

  it("the <think> part comes back as reasoning, the rest as content, streamed or not", async () => {
    const r = await c.chat.completions.create({ ...req, model: thinker.model } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    const m = r.choices[0]!.message as unknown as { content: string; reasoning: string; reasoning_content: string };
    assert.match(m.reasoning, /^(plan|check) [a-z]{2,6}$/);
    assert.equal(m.reasoning_content, m.reasoning);
    assert.match(m.content, /^Answer: (yes|no)$/);
    const stream = await c.chat.completions.create({ ...req, model: thinker.model, stream: true } as OpenAI.ChatCompletionCreateParamsStreaming);
    let reasoning = "";
    let content = "";
    for await (const chunk of stream) {
      const d = chunk.choices[0]?.delta as { content?: string; reasoning?: string } | undefined;
      reasoning += d?.reasoning ?? "";
      content += d?.content ?? "";
    }
    assert.equal(reasoning, m.reasoning); // same seed: the same reply
    assert.equal(content, m.content);
  });

  it("structured output starts after the model's </think>, and a reply still thinking is not constrained", async () => {
    // </think> pushed to the front by logit_bias; the regex then holds (it masks </think> from there on)
    const answer = { messages: USER, max_tokens: 20, seed: 5, temperature: 1, structured_outputs: { regex: "Answer: (yes|no)" } };
    const ended = { ...answer, logit_bias: { [endId]: 100 } };
    const r = await c.chat.completions.create({ ...ended, model: thinker.model } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    const m = r.choices[0]!.message as unknown as { content: string; reasoning: string };
    assert.equal(m.reasoning, "");
    assert.match(m.content, /^Answer: (yes|no)$/);
    assert.equal(r.choices[0]!.finish_reason, "stop");
    let streamed = "";
    for await (const chunk of await c.chat.completions.create({ ...ended, model: thinker.model, stream: true } as OpenAI.ChatCompletionCreateParamsStreaming))
      streamed += chunk.choices[0]?.delta.content ?? "";
    assert.equal(streamed, m.content);
    // no </think> within max_tokens: the whole reply is the model's unconstrained reasoning
    const open = await c.chat.completions.create({ ...answer, max_tokens: 8, model: thinker.model } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    const om = open.choices[0]!.message as unknown as { content: string | null; reasoning: string };
    assert.equal(om.content, null);
    assert.equal(open.choices[0]!.finish_reason, "length");
    assert.ok(!"Answer: yes".startsWith(om.reasoning) && !"Answer: no".startsWith(om.reasoning), om.reasoning);
  });

  it("include_reasoning false drops it; enable_thinking false reads the reply as content", async () => {
    const r = await c.chat.completions.create({ ...req, model: thinker.model, include_reasoning: false } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    const m = r.choices[0]!.message as unknown as { content: string; reasoning: string | null };
    assert.equal(m.reasoning, null);
    assert.match(m.content, /^Answer: (yes|no)$/);
    // after a prompt that ended the reasoning, a reply without a thinking part is content, streamed or not
    const plain = { ...req, max_tokens: 20, structured_outputs: { regex: "Answer: (yes|no)" } };
    const p = await c.chat.completions.create({ ...plain, model: thinker.model } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    const pm = p.choices[0]!.message as unknown as { content: string; reasoning: string | null };
    assert.equal(pm.reasoning, null);
    assert.match(pm.content, /^Answer: (yes|no)$/);
    let streamedContent = "";
    for await (const chunk of await c.chat.completions.create({ ...plain, model: thinker.model, stream: true } as OpenAI.ChatCompletionCreateParamsStreaming))
      streamedContent += chunk.choices[0]?.delta.content ?? "";
    assert.equal(streamedContent, pm.content);
    // enable_thinking false: the free reply is all content
    const off = await c.chat.completions.create({ messages: USER, max_tokens: 8, model: thinker.model, chat_template_kwargs: { enable_thinking: false } } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    const om = off.choices[0]!.message as unknown as { content: string; reasoning: string | null };
    assert.equal(om.reasoning, null);
    assert.ok(om.content.length > 0);
    // beam search replies are split too: a free random reply has no </think>, so it is all reasoning
    const beam = await c.chat.completions.create({ messages: USER, max_tokens: 4, model: thinker.model, use_beam_search: true, n: 1 } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    const bm = beam.choices[0]!.message as unknown as { content: string | null; reasoning: string | null };
    assert.equal(bm.content, null);
    assert.ok((bm.reasoning ?? "").length > 0);
  });
});

describe("kiln serve --enable-prompt-tokens-details (e2e)", () => {
  let cacher: KilnServer;
  before(async () => {
    cacher = await startKiln(["--enable-prompt-tokens-details", "--block-size", "16"]);
  });
  after(async () => {
    assert.equal(await cacher.stop(), 0);
  });

  it("usage counts the prompt tokens read from the prefix cache: whole blocks, the last prompt token recomputed", async () => {
    const c = cacher.client();
    const prompt = "The river ran past the mill and the old stone bridge, and on into the hills where the".repeat(2);
    type Usage = { prompt_tokens: number; prompt_tokens_details?: { cached_tokens: number } | null };
    const first = (await c.completions.create({ model: cacher.model, prompt, max_tokens: 2 })).usage as Usage;
    assert.equal(first.prompt_tokens_details, undefined); // nothing cached: no details, as vLLM
    const again = (await c.completions.create({ model: cacher.model, prompt, max_tokens: 2 })).usage as Usage;
    const want = Math.floor((first.prompt_tokens - 1) / 16) * 16;
    assert.ok(want >= 16, `prompt of ${first.prompt_tokens} tokens`);
    assert.deepEqual(again.prompt_tokens_details, { cached_tokens: want });
    // chat, streamed with include_usage: the same count on the usage chunk
    const messages = [{ role: "user" as const, content: prompt }];
    await c.chat.completions.create({ model: cacher.model, messages, max_tokens: 2 });
    let usage: Usage | null = null;
    for await (const chunk of await c.chat.completions.create({ model: cacher.model, messages, max_tokens: 2, stream: true, stream_options: { include_usage: true } }))
      if (chunk.usage) usage = chunk.usage as Usage;
    assert.deepEqual(usage!.prompt_tokens_details, { cached_tokens: Math.floor((usage!.prompt_tokens - 1) / 16) * 16 });
  });
});
