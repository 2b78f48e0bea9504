// GGUF Q4_K loads straight into Kiln's q4_k layout (native/quant.h: codes as they are, the 12 packed scale bytes
// unpacked), and Kiln's Q4_K encoder writes files llama.cpp reads. Oracles: gguf-quant.ts's Q4_K dequantizer
// (ggml's dequantize_row_q4_K), the f32 matmul on the dequantized weight, and llama.cpp on the same file.
import assert from "node:assert/strict";
import { test } from "node:test";
import { q4kMatmulRef } from "../../src/backends/cpu/q4k-reference.js";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { dequantizeRef, nativeTakesScheme } from "../../src/backends/cpu/quant-reference.js";
import { dequantize, quantizeQ4_K } from "../../src/models/formats/gguf-quant.js";
import { q4_KToQ4k, q4kToQ4_K } from "../../src/models/formats/gguf-repack.js";
import { readGguf } from "../../src/models/formats/gguf.js";
import type { Architecture } from "../../src/models/hf-config.js";
import { exportGguf } from "../../src/models/init-model.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { Linear } from "../../src/nn/layers.js";
import { quantizedWeightOf } from "../../src/nn/quantized-linear.js";
import { fromBytes, tensor } from "../../src/tensor/index.js";
import { quantizedShadowOf, quantizeWeight, type QuantizedWeight } from "../../src/tensor/ops/linalg.js";
import { mulberry32 } from "../../src/util/random.js";
import { expectLlamaCppAgreement, hasLlamaCpp } from "../helpers/llama-cpp.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";
import { bytesOfTensor, expectWithinActivationRounding, lastLogits, linears, maxAbs, maxAbsDiff, seededRandn } from "../helpers/model-logits.js";

const native = tryLoadNativeKernels();
const skip = !native ? "native addon not built" : nativeTakesScheme(native, "q4_k") ? false : "native addon lacks q4_k";


/** Random Q4_K super-blocks: every code and 6-bit scale / min, finite f16 d and dmin of both signs. */
function randomQ4K(blocks: number, seed: number): Uint8Array {
  const u = mulberry32(seed);
  const out = new Uint8Array(blocks * 144);
  for (let i = 0; i < out.length; i++) out[i] = Math.floor(u() * 256);
  for (let b = 0; b < blocks; b++) {
    out[b * 144 + 1]! &= 0x9b; // d: exponent < 31 (finite) and small; either sign
    out[b * 144 + 3]! &= 0x1b; // dmin: finite, small
  }
  return out;
}

/** ggml's get_scale_min_k4, written from its definition: the j-th (scale, min) of a block's 12 bytes at o. */
function scaleMin(src: Uint8Array, o: number, j: number): [number, number] {
  if (j < 4) return [src[o + j]! & 63, src[o + j + 4]! & 63];
  return [(src[o + j + 4]! & 15) | ((src[o + j - 4]! >> 6) << 4), (src[o + j + 4]! >> 4) | ((src[o + j]! >> 6) << 4)];
}


test("Q4_K -> q4_k repack: scales and mins unpacked as get_scale_min_k4, dequantizes bit-exactly, inverts", () => {
  const n = 3, k = 512;
  for (const src of [randomQ4K((n * k) / 256, 5), quantizeQ4_K(seededRandn(n * k, 6, 0.05))]) {
    const q = q4_KToQ4k(src, n, k);
    for (let b = 0; b < (n * k) / 256; b++) {
      assert.deepEqual(q.scales.subarray(b * 20, b * 20 + 4), src.subarray(b * 144, b * 144 + 4), "d, dmin");
      for (let j = 0; j < 8; j++) {
        const [sc, m] = scaleMin(src, b * 144 + 4, j);
        assert.equal(q.scales[b * 20 + 4 + j], sc, `block ${b} scale ${j}`);
        assert.equal(q.scales[b * 20 + 12 + j], m, `block ${b} min ${j}`);
      }
      assert.deepEqual(q.data.subarray(b * 128, b * 128 + 128), src.subarray(b * 144 + 16, b * 144 + 144), "codes as they are");
    }
    const viaQ4k = dequantizeRef("q4_k", { ...q, rowSums: new Int32Array(0) }, n, k);
    const want = dequantize("Q4_K", src, n * k)!;
    assert.ok(viaQ4k.every((v, i) => v === want[i]), "dequantized q4_k != dequantized Q4_K");
    assert.deepEqual(q4kToQ4_K(q, n, k), src);
  }
  assert.throws(() => q4_KToQ4k(new Uint8Array(144), 1, 128), /k % 256 == 0/);
});

test("Q4_K encoder: every element within half a step of its sub-block (or dmin/2 below the stored min)", () => {
  const n = 4, k = 1024;
  const w = seededRandn(n * k, 7, 0.05);
  w.fill(0, 256, 512); // an all-zero super-block: d = dmin = 0
  for (let i = 512; i < 544; i++) w[i] = 0.3 + 0.001 * i; // a positive-only sub-block (min 0) next to small ones
  const src = quantizeQ4_K(w);
  const dq = dequantize("Q4_K", src, n * k)!;
  const q = q4_KToQ4k(src, n, k);
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
  // 4-bit on N(0, 0.05): rms error ~ step / sqrt(12) with step ~ 6 sigma / 15
  assert.ok(Math.sqrt(sq / w.length) < 0.012, `rms error ${Math.sqrt(sq / w.length)}`);
  assert.throws(() => quantizeQ4_K(new Float32Array(100)), /multiple of 256/);
});

test("quant_matmul on repacked Q4_K == f32 matmul on the dequantized weight (within activation rounding)", { skip }, () => {
  const n = 37, k = 768, m = 5;
  const src = randomQ4K((n * k) / 256, 8);
  const q = q4_KToQ4k(src, n, k);
  const wdq = dequantize("Q4_K", src, n * k)!;
  const qw: QuantizedWeight = {
    scheme: "q4_k", outFeatures: n, inFeatures: k, rowSums: null,
    data: fromBytes(q.data, "uint8", [n, k / 2]), scales: fromBytes(q.scales, "uint8", [n, (k / 256) * 20]),
  };
  const x = seededRandn(m * k, 9);
  expectWithinActivationRounding(qw, x, wdq, q4kMatmulRef(x, q, m, n, k), m);
});

test("quantizeWeight(w, 'q4_k') runs the TS encoder (no native quantizer) and rejects in_features % 256 != 0", { skip }, () => {
  const n = 6, k = 256;
  const w = seededRandn(n * k, 10, 0.05);
  const q = quantizeWeight(tensor(w, { shape: [n, k] }), "q4_k");
  assert.deepEqual(q4kToQ4_K({ data: bytesOfTensor(q.data), scales: bytesOfTensor(q.scales) }, n, k), quantizeQ4_K(w));
  assert.throws(() => quantizeWeight(tensor(new Float32Array(2 * 320), { shape: [2, 320] }), "q4_k"), /q4_k needs in_features % 256 == 0, got 320/);
  assert.throws(() => native!.quantMatmul(new Float32Array(320), new Uint8Array(160), new Uint8Array(25), new Int32Array(0), new Float32Array(1), 1, 1, 320, 4), /multiple of 256/);
  assert.throws(() => native!.quantizeWeights(w, n, k, 4, new Uint8Array(768), new Uint8Array(120), new Int32Array(0)), /no native quantizer/);
});

const IDS = [5, 77, 140, 31, 260, 9, 402, 18];
// every linear has in_features % 256 == 0 (hidden 256, intermediate 512, 8 heads of 32)
const Q4K_SHAPES = { hidden_size: 256, intermediate_size: 512, num_attention_heads: 8, num_key_value_heads: 4, tie_word_embeddings: true };

test("Q4_K GGUF export loads as q4_k without dequantizing (tied head included)", { skip, timeout: 60_000 }, () => {
  const dir = tinyModelDir("LlamaForCausalLM", { std: 0.05, overrides: Q4K_SHAPES });
  const file = tempPath("llama-q4_k.gguf");
  exportGguf(dir, file, "Q4_K");
  const g = readGguf(file);
  assert.equal(g.get("blk.0.attn_q.weight")!.type, "Q4_K");
  assert.equal(g.get("blk.1.ffn_down.weight")!.type, "Q4_K");
  assert.equal(g.get("token_embd.weight")!.type, "Q4_K");
  assert.equal(g.get("blk.0.attn_norm.weight")!.type, "F32");
  const raw = new Map(g.tensors.map((t) => [t.name, g.load(t.name).slice()]));
  g.close();

  const direct = loadLocalModel(file);
  assert.equal(direct.quantization, "q4_k");
  for (const [name, layer] of linears(direct)) {
    const q = quantizedWeightOf(layer);
    assert.equal(q?.scheme, "q4_k", `${name} is q4_k`);
    if (name === "model.layers.1.mlp.down_proj") {
      const want = q4_KToQ4k(raw.get("blk.1.ffn_down.weight")!, layer.outFeatures, layer.inFeatures);
      assert.deepEqual(bytesOfTensor(q!.data), want.data);
      assert.deepEqual(bytesOfTensor(q!.scales), want.scales);
    }
  }
  assert.equal(quantizedShadowOf(direct.model.model.embedTokens.weight)?.scheme, "q4_k");
  const floats = loadLocalModel(file, { ggufKeepQuantized: false });
  assert.equal(floats.quantization, null);
  const a = lastLogits(direct, IDS);
  const b = lastLogits(floats, IDS);
  assert.ok(maxAbsDiff(a, b) <= 0.03 * maxAbs(b), `q4_k vs dequantized Q4_K: max logit error ${maxAbsDiff(a, b)} vs range ${maxAbs(b)}`);
});

test("Q4_K export: matrices with in_features % 256 != 0 fall back to Q4_0 and load as int4; ggufKeepQuantized: false dequantizes", { skip, timeout: 60_000 }, () => {
  // intermediate 320: gate/up (in 256) are Q4_K, down_proj (in 320) is written as Q4_0 and loads as int4
  const dir = tinyModelDir("LlamaForCausalLM", { std: 0.05, overrides: { ...Q4K_SHAPES, intermediate_size: 320 } });
  const file = tempPath("llama-q4_k-i320.gguf");
  exportGguf(dir, file, "Q4_K");
  const g = readGguf(file);
  assert.equal(g.get("blk.0.ffn_down.weight")!.type, "Q4_0");
  assert.equal(g.get("blk.0.ffn_up.weight")!.type, "Q4_K");
  const upRaw = g.load("blk.0.ffn_up.weight").slice();
  g.close();
  const notes: string[] = [];
  const m = loadLocalModel(file, { onNote: (s) => notes.push(s) });
  assert.deepEqual(notes, []);
  for (const [name, layer] of linears(m)) assert.equal(quantizedWeightOf(layer)?.scheme, name.endsWith("down_proj") ? "int4" : "q4_k", name);
  const floats = loadLocalModel(file, { ggufKeepQuantized: false });
  assert.equal(linears(floats).some(([, l]) => quantizedWeightOf(l)), false);
  const up = floats.model.namedModules().find(([n]) => n === "model.layers.0.mlp.up_proj")![1] as Linear;
  assert.deepEqual(up.weight.dataSync(), dequantize("Q4_K", upRaw, up.outFeatures * up.inFeatures));
  const a = lastLogits(m, IDS);
  const b = lastLogits(floats, IDS);
  assert.ok(maxAbsDiff(a, b) <= 0.03 * maxAbs(b), `mixed q4_k/int4 vs dequantized: ${maxAbsDiff(a, b)} vs range ${maxAbs(b)}`);
});

test("Q4_K loaded as q4_k matches llama.cpp on the same file: logits and greedy tokens (outside oracle)", { skip: skip || (hasLlamaCpp ? false : "node-llama-cpp not installed"), timeout: 120_000 }, async (t) => {
  const cases: [Architecture, Record<string, unknown>][] = [
    ["LlamaForCausalLM", Q4K_SHAPES],
    // stacked experts split per expert; every in_features is 256, so a row of x is one Q8_K block and both engines
    // round activations identically: the same integer dot products, logits equal up to f32 summation order
    ["MixtralForCausalLM", { ...Q4K_SHAPES, intermediate_size: 256 }],
  ];
  for (const [arch, overrides] of cases) {
    const file = tempPath(`${arch}-Q4_K.gguf`);
    exportGguf(tinyModelDir(arch, { overrides }), file, "Q4_K");
    const direct = loadLocalModel(file);
    assert.equal(linears(direct).every(([, l]) => quantizedWeightOf(l)?.scheme === "q4_k"), true);
    await expectLlamaCppAgreement(t, `${arch} Q4_K`, file, direct, IDS, { vsLlamaCpp: arch === "MixtralForCausalLM" ? 1e-4 : 0.06 });
  }
});
