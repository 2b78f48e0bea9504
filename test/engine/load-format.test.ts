// How a model is read (vLLM's load_format, hf_overrides, disable_sliding_window): random "dummy" weights of the
// config's shapes with no tensor read, config.json keys overridden before the model is built, the sliding window
// capping max_model_len, and load formats that do not match the files refused by name.
import assert from "node:assert/strict";
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { EngineInputError } from "../../src/engine/errors.js";
import { LLM } from "../../src/engine/llm-engine.js";
import { createServingSetupSync } from "../../src/engine/serving.js";
import { exportGguf } from "../../src/models/init-model.js";
import { applyHfOverrides } from "../../src/models/load-format.js";
import { loadLocalModel, ModelLoadError } from "../../src/models/loader.js";
import { KilnError } from "../../src/util/errors.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

const base = { maxModelLen: 64, kvCacheMemory: 1 << 20, enforceEager: true };

/** A copy of `dir` without its weights: config, tokenizer and generation config, and a model.safetensors of junk. */
function withoutWeights(dir: string): string {
  const out = mkdtempSync(join(tmpdir(), "kiln-dummy-"));
  for (const f of ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"]) copyFileSync(join(dir, f), join(out, f));
  writeFileSync(join(out, "model.safetensors"), "not a safetensors file");
  return out;
}

test("load_format dummy: a config too large to allocate is a KilnError naming the parameter and its shape", () => {
  const dir = withoutWeights(tinyModelDir("LlamaForCausalLM"));
  try {
    const config = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>;
    writeFileSync(join(dir, "config.json"), JSON.stringify({ ...config, vocab_size: 1e11 }));
    assert.throws(
      () => loadLocalModel(dir, { loadFormat: "dummy", onNote: () => undefined }),
      (e: Error) => e instanceof KilnError && /"model\.embed_tokens\.weight" of shape \[100000000000, 64\].*cannot be allocated/.test(e.message),
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("load_format dummy: random weights of the config's shapes, no tensor read, the same on every load", { timeout: 120_000 }, () => {
  const dir = withoutWeights(tinyModelDir("LlamaForCausalLM"));
  try {
    assert.throws(() => loadLocalModel(dir), "the junk checkpoint cannot be read");
    const loaded = loadLocalModel(dir, { loadFormat: "dummy", onNote: () => undefined });
    const params = new Map(loaded.model.namedParameters());
    const norm = params.get("model.norm.weight")!.dataSync() as Float32Array;
    assert.ok(norm.every((x) => x === 1), "norms start at scale 1");
    const q = params.get("model.layers.0.self_attn.q_proj.weight")!;
    const values = q.dataSync() as Float32Array;
    const std = Math.sqrt(values.reduce((s, x) => s + x * x, 0) / values.length);
    assert.ok(std > 0.015 && std < 0.025, `std ${std}`);
    assert.deepEqual(q.shape, [loaded.config.numAttentionHeads * loaded.config.headDim, loaded.config.hiddenSize]);
    const run = () => new LLM({ model: dir, loadFormat: "dummy", ...base }).generate(["The jury said"], { temperature: 0, maxTokens: 6, ignoreEos: true });
    const [a, b] = [run()[0]!.outputs[0]!, run()[0]!.outputs[0]!];
    assert.equal(a.tokenIds.length, 6);
    assert.deepEqual(a.tokenIds, b.tokenIds, "the weights depend only on the parameter names");
  } finally {
    rmSync(dir, { recursive: true });
  }
});

test("a load format that does not match the model's files is refused naming both", { timeout: 60_000 }, () => {
  const dir = tinyModelDir("LlamaForCausalLM");
  const gguf = join(mkdtempSync(join(tmpdir(), "kiln-gguf-")), "tiny.gguf");
  exportGguf(dir, gguf);
  const refused = (p: string, loadFormat: "gguf" | "safetensors" | "dummy", re: RegExp) =>
    assert.throws(() => loadLocalModel(p, { loadFormat }), (e: unknown) => e instanceof ModelLoadError && re.test((e as Error).message));
  refused(dir, "gguf", /load_format "gguf" was asked, but the model's weights are safetensors/);
  refused(gguf, "safetensors", /load_format "safetensors" was asked, but the model's weights are gguf/);
  refused(gguf, "dummy", /load_format "dummy" needs a Hugging Face model directory/);
  assert.equal(loadLocalModel(gguf, { loadFormat: "gguf", onNote: () => undefined }).config.numHiddenLayers, 2);
  assert.throws(() => createServingSetupSync({ model: dir, loadFormat: "npz" as "auto" }), (e: unknown) => e instanceof EngineInputError && /load_format must be one of/.test((e as Error).message));
  rmSync(gguf);
});

test("hf_overrides: config.json keys over the model's before it is built; nested configs merge", { timeout: 60_000 }, () => {
  const dir = tinyModelDir("LlamaForCausalLM");
  const s = createServingSetupSync({ model: dir, ...base, maxModelLen: undefined, hfOverrides: { max_position_embeddings: 48, num_hidden_layers: 1 } });
  assert.equal(s.loaded.config.maxPositionEmbeddings, 48);
  assert.equal(s.engineArgs.maxModelLen, 48, "max_model_len follows the overridden config");
  assert.equal(s.loaded.config.numHiddenLayers, 1, "a checkpoint's extra layers are left unread");
  assert.throws(() => createServingSetupSync({ model: dir, hfOverrides: [1] as unknown as Record<string, unknown> }), /hf_overrides must be an object/);
  assert.deepEqual(
    applyHfOverrides({ rope_theta: 1e4, text_config: { a: 1, b: 2 }, quantization_config: { a: 1 }, rope_scaling: { type: "x", f: 1 } },
      { rope_theta: 5e5, text_config: { b: 3 }, quantization_config: { b: 1 }, rope_scaling: { type: "linear" }, sliding_window: null }),
    { rope_theta: 5e5, text_config: { a: 1, b: 3 }, quantization_config: { b: 1 }, rope_scaling: { type: "linear" }, sliding_window: null },
  );
});

test("disable_sliding_window caps max_model_len to the model's window", { timeout: 60_000 }, () => {
  const dir = tinyModelDir("MistralForCausalLM"); // sliding_window 64, max_position_embeddings 512
  const args = { model: dir, kvCacheMemory: 4 << 20, enforceEager: true };
  assert.equal(createServingSetupSync(args).engineArgs.maxModelLen, 512);
  assert.equal(createServingSetupSync({ ...args, disableSlidingWindow: true }).engineArgs.maxModelLen, 64);
  assert.throws(
    () => createServingSetupSync({ ...args, disableSlidingWindow: true, maxModelLen: 128 }),
    (e: unknown) => e instanceof EngineInputError && /max_model_len 128 exceeds the model's sliding window 64/.test((e as Error).message),
  );
  // a model without a window is not capped
  assert.equal(createServingSetupSync({ ...args, model: tinyModelDir("LlamaForCausalLM"), disableSlidingWindow: true }).engineArgs.maxModelLen, 512);
});

test("VLLM_ALLOW_LONG_MAX_MODEL_LEN: max_model_len past max_position_embeddings is refused without it, served with it as by a model with that many positions", { timeout: 60_000 }, () => {
  const dir = tinyModelDir("LlamaForCausalLM");
  const args = { model: dir, kvCacheMemory: 1 << 20, enforceEager: true, maxModelLen: 96 };
  const prompt = { promptTokenIds: Array.from({ length: 70 }, (_, i) => 3 + ((i * 37) % 200)) };
  const greedy = (llm: LLM) => llm.generate([prompt], { temperature: 0, maxTokens: 8, ignoreEos: true })[0]!.outputs[0]!.tokenIds;
  const saved = process.env.VLLM_ALLOW_LONG_MAX_MODEL_LEN;
  try {
    delete process.env.VLLM_ALLOW_LONG_MAX_MODEL_LEN;
    assert.throws(
      () => createServingSetupSync({ ...args, hfOverrides: { max_position_embeddings: 48 } }),
      (e: unknown) => e instanceof EngineInputError && /max_model_len 96 exceeds the model's max_position_embeddings 48 \(set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1/.test((e as Error).message),
    );
    const reference = greedy(new LLM({ ...args, hfOverrides: { max_position_embeddings: 96 } }));
    process.env.VLLM_ALLOW_LONG_MAX_MODEL_LEN = "true";
    const long = new LLM({ ...args, hfOverrides: { max_position_embeddings: 48 } });
    assert.deepEqual(greedy(long), reference, "positions 48..77 rotate as in a model with 96 positions");
  } finally {
    if (saved === undefined) delete process.env.VLLM_ALLOW_LONG_MAX_MODEL_LEN;
    else process.env.VLLM_ALLOW_LONG_MAX_MODEL_LEN = saved;
  }
});
