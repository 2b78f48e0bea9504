// torch.optim.lr_scheduler for Kiln's optimizers (one param group: one lr). As in torch, constructing a scheduler
// sets the optimizer's lr to epoch 0's, each step() advances lastEpoch and sets the next, the base lr is the
// optimizer's lr when its first scheduler was built (torch's "initial_lr"), and stateDict() holds the counter.
// Every lr is computed in closed form from the base lr and the epoch (lrAt), which torch's recursive get_lr()
// equals, up to float rounding, while nothing else changes the lr; so a scheduler is also a StepwiseLr the trainer
// reads by step index (`train({ schedule: new StepLR(opt, { stepSize: 2 }) })`: lrAt(n) is the lr of step n + 1).
import { KilnError } from "../util/errors.js";
import type { StepwiseLr } from "./lr-schedule.js";
import type { SteppableOptimizer } from "./optim.js";

/** Where an optimizer's hyper-parameters live: a wrapper's (ZeroRedundancyOptimizer's) inner optimizer, or itself. */
function hyperParameters(optimizer: SteppableOptimizer): object {
  return "localOptimizer" in optimizer ? (optimizer.localOptimizer as object) : optimizer;
}

export class LrSchedulerError extends KilnError {
  override name = "LrSchedulerError";
}

export interface LrSchedulerStateDict {
  kind: string;
  lastEpoch: number;
  baseLr: number;
  lastLr: number;
}

export abstract class LRScheduler implements StepwiseLr {
  /** The lr epoch 0 scales (torch's base_lrs[0]). */
  readonly baseLr: number;
  /** Steps taken since construction (torch's last_epoch; 0 right after it). */
  lastEpoch = -1;
  private lastLr = NaN;

  constructor(readonly optimizer: SteppableOptimizer) {
    this.baseLr = optimizer.initialLr ??= optimizer.lr;
  }

  /** The lr `epoch` steps after construction (the lr of the trainer's update after `epoch` completed steps). */
  abstract lrAt(epoch: number): number;

  /** Sets the optimizer's other scheduled hyper-parameters for `epoch` (OneCycleLR's momentum); none by default. */
  applyAt(epoch: number): void {
    void epoch;
  }

  /** Advances the counter and sets the optimizer's lr (call after optimizer.step(), as in torch). */
  step(): void {
    this.lastEpoch++;
    this.lastLr = this.optimizer.lr = this.lrAt(this.lastEpoch);
    this.applyAt(this.lastEpoch);
  }

  /** The lr the last step() (or the constructor) set (torch's get_last_lr()[0]). */
  getLastLr(): number {
    return this.lastLr;
  }

  stateDict(): LrSchedulerStateDict {
    return { kind: this.constructor.name, lastEpoch: this.lastEpoch, baseLr: this.baseLr, lastLr: this.lastLr };
  }

  /** Restores the counter (the optimizer's lr comes back with its own state dict, as in torch). */
  loadStateDict(sd: LrSchedulerStateDict): void {
    if (sd.kind !== this.constructor.name) throw new LrSchedulerError(`[${this.constructor.name}] cannot load a ${sd.kind} state`);
    (this as { baseLr: number }).baseLr = sd.baseLr;
    this.lastEpoch = sd.lastEpoch;
    this.lastLr = sd.lastLr;
  }

  /** torch's _initial_step(): epoch 0's lr onto the optimizer; subclasses call it once their fields are set. */
  protected initialStep(): void {
    this.step();
  }

  protected fail(message: string): never {
    throw new LrSchedulerError(`[${this.constructor.name}] ${message}`);
  }
}

/** lr = base * lrLambda(epoch). @example new LambdaLR(opt, (e) => 0.95 ** e) */
export class LambdaLR extends LRScheduler {
  constructor(optimizer: SteppableOptimizer, readonly lrLambda: (epoch: number) => number) {
    super(optimizer);
    this.initialStep();
  }
  lrAt(epoch: number): number {
    return this.baseLr * this.lrLambda(epoch);
  }
}

/** lr = base * gamma^floor(epoch / stepSize) (gamma 0.1). @example new StepLR(opt, { stepSize: 30, gamma: 0.1 }) */
export class StepLR extends LRScheduler {
  readonly stepSize: number;
  readonly gamma: number;
  constructor(optimizer: SteppableOptimizer, o: { stepSize: number; gamma?: number }) {
    super(optimizer);
    if (!Number.isInteger(o.stepSize) || o.stepSize < 1) this.fail(`stepSize must be a positive integer, got ${o.stepSize}`);
    this.stepSize = o.stepSize;
    this.gamma = o.gamma ?? 0.1;
    this.initialStep();
  }
  lrAt(epoch: number): number {
    return this.baseLr * Math.pow(this.gamma, Math.floor(epoch / this.stepSize));
  }
}

/** lr = base * gamma^(milestones passed), a milestone listed twice counting twice (torch's Counter). */
export class MultiStepLR extends LRScheduler {
  readonly milestones: number[];
  readonly gamma: number;
  constructor(optimizer: SteppableOptimizer, o: { milestones: number[]; gamma?: number }) {
    super(optimizer);
    this.milestones = [...o.milestones].sort((a, b) => a - b);
    this.gamma = o.gamma ?? 0.1;
    this.initialStep();
  }
  lrAt(epoch: number): number {
    return this.baseLr * Math.pow(this.gamma, bisectRight(this.milestones, epoch));
  }
}

/** lr = base * gamma^epoch. */
export class ExponentialLR extends LRScheduler {
  constructor(optimizer: SteppableOptimizer, readonly gamma: number) {
    super(optimizer);
    this.initialStep();
  }
  lrAt(epoch: number): number {
    return this.baseLr * Math.pow(this.gamma, epoch);
  }
}

/**
 * lr = etaMin + (base - etaMin) (1 + cos(pi epoch / tMax)) / 2: torch's closed form (_get_closed_form_lr), which its
 * recursive step() equals while nothing else changes the lr, including past tMax, where the cosine rises again.
 */
export class CosineAnnealingLR extends LRScheduler {
  readonly tMax: number;
  readonly etaMin: number;
  constructor(optimizer: SteppableOptimizer, o: { tMax: number; etaMin?: number }) {
    super(optimizer);
    if (!(o.tMax > 0)) this.fail(`tMax must be > 0, got ${o.tMax}`);
    this.tMax = o.tMax;
    this.etaMin = o.etaMin ?? 0;
    this.initialStep();
  }
  lrAt(epoch: number): number {
    return this.etaMin + ((this.baseLr - this.etaMin) * (1 + Math.cos((Math.PI * epoch) / this.tMax))) / 2;
  }
}

/** lr = base * (start + (end - start) min(epoch, totalIters) / totalIters) (start 1/3, end 1, totalIters 5). */
export class LinearLR extends LRScheduler {
  readonly startFactor: number;
  readonly endFactor: number;
  readonly totalIters: number;
  constructor(optimizer: SteppableOptimizer, o: { startFactor?: number; endFactor?: number; totalIters?: number } = {}) {
    super(optimizer);
    this.startFactor = o.startFactor ?? 1 / 3;
    this.endFactor = o.endFactor ?? 1;
    this.totalIters = o.totalIters ?? 5;
    if (!(this.startFactor > 0 && this.startFactor <= 1)) this.fail(`startFactor must be in (0, 1], got ${this.startFactor}`);
    if (!(this.endFactor >= 0 && this.endFactor <= 1)) this.fail(`endFactor must be in [0, 1], got ${this.endFactor}`);
    this.initialStep();
  }
  lrAt(epoch: number): number {
    const progress = Math.min(this.totalIters, epoch) / this.totalIters;
    return this.baseLr * (this.startFactor + (this.endFactor - this.startFactor) * progress);
  }
}

/** lr = base * factor for the first totalIters epochs, then base (factor 1/3, totalIters 5). */
export class ConstantLR extends LRScheduler {
  readonly factor: number;
  readonly totalIters: number;
  constructor(optimizer: SteppableOptimizer, o: { factor?: number; totalIters?: number } = {}) {
    super(optimizer);
    this.factor = o.factor ?? 1 / 3;
    this.totalIters = o.totalIters ?? 5;
    if (!(this.factor >= 0 && this.factor <= 1)) this.fail(`factor must be in [0, 1], got ${this.factor}`);
    this.initialStep();
  }
  lrAt(epoch: number): number {
    return this.baseLr * (epoch >= this.totalIters ? 1 : this.factor);
  }
}

/** lr = base * (1 - min(epoch, totalIters) / totalIters)^power (totalIters 5, power 1). */
export class PolynomialLR extends LRScheduler {
  readonly totalIters: number;
  readonly power: number;
  constructor(optimizer: SteppableOptimizer, o: { totalIters?: number; power?: number } = {}) {
    super(optimizer);
    this.totalIters = o.totalIters ?? 5;
    this.power = o.power ?? 1;
    this.initialStep();
  }
  lrAt(epoch: number): number {
    return this.baseLr * Math.pow(1 - Math.min(this.totalIters, epoch) / this.totalIters, this.power);
  }
}

/**
 * schedulers[i] runs from milestones[i - 1] (0 for the first), counting its own epochs from 0 there (torch's
 * SequentialLR steps the next scheduler with epoch 0 at a milestone, where its closed form restarts from the base lr).
 * The schedulers are read through lrAt: their own counters do not move. A milestone at 0 starts with the second
 * scheduler at epoch 0 (torch before its fix for milestone 0 started every SequentialLR with the first).
 * @example new SequentialLR(opt, [new LinearLR(opt, { startFactor: 0.1, totalIters: 5 }), new CosineAnnealingLR(opt, { tMax: 95 })], [5])
 */
export class SequentialLR extends LRScheduler {
  constructor(optimizer: SteppableOptimizer, readonly schedulers: readonly LRScheduler[], readonly milestones: readonly number[]) {
    super(optimizer);
    if (schedulers.length === 0) this.fail("needs at least one scheduler");
    if (milestones.length !== schedulers.length - 1) this.fail(`expects ${schedulers.length - 1} milestones for ${schedulers.length} schedulers, got ${milestones.length}`);
    schedulers.forEach((s, i) => {
      if (s.optimizer !== optimizer) this.fail(`scheduler ${i} belongs to another optimizer`);
    });
    milestones.forEach((m, i) => {
      if (i > 0 && m < milestones[i - 1]!) this.fail(`milestones must be increasing, got ${milestones.join(", ")}`);
    });
    this.initialStep();
  }
  lrAt(epoch: number): number {
    const i = bisectRight(this.milestones, epoch);
    return this.schedulers[i]!.lrAt(epoch - (i > 0 ? this.milestones[i - 1]! : 0));
  }
}

export interface OneCycleLROptions {
  maxLr: number;
  /** The cycle's length in steps (or epochs x stepsPerEpoch). */
  totalSteps?: number;
  epochs?: number;
  stepsPerEpoch?: number;
  /** Fraction of the cycle spent raising the lr (0.3). */
  pctStart?: number;
  annealStrategy?: "cos" | "linear";
  /** Cycle the momentum (beta1 of Adam-like optimizers) inversely to the lr, between baseMomentum and maxMomentum (true). */
  cycleMomentum?: boolean;
  baseMomentum?: number;
  maxMomentum?: number;
  /** initial lr = maxLr / divFactor (25). */
  divFactor?: number;
  /** final lr = initial lr / finalDivFactor (1e4). */
  finalDivFactor?: number;
  /** Three phases (up, back down to the initial lr, then to the final lr) instead of two. */
  threePhase?: boolean;
}

interface Phase {
  endStep: number;
  lr: [number, number];
  momentum: [number, number];
}

/**
 * The 1cycle policy as torch.optim.lr_scheduler.OneCycleLR: from maxLr / divFactor up to maxLr at step
 * pctStart x totalSteps - 1, then down to maxLr / divFactor / finalDivFactor at step totalSteps - 1 (threePhase: back to
 * the initial lr at 2 pctStart totalSteps - 2 first), each phase a cosine (or linear) anneal; the optimizer's own lr
 * is replaced (its base lr is maxLr / divFactor). The momentum moves the other way when cycleMomentum.
 * @example new OneCycleLR(opt, { maxLr: 0.01, totalSteps: 1000 })
 */
export class OneCycleLR extends LRScheduler {
  readonly totalSteps: number;
  readonly maxLr: number;
  readonly annealStrategy: "cos" | "linear";
  readonly cycleMomentum: boolean;
  private readonly phases: Phase[];
  private readonly momentumKey: "beta1" | "momentum" | null;

  constructor(optimizer: SteppableOptimizer, o: OneCycleLROptions) {
    const divFactor = o.divFactor ?? 25;
    optimizer.initialLr = o.maxLr / divFactor; // torch overwrites the group's initial_lr
    super(optimizer);
    if (o.totalSteps !== undefined) {
      if (!Number.isInteger(o.totalSteps) || o.totalSteps <= 0) this.fail(`totalSteps must be a positive integer, got ${o.totalSteps}`);
      this.totalSteps = o.totalSteps;
    } else if (o.epochs !== undefined && o.stepsPerEpoch !== undefined) {
      if (!Number.isInteger(o.epochs) || o.epochs <= 0) this.fail(`epochs must be a positive integer, got ${o.epochs}`);
      if (!Number.isInteger(o.stepsPerEpoch) || o.stepsPerEpoch <= 0) this.fail(`stepsPerEpoch must be a positive integer, got ${o.stepsPerEpoch}`);
      this.totalSteps = o.epochs * o.stepsPerEpoch;
    } else this.fail("needs totalSteps, or epochs and stepsPerEpoch");
    const pct = o.pctStart ?? 0.3;
    if (!(pct >= 0 && pct <= 1)) this.fail(`pctStart must be in [0, 1], got ${pct}`);
    this.annealStrategy = o.annealStrategy ?? "cos";
    if (this.annealStrategy !== "cos" && this.annealStrategy !== "linear") this.fail(`annealStrategy must be "cos" or "linear", got ${String(this.annealStrategy)}`);
    this.maxLr = o.maxLr;
    const initial = this.baseLr;
    const min = initial / (o.finalDivFactor ?? 1e4);
    const [lo, hi] = [o.baseMomentum ?? 0.85, o.maxMomentum ?? 0.95];
    const T = this.totalSteps;
    this.phases = o.threePhase
      ? [
          { endStep: pct * T - 1, lr: [initial, o.maxLr], momentum: [hi, lo] },
          { endStep: 2 * pct * T - 2, lr: [o.maxLr, initial], momentum: [lo, hi] },
          { endStep: T - 1, lr: [initial, min], momentum: [hi, hi] },
        ]
      : [
          { endStep: pct * T - 1, lr: [initial, o.maxLr], momentum: [hi, lo] },
          { endStep: T - 1, lr: [o.maxLr, min], momentum: [lo, hi] },
        ];
    this.cycleMomentum = o.cycleMomentum ?? true;
    const has = (key: string) => key in hyperParameters(optimizer);
    this.momentumKey = !this.cycleMomentum ? null : has("beta1") ? "beta1" : has("momentum") ? "momentum" : null;
    if (this.cycleMomentum && this.momentumKey === null) this.fail("the optimizer has no momentum or beta1 to cycle: pass cycleMomentum: false");
    this.initialStep();
  }

  lrAt(epoch: number): number {
    return this.at(epoch, "lr");
  }

  /** The momentum (or beta1) of step `epoch` when cycleMomentum. */
  momentumAt(epoch: number): number {
    return this.at(epoch, "momentum");
  }

  override applyAt(epoch: number): void {
    if (this.momentumKey !== null) (hyperParameters(this.optimizer) as Record<string, number>)[this.momentumKey] = this.momentumAt(epoch);
  }

  private at(epoch: number, what: "lr" | "momentum"): number {
    if (epoch > this.totalSteps) this.fail(`tried to step ${epoch} times; the cycle has ${this.totalSteps} steps`);
    let start = 0;
    for (const [i, phase] of this.phases.entries()) {
      if (epoch <= phase.endStep || i === this.phases.length - 1) {
        const pct = (epoch - start) / (phase.endStep - start);
        const [from, to] = phase[what];
        return this.annealStrategy === "cos" ? to + ((from - to) / 2) * (Math.cos(Math.PI * pct) + 1) : (to - from) * pct + from;
      }
      start = phase.endStep;
    }
    return NaN; // (unreachable: the last phase always answers)
  }
}

/**
 * SGDR as torch.optim.lr_scheduler.CosineAnnealingWarmRestarts: a cosine from base to etaMin over T_i epochs, then a
 * restart, with T_0 = t0 and T_{i+1} = T_i x tMult.
 */
export class CosineAnnealingWarmRestarts extends LRScheduler {
  readonly t0: number;
  readonly tMult: number;
  readonly etaMin: number;
  constructor(optimizer: SteppableOptimizer, o: { t0: number; tMult?: number; etaMin?: number }) {
    super(optimizer);
    if (!Number.isInteger(o.t0) || o.t0 <= 0) this.fail(`t0 must be a positive integer, got ${o.t0}`);
    this.t0 = o.t0;
    this.tMult = o.tMult ?? 1;
    if (!Number.isInteger(this.tMult) || this.tMult < 1) this.fail(`tMult must be an integer >= 1, got ${this.tMult}`);
    this.etaMin = o.etaMin ?? 0;
    this.initialStep();
  }
  lrAt(epoch: number): number {
    let tCur = epoch;
    let tI = this.t0;
    while (tCur >= tI) {
      tCur -= tI;
      tI *= this.tMult;
    }
    return this.etaMin + ((this.baseLr - this.etaMin) * (1 + Math.cos((Math.PI * tCur) / tI))) / 2;
  }
}

/** The first index whose value is > x in a sorted list (Python's bisect.bisect_right). */
function bisectRight(sorted: readonly number[], x: number): number {
  let i = 0;
  while (i < sorted.length && sorted[i]! <= x) i++;
  return i;
}
