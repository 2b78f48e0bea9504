// Shared by the weight-format tests: last-position logits of a dense forward, small array measures, a tensor's
// bytes and seeded normal samples; and a model's embedding rows (the prompt-embeddings tests).
import { LLM } from "../../src/engine/llm-engine.js";
import type { CausalLM } from "../../src/models/causal-lm.js";
import type { LoadedModel } from "../../src/models/loader.js";
import { Linear } from "../../src/nn/layers.js";
import assert from "node:assert/strict";
import { arange, linear, noGrad, tensor, type Tensor } from "../../src/tensor/index.js";
import { quantizedLinear, type QuantizedWeight } from "../../src/tensor/ops/linalg.js";
import { DTYPE_BYTES } from "../../src/backends/dtype.js";
import { mulberry32 } from "../../src/util/random.js";

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

/** Log-probabilities [vocab] after the last of `ids`, from the dense forward. */
export function lastLogprobs(m: LoadedModel, ids: readonly number[]): Float32Array {
  const V = m.config.vocabSize;
  return noGrad(() => {
    const h = m.model.forward(tensor(Int32Array.from(ids)), { kind: "dense", batch: 1, seqLen: ids.length, positions: arange(ids.length) });
    return (m.model.logits(h).logSoftmax(-1).dataSync() as Float32Array).slice((ids.length - 1) * V);
  });
}

/** Log-probabilities [T][vocab] at every position of a dense forward over `ids`. */
export function allLogprobs(m: LoadedModel, ids: readonly number[]): Float32Array[] {
  const V = m.config.vocabSize;
  const all = noGrad(() => {
    const h = m.model.forward(tensor(Int32Array.from(ids)), { kind: "dense", batch: 1, seqLen: ids.length, positions: arange(ids.length) });
    return m.model.logits(h).logSoftmax(-1).dataSync() as Float32Array;
  });
  return ids.map((_, t) => all.slice(t * V, (t + 1) * V));
}

/** Greedy continuation by eager full recomputation: the whole sequence through the dense forward at every step (no KV cache). */
export function recomputedGreedy(m: LoadedModel, ids: readonly number[], steps: number): number[] {
  const seq = [...ids];
  for (let s = 0; s < steps; s++) {
    const lp = lastLogprobs(m, seq);
    seq.push(lp.reduce((best, x, i) => (x > lp[best]! ? i : best), 0));
  }
  return seq.slice(ids.length);
}

/** The engine's greedy continuation of `ids` (paged KV cache; step graphs unless `enforceEager`), as `kiln serve` runs it. */
export function servedGreedy(model: string, ids: readonly number[], steps: number, enforceEager = false): number[] {
  const llm = new LLM({ model, maxModelLen: 128, enforceEager });
  return llm.generate([{ promptTokenIds: [...ids] }], { temperature: 0, maxTokens: steps, ignoreEos: true })[0]!.outputs[0]!.tokenIds;
}

export const maxAbsDiff = (a: Float32Array, b: Float32Array): number => a.reduce((e, x, i) => Math.max(e, Math.abs(x - b[i]!)), 0);
export const maxAbs = (v: Float32Array): number => v.reduce((a, x) => Math.max(a, Math.abs(x)), 0);
/** Every Linear of the model with its dotted name. */
export const linears = (m: LoadedModel): [string, Linear][] => m.model.namedModules().filter((e): e is [string, Linear] => e[1] instanceof Linear);

/** A (contiguous) tensor's stored bytes, e.g. quantized codes and scales, to compare layouts bit for bit. */
export function bytesOfTensor(t: Tensor): Uint8Array {
  const size = DTYPE_BYTES[t.dtype];
  return new Uint8Array(t.device.backend.read(t.storage.buffer, t.offset * size, t.numel * size));
}

/** Seeded normal samples (Box-Muller over mulberry32). */
export function seededRandn(n: number, seed: number, std = 1): Float32Array {
  const u = mulberry32(seed);
  return Float32Array.from({ length: n }, () => std * Math.sqrt(-2 * Math.log(Math.max(u(), 1e-12))) * Math.cos(2 * Math.PI * u()));
}

/** The model's input embeddings of `ids` (its embedding layer's output rows), [ids.length * hidden] float32. */
export function embeddingRows(model: CausalLM, ids: readonly number[]): Float32Array {
  return noGrad(() => {
    const t = tensor(Int32Array.from(ids), { device: model.device });
    const e = model.model.embedTokens.forward(t);
    const v = Float32Array.from(e.dataSync() as Float32Array);
    t.dispose();
    e.dispose();
    return v;
  });
}

/**
 * quantizedLinear(x [m, k], qw) against the f32 linear on the weight qw stands for (wdq [n, k], from an independent
 * dequantizer): x is rounded per row to int8 (|x - xq * xs| <= amax / 254), so each output is within amax / 254 *
 * sum |wdq row| of it, plus f32 rounding; and against the kernel's TS reference `ref` [m, n] (the same integer dot
 * products, summed in f32 vs f64).
 */
export function expectWithinActivationRounding(qw: QuantizedWeight, x: Float32Array, wdq: Float32Array, ref: Float32Array, m: number, where = ""): void {
  const [n, k] = [qw.outFeatures, qw.inFeatures];
  noGrad(() => {
    const xt = tensor(x, { shape: [m, k] });
    const got = quantizedLinear(xt, qw).dataSync() as Float32Array;
    const want = linear(xt, tensor(wdq, { shape: [n, k] })).dataSync() as Float32Array;
    for (let r = 0; r < m; r++) {
      let amax = 0;
      for (let i = 0; i < k; i++) amax = Math.max(amax, Math.abs(x[r * k + i]!));
      for (let c = 0; c < n; c++) {
        let wAbs = 0;
        for (let i = 0; i < k; i++) wAbs += Math.abs(wdq[c * k + i]!);
        const bound = (amax / 254) * wAbs * 1.001 + 1e-4 * Math.abs(want[r * n + c]!) + 1e-4;
        assert.ok(Math.abs(got[r * n + c]! - want[r * n + c]!) <= bound, `${where}[${r},${c}] ${got[r * n + c]} vs ${want[r * n + c]} (bound ${bound})`);
        assert.ok(Math.abs(got[r * n + c]! - ref[r * n + c]!) <= 1e-4 * (Math.abs(ref[r * n + c]!) + 1), `${where}[${r},${c}] ${got[r * n + c]} vs reference ${ref[r * n + c]}`);
      }
    }
  });
}
