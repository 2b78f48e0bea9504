// --kv-cache-dtype: a bfloat16 paged KV cache takes half the bytes per block (so the same memory holds twice the
// tokens) and an fp8 one (e4m3 or e5m2) a quarter, "auto" follows the model's dtype, a bad value is a typed error, and
// greedy decoding through a bfloat16 or fp8 cache is the same with and without step graphs and tracks the float32
// cache's output.
import assert from "node:assert/strict";
import { copyFileSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
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
  // fp8 (vLLM's "fp8" = fp8_e4m3): a quarter of float32's bytes per block
  const fp8 = createServingSetupSync({ ...base, kvCacheDtype: "fp8" });
  assert.equal(fp8.runner.kvCacheDtype, "fp8_e4m3");
  assert.equal(fp8.runner.bytesPerBlock * 4, f32.runner.bytesPerBlock);
  assert.ok(fp8.kvTokens >= 4 * f32.kvTokens, `fp8 holds ${fp8.kvTokens} tokens, f32 ${f32.kvTokens}`);
  const e5m2 = createServingSetupSync({ ...base, kvCacheDtype: "fp8_e5m2" });
  assert.equal(e5m2.runner.kvCacheDtype, "fp8_e5m2");
  assert.equal(e5m2.runner.bytesPerBlock, fp8.runner.bytesPerBlock);
  assert.throws(
    () => createServingSetupSync({ ...base, kvCacheDtype: "fp8_e4m3fnuz" as "auto" }),
    (e: unknown) =>
      e instanceof EngineInputError && /kv_cache_dtype must be one of auto, float32, bfloat16, fp8, fp8_e4m3, fp8_e5m2/.test((e as Error).message),
  );
});

for (const dtype of ["fp8_e4m3", "fp8_e5m2"] as const)
  test(`greedy decoding through an ${dtype} KV cache: step graphs equal eager, and next tokens track the float32 cache`, { timeout: 120_000 }, () => {
    const model = tinyModelDir("LlamaForCausalLM");
    const base = { model, maxModelLen: 128, kvCacheMemory: 4 << 20, maxNumSeqs: 4 };
    const eager = greedy(new LLM({ ...base, kvCacheDtype: dtype, enforceEager: true }));
    const s = createServingSetupSync({ ...base, kvCacheDtype: dtype });
    assert.equal(s.runner.captureFailure, null);
    const graphs = greedy(new LLM({ runner: s.runner, tokenizer: s.loaded.tokenizer, engineArgs: s.engineArgs }));
    assert.ok((s.runner.graphs?.replays ?? 0) > 0, "the decode steps ran as step graphs");
    assert.deepEqual(graphs, eager);
    // Teacher-forced against the float32 cache (free-running greedy text diverges for good at the first near-tie of
    // this random model): the most likely next token at every position of the same token sequences.
    const f32 = new LLM({ ...base, kvCacheDtype: "float32", enforceEager: true });
    const seqs = f32
      .generate(PROMPTS, { temperature: 0, maxTokens: 10, ignoreEos: true })
      .map((o) => [...o.promptTokenIds, ...o.outputs[0]!.tokenIds]);
    const top1 = (llm: LLM) =>
      llm
        .generate(seqs.map((promptTokenIds) => ({ promptTokenIds })), { temperature: 0, maxTokens: 1, promptLogprobs: 1 })
        .flatMap((o) => o.promptLogprobs!.slice(1).map((m) => [...m!].find(([, l]) => l.rank === 1)![0]));
    const want = top1(f32), got = top1(new LLM({ ...base, kvCacheDtype: dtype, enforceEager: true }));
    const same = got.filter((t, i) => t === want[i]).length;
    // measured: e4m3 (3 mantissa bits) 50 of 56, e5m2 (2 bits) 41 of 56; a wrong decode or encode agrees by chance only
    assert.ok(same >= (dtype === "fp8_e4m3" ? 0.8 : 0.6) * want.length, `${same} of ${want.length} next tokens agree with the float32 cache`);
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

test("engine arguments a user gets wrong are typed errors naming them, before any weight is read", () => {
  const cases: [Record<string, unknown>, string, RegExp][] = [
    [{ max_model_len: 64 }, "max_model_len", /not an engine argument \(did you mean maxModelLen\?\)/],
    [{ maxNumSeq: 4 }, "maxNumSeq", /not an engine argument$/],
    [{ maxNumSeqs: 0 }, "max_num_seqs", /max_num_seqs must be an integer >= 1, got 0/],
    [{ maxModelLen: 0 }, "max_model_len", /max_model_len must be an integer >= 1/],
    [{ maxNumBatchedTokens: 2.5 }, "max_num_batched_tokens", /integer/],
    [{ gpuMemoryUtilization: 2 }, "gpu_memory_utilization", /in \(0, 1\]/],
    [{ blockSize: 3 }, "block_size", /power of two/],
    [{ kvCacheMemory: -1 }, "kv_cache_memory", /integer >= 1/],
    [{ seed: "x" }, "seed", /seed must be an integer, got "x"/],
    [{ seed: 1.5 }, "seed", /seed must be an integer, got 1.5/],
    [{ schedulingPolicy: "lifo" }, "scheduling_policy", /scheduling_policy must be "fcfs" or "priority", got "lifo"/],
  ];
  for (const [extra, param, message] of cases) {
    assert.throws(
      () => createServingSetupSync({ model: "/nonexistent/model", ...extra } as never),
      (e: unknown) => e instanceof EngineInputError && e.param === param && message.test(e.message),
      JSON.stringify(extra),
    );
  }
});

test("LLM.generate without params uses the model's generation_config.json defaults (vLLM's get_default_sampling_params)", { timeout: 120_000 }, () => {
  const src = tinyModelDir("LlamaForCausalLM");
  const dir = mkdtempSync(join(tmpdir(), "kiln-gen-"));
  for (const f of readdirSync(src)) copyFileSync(join(src, f), join(dir, f));
  writeFileSync(join(dir, "generation_config.json"), JSON.stringify({ temperature: 0, max_new_tokens: 5, eos_token_id: 1e6 }));
  const llm = new LLM({ model: dir, maxModelLen: 128, kvCacheMemory: 2 << 20, enforceEager: true });
  assert.deepEqual(llm.getDefaultSamplingParams(), { temperature: 0, maxTokens: 5 });
  const [a] = llm.generate(["Once upon a time"]); // greedy: EOS could end it early, identically for b
  const [b] = llm.generate(["Once upon a time"], { temperature: 0, maxTokens: 5 });
  assert.equal(a!.outputs[0]!.tokenIds.length, 5);
  assert.deepEqual(a!.outputs[0]!.tokenIds, b!.outputs[0]!.tokenIds, "greedy, as the file says");
  const [c] = llm.generate(["Once upon a time"], { ignoreEos: true }); // explicit params: SamplingParams' own defaults (16 tokens)
  assert.equal(c!.outputs[0]!.tokenIds.length, 16);
  // vLLM's generation_config / override_generation_config engine arguments
  const args = { model: dir, maxModelLen: 128, kvCacheMemory: 2 << 20, enforceEager: true };
  assert.deepEqual(new LLM({ ...args, generationConfig: "vllm" }).getDefaultSamplingParams(), {});
  const over = new LLM({ ...args, overrideGenerationConfig: { max_new_tokens: 3, top_k: 7 } });
  assert.deepEqual(over.getDefaultSamplingParams(), { temperature: 0, topK: 7, maxTokens: 3 });
  assert.deepEqual(over.generate(["Once upon a time"])[0]!.outputs[0]!.tokenIds, a!.outputs[0]!.tokenIds.slice(0, 3));
  const other = mkdtempSync(join(tmpdir(), "kiln-gen-"));
  writeFileSync(join(other, "generation_config.json"), JSON.stringify({ temperature: 0.3 }));
  assert.deepEqual(new LLM({ ...args, generationConfig: other }).getDefaultSamplingParams(), { temperature: 0.3 });
  for (const bad of [{ generationConfig: "/nonexistent" }, { generationConfig: tmpdir() }, { overrideGenerationConfig: "x" }, { overrideGenerationConfig: { foo: 1 } }, { overrideGenerationConfig: { temperature: -1 } }])
    assert.throws(() => new LLM({ ...args, ...bad } as never), (e: unknown) => e instanceof EngineInputError && /generation_config/.test(e.param), JSON.stringify(bad));
  rmSync(dir, { recursive: true });
  rmSync(other, { recursive: true });
});
