// Matrix structure ops composed of differentiable primitives: tril / triu (a mask and where), diagonal (a strided
// slice of the flattened matrix), diag, outer, trace, addmm and baddbmm.
import { OpError } from "../../util/errors.js";
import { tensor, Tensor } from "../tensor.js";
import { maskedFill, mul, add } from "./elementwise.js";
import { bmm, matmul } from "./linalg.js";
import { sum } from "./reduce.js";
import { normDim } from "./shape.js";
import { pad } from "./rearrange.js";

/** Bool [rows, cols] mask of the entries strictly outside the band kept by tril (lower) or triu (upper). */
function outsideBand(rows: number, cols: number, diagonal: number, lower: boolean, x: Tensor): Tensor {
  const data = new Uint8Array(rows * cols);
  for (let i = 0; i < rows; i++)
    for (let j = 0; j < cols; j++) data[i * cols + j] = (lower ? j - i > diagonal : j - i < diagonal) ? 1 : 0;
  return tensor(data, { shape: [rows, cols], dtype: "bool", device: x.device });
}

function triangle(op: "tril" | "triu", x: Tensor, diagonal: number): Tensor {
  if (x.ndim < 2) throw new OpError(op, `expects at least 2 dims, got [${x.shape.join(", ")}]`);
  if (!Number.isInteger(diagonal)) throw new OpError(op, `diagonal must be an integer, got ${diagonal}`);
  const mask = outsideBand(x.shape[x.ndim - 2]!, x.shape[x.ndim - 1]!, diagonal, op === "tril", x);
  const out = maskedFill(x, mask, 0);
  mask.dispose();
  return out;
}

/**
 * torch.tril: the lower triangle of the last two dims (j - i <= diagonal kept, the rest 0); batched.
 * @example tril(tensor([[1, 2], [3, 4]])).toList() // [1, 0, 3, 4]
 */
export const tril = (x: Tensor, diagonal = 0): Tensor => triangle("tril", x, diagonal);

/** torch.triu: the upper triangle of the last two dims (j - i >= diagonal kept, the rest 0); batched. */
export const triu = (x: Tensor, diagonal = 0): Tensor => triangle("triu", x, diagonal);

/**
 * torch.diagonal: the entries x[..., i, i + offset, ...] of dims dim1 and dim2, as a new last dim (a view where x
 * is contiguous: a slice of stride cols + 1 over the flattened matrix; otherwise of a contiguous copy).
 * @example diagonal(tensor([[1, 2], [3, 4]]), 1).toList() // [2]
 */
export function diagonal(x: Tensor, offset = 0, dim1 = 0, dim2 = 1): Tensor {
  const op = "diagonal";
  if (x.ndim < 2) throw new OpError(op, `expects at least 2 dims, got [${x.shape.join(", ")}]`);
  const d1 = normDim(dim1, x.ndim, op);
  const d2 = normDim(dim2, x.ndim, op);
  if (d1 === d2) throw new OpError(op, `diagonal dimensions cannot be identical ${dim1}, ${dim2}`);
  const rest = x.shape.map((_, i) => i).filter((i) => i !== d1 && i !== d2);
  const moved = x.permute([...rest, d1, d2]);
  const [rows, cols] = [x.shape[d1]!, x.shape[d2]!];
  const flat = moved.reshape([...rest.map((i) => x.shape[i]!), rows * cols]);
  moved.dispose();
  const length = Math.max(0, offset >= 0 ? Math.min(rows, cols - offset) : Math.min(rows + offset, cols));
  const start = length === 0 ? 0 : offset >= 0 ? offset : -offset * cols;
  const end = length === 0 ? 0 : start + (length - 1) * (cols + 1) + 1;
  const out = flat.slice(-1, start, end, cols + 1);
  flat.dispose();
  return out;
}

/**
 * torch.diag: a 1-d x becomes the square matrix with x on its `diagonal`-th diagonal; a 2-d x gives that diagonal
 * (a copy).
 * @example diag(tensor([1, 2])).toList() // [1, 0, 0, 2]
 */
export function diag(x: Tensor, diagonalOffset = 0): Tensor {
  if (x.ndim === 2) {
    const d = diagonal(x, diagonalOffset);
    const out = d.contiguous();
    if (out !== d) d.dispose();
    return out;
  }
  if (x.ndim !== 1) throw new OpError("diag", `expects a 1-d or 2-d tensor, got [${x.shape.join(", ")}]`);
  const k = diagonalOffset;
  const size = x.shape[0]! + Math.abs(k);
  // row i of the result reads column j from padded[j]: x[j - k] (k >= 0) or x[j] (k < 0), kept where j - i == k
  const padded = pad(x, k >= 0 ? [k, 0] : [0, -k]);
  const rows = padded.unsqueeze(0);
  const square = rows.expand(size, size);
  const off = tensor(Uint8Array.from({ length: size * size }, (_, e) => (e % size) - Math.floor(e / size) !== k ? 1 : 0),
    { shape: [size, size], dtype: "bool", device: x.device });
  const out = maskedFill(square, off, 0);
  for (const t of [padded, rows, square, off]) t.dispose();
  return out;
}

/** torch.trace: the sum of a 2-d x's main diagonal. */
export function trace(x: Tensor): Tensor {
  if (x.ndim !== 2) throw new OpError("trace", `expects a matrix, got [${x.shape.join(", ")}]`);
  const d = diagonal(x);
  const out = sum(d);
  d.dispose();
  return out;
}

/**
 * torch.outer: a [n] and b [m] give a[i] * b[j] [n, m].
 * @example outer(tensor([1, 2]), tensor([3, 4])).toList() // [3, 4, 6, 8]
 */
export function outer(a: Tensor, b: Tensor): Tensor {
  if (a.ndim !== 1 || b.ndim !== 1) throw new OpError("outer", `expects 1-d tensors, got [${a.shape.join(", ")}] and [${b.shape.join(", ")}]`);
  const col = a.unsqueeze(1);
  const row = b.unsqueeze(0);
  const out = mul(col, row);
  col.dispose();
  row.dispose();
  return out;
}

export interface ScaleOptions {
  /** Multiplies input (default 1; 0 ignores input entirely, NaN included, as torch). */
  beta?: number;
  /** Multiplies the product (default 1). */
  alpha?: number;
}

/** beta * input + alpha * product (product disposed); input broadcasts to the product's shape. */
function scaledSum(op: string, input: Tensor, product: Tensor, { beta = 1, alpha = 1 }: ScaleOptions): Tensor {
  const scaled = alpha === 1 ? product : mul(product, alpha);
  if (scaled !== product) product.dispose();
  try {
    broadcastCheck(op, input, scaled); // torch checks it even when beta = 0 ignores input
  } catch (e) {
    scaled.dispose();
    throw e;
  }
  if (beta === 0) return scaled;
  const out = add(scaled, input, beta);
  scaled.dispose();
  return out;
}

/** input must broadcast to the product's shape (not the other way round). */
function broadcastCheck(op: string, input: Tensor, product: Tensor): void {
  const lead = product.ndim - input.ndim;
  if (lead < 0 || input.shape.some((s, i) => s !== 1 && s !== product.shape[lead + i]))
    throw new OpError(op, `input [${input.shape.join(", ")}] cannot be broadcast to [${product.shape.join(", ")}]`);
}

/**
 * torch.addmm: beta * input + alpha * (a @ b), a [n, k], b [k, m], input broadcastable to [n, m].
 * @example addmm(bias, x, w, { beta: 1, alpha: 2 })
 */
export function addmm(input: Tensor, a: Tensor, b: Tensor, options: ScaleOptions = {}): Tensor {
  if (a.ndim !== 2 || b.ndim !== 2) throw new OpError("addmm", `expects 2-d matrices, got [${a.shape.join(", ")}] and [${b.shape.join(", ")}]`);
  return scaledSum("addmm", input, matmul(a, b), options);
}

/** torch.baddbmm: beta * input + alpha * bmm(b1, b2), b1 [B, n, k], b2 [B, k, m], input broadcastable to [B, n, m]. */
export function baddbmm(input: Tensor, b1: Tensor, b2: Tensor, options: ScaleOptions = {}): Tensor {
  if (b1.ndim !== 3 || b2.ndim !== 3) throw new OpError("baddbmm", `expects 3-d tensors, got [${b1.shape.join(", ")}] and [${b2.shape.join(", ")}]`);
  return scaledSum("baddbmm", input, bmm(b1, b2), options);
}
