// Gemma 3 (Gemma3ForCausalLM): its config read as HF's Gemma3TextConfig reads it, and the serving path (paged KV,
// step graphs, sliding-window layers with their own rotary base, a window shorter than the context) against
// llama.cpp's gemma3 on a GGUF export of the same random weights: next-token probabilities after a long prompt
// and a greedy continuation. (The dense forward is checked against llama.cpp in llama-cpp-oracle.test.ts.)
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";
import { LLM } from "../../src/engine/llm-engine.js";
import { exportGguf } from "../../src/models/init-model.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { ModelConfigError, parseHfConfig } from "../../src/models/hf-config.js";
import { readSafetensors, writeSafetensors } from "../../src/models/formats/safetensors.js";
import { ggufToHfConfig } from "../../src/models/formats/gguf-mapping.js";
import { arange, noGrad, tensor } from "../../src/tensor/index.js";
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
    assert.equal(c.normPlacement, "sandwich");
    assert.equal(c.qkNorm, true);
    assert.equal(c.tieWordEmbeddings, true); // Gemma's default
    assert.equal(c.localRopeTheta, 10000);
    assert.deepEqual(c.slidingWindowLayers, [true, true, true, true, true, false, true, true]); // every 6th is global
    const typed = parseHfConfig({ ...base, layer_types: ["sliding_attention", "full_attention", ...Array(6).fill("sliding_attention")] });
    assert.deepEqual(typed.slidingWindowLayers, [true, false, true, true, true, true, true, true]);
    // transformers v5: rope settings per layer type
    const v5 = parseHfConfig({ ...base, rope_theta: undefined, rope_local_base_freq: undefined, rope_parameters: {
      full_attention: { rope_type: "linear", factor: 8, rope_theta: 1_000_000 }, sliding_attention: { rope_type: "default", rope_theta: 10_000 },
    } });
    assert.deepEqual([v5.ropeTheta, v5.ropeScaling, v5.localRopeTheta], [1_000_000, { type: "linear", factor: 8 }, 10_000]);
    // what a config leaves out comes from Gemma3TextConfig's defaults
    const bare = parseHfConfig({ architectures: ["Gemma3ForCausalLM"], hidden_size: 640, intermediate_size: 2048, num_hidden_layers: 18 });
    assert.deepEqual([bare.headDim, bare.attnScale, bare.slidingWindow, bare.numAttentionHeads, bare.numKeyValueHeads, bare.vocabSize, bare.ropeTheta], [256, 1 / 16, 4096, 8, 4, 262208, 1e6]);
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
    // the dense forward (training, scoring) masks the window too
    const { model } = loadLocalModel(dir);
    const V = model.config.vocabSize;
    const dense = noGrad(() => model.logits(model.forward(tensor(Int32Array.from(prompt)), { kind: "dense", batch: 1, seqLen: prompt.length, positions: arange(prompt.length) })).logSoftmax(-1).dataSync() as Float32Array).subarray((prompt.length - 1) * V);
    let worst = 0;
    for (const [tok, p] of want.probs) if (p >= 1e-7) worst = Math.max(worst, Math.abs(Math.log(p) - dense[tok]!));
    assert.ok(worst < 5e-3, `dense forward: max |logprob diff| ${worst}`);
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

  it("an image-text checkpoint (Gemma3ForConditionalGeneration) serves its language model, in both weight layouts", () => {
    const ids = prompt;
    // (its vision tower left unread, as with --limit-mm-per-prompt '{"image": 0}': the image side is image-inputs.test.ts's)
    const logitsOf = (d: string) => {
      const { model } = loadLocalModel(d, { loadVision: false });
      return noGrad(() => model.logits(model.forward(tensor(Int32Array.from(ids)), { kind: "dense", batch: 1, seqLen: ids.length, positions: arange(ids.length) })).dataSync());
    };
    const want = logitsOf(dir);
    const text = JSON.parse(fs.readFileSync(path.join(dir, "config.json"), "utf8")) as Record<string, unknown>;
    const st = readSafetensors(path.join(dir, "model.safetensors"));
    // before transformers 4.52: language_model.model.X; after: model.language_model.X (lm_head at the top)
    for (const [layout, rename] of [["old", (n: string) => `language_model.${n}`], ["new", (n: string) => n.replace(/^model\./, "model.language_model.")]] as const) {
      const out = tempPath(`gemma3-image-text-${layout}`);
      fs.mkdirSync(out, { recursive: true });
      const { torch_dtype, eos_token_id, ...textConfig } = text;
      const config = { architectures: ["Gemma3ForConditionalGeneration"], model_type: "gemma3", torch_dtype, eos_token_id, text_config: textConfig, vision_config: { model_type: "siglip_vision_model" } };
      fs.writeFileSync(path.join(out, "config.json"), JSON.stringify(config));
      for (const f of ["tokenizer.json", "tokenizer_config.json"]) fs.copyFileSync(path.join(dir, f), path.join(out, f));
      const tensors = st.tensors.map((t) => ({ name: rename(t.name), dtype: t.dtype, shape: t.shape, data: st.load(t.name) }));
      tensors.push({ name: "vision_tower.vision_model.embeddings.patch_embedding.weight", dtype: "F32", shape: [2, 2], data: new Uint8Array(16) });
      writeSafetensors(path.join(out, "model.safetensors"), tensors);
      assert.deepEqual(logitsOf(out), want, layout);
    }
    st.close();
  });

  it("GGUF holds only what llama.cpp's gemma3 assumes: other configs are refused on export, the 27B scale read as llama.cpp reads it", () => {
    for (const [overrides, why] of [
      [{ sliding_window_pattern: 3 }, /every 6th layer must be global/],
      [{ query_pre_attn_scalar: 32 }, /query_pre_attn_scalar must be 16/],
      [{ rope_local_base_freq: 20000 }, /rope_local_base_freq must be 10000/],
    ] as const) {
      const d = tinyModelDir("Gemma3ForCausalLM", { overrides: { num_hidden_layers: 6, ...overrides } });
      assert.throws(() => exportGguf(d, tempPath("gemma3-refused.gguf"), "F32"), why);
    }
    const md = (layers: number) => ({
      "general.architecture": "gemma3", "gemma3.block_count": layers, "gemma3.embedding_length": 5376, "gemma3.attention.head_count": 32,
      "gemma3.attention.key_length": 128, "gemma3.feed_forward_length": 21504,
    });
    assert.equal(ggufToHfConfig(md(62)).query_pre_attn_scalar, 168); // gemma-3-27b: hidden / heads
    assert.equal(ggufToHfConfig(md(34)).query_pre_attn_scalar, 128); // others: head_dim
  });
});
