// `kiln train` from a Hugging Face directory (TorchTitan's [checkpoint] initial_load_path, initial_load_in_hf):
// the first step's loss is the pretrained model's own on that batch (computed here from a fresh load), the export
// keeps the directory's config and tokenizer, and serves.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { spawnSync } from "node:child_process";
import { torchtitanArgs } from "../../src/cli/train-commands.js";
import { LLM } from "../../src/engine/llm-engine.js";
import { readSafetensors } from "../../src/models/formats/safetensors.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { noGrad } from "../../src/tensor/index.js";
import { buildDatasets, DataLoader } from "../../src/train/data-loader.js";
import { runRecipe } from "../../src/train/recipe.js";
import { parseTrainConfig } from "../../src/train/train-config.js";
import { mergeLoraIntoModel } from "../helpers/lora-adapter.js";
import { gemma3TokenizerDir, tinyModelDir } from "../helpers/tiny-model.js";

const root = fileURLToPath(new URL("../../..", import.meta.url)); // dist/test/train -> package root
const KILN_DEFAULT = path.join(root, "models", "kiln-default");

function toml(dump: string, from: string, data: string, extra = ""): string {
  return `
[job]
dump_folder = "${dump}"
seed = 5
[checkpoint]
initial_load_path = "${from}"
initial_load_in_hf = true
[optimizer]
lr = 1e-4
[lr_scheduler]
warmup_steps = 1
[training]
local_batch_size = 2
seq_len = 32
steps = 3
dataset = "${data}"
${extra}
[validation]
enable = false
`;
}

function corpus(dir: string): string {
  const data = path.join(dir, "data");
  fs.mkdirSync(data);
  fs.writeFileSync(path.join(data, "a.txt"), "The river ran past the old mill, and the miller watched the water turn the wheel. ".repeat(60));
  return data;
}

test("fine-tunes kiln-default from its Hugging Face directory and exports a model that serves", { timeout: 120_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-finetune-"));
  try {
    const data = corpus(dir);
    const cfg = parseTrainConfig(toml(path.join(dir, "run"), KILN_DEFAULT, data));
    const losses: number[] = [];
    const logs: string[] = [];
    const r = await runRecipe(cfg, { log: (l) => logs.push(l), onStep: (m) => losses.push(m.loss), resume: false });
    assert.equal(losses.length, 3);
    assert.ok(logs.some((l) => l.includes(`LlamaForCausalLM 4458752 parameters from ${KILN_DEFAULT}`)), logs.join("\n"));

    // the first batch's loss under the pretrained weights, from a load of its own (random init would give ~ln 4096 = 8.3)
    const base = loadLocalModel(KILN_DEFAULT, { dtype: "float32" });
    const text = fs.readFileSync(path.join(data, "a.txt"), "utf8");
    const ds = buildDatasets({ docs: [text], tokenizer: base.tokenizer, eosId: base.tokenizer.tokenToId("<|endoftext|>")!, valFraction: 0, seed: 5 });
    const batch = new DataLoader(ds.train, { batchSize: 2, seqLen: 32, seed: 5 }).next();
    const expected = noGrad(() => base.model.loss(batch.inputs, batch.targets, 2, 32).item());
    assert.ok(expected < 6, `pretrained loss ${expected}`);
    assert.ok(Math.abs(losses[0]! - expected) < 1e-4, `first step ${losses[0]} vs ${expected}`);

    // the export: the directory's config and tokenizer, its parameters trained (names and shapes kept)
    const out = r.exportDir;
    assert.deepEqual(JSON.parse(fs.readFileSync(path.join(out, "config.json"), "utf8")), { ...JSON.parse(fs.readFileSync(path.join(KILN_DEFAULT, "config.json"), "utf8")), torch_dtype: "float32" });
    for (const f of ["tokenizer.json", "tokenizer_config.json", "generation_config.json"])
      assert.deepEqual(fs.readFileSync(path.join(out, f)), fs.readFileSync(path.join(KILN_DEFAULT, f)), f);
    const before = readSafetensors(path.join(KILN_DEFAULT, "model.safetensors"));
    const after = readSafetensors(path.join(out, "model.safetensors"));
    assert.deepEqual(after.tensors.map((t) => `${t.name}:${t.shape.join("x")}`).sort(), before.tensors.map((t) => `${t.name}:${t.shape.join("x")}`).sort());
    const name = "model.layers.0.mlp.down_proj.weight";
    const a = after.loadAsFloat32(name);
    const b = before.loadAsFloat32(name);
    let changed = 0;
    for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) changed++;
    assert.ok(changed > a.length / 2, `${changed} of ${a.length} weights changed`);
    before.close();
    after.close();
    // trained on this text: the first batch's loss went down
    const tuned = loadLocalModel(out, { dtype: "float32" });
    const lower = noGrad(() => tuned.model.loss(batch.inputs, batch.targets, 2, 32).item());
    assert.ok(lower < expected, `${lower} after ${expected}`);
    const llm = new LLM({ model: out, maxModelLen: 64 });
    const [o] = llm.generate(["The river"], { maxTokens: 4, temperature: 0 });
    assert.equal(o!.outputs[0]!.tokenIds.length, 4);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("fine-tunes another family with its own tokenizer (Gemma 3, no ChatML): documents end with its EOS", { timeout: 120_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-finetune-"));
  try {
    const data = corpus(dir);
    const from = tinyModelDir("Gemma3ForCausalLM", { tokenizerDir: gemma3TokenizerDir() });
    const r = await runRecipe(parseTrainConfig(toml(path.join(dir, "run"), from, data)), { log: () => undefined, resume: false });
    assert.ok(Number.isFinite(r.finalLoss));
    assert.equal(JSON.parse(fs.readFileSync(path.join(r.exportDir, "config.json"), "utf8")).architectures[0], "Gemma3ForCausalLM");
    // the packed tokens end each document with <end_of_turn> (its EOS: the vocabulary has no <|endoftext|>)
    const tokens = fs.readFileSync(path.join(dir, "run", "tokens.bin"));
    const eos = JSON.parse(fs.readFileSync(path.join(from, "tokenizer.json"), "utf8")).added_tokens.find((t: { content: string }) => t.content === "<end_of_turn>").id as number;
    assert.equal(tokens.readInt32LE(tokens.length - 4), eos);
    // the ChatML rewrite needs ChatML's tokens
    await assert.rejects(
      runRecipe(parseTrainConfig(toml(path.join(dir, "run2"), from, data, "chat_format_fraction = 0.5")), { log: () => undefined, resume: false }),
      /chat_format_fraction 0.5: the tokenizer of .* has no <\|im_start\|> or <\|im_end\|> \(set it to 0\)/,
    );
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("initial_load_path: refused settings and directories, named", async () => {
  const t = (extra: string, load = "initial_load_in_hf = true") =>
    `[checkpoint]\ninitial_load_path = "${KILN_DEFAULT}"\n${load}\n${extra}\n[training]\nseq_len = 32\n`;
  assert.throws(() => parseTrainConfig(t("", "")), /set initial_load_in_hf = true/);
  assert.throws(() => parseTrainConfig(t("initial_load_model_only = false")), /initial_load_model_only = false: a Hugging Face directory holds the model only/);
  assert.throws(() => parseTrainConfig(`${t("")}[model]\ndim = 64\nflavor = "tiny"\n`), /\[model\] dim, flavor: the model's shape and tokenizer come from \[checkpoint\] initial_load_path/);
  assert.doesNotThrow(() => parseTrainConfig(`${t("")}[model]\nname = "llama"\n`));
  const run = (from: string, extra = "") => runRecipe(parseTrainConfig(`[checkpoint]\ninitial_load_path = "${from}"\ninitial_load_in_hf = true\n[training]\nseq_len = ${extra || 32}\n`), { log: () => undefined, resume: false });
  await Promise.all([
    assert.rejects(run("/nonexistent/model"), /initial_load_path \/nonexistent\/model: no such directory/),
    assert.rejects(run(path.join(KILN_DEFAULT, "model.safetensors")), /a Hugging Face model directory is needed/),
    assert.rejects(run(KILN_DEFAULT, "4096"), /seq_len 4096 > its max_position_embeddings 512/),
  ]);
});

test("kiln train takes TorchTitan's command line: --job.config_file and --section.key overrides", () => {
  assert.deepEqual(torchtitanArgs(["--job.config_file", "a.toml", "--training.steps", "10", "--checkpoint.enable", "--optimizer.lr=0.5"]), {
    configFile: "a.toml", overrides: { "training.steps": "10", "checkpoint.enable": "true", "optimizer.lr": "0.5" },
  });
  assert.throws(() => torchtitanArgs(["--bogus"]), /unknown argument "--bogus"/);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-finetune-"));
  try {
    const data = corpus(dir);
    const file = path.join(dir, "recipe.toml");
    fs.writeFileSync(file, toml(path.join(dir, "run"), "/nonexistent", data));
    // the override replaces the file's initial_load_path and step count
    const r = spawnSync(`${root}/bin/kiln`, ["train", "--job.config_file", file, "--training.steps", "1", `--checkpoint.initial_load_path=${KILN_DEFAULT}`, "--no-resume"], { encoding: "utf8", timeout: 60_000 });
    assert.equal(r.status, 0, r.stderr);
    const result = JSON.parse(r.stdout.trim().split("\n").at(-1)!) as { export_dir: string; params: number };
    assert.equal(result.params, 4458752);
    assert.ok(fs.existsSync(path.join(result.export_dir, "model.safetensors")));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("[lora] trains PEFT adapters on the frozen model; served with --enable-lora they equal the adapter merged into the weights", { timeout: 120_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-finetune-"));
  try {
    const data = corpus(dir);
    const lora = `[lora]\nenable = true\nrank = 4\nalpha = 8\ntarget_modules = ["q_proj", "v_proj", "down_proj"]\nexport_merged = true\n`;
    const cfg = parseTrainConfig(toml(path.join(dir, "run"), KILN_DEFAULT, data).replace("lr = 1e-4", "lr = 1e-2") + lora);
    const losses: number[] = [];
    const r = await runRecipe(cfg, { log: () => undefined, onStep: (m) => losses.push(m.loss), resume: false });
    assert.equal(r.exportDir, path.join(dir, "run", "lora"));
    const config = JSON.parse(fs.readFileSync(path.join(r.exportDir, "adapter_config.json"), "utf8")) as Record<string, unknown>;
    assert.deepEqual([config.peft_type, config.r, config.lora_alpha, config.target_modules], ["LORA", 4, 8, ["q_proj", "v_proj", "down_proj"]]);
    const weights = readSafetensors(path.join(r.exportDir, "adapter_model.safetensors"));
    // 4 layers x 3 projections, A [4, in] and B [out, 4]; B left zero would mean nothing was trained
    assert.equal(weights.tensors.length, 24);
    assert.deepEqual(weights.get("base_model.model.model.layers.0.mlp.down_proj.lora_A.weight")!.shape, [4, 768]);
    assert.ok(weights.loadAsFloat32("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight").some((v) => v !== 0));
    weights.close();

    // B starts at zero: the first step's loss is the model's own; the merged weights fit the text better
    const base = loadLocalModel(KILN_DEFAULT, { dtype: "float32" });
    const text = fs.readFileSync(path.join(data, "a.txt"), "utf8");
    const ds = buildDatasets({ docs: [text], tokenizer: base.tokenizer, eosId: base.tokenizer.tokenToId("<|endoftext|>")!, valFraction: 0, seed: 5 });
    const batch = new DataLoader(ds.train, { batchSize: 2, seqLen: 32, seed: 5 }).next();
    const before = noGrad(() => base.model.loss(batch.inputs, batch.targets, 2, 32).item());
    assert.ok(Math.abs(losses[0]! - before) < 1e-4, `first step ${losses[0]} vs ${before}`);
    const merged = mergeLoraIntoModel(KILN_DEFAULT, r.exportDir, path.join(dir, "merged"));
    for (const f of ["tokenizer.json", "tokenizer_config.json"]) fs.copyFileSync(path.join(KILN_DEFAULT, f), path.join(merged, f));
    const after = noGrad(() => loadLocalModel(merged, { dtype: "float32" }).model.loss(batch.inputs, batch.targets, 2, 32).item());
    assert.ok(after < before, `${after} after ${before}`);
    // export_merged: the recipe's own merge (float32) equals the helper's (float64), with the model's tokenizer beside it
    const ours = readSafetensors(path.join(dir, "run", "hf", "model.safetensors"));
    const theirs = readSafetensors(path.join(merged, "model.safetensors"));
    for (const t of theirs.tensors) {
      const x = ours.loadAsFloat32(t.name), y = theirs.loadAsFloat32(t.name);
      let worst = 0;
      for (let i = 0; i < y.length; i++) worst = Math.max(worst, Math.abs(x[i]! - y[i]!));
      assert.ok(worst < 1e-5, `${t.name}: ${worst}`);
    }
    ours.close();
    theirs.close();
    assert.ok(fs.existsSync(path.join(dir, "run", "hf", "tokenizer.json")));

    // served: the adapter through --enable-lora gives the merged model's greedy tokens and logprobs
    const params = { temperature: 0, maxTokens: 6, logprobs: 1, ignoreEos: true };
    const prompt = [{ promptTokenIds: base.tokenizer.encode("The river ran past") }];
    const viaMerge = new LLM({ model: merged, maxModelLen: 64, enforceEager: true }).generate(prompt, params)[0]!.outputs[0]!;
    const viaLora = new LLM({ model: KILN_DEFAULT, maxModelLen: 64, enforceEager: true, enableLora: true, maxLoraRank: 8 })
      .generate(prompt, params, { loraRequest: { name: "river", id: 1, path: r.exportDir } })[0]!.outputs[0]!;
    assert.deepEqual(viaLora.tokenIds, viaMerge.tokenIds);
    viaLora.logprobs!.forEach((l, i) => assert.ok(Math.abs(l.get(viaLora.tokenIds[i]!)!.logprob - viaMerge.logprobs![i]!.get(viaMerge.tokenIds[i]!)!.logprob) < 2e-3));

    assert.throws(() => parseTrainConfig(`${lora}[training]\nseq_len = 32\n`), /\[lora\] enable = true adapts a pretrained model: set \[checkpoint\] initial_load_path/);
    await assert.rejects(
      runRecipe(parseTrainConfig(toml(path.join(dir, "run2"), KILN_DEFAULT, data) + `[lora]\nenable = true\ntarget_modules = ["qkv_proj"]\n`), { log: () => undefined, resume: false }),
      /\[lora\] target_modules qkv_proj: LoRA goes on q_proj, k_proj/,
    );
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
