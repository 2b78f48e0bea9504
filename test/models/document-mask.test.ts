// TorchTitan's block_causal mask over packed documents (nn/documents.ts, attentionBias, CausalLM.loss's separator):
// the mask written out by hand, and a packed row's loss and gradients against each document run alone from
// position 0 (an independent expectation: no mask is involved in the separate runs).
import { test } from "node:test";
import assert from "node:assert/strict";
import { CausalLM } from "../../src/models/causal-lm.js";
import { parseHfConfig } from "../../src/models/hf-config.js";
import { documentIds, documentPositions } from "../../src/nn/index.js";
import { attentionBias, manualSeed, noGrad, ones, randn, type Tensor } from "../../src/tensor/index.js";

const EOS = 0;

/** The visibility matrices (1: key j visible to query i) of attentionBias's per-row bias. */
function visible(bias: Float32Array, rows: number, S: number): number[][][] {
  return Array.from({ length: rows }, (_, b) => Array.from({ length: S }, (_, i) => Array.from({ length: S }, (_, j) => (bias[(b * S + i) * S + j] === 0 ? 1 : 0))));
}

test("document ids and positions: a separator ends its document, the next token starts one at position 0", () => {
  // row 0: [5 6 EOS | 7 EOS | 8], row 1: [EOS | EOS | 9 9 9 9] (empty documents are the separator alone)
  const tokens = Int32Array.of(5, 6, EOS, 7, EOS, 8, EOS, EOS, 9, 9, 9, 9);
  const docs = documentIds(tokens, 2, 6, EOS);
  assert.deepEqual([...docs], [0, 0, 0, 1, 1, 2, 0, 1, 2, 2, 2, 2]);
  assert.deepEqual([...documentPositions(docs, 2, 6)], [0, 1, 2, 0, 1, 0, 0, 0, 0, 1, 2, 3]);
  // no separator: one document, positions 0..S-1
  assert.deepEqual([...documentPositions(documentIds(Int32Array.of(1, 2, 3), 1, 3, EOS), 1, 3)], [0, 1, 2]);
  assert.throws(() => documentIds(tokens, 2, 5, EOS), /12 tokens are not batch 2 x seqLen 5/);
});

test("the block-causal mask of a hand-written row: causal within each document, EOS with the one it ends", () => {
  // tokens: a a EOS b b EOS c   (positions 0..6)
  const tokens = Int32Array.of(11, 12, EOS, 13, 14, EOS, 15);
  const bias = attentionBias(7, 7, { documents: documentIds(tokens, 1, 7, EOS), batch: 1 });
  assert.deepEqual(visible(bias, 1, 7)[0], [
    [1, 0, 0, 0, 0, 0, 0],
    [1, 1, 0, 0, 0, 0, 0],
    [1, 1, 1, 0, 0, 0, 0], // the first EOS sees its document
    [0, 0, 0, 1, 0, 0, 0], // the token after it starts the next
    [0, 0, 0, 1, 1, 0, 0],
    [0, 0, 0, 1, 1, 1, 0],
    [0, 0, 0, 0, 0, 0, 1],
  ]);
  // with a sliding window of 2 as well: the last 2 keys of the query's own document
  const windowed = attentionBias(7, 7, { documents: documentIds(tokens, 1, 7, EOS), batch: 1, window: 2 });
  assert.deepEqual(visible(windowed, 1, 7)[0], [
    [1, 0, 0, 0, 0, 0, 0],
    [1, 1, 0, 0, 0, 0, 0],
    [0, 1, 1, 0, 0, 0, 0],
    [0, 0, 0, 1, 0, 0, 0],
    [0, 0, 0, 1, 1, 0, 0],
    [0, 0, 0, 0, 1, 1, 0],
    [0, 0, 0, 0, 0, 0, 1],
  ]);
  // one mask per row: a row without a separator is plain causal
  const two = visible(attentionBias(3, 3, { documents: documentIds(Int32Array.of(1, EOS, 2, 1, 2, 3), 2, 3, EOS), batch: 2 }), 2, 3);
  assert.deepEqual(two, [
    [[1, 0, 0], [1, 1, 0], [0, 0, 1]],
    [[1, 0, 0], [1, 1, 0], [1, 1, 1]],
  ]);
  // without documents: the plain causal [S, Sk] bias
  assert.deepEqual(visible(attentionBias(3, 3), 1, 3)[0], [[1, 0, 0], [1, 1, 0], [1, 1, 1]]);
});

/** A small random-weight Llama (GQA); `window`: its first layer slides (Mistral-style), the second attends fully. */
function tinyModel(seed: number, window: number | null = null): CausalLM {
  const cfg = parseHfConfig({
    architectures: [window === null ? "LlamaForCausalLM" : "MistralForCausalLM"], hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
    num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 64, max_position_embeddings: 64, tie_word_embeddings: true, rope_theta: 10000,
    ...(window === null ? {} : { sliding_window: window, layer_types: ["sliding_attention", "full_attention"] }),
  });
  const m = new CausalLM(cfg);
  manualSeed(seed);
  for (const [n, p] of m.namedParameters()) {
    const r = n.endsWith("norm.weight") ? ones(p.shape) : randn(p.shape, { std: 0.3 });
    r.requiresGrad = true;
    m.setParameter(n, r);
  }
  return m;
}

/** One row [docA, EOS, docB, EOS, docC-head]: inputs and next-token targets over its seqLen + 1 tokens. */
function packedRow(): { inputs: Int32Array; targets: Int32Array; spans: [number, number][] } {
  const stream = [7, 21, 33, 5, 48, EOS, 12, 9, 60, 3, EOS, 40, 41, 17];
  const inputs = Int32Array.from(stream.slice(0, -1));
  const targets = Int32Array.from(stream.slice(1));
  // the documents' input spans: each through its EOS (whose target is the next document's first token)
  return { inputs, targets, spans: [[0, 6], [6, 11], [11, 13]] };
}

function lossOf(m: CausalLM, inputs: Int32Array, targets: Int32Array, separator: number | null, batch = 1): number {
  return noGrad(() => {
    const l = m.loss(inputs, targets, batch, inputs.length / batch, separator);
    const v = l.item();
    l.dispose();
    return v;
  });
}

function close(a: number, b: number, tol: number, what: string): void {
  assert.ok(Math.abs(a - b) <= tol * Math.max(1, Math.abs(b)), `${what}: ${a} vs ${b}`);
}

for (const window of [null, 3]) {
  const kind = window === null ? "full attention" : "a sliding window of 3 on one layer";
  test(`a packed row's block_causal loss is the token-weighted loss of its documents run alone (${kind}); causal's differs`, () => {
    const m = tinyModel(17, window);
    const { inputs, targets, spans } = packedRow();
    const packed = lossOf(m, inputs, targets, EOS);
    let weighted = 0;
    for (const [a, b] of spans) weighted += (b - a) * lossOf(m, inputs.slice(a, b), targets.slice(a, b), null);
    weighted /= inputs.length;
    close(packed, weighted, 1e-5, "block_causal vs separate documents");
    const causal = lossOf(m, inputs, targets, null);
    assert.ok(Math.abs(causal - packed) > 1e-3, `causal ${causal} should differ from block_causal ${packed}`);
    // two rows in one batch: each row's own mask (the second row is one document, as causal)
    const two = Int32Array.from([...inputs, ...inputs.map((t) => (t === EOS ? 1 : t))]);
    const twoT = Int32Array.from([...targets, ...targets]);
    const second = lossOf(m, two.slice(inputs.length), twoT.slice(inputs.length), null);
    close(lossOf(m, two, twoT, EOS, 2), (packed + second) / 2, 1e-5, "two rows");
  });
}

test("block_causal gradients of a packed row equal the summed gradients of its documents run alone", () => {
  const m = tinyModel(5);
  const { inputs, targets, spans } = packedRow();
  const grads = (fn: () => void): Map<string, Float32Array> => {
    for (const [, p] of m.namedParameters()) p.grad = null;
    fn();
    return new Map(m.namedParameters().map(([n, p]) => [n, Float32Array.from((p.grad as Tensor).dataSync() as Float32Array)]));
  };
  const packed = grads(() => {
    const l = m.loss(inputs, targets, 1, inputs.length, EOS);
    l.backward();
    l.dispose();
  });
  // the same normalisation: each document's mean loss weighted by its share of the row's targets
  const separate = grads(() => {
    for (const [a, b] of spans) {
      const l = m.loss(inputs.slice(a, b), targets.slice(a, b), 1, b - a, null);
      const w = l.mul((b - a) / inputs.length);
      w.backward();
      w.dispose();
      l.dispose();
    }
  });
  let maxAbs = 0;
  for (const [n, g] of packed) {
    const h = separate.get(n)!;
    for (let i = 0; i < g.length; i++) {
      maxAbs = Math.max(maxAbs, Math.abs(g[i]!));
      assert.ok(Math.abs(g[i]! - h[i]!) <= 1e-5 + 1e-4 * Math.abs(h[i]!), `${n}[${i}]: ${g[i]} vs ${h[i]}`);
    }
  }
  assert.ok(maxAbs > 1e-3, "the gradients are not all ~0");
});
