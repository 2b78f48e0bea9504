// GGUF Q3_K, IQ4_NL and IQ4_XS (llama.cpp's Q3_K_M / IQ4_XS files) dequantize as ggml does; Q3_K loads requantized
// to int8_g32, IQ4_NL as it is and IQ4_XS as iq4_nl (the iq4_nl kernels; its scales rounded to f16). Oracles: each block type decoded here a second way (Q3_K's scales through ggml's 32-bit kmask
// arithmetic, element positions from the block structs' field order), and llama.cpp running the same file.
import assert from "node:assert/strict";
import { test } from "node:test";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { dequantizeRef, floatToHalf, halfToFloat, nativeTakesScheme, quantizeWeightsRef } from "../../src/backends/cpu/quant-reference.js";
import { iq4_xsToIq4Nl } from "../../src/models/formats/gguf-repack.js";
import { dequantize } from "../../src/models/formats/gguf-quant.js";
import { readGguf, writeGguf, type GgufWriteTensor } from "../../src/models/formats/gguf.js";
import { exportGguf } from "../../src/models/init-model.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { quantizedWeightOf } from "../../src/nn/quantized-linear.js";
import type { Embedding } from "../../src/nn/layers.js";
import { quantizedShadowOf } from "../../src/tensor/ops/linalg.js";
import { mulberry32 } from "../../src/util/random.js";
import { hasLlamaCpp, llamaCppOracle, logprobGaps, logSoftmax } from "../helpers/llama-cpp.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";
import { lastLogits, maxAbs, maxAbsDiff } from "../helpers/model-logits.js";

const native = tryLoadNativeKernels();
const skip = !native ? "native addon not built" : nativeTakesScheme(native, "int8_g32") ? false : "native addon lacks int8_g32";

const KV = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/** Random blocks of `bytes`, with the f16 scale at `dAt` set to ~`mag` of either sign. */
function randomBlocks(blocks: number, bytes: number, dAt: number, mag: number, seed: number): Uint8Array {
  const u = mulberry32(seed);
  const out = new Uint8Array(blocks * bytes);
  for (let i = 0; i < out.length; i++) out[i] = Math.floor(u() * 256);
  for (let b = 0; b < blocks; b++) {
    const d = floatToHalf((u() < 0.5 ? -1 : 1) * mag * (1 + u()));
    out[b * bytes + dAt] = d & 255;
    out[b * bytes + dAt + 1] = d >> 8;
  }
  return out;
}

/** Q3_K block `b`, decoded as ggml's dequantize_row_q3_K does: the 12 scale bytes as three u32 with kmask1/kmask2. */
function q3kBlock(src: Uint8Array, b: number): Float64Array {
  const o = b * 110;
  const dv = new DataView(src.buffer, src.byteOffset + o + 96, 12);
  const a = [dv.getUint32(0, true), dv.getUint32(4, true), dv.getUint32(8, true)];
  const k1 = 0x03030303, k2 = 0x0f0f0f0f;
  const aux = [(a[0]! & k2) | ((a[2]! & k1) << 4), (a[1]! & k2) | (((a[2]! >>> 2) & k1) << 4), ((a[0]! >>> 4) & k2) | (((a[2]! >>> 4) & k1) << 4), ((a[1]! >>> 4) & k2) | (((a[2]! >>> 6) & k1) << 4)];
  const scales = new Int8Array(new Uint32Array(aux.map((x) => x >>> 0)).buffer);
  const d = halfToFloat(src[o + 108]! | (src[o + 109]! << 8));
  const y = new Float64Array(256);
  let yi = 0, is = 0, m = 1;
  for (let n = 0; n < 256; n += 128) {
    const q = o + 32 + (n / 128) * 32;
    for (let shift = 0; shift < 8; shift += 2, m <<= 1)
      for (const half of [0, 16]) {
        const dl = d * (scales[is++]! - 32);
        for (let l = half; l < half + 16; l++) y[yi++] = dl * (((src[q + l]! >> shift) & 3) - (src[o + l]! & m ? 0 : 4));
      }
  }
  return y;
}

test("Q3_K, IQ4_NL and IQ4_XS dequantize as ggml's definitions (decoded a second way here)", () => {
  const q3 = randomBlocks(6, 110, 108, 1e-3, 1);
  const want3 = Array.from({ length: 6 }, (_, b) => Array.from(q3kBlock(q3, b))).flat();
  assert.deepEqual(Array.from(dequantize("Q3_K", q3, 6 * 256)!), want3.map(Math.fround));

  const nl = randomBlocks(8, 18, 0, 1e-2, 2);
  const gotNl = dequantize("IQ4_NL", nl, 8 * 32)!;
  for (let b = 0; b < 8; b++) {
    const d = halfToFloat(nl[b * 18]! | (nl[b * 18 + 1]! << 8));
    for (let e = 0; e < 32; e++) assert.equal(gotNl[b * 32 + e], Math.fround(d * KV[e < 16 ? nl[b * 18 + 2 + e]! & 15 : nl[b * 18 + 2 + e - 16]! >> 4]!), `IQ4_NL ${b}:${e}`);
  }

  const xs = randomBlocks(3, 136, 0, 1e-3, 3);
  const gotXs = dequantize("IQ4_XS", xs, 3 * 256)!;
  for (let b = 0; b < 3; b++) {
    const o = b * 136;
    const d = halfToFloat(xs[o]! | (xs[o + 1]! << 8));
    for (let e = 0; e < 256; e++) {
      const sub = e >> 5; // sub-block of 32: 6-bit scale, low 4 bits in scales_l, top 2 in scales_h
      const low = sub % 2 === 0 ? xs[o + 4 + sub / 2]! & 15 : xs[o + 4 + (sub - 1) / 2]! >> 4;
      const high = ((xs[o + 2]! | (xs[o + 3]! << 8)) >> (2 * sub)) & 3;
      const byte = xs[o + 8 + 16 * sub + (e % 16)]!;
      const code = e % 32 < 16 ? byte & 15 : byte >> 4;
      assert.equal(gotXs[b * 256 + e], Math.fround(d * ((low | (high << 4)) - 32) * KV[code]!), `IQ4_XS ${b}:${e}`);
    }
  }
});

test("IQ4_XS -> iq4_nl: the codes moved as they are, each 32's scale d * (ls - 32) within 2^-11 relative of ggml's", () => {
  const blocks = 12;
  const src = randomBlocks(blocks, 136, 0, 2e-5, 61);
  const q = iq4_xsToIq4Nl(src, 3, 1024);
  const got = dequantizeRef("iq4_nl", { ...q, rowSums: new Int32Array(0) }, 3, 1024);
  const want = dequantize("IQ4_XS", src, blocks * 256)!;
  let exact = 0;
  for (let i = 0; i < want.length; i++) {
    assert.ok(Math.abs(got[i]! - want[i]!) <= Math.abs(want[i]!) * 2 ** -11, `element ${i}: ${got[i]} vs ${want[i]}`);
    if (got[i] === want[i]) exact++;
  }
  // most scales need more than f16's 11 bits (a wrong sub-block order or scale bit would be off by far more)
  assert.ok(exact < want.length, "every element exact: the rounding is not exercised");
  assert.throws(() => iq4_xsToIq4Nl(new Uint8Array(136), 1, 128), /k % 256 == 0/);
});

const IDS = [5, 77, 140, 31, 260, 9, 402, 18];
// every matrix has in_features % 256 == 0 (hidden 256, intermediate 512)
const SHAPES = { hidden_size: 256, intermediate_size: 512, num_attention_heads: 8, num_key_value_heads: 4, tie_word_embeddings: false };

test("a GGUF of Q3_K matrices loads requantized to int8_g32, IQ4_NL as it is, IQ4_XS as iq4_nl, noted, and agrees with llama.cpp on it (outside oracle)", { skip: skip || (hasLlamaCpp ? false : "node-llama-cpp not installed"), timeout: 120_000 }, async (t) => {
  const q8 = tempPath("lowbit-q8.gguf");
  exportGguf(tinyModelDir("LlamaForCausalLM", { std: 0.05, overrides: SHAPES }), q8, "Q8_0");
  const g = readGguf(q8);
  const kinds: Record<string, [string, number, number, number, number]> = {
    // type, bytes per block, elements per block, f16 d offset, d magnitude (values of ~std 0.05)
    "output.weight": ["Q3_K", 110, 256, 108, 4e-4],
    "blk.0.ffn_down.weight": ["IQ4_XS", 136, 256, 0, 2e-5],
    "blk.1.attn_q.weight": ["IQ4_NL", 18, 32, 0, 5e-4],
    "token_embd.weight": ["IQ4_NL", 18, 32, 0, 5e-4], // looked up through the iq4_nl rows' dequantization
    "blk.1.ffn_up.weight": ["Q3_K", 110, 256, 108, 4e-4],
  };
  const tensors: GgufWriteTensor[] = g.tensors.map((ti, i) => {
    const kind = kinds[ti.name];
    if (!kind) return { name: ti.name, shape: ti.shape, type: ti.type, raw: g.load(ti.name).slice() };
    const [type, bytes, elems, dAt, mag] = kind;
    return { name: ti.name, shape: ti.shape, type: type as "Q3_K", raw: randomBlocks(ti.numel / elems, bytes, dAt, mag, 50 + i) };
  });
  const file = tempPath("lowbit.gguf");
  writeGguf(file, g.typedMetadata(), tensors);
  g.close();

  const notes: string[] = [];
  const direct = loadLocalModel(file, { onNote: (m) => notes.push(m) });
  assert.ok(notes.some((m) => m.includes("Q3_K (no Q3_K kernel) requantized to int8_g32")), notes.join("\n"));
  assert.ok(notes.some((m) => m.includes("1 tensor(s) IQ4_XS (no IQ4_XS kernel) run as iq4_nl, each 32 weights' scale d * (ls - 32) rounded to f16")), notes.join("\n"));
  assert.ok(!notes.some((m) => m.includes("IQ4_NL")), notes.join("\n"));
  for (const [name, scheme] of [["lm_head", "int8_g32"], ["model.layers.0.mlp.down_proj", "iq4_nl"], ["model.layers.1.self_attn.q_proj", "iq4_nl"]]) {
    const layer = direct.model.namedModules().find(([n]) => n === name)![1] as Parameters<typeof quantizedWeightOf>[0];
    assert.equal(quantizedWeightOf(layer)?.scheme, scheme, name);
  }
  assert.equal(quantizedShadowOf((direct.model as unknown as { model: { embedTokens: Embedding } }).model.embedTokens.weight)?.scheme, "iq4_nl", "the token embedding");
  const floats = loadLocalModel(file, { ggufKeepQuantized: false });
  const a = lastLogits(direct, IDS);
  const b = lastLogits(floats, IDS);
  assert.ok(maxAbsDiff(a, b) <= 0.06 * maxAbs(b), `requantized vs dequantized: ${maxAbsDiff(a, b)} vs range ${maxAbs(b)}`);
  const { probs } = await llamaCppOracle(file, IDS, 0);
  const { dLc, dFloat, scale, compared } = logprobGaps(probs, logSoftmax(a), logSoftmax(b));
  // a misdecoded block type (the head's above all) would be off by the whole range
  assert.ok(dLc < 0.06 * scale, `vs llama.cpp ${dLc} (range ${scale})`);
  t.diagnostic(`Q3_K/IQ4_XS/IQ4_NL: max |logprob diff| requantized vs llama.cpp ${dLc.toExponential(2)} over ${compared} tokens, vs dequantized f32 ${dFloat.toExponential(2)} (range ${scale.toFixed(1)})`);
});

test("an IQ4_NL export loads into the iq4_nl kernels, its blocks Kiln's encoder's, and agrees with llama.cpp on it (outside oracle)", { skip: skip || (hasLlamaCpp ? false : "node-llama-cpp not installed"), timeout: 120_000 }, async (t) => {
  const dir = tinyModelDir("LlamaForCausalLM", { std: 0.05, overrides: SHAPES });
  const file = tempPath("export-iq4nl.gguf");
  exportGguf(dir, file, "IQ4_NL");
  const g = readGguf(file);
  assert.equal(g.get("blk.0.ffn_down.weight")!.type, "IQ4_NL");
  const raw = g.load("blk.0.ffn_down.weight").slice();
  g.close();
  const notes: string[] = [];
  const direct = loadLocalModel(file, { onNote: (m) => notes.push(m) });
  assert.deepEqual(notes, []);
  const down = direct.model.namedModules().find(([n]) => n === "model.layers.0.mlp.down_proj")![1] as Parameters<typeof quantizedWeightOf>[0];
  const q = quantizedWeightOf(down)!;
  assert.equal(q.scheme, "iq4_nl");
  // the file's blocks are the encoder's: its dequantized values are what Kiln's iq4_nl encoder makes of the f32 weight
  const f32 = loadLocalModel(dir).model.namedModules().find(([n]) => n === "model.layers.0.mlp.down_proj")![1] as unknown as { weight: { dataSync(): Float32Array; shape: number[] } };
  const [n, k] = f32.weight.shape as [number, number];
  const enc = quantizeWeightsRef("iq4_nl", f32.weight.dataSync(), n, k);
  const want = dequantizeRef("iq4_nl", enc, n, k);
  const got = dequantize("IQ4_NL", raw, n * k)!;
  assert.ok(got.every((v, i) => v === want[i]), "the export's values differ from the iq4_nl encoder's");
  const floats = loadLocalModel(file, { ggufKeepQuantized: false });
  const a = lastLogits(direct, IDS);
  const b = lastLogits(floats, IDS);
  assert.ok(maxAbsDiff(a, b) <= 0.06 * maxAbs(b), `iq4_nl vs dequantized: ${maxAbsDiff(a, b)} vs range ${maxAbs(b)}`);
  const { probs } = await llamaCppOracle(file, IDS, 0);
  const { dLc, scale, compared } = logprobGaps(probs, logSoftmax(a), logSoftmax(b));
  assert.ok(dLc < 0.06 * scale, `vs llama.cpp ${dLc} (range ${scale})`);
  t.diagnostic(`IQ4_NL export: max |logprob diff| vs llama.cpp ${dLc.toExponential(2)} over ${compared} tokens (range ${scale.toFixed(1)})`);
});
