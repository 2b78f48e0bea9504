// Beam search on a fake model whose next-token distribution is a hand-written table of the last token, so the
// beams, their order and their cumulative logprobs are worked out by hand below; greedy decoding takes another path.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { LLM } from "../../src/engine/llm-engine.js";
import { FakeModelRunner } from "../../src/engine/fake-model-runner.js";
import { beamSearch } from "../../src/engine/beam-search.js";
import type { EngineClient, RequestOutput } from "../../src/engine/types.js";

const V = 6;
const EOS = 0;
// next-token probabilities by the context's last token (the prompt ends with 5)
const TABLE: Record<number, Record<number, number>> = {
  5: { 1: 0.5, 2: 0.4, 3: 0.1 },
  1: { 4: 0.4, 1: 0.3, 2: 0.2, 3: 0.1 },
  2: { 3: 0.9, 4: 0.1 },
  3: { [EOS]: 0.7, 4: 0.3 },
  4: { 4: 1 },
};

function llm(): LLM {
  const runner = new FakeModelRunner(V, {
    override: (context, logits) => {
      const row = TABLE[context[context.length - 1]!] ?? { 4: 1 };
      for (let t = 0; t < V; t++) logits[t] = row[t] !== undefined ? Math.log(row[t]!) : -1e9;
    },
  });
  return new LLM({ runner, tokenizer: null, engineArgs: { maxModelLen: 64, numGpuBlocks: 64, blockSize: 4, eosTokenIds: [EOS] } });
}
const prompt = { promptTokenIds: [3, 4, 5] };
const close = (a: number, b: number): boolean => Math.abs(a - b) < 1e-5;

describe("beam search", () => {
  it("finds the likelier path greedy decoding misses, ranked by cumulative logprob / length", () => {
    const [beams] = llm().beamSearch([prompt], { beamWidth: 2, maxTokens: 2, ignoreEos: true });
    // round 1 keeps [1] (.5) and [2] (.4); round 2: [2,3] = .4 * .9, [1,4] = .5 * .4, then [1,1] = .15 ...
    assert.deepEqual(beams!.map((b) => b.tokenIds), [[2, 3], [1, 4]]);
    assert.ok(close(beams![0]!.cumulativeLogprob, Math.log(0.4) + Math.log(0.9)));
    assert.ok(close(beams![1]!.cumulativeLogprob, Math.log(0.5) + Math.log(0.4)));
    const [greedy] = llm().generate([prompt], { temperature: 0, maxTokens: 2, ignoreEos: true });
    assert.deepEqual(greedy!.outputs[0]!.tokenIds, [1, 4]);
    // width 1 is greedy decoding
    assert.deepEqual(llm().beamSearch([prompt], { beamWidth: 1, maxTokens: 2, ignoreEos: true })[0]!.map((b) => b.tokenIds), [[1, 4]]);
  });

  it("a beam that reaches EOS is completed and ranked without its EOS in the length", () => {
    const [beams] = llm().beamSearch([prompt], { beamWidth: 2, maxTokens: 4 });
    // round 3: [2,3,EOS] completes (.4 * .9 * .7 = .252, length 3 + 2); live: [2,3,4] (.108), [1,4,4] (.2)
    // round 4: [1,4,4,4] (.2, length 3 + 4), [2,3,4,4] (.108, length 7)
    // scores: ln(.2) / 7 = -0.230 beats ln(.252) / 5 = -0.276 (the longer beam is divided by more)
    assert.deepEqual(beams!.map((b) => b.tokenIds), [[1, 4, 4, 4], [2, 3, EOS]]);
    assert.equal(beams![0]!.endedOnEos, false);
    assert.equal(beams![1]!.endedOnEos, true);
    assert.ok(close(beams![1]!.cumulativeLogprob, Math.log(0.252)));
    // a length penalty of 0 ranks by the cumulative logprob alone: ln(.252) > ln(.2)
    const flat = llm().beamSearch([prompt], { beamWidth: 2, maxTokens: 4, lengthPenalty: 0 })[0]!;
    assert.deepEqual(flat.map((b) => b.tokenIds), [[2, 3, EOS], [1, 4, 4, 4]]);
    assert.throws(() => llm().beamSearch([prompt], { beamWidth: 0, maxTokens: 4 }), /beam width must be an integer >= 1/);
  });

  it("the streaming search stops before its next round once its signal is aborted, rejecting with the signal's reason", async () => {
    const stop = new AbortController();
    let requests = 0;
    const engine = {
      async *generate() {
        requests++;
        if (requests === 3) stop.abort(new Error("the client left"));
        yield { outputs: [{ logprobs: [new Map([[4, { logprob: -0.1 }], [1, { logprob: -1 }]])] }] } as unknown as RequestOutput;
      },
      abort() {},
    } as unknown as EngineClient;
    const search = beamSearch(engine, [5], { beamWidth: 2, maxTokens: 50, ignoreEos: true }, [EOS], "beam", null, stop.signal);
    await assert.rejects(search, /the client left/);
    assert.equal(requests, 3, "round 1 (one beam) and round 2 (two beams), then no more");
  });
});
