// A training step and a serving step must not leak device buffers: the dense attention path and
// CausalLM.loss dispose every view and intermediate they make (a leak here once OOM-killed training).
import { test } from "node:test";
import assert from "node:assert/strict";
import { CausalLM } from "../../src/models/causal-lm.js";
import { parseHfConfig } from "../../src/models/hf-config.js";
import { defaultDevice, noGrad, ones, randn } from "../../src/tensor/index.js";

function tinyModel(): CausalLM {
  const cfg = parseHfConfig({
    architectures: ["LlamaForCausalLM"], hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
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

test("forward + backward of CausalLM.loss keeps the live buffer count flat", () => {
  const m = tinyModel();
  const be = defaultDevice().backend;
  const inp = Int32Array.from({ length: 2 * 16 }, (_, i) => (i * 7) % 64);
  const tgt = Int32Array.from({ length: 2 * 16 }, (_, i) => (i * 7 + 7) % 64);
  const step = () => {
    const l = m.loss(inp, tgt, 2, 16);
    l.backward();
    for (const p of m.parameters()) {
      p.grad?.dispose();
      p.grad = null;
    }
    l.dispose();
  };
  step(); // first step allocates caches (rotary tables are built at construction, masks per call)
  const start = be.liveBuffers();
  for (let i = 0; i < 5; i++) step();
  assert.equal(be.liveBuffers(), start, "training steps leaked buffers");
  const fwdStart = be.liveBuffers();
  for (let i = 0; i < 5; i++) noGrad(() => m.loss(inp, tgt, 2, 16).dispose());
  assert.equal(be.liveBuffers(), fwdStart, "no-grad forward leaked buffers");
  // packed documents (block_causal, token 0 ends each): the per-row masks are freed too
  const packedStart = be.liveBuffers();
  for (let i = 0; i < 3; i++) {
    const l = m.loss(inp, tgt, 2, 16, 0);
    l.backward();
    for (const p of m.parameters()) {
      p.grad?.dispose();
      p.grad = null;
    }
    l.dispose();
  }
  assert.equal(be.liveBuffers(), packedStart, "block_causal steps leaked buffers");
});
