// Speculative decoding with a draft model (vLLM's speculative_config {"model": ..., "num_speculative_tokens": k}):
// greedy outputs are token for token those without speculation, whatever the draft (the served model itself, whose
// drafts are all accepted, or another model, whose drafts mostly fail), with step graphs and eagerly, over prompts
// longer than a draft step takes, concurrent requests, preemption and structured output; the draft cache's blocks
// all come back; configs are checked with typed errors.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { parseServeArgs } from "../../src/cli/serve-args.js";
import { DraftModelProposer } from "../../src/engine/draft-model.js";
import { EngineInputError } from "../../src/engine/errors.js";
import { LLM } from "../../src/engine/llm-engine.js";
import type { ModelRunner, RunnerOutput, ScheduledBatch } from "../../src/engine/model-runner.js";
import { createServingSetup, createServingSetupSync, type ServingArgs } from "../../src/engine/serving.js";
import { resolveSpeculativeConfig } from "../../src/engine/speculative.js";
import type { SamplingParams } from "../../src/engine/types.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

const target = () => tinyModelDir("LlamaForCausalLM", { overrides: { num_hidden_layers: 3 } });
const other = () => tinyModelDir("LlamaForCausalLM", { seed: 11 });
const prompts = [
  { promptTokenIds: Array.from({ length: 150 }, (_, i) => (i * 7 + 3) % 300) }, // longer than a draft step's 64 tokens
  { promptTokenIds: [5, 6, 7, 8, 9, 10, 11] },
  { promptTokenIds: Array.from({ length: 40 }, (_, i) => (i * 13 + 1) % 250) },
];
const greedy: Partial<SamplingParams> = { temperature: 0, maxTokens: 20, ignoreEos: true };

function run(spec: { model: string } | null, extra: Record<string, unknown> = {}, params = greedy) {
  const llm = new LLM({
    model: target(), maxModelLen: 256, maxNumBatchedTokens: 64,
    ...(spec === null ? {} : { speculativeConfig: { model: spec.model, numSpeculativeTokens: 3 } }),
    ...extra,
  });
  const out = llm.generate(prompts, params).map((o) => o.outputs[0]!.tokenIds);
  return { out, stats: llm.engine.stats() };
}

describe("draft-model speculative decoding", () => {
  const base = run(null).out;

  for (const enforceEager of [false, true]) {
    it(`greedy outputs equal those without speculation: the served model as its own draft (all accepted) and another model (${enforceEager ? "eager" : "step graphs"})`, { timeout: 60_000 }, () => {
      const self = run({ model: target() }, { enforceEager });
      assert.deepEqual(self.out, base);
      assert.ok(self.stats.specDraftTokens! > 20, `drafted ${self.stats.specDraftTokens}`);
      assert.equal(self.stats.specAcceptedTokens, self.stats.specDraftTokens); // the same model drafts what it samples
      // per draft position (vLLM's ..._per_pos): every run's first draft is kept, and the positions add up
      const perPosition = self.stats.specAcceptedPerPosition!;
      assert.equal(perPosition.length, 3);
      assert.equal(perPosition[0], self.stats.specDrafts);
      assert.equal(perPosition.reduce((a, b) => a + b, 0), self.stats.specAcceptedTokens);
      const diff = run({ model: other() }, { enforceEager });
      assert.deepEqual(diff.out, base);
      assert.ok(diff.stats.specDraftTokens! > 0);
      assert.ok(diff.stats.specAcceptedTokens! < diff.stats.specDraftTokens!, "another model's drafts fail somewhere");
      assert.equal(diff.stats.specAcceptedPerPosition!.reduce((a, b) => a + b, 0), diff.stats.specAcceptedTokens);
    });
  }

  it("under preemption (a KV cache too small for every request at once) and under structured output", { timeout: 60_000 }, () => {
    // 3 layers x 16 tokens x 2 KV heads x 16 dims x 4 bytes x (K, V) = 12 KiB a block: 17 blocks, one max_model_len
    const small = { kvCacheMemory: 17 * 12 * 1024 };
    const plain = run(null, small);
    assert.deepEqual(plain.out, base);
    const spec = run({ model: target() }, small);
    assert.ok(spec.stats.numPreemptions > 0, "the cache is small enough to preempt");
    assert.deepEqual(spec.out, base);
    const so: Partial<SamplingParams> = { temperature: 0, maxTokens: 12, structuredOutputs: { regex: "[a-z ]{1,40}" } };
    assert.deepEqual(run({ model: other() }, {}, so).out, run(null, {}, so).out);
  });

  it("sleep mode frees the draft's KV cache too; after wake_up drafting starts over, outputs unchanged", { timeout: 60_000 }, () => {
    const llm = new LLM({ model: target(), maxModelLen: 256, maxNumBatchedTokens: 64, enableSleepMode: true, speculativeConfig: { model: target(), numSpeculativeTokens: 3 } });
    assert.deepEqual(llm.generate(prompts, greedy).map((o) => o.outputs[0]!.tokenIds), base);
    const draft = (llm.engine as unknown as { draft: DraftModelProposer }).draft;
    const runner = (draft as unknown as { runner: { kvCaches: unknown[] } }).runner;
    llm.sleep(1);
    assert.deepEqual([draft.numTracked, runner.kvCaches.length], [0, 0]);
    llm.wakeUp();
    assert.ok(runner.kvCaches.length > 0);
    const before = llm.engine.stats();
    assert.deepEqual(llm.generate(prompts, greedy).map((o) => o.outputs[0]!.tokenIds), base);
    const after = llm.engine.stats();
    assert.equal(after.specAcceptedTokens! - before.specAcceptedTokens!, after.specDraftTokens! - before.specDraftTokens!);
  });

  it("the draft cache gives back the blocks of requests no longer running; one without room gets no drafts", () => {
    const fed: ScheduledBatch[] = [];
    // a runner that 'predicts' token (last fed token + 1)
    const runner: ModelRunner = {
      vocabSize: 1000,
      execute(batch): RunnerOutput {
        fed.push(batch);
        const ids = batch.sequences.filter((s) => s.needsLogits).map((s) => s.tokenIds.at(-1)! + 1);
        return { logits: new Float32Array(0), promptLogits: new Map(), tokenIds: Int32Array.from(ids) };
      },
    };
    const p = new DraftModelProposer(runner, 4, 9, 8); // 8 usable blocks of 4 tokens; 8 tokens a step
    const a = { requestId: "a", tokens: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], k: 3 };
    let d = p.propose([a], new Set(["a"]));
    assert.deepEqual(d.get("a"), [11, 12, 13]);
    // the prompt went in chunks of 8 then 2 tokens, then the drafts one by one at positions 10 and 11
    assert.deepEqual(fed.map((b) => [b.sequences[0]!.startPosition, b.sequences[0]!.tokenIds.length]), [[0, 8], [8, 2], [10, 1], [11, 1]]);
    assert.equal(p.numFreeBlocks, 8 - 3); // positions 0..11
    // two tokens accepted: only they are fed before the next drafts
    fed.length = 0;
    d = p.propose([{ ...a, tokens: [...a.tokens, 11, 12], k: 2 }], new Set(["a"]));
    assert.deepEqual(d.get("a"), [13, 14]);
    assert.deepEqual(fed.map((b) => [b.sequences[0]!.startPosition, b.sequences[0]!.tokenIds]), [[10, [11, 12]], [12, [13]]]);
    // b needs 5 blocks where 4 are left: no drafts for it, nothing taken
    const b = { requestId: "b", tokens: Array.from({ length: 18 }, (_, i) => i), k: 3 };
    d = p.propose([b], new Set(["a", "b"]));
    assert.deepEqual([d.get("b"), p.numFreeBlocks], [[], 4]);
    // a finished: its blocks come back, and b fits
    d = p.propose([b], new Set(["b"]));
    assert.deepEqual([d.get("b"), p.numTracked, p.numFreeBlocks], [[18, 19, 20], 1, 8 - 5]);
    p.propose([], new Set());
    assert.deepEqual([p.numTracked, p.numFreeBlocks], [0, 8]);
  });

  it("configs: a model without a method is a draft model; typed errors for what cannot draft", () => {
    assert.deepEqual(resolveSpeculativeConfig({ model: "m", numSpeculativeTokens: 2 }), { method: "draft_model", model: "m", numSpeculativeTokens: 2 });
    assert.deepEqual(parseServeArgs("x", { speculativeConfig: '{"model": "d", "num_speculative_tokens": 4}' }, {}).speculativeConfig, {
      method: "draft_model", model: "d", numSpeculativeTokens: 4,
    });
    assert.throws(() => parseServeArgs("x", { speculativeConfig: '{"model": "d", "num_speculative_tokens": 4, "prompt_lookup_max": 2}' }, {}), /"prompt_lookup_max" does not apply to method "draft_model"/);
    assert.throws(() => resolveSpeculativeConfig({ method: "draft_model", numSpeculativeTokens: 2 }), /model must name the draft model/);
    const refused = (overrides: Record<string, unknown>, why: RegExp) =>
      assert.throws(
        () => new LLM({ model: target(), maxModelLen: 256, speculativeConfig: { model: tinyModelDir("LlamaForCausalLM", { overrides }), numSpeculativeTokens: 2 } }),
        (e: unknown) => e instanceof EngineInputError && e.param === "speculative_config" && why.test(e.message),
      );
    refused({ vocab_size: 4000 }, /vocabulary has 4000 tokens, the served model's \d+: a draft model must share the served model's tokenizer/);
    refused({ max_position_embeddings: 128 }, /has 128 positions, fewer than max_model_len 256/);
    assert.throws(
      () => new LLM({ model: target(), maxModelLen: 256, speculativeConfig: { model: "/nonexistent/draft", numSpeculativeTokens: 2 } }),
      (e: unknown) => e instanceof EngineInputError && e.param === "speculative_config" && /draft model: .*\/nonexistent\/draft/.test(e.message),
    );
  });

  it("a drafter that is not there is refused before the served model is read (the served one missing too: the drafter is named)", async () => {
    const missing = (method: string, re: RegExp) => (e: unknown) => e instanceof EngineInputError && e.param === "speculative_config" && re.test(e.message) && !/\/nonexistent\/served/.test(e.message) || assert.fail(`${method}: ${(e as Error).message}`);
    for (const method of ["draft_model", "eagle"]) {
      const args = { model: "/nonexistent/served", speculativeConfig: { method, model: "/nonexistent/drafter", numSpeculativeTokens: 2 } } as ServingArgs;
      const re = method === "eagle" ? /EAGLE head: .*\/nonexistent\/drafter/ : /draft model: .*\/nonexistent\/drafter/;
      assert.throws(() => createServingSetupSync(args), missing(method, re));
      await assert.rejects(createServingSetup(args), missing(method, re));
    }
  });
});
