// Activation checkpointing (torch.utils.checkpoint): a region's forward runs without recording autograd history, so
// none of its intermediate activations stay alive until backward; only its inputs are saved. When backward reaches
// the region's output, the node recomputes the region with history on (from the saved inputs, replaying the default
// generator's draws), runs backward through that recomputation, and hands the inputs' gradients on. Parameters used
// inside the region get their gradients during that inner backward, as torch's reentrant checkpoint gives them.
// With a policy (selective-checkpoint.ts), the outputs of the ops it picks are kept from the forward and handed back
// in the recomputation instead of being computed again (torch's selective checkpointing, TorchTitan's op SAC).
import { isFloating } from "../backends/dtype.js";
import { OpError } from "../util/errors.js";
import { backward, type BackwardNode } from "./autograd.js";
import { asCheckpointRegion, isGradEnabled, noGrad, setGradEnabled } from "./grad-mode.js";
import { defaultGenerator } from "./ops/random.js";
import { inSacPass, runSacPass, SacRegion, type SacPolicy } from "./selective-checkpoint.js";
import { Tensor } from "./tensor.js";

export interface CheckpointOptions {
  /**
   * Tensors the region reads besides its inputs (a module's parameters). The region's output requires grad when an
   * input or one of these does: with neither, nothing inside can receive a gradient, as torch warns.
   */
  parameters?: readonly Tensor[];
  /** Replay the default generator's draws in the recomputation (torch's preserve_rng_state; default true). */
  preserveRngState?: boolean;
  /**
   * Op-level selective checkpointing (torch's context_fn = create_selective_checkpoint_contexts(policy)): the ops the
   * policy saves keep their outputs from the forward and are not recomputed in backward (e.g. opSacPolicy,
   * TorchTitan's). Without it every op of the region is recomputed.
   */
  policy?: SacPolicy;
}

type Region = (...inputs: Tensor[]) => Tensor;

/** Runs fn with autograd history on (torch.enable_grad), whatever the caller's mode. */
function withGrad<T>(fn: () => T): T {
  const prev = isGradEnabled();
  setGradEnabled(true);
  try {
    return fn();
  } finally {
    setGradEnabled(prev);
  }
}

class CheckpointNode implements BackwardNode {
  readonly op = "checkpoint";
  readonly attrs: Record<string, unknown> = {};
  private saved: Tensor[] | null;
  private readonly versions: number[];

  constructor(
    private readonly fn: Region,
    readonly inputs: Tensor[],
    private readonly rngState: { seed: number; counter: number } | null,
    private readonly sac: SacRegion | null,
  ) {
    this.saved = inputs.map((t) => t.detach());
    this.versions = this.saved.map((t) => t.storage.version);
  }

  backward(g: Tensor): (Tensor | null)[] {
    const saved = this.saved;
    if (saved === null)
      throw new OpError(this.op, "backward through a graph whose saved values were already freed; pass { retainGraph: true } to the first backward()");
    saved.forEach((t, i) => {
      if (t.storage.version !== this.versions[i])
        throw new OpError(this.op, `input ${i} of the checkpointed region was modified by an in-place operation after the forward (storage version ${t.storage.version}, saved at ${this.versions[i]}); clone() it first`);
    });
    // leaves standing for the inputs: the recomputation's gradients for them land in their .grad
    const leaves = saved.map((t, i) => t.detach().requiresGrad_(this.inputs[i]!.requiresGrad));
    const now = defaultGenerator.getState();
    if (this.rngState) defaultGenerator.setState(this.rngState);
    let out: Tensor;
    try {
      const sac = this.sac;
      out = withGrad(() => asCheckpointRegion(() => (sac === null ? this.fn(...leaves) : runSacPass(sac, true, () => this.fn(...leaves)))));
    } finally {
      defaultGenerator.setState(now);
    }
    try {
      if (out.requiresGrad) backward(out, g);
      return leaves.map((leaf) => {
        const grad = leaf.grad;
        leaf.grad = null;
        return grad;
      });
    } finally {
      out.dispose();
      for (const leaf of leaves) leaf.dispose();
    }
  }

  release(): void {
    for (const t of this.saved ?? []) t.dispose();
    this.saved = null;
    this.sac?.release();
  }
}

/**
 * torch.utils.checkpoint.checkpoint: `fn(...inputs)`, keeping none of the region's activations for backward (they are
 * recomputed when backward reaches its output). Gradients equal those of calling fn directly; the cost is one more
 * forward of the region per backward. Without grad mode, or when neither an input nor `options.parameters` requires
 * grad, it is a plain call. fn must return one floating tensor that is not one of its inputs, compute it from the
 * inputs and parameters only (no random draws from a generator other than the default one), and not change its
 * inputs in place. A checkpoint inside a region run with a policy is a plain call (its ops belong to that region).
 * @example
 *   // a transformer block whose activations are recomputed in backward
 *   const h2 = checkpoint((x) => block.forward(x, ctx), [h], { parameters: block.parameters() });
 *   // the same, keeping the outputs of the projections TorchTitan's op-level policy saves
 *   const h3 = checkpoint((x) => block.forward(x, ctx), [h], { parameters: block.parameters(), policy: opSacPolicy });
 */
export function checkpoint(fn: Region, inputs: readonly Tensor[], options: CheckpointOptions = {}): Tensor {
  const needsGrad = inputs.some((t) => t.requiresGrad) || (options.parameters ?? []).some((t) => t.requiresGrad);
  const policy = options.policy;
  if (policy !== undefined && typeof policy !== "function")
    throw new OpError("checkpoint", `policy must be a function (op, callIndex) => "save" | "recompute", got ${typeof policy}`);
  if (!isGradEnabled() || !needsGrad || inSacPass()) return fn(...inputs);
  const rngState = options.preserveRngState === false ? null : defaultGenerator.getState();
  const sac = policy === undefined ? null : new SacRegion(policy);
  let out: Tensor;
  try {
    out = noGrad(() => asCheckpointRegion(() => (sac === null ? fn(...inputs) : runSacPass(sac, false, () => fn(...inputs)))));
    if (!(out instanceof Tensor)) throw new OpError("checkpoint", `the checkpointed function must return a Tensor, got ${typeof out}`);
    if (inputs.includes(out)) {
      throw new OpError("checkpoint", "the checkpointed function returned one of its inputs; there is nothing to recompute");
    }
    if (!isFloating(out.dtype))
      throw new OpError("checkpoint", `the checkpointed function's output must be floating point, got ${out.dtype}`);
  } catch (e) {
    sac?.release();
    throw e;
  }
  out.gradFn = new CheckpointNode(fn, [...inputs], rngState, sac);
  out.requiresGrad = true;
  return out;
}
