// The moe kernel's slow, readable twin (STYLE.md 9): every (token, choice) pair runs its expert on that one row in
// float64, except quantized projections, whose products are quant_matmul's reference (which quantizes the
// activations as the native kernels do). Also the cpu back end's host path for layouts its native job lacks.
import type { KernelCall, MoeActivation, MoeProjectionView } from "../backend.js";
import { newScales, quantDataBytes, quantMatmulRef, quantScaleBytes, quantScaleCount } from "../cpu/quant-reference.js";
import { hostOf, readF64, writeDense } from "./host-memory.js";

type MoeCall = Extract<KernelCall, { op: "moe" }>;

/** y [n] = W x (+ bias) for one row x [k]; float weights are read once per call (`cache`). */
function project(p: MoeProjectionView, x: Float64Array, n: number, k: number, cache: Map<MoeProjectionView, Float64Array>): Float64Array {
  let y: Float64Array;
  if (p.quant) {
    const { scheme, scales, rowSums } = p.quant;
    const data = new Uint8Array(hostOf(p.w.buffer), p.w.offset, quantDataBytes(scheme, n, k)).slice();
    const count = quantScaleCount(scheme, n, k);
    const sb = quantScaleBytes(scheme);
    const sc = newScales(scheme, count, new Uint8Array(hostOf(scales.buffer), scales.offset * sb, count * sb).slice().buffer);
    const rs = rowSums ? new Int32Array(new Uint8Array(hostOf(rowSums.buffer), rowSums.offset * 4, n * 4).slice().buffer) : new Int32Array(0);
    y = Float64Array.from(quantMatmulRef(scheme, Float32Array.from(x), { data, scales: sc, rowSums: rs }, 1, n, k));
  } else {
    let w = cache.get(p);
    if (w === undefined) cache.set(p, (w = readF64(p.w)));
    y = new Float64Array(n);
    for (let i = 0; i < n; i++) {
      let dot = 0;
      for (let j = 0; j < k; j++) dot += w[i * k + j]! * x[j]!;
      y[i] = dot;
    }
  }
  if (p.bias) {
    const b = readF64(p.bias);
    for (let i = 0; i < n; i++) y[i] += b[i]!;
  }
  return y;
}

/** The expert activation of gate and up, in place into gate. */
export function moeActivate(act: MoeActivation, g: Float64Array, u: Float64Array): void {
  for (let i = 0; i < g.length; i++) {
    if (act.kind === "silu") {
      g[i] = (g[i]! / (1 + Math.exp(-g[i]!))) * u[i]!;
      continue;
    }
    const gc = Math.min(g[i]!, act.limit);
    const uc = Math.min(Math.max(u[i]!, -act.limit), act.limit);
    g[i] = (uc + 1) * (gc / (1 + Math.exp(-act.alpha * gc)));
  }
}

/** moe (see MoeArgs), one token's choice at a time. */
export function moeReference(call: MoeCall): void {
  const { t: T, h: H, inter: I, k: K, experts } = call;
  const x = readF64(call.x);
  const ids = readF64(call.ids);
  const w = readF64(call.weights);
  const out = new Float64Array(T * H);
  const cache = new Map<MoeProjectionView, Float64Array>();
  for (let t = 0; t < T; t++) {
    const xt = x.subarray(t * H, (t + 1) * H);
    for (let j = 0; j < K; j++) {
      const e = ids[t * K + j]!;
      if (!(e >= 0 && e < experts.length)) continue; // never trusted, as the native job
      const ex = experts[e]!;
      const g = project(ex.gate, xt, I, H, cache);
      moeActivate(call.act, g, project(ex.up, xt, I, H, cache));
      const y = project(ex.down, g, H, I, cache);
      for (let i = 0; i < H; i++) out[t * H + i] += w[t * K + j]! * y[i]!;
    }
  }
  writeDense(call.out, out);
}
