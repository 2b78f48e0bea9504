// GGUF block types no kernel takes as they are (Q5_0 here; Q4_1, Q5_1 and Q2_K likewise) load requantized to
// int8_g32, not as f32 tables. Oracles: gguf-quant.ts's Q5_0 dequantizer (ggml's dequantize_row_q5_0) with the
// bound the requantization promises, and the model loaded all as floats.
import assert from "node:assert/strict";
import { test } from "node:test";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { dequantizeRef, floatToHalf, nativeTakesScheme } from "../../src/backends/cpu/quant-reference.js";
import { dequantize } from "../../src/models/formats/gguf-quant.js";
import { readGguf, writeGguf, type GgufWriteTensor } from "../../src/models/formats/gguf.js";
import { exportGguf } from "../../src/models/init-model.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { quantizedWeightOf } from "../../src/nn/quantized-linear.js";
import { noGrad, tensor } from "../../src/tensor/index.js";
import { quantizedShadowOf } from "../../src/tensor/ops/linalg.js";
import { mulberry32 } from "../../src/util/random.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";
import { bytesOfTensor, lastLogits, maxAbs, maxAbsDiff } from "../helpers/model-logits.js";

const native = tryLoadNativeKernels();
const skip = !native ? "native addon not built" : nativeTakesScheme(native, "int8_g32") ? false : "native addon lacks int8_g32";

/** Random Q5_0 blocks (f16 d, u8 qh[4], u8 qs[16]): every code; d of both signs ~1e-3. */
function randomQ5_0(blocks: number, seed: number): Uint8Array {
  const u = mulberry32(seed);
  const out = new Uint8Array(blocks * 22);
  for (let i = 0; i < out.length; i++) out[i] = Math.floor(u() * 256);
  for (let b = 0; b < blocks; b++) {
    const d = floatToHalf((u() < 0.5 ? -1 : 1) * (5e-4 + 5e-4 * u()));
    out[b * 22] = d & 255;
    out[b * 22 + 1] = d >> 8;
  }
  return out;
}

/** A Q8_0 export of a tiny Llama with `q5` tensors rewritten as random Q5_0 blocks; their bytes by name. */
function withQ5_0(tied: boolean, q5: string[]): { file: string; raw: Map<string, Uint8Array> } {
  const dir = tinyModelDir("LlamaForCausalLM", {
    std: 0.05, overrides: { hidden_size: 256, intermediate_size: 512, num_attention_heads: 8, num_key_value_heads: 4, tie_word_embeddings: tied },
  });
  const q8 = tempPath(`llama-q8-${tied}.gguf`);
  exportGguf(dir, q8, "Q8_0");
  const g = readGguf(q8);
  const raw = new Map<string, Uint8Array>();
  const tensors: GgufWriteTensor[] = g.tensors.map((t, i) => {
    if (!q5.includes(t.name)) return { name: t.name, shape: t.shape, type: t.type, raw: g.load(t.name).slice() };
    const bytes = randomQ5_0(t.shape.reduce((a, b) => a * b, 1) / 32, 100 + i);
    raw.set(t.name, bytes);
    return { name: t.name, shape: t.shape, type: "Q5_0", raw: bytes };
  });
  const file = tempPath(`llama-q5_0-${tied}.gguf`);
  writeGguf(file, g.typedMetadata(), tensors);
  g.close();
  return { file, raw };
}

test("Q5_0 tensors load requantized to int8_g32 (no float table): within half a step of their group, noted", { skip, timeout: 60_000 }, () => {
  const { file, raw } = withQ5_0(false, ["output.weight", "blk.1.ffn_down.weight"]);
  const notes: string[] = [];
  const direct = loadLocalModel(file, { onNote: (m) => notes.push(m) });
  const note = notes.find((m) => /2 tensor\(s\) Q5_0 \(no Q5_0 kernel\) requantized to int8_g32: /.test(m));
  assert.ok(note?.includes("output.weight") && note.includes("blk.1.ffn_down.weight"), notes.join("\n"));
  assert.equal(direct.quantization, "int8_g32");
  for (const [name, gguf] of [["lm_head", "output.weight"], ["model.layers.1.mlp.down_proj", "blk.1.ffn_down.weight"]] as const) {
    const layer = direct.model.namedModules().find(([n]) => n === name)![1] as Parameters<typeof quantizedWeightOf>[0];
    const q = quantizedWeightOf(layer);
    assert.equal(q?.scheme, "int8_g32", `${name} is int8_g32`);
    const [n, k] = [q!.outFeatures, q!.inFeatures];
    const s = bytesOfTensor(q!.scales);
    const got = dequantizeRef("int8_g32", { data: bytesOfTensor(q!.data), scales: new Uint16Array(s.buffer, s.byteOffset, s.length / 2), rowSums: new Int32Array(0) }, n, k);
    const want = dequantize("Q5_0", raw.get(gguf)!, n * k)!;
    for (let g = 0; g < (n * k) / 32; g++) {
      let amax = 0;
      for (let i = g * 32; i < g * 32 + 32; i++) amax = Math.max(amax, Math.abs(want[i]!));
      // half a step of amax / 127, plus the step's own rounding to f16 (2^-11 relative, 2^-25 absolute among f16's
      // subnormals, below 2^-14) times a code of up to 127
      const step = amax / 127;
      const bound = (step / 2 + 127 * Math.max(step / 2048, 2 ** -25)) * 1.001 + 1e-12;
      for (let i = g * 32; i < g * 32 + 32; i++)
        if (Math.abs(got[i]! - want[i]!) > bound) assert.fail(`${name} element ${i}: ${got[i]} vs the file's ${want[i]} (bound ${bound})`);
    }
  }
  const floats = loadLocalModel(file, { ggufKeepQuantized: false });
  const ids = [5, 77, 140, 31, 260, 9, 402, 18];
  // end to end (mostly the int8 activations of every product, the weights' bound checked above): a misplaced row or
  // group would be off by the logits' whole range
  const a = lastLogits(direct, ids);
  const b = lastLogits(floats, ids);
  assert.ok(maxAbsDiff(a, b) <= 0.06 * maxAbs(b), `max logit error ${maxAbsDiff(a, b)} vs range ${maxAbs(b)}`);
});

test("a Q5_0 tied token embedding: lookups read the float table as the file has it, the LM head an int8_g32 copy", { skip, timeout: 60_000 }, () => {
  const { file } = withQ5_0(true, ["token_embd.weight"]);
  const direct = loadLocalModel(file, { onNote: () => {} });
  const floats = loadLocalModel(file, { ggufKeepQuantized: false });
  const emb = direct.model.model.embedTokens.weight;
  assert.equal(quantizedShadowOf(emb)?.scheme, "int8_g32");
  const ids = tensor(Int32Array.of(0, 3, 300, 511));
  const got = noGrad(() => direct.model.model.embedTokens.forward(ids).dataSync() as Float32Array);
  const want = noGrad(() => floats.model.model.embedTokens.forward(ids).dataSync() as Float32Array);
  assert.deepEqual(Array.from(got), Array.from(want));
  // as above: mostly the int8 activations of every product (the head's weights within their bound)
  const a = lastLogits(direct, [5, 77, 140, 31]);
  const b = lastLogits(floats, [5, 77, 140, 31]);
  assert.ok(maxAbsDiff(a, b) <= 0.06 * maxAbs(b), `max logit error ${maxAbsDiff(a, b)} vs range ${maxAbs(b)}`);
});
