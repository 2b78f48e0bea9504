// The flash_attention kernels' slow, readable twin (STYLE.md 9): each query row's scores over its visible keys in
// float64, a plain softmax, and the backward's textbook formulas, no tiles. The mask is attentionBias's
// (ops/nn-functional.ts), restated per key: causal from the row's position, a window, documents, bidirectional spans.
import type { FlashAttentionShape, KernelCall } from "../backend.js";
import { readF64, writeDense } from "./host-memory.js";

type Forward = Extract<KernelCall, { op: "flash_attention" }>;
type Backward = Extract<KernelCall, { op: "flash_attention_backward" }>;

/** Whether query row i of batch row b sees key j. */
function visible(p: FlashAttentionShape, docs: Float64Array | null, b: number, i: number, j: number): boolean {
  const pos = i + p.keys - p.seq;
  for (const [a, e] of p.spans) if (pos >= a && pos < e && j >= a && j < e) return true;
  if (j > pos) return false;
  if (p.window > 0 && j <= pos - p.window) return false;
  return docs === null || docs[b * p.seq + j] === docs[b * p.seq + i];
}

/**
 * Calls fn(bh, kvBase, i, probs, scores' cap derivative) for every query row: probs over the row's keys (0 where
 * hidden), from scores scale * q.k (soft-capped).
 */
function forEachRow(
  p: FlashAttentionShape, q: Float64Array, k: Float64Array,
  fn: (bh: number, kvBase: number, i: number, probs: Float64Array, gate: Float64Array, lse: number, h: number) => void,
): void {
  const { batch: B, heads: H, kvHeads: Hkv, seq: S, keys: Sk, headDim: D } = p;
  const docs = p.docs === null ? null : readF64(p.docs);
  const sinks = p.sinks === null ? null : readF64(p.sinks);
  const probs = new Float64Array(Sk);
  const gate = new Float64Array(Sk);
  for (let b = 0; b < B; b++)
    for (let h = 0; h < H; h++) {
      const bh = b * H + h;
      const kvBase = (b * Hkv + Math.floor(h / (H / Hkv))) * Sk * D;
      for (let i = 0; i < S; i++) {
        let max = -Infinity;
        for (let j = 0; j < Sk; j++) {
          if (!visible(p, docs, b, i, j)) {
            probs[j] = -Infinity;
            continue;
          }
          let dot = 0;
          for (let d = 0; d < D; d++) dot += q[(bh * S + i) * D + d]! * k[kvBase + j * D + d]!;
          let s = dot * p.scale;
          gate[j] = 1;
          if (p.softcap > 0) {
            const th = Math.tanh(s / p.softcap);
            s = p.softcap * th;
            gate[j] = 1 - th * th;
          }
          probs[j] = s;
          max = Math.max(max, s);
        }
        // a sink is one more column of the softmax whose value row is zero
        const sink = sinks === null ? null : sinks[h]!;
        if (sink !== null) max = Math.max(max, sink);
        let sum = sink === null ? 0 : Math.exp(sink - max);
        for (let j = 0; j < Sk; j++) sum += probs[j] === -Infinity ? 0 : Math.exp(probs[j]! - max);
        for (let j = 0; j < Sk; j++) probs[j] = probs[j] === -Infinity ? 0 : Math.exp(probs[j]! - max) / sum;
        fn(bh, kvBase, i, probs, gate, max + Math.log(sum), h);
      }
    }
}

export function flashAttentionReference(p: Forward): void {
  const { seq: S, keys: Sk, headDim: D } = p;
  const q = readF64(p.q);
  const k = readF64(p.k);
  const v = readF64(p.v);
  const out = new Float64Array(q.length);
  const lse = new Float64Array(q.length / D);
  forEachRow(p, q, k, (bh, kvBase, i, probs, _gate, l) => {
    lse[bh * S + i] = l;
    for (let j = 0; j < Sk; j++) {
      if (probs[j] === 0) continue;
      for (let d = 0; d < D; d++) out[(bh * S + i) * D + d] += probs[j]! * v[kvBase + j * D + d]!;
    }
  });
  writeDense(p.out, out);
  writeDense(p.lse, lse);
}

/**
 * dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dP P)) times the cap's derivative and the scale; dQ = dS K, dK = dS^T Q;
 * a sink's gradient -sum over its head's rows of P(sink) rowsum(dP P).
 */
export function flashAttentionBackwardReference(p: Backward): void {
  const { seq: S, keys: Sk, headDim: D } = p;
  const q = readF64(p.q);
  const k = readF64(p.k);
  const v = readF64(p.v);
  const dout = readF64(p.dout);
  const dq = new Float64Array(q.length);
  const dk = new Float64Array(k.length);
  const dv = new Float64Array(v.length);
  const dp = new Float64Array(Sk);
  const sinks = p.sinks === null ? null : readF64(p.sinks);
  const dsinks = new Float64Array(p.heads);
  forEachRow(p, q, k, (bh, kvBase, i, probs, gate, lse, h) => {
    const row = (bh * S + i) * D;
    let rowDot = 0;
    for (let j = 0; j < Sk; j++) {
      let s = 0;
      for (let d = 0; d < D; d++) s += dout[row + d]! * v[kvBase + j * D + d]!;
      dp[j] = s;
      rowDot += probs[j]! * s;
    }
    // the sink's probability times (its value row's dP, 0, minus rowDot)
    if (sinks !== null) dsinks[h] -= Math.exp(sinks[h]! - lse) * rowDot;
    for (let j = 0; j < Sk; j++) {
      const pj = probs[j]!;
      if (pj === 0) continue;
      const ds = pj * (dp[j]! - rowDot) * gate[j]! * p.scale;
      for (let d = 0; d < D; d++) {
        dv[kvBase + j * D + d] += pj * dout[row + d]!;
        dq[row + d] += ds * k[kvBase + j * D + d]!;
        dk[kvBase + j * D + d] += ds * q[row + d]!;
      }
    }
  });
  writeDense(p.dq, dq);
  writeDense(p.dk, dk);
  writeDense(p.dv, dv);
  if (p.dsinks !== null) writeDense(p.dsinks, dsinks);
}
