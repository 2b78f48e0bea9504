// The model-agnostic training loop (TorchTitan's train step): per step, gradAccumulationSteps
// micro-batches of forward + backward, global-norm clipping, the scheduled lr, one optimizer update,
// metrics, and periodic checkpoints that resume to the identical loss trajectory.
import { defaultGenerator, maxMemoryAllocated, resetPeakMemoryStats, type Generator, type Tensor } from "../tensor/index.js";
import { KilnError } from "../util/errors.js";
import { CheckpointError, latestCheckpoint, loadCheckpoint, pruneCheckpoints, saveCheckpoint } from "./checkpoint.js";
import { clipGradNorm } from "./grad-clip.js";
import type { StepwiseLr } from "./lr-schedule.js";
import type { SteppableOptimizer } from "./optim.js";

/** What the loop needs from a model: its params and a scalar loss for a batch. */
export interface TrainableModel {
  parameters(): Tensor[];
  /** Names for checkpoints (default "param.<i>" in parameters() order). */
  namedParameters?(): Iterable<[string, Tensor]>;
  /** Mean loss over the batch's targets, as a one-element tensor that requires grad. */
  loss(inputs: Int32Array, targets: Int32Array): Tensor;
}

export interface TrainBatch {
  inputs: Int32Array;
  targets: Int32Array;
}

/** A batch source; state()/restore() (as train/data-loader.ts's DataLoader) make resume exact. */
export interface BatchSource {
  next(): TrainBatch;
  state?(): unknown;
  restore?(state: never): void;
}

export interface StepMetrics {
  /** Optimizer steps completed, 1-based like TorchTitan's logs. */
  step: number;
  /** Mean loss over the step's micro-batches. */
  loss: number;
  /** Global L2 norm of the gradients before clipping. */
  gradNorm: number;
  lr: number;
  tokens: number;
  tokensPerSecond: number;
  elapsedMs: number;
  /** The most tensor bytes live at once on the parameters' device during the step (TorchTitan's logged memory). */
  peakMemoryBytes: number;
}

export interface CheckpointOptions {
  dir: string;
  /** Save after every `interval` steps (and after the last step when `atEnd`). */
  interval: number;
  atEnd?: boolean;
  /** Keep only the newest k step directories (0 keeps all). */
  keepLatest?: number;
  /** Resume from the newest checkpoint under dir (true), or from this step directory (string). */
  resume?: boolean | string;
}

export interface TrainOptions {
  model: TrainableModel;
  /** An optimizer, or a ZeroRedundancyOptimizer (its state consolidated on every rank before each checkpoint). */
  optimizer: SteppableOptimizer;
  /** lr per step (an LrSchedule or a torch-style scheduler of lr-schedulers.ts); without it the optimizer's lr stays as set. */
  schedule?: StepwiseLr | ((step: number) => number);
  dataLoader: BatchSource;
  /** Total optimizer steps of the run (a resumed run continues up to it). */
  steps: number;
  gradAccumulationSteps?: number;
  /** Clip gradients to this global L2 norm; undefined/0 only measures the norm. */
  maxNorm?: number;
  onStep?: (m: StepMetrics) => void | Promise<void>;
  checkpoint?: CheckpointOptions;
  /** The RNG whose state checkpoints carry (default: the tensor package's default generator). */
  generator?: Generator;
  /** Data-parallel training (a DistributedDataParallel model under `kiln run`); see {@link DataParallelHooks}. */
  dataParallel?: DataParallelHooks;
}

/**
 * What the loop needs from data parallelism: gradient accumulation defers the gradient averaging to the last
 * micro-batch (noSync), the logged loss is the mean over ranks, tokens count every rank's, and only the writer
 * (rank 0) saves checkpoints; every rank resumes from them.
 */
export interface DataParallelHooks {
  noSync<T>(fn: () => T): T;
  /** The mean of x over the ranks (a collective: every rank calls it once per step). */
  averageAcrossRanks(x: number): number;
  worldSize: number;
  isWriter: boolean;
}

export interface TrainResult {
  /** Metrics of the steps this call ran. */
  history: StepMetrics[];
  /** The step the run started from (0, or the resumed checkpoint's). */
  startStep: number;
  finalStep: number;
}

function namedParams(model: TrainableModel): [string, Tensor][] {
  return model.namedParameters ? [...model.namedParameters()] : model.parameters().map((p, i) => [`param.${i}`, p]);
}

/**
 * Runs the loop.
 * @example
 *   const opt = new AdamW(model.parameters(), { lr: 1e-3 });
 *   const schedule = new LrSchedule({ lr: 1e-3, warmupSteps: 10, totalSteps: 200, decayType: "cosine" });
 *   await train({ model, optimizer: opt, schedule, dataLoader, steps: 200, maxNorm: 1, onStep: (m) => console.log(m) });
 */
export async function train(o: TrainOptions): Promise<TrainResult> {
  const accum = o.gradAccumulationSteps ?? 1;
  if (!Number.isInteger(accum) || accum < 1) throw new KilnError(`[train] gradAccumulationSteps must be a positive integer, got ${accum}`);
  const gen = o.generator ?? defaultGenerator;
  const params = o.optimizer.params;
  let step = 0;

  const ck = o.checkpoint;
  if (ck?.resume) {
    const dir = typeof ck.resume === "string" ? ck.resume : latestCheckpoint(ck.dir);
    if (dir) {
      const loaded = loadCheckpoint(dir, namedParams(o.model));
      o.optimizer.loadStateDict(loaded.optimizer);
      if (loaded.dataLoader !== null && o.dataLoader.restore) {
        try {
          o.dataLoader.restore(loaded.dataLoader as never);
        } catch (e) {
          throw new CheckpointError(
            `[checkpoint] ${dir}: its data loader position does not fit this run (${(e as Error).message}): ` +
              "resume with the seq_len, local batch size and number of ranks it was saved with, or start again without resuming",
          );
        }
      }
      if (loaded.rng) gen.setState(loaded.rng as { seed: number; counter: number });
      step = loaded.step;
    }
  }
  const startStep = step;
  const save = () => {
    saveCheckpoint(ck!.dir, {
      step,
      params: namedParams(o.model),
      optimizer: o.optimizer.stateDict(),
      dataLoader: o.dataLoader.state?.(),
      rng: gen.getState(),
    });
    if (ck!.keepLatest) pruneCheckpoints(ck!.dir, ck!.keepLatest);
  };

  const history: StepMetrics[] = [];
  const device = params[0]?.device;
  while (step < o.steps) {
    const t0 = performance.now();
    resetPeakMemoryStats(device);
    let lossSum = 0;
    let tokens = 0;
    const dp = o.dataParallel;
    for (let m = 0; m < accum; m++) {
      const batch = o.dataLoader.next();
      const micro = (): void => {
        const loss = o.model.loss(batch.inputs, batch.targets);
        lossSum += loss.item();
        const scaled = accum > 1 ? loss.div(accum) : loss;
        scaled.backward();
        if (scaled !== loss) scaled.dispose();
        loss.dispose();
      };
      // data parallel: gradients are averaged across ranks after the last micro-batch's backward only
      if (dp !== undefined && m < accum - 1) dp.noSync(micro);
      else micro();
      tokens += batch.targets.length * (dp?.worldSize ?? 1);
    }
    const gradNorm = clipGradNorm(params, o.maxNorm ? o.maxNorm : Infinity);
    const lr = o.schedule === undefined ? o.optimizer.lr : typeof o.schedule === "function" ? o.schedule(step) : o.schedule.lrAt(step);
    o.optimizer.lr = lr;
    if (typeof o.schedule === "object") o.schedule.applyAt?.(step);
    o.optimizer.step();
    o.optimizer.zeroGrad();
    step++;
    const elapsedMs = performance.now() - t0;
    const stepLoss = dp !== undefined ? dp.averageAcrossRanks(lossSum / accum) : lossSum / accum;
    const metrics: StepMetrics = { step, loss: stepLoss, gradNorm, lr, tokens, tokensPerSecond: (tokens * 1000) / Math.max(elapsedMs, 1e-3), elapsedMs,
      peakMemoryBytes: maxMemoryAllocated(device),
    };
    history.push(metrics);
    await o.onStep?.(metrics);
    if (ck && ((ck.interval > 0 && step % ck.interval === 0) || (ck.atEnd && step === o.steps))) {
      o.optimizer.consolidateStateDict?.(0); // (every rank: a sharded optimizer's state meets on the writer)
      if (dp?.isWriter ?? true) save();
    }
  }
  return { history, startStep, finalStep: step };
}
