// Prompt embeddings in the offline API (vLLM's LLM.generate({"prompt_embeds": ...})): the embedding rows of token ids
// generate what the ids generate, across chunked-prefill steps; the repetition penalty does not count the placeholder
// ids of embedded positions; rows of the wrong width and beam search are refused.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { LLM } from "../../src/engine/llm-engine.js";
import { Rng } from "../../src/engine/rng.js";
import { Sampler, type SamplingRow } from "../../src/engine/sampler.js";
import { normalizeSamplingParams } from "../../src/engine/sampling-params.js";
import { embeddingRows } from "../helpers/model-logits.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

const IDS = Array.from({ length: 45 }, (_, i) => 7 + ((i * 29 + 3) % 180));

describe("LLM.generate with promptEmbeds", () => {
  // 16 tokens a step: the 45 embedded rows are prefilled over three steps
  const llm = new LLM({ model: tinyModelDir("LlamaForCausalLM"), maxModelLen: 128, maxNumBatchedTokens: 16 });
  const model = (llm.engine.runner as unknown as { model: import("../../src/models/causal-lm.js").CausalLM }).model;
  const hidden = model.config.hiddenSize;
  const embeds = (ids: number[]): Float32Array => embeddingRows(model, ids);
  const greedy = { temperature: 0, maxTokens: 8, ignoreEos: true, logprobs: 1 };

  it("the embedding rows of token ids generate the ids' tokens and logprobs, prefilled over several steps", () => {
    const [byIds] = llm.generate([{ promptTokenIds: IDS }], greedy);
    const [byEmbeds] = llm.generate([{ promptEmbeds: embeds(IDS), hiddenSize: hidden }], greedy);
    assert.deepEqual(byEmbeds!.outputs[0]!.tokenIds, byIds!.outputs[0]!.tokenIds);
    byEmbeds!.outputs[0]!.logprobs!.forEach((lp, i) => {
      const want = byIds!.outputs[0]!.logprobs![i]!;
      const [id] = [...want.keys()];
      assert.ok(Math.abs(lp.get(id!)!.logprob - want.get(id!)!.logprob) < 1e-3);
    });
  });

  it("refused: rows of the wrong width, beam search", () => {
    assert.throws(() => llm.generate([{ promptEmbeds: new Float32Array(3 * (hidden + 1)), hiddenSize: hidden + 1 }], greedy), /prompt embeddings must be \[3, \d+\]/);
    assert.throws(() => llm.generate([{ promptEmbeds: new Float32Array(5), hiddenSize: hidden }], greedy), /5 values are not rows of width/);
    assert.throws(() => llm.beamSearch([{ promptEmbeds: embeds(IDS), hiddenSize: hidden }], { beamWidth: 2, maxTokens: 2 }), /beam search is not supported with prompt embeddings/);
  });
});

describe("the repetition penalty and embedded prompts", () => {
  it("counts a token-id prompt's ids but not the placeholder ids of embedded positions", () => {
    // logits: token 0 at 2.0, token 1 at 1.5; a penalty of 2 halves a seen positive logit (vLLM's)
    const pick = (mmFeatures?: SamplingRow["mmFeatures"]) => {
      const row: SamplingRow = {
        requestId: "r", params: normalizeSamplingParams({ temperature: 0, repetitionPenalty: 2 }), promptTokenIds: [0, 0, 0], outputTokenIds: [],
        isFinished: false, generator: null, badWordsTokenIds: [], eosTokenIds: [], ...(mmFeatures ? { mmFeatures } : {}),
      } as SamplingRow;
      return new Sampler(4, new Rng(1), [], null).sample(Float32Array.from([2, 1.5, 0, 0]), [row])[0]!.tokenId;
    };
    assert.equal(pick(), 1, "token 0 is a prompt token: 2.0 / 2 < 1.5");
    assert.equal(pick([{ offset: 0, length: 3, inputEmbeds: new Float32Array(3) }]), 0, "embedded positions' placeholders are not prompt tokens");
    assert.equal(pick([{ offset: 0, length: 2, inputEmbeds: new Float32Array(2) }]), 1, "the third position is a token");
  });
});
