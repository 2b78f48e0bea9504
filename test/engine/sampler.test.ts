import { test } from "node:test";
import assert from "node:assert/strict";
import { EngineInputError } from "../../src/engine/errors.js";
import { applyTopKTopP, topKTopPReference } from "../../src/engine/sampler.js";
import { normalizeSamplingParams } from "../../src/engine/sampling-params.js";
import type { SamplingParams } from "../../src/engine/types.js";
import { add, makeEngine, prompt, runToCompletion } from "./helpers.js";

test("sampling params: vLLM defaults", () => {
  const p = normalizeSamplingParams({});
  assert.equal(p.n, 1);
  assert.equal(p.temperature, 1);
  assert.equal(p.maxTokens, 16);
  assert.equal(normalizeSamplingParams({ topK: -1 }).topK, 0);
  const g = normalizeSamplingParams({ temperature: 0, topP: 0.5, topK: 3, minP: 0.2 });
  assert.deepEqual([g.topP, g.topK, g.minP], [1, 0, 0]);
});

test("sampling params: every invalid value is rejected naming its parameter", () => {
  const cases: [Partial<SamplingParams>, string][] = [
    [{ n: 0 }, "n"],
    [{ n: 1.5 }, "n"],
    [{ temperature: -0.1 }, "temperature"],
    [{ temperature: Number.NaN }, "temperature"],
    [{ topP: 0 }, "top_p"],
    [{ topP: 1.1 }, "top_p"],
    [{ topK: -2 }, "top_k"],
    [{ topK: 2.5 }, "top_k"],
    [{ minP: -0.1 }, "min_p"],
    [{ minP: 1.1 }, "min_p"],
    [{ presencePenalty: 2.1 }, "presence_penalty"],
    [{ frequencyPenalty: -2.1 }, "frequency_penalty"],
    [{ repetitionPenalty: 0 }, "repetition_penalty"],
    [{ maxTokens: 0 }, "max_tokens"],
    [{ minTokens: -1 }, "min_tokens"],
    [{ minTokens: 5, maxTokens: 4 }, "min_tokens"],
    [{ logprobs: -1 }, "logprobs"],
    [{ logprobs: 21 }, "logprobs"],
    [{ promptLogprobs: 21 }, "prompt_logprobs"],
    [{ stop: [""] }, "stop"],
    [{ stopTokenIds: [-1] }, "stop_token_ids"],
    [{ seed: 1.5 }, "seed"],
    [{ truncatePromptTokens: 0 }, "truncate_prompt_tokens"],
    [{ logitBias: { 1000: 1 } }, "logit_bias"],
    [{ allowedTokenIds: [] }, "allowed_token_ids"],
    [{ allowedTokenIds: [64] }, "allowed_token_ids"],
    [{ badWords: [""] }, "bad_words"],
    [{ ignoreEos: 1 as unknown as boolean }, "ignore_eos"],
    [{ max_tokens: 3 } as unknown as Partial<SamplingParams>, "max_tokens"],
    [{ temprature: 0.5 } as unknown as Partial<SamplingParams>, "temprature"],
  ];
  for (const [params, name] of cases) {
    assert.throws(
      () => normalizeSamplingParams(params, { vocabSize: 64 }),
      (e: unknown) => e instanceof EngineInputError && e.param === name,
      `${JSON.stringify(params)} should fail on ${name}`,
    );
  }
  assert.equal(normalizeSamplingParams({ logprobs: 30 }, { maxLogprobs: 30 }).logprobs, 30);
  assert.throws(() => normalizeSamplingParams({ max_tokens: 3 } as never), /not a sampling parameter \(did you mean maxTokens\?\)/);
});

/** Independent reference of the processed logits for one step (no engine code). */
function referenceLogprobs(
  raw: Float32Array,
  promptIds: number[],
  out: number[],
  p: { bias: Record<number, number>; rep: number; freq: number; pres: number; temp: number; topK: number },
): Float64Array {
  const l = Float64Array.from(raw);
  for (const [k, b] of Object.entries(p.bias)) l[Number(k)]! += b;
  for (const t of new Set([...promptIds, ...out])) l[t] = l[t]! > 0 ? l[t]! / p.rep : l[t]! * p.rep;
  const counts = new Map<number, number>();
  for (const t of out) counts.set(t, (counts.get(t) ?? 0) + 1);
  for (const [t, c] of counts) l[t]! -= p.freq * c + p.pres;
  for (let v = 0; v < l.length; v++) l[v]! /= p.temp;
  const kth = [...l].sort((a, b) => b - a)[p.topK - 1]!;
  for (let v = 0; v < l.length; v++) if (l[v]! < kth) l[v] = -Infinity;
  const max = Math.max(...l);
  const lse = max + Math.log(l.reduce((s, x) => s + Math.exp(x - max), 0));
  return l.map((x) => x - lse);
}

test("sampler: processed_logprobs equal log_softmax of the processed logits (bias, penalties, temperature, top-k)", () => {
  const raws: Float32Array[] = [];
  const { core } = makeEngine({ logprobsMode: "processed_logprobs" }, { override: (_ctx, row) => void raws.push(Float32Array.from(row)) });
  const cfg = { bias: { 5: 2.5, 9: -1 }, rep: 1.3, freq: 0.5, pres: 0.3, temp: 0.7, topK: 10 };
  const promptIds = prompt(4, 9);
  add(core, "r", promptIds, {
    temperature: cfg.temp,
    topK: cfg.topK,
    seed: 11,
    logitBias: cfg.bias,
    repetitionPenalty: cfg.rep,
    frequencyPenalty: cfg.freq,
    presencePenalty: cfg.pres,
    logprobs: 5,
    maxTokens: 12,
    ignoreEos: true,
  });
  const o = runToCompletion(core).get("r")!.outputs[0]!;
  assert.equal(raws.length, 12);
  let cum = 0;
  o.tokenIds.forEach((tok, k) => {
    const ref = referenceLogprobs(raws[k]!, promptIds, o.tokenIds.slice(0, k), cfg);
    const lp = o.logprobs![k]!;
    assert.ok(Math.abs(lp.get(tok)!.logprob - ref[tok]!) < 1e-4, `step ${k}`);
    assert.ok(Number.isFinite(ref[tok]!), "sampled token survived top-k");
    assert.equal(lp.get(tok)!.rank, 1 + [...ref].filter((x) => x > ref[tok]!).length);
    const top = [...ref.keys()].sort((a, b) => ref[b]! - ref[a]! || a - b).slice(0, 5);
    for (const [i, t] of top.entries()) {
      assert.ok(Math.abs(lp.get(t)!.logprob - ref[t]!) < 1e-4);
      assert.equal(lp.get(t)!.rank, i + 1);
    }
    cum += lp.get(tok)!.logprob;
  });
  assert.ok(Math.abs(o.cumulativeLogprob! - cum) < 1e-6);
});

test("sampler: a seeded request samples the same tokens alone and in a busy batch", () => {
  const params = { temperature: 1.0, topP: 0.9, seed: 1234, maxTokens: 10, ignoreEos: true };
  const { core: alone } = makeEngine();
  add(alone, "s", prompt(9, 7), params);
  const ref = runToCompletion(alone).get("s")!.outputs[0]!.tokenIds;
  const { core: busy } = makeEngine({ maxNumBatchedTokens: 16, seed: 5 });
  for (let i = 0; i < 6; i++) add(busy, `u${i}`, prompt(20 + i, 5 + i), { temperature: 1.0, maxTokens: 8 + i });
  add(busy, "s", prompt(9, 7), params);
  assert.deepEqual(runToCompletion(busy).get("s")!.outputs[0]!.tokenIds, ref);
});

test("sampler: allowed_token_ids, bad_words and min_tokens", () => {
  // The model always prefers EOS, then 'b', then 'a'.
  const prefer = (row: Float32Array): void => {
    row[2] = 100;
    row[4] = 50;
    row[3] = 40;
  };
  const { core } = makeEngine({}, { override: (_c, row) => prefer(row) });
  add(core, "allowed", prompt(1, 4), { temperature: 0, allowedTokenIds: [3, 4], maxTokens: 4 });
  add(core, "bad", prompt(1, 4), { temperature: 0, allowedTokenIds: [3, 4, 29], badWords: ["b"], maxTokens: 3 });
  add(core, "min", prompt(1, 4), { temperature: 0, minTokens: 3, maxTokens: 10 });
  const out = runToCompletion(core);
  assert.deepEqual(out.get("allowed")!.outputs[0]!.tokenIds, [4, 4, 4, 4]);
  assert.deepEqual(out.get("bad")!.outputs[0]!.tokenIds, [3, 3, 3]);
  const min = out.get("min")!.outputs[0]!;
  assert.equal(min.tokenIds.length, 4);
  assert.equal(min.tokenIds[3], 2);
  assert.equal(min.finishReason, "stop");
});

test("sampler: a multi-token bad word bans its last token only after its prefix", () => {
  // The model alternates: after 'a' it prefers 'b', otherwise 'a'.
  const { core } = makeEngine({}, { override: (ctx, row) => ((row[ctx[ctx.length - 1] === 3 ? 4 : 3] = 100), (row[5] = 90)) });
  add(core, "free", [5, 6], { temperature: 0, maxTokens: 4 });
  add(core, "bad", [5, 6], { temperature: 0, badWords: ["ab"], maxTokens: 4 });
  const out = runToCompletion(core);
  assert.deepEqual(out.get("free")!.outputs[0]!.tokenIds, [3, 4, 3, 4]);
  assert.deepEqual(out.get("bad")!.outputs[0]!.tokenIds, [3, 5, 3, 5]);
});

test("sampler: top-k/top-p by partial selection equals the full-sort reference (ties, top_p=1, tiny top_p, min_p, -inf)", () => {
  let seed = 12345;
  const rand = (): number => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32;
  const scratch = new Float32Array(5000);
  const topPs = [1, 0.999, 0.95, 0.9, 0.5, 0.1, 1e-6];
  const topKs = [0, 1, 2, 7, 50, 64, 65, 300, 4999, 5000, 6000];
  let cases = 0;
  for (const V of [1, 3, 64, 65, 200, 5000]) {
    for (let trial = 0; trial < 6; trial++) {
      const raw = new Float32Array(V);
      const kind = trial % 3;
      for (let v = 0; v < V; v++) {
        if (kind === 0)
          raw[v] = rand() * 16 - 8; // distinct
        else if (kind === 1)
          raw[v] = Math.floor(rand() * 6) - 3; // heavy ties
        else raw[v] = (rand() - 0.5) * 0.02; // nearly flat: the nucleus is most of the vocabulary
      }
      if (V > 3 && trial >= 3) for (let v = 0; v < V; v += 5) raw[v] = -Infinity; // already masked tokens
      for (const topP of topPs) {
        for (const topK of topKs) {
          for (const minP of [0, 0.05]) {
            if (!(topK > 0 || topP < 1)) continue;
            const base = Float32Array.from(raw);
            if (minP > 0) {
              // min_p runs before top-k/top-p in the sampler; any masking pattern is a valid input here
              const cut = Math.max(...base) + Math.log(minP);
              for (let v = 0; v < V; v++) if (base[v]! < cut) base[v] = -Infinity;
            }
            const fast = Float32Array.from(base);
            const ref = Float32Array.from(base);
            applyTopKTopP(fast, topK, topP, scratch);
            topKTopPReference(ref, topK, topP);
            assert.deepEqual(fast, ref, `V=${V} trial=${trial} topK=${topK} topP=${topP} minP=${minP}`);
            cases++;
          }
        }
      }
    }
  }
  assert.ok(cases > 2000);
  // Spot checks of the definition: top_p=1 with top_k keeps ties of the k-th value; tiny top_p keeps the maximum and its ties.
  const l = Float32Array.from([1, 3, 3, 2, 3, -1]);
  applyTopKTopP(l, 2, 1, scratch);
  assert.deepEqual([...l], [-Infinity, 3, 3, -Infinity, 3, -Infinity]);
  const t = Float32Array.from([5, 1, 5, 4]);
  applyTopKTopP(t, 0, 1e-9, scratch);
  assert.deepEqual([...t], [5, -Infinity, 5, -Infinity]);
  // the nucleus: probabilities 0.5, 0.3, 0.2 -> top_p 0.6 keeps two, 0.5 keeps one (mass before the 2nd is 0.5, not < 0.5)
  const probs = (): Float32Array => Float32Array.from([Math.log(0.2), Math.log(0.5), Math.log(0.3)]);
  const a = probs();
  applyTopKTopP(a, 0, 0.6, scratch);
  assert.deepEqual(
    a.map((x) => (x === -Infinity ? 0 : 1)),
    Float32Array.from([0, 1, 1]),
  );
  const b = probs();
  applyTopKTopP(b, 0, 0.5, scratch);
  assert.deepEqual(
    b.map((x) => (x === -Infinity ? 0 : 1)),
    Float32Array.from([0, 1, 0]),
  );
});

test("sampler: raw_logprobs (the default) equal log_softmax of the model's logits, whatever the sampling settings", () => {
  const raws: Float32Array[] = [];
  const { core } = makeEngine({}, { override: (_ctx, row) => void raws.push(Float32Array.from(row)) });
  const promptIds = prompt(4, 9);
  add(core, "r", promptIds, {
    temperature: 0.5,
    topK: 2,
    seed: 3,
    logitBias: { 5: 4 },
    repetitionPenalty: 1.5,
    logprobs: 6,
    maxTokens: 8,
    ignoreEos: true,
  });
  const o = runToCompletion(core).get("r")!.outputs[0]!;
  assert.equal(raws.length, 8);
  o.tokenIds.forEach((tok, k) => {
    const raw = Float64Array.from(raws[k]!);
    const max = Math.max(...raw);
    const lse = max + Math.log(raw.reduce((s, x) => s + Math.exp(x - max), 0));
    const ref = raw.map((x) => x - lse);
    const lp = o.logprobs![k]!;
    assert.ok(Math.abs(lp.get(tok)!.logprob - ref[tok]!) < 1e-4, `step ${k}`);
    const top = [...ref.keys()].sort((a, b) => ref[b]! - ref[a]! || a - b).slice(0, 6);
    for (const [i, t] of top.entries()) {
      assert.ok(Number.isFinite(lp.get(t)!.logprob), "no token masked out of the raw logprobs");
      assert.ok(Math.abs(lp.get(t)!.logprob - ref[t]!) < 1e-4);
      assert.equal(lp.get(t)!.rank, i + 1);
    }
  });
});

test("engine: an unknown logprobsMode is refused", () => {
  assert.throws(() => makeEngine({ logprobsMode: "raw_logits" as never }), /logprobsMode must be one of raw_logprobs, processed_logprobs/);
});
