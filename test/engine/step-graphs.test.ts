// Step graphs through the engine: outputs with captured-and-replayed decode and prefill steps equal those of
// --enforce-eager (every op dispatched from JS), on real tiny models, with batches padded up to a bucket,
// sequences joining and finishing mid-way, seeded sampling and logprobs. MoE models (routed on the device) capture
// too, and give eager full recomputation's greedy tokens.
import { test } from "node:test";
import assert from "node:assert/strict";
import { LLM } from "../../src/engine/llm-engine.js";
import { decodeBuckets, mixedBuckets } from "../../src/engine/step-graphs.js";
import { PagedModelRunner } from "../../src/engine/paged-model-runner.js";
import type { RequestOutput, SamplingParams } from "../../src/engine/types.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { lastLogits } from "../helpers/model-logits.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

const PROMPTS = [
  "The jury said that",
  "In the morning, the",
  "He was not sure whether the committee",
  "A",
  "The results of the election were announced on",
];

const pagedRunner = (llm: LLM): PagedModelRunner => {
  const r = llm.engine.runner;
  assert.ok(r instanceof PagedModelRunner);
  return r;
};

function run(model: string, enforceEager: boolean, params: Partial<SamplingParams>): { outs: RequestOutput[]; llm: LLM } {
  const llm = new LLM({ model, maxModelLen: 96, kvCacheMemory: 4 << 20, maxNumSeqs: 8, enforceEager });
  // Different max_tokens: sequences finish at different steps, so buckets 8, 4, 2 and 1 all serve steps.
  const outs = PROMPTS.map((p, i) => ({ p, params: { ...params, maxTokens: 6 + 5 * i } }));
  return { outs: outs.flatMap(({ p, params: sp }) => llm.generate([p], sp)).concat(llm.generate(PROMPTS, { ...params, maxTokens: 24 })), llm };
}

test("decode buckets: powers of two up to the cap, and the cap itself", () => {
  assert.deepEqual(decodeBuckets(256), [1, 2, 4, 8, 16, 32]);
  assert.deepEqual(decodeBuckets(6), [1, 2, 4, 6]);
  assert.deepEqual(decodeBuckets(1), [1]);
  assert.deepEqual(decodeBuckets(100, 48), [1, 2, 4, 8, 16, 32, 48]);
  assert.deepEqual(mixedBuckets(2048), [4, 8, 16, 32, 64, 128, 256, 512]);
  assert.deepEqual(mixedBuckets(100), [4, 8, 16, 32, 64, 100]);
  assert.deepEqual(mixedBuckets(8), [4, 8]);
  assert.deepEqual(mixedBuckets(3), []);
});

for (const arch of ["LlamaForCausalLM", "Qwen3ForCausalLM"] as const) {
  test(`step graphs (${arch}): replayed decode steps give the eager engine's tokens and logprobs`, { timeout: 60_000 }, () => {
    const model = tinyModelDir(arch);
    for (const params of [
      { temperature: 0, ignoreEos: true }, // plain greedy: the token ids come from the graph's argmax
      { temperature: 0, ignoreEos: true, logprobs: 2 },
      { temperature: 0.9, topP: 0.9, seed: 7, ignoreEos: true, logprobs: 1 },
    ] as Partial<SamplingParams>[]) {
      const eager = run(model, true, params);
      const graphs = run(model, false, params);
      assert.equal(pagedRunner(eager.llm).graphs, null);
      const replays = pagedRunner(graphs.llm).graphs?.replays ?? 0;
      assert.ok(replays > 20, `steps were replayed (${replays})`);
      const mixed = pagedRunner(graphs.llm).graphs!.mixedReplays;
      assert.ok(mixed >= PROMPTS.length, `prefill steps were replayed (${mixed})`);
      const onDevice = pagedRunner(graphs.llm).graphs!.deviceSampled;
      const fed = pagedRunner(graphs.llm).graphs!.fedReplays;
      if (params.temperature === 0 && params.logprobs === undefined) {
        assert.equal(onDevice, replays, "plain greedy steps sample on the device");
        // async scheduling queues each decode step behind the previous one, its tokens copied on the device
        assert.ok(fed > replays / 2, `decode steps were fed on the device (${fed} of ${replays})`);
      } else {
        assert.equal(onDevice, 0, "steps needing logits read them back");
        assert.equal(fed, 0, "no step has device-sampled ids to feed from");
      }
      assert.equal(graphs.outs.length, eager.outs.length);
      graphs.outs.forEach((o, i) => {
        const e = eager.outs[i]!;
        assert.deepEqual(o.outputs[0]!.tokenIds, e.outputs[0]!.tokenIds, `request ${i}`);
        const lp = (r: RequestOutput) => r.outputs[0]!.logprobs!.map((m) => [...m.values()].map((v) => v.logprob));
        if (params.logprobs === undefined) return;
        const a = lp(o).flat();
        const b = lp(e).flat();
        assert.equal(a.length, b.length);
        a.forEach((x, j) => assert.ok(Math.abs(x - b[j]!) < 1e-4, `request ${i} logprob ${j}: ${x} vs ${b[j]}`));
      });
      // Every block is back in the pool (graphs never hold KV blocks).
      const s = graphs.llm.engine.stats();
      assert.equal(s.numFreeBlocks, s.numTotalBlocks);
    }
  });
}

// MoE models route on the device (the moe kernel): they capture decode step graphs like dense ones, with no
// fallback warning, and their greedy outputs equal eager full recomputation (a dense forward over the whole
// sequence per token, no KV cache).
for (const arch of ["MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "GptOssForCausalLM"] as const) {
  test(`step graphs: ${arch} (MoE routed on the device) captures and replays decode steps; greedy equals eager full recomputation`, { timeout: 60_000 }, () => {
    const model = tinyModelDir(arch);
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(w.message);
    process.on("warning", onWarning);
    try {
      const graphs = new LLM({ model, maxModelLen: 64, kvCacheMemory: 2 << 20, maxNumSeqs: 4 });
      const runner = pagedRunner(graphs);
      assert.notEqual(runner.graphs, null, `captured (${runner.captureFailure ?? ""})`);
      assert.equal(runner.captureFailure, null);
      const loaded = loadLocalModel(model);
      const p = { temperature: 0, maxTokens: 8, ignoreEos: true };
      const prompts = PROMPTS.slice(0, 3).map((prompt) => ({ promptTokenIds: loaded.tokenizer.encode(prompt) }));
      const got = graphs.generate(prompts, p).map((o) => o.outputs[0]!.tokenIds);
      assert.ok(runner.graphs!.replays >= 7, `decode steps replayed (${runner.graphs!.replays})`);
      got.forEach((tokens, i) => {
        const ids = [...prompts[i]!.promptTokenIds];
        const want: number[] = [];
        for (let s = 0; s < p.maxTokens; s++) want.push(argmax(lastLogits(loaded, [...ids, ...want])));
        assert.deepEqual(tokens, want, `request ${i}`);
      });
      // vLLM's warning for a model it cannot capture never appears
      assert.ok(!warnings.some((w) => /step graphs are unavailable/.test(w)), warnings.join("; "));
    } finally {
      process.off("warning", onWarning);
    }
  });
}

const argmax = (v: ArrayLike<number>): number => {
  let b = 0;
  for (let i = 1; i < v.length; i++) if (v[i]! > v[b]!) b = i;
  return b;
};

test("step graphs with async scheduling: requests stopped by a token while the next step is already scheduled give the eager engine's outputs", { timeout: 60_000 }, () => {
  const model = tinyModelDir("LlamaForCausalLM");
  const opts = { model, maxModelLen: 96, kvCacheMemory: 4 << 20, maxNumSeqs: 8 };
  const eager = new LLM({ ...opts, enforceEager: true });
  const graphs = new LLM(opts);
  assert.equal(graphs.engine.asyncScheduling, true);
  // stop tokens that greedy continuations first produce some tokens in, so requests end at different steps
  const free = eager.generate(PROMPTS, { temperature: 0, ignoreEos: true, maxTokens: 24 });
  const firstNew = (ids: readonly number[], from: number) => ids.find((t, j) => j >= from && !ids.slice(0, j).includes(t));
  const stopTokenIds = [firstNew(free[0]!.outputs[0]!.tokenIds, 6), firstNew(free[1]!.outputs[0]!.tokenIds, 10)].filter((t) => t !== undefined);
  const params: Partial<SamplingParams> = { temperature: 0, maxTokens: 24, stopTokenIds };
  const want = eager.generate(PROMPTS, params);
  const got = graphs.generate(PROMPTS, params);
  assert.ok(want.some((o) => o.outputs[0]!.finishReason === "stop" && o.outputs[0]!.tokenIds.length < 24), "some request stops early on a token");
  got.forEach((o, i) => {
    assert.deepEqual(o.outputs[0]!.tokenIds, want[i]!.outputs[0]!.tokenIds, `request ${i}`);
    assert.equal(o.outputs[0]!.finishReason, want[i]!.outputs[0]!.finishReason, `request ${i}`);
    assert.equal(o.outputs[0]!.text, want[i]!.outputs[0]!.text, `request ${i}`);
  });
  // a second round reuses the freed blocks (and the prefix cache) and still matches
  assert.ok(pagedRunner(graphs).graphs!.fedReplays > 10, "decode steps were fed on the device");
  const again = graphs.generate(PROMPTS, params);
  again.forEach((o, i) => assert.deepEqual(o.outputs[0]!.tokenIds, want[i]!.outputs[0]!.tokenIds, `request ${i}, second round`));
  const s = graphs.engine.stats();
  assert.equal(s.numFreeBlocks, s.numTotalBlocks);
});
