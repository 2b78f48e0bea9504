// --quantization on load: a tiny random Llama quantized to int8 / int4 / mxfp4 / fp8 must greedily generate mostly the
// same tokens as float32, and unsupported methods must fail with a typed error before loading weights.
import { test } from "node:test";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";
import { LLM } from "../../src/engine/llm-engine.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { Tokenizer } from "../../src/models/tokenizer.js";
import { quantizedWeightOf } from "../../src/nn/quantized-linear.js";
import { Linear } from "../../src/nn/layers.js";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { exportGguf } from "../../src/models/init-model.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

const skip = tryLoadNativeKernels() ? false : "native addon not built";
const PROMPTS = ["The jury said", "It was a", "Mr. Brown went to the", "In the afternoon"];
// teacher-forced next-token agreement with f32 (measured 100 / 100 / 95.8 / 99.0 %)
const MIN_AGREEMENT = { int8: 0.95, fp8: 0.9, int4: 0.85, mxfp4: 0.85 } as const;

/** f32 greedy continuations of PROMPTS (token ids). */
function greedy(llm: LLM, prompts: number[][], maxTokens: number): number[][] {
  return llm.generate(prompts.map((promptTokenIds) => ({ promptTokenIds })), { temperature: 0, maxTokens, ignoreEos: true }).map((o) => [...o.outputs[0]!.tokenIds]);
}
/**
 * Teacher-forced agreement: at every position of the f32 continuation, does the quantized model's greedy next
 * token (given the same f32 prefix) equal f32's? One batched generate of max_tokens 1 over all prefixes.
 */
function agreement(model: string, quantization: string, prompts: number[][], ref: number[][]): number {
  const llm = new LLM({ model, maxModelLen: 256, quantization });
  const prefixes: number[][] = [];
  const expected: number[] = [];
  ref.forEach((row, i) => row.forEach((t, j) => {
    prefixes.push([...prompts[i]!, ...row.slice(0, j)]);
    expected.push(t);
  }));
  const got = greedy(llm, prefixes, 1).map((r) => r[0]);
  return got.filter((t, i) => t === expected[i]).length / expected.length;
}

test("quantized Llama agrees with float32 on greedy tokens", { skip, timeout: 120_000 }, () => {
  // 64 = hidden (and 128 = intermediate) are multiples of 64, so every projection takes int4
  // tied embeddings: the residual stream keeps its token's embedding, so logits are decisive enough for a random
  // model (untied random tiny models have near-flat logits, where any perturbation flips the argmax)
  const dir = tinyModelDir("LlamaForCausalLM", { std: 0.05, overrides: { tie_word_embeddings: true } });
  const f32 = new LLM({ model: dir, maxModelLen: 256 });
  const tokenizer = Tokenizer.fromDir(dir);
  const prompts = PROMPTS.map((p) => tokenizer.encode(p));
  const ref = greedy(f32, prompts, 24);
  for (const scheme of ["int8", "fp8", "int4", "mxfp4"] as const) {
    const a = agreement(dir, scheme, prompts, ref);
    console.log(`# ${scheme}: teacher-forced greedy agreement with f32 ${(100 * a).toFixed(1)}%`);
    assert.ok(a >= MIN_AGREEMENT[scheme], `${scheme}: greedy agreement ${a}`);
  }
});

test("loader quantizes the projections (lm_head unless quantizeLmHead: false) and keeps embeddings", { skip }, () => {
  const dir = tinyModelDir("LlamaForCausalLM", { std: 0.05, overrides: { tie_word_embeddings: false } });
  const kept = loadLocalModel(dir, { quantization: "int4", quantizeLmHead: false });
  const keptLinears = kept.model.namedModules().filter(([, m]) => m instanceof Linear) as [string, Linear][];
  for (const [name, m] of keptLinears) assert.equal(quantizedWeightOf(m)?.scheme, name === "lm_head" ? undefined : "int4", name);
  const loaded = loadLocalModel(dir, { quantization: "int8" });
  assert.equal(loaded.quantization, "int8");
  const linears = loaded.model.namedModules().filter(([, m]) => m instanceof Linear) as [string, Linear][];
  for (const [name, m] of linears) assert.equal(quantizedWeightOf(m)?.scheme, "int8", name);
  assert.equal(loaded.model.getParameter("model.embed_tokens.weight")!.dtype, "float32");
  assert.equal(loaded.model.getParameter("model.layers.0.self_attn.q_proj.weight")!.dtype, "int8");
});

test("unsupported --quantization methods fail before loading", { skip }, () => {
  const dir = tinyModelDir("LlamaForCausalLM", { std: 0.05 });
  assert.throws(() => loadLocalModel(dir, { quantization: "awq" }), /--quantization awq is not supported on cpu/);
});

test("kiln generate --quantization int8 prints what LLM({quantization: int8}) generates", { skip, timeout: 60_000 }, async () => {
  const dir = tinyModelDir("LlamaForCausalLM", { std: 0.05, overrides: { tie_word_embeddings: true } });
  const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
  const args = ["generate", "--model", dir, "--prompt", PROMPTS[0]!, "--max-tokens", "12", "--temperature", "0", "--quantization", "int8"];
  const { stdout } = await promisify(execFile)(`${root}/bin/kiln`, args, { encoding: "utf8", timeout: 50_000 });
  const [ref] = new LLM({ model: dir, maxModelLen: 256, quantization: "int8" }).generate([PROMPTS[0]!], { temperature: 0, maxTokens: 12 });
  assert.equal(stdout, `${ref!.outputs[0]!.text}\n`);
});

test("LLM({ quantization: \"gguf\" }) serves a GGUF file in its own blocks, as kiln serve --quantization gguf does; another model is refused", { skip }, () => {
  const dir = tinyModelDir("LlamaForCausalLM", { std: 0.05 });
  const file = path.join(path.dirname(dir), "quantization-gguf-q8.gguf");
  exportGguf(dir, file, "Q8_0");
  const run = (quantization?: string) => new LLM({ model: file, maxModelLen: 128, quantization }).generate([PROMPTS[0]!], { temperature: 0, maxTokens: 8 })[0]!.outputs[0]!.tokenIds;
  assert.deepEqual(run("gguf"), run());
  assert.throws(() => new LLM({ model: dir, maxModelLen: 128, quantization: "gguf" }), (e: Error) => e.name === "EngineInputError" && /"gguf" needs a GGUF model/.test(e.message));
});
