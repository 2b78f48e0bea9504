// kiln train's [optimizer] beyond AdamW and SGD: torch's names parse with the keys each optimizer reads (TorchTitan's
// defaults for Adam/AdamW, torch's for the others), keys an optimizer does not read are refused, a short run trains
// with Adam and with RMSprop, and a checkpoint resumes them to the same losses.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";
import * as k from "../../src/tensor/index.js";
import { runRecipe } from "../../src/train/recipe.js";
import { parseTrainConfig } from "../../src/train/train-config.js";
import { buildOptimizer } from "../../src/train/optimizer-config.js";
import { Adagrad, Adam, NAdam, RMSprop, SGD } from "../../src/train/optim.js";
import { loadCorpus } from "../../src/train/corpus.js";

const base = '[model]\nflavor = "tiny"\n[training]\nseq_len = 32\n';
const opt = (body: string) => parseTrainConfig(`${base}[optimizer]\n${body}\n`);

test("torch's optimizer names parse; keys left out take TorchTitan's defaults for Adam, torch's for the others", () => {
  const adam = opt('name = "Adam"\nlr = 1e-3\namsgrad = true');
  assert.deepEqual([adam.optimizer.name, adam.optimizer.eps, adam.optimizer.beta2, adam.optimizer.weight_decay, adam.optimizer.amsgrad], ["Adam", 1e-8, 0.95, 0.1, true]);
  const built = buildOptimizer(adam.optimizer, [k.tensor([0])]);
  assert.ok(built instanceof Adam && built.amsgrad && built.beta2 === 0.95 && built.lr === 1e-3);
  const rms = opt('name = "rmsprop"\nalpha = 0.9\ncentered = true');
  assert.deepEqual([rms.optimizer.name, rms.optimizer.momentum, rms.optimizer.weight_decay, rms.optimizer.eps], ["RMSprop", 0, 0, 1e-8]);
  const r = buildOptimizer(rms.optimizer, [k.tensor([0])]);
  assert.ok(r instanceof RMSprop && r.alpha === 0.9 && r.centered && r.momentum === 0);
  const ada = buildOptimizer(opt('name = "Adagrad"\nlr_decay = 0.01').optimizer, [k.tensor([0])]);
  assert.ok(ada instanceof Adagrad && ada.eps === 1e-10 && ada.lrDecay === 0.01 && ada.weightDecay === 0);
  const nadam = buildOptimizer(opt('name = "NAdam"\ndecoupled_weight_decay = true\nweight_decay = 0.01').optimizer, [k.tensor([0])]);
  assert.ok(nadam instanceof NAdam && nadam.decoupledWeightDecay && nadam.beta2 === 0.999 && nadam.momentumDecay === 4e-3);
  for (const name of ["RAdam", "Adamax"]) assert.equal(buildOptimizer(opt(`name = "${name}"`).optimizer, [k.tensor([0])]).constructor.name, name);
  const sgd = buildOptimizer(opt('name = "SGD"\nnesterov = true').optimizer, [k.tensor([0])]);
  assert.ok(sgd instanceof SGD && sgd.nesterov && sgd.momentum === 0.9); // the recipe's SGD default momentum, as before
  // TorchTitan's implementation key: accepted, with a warning that it changes nothing
  assert.match(opt('name = "AdamW"\nimplementation = "foreach"').warnings.join("\n"), /\[optimizer\] implementation foreach: no effect/);
});

test("keys the named optimizer does not read, bad names and bad combinations are refused", () => {
  assert.throws(() => opt('name = "SGD"\nbeta1 = 0.8'), /\[optimizer\] beta1 is not a hyper-parameter of SGD \(it reads lr, momentum, weight_decay, dampening, nesterov; beta1 is AdamW, Adam, NAdam, RAdam, Adamax's\)/);
  assert.throws(() => opt('name = "AdamW"\ncentered = true'), /\[optimizer\] centered is not a hyper-parameter of AdamW .*centered is RMSprop's/);
  assert.throws(() => opt('name = "Adagrad"\nmomentum = 0.9'), /momentum is not a hyper-parameter of Adagrad/);
  assert.throws(() => opt('name = "Lion"'), /\[optimizer\] name: expected one of "AdamW", "Adam", "SGD", "RMSprop", "Adagrad", "NAdam", "RAdam", "Adamax", got "Lion"/);
  assert.throws(() => opt('name = "SGD"\nmomentum = 0\nnesterov = true'), /nesterov needs momentum > 0 and dampening 0/);
  assert.throws(() => opt('name = "RMSprop"\nalpha = -1'), /\[optimizer\] alpha: expected a number >= 0/);
});

test("kiln train with Adam and with RMSprop: 3 steps train, and a checkpoint at step 2 repeats step 3's loss", { timeout: 120_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-optim-"));
  try {
    const corpus = path.join(dir, "corpus.txt");
    fs.writeFileSync(corpus, loadCorpus({ source: "brown", granularity: "paragraph", maxDocs: 40 }).join("\n\n"));
    const toml = (optimizer: string, loadStep: number) => `
[job]
dump_folder = "${path.join(dir, "run")}"
[model]
dim = 32
n_layers = 1
n_heads = 2
ffn_dim = 64
tokenizer_vocab_size = 300
[optimizer]
${optimizer}
[lr_scheduler]
warmup_steps = 1
[training]
local_batch_size = 2
seq_len = 16
steps = 3
dataset = "${corpus}"
[checkpoint]
enable_checkpoint = true
interval = 2
load_step = ${loadStep}
[validation]
enabled = false
`;
    const run = async (optimizer: string, loadStep: number, resume: boolean) => {
      const losses = new Map<number, number>();
      await runRecipe(parseTrainConfig(toml(optimizer, loadStep)), { log: () => undefined, onStep: (m) => losses.set(m.step, m.loss), resume });
      return losses;
    };
    for (const optimizer of ['name = "Adam"\nlr = 3e-3\namsgrad = true', 'name = "RMSprop"\nlr = 3e-3\nmomentum = 0.5\ncentered = true']) {
      fs.rmSync(path.join(dir, "run"), { recursive: true, force: true });
      const whole = await run(optimizer, -1, false);
      assert.deepEqual([...whole.keys()], [1, 2, 3]);
      assert.ok([...whole.values()].every(Number.isFinite), `${optimizer}: ${[...whole.values()].join(", ")}`);
      assert.ok(whole.get(3)! < whole.get(1)!, `${optimizer}: the loss falls (${[...whole.values()].join(", ")})`);
      const resumed = await run(optimizer, 2, true);
      assert.deepEqual([...resumed.keys()], [3]);
      assert.equal(resumed.get(3), whole.get(3), optimizer);
    }
    // an RMSprop checkpoint does not resume an AdamW run: the state names its algorithm
    await assert.rejects(run('name = "AdamW"', 2, true), /\[adamw\] cannot load a state saved by rmsprop/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
