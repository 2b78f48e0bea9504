// `kiln serve --runner pooling` through the official `openai` client: /v1/embeddings answers each input with the
// vector the offline pooling LLM gives (itself checked against the dense forward in test/engine/pooling.test.ts),
// as floats or base64 (the client's default), and refuses what vLLM's embedding server refuses.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type OpenAI from "openai";
import { LLM } from "../../src/engine/llm-engine.js";
import { tinyModelDir } from "../helpers/tiny-model.js";
import { startTestServer } from "../server/helpers.js";
import { assertErrorBody, postRaw, startKiln, type KilnServer } from "./kiln-process.js";

const dir = tinyModelDir("LlamaForCausalLM");
const inputs = ["the river ran by the old mill", "a quiet city"];

describe("kiln serve --runner pooling (e2e)", () => {
  let server: KilnServer;
  let c: OpenAI;
  const want = new LLM({ model: dir, runner: "pooling", maxModelLen: 64, kvCacheMemory: 1 << 20 }).embed(inputs).map((e) => e.embedding);
  before(async () => {
    server = await startKiln(["--runner", "pooling", "--max-model-len", "64"]);
    c = server.client();
  });
  after(async () => {
    assert.equal(await server.stop(), 0);
  });

  const assertClose = (got: number[], exp: Float32Array, what: string): void => {
    assert.equal(got.length, exp.length, what);
    got.forEach((x, i) => assert.ok(Math.abs(x - exp[i]!) < 1e-5, `${what}[${i}]: ${x} vs ${exp[i]}`));
  };

  it("embeds each input as the offline pooling engine does (base64, the client's default, and float)", async () => {
    const r = await c.embeddings.create({ model: server.model, input: inputs });
    assert.equal(r.object, "list");
    assert.deepEqual(r.data.map((d) => d.index), [0, 1]);
    r.data.forEach((d, i) => assertClose(d.embedding, want[i]!, `input ${i}`));
    assert.ok(r.usage.prompt_tokens > 0 && r.usage.total_tokens === r.usage.prompt_tokens);
    const f = await postRaw(server.url, "/v1/embeddings", { model: server.model, input: inputs[1], encoding_format: "float" });
    assert.equal(f.status, 200);
    assertClose((f.body as { data: { embedding: number[] }[] }).data[0]!.embedding, want[1]!, "float");
  });

  it("POST /pooling: vLLM's PoolingResponse with each input's embedding; other tasks refused", async () => {
    const r = await postRaw(server.url, "/pooling", { model: server.model, input: inputs });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    const body = r.body as { id: string; object: string; data: { index: number; object: string; data: number[] }[]; usage: { prompt_tokens: number } };
    assert.match(body.id, /^pool-[0-9a-f]{32}$/);
    assert.equal(body.object, "list");
    assert.deepEqual(body.data.map((d) => [d.index, d.object]), [[0, "pooling"], [1, "pooling"]]);
    body.data.forEach((d, i) => assertClose(d.data, want[i]!, `pooling ${i}`));
    const b64 = await postRaw(server.url, "/pooling", { model: server.model, input: inputs[0], task: "embed", encoding_format: "base64" });
    const bytes = Buffer.from((b64.body as { data: { data: string }[] }).data[0]!.data, "base64");
    assertClose(Array.from(new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4)), want[0]!, "pooling base64");
    // embed_dtype (vLLM's EncodingRequestMixin, as on /v1/embeddings): bfloat16's little-endian halves, the top of each float32
    const bf16 = await postRaw(server.url, "/pooling", { model: server.model, input: inputs[0], encoding_format: "base64", embed_dtype: "bfloat16" });
    const halves = Buffer.from((bf16.body as { data: { data: string }[] }).data[0]!.data, "base64");
    assert.equal(halves.length, want[0]!.length * 2);
    Array.from(want[0]!).forEach((x, i) => {
      const v = new Float32Array(new Uint32Array([halves.readUInt16LE(2 * i) << 16]).buffer)[0]!;
      assert.ok(Math.abs(v - x) <= Math.abs(x) * 2 ** -8, `bf16 ${i}: ${v} vs ${x}`);
    });
    for (const [extra, param] of [[{ task: "classify" }, "task"], [{ task: "token_embed" }, "task"], [{ task: "nope" }, "task"], [{ dimensions: 8 }, "dimensions"],
      [{ embed_dtype: "int4" }, "embed_dtype"], [{ endianness: "middle" }, "endianness"]] as const) {
      const bad = await postRaw(server.url, "/pooling", { model: server.model, input: "x", ...extra });
      assert.equal(bad.status, 400);
      assertErrorBody(bad.body, { type: "invalid_request_error", param });
    }
  });

  it("takes chat messages, embed_dtype float16 and truncate_prompt_tokens -1 as vLLM does", async () => {
    const embed = async (extra: Record<string, unknown>) => {
      const r = await postRaw(server.url, "/v1/embeddings", { model: server.model, encoding_format: "float", ...extra });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      return (r.body as { data: { embedding: number[] | string }[] }).data[0]!.embedding;
    };
    // messages: the chat template's text, as /tokenize renders it (without a generation prompt)
    const messages = [{ role: "user", content: "the river ran" }];
    const tok = await postRaw(server.url, "/tokenize", { model: server.model, messages, add_generation_prompt: false });
    const viaTokens = await embed({ input: (tok.body as { tokens: number[] }).tokens });
    assert.deepEqual(await embed({ messages }), viaTokens);
    // float16: each value rounded to half precision (base64 of its little-endian halves)
    const half = Buffer.from((await embed({ input: inputs[0], encoding_format: "base64", embed_dtype: "float16" })) as string, "base64");
    assert.equal(half.length, want[0]!.length * 2);
    const halves = Array.from({ length: want[0]!.length }, (_, i) => half.readUInt16LE(2 * i));
    halves.forEach((h, i) => {
      const e = (h >> 10) & 31, m = h & 1023, v = (h & 0x8000 ? -1 : 1) * (e === 0 ? m * 2 ** -24 : (1 + m / 1024) * 2 ** (e - 15));
      assert.ok(Math.abs(v - want[0]![i]!) <= Math.abs(want[0]![i]!) * 2 ** -10 + 1e-7, `half ${i}: ${v} vs ${want[0]![i]}`);
    });
    assert.deepEqual(await embed({ input: inputs[0], truncate_prompt_tokens: -1 }), Array.from(want[0]!));
    // normalize false (vLLM's newer name: use_activation false): the pooled state without L2 normalization, a
    // multiple of the normalized embedding; true is the default
    for (const field of ["normalize", "use_activation"]) {
      const raw = (await embed({ input: inputs[0], [field]: false })) as number[];
      const norm = Math.hypot(...raw);
      assert.ok(Math.abs(norm - 1) > 1e-3, `${field}: norm ${norm}`);
      raw.forEach((v, i) => assert.ok(Math.abs(v / norm - want[0]![i]!) < 1e-5, `${field} ${i}: ${v / norm} vs ${want[0]![i]}`));
    }
    assert.deepEqual(await embed({ input: inputs[0], use_activation: true }), Array.from(want[0]!));
    // truncation_side (vLLM's): "right" keeps the first truncate_prompt_tokens tokens, "left" (the default) the last
    const ids = (tok.body as { tokens: number[] }).tokens;
    assert.ok(ids.length > 3);
    assert.deepEqual(await embed({ input: ids, truncate_prompt_tokens: 3, truncation_side: "right" }), await embed({ input: ids.slice(0, 3) }));
    assert.deepEqual(await embed({ input: ids, truncate_prompt_tokens: 3 }), await embed({ input: ids.slice(-3) }));
    const side = await postRaw(server.url, "/v1/embeddings", { model: server.model, input: "x", truncation_side: "middle" });
    assertErrorBody(side.body, { type: "invalid_request_error", param: "truncation_side" });
    assert.equal((await postRaw(server.url, "/v1/embeddings", { model: server.model, input: "x", embed_dtype: "int4" })).status, 400);
  });

  it("refuses the generating APIs, dimensions, unknown formats and inputs past max_model_len", async () => {
    const chat = await postRaw(server.url, "/v1/chat/completions", { model: server.model, messages: [{ role: "user", content: "hi" }] });
    assert.equal(chat.status, 400);
    assertErrorBody(chat.body, { type: "invalid_request_error", message: /does not support Chat Completions API/ });
    assert.equal((await postRaw(server.url, "/v1/completions", { model: server.model, prompt: "hi" })).status, 400);
    const dims = await postRaw(server.url, "/v1/embeddings", { model: server.model, input: "x", dimensions: 8 });
    assert.equal(dims.status, 400);
    assertErrorBody(dims.body, { type: "invalid_request_error", param: "dimensions", message: /matryoshka/ });
    assert.equal((await postRaw(server.url, "/v1/embeddings", { model: server.model, input: "x", encoding_format: "int8" })).status, 400);
    const long = await postRaw(server.url, "/v1/embeddings", { model: server.model, input: Array.from({ length: 65 }, () => 5) });
    assert.equal(long.status, 400);
    assertErrorBody(long.body, { type: "invalid_request_error", param: "input", message: /maximum context length is 64 tokens/ });
    assert.equal((await postRaw(server.url, "/v1/embeddings", { model: "other", input: "x" })).status, 404);
    assert.equal((await postRaw(server.url, "/v1/embeddings", { model: server.model })).status, 400);
  });
});

it("a generating server refuses /v1/embeddings and /pooling as vLLM does", async () => {
  const s = await startTestServer();
  try {
    const r = await postRaw(s.url, "/v1/embeddings", { model: "kiln-test", input: "x" });
    assert.equal(r.status, 400);
    assertErrorBody(r.body, { type: "invalid_request_error", message: /does not support Embeddings API/ });
    const p = await postRaw(s.url, "/pooling", { model: "kiln-test", input: "x" });
    assert.equal(p.status, 400);
    assertErrorBody(p.body, { type: "invalid_request_error", message: /does not support Pooling API/ });
  } finally {
    await s.close();
  }
});
