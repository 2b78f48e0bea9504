// torch.nn's loss modules: each holds its options (reduction, weights, ...) and forward(input, target) calls the
// functional form (tensor/ops/losses.ts, cross-entropy.ts), so `new CrossEntropyLoss({ labelSmoothing: 0.1 })` reads as
// torch's nn.CrossEntropyLoss(label_smoothing=0.1).
import {
  binaryCrossEntropy, binaryCrossEntropyWithLogits, crossEntropy, huberLoss, klDiv, l1Loss, mseLoss, nllLoss, smoothL1Loss,
  type CrossEntropyOptions, type LossOptions, type NllLossOptions, type Tensor,
} from "../tensor/index.js";
import { Module } from "./module.js";

/** A loss module: options fixed at construction, forward(input, target) -> the loss. */
abstract class Loss<O> extends Module {
  constructor(readonly options: O) {
    super();
  }
  abstract forward(input: Tensor, target: Tensor): Tensor;
}

/** torch.nn.MSELoss. @example new MSELoss().forward(pred, y).backward() */
export class MSELoss extends Loss<LossOptions> {
  constructor(options: LossOptions = {}) {
    super(options);
  }
  forward(input: Tensor, target: Tensor): Tensor {
    return mseLoss(input, target, this.options);
  }
}

/** torch.nn.L1Loss. */
export class L1Loss extends Loss<LossOptions> {
  constructor(options: LossOptions = {}) {
    super(options);
  }
  forward(input: Tensor, target: Tensor): Tensor {
    return l1Loss(input, target, this.options);
  }
}

/** torch.nn.SmoothL1Loss (beta, default 1). */
export class SmoothL1Loss extends Loss<LossOptions & { beta?: number }> {
  constructor(options: LossOptions & { beta?: number } = {}) {
    super(options);
  }
  forward(input: Tensor, target: Tensor): Tensor {
    return smoothL1Loss(input, target, this.options);
  }
}

/** torch.nn.HuberLoss (delta, default 1). */
export class HuberLoss extends Loss<LossOptions & { delta?: number }> {
  constructor(options: LossOptions & { delta?: number } = {}) {
    super(options);
  }
  forward(input: Tensor, target: Tensor): Tensor {
    return huberLoss(input, target, this.options);
  }
}

/** torch.nn.CrossEntropyLoss over logits and class indices or probabilities (ignoreIndex, reduction, labelSmoothing). */
export class CrossEntropyLoss extends Loss<CrossEntropyOptions> {
  constructor(options: CrossEntropyOptions = {}) {
    super(options);
  }
  forward(input: Tensor, target: Tensor): Tensor {
    return crossEntropy(input, target, this.options);
  }
}

/** torch.nn.NLLLoss over log-probabilities (weight, ignoreIndex, reduction). */
export class NLLLoss extends Loss<NllLossOptions> {
  constructor(options: NllLossOptions = {}) {
    super(options);
  }
  forward(input: Tensor, target: Tensor): Tensor {
    return nllLoss(input, target, this.options);
  }
}

/** torch.nn.BCELoss over probabilities (weight, reduction). */
export class BCELoss extends Loss<LossOptions & { weight?: Tensor | null }> {
  constructor(options: LossOptions & { weight?: Tensor | null } = {}) {
    super(options);
  }
  forward(input: Tensor, target: Tensor): Tensor {
    return binaryCrossEntropy(input, target, this.options);
  }
}

/** torch.nn.BCEWithLogitsLoss (weight, posWeight, reduction). */
export class BCEWithLogitsLoss extends Loss<LossOptions & { weight?: Tensor | null; posWeight?: Tensor | null }> {
  constructor(options: LossOptions & { weight?: Tensor | null; posWeight?: Tensor | null } = {}) {
    super(options);
  }
  forward(input: Tensor, target: Tensor): Tensor {
    return binaryCrossEntropyWithLogits(input, target, this.options);
  }
}

/** torch.nn.KLDivLoss (input log-probabilities; reduction incl. "batchmean", logTarget). */
export class KLDivLoss extends Loss<{ reduction?: LossOptions["reduction"] | "batchmean"; logTarget?: boolean }> {
  constructor(options: { reduction?: LossOptions["reduction"] | "batchmean"; logTarget?: boolean } = {}) {
    super(options);
  }
  forward(input: Tensor, target: Tensor): Tensor {
    return klDiv(input, target, this.options);
  }
}
