// EAGLE at step-graph speed: the served model's step graphs return the hidden rows an EAGLE head reads (EAGLE-1's final
// states, EAGLE-3's aux layers' residual streams) equal to the eager runner's, in mixed, speculated and decode steps;
// a step asking for other rows than the graphs return runs eagerly; graphs captured without hidden rows return none.
// The head's captured feed and draft steps give the eager head's tokens and output states. A second engine re-creates
// the graphs with their hidden outputs from the compile cache.
import assert from "node:assert/strict";
import { test } from "node:test";
import { EagleHeadRunner, type HeadSequence } from "../../src/engine/eagle-runner.js";
import { LLM } from "../../src/engine/llm-engine.js";
import type { HiddenStatesRequest, ScheduledBatch, ScheduledSequence } from "../../src/engine/model-runner.js";
import { PagedModelRunner } from "../../src/engine/paged-model-runner.js";
import { loadEagleHead } from "../../src/models/eagle-head.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { writeEagleHead } from "../helpers/eagle-head.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

const target = () => tinyModelDir("LlamaForCausalLM", { overrides: { num_hidden_layers: 3 } });
const BLOCK = 16;

/** Largest |a - b| over the largest |b|: the graphs' fused kernels may round differently from the eager ones by an ulp or so. */
function relDiff(a: Float32Array, b: Float32Array): number {
  assert.equal(a.length, b.length);
  let d = 0, m = 0;
  for (let i = 0; i < a.length; i++) {
    d = Math.max(d, Math.abs(a[i]! - b[i]!));
    m = Math.max(m, Math.abs(b[i]!));
  }
  return d / Math.max(m, 1e-30);
}

/** Request `block`'s tokens at positions start .. (its block table is [block]). */
function seq(id: string, block: number, tokens: number[], start: number, numSpecTokens = 0): ScheduledSequence {
  const slotMapping = Int32Array.from(tokens, (_, j) => block * BLOCK + start + j);
  return { requestId: id, tokenIds: tokens, startPosition: start, blockTable: [block], slotMapping, needsLogits: true, needsPromptLogits: false, numSpecTokens };
}

const batch = (sequences: ScheduledSequence[], hiddenStates: HiddenStatesRequest | undefined): ScheduledBatch => ({
  sequences, blockSize: BLOCK, numTokens: sequences.reduce((n, s) => n + s.tokenIds.length, 0), finishedRequestIds: [], ...(hiddenStates ? { hiddenStates } : {}),
});

/** Two prompts in one mixed step, a decode of both, then a speculated step of one (1 + 2 rows). */
const STEPS = [
  [seq("a", 1, [5, 9, 33, 2, 71, 8, 8, 140, 12, 6, 200], 0), seq("b", 2, [300, 4, 17], 0)],
  [seq("a", 1, [44], 11), seq("b", 2, [45], 3)],
  [seq("a", 1, [46, 47, 48], 12, 2)],
];

test("the served model's step graphs return the eager runner's hidden rows (final, aux layers), replayed in every bucket kind", { timeout: 60_000 }, () => {
  const { model } = loadLocalModel(target());
  for (const want of ["final", { layers: [0, 1, 2] }, { layers: [2] }] as HiddenStatesRequest[]) {
    const eager = new PagedModelRunner(model, { numBlocks: 4, blockSize: BLOCK });
    const graphs = new PagedModelRunner(model, { numBlocks: 4, blockSize: BLOCK });
    assert.ok(graphs.captureStepGraphs(64, { decodeBuckets: [1, 2], mixedBuckets: [4, 16], mixedRows: 4, fuse: true, hiddenStates: want }));
    const width = 64 * (typeof want === "object" ? want.layers.length : 1);
    STEPS.forEach((step, i) => {
      const e = eager.execute(batch(step, want));
      const g = graphs.execute(batch(step, want));
      assert.equal(graphs.graphs!.replays, i + 1, "replayed");
      assert.equal(g.hiddenStates!.length, batch(step, want).numTokens * width);
      assert.ok(relDiff(g.hiddenStates!, e.hiddenStates!) < 1e-5, `${JSON.stringify(want)} step ${i}: hidden rows differ by ${relDiff(g.hiddenStates!, e.hiddenStates!)}`);
      assert.ok(relDiff(g.logits, e.logits) < 1e-5, `step ${i}: logits`);
    });
    assert.equal(graphs.graphs!.mixedReplays, 2);
    // other rows than the graphs return: the step runs eagerly
    const other: HiddenStatesRequest = want === "final" ? { layers: [0, 1, 2] } : "final";
    const step = [seq("b", 2, [46], 4)];
    const e = eager.execute(batch(step, other));
    const g = graphs.execute(batch(step, other));
    assert.equal(graphs.graphs!.replays, STEPS.length, "ran eagerly");
    assert.ok(relDiff(g.hiddenStates!, e.hiddenStates!) < 1e-5); // (over K/V the graphs wrote)
    eager.dispose();
    graphs.dispose();
  }
  // graphs without hidden rows (no EAGLE drafter) return none, and a step asking for some runs eagerly
  const plain = new PagedModelRunner(model, { numBlocks: 4, blockSize: BLOCK });
  assert.ok(plain.captureStepGraphs(64, { decodeBuckets: [1, 2], mixedBuckets: [4, 16], fuse: true }));
  assert.equal(plain.execute(batch(STEPS[0]!, undefined)).hiddenStates, undefined);
  assert.notEqual(plain.execute(batch(STEPS[1]!, "final")).hiddenStates, undefined);
  assert.equal(plain.graphs!.replays, 1);
  plain.dispose();
});

for (const method of ["eagle", "eagle3"] as const)
  test(`the ${method} head's captured feed and draft steps give the eager head's tokens and output states`, { timeout: 60_000 }, () => {
    const loaded = loadLocalModel(target());
    const dir = method === "eagle"
      ? writeEagleHead(target(), "graphs-e1", { method, config: { num_hidden_layers: 2 }, seed: 9, std: 0.3 })
      : writeEagleHead(target(), "graphs-e3", { method, config: { draft_vocab_size: 300 }, d2t: Array.from({ length: 300 }, (_, d) => (d % 3 === 0 ? 200 : 0)), seed: 10, std: 0.3 });
    const head = loadEagleHead(dir, method, loaded.model, "float32");
    const eager = new EagleHeadRunner(head, 4, 16);
    const graphs = new EagleHeadRunner(head, 4, 16);
    assert.ok(graphs.capture(32, { decodeBuckets: [1, 2], mixedBuckets: [4, 8], fuse: true }));
    let seed = 3;
    const rnd = () => ((seed = (Math.imul(seed, 48271) + 11) >>> 0) / 2 ** 32) * 2 - 1;
    const rows = (n: number, width: number) => Array.from({ length: n }, () => Float32Array.from({ length: width }, () => rnd()));
    const W = head.targetRowSize;
    const seqOf = (blocks: number[], ids: number[], rs: Float32Array[], start: number, read: boolean): HeadSequence => ({
      ids, rows: rs, start, blockTable: blocks, read, slots: Int32Array.from(ids, (_, j) => blocks[Math.floor((start + j) / 4)]! * 4 + ((start + j) % 4)),
    });
    // a feed of two sequences (7 positions, one read; 1 position, read), then two draft steps fed with the outputs
    const feed = [seqOf([1, 2, 3], [3, 8, 100, 7, 6, 5, 4], rows(7, W), 0, true), seqOf([4, 5], [9], rows(1, W), 0, true)];
    let e = eager.run(feed, true), g = graphs.run(feed, true);
    for (let j = 0; j < 3; j++) {
      e.forEach((o, i) => {
        assert.equal(g[i]!.token, o!.token, `step ${j} sequence ${i}`);
        assert.ok(relDiff(g[i]!.hidden, o!.hidden) < 1e-5, `step ${j} sequence ${i}: output states differ by ${relDiff(g[i]!.hidden, o!.hidden)}`);
      });
      const next = (out: typeof e) => [seqOf([1, 2, 3], [out[0]!.token], [out[0]!.hidden], 7 + j, true), seqOf([4, 5], [out[1]!.token], [out[1]!.hidden], 1 + j, true)];
      if (j < 2) [e, g] = [eager.run(next(e), false), graphs.run(next(e), false)];
    }
    assert.deepEqual([graphs.replays, graphs.eagerSteps, eager.replays], [3, 0, 0]);
    eager.dispose();
    graphs.dispose();
  });

test("a second engine re-creates the served model's graphs, hidden outputs included, from the compile cache's recordings", { timeout: 60_000 }, () => {
  const head = writeEagleHead(target(), "graphs-cache-e3", { method: "eagle3", config: { eagle_aux_hidden_state_layer_ids: [0, 1, 2] } });
  const prompts = [{ promptTokenIds: Array.from({ length: 40 }, (_, i) => (i * 13 + 1) % 250) }, { promptTokenIds: [5, 6, 7] }];
  const params = { temperature: 0, maxTokens: 12, ignoreEos: true };
  const runs = [0, 1].map(() => {
    const llm = new LLM({ model: target(), maxModelLen: 128, maxNumBatchedTokens: 32, speculativeConfig: { method: "eagle3", model: head, numSpeculativeTokens: 2 } });
    const out = llm.generate(prompts, params).map((o) => o.outputs[0]!.tokenIds);
    const runner = llm.engine.runner as PagedModelRunner;
    assert.equal(runner.graphs!.replays, llm.engine.numSteps);
    return { out, replayed: runner.graphs!.info!.replayed };
  });
  assert.equal(runs[1]!.replayed, true);
  assert.deepEqual(runs[1]!.out, runs[0]!.out);
  assert.deepEqual(runs[0]!.out, new LLM({ model: target(), maxModelLen: 128, maxNumBatchedTokens: 32 }).generate(prompts, params).map((o) => o.outputs[0]!.tokenIds));
});
