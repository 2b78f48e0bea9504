// scaledDotProductAttention (torch.nn.functional.scaled_dot_product_attention) against a float64 loop written here
// from torch's documented math: L x S scores q.k * scale, is_causal as tril(ones(L, S)) (top-left aligned), a bool
// mask as -inf where false, a float mask added, softmax, weights @ v; GQA by repeat_interleave of the kv heads.
// Gradients by finite differences (gradcheck); the flash path (training, no mask) against the same loop; dropout's
// draws; torch's refusals.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as k from "../../src/tensor/index.js";
import { OpError } from "../../src/util/errors.js";
import { mulberry32 } from "../../src/util/random.js";
import { gradcheck } from "./gradcheck-helper.js";
import { forEachBackend } from "./suite.js";

function data(n: number, seed: number): Float32Array {
  const r = mulberry32(seed);
  return Float32Array.from({ length: n }, () => 2 * r() - 1);
}

interface Ref {
  B: number; Hq: number; Hkv: number; L: number; S: number; E: number; Ev: number;
  causal?: boolean; scale?: number;
  /** [L * S] per (b, h) or broadcast: mask(b, h, i, j) */
  boolMask?: (b: number, h: number, i: number, j: number) => boolean;
  floatMask?: (b: number, h: number, i: number, j: number) => number;
}

/** The float64 loop: out [B, Hq, L, Ev]. */
function reference(c: Ref, q: Float32Array, kk: Float32Array, v: Float32Array): Float64Array {
  const out = new Float64Array(c.B * c.Hq * c.L * c.Ev);
  const scale = c.scale ?? 1 / Math.sqrt(c.E);
  for (let b = 0; b < c.B; b++)
    for (let h = 0; h < c.Hq; h++) {
      const hk = Math.floor(h / (c.Hq / c.Hkv));
      for (let i = 0; i < c.L; i++) {
        const s = new Float64Array(c.S);
        for (let j = 0; j < c.S; j++) {
          let dot = 0;
          for (let e = 0; e < c.E; e++) dot += q[((b * c.Hq + h) * c.L + i) * c.E + e]! * kk[((b * c.Hkv + hk) * c.S + j) * c.E + e]!;
          s[j] = dot * scale;
          if (c.causal && j > i) s[j] = -Infinity;
          if (c.boolMask && !c.boolMask(b, h, i, j)) s[j] = -Infinity;
          if (c.floatMask) s[j] += c.floatMask(b, h, i, j);
        }
        const max = Math.max(...s);
        let sum = 0;
        for (let j = 0; j < c.S; j++) sum += Math.exp(s[j]! - max);
        for (let j = 0; j < c.S; j++) {
          const w = Math.exp(s[j]! - max) / sum;
          for (let e = 0; e < c.Ev; e++) out[((b * c.Hq + h) * c.L + i) * c.Ev + e] += w * v[((b * c.Hkv + hk) * c.S + j) * c.Ev + e]!;
        }
      }
    }
  return out;
}

function assertClose(actual: ArrayLike<number>, expected: ArrayLike<number>, tol: number, what: string): void {
  assert.equal(actual.length, expected.length, what);
  for (let i = 0; i < actual.length; i++)
    assert.ok(Math.abs(actual[i]! - expected[i]!) <= tol * (1 + Math.abs(expected[i]!)), `${what}[${i}]: ${actual[i]} vs ${expected[i]}`);
}

forEachBackend((device) => {
  const make = (c: Ref) => {
    const qd = data(c.B * c.Hq * c.L * c.E, 1);
    const kd = data(c.B * c.Hkv * c.S * c.E, 2);
    const vd = data(c.B * c.Hkv * c.S * c.Ev, 3);
    const t = (d: Float32Array, shape: number[]) => k.tensor(d, { shape, device });
    return {
      qd, kd, vd,
      q: t(qd, [c.B, c.Hq, c.L, c.E]), k: t(kd, [c.B, c.Hkv, c.S, c.E]), v: t(vd, [c.B, c.Hkv, c.S, c.Ev]),
    };
  };

  test("no mask, L != S, Ev != E, explicit scale", () => {
    const c: Ref = { B: 2, Hq: 2, Hkv: 2, L: 5, S: 7, E: 4, Ev: 3, scale: 0.3 };
    const { q, k: kk, v, qd, kd, vd } = make(c);
    const out = k.scaledDotProductAttention(q, kk, v, { scale: 0.3 });
    assert.deepEqual(out.shape, [2, 2, 5, 3]);
    assertClose(out.dataSync() as Float32Array, reference(c, qd, kd, vd), 1e-5, "out");
  });

  test("is_causal is top-left aligned (L < S), as torch's tril(ones(L, S))", () => {
    const c: Ref = { B: 1, Hq: 2, Hkv: 2, L: 4, S: 6, E: 8, Ev: 8, causal: true };
    const { q, k: kk, v, qd, kd, vd } = make(c);
    assertClose(k.scaledDotProductAttention(q, kk, v, { isCausal: true }).dataSync() as Float32Array, reference(c, qd, kd, vd), 1e-5, "out");
  });

  test("bool and float masks broadcast over batch and heads", () => {
    const c: Ref = { B: 2, Hq: 2, Hkv: 2, L: 3, S: 5, E: 4, Ev: 4, boolMask: (b, _h, i, j) => (i + j + b) % 3 !== 0 || j === 0 };
    const { q, k: kk, v, qd, kd, vd } = make(c);
    const maskData = Uint8Array.from({ length: 2 * 3 * 5 }, (_, x) => (c.boolMask!(Math.floor(x / 15), 0, Math.floor((x % 15) / 5), x % 5) ? 1 : 0));
    const mask = k.tensor(maskData, { shape: [2, 1, 3, 5], dtype: "bool", device });
    assertClose(k.scaledDotProductAttention(q, kk, v, { attnMask: mask }).dataSync() as Float32Array, reference(c, qd, kd, vd), 1e-5, "bool mask");
    const f: Ref = { ...c, boolMask: undefined, floatMask: (_b, _h, i, j) => 0.25 * i - 0.5 * j };
    const fm = k.tensor(Float32Array.from({ length: 15 }, (_, x) => 0.25 * Math.floor(x / 5) - 0.5 * (x % 5)), { shape: [3, 5], device });
    assertClose(k.scaledDotProductAttention(q, kk, v, { attnMask: fm }).dataSync() as Float32Array, reference(f, qd, kd, vd), 1e-5, "float mask");
  });

  test("enable_gqa repeats each kv head for its group of query heads", () => {
    const c: Ref = { B: 1, Hq: 4, Hkv: 2, L: 6, S: 6, E: 4, Ev: 4, causal: true };
    const { q, k: kk, v, qd, kd, vd } = make(c);
    assertClose(k.scaledDotProductAttention(q, kk, v, { isCausal: true, enableGqa: true }).dataSync() as Float32Array, reference(c, qd, kd, vd), 1e-5, "gqa");
    assert.throws(() => k.scaledDotProductAttention(q, kk, v), (e: unknown) => e instanceof OpError && /pass enableGqa/.test(e.message));
  });

  test("training attention (flash path, causal and not) equals the loop, gradients by finite differences", () => {
    for (const causal of [true, false]) {
      const c: Ref = { B: 1, Hq: 2, Hkv: 1, L: 20, S: 20, E: 8, Ev: 8, causal };
      const { q, k: kk, v, qd, kd, vd } = make(c);
      q.requiresGrad_();
      const out = k.scaledDotProductAttention(q, kk, v, { isCausal: causal, enableGqa: true });
      assert.equal(out.gradFn?.op, "flash_attention");
      assertClose(out.dataSync() as Float32Array, reference(c, qd, kd, vd), 1e-5, `causal ${causal}`);
    }
    const mask = k.tensor(Uint8Array.of(1, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1), { shape: [3, 4], dtype: "bool", device });
    gradcheck("sdpa causal", [{ shape: [1, 2, 4, 4] }, { shape: [1, 2, 4, 4] }, { shape: [1, 2, 4, 3] }], (q, kk, v) => k.scaledDotProductAttention(q, kk, v, { isCausal: true, scale: 0.7 }), 1, device);
    gradcheck("sdpa bool mask, L != S", [{ shape: [2, 3, 4] }, { shape: [2, 4, 4] }, { shape: [2, 4, 2] }], (q, kk, v) => k.scaledDotProductAttention(q, kk, v, { attnMask: mask }), 1, device);
  });

  test("dropout: p = 1 zeroes the output, the same generator seed draws the same weights, p = 0 changes nothing", () => {
    const c: Ref = { B: 1, Hq: 1, Hkv: 1, L: 4, S: 4, E: 4, Ev: 4 };
    const { q, k: kk, v } = make(c);
    const plain = k.scaledDotProductAttention(q, kk, v).dataSync() as Float32Array;
    assert.ok((k.scaledDotProductAttention(q, kk, v, { dropoutP: 1 }).dataSync() as Float32Array).every((x) => x === 0));
    const a = k.scaledDotProductAttention(q, kk, v, { dropoutP: 0.5, generator: new k.Generator(7) }).dataSync() as Float32Array;
    const b = k.scaledDotProductAttention(q, kk, v, { dropoutP: 0.5, generator: new k.Generator(7) }).dataSync() as Float32Array;
    assert.deepEqual(Array.from(a), Array.from(b));
    assert.notDeepEqual(Array.from(a), Array.from(plain));
    assertClose(k.scaledDotProductAttention(q, kk, v, { dropoutP: 0 }).dataSync() as Float32Array, plain, 0, "p = 0");
  });

  test("torch's refusals", () => {
    const q = k.tensor(data(16, 4), { shape: [1, 1, 4, 4], device });
    const m = k.ones([4, 4], { dtype: "bool", device });
    assert.throws(() => k.scaledDotProductAttention(q, q, q, { isCausal: true, attnMask: m }), /Explicit attn_mask should not be set when is_causal=True/);
    assert.throws(() => k.scaledDotProductAttention(q, q, q, { dropoutP: 1.5 }), /dropout_p must be in \[0, 1\]/);
    const wide = k.tensor(data(20, 5), { shape: [1, 1, 4, 5], device });
    assert.throws(() => k.scaledDotProductAttention(q, wide, wide), /query's last dim 4 and key's 5 differ/);
  });
});
