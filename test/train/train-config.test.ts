import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadTrainConfig, parseTrainConfig, TrainConfigError } from "../../src/train/train-config.js";

const FULL = `
[job]
dump_folder = "./outputs/brown-tiny"
description = "llama tiny on Brown"

[model]
name = "llama"
flavor = "tiny"
n_layers = 2              # overrides the flavor
vocab_size = 4096
norm_eps = 1e-6
rope_theta = 500000.0
tokenizer_vocab_size = 4096

[optimizer]
name = "AdamW"
lr = 3e-4
beta2 = 0.99
weight_decay = 0.0

[lr_scheduler]
warmup_steps = 20
decay_type = "linear"
lr_min = 3e-5

[training]
batch_size = 16           # alias of local_batch_size
seq_len = 128
steps = 500
max_norm = 1.0
gradient_accumulation_steps = 2
dataset = "brown"
mixed_precision_param = "bfloat16"
seed = 42                 # TorchTitan keeps the seed here

[checkpoint]
enable = true
folder = "ckpt"
interval = 100
keep_latest_k = 3
export_dtype = "bfloat16"

[metrics]
log_freq = 5
enable_tensorboard = true
loss_curve = "loss.svg"

[validation]
freq = 50
steps = 4
fraction = 0.02
`;

test("parses every TorchTitan section with flavor, aliases and defaults", () => {
  const c = parseTrainConfig(FULL);
  assert.equal(c.job.seed, 42);
  assert.equal(c.job.dump_folder, "./outputs/brown-tiny");
  assert.deepEqual(
    { dim: c.model.dim, n_layers: c.model.n_layers, n_heads: c.model.n_heads, n_kv_heads: c.model.n_kv_heads },
    { dim: 128, n_layers: 2, n_heads: 4, n_kv_heads: 2 },
  );
  assert.equal(c.model.ffn_dim, 384); // 2/3 * 4 * 128 = 341.3 -> multiple of 64
  assert.equal(c.model.max_seq_len, 2048);
  assert.equal(c.model.tokenizer_path, null);
  assert.deepEqual(c.model.tokenizer_special_tokens, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]);
  assert.equal(c.optimizer.lr, 3e-4);
  assert.equal(c.optimizer.beta1, 0.9); // default
  assert.equal(c.lr_scheduler.decay_type, "linear");
  assert.equal(c.training.local_batch_size, 16);
  assert.equal(c.training.gradient_accumulation_steps, 2);
  assert.equal(c.training.mixed_precision_param, "bfloat16");
  assert.equal("seed" in c.training, false);
  assert.equal(c.checkpoint.keep_latest_k, 3);
  assert.equal(c.metrics.loss_curve, "loss.svg");
  assert.equal(c.validation.fraction, 0.02);
  assert.equal(c.validation.enable, true);
});

test("an empty config needs model dims; explicit HF-style names work", () => {
  assert.throws(() => parseTrainConfig(""), /needs a flavor/);
  const c = parseTrainConfig(`[model]\nhidden_size = 64\nnum_hidden_layers = 2\nnum_attention_heads = 4\nintermediate_size = 160\n`);
  assert.deepEqual([c.model.dim, c.model.n_layers, c.model.n_heads, c.model.n_kv_heads, c.model.ffn_dim], [64, 2, 4, 4, 160]);
  assert.equal(c.optimizer.name, "AdamW");
  assert.equal(c.training.steps, 1000);
  assert.equal(c.checkpoint.enable, false);
});

test("unknown keys and sections are errors that name them", () => {
  assert.throws(
    () => parseTrainConfig(`[model]\nflavor = "tiny"\n[optimizer]\nlearning_rate = 1e-3\n`),
    (e: unknown) => e instanceof TrainConfigError && /unknown key "learning_rate" in \[optimizer\]/.test(e.message),
  );
  assert.throws(
    () => parseTrainConfig(`[model]\nflavor = "tiny"\n[training]\nstpes = 10\n`),
    /unknown key "stpes" in \[training\] \(did you mean "steps"\?\)/,
  );
  assert.throws(
    () => parseTrainConfig(`[model]\nflavor = "tiny"\n[optimiser]\nlr = 1\n`),
    /unknown section \[optimiser\] \(did you mean "optimizer"\?\)/,
  );
  assert.throws(() => parseTrainConfig(`[model]\nflavor = "huge"\n`), /unknown \[model\] flavor "huge"/);
});

test("type, range and consistency errors", () => {
  const base = `[model]\nflavor = "tiny"\n`;
  assert.throws(() => parseTrainConfig(base + `[training]\nsteps = "ten"\n`), /\[training\] steps: expected an integer, got "ten"/);
  assert.throws(() => parseTrainConfig(base + `[training]\nsteps = 0\n`), /expected an integer >= 1/);
  assert.throws(() => parseTrainConfig(base + `[optimizer]\nname = "Adan"\n`), /one of "AdamW", "Adam", "SGD"/);
  assert.throws(() => parseTrainConfig(`[model]\ndim = 100\nn_layers = 1\nn_heads = 3\n`), /not divisible/);
  assert.throws(() => parseTrainConfig(base + `[training]\nbatch_size = 2\nlocal_batch_size = 4\n`), /sets local_batch_size twice/);
  assert.throws(() => parseTrainConfig(base + `[training\n`), /invalid TOML/);
  assert.throws(() => parseTrainConfig(base + `[training]\nchat_format_fraction = 1.5\n`), /chat_format_fraction must be in \[0, 1\], got 1.5/);
  assert.equal(parseTrainConfig(base + `[training]\nchat_format_fraction = 1\n`).training.chat_format_fraction, 1);
  assert.equal(parseTrainConfig(base + `[optimizer]\nname = "sgd"\n`).optimizer.name, "SGD");
});

test("CLI-style overrides and loading from a file", () => {
  const dir = mkdtempSync(join(tmpdir(), "kiln-cfg-"));
  const path = join(dir, "train.toml");
  writeFileSync(path, FULL);
  const c = loadTrainConfig(path, { "training.steps": "20", "optimizer.lr": "1e-3", "checkpoint.enable": "false" });
  assert.equal(c.training.steps, 20);
  assert.equal(c.optimizer.lr, 1e-3);
  assert.equal(c.checkpoint.enable, false);
  assert.throws(() => loadTrainConfig(path, { "training.stepz": 1 }), /unknown key "stepz"/);
  // an override under one name replaces the file's value under another (TorchTitan's --checkpoint.enable over its
  // recipes' enable_checkpoint = false); both names in the file stay an error
  const titan = `[model]\nflavor = "tiny"\n[checkpoint]\nenable_checkpoint = false\n`;
  assert.equal(parseTrainConfig(titan, { "checkpoint.enable": "true" }).checkpoint.enable, true);
  assert.equal(parseTrainConfig(titan, { "checkpoint.enable_checkpoint": "true" }).checkpoint.enable, true);
  assert.throws(() => parseTrainConfig(titan + `enable = true\n`), /sets enable twice/);
  assert.throws(() => loadTrainConfig(join(dir, "missing.toml")), /cannot read config/);
});
