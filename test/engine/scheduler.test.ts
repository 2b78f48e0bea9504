import { test } from "node:test";
import assert from "node:assert/strict";
import { add, makeEngine, prompt, runToCompletion, VOCAB } from "./helpers.js";
import { EngineCore } from "../../src/engine/engine-core.js";
import { FakeModelRunner } from "../../src/engine/fake-model-runner.js";

const greedy = { temperature: 0, ignoreEos: true };
type Entry = { requestId: string; numTokens: number; start: number };
const fmt = (steps: Entry[][]): string[] => steps.map((s) => s.map((e) => `${e.requestId}:${e.start}+${e.numTokens}`).join(" "));

test("scheduler: chunked prefill splits, running first, then waiting with the rest of the budget", () => {
  const { core, runner } = makeEngine({ maxNumBatchedTokens: 8 });
  add(core, "A", prompt(1, 20), { ...greedy, maxTokens: 3 });
  add(core, "B", prompt(2, 5), { ...greedy, maxTokens: 3 });
  runToCompletion(core);
  assert.deepEqual(fmt(runner.log), [
    "A:0+8",
    "A:8+8",
    "A:16+4 B:0+4", // A's last chunk samples; B gets what is left
    "A:20+1 B:4+1",
    "A:21+1 B:5+1",
    "B:6+1",
  ]);
});

test("scheduler: decodes are not starved by a long prefill; long_prefill_token_threshold caps chunks", () => {
  const { core, runner } = makeEngine({ maxNumBatchedTokens: 10, longPrefillTokenThreshold: 6 });
  add(core, "A", prompt(1, 3), { ...greedy, maxTokens: 5 });
  core.step();
  add(core, "C", prompt(3, 30), { ...greedy, maxTokens: 1 });
  for (let i = 0; i < 4; i++) core.step();
  assert.deepEqual(fmt(runner.log), ["A:0+3", "A:3+1 C:0+6", "A:4+1 C:6+6", "A:5+1 C:12+6", "A:6+1 C:18+6"]);
});

test("scheduler: max_num_seqs caps the running set", () => {
  const { core, runner } = makeEngine({ maxNumSeqs: 2 });
  for (const id of ["A", "B", "C"]) add(core, id, prompt(id.charCodeAt(0), 4), { ...greedy, maxTokens: 2 });
  runToCompletion(core);
  assert.deepEqual(fmt(runner.log), ["A:0+4 B:0+4", "A:4+1 B:4+1", "C:0+4", "C:4+1"]);
});

test("scheduler: priority policy admits lower values first, then earlier arrivals", () => {
  const { core, runner } = makeEngine({ maxNumSeqs: 1, schedulingPolicy: "priority" });
  let t = 1000;
  for (const [id, prio] of [
    ["A", 2],
    ["B", 0],
    ["C", 1],
    ["D", 0],
  ] as const)
    core.addRequest({ requestId: id, promptTokenIds: prompt(1, 3), params: { ...greedy, maxTokens: 1 }, priority: prio, arrivalTime: t++ });
  runToCompletion(core);
  assert.deepEqual(
    runner.log.map((s) => s[0]!.requestId),
    ["B", "D", "C", "A"],
  );
});

test("scheduler: a prefix-cache hit recomputes only the last prompt token", () => {
  const { core, runner } = makeEngine();
  const p = prompt(5, 13);
  add(core, "A", p, { ...greedy, maxTokens: 2 });
  const a = runToCompletion(core).get("A")!;
  add(core, "B", p, { ...greedy, maxTokens: 2 });
  const b = runToCompletion(core).get("B")!;
  assert.deepEqual(fmt(runner.log).slice(2), ["B:12+1", "B:13+1"]);
  assert.equal(b.numCachedTokens, 12);
  assert.deepEqual(b.outputs[0]!.tokenIds, a.outputs[0]!.tokenIds);
  const s = core.stats();
  assert.equal(s.prefixCacheHits, 12);
  assert.equal(s.prefixCacheQueries, 26);
});

test("scheduler: a tiny pool preempts the latest running request (fcfs) and recomputes it", () => {
  // 6 usable blocks of 4 = 24 token slots; two requests of 8 prompt + 8 output tokens need 4 blocks each at the end.
  const { core, runner } = makeEngine({ numGpuBlocks: 7, enablePrefixCaching: false });
  add(core, "A", prompt(1, 8), { ...greedy, maxTokens: 8 });
  add(core, "B", prompt(2, 8), { ...greedy, maxTokens: 8 });
  const out = runToCompletion(core);
  assert.ok(core.stats().numPreemptions >= 1);
  const log = fmt(runner.log);
  // B was the victim: it restarts from position 0 later, after A has progressed.
  const restart = log.findIndex((s, i) => i > 0 && s.includes("B:0+"));
  assert.ok(restart > 0, log.join("\n"));
  assert.ok(!log[restart]!.includes("A:0+"));
  const { core: alone } = makeEngine();
  add(alone, "B", prompt(2, 8), { ...greedy, maxTokens: 8 });
  assert.deepEqual(out.get("B")!.outputs[0]!.tokenIds, runToCompletion(alone).get("B")!.outputs[0]!.tokenIds);
  assert.equal(core.stats().numFreeBlocks, 6);
});

test("scheduler: prefix-cache stats count each new request once, at admission, as vLLM's (not lookups while it waits, nor a preempted one's)", () => {
  // 6 usable blocks of 4: A, B and C (A's prompt and 2 more) run until B and C are preempted (then read back their
  // own cached blocks); D waits for blocks from the first step to the last.
  const { core, runner } = makeEngine({ numGpuBlocks: 7 });
  add(core, "A", prompt(1, 8), { ...greedy, maxTokens: 8 });
  add(core, "B", prompt(2, 8), { ...greedy, maxTokens: 8 });
  add(core, "C", [...prompt(1, 8), 7, 7], { ...greedy, maxTokens: 2 });
  add(core, "D", prompt(3, 12), { ...greedy, maxTokens: 1 });
  runToCompletion(core);
  const log = fmt(runner.log);
  assert.deepEqual([log[0], log.at(-4), log.at(-1)], ["A:0+8 B:0+8 C:8+2", "B:8+5", "C:8+3 D:0+12"]);
  assert.equal(core.stats().numPreemptions, 2);
  // each request's prompt queried once; the hits are C's 2 blocks of A's prompt
  assert.equal(core.stats().prefixCacheQueries, 8 + 8 + 10 + 12);
  assert.equal(core.stats().prefixCacheHits, 8);
});

test("scheduler: a victim preempted after this step allocated its chunk leaves those blocks out of the prefix cache (their K/V was never written)", () => {
  // 16 usable blocks of 2. V (priority 1) prefills 4 tokens a step; W (priority 0) joins, and at its first decode
  // the pool is short: V, scheduled first this step with blocks for 16..19, is the victim. Admitted again, V must
  // compute 16..19 rather than hit the blocks that step never wrote.
  const args = { blockSize: 2, numGpuBlocks: 17, maxModelLen: 32, maxNumBatchedTokens: 12, longPrefillTokenThreshold: 4, schedulingPolicy: "priority" as const };
  const V = prompt(1, 20), W = prompt(2, 12);
  const pv = { ...greedy, maxTokens: 5 }, pw = { ...greedy, maxTokens: 2 };
  const alone = (id: string, p: number[], params: typeof greedy & { maxTokens: number }) => {
    const { core } = makeEngine({ ...args, numGpuBlocks: 64 });
    add(core, id, p, params);
    return runToCompletion(core).get(id)!.outputs[0]!.tokenIds;
  };
  const { core, runner } = makeEngine(args);
  add(core, "V", V, pv, 1);
  core.step();
  add(core, "W", W, pw, 0);
  const out = runToCompletion(core);
  assert.deepEqual(fmt(runner.log).slice(3, 6), ["V:12+4 W:8+4", "W:12+1", "V:16+4"]);
  assert.equal(core.stats().numPreemptions, 1);
  assert.deepEqual(out.get("V")!.outputs[0]!.tokenIds, alone("V", V, pv));
  assert.deepEqual(out.get("W")!.outputs[0]!.tokenIds, alone("W", W, pw));
  assert.equal(core.stats().numFreeBlocks, 16);
});

test("scheduler: a chunk never ends inside an image (its tokens attend to each other both ways): it ends before", () => {
  class ImageRunner extends FakeModelRunner {
    readonly supportsImages = true;
  }
  const runner = new ImageRunner(VOCAB);
  const core = new EngineCore({ maxModelLen: 256, numGpuBlocks: 128, blockSize: 4, maxNumBatchedTokens: 8 }, runner, {});
  const image = (offset: number) => ({ hash: `img${offset}`, offset, length: 4, pixelValues: new Float32Array(0) });
  core.addRequest({ requestId: "A", promptTokenIds: prompt(1, 20), params: { ...greedy, maxTokens: 2 }, mmFeatures: [image(6), image(13)] });
  runToCompletion(core);
  assert.deepEqual(fmt(runner.log), [
    "A:0+6", // 0..8 would split [6, 10): the waiting request's first chunk stops at 6
    "A:6+7", // 6..14 would split [13, 17): the running request's chunk stops at 13
    "A:13+7",
    "A:20+1",
  ]);
});
