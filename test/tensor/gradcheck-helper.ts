// gradcheck: an op's analytical gradient (autograd) against central finite differences of L = sum(out * R), R a
// fixed random tensor, accumulated in float64 on the host (shared by the op test files).
//
// Tolerance: the forward runs in float32. Central differences with step h have truncation error
// O(h^2 * f''') ~ 1e-4 for h = 1e-2 and O(1) inputs, and rounding error ~ 1e-7 * |L| / h ~ 1e-5 * |L|;
// so an element passes when |analytic - numeric| <= 3e-3 + 2e-2 * |numeric|.
// Non-smooth ops (relu, abs, max, maximum) get inputs at least 0.1 away from kinks and ties (> h).
import assert from "node:assert/strict";
import * as k from "../../src/tensor/index.js";
import type { Tensor } from "../../src/tensor/index.js";
import { mulberry32 } from "../../src/util/random.js";

const H = 1e-2;
const ATOL = 3e-3;
const RTOL = 2e-2;
/** At most this many elements per input are probed numerically (all of them are checked for shape). */
const MAX_PROBES = 48;

/** Deterministic uniform numbers so failures reproduce. */
const rng = mulberry32;

export interface Input {
  shape: number[];
  /** How values are drawn: normal-ish in [-1.5, 1.5] by default. */
  kind?: "any" | "positive" | "awayFromZero" | "distinct" | "unit";
}

function values(spec: Input, r: () => number): Float32Array {
  const n = spec.shape.reduce((a, b) => a * b, 1);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const u = r() * 2 - 1;
    switch (spec.kind ?? "any") {
      case "any":
        out[i] = 1.5 * u;
        break;
      case "positive":
        out[i] = 0.5 + 1.5 * r();
        break;
      case "awayFromZero":
        out[i] = (u < 0 ? -1 : 1) * (0.15 + 1.2 * Math.abs(u));
        break;
      case "distinct":
        out[i] = 0;
        break;
      case "unit":
        out[i] = 0.1 + 0.8 * r();
        break;
    }
  }
  if (spec.kind === "distinct") {
    // a shuffled ladder with spacing 0.1 (> 2h): no ties within h of each other
    const idx = Array.from({ length: n }, (_, i) => i);
    for (let i = n - 1; i > 0; i--) {
      const j = Math.floor(r() * (i + 1));
      [idx[i], idx[j]] = [idx[j]!, idx[i]!];
    }
    idx.forEach((v, i) => (out[i] = (v - n / 2) * 0.1));
  }
  return out;
}

/** L = sum(out * R) in float64. */
function probe(out: Tensor, weights: Float64Array): number {
  const d = out.dataSync() as Float32Array;
  let s = 0;
  for (let i = 0; i < d.length; i++) s += d[i]! * weights[i]!;
  return s;
}

/** Checks every input's gradient (on `device`, default the default device); the inputs are leaves drawn from specs. */
export function gradcheck(name: string, specs: Input[], fn: (...xs: Tensor[]) => Tensor, seed = 1, device?: string): void {
  const r = rng(seed);
  const data = specs.map((s) => values(s, r));
  const leaves = data.map((d, i) => k.tensor(d, { shape: specs[i]!.shape, requiresGrad: true, device }));
  const out = fn(...leaves);
  const weights = Float64Array.from({ length: out.numel }, () => r() * 2 - 1);
  const wt = k.tensor(Float32Array.from(weights), { shape: out.shape, device });
  out.mul(wt).sum().backward();
  const evalAt = (i: number, j: number, delta: number) =>
    k.noGrad(() => {
      const xs = data.map((d, m) => {
        const copy = Float32Array.from(d);
        if (m === i) copy[j] = copy[j]! + delta;
        return k.tensor(copy, { shape: specs[m]!.shape, device });
      });
      return probe(fn(...xs), weights);
    });
  leaves.forEach((leaf, i) => {
    assert.ok(leaf.grad, `${name}: input ${i} got no gradient`);
    assert.deepEqual([...leaf.grad.shape], specs[i]!.shape, `${name}: grad shape of input ${i}`);
    const analytic = leaf.grad.dataSync() as Float32Array;
    const n = data[i]!.length;
    const probes = n <= MAX_PROBES ? Array.from({ length: n }, (_, j) => j) : Array.from({ length: MAX_PROBES }, () => Math.floor(r() * n));
    for (const j of probes) {
      const numeric = (evalAt(i, j, H) - evalAt(i, j, -H)) / (2 * H);
      const a = analytic[j]!;
      assert.ok(
        Math.abs(a - numeric) <= ATOL + RTOL * Math.abs(numeric),
        `${name}: d/dx${i}[${j}] analytic ${a} vs numeric ${numeric}`,
      );
    }
  });
}
