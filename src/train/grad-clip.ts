// Gradient clipping by global norm (torch.nn.utils.clip_grad_norm_).
import type { Tensor } from "../tensor/index.js";

/**
 * Scales every gradient in place by maxNorm / (total + 1e-6) when the total norm exceeds maxNorm, and
 * returns the total norm before clipping (L2 over all gradients together, or the max |g| for Infinity).
 * A non-finite total leaves the gradients as they are (the caller decides whether to skip the step).
 * @example const norm = clipGradNorm(model.parameters(), 1.0);
 */
export function clipGradNorm(params: readonly Tensor[], maxNorm: number, normType: 2 | number = 2): number {
  const grads = params.map((p) => p.grad).filter((g): g is Tensor => g !== null);
  let total: number;
  if (normType === Infinity) {
    total = 0;
    for (const g of grads) {
      const d = g.dataSync() as Float32Array;
      for (let i = 0; i < d.length; i++) total = Math.max(total, Math.abs(d[i]!));
    }
  } else {
    let acc = 0;
    for (const g of grads) {
      const d = g.dataSync() as Float32Array;
      if (normType === 2) for (let i = 0; i < d.length; i++) acc += d[i]! * d[i]!;
      else for (let i = 0; i < d.length; i++) acc += Math.pow(Math.abs(d[i]!), normType);
    }
    total = Math.pow(acc, 1 / normType);
  }
  if (!Number.isFinite(total)) return total;
  const coef = maxNorm / (total + 1e-6);
  if (coef < 1) for (const g of grads) g.mul_(coef);
  return total;
}
