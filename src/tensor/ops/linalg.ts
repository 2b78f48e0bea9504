// matmul with torch's broadcasting rules, bmm, and linear (x @ W^T + b, W in nn.Linear's [out, in] layout).
import { OpError } from "../../util/errors.js";
import { runKernel, sameDevice } from "../dispatch.js";
import { recordOp } from "../grad-mode.js";
import { empty, numel, Tensor } from "../tensor.js";
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
  const batch = broadcastShapes(op, batchA, batchB);
  const nb = numel(batch);
  const out = empty([...batch, M, N], { dtype: "float32", device: dev });
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
  if (a.ndim === 0 || b.ndim === 0) throw new OpError("matmul", "both arguments must be at least 1-d");
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
  recordOp("matmul", [a, b], out);
  return out;
}

export function bmm(a: Tensor, b: Tensor): Tensor {
  if (a.ndim !== 3 || b.ndim !== 3) throw new OpError("bmm", "expects 3-d tensors");
  if (a.shape[0] !== b.shape[0]) throw new OpError("bmm", `batch sizes differ (${a.shape[0]} vs ${b.shape[0]})`);
  return matmul(a, b);
}

/** linear(x, W, b) = x @ W^T + b with W [out, in]; x [..., in]. W may be bfloat16. */
export function linear(x: Tensor, weight: Tensor, bias?: Tensor | null): Tensor {
  if (weight.ndim !== 2) throw new OpError("linear", `weight must be 2-d, got [${weight.shape.join(", ")}]`);
  const inF = weight.shape[1]!;
  if (x.shape[x.ndim - 1] !== inF) throw new OpError("linear", `input features ${x.shape[x.ndim - 1]} != weight in_features ${inF}`);
  const lead = x.shape.slice(0, -1);
  const x2 = x.reshape(numel(lead), inF);
  const y2 = batchedMatmul("linear", x2, weight, true);
  x2.dispose();
  const y = y2.view(...lead, weight.shape[0]!);
  y2.dispose();
  recordOp("linear", [x, weight], y);
  if (!bias) return y;
  const out = add(y, bias);
  y.dispose();
  return out;
}
