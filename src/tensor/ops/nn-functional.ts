// Neural-network ops: rms_norm, layer_norm, rotary embedding, attention (reference causal and ragged paged) and
// the silu-gated MLP activation (cross-entropy: cross-entropy.ts).
import { isFloating } from "../../backends/dtype.js";
import { OpError } from "../../util/errors.js";
import { runKernel, sameDevice } from "../dispatch.js";
import { inCheckpointRegion, isGradEnabled, recordOp } from "../grad-mode.js";
import { empty, numel, tensor, Tensor } from "../tensor.js";
import { flashAttention, flashAttentionRefusal } from "./flash-attention.js";
import { contiguous } from "./shape.js";
import { matmul, matmulAt, type QuantizedActivations } from "./linalg.js";
import { softmax } from "./reduce.js";
import { cat } from "./indexing.js";
import { add, mul, silu, where } from "./elementwise.js";
import { dropout } from "./activations.js";
import { repeatInterleave } from "./rearrange.js";
import type { Generator } from "./random.js";

function f32Contiguous(t: Tensor): Tensor {
  return contiguous(t.dtype === "float32" ? t : t.to("float32"));
}

/** rms_norm(x, weight, eps) over the last dim: x * rsqrt(mean(x^2) + eps) * weight. */
export function rmsNorm(x: Tensor, weight: Tensor, eps: number): Tensor {
  const n = x.shape[x.ndim - 1]!;
  if (weight.ndim !== 1 || weight.shape[0] !== n) throw new OpError("rms_norm", `weight [${weight.shape.join(", ")}] does not match last dim ${n}`);
  const dev = sameDevice("rms_norm", x, weight);
  const xc = f32Contiguous(x);
  const wc = f32Contiguous(weight);
  const out = empty(x.shape, { dtype: "float32", device: dev });
  runKernel("rms_norm", dev, { op: "rms_norm", x: xc.view_("rms_norm"), weight: wc.view_("rms_norm"), out: out.view_("rms_norm"), rows: numel(x.shape) / n, n, eps }, [out]);
  if (xc !== x) xc.dispose();
  if (wc !== weight) wc.dispose();
  recordOp("rms_norm", [x, weight], out, { eps });
  return out;
}

/**
 * rmsNorm(x, weight, eps) and its rows quantized for the quantized linears that read it (rms_norm fused with their
 * activation quantization: one kernel instead of one quantization per consumer). Inference only (no autograd).
 */
export function rmsNormQuantized(x: Tensor, weight: Tensor, eps: number): { out: Tensor; xq: QuantizedActivations } {
  const n = x.shape[x.ndim - 1]!;
  if (weight.ndim !== 1 || weight.shape[0] !== n) throw new OpError("rms_norm", `weight [${weight.shape.join(", ")}] does not match last dim ${n}`);
  const dev = sameDevice("rms_norm", x, weight);
  const rows = numel(x.shape) / n;
  const xc = f32Contiguous(x);
  const wc = f32Contiguous(weight);
  const out = empty(x.shape, { dtype: "float32", device: dev });
  const xq = { data: empty([rows, n], { dtype: "int8", device: dev }), scales: empty([rows], { dtype: "float32", device: dev }) };
  const v = (t: Tensor) => t.view_("rms_norm");
  runKernel("rms_norm", dev, { op: "rms_norm", x: v(xc), weight: v(wc), out: v(out), rows, n, eps, xq: { data: v(xq.data), scales: v(xq.scales) } }, [out, xq.data, xq.scales]);
  if (xc !== x) xc.dispose();
  if (wc !== weight) wc.dispose();
  return { out, xq };
}

/**
 * vLLM's fused_add_rms_norm: sum = x + residual and out = rmsNorm(sum, weight, eps) in one kernel, bit for bit
 * add() then rmsNorm() (a decoder layer's residual add and the next norm). With `quantize`, also out's rows
 * quantized as rmsNormQuantized quantizes them. x and residual: float32, one shape. Inference only (no autograd).
 */
export function addRmsNorm(
  x: Tensor, residual: Tensor, weight: Tensor, eps: number, quantize: boolean,
): { sum: Tensor; out: Tensor; xq: QuantizedActivations | null } {
  const op = "add_rms_norm";
  const n = x.shape[x.ndim - 1]!;
  if (x.dtype !== "float32" || residual.dtype !== "float32") throw new OpError(op, `x and residual must be float32, got ${x.dtype} and ${residual.dtype}`);
  if (x.shape.join() !== residual.shape.join()) throw new OpError(op, `x [${x.shape.join(", ")}] and residual [${residual.shape.join(", ")}] differ`);
  if (weight.ndim !== 1 || weight.shape[0] !== n) throw new OpError(op, `weight [${weight.shape.join(", ")}] does not match last dim ${n}`);
  const dev = sameDevice(op, x, residual, weight);
  const rows = numel(x.shape) / n;
  const xc = contiguous(x);
  const rc = contiguous(residual);
  const wc = f32Contiguous(weight);
  const sum = empty(x.shape, { dtype: "float32", device: dev });
  const out = empty(x.shape, { dtype: "float32", device: dev });
  const xq = quantize ? { data: empty([rows, n], { dtype: "int8", device: dev }), scales: empty([rows], { dtype: "float32", device: dev }) } : null;
  const v = (t: Tensor) => t.view_(op);
  const call = { op, x: v(xc), residual: v(rc), weight: v(wc), sum: v(sum), out: v(out), rows, n, eps } as const;
  if (xq) runKernel(op, dev, { ...call, xq: { data: v(xq.data), scales: v(xq.scales) } }, [sum, out, xq.data, xq.scales]);
  else runKernel(op, dev, call, [sum, out]);
  for (const [c, t] of [[xc, x], [rc, residual], [wc, weight]] as const) if (c !== t) c.dispose();
  return { sum, out, xq };
}

/**
 * siluMul(gate, up) (contiguous [..., n]) and its rows quantized for the quantized down projection that reads it
 * (silu·mul fused with that projection's activation quantization). Inference only (no autograd).
 */
export function siluMulQuantized(gate: Tensor, up: Tensor): { out: Tensor; xq: QuantizedActivations } {
  const op = "silu_mul";
  if (gate.shape.join() !== up.shape.join()) throw new OpError(op, `gate [${gate.shape.join(", ")}] and up [${up.shape.join(", ")}] differ`);
  const dev = sameDevice(op, gate, up);
  const n = gate.shape[gate.ndim - 1]!;
  const rows = numel(gate.shape) / n;
  const g = f32Contiguous(gate);
  const u = f32Contiguous(up);
  const out = empty(gate.shape, { dtype: "float32", device: dev });
  const xq = { data: empty([rows, n], { dtype: "int8", device: dev }), scales: empty([rows], { dtype: "float32", device: dev }) };
  const v = (t: Tensor) => t.view_(op);
  runKernel(op, dev, { op, gate: v(g), up: v(u), out: v(out), rows, n, xq: { data: v(xq.data), scales: v(xq.scales) } }, [out, xq.data, xq.scales]);
  if (g !== gate) g.dispose();
  if (u !== up) u.dispose();
  return { out, xq };
}

/** Frees quantized activations. */
export function disposeQuantizedActivations(xq: QuantizedActivations): void {
  xq.data.dispose();
  xq.scales.dispose();
}

/**
 * Rotary embedding on x [T, H, D] at integer positions [T], with cos/sin tables [maxPos, rotaryDim/2].
 * neox=true rotates (i, i + rotaryDim/2) pairs (HF Llama's rotate_half); false rotates (2i, 2i+1).
 */
export function rotaryEmbedding(x: Tensor, positions: Tensor, cos: Tensor, sin: Tensor, neox = true): Tensor {
  if (x.ndim !== 3) throw new OpError("rotary", `x must be [tokens, heads, head_dim], got [${x.shape.join(", ")}]`);
  const [T, H, D] = x.shape as [number, number, number];
  const rotaryDim = cos.shape[1]! * 2;
  if (rotaryDim > D) throw new OpError("rotary", `rotary dim ${rotaryDim} exceeds head dim ${D}`);
  if (positions.numel !== T) throw new OpError("rotary", `expected ${T} positions, got ${positions.numel}`);
  const dev = sameDevice("rotary", x, positions, cos, sin);
  const xc = f32Contiguous(x);
  const pos = positions.dtype === "int32" ? contiguous(positions) : positions.to("int32");
  const out = empty(x.shape, { dtype: "float32", device: dev });
  runKernel("rotary", dev, {
    op: "rotary",
    x: xc.view_("rotary"),
    positions: pos.view_("rotary"),
    cos: cos.view_("rotary"),
    sin: sin.view_("rotary"),
    out: out.view_("rotary"),
    tokens: T,
    heads: H,
    headDim: D,
    rotaryDim,
    neox,
  }, [out]);
  if (xc !== x) xc.dispose();
  if (pos !== positions) pos.dispose();
  recordOp("rotary", [x], out, { positions, cos, sin, neox });
  return out;
}

/** What {@link attentionBias} masks beyond causality. */
export interface AttentionMaskOptions {
  /** Sliding window: query position p sees keys j with p - window < j <= p. */
  window?: number;
  /** Spans [start, end) whose tokens see each other whatever the order (Gemma 3's image tokens). */
  bidirectionalSpans?: readonly (readonly [number, number])[];
  /**
   * Each token's document index, int32 [batch * S] row-major (S === Sk): a query sees only keys of its own document
   * (TorchTitan's block_causal). The bias is then per row, [batch, S, Sk].
   */
  documents?: Int32Array | null;
  batch?: number;
}

/**
 * The additive attention mask (0: visible, -1e30: hidden) of S queries aligned to the end of Sk keys: query i (at
 * key position p = i + Sk - S) sees keys j <= p, narrowed by a window and by documents, widened by bidirectional
 * spans. -1e30 is finite (debug mode stays quiet) and still gives exactly zero probability after the max-subtracted
 * exp. Returns [S, Sk], or [batch, S, Sk] with documents.
 * @example
 *   attentionBias(3, 3, { documents: Int32Array.of(0, 0, 1), batch: 1 }); // row 2 sees key 2 only
 */
export function attentionBias(S: number, Sk: number, o: AttentionMaskOptions = {}): Float32Array {
  const docs = o.documents ?? null;
  const rows = docs === null ? 1 : o.batch ?? 1;
  if (docs !== null && (Sk !== S || docs.length !== rows * S))
    throw new OpError("attention", `documents must hold batch x seq = ${rows} x ${S} ids for ${S} queries over ${Sk} keys, got ${docs.length}`);
  const bias = new Float32Array(rows * S * Sk);
  for (let b = 0; b < rows; b++) {
    const out = bias.subarray(b * S * Sk, (b + 1) * S * Sk);
    for (let i = 0; i < S; i++) {
      const p = i + (Sk - S);
      for (let j = 0; j < Sk; j++) {
        const hidden = j > p || (o.window !== undefined && j <= p - o.window) || (docs !== null && docs[b * S + j] !== docs[b * S + i]);
        if (hidden) out[i * Sk + j] = -1e30;
      }
    }
    // key positions j in the same span as query position p see each other (HF's or_masks of the causal mask and Gemma 3's image spans)
    for (const [a, e] of o.bidirectionalSpans ?? [])
      for (let i = 0; i < S; i++) {
        const p = i + (Sk - S);
        if (p >= a && p < e) for (let j = a; j < e; j++) out[i * Sk + j] = 0;
      }
  }
  return bias;
}

/** Scores of at least this many elements (64 MiB in f32) are not materialized even without autograd. */
const FLASH_MIN_SCORES = 1 << 24;

let flashSdp = true;

/**
 * torch.backends.cuda.enable_flash_sdp: false makes causalAttention and scaledDotProductAttention always compose
 * their ops (for comparisons; training then holds the [B, H, S, Sk] scores). Default true.
 */
export function enableFlashSdp(enabled: boolean): void {
  flashSdp = enabled;
}

/** torch.backends.cuda.flash_sdp_enabled. */
export function flashSdpEnabled(): boolean {
  return flashSdp;
}

/**
 * Whether causalAttention takes the flash kernels: whenever autograd records it (training: the composed form keeps
 * several [B, H, S, Sk] tensors alive until backward), in both passes of a checkpointed region (its forward runs
 * without history, its recomputation with it: one implementation for both), and for large scores. Small
 * inference-only attention keeps the composed form, which compile()'s dispatch capture and the eager modes take apart
 * op by op.
 */
function prefersFlash(q: Tensor, k: Tensor, v: Tensor, scores: number): boolean {
  if (!flashSdp) return false;
  if (inCheckpointRegion() || scores >= FLASH_MIN_SCORES) return true;
  return isGradEnabled() && (q.requiresGrad || k.requiresGrad || v.requiresGrad);
}

/** q [B, Hq, S, D] and k/v [B, Hkv, Sk, D]'s sizes, Hq a multiple of Hkv. */
function attentionShape(q: Tensor, k: Tensor, v: Tensor): { B: number; Hq: number; Hkv: number; S: number; Sk: number; D: number } {
  if (q.ndim !== 4 || k.ndim !== 4 || v.ndim !== 4) throw new OpError("attention", "q, k, v must be [batch, heads, seq, head_dim]");
  const [B, Hq, S, D] = q.shape as [number, number, number, number];
  const Hkv = k.shape[1]!;
  if (Hq % Hkv !== 0) throw new OpError("attention", `query heads ${Hq} not a multiple of kv heads ${Hkv}`);
  return { B, Hq, Hkv, S, Sk: k.shape[2]!, D };
}

/**
 * Reference causal attention (scaled_dot_product_attention with is_causal), built from ops so autograd
 * covers it. q [B, Hq, S, D], k/v [B, Hkv, S, D] (GQA repeats kv heads). Returns [B, Hq, S, D]. With `window`,
 * a query sees only the last `window` keys up to its own position (sliding-window attention, as HF and vLLM:
 * position p sees keys j with p - window < j <= p). With `softcap` (Gemma 2's attn_logit_softcapping), the scaled
 * scores s become softcap * tanh(s / softcap) before the mask, as HF and llama.cpp. With `sinks` ([Hq], gpt-oss), each
 * head's logit joins the softmax as one more column whose probability is dropped (HF's eager_attention_forward).
 * With `documents` (each token's document index per row, see {@link attentionBias}), a query sees only keys of its own
 * document (TorchTitan's block_causal mask over packed documents). Attention autograd records (training) or with large
 * scores runs the flash kernels (ops/flash-attention.ts: the scores never materialized); otherwise the ops are
 * composed ({@link composedCausalAttention}).
 */
export function causalAttention(
  q: Tensor, k: Tensor, v: Tensor, scale?: number, window?: number, softcap?: number | null, sinks?: Tensor | null,
  bidirectionalSpans?: readonly (readonly [number, number])[], documents?: Int32Array | null,
): Tensor {
  const { B, Hq, S, Sk, D } = attentionShape(q, k, v);
  const s = scale ?? 1 / Math.sqrt(D);
  const fused = { scale: s, window, softcap, bidirectionalSpans, documents, sinks };
  if (prefersFlash(q, k, v, B * Hq * S * Sk)) {
    if (flashAttentionRefusal(q, k, v, fused) === null) return flashAttention(q, k, v, fused);
    // bfloat16 / float16 training: the kernels run in float32 between two differentiable casts
    if (q.dtype !== "float32" && isFloating(q.dtype) && k.dtype === q.dtype && v.dtype === q.dtype) {
      const [qf, kf, vf] = [q, k, v].map((t) => t.to("float32")) as [Tensor, Tensor, Tensor];
      try {
        if (flashAttentionRefusal(qf, kf, vf, fused) === null) {
          const o = flashAttention(qf, kf, vf, fused);
          const back = o.to(q.dtype);
          o.dispose();
          return back;
        }
      } finally {
        for (const t of [qf, kf, vf]) t.dispose();
      }
    }
  }
  return composedCausalAttention(q, k, v, s, window, softcap, sinks, bidirectionalSpans, documents);
}

/**
 * causalAttention composed of ops (matmul, the additive mask, softmax, matmul), every intermediate materialized: the
 * form small inference-only attention takes, and the flash kernels' independent twin in tests.
 */
export function composedCausalAttention(
  q: Tensor, k: Tensor, v: Tensor, scale?: number, window?: number, softcap?: number | null, sinks?: Tensor | null,
  bidirectionalSpans?: readonly (readonly [number, number])[], documents?: Int32Array | null,
): Tensor {
  const { B, Hq, Hkv, S, Sk, D } = attentionShape(q, k, v);
  const s = scale ?? 1 / Math.sqrt(D);
  const rep = (t: Tensor) => {
    if (Hkv === Hq) return t;
    const u = t.unsqueeze(2);
    const e = u.expand(B, Hkv, Hq / Hkv, Sk, D);
    const r = e.reshape(B, Hq, Sk, D);
    u.dispose();
    e.dispose();
    return r;
  };
  const kr = rep(k);
  const vr = rep(v);
  const kt = kr.transpose(-2, -1);
  const raw = matmulAt(null, q, kt);
  let scores = raw.mul(s);
  if (softcap != null && softcap > 0) {
    const u = scores.div(softcap);
    const th = u.tanh();
    const capped = th.mul(softcap);
    for (const t of [scores, u, th]) t.dispose();
    scores = capped;
  }
  // the mask as an additive bias, [S, Sk] or per row [B, 1, S, Sk] (a native broadcast add; its backward passes the gradient through)
  const biasData = attentionBias(S, Sk, { window, bidirectionalSpans, documents, batch: B });
  const mask = empty(documents != null ? [B, 1, S, Sk] : [S, Sk], { dtype: "float32", device: q.device });
  q.device.backend.write(mask.storage.buffer, 0, new Uint8Array(biasData.buffer));
  const masked = add(scores, mask);
  let probs: Tensor;
  if (sinks) {
    // [B, Hq, S, Sk + 1]: the sink column's probability is computed, then dropped
    const col = sinks.view(1, Hq, 1, 1).expand(B, Hq, S, 1);
    const joined = cat([masked, col], -1);
    const all = softmax(joined, -1);
    const kept = all.narrow(-1, 0, Sk);
    probs = contiguous(kept);
    for (const t of [col, joined, all]) t.dispose();
    if (kept !== probs) kept.dispose();
  } else probs = softmax(masked, -1);
  // the output product is the op-level checkpoint policy's "attention" (torch's scaled_dot_product_attention)
  const out = matmulAt("attention", probs, vr);
  for (const t of [kt, raw, scores, mask, masked, probs]) t.dispose();
  if (kr !== k) kr.dispose();
  if (vr !== v) vr.dispose();
  return out;
}

/** torch.nn.functional.scaled_dot_product_attention's keyword arguments. */
export interface SdpaOptions {
  /**
   * bool (true: attend) or a floating-point bias added to the scores, broadcastable to [..., L, S]. Not with isCausal.
   */
  attnMask?: Tensor | null;
  /** Dropout on the attention weights (applied whenever > 0, as torch's functional form). */
  dropoutP?: number;
  /** Query i sees keys j <= i (torch's top-left aligned tril of ones(L, S)). */
  isCausal?: boolean;
  /** Default 1 / sqrt(E). */
  scale?: number;
  /** Query heads (dim -3) may be a multiple of the key/value heads: head h reads kv head h / (Hq / Hkv). */
  enableGqa?: boolean;
  /** Generator of the dropout draws (default: the global one). */
  generator?: Generator;
}

/**
 * torch.nn.functional.scaled_dot_product_attention: softmax(q k^T * scale + mask) v over query [..., L, E], key
 * [..., S, E], value [..., S, Ev] (batch dims broadcast), with torch's is_causal (top-left aligned), bool or additive
 * attn_mask, dropout_p and enable_gqa; fully masked rows give NaN, as torch's math backend does. Without a mask or
 * dropout, 4-d float32 attention that autograd records (or with large scores) runs the flash kernels.
 * @example
 *   const o = scaledDotProductAttention(q, k, v, { isCausal: true }); // q, k, v [B, H, L, E]
 */
export function scaledDotProductAttention(query: Tensor, key: Tensor, value: Tensor, o: SdpaOptions = {}): Tensor {
  const op = "scaled_dot_product_attention";
  if (query.ndim < 2 || key.ndim < 2 || value.ndim < 2) throw new OpError(op, "query, key and value must have at least 2 dims ([..., seq, features])");
  const [L, E] = query.shape.slice(-2) as [number, number];
  const [S, Ek] = key.shape.slice(-2) as [number, number];
  if (Ek !== E) throw new OpError(op, `query's last dim ${E} and key's ${Ek} differ`);
  if (value.shape[value.ndim - 2] !== S) throw new OpError(op, `key has ${S} positions, value ${value.shape[value.ndim - 2]}`);
  const Ev = value.shape[value.ndim - 1]!;
  if (o.isCausal && o.attnMask) throw new OpError(op, "_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True");
  const p = o.dropoutP ?? 0;
  if (!(p >= 0 && p <= 1)) throw new OpError(op, `dropout_p must be in [0, 1], got ${p}`);
  const scale = o.scale ?? 1 / Math.sqrt(E);
  const Hq = query.ndim >= 3 ? query.shape[query.ndim - 3]! : 1;
  const Hkv = key.ndim >= 3 ? key.shape[key.ndim - 3]! : 1;
  const gqa = query.ndim >= 3 && key.ndim >= 3 && Hq !== Hkv;
  if (gqa && !o.enableGqa) throw new OpError(op, `query has ${Hq} heads and key ${Hkv} (dim -3): pass enableGqa to repeat the key/value heads`);
  if (gqa && (Hq % Hkv !== 0 || value.shape[value.ndim - 3] !== Hkv)) throw new OpError(op, `query heads ${Hq} must be a multiple of the key/value heads ${Hkv}`);
  if (query.ndim === 4 && key.ndim === 4 && value.ndim === 4 && !o.attnMask && p === 0 && Ev === E && (!o.isCausal || L === S)) {
    // the flash kernels read GQA heads in place
    const flash = sdpaFlash(query, key, value, scale, o.isCausal ?? false);
    if (flash) return flash;
  }
  const k = gqa ? repeatInterleave(key, Hq / Hkv, key.ndim - 3) : key;
  const v = gqa ? repeatInterleave(value, Hq / Hkv, value.ndim - 3) : value;
  try {
    const kt = k.transpose(-2, -1);
    const raw = matmul(query, kt);
    let scores = raw.mul(scale);
    for (const t of [kt, raw]) t.dispose();
    const bias = o.isCausal ? causalBias(L, S, query) : o.attnMask ? maskBias(o.attnMask, query) : null;
    if (bias) {
      const masked = add(scores, bias);
      for (const t of [scores, bias]) t.dispose();
      scores = masked;
    }
    let weights = softmax(scores, -1);
    scores.dispose();
    if (p > 0) {
      const dropped = dropout(weights, p, true, o.generator);
      weights.dispose();
      weights = dropped;
    }
    const out = matmul(weights, v);
    weights.dispose();
    return out;
  } finally {
    if (k !== key) k.dispose();
    if (v !== value) v.dispose();
  }
}

/** The flash kernels for unmasked 4-d attention, when causalAttention's rule picks them (null: compose). */
function sdpaFlash(q: Tensor, k: Tensor, v: Tensor, scale: number, causal: boolean): Tensor | null {
  const [B, H, L] = q.shape as [number, number, number];
  const S = k.shape[2]!;
  // not causal: every query inside one span over all the keys
  const fused = { scale, bidirectionalSpans: causal ? [] : [[0, S] as const] };
  if (!prefersFlash(q, k, v, B * H * L * S) || flashAttentionRefusal(q, k, v, fused) !== null) return null;
  return flashAttention(q, k, v, fused);
}

/** torch's is_causal bias: 0 where j <= i, -inf above (top-left aligned), [L, S]. */
function causalBias(L: number, S: number, like: Tensor): Tensor {
  const data = new Float32Array(L * S);
  for (let i = 0; i < L; i++) for (let j = i + 1; j < S; j++) data[i * S + j] = -Infinity;
  return tensor(data, { shape: [L, S], device: like.device });
}

/** A bool mask as a 0 / -inf bias; a float mask as itself (a copy the caller may dispose). */
function maskBias(mask: Tensor, like: Tensor): Tensor {
  if (mask.dtype === "bool") return where(mask, 0, -Infinity);
  if (!isFloating(mask.dtype)) throw new OpError("scaled_dot_product_attention", `attn_mask must be bool or floating point, got ${mask.dtype}`);
  if (mask.device !== like.device) throw new OpError("scaled_dot_product_attention", `attn_mask is on ${mask.device.name}, query on ${like.device.name}`);
  return mask.expand(mask.shape);
}

/** Rotary applied inside paged attention: positions int32 [T], cos/sin [maxPos, rotaryDim/2] (as rotaryEmbedding). */
export interface PagedRotaryArgs {
  positions: Tensor;
  cos: Tensor;
  sin: Tensor;
  neox: boolean;
}

/**
 * Ragged paged attention (see PagedAttentionArgs); writes k/v into the caches, returns [T, Hq, D]. With `rotary`,
 * q and k are un-rotated and the kernel rotates them itself (rotary fused with the KV write): the same result as
 * rotaryEmbedding() on q and k first.
 */
export function pagedAttention(args: {
  q: Tensor; k: Tensor; v: Tensor; kCache: Tensor; vCache: Tensor;
  slotMapping: Tensor; blockTables: Tensor; queryStart: Tensor; seqLens: Tensor;
  scale: number; slidingWindow?: number; rotary?: PagedRotaryArgs | null;
  /** Attention logit soft-capping (Gemma 2): scores s -> softcap * tanh(s / softcap) before the mask; 0 / absent: none. */
  softcap?: number | null;
  /** Attention sinks (gpt-oss): [Hq] logits, one per query head, joined to each softmax denominator; absent: none. */
  sinks?: Tensor | null;
  /**
   * Every query row of a sequence attends as its last position does: all the sequence's keys (an encoder's full
   * attention), or the last slidingWindow of them. Absent: causal.
   */
  bidirectional?: boolean;
}): Tensor {
  const { q, k, v, kCache, vCache } = args;
  const [T, Hq, D] = q.shape as [number, number, number];
  const Hkv = k.shape[1]!;
  const blockSize = kCache.shape[1]!;
  const numSeqs = args.seqLens.numel;
  const maxBlocksPerSeq = args.blockTables.shape[1]!;
  const dev = sameDevice("paged_attention", q, k, v, kCache, vCache);
  const softcap = args.softcap ?? 0;
  if (!Number.isFinite(softcap) || softcap < 0) throw new OpError("paged_attention", `softcap must be a finite number >= 0, got ${softcap}`);
  if (args.sinks && (args.sinks.numel !== Hq || args.sinks.device !== dev))
    throw new OpError("paged_attention", `sinks must be [${Hq}] (one per query head) on ${dev.name}, got [${args.sinks.shape.join(", ")}]`);
  const qc = f32Contiguous(q);
  const kc = f32Contiguous(k);
  const vc = f32Contiguous(v);
  const sinks = args.sinks ? f32Contiguous(args.sinks) : null;
  const out = empty([T, Hq, D], { dtype: "float32", device: dev });
  const rot = args.rotary ? pagedRotaryViews(args.rotary, T, D) : null;
  runKernel("paged_attention", dev, {
    op: "paged_attention",
    q: qc.view_("paged_attention"),
    kNew: kc.view_("paged_attention"),
    vNew: vc.view_("paged_attention"),
    kCache: kCache.view_("paged_attention"),
    vCache: vCache.view_("paged_attention"),
    slotMapping: args.slotMapping.view_("paged_attention"),
    blockTables: args.blockTables.view_("paged_attention"),
    queryStart: args.queryStart.view_("paged_attention"),
    seqLens: args.seqLens.view_("paged_attention"),
    out: out.view_("paged_attention"),
    numSeqs,
    numHeads: Hq,
    numKvHeads: Hkv,
    headDim: D,
    blockSize,
    maxBlocksPerSeq,
    scale: args.scale,
    slidingWindow: args.slidingWindow ?? 0,
    softcap,
    ...(sinks ? { sinks: sinks.view_("paged_attention") } : {}),
    ...(rot ? { rotary: rot.views } : {}),
    ...(args.bidirectional ? { bidirectional: true } : {}),
  }, [out]);
  for (const [c, t] of [[qc, q], [kc, k], [vc, v]] as const) if (c !== t) c.dispose();
  if (sinks && sinks !== args.sinks) sinks.dispose();
  rot?.dispose();
  return out;
}

function pagedRotaryViews(r: PagedRotaryArgs, T: number, D: number) {
  const op = "paged_attention";
  const rotaryDim = r.cos.shape[1]! * 2;
  if (r.cos.ndim !== 2 || r.sin.ndim !== 2 || r.sin.shape[1] !== r.cos.shape[1]) throw new OpError(op, "rotary cos/sin must be [maxPos, rotaryDim/2]");
  if (rotaryDim > D) throw new OpError(op, `rotary dim ${rotaryDim} exceeds head dim ${D}`);
  if (r.positions.numel !== T) throw new OpError(op, `expected ${T} rotary positions, got ${r.positions.numel}`);
  const pos = r.positions.dtype === "int32" ? contiguous(r.positions) : r.positions.to("int32");
  const cos = f32Contiguous(r.cos);
  const sin = f32Contiguous(r.sin);
  const views = { positions: pos.view_(op), cos: cos.view_(op), sin: sin.view_(op), rotaryDim, neox: r.neox };
  const dispose = () => {
    if (pos !== r.positions) pos.dispose();
    if (cos !== r.cos) cos.dispose();
    if (sin !== r.sin) sin.dispose();
  };
  return { views, dispose };
}

/** silu(gate) * up: the SwiGLU activation of Llama-family MLPs. */
export function siluMul(gate: Tensor, up: Tensor): Tensor {
  const g = silu(gate);
  const out = mul(g, up);
  g.dispose();
  return out;
}

/**
 * torch.nn.functional.layer_norm: x normalised over its trailing `normalizedShape` dims (mean removed, divided by
 * sqrt(biased variance + eps)), then scaled by weight and shifted by bias where given (each of normalizedShape).
 * Composed of differentiable ops, so autograd reaches x, weight and bias.
 */
export function layerNorm(x: Tensor, normalizedShape: number | readonly number[], weight: Tensor | null = null, bias: Tensor | null = null, eps = 1e-5): Tensor {
  const op = "layer_norm";
  const norm = typeof normalizedShape === "number" ? [normalizedShape] : [...normalizedShape];
  const k = norm.length;
  const tail = x.shape.slice(x.ndim - k);
  if (k === 0 || k > x.ndim || norm.some((d, i) => d !== tail[i]))
    throw new OpError(op, `normalized_shape [${norm.join(", ")}] must be a non-empty suffix of the input's shape [${x.shape.join(", ")}]`);
  if (!isFloating(x.dtype)) throw new OpError(op, `expected a floating input, got ${x.dtype}`);
  if (!(eps >= 0)) throw new OpError(op, `eps must be >= 0, got ${eps}`);
  for (const [name, t] of [["weight", weight], ["bias", bias]] as const)
    if (t !== null && (t.ndim !== k || t.shape.some((d, i) => d !== norm[i])))
      throw new OpError(op, `${name} of shape [${t.shape.join(", ")}] does not match normalized_shape [${norm.join(", ")}]`);
  const dims = Array.from({ length: k }, (_, i) => x.ndim - k + i);
  const mu = x.mean(dims, true);
  const centered = x.sub(mu);
  const sq = centered.square();
  const variance = sq.mean(dims, true);
  const inv = variance.add(eps).rsqrt();
  let out = centered.mul(inv);
  for (const t of [mu, sq, variance, inv, centered]) t.dispose();
  if (weight !== null) {
    const scaled = out.mul(weight);
    out.dispose();
    out = scaled;
  }
  if (bias !== null) {
    const shifted = out.add(bias);
    out.dispose();
    out = shifted;
  }
  return out;
}
