// OutputPacer: which engine steps' outputs reach a consumer under --stream-interval and final-only delivery, and
// the token steps each delivered output carries (their sum is the tokens the consumer had not seen yet).
import assert from "node:assert/strict";
import { test } from "node:test";
import { FINAL_ONLY_FLUSH_MS, OutputPacer } from "../../src/engine/output-pacing.js";
import type { RequestOutput } from "../../src/engine/types.js";

/** A cumulative output holding `tokens` tokens per sample. */
function output(tokens: number[], finished = false): RequestOutput {
  return {
    requestId: "r", prompt: null, promptTokenIds: [1], promptLogprobs: null, finished, numCachedTokens: 0,
    outputs: tokens.map((n, index) => ({ index, text: "x".repeat(n), tokenIds: Array.from({ length: n }, (_, i) => i), logprobs: null, cumulativeLogprob: null, finishReason: finished ? "length" : null, stopReason: null })),
  };
}

/** Offers outputs of 0 (a prompt chunk), then 1, 2, ... tokens at 10 ms steps, the last finished; returns what was delivered. */
function run(pacer: OutputPacer, totals: number[][], stepMs = 10): { at: number; steps: { time: number; tokens: number }[] }[] {
  const got: { at: number; steps: { time: number; tokens: number }[] }[] = [];
  totals.forEach((t, i) => {
    const steps = pacer.offer(output(t, i === totals.length - 1), 1000 + i * stepMs);
    if (steps !== null) got.push({ at: i, steps });
  });
  return got;
}

test("OutputPacer: stream interval 1 without finalOnly paces nothing; an interval below 1 or fractional is refused", () => {
  assert.equal(new OutputPacer(1, false).paced, false);
  assert.equal(new OutputPacer(2, false).paced, true);
  assert.equal(new OutputPacer(1, true).paced, true);
  for (const bad of [0, -1, 1.5, Number.NaN]) assert.throws(() => new OutputPacer(bad, false), RangeError);
});

test("OutputPacer: interval 4 delivers the first output, the first token, then every 4 tokens, and the finished output", () => {
  // step 0: a prompt chunk (no token); steps 1..10: one token each; step 10 finishes
  const totals = [[0], ...Array.from({ length: 10 }, (_, i) => [i + 1])];
  const got = run(new OutputPacer(4, false), totals);
  assert.deepEqual(got.map((g) => g.at), [0, 1, 5, 9, 10]);
  assert.deepEqual(got.map((g) => g.steps.reduce((a, s) => a + s.tokens, 0)), [0, 1, 4, 4, 1]);
  // each step keeps its own time (10 ms apart), in order
  assert.deepEqual(got[2]!.steps.map((s) => s.time), [1020, 1030, 1040, 1050]);
});

test("OutputPacer: several samples count together; a step adding 3 tokens at once is one step of 3", () => {
  const got = run(new OutputPacer(4, false), [[1, 1], [2, 2], [3, 4], [4, 5]]);
  assert.deepEqual(got.map((g) => g.at), [0, 2, 3]);
  assert.deepEqual(got[1]!.steps, [{ time: 1010, tokens: 2 }, { time: 1020, tokens: 3 }]);
  assert.deepEqual(got[2]!.steps, [{ time: 1030, tokens: 2 }]);
});

test(`OutputPacer: finalOnly delivers the first token, then at most every ${FINAL_ONLY_FLUSH_MS} ms, and the finished output`, () => {
  const totals = Array.from({ length: 60 }, (_, i) => [i + 1]); // 60 tokens, 10 ms apart
  const got = run(new OutputPacer(1, true), totals);
  const flushSteps = FINAL_ONLY_FLUSH_MS / 10;
  assert.deepEqual(got.map((g) => g.at), [0, flushSteps, 2 * flushSteps, 59]);
  const delivered = got.map((g) => g.steps.reduce((a, s) => a + s.tokens, 0));
  assert.equal(delivered.reduce((a, b) => a + b, 0), 60, "every token's step is delivered once");
  assert.deepEqual(delivered, [1, flushSteps, flushSteps, 59 - 2 * flushSteps]);
  // a request finishing before the first flush: its first token, then all the rest with the finished output
  const short = run(new OutputPacer(1, true), [[1], [2], [3]]);
  assert.deepEqual(short.map((g) => g.at), [0, 2]);
});
