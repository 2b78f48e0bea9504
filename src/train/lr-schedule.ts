// Learning-rate schedules with TorchTitan's semantics (torchtitan/components/lr_scheduler.py,
// linear_warmup_stable_decay): `step` counts optimizer steps already taken (0 for the first update).
//   warmup  (step < W):          lr * (step + 1) / (W + 1)
//   stable  (W <= step < W + S): lr
//   decay   (after):             progress = (step + 1 - W - S) / D, curve in {linear: 1 - p,
//                                sqrt: 1 - sqrt(p), cosine: (1 + cos(pi p)) / 2},
//                                lr_min + (lr - lr_min) * curve
// with D = decayRatio ? round(totalSteps * decayRatio) : totalSteps - W, and S = totalSteps - W - D.
import { KilnError } from "../util/errors.js";

/** What the trainer reads each step: the lr of the update after `step` completed steps (LrSchedule, lr-schedulers.ts). */
export interface StepwiseLr {
  lrAt(step: number): number;
  /** Sets the optimizer's other scheduled hyper-parameters for that step (OneCycleLR's momentum). */
  applyAt?(step: number): void;
}

export type DecayType = "linear" | "cosine" | "sqrt";

export interface LrScheduleOptions {
  /** Peak learning rate. */
  lr: number;
  warmupSteps: number;
  /** Total optimizer steps of the run. */
  totalSteps: number;
  decayType?: DecayType;
  /** Absolute floor reached at the end of the decay (TorchTitan's lr_min, as lr * min_lr_factor). */
  lrMin?: number;
  /** Fraction of totalSteps spent decaying (warmup-stable-decay); undefined decays over every post-warmup step. */
  decayRatio?: number;
}

/**
 * @example const s = new LrSchedule({ lr: 3e-4, warmupSteps: 100, totalSteps: 1000, decayType: "cosine", lrMin: 3e-5 });
 *          s.lrAt(0) // 3e-4 / 101
 */
export class LrSchedule {
  readonly lr: number;
  readonly warmupSteps: number;
  readonly stableSteps: number;
  readonly decaySteps: number;
  readonly decayType: DecayType;
  readonly lrMin: number;

  constructor(o: LrScheduleOptions) {
    if (!(o.lr >= 0)) throw new KilnError(`[lr_schedule] lr must be >= 0, got ${o.lr}`);
    if (!(o.totalSteps >= 1) || !(o.warmupSteps >= 0)) throw new KilnError("[lr_schedule] totalSteps must be >= 1 and warmupSteps >= 0");
    this.lr = o.lr;
    this.lrMin = o.lrMin ?? 0;
    if (this.lrMin > this.lr) throw new KilnError(`[lr_schedule] lrMin ${this.lrMin} exceeds lr ${this.lr}`);
    this.decayType = o.decayType ?? "linear";
    // as TorchTitan: a warmup longer than the run is cut to the run (it warms up over every step)
    let warmup = Math.min(o.warmupSteps, o.totalSteps);
    let decay: number;
    if (o.decayRatio !== undefined) {
      decay = Math.round(o.totalSteps * o.decayRatio);
      // as TorchTitan: warmup shrinks to fit in front of the decay
      if (warmup > o.totalSteps - decay) warmup = o.totalSteps - decay;
    } else decay = o.totalSteps - warmup;
    this.warmupSteps = warmup;
    this.decaySteps = Math.max(decay, 0);
    this.stableSteps = Math.max(o.totalSteps - warmup - this.decaySteps, 0);
  }

  /** Multiplier of the peak lr for the update after `step` completed steps. */
  factorAt(step: number): number {
    const W = this.warmupSteps;
    if (step < W) return (step + 1) / (W + 1);
    if (step < W + this.stableSteps || this.decaySteps === 0) return 1;
    const progress = Math.min((step + 1 - W - this.stableSteps) / this.decaySteps, 1);
    let curve: number;
    switch (this.decayType) {
      case "linear":
        curve = 1 - progress;
        break;
      case "sqrt":
        curve = 1 - Math.sqrt(progress);
        break;
      case "cosine":
        curve = 0.5 * (1 + Math.cos(Math.PI * progress));
        break;
    }
    const minFactor = this.lr === 0 ? 0 : this.lrMin / this.lr;
    return minFactor + (1 - minFactor) * curve;
  }

  lrAt(step: number): number {
    return this.lr * this.factorAt(step);
  }
}
