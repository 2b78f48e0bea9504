// Multi-LoRA serving's one op: each token row gets the low-rank delta of its own adapter slot (punica's BGMV, vLLM's
// bgmv_shrink + bgmv_expand in one kernel). Inference only.
import type { BufferView } from "../../backends/backend.js";
import { isFloating } from "../../backends/dtype.js";
import { OpError } from "../../util/errors.js";
import { runKernel, sameDevice } from "../dispatch.js";
import { isGradEnabled } from "../grad-mode.js";
import { empty, type Tensor } from "../tensor.js";
import { contiguous } from "./shape.js";

const OP = "lora_apply";

function f32Contiguous(t: Tensor): Tensor {
  return contiguous(t.dtype === "float32" ? t : t.to("float32"));
}

const shapeOf = (t: Tensor) => `[${t.shape.join(", ")}]`;

/**
 * Adds each token's LoRA delta: out[t] = base[t] + scales[s] * (x[t] @ a[s]^T) @ b[s] with s = slots[t]. A slot
 * outside [0, S) (-1: no adapter) adds nothing, so that row of out is base's. Returns a new float32 tensor [T, N];
 * base is not modified.
 *
 * base [T, N] (the layer's output), x [T, K] (its input), a [S, R, K] (each slot's lora_A), b [S, R, N] (each slot's
 * lora_B transposed, so the expand reads contiguous rows), scales [S] (alpha / r per adapter), slots int32 [T].
 * Float inputs of another float dtype are read as float32. Inference only: throws when grad mode is on and an input
 * requires grad.
 *
 * @example
 * // two adapters of rank 8 on a q projection; token 1 uses none
 * const q = linear(h, wq);                                    // [3, 512]
 * const out = loraApply(q, h, loraA, loraBT, scales, tensor(Int32Array.from([1, -1, 0])));
 */
export function loraApply(base: Tensor, x: Tensor, a: Tensor, b: Tensor, scales: Tensor, slots: Tensor): Tensor {
  if (base.ndim !== 2 || x.ndim !== 2 || a.ndim !== 3 || b.ndim !== 3 || scales.ndim !== 1 || slots.ndim !== 1)
    throw new OpError(
      OP,
      `expects base [T, N], x [T, K], a [S, R, K], b [S, R, N], scales [S], slots [T]; got base ${shapeOf(base)}, ` +
        `x ${shapeOf(x)}, a ${shapeOf(a)}, b ${shapeOf(b)}, scales ${shapeOf(scales)}, slots ${shapeOf(slots)}`,
    );
  const [T, N] = base.shape as [number, number];
  const K = x.shape[1]!;
  const [S, R] = a.shape as [number, number, number];
  if (x.shape[0] !== T) throw new OpError(OP, `x ${shapeOf(x)} has ${x.shape[0]} rows, base ${shapeOf(base)} has ${T}`);
  if (slots.shape[0] !== T) throw new OpError(OP, `slots ${shapeOf(slots)} must have one entry per row of base (${T})`);
  if (a.shape[2] !== K) throw new OpError(OP, `a ${shapeOf(a)} must be [S, R, ${K}] (K of x ${shapeOf(x)})`);
  if (b.shape[0] !== S || b.shape[1] !== R || b.shape[2] !== N)
    throw new OpError(OP, `b ${shapeOf(b)} must be [${S}, ${R}, ${N}] (a's S and R, base's N)`);
  if (scales.shape[0] !== S) throw new OpError(OP, `scales ${shapeOf(scales)} must have one entry per slot (${S})`);
  if (slots.dtype !== "int32") throw new OpError(OP, `slots must be int32, got ${slots.dtype}`);
  const floats = { base, x, a, b, scales };
  for (const [name, t] of Object.entries(floats))
    if (!isFloating(t.dtype)) throw new OpError(OP, `${name} must be a floating dtype, got ${t.dtype}`);
  if (isGradEnabled() && Object.values(floats).some((t) => t.requiresGrad))
    throw new OpError(OP, "loraApply is inference-only (no autograd): run it under noGrad() or detach the inputs");
  const dev = sameDevice(OP, base, x, a, b, scales, slots);
  const given = [base, x, a, b, scales, slots];
  const dense = given.map((t, i) => (i === 5 ? contiguous(t) : f32Contiguous(t))); // slots (5) stay int32
  const views = dense.map((t) => t.view_(OP));
  const [baseV, xV, aV, bV, scalesV, slotsV] = views as [BufferView, BufferView, BufferView, BufferView, BufferView, BufferView];
  const out = empty([T, N], { dtype: "float32", device: dev });
  runKernel(OP, dev, {
    op: OP, base: baseV, x: xV, a: aV, b: bV, scales: scalesV, slots: slotsV, out: out.view_(OP), t: T, n: N, k: K, r: R, s: S,
  }, [out]);
  for (let i = 0; i < given.length; i++) if (dense[i] !== given[i]) dense[i]!.dispose();
  return out;
}
