// Speculative decoding with n-gram drafts: hand-computed proposals; greedy outputs token for token those without
// speculation (on the KV-checking fake runner and on a real tiny model, captured and eager); sampled outputs
// follow the model's own distribution (an exact Markov-chain marginal, computed by hand); stops inside an
// accepted run; under structured output, greedy outputs unchanged and draft masks those of a matcher that accepted
// the drafts; typed errors for bad configs.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { LLM } from "../../src/engine/llm-engine.js";
import { EngineInputError } from "../../src/engine/errors.js";
import { proposeNgram, resolveSpeculativeConfig } from "../../src/engine/speculative.js";
import type { EngineArgs } from "../../src/engine/engine-core.js";
import type { SamplingParams } from "../../src/engine/types.js";
import { DEFAULT_MODEL_DIR } from "../../src/cli/default-model.js";
import { RequestGrammar, StructuredOutputManager, applyBitmask, structuredOutputSpec } from "../../src/engine/structured-output.js";
import { Tokenizer } from "../../src/models/tokenizer.js";
import { add, makeEngine, runToCompletion } from "./helpers.js";

const NGRAM = { method: "ngram" as const, numSpeculativeTokens: 3, promptLookupMax: 3 };

describe("n-gram proposals", () => {
  it("take the longest suffix n-gram's latest occurrence followed by k tokens, else its earliest", () => {
    // suffix [1, 2] last occurs at 3..4 (before the suffix itself), followed by 9, 1, 2
    assert.deepEqual(proposeNgram([1, 2, 7, 1, 2, 9, 1, 2], 1, 3, 3), [9, 1, 2]);
    assert.deepEqual(proposeNgram([1, 2, 7, 1, 2, 9, 1, 2], 1, 3, 2), [9, 1]);
    // k = 4: the latest occurrence (at 3) has 3 tokens after it, the one at 0 has 4
    assert.deepEqual(proposeNgram([1, 2, 7, 1, 2, 9, 1, 2], 1, 3, 4), [7, 1, 2, 9]);
    // k = 7: none has 7; the earliest has the most (to the end)
    assert.deepEqual(proposeNgram([1, 2, 7, 1, 2, 9, 1, 2], 1, 3, 7), [7, 1, 2, 9, 1, 2]);
    // a loop of one token: the latest occurrence with 3 tokens after it, not the one just before the suffix
    assert.deepEqual(proposeNgram([4, 8, 8, 8, 8, 8], 1, 2, 3), [8, 8, 8]);
    // the 3-gram [5, 1, 2] beats the later 2-gram match [1, 2]
    assert.deepEqual(proposeNgram([5, 1, 2, 8, 4, 1, 2, 6, 5, 1, 2], 1, 3, 2), [8, 4]);
    assert.deepEqual(proposeNgram([5, 1, 2, 8, 4, 1, 2, 6, 5, 1, 2], 1, 2, 2), [6, 5]);
    assert.deepEqual(proposeNgram([1, 2, 3, 4], 1, 3, 3), []); // nothing repeats
    assert.deepEqual(proposeNgram([3, 3], 2, 3, 3), []); // below the shortest n
    assert.deepEqual(proposeNgram([3, 3], 1, 3, 3), [3]); // runs to the end of what is known
  });

  it("configs are checked", () => {
    assert.deepEqual(resolveSpeculativeConfig({ method: "ngram", numSpeculativeTokens: 2 }), {
      method: "ngram",
      numSpeculativeTokens: 2,
      promptLookupMax: 5,
      promptLookupMin: 1,
    });
    assert.throws(() => resolveSpeculativeConfig({ method: "medusa" as "ngram", numSpeculativeTokens: 2 }), /not supported/);
    assert.throws(() => resolveSpeculativeConfig({ method: "ngram", numSpeculativeTokens: 0 }), /numSpeculativeTokens/);
    assert.throws(() => resolveSpeculativeConfig({ method: "ngram", num_speculative_tokens: 2 } as object), /unknown key "num_speculative_tokens".*numSpeculativeTokens/);
    assert.throws(() => resolveSpeculativeConfig({ method: "ngram", numSpeculativeTokens: 2, promptLookupMin: 4, promptLookupMax: 2 }), /promptLookupMax/);
    assert.throws(() => makeEngine({ speculativeConfig: NGRAM, asyncScheduling: true }), /cannot be combined/);
  });
});

/** A fake model that mostly continues period-3 patterns (so drafts are often right), with hash noise. */
const periodic = (boost: number) => ({
  override: (ctx: readonly number[], row: Float32Array): void => {
    if (ctx.length >= 3) row[ctx[ctx.length - 3]!] += boost;
  },
});

describe("speculative decoding on the fake runner", () => {
  type Case = [string, number[], Partial<SamplingParams>];
  // processed logprobs: a row that saw another output history would report other values
  const run = (spec: boolean, boost: number, cases: Case[], args: Partial<EngineArgs> = {}) => {
    const { core } = makeEngine({ logprobsMode: "processed_logprobs", ...args, ...(spec ? { speculativeConfig: NGRAM } : {}) }, periodic(boost));
    for (const [id, p, params] of cases) add(core, id, p, params);
    const outs = runToCompletion(core);
    return { outs, steps: core.numSteps, stats: { ...core.scheduler.specStats } };
  };
  const same = (cases: Case[], boost: number, args: Partial<EngineArgs> = {}) => {
    const base = run(false, boost, cases, args);
    const spec = run(true, boost, cases, args);
    for (const [id] of cases) {
      const a = base.outs.get(id)!;
      const b = spec.outs.get(id)!;
      assert.deepEqual(b.outputs.map((o) => o.tokenIds), a.outputs.map((o) => o.tokenIds), id);
      assert.deepEqual(b.outputs.map((o) => o.logprobs), a.outputs.map((o) => o.logprobs), id);
      assert.deepEqual(b.outputs.map((o) => o.finishReason), a.outputs.map((o) => o.finishReason), id);
    }
    return { base, spec };
  };

  it("greedy outputs equal those without speculation, with drafts accepted and fewer steps", () => {
    const { base, spec } = same(
      [
        ["a", [5, 6, 7, 5, 6, 7, 5], { temperature: 0, maxTokens: 40, ignoreEos: true }],
        ["b", [9, 10, 11, 12], { temperature: 0, maxTokens: 17, ignoreEos: true }],
        ["c", [5, 6, 7, 5, 6], { temperature: 0, maxTokens: 23, stopTokenIds: [7] }], // stops on the first 7
        ["d", [20, 21, 22, 20, 21, 22, 20, 21], { temperature: 0, maxTokens: 30, ignoreEos: true, n: 2 }],
      ],
      6,
    );
    assert.equal(spec.outs.get("a")!.outputs[0]!.tokenIds.length, 40);
    assert.equal(spec.outs.get("b")!.outputs[0]!.tokenIds.length, 17);
    assert.equal(spec.outs.get("c")!.outputs[0]!.stopReason, 7);
    assert.ok(spec.stats.acceptedTokens > 20 && spec.stats.acceptedTokens <= spec.stats.draftTokens, JSON.stringify(spec.stats));
    assert.ok(spec.steps < base.steps * 0.7, `${spec.steps} steps vs ${base.steps}`);
  });

  it("each draft row sees the drafts before it as output: penalties, min_tokens and logprobs match", () => {
    // a weaker pattern, so that penalties and min_tokens' masks change tokens
    const { spec } = same(
      [
        ["e", [5, 6, 7, 5, 6, 7, 5], { temperature: 0, maxTokens: 40, ignoreEos: true, repetitionPenalty: 1.3, frequencyPenalty: 0.4, logprobs: 2 }],
        ["f", [8, 9, 10, 8, 9, 10, 8], { temperature: 0, maxTokens: 40, minTokens: 13, stopTokenIds: [9, 10], logprobs: 1 }],
        ["g", [11, 12, 13, 11, 12, 13, 11], { temperature: 0, maxTokens: 40, ignoreEos: true, presencePenalty: 1.5, logprobs: 1 }],
      ],
      5,
    );
    assert.ok(spec.stats.acceptedTokens > 5, JSON.stringify(spec.stats));
  });

  it("a request still reading its prompt gets no drafts (one-token prefill chunks)", () => {
    const { spec } = same(
      [
        ["h", [5, 6, 7, 5, 6, 7, 5, 6], { temperature: 0, maxTokens: 20, ignoreEos: true }],
        ["i", [9, 10, 11, 9, 10], { temperature: 0, maxTokens: 20, ignoreEos: true }],
      ],
      6,
      { longPrefillTokenThreshold: 1 },
    );
    assert.ok(spec.stats.acceptedTokens > 10, JSON.stringify(spec.stats));
  });

  it("a request whose drafts keep being rejected backs off (1, 2, 4, ... steps without drafts)", () => {
    // no pattern in the model: the repetitive prompt's n-grams draft, and the drafts are wrong
    const { spec } = same([["j", [5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6], { temperature: 0, maxTokens: 100, ignoreEos: true }]], 0);
    assert.equal(spec.stats.acceptedTokens, 0);
    assert.ok(spec.stats.draftTokens > 0 && spec.stats.draftTokens < 40, JSON.stringify(spec.stats)); // 134 without the back-off
  });

  it("sampled tokens follow the model's distribution: the exact marginal of a 3-token Markov chain", () => {
    // tokens 5, 6, 7 only; P(next | last) = softmax of row `last` of L (hand-chosen), other tokens masked out
    const T = [5, 6, 7];
    const L: Record<number, number[]> = { 5: [2, 0, 0], 6: [0, 1.5, 0], 7: [0, 0, 1] };
    const chain = {
      override: (ctx: readonly number[], row: Float32Array): void => {
        row.fill(-Infinity);
        const l = L[ctx[ctx.length - 1]!]!;
        T.forEach((t, i) => (row[t] = l[i]!));
      },
    };
    const P = T.map((t) => {
      const e = L[t]!.map(Math.exp);
      const z = e.reduce((a, b) => a + b, 0);
      return e.map((x) => x / z);
    });
    // distribution of the 4th generated token after the prompt's last token 5: e0 P^4
    let d = [1, 0, 0];
    for (let k = 0; k < 4; k++) d = [0, 1, 2].map((j) => d.reduce((s, di, i) => s + di * P[i]![j]!, 0));
    const N = 600;
    const counts = (spec: boolean): number[] => {
      const { core } = makeEngine({ ...(spec ? { speculativeConfig: NGRAM } : {}), numGpuBlocks: 1024 }, chain);
      for (let i = 0; i < N; i++) add(core, `r${i}`, [5, 6, 7, 5, 6, 7, 5], { temperature: 1, seed: 1000 + i, maxTokens: 6, ignoreEos: true });
      const outs = runToCompletion(core);
      if (spec) assert.ok(core.scheduler.specStats.acceptedTokens > N / 4, `drafts were accepted: ${JSON.stringify(core.scheduler.specStats)}`);
      const c = [0, 0, 0];
      for (const o of outs.values()) c[T.indexOf(o.outputs[0]!.tokenIds[3]!)]!++;
      return c;
    };
    for (const spec of [false, true]) {
      const c = counts(spec);
      const chi2 = c.reduce((s, x, j) => s + (x - N * d[j]!) ** 2 / (N * d[j]!), 0);
      assert.ok(chi2 < 13.8, `spec=${spec}: counts ${c} vs expected ${d.map((x) => (x * N).toFixed(1))} (chi2 ${chi2.toFixed(2)}, 2 dof, p = 0.001)`);
    }
  });
});

describe("speculative decoding on a real model (the built-in one, float32)", () => {
  const dir = DEFAULT_MODEL_DIR; // trained: its drafts are often right
  const prompts = ["The cat sat on the mat. The cat sat on the mat. The cat sat on the", "Once upon a time", "def f(x):\n    return x\n\ndef g(x):"];
  const params = { temperature: 0, maxTokens: 64, ignoreEos: true };
  const base = new LLM({ model: dir, maxModelLen: 256, enforceEager: true }).generate(prompts, params);
  for (const enforceEager of [false, true]) {
    it(`greedy outputs equal those without speculation (${enforceEager ? "eager" : "step graphs"})`, () => {
      const llm = new LLM({ model: dir, maxModelLen: 256, enforceEager, speculativeConfig: { method: "ngram", numSpeculativeTokens: 4, promptLookupMax: 4 } });
      const outs = llm.generate(prompts, params);
      outs.forEach((o, i) => assert.deepEqual(o.outputs[0]!.tokenIds, base[i]!.outputs[0]!.tokenIds, prompts[i]));
      assert.ok(llm.engine.scheduler.specStats.acceptedTokens > 0);
    });
  }

  it("structured output: drafts only the grammar allows, rows masked after their drafts; greedy outputs unchanged", () => {
    // no "w": the n-gram's proposals that repeat a "w" of the context are cut there, the rest verified
    const so = { temperature: 0, maxTokens: 64, structuredOutputs: { regex: "[ a-vx-z.]{1,200}" } }; // (EOS ends it)
    const want = new LLM({ model: dir, maxModelLen: 256, enforceEager: true }).generate(prompts, so);
    for (const o of want) assert.match(o.outputs[0]!.text, /^[ a-vx-z.]+$/);
    const validPrefix = RequestGrammar.prototype.validPrefix;
    let cut = 0;
    RequestGrammar.prototype.validPrefix = function (drafts) {
      const n = validPrefix.call(this, drafts);
      if (n < drafts.length) cut++;
      return n;
    };
    try {
      for (const enforceEager of [false, true]) {
        const llm = new LLM({ model: dir, maxModelLen: 256, enforceEager, speculativeConfig: { method: "ngram", numSpeculativeTokens: 4, promptLookupMax: 4 } });
        const outs = llm.generate(prompts, so);
        outs.forEach((o, i) => assert.deepEqual(o.outputs[0]!.tokenIds, want[i]!.outputs[0]!.tokenIds, prompts[i]));
        assert.ok(llm.engine.scheduler.specStats.acceptedTokens > 0, JSON.stringify(llm.engine.scheduler.specStats));
      }
    } finally {
      RequestGrammar.prototype.validPrefix = validPrefix;
    }
    assert.ok(cut > 0, "some proposals held a token the grammar refuses");
  });

  it("a grammar run ahead through drafts gives the masks of a matcher that accepted them, and is put back", () => {
    const tok = Tokenizer.fromDir(dir);
    const m = new StructuredOutputManager(tok.grammarVocab(), tok.vocabSize, tok.eosTokenIds);
    const spec = structuredOutputSpec({ regex: "(ab|cd)+ [a-z]{2}" })!;
    const g = m.matcher(spec);
    const ids = tok.encode("abcdab xy", { addSpecialTokens: false });
    const maskOf = (r: RequestGrammar) => {
      const l = new Float32Array(tok.vocabSize);
      r.applyMask(l);
      return l.map((x) => (x === -Infinity ? 0 : 1));
    };
    const before = maskOf(g);
    assert.equal(g.validPrefix(ids), ids.length);
    assert.equal(g.validPrefix([...ids.slice(0, 2), tok.encode("Q", { addSpecialTokens: false })[0]!]), 2); // "Q" is refused
    const masks = g.draftMasks(ids);
    const stepped = m.matcher(spec);
    ids.forEach((t, j) => {
      assert.ok(stepped.accept(t));
      const l = new Float32Array(tok.vocabSize);
      if (masks[j] !== null) applyBitmask(l, masks[j]!);
      assert.deepEqual(l.map((x) => (x === -Infinity ? 0 : 1)), maskOf(stepped), `after draft ${j}`);
    });
    assert.deepEqual(maskOf(g), before); // put back
    g.dispose();
    stepped.dispose();
  });

  it("a bad speculative config is an EngineInputError before the model loads", () => {
    assert.throws(() => new LLM({ model: dir, speculativeConfig: { method: "medusa" as "ngram", numSpeculativeTokens: 2 } }), (e: unknown) => {
      assert.ok(e instanceof EngineInputError);
      assert.equal(e.param, "speculative_config");
      return true;
    });
  });
});
