// The optimizers that scale each coordinate by its own squared-gradient history and keep no first moment
// (torch.optim.Adagrad and torch.optim.RMSprop, as their algorithm boxes write them; g includes the L2 penalty wd p):
//   Adagrad: clr = lr / (1 + (t - 1) lr_decay); sum += g^2; p -= clr g / (sqrt(sum) + eps)
//   RMSprop: v = alpha v + (1 - alpha) g^2; centered: gavg = alpha gavg + (1 - alpha) g, v~ = v - gavg^2;
//            d = g / (sqrt(v~) + eps); momentum: buf = mu buf + d, p -= lr buf; else p -= lr d
import type { Tensor } from "../../tensor/index.js";
import { Optimizer, type BaseOptimizerOptions, type ParamState } from "./optimizer.js";

export interface AdagradOptions extends BaseOptimizerOptions {
  lrDecay?: number;
  weightDecay?: number;
  /** The starting value of every coordinate's squared-gradient sum. */
  initialAccumulatorValue?: number;
  eps?: number;
}

/** torch.optim.Adagrad: lr 1e-2, lr_decay 0, weight_decay 0, initial_accumulator_value 0, eps 1e-10. */
export class Adagrad extends Optimizer {
  readonly lrDecay: number;
  readonly weightDecay: number;
  readonly initialAccumulatorValue: number;
  readonly eps: number;

  constructor(params: readonly Tensor[], options: AdagradOptions = {}) {
    super(params, "adagrad", options, 1e-2);
    this.lrDecay = options.lrDecay ?? 0;
    this.weightDecay = options.weightDecay ?? 0;
    this.initialAccumulatorValue = options.initialAccumulatorValue ?? 0;
    this.eps = options.eps ?? 1e-10;
    this.check("lr_decay", this.lrDecay, ">= 0");
    this.check("weight_decay", this.weightDecay, ">= 0");
    this.check("initial_accumulator_value", this.initialAccumulatorValue, ">= 0");
    this.check("eps", this.eps, ">= 0");
  }

  protected newBuffers(n: number): Record<string, Float32Array> {
    return { sum: new Float32Array(n).fill(this.initialAccumulatorValue) };
  }

  protected update(p: Float32Array, g: Float32Array, state: ParamState): void {
    const { eps, weightDecay: wd } = this;
    const sum = state.buffers.sum!;
    const clr = this.lr / (1 + (state.step - 1) * this.lrDecay);
    for (let i = 0; i < p.length; i++) {
      const gi = g[i]! + wd * p[i]!;
      const s = (sum[i] = sum[i]! + gi * gi);
      p[i] = p[i]! - (clr * gi) / (Math.sqrt(s) + eps);
    }
  }
}

export interface RMSpropOptions extends BaseOptimizerOptions {
  /** Smoothing constant of the squared-gradient average. */
  alpha?: number;
  eps?: number;
  weightDecay?: number;
  momentum?: number;
  /** Normalize by the estimated variance (v - mean(g)^2) instead of the raw second moment. */
  centered?: boolean;
}

/** torch.optim.RMSprop: lr 1e-2, alpha 0.99, eps 1e-8, weight_decay 0, momentum 0, centered false. */
export class RMSprop extends Optimizer {
  readonly alpha: number;
  readonly eps: number;
  readonly weightDecay: number;
  momentum: number;
  readonly centered: boolean;

  constructor(params: readonly Tensor[], options: RMSpropOptions = {}) {
    super(params, "rmsprop", options, 1e-2);
    this.alpha = options.alpha ?? 0.99;
    this.eps = options.eps ?? 1e-8;
    this.weightDecay = options.weightDecay ?? 0;
    this.momentum = options.momentum ?? 0;
    this.centered = options.centered ?? false;
    this.check("eps", this.eps, ">= 0");
    this.check("momentum", this.momentum, ">= 0");
    this.check("weight_decay", this.weightDecay, ">= 0");
    this.check("alpha", this.alpha, ">= 0");
  }

  protected newBuffers(n: number): Record<string, Float32Array> {
    return {
      square_avg: new Float32Array(n),
      ...(this.momentum > 0 ? { momentum_buffer: new Float32Array(n) } : {}),
      ...(this.centered ? { grad_avg: new Float32Array(n) } : {}),
    };
  }

  protected update(p: Float32Array, g: Float32Array, state: ParamState): void {
    const { alpha, eps, lr, momentum: mu, weightDecay: wd } = this;
    const sq = state.buffers.square_avg!;
    const buf = state.buffers.momentum_buffer;
    const gavg = state.buffers.grad_avg;
    for (let i = 0; i < p.length; i++) {
      const gi = g[i]! + wd * p[i]!;
      let v = (sq[i] = alpha * sq[i]! + (1 - alpha) * gi * gi);
      if (gavg) {
        const a = (gavg[i] = alpha * gavg[i]! + (1 - alpha) * gi);
        v -= a * a;
      }
      const d = gi / (Math.sqrt(v) + eps);
      p[i] = p[i]! - lr * (buf ? (buf[i] = mu * buf[i]! + d) : d);
    }
  }
}
