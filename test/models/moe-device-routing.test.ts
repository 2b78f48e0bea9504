// MoE layers route on the device (one moe kernel, no host read): Mixtral-, Qwen2-MoE- (with its shared expert),
// Qwen3-MoE- (with and without norm_topk_prob) and gpt-oss-shaped tiny models give the logits of the host-routed algorithm Kiln ran before
// (kept here as the reference: the router's top-k read back, each expert's GatedMLP run on its tokens, the weighted
// sum made on the host), in float32, bfloat16 and with int8 / int4 experts (--quantization).
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { InitModelOptions } from "../../src/models/init-model.js";
import { loadLocalModel, type LoadedModel } from "../../src/models/loader.js";
import { MoE } from "../../src/nn/mlp.js";
import { noGrad, type Tensor } from "../../src/tensor/index.js";
import { hostRoutedForward } from "../helpers/host-routed-moe.js";
import { lastLogits, maxAbs, maxAbsDiff } from "../helpers/model-logits.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

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
  { arch: "Qwen2MoeForCausalLM", tol: 1e-5 },
  { arch: "Qwen2MoeForCausalLM", load: { quantization: "int4" }, tol: 1e-4 },
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
