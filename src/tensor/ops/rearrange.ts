// Rearranging ops composed of differentiable primitives: flip (index_select with reversed indices), roll (two
// narrows and a cat), repeat / tile / repeatInterleave (expand and reshape) and pad (narrow, cat, expand).
import { OpError } from "../../util/errors.js";
import { full, tensor, Tensor } from "../tensor.js";
import { cat, indexSelect } from "./indexing.js";
import { normDim } from "./shape.js";

/** dims as a normalised, duplicate-free list. */
function dimList(op: string, dims: number | readonly number[], ndim: number): number[] {
  const ds = (typeof dims === "number" ? [dims] : [...dims]).map((d) => normDim(d, ndim, op));
  if (new Set(ds).size !== ds.length) throw new OpError(op, `dims [${ds.join(", ")}] has a repeated dim`);
  return ds;
}

/**
 * Applies f to x for each step, disposing the intermediates (never x itself); returns a tensor x's caller may dispose
 * separately (a clone when there is no step).
 */
function chain<T>(x: Tensor, steps: readonly T[], f: (cur: Tensor, step: T) => Tensor): Tensor {
  let cur = x;
  for (const s of steps) {
    const next = f(cur, s);
    if (cur !== x) cur.dispose();
    cur = next;
  }
  return cur === x ? x.clone() : cur;
}

/**
 * torch.flip: reverses the order of elements along dims (a copy).
 * @example flip(tensor([[1, 2], [3, 4]]), [1]).toList() // [2, 1, 4, 3]
 */
export function flip(x: Tensor, dims: number | readonly number[]): Tensor {
  const ds = dimList("flip", dims, x.ndim);
  if (x.numel === 0) return x.clone(); // nothing to move (index_select would read rows that are not there)
  return chain(x, ds, (cur, d) => {
    const n = cur.shape[d] ?? 1; // a 0-d x flips along its dim 0 (or -1) as a 1-element vector
    const index = tensor(Int32Array.from({ length: n }, (_, i) => n - 1 - i), { device: x.device });
    const out = indexSelect(cur, d, index);
    index.dispose();
    return out;
  });
}

/**
 * torch.roll: shifts elements along dims (wrapping around); with dims omitted, over the flattened x (shape kept).
 * @example roll(tensor([1, 2, 3, 4]), 1).toList() // [4, 1, 2, 3]
 */
export function roll(x: Tensor, shifts: number | readonly number[], dims?: number | readonly number[]): Tensor {
  const op = "roll";
  const ss = typeof shifts === "number" ? [shifts] : [...shifts];
  if (ss.some((s) => !Number.isInteger(s))) throw new OpError(op, `shifts must be integers, got [${ss.join(", ")}]`);
  if (dims === undefined) {
    if (ss.length !== 1) throw new OpError(op, `shifts [${ss.join(", ")}] need dims (one shift rolls the flattened tensor)`);
    const flat = x.reshape(-1);
    const rolled = roll(flat, ss[0]!, 0);
    const out = rolled.reshape(x.shape);
    flat.dispose();
    rolled.dispose();
    return out;
  }
  const ds = (typeof dims === "number" ? [dims] : [...dims]).map((d) => normDim(d, x.ndim, op));
  if (ds.length !== ss.length) throw new OpError(op, `shifts and dimensions must align. shifts: ${ss.length}, dims: ${ds.length}`);
  return chain(x, ds.map((d, i) => [d, ss[i]!] as const), (cur, [d, s]) => {
    const n = cur.shape[d] ?? 1; // a 0-d x rolls along its dim 0 (or -1) as a 1-element vector
    const k = n === 0 ? 0 : ((s % n) + n) % n;
    if (k === 0) return cur.clone();
    const tail = cur.narrow(d, n - k, k);
    const head = cur.narrow(d, 0, n - k);
    const out = cat([tail, head], d);
    tail.dispose();
    head.dispose();
    return out;
  });
}

/**
 * Tensor.repeat: tiles x sizes[i] times along dim i; sizes may be longer than x's rank (new leading dims).
 * @example repeat(tensor([1, 2]), 2, 2).toList() // [1, 2, 1, 2, 1, 2, 1, 2] ([2, 4])
 */
export function repeat(x: Tensor, ...sizes: number[]): Tensor {
  const op = "repeat";
  if (sizes.length < x.ndim)
    throw new OpError(op, `Number of dimensions of repeat dims (${sizes.length}) can not be smaller than number of dimensions of tensor (${x.ndim})`);
  if (sizes.some((s) => !Number.isInteger(s) || s < 0)) throw new OpError(op, `repeats must be non-negative integers, got [${sizes.join(", ")}]`);
  const shape = [...new Array<number>(sizes.length - x.ndim).fill(1), ...x.shape];
  // [1, s0, 1, s1, ...] expanded to [r0, s0, r1, s1, ...], then merged pairwise
  const interleaved = x.reshape(shape.flatMap((s) => [1, s]));
  const expanded = interleaved.expand(shape.flatMap((s, i) => [sizes[i]!, s]));
  const out = expanded.reshape(shape.map((s, i) => s * sizes[i]!));
  interleaved.dispose();
  expanded.dispose();
  return out;
}

/** torch.tile: repeat, with dims shorter than x's rank padded with leading ones. */
export function tile(x: Tensor, dims: readonly number[]): Tensor {
  return repeat(x, ...new Array<number>(Math.max(0, x.ndim - dims.length)).fill(1), ...dims);
}

/**
 * torch.repeat_interleave with a scalar count: each element repeated `repeats` times along dim (the flattened x
 * when dim is omitted).
 * @example repeatInterleave(tensor([1, 2]), 2).toList() // [1, 1, 2, 2]
 */
export function repeatInterleave(x: Tensor, repeats: number, dim?: number): Tensor {
  const op = "repeat_interleave";
  if (!Number.isInteger(repeats) || repeats < 0) throw new OpError(op, `repeats must be a non-negative integer, got ${repeats}`);
  if (dim === undefined) {
    const flat = x.reshape(-1);
    const out = repeatInterleave(flat, repeats, 0);
    flat.dispose();
    return out;
  }
  const d = normDim(dim, x.ndim, op);
  if (x.ndim === 0) return repeat(x, repeats);
  const u = x.unsqueeze(d + 1);
  const e = u.expand(x.shape.flatMap((s, i) => (i === d ? [s, repeats] : [s])));
  const out = e.reshape(x.shape.map((s, i) => (i === d ? s * repeats : s)));
  u.dispose();
  e.dispose();
  return out;
}

export type PadMode = "constant" | "reflect" | "replicate" | "circular";

/**
 * torch.nn.functional.pad: pad = [left, right] of the last dim, then of the one before, ...; negative amounts crop.
 * "constant" fills with value; "reflect" mirrors without repeating the edge (each amount < the dim's size);
 * "replicate" repeats the edge; "circular" wraps around (each amount <= the dim's size). Always a new tensor.
 * @example pad(tensor([1, 2]), [1, 2]).toList() // [0, 1, 2, 0, 0]
 */
export function pad(x: Tensor, amounts: readonly number[], mode: PadMode = "constant", value = 0): Tensor {
  const op = "pad";
  if (amounts.length % 2 !== 0) throw new OpError(op, `Padding length must be divisible by 2, got ${amounts.length}`);
  if (amounts.length / 2 > x.ndim) throw new OpError(op, `Padding length ${amounts.length} too large for a ${x.ndim}-d input`);
  if (amounts.some((a) => !Number.isInteger(a))) throw new OpError(op, `pad amounts must be integers, got [${amounts.join(", ")}]`);
  if (mode !== "constant" && value !== 0) throw new OpError(op, `padding mode "${mode}" doesn't take in value argument`);
  const steps = Array.from({ length: amounts.length / 2 }, (_, i) => ({ d: x.ndim - 1 - i, left: amounts[2 * i]!, right: amounts[2 * i + 1]! }));
  for (const { d, left, right } of steps) {
    const n = x.shape[d]!;
    if (n + Math.min(left, 0) + Math.min(right, 0) < 0)
      throw new OpError(op, `padding [${left}, ${right}] crops more than the size ${n} of dim ${d}`);
    if (mode === "constant") continue;
    if (left < 0 || right < 0) throw new OpError(op, `negative padding is supported only in "constant" mode, got [${left}, ${right}] for dim ${d}`);
    if (n === 0 && left + right > 0) throw new OpError(op, `${mode} padding needs a non-empty dim ${d}`);
    const limit = mode === "reflect" ? n - 1 : mode === "circular" ? n : Infinity;
    if (left > limit || right > limit)
      throw new OpError(op, `padding [${left}, ${right}] must be ${mode === "reflect" ? "<" : "<="} the size ${n} of dim ${d} in ${mode} mode`);
  }
  return chain(x, steps, (cur, { d, left, right }) => {
    const n = cur.shape[d]!;
    // crops first (constant mode's negative amounts), then the pieces either side
    const lo = Math.max(0, -left);
    const hi = Math.max(0, -right);
    const core = cur.narrow(d, lo, Math.max(0, n - lo - hi));
    const parts = [edge(core, d, Math.max(0, left), "left", mode, value), core, edge(core, d, Math.max(0, right), "right", mode, value)];
    const kept = parts.filter((p) => p.shape[d]! > 0 || p === core);
    const out = kept.length === 1 ? core.clone() : cat(kept, d);
    for (const p of parts) p.dispose();
    return out;
  });
}

/** The `amount`-wide piece that pad puts on one side of x along d. */
function edge(x: Tensor, d: number, amount: number, side: "left" | "right", mode: PadMode, value: number): Tensor {
  const n = x.shape[d]!;
  const shape = x.shape.map((s, i) => (i === d ? amount : s));
  if (amount === 0 || mode === "constant") return full(shape, value, { dtype: x.dtype, device: x.device });
  if (mode === "replicate") {
    const one = x.narrow(d, side === "left" ? 0 : n - 1, 1);
    const out = one.expand(shape);
    one.dispose();
    return out;
  }
  if (mode === "circular") return x.narrow(d, side === "left" ? n - amount : 0, amount);
  const mirror = x.narrow(d, side === "left" ? 1 : n - 1 - amount, amount);
  const out = flip(mirror, d);
  mirror.dispose();
  return out;
}

