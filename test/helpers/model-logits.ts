// Shared by the weight-format tests: last-position logits of a dense forward, and small array measures.
import type { LoadedModel } from "../../src/models/loader.js";
import { Linear } from "../../src/nn/layers.js";
import { noGrad, tensor } from "../../src/tensor/index.js";

/** Logits [vocab] at the last position of a dense forward over `ids`. */
export function lastLogits(m: LoadedModel, ids: number[]): Float32Array {
  return noGrad(() => {
    const input = tensor(Int32Array.from(ids));
    const positions = tensor(Int32Array.from(ids, (_, i) => i));
    const hidden = m.model.forward(input, { kind: "dense", batch: 1, seqLen: ids.length, positions });
    const logits = m.model.logits(hidden);
    const V = m.config.vocabSize;
    const out = (logits.dataSync() as Float32Array).slice((ids.length - 1) * V);
    for (const t of [input, positions, hidden, logits]) t.dispose();
    return out;
  });
}

export const maxAbsDiff = (a: Float32Array, b: Float32Array): number => a.reduce((e, x, i) => Math.max(e, Math.abs(x - b[i]!)), 0);
export const maxAbs = (v: Float32Array): number => v.reduce((a, x) => Math.max(a, Math.abs(x)), 0);
/** Every Linear of the model with its dotted name. */
export const linears = (m: LoadedModel): [string, Linear][] => m.model.namedModules().filter((e): e is [string, Linear] => e[1] instanceof Linear);
