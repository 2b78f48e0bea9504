// Dense attention without materialized scores (the flash_attention kernels: native/flash-attention-impl.inc on cpu,
// backends/reference/flash-attention-reference.ts on reference): causalAttention's result and gradients, holding
// O(S) memory per head instead of the [B, H, S, Sk] scores, probabilities and their gradients. The forward saves its
// output and each row's log-sum-exp; the backward recomputes the probabilities tile by tile from them.
import type { FlashAttentionShape } from "../../backends/backend.js";
import { OpError } from "../../util/errors.js";
import { runKernel, sameDevice } from "../dispatch.js";
import { recordOp } from "../grad-mode.js";
import { sacSites } from "../selective-checkpoint.js";
import { empty, tensor, Tensor } from "../tensor.js";
import { contiguous } from "./shape.js";

/** The mask and scores of {@link flashAttention}: see causalAttention (ops/nn-functional.ts). */
export interface FlashAttentionOptions {
  scale: number;
  /** Sliding window (>= 1): query position p sees keys j with p - window < j <= p. */
  window?: number;
  /** Scores s become softcap * tanh(s / softcap) (Gemma 2); absent or 0: none. */
  softcap?: number | null;
  bidirectionalSpans?: readonly (readonly [number, number])[];
  /** Each token's document index, int32 [batch * seq] (keys === seq). */
  documents?: Int32Array | null;
  /** Attention sinks (gpt-oss): float32 [Hq], one logit per query head joined to each row's softmax; differentiable. */
  sinks?: Tensor | null;
}

/** The kernel's shape fields; `views` are the contiguous f32 operands (q, k, v). */
function shapeOf(
  q: Tensor, k: Tensor, o: FlashAttentionOptions, docs: Tensor | null, sinks: Tensor | null,
): Omit<FlashAttentionShape, "q" | "k" | "v" | "docs"> & { docsView: FlashAttentionShape["docs"] } {
  const [B, H, S, D] = q.shape as [number, number, number, number];
  return {
    batch: B, heads: H, kvHeads: k.shape[1]!, seq: S, keys: k.shape[2]!, headDim: D, scale: o.scale, softcap: o.softcap ?? 0,
    window: o.window ?? 0, spans: o.bidirectionalSpans ?? [], docsView: docs === null ? null : docs.view_("flash_attention"),
    sinks: sinks === null ? null : sinks.view_("flash_attention"),
  };
}

/**
 * Why {@link flashAttention} cannot take these operands (null: it can). q [B, Hq, S, D], k/v [B, Hkv, Sk, D], all
 * float32; Sk >= S; a window of at least 1.
 */
export function flashAttentionRefusal(q: Tensor, k: Tensor, v: Tensor, o: FlashAttentionOptions): string | null {
  if (q.ndim !== 4 || k.ndim !== 4 || v.ndim !== 4) return "q, k, v must be [batch, heads, seq, head_dim]";
  if (q.dtype !== "float32" || k.dtype !== "float32" || v.dtype !== "float32") return "q, k, v must be float32";
  const [B, Hq, S, D] = q.shape as [number, number, number, number];
  const [Bk, Hkv, Sk, Dk] = k.shape as [number, number, number, number];
  if (Bk !== B || Dk !== D || v.shape.join() !== k.shape.join()) return `k [${k.shape.join(", ")}] and v [${v.shape.join(", ")}] do not match q [${q.shape.join(", ")}]`;
  if (Hq % Hkv !== 0) return `query heads ${Hq} not a multiple of kv heads ${Hkv}`;
  if (Sk < S) return `${Sk} keys for ${S} queries (queries are the last positions)`;
  if (o.window !== undefined && !(Number.isInteger(o.window) && o.window >= 1)) return `window must be an integer >= 1, got ${o.window}`;
  if (o.documents != null && (Sk !== S || o.documents.length !== B * S)) return `documents must hold batch x seq = ${B} x ${S} ids`;
  if (o.softcap != null && !(Number.isFinite(o.softcap) && o.softcap >= 0)) return `softcap must be a finite number >= 0, got ${o.softcap}`;
  for (const [a, e] of o.bidirectionalSpans ?? [])
    if (!(Number.isInteger(a) && Number.isInteger(e) && a >= 0 && a <= e && e <= Sk)) return `span [${a}, ${e}) outside [0, ${Sk}]`;
  if (o.sinks != null && (o.sinks.dtype !== "float32" || o.sinks.numel !== Hq || o.sinks.device !== q.device))
    return `sinks must be float32 [${Hq}] on ${q.device.name}, got ${o.sinks.dtype} [${o.sinks.shape.join(", ")}]`;
  return null;
}

/**
 * causalAttention (scaled_dot_product_attention with is_causal and the masks described there) computed tile by tile
 * with an online softmax: [B, Hq, S, D], differentiable in q, k, v (and sinks).
 * @example
 *   const o = flashAttention(q, k, v, { scale: 1 / Math.sqrt(64) }); // q [1, 8, 512, 64], k/v [1, 2, 512, 64]
 */
export function flashAttention(q: Tensor, k: Tensor, v: Tensor, o: FlashAttentionOptions): Tensor {
  const why = flashAttentionRefusal(q, k, v, o);
  if (why !== null) throw new OpError("flash_attention", why);
  const dev = sameDevice("flash_attention", q, k, v);
  const docs = o.documents != null ? tensor(o.documents, { device: dev }) : null;
  const [B, H, S, D] = q.shape as [number, number, number, number];
  // the op-level checkpoint policy's "attention": under it a recomputation gets the forward's out and lse back
  // (without contiguous copies of its operands)
  const [out, lse] = sacSites("attention", [q, k, v], () => {
    const [qc, kc, vc] = [q, k, v].map((t) => contiguous(t)) as [Tensor, Tensor, Tensor];
    const sinks = o.sinks != null ? contiguous(o.sinks) : null;
    const out = empty([B, H, S, D], { dtype: "float32", device: dev });
    const lse = empty([B, H, S], { dtype: "float32", device: dev });
    const { docsView, ...dims } = shapeOf(q, k, o, docs, sinks);
    const view = (t: Tensor) => t.view_("flash_attention");
    runKernel("flash_attention", dev, { op: "flash_attention", q: view(qc), k: view(kc), v: view(vc), docs: docsView, ...dims, out: view(out), lse: view(lse) }, [out]);
    if (sinks !== null && sinks !== o.sinks) sinks.dispose();
    for (const [c, t] of [[qc, q], [kc, k], [vc, v]] as const) if (c !== t) c.dispose();
    return [out, lse];
  }) as [Tensor, Tensor];
  recordOp("flash_attention", [q, k, v, o.sinks ?? null], out, { lse, docs, options: o });
  lse.dispose();
  docs?.dispose();
  return out;
}

/**
 * flashAttention's gradients from its saved operands: dq, dk, dv (and the sinks', or null) for the output gradient
 * g. `lse` and `docs` are the tensors the forward recorded; `sinks` its saved sinks.
 */
export function flashAttentionBackward(
  g: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, docs: Tensor | null, o: FlashAttentionOptions, sinks: Tensor | null = null,
): [Tensor, Tensor, Tensor, Tensor | null] {
  const dev = sameDevice("flash_attention_backward", g, q, k, v, out, lse);
  const c = [q, k, v, out, g].map((t) => contiguous(t.dtype === "float32" ? t : t.to("float32")));
  const dq = empty(q.shape, { dtype: "float32", device: dev });
  const dk = empty(k.shape, { dtype: "float32", device: dev });
  const dv = empty(v.shape, { dtype: "float32", device: dev });
  const sc = sinks === null ? null : contiguous(sinks);
  const dsinks = sc === null ? null : empty(sc.shape, { dtype: "float32", device: dev });
  const { docsView, ...dims } = shapeOf(q, k, o, docs, sc);
  const view = (t: Tensor) => t.view_("flash_attention_backward");
  runKernel("flash_attention_backward", dev, {
    op: "flash_attention_backward", q: view(c[0]!), k: view(c[1]!), v: view(c[2]!), o: view(c[3]!), dout: view(c[4]!), lse: view(lse),
    docs: docsView, ...dims, dq: view(dq), dk: view(dk), dv: view(dv), dsinks: dsinks === null ? null : view(dsinks),
  }, [dq, dk, dv]);
  [q, k, v, out, g].forEach((t, i) => {
    if (c[i] !== t) c[i]!.dispose();
  });
  if (sc !== null && sc !== sinks) sc.dispose();
  return [dq, dk, dv, dsinks];
}
