// --kv-cache-dtype: a bfloat16 paged KV cache takes half the bytes per block (so the same memory holds twice the
// tokens), "auto" follows the model's dtype, a bad value is a typed error, and greedy decoding through a bfloat16
// cache is the same with and without step graphs and tracks the float32 cache's output.
import assert from "node:assert/strict";
import { test } from "node:test";
import { EngineInputError } from "../../src/engine/errors.js";
import { LLM } from "../../src/engine/llm-engine.js";
import { createServingSetupSync } from "../../src/engine/serving.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

const PROMPTS = ["The jury said that", "In the morning, the", "He was not sure whether the committee"];

function greedy(llm: LLM): number[][] {
  return llm.generate(PROMPTS, { temperature: 0, maxTokens: 10, ignoreEos: true }).map((o) => o.outputs[0]!.tokenIds);
}

test("a bfloat16 KV cache: half the bytes per block, auto follows the model dtype, bad values are typed errors", { timeout: 120_000 }, () => {
  const model = tinyModelDir("LlamaForCausalLM");
  const base = { model, maxModelLen: 128, kvCacheMemory: 2 << 20, enforceEager: true };
  const f32 = createServingSetupSync({ ...base, kvCacheDtype: "float32" });
  const bf16 = createServingSetupSync({ ...base, kvCacheDtype: "bfloat16" });
  assert.equal(bf16.runner.bytesPerBlock * 2, f32.runner.bytesPerBlock);
  assert.equal(bf16.runner.kvCacheDtype, "bfloat16");
  assert.equal(f32.runner.kvCacheDtype, "float32");
  assert.ok(bf16.kvTokens >= 2 * f32.kvTokens, `bf16 holds ${bf16.kvTokens} tokens, f32 ${f32.kvTokens}`);
  const auto32 = createServingSetupSync({ ...base, kvCacheDtype: "auto" });
  assert.equal(auto32.runner.kvCacheDtype, "float32", "a float32 model keeps a float32 cache");
  const auto16 = createServingSetupSync({ ...base, dtype: "bfloat16" });
  assert.equal(auto16.runner.kvCacheDtype, "bfloat16", "a bfloat16 model gets a bfloat16 cache");
  assert.throws(
    () => createServingSetupSync({ ...base, kvCacheDtype: "fp8" as "auto" }),
    (e: unknown) => e instanceof EngineInputError && /kv_cache_dtype must be auto, float32 or bfloat16/.test((e as Error).message),
  );
});

test("greedy decoding through a bfloat16 KV cache: step graphs equal eager, and track the float32 cache", { timeout: 120_000 }, () => {
  const model = tinyModelDir("LlamaForCausalLM");
  const base = { model, maxModelLen: 128, kvCacheMemory: 4 << 20, maxNumSeqs: 4 };
  const eager = greedy(new LLM({ ...base, kvCacheDtype: "bfloat16", enforceEager: true }));
  const s = createServingSetupSync({ ...base, kvCacheDtype: "bfloat16" });
  assert.equal(s.runner.captureFailure, null);
  const graphs = greedy(new LLM({ runner: s.runner, tokenizer: s.loaded.tokenizer, engineArgs: s.engineArgs }));
  assert.ok((s.runner.graphs?.replays ?? 0) > 0, "the decode steps ran as step graphs");
  assert.deepEqual(graphs, eager);
  const full = greedy(new LLM({ ...base, kvCacheDtype: "float32", enforceEager: true }));
  // bf16 keys and values move the logits by ~1e-3 relative: greedy tokens agree but for rare near-ties
  const same = full.flat().filter((t, i) => t === eager.flat()[i]).length;
  assert.ok(same >= 0.8 * full.flat().length, `${same} of ${full.flat().length} tokens agree with the float32 cache`);
});
