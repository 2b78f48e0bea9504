// The offline LLM API's behaviour on bad input and failures, against a fresh LLM's results.
import { test } from "node:test";
import assert from "node:assert/strict";
import { EngineInputError } from "../../src/engine/errors.js";
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

test("LLM.generate takes vLLM's prompt forms: a TextPrompt {prompt}, one prompt outside a list; other values are EngineInputErrors", () => {
  const llm = newLLM();
  const ids = tokenizer.encode("hello world");
  const [want] = llm.generate([{ promptTokenIds: ids }], GREEDY);
  const [text] = llm.generate([{ prompt: "hello world" }], GREEDY);
  assert.deepEqual(text!.promptTokenIds, ids);
  assert.equal(text!.prompt, "hello world");
  assert.deepEqual(text!.outputs[0]!.tokenIds, want!.outputs[0]!.tokenIds);
  const single = llm.generate("hello world", GREEDY);
  assert.equal(single.length, 1);
  assert.deepEqual(single[0]!.outputs[0]!.tokenIds, want!.outputs[0]!.tokenIds);
  for (const bad of [null, 5, {}, { prompt: 7 }] as unknown[])
    assert.throws(() => llm.generate(["hi", bad] as never, GREEDY), (e: unknown) => e instanceof EngineInputError && e.param === "prompt", JSON.stringify(bad));
  assert.equal(llm.engine.hasUnfinishedRequests(), false);
});

test("SamplingParams.detokenize false (vLLM's): the same token ids and finish, no text; stop strings are refused", () => {
  const llm = newLLM();
  const p = { promptTokenIds: prompt(3, 6) };
  const [withText] = llm.generate([p], { ...GREEDY, stopTokenIds: [] });
  const ids = withText!.outputs[0]!.tokenIds;
  assert.notEqual(withText!.outputs[0]!.text, "");
  const [noText] = llm.generate([p], { ...GREEDY, detokenize: false, stopTokenIds: [ids[4]!] });
  const out = noText!.outputs[0]!;
  assert.deepEqual(out.tokenIds, ids.slice(0, ids.indexOf(ids[4]!) + 1));
  assert.equal(out.text, "");
  assert.equal(out.finishReason, "stop");
  assert.equal(out.stopReason, ids[4]);
  // logprob entries name no decoded token either (vLLM's decoded_token None); with text they do
  const decoded = (detokenize: boolean) => {
    const [r] = llm.generate([p], { ...GREEDY, maxTokens: 3, logprobs: 2, promptLogprobs: 1, detokenize });
    return [...r!.outputs[0]!.logprobs!, ...r!.promptLogprobs!.slice(1)].flatMap((m) => [...m!.values()].map((l) => l.decodedToken));
  };
  assert.ok(decoded(false).length >= 3 + 5 && decoded(false).every((t) => t === null));
  assert.ok(decoded(true).every((t) => typeof t === "string"));
  assert.throws(() => llm.generate([p], { detokenize: false, stop: ["a"] }), (e: unknown) => e instanceof EngineInputError && e.param === "stop");
  assert.throws(() => llm.generate([p], { detokenize: "no" as never }), (e: unknown) => e instanceof EngineInputError && e.param === "detokenize");
});

test("a sampling parameter given as a string is refused naming it, the string quoted (not shown as a valid number)", () => {
  const llm = newLLM();
  const cases: [Record<string, unknown>, string, string][] = [
    [{ temperature: "0" }, "temperature", 'got "0"'],
    [{ topP: "0.5" }, "top_p", 'got "0.5"'],
    [{ n: "2" }, "n", 'got "2"'],
    [{ maxTokens: "16" }, "max_tokens", 'got "16"'],
    [{ logitBias: { 5: "1" } }, "logit_bias", 'got "1"'],
  ];
  for (const [params, param, got] of cases)
    assert.throws(
      () => llm.generate("hi", params as never),
      (e: unknown) => e instanceof EngineInputError && e.param === param && e.message.endsWith(got),
      JSON.stringify(params),
    );
  assert.equal(llm.engine.hasUnfinishedRequests(), false);
});

test("LLM.generate takes one priority per prompt, as vLLM's list (a list of another length is refused, not read as 0s)", () => {
  const llm = new LLM({ runner: new FakeModelRunner(VOCAB), tokenizer, engineArgs: { ...engineArgs, schedulingPolicy: "priority" } });
  const prompts = [{ promptTokenIds: prompt(1, 6) }, { promptTokenIds: prompt(2, 6) }];
  assert.equal(llm.generate(prompts, GREEDY, { priority: [1, 0] }).length, 2);
  assert.throws(() => llm.generate(prompts, GREEDY, { priority: [1] }), (e) => e instanceof EngineInputError && e.param === "priority" && /got 1 priorities for 2 prompts/.test(e.message));
  assert.throws(() => llm.generate(prompts, [GREEDY]), (e) => e instanceof EngineInputError && e.param === "sampling_params");
  assert.equal(llm.engine.hasUnfinishedRequests(), false);
});

test("LLM.chat takes one SamplingParams per conversation, as vLLM's list", () => {
  const llm = newLLM();
  const chat = [{ role: "user", content: "hi" }];
  const outs = llm.chat([chat, chat], [{ ...GREEDY, maxTokens: 2 }, { ...GREEDY, maxTokens: 5 }]);
  const [whole] = llm.chat(chat, { ...GREEDY, maxTokens: 5 });
  assert.deepEqual(outs.map((o) => o.outputs[0]!.tokenIds), [whole!.outputs[0]!.tokenIds.slice(0, 2), whole!.outputs[0]!.tokenIds]);
  assert.throws(() => llm.chat([chat, chat], [GREEDY]), (e) => e instanceof EngineInputError && e.param === "sampling_params" && /1 SamplingParams for 2 prompts/.test(e.message));
});
