// The flash attention kernels (ops/flash-attention.ts) against attention composed of ops (composedCausalAttention:
// matmul, the additive mask, softmax, matmul, with autograd through each): outputs and the gradients of q, k and v
// over every mask (causal, queries after cached keys, sliding window, soft-cap, packed documents, bidirectional spans)
// and GQA, on each back end; the native kernels against the float64 reference kernels; the memory a training
// attention holds; refusals.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as k from "../../src/tensor/index.js";
import type { Tensor } from "../../src/tensor/index.js";
import { OpError } from "../../src/util/errors.js";
import { mulberry32 } from "../../src/util/random.js";
import { forEachBackend } from "./suite.js";
import { countKernels } from "../helpers/kernel-counts.js";

interface Case {
  name: string;
  B: number;
  Hq: number;
  Hkv: number;
  S: number;
  Sk?: number;
  D: number;
  window?: number;
  softcap?: number;
  spans?: [number, number][];
  docs?: number[][];
  sinks?: number[];
}

const CASES: Case[] = [
  { name: "MHA, rows past one tile and one row block", B: 1, Hq: 2, Hkv: 2, S: 37, D: 16 },
  { name: "GQA, head dim not a multiple of the vector width", B: 2, Hq: 4, Hkv: 2, S: 21, D: 20 },
  { name: "queries after 11 cached keys", B: 1, Hq: 2, Hkv: 1, S: 19, Sk: 30, D: 8 },
  { name: "sliding window 5", B: 1, Hq: 2, Hkv: 2, S: 40, D: 16, window: 5 },
  { name: "soft-capped scores", B: 1, Hq: 2, Hkv: 2, S: 24, D: 32, softcap: 0.8 },
  { name: "bidirectional spans", B: 1, Hq: 2, Hkv: 1, S: 33, D: 16, spans: [[3, 9], [20, 31]] },
  {
    name: "packed documents (block_causal)", B: 2, Hq: 2, Hkv: 2, S: 36, D: 16,
    docs: [[...Array(10).fill(0), ...Array(19).fill(1), ...Array(7).fill(2)], [...Array(3).fill(4), ...Array(33).fill(5)]],
  },
  { name: "document ids out of order", B: 1, Hq: 1, Hkv: 1, S: 20, D: 16, docs: [[...Array(8).fill(1), ...Array(6).fill(0), ...Array(6).fill(1)]] },
  { name: "attention sinks (gpt-oss) with a window, GQA", B: 2, Hq: 4, Hkv: 2, S: 26, D: 16, window: 7, sinks: [0.5, -1.25, 2.5, 0] },
];

function randn(shape: number[], seed: number, device: string): Tensor {
  const r = mulberry32(seed);
  const n = shape.reduce((a, b) => a * b, 1);
  const data = new Float32Array(n);
  for (let i = 0; i < n; i++) data[i] = 1.6 * (r() * 2 - 1);
  return k.tensor(data, { shape, device });
}

/** Output and gradients of sum(attention(q, k, v) * w) for either form. */
function run(c: Case, device: string, form: "flash" | "composed"): { out: Float32Array; grads: Float32Array[] } {
  const Sk = c.Sk ?? c.S;
  const q = randn([c.B, c.Hq, c.S, c.D], 1, device).requiresGrad_();
  const kk = randn([c.B, c.Hkv, Sk, c.D], 2, device).requiresGrad_();
  const v = randn([c.B, c.Hkv, Sk, c.D], 3, device).requiresGrad_();
  const w = randn([c.B, c.Hq, c.S, c.D], 4, device);
  const scale = 1 / Math.sqrt(c.D);
  const documents = c.docs ? Int32Array.from(c.docs.flat()) : null;
  const sinks = c.sinks ? k.tensor(c.sinks, { device }).requiresGrad_() : null;
  const out = form === "flash"
    ? k.flashAttention(q, kk, v, { scale, window: c.window, softcap: c.softcap, bidirectionalSpans: c.spans, documents, sinks })
    : k.composedCausalAttention(q, kk, v, scale, c.window, c.softcap, sinks, c.spans, documents);
  out.mul(w).sum().backward();
  const leaves = sinks ? [q, kk, v, sinks] : [q, kk, v];
  return { out: out.dataSync() as Float32Array, grads: leaves.map((t) => t.grad!.dataSync() as Float32Array) };
}

function assertClose(actual: Float32Array, expected: Float32Array, tol: number, what: string): void {
  assert.equal(actual.length, expected.length, what);
  let worst = 0;
  for (let i = 0; i < actual.length; i++) worst = Math.max(worst, Math.abs(actual[i]! - expected[i]!) / (1 + Math.abs(expected[i]!)));
  assert.ok(worst <= tol, `${what}: worst relative difference ${worst} > ${tol}`);
}

forEachBackend((device) => {
  for (const c of CASES)
    test(`flash attention = composed attention, values and gradients: ${c.name}`, () => {
      const flash = run(c, device, "flash");
      const composed = run(c, device, "composed");
      assertClose(flash.out, composed.out, 2e-5, "output");
      ["dq", "dk", "dv", "dsinks"].slice(0, flash.grads.length).forEach((name, i) => assertClose(flash.grads[i]!, composed.grads[i]!, 5e-5, name));
      assert.equal(flash.grads.length, composed.grads.length);
    });

  test("causalAttention takes the flash kernels when autograd records it, and gives the composed result", () => {
    const q = randn([1, 2, 12, 8], 5, device).requiresGrad_();
    const kk = randn([1, 2, 12, 8], 6, device);
    const v = randn([1, 2, 12, 8], 7, device);
    const routed = k.causalAttention(q, kk, v);
    assert.equal(routed.gradFn?.op, "flash_attention");
    const composed = k.composedCausalAttention(q, kk, v);
    assertClose(routed.dataSync() as Float32Array, composed.dataSync() as Float32Array, 2e-5, "output");
    // with sinks (gpt-oss) too
    const sinks = k.tensor([0.5, -0.25], { device }).requiresGrad_();
    assert.equal(k.causalAttention(q, kk, v, undefined, undefined, null, sinks).gradFn?.op, "flash_attention");
  });

  test("refusals name the operand", () => {
    const q = randn([1, 2, 8, 4], 8, device);
    const kk = randn([1, 2, 6, 4], 9, device);
    assert.throws(() => k.flashAttention(q, kk, kk, { scale: 0.5 }), (e: unknown) => e instanceof OpError && /6 keys for 8 queries/.test(e.message));
    assert.throws(() => k.flashAttention(q, q, q, { scale: 0.5, window: 0 }), (e: unknown) => e instanceof OpError && /window must be an integer >= 1/.test(e.message));
    assert.throws(() => k.flashAttention(q, q, q, { scale: 0.5, documents: Int32Array.of(0, 1) }), (e: unknown) => e instanceof OpError && /documents must hold batch x seq = 1 x 8/.test(e.message));
    const odd = randn([1, 3, 8, 4], 10, device);
    assert.throws(() => k.flashAttention(odd, q, q, { scale: 0.5 }), (e: unknown) => e instanceof OpError && /query heads 3 not a multiple of kv heads 2/.test(e.message));
  });
});

test("the native kernels equal the float64 reference kernels (forward and backward)", () => {
  for (const c of CASES) {
    const native = run(c, "cpu", "flash");
    const reference = run(c, "reference", "flash");
    assertClose(native.out, reference.out, 1e-5, `${c.name}: output`);
    ["dq", "dk", "dv", "dsinks"].slice(0, native.grads.length).forEach((name, i) => assertClose(native.grads[i]!, reference.grads[i]!, 2e-5, `${c.name}: ${name}`));
  }
});

test("training attention holds O(S) memory per head: no [S, S] scores alive through forward and backward", () => {
  const [B, H, S, D] = [1, 4, 1024, 16];
  const scoresBytes = B * H * S * S * 4; // 16 MiB, one materialized score tensor
  const peakOf = (form: "flash" | "composed"): number => {
    const q = randn([B, H, S, D], 11, "cpu").requiresGrad_();
    const kk = randn([B, H, S, D], 12, "cpu").requiresGrad_();
    const v = randn([B, H, S, D], 13, "cpu").requiresGrad_();
    k.resetPeakMemoryStats();
    const base = k.memoryAllocated();
    const out = form === "flash" ? k.flashAttention(q, kk, v, { scale: 0.25 }) : k.composedCausalAttention(q, kk, v, 0.25);
    out.sum().backward();
    const peak = k.maxMemoryAllocated() - base;
    for (const t of [q, kk, v, out]) t.dispose();
    return peak;
  };
  const flash = peakOf("flash");
  const composed = peakOf("composed");
  // flash: q, k, v, out, their gradients, the log-sum-exp and the output gradient: ~9 x 256 KiB
  assert.ok(flash < scoresBytes / 4, `flash attention peaked at ${flash} bytes`);
  assert.ok(composed >= 2 * scoresBytes, `the composed form peaked at ${composed} bytes (expected several score tensors)`);
});

test("bfloat16 training attention runs the flash kernels in float32 between casts: bf16 output and gradients", () => {
  const mk = (seed: number, heads: number) => randn([1, heads, 24, 16], seed, "cpu").to("bfloat16").requiresGrad_();
  const w = randn([1, 4, 24, 16], 4, "cpu");
  const gradsOf = (form: "routed" | "composed") => {
    const [q, kk, v] = [mk(1, 4), mk(2, 2), mk(3, 2)];
    const out = form === "routed" ? k.causalAttention(q, kk, v) : k.composedCausalAttention(q, kk, v);
    // as torch's attention, the input's dtype (the composed form's softmax promotes to float32)
    if (form === "routed") assert.equal(out.dtype, "bfloat16");
    out.to("float32").mul(w).sum().backward();
    for (const t of [q, kk, v]) assert.equal(t.grad!.dtype, "bfloat16");
    return { out: out.to("float32").dataSync() as Float32Array, grads: [q, kk, v].map((t) => t.grad!.to("float32").dataSync() as Float32Array) };
  };
  let routed: ReturnType<typeof gradsOf> | undefined;
  const kernels = countKernels("cpu", () => (routed = gradsOf("routed")));
  assert.ok(kernels.has("flash_attention") && kernels.has("flash_attention_backward"), "the flash kernels ran");
  const composed = gradsOf("composed");
  // bf16 rounding of the composed form's intermediates (scores, probabilities) bounds the agreement
  assertClose(routed!.out, composed.out, 3e-2, "output");
  ["dq", "dk", "dv"].forEach((name, i) => assertClose(routed!.grads[i]!, composed.grads[i]!, 6e-2, name));
});
