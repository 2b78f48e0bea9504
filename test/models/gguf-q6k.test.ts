// GGUF Q6_K loads straight into Kiln's q6_k layout (native/quant.h: ql and qh as they are, d and the 16 scales
// moved beside them), and Kiln's Q6_K encoder writes files llama.cpp reads. Oracles: gguf-quant.ts's Q6_K
// dequantizer (ggml's dequantize_row_q6_K), the f32 matmul on the dequantized weight, and llama.cpp on the same file.
import assert from "node:assert/strict";
import { test } from "node:test";
import { q6kMatmulRef } from "../../src/backends/cpu/q6k-reference.js";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { dequantizeRef, floatToHalf, nativeTakesScheme } from "../../src/backends/cpu/quant-reference.js";
import { dequantize, quantizeQ6_K } from "../../src/models/formats/gguf-quant.js";
import { q6_KToQ6k, q6kToQ6_K } from "../../src/models/formats/gguf-repack.js";
import { readGguf } from "../../src/models/formats/gguf.js";
import { exportGguf } from "../../src/models/init-model.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { quantizedWeightOf } from "../../src/nn/quantized-linear.js";
import { fromBytes, noGrad, tensor } from "../../src/tensor/index.js";
import { quantizedShadowOf, quantizeWeight, type QuantizedWeight } from "../../src/tensor/ops/linalg.js";
import { mulberry32 } from "../../src/util/random.js";
import { expectLlamaCppAgreement, hasLlamaCpp } from "../helpers/llama-cpp.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";
import { bytesOfTensor, expectWithinActivationRounding, lastLogits, linears, maxAbs, maxAbsDiff, seededRandn } from "../helpers/model-logits.js";

const native = tryLoadNativeKernels();
const skip = !native ? "native addon not built" : nativeTakesScheme(native, "q6_k") ? false : "native addon lacks q6_k";

/** Random Q6_K super-blocks (ql[128], qh[64], int8 scales[16], f16 d): every code and scale, d of both signs ~1e-4. */
function randomQ6K(blocks: number, seed: number): Uint8Array {
  const u = mulberry32(seed);
  const out = new Uint8Array(blocks * 210);
  for (let i = 0; i < out.length; i++) out[i] = Math.floor(u() * 256);
  for (let b = 0; b < blocks; b++) {
    const d = floatToHalf((u() < 0.5 ? -1 : 1) * (5e-5 + 5e-5 * u()));
    out[b * 210 + 208] = d & 255;
    out[b * 210 + 209] = d >> 8;
  }
  return out;
}

test("Q6_K -> q6_k repack: codes as they are, d and scales beside them; dequantizes bit-exactly, inverts", () => {
  const n = 3, k = 512;
  for (const src of [randomQ6K((n * k) / 256, 5), quantizeQ6_K(seededRandn(n * k, 6, 0.05))]) {
    const q = q6_KToQ6k(src, n, k);
    for (let b = 0; b < (n * k) / 256; b++) {
      assert.deepEqual(q.data.subarray(b * 192, b * 192 + 192), src.subarray(b * 210, b * 210 + 192), "ql, qh");
      assert.deepEqual(q.scales.subarray(b * 18, b * 18 + 2), src.subarray(b * 210 + 208, b * 210 + 210), "d");
      assert.deepEqual(q.scales.subarray(b * 18 + 2, b * 18 + 18), src.subarray(b * 210 + 192, b * 210 + 208), "scales");
    }
    const viaQ6k = dequantizeRef("q6_k", { ...q, rowSums: new Int32Array(0) }, n, k);
    const want = dequantize("Q6_K", src, n * k)!;
    assert.ok(viaQ6k.every((v, i) => v === want[i]), "dequantized q6_k != dequantized Q6_K");
    assert.deepEqual(q6kToQ6_K(q, n, k), src);
  }
  assert.throws(() => q6_KToQ6k(new Uint8Array(210), 1, 128), /k % 256 == 0/);
  assert.throws(() => q6_KToQ6k(new Uint8Array(209), 1, 256), /209 bytes are not Q6_K \[1, 256\]/);
});

test("Q6_K encoder: every element within half a step of its sub-block of 16", () => {
  const n = 4, k = 1024;
  const w = seededRandn(n * k, 7, 0.05);
  w.fill(0, 256, 512); // an all-zero super-block: d = 0
  for (let i = 512; i < 528; i++) w[i] = 0.3 + 0.001 * i; // a large positive-only sub-block next to small ones
  const src = quantizeQ6_K(w);
  const dq = dequantize("Q6_K", src, n * k)!;
  let sq = 0;
  for (let i = 0; i < w.length; i++) {
    const b = i >> 8;
    const d = dequantize("F16", src.subarray(b * 210 + 208, b * 210 + 210), 1)![0]!;
    const sc = (src[b * 210 + 192 + ((i % 256) >> 4)]! << 24) >> 24;
    const bound = (Math.abs(d * sc) / 2) * 1.0001 + 1e-9;
    assert.ok(Math.abs(w[i]! - dq[i]!) <= bound, `element ${i}: ${w[i]} -> ${dq[i]} (bound ${bound})`);
    sq += (w[i]! - dq[i]!) ** 2;
  }
  assert.ok(dq.subarray(256, 512).every((v) => v === 0), "zero block");
  // 6-bit on N(0, 0.05): rms error ~ step / sqrt(12) with step ~ 2.5 sigma / 31
  assert.ok(Math.sqrt(sq / w.length) < 0.0025, `rms error ${Math.sqrt(sq / w.length)}`);
  assert.throws(() => quantizeQ6_K(new Float32Array(100)), /multiple of 256/);
});

test("quant_matmul on repacked Q6_K == f32 matmul on the dequantized weight (within activation rounding)", { skip }, () => {
  const n = 37, k = 768;
  for (const m of [1, 5, 20]) {
    const src = randomQ6K((n * k) / 256, 8 + m);
    const q = q6_KToQ6k(src, n, k);
    const wdq = dequantize("Q6_K", src, n * k)!;
    const qw: QuantizedWeight = {
      scheme: "q6_k", outFeatures: n, inFeatures: k, rowSums: null,
      data: fromBytes(q.data, "uint8", [n, (k / 256) * 192]), scales: fromBytes(q.scales, "uint8", [n, (k / 256) * 18]),
    };
    const x = seededRandn(m * k, 9);
    expectWithinActivationRounding(qw, x, wdq, q6kMatmulRef(x, q, m, n, k), m, `M=${m} `);
  }
});

test("quantizeWeight(w, 'q6_k') runs the TS encoder (no native quantizer) and rejects in_features % 256 != 0", { skip }, () => {
  const n = 6, k = 256;
  const w = seededRandn(n * k, 10, 0.05);
  const q = quantizeWeight(tensor(w, { shape: [n, k] }), "q6_k");
  assert.deepEqual(q6kToQ6_K({ data: bytesOfTensor(q.data), scales: bytesOfTensor(q.scales) }, n, k), quantizeQ6_K(w));
  assert.throws(() => quantizeWeight(tensor(new Float32Array(2 * 320), { shape: [2, 320] }), "q6_k"), /q6_k needs in_features % 256 == 0, got 320/);
});

const IDS = [5, 77, 140, 31, 260, 9, 402, 18];
// every linear has in_features % 256 == 0 (hidden 256, intermediate 512, 8 heads of 32)
const Q6K_SHAPES = { hidden_size: 256, intermediate_size: 512, num_attention_heads: 8, num_key_value_heads: 4, tie_word_embeddings: true };

test("Q6_K GGUF export loads as q6_k without dequantizing (tied embedding and head in their blocks)", { skip, timeout: 60_000 }, () => {
  const dir = tinyModelDir("LlamaForCausalLM", { std: 0.05, overrides: Q6K_SHAPES });
  const file = tempPath("llama-q6_k.gguf");
  exportGguf(dir, file, "Q6_K");
  const g = readGguf(file);
  assert.equal(g.get("blk.0.attn_q.weight")!.type, "Q6_K");
  assert.equal(g.get("token_embd.weight")!.type, "Q6_K");
  assert.equal(g.get("blk.0.attn_norm.weight")!.type, "F32");
  const raw = new Map(g.tensors.map((t) => [t.name, g.load(t.name).slice()]));
  g.close();

  const notes: string[] = [];
  const direct = loadLocalModel(file, { onNote: (m) => notes.push(m) });
  assert.deepEqual(notes, [], "nothing requantized or dequantized");
  assert.equal(direct.quantization, "q6_k");
  for (const [name, layer] of linears(direct)) {
    const q = quantizedWeightOf(layer);
    assert.equal(q?.scheme, "q6_k", `${name} is q6_k`);
    if (name === "model.layers.1.mlp.down_proj") {
      const want = q6_KToQ6k(raw.get("blk.1.ffn_down.weight")!, layer.outFeatures, layer.inFeatures);
      assert.deepEqual(bytesOfTensor(q!.data), want.data);
      assert.deepEqual(bytesOfTensor(q!.scales), want.scales);
    }
  }
  // the token embedding is the blocks themselves (a placeholder parameter), read by lookups and the tied head alike
  const emb = direct.model.model.embedTokens.weight;
  assert.equal(quantizedShadowOf(emb)?.scheme, "q6_k");
  assert.ok(emb.strides.every((s) => s === 0), "placeholder parameter");
  const floats = loadLocalModel(file, { ggufKeepQuantized: false });
  assert.equal(floats.quantization, null);
  const ids = tensor(Int32Array.of(0, 3, 300, 511));
  const got = noGrad(() => direct.model.model.embedTokens.forward(ids).dataSync() as Float32Array);
  const want = noGrad(() => floats.model.model.embedTokens.forward(ids).dataSync() as Float32Array);
  assert.deepEqual(Array.from(got), Array.from(want), "lookups equal the dequantized table's bit for bit");
  const a = lastLogits(direct, IDS);
  const b = lastLogits(floats, IDS);
  assert.ok(maxAbsDiff(a, b) <= 0.03 * maxAbs(b), `q6_k vs dequantized Q6_K: max logit error ${maxAbsDiff(a, b)} vs range ${maxAbs(b)}`);
});

test("a Q4_K_M export (llama.cpp's recipe: Q4_K, Q6_K output and some attn_v / ffn_down) runs each tensor in its kernel and agrees with llama.cpp", { skip: skip || (hasLlamaCpp ? false : "node-llama-cpp not installed"), timeout: 120_000 }, async (t) => {
  const file = tempPath("llama-q4_k_m.gguf");
  exportGguf(tinyModelDir("LlamaForCausalLM", { overrides: { ...Q6K_SHAPES, num_hidden_layers: 8, tie_word_embeddings: false } }), file, "Q4_K_M");
  const g = readGguf(file);
  // use_more_bits(i, 8): i < 1, i >= 7, or (i - 1) % 3 == 2
  const more = new Set([0, 3, 6, 7]);
  assert.equal(g.get("output.weight")!.type, "Q6_K");
  assert.equal(g.get("token_embd.weight")!.type, "Q4_K");
  for (let i = 0; i < 8; i++) {
    for (const part of ["attn_v", "ffn_down"]) assert.equal(g.get(`blk.${i}.${part}.weight`)!.type, more.has(i) ? "Q6_K" : "Q4_K", `blk.${i}.${part}`);
    assert.equal(g.get(`blk.${i}.attn_q.weight`)!.type, "Q4_K");
  }
  g.close();
  const notes: string[] = [];
  const m = loadLocalModel(file, { onNote: (n) => notes.push(n) });
  assert.deepEqual(notes, []);
  for (const [name, layer] of linears(m)) {
    const six = name === "lm_head" || [...more].some((i) => name === `model.layers.${i}.self_attn.v_proj` || name === `model.layers.${i}.mlp.down_proj`);
    assert.equal(quantizedWeightOf(layer)?.scheme, six ? "q6_k" : "q4_k", name);
  }
  // 8 layers of int8-rounded activations drift further from the f32 load (measured 7% of the range) than from
  // llama.cpp, which rounds its activations too
  await expectLlamaCppAgreement(t, "Q4_K_M", file, m, IDS, { tolerance: 0.1, vsLlamaCpp: 0.06 });
});

test("Q6_K loaded as q6_k matches llama.cpp on the same file: logits and greedy tokens (outside oracle)", { skip: skip || (hasLlamaCpp ? false : "node-llama-cpp not installed"), timeout: 120_000 }, async (t) => {
  const file = tempPath("LlamaForCausalLM-Q6_K.gguf");
  exportGguf(tinyModelDir("LlamaForCausalLM", { overrides: Q6K_SHAPES }), file, "Q6_K");
  const direct = loadLocalModel(file);
  assert.equal(linears(direct).every(([, l]) => quantizedWeightOf(l)?.scheme === "q6_k"), true);
  await expectLlamaCppAgreement(t, "Q6_K", file, direct, IDS);
});
