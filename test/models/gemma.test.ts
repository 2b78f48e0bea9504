// Gemma (GemmaForCausalLM: gemma-2b, gemma-7b): Llama's layer with Gemma's pieces: RMSNorm scaling by (1 + w),
// embeddings scaled by sqrt(hidden_size) (rounded to the weights' dtype), a GELU-tanh gated MLP, head_dim apart from
// hidden / heads, a tied head. Checked: the config as vLLM reads it (Gemma 1.0's hidden_act "gelu" runs the tanh GELU);
// the norm, embedding scale and MLP against hand-derived values; the model against llama.cpp's gemma on a GGUF export of
// the same random weights (norm weights random too, so (1 + w) shows), served from the directory and from the GGUF
// along llama.cpp's greedy path; the GGUF round trip (norms stored as 1 + w) and what an export refuses.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";
import { CausalLM } from "../../src/models/causal-lm.js";
import { readGguf } from "../../src/models/formats/gguf.js";
import { ggufToHfConfig, hfConfigToGgufMetadata } from "../../src/models/formats/gguf-mapping.js";
import { ModelFormatError } from "../../src/models/formats/model-format-error.js";
import { readSafetensors, writeSafetensors } from "../../src/models/formats/safetensors.js";
import { ModelConfigError, parseHfConfig } from "../../src/models/hf-config.js";
import { exportGguf } from "../../src/models/init-model.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { GatedMLP } from "../../src/nn/index.js";
import { noGrad, tensor } from "../../src/tensor/index.js";
import { hasLlamaCpp, llamaCppAlong, withFloat16Gelu } from "../helpers/llama-cpp.js";
import { lastLogprobs, recomputedGreedy, seededRandn, servedGreedy } from "../helpers/model-logits.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";

// gemma-7b's config.json as released (hidden_act "gelu", no hidden_activation)
const gemma7b = {
  architectures: ["GemmaForCausalLM"], model_type: "gemma", attention_bias: false, attention_dropout: 0, bos_token_id: 2, eos_token_id: 1,
  head_dim: 256, hidden_act: "gelu", hidden_size: 3072, initializer_range: 0.02, intermediate_size: 24576, max_position_embeddings: 8192,
  num_attention_heads: 16, num_hidden_layers: 28, num_key_value_heads: 16, pad_token_id: 0, rms_norm_eps: 1e-6, rope_scaling: null,
  rope_theta: 10000, torch_dtype: "bfloat16", use_cache: true, vocab_size: 256000,
};

const prompt = Array.from({ length: 20 }, (_, i) => (i * 29 + 7) % 500);

/** The tiny Gemma with its norm weights drawn N(0, 0.3) (init-model writes w = 0: (1 + w) = 1 would hide the offset). */
const dir = (() => {
  let made: string | null = null;
  return (): string => {
    if (made !== null) return made;
    const src = tinyModelDir("GemmaForCausalLM");
    const out = tempPath("gemma-random-norms");
    fs.mkdirSync(out, { recursive: true });
    for (const f of ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"]) fs.copyFileSync(path.join(src, f), path.join(out, f));
    const st = readSafetensors(path.join(src, "model.safetensors"));
    const tensors = st.tensors.map((t, k) => {
      if (!t.name.endsWith("norm.weight")) return { name: t.name, dtype: t.dtype, shape: t.shape, data: st.load(t.name) };
      const w = seededRandn(t.shape[0]!, 100 + k, 0.3);
      return { name: t.name, dtype: "F32" as const, shape: t.shape, data: new Uint8Array(w.buffer) };
    });
    writeSafetensors(path.join(out, "model.safetensors"), tensors);
    st.close();
    return (made = out);
  };
})();

/** The engine's greedy 8 tokens after `prompt`. */
const served = (model: string, enforceEager = false): number[] => servedGreedy(model, prompt, 8, enforceEager);

describe("Gemma", () => {
  it("reads the config as vLLM does: the released hidden_act \"gelu\" runs the tanh GELU; malformed fields are refused by name", () => {
    const c = parseHfConfig(gemma7b);
    assert.equal(c.architecture, "GemmaForCausalLM");
    assert.equal(c.hiddenAct, "gelu_tanh"); // no hidden_activation: gelu_pytorch_tanh, whatever hidden_act says
    assert.equal(c.headDim, 256); // not 3072 / 16
    assert.equal(c.attnScale, 1 / 16); // head_dim ** -0.5
    assert.equal(c.embedScale, Math.sqrt(3072));
    assert.deepEqual([c.normOffset, c.normPlacement, c.qkNorm, c.qkvBias, c.oBias, c.tieWordEmbeddings], [1, "pre", false, false, false, true]);
    assert.deepEqual([c.attnSoftcap, c.finalSoftcap, c.slidingWindow, c.localRopeTheta, c.moe], [null, null, null, null, null]);
    assert.equal(parseHfConfig({ ...gemma7b, hidden_activation: "gelu_pytorch_tanh" }).hiddenAct, "gelu_tanh");
    assert.deepEqual([parseHfConfig({ ...gemma7b, attention_bias: true }).qkvBias, parseHfConfig({ ...gemma7b, attention_bias: true }).oBias], [true, true]);
    // what a config leaves out comes from GemmaConfig's defaults (gemma-7b's shape)
    const bare = parseHfConfig({ architectures: ["GemmaForCausalLM"] });
    assert.deepEqual(
      [bare.vocabSize, bare.hiddenSize, bare.intermediateSize, bare.numHiddenLayers, bare.numAttentionHeads, bare.numKeyValueHeads, bare.headDim, bare.tieWordEmbeddings, bare.bosTokenId, bare.eosTokenIds],
      [256000, 3072, 24576, 28, 16, 16, 256, true, 2, [1]],
    );
    const refused = (over: Record<string, unknown>, why: RegExp) =>
      assert.throws(() => parseHfConfig({ ...gemma7b, ...over }), (e: unknown) => e instanceof ModelConfigError && why.test(e.message), JSON.stringify(over));
    refused({ hidden_activation: "gelu" }, /unsupported hidden_activation "gelu"/); // exact GELU: not what Gemma was trained with
    refused({ head_dim: 0 }, /"head_dim" must be a positive integer/);
    refused({ num_key_value_heads: 3 }, /num_attention_heads 16 is not a multiple of num_key_value_heads 3/);
    refused({ query_pre_attn_scalar: 224 }, /unsupported field "query_pre_attn_scalar"/); // Gemma 2's, not Gemma's
    refused({ final_logit_softcapping: 30 }, /unsupported field "final_logit_softcapping"/);
    refused({ rms_norm_eps: "1e-6" }, /"rms_norm_eps" must be a number/);
  });

  it("hand-derived: embeddings times sqrt(hidden) (rounded to bf16 in bf16), norms scale by (1 + w), a GELU-tanh gated MLP", () => {
    const m = loadLocalModel(dir());
    const H = m.config.hiddenSize;
    const ids = [5, 77, 300];
    const rows = noGrad(() => m.model.model.embedTokens.forward(tensor(Int32Array.from(ids))).dataSync() as Float32Array);
    const table = m.model.model.embedTokens.weight.dataSync() as Float32Array;
    rows.forEach((v, i) => assert.equal(v, Math.fround(table[ids[Math.floor(i / H)]! * H + (i % H)]! * 8), `row value ${i}`)); // sqrt(64)
    // bfloat16 weights: HF casts sqrt(72) = 8.485 to bf16, 8.5
    const bf = new CausalLM(parseHfConfig({ ...gemma7b, hidden_size: 72, intermediate_size: 32, num_hidden_layers: 1, head_dim: 16, num_attention_heads: 2, num_key_value_heads: 1, vocab_size: 10 }), { dtype: "bfloat16" });
    const bfRow = noGrad(() => bf.model.embedTokens.forward(tensor(Int32Array.from([3]))).dataSync() as Float32Array);
    const bfTable = noGrad(() => bf.model.embedTokens.weight.to("float32").dataSync() as Float32Array);
    bfRow.forEach((v, i) => assert.ok(Math.abs(v - bfTable[3 * 72 + i]! * 8.5) <= 1e-6 * Math.abs(v), `bf16 row value ${i}: ${v} vs ${bfTable[3 * 72 + i]! * 8.5}`));

    const layer = m.model.model.layers[0]!;
    const norm = layer.attnInNorm!;
    const w = norm.weight.dataSync() as Float32Array;
    assert.ok(w.some((v) => v < -0.1) && w.some((v) => v > 0.1), "random norm weights");
    const T = 3;
    const x = seededRandn(T * H, 9);
    const normed = noGrad(() => norm.forward(tensor(x, { shape: [T, H] })).dataSync() as Float32Array);
    for (let t = 0; t < T; t++) {
      const row = x.subarray(t * H, (t + 1) * H);
      const inv = 1 / Math.sqrt(row.reduce((s, v) => s + v * v, 0) / H + m.config.rmsNormEps);
      row.forEach((v, i) => assert.ok(Math.abs(normed[t * H + i]! - v * inv * (1 + w[i]!)) < 1e-5, `norm ${t},${i}`));
    }

    const mlp = layer.mlp;
    assert.ok(mlp instanceof GatedMLP);
    const out = noGrad(() => mlp.forward(tensor(x, { shape: [T, H] })).dataSync() as Float32Array);
    const W = (l: { weight: { dataSync(): unknown } }) => l.weight.dataSync() as Float32Array;
    const matvec = (M: Float32Array, row: Float32Array, n: number) => Float32Array.from({ length: n }, (_, o) => row.reduce((s, v, i) => s + M[o * row.length + i]! * v, 0));
    const geluTanh = (v: number) => 0.5 * v * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (v + 0.044715 * v ** 3)));
    const silu = (v: number) => v / (1 + Math.exp(-v));
    const I = m.config.intermediateSize;
    const reference = (act: (v: number) => number) => Float32Array.from({ length: T * H }, (_, k) => {
      const row = x.subarray(Math.floor(k / H) * H, (Math.floor(k / H) + 1) * H);
      const g = matvec(W(mlp.gateProj), row, I), u = matvec(W(mlp.upProj), row, I);
      return W(mlp.downProj).subarray((k % H) * I, (k % H + 1) * I).reduce((s, d, j) => s + d * act(g[j]!) * u[j]!, 0);
    });
    const gap = (ref: Float32Array) => ref.reduce((d, v, i) => Math.max(d, Math.abs(v - out[i]!)), 0);
    assert.ok(gap(reference(geluTanh)) < 1e-5, `GELU-tanh MLP: ${gap(reference(geluTanh))}`);
    assert.ok(gap(reference(silu)) > 1e-2, "a SiLU MLP would differ");
  });

  it("dense forward and serving (directory: step graphs and eager; the GGUF) agree with llama.cpp's gemma", { skip: hasLlamaCpp ? false : "node-llama-cpp not installed", timeout: 120_000 }, async (t) => {
    const gguf = tempPath("gemma.gguf");
    exportGguf(dir(), gguf, "F32");
    const m = loadLocalModel(dir());
    const greedy = recomputedGreedy(m, prompt, 8); // eager full recomputation
    const lc = await llamaCppAlong(gguf, prompt, greedy);
    assert.deepEqual(lc.argmax, greedy, "llama.cpp's greedy path");
    const range = (lp: Float32Array) => lp.reduce((a, b) => Math.max(a, b), -Infinity) - lp.reduce((a, b) => Math.min(a, b), Infinity);
    const gap = (lp: Float32Array) => [...lc.probs[0]!].reduce((d, [tok, p]) => (p >= 1e-7 ? Math.max(d, Math.abs(Math.log(p) - lp[tok]!)) : d), 0);
    const plain = lastLogprobs(m, prompt);
    // ggml's GELU reads a float16 table: with Kiln's GELU doing the same, what is left is float32 accumulation order
    const emulated = withFloat16Gelu(() => lastLogprobs(m, prompt));
    t.diagnostic(`Gemma dense forward vs llama.cpp: max |logprob diff| ${gap(plain).toExponential(2)}, ${gap(emulated).toExponential(2)} with ggml's float16 GELU emulated (log-prob range ${range(plain).toFixed(1)})`);
    assert.ok(gap(emulated) < 1e-5 * range(plain), `with the float16 GELU emulated: ${gap(emulated)}`);
    assert.ok(gap(plain) < 1e-3 * range(plain), `plain: ${gap(plain)}`);
    assert.deepEqual(served(dir()), greedy, "served, step graphs");
    assert.deepEqual(served(dir(), true), greedy, "served, eager");
    assert.deepEqual(served(gguf), greedy, "the GGUF served");
  });

  it("a GGUF export loads back to the same model: norms stored as 1 + w, no output head (llama.cpp reads the embedding)", () => {
    const gguf = tempPath("gemma-roundtrip.gguf");
    exportGguf(dir(), gguf, "F32");
    const a = loadLocalModel(dir());
    const g = readGguf(gguf);
    try {
      assert.equal(g.metadata["general.architecture"], "gemma");
      assert.deepEqual(["attention.key_length", "attention.value_length", "embedding_length", "attention.head_count"].map((k) => g.metadata[`gemma.${k}`]), [32, 32, 64, 4]);
      assert.equal(g.get("output.weight"), undefined);
      const stored = g.loadAsFloat32("blk.0.attn_norm.weight");
      const w = a.model.model.layers[0]!.attnInNorm!.weight.dataSync() as Float32Array;
      stored.forEach((v, i) => assert.equal(v, Math.fround(1 + w[i]!), `attn_norm ${i}`));
    } finally {
      g.close();
    }
    const b = loadLocalModel(gguf);
    for (const key of ["architecture", "hiddenAct", "headDim", "attnScale", "embedScale", "normOffset", "normPlacement", "tieWordEmbeddings", "qkvBias"] as const)
      assert.deepEqual(b.config[key], a.config[key], key);
    const theirs = new Map(b.model.namedParameters());
    for (const [name, p] of a.model.namedParameters()) {
      const q = theirs.get(name)!.dataSync() as Float32Array;
      // (norms come back as (1 + w) - 1 in float32)
      (p.dataSync() as Float32Array).forEach((v, i) => assert.ok(Math.abs(v - q[i]!) <= 1e-7, `${name}[${i}]`));
    }
  });

  it("GGUF holds only what llama.cpp's gemma reads: an untied head is refused on export; a GGUF reads back tied, GELU-tanh", () => {
    const base = JSON.parse(fs.readFileSync(path.join(dir(), "config.json"), "utf8")) as Record<string, unknown>;
    for (const [over, why] of [
      [{ tie_word_embeddings: false }, /tie_word_embeddings must be true/],
      [{ rope_scaling: { rope_type: "linear", factor: 2 } }, /rope_scaling must be absent/],
    ] as const)
      assert.throws(() => hfConfigToGgufMetadata({ ...base, ...over }), (e: unknown) => e instanceof ModelFormatError && why.test(e.message), JSON.stringify(over));
    // a config leaving head_dim to GemmaConfig's default writes 256, not hidden / heads
    const md = hfConfigToGgufMetadata({ ...base, head_dim: undefined });
    assert.deepEqual([md["gemma.attention.key_length"]?.value, md["gemma.attention.value_length"]?.value], [256, 256]);
    const c = parseHfConfig(ggufToHfConfig({
      "general.architecture": "gemma", "gemma.block_count": 18, "gemma.embedding_length": 2048, "gemma.attention.head_count": 8,
      "gemma.attention.head_count_kv": 1, "gemma.attention.key_length": 256, "gemma.feed_forward_length": 16384, "gemma.vocab_size": 256000,
    }, ["token_embd.weight", "output.weight"]));
    assert.deepEqual([c.architecture, c.hiddenAct, c.tieWordEmbeddings, c.attnScale, c.normOffset, c.embedScale], ["GemmaForCausalLM", "gelu_tanh", true, 1 / 16, 1, Math.sqrt(2048)]);
  });
});
