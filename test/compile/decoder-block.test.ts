// compile() of a Llama-style decoder layer (and Qwen3's q/k-norm variant) equals the eager src/nn layer over
// random inputs, with the token dim dynamic across bucket boundaries. The layer is compiled in two programs
// around the attention core: attention over a dynamic key dim is not traceable yet (Sym.matmul takes a 2-d
// right operand, and softmax refuses a dynamic last dim), so causalAttention runs eagerly between them.
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import * as k from "../../src/tensor/index.js";
import { compile, jitUnavailableReason, linear, rmsNorm, rotaryEmbedding, siluMul, type AnyTensor } from "../../src/compile/index.js";
import { Attention, type DenseContext } from "../../src/nn/attention.js";
import { RMSNorm } from "../../src/nn/layers.js";
import { GatedMLP } from "../../src/nn/mlp.js";
import { RotaryEmbedding } from "../../src/nn/rotary.js";
import type { DType } from "../../src/backends/dtype.js";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { assertClose } from "../tensor/suite.js";

process.env.KILN_CACHE_DIR = mkdtempSync(join(tmpdir(), "kiln-decoder-test-"));
const hasJit = jitUnavailableReason() === null;

type T = any; // traced Syms or eager Tensors: the block below is written once for both

const HIDDEN = 64;
const HEADS = 4;
const KV_HEADS = 2;
const HEAD_DIM = 16;
const FFN = 96;
const EPS = 1e-6;

/** One decoder layer's modules with random weights (norm weights near 1). */
function layer(qkNorm: boolean, dtype: DType, seed: number) {
  const rotary = new RotaryEmbedding({ rotaryDim: HEAD_DIM, theta: 10000, maxPositions: 256, scaling: null });
  const opts = { dtype };
  const attn = new Attention(
    { hiddenSize: HIDDEN, numHeads: HEADS, numKvHeads: KV_HEADS, headDim: HEAD_DIM, qkvBias: false, oBias: false, qkNorm, rmsNormEps: EPS, slidingWindow: null },
    0, rotary, opts,
  );
  const mlp = new GatedMLP(HIDDEN, FFN, false, opts);
  const inNorm = new RMSNorm(HIDDEN, EPS);
  const postNorm = new RMSNorm(HIDDEN, EPS);
  const gen = new k.Generator(seed);
  for (const m of [attn, mlp, inNorm, postNorm]) {
    for (const [n, p] of m.namedParameters()) {
      const r = n.endsWith("norm.weight") || n === "weight" ? k.randn(p.shape, { std: 0.1, generator: gen }).add(1) : k.randn(p.shape, { std: 0.1, generator: gen });
      m.setParameter(n, r.to(p.dtype));
    }
  }
  return { rotary, attn, mlp, inNorm, postNorm };
}

/** Eager reference: the src/nn modules' own forward (dense path, batch 1). */
function eagerLayer(l: ReturnType<typeof layer>, x: k.Tensor, positions: k.Tensor): k.Tensor {
  const T = x.shape[0]!;
  const ctx: DenseContext = { kind: "dense", batch: 1, seqLen: T, positions };
  const h = x.add(l.attn.forward(l.inNorm.forward(x), ctx));
  return h.add(l.mlp.forward(l.postNorm.forward(h)));
}

/** The same math written against compile/functional.ts, split around the attention core. */
function compiledLayer(l: ReturnType<typeof layer>) {
  const { attn, mlp, inNorm, postNorm, rotary } = l;
  const dynamic = (args: number[]) => args.map((argIndex) => ({ argIndex, dim: 0, max: 128 }));
  const heads = (h: AnyTensor, w: k.Tensor, n: number, norm: RMSNorm | null): T => {
    const v = (linear(h, w) as T).reshape(-1, n, HEAD_DIM);
    return norm ? rmsNorm(v, norm.weight, norm.eps) : v;
  };
  // x [T, hidden], positions int32 [T] -> q [T, H, D], k, v [T, Hkv, D]
  const pre = compile(
    (x: T, pos: T) => {
      const h = rmsNorm(x, inNorm.weight, inNorm.eps);
      const q = rotaryEmbedding(heads(h, attn.qProj.weight, HEADS, attn.qNorm), pos, rotary.cos, rotary.sin, rotary.neox);
      const kk = rotaryEmbedding(heads(h, attn.kProj.weight, KV_HEADS, attn.kNorm), pos, rotary.cos, rotary.sin, rotary.neox);
      return [q, kk, heads(h, attn.vProj.weight, KV_HEADS, null)];
    },
    { dynamic: dynamic([0, 1]), name: "decoder-pre" },
  );
  // x [T, hidden], attention output [T, H*D] -> layer output [T, hidden]
  const post = compile(
    (x: T, a: T) => {
      const h = x.add(linear(a, attn.oProj.weight));
      const n = rmsNorm(h, postNorm.weight, postNorm.eps);
      return h.add(linear(siluMul(linear(n, mlp.gateProj.weight), linear(n, mlp.upProj.weight)), mlp.downProj.weight));
    },
    { dynamic: dynamic([0, 1]), name: "decoder-post" },
  );
  const run = (x: k.Tensor, positions: k.Tensor): k.Tensor => {
    const T = x.shape[0]!;
    const [q, kk, v] = pre(x, positions) as k.Tensor[];
    const toHeads = (t: k.Tensor, n: number) => t.view(1, T, n, HEAD_DIM).transpose(1, 2);
    const o = k.causalAttention(toHeads(q!, HEADS), toHeads(kk!, KV_HEADS), toHeads(v!, KV_HEADS));
    const a = o.transpose(1, 2).reshape(T, HEADS * HEAD_DIM);
    return post(x, a) as k.Tensor;
  };
  return { pre, post, run };
}

describe("compile: decoder layer equals eager", { skip: hasJit ? false : `no JIT: ${jitUnavailableReason()}` }, () => {
  const cases: { name: string; qkNorm: boolean; dtype: DType; tol: number }[] = [
    { name: "Llama-style, float32 weights", qkNorm: false, dtype: "float32", tol: 1e-4 },
    // bf16: on avx512-bf16 a product of >= k.bf16DotMinM rows rounds its activations to bf16 (2^-9 relative), so
    // the compiled program (rows padded to the bucket, 32) and eager (17 rows, exact f32) differ by ~2e-3
    { name: "Llama-style, bf16 weights", qkNorm: false, dtype: "bfloat16", tol: (tryLoadNativeKernels()?.bf16DotMinM ?? 0) > 0 ? 2 ** -7 : 1e-3 },
    { name: "Qwen3-style q/k norm", qkNorm: true, dtype: "float32", tol: 1e-4 },
  ];
  for (const c of cases) {
    it(`${c.name}: random inputs across bucket boundaries; recompiles only for a new bucket`, () => {
      const l = layer(c.qkNorm, c.dtype, 11);
      const f = compiledLayer(l);
      const gen = new k.Generator(5);
      // buckets (powers of two): 5,7,8 -> 8; 9,16 -> 16; 17 -> 32
      const plan: [number, number][] = [[5, 1], [7, 1], [8, 1], [9, 2], [16, 2], [17, 3], [3, 4]];
      for (const [T, compiles] of plan) {
        const x = k.randn([T, HIDDEN], { generator: gen });
        const positions = k.arange(T, undefined, 1, { dtype: "int32" });
        const want = eagerLayer(l, x, positions).dataSync() as Float32Array;
        const got = f.run(x, positions);
        assert.deepEqual([...got.shape], [T, HIDDEN]);
        assertClose(got, want, { rtol: c.tol, atol: c.tol, msg: `T=${T}` });
        assert.equal(f.pre.stats.compiles, compiles, `pre-attention programs after T=${T}`);
        assert.equal(f.post.stats.compiles, compiles, `post-attention programs after T=${T}`);
      }
      assert.equal(f.pre.stats.fallbackCalls, 0);
      assert.equal(f.post.stats.fallbackCalls, 0);
      assert.equal(f.post.lastInfo!.opaqueKernels, 4, "o_proj, gate, up, down run as back-end matmuls");
    });
  }
});
