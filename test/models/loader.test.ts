// loadLocalModel / loadModel: --dtype, Q8_0 GGUF, tied embeddings, head_dim, sharded checkpoints, typed errors on
// hostile inputs, and loading a model larger than the JS heap. Malformed headers are covered in safetensors/gguf tests.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { CausalLM } from "../../src/models/causal-lm.js";
import { ModelConfigError, parseHfConfig } from "../../src/models/hf-config.js";
import { ModelNotFoundError } from "../../src/models/hub.js";
import { exportGguf, initModel } from "../../src/models/init-model.js";
import { loadLocalModel, loadModel, ModelLoadError, type LoadedModel } from "../../src/models/loader.js";
import { ModelFormatError } from "../../src/models/formats/model-format-error.js";
import { readSafetensors, writeSafetensors, writeSafetensorsIndex, type SafetensorsWriteTensor } from "../../src/models/formats/safetensors.js";
import { StateDictError } from "../../src/nn/module.js";
import { noGrad, tensor } from "../../src/tensor/index.js";
import { defaultDevice } from "../../src/tensor/device.js";
import { DTYPE_BYTES } from "../../src/backends/dtype.js";
import { UnsupportedError } from "../../src/util/errors.js";
import { tempPath, testTokenizerDir, tinyModelDir } from "../helpers/tiny-model.js";

const root = fileURLToPath(new URL("../../..", import.meta.url)); // dist/test/models -> package root
const PROMPT_IDS = [5, 77, 140, 31, 260, 9, 402, 18];

/** Logits [T][vocab] of a dense forward over `ids`. */
function allLogits(m: LoadedModel, ids: number[]): Float32Array[] {
  return noGrad(() => {
    const input = tensor(Int32Array.from(ids));
    const positions = tensor(Int32Array.from(ids, (_, i) => i));
    const hidden = m.model.forward(input, { kind: "dense", batch: 1, seqLen: ids.length, positions });
    const logits = m.model.logits(hidden);
    const flat = logits.dataSync() as Float32Array;
    const V = m.config.vocabSize;
    const rows = ids.map((_, t) => flat.slice(t * V, (t + 1) * V));
    for (const t of [input, positions, hidden, logits]) t.dispose();
    return rows;
  });
}

const lastLogits = (m: LoadedModel, ids: number[]) => allLogits(m, ids).at(-1)!;
const argmax = (v: Float32Array) => v.reduce((best, x, i) => (x > v[best]! ? i : best), 0);
const maxAbs = (v: Float32Array) => v.reduce((a, x) => Math.max(a, Math.abs(x)), 0);
const maxAbsDiff = (a: Float32Array, b: Float32Array) => a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i]!)), 0);

/** Greedy continuation by re-running the dense forward (the reference path, no KV cache). */
function greedy(m: LoadedModel, ids: number[], n: number): number[] {
  const seq = [...ids];
  for (let i = 0; i < n; i++) seq.push(argmax(lastLogits(m, seq)));
  return seq;
}

function param(m: LoadedModel, name: string) {
  const t = m.model.namedParameters().find(([n]) => n === name);
  assert.ok(t, `no parameter ${name}`);
  return t[1];
}

/** A fresh copy of a model directory to break in one way. */
function copyDir(src: string, name: string): string {
  const dst = tempPath(name);
  fs.rmSync(dst, { recursive: true, force: true });
  fs.cpSync(src, dst, { recursive: true });
  return dst;
}

function editConfig(dir: string, edit: (cfg: Record<string, unknown>) => void): void {
  const file = path.join(dir, "config.json");
  const cfg = JSON.parse(fs.readFileSync(file, "utf8")) as Record<string, unknown>;
  edit(cfg);
  fs.writeFileSync(file, JSON.stringify(cfg));
}

function readAllTensors(file: string): SafetensorsWriteTensor[] {
  const st = readSafetensors(file);
  try {
    return st.tensors.map((t) => ({ name: t.name, dtype: t.dtype, shape: t.shape, data: st.load(t.name) }));
  } finally {
    st.close();
  }
}

test("--dtype: auto follows torch_dtype, float32 forces f32, float16 is a clear UnsupportedError", () => {
  const bf16Dir = tinyModelDir("LlamaForCausalLM", { dtype: "bfloat16" });
  const auto = loadLocalModel(bf16Dir);
  assert.equal(auto.dtype, "bfloat16");
  assert.equal(param(auto, "model.layers.0.self_attn.q_proj.weight").dtype, "bfloat16");
  assert.equal(param(auto, "model.embed_tokens.weight").dtype, "bfloat16");
  assert.equal(param(auto, "model.layers.0.input_layernorm.weight").dtype, "float32"); // norms stay f32
  const f32 = loadLocalModel(bf16Dir, { dtype: "float32" });
  assert.equal(f32.dtype, "float32");
  for (const [n, t] of f32.model.namedParameters()) assert.equal(t.dtype, "float32", n);
  // bf16 -> f32 widening is exact, so both loads compute the same function up to accumulation order
  const a = lastLogits(auto, PROMPT_IDS);
  const b = lastLogits(f32, PROMPT_IDS);
  assert.ok(maxAbsDiff(a, b) <= 0.02 * maxAbs(b), `bf16 vs widened f32: ${maxAbsDiff(a, b)}`);
  assert.equal(loadLocalModel(tinyModelDir("LlamaForCausalLM")).dtype, "float32"); // f32 checkpoint under auto
  for (const dtype of ["float16", "half"] as const) {
    assert.throws(() => loadLocalModel(bf16Dir, { dtype }), (e: unknown) => e instanceof UnsupportedError && /float16 is not supported on cpu/.test((e as Error).message));
  }
});

test("bf16 and f32 agree on the greedy continuation of an f32 checkpoint (teacher-forced, >= 28 of 32 positions)", () => {
  // Casting weights to bf16 (8-bit mantissa, rel. error <= 2^-9) perturbs logits by ~1%; the argmax can only
  // flip where the top two logits are that close. Teacher forcing keeps one early flip from cascading.
  const dir = tinyModelDir("LlamaForCausalLM");
  const f32 = loadLocalModel(dir, { dtype: "float32" });
  const bf16 = loadLocalModel(dir, { dtype: "bfloat16" });
  assert.equal(param(bf16, "lm_head.weight").dtype, "bfloat16");
  // seq is f32's own greedy continuation, so f32's argmax at each position is seq[t + 1] by construction
  const seq = greedy(f32, PROMPT_IDS, 32);
  const b = allLogits(bf16, seq);
  let agree = 0;
  for (let t = PROMPT_IDS.length - 1; t < seq.length - 1; t++) if (argmax(b[t]!) === seq[t + 1]) agree++;
  assert.ok(agree >= 28, `bf16 agrees with f32 on ${agree}/32 greedy tokens`);
});

test("Q8_0 GGUF export loads; last-position logits within Q8_0's per-block error of f32", () => {
  // Q8_0 stores each 32-weight block as int8 * (max|w| / 127): per-weight error <= max|w| / 254, i.e. ~0.4% of a
  // block's largest weight. Through 2 layers of 7 quantized matrices plus lm_head this stays well under 5% of the
  // logit range; a broken block layout or scale would be off by ~100%.
  const dir = tinyModelDir("LlamaForCausalLM");
  const file = tempPath("llama-q8_0.gguf");
  exportGguf(dir, file, "Q8_0");
  const q8 = loadLocalModel(file);
  const f32 = loadLocalModel(dir);
  const a = lastLogits(q8, PROMPT_IDS);
  const b = lastLogits(f32, PROMPT_IDS);
  const err = maxAbsDiff(a, b);
  assert.ok(err > 0, "Q8_0 should not be lossless on random weights");
  assert.ok(err <= 0.05 * maxAbs(b), `Q8_0 max logit error ${err} vs logit range ${maxAbs(b)}`);
});

test("tied embeddings: no lm_head in the file, logits use embed_tokens (safetensors and GGUF)", () => {
  const dir = tinyModelDir("LlamaForCausalLM", { overrides: { tie_word_embeddings: true } });
  const st = readSafetensors(path.join(dir, "model.safetensors"));
  assert.equal(st.has("lm_head.weight"), false);
  st.close();
  const m = loadLocalModel(dir);
  assert.equal(m.model.lmHead, null);
  // logits[v] = final hidden . embed_tokens[v]
  const hiddenLast = noGrad(() => {
    const ids = tensor(Int32Array.from(PROMPT_IDS));
    const positions = tensor(Int32Array.from(PROMPT_IDS, (_, i) => i));
    const h = m.model.forward(ids, { kind: "dense", batch: 1, seqLen: PROMPT_IDS.length, positions });
    const H = m.config.hiddenSize;
    const row = (h.dataSync() as Float32Array).slice((PROMPT_IDS.length - 1) * H);
    h.dispose();
    return row;
  });
  const emb = param(m, "model.embed_tokens.weight").dataSync() as Float32Array;
  const H = m.config.hiddenSize;
  const expected = Float32Array.from({ length: m.config.vocabSize }, (_, v) => hiddenLast.reduce((s, x, i) => s + x * emb[v * H + i]!, 0));
  const got = lastLogits(m, PROMPT_IDS);
  assert.ok(maxAbsDiff(got, expected) <= 1e-4 * Math.max(1, maxAbs(expected)), `tied logits off by ${maxAbsDiff(got, expected)}`);
  const file = tempPath("llama-tied.gguf");
  exportGguf(dir, file, "F32");
  const g = loadLocalModel(file);
  assert.equal(g.model.lmHead, null);
  assert.ok(maxAbsDiff(lastLogits(g, PROMPT_IDS), got) <= 1e-4 * Math.max(1, maxAbs(got)));
});

test("head_dim override: Qwen3 with head_dim != hidden / heads loads from safetensors and GGUF alike", () => {
  const dir = tinyModelDir("Qwen3ForCausalLM", { overrides: { head_dim: 32 } }); // hidden 64, 4 heads -> default 16
  const m = loadLocalModel(dir);
  assert.equal(m.config.headDim, 32);
  assert.deepEqual(param(m, "model.layers.0.self_attn.q_proj.weight").shape, [4 * 32, 64]);
  assert.deepEqual(param(m, "model.layers.0.self_attn.k_proj.weight").shape, [2 * 32, 64]);
  assert.deepEqual(param(m, "model.layers.0.self_attn.o_proj.weight").shape, [64, 4 * 32]);
  assert.deepEqual(param(m, "model.layers.0.self_attn.q_norm.weight").shape, [32]);
  const a = lastLogits(m, PROMPT_IDS);
  assert.ok(a.every(Number.isFinite));
  const file = tempPath("qwen3-headdim.gguf");
  exportGguf(dir, file, "F32");
  const g = loadLocalModel(file);
  assert.equal(g.config.headDim, 32);
  assert.ok(maxAbsDiff(lastLogits(g, PROMPT_IDS), a) <= 1e-4 * Math.max(1, maxAbs(a)));
});

test("sharded safetensors (two shards + index) load identically to the single file", () => {
  const src = tinyModelDir("Qwen2ForCausalLM");
  const dir = copyDir(src, "qwen2-sharded");
  const tensors = readAllTensors(path.join(dir, "model.safetensors"));
  fs.rmSync(path.join(dir, "model.safetensors"));
  const half = Math.ceil(tensors.length / 2);
  const shards = [tensors.slice(0, half), tensors.slice(half)];
  const weightMap: Record<string, string> = {};
  shards.forEach((ts, i) => {
    const name = `model-0000${i + 1}-of-00002.safetensors`;
    writeSafetensors(path.join(dir, name), ts, { format: "pt" });
    for (const t of ts) weightMap[t.name] = name;
  });
  writeSafetensorsIndex(dir, weightMap, tensors.reduce((s, t) => s + t.data.byteLength, 0));
  const single = loadLocalModel(src);
  const sharded = loadLocalModel(dir);
  for (const [n, t] of single.model.namedParameters()) assert.deepEqual(param(sharded, n).dataSync(), t.dataSync(), n);
  assert.deepEqual(lastLogits(sharded, PROMPT_IDS), lastLogits(single, PROMPT_IDS));
});

// ---- hostile and malformed inputs: a typed error naming the problem, in bounded time ----

const bounded = { timeout: 15_000 };
const isError = (type: new (...a: never[]) => Error, re: RegExp) => (e: unknown) => {
  assert.ok(e instanceof type, `expected ${type.name}, got ${String(e)}`);
  assert.match(e.message, re);
  return true;
};

test("hostile: config.json is not JSON", bounded, () => {
  const dir = copyDir(tinyModelDir("LlamaForCausalLM"), "bad-config-json");
  fs.writeFileSync(path.join(dir, "config.json"), '{"architectures": ["LlamaForCausalLM"], ');
  assert.throws(() => loadLocalModel(dir), isError(ModelLoadError, /config\.json: .*JSON/));
});

test("hostile: unknown architecture is named", bounded, () => {
  const dir = copyDir(tinyModelDir("LlamaForCausalLM"), "bad-arch");
  editConfig(dir, (c) => (c.architectures = ["GPTNeoXForCausalLM"]));
  assert.throws(() => loadLocalModel(dir), isError(ModelConfigError, /unsupported architecture "GPTNeoXForCausalLM"/));
});

test("hostile: unsupported numerics fields (rope_scaling mrope, hidden_act gelu)", bounded, () => {
  const dir = copyDir(tinyModelDir("LlamaForCausalLM"), "bad-numerics");
  editConfig(dir, (c) => (c.rope_scaling = { rope_type: "mrope", mrope_section: [16, 24, 24] }));
  assert.throws(() => loadLocalModel(dir), isError(ModelConfigError, /unsupported rope_scaling type "mrope"/));
  editConfig(dir, (c) => {
    delete c.rope_scaling;
    c.hidden_act = "gelu";
  });
  assert.throws(() => loadLocalModel(dir), isError(ModelConfigError, /unsupported hidden_act "gelu"/));
});

test("hostile: a tensor missing from model.safetensors is named", bounded, () => {
  const dir = copyDir(tinyModelDir("LlamaForCausalLM"), "missing-tensor");
  const file = path.join(dir, "model.safetensors");
  writeSafetensors(file, readAllTensors(file).filter((t) => t.name !== "model.layers.1.mlp.down_proj.weight"));
  assert.throws(() => loadLocalModel(dir), isError(ModelLoadError, /lacks 1 parameters, e\.g\. model\.layers\.1\.mlp\.down_proj\.weight/));
});

test("a checkpoint load allocates no parameter twice: the model is built unallocated, then every parameter is mapped", bounded, () => {
  const dir = tinyModelDir("LlamaForCausalLM");
  const built = new CausalLM(parseHfConfig(JSON.parse(fs.readFileSync(path.join(dir, "config.json"), "utf8")) as Record<string, unknown>), { unallocatedParameters: true });
  assert.ok(built.parameters().every((p) => p.isDisposed), "unallocated: shape and dtype only");
  // bytes the load allocates (mapped weights are adopted, not allocated): far below the parameters' own bytes
  const backend = defaultDevice().backend;
  const allocate = backend.allocate;
  let allocated = 0;
  backend.allocate = (n) => {
    allocated += n;
    return allocate.call(backend, n);
  };
  let m: ReturnType<typeof loadLocalModel>;
  try {
    m = loadLocalModel(dir);
  } finally {
    backend.allocate = allocate;
  }
  assert.ok(m.model.parameters().every((p) => !p.isDisposed), "every parameter assigned from the checkpoint");
  // the loader installs the checkpoint's tensors as they are (setParameter): inference weights, as vLLM's
  assert.ok(m.model.parameters().every((p) => !p.requiresGrad), "loaded parameters do not require grad");
  assert.equal(m.model.training, false, "a loaded model is in eval mode");
  const paramBytes = m.model.parameters().reduce((a, p) => a + p.numel * DTYPE_BYTES[p.dtype], 0);
  assert.ok(allocated < paramBytes / 2, `the load allocated ${allocated} bytes for ${paramBytes} bytes of parameters`);
});

test("hostile: tensor shape vs config mismatch names the tensor and both shapes", bounded, () => {
  const dir = copyDir(tinyModelDir("LlamaForCausalLM"), "shape-mismatch");
  editConfig(dir, (c) => (c.intermediate_size = 96)); // checkpoint has 128
  assert.throws(() => loadLocalModel(dir), isError(StateDictError, /model\.layers\.0\.mlp\.gate_proj\.weight.*\[128, 64\].*\[96, 64\]/));
});

test("hostile: truncated model.safetensors", bounded, () => {
  const dir = copyDir(tinyModelDir("LlamaForCausalLM"), "truncated-st");
  const file = path.join(dir, "model.safetensors");
  fs.truncateSync(file, Math.floor(fs.statSync(file).size / 2));
  assert.throws(() => loadLocalModel(dir), isError(ModelFormatError, /model\.safetensors.*outside the \d+-byte data region/));
});

test("hostile: a GGUF tensor whose offset points past EOF", bounded, () => {
  const file = tempPath("offset-past-eof.gguf");
  exportGguf(tinyModelDir("LlamaForCausalLM"), file, "F32");
  const bytes = fs.readFileSync(file);
  // tensor info: u64 name length, name, u32 n_dims, u64 dims[n_dims], u32 type, u64 offset
  const name = "blk.1.ffn_down.weight";
  const prefix = Buffer.alloc(8);
  prefix.writeBigUInt64LE(BigInt(name.length));
  const at = bytes.lastIndexOf(Buffer.concat([prefix, Buffer.from(name)]));
  assert.ok(at > 0);
  const dimsAt = at + 8 + name.length;
  const offsetAt = dimsAt + 4 + 8 * bytes.readUInt32LE(dimsAt) + 4;
  bytes.writeBigUInt64LE(BigInt(bytes.length) * 32n, offsetAt); // aligned, far past the end
  fs.writeFileSync(file, bytes);
  assert.throws(() => loadLocalModel(file), isError(ModelFormatError, /blk\.1\.ffn_down\.weight.*runs past the end of the file/));
});

test("hostile: a directory without tokenizer.json", bounded, () => {
  const dir = copyDir(tinyModelDir("LlamaForCausalLM"), "no-tokenizer");
  fs.rmSync(path.join(dir, "tokenizer.json"));
  assert.throws(() => loadLocalModel(dir), isError(ModelLoadError, /no tokenizer\.json/));
});

test("hostile: a non-existent path and an uncached hub id offline are ModelNotFoundError naming where it looked", bounded, async () => {
  const missing = tempPath("no-such-model");
  assert.throws(() => loadLocalModel(missing), isError(ModelNotFoundError, new RegExp(`${missing}`)));
  await assert.rejects(loadModel(missing), isError(ModelNotFoundError, new RegExp(`${missing}`)));
  const cache = tempPath("empty-cache");
  fs.mkdirSync(cache, { recursive: true });
  const saved = { offline: process.env.HF_HUB_OFFLINE, cache: process.env.HF_HUB_CACHE };
  process.env.HF_HUB_OFFLINE = "1";
  process.env.HF_HUB_CACHE = cache;
  try {
    const snapshot = path.join(cache, "models--kiln-test--absent", "snapshots", "main");
    await assert.rejects(loadModel("kiln-test/absent"), (e: unknown) => {
      assert.ok(e instanceof ModelNotFoundError);
      assert.equal(e.lookedIn, snapshot);
      assert.ok(e.message.includes(snapshot) && /offline/.test(e.message), e.message);
      return true;
    });
  } finally {
    for (const [k, v] of [["HF_HUB_OFFLINE", saved.offline], ["HF_HUB_CACHE", saved.cache]] as const) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
});

// ---- memory: weights go file -> ArrayBuffer (off-heap) -> tensor, so the JS heap bounds nothing ----

test("a model twice the size of a 64 MB JS heap loads", { timeout: 60_000 }, () => {
  const dir = tempPath("big-llama");
  // per layer 4 * 1024^2 (attention) + 3 * 1024 * 768 (MLP); + 2 * 4096 * 1024 (embed, lm_head) = 36.2M params, 145 MB f32
  const overrides = { hidden_size: 1024, intermediate_size: 768, num_hidden_layers: 4, num_attention_heads: 8, num_key_value_heads: 8, vocab_size: 4096 };
  initModel(dir, { architecture: "LlamaForCausalLM", tokenizerDir: testTokenizerDir(), seed: 3, overrides });
  const expected = 4 * (4 * 1024 * 1024 + 3 * 1024 * 768 + 2 * 1024) + 2 * 4096 * 1024 + 1024;
  assert.ok(fs.statSync(path.join(dir, "model.safetensors")).size > 128 * 2 ** 20);
  const script = `
    const { loadLocalModel } = await import(${JSON.stringify(path.join(root, "dist/src/models/loader.js"))});
    const m = loadLocalModel(${JSON.stringify(dir)});
    let n = 0;
    for (const [, t] of m.model.namedParameters()) n += t.numel;
    console.log(n);`;
  const out = execFileSync(process.execPath, ["--max-old-space-size=64", "--input-type=module", "-e", script], { encoding: "utf8", timeout: 50_000, stdio: ["ignore", "pipe", "pipe"] });
  assert.equal(Number(out.trim()), expected);
});
