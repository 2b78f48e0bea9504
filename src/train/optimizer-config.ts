// kiln train's [optimizer]: torch.optim's name (as torch spells it) and the hyper-parameters that optimizer reads.
// A key the named optimizer does not read is refused; a key it reads but the config leaves out takes TorchTitan's
// default for Adam and AdamW (lr 8e-4, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1: TorchTitan's [optimizer]) and
// the recipe's for SGD (momentum 0.9, weight_decay 0.1), torch's own for the optimizers TorchTitan does not offer.
import type { Tensor } from "../tensor/index.js";
import { Adagrad, Adam, Adamax, AdamW, NAdam, RAdam, RMSprop, SGD, type Optimizer } from "./optim.js";
import type { OptimizerConfig } from "./train-config.js";

export const OPTIMIZER_NAMES = ["AdamW", "Adam", "SGD", "RMSprop", "Adagrad", "NAdam", "RAdam", "Adamax"] as const;
export type OptimizerName = (typeof OPTIMIZER_NAMES)[number];

type HyperParameter = Exclude<keyof OptimizerConfig, "name" | "lr" | "implementation">;

const TITAN_ADAM = { eps: 1e-8, beta1: 0.9, beta2: 0.95, weight_decay: 0.1, amsgrad: false };
const TORCH_BETAS = { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0 };

/** The keys each optimizer reads, with the value each takes when the config leaves it out. */
const READS: Record<OptimizerName, Partial<Record<HyperParameter, number | boolean>>> = {
  AdamW: TITAN_ADAM,
  Adam: TITAN_ADAM,
  SGD: { momentum: 0.9, weight_decay: 0.1, dampening: 0, nesterov: false },
  RMSprop: { alpha: 0.99, eps: 1e-8, weight_decay: 0, momentum: 0, centered: false },
  Adagrad: { lr_decay: 0, weight_decay: 0, initial_accumulator_value: 0, eps: 1e-10 },
  NAdam: { ...TORCH_BETAS, momentum_decay: 4e-3, decoupled_weight_decay: false },
  RAdam: { ...TORCH_BETAS, decoupled_weight_decay: false },
  Adamax: TORCH_BETAS,
};

/**
 * Checks the [optimizer] keys the config gave against what `o.name` reads and fills the ones it left out (see the
 * file comment); `err` throws the config's error.
 */
export function resolveOptimizerConfig(o: OptimizerConfig, given: readonly string[], err: (msg: string) => never, warn: (msg: string) => void): void {
  const reads = READS[o.name];
  for (const key of given) {
    if (key === "name" || key === "lr" || key === "implementation" || key in reads) continue;
    const users = OPTIMIZER_NAMES.filter((n) => key in READS[n]);
    err(`[optimizer] ${key} is not a hyper-parameter of ${o.name} (it reads lr, ${Object.keys(reads).join(", ")}; ${key} is ${users.join(", ")}'s)`);
  }
  const config = o as unknown as Record<string, unknown>;
  for (const [key, value] of Object.entries(reads)) if (!given.includes(key)) config[key] = value;
  if (o.nesterov && (o.momentum <= 0 || o.dampening !== 0)) err(`[optimizer] nesterov needs momentum > 0 and dampening 0 (got momentum ${o.momentum}, dampening ${o.dampening})`);
  if (given.includes("implementation") && o.implementation !== "for-loop") warn(`[optimizer] implementation ${o.implementation}: no effect, the optimizer updates each parameter in one loop`);
}

/** The optimizer a resolved [optimizer] section names, over `params`. */
export function buildOptimizer(o: OptimizerConfig, params: readonly Tensor[]): Optimizer {
  const betas: [number, number] = [o.beta1, o.beta2];
  const { lr, eps, weight_decay: weightDecay } = o;
  switch (o.name) {
    case "AdamW":
      return new AdamW(params, { lr, betas, eps, weightDecay, amsgrad: o.amsgrad });
    case "Adam":
      return new Adam(params, { lr, betas, eps, weightDecay, amsgrad: o.amsgrad });
    case "SGD":
      return new SGD(params, { lr, momentum: o.momentum, dampening: o.dampening, nesterov: o.nesterov, weightDecay });
    case "RMSprop":
      return new RMSprop(params, { lr, alpha: o.alpha, eps, weightDecay, momentum: o.momentum, centered: o.centered });
    case "Adagrad":
      return new Adagrad(params, { lr, lrDecay: o.lr_decay, weightDecay, initialAccumulatorValue: o.initial_accumulator_value, eps });
    case "NAdam":
      return new NAdam(params, { lr, betas, eps, weightDecay, momentumDecay: o.momentum_decay, decoupledWeightDecay: o.decoupled_weight_decay });
    case "RAdam":
      return new RAdam(params, { lr, betas, eps, weightDecay, decoupledWeightDecay: o.decoupled_weight_decay });
    case "Adamax":
      return new Adamax(params, { lr, betas, eps, weightDecay });
  }
}
