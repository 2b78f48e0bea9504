// The offline LLM API's behaviour on bad input and failures, against a fresh LLM's results.
import { test } from "node:test";
import assert from "node:assert/strict";
import { FakeModelRunner } from "../../src/engine/fake-model-runner.js";
import { LLM } from "../../src/engine/llm-engine.js";
import { prompt, tokenizer, VOCAB } from "./helpers.js";

const engineArgs = { maxModelLen: 128, numGpuBlocks: 64, blockSize: 4 };
const newLLM = (): LLM => new LLM({ runner: new FakeModelRunner(VOCAB), tokenizer, engineArgs });
const GREEDY = { temperature: 0, maxTokens: 8, ignoreEos: true };

test("LLM.generate: a logits processor that throws fails its call, and the next call runs as on a fresh LLM", () => {
  const want = newLLM().generate([{ promptTokenIds: prompt(1, 6) }, "hello"], GREEDY).map((o) => o.outputs[0]!.tokenIds);
  const llm = newLLM();
  let calls = 0;
  const throwsOnThird = (): void => {
    if (++calls === 3) throw new Error("boom");
  };
  assert.throws(
    () => llm.generate([{ promptTokenIds: prompt(2, 5) }, "hi"], [GREEDY, { ...GREEDY, logitsProcessors: [throwsOnThird] }]),
    /boom/,
  );
  // the failed call's requests are gone (left scheduled but never sampled, they would stall every later step)
  assert.equal(llm.engine.hasUnfinishedRequests(), false);
  assert.equal(llm.engine.stats().numFreeBlocks, llm.engine.stats().numTotalBlocks);
  const got = llm.generate([{ promptTokenIds: prompt(1, 6) }, "hello"], GREEDY).map((o) => o.outputs[0]!.tokenIds);
  assert.deepEqual(got, want);
});
