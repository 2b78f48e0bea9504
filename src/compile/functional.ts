// Free ops that work on real Tensors (eager) and on traced Syms (compile/lazy): model code written
// against these runs unchanged in both worlds. Methods (x.add(y).silu()) already share names.
import * as k from "../tensor/index.js";
import { Tensor } from "../tensor/index.js";
import { OpError } from "../util/errors.js";
import * as tr from "./trace.js";
import { Sym } from "./trace.js";

export type AnyTensor = Tensor | Sym;

/** rms_norm over the last dim: x * rsqrt(mean(x^2) + eps) * weight. */
export function rmsNorm<T extends AnyTensor>(x: T, weight: AnyTensor, eps: number): T {
  if (x instanceof Sym) return tr.rmsNorm(x, weight, eps) as T;
  if (weight instanceof Sym) throw new OpError("rms_norm", "symbolic weight with an eager input");
  return k.rmsNorm(x as Tensor, weight, eps) as T;
}

/** x @ weight^T (nn.Linear's [out, in] weight layout). */
export function linear<T extends AnyTensor>(x: T, weight: AnyTensor): T {
  if (x instanceof Sym) return x.matmul(weight, true) as T;
  if (weight instanceof Sym) throw new OpError("linear", "symbolic weight with an eager input");
  return k.linear(x as Tensor, weight) as T;
}

/** silu(gate) * up, the gated MLP activation. */
export function siluMul<T extends AnyTensor>(gate: T, up: AnyTensor): T {
  if (gate instanceof Sym) return gate.silu().mul(up) as T;
  if (up instanceof Sym) return up.mul((gate as Tensor).silu()) as T;
  const s = (gate as Tensor).silu();
  const out = s.mul(up);
  s.dispose();
  return out as T;
}

export function where(cond: AnyTensor, a: AnyTensor | number, b: AnyTensor | number): AnyTensor {
  if (cond instanceof Sym || a instanceof Sym || b instanceof Sym) return tr.where(cond, a, b);
  return k.where(cond, a, b);
}

export function rotaryEmbedding<T extends AnyTensor>(x: T, positions: AnyTensor, cos: AnyTensor, sin: AnyTensor, neox = true): T {
  if (x instanceof Sym) return tr.rotaryEmbedding(x, positions, cos, sin, neox) as T;
  return k.rotaryEmbedding(x as Tensor, positions as Tensor, cos as Tensor, sin as Tensor, neox) as T;
}
