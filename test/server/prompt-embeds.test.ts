// vLLM's prompt_embeds in /v1/completions (`kiln serve --enable-prompt-embeds`, a real child process): a prompt given as
// its token embeddings (the model's own embedding rows, torch.save'd and base64-encoded as vLLM's client example does)
// generates what the same token ids generate, logprobs included; an identical embeddings prompt hits the prefix cache,
// another does not; and what vLLM refuses is a 400 naming prompt_embeds.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { createServingSetupSync } from "../../src/engine/serving.js";
import { embeddingRows } from "../helpers/model-logits.js";
import { tinyModelDir } from "../helpers/tiny-model.js";
import { torchSaveFloat32 } from "../helpers/torch-save.js";
import { assertErrorBody, postRaw, startKiln, type KilnServer } from "../e2e/kiln-process.js";

const IDS = Array.from({ length: 37 }, (_, i) => 5 + ((i * 37 + 11) % 200));

interface Completion {
  choices: { index: number; text: string; logprobs: { token_logprobs: number[]; tokens: string[] }; token_ids?: number[]; prompt_token_ids?: number[] | null }[];
  usage: { prompt_tokens: number; completion_tokens: number; prompt_tokens_details?: { cached_tokens: number } | null };
}

describe("completions with prompt_embeds", () => {
  const dir = tinyModelDir("LlamaForCausalLM");
  let server: KilnServer;
  let hidden = 0;
  /** The model's input embeddings of `ids` (its embedding table's rows), [ids.length * hidden]. */
  let valuesOf: (ids: number[]) => Float32Array;
  /** Those embeddings as torch.save bytes in base64 (`edit` may change them first). */
  const embedsOf = (ids: number[], edit?: (v: Float32Array) => void): string => {
    const v = valuesOf(ids);
    edit?.(v);
    return torchSaveFloat32(v, [ids.length, hidden]).toString("base64");
  };
  before(async () => {
    const setup = createServingSetupSync({ model: dir, maxModelLen: 128, kvCacheMemory: 4 << 20 });
    const model = setup.runner.model;
    hidden = model.config.hiddenSize;
    valuesOf = (ids) => embeddingRows(model, ids);
    server = await startKiln(["--enable-prompt-embeds", "--enable-prompt-tokens-details", "--max-model-len", "128"], dir);
  });
  after(() => server?.stop());

  const base = { max_tokens: 6, temperature: 0, ignore_eos: true, logprobs: 2, return_token_ids: true };
  const complete = async (body: object): Promise<Completion> => {
    const r = await postRaw(server.url, "/v1/completions", { model: server.model, ...base, ...body });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    return r.body as Completion;
  };

  it("the embeddings of token ids generate what the ids generate (tokens and logprobs); usage counts the rows", async () => {
    const byIds = await complete({ prompt: IDS });
    const byEmbeds = await complete({ prompt_embeds: embedsOf(IDS) });
    const [a, b] = [byIds.choices[0]!, byEmbeds.choices[0]!];
    assert.deepEqual(b.token_ids, a.token_ids);
    assert.equal(b.text, a.text);
    b.logprobs.token_logprobs.forEach((lp, i) => assert.ok(Math.abs(lp - a.logprobs.token_logprobs[i]!) < 1e-3, `token ${i}: ${lp} vs ${a.logprobs.token_logprobs[i]}`));
    assert.equal(byEmbeds.usage.prompt_tokens, IDS.length);
    assert.equal(b.prompt_token_ids, null, "an embeddings prompt has no token ids");
  });

  it("a [1, seq, hidden] tensor, and prompt with prompt_embeds: the embeddings' choices come first", async () => {
    const ids = IDS.slice(0, 20);
    const batched = torchSaveFloat32(valuesOf(IDS), [1, IDS.length, hidden]).toString("base64");
    const r = await complete({ prompt: [ids], prompt_embeds: [batched] });
    assert.equal(r.choices.length, 2);
    const byIds = await complete({ prompt: IDS });
    const short = await complete({ prompt: ids });
    assert.deepEqual(r.choices[0]!.token_ids, byIds.choices[0]!.token_ids, "index 0: the embeddings prompt");
    assert.deepEqual(r.choices[1]!.token_ids, short.choices[0]!.token_ids, "index 1: the token prompt");
  });

  it("an identical embeddings prompt reads its blocks from the prefix cache; changed embeddings do not", async () => {
    const ids = IDS.map((t) => (t + 3) % 250);
    await complete({ prompt_embeds: embedsOf(ids) });
    const again = await complete({ prompt_embeds: embedsOf(ids) });
    assert.ok((again.usage.prompt_tokens_details?.cached_tokens ?? 0) >= 32, JSON.stringify(again.usage));
    const changed = await complete({ prompt_embeds: embedsOf(ids, (v) => (v[0] = v[0]! + 0.5)) });
    assert.equal(changed.usage.prompt_tokens_details?.cached_tokens ?? 0, 0);
  });

  it("truncate_prompt_tokens keeps the last rows", async () => {
    const r = await complete({ prompt_embeds: embedsOf(IDS), truncate_prompt_tokens: 10 });
    const byIds = await complete({ prompt: IDS.slice(-10) });
    assert.equal(r.usage.prompt_tokens, 10);
    assert.deepEqual(r.choices[0]!.token_ids, byIds.choices[0]!.token_ids);
  });

  it("400s: the wrong width, bad base64, a non-tensor file, echo, and a request without prompt or prompt_embeds", async () => {
    const post = (body: object) => postRaw(server.url, "/v1/completions", { model: server.model, max_tokens: 2, ...body });
    const wide = torchSaveFloat32(new Float32Array(3 * (hidden + 1)), [3, hidden + 1]).toString("base64");
    let r = await post({ prompt_embeds: wide });
    assert.equal(r.status, 400);
    assertErrorBody(r.body, { type: "invalid_request_error", message: new RegExp(`must be \\[3, ${hidden}\\]`) });
    r = await post({ prompt_embeds: "not base64!" });
    assert.equal(r.status, 400);
    assertErrorBody(r.body, { type: "invalid_request_error", param: "prompt_embeds", message: /not valid base64/ });
    r = await post({ prompt_embeds: Buffer.from("hello").toString("base64") });
    assert.equal(r.status, 400);
    assertErrorBody(r.body, { type: "invalid_request_error", param: "prompt_embeds", message: /not a torch.save file/ });
    r = await post({ prompt_embeds: torchSaveFloat32(new Float32Array(hidden * 2), [2, 1, hidden]).toString("base64") });
    assert.equal(r.status, 400);
    assertErrorBody(r.body, { type: "invalid_request_error", param: "prompt_embeds", message: /\[sequence_length, hidden_size\]/ });
    r = await post({ prompt_embeds: embedsOf(IDS.slice(0, 4)), echo: true });
    assert.equal(r.status, 400);
    assertErrorBody(r.body, { type: "invalid_request_error", param: "echo" });
    r = await post({ prompt_embeds: [] });
    assert.equal(r.status, 400);
    assert.ok(server.log().length > 0);
  });
});

describe("completions with prompt_embeds on a server without --enable-prompt-embeds", () => {
  it("is vLLM's 400", async () => {
    const server = await startKiln(["--max-model-len", "64"]);
    try {
      const body = torchSaveFloat32(new Float32Array(4 * 64), [4, 64]).toString("base64");
      const r = await postRaw(server.url, "/v1/completions", { model: server.model, prompt_embeds: body, max_tokens: 2 });
      assert.equal(r.status, 400);
      assertErrorBody(r.body, { type: "invalid_request_error", param: "prompt_embeds", message: /You must set `--enable-prompt-embeds` to input `prompt_embeds`\./ });
    } finally {
      await server.stop();
    }
  });
});
