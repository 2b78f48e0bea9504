// Shared engine-test helpers: an EngineCore over the fake runner and the fake tokenizer.
import { EngineCore, type EngineArgs } from "../../src/engine/engine-core.js";
import { FakeModelRunner, type FakeModelRunnerOptions } from "../../src/engine/fake-model-runner.js";
import type { RequestOutput, SamplingParams } from "../../src/engine/types.js";
import { FakeTokenizer } from "./fake-tokenizer.js";

export const tokenizer = new FakeTokenizer();
export const VOCAB = tokenizer.vocabSize;

export function makeEngine(
  args: Partial<EngineArgs> = {},
  runnerOptions: FakeModelRunnerOptions = {},
): { core: EngineCore; runner: FakeModelRunner } {
  const runner = new FakeModelRunner(VOCAB, runnerOptions);
  const core = new EngineCore({ maxModelLen: 256, numGpuBlocks: 128, blockSize: 4, ...args }, runner, { tokenizer });
  return { core, runner };
}

/** Steps until idle; returns the final output of every request. */
export function runToCompletion(core: EngineCore, maxSteps = 10_000): Map<string, RequestOutput> {
  const done = new Map<string, RequestOutput>();
  for (let i = 0; core.hasUnfinishedRequests(); i++) {
    if (i >= maxSteps) throw new Error("engine did not finish");
    for (const o of core.step()) if (o.finished) done.set(o.requestId, o);
  }
  return done;
}

/** Deterministic prompt of `len` ids in [3, VOCAB), varying with `seed`. */
export function prompt(seed: number, len: number): number[] {
  return Array.from({ length: len }, (_, i) => 3 + ((seed * 7919 + i * 31 + ((i * i) ^ seed)) % (VOCAB - 3)));
}

export function add(
  core: EngineCore,
  requestId: string,
  promptTokenIds: number[],
  params: Partial<SamplingParams> = {},
  priority = 0,
): void {
  core.addRequest({ requestId, promptTokenIds, params, priority });
}
