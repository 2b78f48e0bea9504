// Backward formulas of the fused nn ops: rms_norm (closed form, one host pass), flash attention (its backward
// kernel), rotary (the inverse rotation) and the fused cross-entropy (softmax - onehot).
import * as ew from "../ops/elementwise.js";
import { flashAttentionBackward, type FlashAttentionOptions } from "../ops/flash-attention.js";
import { rotaryEmbedding } from "../ops/nn-functional.js";
import { softmax } from "../ops/reduce.js";
import { tensor, Tensor } from "../tensor.js";
import type { RuleTable } from "./types.js";

export const nnRules: RuleTable = {
  // y = x * r * w with r = (mean(x^2) + eps)^-1/2 per row:
  // dx = r * g*w - x * r^3 * mean(g*w*x);  dw = sum_rows g * x * r
  rms_norm: {
    saves: "inputs",
    grad: (g, c) => {
      const x = c.inputs[0]!;
      const w = c.inputs[1]!;
      const eps = c.attrs.eps as number;
      const n = x.shape[x.ndim - 1]!;
      const xs = x.dataSync() as Float32Array;
      const ws = w.dataSync() as Float32Array;
      const gs = g.dataSync() as Float32Array;
      const rows = xs.length / n;
      const dx = c.needsGrad[0] ? new Float32Array(xs.length) : null;
      const dw = c.needsGrad[1] ? new Float64Array(n) : null;
      for (let r = 0; r < rows; r++) {
        const o = r * n;
        let ss = 0;
        let dot = 0;
        for (let i = 0; i < n; i++) {
          const xi = xs[o + i]!;
          ss += xi * xi;
          dot += gs[o + i]! * ws[i]! * xi;
        }
        const inv = 1 / Math.sqrt(ss / n + eps);
        if (dx) {
          const k = (inv * inv * inv * dot) / n;
          for (let i = 0; i < n; i++) dx[o + i] = inv * gs[o + i]! * ws[i]! - xs[o + i]! * k;
        }
        if (dw) for (let i = 0; i < n; i++) dw[i] += gs[o + i]! * xs[o + i]! * inv;
      }
      return [
        dx ? tensor(dx, { shape: x.shape, device: x.device }) : null,
        dw ? tensor(Float32Array.from(dw), { shape: w.shape, device: w.device }) : null,
      ];
    },
  },
  // FlashAttention-2's backward: the probabilities recomputed tile by tile from the saved log-sum-exp
  flash_attention: {
    saves: "both",
    grad: (g, c) => {
      const [q, k, v, sinks] = c.inputs as (Tensor | null)[];
      const { lse, docs, options } = c.attrs as { lse: Tensor; docs: Tensor | null; options: FlashAttentionOptions };
      const grads = flashAttentionBackward(g, q!, k!, v!, c.output!, lse, docs, options, sinks ?? null);
      return grads.map((t, i) => {
        if (t === null || c.needsGrad[i]) return t;
        t.dispose();
        return null;
      });
    },
  },
  // rotation by -theta: the same kernel with sin negated (pass-through dims stay identity)
  rotary: {
    saves: "none",
    grad: (g, c) => {
      const { positions, cos, sin, neox } = c.attrs as { positions: Tensor; cos: Tensor; sin: Tensor; neox: boolean };
      const negSin = ew.neg(sin);
      const out = rotaryEmbedding(g, positions, cos, negSin, neox);
      negSin.dispose();
      return [out];
    },
  },
};

/**
 * cross_entropy(logits [N, V], class-index targets [N]; ops/cross-entropy.ts): d/dlogits row i = scale_i *
 * (softmax(logits) - q_i), q_i = (1 - eps) * onehot(target_i) + eps / V; scale_i = g / count (mean), g (sum) or
 * g[i] (none); 0 on ignored rows.
 */
nnRules.cross_entropy = {
  saves: "inputs",
  grad: (g, c) => {
    const logits = c.inputs[0]!;
    const { targets, ignoreIndex, count, reduction, labelSmoothing } = c.attrs as {
      targets: Int32Array; ignoreIndex: number; count: number; reduction: "mean" | "sum" | "none"; labelSmoothing: number;
    };
    const [N, V] = logits.shape as [number, number];
    const x = logits.to("float32"); // a bf16 / f16 loss is computed in float32 too
    const p = softmax(x, -1);
    const probs = Float32Array.from(p.dataSync() as Float32Array);
    p.dispose();
    if (x !== logits) x.dispose();
    const upstream = g.dataSync() as Float32Array;
    const uniform = labelSmoothing / V;
    for (let i = 0; i < N; i++) {
      const o = i * V;
      const t = targets[i]!;
      if (t === ignoreIndex) {
        probs.fill(0, o, o + V);
        continue;
      }
      const scale = reduction === "none" ? upstream[i]! : reduction === "sum" ? upstream[0]! : upstream[0]! / count;
      probs[o + t] = probs[o + t]! - (1 - labelSmoothing);
      for (let j = 0; j < V; j++) probs[o + j] = (probs[o + j]! - uniform) * scale;
    }
    return [tensor(probs, { shape: logits.shape, device: logits.device })];
  },
};
