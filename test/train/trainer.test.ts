// The training loop on a tiny bigram language model (embedding -> linear logits -> cross-entropy):
// the loss falls, runs are bit-for-bit deterministic, and resuming from a checkpoint reproduces the
// uninterrupted loss trajectory exactly.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k from "../../src/tensor/index.js";
import type { Tensor } from "../../src/tensor/index.js";
import { AdamW } from "../../src/train/optim.js";
import { LrSchedule } from "../../src/train/lr-schedule.js";
import { train, type BatchSource, type StepMetrics, type TrainableModel } from "../../src/train/trainer.js";
import { CheckpointError } from "../../src/train/checkpoint.js";
import type { DataLoader } from "../../src/train/data-loader.js";

// the project's DataLoader plugs into the loop as a batch source (compile-time check)
const _dataLoaderFits: BatchSource = null as unknown as DataLoader;
void _dataLoaderFits;

const V = 16;
const D = 16;

class BigramLm implements TrainableModel {
  readonly emb: Tensor;
  readonly head: Tensor;
  constructor(seed: number) {
    const gen = new k.Generator(seed);
    this.emb = k.randn([V, D], { generator: gen, std: 0.5 }).requiresGrad_();
    this.head = k.randn([V, D], { generator: gen, std: 0.5 }).requiresGrad_();
  }
  parameters(): Tensor[] {
    return [this.emb, this.head];
  }
  namedParameters(): [string, Tensor][] {
    return [["tok_embeddings.weight", this.emb], ["output.weight", this.head]];
  }
  loss(inputs: Int32Array, targets: Int32Array): Tensor {
    const h = k.embedding(k.tensor(inputs), this.emb);
    return k.crossEntropy(k.linear(h, this.head), k.tensor(targets));
  }
}

/** A fixed token stream where each token determines the next (a 16-cycle), cut into windows in a seeded order. */
class Windows implements BatchSource {
  private cursor = 0;
  private readonly tokens: Int32Array;
  constructor(private readonly batch: number, private readonly seqLen: number) {
    this.tokens = new Int32Array(512);
    for (let i = 1; i < this.tokens.length; i++) this.tokens[i] = (this.tokens[i - 1]! * 5 + 3) % V;
  }
  next() {
    const inputs = new Int32Array(this.batch * this.seqLen);
    const targets = new Int32Array(this.batch * this.seqLen);
    for (let b = 0; b < this.batch; b++) {
      const start = ((this.cursor * 37) % (this.tokens.length - this.seqLen - 1)) | 0;
      this.cursor++;
      inputs.set(this.tokens.subarray(start, start + this.seqLen), b * this.seqLen);
      targets.set(this.tokens.subarray(start + 1, start + this.seqLen + 1), b * this.seqLen);
    }
    return { inputs, targets };
  }
  state() {
    return { cursor: this.cursor };
  }
  restore(s: { cursor: number }) {
    this.cursor = s.cursor;
  }
}

const STEPS = 40;

async function run(opts: { seed?: number; steps?: number; checkpointDir?: string; resume?: string; accum?: number; dataLoader?: Windows } = {}): Promise<StepMetrics[]> {
  const model = new BigramLm(opts.seed ?? 7);
  const optimizer = new AdamW(model.parameters(), { lr: 0.05, weightDecay: 0.01 });
  const schedule = new LrSchedule({ lr: 0.05, warmupSteps: 5, totalSteps: STEPS, decayType: "cosine", lrMin: 0.005 });
  const { history } = await train({
    model,
    optimizer,
    schedule,
    dataLoader: opts.dataLoader ?? new Windows(4, 16),
    steps: opts.steps ?? STEPS,
    gradAccumulationSteps: opts.accum ?? 1,
    maxNorm: 1,
    checkpoint: opts.checkpointDir ? { dir: opts.checkpointDir, interval: 10, resume: opts.resume } : undefined,
  });
  return history;
}

describe("train()", () => {
  test("the loss of a bigram LM falls from ln(16) to below 0.25 in 40 steps, deterministically", async () => {
    const t0 = performance.now();
    const a = await run();
    const b = await run();
    assert.ok(a[0]!.loss > 2, `first loss ${a[0]!.loss}`);
    assert.ok(a[STEPS - 1]!.loss < 0.25, `final loss ${a[STEPS - 1]!.loss}`);
    assert.deepEqual(a.map((m) => m.loss), b.map((m) => m.loss));
    assert.deepEqual(a.map((m) => m.gradNorm), b.map((m) => m.gradNorm));
    assert.equal(a[0]!.tokens, 64);
    assert.ok(a[0]!.lr < a[4]!.lr && a[STEPS - 1]!.lr < a[10]!.lr, "warmup then decay");
    assert.ok(performance.now() - t0 < 15000);
  });

  test("gradient accumulation runs micro-batches per step", async () => {
    const h = await run({ steps: 5, accum: 2 });
    assert.equal(h.length, 5);
    assert.equal(h[0]!.tokens, 128);
  });

  test("resuming from a checkpoint reproduces the uninterrupted loss trajectory", async () => {
    const dir = mkdtempSync(join(tmpdir(), "kiln-train-"));
    try {
      const full = await run({ checkpointDir: dir });
      assert.ok(existsSync(join(dir, "step-00000020", "model.safetensors")));
      // a differently initialised model restored from step 20 continues exactly as the full run did
      const resumed = await run({ seed: 99, checkpointDir: dir, resume: join(dir, "step-00000020") });
      assert.equal(resumed.length, STEPS - 20);
      assert.equal(resumed[0]!.step, 21);
      assert.deepEqual(resumed.map((m) => m.loss), full.slice(20).map((m) => m.loss));
      assert.deepEqual(resumed.map((m) => m.lr), full.slice(20).map((m) => m.lr));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("a checkpoint whose data loader position does not fit the run is a CheckpointError saying how to resume", async () => {
    const dir = mkdtempSync(join(tmpdir(), "kiln-train-"));
    try {
      await run({ steps: 10, checkpointDir: dir });
      const other = new (class extends Windows {
        override restore(): void {
          throw new Error("state is for 16 windows, seqLen 16, batch 4; this loader has 8, 16, 8");
        }
      })(4, 16);
      await assert.rejects(run({ checkpointDir: dir, resume: join(dir, "step-00000010"), dataLoader: other }), (e: unknown) =>
        e instanceof CheckpointError && /step-00000010: its data loader position does not fit this run \(state is for 16 windows.*\): resume with the seq_len, local batch size and number of ranks/.test((e as Error).message));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
