// Shared functions for the compile tests and the cross-process cache child: each is written once against
// Tensor method names / compile/functional.ts, so the same code runs eagerly and traced.
import type { AnyTensor } from "../../src/compile/index.js";
import { linear, rmsNorm, siluMul } from "../../src/compile/index.js";

type T = any;  

/** A long elementwise chain with broadcasting, a comparison/where and a cast. */
export function chain(x: T, y: T): T {
  const a = x.mul(1.5).add(y).sub(0.25);
  const b = a.tanh().mul(a.sigmoid()).add(x.square().mul(0.1));
  const m = b.gt(0);
  return b.where(m, b.mul(0.01)).exp().log().abs().add(1).sqrt();
}

export function normScale(x: AnyTensor, w: AnyTensor, r: AnyTensor): AnyTensor {
  return (rmsNorm((x as T).add(r), w, 1e-6) as T).mul(0.5);
}

export function gatedMlp(x: T, wg: AnyTensor, wu: AnyTensor, wd: AnyTensor, wn: AnyTensor): T {
  const h = rmsNorm(x, wn, 1e-5);
  const g = siluMul(linear(h, wg), linear(h, wu));
  return linear(g, wd).add(x);
}
