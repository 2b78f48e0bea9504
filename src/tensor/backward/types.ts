// The contract between the autograd engine (tensor/autograd.ts) and the per-op backward formulas.
import type { Shape, Tensor } from "../tensor.js";

/** What a backward formula sees: the values its op saved, its attrs, and which inputs want a grad. */
export interface BackwardContext {
  readonly op: string;
  /** Saved input values (detached views), aligned with the op's inputs; null for scalars or unsaved. */
  readonly inputs: readonly (Tensor | null)[];
  /** The saved output (a detached view) when the rule asked for it. */
  readonly output: Tensor | null;
  /** The op's attrs; tensors in them are detached views the node owns. */
  readonly attrs: Readonly<Record<string, unknown>>;
  /** needsGrad[i]: input i is a tensor that requires grad (skip work for the others). */
  readonly needsGrad: readonly boolean[];
  readonly inputShapes: readonly (Shape | null)[];
}

/**
 * One op's vector-Jacobian product. `grad` returns one gradient per input (null = none); a gradient may
 * have the output's (broadcast) shape: the engine sum-reduces it to the input's shape. Runs under noGrad.
 * A returned tensor is owned by the engine; returning `g` itself is allowed.
 */
export interface BackwardRule {
  readonly saves: "none" | "inputs" | "output" | "both";
  grad(g: Tensor, ctx: BackwardContext): (Tensor | null)[];
}

export type RuleTable = Record<string, BackwardRule>;
