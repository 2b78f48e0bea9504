// --quantization on load: a tiny random Llama quantized to int8 / int4 / fp8 must greedily generate mostly the
// same tokens as float32, and unsupported methods must fail with a typed error before loading weights.
import { test } from "node:test";
import assert from "node:assert/strict";
import { LLM } from "../../src/engine/llm-engine.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { quantizedWeightOf } from "../../src/nn/quantized-linear.js";
import { Linear } from "../../src/nn/layers.js";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

const skip = tryLoadNativeKernels() ? false : "native addon not built";
const PROMPTS = ["The jury said", "It was a", "Mr. Brown went to the", "In the afternoon"];
// agreement of greedy continuations (token by token until the first divergence counts all later tokens as misses)
const MIN_AGREEMENT = { int8: 0.6, fp8: 0.3, int4: 0.25 } as const; // measured 77 / 48 / 43 %

function greedy(model: string, quantization?: string): number[][] {
  const llm = new LLM({ model, maxModelLen: 256, quantization });
  return llm.generate(PROMPTS, { temperature: 0, maxTokens: 24, ignoreEos: true }).map((o) => [...o.outputs[0]!.tokenIds]);
}
function agreement(a: number[][], b: number[][]): number {
  let same = 0;
  let total = 0;
  a.forEach((row, i) => {
    let diverged = false;
    row.forEach((t, j) => {
      if (t !== b[i]![j]) diverged = true;
      if (!diverged) same++;
      total++;
    });
  });
  return same / total;
}

test("quantized Llama agrees with float32 on greedy tokens", { skip, timeout: 120_000 }, () => {
  // 64 = hidden (and 128 = intermediate) are multiples of 64, so every projection takes int4
  const dir = tinyModelDir("LlamaForCausalLM", { std: 0.05 });
  const ref = greedy(dir);
  for (const scheme of ["int8", "fp8", "int4"] as const) {
    const got = greedy(dir, scheme);
    const a = agreement(ref, got);
    console.log(`# ${scheme}: greedy agreement with f32 ${(100 * a).toFixed(1)}%`);
    assert.ok(a >= MIN_AGREEMENT[scheme], `${scheme}: greedy agreement ${a}`);
  }
});

test("loader quantizes the decoder's projections and keeps lm_head / embeddings", { skip }, () => {
  const dir = tinyModelDir("LlamaForCausalLM", { std: 0.05, overrides: { tie_word_embeddings: false } });
  const loaded = loadLocalModel(dir, { quantization: "int8" });
  assert.equal(loaded.quantization, "int8");
  const linears = loaded.model.namedModules().filter(([, m]) => m instanceof Linear) as [string, Linear][];
  for (const [name, m] of linears) assert.equal(quantizedWeightOf(m) !== undefined, name !== "lm_head", name);
  assert.equal(loaded.model.getParameter("model.embed_tokens.weight")!.dtype, "float32");
  assert.equal(loaded.model.getParameter("model.layers.0.self_attn.q_proj.weight")!.dtype, "int8");
});

test("unsupported --quantization methods fail before loading", { skip }, () => {
  const dir = tinyModelDir("LlamaForCausalLM", { std: 0.05 });
  assert.throws(() => loadLocalModel(dir, { quantization: "awq" }), /--quantization awq is not supported on cpu/);
});
