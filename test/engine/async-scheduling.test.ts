// Async scheduling: step N+1 is scheduled while step N computes. The fake runner's dispatch() defers the
// work to wait(), as a device stream does, and checks the paged KV chain on every step; outputs must equal
// the synchronous engine's, whatever finishes, is preempted or aborted while a step is in flight.
import { test } from "node:test";
import assert from "node:assert/strict";
import { EngineCore, type EngineArgs } from "../../src/engine/engine-core.js";
import { FakeModelRunner } from "../../src/engine/fake-model-runner.js";
import { fillFedTokens, type PendingRunnerOutput, type RunnerOutput, type ScheduledBatch } from "../../src/engine/model-runner.js";
import type { SamplingParams } from "../../src/engine/types.js";
import { add, prompt, runToCompletion, tokenizer, VOCAB } from "./helpers.js";

/** A fake runner whose work runs at wait() time, logging dispatch/wait; the engine's schedule() is logged too. */
class DeferredFakeRunner extends FakeModelRunner {
  readonly events: string[] = [];
  private dispatched = 0;
  dispatch(batch: ScheduledBatch): PendingRunnerOutput {
    const n = this.dispatched++;
    this.events.push(`dispatch ${n}`);
    for (const s of batch.sequences) assert.ok(!s.tokenIds.includes(-1), `step ${n} dispatched with a placeholder token`);
    // The engine may not touch the batch after dispatch: copy what a device would have captured.
    const frozen: ScheduledBatch = { ...batch, sequences: batch.sequences.map((s) => ({ ...s, tokenIds: [...s.tokenIds] })) };
    return {
      wait: () => {
        this.events.push(`wait ${n}`);
        return this.execute(frozen);
      },
    };
  }
}

function engines(args: Partial<EngineArgs>): { sync: EngineCore; async: EngineCore; runner: DeferredFakeRunner } {
  const base = { maxModelLen: 256, numGpuBlocks: 128, blockSize: 4, ...args };
  const runner = new DeferredFakeRunner(VOCAB);
  const asyncCore = new EngineCore(base, runner, { tokenizer });
  const schedule = asyncCore.scheduler.schedule.bind(asyncCore.scheduler);
  asyncCore.scheduler.schedule = (now?: number) => {
    runner.events.push("schedule");
    return schedule(now);
  };
  return { sync: new EngineCore(base, new FakeModelRunner(VOCAB), { tokenizer }), async: asyncCore, runner };
}

const shared = prompt(5, 9);
const PROMPTS = Array.from({ length: 16 }, (_, i) => (i % 4 === 0 ? [...shared, ...prompt(i, 2 + i)] : prompt(i + 40, 3 + ((i * 5) % 23))));

test("async scheduling: on by default when the runner can dispatch; the next step is scheduled before the current one is waited for", () => {
  const { async: core, runner } = engines({});
  assert.equal(core.asyncScheduling, true);
  assert.equal(new EngineCore({ maxModelLen: 64, numGpuBlocks: 16 }, new FakeModelRunner(VOCAB)).asyncScheduling, false);
  add(core, "a", prompt(1, 6), { temperature: 0, maxTokens: 5, ignoreEos: true });
  add(core, "b", prompt(2, 3), { temperature: 0, maxTokens: 3, ignoreEos: true });
  runToCompletion(core);
  // Every wait(N) is preceded, after dispatch(N), by the schedule() of the following step.
  const ev = runner.events;
  for (let i = 0; i < ev.length; i++) {
    if (!ev[i]!.startsWith("wait")) continue;
    const n = ev[i]!.split(" ")[1];
    const d = ev.indexOf(`dispatch ${n}`);
    assert.ok(d >= 0 && d < i, `dispatch ${n} before wait ${n}`);
    assert.ok(ev.slice(d + 1, i).includes("schedule"), `a schedule() ran while step ${n} was in flight: ${ev.join(", ")}`);
  }
  assert.equal(core.stats().numFreeBlocks, core.stats().numTotalBlocks);
});

test("async scheduling: outputs equal the synchronous engine's across caching, chunking, preemption, stops and n > 1", () => {
  const cases: [string, Partial<EngineArgs>, Partial<SamplingParams>][] = [
    ["greedy", {}, { temperature: 0, maxTokens: 9 }],
    ["seeded, no caching", { enablePrefixCaching: false }, { temperature: 0.9, topK: 30, seed: 11, maxTokens: 9 }],
    ["small chunks", { maxNumBatchedTokens: 5 }, { temperature: 0, maxTokens: 7 }],
    ["tiny pool", { numGpuBlocks: 20, maxNumBatchedTokens: 64 }, { temperature: 0, maxTokens: 10 }],
    ["tiny pool priority", { numGpuBlocks: 20, schedulingPolicy: "priority" }, { temperature: 0.7, seed: 2, maxTokens: 10 }],
    ["stop tokens and strings", {}, { temperature: 0, maxTokens: 12, stopTokenIds: [7, 8, 9, 10, 11], stop: ["e"] }],
    ["n=2", {}, { temperature: 1, n: 2, seed: 4, maxTokens: 6 }],
    ["min/max tokens", { maxNumSeqs: 3 }, { temperature: 0, minTokens: 2, maxTokens: 3 }],
  ];
  for (const [name, args, params] of cases) {
    const { sync, async: core } = engines(args);
    PROMPTS.forEach((p, i) => {
      const prio = args.schedulingPolicy === "priority" ? i % 3 : 0; // a priority needs the priority policy
      add(sync, `r${i}`, p, params, prio);
      add(core, `r${i}`, p, params, prio);
    });
    const want = runToCompletion(sync);
    const got = runToCompletion(core);
    for (let i = 0; i < PROMPTS.length; i++) {
      const w = want.get(`r${i}`)!;
      const g = got.get(`r${i}`)!;
      assert.deepEqual(
        g.outputs.map((o) => [o.tokenIds, o.text, o.finishReason]),
        w.outputs.map((o) => [o.tokenIds, o.text, o.finishReason]),
        `${name}: r${i}`,
      );
    }
    const s = core.stats();
    assert.equal(s.numFreeBlocks, s.numTotalBlocks, `${name}: every block is free at the end`);
    if (name.startsWith("tiny")) assert.ok(s.numPreemptions > 0, `${name}: expected preemption`);
  }
});

test("async scheduling: a request that finishes in step N never runs in step N+1; abort with a step in flight frees its blocks", () => {
  const { async: core, runner } = engines({ enablePrefixCaching: false });
  const start = core.stats().numFreeBlocks;
  add(core, "short", prompt(3, 4), { temperature: 0, maxTokens: 2, ignoreEos: true });
  add(core, "long", prompt(4, 4), { temperature: 0, maxTokens: 40, ignoreEos: true });
  add(core, "gone", prompt(6, 5), { temperature: 0, maxTokens: 40, ignoreEos: true });
  const seen: string[] = [];
  for (let i = 0; i < 4; i++) for (const o of core.step()) if (o.finished) seen.push(o.requestId);
  assert.deepEqual(seen, ["short"]);
  // "short": 4 prompt tokens + 1 decode computed; its second sampled token ends it, so no third step for it.
  const shortSteps = runner.log.flat().filter((s) => s.requestId === "short");
  assert.deepEqual(
    shortSteps.map((s) => [s.start, s.numTokens]),
    [
      [0, 4],
      [4, 1],
    ],
  );
  const [out] = core.abortRequest(["gone"]);
  assert.equal(out!.outputs[0]!.finishReason, "abort");
  runToCompletion(core);
  assert.equal(core.stats().numFreeBlocks, start);
  const gone = runner.log.flat().filter((s) => s.requestId === "gone");
  assert.ok(gone.length <= 5, "no step after the abort's in-flight one runs the aborted request");
});

test("async scheduling: each step's outputs, text included, equal the synchronous engine's; text without stop strings is decoded after the next step is dispatched", () => {
  const { sync, async: core, runner } = engines({});
  // r1's stop string never forms (no token decodes to BEL)
  const params: Partial<SamplingParams>[] = [
    { temperature: 0, maxTokens: 7, ignoreEos: true },
    { temperature: 0, maxTokens: 7, ignoreEos: true, stop: ["\u0007\u0007"] },
  ];
  for (const [i, p] of params.entries()) {
    add(sync, `r${i}`, prompt(i + 3, 5), p);
    add(core, `r${i}`, prompt(i + 3, 5), p);
  }
  add(sync, "raw1", prompt(4, 5), params[0]); // r1's tokens without its stop string: r1's text with none held back
  // At each dispatch: every request's output token count and decoded text, as the engine holds them then.
  const atDispatch: Map<string, [number, string]>[] = [];
  const dispatch = runner.dispatch.bind(runner);
  runner.dispatch = (batch: ScheduledBatch) => {
    atDispatch.push(new Map(batch.sequences.map((s) => {
      const r = (s as ScheduledBatch["sequences"][number] & { request: { numOutputTokens: number; outputText: string } }).request;
      return [s.requestId, [r.numOutputTokens, r.outputText]];
    })));
    return dispatch(batch);
  };
  // the synchronous engine's text of each request after k tokens
  const textAfter = new Map<string, string[]>([["r0", [""]], ["r1", [""]], ["raw1", [""]]]);
  const view = (outs: ReturnType<EngineCore["step"]>) => outs.map((o) => [o.requestId, o.outputs[0]!.tokenIds, o.outputs[0]!.text, o.finished]);
  while (sync.hasUnfinishedRequests() || core.hasUnfinishedRequests()) {
    const want = sync.step();
    for (const o of want) textAfter.get(o.requestId)![o.outputs[0]!.tokenIds.length] = o.outputs[0]!.text;
    assert.deepEqual(view(core.step()), view(want.filter((o) => o.requestId !== "raw1")));
  }
  // Each decode dispatch comes right after a token was applied: r1 (with a stop string) has its text, r0's text
  // lags by the token just sampled.
  let checked = 0;
  for (const m of atDispatch) {
    const [n0, t0] = m.get("r0") ?? [0, ""];
    const [n1, t1] = m.get("r1") ?? [0, ""];
    if (n0 < 2 || n1 < 2) continue;
    assert.equal(t0, textAfter.get("r0")![n0 - 1], `r0's text at dispatch: ${n0 - 1} of its ${n0} tokens`);
    assert.equal(t1, textAfter.get("raw1")![n1], `r1's text at dispatch: all ${n1} tokens`);
    checked++;
  }
  assert.ok(checked >= 3, `checked ${checked} dispatches`);
});

/**
 * A fake device: dispatch() queues the step, which runs when it or a later step is waited for (in order, as on a
 * stream); fed tokens are read from their step's sampled ids when the step runs, and greedy batches return their
 * argmax ids as device tokens.
 */
class DeviceFakeRunner extends FakeModelRunner {
  readonly events: string[] = [];
  private readonly queue: (() => void)[] = [];
  private dispatched = 0;
  fed = 0;
  dispatch(batch: ScheduledBatch): PendingRunnerOutput {
    const n = this.dispatched++;
    this.events.push(`dispatch ${n}`);
    const fedAt = new Set(batch.fedTokens?.at ?? []);
    let at = 0;
    for (const s of batch.sequences) {
      for (let j = 0; j < s.tokenIds.length; j++)
        assert.equal(s.tokenIds[j] === -1, fedAt.has(at + j), `step ${n}: placeholders are exactly the fed tokens`);
      at += s.tokenIds.length;
    }
    if (batch.fedTokens !== undefined && batch.fedTokens.at.length > 0) this.fed++;
    const frozen: ScheduledBatch = { ...batch, sequences: batch.sequences.map((s) => ({ ...s, tokenIds: [...s.tokenIds] })) };
    let result: RunnerOutput | null = null;
    const run = () => {
      const fed = batch.fedTokens;
      if (fed !== undefined) {
        const ids = new Int32Array(frozen.numTokens);
        fillFedTokens(ids, fed);
        let off = 0;
        for (const s of frozen.sequences) {
          for (let j = 0; j < s.tokenIds.length; j++) if (fedAt.has(off + j)) (s.tokenIds as number[])[j] = ids[off + j]!;
          off += s.tokenIds.length;
        }
      }
      const out = this.execute(frozen);
      if (batch.sampleOnDevice === true) {
        const V = this.vocabSize;
        const ids = new Int32Array(out.logits.length / V);
        for (let r = 0; r < ids.length; r++) {
          let best = 0;
          for (let v = 1; v < V; v++) if (out.logits[r * V + v]! > out.logits[r * V + best]!) best = v;
          ids[r] = best;
        }
        result = { logits: new Float32Array(0), promptLogits: out.promptLogits, tokenIds: ids };
      } else result = out;
    };
    this.queue.push(run);
    const waitFor = (): RunnerOutput => {
      while (result === null) this.queue.shift()!();
      return result;
    };
    return {
      wait: () => {
        this.events.push(`wait ${n}`);
        return waitFor();
      },
      deviceTokens: batch.sampleOnDevice === true ? { read: () => waitFor().tokenIds! } : undefined,
    };
  }
}

test("async scheduling with device-sampled ids: the next step is dispatched before the current one is read, its placeholders fed from the device; outputs equal the synchronous engine's", () => {
  const cases: [string, Partial<EngineArgs>, Partial<SamplingParams>][] = [
    ["greedy", {}, { temperature: 0, maxTokens: 9 }],
    ["greedy, ignore eos", {}, { temperature: 0, maxTokens: 11, ignoreEos: true }],
    ["small chunks", { maxNumBatchedTokens: 5 }, { temperature: 0, maxTokens: 7 }],
    ["tiny pool", { numGpuBlocks: 20, maxNumBatchedTokens: 64 }, { temperature: 0, maxTokens: 10 }],
    ["stop tokens and strings", {}, { temperature: 0, maxTokens: 12, stopTokenIds: [7, 8, 9, 10, 11], stop: ["e"] }],
    ["max tokens, 3 sequences", { maxNumSeqs: 3 }, { temperature: 0, maxTokens: 3 }],
    ["some sampled on the host", {}, { temperature: 0, minTokens: 2, maxTokens: 8, logprobs: 1 }],
  ];
  for (const [name, args, params] of cases) {
    const base = { maxModelLen: 256, numGpuBlocks: 128, blockSize: 4, ...args };
    const runner = new DeviceFakeRunner(VOCAB);
    const core = new EngineCore(base, runner, { tokenizer });
    const sync = new EngineCore(base, new FakeModelRunner(VOCAB), { tokenizer });
    PROMPTS.forEach((p, i) => {
      // the last case mixes greedy requests with ones that need logits (sampled on the host)
      const ps = name.startsWith("some") && i % 2 === 0 ? { temperature: 0, maxTokens: 8 } : params;
      const prio = args.schedulingPolicy === "priority" ? i % 3 : 0;
      add(sync, `r${i}`, p, ps, prio);
      add(core, `r${i}`, p, ps, prio);
    });
    const want = runToCompletion(sync);
    const got = runToCompletion(core);
    for (let i = 0; i < PROMPTS.length; i++) {
      const view = (o: NonNullable<ReturnType<typeof want.get>>) =>
        o.outputs.map((c) => [c.tokenIds, c.text, c.finishReason, c.logprobs?.length ?? null]);
      assert.deepEqual(view(got.get(`r${i}`)!), view(want.get(`r${i}`)!), `${name}: r${i}`);
    }
    const s = core.stats();
    assert.equal(s.numFreeBlocks, s.numTotalBlocks, `${name}: every block is free at the end`);
    if (name.startsWith("tiny")) assert.ok(s.numPreemptions > 0, `${name}: expected preemption`);
    if (name.startsWith("some")) continue; // a batch with one row sampled on the host has no device ids to feed
    assert.ok(runner.fed > 0, `${name}: some steps were fed on the device`);
    // a fed step N+1 is dispatched before step N is waited for
    const ev = runner.events;
    let early = 0;
    for (let i = 0; i < ev.length; i++) {
      if (!ev[i]!.startsWith("dispatch")) continue;
      const n = Number(ev[i]!.split(" ")[1]);
      if (n > 0 && ev.indexOf(`wait ${n - 1}`) > i) early++;
    }
    assert.ok(early > 0, `${name}: no step was dispatched ahead of its predecessor's read: ${ev.slice(0, 12).join(", ")}`);
  }
});

test("async scheduling with device-sampled ids: a request whose placeholder reaches max_tokens is not scheduled again", () => {
  const runner = new DeviceFakeRunner(VOCAB);
  const core = new EngineCore({ maxModelLen: 256, numGpuBlocks: 64, blockSize: 4, enablePrefixCaching: false }, runner, { tokenizer });
  add(core, "short", prompt(3, 4), { temperature: 0, maxTokens: 2, ignoreEos: true });
  add(core, "long", prompt(4, 4), { temperature: 0, maxTokens: 6, ignoreEos: true });
  const out = runToCompletion(core);
  assert.equal(out.get("short")!.outputs[0]!.tokenIds.length, 2);
  assert.equal(out.get("long")!.outputs[0]!.tokenIds.length, 6);
  const steps = (id: string) => runner.log.flat().filter((s) => s.requestId === id).map((s) => [s.start, s.numTokens]);
  assert.deepEqual(steps("short"), [[0, 4], [4, 1]]);
  assert.deepEqual(steps("long"), [[0, 4], [4, 1], [5, 1], [6, 1], [7, 1], [8, 1]]);
});
