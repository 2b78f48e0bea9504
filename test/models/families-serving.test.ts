// Granite (GraniteForCausalLM: Llama with four multipliers: embedding_multiplier, residual_multiplier,
// attention_multiplier as the attention's scale, logits_scaling) and OLMo 2 (Olmo2ForCausalLM: norms on the attention's
// and the MLP's outputs only, q/k norms over whole projections). The serving path (paged KV, step graphs and eager)
// against llama.cpp on a GGUF export of the same random weights: greedy continuation and next-token probabilities.
// (Gemma 3's is in gemma3.test.ts; every family's dense forward in llama-cpp-oracle.test.ts.) Phi-3 is Llama with
// q/k/v and gate/up stored fused: a Llama checkpoint rewritten that way must give the same logits and generations.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";
import { loadLocalModel } from "../../src/models/loader.js";
import { readSafetensors, writeSafetensors } from "../../src/models/formats/safetensors.js";
import { arange, noGrad, tensor } from "../../src/tensor/index.js";
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

  it("Phi-3 (fused qkv_proj and gate_up_proj) equals the Llama model holding the same weights apart", () => {
    const llama = tinyModelDir("LlamaForCausalLM");
    const out = tempPath("phi3-fused");
    fs.mkdirSync(out, { recursive: true });
    const config = JSON.parse(fs.readFileSync(path.join(llama, "config.json"), "utf8")) as Record<string, unknown>;
    fs.writeFileSync(path.join(out, "config.json"), JSON.stringify({ ...config, architectures: ["Phi3ForCausalLM"], model_type: "phi3" }));
    for (const f of ["tokenizer.json", "tokenizer_config.json"]) fs.copyFileSync(path.join(llama, f), path.join(out, f));
    const st = readSafetensors(path.join(llama, "model.safetensors"));
    const concat = (names: string[]) => {
      const parts = names.map((n) => st.load(n));
      const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
      let at = 0;
      for (const p of parts) all.set(p, (at += p.length) - p.length);
      return all;
    };
    const fusedAs: Record<string, [string, string[]]> = {};
    const tensors = [];
    for (const t of st.tensors) {
      const m = /^(model\.layers\.\d+)\.(self_attn\.[qkv]_proj|mlp\.(gate|up)_proj)\.weight$/.exec(t.name);
      if (m === null) {
        tensors.push({ name: t.name, dtype: t.dtype, shape: t.shape, data: st.load(t.name) });
        continue;
      }
      const attn = m[2]!.startsWith("self_attn");
      const fused = `${m[1]}.${attn ? "self_attn.qkv_proj" : "mlp.gate_up_proj"}.weight`;
      const parts = attn ? ["q", "k", "v"].map((p) => `${m[1]}.self_attn.${p}_proj.weight`) : ["gate", "up"].map((p) => `${m[1]}.mlp.${p}_proj.weight`);
      if (fusedAs[fused] !== undefined) continue;
      fusedAs[fused] = [t.dtype, parts];
      const rows = parts.reduce((n, p) => n + st.get(p)!.shape[0]!, 0);
      tensors.push({ name: fused, dtype: t.dtype, shape: [rows, t.shape[1]!], data: concat(parts) });
    }
    writeSafetensors(path.join(out, "model.safetensors"), tensors);
    st.close();
    const ids = Array.from({ length: 12 }, (_, i) => (i * 31 + 3) % 500);
    const logits = (d: string) => {
      const { model } = loadLocalModel(d);
      return noGrad(() => model.logits(model.forward(tensor(Int32Array.from(ids)), { kind: "dense", batch: 1, seqLen: ids.length, positions: arange(ids.length) })).dataSync());
    };
    assert.ok(Object.keys(fusedAs).length >= 4);
    assert.deepEqual(logits(out), logits(llama));
    const gen = (d: string) => new LLM({ model: d, maxModelLen: 64 }).generate([{ promptTokenIds: ids }], { temperature: 0, maxTokens: 6, ignoreEos: true })[0]!.outputs[0]!.tokenIds;
    assert.deepEqual(gen(out), gen(llama));
  });
});
