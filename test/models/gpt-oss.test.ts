// gpt-oss (GptOssForCausalLM): its config read as HF's GptOssConfig reads it; a tiny random model against an
// independent float64 forward written here from HF's modeling_gpt_oss.py (reading the checkpoint's own tensors in
// HF's layout: fused, interleaved gate_up_proj [E, hidden, 2 * inter] or OpenAI's MXFP4 blocks), with attention
// sinks, an 8-token window against a 24-token prompt, YaRN past its 16 original positions (truncate false), q/k/v/o
// biases, a biased router over 4 experts (top 2) and the clamped SwiGLU; serving (prefill + paged decode) against
// eager full-sequence recomputation; the MXFP4 layout loaded into the mxfp4 kernel bit for bit.
import assert from "node:assert/strict";
import * as path from "node:path";
import { describe, it } from "node:test";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { dequantizeRef, nativeTakesScheme, quantizeWeightsRef } from "../../src/backends/cpu/quant-reference.js";
import { LLM } from "../../src/engine/llm-engine.js";
import { parseHfConfig } from "../../src/models/hf-config.js";
import { loadLocalModel, type LoadedModel } from "../../src/models/loader.js";
import { kilnToOpenaiMxfp4, openaiMxfp4RowsToKiln } from "../../src/models/formats/openai-mxfp4.js";
import { readSafetensors } from "../../src/models/formats/safetensors.js";
import { quantizedWeightOf } from "../../src/nn/quantized-linear.js";
import { arange, noGrad, tensor } from "../../src/tensor/index.js";
import { mulberry32 } from "../../src/util/random.js";
import { bytesOfTensor, linears } from "../helpers/model-logits.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

// openai/gpt-oss-20b's config.json
const gptOss20b = {
  architectures: ["GptOssForCausalLM"], attention_bias: true, attention_dropout: 0, eos_token_id: 200002, experts_per_token: 4,
  head_dim: 64, hidden_act: "silu", hidden_size: 2880, initial_context_length: 4096, initializer_range: 0.02, intermediate_size: 2880,
  layer_types: Array.from({ length: 24 }, (_, i) => (i % 2 === 0 ? "sliding_attention" : "full_attention")),
  max_position_embeddings: 131072, model_type: "gpt_oss", num_attention_heads: 64, num_experts_per_tok: 4, num_hidden_layers: 24,
  num_key_value_heads: 8, num_local_experts: 32, output_router_logits: false, pad_token_id: 199999,
  quantization_config: { modules_to_not_convert: ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"], quant_method: "mxfp4" },
  rms_norm_eps: 1e-5, rope_scaling: { beta_fast: 32, beta_slow: 1, factor: 32, original_max_position_embeddings: 4096, rope_type: "yarn", truncate: false },
  rope_theta: 150000, router_aux_loss_coef: 0.9, sliding_window: 128, swiglu_limit: 7, tie_word_embeddings: false, torch_dtype: "bfloat16",
  use_cache: true, vocab_size: 201088,
};

// ---- the float64 reference: transformers' GptOss forward over the checkpoint's tensors ----

type F64 = Float64Array;
const FP4 = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6];

/** The checkpoint's tensors as float64, MXFP4 experts dequantized as convert_moe_packed_tensors does ([E, in, out]). */
function checkpointTensors(dir: string): Map<string, { v: F64; shape: number[] }> {
  const h = readSafetensors(path.join(dir, "model.safetensors"));
  const out = new Map<string, { v: F64; shape: number[] }>();
  for (const t of h.tensors) if (!/_(blocks|scales)$/.test(t.name)) out.set(t.name, { v: Float64Array.from(h.loadAsFloat32(t.name)), shape: t.shape });
  for (const t of h.tensors) {
    if (!t.name.endsWith("_blocks")) continue;
    const base = t.name.slice(0, -"_blocks".length);
    const [E, rows, G] = t.shape as [number, number, number];
    const blocks = h.load(t.name);
    const scales = h.load(`${base}_scales`);
    const w = new Float64Array(E * rows * G * 32); // [E, in, out]: the dequantized rows [E, out, in] transposed
    for (let e = 0; e < E; e++)
      for (let r = 0; r < rows; r++)
        for (let g = 0; g < G; g++) {
          const s = 2 ** (scales[(e * rows + r) * G + g]! - 127);
          for (let j = 0; j < 16; j++) {
            const byte = blocks[((e * rows + r) * G + g) * 16 + j]!;
            for (const [d, code] of [[0, byte & 15], [1, byte >> 4]] as const) w[(e * G * 32 + g * 32 + 2 * j + d) * rows + r] = FP4[code]! * s;
          }
        }
    out.set(base, { v: w, shape: [E, G * 32, rows] });
  }
  h.close();
  return out;
}

/** YaRN inverse frequencies and cos/sin scale (modeling_rope_utils' _compute_yarn_parameters, truncate honoured). */
function yarn(dim: number, base: number, r: { factor: number; beta_fast: number; beta_slow: number; original_max_position_embeddings: number; truncate?: boolean }) {
  const corr = (rot: number) => (dim * Math.log(r.original_max_position_embeddings / (rot * 2 * Math.PI))) / (2 * Math.log(base));
  let [low, high] = [corr(r.beta_fast), corr(r.beta_slow)];
  if (r.truncate !== false) [low, high] = [Math.floor(low), Math.ceil(high)];
  [low, high] = [Math.max(low, 0), Math.min(high, dim - 1)];
  if (low === high) high += 0.001;
  const inv = Array.from({ length: dim / 2 }, (_, i) => {
    const posFreq = base ** ((2 * i) / dim);
    const extrapolationFactor = 1 - Math.min(Math.max((i - low) / (high - low), 0), 1);
    return (1 / (r.factor * posFreq)) * (1 - extrapolationFactor) + (1 / posFreq) * extrapolationFactor;
  });
  return { inv, scale: 0.1 * Math.log(r.factor) + 1 };
}

/** Logits [T, vocab] of transformers' GptOssForCausalLM (eager attention) over `ids`, in float64. */
function referenceLogits(dir: string, config: Record<string, unknown>, ids: number[]): F64[] {
  const W = checkpointTensors(dir);
  const get = (n: string) => W.get(n)!.v;
  const c = config as Record<string, number> & { layer_types: string[]; rope_scaling: Parameters<typeof yarn>[2] };
  const [Hd, H, Hkv, D, E, K, I, V] = [c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.num_local_experts, c.num_experts_per_tok, c.intermediate_size, c.vocab_size];
  const limit = c.swiglu_limit, alpha = 1.702;
  const rms = (x: F64, w: F64) => {
    const ms = x.reduce((a, v) => a + v * v, 0) / x.length;
    return x.map((v, i) => (v / Math.sqrt(ms + c.rms_norm_eps)) * w[i]!);
  };
  const lin = (x: F64, w: F64, b: F64 | null, out: number) => Float64Array.from({ length: out }, (_, o) => {
    let s = b ? b[o]! : 0;
    for (let i = 0; i < x.length; i++) s += w[o * x.length + i]! * x[i]!;
    return s;
  });
  const { inv, scale: ropeScale } = yarn(D, c.rope_theta, c.rope_scaling);
  const rope = (x: F64, pos: number) => { // neox halves, per head of D
    const out = x.slice();
    for (let h = 0; h < x.length / D; h++)
      for (let i = 0; i < D / 2; i++) {
        const [cs, sn] = [Math.cos(pos * inv[i]!) * ropeScale, Math.sin(pos * inv[i]!) * ropeScale];
        const [a, b] = [x[h * D + i]!, x[h * D + i + D / 2]!];
        out[h * D + i] = a * cs - b * sn;
        out[h * D + i + D / 2] = b * cs + a * sn;
      }
    return out;
  };
  let x = ids.map((id) => get("model.embed_tokens.weight").slice(id * Hd, (id + 1) * Hd));
  for (let l = 0; l < c.num_hidden_layers; l++) {
    const p = `model.layers.${l}.`;
    const w = (n: string) => get(p + n);
    const window = c.layer_types[l] === "sliding_attention" ? c.sliding_window : Infinity;
    const xn = x.map((v) => rms(v, w("input_layernorm.weight")));
    const q = xn.map((v, t) => rope(lin(v, w("self_attn.q_proj.weight"), w("self_attn.q_proj.bias"), H * D), t));
    const k = xn.map((v, t) => rope(lin(v, w("self_attn.k_proj.weight"), w("self_attn.k_proj.bias"), Hkv * D), t));
    const vv = xn.map((v) => lin(v, w("self_attn.v_proj.weight"), w("self_attn.v_proj.bias"), Hkv * D));
    const sinks = w("self_attn.sinks");
    x = x.map((res, t) => {
      const attn = new Float64Array(H * D);
      for (let h = 0; h < H; h++) {
        const g = Math.floor(h / (H / Hkv));
        const keys = Array.from({ length: t + 1 }, (_, j) => j).filter((j) => j > t - window);
        const s = keys.map((j) => {
          let d = 0;
          for (let i = 0; i < D; i++) d += q[t]![h * D + i]! * k[j]![g * D + i]!;
          return d / Math.sqrt(D);
        });
        const all = [...s, sinks[h]!]; // the sink column, its probability dropped after the softmax
        const m = Math.max(...all);
        const z = all.reduce((a, v) => a + Math.exp(v - m), 0);
        keys.forEach((j, n) => {
          const pr = Math.exp(s[n]! - m) / z;
          for (let i = 0; i < D; i++) attn[h * D + i] += pr * vv[j]![g * D + i]!;
        });
      }
      const o = lin(attn, w("self_attn.o_proj.weight"), w("self_attn.o_proj.bias"), Hd);
      return res.map((r, i) => r + o[i]!);
    });
    // MoE: top-k of the biased router's logits, softmax over those k; experts x @ W + b, interleaved gate/up
    const [gu, gub, dn, dnb] = ["mlp.experts.gate_up_proj", "mlp.experts.gate_up_proj_bias", "mlp.experts.down_proj", "mlp.experts.down_proj_bias"].map(w) as [F64, F64, F64, F64];
    x = x.map((res) => {
      const xm = rms(res, w("post_attention_layernorm.weight"));
      const logits = lin(xm, w("mlp.router.weight"), w("mlp.router.bias"), E);
      const top = [...logits.keys()].sort((a, b) => logits[b]! - logits[a]! || a - b).slice(0, K);
      const mx = Math.max(...top.map((e) => logits[e]!));
      const z = top.reduce((a, e) => a + Math.exp(logits[e]! - mx), 0);
      const out = new Float64Array(Hd);
      for (const e of top) {
        const glu = new Float64Array(I);
        for (let i = 0; i < I; i++) {
          let [g, u] = [gub[e * 2 * I + 2 * i]!, gub[e * 2 * I + 2 * i + 1]!];
          for (let j = 0; j < Hd; j++) {
            g += xm[j]! * gu[(e * Hd + j) * 2 * I + 2 * i]!;
            u += xm[j]! * gu[(e * Hd + j) * 2 * I + 2 * i + 1]!;
          }
          g = Math.min(g, limit);
          u = Math.min(Math.max(u, -limit), limit);
          glu[i] = (u + 1) * (g / (1 + Math.exp(-alpha * g)));
        }
        const weight = Math.exp(logits[e]! - mx) / z;
        for (let o = 0; o < Hd; o++) {
          let s = dnb[e * Hd + o]!;
          for (let i = 0; i < I; i++) s += glu[i]! * dn[(e * I + i) * Hd + o]!;
          out[o] += weight * s;
        }
      }
      return res.map((r, i) => r + out[i]!);
    });
  }
  return x.map((v) => lin(rms(v, get("model.norm.weight")), get("lm_head.weight"), null, V));
}

/** Kiln's dense forward: logits [T][vocab]. */
function denseLogits(m: LoadedModel, ids: number[]): Float32Array[] {
  const V = m.config.vocabSize;
  const all = noGrad(() => m.model.logits(m.model.forward(tensor(Int32Array.from(ids)), { kind: "dense", batch: 1, seqLen: ids.length, positions: arange(ids.length) })).dataSync() as Float32Array);
  return ids.map((_, t) => all.slice(t * V, (t + 1) * V));
}

const argmax = (v: ArrayLike<number>): number => {
  let b = 0;
  for (let i = 1; i < v.length; i++) if (v[i]! > v[b]!) b = i;
  return b;
};
const logSoftmax = (v: ArrayLike<number>): F64 => {
  const m = Math.max(...Array.from(v));
  const lse = Math.log(Array.from(v).reduce((a, x) => a + Math.exp(x - m), 0)) + m;
  return Float64Array.from(v, (x) => x - lse);
};

describe("gpt-oss", () => {
  it("reads the config as GptOssConfig does", () => {
    const c = parseHfConfig(gptOss20b);
    assert.equal(c.architecture, "GptOssForCausalLM");
    assert.deepEqual([c.qkvBias, c.oBias, c.attnSinks, c.tieWordEmbeddings, c.rmsNormEps, c.ropeTheta, c.slidingWindow], [true, true, true, false, 1e-5, 150000, 128]);
    assert.deepEqual(c.slidingWindowLayers.slice(0, 4), [true, false, true, false]);
    assert.deepEqual(c.moeLayers.every(Boolean), true);
    assert.deepEqual(c.moe, {
      numExperts: 32, numExpertsPerTok: 4, moeIntermediateSize: 2880, normTopkProb: true, decoderSparseStep: 1, mlpOnlyLayers: [],
      routerBias: true, expertBias: true, clampedSwiglu: { alpha: 1.702, limit: 7 }, sharedExpertIntermediateSize: null,
    });
    assert.deepEqual(c.ropeScaling, {
      type: "yarn", factor: 32, originalMaxPositionEmbeddings: 4096, betaFast: 32, betaSlow: 1, attentionFactor: null, mscale: null, mscaleAllDim: null, truncate: false,
    });
    // what a config leaves out comes from GptOssConfig's defaults (gpt-oss-120b's shape), rope included
    const bare = parseHfConfig({ architectures: ["GptOssForCausalLM"] });
    assert.deepEqual([bare.numHiddenLayers, bare.moe!.numExperts, bare.hiddenSize, bare.headDim, bare.numAttentionHeads, bare.numKeyValueHeads], [36, 128, 2880, 64, 64, 8]);
    assert.equal(bare.ropeScaling?.type === "yarn" && bare.ropeScaling.truncate, false);
    assert.deepEqual(bare.slidingWindowLayers.slice(0, 3), [true, false, true]);
    // transformers v5's rope_parameters are read instead of the default
    const v5 = parseHfConfig({ ...gptOss20b, rope_scaling: undefined, rope_theta: undefined, rope_parameters: { ...gptOss20b.rope_scaling, rope_theta: 5000 } });
    assert.deepEqual([v5.ropeTheta, v5.ropeScaling?.type], [5000, "yarn"]);
  });

  it("OpenAI MXFP4 rows <-> Kiln mxfp4: bits moved both ways", () => {
    const [n, k] = [6, 128];
    const u = mulberry32(3);
    const w = Float32Array.from({ length: n * k }, () => (u() - 0.5) * 0.4);
    const q = quantizeWeightsRef("mxfp4", w, n, k) as { data: Uint8Array; scales: Uint8Array };
    const o = kilnToOpenaiMxfp4(q, n, k);
    const back = openaiMxfp4RowsToKiln(o.blocks, o.scales, [0, 1, 2, 3, 4, 5], k);
    assert.deepEqual([back.data, back.scales], [q.data, q.scales]);
    // element 2j + 1 of a block sits in byte j's high nibble (convert_moe_packed_tensors' order)
    const one = new Uint8Array(32);
    one[3] = 0x70; // Kiln: byte 3's high nibble is element 32 + 3 of the chunk -> block 1, element 3: byte 1, high
    const ob = kilnToOpenaiMxfp4({ data: one, scales: new Uint8Array(2) }, 1, 64).blocks;
    assert.equal(ob[16 + 1], 0x70);
    // rows picked out of order (gate rows even, up rows odd)
    const odd = openaiMxfp4RowsToKiln(o.blocks, o.scales, [5, 1], k);
    assert.deepEqual(odd.data, Uint8Array.from([...q.data.subarray(5 * 64, 6 * 64), ...q.data.subarray(64, 128)]));
  });

  // 24-token prompt against an 8-token window (layer 0) and YaRN's 16 original positions; a rotary base of 100 puts
  // YaRN's ramp across whole head dims (at 150000 and head_dim 16 it would end inside the first one)
  const prompt = Array.from({ length: 24 }, (_, i) => (i * 37 + 11) % 500);
  const overrides = { rope_theta: 100 };
  const dirs = {
    float32: tinyModelDir("GptOssForCausalLM", { std: 0.1, overrides }),
    bfloat16: tinyModelDir("GptOssForCausalLM", { std: 0.1, dtype: "bfloat16", overrides }),
  };

  for (const [layout, dir] of Object.entries(dirs)) {
    it(`${layout} checkpoint: dense forward matches the float64 reference at every position`, { timeout: 60_000 }, (t) => {
      const m = loadLocalModel(dir, { dtype: "float32" });
      const ref = referenceLogits(dir, JSON.parse(JSON.stringify(m.config.raw)) as Record<string, unknown>, prompt);
      const got = denseLogits(m, prompt);
      let worst = 0;
      let range = 0;
      ref.forEach((r, i) => {
        range = Math.max(range, Math.max(...r) - Math.min(...r));
        r.forEach((x, j) => (worst = Math.max(worst, Math.abs(x - got[i]![j]!))));
        assert.equal(argmax(got[i]!), argmax(r), `argmax at position ${i}`);
      });
      t.diagnostic(`${layout}: max |logit diff| vs float64 ${worst.toExponential(2)} (logit range ${range.toFixed(2)})`);
      assert.ok(worst < 1e-4 * Math.max(1, range), `max |logit diff| ${worst}`);
    });
  }

  it("the reference sees what it should: the window, the clamp and YaRN's truncate all change the logits", () => {
    const m = loadLocalModel(dirs.float32);
    const raw = JSON.parse(JSON.stringify(m.config.raw)) as Record<string, unknown>;
    const base = referenceLogits(dirs.float32, raw, prompt).at(-1)!;
    const moved = (over: Record<string, unknown>) => {
      const other = referenceLogits(dirs.float32, { ...raw, ...over }, prompt).at(-1)!;
      return base.reduce((a, x, i) => Math.max(a, Math.abs(x - other[i]!)), 0);
    };
    assert.ok(moved({ sliding_window: 1000 }) > 1e-3, "the window");
    assert.ok(moved({ swiglu_limit: 0.5 }) > 1e-3, "the clamp");
    assert.ok(moved({ rope_scaling: { ...(raw.rope_scaling as object), truncate: true } }) > 1e-6, "YaRN's truncate");
  });

  it("serving (prefill + paged decode) equals eager full-sequence recomputation, and the float64 reference's greedy path", { timeout: 120_000 }, (t) => {
    const dir = dirs.float32;
    const m = loadLocalModel(dir);
    const steps = 10;
    // greedy by recomputing the whole sequence each step (the dense forward)
    const recomputed: number[] = [];
    for (let i = 0; i < steps; i++) recomputed.push(argmax(denseLogits(m, [...prompt, ...recomputed]).at(-1)!));
    const ref = referenceLogits(dir, JSON.parse(JSON.stringify(m.config.raw)) as Record<string, unknown>, [...prompt, ...recomputed.slice(0, -1)]);
    assert.deepEqual(ref.slice(prompt.length - 1).map(argmax), recomputed, "float64 reference, teacher-forced");
    // (decode step graphs cannot capture MoE routing, a host read: the engine serves gpt-oss eagerly, as Mixtral;
    // compile()'s capture of the paged forward with the sinks, the MoE opaque, is in compile/model-compile.test.ts)
    for (const enforceEager of [false, true]) {
      // block size 4: the prompt spans six blocks, the window two
      const llm = new LLM({ model: dir, maxModelLen: 128, enforceEager, blockSize: 4 });
      const [out] = llm.generate([{ promptTokenIds: prompt }], { temperature: 0, maxTokens: steps, ignoreEos: true, logprobs: 5 });
      const c = out!.outputs[0]!;
      assert.deepEqual(c.tokenIds, recomputed, `greedy continuation (enforceEager ${enforceEager})`);
      // the first sampled token's log-probabilities against the float64 reference
      const lp = logSoftmax(ref[prompt.length - 1]!);
      const worst = Math.max(...[...c.logprobs![0]!].map(([tok, x]) => Math.abs(x.logprob - lp[tok]!)));
      t.diagnostic(`serving (enforceEager ${enforceEager}): first token's top-5 max |logprob diff| vs float64 ${worst.toExponential(2)}`);
      assert.ok(worst < 1e-4, `logprobs ${worst}`);
    }
  });

  const native = tryLoadNativeKernels();
  const mxfp4 = native !== null && nativeTakesScheme(native, "mxfp4");
  it("MXFP4 checkpoint (OpenAI's layout): experts run the mxfp4 kernel on the file's bits, within int8-activation rounding of the float64 reference", { skip: mxfp4 ? false : "native addon lacks mxfp4", timeout: 60_000 }, (t) => {
    const dir = tinyModelDir("GptOssForCausalLM", { std: 0.1, mxfp4Experts: true, overrides });
    const m = loadLocalModel(dir);
    assert.equal(m.quantization, "mxfp4");
    const experts = linears(m).filter(([n]) => n.includes(".experts."));
    assert.equal(experts.length, 2 * 4 * 3);
    for (const [name, layer] of linears(m)) assert.equal(quantizedWeightOf(layer)?.scheme, name.includes(".experts.") ? "mxfp4" : undefined, name);
    // the kernel's codes are the file's bits: expert 1's up_proj (odd rows of gate_up_proj) of layer 1
    const h = readSafetensors(path.join(dir, "model.safetensors"));
    const [inter, hidden] = [m.config.intermediateSize, m.config.hiddenSize];
    const rows = (e: number) => Array.from({ length: inter }, (_, i) => e * 2 * inter + 2 * i + 1);
    const want = openaiMxfp4RowsToKiln(h.load("model.layers.1.mlp.experts.gate_up_proj_blocks"), h.load("model.layers.1.mlp.experts.gate_up_proj_scales"), rows(1), hidden);
    h.close();
    const q = quantizedWeightOf(experts.find(([n]) => n === "model.layers.1.mlp.experts.1.up_proj")![1])!;
    assert.deepEqual([bytesOfTensor(q.data), bytesOfTensor(q.scales)], [want.data, want.scales]);
    const ref = referenceLogits(dir, JSON.parse(JSON.stringify(m.config.raw)) as Record<string, unknown>, prompt);
    const range = Math.max(...ref.map((r) => Math.max(...r) - Math.min(...r)));
    const errors = (got: Float32Array[]) => ref.map((r, i) => r.reduce((a, x, j) => Math.max(a, Math.abs(x - got[i]![j]!)), 0));
    // the installed codes dequantized to floats (Kiln's dequantizeRef) run Kiln's float path: equal to the float64
    // forward over the file's dequantized blocks, so the codes are the file's, in the right rows and nibbles
    const twin = loadLocalModel(dir);
    for (const [name, layer] of linears(twin)) {
      const qw = quantizedWeightOf(layer);
      if (qw === undefined) continue;
      const w = dequantizeRef("mxfp4", { data: bytesOfTensor(qw.data), scales: bytesOfTensor(qw.scales), rowSums: new Int32Array(0) }, qw.outFeatures, qw.inFeatures);
      twin.model.setParameter(`${name}.weight`, tensor(w, { shape: [qw.outFeatures, qw.inFeatures] }));
      delete (layer as { forward?: unknown }).forward; // installQuantizedWeight's own forward: back to Linear's
    }
    const exact = Math.max(...errors(denseLogits(twin, prompt)));
    // the mxfp4 kernel itself rounds activations to int8 per row: ~1% of the range, except where that moves a
    // token's top-2 experts (a router margin within the rounding): measured one position of 24 here
    const kernel = errors(denseLogits(m, prompt)).sort((a, b) => a - b);
    t.diagnostic(`MXFP4 experts vs float64 over the dequantized file: float path ${exact.toExponential(2)}; mxfp4 kernel median ${kernel[12]!.toExponential(2)}, ` +
      `22nd of 24 ${kernel[21]!.toExponential(2)}, worst ${kernel[23]!.toExponential(2)} (range ${range.toFixed(2)})`);
    assert.ok(exact < 1e-4 * range, `dequantized codes: max |logit diff| ${exact}`);
    assert.ok(kernel[21]! < 0.015 * range, `mxfp4 kernel: 22nd smallest max |logit diff| ${kernel[21]} of range ${range}`);
    // served greedily, it equals its own eager recomputation
    const recomputed: number[] = [];
    for (let i = 0; i < 6; i++) recomputed.push(argmax(denseLogits(m, [...prompt, ...recomputed]).at(-1)!));
    const [out] = new LLM({ model: dir, maxModelLen: 128 }).generate([{ promptTokenIds: prompt }], { temperature: 0, maxTokens: 6, ignoreEos: true });
    assert.deepEqual(out!.outputs[0]!.tokenIds, recomputed);
  });
});
