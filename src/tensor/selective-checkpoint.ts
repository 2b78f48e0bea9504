// Op-level selective activation checkpointing (torch's create_selective_checkpoint_contexts, TorchTitan's op SAC).
// A checkpointed region run with a policy keeps the outputs of the ops the policy picks from its no-history forward;
// when backward recomputes the region, those ops hand back the kept tensors instead of running again, while every
// other op (norms, elementwise, rotary, softmax...) is recomputed. The op still records its autograd node in the
// recomputation (with the kept tensor as its output), so gradients reach its inputs as without the policy.
//
// Ops take part through sacSite(): the matrix products of linear() and matmul() ("mm", torch's aten.mm / bmm) and
// attention ("attention", scaled_dot_product_attention: the flash kernel's output and log-sum-exp, or the composed
// form's output product). checkpoint.ts opens a run around each
// pass over the region (the forward, then each recomputation); sites count their calls per op within that run.
import { OpError } from "../util/errors.js";
import type { Tensor } from "./tensor.js";

/**
 * The ops a policy decides on. "mm": the product of every linear() and matmul() (torch's aten.mm, the projections);
 * "attention": causalAttention's output (torch's scaled_dot_product_attention): the flash kernel's whole forward (what
 * training runs), or the composed form's output product (its scores and softmax, which its backward needs, are
 * recomputed).
 */
export type SacOp = "mm" | "attention";

/** "save": keep the output from the forward for the recomputation (MUST_SAVE); "recompute": run it again (PREFER_RECOMPUTE). */
export type SacDecision = "save" | "recompute";

/**
 * torch's selective checkpoint policy_fn, called once per op call in the region's forward. `callIndex`: how many calls
 * of `op` came before this one in that forward (0-based); the recomputation replays the forward's decisions.
 */
export type SacPolicy = (op: SacOp, callIndex: number) => SacDecision;

/**
 * TorchTitan's op-level policy (`_apply_op_sac`): attention outputs are saved, and matrix products are saved except
 * every second one (its 1-based mm count: `count % 2 == 0` recomputes, so the 1st, 3rd, 5th... are saved).
 * @example
 *   const h2 = checkpoint((x) => block.forward(x, ctx), [h], { parameters: block.parameters(), policy: opSacPolicy });
 */
export const opSacPolicy: SacPolicy = (op, callIndex) => (op === "attention" || callIndex % 2 === 0 ? "save" : "recompute");

/** A policy returned something other than "save" or "recompute". */
export class CheckpointPolicyError extends OpError {
  override name = "CheckpointPolicyError";
  constructor(
    readonly sacOp: SacOp,
    readonly callIndex: number,
    readonly returned: unknown,
  ) {
    super("checkpoint", `the selective checkpoint policy returned ${describe(returned)} for ${sacOp} call ${callIndex}; expected "save" or "recompute"`);
  }
}

function describe(v: unknown): string {
  if (typeof v === "string") return JSON.stringify(v);
  if (typeof v === "function") return "a function";
  return String(v);
}

/** What one region keeps between its forward and its recomputations: op outputs by (op, call index). */
export class SacRegion {
  private readonly saved = new Map<string, { values: Tensor[]; versions: number[]; reads: string }>();
  private readonly counts = new Map<SacOp, number>();
  private recomputing = false;

  constructor(readonly policy: SacPolicy) {}

  /** Starts a pass over the region: the forward (policy decides, outputs kept) or a recomputation (kept outputs read). */
  begin(recomputing: boolean): void {
    this.recomputing = recomputing;
    this.counts.clear();
  }

  site(op: SacOp, inputs: readonly Tensor[], compute: () => Tensor[]): Tensor[] {
    const index = this.counts.get(op) ?? 0;
    this.counts.set(op, index + 1);
    const key = `${op}#${index}`;
    // the inputs' dtypes and shapes: a recomputation that reaches a kept call with other ones ran other ops
    const reads = inputs.map((t) => `${t.dtype}[${t.shape.join(", ")}]`).join(", ");
    if (!this.recomputing) {
      const decision: unknown = this.policy(op, index);
      if (decision !== "save" && decision !== "recompute") throw new CheckpointPolicyError(op, index, decision);
      const outs = compute();
      if (decision === "save") this.saved.set(key, { values: outs.map((t) => t.detach()), versions: outs.map((t) => t.storage.version), reads });
      return outs;
    }
    const kept = this.saved.get(key);
    if (kept === undefined) return compute();
    if (kept.reads !== reads)
      throw new OpError("checkpoint", `the recomputation's ${op} call ${index} reads ${reads} where the forward's read ${kept.reads}; the region must run the same ops each time`);
    kept.values.forEach((value, i) => {
      if (value.storage.version !== kept.versions[i])
        throw new OpError("checkpoint", `the saved output of ${op} call ${index} was modified by an in-place operation after the forward computed it (storage version ${value.storage.version}, saved at ${kept.versions[i]}); clone() it before modifying it`);
    });
    return kept.values.map((value) => value.detach());
  }

  /** Frees the kept outputs (the region's node is done with them). */
  release(): void {
    for (const { values } of this.saved.values()) for (const value of values) value.dispose();
    this.saved.clear();
  }
}

let active: SacRegion | null = null;

/** Runs fn as one pass over `region` (its sites count from 0); the previous region, if any, is restored after. */
export function runSacPass<T>(region: SacRegion, recomputing: boolean, fn: () => T): T {
  const prev = active;
  active = region;
  region.begin(recomputing);
  try {
    return fn();
  } finally {
    active = prev;
  }
}

/** Whether a pass over a policy region is running (a checkpoint inside it runs as a plain call, one region). */
export function inSacPass(): boolean {
  return active !== null;
}

/**
 * An op's selectable computation: compute() outside a policy region; inside one, the forward keeps what the policy
 * picks and the recomputation returns it (a fresh view the caller owns) instead of calling compute(). The caller
 * records its autograd node on the result either way. `inputs`: the tensors the op reads (checked on reuse).
 */
export function sacSite(op: SacOp, inputs: readonly Tensor[], compute: () => Tensor): Tensor {
  return active === null ? compute() : active.site(op, inputs, () => [compute()])[0]!;
}

/** sacSite for an op with several outputs (flash attention's output and log-sum-exp), kept or recomputed together. */
export function sacSites(op: SacOp, inputs: readonly Tensor[], compute: () => Tensor[]): Tensor[] {
  return active === null ? compute() : active.site(op, inputs, compute);
}
