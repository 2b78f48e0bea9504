// Adam's variants in torch.optim, as their algorithm boxes write them (g includes the L2 penalty wd p unless the
// decay is decoupled, p *= 1 - lr wd; m = b1 m + (1 - b1) g and v = b2 v + (1 - b2) g^2 as in Adam):
//   Adamax: u = max(b2 u, |g| + eps); p -= lr / (1 - b1^t) * m / u
//   NAdam:  mu_t = b1 (1 - 0.5 * 0.96^(t psi)) (psi: momentum_decay); denom = sqrt(v / (1 - b2^t)) + eps;
//           p -= lr (1 - mu_t) / (1 - prod_{i<=t} mu_i) g / denom + lr mu_{t+1} / (1 - prod_{i<=t+1} mu_i) m / denom
//   RAdam:  rho_inf = 2 / (1 - b2) - 1; rho_t = rho_inf - 2 t b2^t / (1 - b2^t); m^ = m / (1 - b1^t);
//           rho_t > 5: r = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t)),
//                      p -= lr m^ r sqrt(1 - b2^t) / (sqrt(v) + eps); else p -= lr m^
// NAdam's mu product (torch keeps it as state) is a function of t alone, so it is recomputed from the step count.
import type { Tensor } from "../../tensor/index.js";
import { Optimizer, type BaseOptimizerOptions, type OptimizerKind, type ParamState } from "./optimizer.js";

export interface AdamVariantOptions extends BaseOptimizerOptions {
  betas?: [number, number];
  eps?: number;
  weightDecay?: number;
}

/** The hyper-parameters every variant shares, checked as torch checks them. */
abstract class AdamVariant extends Optimizer {
  beta1: number;
  readonly beta2: number;
  readonly eps: number;
  readonly weightDecay: number;

  constructor(params: readonly Tensor[], kind: OptimizerKind, options: AdamVariantOptions, defaultLr: number) {
    super(params, kind, options, defaultLr);
    [this.beta1, this.beta2] = options.betas ?? [0.9, 0.999];
    this.eps = options.eps ?? 1e-8;
    this.weightDecay = options.weightDecay ?? 0;
    this.check("eps", this.eps, ">= 0");
    this.checkBetas([this.beta1, this.beta2]);
    this.check("weight_decay", this.weightDecay, ">= 0");
  }

  protected newBuffers(n: number): Record<string, Float32Array> {
    return { exp_avg: new Float32Array(n), [this.secondBuffer]: new Float32Array(n) };
  }

  protected abstract readonly secondBuffer: string;
}

/** torch.optim.Adamax (Adam with the infinity norm): lr 2e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0. */
export class Adamax extends AdamVariant {
  protected readonly secondBuffer = "exp_inf";

  constructor(params: readonly Tensor[], options: AdamVariantOptions = {}) {
    super(params, "adamax", options, 2e-3);
  }

  protected update(p: Float32Array, g: Float32Array, state: ParamState): void {
    const { beta1: b1, beta2: b2, eps, weightDecay: wd } = this;
    const m = state.buffers.exp_avg!;
    const u = state.buffers.exp_inf!;
    const clr = this.lr / (1 - Math.pow(b1, state.step));
    for (let i = 0; i < p.length; i++) {
      const gi = g[i]! + wd * p[i]!;
      const mi = (m[i] = b1 * m[i]! + (1 - b1) * gi);
      const ui = (u[i] = Math.max(b2 * u[i]!, Math.abs(gi) + eps));
      p[i] = p[i]! - (clr * mi) / ui;
    }
  }
}

export interface NAdamOptions extends AdamVariantOptions {
  /** psi in mu_t = b1 (1 - 0.5 * 0.96^(t psi)). */
  momentumDecay?: number;
  /** AdamW-style decay (p *= 1 - lr wd) instead of the L2 penalty. */
  decoupledWeightDecay?: boolean;
}

/** torch.optim.NAdam (Adam with Nesterov momentum): lr 2e-3, betas (0.9, 0.999), eps 1e-8, momentum_decay 4e-3. */
export class NAdam extends AdamVariant {
  readonly momentumDecay: number;
  readonly decoupledWeightDecay: boolean;
  protected readonly secondBuffer = "exp_avg_sq";

  constructor(params: readonly Tensor[], options: NAdamOptions = {}) {
    super(params, "nadam", options, 2e-3);
    this.momentumDecay = options.momentumDecay ?? 4e-3;
    this.decoupledWeightDecay = options.decoupledWeightDecay ?? false;
    this.check("momentum_decay", this.momentumDecay, ">= 0");
  }

  /** mu_t, the momentum coefficient of step t. */
  private mu(t: number): number {
    return this.beta1 * (1 - 0.5 * Math.pow(0.96, t * this.momentumDecay));
  }

  protected update(p: Float32Array, g: Float32Array, state: ParamState): void {
    const { beta1: b1, beta2: b2, eps, lr, weightDecay: wd } = this;
    const t = state.step;
    const m = state.buffers.exp_avg!;
    const v = state.buffers.exp_avg_sq!;
    let muProduct = 1;
    for (let i = 1; i <= t; i++) muProduct *= this.mu(i);
    const mu = this.mu(t);
    const muNext = this.mu(t + 1);
    const gradCoef = (lr * (1 - mu)) / (1 - muProduct);
    const avgCoef = (lr * muNext) / (1 - muProduct * muNext);
    const bc2 = 1 - Math.pow(b2, t);
    const decay = this.decoupledWeightDecay ? 1 - lr * wd : 1;
    const l2 = this.decoupledWeightDecay ? 0 : wd;
    for (let i = 0; i < p.length; i++) {
      const pi = p[i]! * decay;
      const gi = g[i]! + l2 * p[i]!;
      const mi = (m[i] = b1 * m[i]! + (1 - b1) * gi);
      const vi = (v[i] = b2 * v[i]! + (1 - b2) * gi * gi);
      const denom = Math.sqrt(vi / bc2) + eps;
      p[i] = pi - (gradCoef * gi) / denom - (avgCoef * mi) / denom;
    }
  }
}

export interface RAdamOptions extends AdamVariantOptions {
  /** AdamW-style decay (p *= 1 - lr wd) instead of the L2 penalty. */
  decoupledWeightDecay?: boolean;
}

/** torch.optim.RAdam (Adam with a rectified adaptive lr): lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0. */
export class RAdam extends AdamVariant {
  readonly decoupledWeightDecay: boolean;
  protected readonly secondBuffer = "exp_avg_sq";

  constructor(params: readonly Tensor[], options: RAdamOptions = {}) {
    super(params, "radam", options, 1e-3);
    this.decoupledWeightDecay = options.decoupledWeightDecay ?? false;
  }

  protected update(p: Float32Array, g: Float32Array, state: ParamState): void {
    const { beta1: b1, beta2: b2, eps, lr, weightDecay: wd } = this;
    const t = state.step;
    const m = state.buffers.exp_avg!;
    const v = state.buffers.exp_avg_sq!;
    const bc1 = 1 - Math.pow(b1, t);
    const bc2 = 1 - Math.pow(b2, t);
    const rhoInf = 2 / (1 - b2) - 1;
    const rhoT = rhoInf - (2 * t * Math.pow(b2, t)) / bc2;
    // the variance of the adaptive lr is tractable only past rho_t = 5: before that, un-adapted momentum SGD
    const rect = rhoT > 5 ? Math.sqrt(((rhoT - 4) * (rhoT - 2) * rhoInf) / ((rhoInf - 4) * (rhoInf - 2) * rhoT)) : 0;
    const decay = this.decoupledWeightDecay ? 1 - lr * wd : 1;
    const l2 = this.decoupledWeightDecay ? 0 : wd;
    for (let i = 0; i < p.length; i++) {
      const pi = p[i]! * decay;
      const gi = g[i]! + l2 * p[i]!;
      const mi = (m[i] = b1 * m[i]! + (1 - b1) * gi);
      const vi = (v[i] = b2 * v[i]! + (1 - b2) * gi * gi);
      const mHat = mi / bc1;
      p[i] = rhoT > 5 ? pi - (lr * mHat * rect * Math.sqrt(bc2)) / (Math.sqrt(vi) + eps) : pi - lr * mHat;
    }
  }
}
