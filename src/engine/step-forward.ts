// What a step graph computes (step-graphs.ts captures it once per bucket): a forward from the bucket's persistent
// inputs to its outputs. The served model's (and a draft model's) forward returns the sampled rows' logits and their
// argmax, and, for an EAGLE drafter, the hidden rows it reads of every token; an EAGLE head's forward (eagle-runner.ts)
// also takes a float row per token and returns its sampled rows' output hidden states.
import type { Device } from "../tensor/device.js";
import type { CausalLM } from "../models/causal-lm.js";
import { cat, type Tensor } from "../tensor/index.js";
import type { HiddenStatesRequest } from "./model-runner.js";

/** A bucket's persistent inputs, by the names recordings give them. Shapes for a bucket of T tokens and R sampled rows. */
export interface StepGraphInputs {
  ids: Tensor; // int32 [T]
  positions: Tensor; // int32 [T]
  slots: Tensor; // int32 [T]
  queryStart: Tensor; // int32 [T + 1]
  seqLens: Tensor; // int32 [T]
  tables: Tensor; // int32 [T, maxBlocksPerSeq]
  /** Mixed buckets: the sampled rows (int32 [R]); decode buckets sample every row (null). */
  rowIndex: Tensor | null;
  /** With LoRA, each token's slot (int32 [T], -1: none); else null. */
  loraSlots: Tensor | null;
  /** StepForward.inputWidth > 0: each token's float row (float32 [T, inputWidth]); else null. */
  rowInputs: Tensor | null;
}

/** A captured forward's outputs (kept by the bucket: replays rewrite them). */
export interface StepOutputs {
  logits: Tensor; // [R, vocab]
  argmax: Tensor; // int32 [R]
  /** StepForward.hiddenRows: float32 [T, width] ("tokens") or [R, width] ("sampled"); else null. */
  hidden: Tensor | null;
}

export interface StepForward {
  readonly device: Device;
  /** Token ids a step may hold: [0, vocabSize) (replays trust their metadata, so launches check it). */
  readonly vocabSize: number;
  /** Width of each token's float input row (StepGraphInputs.rowInputs), 0 for none. */
  readonly inputWidth: number;
  /** Which hidden rows the outputs hold: every token's, the sampled rows', or none (null). */
  readonly hiddenRows: "tokens" | "sampled" | null;
  /** Traced once per bucket inside the capture (under noGrad, maybe defer-and-fuse). */
  trace(inputs: StepGraphInputs, kvCaches: { k: Tensor; v: Tensor }[]): StepOutputs;
}

/** `t` as float32 (the tensor itself when it is; else a cast, `t` disposed): hidden rows return as float32, as eagerly. */
export function asFloat32(t: Tensor): Tensor {
  if (t.dtype === "float32") return t;
  const out = t.to("float32");
  t.dispose();
  return out;
}

/**
 * A served (or draft) model's step: logits of the sampled rows and their argmax; with `hiddenStates`, also the hidden
 * rows an EAGLE drafter reads of every token, as the eager runner returns them (paged-model-runner.ts hiddenRows): the
 * final normed states, or the residual streams entering the aux layers side by side per row in layer order.
 */
export function causalLmStep(model: CausalLM, hiddenStates?: HiddenStatesRequest): StepForward {
  return {
    device: model.device,
    vocabSize: model.config.vocabSize,
    inputWidth: 0,
    hiddenRows: hiddenStates === undefined ? null : "tokens",
    trace: ({ ids, positions, slots, queryStart, seqLens, tables, rowIndex, loraSlots }, kvCaches) => {
      const aux = typeof hiddenStates === "object" ? { layers: hiddenStates.layers, out: [] as Tensor[] } : undefined;
      const final = model.forward(ids, { kind: "paged", positions, slotMapping: slots, blockTables: tables, queryStart, seqLens, kvCaches, loraSlots }, aux);
      const picked = rowIndex === null ? final : final.indexSelect(0, rowIndex);
      const logits = model.logits(picked);
      const argmax = logits.argmax(-1);
      if (picked !== final) picked.dispose();
      let hidden: Tensor | null = null;
      if (hiddenStates === "final") hidden = asFloat32(final);
      else final.dispose();
      if (aux !== undefined) {
        hidden = asFloat32(cat(aux.out, 1));
        for (const t of aux.out) t.dispose();
      }
      return { logits, argmax, hidden };
    },
  };
}
