// --num-gpu-blocks-override (vLLM's num_gpu_blocks_override): the KV cache gets that many blocks whatever the memory
// budget says, the engine's stats (and so kiln:kv_cache_total_blocks) count them, and a cache too small for the
// batch preempts requests that still finish with the same greedy tokens; one too small for max_model_len is refused.
import assert from "node:assert/strict";
import { test } from "node:test";
import { EngineInputError } from "../../src/engine/errors.js";
import { LLM } from "../../src/engine/llm-engine.js";
import { createServingSetupSync } from "../../src/engine/serving.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

const PROMPTS = ["The jury said that", "In the morning, the", "He was not sure whether the committee", "It was a"];

test("num_gpu_blocks_override sets the KV cache's block count; a small one preempts, same tokens", { timeout: 120_000 }, () => {
  const model = tinyModelDir("LlamaForCausalLM");
  const base = { model, maxModelLen: 64, blockSize: 16, kvCacheMemory: 64 << 20, maxNumSeqs: 4, enforceEager: true };
  const s = createServingSetupSync({ ...base, numGpuBlocksOverride: 6 });
  assert.equal(s.engineArgs.numGpuBlocks, 6);
  assert.equal(s.kvTokens, 5 * 16, "block 0 is the null block");
  const small = new LLM({ runner: s.runner, tokenizer: s.loaded.tokenizer, engineArgs: s.engineArgs });
  assert.equal(small.engine.stats().numTotalBlocks, 5);
  const params = { temperature: 0, maxTokens: 40, ignoreEos: true };
  const tokens = (llm: LLM) => llm.generate(PROMPTS, params).map((o) => o.outputs[0]!.tokenIds);
  const got = tokens(small);
  assert.ok(small.engine.stats().numPreemptions > 0, "4 sequences of ~45 tokens need 12 blocks: some were preempted");
  const roomy = new LLM(base);
  assert.equal(roomy.engine.stats().numTotalBlocks, 16, "sized: every sequence at max_model_len (4 x 4 blocks)");
  assert.deepEqual(got, tokens(roomy));
  assert.equal(roomy.engine.stats().numPreemptions, 0);
  assert.throws(
    () => createServingSetupSync({ ...base, numGpuBlocksOverride: 4 }),
    (e: unknown) => e instanceof EngineInputError && /num_gpu_blocks_override 4 \(48 tokens after the null block\) cannot hold one sequence of max_model_len 64/.test((e as Error).message),
  );
  assert.throws(() => createServingSetupSync({ ...base, numGpuBlocksOverride: 1 }), /num_gpu_blocks_override must be an integer >= 2, got 1/);
});
