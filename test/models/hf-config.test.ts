import { test } from "node:test";
import assert from "node:assert/strict";
import { parseHfConfig, ModelConfigError } from "../../src/models/hf-config.js";

const base = {
  vocab_size: 1000, hidden_size: 256, intermediate_size: 512, num_hidden_layers: 4, num_attention_heads: 8,
  max_position_embeddings: 4096, rms_norm_eps: 1e-5, rope_theta: 500000, hidden_act: "silu", torch_dtype: "bfloat16",
};

test("Llama: defaults, llama3 rope scaling, attention_bias", () => {
  const c = parseHfConfig({
    ...base, architectures: ["LlamaForCausalLM"], attention_bias: true, bos_token_id: 1, eos_token_id: [2, 3], tie_word_embeddings: true,
    rope_scaling: { rope_type: "llama3", factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 },
  });
  assert.equal(c.numKeyValueHeads, 8);
  assert.equal(c.headDim, 32);
  assert.deepEqual(c.ropeScaling, { type: "llama3", factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192 });
  assert.equal(c.qkvBias, true); assert.equal(c.oBias, true); assert.equal(c.qkNorm, false);
  assert.equal(c.tieWordEmbeddings, true); assert.equal(c.bosTokenId, 1); assert.deepEqual(c.eosTokenIds, [2, 3]);
  assert.equal(c.torchDtype, "bfloat16"); assert.equal(c.slidingWindow, null); assert.equal(c.moe, null);
  assert.equal(c.rmsNormEps, 1e-5); assert.equal(c.ropeTheta, 500000);
});

test("Mistral: sliding window on every layer, linear rope", () => {
  const c = parseHfConfig({ ...base, architectures: ["MistralForCausalLM"], num_key_value_heads: 2, sliding_window: 1024, rope_scaling: { type: "linear", factor: 2 } });
  assert.equal(c.slidingWindow, 1024);
  assert.deepEqual(c.slidingWindowLayers, [true, true, true, true]);
  assert.deepEqual(c.ropeScaling, { type: "linear", factor: 2 });
  assert.equal(c.qkvBias, false);
  assert.equal(parseHfConfig({ ...base, architectures: ["MistralForCausalLM"], sliding_window: null }).slidingWindow, null);
});

test("Qwen2: qkv bias always, sliding window only with use_sliding_window and from max_window_layers", () => {
  const c = parseHfConfig({ ...base, architectures: ["Qwen2ForCausalLM"], sliding_window: 4096, use_sliding_window: false, max_window_layers: 2 });
  assert.equal(c.qkvBias, true); assert.equal(c.oBias, false);
  assert.equal(c.slidingWindow, null);
  assert.deepEqual(c.slidingWindowLayers, [false, false, false, false]);
  const s = parseHfConfig({ ...base, architectures: ["Qwen2ForCausalLM"], sliding_window: 4096, use_sliding_window: true, max_window_layers: 2 });
  assert.equal(s.slidingWindow, 4096);
  assert.deepEqual(s.slidingWindowLayers, [false, false, true, true]);
});

test("Qwen3: head_dim explicit, qk norm, yarn", () => {
  const c = parseHfConfig({
    ...base, architectures: ["Qwen3ForCausalLM"], head_dim: 128, num_key_value_heads: 4,
    rope_scaling: { rope_type: "yarn", factor: 4, original_max_position_embeddings: 32768 },
  });
  assert.equal(c.headDim, 128); assert.equal(c.qkNorm, true); assert.equal(c.qkvBias, false);
  assert.deepEqual(c.ropeScaling, { type: "yarn", factor: 4, originalMaxPositionEmbeddings: 32768, betaFast: 32, betaSlow: 1, attentionFactor: null, mscale: null, mscaleAllDim: null });
  assert.equal(parseHfConfig({ ...base, architectures: ["Qwen3ForCausalLM"], rope_scaling: { rope_type: "default" } }).ropeScaling, null);
});

test("Mixtral and Qwen3-MoE", () => {
  const m = parseHfConfig({ ...base, architectures: ["MixtralForCausalLM"], num_local_experts: 8, num_experts_per_tok: 2 });
  assert.deepEqual(m.moe, { numExperts: 8, numExpertsPerTok: 2, moeIntermediateSize: 512, normTopkProb: true, decoderSparseStep: 1, mlpOnlyLayers: [],
    routerBias: false, expertBias: false, clampedSwiglu: null, sharedExpertIntermediateSize: null,
  });
  assert.deepEqual(m.moeLayers, [true, true, true, true]);
  const q = parseHfConfig({
    ...base, architectures: ["Qwen3MoeForCausalLM"], num_experts: 16, num_experts_per_tok: 4, moe_intermediate_size: 64,
    norm_topk_prob: true, decoder_sparse_step: 2, mlp_only_layers: [3],
  });
  assert.equal(q.moe!.moeIntermediateSize, 64);
  assert.deepEqual(q.moeLayers, [false, true, false, false]); // (i+1) % 2 == 0 and not in mlp_only_layers
});

test("config errors name the problem", () => {
  const bad: [unknown, RegExp][] = [
    [{ ...base, architectures: ["GPT2LMHeadModel"] }, /unsupported architecture "GPT2LMHeadModel"/],
    [{ ...base }, /architectures/],
    [{ ...base, architectures: ["LlamaForCausalLM"], hidden_act: "gelu" }, /hidden_act "gelu"/],
    [{ ...base, architectures: ["LlamaForCausalLM"], rope_scaling: { rope_type: "mrope", factor: 2 } }, /rope_scaling type "mrope"/],
    [{ ...base, architectures: ["LlamaForCausalLM"], attn_logit_softcapping: 50 }, /attn_logit_softcapping/],
    [{ ...base, architectures: ["LlamaForCausalLM"], hidden_size: -1 }, /hidden_size/],
    [{ ...base, architectures: ["LlamaForCausalLM"], num_key_value_heads: 3 }, /num_key_value_heads 3/],
    [{ ...base, architectures: ["LlamaForCausalLM"], rope_scaling: { rope_type: "llama3", factor: 8 } }, /low_freq_factor/],
    [{ ...base, architectures: ["Qwen3MoeForCausalLM"] }, /num_experts/],
    ["nope", /not an object/],
  ];
  for (const [cfg, re] of bad) assert.throws(() => parseHfConfig(cfg), (e: unknown) => e instanceof ModelConfigError && re.test(e.message), String(re));
});

test("*ForSequenceClassification: the head's labels, and vLLM's use_sep_token (default true; use_pad_token, deprecated, first)", () => {
  const cls = (extra: Record<string, unknown>) => parseHfConfig({ ...base, architectures: ["LlamaForSequenceClassification"], ...extra }).classifier!;
  assert.deepEqual(cls({ num_labels: 1 }), { numLabels: 1, labels: ["LABEL_0"], problemType: null, useSepToken: true });
  assert.equal(cls({ num_labels: 1, use_sep_token: false }).useSepToken, false);
  assert.equal(cls({ num_labels: 1, use_pad_token: false, use_sep_token: true }).useSepToken, false);
  assert.equal(cls({ num_labels: 1, use_pad_token: null, use_sep_token: false }).useSepToken, false);
  assert.throws(() => cls({ use_sep_token: "no" }), ModelConfigError);
  assert.equal(parseHfConfig({ ...base, architectures: ["LlamaForCausalLM"] }).classifier, null);
});
