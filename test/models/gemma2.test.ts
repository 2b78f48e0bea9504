// Gemma 2 (Gemma2ForCausalLM): its config read as HF's Gemma2Config reads it, and the model against llama.cpp's gemma2
// on a GGUF export of the same random weights, with soft-caps small enough to bite (attention scores of a few units
// capped at 2, logits of up to ~8 capped at 4) and an 8-token window against a 24-token prompt: the dense forward's
// log-probabilities, and serving (paged KV, step graphs and eager) through a greedy continuation.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { LLM } from "../../src/engine/llm-engine.js";
import { exportGguf } from "../../src/models/init-model.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { ModelConfigError, parseHfConfig } from "../../src/models/hf-config.js";
import { ggufToHfConfig } from "../../src/models/formats/gguf-mapping.js";
import { arange, noGrad, tensor } from "../../src/tensor/index.js";
import { hasLlamaCpp, llamaCppOracle, withFloat16Gelu } from "../helpers/llama-cpp.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";

// gemma-2-9b's config.json (before transformers 4.53: no layer_types)
const gemma2_9b = {
  architectures: ["Gemma2ForCausalLM"], model_type: "gemma2", attention_bias: false, attention_dropout: 0, attn_logit_softcapping: 50,
  bos_token_id: 2, cache_implementation: "hybrid", eos_token_id: 1, final_logit_softcapping: 30, head_dim: 256,
  hidden_act: "gelu_pytorch_tanh", hidden_activation: "gelu_pytorch_tanh", hidden_size: 3584, initializer_range: 0.02,
  intermediate_size: 14336, max_position_embeddings: 8192, num_attention_heads: 16, num_hidden_layers: 42,
  num_key_value_heads: 8, pad_token_id: 0, query_pre_attn_scalar: 256, rms_norm_eps: 1e-6, rope_theta: 10000,
  sliding_window: 4096, sliding_window_size: 4096, torch_dtype: "float32", use_cache: true, vocab_size: 256000,
};

describe("Gemma 2", () => {
  it("reads the config as Gemma2Config does", () => {
    const c = parseHfConfig(gemma2_9b);
    assert.equal(c.architecture, "Gemma2ForCausalLM");
    assert.equal(c.hiddenAct, "gelu_tanh");
    assert.equal(c.attnScale, 1 / 16); // query_pre_attn_scalar ** -0.5
    assert.equal(c.embedScale, Math.sqrt(3584));
    assert.deepEqual([c.normOffset, c.normPlacement, c.qkNorm, c.tieWordEmbeddings, c.localRopeTheta], [1, "sandwich", false, true, null]);
    assert.deepEqual([c.attnSoftcap, c.finalSoftcap, c.slidingWindow, c.ropeTheta], [50, 30, 4096, 10000]);
    // without layer_types the even layers slide (HF: (i + 1) % 2, llama.cpp: il % 2 < 1)
    assert.deepEqual(c.slidingWindowLayers, Array.from({ length: 42 }, (_, i) => i % 2 === 0));
    const typed = parseHfConfig({ ...gemma2_9b, num_hidden_layers: 3, layer_types: ["full_attention", "sliding_attention", "full_attention"] });
    assert.deepEqual(typed.slidingWindowLayers, [false, true, false]);
    // null soft-caps are none (a fine-tune may drop them); null sliding_window: no layer slides
    const uncapped = parseHfConfig({ ...gemma2_9b, attn_logit_softcapping: null, final_logit_softcapping: null, sliding_window: null });
    assert.deepEqual([uncapped.attnSoftcap, uncapped.finalSoftcap, uncapped.slidingWindow, uncapped.slidingWindowLayers.some(Boolean)], [null, null, null, false]);
    // what a config leaves out comes from Gemma2Config's defaults (gemma-2-2b's shape)
    const bare = parseHfConfig({ architectures: ["Gemma2ForCausalLM"] });
    assert.deepEqual(
      [bare.vocabSize, bare.hiddenSize, bare.intermediateSize, bare.numHiddenLayers, bare.numAttentionHeads, bare.numKeyValueHeads, bare.headDim],
      [256000, 2304, 9216, 26, 8, 4, 256],
    );
    assert.deepEqual(
      [bare.attnScale, bare.attnSoftcap, bare.finalSoftcap, bare.slidingWindow, bare.maxPositionEmbeddings, bare.ropeTheta, bare.hiddenAct, bare.tieWordEmbeddings, bare.bosTokenId, bare.eosTokenIds],
      [1 / 16, 50, 30, 4096, 8192, 10000, "gelu_tanh", true, 2, [1]],
    );
    assert.deepEqual(bare.slidingWindowLayers.slice(0, 4), [true, false, true, false]);
    // refused: what Kiln would compute differently
    const refused = (over: Record<string, unknown>, why: RegExp) =>
      assert.throws(() => parseHfConfig({ ...gemma2_9b, ...over }), (e: unknown) => e instanceof ModelConfigError && why.test(e.message), JSON.stringify(over));
    refused({ attn_logit_softcapping: 0 }, /"attn_logit_softcapping" must be a positive number or null/);
    refused({ final_logit_softcapping: "30" }, /"final_logit_softcapping" must be a number/);
    refused({ use_bidirectional_attention: true }, /use_bidirectional_attention/);
    refused({ hidden_activation: "relu" }, /unsupported hidden_activation "relu"/);
    refused({ partial_rotary_factor: 0.5 }, /partial_rotary_factor/);
  });

  // 4 layers (0 and 2 sliding), an 8-token window against a 24-token prompt; soft-caps that bite
  const caps = { attn_logit_softcapping: 2, final_logit_softcapping: 4 };
  const dir = tinyModelDir("Gemma2ForCausalLM", { overrides: { num_hidden_layers: 4, sliding_window: 8, ...caps } });
  const prompt = Array.from({ length: 24 }, (_, i) => (i * 37 + 11) % 500);

  it("dense forward and serving (step graphs and eager) agree with llama.cpp past the window, soft-caps biting", { skip: hasLlamaCpp ? false : "node-llama-cpp not installed", timeout: 180_000 }, async (t) => {
    const gguf = tempPath("gemma2-swa.gguf");
    exportGguf(dir, gguf, "F32");
    const want = await llamaCppOracle(gguf, prompt, 8);
    const gap = (lps: Iterable<[number, number]>) => {
      let worst = 0;
      for (const [tok, lp] of lps) worst = Math.max(worst, Math.abs(Math.log(want.probs.get(tok) ?? 0) - lp));
      return worst;
    };
    // the dense forward (training, scoring): every token llama.cpp gives p >= 1e-7
    const { model } = loadLocalModel(dir);
    const V = model.config.vocabSize;
    const dense = () => noGrad(() => model.logits(model.forward(tensor(Int32Array.from(prompt)), { kind: "dense", batch: 1, seqLen: prompt.length, positions: arange(prompt.length) })).logSoftmax(-1).dataSync() as Float32Array).subarray((prompt.length - 1) * V);
    const overAll = (lp: Float32Array) => gap([...want.probs.keys()].filter((t) => want.probs.get(t)! >= 1e-7).map((t) => [t, lp[t]!] as [number, number]));
    const plain = overAll(dense());
    // ggml's GELU reads a float16 table: with Kiln's GELU doing the same, what is left is float32 rounding (~5e-5
    // here with the caps or without them: 4.8e-5 at caps of 1e6)
    const emulated = overAll(withFloat16Gelu(dense));
    t.diagnostic(`Gemma 2 dense forward vs llama.cpp: max |logprob diff| ${plain.toExponential(2)}, ${emulated.toExponential(2)} with ggml's float16 GELU emulated`);
    assert.ok(plain < 3e-3, `dense forward: max |logprob diff| ${plain}`);
    assert.ok(emulated < 1e-4, `dense forward with the float16 GELU emulated: max |logprob diff| ${emulated}`);
    for (const enforceEager of [false, true]) {
      const llm = new LLM({ model: dir, maxModelLen: 128, enforceEager });
      const [out] = llm.generate([{ promptTokenIds: prompt }], { temperature: 0, maxTokens: 8, ignoreEos: true, logprobs: 20 });
      const c = out!.outputs[0]!;
      const mode = enforceEager ? "eager" : "step graphs";
      assert.deepEqual(c.tokenIds, want.greedy, `greedy continuation (${mode})`);
      const worst = gap([...c.logprobs![0]!].map(([tok, lp]) => [tok, lp.logprob] as [number, number]));
      t.diagnostic(`Gemma 2 serving (${mode}) vs llama.cpp: first token's top-20 max |logprob diff| ${worst.toExponential(2)}`);
      assert.ok(worst < 3e-3, `${mode}: max |logprob diff| ${worst}`);
    }
  });

  it("a GGUF export loads back to the same model (norms stored as 1 + w, soft-caps and window in gemma2.* keys)", () => {
    const gguf = tempPath("gemma2-roundtrip.gguf");
    exportGguf(dir, gguf, "F32");
    const a = loadLocalModel(dir);
    const b = loadLocalModel(gguf);
    for (const key of ["architecture", "attnSoftcap", "finalSoftcap", "slidingWindow", "slidingWindowLayers", "attnScale", "headDim", "normOffset", "tieWordEmbeddings"] as const)
      assert.deepEqual(b.config[key], a.config[key], key);
    assert.deepEqual([b.config.attnSoftcap, b.config.finalSoftcap, b.config.slidingWindow], [2, 4, 8]);
    for (const [name, t] of a.model.namedParameters()) {
      const u = b.model.namedParameters().find(([n]) => n === name)?.[1];
      assert.ok(u !== undefined, name);
      assert.deepEqual(u.dataSync(), t.dataSync(), name);
    }
  });

  it("GGUF holds only what llama.cpp's gemma2 reads or assumes: other configs are refused on export, absent keys read as llama.cpp reads them", () => {
    for (const [overrides, why] of [
      [{ query_pre_attn_scalar: 32 }, /query_pre_attn_scalar must be 16/],
      [{ attn_logit_softcapping: null }, /attn_logit_softcapping must be set/],
      [{ final_logit_softcapping: null }, /final_logit_softcapping must be set/],
      [{ layer_types: ["full_attention", "sliding_attention"] }, /layer_types must alternate/],
      [{ sliding_window: null }, /sliding_window must be set/],
    ] as const) {
      const d = tinyModelDir("Gemma2ForCausalLM", { overrides });
      assert.throws(() => exportGguf(d, tempPath("gemma2-refused.gguf"), "F32"), why, JSON.stringify(overrides));
    }
    const md = (layers: number, extra: Record<string, number> = {}) => ({
      "general.architecture": "gemma2", "gemma2.block_count": layers, "gemma2.embedding_length": 4608, "gemma2.attention.head_count": 32,
      "gemma2.attention.key_length": 128, "gemma2.feed_forward_length": 36864, ...extra,
    });
    const c27 = parseHfConfig(ggufToHfConfig(md(46)));
    assert.equal(c27.attnScale, 1 / Math.sqrt(144)); // gemma-2-27b: hidden / heads, as llama.cpp
    // keys llama.cpp does not find read as its defaults: a 4096 window, soft-caps 50 and 30
    assert.deepEqual([c27.slidingWindow, c27.attnSoftcap, c27.finalSoftcap, c27.slidingWindowLayers.slice(0, 3)], [4096, 50, 30, [true, false, true]]);
    const c = parseHfConfig(ggufToHfConfig(md(26, { "gemma2.attn_logit_softcapping": 20, "gemma2.final_logit_softcapping": 10, "gemma2.attention.sliding_window": 512 })));
    assert.deepEqual([c.attnScale, c.attnSoftcap, c.finalSoftcap, c.slidingWindow], [1 / Math.sqrt(128), 20, 10, 512]);
  });
});
