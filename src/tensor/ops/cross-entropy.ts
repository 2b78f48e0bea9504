// torch.nn.functional.cross_entropy over input [C], [N, C] or [N, C, d1, ..., dk]: class-index targets (one fused
// autograd op, backward in backward/nn.ts) and class-probability targets (composed of differentiable ops).
import { isFloating, type DType } from "../../backends/dtype.js";
import { IndexOutOfRangeError, OpError } from "../../util/errors.js";
import { sameDevice } from "../dispatch.js";
import { noGrad, recordOp } from "../grad-mode.js";
import { empty, full, Tensor } from "../tensor.js";
import { logSoftmax, sum } from "./reduce.js";
import { gather } from "./indexing.js";
import { add, mul } from "./elementwise.js";

const op = "cross_entropy";

/** torch.nn.functional.cross_entropy's options. */
export interface CrossEntropyOptions {
  /** Class-index targets equal to it are skipped (default -100); probability targets allow only a negative one. */
  ignoreIndex?: number;
  /** "mean" (default: over the targets not ignored), "sum", or "none" (one loss per target, 0 where ignored). */
  reduction?: "mean" | "sum" | "none";
  /** epsilon in [0, 1]: the target becomes (1 - epsilon) * target + epsilon / C (default 0). */
  labelSmoothing?: number;
}

type Reduction = "mean" | "sum" | "none";

/**
 * Cross-entropy of logits against targets (torch's F.cross_entropy), the classes along dim 1 (dim 0 of a 1-d input):
 * - class indices: targets of an integer dtype, shaped as the input without its class dim ([] for input [C],
 *   [N] for [N, C], [N, d1, ..., dk] for [N, C, d1, ..., dk]); per target (1 - eps) * -log p[target] +
 *   eps * mean over classes of -log p; targets equal to ignoreIndex are skipped.
 * - class probabilities: floating targets of the input's shape; per target -sum over classes of q * log p with
 *   q = (1 - eps) * target + eps / C; differentiable in the targets too.
 * "none" gives the losses in the input's shape without its class dim; "mean" averages over the targets (class
 * indices: those not ignored, 0 if none is). The loss has the input's dtype (probabilities: promoted with the
 * targets'). The third argument is ignoreIndex itself, or the options.
 *
 * @example crossEntropy(tensor([[2, 0, 1]]), tensor(Int32Array.of(0))).item() // 0.4076
 */
export function crossEntropy(logits: Tensor, targets: Tensor, options: number | CrossEntropyOptions = {}): Tensor {
  const { ignoreIndex = -100, reduction = "mean", labelSmoothing = 0 } = typeof options === "number" ? { ignoreIndex: options } : options;
  if (reduction !== "mean" && reduction !== "sum" && reduction !== "none")
    throw new OpError(op, `reduction must be "mean", "sum" or "none", got ${JSON.stringify(reduction)}`);
  if (!(labelSmoothing >= 0 && labelSmoothing <= 1)) throw new OpError(op, `label_smoothing must be in [0, 1], got ${labelSmoothing}`);
  if (logits.ndim === 0) throw new OpError(op, "Expected 1 or more dimensions (got 0)");
  if (!isFloating(logits.dtype)) throw new OpError(op, `expected floating logits, got ${logits.dtype}`);
  sameDevice(op, logits, targets);
  // as torch: targets of the input's shape are class probabilities, any other shape class indices
  const probabilities = targets.ndim === logits.ndim && targets.shape.every((s, i) => s === logits.shape[i]);
  const lossShape = logits.ndim === 1 ? [] : logits.shape.filter((_, i) => i !== 1);
  const rows = classesLast(logits);
  try {
    if (probabilities) return probabilityLoss(rows, targets, lossShape, { ignoreIndex, reduction, labelSmoothing });
    if (targets.ndim !== lossShape.length || targets.shape.some((s, i) => s !== lossShape[i]))
      throw new OpError(op, `expected targets of shape [${lossShape.join(", ")}] (class indices) or [${logits.shape.join(", ")}] ` +
        `(class probabilities) for logits [${logits.shape.join(", ")}], got [${targets.shape.join(", ")}]`);
    if (isFloating(targets.dtype) || targets.dtype === "bool")
      throw new OpError(op, `targets must be class indices of an integer dtype, got ${targets.dtype} (class probabilities take the logits' shape)`);
    const loss = classIndexLoss(rows, targets, { ignoreIndex, reduction, labelSmoothing });
    if (reduction !== "none" || lossShape.length === 1) return loss;
    const shaped = loss.reshape(lossShape);
    loss.dispose();
    return shaped;
  } finally {
    if (rows !== logits) rows.dispose();
  }
}

/** The input as [M, C] rows (differentiable): classes last, one row per target. */
function classesLast(x: Tensor): Tensor {
  if (x.ndim === 1) return x.reshape(1, x.shape[0]!);
  if (x.ndim === 2) return x;
  const order = [0, ...Array.from({ length: x.ndim - 2 }, (_, i) => i + 2), 1];
  const moved = x.permute(order);
  const rows = moved.reshape(-1, x.shape[1]!);
  moved.dispose();
  return rows;
}

/** -sum_c q * log_softmax(rows), q the (smoothed) probabilities; composed of ops, so autograd reaches the targets. */
function probabilityLoss(rows: Tensor, targets: Tensor, lossShape: number[], o: Required<CrossEntropyOptions>): Tensor {
  if (!isFloating(targets.dtype)) throw new OpError(op, `Expected floating point type for target with class probabilities, got ${targets.dtype}`);
  if (o.ignoreIndex >= 0) throw new OpError(op, `ignore_index is not supported for floating point target (got ${o.ignoreIndex})`);
  const classes = rows.shape[1]!;
  const tRows = classesLast(targets);
  let q = tRows;
  if (o.labelSmoothing > 0) {
    const scaled = tRows.mul(1 - o.labelSmoothing);
    q = scaled.add(o.labelSmoothing / classes);
    scaled.dispose();
  }
  const lsm = logSoftmax(rows, -1);
  const weighted = mul(lsm, q);
  const rowSum = sum(weighted, -1);
  const perRow = rowSum.neg(); // [M]
  for (const t of new Set([tRows, q, lsm, weighted, rowSum])) if (t !== targets) t.dispose();
  if (o.reduction === "none") {
    const out = perRow.reshape(lossShape);
    if (out !== perRow) perRow.dispose();
    return out;
  }
  const total = sum(perRow);
  perRow.dispose();
  if (o.reduction === "sum") return total;
  const mean = total.div(rows.shape[0]!); // torch: over N * d1 * ... * dk (no targets: 0 / 0, NaN)
  total.dispose();
  return mean;
}

/**
 * Fused class-index cross-entropy of rows [M, C] against targets (M of them): computed in float32, the loss cast to
 * the logits' dtype; the forward records one "cross_entropy" op whose backward is (softmax - q) * its scale.
 */
function classIndexLoss(logits: Tensor, targets: Tensor, o: Required<CrossEntropyOptions>): Tensor {
  const { ignoreIndex, reduction, labelSmoothing } = o;
  const t32 = targets.to("int32");
  const tgt = Int32Array.from(t32.dataSync() as Int32Array);
  if (t32 !== targets) t32.dispose();
  const [N, classes] = logits.shape as [number, number];
  for (const t of tgt)
    if (t !== ignoreIndex && (t < 0 || t >= classes)) throw new IndexOutOfRangeError(op, `target ${t} out of range for ${classes} classes`);
  const keep = Float32Array.from(tgt, (t) => (t === ignoreIndex ? 0 : 1));
  const count = keep.reduce((a, b) => a + b, 0);
  const attrs = { targets: tgt, ignoreIndex, count, reduction, labelSmoothing };
  const dtype = logits.dtype;
  if (count === 0) {
    // nothing to average (torch's mean: NaN): 0, still on the graph so that backward gives zero gradients
    const zero = full(reduction === "none" ? [N] : [], 0, { dtype, device: logits.device });
    recordOp(op, [logits], zero, attrs);
    return zero;
  }
  const loss = noGrad(() => {
    const x = logits.to("float32");
    const lsm = logSoftmax(x, -1);
    const idx = empty([N, 1], { dtype: "int32", device: logits.device });
    logits.device.backend.write(idx.storage.buffer, 0, new Uint8Array(Int32Array.from(tgt, (t) => (t === ignoreIndex ? 0 : t)).buffer));
    const gathered = gather(lsm, 1, idx);
    const picked = gathered.reshape(-1);
    // -((1 - eps) * logp[target] + eps / C * sum logp), times keep (0 on ignored rows)
    let row = picked.mul(-(1 - labelSmoothing));
    if (labelSmoothing > 0) {
      const rowSum = sum(lsm, -1);
      const smoothed = add(row, rowSum.mul(-labelSmoothing / classes));
      for (const t of [row, rowSum]) t.dispose();
      row = smoothed;
    }
    const w = empty([N], { dtype: "float32", device: logits.device });
    logits.device.backend.write(w.storage.buffer, 0, new Uint8Array(keep.buffer));
    const perRow = mul(row, w);
    for (const t of new Set([lsm, idx, gathered, picked, row, w])) t.dispose();
    if (x !== logits) x.dispose();
    return reduceLosses(perRow, reduction, count, dtype);
  });
  recordOp(op, [logits], loss, attrs);
  return loss;
}

/** none / sum / mean over `count` of float32 per-row losses (disposed), in `dtype`. */
function reduceLosses(perRow: Tensor, reduction: Reduction, count: number, dtype: DType): Tensor {
  let out = perRow;
  if (reduction !== "none") {
    const total = sum(perRow);
    perRow.dispose();
    out = reduction === "sum" ? total : total.div(count);
    if (out !== total) total.dispose();
  }
  if (out.dtype === dtype) return out;
  const cast = out.to(dtype);
  out.dispose();
  return cast;
}
