// GGUF Q5_K loads straight into Kiln's q5_k layout (native/quant.h: qs and qh as they are, the 12 packed scale bytes
// unpacked as Q4_K's), and Kiln's Q5_K encoder writes files llama.cpp reads. Oracles: gguf-quant.ts's Q5_K
// dequantizer (ggml's dequantize_row_q5_K), the f32 model on the dequantized weights, and llama.cpp on the same file.
import assert from "node:assert/strict";
import { test } from "node:test";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { dequantizeRef, floatToHalf, nativeTakesScheme } from "../../src/backends/cpu/quant-reference.js";
import { dequantize, quantizeQ5_K } from "../../src/models/formats/gguf-quant.js";
import { q5_KToQ5k, q5kToQ5_K } from "../../src/models/formats/gguf-repack.js";
import { readGguf, writeGguf, type GgufWriteTensor } from "../../src/models/formats/gguf.js";
import { exportGguf } from "../../src/models/init-model.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { quantizedWeightOf } from "../../src/nn/quantized-linear.js";
import { tensor } from "../../src/tensor/index.js";
import { quantizedShadowOf, quantizeWeight } from "../../src/tensor/ops/linalg.js";
import { mulberry32 } from "../../src/util/random.js";
import { expectLlamaCppAgreement, hasLlamaCpp } from "../helpers/llama-cpp.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";
import { bytesOfTensor, lastLogits, linears, maxAbs, maxAbsDiff, seededRandn } from "../helpers/model-logits.js";

const native = tryLoadNativeKernels();
const skip = !native ? "native addon not built" : nativeTakesScheme(native, "q5_k") ? false : "native addon lacks q5_k";

/** Random Q5_K super-blocks: every code, 6-bit scale and min, fifth bit; d and dmin of both signs ~1e-4. */
function randomQ5K(blocks: number, seed: number): Uint8Array {
  const u = mulberry32(seed);
  const out = new Uint8Array(blocks * 176);
  for (let i = 0; i < out.length; i++) out[i] = Math.floor(u() * 256);
  for (let b = 0; b < blocks; b++)
    for (const o of [0, 2]) {
      const d = floatToHalf((u() < 0.5 ? -1 : 1) * (5e-5 + 5e-5 * u()));
      out[b * 176 + o] = d & 255;
      out[b * 176 + o + 1] = d >> 8;
    }
  return out;
}

test("Q5_K -> q5_k repack: qs then qh, scales unpacked; dequantizes bit-exactly, inverts", () => {
  const n = 3, k = 512;
  for (const src of [randomQ5K((n * k) / 256, 5), quantizeQ5_K(seededRandn(n * k, 6, 0.05))]) {
    const q = q5_KToQ5k(src, n, k);
    for (let b = 0; b < (n * k) / 256; b++) {
      assert.deepEqual(q.data.subarray(b * 160, b * 160 + 128), src.subarray(b * 176 + 48, b * 176 + 176), "qs");
      assert.deepEqual(q.data.subarray(b * 160 + 128, b * 160 + 160), src.subarray(b * 176 + 16, b * 176 + 48), "qh");
      assert.deepEqual(q.scales.subarray(b * 20, b * 20 + 4), src.subarray(b * 176, b * 176 + 4), "d, dmin");
    }
    const viaQ5k = dequantizeRef("q5_k", { ...q, rowSums: new Int32Array(0) }, n, k);
    const want = dequantize("Q5_K", src, n * k)!;
    assert.ok(viaQ5k.every((v, i) => v === want[i]), "dequantized q5_k != dequantized Q5_K");
    assert.deepEqual(q5kToQ5_K(q, n, k), src);
  }
  assert.throws(() => q5_KToQ5k(new Uint8Array(176), 1, 128), /k % 256 == 0/);
  assert.throws(() => q5_KToQ5k(new Uint8Array(175), 1, 256), /175 bytes are not Q5_K \[1, 256\]/);
});

test("Q5_K encoder: every element within half a step of its sub-block (or dmin/2 below the stored min)", () => {
  const n = 4, k = 1024;
  const w = seededRandn(n * k, 7, 0.05);
  w.fill(0, 256, 512); // an all-zero super-block
  const src = quantizeQ5_K(w);
  const dq = dequantize("Q5_K", src, n * k)!;
  const q = q5_KToQ5k(src, n, k);
  let sq = 0;
  for (let i = 0; i < w.length; i++) {
    const b = i >> 8;
    const j = (i % 256) >> 5;
    const [d, dmin] = [dequantize("F16", q.scales.subarray(b * 20, b * 20 + 2), 1)![0]!, dequantize("F16", q.scales.subarray(b * 20 + 2, b * 20 + 4), 1)![0]!];
    const bound = Math.max((d * q.scales[b * 20 + 4 + j]!) / 2, dmin / 2) * 1.0001 + 1e-7;
    assert.ok(Math.abs(w[i]! - dq[i]!) <= bound, `element ${i}: ${w[i]} -> ${dq[i]} (bound ${bound})`);
    sq += (w[i]! - dq[i]!) ** 2;
  }
  assert.ok(dq.subarray(256, 512).every((v) => v === 0), "zero block");
  // 5-bit on N(0, 0.05): rms error ~ step / sqrt(12) with step ~ 6 sigma / 31
  assert.ok(Math.sqrt(sq / w.length) < 0.006, `rms error ${Math.sqrt(sq / w.length)}`);
  // quantizeWeight runs the same TS encoder (no native quantizer)
  const qw = quantizeWeight(tensor(w.subarray(0, 2 * k), { shape: [2, k] }), "q5_k");
  assert.deepEqual(q5kToQ5_K({ data: bytesOfTensor(qw.data), scales: bytesOfTensor(qw.scales) }, 2, k), quantizeQ5_K(w.subarray(0, 2 * k)));
  assert.throws(() => quantizeQ5_K(new Float32Array(100)), /multiple of 256/);
});

const IDS = [5, 77, 140, 31, 260, 9, 402, 18];
const SHAPES = { hidden_size: 256, intermediate_size: 512, num_attention_heads: 8, num_key_value_heads: 4, tie_word_embeddings: true };

test("Q5_K GGUF export loads as q5_k without dequantizing; a Q5_K_M-style file runs Q5_K and Q6_K in their kernels", { skip, timeout: 60_000 }, () => {
  const file = tempPath("llama-q5_k.gguf");
  exportGguf(tinyModelDir("LlamaForCausalLM", { std: 0.05, overrides: SHAPES }), file, "Q5_K");
  const g = readGguf(file);
  assert.equal(g.get("blk.0.attn_q.weight")!.type, "Q5_K");
  const raw = new Map(g.tensors.map((t) => [t.name, g.load(t.name).slice()]));
  const notes: string[] = [];
  const direct = loadLocalModel(file, { onNote: (m) => notes.push(m) });
  assert.deepEqual(notes, []);
  assert.equal(direct.quantization, "q5_k");
  for (const [name, layer] of linears(direct)) {
    assert.equal(quantizedWeightOf(layer)?.scheme, "q5_k", name);
    if (name === "model.layers.1.mlp.down_proj") {
      const want = q5_KToQ5k(raw.get("blk.1.ffn_down.weight")!, layer.outFeatures, layer.inFeatures);
      assert.deepEqual(bytesOfTensor(quantizedWeightOf(layer)!.data), want.data);
    }
  }
  assert.equal(quantizedShadowOf(direct.model.model.embedTokens.weight)?.scheme, "q5_k");
  const floats = loadLocalModel(file, { ggufKeepQuantized: false });
  let a = lastLogits(direct, IDS);
  let b = lastLogits(floats, IDS);
  assert.ok(maxAbsDiff(a, b) <= 0.03 * maxAbs(b), `q5_k vs dequantized Q5_K: max logit error ${maxAbsDiff(a, b)} vs range ${maxAbs(b)}`);

  // Q5_K_M: llama.cpp keeps some ffn_down (and the output) at Q6_K
  const tensors: GgufWriteTensor[] = g.tensors.map((t) =>
    t.name === "blk.0.ffn_down.weight" ? { name: t.name, shape: t.shape, type: "Q6_K", data: dequantize(t.type, g.load(t.name), t.shape.reduce((x, y) => x * y, 1))! }
    : { name: t.name, shape: t.shape, type: t.type, raw: g.load(t.name).slice() });
  const mixed = tempPath("llama-q5_k-m.gguf");
  writeGguf(mixed, g.typedMetadata(), tensors);
  g.close();
  const m = loadLocalModel(mixed);
  for (const [name, layer] of linears(m)) assert.equal(quantizedWeightOf(layer)?.scheme, name === "model.layers.0.mlp.down_proj" ? "q6_k" : "q5_k", name);
  a = lastLogits(m, IDS);
  b = lastLogits(loadLocalModel(mixed, { ggufKeepQuantized: false }), IDS);
  assert.ok(maxAbsDiff(a, b) <= 0.03 * maxAbs(b), `mixed q5_k/q6_k vs dequantized: ${maxAbsDiff(a, b)} vs range ${maxAbs(b)}`);
});

test("Q5_K loaded as q5_k matches llama.cpp on the same file: logits and greedy tokens (outside oracle)", { skip: skip || (hasLlamaCpp ? false : "node-llama-cpp not installed"), timeout: 120_000 }, async (t) => {
  const file = tempPath("LlamaForCausalLM-Q5_K.gguf");
  exportGguf(tinyModelDir("LlamaForCausalLM", { overrides: SHAPES }), file, "Q5_K");
  const direct = loadLocalModel(file);
  assert.equal(linears(direct).every(([, l]) => quantizedWeightOf(l)?.scheme === "q5_k"), true);
  await expectLlamaCppAgreement(t, "Q5_K", file, direct, IDS);
});
