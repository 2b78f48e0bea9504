import { test } from "node:test";
import assert from "node:assert/strict";
import { AsyncLLM } from "../../src/engine/async-llm.js";
import { EngineInputError, EngineRequestIdError } from "../../src/engine/errors.js";
import { FakeModelRunner } from "../../src/engine/fake-model-runner.js";
import { LLM } from "../../src/engine/llm-engine.js";
import type { EngineArgs } from "../../src/engine/engine-core.js";
import type { RequestOutput, SamplingParams } from "../../src/engine/types.js";
import { add, makeEngine, prompt, runToCompletion, tokenizer, VOCAB } from "./helpers.js";

// 16 prompts, some sharing long prefixes so the prefix cache has work to do.
const shared = prompt(99, 12);
const PROMPTS = Array.from({ length: 16 }, (_, i) => (i % 3 === 0 ? [...shared, ...prompt(i, 3 + i)] : prompt(i, 5 + ((i * 7) % 29))));

function runBatch(
  args: Partial<EngineArgs>,
  params: Partial<SamplingParams>,
): { tokens: number[][]; preemptions: number; free: number; total: number } {
  const { core } = makeEngine(args);
  PROMPTS.forEach((p, i) => add(core, `r${i}`, p, params));
  const out = runToCompletion(core);
  const s = core.stats();
  return {
    tokens: PROMPTS.map((_, i) => out.get(`r${i}`)!.outputs[0]!.tokenIds),
    preemptions: s.numPreemptions,
    free: s.numFreeBlocks,
    total: s.numTotalBlocks,
  };
}

test("engine: outputs are batch-invariant across caching, chunk size and preemption", () => {
  for (const params of [
    { temperature: 0, maxTokens: 12 },
    { temperature: 0.8, topK: 20, seed: 3, maxTokens: 12 },
  ] as Partial<SamplingParams>[]) {
    const alone = PROMPTS.map((p) => {
      const { core } = makeEngine();
      add(core, "x", p, params);
      return runToCompletion(core).get("x")!.outputs[0]!.tokenIds;
    });
    const configs: [string, Partial<EngineArgs>][] = [
      ["prefix caching on", {}],
      ["prefix caching off", { enablePrefixCaching: false }],
      ["small chunks", { maxNumBatchedTokens: 5 }],
      ["tiny pool", { numGpuBlocks: 20, maxNumBatchedTokens: 64 }],
      ["tiny pool, no caching, priority", { numGpuBlocks: 20, enablePrefixCaching: false, schedulingPolicy: "priority" }],
    ];
    for (const [name, args] of configs) {
      const r = runBatch(args, params);
      assert.deepEqual(r.tokens, alone, name);
      assert.equal(r.free, r.total, `${name}: every block is free at the end`);
      if (name.startsWith("tiny")) assert.ok(r.preemptions > 0, `${name}: expected preemption`);
    }
  }
});

test("engine: abort frees every block at once; the stream ends with finish reason abort", () => {
  const { core } = makeEngine({ enablePrefixCaching: false });
  const start = core.stats().numFreeBlocks;
  for (let i = 0; i < 3; i++) add(core, `a${i}`, prompt(i, 9), { maxTokens: 50, ignoreEos: true });
  core.step();
  core.step();
  assert.ok(core.stats().numFreeBlocks < start);
  const outs = core.abortRequest(["a0", "a1", "a2", "unknown"]);
  assert.equal(outs.length, 3);
  assert.ok(outs.every((o) => o.finished && o.outputs[0]!.finishReason === "abort"));
  assert.equal(core.stats().numFreeBlocks, start);
  assert.equal(core.hasUnfinishedRequests(), false);
});

test("engine: over-long and never-fitting prompts are rejected while others keep running", () => {
  const { core } = makeEngine({ maxModelLen: 64, numGpuBlocks: 9 }); // 8 usable blocks of 4 = 32 slots
  add(core, "ok", prompt(1, 6), { temperature: 0, maxTokens: 6 });
  core.step();
  const rejects: [number[], Partial<SamplingParams>, string][] = [
    [prompt(2, 65), {}, "prompt"],
    [prompt(2, 40), {}, "prompt"],
    [prompt(2, 20), { maxTokens: 20 }, "max_tokens"],
    [[], {}, "prompt"],
    [[VOCAB], {}, "prompt_token_ids"],
    [prompt(2, 3), { topP: 2 }, "top_p"],
  ];
  for (const [p, params, name] of rejects) {
    assert.throws(
      () => add(core, "bad", p, params),
      (e: unknown) => e instanceof EngineInputError && e.param === name,
      name,
    );
  }
  const out = runToCompletion(core);
  assert.equal(out.get("ok")!.outputs[0]!.tokenIds.length, 6);
  // The rejected id was never registered: it can be reused.
  add(core, "bad", prompt(2, 3), { maxTokens: 1 });
  assert.ok(runToCompletion(core).get("bad")!.finished);
});

/** Runner override that makes the model spell `text` (then EOS), whatever the prompt. */
function spell(text: string, promptLen: number): (ctx: readonly number[], row: Float32Array) => void {
  const ids = tokenizer.encode(text, { addSpecialTokens: false });
  return (ctx, row) => {
    const k = ctx.length - promptLen;
    row[k < ids.length ? ids[k]! : 2] = 1000;
  };
}

test("engine: stop strings across token boundaries, with and without include_stop_str_in_output", () => {
  const text = "hello world 🙂 ok";
  const { core } = makeEngine({}, { override: spell(text, 3) });
  const p = [5, 6, 7];
  add(core, "span", p, { temperature: 0, stop: ["lo w"] });
  add(core, "incl", p, { temperature: 0, stop: ["lo w"], includeStopStrInOutput: true });
  add(core, "emoji", p, { temperature: 0, stop: ["🙂"], maxTokens: 30 });
  add(core, "eos", p, { temperature: 0, maxTokens: 30 });
  add(core, "stoptok", p, { temperature: 0, stopTokenIds: [tokenizer.encode("w", { addSpecialTokens: false })[0]!] });
  const out = runToCompletion(core);
  const o = (id: string) => out.get(id)!.outputs[0]!;
  assert.deepEqual([o("span").text, o("span").finishReason, o("span").stopReason], ["hel", "stop", "lo w"]);
  assert.equal(o("incl").text, "hello w");
  assert.equal(o("emoji").text, "hello world ");
  assert.deepEqual([o("eos").text, o("eos").finishReason, o("eos").stopReason], [text, "stop", null]);
  assert.deepEqual([o("stoptok").text, o("stoptok").stopReason], ["hello ", 25]);
});

test("engine: stop strings count only after min_tokens tokens and only when they end after them (vLLM's detokenizer)", () => {
  const text = "hello hello world";
  const ids = tokenizer.encode(text, { addSpecialTokens: false });
  const first = tokenizer.decode(ids.slice(0, 1));
  const { core } = makeEngine({}, { override: spell(text, 3) });
  const p = [5, 6, 7];
  add(core, "none", p, { temperature: 0, stop: [first] });
  add(core, "min1", p, { temperature: 0, stop: [first], minTokens: 1, maxTokens: 30 });
  const out = runToCompletion(core);
  const o = (id: string) => out.get(id)!.outputs[0]!;
  assert.deepEqual([o("none").text, o("none").stopReason], ["", first]);
  // The first token's stop string ends inside min_tokens: skipped; the next occurrence stops it.
  const at = text.indexOf(first, first.length);
  assert.ok(at > 0, `"${first}" occurs again in "${text}"`);
  assert.deepEqual([o("min1").text, o("min1").stopReason], [text.slice(0, at), first]);
});

test("engine: a non-zero priority needs --scheduling-policy priority, as in vLLM", () => {
  const { core } = makeEngine();
  assert.throws(() => core.addRequest({ requestId: "p", promptTokenIds: [5, 6], params: {}, priority: 5 }), /Got priority 5 but Priority scheduling is not enabled/);
  const { core: prio } = makeEngine({ schedulingPolicy: "priority" });
  prio.addRequest({ requestId: "p", promptTokenIds: [5, 6], params: { maxTokens: 1 }, priority: 5 });
  assert.equal(runToCompletion(prio).get("p")!.outputs[0]!.tokenIds.length, 1);
});

test("engine: n=2 children share the prompt's blocks and give distinct seeded samples", () => {
  const { core } = makeEngine();
  add(core, "r", prompt(3, 13), { n: 2, temperature: 1, seed: 7, maxTokens: 6, ignoreEos: true });
  core.step();
  const t0 = core.kv.getBlockIds("0_r");
  const t1 = core.kv.getBlockIds("1_r");
  assert.deepEqual(t0.slice(0, 3), t1.slice(0, 3));
  assert.notEqual(t0[3], t1[3]);
  assert.equal(core.kv.pool.blocks[t0[0]!]!.refCnt, 2);
  const out = runToCompletion(core).get("r")!;
  assert.equal(out.outputs.length, 2);
  assert.deepEqual(
    out.outputs.map((c) => c.index),
    [0, 1],
  );
  assert.notDeepEqual(out.outputs[0]!.tokenIds, out.outputs[1]!.tokenIds);
  assert.equal(core.stats().numFreeBlocks, core.stats().numTotalBlocks);
});

test("engine: a request id that is a live sample's id (\"0_r\" beside r with n=2) is refused, not run on that sample's blocks", () => {
  const greedy = { temperature: 0, maxTokens: 6, ignoreEos: true };
  const alone = (id: string, p: number[], params: Partial<SamplingParams>) => {
    const { core } = makeEngine();
    add(core, id, p, params);
    return runToCompletion(core).get(id)!.outputs.map((c) => c.tokenIds);
  };
  for (const [first, second] of [
    [["r", prompt(3, 9), { ...greedy, n: 2 }], ["0_r", prompt(4, 7), greedy]],
    [["0_r", prompt(4, 7), greedy], ["r", prompt(3, 9), { ...greedy, n: 2 }]],
  ] as const) {
    const { core } = makeEngine();
    add(core, first[0], first[1], first[2]);
    core.step();
    assert.throws(
      () => add(core, second[0], second[1], second[2]),
      (e: unknown) => e instanceof EngineRequestIdError && e.requestId === second[0] && /is already in use \("0_r" is sample 0 of request "(0_)?r"\)/.test(e.message),
    );
    assert.deepEqual(runToCompletion(core).get(first[0])!.outputs.map((c) => c.tokenIds), alone(first[0], first[1], first[2]));
    assert.equal(core.stats().numFreeBlocks, core.stats().numTotalBlocks);
    add(core, second[0], second[1], second[2]); // free again once the other has finished
    assert.deepEqual(runToCompletion(core).get(second[0])!.outputs.map((c) => c.tokenIds), alone(second[0], second[1], second[2]));
  }
});

test("engine: prompt logprobs cover every prompt token after the first", () => {
  const { core } = makeEngine({ maxNumBatchedTokens: 4 });
  const p = prompt(8, 10);
  add(core, "r", p, { temperature: 0, maxTokens: 2, promptLogprobs: 2 });
  const out = runToCompletion(core).get("r")!;
  assert.equal(out.promptLogprobs!.length, 10);
  assert.equal(out.promptLogprobs![0], null);
  for (let i = 1; i < 10; i++) {
    const e = out.promptLogprobs![i]!;
    assert.ok(e.has(p[i]!));
    assert.ok(e.size >= 2 && e.size <= 3);
  }
});

test("engine: final_only requests give one output, the finished one, equal to a cumulative request's last", () => {
  const { core } = makeEngine({ enablePrefixCaching: false }); // no cached tokens for the second of two equal prompts
  const params = { temperature: 0.8, seed: 5, maxTokens: 9, stop: ["zz"] };
  core.addRequest({ requestId: "cum", promptTokenIds: prompt(3, 7), params });
  core.addRequest({ requestId: "fin", promptTokenIds: prompt(3, 7), params, outputKind: "final_only" });
  const seen = new Map<string, RequestOutput[]>([["cum", []], ["fin", []]]);
  while (core.hasUnfinishedRequests()) for (const o of core.step()) seen.get(o.requestId)!.push(o);
  const cum = seen.get("cum")!, fin = seen.get("fin")!;
  assert.ok(cum.length > 2, "the cumulative request reports as it goes");
  assert.equal(fin.length, 1);
  assert.equal(fin[0]!.finished, true);
  assert.deepEqual({ ...fin[0]!, requestId: "cum", metrics: null }, { ...cum.at(-1)!, metrics: null });
  assert.throws(
    () => core.addRequest({ requestId: "bad", promptTokenIds: [1], outputKind: "delta" as never }),
    (e: unknown) => e instanceof EngineInputError && /output_kind/.test(e.message),
  );
  assert.equal(core.hasUnfinishedRequests(), false, "the rejected request was not queued");
});

test("LLM.generate and LLM.chat run to completion in input order", () => {
  const llm = new LLM({ runner: new FakeModelRunner(VOCAB), tokenizer, engineArgs: { maxModelLen: 128, numGpuBlocks: 64, blockSize: 4 } });
  const outs = llm.generate(["hello", { promptTokenIds: prompt(1, 5) }, "日本 é"], { temperature: 0, maxTokens: 5 });
  assert.equal(outs.length, 3);
  assert.deepEqual(
    outs.map((o) => o.promptTokenIds[0]),
    [1, prompt(1, 5)[0], 1],
  );
  assert.ok(outs.every((o) => o.finished));
  const chat = llm.chat([{ role: "user", content: "hi" }], { temperature: 0, maxTokens: 3 });
  assert.equal(chat.length, 1);
  assert.equal(chat[0]!.prompt, "u hi\na ");
  assert.throws(() => llm.generate(["ok", "bad \u0001"]), /cannot encode/);
  assert.equal(llm.engine.hasUnfinishedRequests(), false);
});

test("AsyncLLM streams deltas that add up to the offline result, and abort ends a stream", async () => {
  const engineArgs = { maxModelLen: 128, numGpuBlocks: 64, blockSize: 4 };
  const params = { temperature: 0, maxTokens: 8, ignoreEos: true };
  const ref = new LLM({ runner: new FakeModelRunner(VOCAB), tokenizer, engineArgs }).generate(
    [{ promptTokenIds: prompt(2, 6) }],
    params,
  )[0]!;
  const llm = new AsyncLLM({ runner: new FakeModelRunner(VOCAB), tokenizer, engineArgs });
  const collect = async (id: string): Promise<{ text: string; tokens: number[]; n: number }> => {
    let text = "";
    const tokens: number[] = [];
    let n = 0;
    for await (const o of llm.generate({ promptTokenIds: prompt(2, 6) }, params, { requestId: id, delta: true })) {
      text += o.outputs[0]!.text;
      tokens.push(...o.outputs[0]!.tokenIds);
      n++;
    }
    return { text, tokens, n };
  };
  const stopEarly = (async () => {
    let n = 0;
    for await (const o of llm.generate({ promptTokenIds: prompt(3, 6) }, { ...params, maxTokens: 100 }, { requestId: "early" }))
      if (++n === 2 || o.finished) break;
    return n;
  })();
  const [a, b, early] = await Promise.all([collect("a"), collect("b"), stopEarly]);
  assert.equal(early, 2);
  for (const r of [a, b]) {
    assert.deepEqual(r.tokens, ref.outputs[0]!.tokenIds);
    assert.equal(r.text, ref.outputs[0]!.text);
    assert.equal(r.n, 8);
  }
  assert.throws(() => llm.generate({ promptTokenIds: [] }, {}, { requestId: "x" }), EngineInputError);
  assert.equal(llm.stats().numFreeBlocks, llm.stats().numTotalBlocks);
  assert.equal(llm.stats().numRunning, 0);
});

test("engine: the tokenizer's EOS stops with no stop_reason; generation_config's other end ids name themselves, as vLLM's stop tokens", async () => {
  const { EngineCore } = await import("../../src/engine/engine-core.js");
  for (const [end, reason] of [[2, null], [3, 3]] as const) {
    const runner = new FakeModelRunner(VOCAB, { override: (ctx, row) => void (row[ctx.length > 4 ? end : 9] = 1000) });
    const core = new EngineCore({ maxModelLen: 64, numGpuBlocks: 32, blockSize: 4, eosTokenIds: [2, 3] }, runner, { tokenizer: null });
    core.addRequest({ requestId: "r", promptTokenIds: [5, 6, 7, 8], params: { temperature: 0, maxTokens: 8 } });
    const o = runToCompletion(core).get("r")!.outputs[0]!;
    assert.deepEqual([o.finishReason, o.stopReason, o.tokenIds.at(-1)], ["stop", reason, end]);
  }
});

test("engine: max_model_len ends a request before min_tokens is reached (vLLM checks the length first)", () => {
  // maxModelLen 32: a 29-token prompt leaves room for 3 tokens, fewer than min_tokens; a pool of exactly 32 tokens
  const { core } = makeEngine({ maxModelLen: 32, numGpuBlocks: 9, blockSize: 4 });
  add(core, "m", prompt(3, 29), { temperature: 0, maxTokens: 3, minTokens: 3, ignoreEos: true });
  add(core, "n", prompt(4, 30), { temperature: 0, minTokens: 5 });
  const out = runToCompletion(core, 200);
  assert.deepEqual([out.get("m")!.outputs[0]!.tokenIds.length, out.get("m")!.outputs[0]!.finishReason], [3, "length"]);
  assert.deepEqual([out.get("n")!.outputs[0]!.tokenIds.length, out.get("n")!.outputs[0]!.finishReason], [2, "length"]);
});
