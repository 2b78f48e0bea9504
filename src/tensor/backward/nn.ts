// Backward formulas of the fused nn ops: rms_norm (closed form in device ops), flash attention (its backward
// kernel), rotary (the inverse rotation) and the fused cross-entropy (softmax - onehot).
import * as ew from "../ops/elementwise.js";
import { flashAttentionBackward, type FlashAttentionOptions } from "../ops/flash-attention.js";
import { rotaryEmbedding } from "../ops/nn-functional.js";
import { scatter } from "../ops/indexing.js";
import { mean, softmax, sum } from "../ops/reduce.js";
import { tensor, Tensor } from "../tensor.js";
import type { RuleTable } from "./types.js";

export const nnRules: RuleTable = {
  // y = x * r * w with r = (mean(x^2) + eps)^-1/2 per row:
  // dx = r * g*w - x * r^3 * mean(g*w*x);  dw = sum_rows g * x * r
  rms_norm: {
    saves: "inputs",
    // device ops in float32 (no host pass, so the backward stays queued on the device's stream)
    grad: (g, c) => {
      const x = c.inputs[0]!;
      const w = c.inputs[1]!;
      const eps = c.attrs.eps as number;
      const n = x.shape[x.ndim - 1]!;
      const temps: Tensor[] = [];
      const tmp = <T extends Tensor>(t: T): T => (temps.push(t), t);
      const rowsOf = (t: Tensor): Tensor => tmp((t.dtype === "float32" ? t : tmp(t.to("float32"))).reshape(-1, n));
      const xs = rowsOf(x);
      const gs = rowsOf(g);
      const ws = w.dtype === "float32" ? w : tmp(w.to("float32"));
      const r = tmp(ew.rsqrt(tmp(ew.add(tmp(mean(tmp(ew.square(xs)), -1, true)), eps)))); // [rows, 1]
      let dx: Tensor | null = null;
      if (c.needsGrad[0]) {
        const gw = tmp(ew.mul(gs, ws));
        const dot = tmp(sum(tmp(ew.mul(gw, xs)), -1, true));
        const k = tmp(ew.mul(tmp(ew.mul(tmp(ew.square(r)), r)), tmp(ew.div(dot, n)))); // r^3 * mean(g*w*x)
        const rows = tmp(ew.sub(tmp(ew.mul(gw, r)), tmp(ew.mul(xs, k))));
        dx = rows.reshape(x.shape);
      }
      const dw = c.needsGrad[1] ? sum(tmp(ew.mul(tmp(ew.mul(gs, xs)), r)), 0) : null;
      for (const t of new Set(temps)) if (t !== x && t !== g && t !== w && t !== dx) t.dispose();
      return [dx, dw];
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
  // device ops (no host pass over the [N, V] probabilities): scale * softmax, then -(1 - eps) * scale scattered in at
  // each row's target and eps / V * scale taken off every element
  grad: (g, c) => {
    const logits = c.inputs[0]!;
    const { targets, ignoreIndex, count, reduction, labelSmoothing } = c.attrs as {
      targets: Int32Array; ignoreIndex: number; count: number; reduction: "mean" | "sum" | "none"; labelSmoothing: number;
    };
    const [N, V] = logits.shape as [number, number];
    const device = logits.device;
    const temps: Tensor[] = [];
    const tmp = <T extends Tensor>(t: T): T => (temps.push(t), t);
    const x = logits.dtype === "float32" ? logits : tmp(logits.to("float32")); // a bf16 / f16 loss is computed in float32 too
    const up = g.dtype === "float32" ? g : tmp(g.to("float32"));
    const keep = tmp(tensor(Float32Array.from(targets, (t) => (t === ignoreIndex ? 0 : 1)), { shape: [N, 1], device }));
    // each row's scale: the upstream gradient's share of the row (0 on ignored rows; with count 0 every row is)
    const share = reduction === "none" ? tmp(up.reshape(N, 1)) : reduction === "sum" ? up : tmp(ew.div(up, Math.max(count, 1)));
    const scale = tmp(ew.mul(keep, share));
    const at = tmp(tensor(Int32Array.from(targets, (t) => (t === ignoreIndex ? 0 : t)), { shape: [N, 1], dtype: "int32", device }));
    // in place where it can: at most two [N, V] tensors live at once (the probabilities and the gradient)
    const scaled = tmp(softmax(x, -1)).mul_(scale);
    const grad = scatter(scaled, 1, at, tmp(ew.mul(scale, -(1 - labelSmoothing))), true);
    if (labelSmoothing > 0) grad.sub_(tmp(ew.mul(scale, labelSmoothing / V)));
    for (const t of new Set(temps)) if (t !== logits && t !== g) t.dispose();
    return [grad];
  },
};
