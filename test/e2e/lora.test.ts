// `kiln serve --enable-lora --lora-modules` through the official `openai` client: an adapter is a model of its own
// (listed with the base as parent), its completions equal those of a server of the adapter merged into the weights,
// and with VLLM_ALLOW_RUNTIME_LORA_UPDATING adapters load and unload at run time with vLLM's answers.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type OpenAI from "openai";
import { allProjections, mergeLoraIntoModel, writeLoraAdapter } from "../helpers/lora-adapter.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";
import { assertErrorBody, postRaw, startKiln, type KilnServer } from "./kiln-process.js";

const base = tinyModelDir("LlamaForCausalLM");
const sql = writeLoraAdapter(base, tempPath("e2e-lora-sql"), { rank: 4, alpha: 8, modules: allProjections(2), seed: 21 });
const chat = writeLoraAdapter(base, tempPath("e2e-lora-chat"), { rank: 8, alpha: 8, modules: allProjections(2), seed: 22 });
const body = { prompt: "the river ran by the", max_tokens: 12, temperature: 0, ignore_eos: true, logprobs: 1 };

describe("kiln serve --enable-lora (e2e)", () => {
  let server: KilnServer;
  let merged: KilnServer;
  let c: OpenAI;
  before(async () => {
    [server, merged] = await Promise.all([
      startKiln(["--enable-lora", "--lora-modules", `sql=${sql}`, "--max-loras", "2", "--max-lora-rank", "8"], base, { VLLM_ALLOW_RUNTIME_LORA_UPDATING: "True" }),
      startKiln([], mergeLoraIntoModel(base, sql, tempPath("e2e-merged-sql"))),
    ]);
    c = server.client();
  });
  after(async () => {
    assert.equal(await server.stop(), 0);
    assert.equal(await merged.stop(), 0);
  });

  it("lists the adapter as a model whose parent is the base model", async () => {
    const models = (await c.models.list()).data as unknown as { id: string; root: string; parent: string | null }[];
    assert.deepEqual(models.map((m) => m.id), [server.model, "sql"]);
    assert.equal(models[1]!.parent, server.model);
    assert.equal(models[1]!.root, sql);
    // vLLM's info gauge: max_lora as a label (no request runs now: no adapters in use)
    const text = await (await fetch(`${server.url}/metrics`)).text();
    assert.match(text, /^vllm:lora_requests_info\{[^}]*max_lora="2"[^}]*running_lora_adapters=""[^}]*\} \d/m);
  });

  it("a completion for the adapter equals the merged model's, and differs from the base model's", async () => {
    const [withLora, plain, want] = await Promise.all([
      c.completions.create({ ...body, model: "sql" } as OpenAI.CompletionCreateParamsNonStreaming),
      c.completions.create({ ...body, model: server.model } as OpenAI.CompletionCreateParamsNonStreaming),
      merged.client().completions.create({ ...body, model: merged.model } as OpenAI.CompletionCreateParamsNonStreaming),
    ]);
    assert.equal(withLora.model, "sql");
    assert.equal(withLora.choices[0]!.text, want.choices[0]!.text);
    const lp = (r: OpenAI.Completion) => r.choices[0]!.logprobs!.token_logprobs!;
    lp(withLora).forEach((x, i) => assert.ok(Math.abs(x - lp(want)[i]!) < 2e-3, `token ${i}: ${x} vs ${lp(want)[i]}`));
    assert.notDeepEqual(lp(plain), lp(withLora));
    // beam search runs with the adapter too: one beam is the merged model's greedy text
    const { logprobs: _lp, ...plainBody } = body;
    const beam = await c.completions.create({ ...plainBody, model: "sql", use_beam_search: true, n: 1 } as OpenAI.CompletionCreateParamsNonStreaming);
    assert.equal(beam.choices[0]!.text, want.choices[0]!.text);
    // streamed too
    const stream = await c.completions.create({ ...body, model: "sql", stream: true } as OpenAI.CompletionCreateParamsStreaming);
    let text = "";
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? "";
    assert.equal(text, want.choices[0]!.text);
  });

  it("loads and unloads adapters at run time, with vLLM's answers", async () => {
    const load = await fetch(`${server.url}/v1/load_lora_adapter`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ lora_name: "chat", lora_path: chat }) });
    assert.equal(load.status, 200);
    assert.equal(await load.text(), "Success: LoRA adapter 'chat' added successfully.");
    assert.ok((await c.models.list()).data.some((m) => m.id === "chat"));
    const r = await c.completions.create({ ...body, model: "chat" } as OpenAI.CompletionCreateParamsNonStreaming);
    assert.equal(r.choices[0]!.finish_reason, "length");

    const again = await postRaw(server.url, "/v1/load_lora_adapter", { lora_name: "chat", lora_path: chat });
    assert.equal(again.status, 400);
    assertErrorBody(again.body, { type: "invalid_request_error", message: /already been loaded/ });
    const missing = await postRaw(server.url, "/v1/load_lora_adapter", { lora_name: "gone", lora_path: tempPath("no-adapter-here") });
    assert.equal(missing.status, 404);
    const tooBig = writeLoraAdapter(base, tempPath("e2e-lora-r16"), { rank: 16, alpha: 16, modules: allProjections(1), seed: 3 });
    const big = await postRaw(server.url, "/v1/load_lora_adapter", { lora_name: "big", lora_path: tooBig });
    assert.equal(big.status, 400);
    assertErrorBody(big.body, { type: "invalid_request_error", message: /rank 16 is greater than max_lora_rank 8/ });
    assert.equal((await postRaw(server.url, "/v1/load_lora_adapter", { lora_name: "x" })).status, 400);

    const unload = await fetch(`${server.url}/v1/unload_lora_adapter`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ lora_name: "chat" }) });
    assert.equal(unload.status, 200);
    assert.equal(await unload.text(), "Success: LoRA adapter 'chat' removed successfully.");
    const gone = await postRaw(server.url, "/v1/completions", { ...body, model: "chat" });
    assert.equal(gone.status, 404);
    assertErrorBody(gone.body, { type: "not_found_error", param: "model" });
    assert.equal((await postRaw(server.url, "/v1/unload_lora_adapter", { lora_name: "chat" })).status, 404);
  });

  it("loads one name once at a time, and again in place with load_inplace", async () => {
    const load = (name: string, path: string, extra = {}) =>
      fetch(`${server.url}/v1/load_lora_adapter`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ lora_name: name, lora_path: path, ...extra }) });
    const statuses = (await Promise.all([load("dup", sql), load("dup", sql)])).map((r) => r.status).sort();
    assert.deepEqual(statuses, [200, 400]);
    const asSql = await c.completions.create({ ...body, model: "dup" } as OpenAI.CompletionCreateParamsNonStreaming);
    const sqlOut = await c.completions.create({ ...body, model: "sql" } as OpenAI.CompletionCreateParamsNonStreaming);
    assert.equal(asSql.choices[0]!.text, sqlOut.choices[0]!.text);
    assert.equal((await load("dup", chat, { load_inplace: true })).status, 200);
    const asChat = await c.completions.create({ ...body, model: "dup" } as OpenAI.CompletionCreateParamsNonStreaming);
    assert.notDeepEqual(asChat.choices[0]!.logprobs!.token_logprobs, asSql.choices[0]!.logprobs!.token_logprobs); // the new weights, not cached blocks of the old
    assert.equal((await load(server.model, sql)).status, 400); // the base model's own name
    assert.equal((await c.models.list()).data.filter((m) => m.id === "dup").length, 1);
  });

  it("a server without --enable-lora has no adapter routes", async () => {
    assert.equal((await postRaw(merged.url, "/v1/load_lora_adapter", { lora_name: "a", lora_path: sql })).status, 404);
  });
});
