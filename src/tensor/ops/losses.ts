// torch.nn.functional losses composed of differentiable ops: mse, l1, smooth l1 / huber, nll, binary cross-entropy
// (on probabilities and, stably, on logits) and KL divergence. (cross_entropy: cross-entropy.ts, whose class-index
// conventions nllLoss follows.)
import { isFloating } from "../../backends/dtype.js";
import { IndexOutOfRangeError, OpError } from "../../util/errors.js";
import { sameDevice } from "../dispatch.js";
import { noGrad } from "../grad-mode.js";
import { tensor, Tensor } from "../tensor.js";
import { abs, add, clamp, exp, log, mul, sub, where } from "./elementwise.js";
import { gather } from "./indexing.js";
import { amax, amin, mean, sum } from "./reduce.js";
import { softplus } from "./activations.js";

export type LossReduction = "mean" | "sum" | "none";

export interface LossOptions {
  /** "mean" (default) over every element, "sum", or "none" (the elementwise losses). */
  reduction?: LossReduction;
}

function checkReduction(op: string, reduction: string, allowed: readonly string[] = ["mean", "sum", "none"]): void {
  if (!allowed.includes(reduction)) throw new OpError(op, `reduction must be ${allowed.map((r) => `"${r}"`).join(", ")}; got ${JSON.stringify(reduction)}`);
}

/** Reduces elementwise losses (disposed unless returned as they are). */
function reduceLoss(loss: Tensor, reduction: LossReduction): Tensor {
  if (reduction === "none") return loss;
  const out = reduction === "sum" ? sum(loss) : mean(loss);
  loss.dispose();
  return out;
}

/** f(input - target) reduced; input and target broadcast (torch warns on differing shapes, and broadcasts). */
function pointwise(op: string, input: Tensor, target: Tensor, reduction: LossReduction, f: (diff: Tensor) => Tensor): Tensor {
  checkReduction(op, reduction);
  sameDevice(op, input, target);
  const diff = sub(input, target);
  const loss = f(diff);
  diff.dispose();
  return reduceLoss(loss, reduction);
}

/**
 * torch.nn.functional.mse_loss: (input - target)^2, reduced.
 * @example mseLoss(tensor([1, 2]), tensor([1, 4])).item() // 2
 */
export const mseLoss = (input: Tensor, target: Tensor, { reduction = "mean" }: LossOptions = {}): Tensor =>
  pointwise("mse_loss", input, target, reduction, (d) => d.square());

/** torch.nn.functional.l1_loss: |input - target|, reduced. */
export const l1Loss = (input: Tensor, target: Tensor, { reduction = "mean" }: LossOptions = {}): Tensor =>
  pointwise("l1_loss", input, target, reduction, (d) => abs(d));

/** Huber's elementwise loss of d: 0.5 d^2 where |d| < delta, else delta * (|d| - delta / 2); divided by `scale`. */
function huber(d: Tensor, delta: number, scale: number): Tensor {
  const a = abs(d);
  const small = a.lt(delta);
  const quad = a.square();
  const q = quad.mul(0.5 / scale);
  const lin = a.sub(delta / 2);
  const l = delta === scale ? lin : lin.mul(delta / scale);
  const out = where(small, q, l);
  for (const t of new Set([a, small, quad, q, lin, l])) t.dispose();
  return out;
}

/** torch.nn.functional.smooth_l1_loss: 0.5 d^2 / beta where |d| < beta, else |d| - beta / 2 (beta = 0: l1). */
export function smoothL1Loss(input: Tensor, target: Tensor, { beta = 1, reduction = "mean" }: LossOptions & { beta?: number } = {}): Tensor {
  if (!(beta >= 0)) throw new OpError("smooth_l1_loss", `beta must be non-negative, got ${beta}`);
  return pointwise("smooth_l1_loss", input, target, reduction, (d) => (beta === 0 ? abs(d) : huber(d, beta, beta)));
}

/** torch.nn.functional.huber_loss: 0.5 d^2 where |d| < delta, else delta * (|d| - delta / 2). */
export function huberLoss(input: Tensor, target: Tensor, { delta = 1, reduction = "mean" }: LossOptions & { delta?: number } = {}): Tensor {
  if (!(delta > 0)) throw new OpError("huber_loss", `delta must be positive, got ${delta}`);
  return pointwise("huber_loss", input, target, reduction, (d) => huber(d, delta, 1));
}

export interface NllLossOptions extends LossOptions {
  /** Per-class weights [C] (not differentiated, as torch's); "mean" divides by the kept targets' total weight. */
  weight?: Tensor | null;
  /** Targets equal to it are skipped (default -100). */
  ignoreIndex?: number;
}

/**
 * torch.nn.functional.nll_loss: -logProbs[n, target[n]] * weight[target[n]] over input [C] (target []), [N, C]
 * (target [N]) or [N, C, d1, ...] (target [N, d1, ...]), classes along dim 1. "mean" divides by the total weight
 * of the targets not ignored; with every target ignored it gives 0 (as crossEntropy here; torch: NaN).
 * crossEntropy(x, t) equals nllLoss(logSoftmax(x, 1), t).
 * @example nllLoss(logSoftmax(logits, 1), targets, { ignoreIndex: 0 })
 */
export function nllLoss(logProbs: Tensor, target: Tensor, { weight = null, ignoreIndex = -100, reduction = "mean" }: NllLossOptions = {}): Tensor {
  const op = "nll_loss";
  checkReduction(op, reduction);
  if (logProbs.ndim === 0) throw new OpError(op, "Expected 1 or more dimensions (got 0)");
  if (!isFloating(logProbs.dtype)) throw new OpError(op, `expected floating log-probabilities, got ${logProbs.dtype}`);
  if (isFloating(target.dtype) || target.dtype === "bool") throw new OpError(op, `expected class indices of an integer dtype, got ${target.dtype}`);
  sameDevice(op, logProbs, target);
  const classDim = logProbs.ndim === 1 ? 0 : 1;
  const classes = logProbs.shape[classDim]!;
  const lossShape = logProbs.shape.filter((_, i) => i !== classDim);
  if (target.ndim !== lossShape.length || target.shape.some((s, i) => s !== lossShape[i]))
    throw new OpError(op, `expected target of shape [${lossShape.join(", ")}] for input [${logProbs.shape.join(", ")}], got [${target.shape.join(", ")}]`);
  if (weight && (weight.ndim !== 1 || weight.shape[0] !== classes))
    throw new OpError(op, `weight tensor should be defined either for all ${classes} classes or no classes but got weight tensor of shape: [${weight.shape.join(", ")}]`);
  const ids = Array.from(target.dataSync() as ArrayLike<number | bigint>, Number);
  for (const t of ids) if (t !== ignoreIndex && (t < 0 || t >= classes)) throw new IndexOutOfRangeError(op, `Target ${t} is out of bounds (${classes} classes)`);
  const classWeight = weight ? Array.from(weight.dataSync() as ArrayLike<number>, Number) : null;
  const w = Float32Array.from(ids, (t) => (t === ignoreIndex ? 0 : classWeight ? classWeight[t]! : 1));
  const totalWeight = w.reduce((a, b) => a + b, 0);
  const indexShape = logProbs.shape.map((s, i) => (i === classDim ? 1 : s));
  const index = tensor(Int32Array.from(ids, (t) => (t === ignoreIndex ? 0 : t)), { shape: indexShape, device: logProbs.device });
  const wt = tensor(w, { shape: lossShape, dtype: logProbs.dtype, device: logProbs.device });
  const picked = gather(logProbs, classDim, index);
  const flat = picked.reshape(lossShape);
  const weighted = mul(flat, wt);
  const perTarget = weighted.neg();
  for (const t of [index, wt, picked, flat, weighted]) t.dispose();
  if (reduction === "none") return perTarget;
  const total = sum(perTarget);
  perTarget.dispose();
  if (reduction === "sum") return total;
  const out = total.div(totalWeight === 0 ? 1 : totalWeight);
  total.dispose();
  return out;
}

export interface BceOptions extends LossOptions {
  /** Rescales each element's loss (broadcast to the input's shape). */
  weight?: Tensor | null;
}

function checkSameShape(op: string, input: Tensor, target: Tensor): void {
  sameDevice(op, input, target);
  if (input.ndim !== target.ndim || input.shape.some((s, i) => s !== target.shape[i]))
    throw new OpError(op, `Using a target size ([${target.shape.join(", ")}]) that is different to the input size ([${input.shape.join(", ")}]) is deprecated. Please ensure they have the same size.`);
}

/** loss * weight (loss disposed), or loss. */
function weighted(loss: Tensor, weight: Tensor | null | undefined): Tensor {
  if (!weight) return loss;
  const out = mul(loss, weight);
  loss.dispose();
  return out;
}

/**
 * torch.nn.functional.binary_cross_entropy on probabilities in [0, 1] (checked on the host, as torch):
 * -(t log p + (1 - t) log(1 - p)), each log clamped to >= -100 as torch does.
 */
export function binaryCrossEntropy(probs: Tensor, target: Tensor, { weight = null, reduction = "mean" }: BceOptions = {}): Tensor {
  const op = "binary_cross_entropy";
  checkReduction(op, reduction);
  checkSameShape(op, probs, target);
  if (probs.numel > 0) {
    const [lo, hi] = noGrad(() => [amin(probs), amax(probs)].map((t) => {
      const v = t.item();
      t.dispose();
      return v;
    }));
    if (!(lo! >= 0 && hi! <= 1)) throw new OpError(op, "all elements of input should be between 0 and 1");
  }
  const logP = log(probs);
  const logPc = clamp(logP, -100);
  const q = sub(1, probs);
  const logQ = log(q);
  const logQc = clamp(logQ, -100);
  const tc = sub(1, target);
  const a = mul(target, logPc);
  const b = mul(tc, logQc);
  const s = add(a, b);
  const loss = s.neg();
  for (const t of [logP, logPc, q, logQ, logQc, tc, a, b, s]) t.dispose();
  return reduceLoss(weighted(loss, weight), reduction);
}

/**
 * torch.nn.functional.binary_cross_entropy_with_logits: binaryCrossEntropy(sigmoid(x), t) computed stably as
 * (1 - t) x + (1 + (posWeight - 1) t) softplus(-x); posWeight (the positive class's weight) broadcasts against the
 * last dim.
 * @example binaryCrossEntropyWithLogits(logits, labels, { posWeight: tensor([3]) })
 */
export function binaryCrossEntropyWithLogits(
  logits: Tensor, target: Tensor, { weight = null, posWeight = null, reduction = "mean" }: BceOptions & { posWeight?: Tensor | null } = {},
): Tensor {
  const op = "binary_cross_entropy_with_logits";
  checkReduction(op, reduction);
  checkSameShape(op, logits, target);
  const tc = sub(1, target);
  const linear = mul(tc, logits);
  const negX = logits.neg();
  const sp = softplus(negX);
  let logWeight: Tensor | null = null;
  if (posWeight) {
    const pm1 = sub(posWeight, 1);
    const scaled = mul(pm1, target);
    logWeight = add(scaled, 1);
    pm1.dispose();
    scaled.dispose();
  }
  const spw = logWeight ? mul(sp, logWeight) : sp;
  const loss = add(linear, spw);
  for (const t of new Set([tc, linear, negX, sp, spw, ...(logWeight ? [logWeight] : [])])) t.dispose();
  return reduceLoss(weighted(loss, weight), reduction);
}

/**
 * torch.nn.functional.kl_div(input, target): input holds log-probabilities; target probabilities (log-probabilities
 * with logTarget). Elementwise target * (log target - input) (0 where target is 0), or exp(target) * (target -
 * input). "batchmean" divides the sum by the batch size (input.shape[0]), the true KL divergence; "mean" (torch's
 * default) by the element count.
 */
export function klDiv(input: Tensor, target: Tensor, { reduction = "mean", logTarget = false }: { reduction?: LossReduction | "batchmean"; logTarget?: boolean } = {}): Tensor {
  const op = "kl_div";
  checkReduction(op, reduction, ["mean", "batchmean", "sum", "none"]);
  sameDevice(op, input, target);
  let loss: Tensor;
  if (logTarget) {
    const p = exp(target);
    const diff = sub(target, input);
    loss = mul(p, diff);
    p.dispose();
    diff.dispose();
  } else {
    // xlogy(t, t): log reads 1 where t is 0 (a zero term, and no 0 * -inf in the gradient); a negative t stays NaN
    const zero = target.eq(0);
    const safe = where(zero, 1, target);
    const logT = log(safe);
    const diff = sub(logT, input);
    loss = mul(target, diff);
    for (const t of [zero, safe, logT, diff]) t.dispose();
  }
  if (reduction !== "batchmean") return reduceLoss(loss, reduction);
  const total = sum(loss);
  loss.dispose();
  if (input.ndim === 0) return total;
  const out = total.div(input.shape[0]!);
  total.dispose();
  return out;
}
