// Batch invariance on a real (tiny, random) model through the paged runner: greedy outputs of 16 different
// prompts submitted together equal each prompt run alone — with prefix caching on and off, with a token
// budget that chunks prompts, and with a KV pool small enough to force preemptions.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServingSetupSync } from "../../src/engine/serving.js";
import { LLM } from "../../src/engine/llm-engine.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

const PROMPTS = [
  "The jury said that",
  "The jury said that the city",
  "In the morning, the",
  "He was not sure whether",
  "The committee approved",
  "A new school building",
  "The jury said that the city of Atlanta",
  "She looked at the",
  "It is important to",
  "The state senate",
  "After the war,",
  "They could not find",
  "The new president of the",
  "On Monday the",
  "Most of the people in the town",
  "The results of the election",
];

function greedy(llm: LLM, prompts: string[]): number[][] {
  return llm.generate(prompts, { temperature: 0, maxTokens: 12, ignoreEos: true }).map((o) => o.outputs[0]!.tokenIds);
}

test("greedy outputs are batch-invariant across caching, chunking and preemption", { timeout: 120_000 }, () => {
  const model = tinyModelDir("LlamaForCausalLM");
  const alone = new LLM({ model, maxModelLen: 128, kvCacheMemory: 8 << 20, maxNumSeqs: 1 });
  const expected = PROMPTS.map((p) => greedy(alone, [p])[0]!);
  const variants: { name: string; args: Record<string, unknown> }[] = [
    { name: "prefix caching on", args: {} },
    { name: "prefix caching off", args: { enablePrefixCaching: false } },
    { name: "chunked prefill (budget 7 tokens)", args: { maxNumBatchedTokens: 7 } },
  ];
  for (const v of variants) {
    const llm = new LLM({ model, maxModelLen: 128, kvCacheMemory: 8 << 20, ...v.args });
    assert.deepEqual(greedy(llm, PROMPTS), expected, v.name);
  }
  // 10 blocks of 16 tokens cannot hold 16 running sequences of ~20 tokens: the scheduler must preempt.
  const perBlock = createServingSetupSync({ model, maxModelLen: 64, kvCacheMemory: 1 << 20 }).runner.bytesPerBlock;
  const small = new LLM({ model, maxModelLen: 64, kvCacheMemory: 10 * perBlock });
  assert.deepEqual(greedy(small, PROMPTS), expected, "tiny pool");
  assert.ok(small.engine.stats().numPreemptions > 0, "the tiny pool forced preemptions");
});
