// Statistics composed of differentiable ops: var / std (with Bessel's correction), varMean / stdMean, vector norms,
// and the value tests isnan / isinf / isfinite and allclose (host side).
import { isFloating } from "../../backends/dtype.js";
import { OpError } from "../../util/errors.js";
import { noGrad } from "../grad-mode.js";
import { full, numel, Tensor } from "../tensor.js";
import { abs, logicalNot, logicalOr, ne, pow, sqrt, square, sub, where } from "./elementwise.js";
import { amax, amin, mean, sum } from "./reduce.js";
import { broadcastShapes, normDim } from "./shape.js";

export interface VarOptions {
  /** Subtracted from the element count in the divisor (default 1: the unbiased estimate; 0: the population's). */
  correction?: number;
  keepdim?: boolean;
}

/** Normalised reduced dims (all when omitted) and their element count. */
function reducedCount(op: string, x: Tensor, dim: number | readonly number[] | undefined): { dims: number[]; count: number } {
  const all = dim === undefined || (typeof dim !== "number" && dim.length === 0); // torch: dim=[] reduces every dim
  const dims = all ? x.shape.map((_, i) => i) : (typeof dim === "number" ? [dim] : [...dim!]).map((d) => normDim(d, x.ndim, op));
  return { dims, count: numel(dims.map((d) => x.shape[d] ?? 1)) };
}

/**
 * torch.var_mean: sum((x - mean)^2) / max(0, N - correction) over dims (all when omitted) and the mean.
 * As torch, a divisor of 0 gives inf or NaN.
 * @example varMean(tensor([1, 2, 3, 4])).var.item() // 1.6667
 */
export function varMean(x: Tensor, dim?: number | readonly number[], { correction = 1, keepdim = false }: VarOptions = {}): { var: Tensor; mean: Tensor } {
  if (!isFloating(x.dtype)) throw new OpError("var", `std and var only support floating point dtypes, got ${x.dtype}`);
  const { dims, count } = reducedCount("var", x, dim);
  const m = mean(x, dims, true);
  const centred = sub(x, m);
  const sq = square(centred);
  const total = sum(sq, dims, keepdim);
  const v = total.div(Math.max(0, count - correction));
  for (const t of [centred, sq, total]) t.dispose();
  if (keepdim || x.ndim === 0) return { var: v, mean: m };
  const squeezed = m.reshape(v.shape);
  m.dispose();
  return { var: v, mean: squeezed };
}

/** torch.var: see varMean. */
export function variance(x: Tensor, dim?: number | readonly number[], options: VarOptions = {}): Tensor {
  const r = varMean(x, dim, options);
  r.mean.dispose();
  return r.var;
}

/** torch.std_mean: the square root of varMean's variance, and the mean. */
export function stdMean(x: Tensor, dim?: number | readonly number[], options: VarOptions = {}): { std: Tensor; mean: Tensor } {
  const r = varMean(x, dim, options);
  const s = sqrt(r.var);
  r.var.dispose();
  return { std: s, mean: r.mean };
}

/** torch.std: the square root of var. */
export function std(x: Tensor, dim?: number | readonly number[], options: VarOptions = {}): Tensor {
  const r = stdMean(x, dim, options);
  r.mean.dispose();
  return r.std;
}

/**
 * torch.norm / linalg.vector_norm over dims (all when omitted): p = 2 ("fro") sqrt(sum x^2), 1 sum |x|, Infinity
 * max |x|, -Infinity min |x|, 0 the count of non-zeros, any other p (sum |x|^p)^(1/p).
 * @example norm(tensor([3, 4])).item() // 5
 */
export function norm(x: Tensor, p: number | "fro" = 2, dim?: number | readonly number[], keepdim = false): Tensor {
  if (!isFloating(x.dtype)) throw new OpError("norm", `expected a floating point input, got ${x.dtype}`);
  const order = p === "fro" ? 2 : p;
  if (typeof order !== "number" || Number.isNaN(order)) throw new OpError("norm", `unsupported norm order ${String(p)}`);
  const { dims } = reducedCount("norm", x, dim);
  const dl = dims.length === 0 && x.ndim === 0 ? undefined : dims;
  if (order === 0) {
    const nz = noGrad(() => ne(x, 0));
    const count = sum(nz, dl, keepdim);
    nz.dispose();
    const out = count.to(x.dtype);
    if (out !== count) count.dispose();
    return out;
  }
  if (order === 2) {
    const sq = square(x);
    const s = sum(sq, dl, keepdim);
    const out = rootAwayFromZero(s, sqrt);
    sq.dispose();
    s.dispose();
    return out;
  }
  const a = abs(x);
  let out: Tensor;
  if (order === 1) out = sum(a, dl, keepdim);
  else if (order === Infinity) out = amax(a, dl, keepdim);
  else if (order === -Infinity) out = amin(a, dl, keepdim);
  else {
    const powered = pow(a, order);
    const s = sum(powered, dl, keepdim);
    out = rootAwayFromZero(s, (v) => pow(v, 1 / order));
    powered.dispose();
    s.dispose();
  }
  a.dispose();
  return out;
}

/**
 * root(s), with a zero gradient where s is 0 (torch's norm backward masks a zero norm there; the root's own
 * derivative is infinite at 0 and would give 0 * inf = NaN): the root reads 1 there, and where() takes 0.
 */
function rootAwayFromZero(s: Tensor, root: (v: Tensor) => Tensor): Tensor {
  const zero = s.eq(0);
  const safe = where(zero, 1, s);
  const r = root(safe);
  const out = where(zero, 0, r);
  for (const t of [zero, safe, r]) t.dispose();
  return out;
}

/** torch.isnan: bool, true where x is NaN (never for integer dtypes). */
export function isnan(x: Tensor): Tensor {
  if (!isFloating(x.dtype)) return full(x.shape, 0, { dtype: "bool", device: x.device });
  return ne(x, x);
}

/** torch.isinf: bool, true where x is +-Infinity. */
export function isinf(x: Tensor): Tensor {
  if (!isFloating(x.dtype)) return full(x.shape, 0, { dtype: "bool", device: x.device });
  const a = abs(x);
  const out = a.eq(Infinity);
  a.dispose();
  return out;
}

/** torch.isfinite: bool, true where x is neither NaN nor infinite. */
export function isfinite(x: Tensor): Tensor {
  if (!isFloating(x.dtype)) return full(x.shape, 1, { dtype: "bool", device: x.device });
  const nan = isnan(x);
  const inf = isinf(x);
  const either = logicalOr(nan, inf);
  const out = logicalNot(either);
  for (const t of [nan, inf, either]) t.dispose();
  return out;
}

/**
 * torch.allclose: whether |a - b| <= atol + rtol * |b| everywhere (a and b broadcast); equal infinities are close,
 * NaN only with equalNan. Reads both tensors back to the host.
 * @example allclose(tensor([1, 2]), tensor([1, 2.000001])) // true
 */
export function allclose(a: Tensor, b: Tensor, rtol = 1e-5, atol = 1e-8, equalNan = false): boolean {
  const shape = broadcastShapes("allclose", a.shape, b.shape);
  const read = (t: Tensor): ArrayLike<number> => {
    const e = t.expand(shape);
    const values = Float64Array.from(e.dataSync() as ArrayLike<number | bigint>, Number);
    e.dispose();
    return values;
  };
  const [av, bv] = noGrad(() => [read(a), read(b)]);
  for (let i = 0; i < av.length; i++) {
    const x = av[i]!;
    const y = bv[i]!;
    if (Number.isNaN(x) || Number.isNaN(y)) {
      if (equalNan && Number.isNaN(x) && Number.isNaN(y)) continue;
      return false;
    }
    if (x === y) continue;
    // an infinity is close only to itself (inf <= rtol * inf would pass it against -inf)
    if (!Number.isFinite(x) || !Number.isFinite(y) || !(Math.abs(x - y) <= atol + rtol * Math.abs(y))) return false;
  }
  return true;
}
