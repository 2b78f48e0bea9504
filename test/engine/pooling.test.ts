// A pooling engine (vLLM's --runner pooling): each prompt's final hidden states pooled into one vector, checked
// against the model's dense forward (the training path: another attention kernel, no KV cache, no chunks) pooled
// here by hand, with prompts read in one step and in chunks of 5 tokens, alone and batched.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";
import { LLM } from "../../src/engine/llm-engine.js";
import { resolvePooler } from "../../src/engine/serving.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { noGrad, tensor } from "../../src/tensor/index.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";

const dir = tinyModelDir("LlamaForCausalLM");
const prompts = [[5, 17, 42, 99, 3, 250, 7, 8, 9, 10, 11, 12, 13], [300, 2, 44], [5, 17, 42, 99, 3, 250, 7, 8, 9, 10, 11, 12, 13]];

/** The dense forward's final hidden rows [L, H] of one prompt. */
function denseHidden(ids: number[]): Float32Array[] {
  const { model } = loadLocalModel(dir);
  return noGrad(() => {
    const L = ids.length;
    const positions = tensor(Int32Array.from({ length: L }, (_, i) => i));
    const h = model.forward(tensor(Int32Array.from(ids)), { kind: "dense", batch: 1, seqLen: L, positions });
    const flat = h.dataSync() as Float32Array;
    const H = flat.length / L;
    return Array.from({ length: L }, (_, i) => flat.slice(i * H, (i + 1) * H));
  });
}

function pool(rows: Float32Array[], type: "LAST" | "MEAN" | "CLS", normalize: boolean): Float32Array {
  const H = rows[0]!.length;
  let v = new Float32Array(H);
  if (type === "LAST") v = rows[rows.length - 1]!.slice();
  else if (type === "CLS") v = rows[0]!.slice();
  else for (const r of rows) for (let i = 0; i < H; i++) v[i] += r[i]! / rows.length;
  if (normalize) {
    const n = Math.hypot(...v);
    for (let i = 0; i < H; i++) v[i] = v[i]! / n;
  }
  return v;
}

function assertClose(got: Float32Array, want: Float32Array, what: string): void {
  assert.equal(got.length, want.length, what);
  for (let i = 0; i < want.length; i++) assert.ok(Math.abs(got[i]! - want[i]!) < 1e-4, `${what}[${i}]: ${got[i]} vs ${want[i]}`);
}

describe("pooling runner (embeddings)", () => {
  const hidden = prompts.map(denseHidden);
  for (const [type, normalize] of [["LAST", true], ["MEAN", true], ["CLS", false]] as const) {
    for (const chunk of [undefined, 5]) {
      it(`${type}${normalize ? ", normalized" : ""}: the dense forward's rows pooled${chunk ? `, prompts read in chunks of ${chunk}` : ""}`, () => {
        const llm = new LLM({
          model: dir, runner: "pooling", poolerConfig: { poolingType: type, normalize }, maxModelLen: 64, kvCacheMemory: 1 << 20,
          ...(chunk ? { maxNumBatchedTokens: chunk } : {}),
        });
        const out = llm.embed(prompts.map((p) => ({ promptTokenIds: p })));
        out.forEach((o, i) => assertClose(o.embedding, pool(hidden[i]!, type, normalize), `prompt ${i}`));
        if (normalize) assert.ok(Math.abs(Math.hypot(...out[0]!.embedding) - 1) < 1e-5);
        // the third prompt repeats the first (a prefix-cache hit for LAST): the same vector
        assertClose(out[2]!.embedding, out[0]!.embedding, "repeated prompt");
      });
    }
  }

  it("a pooling LLM does not generate and a generating one does not embed", () => {
    const pooling = new LLM({ model: dir, runner: "pooling", maxModelLen: 64, kvCacheMemory: 1 << 20 });
    assert.throws(() => pooling.generate(["x"]), /use embed\(\)/);
    const gen = new LLM({ model: dir, maxModelLen: 64, kvCacheMemory: 1 << 20, enforceEager: true });
    assert.throws(() => gen.embed(["x"]), /runner: "pooling"/);
    assert.throws(() => new LLM({ model: dir, poolerConfig: { poolingType: "MEAN" } }), /pooler_config needs runner "pooling"/);
    assert.throws(() => new LLM({ model: dir, runner: "pooling", poolerConfig: { poolingType: "MAX" as "MEAN" } }), /pooling_type must be LAST, MEAN or CLS/);
  });

  it("reads a sentence-transformers model's pooling and normalization as vLLM does (through modules.json)", () => {
    const st = tempPath("st-pooling");
    fs.mkdirSync(path.join(st, "2_Pool"), { recursive: true });
    fs.writeFileSync(path.join(st, "2_Pool", "config.json"), JSON.stringify({ pooling_mode_mean_tokens: true, pooling_mode_cls_token: false }));
    assert.deepEqual(resolvePooler(st, {}), { poolingType: "LAST", normalize: true }); // no modules.json: the defaults
    const modules = [{ type: "sentence_transformers.models.Transformer", path: "" }, { type: "sentence_transformers.models.Pooling", path: "2_Pool" }];
    fs.writeFileSync(path.join(st, "modules.json"), JSON.stringify(modules));
    assert.deepEqual(resolvePooler(st, {}), { poolingType: "MEAN", normalize: false });
    fs.writeFileSync(path.join(st, "modules.json"), JSON.stringify([...modules, { type: "sentence_transformers.models.Normalize", path: "3_Norm" }]));
    assert.deepEqual(resolvePooler(st, {}), { poolingType: "MEAN", normalize: true });
    assert.deepEqual(resolvePooler(st, { poolingType: "CLS" }), { poolingType: "CLS", normalize: true });
    fs.writeFileSync(path.join(st, "2_Pool", "config.json"), JSON.stringify({ pooling_mode_max_tokens: true }));
    assert.throws(() => resolvePooler(st, {}), /pooling \(max_tokens\) is not supported/);
    assert.deepEqual(resolvePooler(dir, {}), { poolingType: "LAST", normalize: true });
  });
});
