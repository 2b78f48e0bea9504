// SmolLM3 (SmolLM3ForCausalLM): Llama whose every 4th layer attends without rotary (NoPE, `no_rope_layers`). Its
// config as SmolLM3Config reads it; a NoPE layer's attention is blind to order (a one-layer NoPE model's last logits do
// not move when the tokens before the last are shuffled, a rotary one's do); llama.cpp's smollm3 (the outside oracle)
// runs Kiln's GGUF export to Kiln's numbers, served with step graphs and eagerly; the export loads back bit for bit.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";
import { LLM } from "../../src/engine/llm-engine.js";
import { readGguf } from "../../src/models/formats/gguf.js";
import { hfConfigToGgufMetadata } from "../../src/models/formats/gguf-mapping.js";
import { ModelFormatError } from "../../src/models/formats/model-format-error.js";
import { ModelConfigError, parseHfConfig } from "../../src/models/hf-config.js";
import { exportGguf } from "../../src/models/init-model.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { hasLlamaCpp, llamaCppOracle } from "../helpers/llama-cpp.js";
import { allLogprobs } from "../helpers/model-logits.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";

const base = { architectures: ["SmolLM3ForCausalLM"], vocab_size: 100, hidden_size: 64, intermediate_size: 128, num_attention_heads: 4 };
/** Four layers: layer 3 is the NoPE one. */
const smol = () => tinyModelDir("SmolLM3ForCausalLM", { overrides: { num_hidden_layers: 4 } });

const logprobs = allLogprobs;
const maxAbsDiff = (a: Float32Array, b: Float32Array) => a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i]!)), 0);

describe("SmolLM3", () => {
  it("reads SmolLM3Config: a NoPE layer every no_rope_layer_interval-th by default, or as no_rope_layers lists; its class defaults", () => {
    const c = parseHfConfig({ ...base, num_hidden_layers: 8 });
    assert.deepEqual(c.ropeLayers, [true, true, true, false, true, true, true, false]);
    assert.equal(c.ropeTheta, 2_000_000); // SmolLM3Config's default_theta
    assert.equal(c.tieWordEmbeddings, true);
    assert.deepEqual(parseHfConfig({ ...base, num_hidden_layers: 3, no_rope_layer_interval: 2 }).ropeLayers, [true, false, true]);
    // a longer list is allowed (SmolLM3Config asks for at least one entry per layer)
    assert.deepEqual(parseHfConfig({ ...base, num_hidden_layers: 3, no_rope_layers: [0, 1, 1, 0] }).ropeLayers, [false, true, true]);
    // with use_sliding_window (and no layer_types), the NoPE layers slide
    const sliding = parseHfConfig({ ...base, num_hidden_layers: 4, use_sliding_window: true, sliding_window: 16 });
    assert.deepEqual([sliding.slidingWindow, sliding.slidingWindowLayers], [16, [false, false, false, true]]);
    assert.equal(parseHfConfig({ ...base, num_hidden_layers: 4, sliding_window: 16 }).slidingWindow, null);
    // every other family rotates in every layer
    assert.deepEqual(parseHfConfig({ ...base, architectures: ["LlamaForCausalLM"], num_hidden_layers: 4 }).ropeLayers, [true, true, true, true]);
    for (const [over, why] of [
      [{ no_rope_layers: [1, 0] }, /no_rope_layers must list 0 or 1 for each of the 4 layers/],
      [{ no_rope_layers: [1, 2, 1, 1] }, /no_rope_layers must list 0 or 1/],
      [{ no_rope_layer_interval: 0 }, /"no_rope_layer_interval" must be a positive integer/],
    ] as const)
      assert.throws(() => parseHfConfig({ ...base, num_hidden_layers: 4, ...over }), (e: unknown) => e instanceof ModelConfigError && why.test(e.message), JSON.stringify(over));
  });

  it("a NoPE layer attends to content alone: shuffling the tokens before the last leaves a one-layer NoPE model's last logits, not a rotary one's", () => {
    const ids = [5, 17, 42, 99, 3, 64, 28, 11];
    const shuffled = [64, 3, 28, 42, 5, 99, 17, 11]; // the same first seven, reordered; the same last
    const gap = (noRope: number) => {
      const m = loadLocalModel(tinyModelDir("SmolLM3ForCausalLM", { overrides: { num_hidden_layers: 1, no_rope_layers: [noRope] } }));
      return maxAbsDiff(logprobs(m, ids).at(-1)!, logprobs(m, shuffled).at(-1)!);
    };
    const [nope, rope] = [gap(0), gap(1)];
    assert.ok(nope < 1e-5, `NoPE: ${nope}`); // summation order only
    assert.ok(rope > 1e-2, `rotary: ${rope}`);
  });

  it("GGUF: the export is llama.cpp's smollm3 and loads back to the directory's logits bit for bit; other NoPE patterns are refused", () => {
    const dir = smol();
    const file = tempPath("smollm3.gguf");
    exportGguf(dir, file, "F32");
    const g = readGguf(file);
    try {
      assert.equal(g.metadata["general.architecture"], "smollm3");
    } finally {
      g.close();
    }
    const [hf, back] = [loadLocalModel(dir), loadLocalModel(file)];
    assert.equal(back.config.architecture, "SmolLM3ForCausalLM");
    assert.deepEqual(back.config.ropeLayers, [true, true, true, false]);
    const ids = Array.from({ length: 12 }, (_, i) => (i * 31 + 5) % 400);
    const [a, b] = [logprobs(hf, ids), logprobs(back, ids)];
    a.forEach((row, t) => assert.ok(row.every((x, i) => x === b[t]![i]), `position ${t} differs`));
    const config = JSON.parse(fs.readFileSync(path.join(dir, "config.json"), "utf8")) as Record<string, unknown>;
    for (const [over, why] of [
      [{ no_rope_layers: [1, 0, 1, 1] }, /every 4th layer NoPE/],
      [{ no_rope_layer_interval: 2 }, /every 4th layer NoPE/],
      [{ use_sliding_window: true, sliding_window: 8 }, /use_sliding_window must be false/],
    ] as const)
      assert.throws(() => hfConfigToGgufMetadata({ ...config, ...over }), (e: unknown) => e instanceof ModelFormatError && why.test(e.message), JSON.stringify(over));
  });

  it("served (step graphs and eager) as llama.cpp runs the same GGUF; read as plain Llama, the NoPE layer's absence shows", { skip: hasLlamaCpp ? false : "node-llama-cpp not installed", timeout: 120_000 }, async () => {
    const dir = smol();
    const file = tempPath("smollm3-served.gguf");
    exportGguf(dir, file, "F32");
    const prompt = Array.from({ length: 20 }, (_, i) => (i * 29 + 7) % 500);
    const want = await llamaCppOracle(file, prompt, 8);
    const worstGap = (logprobs: Map<number, { logprob: number }>) => {
      let worst = 0;
      for (const [tok, lp] of logprobs) worst = Math.max(worst, Math.abs(Math.log(want.probs.get(tok) ?? 0) - lp.logprob));
      return worst;
    };
    for (const enforceEager of [false, true]) {
      const llm = new LLM({ model: dir, maxModelLen: 128, enforceEager });
      const c = llm.generate([{ promptTokenIds: prompt }], { temperature: 0, maxTokens: 8, ignoreEos: true, logprobs: 20 })[0]!.outputs[0]!;
      assert.deepEqual(c.tokenIds, want.greedy, enforceEager ? "eager" : "step graphs");
      const worst = worstGap(c.logprobs![0]!);
      assert.ok(worst < 1e-4, `max |logprob diff| ${worst}`); // float32 on both sides
    }
    // the same weights with rotary in every layer (Kiln's Llama): the oracle tells them apart
    const llama = new LLM({ model: dir, maxModelLen: 128, hfOverrides: { no_rope_layers: [1, 1, 1, 1] } });
    const c = llama.generate([{ promptTokenIds: prompt }], { temperature: 0, maxTokens: 1, logprobs: 20 })[0]!.outputs[0]!;
    assert.ok(worstGap(c.logprobs![0]!) > 1e-3, `all-rotary ${worstGap(c.logprobs![0]!)}`);
  });
});
