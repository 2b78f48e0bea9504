// Optimizers: AdamW (decoupled weight decay, bias correction; torch.optim.AdamW's update) and SGD with
// momentum / Nesterov. Updates run as plain loops over float32 arrays (see param-access.ts); state is
// float32 per param, as torch keeps it. stateDict()/loadStateDict() give an exact resume.
import type { Tensor } from "../tensor/index.js";
import { KilnError } from "../util/errors.js";
import { readFloat32, writeFloat32 } from "./param-access.js";

export class OptimizerError extends KilnError {
  override name = "OptimizerError";
}

/** Per-param optimizer state: a step count and named float32 buffers (exp_avg, momentum, master...). */
export interface ParamState {
  step: number;
  buffers: Record<string, Float32Array>;
}

/** Everything an optimizer needs to resume exactly; buffers are the ones the optimizer uses (not copies). */
export interface OptimizerStateDict {
  kind: "adamw" | "sgd";
  lr: number;
  /** One entry per param, in parameter order; null for params that never had a gradient. */
  states: (ParamState | null)[];
}

export abstract class Optimizer {
  /** Learning rate of the next step (the trainer sets it from the schedule before each step). */
  lr: number;
  protected states: (ParamState | null)[];

  constructor(
    readonly params: readonly Tensor[],
    lr: number,
    protected readonly kind: OptimizerStateDict["kind"],
  ) {
    if (!(lr >= 0)) throw new OptimizerError(`[${kind}] learning rate must be >= 0, got ${lr}`);
    this.lr = lr;
    this.states = params.map(() => null);
  }

  /** Applies one update to every param that has a gradient. */
  step(): void {
    this.params.forEach((p, i) => {
      if (p.grad === null) return;
      const grad = p.grad.dataSync() as Float32Array;
      const state = (this.states[i] ??= this.initState(p));
      state.step++;
      // with master weights the update runs on the float32 copy, then rounds into the param
      const master = state.buffers.master;
      const values = master ?? readFloat32(p);
      this.update(values, grad, state);
      writeFloat32(p, values);
    });
  }

  /** Drops every gradient (torch's zero_grad(set_to_none=True)). */
  zeroGrad(): void {
    for (const p of this.params) {
      p.grad?.dispose();
      p.grad = null;
    }
  }

  stateDict(): OptimizerStateDict {
    return { kind: this.kind, lr: this.lr, states: this.states.map((s) => (s ? { step: s.step, buffers: { ...s.buffers } } : null)) };
  }

  /** Restores a stateDict() (copies the buffers). */
  loadStateDict(sd: OptimizerStateDict): void {
    if (sd.kind !== this.kind) throw new OptimizerError(`[${this.kind}] cannot load a ${sd.kind} state`);
    if (sd.states.length !== this.params.length) throw new OptimizerError(`[${this.kind}] state has ${sd.states.length} params, optimizer has ${this.params.length}`);
    this.lr = sd.lr;
    this.states = sd.states.map((s, i) => {
      if (!s) return null;
      const buffers: Record<string, Float32Array> = {};
      for (const [name, b] of Object.entries(s.buffers)) {
        if (b.length !== this.params[i]!.numel) throw new OptimizerError(`[${this.kind}] buffer ${name} of param ${i} has ${b.length} elements, param has ${this.params[i]!.numel}`);
        buffers[name] = Float32Array.from(b);
      }
      return { step: s.step, buffers };
    });
  }

  protected abstract initState(p: Tensor): ParamState;
  /** Updates `values` (the param or its master copy) in place from `grad`. */
  protected abstract update(values: Float32Array, grad: Float32Array, state: ParamState): void;
}

/** A float32 master copy for params stored in a reduced float dtype (masterWeights: "auto" | true). */
function masterFor(p: Tensor, masterWeights: boolean | "auto"): Record<string, Float32Array> {
  const want = masterWeights === true || (masterWeights === "auto" && p.dtype !== "float32");
  return want ? { master: Float32Array.from(p.dataSync() as Float32Array) } : {};
}

export interface AdamWOptions {
  lr?: number;
  betas?: [number, number];
  eps?: number;
  weightDecay?: number;
  /** Keep float32 master weights for non-float32 (e.g. bfloat16) params; "auto" (default) does so for those only. */
  masterWeights?: boolean | "auto";
}

/**
 * AdamW as torch.optim.AdamW: p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
 * @example const opt = new AdamW(model.parameters(), { lr: 3e-4, weightDecay: 0.1 }); loss.backward(); opt.step(); opt.zeroGrad();
 */
export class AdamW extends Optimizer {
  readonly beta1: number;
  readonly beta2: number;
  readonly eps: number;
  readonly weightDecay: number;
  private readonly masterWeights: boolean | "auto";

  constructor(params: readonly Tensor[], options: AdamWOptions = {}) {
    super(params, options.lr ?? 1e-3, "adamw");
    [this.beta1, this.beta2] = options.betas ?? [0.9, 0.999];
    this.eps = options.eps ?? 1e-8;
    this.weightDecay = options.weightDecay ?? 1e-2;
    this.masterWeights = options.masterWeights ?? "auto";
    for (const b of [this.beta1, this.beta2]) if (!(b >= 0 && b < 1)) throw new OptimizerError(`[adamw] betas must be in [0, 1), got ${b}`);
  }

  protected initState(p: Tensor): ParamState {
    return { step: 0, buffers: { exp_avg: new Float32Array(p.numel), exp_avg_sq: new Float32Array(p.numel), ...masterFor(p, this.masterWeights) } };
  }

  protected update(p: Float32Array, g: Float32Array, state: ParamState): void {
    const { beta1: b1, beta2: b2, eps, lr } = this;
    const m = state.buffers.exp_avg!;
    const v = state.buffers.exp_avg_sq!;
    const decay = 1 - lr * this.weightDecay;
    const stepSize = lr / (1 - Math.pow(b1, state.step));
    const bc2Sqrt = Math.sqrt(1 - Math.pow(b2, state.step));
    for (let i = 0; i < p.length; i++) {
      const gi = g[i]!;
      const mi = (m[i] = b1 * m[i]! + (1 - b1) * gi);
      const vi = (v[i] = b2 * v[i]! + (1 - b2) * gi * gi);
      p[i] = p[i]! * decay - (stepSize * mi) / (Math.sqrt(vi) / bc2Sqrt + eps);
    }
  }
}

export interface SGDOptions {
  lr?: number;
  momentum?: number;
  dampening?: number;
  nesterov?: boolean;
  /** L2 penalty added to the gradient (torch.optim.SGD's coupled weight_decay). */
  weightDecay?: number;
  masterWeights?: boolean | "auto";
}

/** SGD as torch.optim.SGD: d = g + wd p; buf = mu buf + (1 - dampening) d (buf = d at the first step); p -= lr (nesterov ? d + mu buf : buf). */
export class SGD extends Optimizer {
  readonly momentum: number;
  readonly dampening: number;
  readonly nesterov: boolean;
  readonly weightDecay: number;
  private readonly masterWeights: boolean | "auto";

  constructor(params: readonly Tensor[], options: SGDOptions = {}) {
    super(params, options.lr ?? 1e-3, "sgd");
    this.momentum = options.momentum ?? 0;
    this.dampening = options.dampening ?? 0;
    this.nesterov = options.nesterov ?? false;
    this.weightDecay = options.weightDecay ?? 0;
    this.masterWeights = options.masterWeights ?? "auto";
    if (this.nesterov && (this.momentum <= 0 || this.dampening !== 0)) throw new OptimizerError("[sgd] nesterov needs momentum > 0 and zero dampening");
  }

  protected initState(p: Tensor): ParamState {
    return { step: 0, buffers: { ...(this.momentum !== 0 ? { momentum_buffer: new Float32Array(p.numel) } : {}), ...masterFor(p, this.masterWeights) } };
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
