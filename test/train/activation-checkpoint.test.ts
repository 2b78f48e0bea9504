// TorchTitan's [activation_checkpoint] in `kiln train`: which layers each mode checkpoints (TorchTitan's counting), and
// a run that checkpoints every layer, whole or under the op-level policy, trains to the same losses as one that keeps
// every activation while its steps' peak memory is lower (the op policy's between the two).
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { runRecipe } from "../../src/train/recipe.js";
import { activationCheckpointLayers, loadTrainConfig, opLevelActivationCheckpoint, parseTrainConfig } from "../../src/train/train-config.js";
import { loadCorpus } from "../../src/train/corpus.js";

const fixture = fileURLToPath(new URL("../../../test/fixtures/torchtitan/debug_model.toml", import.meta.url));
const layersOf = (toml: string, n: number, overrides: Record<string, unknown> = {}) => {
  const policy = activationCheckpointLayers(parseTrainConfig(toml, overrides));
  return policy === null ? null : Array.from({ length: n }, (_, i) => i).filter(policy);
};

test("modes: full is every layer, selective N every Nth counted from 1 (TorchTitan's), op every layer under the op policy, none or no section nothing", () => {
  // debug_model.toml: mode = "selective", selective_ac_option = '2' over its 6 layers
  const titan = loadTrainConfig(fixture, { "training.dataset": "brown", "model.hf_assets_path": null });
  assert.deepEqual(Array.from({ length: 6 }, (_, i) => i).filter(activationCheckpointLayers(titan)!), [1, 3, 5]);
  assert.ok(!titan.warnings.some((w) => w.startsWith("[activation_checkpoint]")), titan.warnings.join("\n"));
  const base = '[model]\nflavor = "tiny"\n';
  assert.deepEqual(layersOf(`${base}[activation_checkpoint]\nmode = "full"\n`, 4), [0, 1, 2, 3]);
  assert.deepEqual(layersOf(`${base}[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "3"\n`, 7), [2, 5]);
  assert.deepEqual(layersOf(`${base}[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "0"\n`, 3), [0, 1, 2]);
  assert.deepEqual(layersOf(base, 4, { "activation_checkpoint.mode": "full" }), [0, 1, 2, 3]); // --activation_checkpoint.mode full
  assert.equal(layersOf(`${base}[activation_checkpoint]\nmode = "none"\n`, 4), null);
  assert.equal(layersOf(base, 4), null);
  const op = parseTrainConfig(`${base}[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "op"\n`);
  assert.deepEqual(Array.from({ length: 3 }, (_, i) => i).filter(activationCheckpointLayers(op)!), [0, 1, 2]);
  assert.ok(!op.warnings.some((w) => w.startsWith("[activation_checkpoint]")), op.warnings.join("\n"));
  assert.equal(opLevelActivationCheckpoint(op), true);
  for (const toml of [`${base}[activation_checkpoint]\nmode = "full"\nselective_ac_option = "op"\n`, `${base}[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "2"\n`, base])
    assert.equal(opLevelActivationCheckpoint(parseTrainConfig(toml)), false, toml);
  assert.throws(() => parseTrainConfig(`${base}[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "every"\n`),
    /selective_ac_option must be "op" or a layer frequency \(a non-negative integer\), got "every"/);
  assert.throws(() => parseTrainConfig(`${base}[activation_checkpoint]\nmode = "memory_budget"\n`), /mode/);
});

test("mode full and selective op train to the same losses as none, with lower peaks of memory per step (op's between)", { timeout: 180_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-ac-"));
  try {
    const corpus = path.join(dir, "corpus.txt");
    fs.writeFileSync(corpus, loadCorpus({ source: "brown", granularity: "paragraph", maxDocs: 60 }).join("\n\n"));
    const run = async (mode: string, option = "") => {
      const cfg = parseTrainConfig(`
[job]
dump_folder = "${path.join(dir, mode + option)}"
[model]
dim = 64
n_layers = 4
n_heads = 2
ffn_dim = 128
tokenizer_vocab_size = 300
[training]
local_batch_size = 4
seq_len = 64
steps = 3
dataset = "${corpus}"
[validation]
enabled = false
[activation_checkpoint]
mode = "${mode}"
${option !== "" ? `selective_ac_option = "${option}"` : ""}
`);
      const losses: number[] = [];
      const peaks: number[] = [];
      const logs: string[] = [];
      await runRecipe(cfg, { log: (s) => logs.push(s), onStep: (m) => (losses.push(m.loss), peaks.push(m.peakMemoryBytes)), resume: false });
      return { losses, peak: Math.max(...peaks), logs };
    };
    const none = await run("none");
    const full = await run("full");
    const op = await run("selective", "op");
    assert.equal(none.losses.length, 3);
    full.losses.forEach((l, i) => assert.ok(Math.abs(l - none.losses[i]!) <= 1e-5 * Math.abs(none.losses[i]!), `step ${i + 1}: ${l} vs ${none.losses[i]}`));
    op.losses.forEach((l, i) => assert.ok(Math.abs(l - none.losses[i]!) <= 1e-6 * Math.abs(none.losses[i]!), `op step ${i + 1}: ${l} vs ${none.losses[i]}`));
    assert.ok(full.peak < none.peak, `peak ${full.peak} bytes with every layer checkpointed vs ${none.peak} without`);
    assert.ok(full.peak < op.peak && op.peak < none.peak, `peak ${op.peak} bytes under the op policy, ${full.peak} whole layers checkpointed, ${none.peak} none`);
    assert.ok(full.logs.some((s) => s.includes("[activation_checkpoint] full: 4 of 4 layers recompute")), full.logs.join("\n"));
    assert.ok(op.logs.some((s) => s.includes("[activation_checkpoint] selective (op): 4 of 4 layers recompute their activations in backward but for the outputs")), op.logs.join("\n"));
    assert.ok(!none.logs.some((s) => s.includes("[activation_checkpoint]")));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("LoRA fine-tuning with every layer checkpointed trains the adapters to the same losses", { timeout: 120_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-ac-lora-"));
  try {
    const data = path.join(dir, "data.txt");
    fs.writeFileSync(data, "The river ran past the old mill, and the miller watched the water turn the wheel. ".repeat(60));
    const kilnDefault = fileURLToPath(new URL("../../../models/kiln-default", import.meta.url));
    const run = async (mode: string) => {
      const cfg = parseTrainConfig(`
[job]
dump_folder = "${path.join(dir, mode)}"
[checkpoint]
initial_load_path = "${kilnDefault}"
initial_load_in_hf = true
[optimizer]
lr = 1e-2
[training]
local_batch_size = 2
seq_len = 32
steps = 3
dataset = "${data}"
[validation]
enable = false
[lora]
enable = true
rank = 4
target_modules = ["q_proj", "v_proj", "down_proj"]
[activation_checkpoint]
mode = "${mode}"
`);
      const losses: number[] = [];
      await runRecipe(cfg, { log: () => undefined, onStep: (m) => losses.push(m.loss), resume: false });
      return losses;
    };
    const none = await run("none");
    const full = await run("full");
    // the adapters' updates move the loss (so equal losses mean the checkpointed layers gave them the same gradients)
    assert.ok(none[1] !== none[0] && none[2] !== none[1], `losses ${none.join(", ")}`);
    full.forEach((l, i) => assert.ok(Math.abs(l - none[i]!) <= 1e-5 * Math.abs(none[i]!), `step ${i + 1}: ${l} vs ${none[i]}`));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
