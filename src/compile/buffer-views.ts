// How a kernel's BufferView reads memory, in IR terms: a dense block of the buffer read as a shape (1 on
// broadcast dims) or as a permutation of a dense block (transposed reads). Shared by the two recorders that
// turn KernelCalls into IR: defer.ts (defer-and-fuse) and capture.ts (compile()'s dispatch capture).
import type { BufferView } from "../backends/backend.js";
import { contiguousStrides } from "../tensor/index.js";

/** How an elementwise input view reads memory: a dense block at `offset`, as `shape` (1 on broadcast dims)
 *  or, for a transposed read, as the dense `memShape` permuted by `dims`. */
export interface ReadPlan {
  offset: number;
  numel: number;
  shape: number[];
  perm: { memShape: number[]; dims: number[] } | null;
}

export function analyzeRead(v: BufferView): ReadPlan | null {
  const r = v.shape.length;
  const live: number[] = [];
  for (let d = 0; d < r; d++) if (v.shape[d]! > 1 && v.strides[d] !== 0) live.push(d);
  const byStride = [...live].sort((a, b) => v.strides[b]! - v.strides[a]!);
  let expect = 1;
  for (let i = byStride.length - 1; i >= 0; i--) {
    const d = byStride[i]!;
    if (v.strides[d] !== expect) return null;
    expect *= v.shape[d]!;
  }
  const numel = expect;
  const shape = v.shape.map((s, d) => (live.includes(d) ? s : 1));
  const inOrder = live.every((d, i) => d === byStride[i]);
  if (inOrder) return { offset: v.offset, numel, shape, perm: null };
  if (live.length !== v.shape.filter((s) => s > 1).length) return null; // transposed and broadcast: eager
  // memory order: all dims sorted by stride (size-1 dims anywhere), output dim i = memory dim dims[i]
  const all = v.shape.map((_, d) => d).sort((a, b) => (v.shape[b]! > 1 ? v.strides[b]! : 0) - (v.shape[a]! > 1 ? v.strides[a]! : 0));
  const memShape = all.map((d) => v.shape[d]!);
  const dims = v.shape.map((_, d) => all.indexOf(d));
  return { offset: v.offset, numel, shape: [...v.shape], perm: { memShape, dims } };
}

export function isDense(v: BufferView): boolean {
  const cs = contiguousStrides(v.shape);
  return v.shape.every((s, d) => s === 1 || v.strides[d] === cs[d]);
}

/** The shape without leading 1s, as text (equal texts: a reshape is not needed). */
export const strip = (s: readonly number[]) => s.slice(s.findIndex((x) => x !== 1) < 0 ? s.length : s.findIndex((x) => x !== 1)).join();
