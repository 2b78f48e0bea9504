// Whether the outside oracle node-llama-cpp (an optional dependency) is installed: tests against it skip otherwise.
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import type { TestContext } from "node:test";
import { loadLocalModel, type LoadedModel } from "../../src/models/loader.js";
import { lastLogits } from "./model-logits.js";
import { tensor } from "../../src/tensor/index.js";
import { Tensor } from "../../src/tensor/tensor.js";

export const hasLlamaCpp = ((): boolean => {
  try {
    createRequire(import.meta.url).resolve("node-llama-cpp");
    return true;
  } catch {
    return false;
  }
})();

type Llama = Awaited<ReturnType<typeof import("node-llama-cpp").getLlama>>;
let llamaOnce: Promise<Llama> | null = null;

/**
 * llama.cpp (CPU, f32 KV cache, no flash attention) on a GGUF file: its next-token probabilities after `ids`
 * (temperature 1, no truncation) and, with `greedySteps`, its greedy continuation of `ids`.
 */
export async function llamaCppOracle(file: string, ids: readonly number[], greedySteps = 0): Promise<{ probs: Map<number, number>; greedy: number[] }> {
  llamaOnce ??= import("node-llama-cpp").then(({ getLlama }) => getLlama({ gpu: false, build: "never", logLevel: "error" as never }));
  const model = await (await llamaOnce).loadModel({ modelPath: file });
  let ctx: Awaited<ReturnType<typeof model.createContext>> | null = null;
  try {
    ctx = await model.createContext({ contextSize: 128, experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32", flashAttention: false });
    const seq = ctx.getSequence();
    const last = ids.length - 1;
    const res = await seq.controlledEvaluate(
      ids.map((id, i) => (i === last ? [id, { generateNext: { probabilities: true, options: { temperature: 1, topK: 0, topP: 1, minP: 0 } } }] : id)) as never,
    );
    const probs = res[last]!.next!.probabilities! as Map<number, number>;
    const greedy: number[] = [];
    if (greedySteps > 0) {
      await seq.clearHistory();
      for await (const tok of seq.evaluate([...ids] as never, { temperature: 0 })) {
        greedy.push(tok as number);
        if (greedy.length >= greedySteps) break;
      }
    }
    return { probs, greedy };
  } finally {
    await ctx?.dispose();
    await model.dispose();
  }
}

/**
 * llama.cpp's next-token probabilities after `ids` and after each prefix of `ids` + `path` (teacher forcing: `path`
 * fed, one batched evaluation), and its greedy choice at each of those positions. `argmax` equals `path` iff
 * llama.cpp's own greedy continuation of `ids` is `path`: the same check as llamaCppOracle's `greedy`, without its
 * token-by-token decode (an MoE's decode steps take seconds each on a loaded 2-core machine).
 */
export async function llamaCppAlong(file: string, ids: readonly number[], path: readonly number[]): Promise<{ probs: Map<number, number>[]; argmax: number[] }> {
  llamaOnce ??= import("node-llama-cpp").then(({ getLlama }) => getLlama({ gpu: false, build: "never", logLevel: "error" as never }));
  const model = await (await llamaOnce).loadModel({ modelPath: file });
  let ctx: Awaited<ReturnType<typeof model.createContext>> | null = null;
  try {
    ctx = await model.createContext({ contextSize: 128, experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32", flashAttention: false });
    const all = [...ids, ...path.slice(0, -1)];
    const next = { generateNext: { probabilities: true, options: { temperature: 1, topK: 0, topP: 1, minP: 0 } } };
    const res = await ctx.getSequence().controlledEvaluate(all.map((id, i) => (i >= ids.length - 1 ? [id, next] : id)) as never);
    const probs = all.slice(ids.length - 1).map((_, k) => res[ids.length - 1 + k]!.next!.probabilities! as Map<number, number>);
    const argmax = probs.map((p) => [...p].reduce((best, e) => (e[1] > best[1] ? e : best))[0]);
    return { probs, argmax };
  } finally {
    await ctx?.dispose();
    await model.dispose();
  }
}

/** log-softmax of one logits row. */
export function logSoftmax(l: Float32Array): Float32Array {
  const mx = l.reduce((a, b) => Math.max(a, b), -Infinity);
  const lse = Math.log(l.reduce((s, x) => s + Math.exp(x - mx), 0)) + mx;
  return l.map((x) => x - lse);
}

/**
 * How far Kiln's next-token log-probabilities (`ours`, from the quantized weights as loaded) are from llama.cpp's
 * (over the tokens it gives p >= 1e-7) and from Kiln's dequantized-f32 load (`ref`, every token), next to the
 * f32 log-probability range (`scale`) the tolerances are fractions of.
 */
export function logprobGaps(probs: Map<number, number>, ours: Float32Array, ref: Float32Array): { dLc: number; dFloat: number; scale: number; compared: number } {
  let dLc = 0, dFloat = 0, compared = 0;
  for (const [tok, p] of probs) {
    if (p < 1e-7) continue;
    dLc = Math.max(dLc, Math.abs(Math.log(p) - ours[tok]!));
    compared++;
  }
  for (let i = 0; i < ours.length; i++) dFloat = Math.max(dFloat, Math.abs(ours[i]! - ref[i]!));
  const scale = ref.reduce((a, b) => Math.max(a, b), -Infinity) - ref.reduce((a, b) => Math.min(a, b), Infinity);
  return { dLc, dFloat, scale, compared };
}

/** Runs f with Tensor.gelu as ggml's CPU GELU: tanh-approximate GELU of x rounded to float16, rounded to float16. */
export function withFloat16Gelu<T>(f: () => T): T {
  const f16 = (x: number) => {
    if (x === 0) return 0;
    const q = 2 ** (Math.max(Math.floor(Math.log2(Math.abs(x))), -14) - 10); // float16's spacing at x
    return Math.round(x / q) * q;
  };
  const gelu = (x: number) => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * x * (1 + 0.044715 * x * x)));
  const original = Tensor.prototype.gelu;
  Tensor.prototype.gelu = function (this: Tensor) {
    const y = Float32Array.from(this.dataSync() as Float32Array, (x) => (x <= -10 ? 0 : x >= 10 ? x : f16(gelu(f16(x)))));
    return tensor(y, { shape: [...this.shape] });
  };
  try {
    return f();
  } finally {
    Tensor.prototype.gelu = original;
  }
}

/**
 * Kiln's model `direct`, loaded from the GGUF `file` with its blocks kept, against llama.cpp on that file: the
 * next-token log-probabilities after `ids` within `tolerance` of the f32 log-probability range of llama.cpp's and of
 * the file loaded dequantized to f32 (llama.cpp rounds activations per 256 (Q8_K) or per block, Kiln per row: a few
 * % of the range on these random weights; a misplaced code bit, scale or min is off by the whole range); and `steps`
 * greedy tokens: following llama.cpp's, Kiln's argmax agrees at all but at most one step, and where it does not,
 * llama.cpp's pick is within a near-tie (2% of the range) of it. Reports the figures as a diagnostic.
 */
export async function expectLlamaCppAgreement(
  t: TestContext, label: string, file: string, direct: LoadedModel, ids: readonly number[],
  /** tolerance: against both (default 0.06); vsLlamaCpp: a tighter one against llama.cpp alone */
  options: { steps?: number; tolerance?: number; vsLlamaCpp?: number } = {},
): Promise<void> {
  const steps = options.steps ?? 8;
  const tolerance = options.tolerance ?? 0.06;
  const { probs, greedy: lcTokens } = await llamaCppOracle(file, ids, steps);
  const ours = logSoftmax(lastLogits(direct, [...ids]));
  const { dLc, dFloat, scale, compared } = logprobGaps(probs, ours, logSoftmax(lastLogits(loadLocalModel(file, { ggufKeepQuantized: false }), [...ids])));
  assert.ok(dLc < (options.vsLlamaCpp ?? tolerance) * scale, `${label}: vs llama.cpp ${dLc} (range ${scale})`);
  assert.ok(dFloat < tolerance * scale, `${label}: vs dequantized ${dFloat} (range ${scale})`);
  let agree = 0;
  const seq = [...ids];
  for (const tok of lcTokens) {
    const l = lastLogits(direct, seq);
    const best = l.reduce((b, x, i) => (x > l[b]! ? i : b), 0);
    if (best === tok) agree++;
    else assert.ok(l[best]! - l[tok]! < 0.02 * scale, `${label} step ${seq.length - ids.length}: Kiln ${best} vs llama.cpp ${tok}, gap ${l[best]! - l[tok]!}`);
    seq.push(tok);
  }
  t.diagnostic(`${label}: max |logprob diff| vs llama.cpp ${dLc.toExponential(2)} over ${compared} tokens, vs dequantized f32 ${dFloat.toExponential(2)} (range ${scale.toFixed(1)}); greedy ${agree}/${lcTokens.length} identical`);
  assert.equal(lcTokens.length, steps);
  assert.ok(agree >= lcTokens.length - 1, `${label}: greedy agreement ${agree}/${lcTokens.length}`);
}
