// Adam and AdamW as torch.optim writes them (the algorithm boxes of torch.optim.Adam / AdamW), per element at step t:
//   g = grad (+ wd * p for Adam's L2 penalty) ; AdamW instead decays the param first: p *= 1 - lr * wd
//   m = b1 m + (1 - b1) g ; v = b2 v + (1 - b2) g^2 ; amsgrad: vmax = max(vmax, v), used in place of v below
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
import type { Tensor } from "../../tensor/index.js";
import { Optimizer, type BaseOptimizerOptions, type ParamState } from "./optimizer.js";

export interface AdamOptions extends BaseOptimizerOptions {
  betas?: [number, number];
  eps?: number;
  weightDecay?: number;
  /** Use the running maximum of the second moment (torch's amsgrad; state max_exp_avg_sq). */
  amsgrad?: boolean;
}

/**
 * torch.optim.Adam: weight decay is an L2 penalty added to the gradient (default 0); lr 1e-3, betas (0.9, 0.999), eps 1e-8.
 * @example const opt = new Adam(model.parameters(), { lr: 1e-3, amsgrad: true }); loss.backward(); opt.step(); opt.zeroGrad();
 */
export class Adam extends Optimizer {
  beta1: number;
  readonly beta2: number;
  readonly eps: number;
  readonly weightDecay: number;
  readonly amsgrad: boolean;
  /** AdamW's decoupled decay (p *= 1 - lr wd) instead of Adam's L2 penalty. */
  protected readonly decoupled: boolean;

  constructor(params: readonly Tensor[], options: AdamOptions = {}, decoupled = false) {
    super(params, decoupled ? "adamw" : "adam", options, 1e-3);
    this.decoupled = decoupled;
    [this.beta1, this.beta2] = options.betas ?? [0.9, 0.999];
    this.eps = options.eps ?? 1e-8;
    this.weightDecay = options.weightDecay ?? (decoupled ? 1e-2 : 0);
    this.amsgrad = options.amsgrad ?? false;
    this.check("eps", this.eps, ">= 0");
    this.checkBetas([this.beta1, this.beta2]);
    this.check("weight_decay", this.weightDecay, ">= 0");
  }

  protected newBuffers(n: number): Record<string, Float32Array> {
    const buffers: Record<string, Float32Array> = { exp_avg: new Float32Array(n), exp_avg_sq: new Float32Array(n) };
    if (this.amsgrad) buffers.max_exp_avg_sq = new Float32Array(n);
    return buffers;
  }

  protected update(p: Float32Array, g: Float32Array, state: ParamState): void {
    const { beta1: b1, beta2: b2, eps, lr, weightDecay: wd } = this;
    const m = state.buffers.exp_avg!;
    const v = state.buffers.exp_avg_sq!;
    const vmax = state.buffers.max_exp_avg_sq;
    const decay = this.decoupled ? 1 - lr * wd : 1;
    const l2 = this.decoupled ? 0 : wd;
    const stepSize = lr / (1 - Math.pow(b1, state.step));
    const bc2Sqrt = Math.sqrt(1 - Math.pow(b2, state.step));
    for (let i = 0; i < p.length; i++) {
      const gi = g[i]! + l2 * p[i]!;
      const mi = (m[i] = b1 * m[i]! + (1 - b1) * gi);
      let vi = (v[i] = b2 * v[i]! + (1 - b2) * gi * gi);
      if (vmax) vi = vmax[i] = Math.max(vmax[i]!, vi);
      p[i] = p[i]! * decay - (stepSize * mi) / (Math.sqrt(vi) / bc2Sqrt + eps);
    }
  }
}

/**
 * torch.optim.AdamW: decoupled weight decay (default 1e-2), otherwise Adam.
 * @example const opt = new AdamW(model.parameters(), { lr: 3e-4, weightDecay: 0.1 }); loss.backward(); opt.step(); opt.zeroGrad();
 */
export class AdamW extends Adam {
  constructor(params: readonly Tensor[], options: AdamOptions = {}) {
    super(params, options, true);
  }
}

/** AdamW takes Adam's options (only the default weight decay differs). */
export type AdamWOptions = AdamOptions;
