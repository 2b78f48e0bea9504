// CausalLM under TorchTitan's op-level selective activation checkpointing (activationCheckpointPolicy = opSacPolicy):
// every parameter's gradient equals the one without checkpointing, each layer's recomputation skips the 4 projections
// the policy saves (mm calls 0, 2, 4, 6 of its 7) and its attention (the flash kernel's forward), and training steps
// leak no buffers.
import { test } from "node:test";
import assert from "node:assert/strict";
import { CausalLM } from "../../src/models/causal-lm.js";
import { parseHfConfig } from "../../src/models/hf-config.js";
import { countKernels } from "../helpers/kernel-counts.js";
import { defaultDevice, ones, opSacPolicy, randn } from "../../src/tensor/index.js";

const LAYERS = 2;

function tinyModel(): CausalLM {
  const cfg = parseHfConfig({
    architectures: ["LlamaForCausalLM"], hidden_size: 32, intermediate_size: 64, num_hidden_layers: LAYERS,
    num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 64, max_position_embeddings: 64, tie_word_embeddings: true,
  });
  const m = new CausalLM(cfg);
  for (const [n, p] of m.namedParameters()) {
    const r = n.endsWith("norm.weight") ? ones(p.shape) : randn(p.shape, { std: 0.1 });
    r.requiresGrad = true;
    m.setParameter(n, r);
  }
  return m;
}

/** Products launched during fn on the default device: matmul kernels and flash attention forwards. */
function matmulKernels(fn: () => void): number {
  const counts = countKernels(defaultDevice().name, fn);
  return (counts.get("matmul") ?? 0) + (counts.get("flash_attention") ?? 0);
}

test("op SAC on a CausalLM: the plain gradients, 5 fewer products recomputed per layer than whole-layer checkpointing, no leak", () => {
  const m = tinyModel();
  const inp = Int32Array.from({ length: 2 * 16 }, (_, i) => (i * 7) % 64);
  const tgt = Int32Array.from({ length: 2 * 16 }, (_, i) => (i * 7 + 7) % 64);
  const step = (mode: "none" | "full" | "op") => {
    m.activationCheckpointing = mode === "none" ? null : () => true;
    m.activationCheckpointPolicy = mode === "op" ? opSacPolicy : null;
    const l = m.loss(inp, tgt, 2, 16);
    const products = matmulKernels(() => l.backward());
    const grads = m.namedParameters().map(([n, p]) => {
      const c = p.grad!.contiguous();
      const g = Array.from(c.dataSync() as Float32Array);
      if (c !== p.grad) c.dispose();
      p.grad!.dispose();
      p.grad = null;
      return [n, g] as const;
    });
    l.dispose();
    return { products, grads };
  };
  const none = step("none");
  const full = step("full");
  const op = step("op");
  for (const [i, [name, g]] of op.grads.entries()) {
    const want = none.grads[i]![1];
    g.forEach((v, j) => assert.ok(Math.abs(v - want[j]!) <= 1e-6, `${name}[${j}]: ${v} vs ${want[j]}`));
  }
  // whole layers recompute their 7 projections and their attention; op SAC skips 4 projections and the attention
  assert.equal(full.products - none.products, LAYERS * 8);
  assert.equal(op.products - none.products, LAYERS * 3);
  const be = defaultDevice().backend;
  const start = be.liveBuffers();
  for (let i = 0; i < 3; i++) step("op");
  assert.equal(be.liveBuffers(), start, "op SAC training steps leaked buffers");
});
