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

/**
 * The read-bandwidth probe's 256 MiB (far past the caches), written (untouched pages would read as the zero page) and
 * on huge pages where the addon can allocate them, as the serving setup keeps weights: a probe on 4 KiB pages read
 * 55 vs 61 GB/s in this VM's fast regime (38 vs 39 in the slow one), which would flatter every roofline ratio.
 */
export function bandwidthProbe(native: { allocHugeMemory?: (byteLength: number) => ArrayBuffer }): Float32Array {
  const floats = 64 << 20;
  const a = native.allocHugeMemory ? new Float32Array(native.allocHugeMemory(floats * 4)) : new Float32Array(floats);
  return a.fill(1);
}
