// TorchTitan's own recipe files run: its Llama 3 debug recipe (test/fixtures/torchtitan) parses with only the
// offline-impossible settings overridden (the hub dataset, the tokenizer folder); its schedule keys (decay_ratio,
// min_lr_factor) drive the learning rate as TorchTitan's warmup-stable-decay does; GPU-only settings are accepted
// with a warning, and what cannot be honoured (tensor parallelism, float8 converters, hub datasets) is refused.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { runRecipe } from "../../src/train/recipe.js";
import { loadTrainConfig, parseTrainConfig } from "../../src/train/train-config.js";
import { loadCorpus } from "../../src/train/corpus.js";

const fixture = fileURLToPath(new URL("../../../test/fixtures/torchtitan/debug_model.toml", import.meta.url));

test("TorchTitan's debug_model.toml parses; c4_test is refused with what to use instead", () => {
  assert.throws(() => loadTrainConfig(fixture), /\[training\] dataset c4_test is downloaded from the Hugging Face hub, which Kiln cannot reach: use brown/);
  const cfg = loadTrainConfig(fixture, { "training.dataset": "brown", "model.hf_assets_path": null });
  assert.deepEqual([cfg.model.name, cfg.model.dim, cfg.model.n_layers, cfg.model.n_heads], ["llama3", 256, 6, 16]); // the debugmodel flavor
  assert.equal(cfg.checkpoint.enable, false); // enable_checkpoint
  assert.equal(cfg.validation.enable, false); // enabled
  assert.deepEqual([cfg.lr_scheduler.decay_type, cfg.lr_scheduler.decay_ratio, cfg.lr_scheduler.lr_min], ["linear", 0.8, 0]);
  assert.deepEqual([cfg.activation_checkpoint.mode, cfg.activation_checkpoint.selective_ac_option], ["selective", "2"]); // applied (activation-checkpoint.test.ts)
  // (validation is off in the recipe: its hub dataset is not read; turned on, it is refused)
  assert.equal(cfg.validation.dataset, "c4_validation");
  assert.throws(() => loadTrainConfig(fixture, { "training.dataset": "brown", "model.hf_assets_path": null, "validation.enabled": true }), /\[validation\] dataset c4_validation is downloaded from the Hugging Face hub/);
});

test("refused: tensor/pipeline parallel degrees, float8 converters, degrees that do not cover the ranks", async () => {
  const base = '[model]\nflavor = "tiny"\n[training]\nseq_len = 32\n';
  assert.throws(() => parseTrainConfig(`${base}[parallelism]\ntensor_parallel_degree = 2\n`), /tensor_parallel_degree 2: Kiln trains data-parallel only/);
  assert.throws(() => parseTrainConfig(`${base.replace("[training]", 'converters = ["float8"]\n[training]')}`), /\[model\] converters float8: not supported/);
  assert.throws(() => parseTrainConfig(`${base}[lr_scheduler]\nlr_min = 1e-4\nmin_lr_factor = 0.5\n`), /lr_min 0.0001 and min_lr_factor 0.5 .* disagree/);
  await assert.rejects(runRecipe(parseTrainConfig(`${base}[parallelism]\ndata_parallel_replicate_degree = 2\n`), { log: () => undefined }),
    /data_parallel_replicate_degree 2 x data_parallel_shard_degree -1 does not cover the 1 rank/);
  await assert.rejects(runRecipe(parseTrainConfig(base.replace("seq_len = 32", "seq_len = 32\nlocal_batch_size = 4\nglobal_batch_size = 6")), { log: () => undefined }),
    /global_batch_size 6 is not a multiple of local_batch_size 4 x 1 rank/);
  // dataset_path: the local copy TorchTitan would read a named dataset from, read in Kiln's formats
  assert.equal(parseTrainConfig(base.replace("seq_len = 32", 'seq_len = 32\ndataset = "c4_test"\ndataset_path = "/data/c4.jsonl"')).training.dataset, "/data/c4.jsonl");
});

test("decay_ratio and min_lr_factor: warmup, a stable phase, then a linear decay to lr x min_lr_factor", { timeout: 60_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-titan-"));
  try {
    const corpus = path.join(dir, "corpus.txt");
    fs.writeFileSync(corpus, loadCorpus({ source: "brown", granularity: "paragraph", maxDocs: 40 }).join("\n\n"));
    const cfg = parseTrainConfig(`
[job]
dump_folder = "${path.join(dir, "run")}"
[model]
name = "llama3"
dim = 32
n_layers = 1
n_heads = 2
ffn_dim = 64
tokenizer_vocab_size = 300
[optimizer]
lr = 1e-3
[lr_scheduler]
warmup_steps = 1
decay_ratio = 0.5
decay_type = "linear"
min_lr_factor = 0.1
[training]
local_batch_size = 2
global_batch_size = 4
seq_len = 16
steps = 6
dataset = "${corpus}"
[validation]
enabled = false
`);
    const lrs: number[] = [];
    const tokens: number[] = [];
    await runRecipe(cfg, { log: () => undefined, onStep: (m) => (lrs.push(m.lr), tokens.push(m.tokens)), resume: false });
    // global_batch_size 4 of local batches of 2: two micro-batches of 2 x 16 tokens per step
    assert.deepEqual(tokens, Array(6).fill(64));
    // by hand: W = 1, D = round(6 x 0.5) = 3, S = 6 - 1 - 3 = 2; warmup lr (s+1)/(W+1), decay from p = (s+1-W-S)/D
    const lr = 1e-3, min = 1e-4;
    const want = [lr / 2, lr, lr, min + (lr - min) * (2 / 3), min + (lr - min) * (1 / 3), min];
    lrs.forEach((v, i) => assert.ok(Math.abs(v - want[i]!) < 1e-12, `step ${i + 1}: ${v} vs ${want[i]}`));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("[checkpoint] load_step resumes from that step's checkpoint: the run from step 2 repeats steps 3-4 exactly", { timeout: 60_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-titan-"));
  try {
    const corpus = path.join(dir, "corpus.txt");
    fs.writeFileSync(corpus, loadCorpus({ source: "brown", granularity: "paragraph", maxDocs: 40 }).join("\n\n"));
    const toml = (loadStep: number) => `
[job]
dump_folder = "${path.join(dir, "run")}"
[model]
dim = 32
n_layers = 1
n_heads = 2
ffn_dim = 64
tokenizer_vocab_size = 300
[training]
local_batch_size = 2
seq_len = 16
steps = 4
dataset = "${corpus}"
[checkpoint]
enable_checkpoint = true
interval = 2
load_step = ${loadStep}
[validation]
enabled = false
`;
    const run = async (loadStep: number, resume: boolean) => {
      const losses = new Map<number, number>();
      await runRecipe(parseTrainConfig(toml(loadStep)), { log: () => undefined, onStep: (m) => losses.set(m.step, m.loss), resume });
      return losses;
    };
    const whole = await run(-1, false);
    assert.deepEqual([...whole.keys()], [1, 2, 3, 4]);
    const resumed = await run(2, true);
    assert.deepEqual([...resumed.keys()], [3, 4]);
    for (const s of [3, 4]) assert.equal(resumed.get(s), whole.get(s));
    await assert.rejects(run(3, true), /\[checkpoint\] load_step 3: no checkpoint at .*step-00000003/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("[validation] dataset: validated on that data, every training document trained on", { timeout: 60_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-titan-"));
  try {
    const paragraphs = loadCorpus({ source: "brown", granularity: "paragraph", maxDocs: 60 });
    const train = path.join(dir, "train");
    fs.mkdirSync(train);
    for (let f = 0; f < 20; f++) fs.writeFileSync(path.join(train, `doc-${f}.txt`), paragraphs.slice(f * 2, f * 2 + 2).join("\n\n"));
    const val = path.join(dir, "val.txt");
    fs.writeFileSync(val, paragraphs.slice(40).join("\n\n"));
    const run = async (validation: string) => {
      const logs: string[] = [];
      const cfg = parseTrainConfig(`
[job]
dump_folder = "${path.join(dir, "run")}"
[model]
dim = 32
n_layers = 1
n_heads = 2
ffn_dim = 64
tokenizer_vocab_size = 300
[training]
local_batch_size = 2
seq_len = 16
steps = 2
dataset = "${train}"
[validation]
freq = 2
steps = 2
fraction = 0.1
${validation}
`);
      const r = await runRecipe(cfg, { log: (l) => logs.push(l), resume: false });
      const line = logs.find((l) => l.includes("validation tokens"))!;
      const [trainTokens, valTokens] = [...line.matchAll(/(\d+) (?:training|validation) tokens/g)].map((m) => Number(m[1]));
      return { trainTokens: trainTokens!, valTokens: valTokens!, line, valLoss: r.valLoss };
    };
    const own = await run(`enabled = true\ndataset = "${val}"`);
    const heldOut = await run("enabled = true");
    const none = await run("enabled = false");
    assert.ok(own.valTokens > 100 && own.line.endsWith(`(from ${val})`), own.line);
    assert.ok(own.valLoss !== null && Number.isFinite(own.valLoss), String(own.valLoss));
    // with its own data, no training document is held out: as many training tokens as without validation
    assert.equal(own.trainTokens, none.trainTokens);
    assert.ok(heldOut.trainTokens < none.trainTokens && heldOut.valTokens > 0, heldOut.line);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
