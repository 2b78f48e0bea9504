// Gemma 3 (Gemma3ForCausalLM): its config read as HF's Gemma3TextConfig reads it, and the serving path (paged KV,
// step graphs, sliding-window layers with their own rotary base, a window shorter than the context) against
// llama.cpp's gemma3 on a GGUF export of the same random weights: next-token probabilities after a long prompt
// and a greedy continuation. (The dense forward is checked against llama.cpp in llama-cpp-oracle.test.ts.)
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { LLM } from "../../src/engine/llm-engine.js";
import { exportGguf } from "../../src/models/init-model.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { ModelConfigError, parseHfConfig } from "../../src/models/hf-config.js";
import { hasLlamaCpp, llamaCppOracle } from "../helpers/llama-cpp.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";

const base = {
  architectures: ["Gemma3ForCausalLM"], vocab_size: 1000, hidden_size: 256, intermediate_size: 512, num_hidden_layers: 8,
  num_attention_heads: 4, num_key_value_heads: 1, head_dim: 64, max_position_embeddings: 4096, rms_norm_eps: 1e-6,
  rope_theta: 1_000_000, hidden_activation: "gelu_pytorch_tanh", hidden_act: "gelu_pytorch_tanh", query_pre_attn_scalar: 168,
  sliding_window: 512, rope_local_base_freq: 10000, attn_logit_softcapping: null, final_logit_softcapping: null,
};

describe("Gemma 3", () => {
  it("reads the config as Gemma3TextConfig does", () => {
    const c = parseHfConfig({ ...base, sliding_window_pattern: 6 });
    assert.equal(c.hiddenAct, "gelu_tanh");
    assert.equal(c.attnScale, 1 / Math.sqrt(168)); // query_pre_attn_scalar, not head_dim
    assert.equal(c.embedScale, 16); // sqrt(hidden_size)
    assert.equal(c.normOffset, 1);
    assert.equal(c.sandwichNorms, true);
    assert.equal(c.qkNorm, true);
    assert.equal(c.tieWordEmbeddings, true); // Gemma's default
    assert.equal(c.localRopeTheta, 10000);
    assert.deepEqual(c.slidingWindowLayers, [true, true, true, true, true, false, true, true]); // every 6th is global
    const typed = parseHfConfig({ ...base, layer_types: ["sliding_attention", "full_attention", ...Array(6).fill("sliding_attention")] });
    assert.deepEqual(typed.slidingWindowLayers, [true, false, true, true, true, true, true, true]);
    assert.throws(() => parseHfConfig({ ...base, final_logit_softcapping: 30 }), (e: unknown) => e instanceof ModelConfigError && /final_logit_softcapping/.test(e.message));
    assert.throws(() => parseHfConfig({ ...base, hidden_activation: "relu" }), /unsupported hidden_activation "relu"/);
  });

  // 6 layers (the last global), a window of 8 tokens against a 24-token prompt: the sliding layers see only the last
  // 8 positions, and rotate with base 10000 while the global layer uses 1e6
  const dir = tinyModelDir("Gemma3ForCausalLM", { overrides: { num_hidden_layers: 6, sliding_window: 8 } });
  const prompt = Array.from({ length: 24 }, (_, i) => (i * 37 + 11) % 500);

  it("serving (step graphs and eager) agrees with llama.cpp past the sliding window", { skip: hasLlamaCpp ? false : "node-llama-cpp not installed", timeout: 120_000 }, async () => {
    const gguf = tempPath("gemma3-swa.gguf");
    exportGguf(dir, gguf, "F32");
    const want = await llamaCppOracle(gguf, prompt, 8);
    for (const enforceEager of [false, true]) {
      const llm = new LLM({ model: dir, maxModelLen: 128, enforceEager });
      const [out] = llm.generate([{ promptTokenIds: prompt }], { temperature: 0, maxTokens: 8, ignoreEos: true, logprobs: 20 });
      const c = out!.outputs[0]!;
      assert.deepEqual(c.tokenIds, want.greedy, `greedy continuation (${enforceEager ? "eager" : "step graphs"})`);
      // the first token's top logprobs against llama.cpp's probabilities (its GELU reads a float16 table: ~1e-3)
      let worst = 0;
      for (const [tok, lp] of c.logprobs![0]!) worst = Math.max(worst, Math.abs(Math.log(want.probs.get(tok) ?? 0) - lp.logprob));
      assert.ok(worst < 5e-3, `max |logprob diff| ${worst}`);
    }
  });

  it("a GGUF export loads back to the same weights (norms stored as 1 + w, as llama.cpp's converter writes them)", () => {
    const gguf = tempPath("gemma3-roundtrip.gguf");
    exportGguf(dir, gguf, "F32");
    const a = loadLocalModel(dir);
    const b = loadLocalModel(gguf);
    assert.equal(b.config.architecture, "Gemma3ForCausalLM");
    assert.deepEqual(b.config.slidingWindowLayers, a.config.slidingWindowLayers);
    for (const [name, t] of a.model.namedParameters()) {
      const u = b.model.namedParameters().find(([n]) => n === name)?.[1];
      assert.ok(u !== undefined, name);
      assert.deepEqual(u.dataSync(), t.dataSync(), name);
    }
  });
});
