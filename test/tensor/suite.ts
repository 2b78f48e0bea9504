// Shared helpers of the tensor tests: one suite per back end (STYLE.md 11), value comparison with tolerances.
import { afterEach, beforeEach, describe } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isBackendAvailable } from "../../src/backends/registry.js";
import { jitUnavailableReason } from "../../src/compile/index.js"; // installs the defer-and-fuse hook
import { device as deviceOf, flushDeferred, setEagerMode, type Tensor } from "../../src/tensor/index.js";
import { mulberry32 } from "../../src/util/random.js";

/** Back-end names the suites run on, in order; unavailable ones are reported as skipped. */
export const BACKENDS = ["reference", "cpu"] as const;

/** Extra suite variants: a back end run under a non-default eager mode. */
const MODE_VARIANTS = [{ device: "cpu", mode: "defer-and-fuse" }] as const;

/**
 * Runs `fn(deviceName)` inside one describe block per back end; skips back ends that cannot load here.
 * With `modes: true` (the op suites) it runs once more per MODE_VARIANTS entry, e.g. "[cpu+defer-and-fuse]"
 * with every test body under that eager mode, so each op test also runs deferred and must match strict.
 * `fn` learns the variant's mode through its second argument (to skip cases deferral cannot express).
 */
export function forEachBackend(fn: (device: string, mode?: "defer-and-fuse") => void, options: { modes?: boolean } = {}): void {
  for (const name of BACKENDS) {
    if (isBackendAvailable(name)) describe(`[${name}]`, () => fn(name));
    else describe(`[${name}]`, { skip: `back end "${name}" is unavailable on this machine` }, () => {});
  }
  if (!options.modes) return;
  for (const { device, mode } of MODE_VARIANTS) {
    const title = `[${device}+${mode}]`;
    const why = !isBackendAvailable(device) ? `back end "${device}" is unavailable on this machine` : jitUnavailableReason();
    if (why) {
      describe(title, { skip: why }, () => {});
      continue;
    }
    describe(title, () => {
      // private compile cache: deferred batches build C libraries on disk
      process.env.KILN_CACHE_DIR ??= mkdtempSync(join(tmpdir(), "kiln-suite-defer-"));
      beforeEach(() => setEagerMode(mode));
      afterEach(() => {
        flushDeferred();
        setEagerMode("strict");
      });
      fn(device, mode);
    });
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
export const prng = mulberry32;

/**
 * Asserts that `run` frees every buffer it allocates but the tensors it returns (which are then disposed): the
 * back end's liveBuffers() is back at its start. A first, unmeasured run warms defer-and-fuse (its programs and
 * arena stay allocated), and pending deferred work is flushed before each count.
 */
export function assertNoLeaks(device: string, name: string, run: () => (Tensor | null)[]): void {
  const backend = deviceOf(device).backend;
  for (const t of run()) t?.dispose();
  flushDeferred();
  const start = backend.liveBuffers();
  for (const t of run()) t?.dispose();
  flushDeferred();
  assert.equal(backend.liveBuffers(), start, `${name}: ${backend.liveBuffers() - start} buffers leaked`);
}

/** n seeded uniform numbers in [lo, hi). */
export function randomValues(n: number, seed: number, lo = -1.5, hi = 1.5): Float32Array {
  const r = prng(seed);
  return Float32Array.from({ length: n }, () => lo + (hi - lo) * r());
}
