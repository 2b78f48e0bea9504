// SGD as torch.optim.SGD: d = g + wd p; buf = mu buf + (1 - dampening) d (buf = d at the first step);
// p -= lr (nesterov ? d + mu buf : buf), or p -= lr d without momentum.
import type { Tensor } from "../../tensor/index.js";
import { Optimizer, OptimizerError, type BaseOptimizerOptions, type ParamState } from "./optimizer.js";

export interface SGDOptions extends BaseOptimizerOptions {
  momentum?: number;
  dampening?: number;
  nesterov?: boolean;
  /** L2 penalty added to the gradient (torch.optim.SGD's coupled weight_decay). */
  weightDecay?: number;
}

/** @example const opt = new SGD(model.parameters(), { lr: 0.1, momentum: 0.9, nesterov: true }); */
export class SGD extends Optimizer {
  momentum: number;
  readonly dampening: number;
  readonly nesterov: boolean;
  readonly weightDecay: number;

  constructor(params: readonly Tensor[], options: SGDOptions = {}) {
    super(params, "sgd", options, 1e-3);
    this.momentum = options.momentum ?? 0;
    this.dampening = options.dampening ?? 0;
    this.nesterov = options.nesterov ?? false;
    this.weightDecay = options.weightDecay ?? 0;
    this.check("momentum", this.momentum, ">= 0");
    this.check("weight_decay", this.weightDecay, ">= 0");
    if (this.nesterov && (this.momentum <= 0 || this.dampening !== 0)) throw new OptimizerError("[sgd] nesterov needs momentum > 0 and zero dampening");
  }

  protected newBuffers(n: number): Record<string, Float32Array> {
    return this.momentum !== 0 ? { momentum_buffer: new Float32Array(n) } : {};
  }

  protected update(p: Float32Array, g: Float32Array, state: ParamState): void {
    const { lr, momentum: mu, dampening, nesterov, weightDecay: wd } = this;
    const buf = state.buffers.momentum_buffer;
    const first = state.step === 1;
    for (let i = 0; i < p.length; i++) {
      let d = g[i]! + wd * p[i]!;
      if (buf) {
        const b = (buf[i] = first ? d : mu * buf[i]! + (1 - dampening) * d);
        d = nesterov ? d + mu * b : b;
      }
      p[i] = p[i]! - lr * d;
    }
  }
}
