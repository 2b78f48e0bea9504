// Backward formulas of views, reductions, softmax, matmul/linear and the indexing ops.
import * as ew from "../ops/elementwise.js";
import * as ix from "../ops/indexing.js";
import * as la from "../ops/linalg.js";
import * as rd from "../ops/reduce.js";
import { zeros, Tensor, type Shape } from "../tensor.js";
import type { BackwardContext, RuleTable } from "./types.js";

/** g of a keepdim=false reduction reshaped to the keepdim shape, so it broadcasts against the input. */
function keepDims(g: Tensor, c: BackwardContext): Tensor {
  if (c.attrs.keepdim) return g;
  const dims = c.attrs.dims as number[];
  const shape = (c.attrs.inputShape as Shape).map((s, i) => (dims.includes(i) ? 1 : s));
  return g.reshape(...shape);
}

/** Inverse of a permutation. */
function invert(dims: readonly number[]): number[] {
  const inv = new Array<number>(dims.length);
  dims.forEach((d, i) => (inv[d] = i));
  return inv;
}

/** A zero tensor of `shape` with `g` written into the region `place` selects (slice/cat/gather padding). */
function placeInto(shape: Shape, g: Tensor, place: (z: Tensor) => Tensor): Tensor {
  const z = zeros(shape, { device: g.device });
  const region = place(z);
  ew.copyInto(region, g);
  if (region !== z) region.dispose();
  return z;
}

const views: RuleTable = {
  view: { saves: "none", grad: (g, c) => [g.reshape(...(c.attrs.shape as Shape))] },
  permute: { saves: "none", grad: (g, c) => [g.permute(...invert(c.attrs.dims as number[]))] },
  slice: {
    saves: "none",
    grad: (g, c) => {
      const { dim, start, step } = c.attrs as { dim: number; start: number; step: number };
      const len = g.shape[dim]!;
      return [placeInto(c.attrs.inputShape as Shape, g, (z) => z.slice(dim, start, start + (len - 1) * step + 1, step))];
    },
  },
  // expand's grad is g summed over the expanded dims: the engine's reduction to the input shape does it
  expand: { saves: "none", grad: (g) => [g] },
  identity: { saves: "none", grad: (g) => [g] },
  // dtype casts: grads stay float32 in flight; leaves receive their own dtype
  cast: { saves: "none", grad: (g) => [g] },
};

const reductions: RuleTable = {
  sum: {
    saves: "none",
    grad: (g, c) => {
      const gk = keepDims(g, c);
      const out = gk.expand(...(c.attrs.inputShape as Shape));
      if (gk !== g) gk.dispose();
      return [out];
    },
  },
  prod: {
    saves: "inputs",
    grad: (g, c) => {
      // d(prod)/dx_i = product of the other entries (torch's prod_backward): with no zero in the row that is
      // prod / x_i; with one zero, only the zero's entry is non-zero (the product of the rest); with two, all are 0.
      // As one formula: p = prod(x with zeros read as 1); grad_i = g * p / x'_i where the row has no zero, or
      // where x_i is its only zero (x'_i = 1 there), else 0.
      const x = c.inputs[0]!;
      const dims = c.attrs.dims as number[];
      const gk = keepDims(g, c);
      const zero = ew.eq(x, 0);
      const xNz = ew.where(zero, 1, x);
      const p = rd.prod(xNz, dims, true);
      const zeros = rd.sum(zero, dims, true);
      const noZero = ew.eq(zeros, 0);
      const oneZero = ew.eq(zeros, 1);
      const onlyZero = ew.logicalAnd(zero, oneZero);
      const keep = ew.logicalOr(noZero, onlyZero);
      const gp = ew.mul(gk, p);
      const all = ew.div(gp, xNz);
      const out = ew.where(keep, all, 0);
      for (const t of [zero, xNz, p, zeros, noZero, oneZero, onlyZero, keep, gp, all, ...(gk !== g ? [gk] : [])]) t.dispose();
      return [out];
    },
  },
  max: { saves: "both", grad: (g, c) => [extremumGrad(g, c)] },
  min: { saves: "both", grad: (g, c) => [extremumGrad(g, c)] },
  amax: { saves: "both", grad: (g, c) => [extremumGrad(g, c)] },
  amin: { saves: "both", grad: (g, c) => [extremumGrad(g, c)] },
  // dx = y * (g - sum(g * y))
  softmax: {
    saves: "output",
    grad: (g, c) => {
      const y = c.output!;
      const dim = c.attrs.dim as number;
      const gy = ew.mul(g, y);
      const s = rd.sum(gy, dim, true);
      const d = ew.sub(g, s);
      const out = ew.mul(y, d);
      for (const t of [gy, s, d]) t.dispose();
      return [out];
    },
  },
  // dx = g - softmax * sum(g)
  log_softmax: {
    saves: "output",
    grad: (g, c) => {
      const dim = c.attrs.dim as number;
      const p = ew.exp(c.output!);
      const s = rd.sum(g, dim, true);
      const ps = ew.mul(p, s);
      const out = ew.sub(g, ps);
      for (const t of [p, s, ps]) t.dispose();
      return [out];
    },
  },
  // reverse cumulative sum: sum_{j >= i} g_j = total - cumsum_i + g_i
  cumsum: {
    saves: "none",
    grad: (g, c) => {
      const dim = c.attrs.dim as number;
      const total = rd.sum(g, dim, true);
      const cs = rd.cumsum(g, dim);
      const t1 = ew.sub(total, cs);
      const out = ew.add(t1, g);
      for (const t of [total, cs, t1]) t.dispose();
      return [out];
    },
  },
};

/** max/min: the gradient is shared evenly among the elements equal to the extremum (torch's amax rule). */
function extremumGrad(g: Tensor, c: BackwardContext): Tensor {
  const x = c.inputs[0]!;
  const yk = keepDims(c.output!, c);
  const gk = keepDims(g, c);
  const hit = ew.eq(x, yk);
  const mask = ew.where(hit, 1, 0);
  const count = rd.sum(mask, c.attrs.dims as number[], true);
  const share = ew.div(gk, count);
  const out = ew.mul(mask, share);
  for (const t of [hit, mask, count, share, ...(gk !== g ? [gk] : []), ...(yk !== c.output ? [yk] : [])]) t.dispose();
  return out;
}

const linalg: RuleTable = {
  // a [..., M, K] @ b [..., K, N]; 1-d operands were promoted (and squeezed back) by matmul
  matmul: {
    saves: "inputs",
    grad: (g, c) => {
      const A = c.inputs[0]!;
      const B = c.inputs[1]!;
      let gg = g;
      if (A.ndim === 1) gg = gg.unsqueeze(Math.max(gg.ndim - 1, 0)); // g [..., N] -> [..., 1, N]
      if (B.ndim === 1) gg = gg.unsqueeze(-1);
      const a = A.ndim === 1 ? A.unsqueeze(0) : A;
      const b = B.ndim === 1 ? B.unsqueeze(1) : B;
      let ga: Tensor | null = null;
      let gb: Tensor | null = null;
      if (c.needsGrad[0]) {
        const bt = b.transpose(-2, -1);
        ga = la.matmul(gg, bt);
        bt.dispose();
        if (A.ndim === 1) ga = ga.squeeze(-2);
      }
      if (c.needsGrad[1]) {
        const at = a.transpose(-2, -1);
        gb = la.matmul(at, gg);
        at.dispose();
        if (B.ndim === 1) gb = gb.squeeze(-1);
      }
      return [ga, gb];
    },
  },
  // y = x @ W^T over flattened leading dims: dx = g @ W, dW = g^T @ x
  linear: {
    saves: "inputs",
    grad: (g, c) => {
      const x = c.inputs[0]!;
      const w = c.inputs[1]!;
      const [outF, inF] = w.shape as [number, number];
      const g2 = g.reshape(-1, outF);
      let gx: Tensor | null = null;
      let gw: Tensor | null = null;
      if (c.needsGrad[0]) {
        const d = la.matmul(g2, w);
        gx = d.reshape(...x.shape);
        if (gx !== d) d.dispose();
      }
      if (c.needsGrad[1]) {
        const x2 = x.reshape(-1, inF);
        const g2t = g2.transpose(0, 1);
        gw = la.matmul(g2t, x2);
        g2t.dispose();
        x2.dispose();
      }
      if (g2 !== g) g2.dispose();
      return [gx, gw];
    },
  },
};

const indexing: RuleTable = {
  // grad rows added into a zero table by a device kernel (indexSelectGrad)
  index_select: {
    saves: "none",
    grad: (g, c) => [indexSelectGrad(g, c.attrs.dim as number, c.attrs.index as Tensor, c.attrs.inputShape as Shape)],
  },
  gather: {
    saves: "none",
    grad: (g, c) => {
      const dim = c.attrs.dim as number;
      const index = c.attrs.index as Tensor;
      const inputShape = c.attrs.inputShape as Shape;
      // scatter needs index to cover the input in every dim but `dim`; pad afterwards when it does not
      const covered = inputShape.map((s, i) => (i === dim ? s : index.shape[i]!));
      const base = zeros(covered, { dtype: g.dtype, device: g.device }); // scatter takes src's dtype only
      const scattered = ix.scatter(base, dim, index, g, true);
      base.dispose();
      if (covered.every((s, i) => s === inputShape[i])) return [scattered];
      const out = placeInto(inputShape, scattered, (z) => narrowTo(z, covered));
      scattered.dispose();
      return [out];
    },
  },
  scatter: { saves: "none", grad: (g, c) => scatterGrad(g, c, false) },
  scatter_add: { saves: "none", grad: (g, c) => scatterGrad(g, c, true) },
  cat: {
    saves: "none",
    grad: (g, c) => {
      const dim = c.attrs.dim as number;
      const sizes = c.attrs.sizes as number[];
      let at = 0;
      return sizes.map((s, i) => {
        const part = c.needsGrad[i] ? g.narrow(dim, at, s) : null;
        at += s;
        return part;
      });
    },
  },
};

function narrowTo(t: Tensor, shape: Shape): Tensor {
  let v = t;
  for (let d = 0; d < shape.length; d++) {
    if (shape[d] === v.shape[d]) continue;
    const next = v.narrow(d, 0, shape[d]!);
    if (v !== t) v.dispose();
    v = next;
  }
  return v;
}

function scatterGrad(g: Tensor, c: BackwardContext, accumulate: boolean): (Tensor | null)[] {
  const dim = c.attrs.dim as number;
  const index = c.attrs.index as Tensor;
  let gt: Tensor | null = null;
  if (c.needsGrad[0]) {
    if (accumulate) gt = g;
    else {
      // overwritten positions do not depend on the input
      const z = zeros(index.shape, { dtype: g.dtype, device: g.device });
      gt = ix.scatter(g, dim, index, z);
      z.dispose();
    }
  }
  let gs: Tensor | null = null;
  if (c.needsGrad[2]) {
    const picked = ix.gather(g, dim, index);
    const srcShape = c.inputShapes[2]!;
    gs = picked.shape.every((s, i) => s === srcShape[i]) ? picked : placeInto(srcShape, picked, (z) => narrowTo(z, picked.shape));
    if (gs !== picked) picked.dispose();
  }
  return [gt, null, gs];
}

function indexSelectGrad(g: Tensor, dim: number, index: Tensor, inputShape: Shape): Tensor {
  // On the device, along any dim and in any dtype: g's rows along `dim` brought to the front (g [.., numIds, ..] ->
  // [numIds, rest]), added in float32 into a zero table [inputShape[dim], rest] in index order (index_add_rows: an
  // embedding's gradient makes no host pass over the table), moved back into place, in g's dtype.
  const others = inputShape.map((_, i) => i).filter((i) => i !== dim);
  const moved = dim === 0 ? g : g.permute(dim, ...others);
  const src = moved.dtype === "float32" ? moved : moved.to("float32");
  if (moved !== g && moved !== src) moved.dispose();
  const acc = zeros([inputShape[dim]!, ...others.map((i) => inputShape[i]!)], { dtype: "float32", device: g.device });
  ix.indexAddRowsInto(acc, index, src);
  if (src !== g) src.dispose();
  let out = acc;
  if (dim !== 0) {
    // acc's dims are [dim, ...others]: dim i of the input is acc's dim 0 (i == dim) or its place among the others
    const p = acc.permute(...inputShape.map((_, i) => (i === dim ? 0 : i < dim ? i + 1 : i)));
    out = p.contiguous();
    if (p !== out) p.dispose();
    acc.dispose();
  }
  if (out.dtype === g.dtype) return out;
  const cast = out.to(g.dtype);
  out.dispose();
  return cast;
}

export const structuralRules: RuleTable = { ...views, ...reductions, ...linalg, ...indexing };
