// Phi-3.5 / Phi-4-mini (Phi3ForCausalLM with longrope and partial rotary): the config read as HF's Phi3Config reads
// it, the rotary tables against the longrope formula worked out here, and the model (dense forward, serving with step
// graphs and eager) against llama.cpp's phi3 on a GGUF export of the same random weights, in both of longrope's
// factor sets (llama.cpp, like vLLM, takes the long factors when its context exceeds the original one).
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";
import { LLM } from "../../src/engine/llm-engine.js";
import { exportGguf } from "../../src/models/init-model.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { ModelConfigError, parseHfConfig } from "../../src/models/hf-config.js";
import { writeSafetensors } from "../../src/models/formats/safetensors.js";
import type { GatedMLP } from "../../src/nn/mlp.js";
import { quantizedWeightOf } from "../../src/nn/quantized-linear.js";
import { RotaryEmbedding, type RopeScaling } from "../../src/nn/rotary.js";
import { arange, noGrad, tensor } from "../../src/tensor/index.js";
import { hasLlamaCpp, llamaCppOracle } from "../helpers/llama-cpp.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";

// tiny preset: hidden 64, 4 heads of 16; partial_rotary_factor 0.5 turns 8 dimensions of each head (4 frequencies)
const SHORT = [1, 1.5, 3, 7];
const LONG = [1.25, 2.5, 6, 19]; // exact in float32, as GGUF stores them
const phi = (orig: number, maxPos: number) => ({
  partial_rotary_factor: 0.5, max_position_embeddings: maxPos, original_max_position_embeddings: orig,
  rope_scaling: { type: "longrope", short_factor: SHORT, long_factor: LONG },
});

describe("Phi-3 longrope and partial rotary", () => {
  it("reads the config as Phi3Config does, and refuses what it cannot serve", () => {
    const base = { architectures: ["Phi3ForCausalLM"], vocab_size: 100, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4 };
    const c = parseHfConfig({ ...base, ...phi(32, 4096) });
    assert.equal(c.rotaryDim, 8);
    assert.deepEqual(c.ropeScaling, { type: "longrope", shortFactor: SHORT, longFactor: LONG, originalMaxPositionEmbeddings: 32, shortMscale: null, longMscale: null });
    // transformers v5 keeps original_max_position_embeddings inside the rope parameters
    const v5 = parseHfConfig({ ...base, partial_rotary_factor: 0.5, rope_parameters: { rope_type: "longrope", rope_theta: 10000, short_factor: SHORT, long_factor: LONG, original_max_position_embeddings: 64 } });
    assert.equal(v5.ropeScaling?.type === "longrope" && v5.ropeScaling.originalMaxPositionEmbeddings, 64);
    const refused = (extra: object, re: RegExp) => assert.throws(() => parseHfConfig({ ...base, ...extra }), (e: unknown) => e instanceof ModelConfigError && re.test(e.message));
    refused({ ...phi(32, 4096), rope_scaling: { type: "longrope", short_factor: SHORT, long_factor: [1, 2] } }, /"long_factor" must be 4 positive numbers/);
    refused({ ...phi(32, 4096), original_max_position_embeddings: undefined }, /needs original_max_position_embeddings/);
    refused({ partial_rotary_factor: 0.4375 }, /must turn an even number of each head's 16 dimensions/);
    refused({ architectures: ["LlamaForCausalLM"], partial_rotary_factor: 0.5 }, /partial_rotary_factor 0.5 is not supported/);
  });

  it("builds the rotary tables from the factor set the served context needs, rewriting them in place", () => {
    const scaling: RopeScaling = { type: "longrope", shortFactor: SHORT, longFactor: LONG, originalMaxPositionEmbeddings: 32, shortMscale: null, longMscale: null };
    const r = new RotaryEmbedding({ rotaryDim: 8, theta: 10000, maxPositions: 4096, scaling });
    const cos = r.cos; // kept: a graph holding the table must see the new values
    // cos[p, i] = cos(p / (factor_i * 10000^(2i/8))) * sqrt(1 + ln(4096 / 32) / ln(32))
    const want = (factors: number[], p: number, i: number) => Math.cos(p / (factors[i]! * 10000 ** ((2 * i) / 8))) * Math.sqrt(1 + Math.log(128) / Math.log(32));
    const at = (p: number, i: number) => (cos.dataSync() as Float32Array)[p * 4 + i]!;
    for (const [p, i] of [[5, 0], [77, 1], [300, 3]] as const) assert.ok(Math.abs(at(p, i) - want(LONG, p, i)) < 1e-6, `long ${p},${i}`);
    r.setContextLength(32); // within the original context: the short factors
    assert.equal(r.cos, cos);
    for (const [p, i] of [[5, 0], [31, 2], [17, 3]] as const) assert.ok(Math.abs(at(p, i) - want(SHORT, p, i)) < 1e-6, `short ${p},${i}`);
    r.setContextLength(33);
    assert.ok(Math.abs(at(17, 3) - want(LONG, 17, 3)) < 1e-6);
  });

  const prompt = Array.from({ length: 20 }, (_, i) => (i * 37 + 11) % 500);
  // long: llama.cpp's 128-token context and Kiln's max_model_len 128 exceed the original 32; short: both within 2048
  for (const [set, orig, maxPos] of [["long", 32, 4096], ["short", 2048, 8192]] as const) {
    it(`dense forward and serving agree with llama.cpp's phi3 (${set} factors)`, { skip: hasLlamaCpp ? false : "node-llama-cpp not installed", timeout: 120_000 }, async () => {
      const dir = tinyModelDir("Phi3ForCausalLM", { overrides: phi(orig, maxPos) });
      const gguf = tempPath(`phi3-${set}.gguf`);
      exportGguf(dir, gguf, "F32");
      const want = await llamaCppOracle(gguf, prompt, 8);
      const { model } = loadLocalModel(dir);
      model.setContextLength(128);
      const V = model.config.vocabSize;
      const dense = noGrad(() => model.logits(model.forward(tensor(Int32Array.from(prompt)), { kind: "dense", batch: 1, seqLen: prompt.length, positions: arange(prompt.length) })).logSoftmax(-1).dataSync() as Float32Array).subarray((prompt.length - 1) * V);
      let worst = 0;
      for (const [tok, p] of want.probs) if (p >= 1e-7) worst = Math.max(worst, Math.abs(Math.log(p) - dense[tok]!));
      assert.ok(worst < 1e-4, `dense forward: max |logprob diff| ${worst}`);
      // the other factor set must not pass: the test sees which one llama.cpp used
      model.setContextLength(set === "long" ? 16 : 4096);
      const other = noGrad(() => model.logits(model.forward(tensor(Int32Array.from(prompt)), { kind: "dense", batch: 1, seqLen: prompt.length, positions: arange(prompt.length) })).logSoftmax(-1).dataSync() as Float32Array).subarray((prompt.length - 1) * V);
      let gap = 0;
      for (const [tok, p] of want.probs) if (p >= 1e-7) gap = Math.max(gap, Math.abs(Math.log(p) - other[tok]!));
      assert.ok(gap > 1e-2, `the other factor set is ${gap} from llama.cpp`);
      for (const enforceEager of [false, true]) {
        const llm = new LLM({ model: dir, maxModelLen: 128, enforceEager });
        const [out] = llm.generate([{ promptTokenIds: prompt }], { temperature: 0, maxTokens: 8, ignoreEos: true, logprobs: 20 });
        const c = out!.outputs[0]!;
        assert.deepEqual(c.tokenIds, want.greedy, `greedy continuation (${enforceEager ? "eager" : "step graphs"})`);
        let w = 0;
        for (const [tok, lp] of c.logprobs![0]!) w = Math.max(w, Math.abs(Math.log(want.probs.get(tok) ?? 0) - lp.logprob));
        assert.ok(w < 1e-4, `serving: max |logprob diff| ${w}`);
      }
    });
  }

  it("a GGUF export loads back as the same model: fused tensors split, rope factors and rotary width from the file", () => {
    const dir = tinyModelDir("Phi3ForCausalLM", { overrides: phi(32, 4096) });
    const gguf = tempPath("phi3-roundtrip.gguf");
    exportGguf(dir, gguf, "F32");
    const a = loadLocalModel(dir);
    const b = loadLocalModel(gguf);
    assert.equal(b.config.architecture, "Phi3ForCausalLM");
    assert.equal(b.config.rotaryDim, 8);
    assert.deepEqual(b.config.ropeScaling, { ...a.config.ropeScaling!, shortMscale: Math.fround(Math.sqrt(1 + Math.log(128) / Math.log(32))), longMscale: Math.fround(Math.sqrt(1 + Math.log(128) / Math.log(32))) });
    for (const [name, t] of a.model.namedParameters()) {
      const u = b.model.namedParameters().find(([n]) => n === name)?.[1];
      assert.ok(u !== undefined, name);
      assert.deepEqual(u.dataSync(), t.dataSync(), name);
    }
  });

  it("a Q8_0 export loads the fused matrices' parts straight from their blocks, as the same model's Llama export loads", () => {
    // the same weights written as a Llama checkpoint (q/k/v and gate/up apart): both Q8_0 files must give equal logits
    const dir = tinyModelDir("Phi3ForCausalLM");
    const { model } = loadLocalModel(dir);
    const llama = tempPath("phi3-as-llama");
    fs.mkdirSync(llama, { recursive: true });
    const config = JSON.parse(fs.readFileSync(path.join(dir, "config.json"), "utf8")) as Record<string, unknown>;
    fs.writeFileSync(path.join(llama, "config.json"), JSON.stringify({ ...config, architectures: ["LlamaForCausalLM"], model_type: "llama" }));
    for (const f of ["tokenizer.json", "tokenizer_config.json"]) fs.copyFileSync(path.join(dir, f), path.join(llama, f));
    writeSafetensors(path.join(llama, "model.safetensors"), model.namedParameters().map(([name, t]) => ({ name, dtype: "F32" as const, shape: [...t.shape], data: t.dataSync() as Float32Array })));
    const logits = (file: string) => {
      const m = loadLocalModel(file).model;
      const layer = m.model.layers[0]!;
      const mlp = layer.mlp as GatedMLP;
      for (const l of [layer.selfAttn.qProj, layer.selfAttn.kProj, layer.selfAttn.vProj, mlp.gateProj, mlp.upProj]) assert.equal(quantizedWeightOf(l)?.scheme, "int8_g32");
      return noGrad(() => m.logits(m.forward(tensor(Int32Array.from(prompt)), { kind: "dense", batch: 1, seqLen: prompt.length, positions: arange(prompt.length) })).dataSync());
    };
    const [a, b] = [tempPath("phi3-q8.gguf"), tempPath("phi3-as-llama-q8.gguf")];
    exportGguf(dir, a, "Q8_0");
    exportGguf(llama, b, "Q8_0");
    assert.deepEqual(logits(a), logits(b));
  });
});
