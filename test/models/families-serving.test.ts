// Granite (GraniteForCausalLM: Llama with four multipliers: embedding_multiplier, residual_multiplier,
// attention_multiplier as the attention's scale, logits_scaling) and OLMo 2 (Olmo2ForCausalLM: norms on the attention's
// and the MLP's outputs only, q/k norms over whole projections). The serving path (paged KV, step graphs and eager)
// against llama.cpp on a GGUF export of the same random weights: greedy continuation and next-token probabilities.
// (Gemma 3's is in gemma3.test.ts; every family's dense forward in llama-cpp-oracle.test.ts.)
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { LLM } from "../../src/engine/llm-engine.js";
import { exportGguf } from "../../src/models/init-model.js";
import { parseHfConfig, type Architecture } from "../../src/models/hf-config.js";
import { hasLlamaCpp, llamaCppOracle } from "../helpers/llama-cpp.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";

describe("Granite and OLMo 2", () => {
  it("Granite: reads its multipliers", () => {
    const c = parseHfConfig({
      architectures: ["GraniteForCausalLM"], vocab_size: 100, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
      num_attention_heads: 4, embedding_multiplier: 12, residual_multiplier: 0.22, attention_multiplier: 0.015625, logits_scaling: 8,
    });
    assert.deepEqual([c.embedScale, c.residualScale, c.attnScale, c.logitScale], [12, 0.22, 0.015625, 8]);
    assert.throws(() => parseHfConfig({ ...c.raw, architectures: ["LlamaForCausalLM"] }), /unsupported field "logits_scaling"/);
  });

  for (const arch of ["GraniteForCausalLM", "Olmo2ForCausalLM"] as Architecture[]) {
    it(`${arch}: serving (step graphs and eager) agrees with llama.cpp`, { skip: hasLlamaCpp ? false : "node-llama-cpp not installed", timeout: 120_000 }, async () => {
      const dir = tinyModelDir(arch);
      const gguf = tempPath(`${arch}-serving.gguf`);
      exportGguf(dir, gguf, "F32");
      const prompt = Array.from({ length: 20 }, (_, i) => (i * 29 + 7) % 500);
      const want = await llamaCppOracle(gguf, prompt, 8);
      for (const enforceEager of [false, true]) {
        const llm = new LLM({ model: dir, maxModelLen: 128, enforceEager });
        const c = llm.generate([{ promptTokenIds: prompt }], { temperature: 0, maxTokens: 8, ignoreEos: true, logprobs: 20 })[0]!.outputs[0]!;
        assert.deepEqual(c.tokenIds, want.greedy, enforceEager ? "eager" : "step graphs");
        let worst = 0;
        for (const [tok, lp] of c.logprobs![0]!) worst = Math.max(worst, Math.abs(Math.log(want.probs.get(tok) ?? 0) - lp.logprob));
        assert.ok(worst < 1e-4, `max |logprob diff| ${worst}`);
      }
    });
  }
});
