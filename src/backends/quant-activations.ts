// quant_matmul's activation quantization on the host, shared by the reference back end's kernel and the cpu back
// end's TS reference: per row, symmetric int8 with xs = amax / 127 and round-half-even codes, as the native
// quantizeRows computes it (bit for bit).

/** C's nearbyint under the default rounding mode (ties to even), as the native kernels round. */
export function roundHalfEven(x: number): number {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** Rows x [m, k] (f32 values) -> int8 codes [m, k] and per-row scales [m]. */
export function quantizeActivationsRef(x: ArrayLike<number>, m: number, k: number): { xq: Int8Array; xs: Float32Array } {
  const xq = new Int8Array(m * k);
  const xs = new Float32Array(m);
  for (let r = 0; r < m; r++) {
    let amax = 0;
    for (let i = 0; i < k; i++) amax = Math.max(amax, Math.abs(x[r * k + i]!));
    xs[r] = Math.fround(amax / 127);
    const inv = amax > 0 ? Math.fround(127 / amax) : 0;
    for (let i = 0; i < k; i++) xq[r * k + i] = roundHalfEven(Math.fround(x[r * k + i]! * inv));
  }
  return { xq, xs };
}
