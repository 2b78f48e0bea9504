// matmul with torch's broadcasting rules, bmm, and linear (x @ W^T + b, W in nn.Linear's [out, in] layout).
import type { QuantScheme } from "../../backends/backend.js";
import { quantDataBytes, quantKMultiple, quantScaleCount, quantScaleDtype } from "../../backends/quant-layout.js";
import { OpError, UnsupportedError } from "../../util/errors.js";
import { runKernel, sameDevice } from "../dispatch.js";
import { recordOp } from "../grad-mode.js";
import { sacSite, type SacOp } from "../selective-checkpoint.js";
import { empty, emptyOutput, numel, Tensor } from "../tensor.js";
import { broadcastShapes, contiguous } from "./shape.js";
import { add } from "./elementwise.js";

/** Batched product of contiguous [..., M, K] and [..., K, N] (or [..., N, K] when bTransposed). */
function batchedMatmul(op: string, a: Tensor, b: Tensor, bTransposed: boolean): Tensor {
  const dev = sameDevice(op, a, b);
  const M = a.shape[a.ndim - 2]!;
  const K = a.shape[a.ndim - 1]!;
  const N = bTransposed ? b.shape[b.ndim - 2]! : b.shape[b.ndim - 1]!;
  const Kb = bTransposed ? b.shape[b.ndim - 1]! : b.shape[b.ndim - 2]!;
  if (K !== Kb) throw new OpError(op, `shapes [${a.shape.join(", ")}] and [${b.shape.join(", ")}] cannot be multiplied (${K} != ${Kb})`);
  const batchA = a.shape.slice(0, -2);
  const batchB = b.shape.slice(0, -2);
  let batch: number[];
  try {
    batch = broadcastShapes(op, batchA, batchB);
  } catch {
    throw new OpError(op, `batch dimensions of [${a.shape.join(", ")}] and [${b.shape.join(", ")}] cannot be broadcast ([${batchA.join(", ")}] vs [${batchB.join(", ")}])`);
  }
  const nb = numel(batch);
  // every path below writes all of out, but with K = 0 only a zeroed out is the right (empty-sum) result
  const out = (K > 0 ? emptyOutput : empty)([...batch, M, N], { dtype: "float32", device: dev });
  if (a.ndim === 2 && b.ndim === 2 && a.dtype === "float32" && !a.isContiguous && a.strides[0] === 1 && a.strides[1] === M) {
    // a is the transpose of a dense [K, M] matrix (x.T @ y, as in a weight gradient): no transposed copy
    const cb2 = contiguous(b.dtype === "float32" || b.dtype === "bfloat16" ? b : b.to("float32"));
    const av = { ...a.view_(op), shape: [K, M], strides: [M, 1] };
    runKernel(op, dev, { op: "matmul", a: av, b: cb2.view_(op), out: out.view_(op), batch: 1, m: M, n: N, k: K, bTransposed, aTransposed: true, strideA: 0, strideB: 0, strideOut: 0 }, [out]);
    if (cb2 !== b) cb2.dispose();
    return out;
  }
  const ca = contiguous(a.dtype === "float32" ? a : a.to("float32"));
  // weights may stay bf16 (native bf16 GEMM); anything else is widened
  const cb = contiguous(b.dtype === "float32" || b.dtype === "bfloat16" ? b : b.to("float32"));
  // batch broadcasting with stride 0 works when one side has no batch or a full batch
  const strideFor = (bs: readonly number[], size: number) => (numel(bs) === nb ? size : numel(bs) === 1 ? 0 : -1);
  const sA = strideFor(batchA, M * K);
  const sB = strideFor(batchB, K * N);
  if (sA < 0 || sB < 0) {
    // general broadcast: materialise both sides at the full batch
    const xa = ca.expand(...batch, M, K);
    const xb = cb.expand(...batch, ...cb.shape.slice(-2));
    const ea = xa.contiguous();
    const eb = xb.contiguous();
    const r = batchedMatmul(op, ea, eb, bTransposed);
    for (const x of new Set([xa, xb, ea, eb, ca, cb])) if (x !== a && x !== b) x.dispose();
    out.dispose();
    return r;
  }
  runKernel(op, dev, {
    op: "matmul",
    a: ca.view_(op),
    b: cb.view_(op),
    out: out.view_(op),
    batch: nb,
    m: M,
    n: N,
    k: K,
    bTransposed,
    strideA: sA,
    strideB: sB,
    strideOut: M * N,
  }, [out]);
  if (ca !== a) ca.dispose();
  if (cb !== b) cb.dispose();
  return out;
}

/** torch.matmul: 1-d operands are promoted and squeezed back; batch dims broadcast. */
export function matmul(a: Tensor, b: Tensor): Tensor {
  return matmulAt("mm", a, b);
}

/**
 * matmul(a, b) as the selective-checkpoint site `site` (selective-checkpoint.ts), or as none (null): causalAttention
 * names its output product "attention" and keeps its score product out of the policy, as torch's attention op does.
 */
export function matmulAt(site: SacOp | null, a: Tensor, b: Tensor): Tensor {
  if (a.ndim === 0 || b.ndim === 0) throw new OpError("matmul", "both arguments must be at least 1-d");
  const product = () => {
    const a2 = a.ndim === 1 ? a.unsqueeze(0) : a;
    const b2 = b.ndim === 1 ? b.unsqueeze(1) : b;
    let out = batchedMatmul("matmul", a2, b2, false);
    if (a2 !== a) a2.dispose();
    if (b2 !== b) b2.dispose();
    const squeezeOut = (dim: number) => {
      const s = out.squeeze(dim);
      out.dispose();
      out = s;
    };
    if (a.ndim === 1) squeezeOut(-2);
    if (b.ndim === 1) squeezeOut(-1);
    return out;
  };
  const out = site === null ? product() : sacSite(site, [a, b], product);
  recordOp("matmul", [a, b], out);
  return out;
}

export function bmm(a: Tensor, b: Tensor): Tensor {
  if (a.ndim !== 3 || b.ndim !== 3) throw new OpError("bmm", "expects 3-d tensors");
  if (a.shape[0] !== b.shape[0]) throw new OpError("bmm", `batch sizes differ (${a.shape[0]} vs ${b.shape[0]})`);
  return matmul(a, b);
}

/**
 * linear(x, W, b) = x @ W^T + b with W [out, in]; x [..., in]. W may be bfloat16. `xq` (x already quantized, from
 * rmsNormQuantized) is used when W reads through a quantized shadow, else ignored.
 */
export function linear(x: Tensor, weight: Tensor, bias?: Tensor | null, xq?: QuantizedActivations | null): Tensor {
  const shadow = quantizedShadows.get(weight);
  if (shadow) return quantizedLinear(x, shadow, bias, xq);
  if (weight.ndim !== 2) throw new OpError("linear", `weight must be 2-d, got [${weight.shape.join(", ")}]`);
  const inF = weight.shape[1]!;
  if (x.shape[x.ndim - 1] !== inF) throw new OpError("linear", `input features ${x.shape[x.ndim - 1]} != weight in_features ${inF}`);
  const lead = x.shape.slice(0, -1);
  const y = sacSite("mm", [x, weight], () => {
    const x2 = x.reshape(numel(lead), inF);
    const y2 = batchedMatmul("linear", x2, weight, true);
    x2.dispose();
    const y = y2.view(...lead, weight.shape[0]!);
    y2.dispose();
    return y;
  });
  recordOp("linear", [x, weight], y);
  if (!bias) return y;
  const out = add(y, bias);
  y.dispose();
  return out;
}

// ---- weight-only quantized linear (int8 / int4 / fp8 weights, f32 activations) ----

/**
 * A weight-only quantized nn.Linear weight [outFeatures, inFeatures] in the back end's quant_matmul layout:
 * int8 data int8 [out, in] + f32 scales [out] + int32 rowSums [out]; int4 data uint8 [out, in/2] + f16 scales
 * [out, in/32] (groups of 32, in % 64 == 0); fp8 data uint8 (e4m3fn codes) [out, in] + f32 scales [out]; mxfp4
 * data uint8 [out, in/2] (E2M1 codes) + e8m0 uint8 scales [out, in/32] (in % 64 == 0); q4_k data uint8 [out, in/2]
 * + meta uint8 [out, in/256*20] (GGUF Q4_K super-blocks, in % 256 == 0); q6_k data uint8 [out, in/256*192] + meta
 * uint8 [out, in/256*18] (GGUF Q6_K super-blocks, in % 256 == 0).
 */
export interface QuantizedWeight {
  readonly scheme: QuantScheme;
  readonly outFeatures: number;
  readonly inFeatures: number;
  readonly data: Tensor;
  readonly scales: Tensor;
  readonly rowSums: Tensor | null;
}

/** Whether `scheme` can hold an [out, in] weight (int4, int8_g32 and mxfp4 pack 64-element chunks, q4_k and q6_k 256). */
export function canQuantize(scheme: QuantScheme, inFeatures: number): boolean {
  return inFeatures % quantKMultiple(scheme) === 0;
}

/** Quantizes a 2-d float weight [out, in] (per output channel; int4 / mxfp4 per group of 32). */
export function quantizeWeight(weight: Tensor, scheme: QuantScheme): QuantizedWeight {
  const op = "quantize";
  if (weight.ndim !== 2) throw new OpError(op, `weight must be 2-d, got [${weight.shape.join(", ")}]`);
  const [n, k] = weight.shape as [number, number];
  if (!canQuantize(scheme, k)) throw new OpError(op, `${scheme} needs in_features % ${quantKMultiple(scheme)} == 0, got ${k}`);
  const dev = weight.device;
  if (dev.backend.name !== "cpu") throw new UnsupportedError(op, `${scheme} weights are not supported on ${dev.name}`);
  const w = contiguous(weight.dtype === "float32" ? weight : weight.to("float32"));
  const data = empty([n, quantDataBytes(scheme, 1, k)], { dtype: scheme === "int8" ? "int8" : "uint8", device: dev });
  const perRow = quantScaleCount(scheme, 1, k);
  const scales = empty(perRow === 1 ? [n] : [n, perRow], { dtype: quantScaleDtype(scheme), device: dev });
  const rowSums = scheme === "int8" ? empty([n], { dtype: "int32", device: dev }) : null;
  runKernel(op, dev, { op: "quantize_weight", scheme, w: w.view_(op), data: data.view_(op), scales: scales.view_(op), rowSums: rowSums?.view_(op) ?? null, n, k });
  if (w !== weight) w.dispose();
  return { scheme, outFeatures: n, inFeatures: k, data, scales, rowSums };
}

/**
 * x's rows quantized as quant_matmul quantizes them (QuantizedRowsView): data int8 [rows, in], scales f32 [rows].
 * Made once by rmsNormQuantized(), then read by every quantizedLinear() of that x instead of re-quantizing it.
 */
export interface QuantizedActivations {
  readonly data: Tensor;
  readonly scales: Tensor;
}

/** Whether quantizedLinear() on this weight's scheme reads pre-quantized activations (fp8 dots f32 x directly). */
export function takesQuantizedActivations(scheme: QuantScheme): boolean {
  return scheme !== "fp8";
}

/**
 * embedding(ids, W) with a quantized table W [numEmbeddings, dim] (ids int32 of any shape -> [...ids, dim] f32): each
 * row dequantized exactly as the quantized products read it (a GGUF token embedding kept in its blocks, as llama.cpp
 * keeps it). Inference only.
 */
export function quantizedEmbedding(ids: Tensor, weight: QuantizedWeight): Tensor {
  const op = "quantized_embedding";
  if (ids.dtype !== "int32") throw new OpError(op, `ids must be int32, got ${ids.dtype}`);
  const dev = sameDevice(op, ids, weight.data);
  const { outFeatures: n, inFeatures: k } = weight;
  const flat = contiguous(ids);
  const out = empty([...ids.shape, k], { dtype: "float32", device: dev });
  if (flat.numel > 0)
    runKernel(op, dev, {
      op: "quant_gather_rows", scheme: weight.scheme, w: weight.data.view_(op), scales: weight.scales.view_(op), ids: flat.view_(op),
      out: out.view_(op), numIds: flat.numel, n, k,
    }, [out]);
  if (flat !== ids) flat.dispose();
  return out;
}

/**
 * linear(x, W, b) with a quantized W: x [..., in] f32 (activations are quantized per row inside the kernel, or
 * read from `xq`, x's rows already quantized: the same bits).
 */
export function quantizedLinear(x: Tensor, weight: QuantizedWeight, bias?: Tensor | null, xq?: QuantizedActivations | null): Tensor {
  const op = "quantized_linear";
  const { inFeatures: k, outFeatures: n } = weight;
  if (x.shape[x.ndim - 1] !== k) throw new OpError(op, `input features ${x.shape[x.ndim - 1]} != weight in_features ${k}`);
  const dev = sameDevice(op, x, weight.data);
  const lead = x.shape.slice(0, -1);
  const m = numel(lead);
  const pre = xq && takesQuantizedActivations(weight.scheme) ? xq : null;
  if (pre && (pre.data.dtype !== "int8" || pre.data.numel !== m * k || pre.scales.numel !== m || !pre.data.isContiguous || !pre.scales.isContiguous))
    throw new OpError(op, `quantized activations [${pre.data.shape.join(", ")}] do not match x [${x.shape.join(", ")}]`);
  const cx = contiguous(x.dtype === "float32" ? x : x.to("float32"));
  const y = empty([...lead, n], { dtype: "float32", device: dev });
  if (m > 0)
    runKernel(op, dev, {
      op: "quant_matmul", scheme: weight.scheme, x: cx.view_(op), w: weight.data.view_(op), scales: weight.scales.view_(op),
      rowSums: weight.rowSums?.view_(op) ?? null, out: y.view_(op), m, n, k,
      ...(pre ? { xq: { data: pre.data.view_(op), scales: pre.scales.view_(op) } } : {}),
    }, [y]);
  if (cx !== x) cx.dispose();
  if (!bias) return y;
  const out = add(y, bias);
  y.dispose();
  return out;
}

// A float weight that linear() should read through a quantized copy (e.g. a tied LM head whose float table the
// embedding lookup still needs). Inference only: the quantized path records no autograd op.
const quantizedShadows = new WeakMap<Tensor, QuantizedWeight>();

/** Makes linear(x, weight) use `q` (a quantization of weight) from now on; null removes it. */
export function setQuantizedShadow(weight: Tensor, q: QuantizedWeight | null): void {
  const old = quantizedShadows.get(weight);
  if (old && old !== q) disposeQuantizedWeight(old);
  if (q) quantizedShadows.set(weight, q);
  else quantizedShadows.delete(weight);
}
export function quantizedShadowOf(weight: Tensor): QuantizedWeight | undefined {
  return quantizedShadows.get(weight);
}

/** Frees a quantized weight's tensors. */
export function disposeQuantizedWeight(w: QuantizedWeight): void {
  w.data.dispose();
  w.scales.dispose();
  w.rowSums?.dispose();
}
