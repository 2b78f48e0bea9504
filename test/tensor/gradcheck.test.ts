// Gradient checks: every differentiable op's analytical gradient (autograd) against central finite
// differences, on small random shapes including non-contiguous views and broadcasting.
// (the helper and its tolerances: gradcheck-helper.ts)
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import * as k from "../../src/tensor/index.js";
import type { Tensor } from "../../src/tensor/index.js";
import { gradcheck, type Input } from "./gradcheck-helper.js";

describe("gradcheck: elementwise", () => {
  test("add/sub/mul/div with broadcasting", () => {
    gradcheck("add", [{ shape: [2, 3] }, { shape: [3] }], (a, b) => a.add(b));
    gradcheck("add alpha", [{ shape: [2, 3] }, { shape: [2, 1] }], (a, b) => k.add(a, b, 0.5));
    gradcheck("sub", [{ shape: [2, 1, 3] }, { shape: [4, 1] }], (a, b) => a.sub(b));
    gradcheck("mul", [{ shape: [3, 4] }, { shape: [1, 4] }], (a, b) => a.mul(b));
    gradcheck("div", [{ shape: [3, 4] }, { shape: [4], kind: "positive" }], (a, b) => a.div(b));
    gradcheck("scalar ops", [{ shape: [5], kind: "positive" }], (a) => k.div(2, a).add(3).mul(0.5).sub(1));
  });
  test("pow, maximum, minimum, clamp", () => {
    gradcheck("pow scalar", [{ shape: [2, 3], kind: "positive" }], (a) => a.pow(3));
    gradcheck("pow tensor", [{ shape: [2, 3], kind: "positive" }, { shape: [3] }], (a, b) => a.pow(b));
    gradcheck("rpow", [{ shape: [4] }], (a) => k.pow(2, a));
    gradcheck("maximum", [{ shape: [8], kind: "distinct" }, { shape: [8], kind: "distinct" }], (a, b) => a.maximum(b.add(0.05)), 3);
    gradcheck("minimum", [{ shape: [8], kind: "distinct" }, { shape: [8], kind: "distinct" }], (a, b) => a.minimum(b.add(0.05)), 4);
    gradcheck("clamp", [{ shape: [10], kind: "distinct" }], (a) => a.clamp(-0.22, 0.33));
  });
  test("unary math", () => {
    const any = [{ shape: [2, 5] }];
    const pos = [{ shape: [2, 5], kind: "positive" as const }];
    const away = [{ shape: [2, 5], kind: "awayFromZero" as const }];
    gradcheck("neg", any, (a) => a.neg());
    gradcheck("exp", any, (a) => a.exp());
    gradcheck("log", pos, (a) => a.log());
    gradcheck("sqrt", pos, (a) => a.sqrt());
    gradcheck("rsqrt", pos, (a) => a.rsqrt());
    gradcheck("reciprocal", pos, (a) => k.reciprocal(a));
    gradcheck("tanh", any, (a) => a.tanh());
    gradcheck("sigmoid", any, (a) => a.sigmoid());
    gradcheck("silu", any, (a) => a.silu());
    gradcheck("gelu", any, (a) => a.gelu());
    gradcheck("gelu tanh", any, (a) => a.gelu("tanh"));
    gradcheck("relu", away, (a) => a.relu());
    gradcheck("abs", away, (a) => a.abs());
    gradcheck("square", any, (a) => a.square());
    gradcheck("sin cos", any, (a) => k.sin(a).add(k.cos(a)));
  });
  test("where and masked fill", () => {
    const cond = k.tensor([[true, false, true], [false, false, true]]);
    gradcheck("where", [{ shape: [2, 3] }, { shape: [3] }], (a, b) => k.where(cond, a, b));
    gradcheck("masked fill", [{ shape: [2, 3] }], (a) => a.maskedFill(cond, -2));
  });
});

describe("gradcheck: views on non-contiguous inputs", () => {
  test("transpose, permute, slice, narrow, select, expand, squeeze, unsqueeze, reshape", () => {
    gradcheck("transpose", [{ shape: [3, 4] }], (a) => a.T.mul(a.T));
    gradcheck("permute", [{ shape: [2, 3, 4] }], (a) => a.permute(2, 0, 1).exp());
    gradcheck("slice step", [{ shape: [6, 3] }], (a) => a.slice(0, 1, 6, 2).square());
    gradcheck("narrow of transpose", [{ shape: [4, 5] }], (a) => a.T.narrow(0, 1, 3).tanh());
    gradcheck("select", [{ shape: [3, 4] }], (a) => a.select(1, 2).mul(a.select(0, 1).narrow(0, 0, 3)));
    gradcheck("expand", [{ shape: [3, 1] }], (a) => a.expand(2, 3, 4).sigmoid());
    gradcheck("squeeze unsqueeze", [{ shape: [3, 1, 2] }], (a) => a.squeeze(1).unsqueeze(0).square());
    gradcheck("reshape of transposed", [{ shape: [3, 4] }], (a) => a.T.reshape(2, 6).exp());
    gradcheck("contiguous clone flatten", [{ shape: [2, 3, 2] }], (a) => a.transpose(0, 2).contiguous().clone().flatten().square());
  });
});

describe("gradcheck: reductions and normalisations", () => {
  test("sum, mean, max, min, prod", () => {
    gradcheck("sum all", [{ shape: [2, 3] }], (a) => a.square().sum());
    gradcheck("sum dims", [{ shape: [2, 3, 4] }], (a) => a.sum([0, 2]));
    gradcheck("sum keepdim transposed", [{ shape: [3, 4] }], (a) => a.T.sum(1, true).square());
    gradcheck("mean", [{ shape: [2, 3, 4] }], (a) => a.mean(-1).square());
    gradcheck("max dim", [{ shape: [3, 5], kind: "distinct" }], (a) => a.max(1));
    gradcheck("min keepdim", [{ shape: [3, 5], kind: "distinct" }], (a) => a.min(0, true));
    gradcheck("max all", [{ shape: [4, 3], kind: "distinct" }], (a) => a.max());
    gradcheck("prod", [{ shape: [2, 3], kind: "positive" }], (a) => k.prod(a, 1));
  });
  test("softmax, log_softmax, logsumexp, cumsum", () => {
    gradcheck("softmax", [{ shape: [3, 5] }], (a) => a.softmax(-1));
    gradcheck("softmax dim0 of transposed", [{ shape: [4, 3] }], (a) => a.T.softmax(0));
    gradcheck("log_softmax", [{ shape: [3, 5] }], (a) => a.logSoftmax(1));
    gradcheck("logsumexp", [{ shape: [3, 5] }], (a) => a.logsumexp(1));
    gradcheck("cumsum", [{ shape: [3, 4] }], (a) => a.cumsum(1));
    gradcheck("cumsum dim0 transposed", [{ shape: [3, 4] }], (a) => a.T.cumsum(0));
  });
  test("rms_norm", () => {
    gradcheck("rms_norm", [{ shape: [3, 8] }, { shape: [8] }], (x, w) => k.rmsNorm(x, w, 1e-5));
    gradcheck("rms_norm 3-d transposed", [{ shape: [8, 2, 3] }, { shape: [8] }], (x, w) => k.rmsNorm(x.permute(1, 2, 0), w, 1e-5));
  });
  test("gelu's and gelu_tanh's gradients equal their closed forms in float64 (tightly), 0 and both tails included", () => {
    const xs = [-9, -5, -3, -1.5, -0.5, -1e-3, -1e-30, 0, 1e-20, 1e-3, 0.25, 0.5, 1, 2, 4, 9];
    const g = xs.map((_, i) => 1 + 0.1 * i);
    // erf by its Maclaurin series (|x| < 3) and its asymptotic expansion (|x| >= 3), in float64
    const erf = (z: number): number => {
      const a = Math.abs(z);
      if (a >= 3) {
        let sum = 1, term = 1;
        for (let n = 1; n < 8; n++) sum += (term *= -(2 * n - 1) / (2 * a * a));
        return Math.sign(z) * (1 - (Math.exp(-a * a) / (a * Math.sqrt(Math.PI))) * sum);
      }
      let sum = 0, term = z;
      for (let n = 0; n < 80; n++) {
        sum += term / (2 * n + 1);
        term *= (-z * z) / (n + 1);
      }
      return (2 / Math.sqrt(Math.PI)) * sum;
    };
    const exact = (x: number) => 0.5 * (1 + erf(x / Math.SQRT2)) + (x * Math.exp(-0.5 * x * x)) / Math.sqrt(2 * Math.PI);
    const tanhForm = (x: number) => {
      const kk = Math.sqrt(2 / Math.PI);
      const t = Math.tanh(kk * (x + 0.044715 * x ** 3));
      return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kk * (1 + 3 * 0.044715 * x * x);
    };
    for (const [approximate, d] of [["none", exact], ["tanh", tanhForm]] as const) {
      const x = k.tensor(Float32Array.from(xs), { requiresGrad: true });
      x.gelu(approximate).backward(k.tensor(Float32Array.from(g)));
      const got = x.grad!.toList() as number[];
      xs.forEach((v, i) => {
        const want = g[i]! * d(Math.fround(v));
        assert.ok(Number.isFinite(got[i]!) && Math.abs(got[i]! - want) <= 2e-6 * Math.max(1, Math.abs(want)), `gelu ${approximate} at ${v}: ${got[i]} vs ${want}`);
      });
    }
  });
  test("rms_norm's gradients equal its closed form computed in float64 (tightly: the finite differences allow 2%)", () => {
    const [rows, n, eps] = [37, 48, 1e-5];
    const xs = Float32Array.from({ length: rows * n }, (_, i) => Math.sin(i * 0.37) * 1.3 + 0.1);
    const ws = Float32Array.from({ length: n }, (_, i) => 0.5 + Math.cos(i * 0.7));
    const gs = Float32Array.from({ length: rows * n }, (_, i) => Math.cos(i * 0.11));
    // dx = r g w - x r^3 mean(g w x), dw = sum over rows of g x r, r = (mean(x^2) + eps)^-1/2
    const dx = new Float64Array(rows * n);
    const dw = new Float64Array(n);
    for (let r = 0; r < rows; r++) {
      let ss = 0;
      let dot = 0;
      for (let i = 0; i < n; i++) {
        ss += xs[r * n + i]! ** 2;
        dot += gs[r * n + i]! * ws[i]! * xs[r * n + i]!;
      }
      const inv = 1 / Math.sqrt(ss / n + eps);
      for (let i = 0; i < n; i++) {
        dx[r * n + i] = inv * gs[r * n + i]! * ws[i]! - (xs[r * n + i]! * inv ** 3 * dot) / n;
        dw[i] += gs[r * n + i]! * xs[r * n + i]! * inv;
      }
    }
    const x = k.tensor(xs, { shape: [rows, n], requiresGrad: true });
    const w = k.tensor(ws, { requiresGrad: true });
    k.rmsNorm(x, w, eps).backward(k.tensor(gs, { shape: [rows, n] }));
    const close = (got: Float32Array, want: Float64Array, what: string) =>
      got.forEach((v, i) => assert.ok(Math.abs(v - want[i]!) <= 1e-5 + 1e-5 * Math.abs(want[i]!), `${what}[${i}] ${v} vs ${want[i]}`));
    close(x.grad!.dataSync() as Float32Array, dx, "dx");
    close(w.grad!.dataSync() as Float32Array, dw, "dw");
  });
});

describe("gradcheck: linear algebra", () => {
  test("matmul: 2-d, batched, broadcast, 1-d", () => {
    gradcheck("matmul 2d", [{ shape: [3, 4] }, { shape: [4, 2] }], (a, b) => a.matmul(b));
    gradcheck("matmul transposed inputs", [{ shape: [4, 3] }, { shape: [2, 4] }], (a, b) => a.T.matmul(b.T));
    gradcheck("matmul batched", [{ shape: [2, 3, 4] }, { shape: [2, 4, 2] }], (a, b) => a.matmul(b));
    gradcheck("matmul broadcast batch", [{ shape: [2, 3, 4] }, { shape: [4, 2] }], (a, b) => a.matmul(b));
    gradcheck("matmul broadcast 1 vs 2", [{ shape: [1, 3, 4] }, { shape: [2, 4, 2] }], (a, b) => a.matmul(b));
    gradcheck("matmul vec-mat", [{ shape: [4] }, { shape: [4, 3] }], (a, b) => a.matmul(b));
    gradcheck("matmul mat-vec", [{ shape: [2, 3, 4] }, { shape: [4] }], (a, b) => a.matmul(b));
    gradcheck("matmul dot", [{ shape: [4] }, { shape: [4] }], (a, b) => a.matmul(b));
  });
  test("linear with bias, 3-d input", () => {
    gradcheck("linear", [{ shape: [2, 3, 4] }, { shape: [5, 4] }, { shape: [5] }], (x, w, b) => k.linear(x, w, b));
    gradcheck("linear transposed x", [{ shape: [4, 3] }, { shape: [2, 4] }], (x, w) => k.linear(x.T, w));
  });
});

describe("gradcheck: indexing", () => {
  test("index_select and embedding (repeated ids)", () => {
    const ids = k.tensor(new Int32Array([2, 0, 2, 3, 1, 2]), { shape: [2, 3] });
    gradcheck("embedding", [{ shape: [5, 3] }], (w) => k.embedding(ids, w));
    const idx = k.tensor(new Int32Array([1, 1, 0]));
    gradcheck("index_select dim1", [{ shape: [2, 3, 2] }], (t) => k.indexSelect(t, 1, idx));
  });
  test("gather, scatter, scatter_add", () => {
    const index = k.tensor(new Int32Array([0, 2, 2, 1, 0, 0]), { shape: [2, 3] });
    gradcheck("gather dim1", [{ shape: [2, 4] }], (t) => k.gather(t, 1, index));
    gradcheck("gather dim0", [{ shape: [3, 3] }], (t) => k.gather(t, 0, index));
    const perm = k.tensor(new Int32Array([2, 0, 1, 3, 1, 0]), { shape: [2, 3] });
    gradcheck("scatter", [{ shape: [2, 4] }, { shape: [2, 3] }], (t, s) => k.scatter(t, 1, perm, s));
    gradcheck("scatter_add", [{ shape: [2, 4] }, { shape: [2, 3] }], (t, s) => k.scatter(t, 1, index, s, true));
  });
  test("gather / scatter backward of a bf16 gradient: the zeros it is scattered into are bf16 too", () => {
    const g = k.tensor([[1, 10, 100]], { dtype: "bfloat16" }); // the upstream gradient, bf16
    const x = k.tensor([[1, 2, 3]], { dtype: "bfloat16", requiresGrad: true });
    k.gather(x, 1, k.tensor(Int32Array.of(2, 2, 0), { shape: [1, 3] })).backward(g);
    assert.equal(x.grad!.dtype, "bfloat16");
    assert.deepEqual(x.grad!.toList(), [100, 0, 11]);
    const self = k.zeros([1, 3], { dtype: "bfloat16", requiresGrad: true });
    const src = k.tensor([[4, 5]], { dtype: "bfloat16", requiresGrad: true });
    k.scatter(self, 1, k.tensor(Int32Array.of(2, 0), { shape: [1, 2] }), src).backward(g);
    assert.deepEqual(self.grad!.toList(), [0, 10, 0]); // overwritten positions get none
    assert.deepEqual(src.grad!.toList(), [100, 1]);
  });
  test("cat, stack, split, chunk", () => {
    gradcheck("cat", [{ shape: [2, 3] }, { shape: [2, 1] }, { shape: [2, 2] }], (a, b, c) => k.cat([a, b.exp(), c], 1));
    gradcheck("stack", [{ shape: [3] }, { shape: [3] }], (a, b) => k.stack([a, b.square()], 0));
    gradcheck("split", [{ shape: [5, 2] }], (a) => {
      const [x, y, z] = k.split(a, [2, 2, 1], 0);
      return k.cat([x!.mul(2), y!.square(), z!.exp()], 0);
    });
    gradcheck("chunk", [{ shape: [2, 4] }], (a) => {
      const [x, y] = k.chunk(a, 2, 1);
      return x!.mul(y!);
    });
  });
});

/** cos/sin tables [maxPos, half] for rotary with base 10000. */
function ropeTables(maxPos: number, rotaryDim: number): { cos: Tensor; sin: Tensor } {
  const half = rotaryDim / 2;
  const c = new Float32Array(maxPos * half);
  const s = new Float32Array(maxPos * half);
  for (let p = 0; p < maxPos; p++)
    for (let i = 0; i < half; i++) {
      const theta = p / Math.pow(10000, (2 * i) / rotaryDim);
      c[p * half + i] = Math.cos(theta);
      s[p * half + i] = Math.sin(theta);
    }
  return { cos: k.tensor(c, { shape: [maxPos, half] }), sin: k.tensor(s, { shape: [maxPos, half] }) };
}

describe("gradcheck: fused nn ops", () => {
  test("rotary (neox, interleaved, partial)", () => {
    const pos = k.tensor(new Int32Array([0, 3, 5]));
    const full = ropeTables(8, 4);
    gradcheck("rotary neox", [{ shape: [3, 2, 4] }], (x) => k.rotaryEmbedding(x, pos, full.cos, full.sin, true));
    gradcheck("rotary gptj", [{ shape: [3, 2, 4] }], (x) => k.rotaryEmbedding(x, pos, full.cos, full.sin, false));
    const partial = ropeTables(8, 2);
    gradcheck("rotary partial of transposed", [{ shape: [2, 3, 4] }], (x) => k.rotaryEmbedding(x.transpose(0, 1), pos, partial.cos, partial.sin, true));
  });
  test("causal attention (MHA and GQA)", () => {
    gradcheck("attention", [{ shape: [1, 2, 3, 4] }, { shape: [1, 2, 3, 4] }, { shape: [1, 2, 3, 4] }], (q, kk, v) => k.causalAttention(q, kk, v));
    gradcheck("attention gqa", [{ shape: [1, 4, 3, 2] }, { shape: [1, 2, 3, 2] }, { shape: [1, 2, 3, 2] }], (q, kk, v) => k.causalAttention(q, kk, v));
    // Gemma 2's soft-capped scores (cap 0.5, under the scores' range) and a 2-token window: training through them
    gradcheck("attention soft-capped", [{ shape: [1, 2, 4, 4] }, { shape: [1, 2, 4, 4] }, { shape: [1, 2, 4, 4] }], (q, kk, v) => k.causalAttention(q, kk, v, undefined, 2, 0.5));
  });
  test("cross entropy with ignore_index, N-d inputs and class probabilities", () => {
    const targets = k.tensor(new Int32Array([1, -100, 4, 0]));
    gradcheck("cross_entropy", [{ shape: [4, 5] }], (l) => k.crossEntropy(l, targets));
    const spatial = k.tensor(Int32Array.of(0, 2, -100, 1), { shape: [2, 2] });
    gradcheck("cross_entropy [N, C, d]", [{ shape: [2, 3, 2] }], (l) => k.crossEntropy(l, spatial, { reduction: "none", labelSmoothing: 0.1 }));
    // class probabilities: the gradient reaches the targets too
    gradcheck("cross_entropy probabilities", [{ shape: [2, 4, 2] }, { shape: [2, 4, 2], kind: "positive" }], (l, p) => k.crossEntropy(l, p, { labelSmoothing: 0.1 }));
    gradcheck("siluMul", [{ shape: [2, 3] }, { shape: [2, 3] }], (a, b) => k.siluMul(a, b));
  });
});

describe("gradcheck: a tiny transformer block end to end", () => {
  test("rms_norm -> q,k,v -> rotary -> causal attention -> o -> residual -> rms_norm -> silu MLP -> residual", () => {
    const [S, D, Hn, Hd, F] = [4, 8, 2, 4, 12];
    const pos = k.tensor(new Int32Array([0, 1, 2, 3]));
    const rope = ropeTables(S, Hd);
    const specs: Input[] = [
      { shape: [S, D] }, // x
      { shape: [D] }, // attention norm
      { shape: [D, D] }, // wq
      { shape: [D, D] }, // wk
      { shape: [D, D] }, // wv
      { shape: [D, D] }, // wo
      { shape: [D] }, // mlp norm
      { shape: [F, D] }, // w1 (gate)
      { shape: [F, D] }, // w3 (up)
      { shape: [D, F] }, // w2 (down)
    ];
    const scale = (t: Tensor, s: number) => t.mul(s);
    gradcheck("transformer block", specs, (x, n1, wq, wk, wv, wo, n2, w1, w3, w2) => {
      const h = k.rmsNorm(x, n1, 1e-5);
      const heads = (w: Tensor) => k.linear(h, scale(w, 0.5)).view(S, Hn, Hd);
      const q = k.rotaryEmbedding(heads(wq), pos, rope.cos, rope.sin);
      const kk = k.rotaryEmbedding(heads(wk), pos, rope.cos, rope.sin);
      const v = heads(wv);
      const toBHSD = (t: Tensor) => t.permute(1, 0, 2).unsqueeze(0);
      const attn = k.causalAttention(toBHSD(q), toBHSD(kk), toBHSD(v)); // [1, H, S, Hd]
      const merged = attn.squeeze(0).permute(1, 0, 2).reshape(S, D);
      const x1 = x.add(k.linear(merged, scale(wo, 0.5)));
      const h2 = k.rmsNorm(x1, n2, 1e-5);
      const mlp = k.linear(k.siluMul(k.linear(h2, scale(w1, 0.5)), k.linear(h2, scale(w3, 0.5))), scale(w2, 0.5));
      return x1.add(mlp);
    });
  });
});

describe("prod backward with zeros (torch's prod_backward)", () => {
  test("one zero: its entry gets the product of the others; two zeros: all 0; none: prod / x", () => {
    const x = k.tensor([[0, 2, 3], [0, 0, 4], [1, 2, 3], [5, 0.5, -2]], { requiresGrad: true });
    k.prod(x, 1).mul(k.tensor([1, 1, 1, 10])).sum().backward();
    assert.deepEqual(x.grad!.toList(), [6, 0, 0, 0, 0, 0, 6, 3, 2, -10, -100, 25]);
    const y = k.tensor([0, 2, 3], { requiresGrad: true });
    k.prod(y).backward();
    assert.deepEqual(y.grad!.toList(), [6, 0, 0]);
    const z = k.tensor([[2, 0], [3, 5]], { requiresGrad: true }); // along dim 0 of a transposed view, keepdim
    k.prod(z.T, 1, true).sum().backward();
    assert.deepEqual(z.grad!.toList(), [3, 5, 2, 0]);
  });
});

describe("autograd engine", () => {
  test("gradients accumulate across backward calls; zero by resetting .grad", () => {
    const w = k.tensor([1, 2, 3], { requiresGrad: true });
    w.mul(2).sum().backward();
    w.mul(3).sum().backward();
    assert.deepEqual(w.grad!.toList(), [5, 5, 5]);
  });
  test("retainGrad keeps a non-leaf gradient; noGrad records nothing", () => {
    const w = k.tensor([1, 2], { requiresGrad: true });
    const y = w.mul(3).retainGrad();
    y.square().sum().backward();
    assert.deepEqual(y.grad!.toList(), [6, 12]);
    assert.deepEqual(w.grad!.toList(), [18, 36]);
    const z = k.noGrad(() => w.mul(2));
    assert.equal(z.requiresGrad, false);
    assert.equal(z.gradFn, null);
  });
  test("a reused intermediate sums its gradients; comparisons do not require grad", () => {
    const a = k.tensor([0.5, -1], { requiresGrad: true });
    const b = a.exp();
    b.add(b).mul(b).sum().backward(); // d/da 2 e^{2a} = 4 e^{2a}
    const g = a.grad!.toList();
    assert.ok(Math.abs(g[0]! - 4 * Math.exp(1)) < 1e-4 && Math.abs(g[1]! - 4 * Math.exp(-2)) < 1e-5);
    assert.equal(a.gt(0).requiresGrad, false);
  });
  test("in-place ops autograd would have to record are refused, never silently wrong", () => {
    const p = k.tensor([1, 2], { requiresGrad: true });
    const q = p.mul(1);
    const inPlace: [string, () => unknown][] = [
      ["mul_", () => q.mul_(3)],
      ["add_", () => q.add_(p)],
      ["div_", () => q.div_(2)],
      ["fill_", () => q.fill_(0)],
      ["masked_fill_", () => q.maskedFill_(k.tensor([true, false]), 0)],
      ["mul_", () => q.slice(0, 0, 1).mul_(3)],
      ["copy_", () => k.zeros([2]).copy_(p.mul(3))],
      ["add_", () => k.zeros([2]).add_(p)],
      ["fill_", () => p.fill_(1)],
      ["copy_", () => p.copy_(k.zeros([2]))],
    ];
    for (const [op, f] of inPlace) assert.throws(f, (e: Error) => e.message.includes(op) && /grad/.test(e.message), op);
    assert.deepEqual(q.toList(), [1, 2], "nothing was written");
    q.sum().backward();
    assert.deepEqual(p.grad!.toList(), [1, 1]);
    // Without autograd in the way they run: under noGrad (as optimizers write parameters), and on plain tensors.
    k.noGrad(() => p.mul_(2));
    assert.deepEqual(p.toList(), [2, 4]);
    assert.deepEqual(k.tensor([1, 2]).mul_(3).toList(), [3, 6]);
  });
  test("in-place ops check shape, dtype and overlap as torch does; only floating tensors require grad", () => {
    assert.throws(() => k.zeros([3]).add_(k.zeros([2, 3])), /\[add_\] output with shape \[3\] doesn't match the broadcast shape \[2, 3\]/);
    assert.throws(() => k.tensor(Int32Array.of(1, 2)).mul_(1.5), /\[mul_\] result type float32 can't be cast to the desired output type int32/);
    assert.throws(() => k.tensor(Int32Array.of(1, 2)).div_(2), /\[div_\] result type float32/);
    assert.deepEqual(k.tensor(Int32Array.of(1, 2)).mul_(3).toList(), [3, 6]);
    assert.deepEqual(k.tensor(Int32Array.of(1, 2)).maskedFill_(k.tensor([true, false]), 7).toList(), [7, 2]);
    assert.throws(() => k.zeros([1]).expand(3).add_(1), /more than one element of the written-to tensor/);
    assert.throws(() => k.zeros([2]).expand(2, 2).fill_(1), /more than one element/);
    assert.throws(() => k.tensor(Int32Array.of(1, 2), { requiresGrad: true }), /only tensors of floating point dtype can require gradients/);
    assert.throws(() => k.tensor(Int32Array.of(1, 2)).requiresGrad_(), /floating point/);
    // only leaves change the flag (torch): switching a computed tensor off silently cut its inputs' gradients
    const leaf = k.tensor([1, 2], { requiresGrad: true });
    const computed = leaf.mul(3);
    assert.throws(() => computed.requiresGrad_(false), /\[requires_grad_\] you can only change requires_grad flags of leaf variables/);
    assert.equal(computed.requiresGrad_(true).requiresGrad, true);
    computed.sum().backward();
    assert.deepEqual(leaf.grad!.toList(), [3, 3]);
    assert.equal(leaf.requiresGrad_(false).requiresGrad, false);
  });
  test("a value saved for backward and then written in place makes backward throw (version counter)", () => {
    const w = k.tensor([1, 2], { requiresGrad: true });
    const x = k.tensor([3, 4]);
    const y = w.mul(x); // saves x for w's gradient
    x.mul_(10); // allowed: x does not require grad
    assert.throws(() => y.sum().backward(), /modified by an in-place operation/);
    const x2 = k.tensor([3, 4]);
    const y2 = w.mul(x2);
    k.noGrad(() => x2.clone().mul_(10)); // a clone's writes leave the saved value alone
    y2.sum().backward();
    assert.deepEqual(w.grad!.toList(), [3, 4]);
  });
  test("indices and conditions a backward reads are version-checked too (they gave the gradient of the new values)", () => {
    const modified: [string, (w: k.Tensor) => { y: k.Tensor; write: () => void }][] = [
      ["index_select", (w) => { const i = k.tensor(Int32Array.of(0)); return { y: w.indexSelect(0, i), write: () => i.fill_(2) }; }],
      ["gather", (w) => { const i = k.tensor(Int32Array.of(0), { shape: [1] }); return { y: w.gather(0, i), write: () => i.fill_(2) }; }],
      ["where", (w) => { const c = k.tensor([true, false, false]); return { y: k.where(c, w, 0), write: () => c.fill_(1) }; }],
      ["where", (w) => { const m = k.tensor([true, false, false]); return { y: w.maskedFill(m, 0), write: () => m.select(0, 0).fill_(0) }; }],
    ];
    for (const [op, make] of modified) {
      const w = k.tensor([1, 2, 3], { requiresGrad: true });
      const { y, write } = make(w);
      write();
      assert.throws(() => y.sum().backward(), new RegExp(`\\[${op}\\] one of the tensors needed for gradient computation has been modified by an in-place operation`), op);
      assert.equal(w.grad, null, `${op}: no gradient from the modified index`);
    }
    const w = k.tensor([1, 2, 3], { requiresGrad: true });
    const i = k.tensor(Int32Array.of(0));
    const y = w.indexSelect(0, i);
    k.noGrad(() => i.clone().fill_(2)); // a clone's writes leave the saved index alone
    y.sum().backward();
    assert.deepEqual(w.grad!.toList(), [1, 0, 0]);
  });
  test("second backward through a freed graph fails; retainGraph allows it", () => {
    const a = k.tensor([1, 2], { requiresGrad: true });
    const y = a.exp().sum();
    y.backward(undefined, { retainGraph: true });
    y.backward();
    assert.throws(() => y.backward(), /already freed/);
    const e = Math.exp(1);
    assert.ok(Math.abs(a.grad!.toList()[0]! - 2 * e) < 1e-4);
  });
  test("non-scalar backward needs an explicit grad; bf16 leaves get bf16 grads", () => {
    const a = k.tensor([1, 2], { requiresGrad: true });
    assert.throws(() => a.mul(2).backward(), /one-element/);
    a.mul(2).backward(k.tensor([1, 10]));
    assert.deepEqual(a.grad!.toList(), [2, 20]);
    const b = k.tensor([1, 2], { dtype: "bfloat16", requiresGrad: true });
    b.to("float32").square().sum().backward();
    assert.equal(b.grad!.dtype, "bfloat16");
    assert.deepEqual(b.grad!.toList(), [2, 4]);
  });
  test("disposing activations before backward is safe: nodes hold what backward needs", () => {
    const a = k.tensor([0.5, -1, 2], { requiresGrad: true });
    const e = a.exp();
    const s = e.mul(e);
    const loss = s.sum();
    e.dispose();
    s.dispose();
    loss.backward(); // d/da sum(e^{2a}) = 2 e^{2a}
    a.grad!.toList().forEach((g, i) => assert.ok(Math.abs(g - 2 * Math.exp(2 * [0.5, -1, 2][i]!)) < 1e-3));
  });
  test("embedding backward scatter-adds a 4096 x 256 table quickly", () => {
    const w = k.zeros([4096, 256], { requiresGrad: true });
    const ids = k.tensor(Int32Array.from({ length: 512 }, (_, i) => (i * 37) % 4096));
    const t0 = performance.now();
    k.embedding(ids, w).sum().backward();
    const ms = performance.now() - t0;
    assert.equal(w.grad!.sum().item(), 512 * 256);
    assert.ok(ms < 2000, `took ${ms} ms`);
  });
});

describe("gradients where torch defines them at bounds, zeros and through selections", () => {
  test("clamp passes the gradient at its bounds (torch: min <= x <= max), blocks it outside", () => {
    const x = k.tensor([0, 1, 1.5, 2, 3], { requiresGrad: true });
    x.clamp(1, 2).sum().backward();
    assert.deepEqual(x.grad!.toList(), [0, 1, 1, 1, 0]);
    const y = k.tensor([-1, 0, 1], { requiresGrad: true });
    y.clamp(0).mul(k.tensor([1, 2, 3])).sum().backward(); // min only
    assert.deepEqual(y.grad!.toList(), [0, 2, 3]);
    const z = k.tensor([-1, 0, 1], { requiresGrad: true });
    z.clamp(undefined, 0).sum().backward(); // max only
    assert.deepEqual(z.grad!.toList(), [1, 1, 0]);
  });
  test("pow at zero: d(x^0)/dx is 0 and d(0^y)/dy is 0 for y >= 0 (torch's pow_backward), not NaN", () => {
    const x = k.tensor([0, 2], { requiresGrad: true });
    x.pow(0).sum().backward();
    assert.deepEqual(x.grad!.toList(), [0, 0]);
    const a = k.tensor([0, 0, 3], { requiresGrad: true });
    const b = k.tensor([0, 2, 0], { requiresGrad: true });
    a.pow(b).sum().backward();
    assert.deepEqual(a.grad!.toList(), [0, 0, 0]); // b * a^(b-1): 0 where b == 0, 2 * 0 at a = 0, b = 2
    assert.deepEqual(b.grad!.toList(), [0, 0, Math.fround(Math.log(3))]);
    const e = k.tensor([1, 2], { requiresGrad: true });
    k.pow(0, e).sum().backward(); // 0^e with a scalar base
    assert.deepEqual(e.grad!.toList(), [0, 0]);
  });
  test("remainder: the divisor's gradient is -g * floor(a / b)", () => {
    const a = k.tensor([7, -7, 5.5], { requiresGrad: true });
    const b = k.tensor([3, 3, -2], { requiresGrad: true });
    k.remainder(a, b).sum().backward();
    assert.deepEqual(a.grad!.toList(), [1, 1, 1]);
    assert.deepEqual(b.grad!.toList(), [-2, 3, 3]);
  });
  test("sort and topk values are differentiable: the gradient flows back to the picked positions", () => {
    const x = k.tensor([[3, 1, 2], [0, 5, 4]], { requiresGrad: true });
    const s = k.sort(x, 1, true);
    assert.equal(s.values.requiresGrad, true);
    s.values.mul(k.tensor([1, 10, 100])).sum().backward();
    assert.deepEqual(x.grad!.toList(), [1, 100, 10, 100, 1, 10]);
    const y = k.tensor([[3, 1], [0, 5], [2, 4]], { requiresGrad: true });
    const top = k.topk(y, 2, 0); // along dim 0: rows [3, 5] then [2, 4]
    assert.deepEqual(top.values.toList(), [3, 5, 2, 4]);
    top.values.mul(k.tensor([[1, 2], [10, 20]])).sum().backward();
    assert.deepEqual(y.grad!.toList(), [1, 0, 0, 2, 10, 20]);
    assert.equal(k.sort(k.tensor(Int32Array.of(2, 1))).values.requiresGrad, false);
  });
  test("cross_entropy whose targets are all ignore_index is still differentiable (zero gradient)", () => {
    const logits = k.tensor([[1, 2], [3, 4]], { requiresGrad: true });
    const loss = k.crossEntropy(logits, k.tensor(Int32Array.of(-100, -100)));
    loss.backward();
    assert.deepEqual(logits.grad!.toList(), [0, 0, 0, 0]);
  });
});
