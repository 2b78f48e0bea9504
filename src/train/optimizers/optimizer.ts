// The optimizer base (torch.optim.Optimizer for one param group): per-param float32 state, an update written as a
// plain loop over float32 arrays (see ../param-access.ts), float32 master weights for reduced-precision params, and
// stateDict()/loadStateDict() that resume exactly. The algorithms live beside it (adam.ts, sgd.ts, ...).
import type { Tensor } from "../../tensor/index.js";
import { KilnError } from "../../util/errors.js";
import { readFloat32, writeFloat32 } from "../param-access.js";

export class OptimizerError extends KilnError {
  override name = "OptimizerError";
}

/** Per-param optimizer state: a step count and named float32 buffers (exp_avg, momentum_buffer, master...). */
export interface ParamState {
  step: number;
  buffers: Record<string, Float32Array>;
}

/** Which algorithm a state belongs to (torch's class name, lower-cased). */
export type OptimizerKind = "adamw" | "adam" | "sgd" | "rmsprop" | "adagrad" | "adamax" | "nadam" | "radam";

/** Everything an optimizer needs to resume exactly; buffers are the ones the optimizer uses (not copies). */
export interface OptimizerStateDict {
  kind: OptimizerKind;
  lr: number;
  /** The lr the first lr scheduler started from (torch keeps "initial_lr" in the param group it saves). */
  initialLr?: number;
  /** One entry per param, in parameter order; null for params that never had a gradient. */
  states: (ParamState | null)[];
}

/** What every optimizer takes besides its own hyper-parameters. */
export interface BaseOptimizerOptions {
  lr?: number;
  /** Ascend the objective instead of descending it (torch's maximize: the gradient is negated first). */
  maximize?: boolean;
  /** Keep float32 master weights for non-float32 (e.g. bfloat16) params; "auto" (default) does so for those only. */
  masterWeights?: boolean | "auto";
}

/**
 * What the training loop drives: an Optimizer, or a wrapper of one that shards it across ranks
 * (ZeroRedundancyOptimizer, whose stateDict() needs the collective consolidateStateDict() on every rank first).
 */
export interface SteppableOptimizer {
  /** Every parameter it updates (the loop clips their gradients). */
  readonly params: readonly Tensor[];
  lr: number;
  initialLr: number | undefined;
  step(): void;
  zeroGrad(): void;
  stateDict(): OptimizerStateDict;
  loadStateDict(sd: OptimizerStateDict): void;
  /** Gathers the whole state on group rank `to` (a collective); the loop calls it on every rank before a checkpoint. */
  consolidateStateDict?(to?: number): void;
}

export abstract class Optimizer implements SteppableOptimizer {
  /** Learning rate of the next step (the trainer or an lr scheduler sets it before each step). */
  lr: number;
  /** The lr the first lr scheduler attached to this optimizer started from (torch's param_group["initial_lr"]). */
  initialLr: number | undefined;
  readonly maximize: boolean;
  protected states: (ParamState | null)[];
  private readonly masterWeights: boolean | "auto";

  constructor(
    readonly params: readonly Tensor[],
    protected readonly kind: OptimizerKind,
    options: BaseOptimizerOptions,
    defaultLr: number,
  ) {
    this.lr = options.lr ?? defaultLr;
    this.maximize = options.maximize ?? false;
    this.masterWeights = options.masterWeights ?? "auto";
    this.check("lr", this.lr, ">= 0");
    this.states = params.map(() => null);
  }

  /** Applies one update to every param that has a gradient. */
  step(): void {
    this.params.forEach((p, i) => {
      if (p.grad === null) return;
      let grad = p.grad.dataSync() as Float32Array;
      if (this.maximize) grad = grad.map((g) => -g);
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
    const initial = this.initialLr !== undefined ? { initialLr: this.initialLr } : {};
    return { kind: this.kind, lr: this.lr, ...initial, states: this.states.map((s) => (s ? { step: s.step, buffers: { ...s.buffers } } : null)) };
  }

  /** Restores a stateDict() (copies the buffers); the state must be this algorithm's with these hyper-parameters' buffers. */
  loadStateDict(sd: OptimizerStateDict): void {
    const k = this.kind;
    if (sd.kind !== k) throw new OptimizerError(`[${k}] cannot load a state saved by ${sd.kind}`);
    if (sd.states.length !== this.params.length) throw new OptimizerError(`[${k}] state has ${sd.states.length} params, optimizer has ${this.params.length}`);
    const want = Object.keys(this.newBuffers(0)).sort();
    this.lr = sd.lr;
    if (sd.initialLr !== undefined) this.initialLr = sd.initialLr;
    this.states = sd.states.map((s, i) => {
      if (!s) return null;
      const p = this.params[i]!;
      const have = Object.keys(s.buffers).filter((n) => n !== "master").sort();
      if (have.join() !== want.join()) throw new OptimizerError(`[${k}] state of param ${i} holds buffers ${have.join(", ") || "(none)"}, this optimizer's hyper-parameters use ${want.join(", ") || "(none)"}`);
      const buffers: Record<string, Float32Array> = {};
      for (const [name, b] of Object.entries(s.buffers)) {
        if (b.length !== p.numel) throw new OptimizerError(`[${k}] buffer ${name} of param ${i} has ${b.length} elements, param has ${p.numel}`);
        buffers[name] = Float32Array.from(b);
      }
      if (this.wantsMaster(p) && !buffers.master) buffers.master = Float32Array.from(readFloat32(p)); // (a state saved without master weights)
      return { step: s.step, buffers };
    });
  }

  /** Throws an OptimizerError naming the hyper-parameter unless `value` satisfies `rule` (torch's constructor checks). */
  protected check(name: string, value: number, rule: ">= 0" | "[0, 1)" | "> 0"): void {
    const ok = rule === ">= 0" ? value >= 0 : rule === "> 0" ? value > 0 : value >= 0 && value < 1;
    if (!ok) throw new OptimizerError(`[${this.kind}] invalid ${name}: ${value} (must be ${rule === "[0, 1)" ? "in [0, 1)" : rule})`);
  }

  protected checkBetas(betas: readonly [number, number]): void {
    this.check("beta1 (betas[0])", betas[0], "[0, 1)");
    this.check("beta2 (betas[1])", betas[1], "[0, 1)");
  }

  private wantsMaster(p: Tensor): boolean {
    return this.masterWeights === true || (this.masterWeights === "auto" && p.dtype !== "float32");
  }

  private initState(p: Tensor): ParamState {
    const buffers = this.newBuffers(p.numel);
    if (this.wantsMaster(p)) buffers.master = Float32Array.from(p.dataSync() as Float32Array);
    return { step: 0, buffers };
  }

  /** The algorithm's state buffers for a param of n elements, at their initial values (torch's state names). */
  protected abstract newBuffers(n: number): Record<string, Float32Array>;
  /** Updates `values` (the param or its master copy) in place from `grad` (never written); state.step counts this step. */
  protected abstract update(values: Float32Array, grad: Float32Array, state: ParamState): void;
}
