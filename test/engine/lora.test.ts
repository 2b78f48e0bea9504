// LoRA serving: adapters read from PEFT directories and applied per request, checked against the same adapters
// merged into the weights (W + scaling * B A, merged in float64 by the test helper), eagerly and in step graphs,
// alone and mixed in one batch with other adapters and the base model.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import { describe, it } from "node:test";
import { LLM } from "../../src/engine/llm-engine.js";
import { EngineInputError } from "../../src/engine/errors.js";
import { LoraError, readLoraAdapter } from "../../src/models/lora.js";
import type { LoraRequest } from "../../src/engine/lora-manager.js";
import type { RequestOutput, SamplingParams } from "../../src/engine/types.js";
import { allProjections, mergeLoraIntoModel, writeLoraAdapter } from "../helpers/lora-adapter.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";

const base = tinyModelDir("LlamaForCausalLM");
const adapterA = writeLoraAdapter(base, tempPath("lora-a"), { rank: 4, alpha: 8, modules: allProjections(2), seed: 11 });
// B: rank 2 on a few modules only, rsLoRA scaling
const adapterB = writeLoraAdapter(base, tempPath("lora-b"), {
  rank: 2, alpha: 4, seed: 12, modules: ["model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj", "model.layers.1.self_attn.v_proj"],
  config: { use_rslora: true }, std: 0.5,
});
const mergedA = mergeLoraIntoModel(base, adapterA, tempPath("merged-a"));
const mergedB = mergeLoraIntoModel(base, adapterB, tempPath("merged-b"));
const loraA: LoraRequest = { name: "a", id: 1, path: adapterA };
const loraB: LoraRequest = { name: "b", id: 2, path: adapterB };

const prompts = [{ promptTokenIds: [5, 17, 42, 99, 3, 250] }, { promptTokenIds: [7, 8, 9, 10] }];
const greedy: Partial<SamplingParams> = { temperature: 0, maxTokens: 8, logprobs: 3, ignoreEos: true };
const llmArgs = { maxModelLen: 64, kvCacheMemory: 1 << 20, maxNumSeqs: 8 };

/** Token ids and chosen-token logprobs of each output. */
function summary(outs: RequestOutput[]): { ids: number[]; lps: number[] }[] {
  return outs.map((o) => {
    const c = o.outputs[0]!;
    return { ids: c.tokenIds, lps: c.logprobs!.map((l, i) => l.get(c.tokenIds[i]!)!.logprob) };
  });
}

function assertSame(got: { ids: number[]; lps: number[] }[], want: { ids: number[]; lps: number[] }[], what: string): void {
  for (let i = 0; i < want.length; i++) {
    assert.deepEqual(got[i]!.ids, want[i]!.ids, `${what}: prompt ${i} tokens`);
    got[i]!.lps.forEach((lp, j) => assert.ok(Math.abs(lp - want[i]!.lps[j]!) < 2e-3, `${what}: prompt ${i} token ${j} logprob ${lp} vs ${want[i]!.lps[j]}`));
  }
}

describe("LoRA adapters", () => {
  const reference = new Map<string, { ids: number[]; lps: number[] }[]>();
  for (const [name, dir] of [["base", base], ["a", mergedA], ["b", mergedB]] as const) {
    const llm = new LLM({ model: dir, ...llmArgs, enforceEager: true });
    reference.set(name, summary(llm.generate(prompts, greedy)));
  }

  it("the adapters change the output (the test would not notice a dropped adapter otherwise)", () => {
    assert.notDeepEqual(reference.get("a")![0]!.lps, reference.get("base")![0]!.lps);
    assert.notDeepEqual(reference.get("b")![0]!.lps, reference.get("base")![0]!.lps);
  });

  for (const enforceEager of [true, false]) {
    it(`match the merged weights, alone and mixed in one batch (${enforceEager ? "eager" : "step graphs"})`, () => {
      const llm = new LLM({ model: base, ...llmArgs, enforceEager, enableLora: true, maxLoras: 2, maxLoraRank: 8 });
      assertSame(summary(llm.generate(prompts, greedy, { loraRequest: loraA })), reference.get("a")!, "adapter a");
      assertSame(summary(llm.generate(prompts, greedy, { loraRequest: loraB })), reference.get("b")!, "adapter b");
      assertSame(summary(llm.generate(prompts, greedy)), reference.get("base")!, "base model");
      // the same prompts under three models at once: prefix caching must not share K/V across adapters
      const mixed = [...prompts, ...prompts, ...prompts];
      const loras = [loraA, loraA, null, null, loraB, loraB];
      const got = summary(llm.generate(mixed, greedy, { loraRequest: loras }));
      assertSame(got.slice(0, 2), reference.get("a")!, "mixed: a");
      assertSame(got.slice(2, 4), reference.get("base")!, "mixed: base");
      assertSame(got.slice(4, 6), reference.get("b")!, "mixed: b");
    });
  }

  it("with one slot, requests of two adapters take turns and each still matches", () => {
    const llm = new LLM({ model: base, ...llmArgs, enableLora: true, maxLoras: 1, maxLoraRank: 4 });
    const got = summary(llm.generate([...prompts, ...prompts], greedy, { loraRequest: [loraA, loraA, loraB, loraB] }));
    assertSame(got.slice(0, 2), reference.get("a")!, "a");
    assertSame(got.slice(2, 4), reference.get("b")!, "b");
    assert.ok(llm.engine.lora!.heldIds.length <= 1, "max_cpu_loras defaults to max_loras: unused adapters are dropped");
    // the adapters of waiting and running requests, by name (vLLM's lora_requests_info)
    const e = llm.engine;
    e.addRequest({ requestId: "s1", promptTokenIds: [1, 2, 3], params: { maxTokens: 4 }, loraRequest: loraA });
    e.addRequest({ requestId: "s2", promptTokenIds: [1, 2, 3], params: { maxTokens: 4 }, loraRequest: loraB });
    assert.deepEqual(e.stats().lora, { maxLoras: 1, running: [], waiting: ["a", "b"] });
    e.step();
    assert.deepEqual(e.stats().lora, { maxLoras: 1, running: ["a"], waiting: ["b"] }); // one slot: b waits for a
    while (e.hasUnfinishedRequests()) e.step();
    assert.deepEqual(e.stats().lora, { maxLoras: 1, running: [], waiting: [] });
  });

  it("an id reused for another adapter never reads the first one's cached blocks", () => {
    // a prompt of three full blocks: later requests with it hit the prefix cache
    const long = [{ promptTokenIds: Array.from({ length: 50 }, (_, i) => 3 + ((i * 37) % 400)) }];
    const want = summary(new LLM({ model: mergedB, ...llmArgs, enforceEager: true }).generate(long, greedy));
    const llm = new LLM({ model: base, ...llmArgs, enableLora: true, maxLoras: 1, maxLoraRank: 4 });
    llm.generate(long, greedy, { loraRequest: loraA });
    llm.generate(prompts, greedy, { loraRequest: loraB }); // a leaves the host cache (max_cpu_loras 1)
    assertSame(summary(llm.generate(long, greedy, { loraRequest: { name: "b-again", id: loraA.id, path: adapterB } })), want, "id 1 reused for b");
    assert.throws(() => llm.generate(prompts, greedy, { loraRequest: [loraA] }), (e) => e instanceof EngineInputError && e.param === "lora_request" && /got 1 LoRA requests for 2 prompts/.test(e.message));
  });

  it("an adapter on Phi-3's fused qkv_proj and gate_up_proj (as PEFT names them) matches the merged weights", () => {
    const phi3 = tinyModelDir("Phi3ForCausalLM");
    const modules = [0, 1].flatMap((i) => ["self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj"].map((m) => `model.layers.${i}.${m}`));
    const adapter = writeLoraAdapter(phi3, tempPath("lora-phi3"), { rank: 4, alpha: 8, modules, seed: 13 });
    // merged into the checkpoint's fused weights: the loader then splits W + scaling * B A as it splits W
    const want = summary(new LLM({ model: mergeLoraIntoModel(phi3, adapter, tempPath("merged-phi3")), ...llmArgs, enforceEager: true }).generate(prompts, greedy));
    const llm = new LLM({ model: phi3, ...llmArgs, enforceEager: true, enableLora: true, maxLoraRank: 4 });
    assert.notDeepEqual(summary(llm.generate(prompts, greedy))[0]!.lps, want[0]!.lps);
    assertSame(summary(llm.generate(prompts, greedy, { loraRequest: { name: "phi3", id: 1, path: adapter } })), want, "phi3 fused");
  });

  it("an adapter on Qwen2-MoE's shared expert (as vLLM adapts it) matches the merged weights, eager and with step graphs", () => {
    const moe = tinyModelDir("Qwen2MoeForCausalLM");
    const modules = [0, 1].flatMap((i) => ["self_attn.q_proj", "mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj", "mlp.shared_expert.down_proj"].map((m) => `model.layers.${i}.${m}`));
    const adapter = writeLoraAdapter(moe, tempPath("lora-moe"), { rank: 4, alpha: 8, modules, seed: 17 });
    const want = summary(new LLM({ model: mergeLoraIntoModel(moe, adapter, tempPath("merged-moe")), ...llmArgs, enforceEager: true }).generate(prompts, greedy));
    for (const enforceEager of [true, false]) {
      const llm = new LLM({ model: moe, ...llmArgs, enforceEager, enableLora: true, maxLoraRank: 4 });
      assert.notDeepEqual(summary(llm.generate(prompts, greedy))[0]!.lps, want[0]!.lps);
      assertSame(summary(llm.generate(prompts, greedy, { loraRequest: { name: "moe", id: 1, path: adapter } })), want, `shared expert (${enforceEager ? "eager" : "step graphs"})`);
    }
  });

  it("refuses what it cannot serve with typed errors, before anything is queued", () => {
    const plain = new LLM({ model: base, ...llmArgs, enforceEager: true });
    assert.throws(() => plain.generate(prompts, greedy, { loraRequest: loraA }), (e: unknown) => e instanceof EngineInputError && e.param === "lora_request" && /not enabled/.test(e.message));
    const llm = new LLM({ model: base, ...llmArgs, enforceEager: true, enableLora: true, maxLoraRank: 2 });
    assert.throws(() => llm.generate(prompts, greedy, { loraRequest: loraA }), /LoRA rank 4 is greater than max_lora_rank 2/);
    assert.throws(() => llm.generate(prompts, greedy, { loraRequest: { name: "x", id: 3, path: tempPath("no-such-adapter") } }), /no adapter_config.json/);
    assert.throws(() => llm.generate(prompts, greedy, { loraRequest: { ...loraB, path: adapterA } }), /LoRA id 2|rank 4/);
    assert.equal(llm.engine.hasUnfinishedRequests(), false);
    assert.deepEqual(summary(llm.generate(prompts, greedy, { loraRequest: loraB })), summary(llm.generate(prompts, greedy, { loraRequest: loraB })));
  });
});

describe("readLoraAdapter", () => {
  const variant = (name: string, config: Record<string, unknown>, modules = ["model.layers.0.self_attn.q_proj"]): string =>
    writeLoraAdapter(base, tempPath(`lora-${name}`), { rank: 2, alpha: 4, seed: 1, modules, config });

  it("reads rank, alpha, scaling and every module's A and B", () => {
    const a = readLoraAdapter("a", adapterA, { maxRank: 16 });
    assert.equal(a.rank, 4);
    assert.equal(a.scaling, 2); // 8 / 4
    assert.equal(a.modules.size, 14);
    const q = a.modules.get("model.layers.1.self_attn.q_proj")!;
    assert.deepEqual([q.inFeatures, q.outFeatures, q.a.length, q.b.length], [64, 64, 4 * 64, 64 * 4]);
    assert.equal(readLoraAdapter("b", adapterB, { maxRank: 16 }).scaling, 4 / Math.sqrt(2)); // use_rslora
  });

  it("refuses adapters it would serve wrong", () => {
    const refuses = (dir: string, re: RegExp): void => assert.throws(() => readLoraAdapter("x", dir, { maxRank: 16 }), (e: unknown) => e instanceof LoraError && re.test(e.message));
    refuses(variant("dora", { use_dora: true }), /DoRA/);
    refuses(variant("bias", { bias: "all" }), /bias "all" is not supported/);
    refuses(variant("save", { modules_to_save: ["lm_head"] }), /modules_to_save/);
    refuses(variant("pattern", { rank_pattern: { q_proj: 8 } }), /rank_pattern/);
    refuses(variant("prefix", { peft_type: "PREFIX_TUNING" }), /peft_type/);
    const noWeights = variant("noweights", {});
    fs.rmSync(`${noWeights}/adapter_model.safetensors`);
    fs.writeFileSync(`${noWeights}/adapter_model.bin`, "pickle");
    refuses(noWeights, /adapter_model.bin/);
    assert.throws(() => readLoraAdapter("x", tempPath("nothing-here"), { maxRank: 16 }), (e: unknown) => e instanceof LoraError && e.kind === "not_found");
  });
});
