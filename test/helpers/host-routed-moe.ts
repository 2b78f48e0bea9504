// Kiln's MoE.forward before on-device routing, kept as the reference the on-device moe kernel is checked against
// (test/models/moe-device-routing.test.ts) and as bench/moe-decode.ts's baseline: the router's top-k read back to
// the host, each expert's GatedMLP run on its tokens, the weighted sum made on the host (and Qwen2-MoE's shared
// expert, scaled by sigmoid(shared_expert_gate(x)) on the host).
import type { MoE } from "../../src/nn/mlp.js";
import { empty, linear, softmax, tensor, topk, type Tensor } from "../../src/tensor/index.js";

/** x [T, hidden] -> [T, hidden], routed on the host (two host reads per layer and one per expert used). */
export function hostRoutedForward(moe: MoE, x: Tensor): Tensor {
  const T = x.shape[0]!;
  const { hidden: H, topK: k, normTopkProb } = moe.opts;
  const logits = linear(x, moe.gate.weight, moe.gate.bias);
  const probs = softmax(logits, -1);
  const { values, indices } = topk(probs, k, -1);
  const w = values.dataSync() as Float32Array;
  const ids = indices.dataSync() as Int32Array;
  for (const t of [logits, probs, values, indices]) t.dispose();
  const out = new Float32Array(T * H);
  const byExpert = new Map<number, { rows: number[]; weights: number[] }>();
  for (let t = 0; t < T; t++) {
    let norm = 1;
    if (normTopkProb) {
      norm = 0;
      for (let j = 0; j < k; j++) norm += w[t * k + j]!;
    }
    for (let j = 0; j < k; j++) {
      const entry = byExpert.get(ids[t * k + j]!) ?? { rows: [], weights: [] };
      entry.rows.push(t);
      entry.weights.push(w[t * k + j]! / norm);
      byExpert.set(ids[t * k + j]!, entry);
    }
  }
  for (const [e, { rows, weights }] of byExpert) {
    const idx = tensor(Int32Array.from(rows), { device: x.device });
    const xe = x.indexSelect(0, idx);
    const ye = moe.experts[e]!.forward(xe);
    const y = ye.dataSync() as Float32Array;
    for (let r = 0; r < rows.length; r++) for (let i = 0; i < H; i++) out[rows[r]! * H + i] += weights[r]! * y[r * H + i]!;
    for (const t of [idx, xe, ye]) t.dispose();
  }
  if (moe.sharedExpert !== null && moe.sharedExpertGate !== null) {
    const ys = moe.sharedExpert.forward(x);
    const gl = moe.sharedExpertGate.forward(x);
    const y = ys.dataSync() as Float32Array;
    const g = gl.dataSync() as Float32Array; // [T, 1]
    for (let t = 0; t < T; t++) for (let i = 0; i < H; i++) out[t * H + i] += y[t * H + i]! / (1 + Math.exp(-g[t]!));
    ys.dispose();
    gl.dispose();
  }
  const res = empty([T, H], { device: x.device });
  res.device.backend.write(res.storage.buffer, 0, new Uint8Array(out.buffer));
  return res;
}
