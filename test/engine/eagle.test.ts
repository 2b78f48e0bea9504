// Speculative decoding with EAGLE heads (vLLM's speculative_config {"method": "eagle" | "eagle3", "model": <head>}):
// greedy outputs are token for token those without speculation whatever the head (random heads, whose drafts mostly
// fail), with step graphs (the served model's steps and the head's replayed) and eagerly, over prompts longer than a
// step, concurrent requests and preemption; a head built to agree with a served model gets its drafts accepted (the
// hidden states and positions line up: EAGLE-1's final state, EAGLE-3's aux layers); the proposer's drafts equal a
// pure-TS computation of the head, captured or not; configs that cannot draft are typed errors.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";
import { parseServeArgs } from "../../src/cli/serve-args.js";
import { EagleProposer } from "../../src/engine/eagle.js";
import { PagedModelRunner } from "../../src/engine/paged-model-runner.js";
import { EngineInputError } from "../../src/engine/errors.js";
import { LLM } from "../../src/engine/llm-engine.js";
import { resolveSpeculativeConfig, type DraftRequest, type Drafter } from "../../src/engine/speculative.js";
import type { SamplingParams } from "../../src/engine/types.js";
import { loadEagleHead, type EagleMethod } from "../../src/models/eagle-head.js";
import { readSafetensors, writeSafetensors } from "../../src/models/formats/safetensors.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";
import { writeEagleHead } from "../helpers/eagle-head.js";
import { readWeights, referenceDrafts } from "../helpers/eagle-reference.js";

const target = () => tinyModelDir("LlamaForCausalLM", { overrides: { num_hidden_layers: 3 } });
const prompts = [
  { promptTokenIds: Array.from({ length: 150 }, (_, i) => (i * 7 + 3) % 300) }, // longer than a step's 64 tokens
  { promptTokenIds: [5, 6, 7, 8, 9, 10, 11] },
  { promptTokenIds: Array.from({ length: 40 }, (_, i) => (i * 13 + 1) % 250) },
];
const greedy: Partial<SamplingParams> = { temperature: 0, maxTokens: 20, ignoreEos: true };

const H = 64; // the tiny preset's hidden size

/** The target with the weights `zero` names set to zero, written once under `name`. */
function zeroedTarget(name: string, zero: (tensor: string) => boolean): string {
  const dir = tempPath(name);
  if (fs.existsSync(path.join(dir, "model.safetensors"))) return dir;
  const src = target();
  fs.mkdirSync(dir, { recursive: true });
  for (const f of fs.readdirSync(src)) if (f !== "model.safetensors") fs.copyFileSync(path.join(src, f), path.join(dir, f));
  const h = readSafetensors(src);
  const tensors = h.tensors.map((t) => {
    const v = h.loadAsFloat32(t.name);
    return { name: t.name, dtype: "F32" as const, shape: t.shape, data: zero(t.name) ? new Float32Array(v.length) : v };
  });
  h.close();
  writeSafetensors(path.join(dir, "model.safetensors"), tensors);
  return dir;
}

/** The target with every attention's o_proj zero: its hidden state at p depends on token p alone (a Markov chain). */
const markovTarget = () => zeroedTarget("eagle-markov-target", (n) => n.endsWith("o_proj.weight"));

/** The target whose last layer adds nothing (o_proj, down_proj zero): the stream entering it is the final one. */
const lastLayerIdle = () => zeroedTarget("eagle-idle-last-target", (n) => /^model\.layers\.2\.(self_attn\.o_proj|mlp\.down_proj)\.weight$/.test(n));

/** Step graph replays and eager steps of the served model and of its EAGLE head. */
function replays(llm: LLM): { served: number; head: number; headEager: number } {
  const runner = llm.engine.runner;
  assert.ok(runner instanceof PagedModelRunner);
  const head = (llm.engine as unknown as { draft: EagleProposer }).draft.runner;
  return { served: runner.graphs?.replays ?? 0, head: head.replays, headEager: head.eagerSteps };
}

/** Asserts that every step of the served model and of the head was replayed (graphs), or that none was (eager). */
function assertReplayed(llm: LLM, enforceEager: boolean, what: string): void {
  const r = replays(llm);
  if (enforceEager) assert.deepEqual(r, { served: 0, head: 0, headEager: r.headEager }, what);
  else assert.deepEqual(r, { served: llm.engine.numSteps, head: r.head, headEager: 0 }, `${what}: every step replayed`);
  assert.ok(r.head + r.headEager > 5, `${what}: ${JSON.stringify(r)}`);
}

/** fc [H, 2H] passing one half of [embedding, hidden] through. */
function fcPassing(half: "embedding" | "hidden"): Float32Array {
  const w = new Float32Array(H * 2 * H);
  for (let i = 0; i < H; i++) w[i * 2 * H + i + (half === "hidden" ? H : 0)] = 1;
  return w;
}

/** Wraps an LLM's drafter to record each proposal: (requests, drafts). */
function recordProposals(llm: LLM): { requests: DraftRequest[]; drafts: Map<string, number[]> }[] {
  const drafter = (llm.engine as unknown as { draft: Drafter }).draft;
  const seen: { requests: DraftRequest[]; drafts: Map<string, number[]> }[] = [];
  const propose = drafter.propose.bind(drafter);
  drafter.propose = (requests, running) => {
    const drafts = propose(requests, running);
    seen.push({ requests: requests.map((r) => ({ ...r, tokens: [...r.tokens] })), drafts });
    return drafts;
  };
  return seen;
}

function run(model: string, spec: { method: "eagle" | "eagle3"; model: string } | null, extra: Record<string, unknown> = {}, params = greedy) {
  const llm = new LLM({
    model, maxModelLen: 256, maxNumBatchedTokens: 64,
    ...(spec === null ? {} : { speculativeConfig: { ...spec, numSpeculativeTokens: 3 } }),
    ...extra,
  });
  const out = llm.generate(prompts, params).map((o) => o.outputs[0]!.tokenIds);
  return { out, stats: llm.engine.stats(), llm };
}

describe("EAGLE speculative decoding", () => {
  const base = run(target(), null).out;
  const eagle1 = () => writeEagleHead(target(), "e1-random", { method: "eagle" });
  const eagle3 = () => writeEagleHead(target(), "e3-random", { method: "eagle3", config: { draft_vocab_size: 400 }, d2t: Array.from({ length: 400 }, (_, d) => (d % 5 === 0 ? 100 : 0)).map((o, d) => (d + o < 512 ? o : 0)) });

  for (const enforceEager of [false, true]) {
    it(`greedy outputs equal those without speculation, random EAGLE-1 and EAGLE-3 heads (${enforceEager ? "eager" : "step graphs"})`, { timeout: 120_000 }, () => {
      for (const spec of [{ method: "eagle" as const, model: eagle1() }, { method: "eagle3" as const, model: eagle3() }]) {
        const r = run(target(), spec, { enforceEager });
        assert.deepEqual(r.out, base, spec.method);
        assert.ok(r.stats.specDraftTokens! > 0, `${spec.method} drafted ${r.stats.specDraftTokens}`);
        assertReplayed(r.llm, enforceEager, spec.method);
      }
    });
  }

  it("head steps no captured bucket fits run eagerly, the others replay", { timeout: 60_000 }, () => {
    // mixed buckets of 4 and 8 tokens: the head's feeds of prompt chunks run eagerly
    const r = run(target(), { method: "eagle3", model: eagle3() }, { maxCaptureTokens: 8 });
    assert.deepEqual(r.out, base);
    const n = replays(r.llm);
    assert.ok(n.head > 0 && n.headEager > 0, JSON.stringify(n));
  });

  it("a head built to agree with the served model gets every draft accepted (tokens line up with positions)", { timeout: 60_000 }, () => {
    // served model: attention outputs zero, so its next token is a function of the current one, M(t). Head: fc passes
    // the embedding through, then the served model's own layers (its o_proj zero too): at position p it reads token
    // p + 1 and computes the served model's residual stream there, whose argmax through the LM head (the final norm's
    // weights are ones: a positive scale per row) is M(token p + 1), token p + 2: the served model's own next token.
    const served = markovTarget();
    const hw = readSafetensors(served);
    const weights: Record<string, Float32Array> = { "fc.weight": fcPassing("embedding") };
    for (const t of hw.tensors) if (t.name.startsWith("model.layers.")) weights[t.name.slice("model.".length)] = hw.loadAsFloat32(t.name);
    hw.close();
    const head = writeEagleHead(served, "agree", { method: "eagle", config: { num_hidden_layers: 3 }, weights });
    const plain = run(served, null, { enforceEager: true }).out;
    for (const enforceEager of [false, true]) {
      const r = run(served, { method: "eagle", model: head }, { enforceEager });
      assert.deepEqual(r.out, plain);
      assert.ok(r.stats.specDraftTokens! > 30, `drafted ${r.stats.specDraftTokens}`);
      assert.equal(r.stats.specAcceptedTokens, r.stats.specDraftTokens);
      assertReplayed(r.llm, enforceEager, `enforceEager ${enforceEager}`);
    }
  });

  for (const method of ["eagle", "eagle3"] as const)
    it(`a ${method} head that passes the served model's hidden state through proposes the token that state sampled: the last one (hidden states line up)`, { timeout: 60_000 }, () => {
      // fc passes one hidden state through, the layer adds nothing (o_proj, down_proj zero): the head's output at p is
      // the served model's state at p, whose LM head argmax is token p + 1. Fed at N - 2, it proposes token N - 1 (the
      // last one), not N - 2's (an off-by-one in the rows) nor anything else; its own state fed back gives it again.
      // EAGLE-1 reads the final state. EAGLE-3 reads the streams entering layers 0, 1, 2 and passes the third: the
      // served model's last layer adds nothing, so that stream is the final one (the first two are not: a graph
      // returning another layer's stream, or the streams in another order, proposes other tokens).
      const zeros = (n: number) => new Float32Array(n);
      const served = method === "eagle" ? target() : lastLayerIdle();
      let head: string;
      if (method === "eagle") {
        head = writeEagleHead(served, "identity", {
          method, weights: { "fc.weight": fcPassing("hidden"), "layers.0.self_attn.o_proj.weight": zeros(H * H), "layers.0.mlp.down_proj.weight": zeros(H * 128) },
        });
      } else {
        const fc = new Float32Array(H * 3 * H);
        for (let i = 0; i < H; i++) fc[i * 3 * H + 2 * H + i] = 1; // the stream entering layer 2
        const hw = readSafetensors(served);
        const lmHead = hw.loadAsFloat32("lm_head.weight");
        hw.close();
        head = writeEagleHead(served, "identity3", {
          method, config: { eagle_aux_hidden_state_layer_ids: [0, 1, 2] },
          weights: { "fc.weight": fc, "midlayer.self_attn.o_proj.weight": zeros(H * H), "midlayer.mlp.down_proj.weight": zeros(H * 128), "lm_head.weight": lmHead },
        });
      }
      const plain = method === "eagle" ? base : run(served, null, { enforceEager: true }).out;
      for (const enforceEager of [false, true]) {
        const llm = new LLM({ model: served, maxModelLen: 256, maxNumBatchedTokens: 64, enforceEager, speculativeConfig: { method, model: head, numSpeculativeTokens: 3 } });
        const seen = recordProposals(llm);
        assert.deepEqual(llm.generate(prompts, greedy).map((o) => o.outputs[0]!.tokenIds), plain);
        let checked = 0;
        for (const { requests, drafts } of seen)
          for (const r of requests) {
            const d = drafts.get(r.requestId)!;
            if (r.k === 0) assert.deepEqual(d, []);
            else if (d.length > 0) {
              assert.deepEqual(d, Array(r.k).fill(r.tokens.at(-1)), `drafts after ${r.tokens.slice(-3).join(",")} (enforceEager ${enforceEager})`);
              checked++;
            }
          }
        assert.ok(checked >= 9, `checked ${checked} proposals`); // (rejected drafts pause drafting: few proposals)
        assertReplayed(llm, enforceEager, `enforceEager ${enforceEager}`);
      }
    });

  for (const [method, captured] of [["eagle", false], ["eagle3", false], ["eagle", true], ["eagle3", true]] as const)
    it(`the proposer's drafts equal a pure-TS ${method} head on the same hidden states, in chunks and a step later (${captured ? "step graphs" : "eager"})`, { timeout: 60_000 }, () => {
      const loaded = loadLocalModel(target());
      const d2t = method === "eagle3" ? Array.from({ length: 300 }, (_, d) => (d % 3 === 0 ? 200 : 0)) : null;
      const dir = method === "eagle"
        ? writeEagleHead(target(), "ref-e1", { method, config: { num_hidden_layers: 2 }, seed: 5, std: 0.3 })
        : writeEagleHead(target(), "ref-e3", { method, config: { draft_vocab_size: 300 }, d2t: d2t!, seed: 6, std: 0.3 });
      const head = loadEagleHead(dir, method as EagleMethod, loaded.model, "float32");
      const p = new EagleProposer(head, 4, 64, 8); // 4-token blocks, 8 positions a head forward: the catch-up goes in chunks
      if (captured) assert.ok(p.captureStepGraphs(64, { decodeBuckets: [1, 2], mixedBuckets: [4, 8], fuse: true }));
      const width = head.targetRowSize;
      let seed = 1;
      const rnd = () => ((seed = (Math.imul(seed, 48271) + 11) >>> 0) / 2 ** 32) * 2 - 1;
      const rows: Float32Array[] = [];
      const tokens = Array.from({ length: 13 }, () => Math.floor((rnd() + 1) * 250));
      const feed = (from: number, to: number) => {
        for (let q = from; q < to; q++) rows.push(Float32Array.from({ length: width }, () => rnd() * 2));
        const flat = new Float32Array((to - from) * width);
        for (let q = from; q < to; q++) flat.set(rows[q]!, (q - from) * width);
        p.observe("a", from, flat, to - from);
      };
      const cfg = { method, hidden: H, heads: 4, kvHeads: 2, headDim: 16, eps: 1e-6, theta: 10000, layers: method === "eagle" ? 2 : 1 };
      const hw = readWeights(dir), tw = readWeights(target());
      const expect = () => referenceDrafts(cfg, hw, tw, tokens, rows.map((r) => Float64Array.from(r)), 3, d2t);
      feed(0, 5); // a prompt chunk, then the rest: positions 0 .. N-2
      feed(5, tokens.length - 1);
      assert.deepEqual(p.propose([{ requestId: "a", tokens, k: 3 }], new Set(["a"])).get("a"), expect());
      // the next step kept two drafts and sampled one more: rows of positions N-1 .. N+1 come
      const n = tokens.length;
      tokens.push(7, 8, 9);
      feed(n - 1, n + 2);
      assert.deepEqual(p.propose([{ requestId: "a", tokens, k: 3 }], new Set(["a"])).get("a"), expect());
      // not scheduled since: the same drafts again (the last position fed again)
      assert.deepEqual(p.propose([{ requestId: "a", tokens, k: 3 }], new Set(["a"])).get("a"), expect());
      assert.ok(p.numFreeBlocks < 63);
      p.propose([], new Set());
      assert.deepEqual([p.numTracked, p.numFreeBlocks], [0, 63]);
      if (captured) assert.deepEqual([p.runner.replays > 5, p.runner.eagerSteps], [true, 0]);
      else assert.deepEqual([p.runner.replays, p.runner.eagerSteps > 5], [0, true]);
      p.dispose();
    });

  it("under preemption (a KV cache too small for every request at once), and sleep mode", { timeout: 60_000 }, () => {
    // 3 layers x 16 tokens x 2 KV heads x 16 dims x 4 bytes x (K, V) = 12 KiB a block: 17 blocks, one max_model_len
    const spec = run(target(), { method: "eagle", model: eagle1() }, { kvCacheMemory: 17 * 12 * 1024 });
    assert.ok(spec.stats.numPreemptions > 0, "the cache is small enough to preempt");
    assert.deepEqual(spec.out, base);
    const llm = new LLM({ model: target(), maxModelLen: 256, maxNumBatchedTokens: 64, enableSleepMode: true, speculativeConfig: { method: "eagle3", model: eagle3(), numSpeculativeTokens: 3 } });
    assert.deepEqual(llm.generate(prompts, greedy).map((o) => o.outputs[0]!.tokenIds), base);
    const before = replays(llm);
    llm.sleep(1);
    llm.wakeUp();
    assert.deepEqual(llm.generate(prompts, greedy).map((o) => o.outputs[0]!.tokenIds), base);
    const after = replays(llm); // the head's graphs captured again with its KV cache
    // (the served model's graphs are new ones, counting from 0)
    assert.ok(after.served > 10 && after.head > before.head && after.headEager === 0, JSON.stringify({ before, after }));
  });

  it("configs: eagle and eagle3 methods; typed errors for heads that do not fit the served model", () => {
    assert.deepEqual(resolveSpeculativeConfig({ method: "eagle3", model: "h", numSpeculativeTokens: 2 }), { method: "eagle3", model: "h", numSpeculativeTokens: 2 });
    assert.deepEqual(parseServeArgs("x", { speculativeConfig: '{"method": "eagle", "model": "h", "num_speculative_tokens": 4}' }, {}).speculativeConfig, {
      method: "eagle", model: "h", numSpeculativeTokens: 4,
    });
    assert.throws(() => parseServeArgs("x", { speculativeConfig: '{"method": "eagle", "model": "h", "num_speculative_tokens": 4, "prompt_lookup_max": 2}' }, {}), /"prompt_lookup_max" does not apply to method "eagle"/);
    assert.throws(() => resolveSpeculativeConfig({ method: "eagle3", numSpeculativeTokens: 2 }), /model must name the EAGLE head's directory/);
    assert.throws(() => resolveSpeculativeConfig({ method: "medusa" as "eagle", model: "h", numSpeculativeTokens: 2 }), /method "medusa" is not supported/);
    const refused = (method: "eagle" | "eagle3", head: string, why: RegExp, model = target()) =>
      assert.throws(
        () => new LLM({ model, maxModelLen: 256, speculativeConfig: { method, model: head, numSpeculativeTokens: 2 } }),
        (e: unknown) => e instanceof EngineInputError && e.param === "speculative_config" && why.test(e.message),
      );
    const small = { hidden_size: 32, intermediate_size: 64, num_attention_heads: 2, num_key_value_heads: 2 };
    refused("eagle", writeEagleHead(target(), "bad-hidden", { method: "eagle", config: small }), /hidden size is 32, the served model's 64/);
    refused("eagle3", writeEagleHead(target(), "bad-target-hidden", { method: "eagle3", config: { target_hidden_size: 32 } }), /hidden states of size 32, the served model's are 64/);
    refused("eagle3", writeEagleHead(target(), "bad-vocab", { method: "eagle3", config: { vocab_size: 1000 } }), /vocabulary has 1000 tokens, the served model's 512/);
    refused("eagle3", writeEagleHead(target(), "bad-aux", { method: "eagle3", config: { eagle_aux_hidden_state_layer_ids: [0, 1, 5] } }), /aux hidden state layers \[0,1,5\] must be 3 distinct layers of the served model's 3/);
    // a 2-layer served model has no default aux layers (2, L/2, L-3)
    refused("eagle3", writeEagleHead(target(), "default-aux", { method: "eagle3" }), /the default 2, L\/2, L-3/, tinyModelDir("LlamaForCausalLM"));
    refused("eagle3", writeEagleHead(target(), "no-d2t", { method: "eagle3", config: { draft_vocab_size: 100 } }), /needs d2t/);
    refused("eagle", tempPath("no-such-head"), /EAGLE head: .*no-such-head does not exist/);
    const noFc = writeEagleHead(target(), "no-fc", { method: "eagle" });
    const h = readSafetensors(noFc);
    const kept = h.tensors.filter((t) => t.name !== "fc.weight").map((t) => ({ name: t.name, dtype: "F32" as const, shape: t.shape, data: h.loadAsFloat32(t.name) }));
    h.close();
    writeSafetensors(path.join(noFc, "model.safetensors"), kept);
    refused("eagle", noFc, /checkpoint lacks 1 parameters, e.g. fc.weight/);
  });
});
