// MoE layers route on the device (one moe kernel, no host read): Mixtral-, Qwen3-MoE- (with and without
// norm_topk_prob) and gpt-oss-shaped tiny models give the logits of the host-routed algorithm Kiln ran before
// (kept here as the reference: the router's top-k read back, each expert's GatedMLP run on its tokens, the weighted
// sum made on the host), in float32, bfloat16 and with int8 / int4 experts (--quantization).
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { InitModelOptions } from "../../src/models/init-model.js";
import { loadLocalModel, type LoadedModel } from "../../src/models/loader.js";
import { MoE } from "../../src/nn/mlp.js";
import { empty, linear, noGrad, softmax, tensor, topk, type Tensor } from "../../src/tensor/index.js";
import { lastLogits, maxAbs, maxAbsDiff } from "../helpers/model-logits.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

/** Kiln's MoE.forward before on-device routing, verbatim in substance: routing and the weighted sum on the host. */
function hostRoutedForward(moe: MoE, x: Tensor): Tensor {
  const T = x.shape[0]!;
  const { hidden: H, topK: k, normTopkProb } = moe.opts;
  const logits = linear(x, moe.gate.weight, moe.gate.bias);
  const probs = softmax(logits, -1);
  const { values, indices } = topk(probs, k, -1);
  const w = values.dataSync() as Float32Array;
  const ids = indices.dataSync() as Int32Array;
  for (const t of [logits, probs, values, indices]) t.dispose();
  const out = new Float32Array(T * H);
  const byExpert = new Map<number, { rows: number[]; weights: number[] }>();
  for (let t = 0; t < T; t++) {
    let norm = 1;
    if (normTopkProb) {
      norm = 0;
      for (let j = 0; j < k; j++) norm += w[t * k + j]!;
    }
    for (let j = 0; j < k; j++) {
      const entry = byExpert.get(ids[t * k + j]!) ?? { rows: [], weights: [] };
      entry.rows.push(t);
      entry.weights.push(w[t * k + j]! / norm);
      byExpert.set(ids[t * k + j]!, entry);
    }
  }
  for (const [e, { rows, weights }] of byExpert) {
    const idx = tensor(Int32Array.from(rows), { device: x.device });
    const xe = x.indexSelect(0, idx);
    const ye = moe.experts[e]!.forward(xe);
    const y = ye.dataSync() as Float32Array;
    for (let r = 0; r < rows.length; r++) for (let i = 0; i < H; i++) out[rows[r]! * H + i] += weights[r]! * y[r * H + i]!;
    for (const t of [idx, xe, ye]) t.dispose();
  }
  const res = empty([T, H], { device: x.device });
  res.device.backend.write(res.storage.buffer, 0, new Uint8Array(out.buffer));
  return res;
}

/** The model's logits at every prefix end of `ids` (last position), on-device routing vs the host-routed reference. */
function compare(m: LoadedModel, ids: number[]): { diff: number; scale: number } {
  const moes = m.model.namedModules().flatMap(([, mod]) => (mod instanceof MoE ? [mod] : []));
  assert.ok(moes.length > 0, "the model has MoE layers");
  let diff = 0;
  let scale = 0;
  for (const n of [1, 3, ids.length]) {
    const prefix = ids.slice(0, n);
    const got = noGrad(() => lastLogits(m, prefix));
    for (const moe of moes) moe.forward = (x: Tensor) => hostRoutedForward(moe, x);
    const want = noGrad(() => lastLogits(m, prefix));
    for (const moe of moes) delete (moe as { forward?: unknown }).forward; // back to MoE.prototype.forward
    diff = Math.max(diff, maxAbsDiff(got, want));
    scale = Math.max(scale, maxAbs(want));
  }
  return { diff, scale };
}

const PROMPT = [5, 17, 3, 99, 42, 8, 61, 23, 77, 11, 2, 30];

const CASES: { arch: InitModelOptions["architecture"]; extra?: Partial<InitModelOptions>; load?: Parameters<typeof loadLocalModel>[1]; tol: number }[] = [
  { arch: "MixtralForCausalLM", tol: 1e-5 },
  { arch: "MixtralForCausalLM", load: { dtype: "bfloat16" }, tol: 1e-4 },
  { arch: "MixtralForCausalLM", load: { quantization: "int8" }, tol: 1e-4 },
  { arch: "Qwen3MoeForCausalLM", tol: 1e-5 },
  { arch: "Qwen3MoeForCausalLM", extra: { overrides: { norm_topk_prob: false } }, tol: 1e-5 },
  { arch: "Qwen3MoeForCausalLM", load: { quantization: "int4" }, tol: 1e-4 },
  { arch: "GptOssForCausalLM", tol: 1e-5 },
];

describe("MoE on-device routing equals the host-routed algorithm", () => {
  for (const c of CASES) {
    const what = `${c.arch}${c.extra ? ` ${JSON.stringify(c.extra.overrides)}` : ""}${c.load ? ` ${JSON.stringify(c.load)}` : ""}`;
    it(what, (t) => {
      const m = loadLocalModel(tinyModelDir(c.arch, c.extra ?? {}), c.load ?? {});
      const { diff, scale } = compare(m, PROMPT);
      t.diagnostic(`${what}: max |logit diff| ${diff.toExponential(2)} of max |logit| ${scale.toFixed(2)}`);
      assert.ok(scale > 0.1, "non-trivial logits");
      assert.ok(diff <= c.tol * Math.max(1, scale), `max |logit diff| ${diff} (max |logit| ${scale})`);
    });
  }
});
