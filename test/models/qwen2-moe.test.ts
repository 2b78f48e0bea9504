// Qwen2-MoE (Qwen2MoeForCausalLM: Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (q/k/v biases) with sparse MoE
// blocks whose softmax top-k routing is left unnormalized (norm_topk_prob false), plus a shared expert every token runs,
// scaled by sigmoid(shared_expert_gate(x)); decoder_sparse_step and mlp_only_layers keep some layers dense. Checked: the
// config as Qwen2MoeConfig reads it (typed errors naming the field); the sparse block against a plain-TS reference;
// the model against llama.cpp's qwen2moe on a GGUF export of the same random weights (dense forward, and serving's
// greedy path from the directory and from the GGUF); serving against eager full recomputation with dense layers mixed
// in; the GGUF round trip and what an export refuses.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";
import { readGguf, writeGguf, type GgufWriteTensor } from "../../src/models/formats/gguf.js";
import { ggufToHfConfig, hfConfigToGgufMetadata } from "../../src/models/formats/gguf-mapping.js";
import { ModelFormatError } from "../../src/models/formats/model-format-error.js";
import { ModelConfigError, parseHfConfig } from "../../src/models/hf-config.js";
import { exportGguf } from "../../src/models/init-model.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { GatedMLP, MoE } from "../../src/nn/index.js";
import { noGrad, tensor } from "../../src/tensor/index.js";
import { hasLlamaCpp, llamaCppAlong } from "../helpers/llama-cpp.js";
import { lastLogprobs, recomputedGreedy, seededRandn, servedGreedy } from "../helpers/model-logits.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";

// Qwen1.5-MoE-A2.7B's config.json
const qwen15MoE = {
  architectures: ["Qwen2MoeForCausalLM"], model_type: "qwen2_moe", attention_dropout: 0, bos_token_id: 151643, eos_token_id: 151643,
  hidden_act: "silu", hidden_size: 2048, initializer_range: 0.02, intermediate_size: 5632, max_position_embeddings: 8192,
  max_window_layers: 21, num_attention_heads: 16, num_experts: 60, num_experts_per_tok: 4, moe_intermediate_size: 1408,
  shared_expert_intermediate_size: 5632, norm_topk_prob: false, decoder_sparse_step: 1, num_hidden_layers: 24,
  num_key_value_heads: 16, rms_norm_eps: 1e-6, rope_theta: 1_000_000, sliding_window: 32768, tie_word_embeddings: false,
  torch_dtype: "bfloat16", use_cache: true, use_sliding_window: false, vocab_size: 151936, output_router_logits: false,
};

const prompt = Array.from({ length: 20 }, (_, i) => (i * 37 + 11) % 500);
const dir = () => tinyModelDir("Qwen2MoeForCausalLM");
/** 3 layers, the middle one dense (mlp_only_layers): llama.cpp's qwen2moe cannot hold it. */
const mixedDir = () => tinyModelDir("Qwen2MoeForCausalLM", { overrides: { num_hidden_layers: 3, mlp_only_layers: [1] } });

/** The engine's greedy 8 tokens after `prompt`. */
const served = (model: string, enforceEager = false): number[] => servedGreedy(model, prompt, 8, enforceEager);

describe("Qwen2-MoE", () => {
  it("reads the config as Qwen2MoeConfig does; malformed fields are refused by name", () => {
    const c = parseHfConfig(qwen15MoE);
    assert.equal(c.architecture, "Qwen2MoeForCausalLM");
    assert.deepEqual(c.moe, {
      numExperts: 60, numExpertsPerTok: 4, moeIntermediateSize: 1408, normTopkProb: false, decoderSparseStep: 1, mlpOnlyLayers: [],
      routerBias: false, expertBias: false, clampedSwiglu: null, sharedExpertIntermediateSize: 5632,
    });
    assert.deepEqual([c.qkvBias, c.oBias, c.qkNorm, c.mlpBias, c.hiddenAct, c.tieWordEmbeddings, c.slidingWindow], [true, false, false, false, "silu", false, null]);
    assert.ok(c.moeLayers.every(Boolean));
    assert.equal(c.intermediateSize, 5632); // the dense layers' (none here)
    // a layer is sparse iff not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
    const mixed = parseHfConfig({ ...qwen15MoE, num_hidden_layers: 6, decoder_sparse_step: 2, mlp_only_layers: [3] });
    assert.deepEqual(mixed.moeLayers, [false, true, false, false, false, true]);
    // shared_expert_intermediate_size 0: no shared expert (vLLM's reading); qkv_bias false: none
    assert.equal(parseHfConfig({ ...qwen15MoE, shared_expert_intermediate_size: 0 }).moe!.sharedExpertIntermediateSize, null);
    assert.equal(parseHfConfig({ ...qwen15MoE, qkv_bias: false }).qkvBias, false);
    assert.equal(parseHfConfig({ ...qwen15MoE, norm_topk_prob: true }).moe!.normTopkProb, true);
    const refused = (over: Record<string, unknown>, why: RegExp) =>
      assert.throws(() => parseHfConfig({ ...qwen15MoE, ...over }), (e: unknown) => e instanceof ModelConfigError && why.test(e.message), JSON.stringify(over));
    refused({ num_experts: undefined }, /"num_experts" must be a positive integer/);
    refused({ moe_intermediate_size: 0 }, /"moe_intermediate_size" must be a positive integer/);
    refused({ shared_expert_intermediate_size: undefined }, /"shared_expert_intermediate_size" must be a non-negative integer/);
    refused({ shared_expert_intermediate_size: 1.5 }, /"shared_expert_intermediate_size" must be a non-negative integer/);
    refused({ decoder_sparse_step: 0 }, /"decoder_sparse_step" must be a positive integer/);
    refused({ mlp_only_layers: [1.5] }, /mlp_only_layers must list layer indices/);
    refused({ mlp_only_layers: "0" }, /mlp_only_layers must list layer indices/);
    refused({ norm_topk_prob: "no" }, /"norm_topk_prob" must be true or false/);
    refused({ num_experts_per_tok: 61 }, /num_experts_per_tok 61 > experts 60/);
  });

  it("the sparse block equals a plain-TS reference: unnormalized softmax top-k plus sigmoid(gate · x) * shared expert", () => {
    const m = loadLocalModel(dir());
    const block = m.model.model.layers[0]!.mlp;
    assert.ok(block instanceof MoE && block.sharedExpert !== null && block.sharedExpertGate !== null);
    const names = m.model.namedParameters().map(([n]) => n).filter((n) => n.startsWith("model.layers.0.mlp.shared"));
    assert.deepEqual(names.sort(), [
      "model.layers.0.mlp.shared_expert.down_proj.weight", "model.layers.0.mlp.shared_expert.gate_proj.weight",
      "model.layers.0.mlp.shared_expert.up_proj.weight", "model.layers.0.mlp.shared_expert_gate.weight",
    ]);
    const H = m.config.hiddenSize;
    const T = 6;
    const x = seededRandn(T * H, 3);
    const ours = noGrad(() => block.forward(tensor(x, { shape: [T, H] })).dataSync() as Float32Array);
    const w = (t: { dataSync(): unknown }) => t.dataSync() as Float32Array;
    /** y = W x for W [out, in] (row-major), x one row. */
    const matvec = (W: Float32Array, row: Float32Array, out: number): Float32Array =>
      Float32Array.from({ length: out }, (_, o) => row.reduce((s, v, i) => s + W[o * row.length + i]! * v, 0));
    const silu = (v: number) => v / (1 + Math.exp(-v));
    const mlp = (e: GatedMLP, row: Float32Array): Float32Array => {
      const I = e.gateProj.weight.shape[0]!;
      const g = matvec(w(e.gateProj.weight), row, I), u = matvec(w(e.upProj.weight), row, I);
      return matvec(w(e.downProj.weight), g.map((v, i) => silu(v) * u[i]!), H);
    };
    const { numExperts: E, numExpertsPerTok: K } = m.config.moe!;
    /** The block by hand; `gated` false drops the sigmoid (a wrong formula the comparison must catch). */
    const reference = (gated: boolean) => {
      const out = new Float32Array(T * H);
      for (let t = 0; t < T; t++) {
        const row = x.subarray(t * H, (t + 1) * H);
        const logits = matvec(w(block.gate.weight), row, E);
        const mx = Math.max(...logits);
        const p = logits.map((l) => Math.exp(l - mx));
        const sum = p.reduce((a, b) => a + b, 0);
        const top = [...p.keys()].sort((a, b) => p[b]! - p[a]!).slice(0, K); // weights p / sum, not renormalized over the k
        for (const e of top) mlp(block.experts[e]!, row).forEach((v, i) => (out[t * H + i]! += (p[e]! / sum) * v));
        const gateLogit = matvec(w(block.sharedExpertGate!.weight), row, 1)[0]!;
        const scale = gated ? 1 / (1 + Math.exp(-gateLogit)) : 1;
        mlp(block.sharedExpert!, row).forEach((v, i) => (out[t * H + i]! += scale * v));
      }
      return out;
    };
    const gap = (ref: Float32Array) => ref.reduce((d, v, i) => Math.max(d, Math.abs(v - ours[i]!)), 0);
    const size = ours.reduce((a, v) => Math.max(a, Math.abs(v)), 0);
    assert.ok(gap(reference(true)) < 1e-5 * size, `max |diff| ${gap(reference(true))} (outputs up to ${size})`);
    assert.ok(gap(reference(false)) > 1e-2 * size, "an ungated shared expert would differ");
  });

  it("dense forward, serving (step graphs and eager) and serving the GGUF agree with llama.cpp's qwen2moe", { skip: hasLlamaCpp ? false : "node-llama-cpp not installed", timeout: 120_000 }, async (t) => {
    const gguf = tempPath("qwen2moe.gguf");
    exportGguf(dir(), gguf, "F32");
    const m = loadLocalModel(dir());
    const greedy = recomputedGreedy(m, prompt, 8); // eager full recomputation
    const lc = await llamaCppAlong(gguf, prompt, greedy);
    assert.deepEqual(lc.argmax, greedy, "llama.cpp's greedy path");
    const ours = lastLogprobs(m, prompt);
    let worst = 0;
    for (const [tok, p] of lc.probs[0]!) if (p >= 1e-7) worst = Math.max(worst, Math.abs(Math.log(p) - ours[tok]!));
    const range = ours.reduce((a, b) => Math.max(a, b), -Infinity) - ours.reduce((a, b) => Math.min(a, b), Infinity);
    t.diagnostic(`Qwen2-MoE dense forward vs llama.cpp: max |logprob diff| ${worst.toExponential(2)} (log-prob range ${range.toFixed(1)})`);
    // both sides float32 (weights and KV cache): accumulation order only; an ungated shared expert or renormalized
    // top-k moves these by 1e-2 and more
    assert.ok(worst < 1e-5 * range, `max |logprob diff| ${worst}`);
    assert.deepEqual(served(dir()), greedy, "served, step graphs");
    assert.deepEqual(served(dir(), true), greedy, "served, eager");
    assert.deepEqual(served(gguf), greedy, "the GGUF served");
  });

  it("dense layers (mlp_only_layers) mixed in: serving equals eager full recomputation", () => {
    const m = loadLocalModel(mixedDir());
    assert.deepEqual(m.config.moeLayers, [true, false, true]);
    assert.ok(m.model.model.layers[1]!.mlp instanceof GatedMLP && m.model.model.layers[1]!.mlp.gateProj.weight.shape[0] === m.config.intermediateSize);
    const want = recomputedGreedy(m, prompt, 8);
    assert.deepEqual(served(mixedDir()), want, "step graphs");
    assert.deepEqual(served(mixedDir(), true), want, "eager");
  });

  it("a GGUF export loads back to the same model; a squeezed [hidden] shared-expert gate is read too", () => {
    const gguf = tempPath("qwen2moe-roundtrip.gguf");
    exportGguf(dir(), gguf, "F32");
    const a = loadLocalModel(dir());
    const g = readGguf(gguf);
    let squeezed = "";
    try {
      assert.equal(g.metadata["general.architecture"], "qwen2moe");
      const md = (k: string) => g.metadata[`qwen2moe.${k}`];
      assert.deepEqual(["expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_feed_forward_length", "feed_forward_length"].map(md), [4, 2, 32, 128, 128]);
      const t = (n: string) => g.get(n) && `${g.get(n)!.type} [${g.get(n)!.shape.join(", ")}]`;
      assert.deepEqual(
        ["blk.0.ffn_gate_inp.weight", "blk.0.ffn_up_exps.weight", "blk.0.ffn_gate_shexp.weight", "blk.0.ffn_down_shexp.weight", "blk.0.ffn_gate_inp_shexp.weight", "blk.0.attn_q.bias"].map(t),
        ["F32 [4, 64]", "F32 [4, 32, 64]", "F32 [128, 64]", "F32 [64, 128]", "F32 [1, 64]", "F32 [64]"],
      );
      // as a converter that squeezed size-1 dims wrote it (Qwen1.5-MoE GGUFs of 2024)
      squeezed = tempPath("qwen2moe-squeezed.gguf");
      const tensors = g.tensors.map((info): GgufWriteTensor => ({
        name: info.name, shape: info.name.endsWith("ffn_gate_inp_shexp.weight") ? [info.shape[1]!] : info.shape, type: info.type, raw: g.load(info.name),
      }));
      writeGguf(squeezed, g.typedMetadata(), tensors);
    } finally {
      g.close();
    }
    for (const file of [gguf, squeezed]) {
      const b = loadLocalModel(file);
      for (const key of ["architecture", "moe", "moeLayers", "qkvBias", "oBias", "headDim", "tieWordEmbeddings", "intermediateSize"] as const)
        assert.deepEqual(b.config[key], a.config[key], `${file}: ${key}`);
      const theirs = new Map(b.model.namedParameters());
      for (const [name, p] of a.model.namedParameters()) {
        assert.deepEqual(theirs.get(name)?.shape, p.shape, name);
        assert.deepEqual(theirs.get(name)!.dataSync(), p.dataSync(), name);
      }
    }
  });

  it("GGUF holds only what llama.cpp's qwen2moe can run: other configs are refused on export; a GGUF's absent keys read as llama.cpp reads them", () => {
    const base = JSON.parse(fs.readFileSync(path.join(dir(), "config.json"), "utf8")) as Record<string, unknown>;
    for (const [over, why] of [
      [{ num_hidden_layers: 3, mlp_only_layers: [1] }, /every layer must be sparse/],
      [{ decoder_sparse_step: 2 }, /every layer must be sparse/],
      [{ norm_topk_prob: true }, /norm_topk_prob must be false/],
      [{ shared_expert_intermediate_size: 0 }, /shared_expert_intermediate_size must be positive/],
      [{ use_sliding_window: true, sliding_window: 16, max_window_layers: 0 }, /use_sliding_window must be false/],
    ] as const)
      assert.throws(() => hfConfigToGgufMetadata({ ...base, ...over }), (e: unknown) => e instanceof ModelFormatError && why.test(e.message), JSON.stringify(over));
    assert.throws(() => exportGguf(mixedDir(), tempPath("qwen2moe-mixed.gguf"), "F32"), /every layer must be sparse/);
    // without the expert sizes, llama.cpp takes feed_forward_length / experts used, and feed_forward_length
    const c = parseHfConfig(ggufToHfConfig({
      "general.architecture": "qwen2moe", "qwen2moe.block_count": 24, "qwen2moe.embedding_length": 2048, "qwen2moe.attention.head_count": 16,
      "qwen2moe.feed_forward_length": 5632, "qwen2moe.expert_count": 60, "qwen2moe.expert_used_count": 4, "qwen2moe.vocab_size": 151936,
    }));
    assert.deepEqual(
      [c.moe!.moeIntermediateSize, c.moe!.sharedExpertIntermediateSize, c.moe!.normTopkProb, c.qkvBias, c.moeLayers.every(Boolean)],
      [1408, 5632, false, true, true],
    );
  });
});
