// A top-k mixture of experts as one device op: the routing stays on the device (ids and weights are tensors the
// router's ops computed), so MoE layers need no host round trip and step graphs can capture them. Inference only.
import type { BufferView, MoeActivation, MoeExpertView, MoeProjectionView } from "../../backends/backend.js";
import { isFloating } from "../../backends/dtype.js";
import { OpError } from "../../util/errors.js";
import { runKernel, sameDevice } from "../dispatch.js";
import { isGradEnabled } from "../grad-mode.js";
import { empty, type Tensor } from "../tensor.js";
import type { QuantizedWeight } from "./linalg.js";
import { contiguous } from "./shape.js";

const OP = "moe";

/** One expert projection: a float weight [out, in] (nn.Linear's) or a quantized one, and an optional bias [out]. */
export interface MoeProjection {
  weight: Tensor | QuantizedWeight;
  bias?: Tensor | null;
}

/** An expert's gate and up ([inter, hidden]) and down ([hidden, inter]) projections. */
export interface MoeExpert {
  gate: MoeProjection;
  up: MoeProjection;
  down: MoeProjection;
}

const shapeOf = (t: Tensor) => `[${t.shape.join(", ")}]`;
const isQuantized = (w: Tensor | QuantizedWeight): w is QuantizedWeight => "scheme" in w;

/**
 * out[t] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t]), expert e = down(act(gate(x), up(x))) with act silu(g) * u
 * or gpt-oss's clamped SwiGLU (`act`). x [T, H] float, ids int32 [T, K], weights float [T, K] (the router's top-k,
 * already renormalised where the model does), experts [E]. Returns a new float32 [T, H]. An id outside [0, E)
 * contributes nothing (the kernel reads the ids when it runs, never on the host). Float weights of float32 or
 * bfloat16 and the quantized schemes run natively on cpu; others take the back end's host path.
 *
 * @example
 * const { values, indices } = topk(softmax(linear(x, router), -1), 2);
 * const y = moe(x, indices, values, experts, { kind: "silu" }); // Mixtral-style, without renormalisation
 */
export function moe(x: Tensor, ids: Tensor, weights: Tensor, experts: readonly MoeExpert[], act: MoeActivation): Tensor {
  if (x.ndim !== 2 || ids.ndim !== 2 || weights.ndim !== 2)
    throw new OpError(OP, `expects x [T, H], ids [T, K], weights [T, K]; got x ${shapeOf(x)}, ids ${shapeOf(ids)}, weights ${shapeOf(weights)}`);
  const [T, H] = x.shape as [number, number];
  const K = ids.shape[1]!;
  if (ids.shape[0] !== T || weights.shape[0] !== T || weights.shape[1] !== K)
    throw new OpError(OP, `ids ${shapeOf(ids)} and weights ${shapeOf(weights)} must both be [${T}, K] (x ${shapeOf(x)})`);
  if (ids.dtype !== "int32") throw new OpError(OP, `ids must be int32, got ${ids.dtype}`);
  if (!isFloating(x.dtype) || !isFloating(weights.dtype)) throw new OpError(OP, `x and weights must be floating, got ${x.dtype} and ${weights.dtype}`);
  if (experts.length === 0) throw new OpError(OP, "needs at least one expert");
  if (act.kind === "clamped_swiglu" && !(act.limit > 0 && Number.isFinite(act.alpha)))
    throw new OpError(OP, `clamped SwiGLU needs limit > 0 and a finite alpha, got limit ${act.limit}, alpha ${act.alpha}`);
  const I = outFeatures(experts[0]!.gate.weight);
  const tensors: Tensor[] = [];
  experts.forEach((ex, e) => {
    for (const [name, p, out, inF] of [["gate", ex.gate, I, H], ["up", ex.up, I, H], ["down", ex.down, H, I]] as const) {
      const w = p.weight;
      const [o, i] = isQuantized(w) ? [w.outFeatures, w.inFeatures] : (w.shape as [number, number]);
      if ((!isQuantized(w) && (w.ndim !== 2 || !isFloating(w.dtype))) || o !== out || i !== inF)
        throw new OpError(OP, `expert ${e} ${name}: weight must be a float or quantized [${out}, ${inF}], got ${describe(w)}`);
      if (p.bias && (p.bias.ndim !== 1 || p.bias.shape[0] !== out || !isFloating(p.bias.dtype)))
        throw new OpError(OP, `expert ${e} ${name}: bias must be a float [${out}], got ${p.bias.dtype}${shapeOf(p.bias)}`);
      if (isQuantized(w)) tensors.push(w.data, w.scales, ...(w.rowSums ? [w.rowSums] : []));
      else tensors.push(w);
      if (p.bias) tensors.push(p.bias);
    }
  });
  if (isGradEnabled() && [x, weights, ...tensors].some((t) => t.requiresGrad))
    throw new OpError(OP, "moe is inference-only (no autograd): run it under noGrad() or detach the inputs");
  const dev = sameDevice(OP, x, ids, weights, ...tensors);
  const temps: Tensor[] = [];
  /** A contiguous view of t (float32 when `f32`), converting into a temporary when needed. */
  const view = (t: Tensor, f32 = false): BufferView => {
    let d = f32 && t.dtype !== "float32" ? t.to("float32") : t;
    if (d !== t) temps.push(d);
    const c = contiguous(d);
    if (c !== d) temps.push((d = c));
    return d.view_(OP);
  };
  const projection = (p: MoeProjection): MoeProjectionView => {
    const w = p.weight;
    const bias = p.bias ? view(p.bias, true) : null;
    if (!isQuantized(w)) return { w: view(w), bias };
    return { w: view(w.data), quant: { scheme: w.scheme, scales: view(w.scales), rowSums: w.rowSums ? view(w.rowSums) : null }, bias };
  };
  const views: MoeExpertView[] = experts.map((ex) => ({ gate: projection(ex.gate), up: projection(ex.up), down: projection(ex.down) }));
  const out = empty([T, H], { dtype: "float32", device: dev });
  runKernel(OP, dev, {
    op: OP, x: view(x, true), ids: view(ids), weights: view(weights, true), out: out.view_(OP), experts: views, t: T, h: H, inter: I, k: K, act,
  }, [out]);
  for (const t of temps) t.dispose();
  return out;
}

function outFeatures(w: Tensor | QuantizedWeight): number {
  return isQuantized(w) ? w.outFeatures : w.shape[0]!;
}

function describe(w: Tensor | QuantizedWeight): string {
  return isQuantized(w) ? `${w.scheme}[${w.outFeatures}, ${w.inFeatures}]` : `${w.dtype}${shapeOf(w)}`;
}
