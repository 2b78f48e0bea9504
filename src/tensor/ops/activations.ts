// Activations and elementwise extras composed of differentiable ops: lerp, log1p, softplus, logSigmoid, hardtanh,
// leakyRelu, elu, clampMin / clampMax, and dropout.
import { isFloating } from "../../backends/dtype.js";
import { OpError } from "../../util/errors.js";
import { noGrad, recordOp } from "../grad-mode.js";
import { Tensor, type TensorOrScalar } from "../tensor.js";
import { add, clamp, div, eq, exp, gt, log, mul, sub, where } from "./elementwise.js";
import { rand, type Generator } from "./random.js";

/**
 * torch.lerp: a + weight * (b - a), broadcasting all three.
 * @example lerp(tensor([0, 10]), tensor([10, 20]), 0.5).toList() // [5, 15]
 */
export function lerp(a: Tensor, b: Tensor, weight: TensorOrScalar): Tensor {
  const diff = sub(b, a);
  const step = mul(diff, weight);
  const out = add(a, step);
  diff.dispose();
  step.dispose();
  return out;
}

/**
 * torch.log1p: log(1 + x), accurate where 1 + x rounds (|x| small): Goldberg's x * log(u) / (u - 1) with u = 1 + x,
 * or x itself where u rounds to 1. One autograd op (its backward 1 / (1 + x): backward/elementwise.ts).
 * @example log1p(tensor([1e-10])).item() // 1e-10 (log(1 + 1e-10) is 0 in float32)
 */
export function log1p(x: Tensor): Tensor {
  const out = noGrad(() => {
    const xf = isFloating(x.dtype) ? x : x.to("float32");
    const u = add(xf, 1);
    const d = sub(u, 1);
    const l = log(u);
    const ratio = div(xf, d);
    const scaled = mul(l, ratio);
    const rounded = eq(d, 0);
    const small = where(rounded, xf, scaled);
    // x = inf: inf / inf is NaN in the ratio; log1p(inf) = inf
    const infinite = eq(xf, Infinity);
    const r = where(infinite, xf, small);
    for (const t of [u, d, l, ratio, scaled, rounded, small, infinite]) t.dispose();
    if (xf !== x) xf.dispose();
    return r;
  });
  recordOp("log1p", [x], out);
  return out;
}

/**
 * torch.nn.functional.softplus: log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold. Computed as
 * log1p(exp(bx)) for bx <= 0 and bx + log1p(exp(-bx)) above: no exp overflows (each branch reads bx clamped to its
 * side, so the unused one stays finite and its zero gradient never meets inf), tiny results keep their precision,
 * and the gradient is sigmoid(beta * x) everywhere (1/2 at 0).
 */
export function softplus(x: Tensor, beta = 1, threshold = 20): Tensor {
  const bx = mul(x, beta);
  const positive = gt(bx, 0);
  const lo = clamp(bx, undefined, 0);
  const eLo = exp(lo);
  const below = log1p(eLo);
  const hi = clamp(bx, 0);
  const negHi = hi.neg();
  const eHi = exp(negHi);
  const tail = log1p(eHi);
  const above = add(hi, tail);
  const lse = where(positive, above, below);
  const soft = beta === 1 ? lse : lse.div(beta);
  const linear = gt(bx, threshold);
  const out = where(linear, x, soft);
  for (const t of new Set([bx, positive, lo, eLo, below, hi, negHi, eHi, tail, above, lse, soft, linear])) t.dispose();
  return out;
}

/** torch.nn.functional.logsigmoid: log(sigmoid(x)) = -softplus(-x), stable for large |x|. */
export function logSigmoid(x: Tensor): Tensor {
  const n = x.neg();
  const sp = softplus(n, 1, Infinity);
  const out = sp.neg();
  n.dispose();
  sp.dispose();
  return out;
}

/** torch.nn.functional.hardtanh: x clamped to [minVal, maxVal] (gradient 1 inside, bounds included). */
export function hardtanh(x: Tensor, minVal = -1, maxVal = 1): Tensor {
  if (minVal > maxVal) throw new OpError("hardtanh", `min_val cannot be greater than max_val (${minVal} > ${maxVal})`);
  return clamp(x, minVal, maxVal);
}

/** torch.clamp_min: max(x, min), gradient 1 where x >= min. */
export const clampMin = (x: Tensor, min: number): Tensor => clamp(x, min);
/** torch.clamp_max: min(x, max), gradient 1 where x <= max. */
export const clampMax = (x: Tensor, max: number): Tensor => clamp(x, undefined, max);

/** torch.nn.functional.leaky_relu: x where x > 0, else negativeSlope * x (gradient negativeSlope at 0, as torch). */
export function leakyRelu(x: Tensor, negativeSlope = 0.01): Tensor {
  const positive = gt(x, 0);
  const scaled = mul(x, negativeSlope);
  const out = where(positive, x, scaled);
  positive.dispose();
  scaled.dispose();
  return out;
}

/**
 * torch.nn.functional.elu: x where x > 0, else alpha * (exp(x) - 1). The exp reads min(x, 0), so a large x cannot
 * overflow into the unused branch (whose zero gradient would otherwise meet inf: NaN).
 */
export function elu(x: Tensor, alpha = 1): Tensor {
  const positive = gt(x, 0);
  const neg = clamp(x, undefined, 0);
  const e = exp(neg);
  const em1 = e.sub(1);
  const scaled = mul(em1, alpha);
  const out = where(positive, x, scaled);
  for (const t of [positive, neg, e, em1, scaled]) t.dispose();
  return out;
}

/**
 * torch.nn.functional.dropout: in training, zeroes each element with probability p (drawn from `generator`, default
 * the global one) and scales the rest by 1 / (1 - p); the gradient passes through the same mask and scale.
 * p = 0 or training = false returns an alias of x (a view sharing its storage and its gradient); p = 1 gives x * 0.
 * @example dropout(x, 0.1, model.training)
 */
export function dropout(x: Tensor, p = 0.5, training = true, generator?: Generator): Tensor {
  if (!(p >= 0 && p <= 1)) throw new OpError("dropout", `dropout probability has to be between 0 and 1, but got ${p}`);
  // an alias: a same-shape expand is a view for any strides, and its gradient passes straight through
  if (p === 0 || !training || x.numel === 0) return x.expand(x.shape);
  if (p === 1) return mul(x, 0);
  const scale = noGrad(() => {
    const u = rand(x.shape, { generator, device: x.device });
    const keep = u.lt(1 - p);
    const s = where(keep, 1 / (1 - p), 0);
    u.dispose();
    keep.dispose();
    if (s.dtype === x.dtype) return s;
    const cast = s.to(x.dtype);
    s.dispose();
    return cast;
  });
  const out = mul(x, scale);
  scale.dispose();
  return out;
}
