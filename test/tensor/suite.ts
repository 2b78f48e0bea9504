// Shared helpers of the tensor tests: one suite per back end (STYLE.md 11), value comparison with tolerances.
import { describe } from "node:test";
import assert from "node:assert/strict";
import { isBackendAvailable } from "../../src/backends/registry.js";
import type { Tensor } from "../../src/tensor/index.js";

/** Back-end names the suites run on, in order; unavailable ones are reported as skipped. */
export const BACKENDS = ["reference", "cpu"] as const;

/** Runs `fn(deviceName)` inside one describe block per back end; skips back ends that cannot load here. */
export function forEachBackend(fn: (device: string) => void): void {
  for (const name of BACKENDS) {
    if (isBackendAvailable(name)) describe(`[${name}]`, () => fn(name));
    else describe(`[${name}]`, { skip: `back end "${name}" is unavailable on this machine` }, () => {});
  }
}

/** Elements of a tensor as plain numbers, row-major. */
export function values(t: Tensor): number[] {
  return t.toList();
}

/**
 * Asserts |actual - expected| <= atol + rtol * |expected| elementwise (NaN matches NaN, +-Inf match exactly).
 * Shapes are compared when `actual` is a tensor and `shape` is given.
 */
export function assertClose(actual: Tensor | ArrayLike<number>, expected: ArrayLike<number>, opts: { rtol?: number; atol?: number; shape?: readonly number[]; msg?: string } = {}): void {
  const { rtol = 1e-5, atol = 1e-6, msg = "" } = opts;
  let got: ArrayLike<number>;
  if (typeof (actual as Tensor).toList === "function") {
    const t = actual as Tensor;
    if (opts.shape) assert.deepEqual([...t.shape], [...opts.shape], `${msg} shape`);
    got = t.toList();
  } else got = actual as ArrayLike<number>;
  assert.equal(got.length, expected.length, `${msg} length ${got.length} != ${expected.length}`);
  for (let i = 0; i < expected.length; i++) {
    const a = got[i]!;
    const e = expected[i]!;
    if (Number.isNaN(e)) {
      assert.ok(Number.isNaN(a), `${msg} [${i}]: expected NaN, got ${a}`);
      continue;
    }
    if (!Number.isFinite(e)) {
      assert.equal(a, e, `${msg} [${i}]`);
      continue;
    }
    assert.ok(Math.abs(a - e) <= atol + rtol * Math.abs(e), `${msg} [${i}]: got ${a}, expected ${e} (rtol ${rtol}, atol ${atol})`);
  }
}

/** mulberry32: a tiny seeded PRNG so property tests are reproducible. */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
