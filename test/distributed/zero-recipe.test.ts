// `kiln train` over 2 ranks with [parallelism] data_parallel_shard_degree = 2: the optimizer state is sharded
// (ZeroRedundancyOptimizer, logged) and the run takes the losses of plain DDP (data_parallel_replicate_degree = 2)
// within 1e-6; its checkpoints hold the whole optimizer state (equal to DDP's), and a run resumed from one continues
// with the uninterrupted run's losses.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { describe, it } from "node:test";
import { readSafetensors } from "../../src/models/formats/safetensors.js";
import { loadCorpus } from "../../src/train/corpus.js";
import { cleanup, runRanks, skipWithoutGloo } from "./run-ranks.js";

const STEPS = 4;
const SHARDED = /^\[parallelism\] optimizer state sharded over 2 ranks \(ZeRO-1: parameters and gradients replicated\); rank 0 keeps the state of (\d+) of (\d+) parameters \((\d+) of (\d+) elements\)$/m;

/**
 * Rank 0's part of the state by the sharding line: [params, of params, elements, of elements]. By hand: the model's 11
 * parameters hold 19936 elements (embedding 300 x 32 = 9600; q, k, v, o 1024 each; gate, up, down 2048 each; three
 * norms of 32); torch's greedy partition over 2 ranks gives rank 0 the embedding, then, once rank 1 holds the six
 * matrices (10240 elements), the three norms: 4 parameters, 9696 elements (over 4 ranks it would keep the embedding alone).
 */
const RANK0_OF_2 = [4, 11, 9696, 19936];

function rank0Part(logs: string[], line: RegExp): number[] {
  const m = logs.join("\n").match(line);
  assert.ok(m !== null, logs.join("\n"));
  return m.slice(1, 5).map(Number);
}

function toml(dump: string, corpus: string, parallelism: string): string {
  return `
[job]
dump_folder = "${dump}"
seed = 5
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
weight_decay = 0.1
[lr_scheduler]
warmup_steps = 1
[training]
local_batch_size = 2
seq_len = 32
steps = ${STEPS}
max_norm = 1.0
dataset = "${corpus}"
[parallelism]
${parallelism}
[checkpoint]
enable = true
interval = 2
export_dtype = "float32"
[metrics]
log_freq = 1
[validation]
enable = false
`;
}

interface Rank0 {
  losses: number[];
  logs: string[];
  worldSize: number;
}

async function kilnTrain(config: string, resume: boolean, nproc = 2): Promise<Rank0> {
  const run = await runRanks("recipe-worker", nproc, [config, resume ? "resume" : "fresh"]);
  assert.equal(run.exitCode, 0, run.log.join("\n"));
  const r0 = run.results[0] as unknown as Rank0;
  assert.ok(run.results.every((r) => r !== null), run.log.join("\n"));
  cleanup(run);
  return r0;
}

function assertLosses(got: number[], want: number[], what: string): void {
  assert.equal(got.length, want.length, `${what}: ${got.join(", ")}`);
  got.forEach((l, i) => assert.ok(Math.abs(l - want[i]!) <= 1e-6, `${what} step ${i + 1}: ${l} vs ${want[i]}`));
}

describe("kiln train with data_parallel_shard_degree = 2 (ZeRO-1)", { skip: skipWithoutGloo, timeout: 240_000 }, () => {
  it("takes plain DDP's losses, checkpoints the whole optimizer state, resumes exactly", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-zero-recipe-"));
    try {
      const corpus = path.join(dir, "corpus.txt");
      fs.writeFileSync(corpus, loadCorpus({ source: "brown", granularity: "paragraph", maxDocs: 80 }).join("\n\n"));
      const config = (name: string, parallelism: string): string => {
        const file = path.join(dir, `${name}.toml`);
        fs.writeFileSync(file, toml(path.join(dir, name), corpus, parallelism));
        return file;
      };
      const shardToml = config("shard", "data_parallel_shard_degree = 2");
      const shard = await kilnTrain(shardToml, false);
      const ddp = await kilnTrain(config("ddp", "data_parallel_replicate_degree = 2"), false);
      assert.equal(shard.worldSize, 2);
      assert.deepEqual(rank0Part(shard.logs, SHARDED), RANK0_OF_2);
      assert.doesNotMatch(ddp.logs.join("\n"), /optimizer state sharded/);
      assertLosses(shard.losses, ddp.losses, "sharded vs DDP");

      // the checkpoint holds every parameter's moments, as DDP's (rank 0 gathered them from both ranks)
      const ckpt = (name: string) => path.join(dir, name, "checkpoint", "step-00000004", "optimizer.safetensors");
      const a = readSafetensors(ckpt("shard"));
      const b = readSafetensors(ckpt("ddp"));
      assert.deepEqual(a.tensors.map((t) => t.name).sort(), b.tensors.map((t) => t.name).sort());
      assert.ok(a.tensors.length >= 2 * 8, `${a.tensors.length} buffers`);
      for (const t of a.tensors) {
        const x = a.loadAsFloat32(t.name);
        const y = b.loadAsFloat32(t.name);
        const worst = x.reduce((m, v, i) => Math.max(m, Math.abs(v - y[i]!)), 0);
        assert.ok(worst <= 1e-6, `${t.name}: max |diff| ${worst}`);
      }
      a.close();
      b.close();

      // resume from step 2: steps 3 and 4 again, with the uninterrupted run's losses
      fs.rmSync(path.join(dir, "shard", "checkpoint", "step-00000004"), { recursive: true });
      const resumed = await kilnTrain(shardToml, true);
      assertLosses(resumed.losses, shard.losses.slice(2), "resumed from step 2");
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it("4 ranks as 2 replicas x 2 shards take the losses of 4 plain DDP replicas", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-zero-hybrid-"));
    try {
      const corpus = path.join(dir, "corpus.txt");
      fs.writeFileSync(corpus, loadCorpus({ source: "brown", granularity: "paragraph", maxDocs: 80 }).join("\n\n"));
      const config = (name: string, parallelism: string): string => {
        const file = path.join(dir, `${name}.toml`);
        fs.writeFileSync(file, toml(path.join(dir, name), corpus, parallelism).replace("enable = true\ninterval = 2", "enable = false"));
        return file;
      };
      const hybrid = await kilnTrain(config("hybrid", "data_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 2"), false, 4);
      const ddp = await kilnTrain(config("ddp", "data_parallel_replicate_degree = 4"), false, 4);
      assert.equal(hybrid.worldSize, 4);
      // each replica splits the state in two (not in four over all the ranks)
      const part = rank0Part(hybrid.logs, /^\[parallelism\] optimizer state sharded over 2 ranks, 2 replicas of it \(ZeRO-1: parameters and gradients replicated\); rank 0 keeps the state of (\d+) of (\d+) parameters \((\d+) of (\d+) elements\)$/m);
      assert.deepEqual(part, RANK0_OF_2);
      assertLosses(hybrid.losses, ddp.losses, "2 x 2 vs 4 replicas");
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
