// `kiln run --nproc-per-node 2 kiln train`: the recipe trains data-parallel (each rank its shard of every step's
// batches, gradients averaged by DistributedDataParallel) and matches one process training with the global batch
// (local_batch_size x 2): the same loss at every step and the same exported weights. Only rank 0 logs and writes.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, it } from "node:test";
import { loadCorpus } from "../../src/train/corpus.js";
import { readSafetensors } from "../../src/models/formats/safetensors.js";
import { skipWithoutGloo } from "./run-ranks.js";

const kiln = path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "bin", "kiln");
const STEPS = 4;

function toml(dump: string, corpus: string, batch: number): string {
  return `
[job]
dump_folder = "${dump}"
seed = 3
[model]
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
warmup_steps = 1
[training]
local_batch_size = ${batch}
seq_len = 32
steps = ${STEPS}
max_norm = 1.0
dataset = "${corpus}"
[checkpoint]
enable = true
interval = 2
export_dtype = "float32"
[metrics]
log_freq = 1
loss_curve = "loss.svg"
[validation]
enable = false
`;
}

function stepLosses(stdout: string): number[] {
  return [...stdout.matchAll(/^step +(\d+) +loss (\S+)/gm)].map((m) => Number(m[2]));
}

describe("kiln train under kiln run", { skip: skipWithoutGloo, timeout: 120_000 }, () => {
  it("2 ranks x batch 2 train as 1 process x batch 4; rank 0 alone logs and writes", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-dist-train-"));
    try {
      const corpus = path.join(dir, "corpus.txt");
      fs.writeFileSync(corpus, loadCorpus({ source: "brown", granularity: "paragraph", maxDocs: 120 }).join("\n\n"));
      fs.writeFileSync(path.join(dir, "dp.toml"), toml(path.join(dir, "dp"), corpus, 2));
      fs.writeFileSync(path.join(dir, "single.toml"), toml(path.join(dir, "single"), corpus, 4));
      const env = { ...process.env, KILN_NUM_THREADS: "1" };
      const dp = spawnSync(process.execPath, [kiln, "run", "--nproc-per-node", "2", "kiln", "train", "--config", path.join(dir, "dp.toml"), "--no-resume"], { encoding: "utf8", env, timeout: 100_000 });
      assert.equal(dp.status, 0, dp.stderr);
      const single = spawnSync(process.execPath, [kiln, "train", "--config", path.join(dir, "single.toml"), "--no-resume"], { encoding: "utf8", env, timeout: 100_000 });
      assert.equal(single.status, 0, single.stderr);

      // one report and one log line per step: the other rank is silent
      assert.equal(dp.stdout.match(/"export_dir"/g)?.length, 1, dp.stdout);
      const dpLosses = stepLosses(dp.stdout);
      const singleLosses = stepLosses(single.stdout);
      assert.equal(dpLosses.length, STEPS, dp.stdout);
      assert.equal(singleLosses.length, STEPS);
      // the logged loss is the mean over ranks = the global batch's mean (4-decimal logs)
      dpLosses.forEach((l, i) => assert.ok(Math.abs(l - singleLosses[i]!) <= 2e-4, `step ${i + 1}: ${l} vs ${singleLosses[i]}`));
      assert.match(dp.stdout, /\[data\] \d+ training tokens/);

      for (const step of ["step-00000002", "step-00000004"]) assert.ok(fs.existsSync(path.join(dir, "dp", "checkpoint", step)), `${step} saved`);
      const a = readSafetensors(path.join(dir, "dp", "hf", "model.safetensors"));
      const b = readSafetensors(path.join(dir, "single", "hf", "model.safetensors"));
      assert.deepEqual(a.tensors.map((t) => t.name).sort(), b.tensors.map((t) => t.name).sort());
      for (const t of a.tensors) {
        const x = a.loadAsFloat32(t.name);
        const y = b.loadAsFloat32(t.name);
        const worst = x.reduce((m, v, i) => Math.max(m, Math.abs(v - y[i]!)), 0);
        assert.ok(worst <= 1e-4, `${t.name}: max |diff| ${worst}`);
      }
      a.close();
      b.close();
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it("LoRA: 2 ranks x batch 2 train the same adapters as 1 process x batch 4 (the adapters' gradients averaged)", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-dist-lora-"));
    try {
      const corpus = path.join(dir, "corpus.txt");
      fs.writeFileSync(corpus, loadCorpus({ source: "brown", granularity: "paragraph", maxDocs: 60 }).join("\n\n"));
      const base = path.join(path.dirname(kiln), "..", "models", "kiln-default");
      const lora = (dump: string, batch: number) => `
[job]
dump_folder = "${dump}"
seed = 3
[checkpoint]
initial_load_path = "${base}"
initial_load_in_hf = true
[lora]
enable = true
rank = 4
target_modules = ["q_proj", "v_proj"]
[optimizer]
lr = 1e-2
weight_decay = 0.0
[lr_scheduler]
warmup_steps = 1
[training]
local_batch_size = ${batch}
seq_len = 32
steps = ${STEPS}
dataset = "${corpus}"
[metrics]
log_freq = 1
[validation]
enable = false
`;
      fs.writeFileSync(path.join(dir, "dp.toml"), lora(path.join(dir, "dp"), 2));
      fs.writeFileSync(path.join(dir, "single.toml"), lora(path.join(dir, "single"), 4));
      const env = { ...process.env, KILN_NUM_THREADS: "1" };
      const dp = spawnSync(process.execPath, [kiln, "run", "--nproc-per-node", "2", "kiln", "train", "--config", path.join(dir, "dp.toml"), "--no-resume"], { encoding: "utf8", env, timeout: 100_000 });
      assert.equal(dp.status, 0, dp.stderr);
      const single = spawnSync(process.execPath, [kiln, "train", "--config", path.join(dir, "single.toml"), "--no-resume"], { encoding: "utf8", env, timeout: 100_000 });
      assert.equal(single.status, 0, single.stderr);
      const dpLosses = stepLosses(dp.stdout);
      const singleLosses = stepLosses(single.stdout);
      assert.equal(dpLosses.length, STEPS, dp.stdout);
      dpLosses.forEach((l, i) => assert.ok(Math.abs(l - singleLosses[i]!) <= 2e-4, `step ${i + 1}: ${l} vs ${singleLosses[i]}`));
      const a = readSafetensors(path.join(dir, "dp", "lora", "adapter_model.safetensors"));
      const b = readSafetensors(path.join(dir, "single", "lora", "adapter_model.safetensors"));
      assert.equal(a.tensors.length, 16);
      for (const t of a.tensors) {
        const x = a.loadAsFloat32(t.name);
        const y = b.loadAsFloat32(t.name);
        const worst = x.reduce((m, v, i) => Math.max(m, Math.abs(v - y[i]!)), 0);
        assert.ok(worst <= 1e-4, `${t.name}: max |diff| ${worst}`);
      }
      // trained: B moved off zero
      assert.ok(a.loadAsFloat32("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight").some((v) => v !== 0));
      a.close();
      b.close();
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
