// Sequence classifiers (vLLM's classify task): a *ForSequenceClassification checkpoint pools on its own (no --runner
// flag), and each prompt's class probabilities are the softmax of its `score` head over the last token's final hidden
// state. The expectation is computed here: the model's dense forward (the training path, another attention kernel,
// no KV cache) and the head's weights multiplied out in float64. Offline (LLM.classify) and over HTTP (/classify).
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { LLM } from "../../src/engine/llm-engine.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { arange, noGrad, tensor } from "../../src/tensor/index.js";
import { tinyModelDir } from "../helpers/tiny-model.js";
import { assertErrorBody, postRaw, startKiln, type KilnServer } from "./kiln-process.js";

const LABELS = ["negative", "positive", "neutral"];
const dir = tinyModelDir("Qwen3ForCausalLM", {
  overrides: { architectures: ["Qwen3ForSequenceClassification"], id2label: { "0": LABELS[0], "1": LABELS[1], "2": LABELS[2] } },
});
const TEXTS = ["The river ran past the mill.", "What a dreadful, dreary day", "Fine."];

/** W h_last (the head's raw logits) in float64, h_last from the dense forward of the whole prompt. */
function expectedLogits(ids: number[]): number[] {
  const { model } = loadLocalModel(dir);
  const H = model.config.hiddenSize;
  const h = noGrad(() => model.forward(tensor(Int32Array.from(ids)), { kind: "dense", batch: 1, seqLen: ids.length, positions: arange(ids.length) }).dataSync() as Float32Array);
  const last = h.subarray((ids.length - 1) * H, ids.length * H);
  const w = model.score!.weight.dataSync() as Float32Array;
  const logits = LABELS.map((_, c) => {
    let s = 0;
    for (let i = 0; i < H; i++) s += w[c * H + i]! * last[i]!;
    return s;
  });
  return logits;
}

/** softmax(W h_last). */
function expected(ids: number[]): number[] {
  const logits = expectedLogits(ids);
  const m = Math.max(...logits);
  const e = logits.map((x) => Math.exp(x - m));
  const z = e.reduce((a, b) => a + b, 0);
  return e.map((x) => x / z);
}

const close = (got: ArrayLike<number>, want: number[], what: string) =>
  want.forEach((p, i) => assert.ok(Math.abs(got[i]! - p) < 1e-5, `${what}: class ${i} ${got[i]} vs ${p}`));
/** Two of Kiln's own answers for one prompt: equal but for float32 rounding. */
const closeTo = (got: number[], want: number[], what: string) => {
  assert.equal(got.length, want.length, what);
  want.forEach((p, i) => assert.ok(Math.abs(got[i]! - p) <= 1e-6, `${what}: class ${i} ${got[i]} vs ${p}`));
};

describe("sequence classification (*ForSequenceClassification)", () => {
  it("LLM.classify: the head's softmax over the last token's state, the best label named", () => {
    const llm = new LLM({ model: dir, maxModelLen: 128 });
    const tok = loadLocalModel(dir).tokenizer;
    const outs = llm.classify(TEXTS);
    assert.equal(outs.length, TEXTS.length);
    outs.forEach((o, i) => {
      const want = expected(tok.encode(TEXTS[i]!));
      close(o.probs, want, TEXTS[i]!);
      assert.equal(o.label, LABELS[want.indexOf(Math.max(...want))]);
    });
    assert.ok(new Set(outs.map((o) => o.label)).size >= 1);
    assert.throws(() => llm.embed(["x"]), /classifies: use classify\(\)/);
    assert.throws(() => llm.score("a", "b"), /Score API is only enabled for num_labels == 1; this classifier has 3/);
    assert.throws(() => llm.generate(["x"]), /pools/);
    // vLLM's PoolingParams(use_activation=False): the raw logits, the best label unchanged
    const raw = llm.classify(TEXTS, { pooling: { activation: false } });
    raw.forEach((o, i) => {
      const want = expectedLogits(tok.encode(TEXTS[i]!));
      close(o.probs, want, `raw ${TEXTS[i]!}`);
      assert.equal(o.label, outs[i]!.label);
    });
    assert.throws(() => llm.classify(["x"], { pooling: { normalize: false } }), /task classify does not take normalize/);
  });

  describe("kiln serve (e2e)", () => {
    let server: KilnServer;
    before(async () => {
      server = await startKiln(["--max-model-len", "128"], dir);
    });
    after(async () => {
      assert.equal(await server.stop(), 0);
    });

    it("POST /classify answers the class probabilities; the other APIs are refused", async () => {
      const r = await postRaw(server.url, "/classify", { model: server.model, input: TEXTS });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      const body = r.body as { object: string; data: { index: number; label: string; probs: number[]; num_classes: number }[]; usage: { prompt_tokens: number } };
      assert.equal(body.object, "list");
      const tok = loadLocalModel(dir).tokenizer;
      body.data.forEach((d, i) => {
        const want = expected(tok.encode(TEXTS[i]!));
        assert.equal(d.index, i);
        assert.equal(d.num_classes, 3);
        close(d.probs, want, TEXTS[i]!);
        assert.equal(d.label, LABELS[want.indexOf(Math.max(...want))]);
      });
      assert.equal(body.usage.prompt_tokens, TEXTS.reduce((n, t) => n + tok.encode(t).length, 0));
      const one = await postRaw(server.url, "/v1/classify", { model: server.model, input: TEXTS[0] });
      // one prompt alone against the same prompt in a batch of three: products of other row counts, which the AVX2 and
      // portable builds sum in other orders (a request's numbers may depend on its batch, as in vLLM)
      closeTo((one.body as typeof body).data[0]!.probs, body.data[0]!.probs, "/v1/classify");
      // vLLM's /pooling on a classifier: the same probabilities, raw
      const pooled = await postRaw(server.url, "/pooling", { model: server.model, input: TEXTS });
      assert.equal(pooled.status, 200, JSON.stringify(pooled.body));
      const pooledData = (pooled.body as { data: { object: string; data: number[] }[] }).data;
      assert.deepEqual(pooledData.map((d) => d.object), ["pooling", "pooling", "pooling"]);
      pooledData.forEach((d, i) => closeTo(d.data, body.data[i]!.probs, `/pooling ${i}`)); // the prompts now hit the prefix cache
      assert.equal((await postRaw(server.url, "/pooling", { model: server.model, input: "x", task: "embed" })).status, 400);
      // vLLM's use_activation false (older names: activation, softmax): the head's raw logits
      const logits = expectedLogits(tok.encode(TEXTS[0]!));
      for (const [path, field] of [["/classify", "use_activation"], ["/v1/classify", "activation"], ["/classify", "softmax"], ["/pooling", "softmax"]] as const) {
        const raw = await postRaw(server.url, path, { model: server.model, input: TEXTS[0], [field]: false });
        assert.equal(raw.status, 200, `${path} ${field}: ${JSON.stringify(raw.body)}`);
        const d = (raw.body as { data: { probs?: number[]; data?: number[] }[] }).data[0]!;
        close(d.probs ?? d.data!, logits, `${path} ${field}`);
      }
      const refused = await postRaw(server.url, "/classify", { model: server.model, input: TEXTS[0], normalize: false });
      assert.equal(refused.status, 400);
      assertErrorBody(refused.body, { type: "invalid_request_error", param: "normalize" });
      const activated = await postRaw(server.url, "/classify", { model: server.model, input: TEXTS[0], use_activation: true }); // the default
      closeTo((activated.body as typeof body).data[0]!.probs, body.data[0]!.probs, "use_activation true");
      for (const [path, req] of [
        ["/v1/embeddings", { model: server.model, input: "x" }],
        ["/v1/chat/completions", { model: server.model, messages: [{ role: "user", content: "x" }] }],
        ["/v1/completions", { model: server.model, prompt: "x" }],
      ] as const) {
        const refused = await postRaw(server.url, path, req);
        assert.equal(refused.status, 400, path);
        assert.match((refused.body as { error: { message: string } }).error.message, /does not support/);
      }
      // vLLM scores pairs with a classifier of one label only (a cross-encoder; cross-encoder.test.ts): this one has 3
      for (const [path, req, api] of [
        ["/v1/score", { model: server.model, text_1: "a", text_2: ["b", "c"] }, "Score"],
        ["/score", { model: server.model, text_1: "a", text_2: "b" }, "Score"],
        ["/rerank", { model: server.model, query: "a", documents: ["b"] }, "Rerank \\(Score\\)"],
        ["/v1/rerank", { model: server.model, query: "a", documents: ["b"] }, "Rerank \\(Score\\)"],
        ["/v2/rerank", { model: server.model, query: "a", documents: ["b"] }, "Rerank \\(Score\\)"],
      ] as const) {
        const refused = await postRaw(server.url, path, req);
        assert.equal(refused.status, 400, path);
        assertErrorBody(refused.body, { type: "invalid_request_error", param: null, message: new RegExp(`does not support ${api} API \\(it is only enabled for num_labels == 1; this classifier has 3\\)`) });
      }
      const empty = await postRaw(server.url, "/classify", { model: server.model, input: "" });
      assert.equal(empty.status, 400);
      // messages (vLLM's chat form): the rendered template classified, as that text sent as input would be
      const messages = [{ role: "user", content: TEXTS[1] }];
      const viaChat = await postRaw(server.url, "/classify", { model: server.model, messages });
      const rendered = tok.applyChatTemplate(messages, { addGenerationPrompt: false });
      const viaInput = await postRaw(server.url, "/classify", { model: server.model, input: rendered, add_special_tokens: false });
      assert.equal(viaChat.status, 200, JSON.stringify(viaChat.body));
      closeTo((viaChat.body as typeof body).data[0]!.probs, (viaInput.body as typeof body).data[0]!.probs, "messages");
      close((viaChat.body as typeof body).data[0]!.probs, expected(tok.encode(rendered, { addSpecialTokens: false })), "chat");
    });
  });
});
