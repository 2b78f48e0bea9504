// Shared timing helper for the benchmarks.

/** Best mean time (ms) over a few batches of calls sized to ~targetMs: robust to noisy neighbours. */
export function timeIt(f: () => void, targetMs = 250, batches = 4): number {
  f();
  const t0 = performance.now();
  f();
  const once = Math.max(performance.now() - t0, 1e-3);
  const reps = Math.max(1, Math.min(2000, Math.round(targetMs / batches / once)));
  let best = Infinity;
  for (let b = 0; b < batches; b++) {
    const s = performance.now();
    for (let i = 0; i < reps; i++) f();
    best = Math.min(best, (performance.now() - s) / reps);
  }
  return best;
}
