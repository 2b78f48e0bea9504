// Gemma 3's vision side (SigLIP tower + Gemma3MultiModalProjector) against a plain float64 reference written here
// from HF's formulas (modeling_siglip.py, modeling_gemma3.py): conv patch embedding with bias, learned positions,
// pre-norm encoder layers (LayerNorm, biased multi-head attention, GELU-tanh MLP), post_layernorm, then the patch
// grid average-pooled, Gemma's (1 + w) RMSNorm and x @ mm_input_projection_weight.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Gemma3Vision, parseGemma3VisionConfig, type Gemma3VisionConfig } from "../../src/models/siglip.js";
import { tensor } from "../../src/tensor/index.js";
import { mulberry32 } from "../../src/util/random.js";

const json = {
  mm_tokens_per_image: 4,
  vision_config: { hidden_size: 16, intermediate_size: 24, num_hidden_layers: 2, num_attention_heads: 2, image_size: 56, patch_size: 14, layer_norm_eps: 1e-6 },
};

type W = Map<string, Float64Array>;

function randomWeights(model: Gemma3Vision, seed: number): W {
  const u = mulberry32(seed);
  const w: W = new Map();
  for (const [name, t] of model.namedParameters()) {
    const v = new Float64Array(t.numel);
    // norms near 1 (LayerNorm) or near 0 (the (1 + w) RMSNorm), but not exactly: a formula that drops them fails
    const base = /layer_?norm\d?\.weight$/.test(name) ? 1 : 0;
    for (let i = 0; i < v.length; i++) v[i] = base + (u() * 2 - 1) * 0.5;
    w.set(name, v);
    model.setParameter(name, tensor(Float32Array.from(v), { shape: [...t.shape] }));
  }
  return w;
}

/** y [n, out] = x [n, in] W^T + b, W [out, in]. */
function lin(x: Float64Array, n: number, W: Float64Array, b: Float64Array | null, inF: number, outF: number): Float64Array {
  const y = new Float64Array(n * outF);
  for (let r = 0; r < n; r++)
    for (let o = 0; o < outF; o++) {
      let s = b ? b[o]! : 0;
      for (let i = 0; i < inF; i++) s += x[r * inF + i]! * W[o * inF + i]!;
      y[r * outF + o] = s;
    }
  return y;
}

function layerNorm(x: Float64Array, n: number, d: number, g: Float64Array, b: Float64Array, eps: number): Float64Array {
  const y = new Float64Array(n * d);
  for (let r = 0; r < n; r++) {
    let mu = 0;
    for (let i = 0; i < d; i++) mu += x[r * d + i]! / d;
    let v = 0;
    for (let i = 0; i < d; i++) v += (x[r * d + i]! - mu) ** 2 / d;
    for (let i = 0; i < d; i++) y[r * d + i] = ((x[r * d + i]! - mu) / Math.sqrt(v + eps)) * g[i]! + b[i]!;
  }
  return y;
}

const geluTanh = (x: number) => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3)));

function reference(cfg: Gemma3VisionConfig, w: W, pixels: Float64Array): Float64Array {
  const { hiddenSize: h, patchSize: p, imageSize: S, numHeads: H, intermediateSize: I, layerNormEps: eps } = cfg;
  const side = S / p, N = side * side, D = h / H;
  const g = (n: string) => w.get(`vision_tower.vision_model.${n}`)!;
  // the conv, patch by patch
  let x: Float64Array = new Float64Array(N * h);
  const cw = g("embeddings.patch_embedding.weight"), cb = g("embeddings.patch_embedding.bias"), pos = g("embeddings.position_embedding.weight");
  for (let py = 0; py < side; py++)
    for (let px = 0; px < side; px++)
      for (let o = 0; o < h; o++) {
        let s = cb[o]!;
        for (let c = 0; c < 3; c++)
          for (let ky = 0; ky < p; ky++)
            for (let kx = 0; kx < p; kx++) s += cw[((o * 3 + c) * p + ky) * p + kx]! * pixels[c * S * S + (py * p + ky) * S + px * p + kx]!;
        const n = py * side + px;
        x[n * h + o] = s + pos[n * h + o]!;
      }
  for (let l = 0; l < cfg.numLayers; l++) {
    const L = (n: string) => g(`encoder.layers.${l}.${n}`);
    const a = layerNorm(x, N, h, L("layer_norm1.weight"), L("layer_norm1.bias"), eps);
    const [q, k, v] = ["q", "k", "v"].map((t) => lin(a, N, L(`self_attn.${t}_proj.weight`), L(`self_attn.${t}_proj.bias`), h, h));
    const att = new Float64Array(N * h);
    for (let hd = 0; hd < H; hd++)
      for (let i = 0; i < N; i++) {
        const sc = new Float64Array(N);
        let mx = -Infinity;
        for (let j = 0; j < N; j++) {
          let s = 0;
          for (let d = 0; d < D; d++) s += q![i * h + hd * D + d]! * k![j * h + hd * D + d]!;
          sc[j] = s / Math.sqrt(D);
          mx = Math.max(mx, sc[j]!);
        }
        let z = 0;
        for (let j = 0; j < N; j++) z += (sc[j] = Math.exp(sc[j]! - mx));
        for (let d = 0; d < D; d++) {
          let s = 0;
          for (let j = 0; j < N; j++) s += (sc[j]! / z) * v![j * h + hd * D + d]!;
          att[i * h + hd * D + d] = s;
        }
      }
    const o = lin(att, N, L("self_attn.out_proj.weight"), L("self_attn.out_proj.bias"), h, h);
    const x2 = x.map((xv, i) => xv + o[i]!);
    const m1 = lin(layerNorm(x2, N, h, L("layer_norm2.weight"), L("layer_norm2.bias"), eps), N, L("mlp.fc1.weight"), L("mlp.fc1.bias"), h, I).map(geluTanh);
    const m2 = lin(m1, N, L("mlp.fc2.weight"), L("mlp.fc2.bias"), I, h);
    x = x2.map((xv, i) => xv + m2[i]!);
  }
  x = layerNorm(x, N, h, g("post_layernorm.weight"), g("post_layernorm.bias"), eps);
  // the projector: [h, side, side] average-pooled with kernel = stride = side / tokSide
  const T = Math.sqrt(cfg.mmTokensPerImage), k = side / T;
  const pooled = new Float64Array(T * T * h);
  for (let ty = 0; ty < T; ty++)
    for (let tx = 0; tx < T; tx++)
      for (let c = 0; c < h; c++) {
        let s = 0;
        for (let ky = 0; ky < k; ky++) for (let kx = 0; kx < k; kx++) s += x[((ty * k + ky) * side + tx * k + kx) * h + c]!;
        pooled[(ty * T + tx) * h + c] = s / (k * k);
      }
  const nw = w.get("multi_modal_projector.mm_soft_emb_norm.weight")!, P = w.get("multi_modal_projector.mm_input_projection_weight")!;
  const th = cfg.textHiddenSize;
  const out = new Float64Array(T * T * th);
  for (let r = 0; r < T * T; r++) {
    let ms = 0;
    for (let c = 0; c < h; c++) ms += pooled[r * h + c]! ** 2 / h;
    const inv = 1 / Math.sqrt(ms + eps);
    for (let o = 0; o < th; o++) {
      let s = 0;
      for (let c = 0; c < h; c++) s += pooled[r * h + c]! * inv * (1 + nw[c]!) * P[c * th + o]!;
      out[r * th + o] = s;
    }
  }
  return out;
}

describe("SigLIP vision tower + Gemma 3 projector", () => {
  it("reads Gemma3Config's vision fields, and refuses a grid that does not pool evenly", () => {
    const c = parseGemma3VisionConfig({ vision_config: {} }, 2560);
    assert.deepEqual([c.hiddenSize, c.numLayers, c.imageSize, c.patchSize, c.mmTokensPerImage, c.imageTokenIndex], [1152, 27, 896, 14, 256, 262144]);
    assert.throws(() => parseGemma3VisionConfig({ ...json, mm_tokens_per_image: 9 }, 12), /pool evenly/);
  });

  it("matches a float64 reference of HF's formulas", () => {
    const cfg = parseGemma3VisionConfig(json, 12);
    const model = new Gemma3Vision(cfg);
    const w = randomWeights(model, 11);
    const names = model.namedParameters().map(([n]) => n);
    assert.ok(names.includes("vision_tower.vision_model.encoder.layers.1.self_attn.out_proj.bias"));
    assert.ok(names.includes("vision_tower.vision_model.embeddings.patch_embedding.weight"));
    assert.ok(names.includes("multi_modal_projector.mm_input_projection_weight"));
    const u = mulberry32(5);
    const pixels = Float64Array.from({ length: 3 * 56 * 56 }, () => u() * 2 - 1);
    const got = model.encode(Float32Array.from(pixels));
    const want = reference(cfg, w, pixels);
    assert.equal(got.length, 4 * 12);
    let maxErr = 0, maxRef = 0;
    for (let i = 0; i < want.length; i++) {
      maxErr = Math.max(maxErr, Math.abs(got[i]! - want[i]!));
      maxRef = Math.max(maxRef, Math.abs(want[i]!));
    }
    assert.ok(maxRef > 0.1, `reference too small to test (${maxRef})`);
    assert.ok(maxErr < 1e-4 * Math.max(1, maxRef), `max abs error ${maxErr} (max |ref| ${maxRef})`);
  });
});
