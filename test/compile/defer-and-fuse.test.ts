// The global defer-and-fuse eager mode: elementwise eager ops are recorded and fused at the next sync
// point; results equal strict mode's, with fewer kernels dispatched.
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import * as k from "../../src/tensor/index.js";
import { jitUnavailableReason } from "../../src/compile/index.js";
import { CausalLM } from "../../src/models/causal-lm.js";
import { parseHfConfig } from "../../src/models/hf-config.js";
import { assertClose } from "../tensor/suite.js";

process.env.KILN_CACHE_DIR = mkdtempSync(join(tmpdir(), "kiln-defer-test-"));
const hasJit = jitUnavailableReason() === null;
const RTOL = { rtol: 1e-6, atol: 1e-6 };

const data = (n: number, f: (i: number) => number) => Float32Array.from({ length: n }, (_, i) => f(i));

/** fn's values and kernel count in strict mode and in defer-and-fuse mode. */
function both(fn: () => k.Tensor): { strict: number[]; deferred: number[]; strictKernels: number; deferredKernels: number } {
  const run = (mode: k.EagerMode) =>
    k.withEagerMode(mode, () => {
      const before = k.kernelsDispatched();
      const t = fn();
      const values = t.toList(); // the sync point
      const kernels = k.kernelsDispatched() - before;
      t.dispose();
      return { values, kernels };
    });
  const s = run("strict");
  const d = run("defer-and-fuse");
  return { strict: s.values, deferred: d.values, strictKernels: s.kernels, deferredKernels: d.kernels };
}

describe("defer-and-fuse eager mode", { skip: hasJit ? false : `no JIT: ${jitUnavailableReason()}` }, () => {
  const x = k.tensor(data(48, (i) => Math.sin(i) * 0.5), { shape: [4, 12] });
  const y = k.tensor(data(48, (i) => Math.cos(i * 0.7)), { shape: [4, 12] });
  const row = k.tensor(data(12, (i) => 1 + i / 10), { shape: [12] });

  it("fuses ((x*2+1).exp()*y).sigmoid() into fewer kernels with strict's values", () => {
    const r = both(() => x.mul(2).add(1).exp().mul(y).sigmoid());
    assertClose(r.deferred, r.strict, RTOL);
    assert.ok(r.deferredKernels < r.strictKernels, `${r.deferredKernels} !< ${r.strictKernels}`);
    assert.equal(r.deferredKernels, 1);
  });

  it("exp over float32's whole range, as torch.exp: subnormal results down to -103.97, finite up to ln(FLT_MAX), in strict and fused", () => {
    const xs = [-1e30, -104.5, -100, -88.8, -87.4, -87.3, 0, 1, 88.3, 88.5, 88.7, 88.8, 1e30, NaN];
    const r = both(() => k.tensor(xs).exp());
    const want = xs.map((x) => Math.fround(Math.exp(Math.fround(x))));
    assert.ok(want[2]! > 0 && want[2]! < 1.2e-38 && Number.isFinite(want[10]!), "the cases reach the subnormals and the top of the range");
    for (const got of [r.strict, r.deferred])
      got.forEach((v, i) => {
        if (Number.isNaN(want[i]!)) assert.ok(Number.isNaN(v), `exp(${xs[i]}) = ${v}`);
        else assert.ok(v === want[i] || Math.abs(v - want[i]!) <= 2e-6 * want[i]! + 2.9e-45, `exp(${xs[i]}) = ${v}, want ${want[i]}`);
      });
  });

  it("fills of -0, NaN and infinities are distinct programs (-0 reused 0's, inf reused NaN's: x / inf gave NaN)", () => {
    const num = k.tensor([1, -2]);
    for (const [v, want] of [[0, [Infinity, -Infinity]], [-0, [-Infinity, Infinity]], [NaN, [NaN, NaN]], [Infinity, [0, -0]]] as const) {
      const r = both(() => num.div(k.zeros([2]).fill_(v)));
      assert.deepEqual(r.deferred, want, `fill ${v}`);
      assert.deepEqual(r.deferred, r.strict, `fill ${v}`);
    }
  });

  it("silu(g) * u and a residual add", () => {
    const r = both(() => x.silu().mul(y).add(x));
    assertClose(r.deferred, r.strict, RTOL);
    assert.ok(r.deferredKernels < r.strictKernels);
  });

  it("rms_norm-like x * rsqrt(mean(x^2) + eps) * w (the reduce flushes)", () => {
    const r = both(() => {
      const ms = x.square().mean(-1, true);
      return x.mul(ms.add(1e-6).rsqrt()).mul(row);
    });
    assertClose(r.deferred, r.strict, RTOL);
    assert.ok(r.deferredKernels < r.strictKernels, `${r.deferredKernels} !< ${r.strictKernels}`);
  });

  it("broadcast rows, transposed reads, where and fill", () => {
    const r = both(() => {
      const t = x.transpose(0, 1).contiguous().mul(0.5); // [12, 4], a strided read
      const m = t.gt(0);
      const w = k.where(m, t, t.neg().exp()).add(k.zeros([12, 4]).add(3));
      return w.mul(row.reshape(12, 1));
    });
    assertClose(r.deferred, r.strict, RTOL);
  });

  it("reading values mid-chain flushes, and later ops see the read value", () => {
    k.withEagerMode("defer-and-fuse", () => {
      const a = x.mul(3);
      const before = k.kernelsDispatched();
      assert.equal(k.kernelsDispatched() - before, 0);
      const aVals = a.toList();
      assertClose(aVals, Array.from(x.toList(), (v) => v * 3), RTOL);
      const b = a.add(1).mul(a);
      assertClose(b.toList(), aVals.map((v) => (v + 1) * v), RTOL);
      const s = b.sum().item(); // reduce: not deferred, runs after a flush
      assert.ok(Math.abs(s - aVals.reduce((p, v) => p + (v + 1) * v, 0)) < 1e-4);
      for (const t of [a, b]) t.dispose();
    });
  });

  it("disposing intermediates before the sync point is safe and frees their buffers", () => {
    const be = k.defaultDevice().backend;
    const chain = () => {
      const a = x.mul(2);
      const b = a.add(y);
      a.dispose();
      const c = b.exp();
      b.dispose();
      const d = c.mul(c);
      c.dispose();
      return d;
    };
    const expected = k.withEagerMode("strict", () => {
      const d = chain();
      const v = d.toList();
      d.dispose();
      return v;
    });
    k.withEagerMode("defer-and-fuse", () => chain().dispose()); // warm: program built, arena allocated
    const live = be.liveBuffers();
    k.withEagerMode("defer-and-fuse", () => {
      const d = chain();
      assertClose(d.toList(), expected, RTOL);
      d.dispose();
    });
    k.withEagerMode("defer-and-fuse", () => chain().dispose()); // never read: dropped at the next flush
    k.flushDeferred();
    assert.ok(be.liveBuffers() <= live, `deferred intermediates leaked: ${be.liveBuffers()} > ${live}`);
  });

  it("in-place updates keep their order", () => {
    const run = () => {
      const a = x.clone();
      const b = a.mul(2);
      a.copy_(y); // overwrites a after b read it
      const c = b.add(a);
      const v = c.toList();
      for (const t of [a, b, c]) t.dispose();
      return v;
    };
    assertClose(k.withEagerMode("defer-and-fuse", run), k.withEagerMode("strict", run), RTOL);
  });

  it("a tiny transformer forward gives strict's logits", () => {
    const cfg = parseHfConfig({
      architectures: ["LlamaForCausalLM"], hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
      num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 64, max_position_embeddings: 64, tie_word_embeddings: true,
    });
    const m = new CausalLM(cfg);
    k.manualSeed(7);
    for (const [n, p] of m.namedParameters()) m.setParameter(n, n.endsWith("norm.weight") ? k.full(p.shape, 1.1) : k.randn(p.shape, { std: 0.1 }));
    const seqLen = 8;
    const ids = k.tensor(Int32Array.from({ length: seqLen }, (_, i) => (i * 5 + 3) % 64));
    const positions = k.tensor(Int32Array.from({ length: seqLen }, (_, i) => i));
    const run = (mode: k.EagerMode) =>
      k.withEagerMode(mode, () =>
        k.noGrad(() => {
          const before = k.kernelsDispatched();
          const h = m.forward(ids, { kind: "dense", batch: 1, seqLen, positions });
          const logits = m.logits(h);
          const v = logits.toList();
          const kernels = k.kernelsDispatched() - before;
          h.dispose();
          logits.dispose();
          return { v, kernels };
        }),
      );
    const s = run("strict");
    const d = run("defer-and-fuse");
    assertClose(d.v, s.v, { rtol: 1e-5, atol: 1e-6 });
    assert.ok(d.kernels < s.kernels, `${d.kernels} !< ${s.kernels}`);
  });
});
