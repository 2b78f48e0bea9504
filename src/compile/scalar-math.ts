// Scalar semantics of the elementwise ops, shared by constant folding (the C renderer has its own
// spelling of the same formulas, in codegen-c.ts).
import type { BinaryOp, DType, UnaryOp } from "./ir.js";
import { integerBinary, wrapsInInt32 } from "../backends/int-math.js";

function erf(x: number): number {
  // Abramowitz-Stegun 7.1.26 is too coarse for folding; use a series/continued-fraction split.
  const t = Math.abs(x);
  if (t < 2.5) {
    let sum = t;
    let term = t;
    for (let n = 1; n < 60; n++) {
      term *= (-t * t) / n;
      sum += term / (2 * n + 1);
    }
    return Math.sign(x) * (2 / Math.sqrt(Math.PI)) * sum;
  }
  let cf = 0;
  for (let n = 60; n >= 1; n--) cf = n / 2 / (t + cf);
  return Math.sign(x) * (1 - Math.exp(-t * t) / Math.sqrt(Math.PI) / (t + cf));
}

/** fn(x) computed as the kernels compute it for a result of `dtype` (integer square wraps). */
export function evalUnary(fn: UnaryOp, x: number, dtype: DType): number {
  switch (fn) {
    case "neg": return -x;
    case "exp": return Math.exp(x);
    case "log": return Math.log(x);
    case "sqrt": return Math.sqrt(x);
    case "rsqrt": return 1 / Math.sqrt(x);
    case "tanh": return Math.tanh(x);
    case "sigmoid": return 1 / (1 + Math.exp(-x));
    case "silu": return x / (1 + Math.exp(-x));
    case "gelu": return 0.5 * x * (1 + erf(x / Math.SQRT2));
    case "gelu_tanh": return 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x * x * x)));
    case "abs": return Math.abs(x);
    case "reciprocal": return 1 / x;
    case "sin": return Math.sin(x);
    case "cos": return Math.cos(x);
    case "square": return wrapsInInt32(dtype) ? Math.imul(x, x) : x * x;
    case "relu": return Math.max(0, x);
    case "floor": return Math.floor(x);
    case "ceil": return Math.ceil(x);
    case "round": { const r = Math.round(x); return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r; }
    case "sign": return Number(x > 0) - Number(x < 0); // as the eager kernel: NaN gives 0
    case "logical_not": return x === 0 ? 1 : 0;
  }
}

/** fn(a, b) computed as the kernels compute it for a result of `dtype` (integer mul and pow wrap: int-math.ts). */
export function evalBinary(fn: BinaryOp, a: number, b: number, dtype: DType): number {
  const int = integerBinary(fn, dtype);
  if (int) return int(a, b);
  switch (fn) {
    case "add": return a + b;
    case "sub": return a - b;
    case "mul": return a * b;
    case "div": return a / b;
    case "pow": return a === 1 || (a === -1 && Math.abs(b) === Infinity) ? 1 : a ** b; // C's pow: 1 ** NaN is 1 (JS: NaN)
    case "maximum": return Math.max(a, b);
    case "minimum": return Math.min(a, b);
    case "remainder": { const r = a % b; return r !== 0 && r < 0 !== b < 0 ? r + b : r; }
    case "eq": return a === b ? 1 : 0;
    case "ne": return a !== b ? 1 : 0;
    case "lt": return a < b ? 1 : 0;
    case "le": return a <= b ? 1 : 0;
    case "gt": return a > b ? 1 : 0;
    case "ge": return a >= b ? 1 : 0;
    case "logical_and": return a !== 0 && b !== 0 ? 1 : 0;
    case "logical_or": return a !== 0 || b !== 0 ? 1 : 0;
  }
}
