// Writes random-initialised Hugging Face model directories (config.json, model.safetensors, tokenizer files,
// generation_config.json) for tests and benchmarks, and exports model directories to GGUF for llama.cpp.
import * as fs from "node:fs";
import * as path from "node:path";
import { f32ToBf16 } from "./formats/dtype-convert.js";
import { mulberry32 } from "../util/random.js";
import { writeSafetensors, type SafetensorsLazyTensor } from "./formats/safetensors.js";
import { writeGguf, type GgufWriteTensor } from "./formats/gguf.js";
import type { GgmlTypeName } from "./formats/gguf-quant.js";
import { ggufFamilyOf, ggufNormShift, hfConfigToGgufMetadata, hfToGgufTensorName, llama3RopeFreqTensors, permuteQK, phi3RopeFactorTensors } from "./formats/gguf-mapping.js";
import { tokenizerJsonToGgufMetadata } from "./formats/gguf-tokenizer.js";
import { CausalLM } from "./causal-lm.js";
import { parseHfConfig, type Architecture, type ModelConfig } from "./hf-config.js";
import { fusedParts } from "./fused-weights.js";
import { FAMILIES, ModelLoadError } from "./loader.js";
import { fuseGptOssExperts, gptOssGgufExpertTensors, isGptOssFusedExpertTensor, isMxfp4Checkpoint } from "./gpt-oss-experts.js";
import { inspectModelDir, openCheckpoint } from "./model-dir.js";
import { fp8CheckpointFormat, isFp8ScaleTensor, loadFp8CheckpointTensor } from "./fp8-checkpoint.js";
import { PRESETS, type GgufExportType } from "./model-presets.js";
import { GEMMA3_BOI, GEMMA3_EOI, GEMMA3_IMAGE_TOKEN } from "./gemma3-image-processor.js";
import { Gemma3Vision, parseGemma3VisionConfig } from "./siglip.js";

type Json = Record<string, unknown>;

export { GGUF_EXPORT_TYPES, PRESETS, type GgufExportType } from "./model-presets.js";

/** Per-architecture config fields that make the family what it is. */
function archExtras(arch: Architecture): Json {
  switch (arch) {
    case "Qwen2ForCausalLM":
      return { model_type: "qwen2", use_sliding_window: false };
    case "Qwen3ForCausalLM":
      return { model_type: "qwen3", head_dim: 16 };
    case "MistralForCausalLM":
      return { model_type: "mistral", sliding_window: 64 };
    case "MixtralForCausalLM":
      return { model_type: "mixtral", num_local_experts: 4, num_experts_per_tok: 2 };
    case "Qwen2MoeForCausalLM":
      // Qwen1.5-MoE-A2.7B's rules at the tiny model's scale: unnormalized top-k weights, a shared expert 4 experts wide
      return {
        model_type: "qwen2_moe", num_experts: 4, num_experts_per_tok: 2, moe_intermediate_size: 32, shared_expert_intermediate_size: 128,
        norm_topk_prob: false, decoder_sparse_step: 1, mlp_only_layers: [], use_sliding_window: false, qkv_bias: true,
      };
    case "Qwen3MoeForCausalLM":
      return { model_type: "qwen3_moe", num_experts: 4, num_experts_per_tok: 2, moe_intermediate_size: 64, norm_topk_prob: true, head_dim: 16 };
    case "Olmo2ForCausalLM":
      return { model_type: "olmo2", rope_theta: 500_000 };
    case "GraniteForCausalLM":
      // Granite 3's multipliers at the tiny model's scale (the 2B model's are 12, 0.22, 0.015625 and 8)
      return { model_type: "granite", embedding_multiplier: 12, residual_multiplier: 0.22, attention_multiplier: 0.125, logits_scaling: 8 };
    case "GemmaForCausalLM":
      // gemma-7b's rule: head_dim 256 with 16 heads of a 3072 hidden (here 32 with 4 of 64: no hidden / heads)
      return { model_type: "gemma", head_dim: 32, hidden_activation: "gelu_pytorch_tanh", tie_word_embeddings: true };
    case "Gemma2ForCausalLM":
      // llama.cpp's gemma2 assumptions (even layers sliding, head_dim ** -0.5 scale, both soft-caps), Gemma 2's caps
      return {
        model_type: "gemma2", head_dim: 16, query_pre_attn_scalar: 16, hidden_activation: "gelu_pytorch_tanh", sliding_window: 512,
        attn_logit_softcapping: 50, final_logit_softcapping: 30, rope_theta: 10000, tie_word_embeddings: true,
      };
    case "Gemma3ForCausalLM":
      // llama.cpp's gemma3 assumptions (every 6th layer global, local rotary base 10000, head_dim ** -0.5 scale)
      return {
        model_type: "gemma3_text", head_dim: 16, query_pre_attn_scalar: 16, hidden_activation: "gelu_pytorch_tanh", sliding_window: 512,
        sliding_window_pattern: 6, rope_theta: 1_000_000, rope_local_base_freq: 10000, tie_word_embeddings: true,
      };
    case "Phi3ForCausalLM":
      return { model_type: "phi3" };
    case "GptOssForCausalLM":
      // gpt-oss-20b's shape rules at the tiny model's scale: alternating 8-token windows, 4 experts (top 2), YaRN over
      // 16 original positions (factor 32 = max_position_embeddings 512 / 16), hidden and expert sizes whole
      // 64-element chunks for the mxfp4 kernel
      return {
        model_type: "gpt_oss", head_dim: 16, num_local_experts: 4, num_experts_per_tok: 2, sliding_window: 8, attention_bias: true,
        layer_types: ["sliding_attention", "full_attention"], swiglu_limit: 7.0, rope_theta: 150000, rms_norm_eps: 1e-5,
        rope_scaling: { rope_type: "yarn", factor: 32, beta_fast: 32, beta_slow: 1, truncate: false, original_max_position_embeddings: 16 },
      };
    case "SmolLM3ForCausalLM":
      return { model_type: "smollm3", no_rope_layer_interval: 4 };
    default:
      return { model_type: "llama" };
  }
}

/** Box-Muller normals over mulberry32: the same seed always writes the same weights. */
function normalStream(seed: number): () => number {
  const u = mulberry32(seed);
  return () => Math.sqrt(-2 * Math.log(Math.max(u(), 1e-12))) * Math.cos(2 * Math.PI * u());
}

export interface InitModelOptions {
  architecture: Architecture;
  preset?: string;
  /** Extra/override config.json fields. */
  overrides?: Json;
  dtype?: "float32" | "bfloat16";
  /** Directory holding tokenizer.json and tokenizer_config.json to copy. */
  tokenizerDir: string;
  seed?: number;
  /** Standard deviation of the random weights. */
  std?: number;
  /**
   * gpt-oss: write the experts as OpenAI's MXFP4 blocks and scales (quant_method "mxfp4", as the released
   * checkpoints), rounded as --quantization mxfp4 rounds; default false (the HF float layout).
   */
  mxfp4Experts?: boolean;
  /**
   * Gemma 3 (architecture Gemma3ForCausalLM) as an image-text checkpoint, Gemma3ForConditionalGeneration: the text
   * config nested as text_config, this vision_config (HF's SigLIP defaults for what it leaves out) and
   * mm_tokens_per_image, a random vision tower and projector, and the text weights under `language_model.`
   * (transformers before 4.52) or `model.language_model.` ("new"). The tokenizer must hold Gemma 3's image tokens.
   */
  vision?: { visionConfig: Json; mmTokensPerImage: number; layout?: "old" | "new" };
}

/** Writes a random model directory; returns its config.json object. */
export function initModel(out: string, options: InitModelOptions): Json {
  const preset = PRESETS[options.preset ?? "tiny"];
  if (!preset) throw new ModelLoadError(`unknown preset "${options.preset}" (known: ${Object.keys(PRESETS).join(", ")})`);
  const tokJson = JSON.parse(fs.readFileSync(path.join(options.tokenizerDir, "tokenizer.json"), "utf8")) as Json;
  const tokConfigPath = path.join(options.tokenizerDir, "tokenizer_config.json");
  const tokConfig = fs.existsSync(tokConfigPath) ? (JSON.parse(fs.readFileSync(tokConfigPath, "utf8")) as Json) : {};
  const tokVocab = tokenizerVocabSize(tokJson);
  const dtype = options.dtype ?? "float32";
  const config: Json = {
    architectures: [options.architecture],
    vocab_size: Math.max(tokVocab, 1),
    rms_norm_eps: 1e-6,
    rope_theta: 10000,
    tie_word_embeddings: false,
    torch_dtype: dtype,
    hidden_act: "silu",
    ...preset,
    ...archExtras(options.architecture),
    ...options.overrides,
  };
  if (Number(config.vocab_size) < tokVocab) config.vocab_size = tokVocab;
  const eosName = typeof tokConfig.eos_token === "string" ? tokConfig.eos_token : null;
  const eosId = eosName !== null ? tokenId(tokJson, eosName) : null;
  if (eosId !== null) config.eos_token_id = eosId;
  const cfg = parseHfConfig(config);
  // Build the module tree only to enumerate names and shapes: unallocated, so nothing is allocated or initialised.
  const model = new CausalLM(cfg, { family: FAMILIES[cfg.architecture], unallocatedParameters: true });
  const normal = normalStream(options.seed ?? 0);
  const std = options.std ?? 0.02;
  // values are drawn when each tensor is written, in parameter order (a 1B model never sits in memory at once)
  const tensors: SafetensorsLazyTensor[] = model.namedParameters().map(([name, t]) => {
    const n = t.numel;
    const keepF32 = name.endsWith("norm.weight") || name.endsWith(".bias") || name.endsWith(".sinks") || dtype === "float32";
    const values = () => {
      const v = new Float32Array(n);
      // norms start at scale 1 (as HF initialises them: Gemma's (1 + w) at w = 0); everything else, biases
      // included, is N(0, std)
      if (name.endsWith("norm.weight")) v.fill(1 - cfg.normOffset);
      else if (name.endsWith(".sinks")) for (let i = 0; i < n; i++) v[i] = normal(); // learned sinks are O(1) logits
      else for (let i = 0; i < n; i++) v[i] = normal() * std;
      return keepF32 ? v : f32ToBf16(v);
    };
    return { name, dtype: keepF32 ? ("F32" as const) : ("BF16" as const), shape: [...t.shape], data: values };
  });
  for (const [, t] of model.namedParameters()) t.dispose();
  fs.mkdirSync(out, { recursive: true });
  if (cfg.architecture === "Phi3ForCausalLM") fuseTensors(tensors, cfg); // as HF's Phi-3 checkpoints store them
  if (cfg.architecture === "GptOssForCausalLM") {
    fuseGptOssExperts(tensors, cfg, options.mxfp4Experts === true); // as HF's gpt-oss checkpoints store them
    if (options.mxfp4Experts === true)
      config.quantization_config = { quant_method: "mxfp4", modules_to_not_convert: ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"] };
  }
  const written = options.vision === undefined ? config : imageTextCheckpoint(config, cfg, tokJson, options.vision, tensors, normal, std);
  fs.writeFileSync(path.join(out, "config.json"), JSON.stringify(written, null, 2));
  writeSafetensors(path.join(out, "model.safetensors"), tensors, { format: "pt" });
  fs.copyFileSync(path.join(options.tokenizerDir, "tokenizer.json"), path.join(out, "tokenizer.json"));
  fs.writeFileSync(path.join(out, "tokenizer_config.json"), JSON.stringify(tokConfig, null, 2));
  fs.writeFileSync(path.join(out, "generation_config.json"), JSON.stringify({ eos_token_id: eosId ?? undefined, do_sample: false }, null, 2));
  return config;
}

/**
 * Gemma3ForConditionalGeneration's config around the text config, with the text tensors renamed in place and the
 * vision tower's and projector's random tensors added (LayerNorms at scale 1, the projector's (1 + w) norm at w = 0).
 */
function imageTextCheckpoint(
  text: Json, cfg: ModelConfig, tokJson: Json, vision: NonNullable<InitModelOptions["vision"]>, tensors: SafetensorsLazyTensor[], normal: () => number, std: number,
): Json {
  if (cfg.architecture !== "Gemma3ForCausalLM") throw new ModelLoadError(`[init] an image-text checkpoint is written for Gemma 3 only, not ${cfg.architecture}`);
  const ids = [GEMMA3_IMAGE_TOKEN, GEMMA3_BOI, GEMMA3_EOI].map((t) => tokenId(tokJson, t));
  if (ids.some((id) => id === null)) throw new ModelLoadError(`[init] the tokenizer lacks Gemma 3's image tokens (${GEMMA3_BOI}, ${GEMMA3_IMAGE_TOKEN}, ${GEMMA3_EOI})`);
  const outer: Json = {
    architectures: ["Gemma3ForConditionalGeneration"], model_type: "gemma3", torch_dtype: text.torch_dtype, eos_token_id: text.eos_token_id,
    mm_tokens_per_image: vision.mmTokensPerImage, image_token_index: ids[0], boi_token_index: ids[1], eoi_token_index: ids[2],
    text_config: { ...text, architectures: undefined }, vision_config: { model_type: "siglip_vision_model", ...vision.visionConfig },
  };
  const newLayout = vision.layout === "new";
  for (const t of tensors)
    t.name = newLayout ? (t.name.startsWith("model.") ? `model.language_model.${t.name.slice(6)}` : t.name) : `language_model.${t.name}`;
  const v = new Gemma3Vision(parseGemma3VisionConfig(outer, cfg.hiddenSize), { unallocatedParameters: true });
  for (const [name, p] of v.namedParameters()) {
    const n = p.numel;
    const data = () => {
      const x = new Float32Array(n);
      if (/layer_?norm\d?\.weight$/.test(name)) x.fill(1);
      else if (!name.endsWith("norm.weight")) for (let i = 0; i < n; i++) x[i] = normal() * std;
      return x;
    };
    tensors.push({ name: (newLayout ? "model." : "") + name, dtype: "F32", shape: [...p.shape], data });
  }
  for (const [, p] of v.namedParameters()) p.dispose();
  return outer;
}

/** Replaces the parts of each of the config's fused tensors (Phi-3's qkv_proj, gate_up_proj) with the fused tensor, in place. */
function fuseTensors(tensors: SafetensorsLazyTensor[], cfg: ModelConfig): void {
  const byName = new Map(tensors.map((t) => [t.name, t]));
  const fused: SafetensorsLazyTensor[] = [];
  const gone = new Set<string>();
  for (const t of tensors) {
    const m = /^(model\.layers\.\d+\.)self_attn\.q_proj\.weight$|^(model\.layers\.\d+\.)mlp\.gate_proj\.weight$/.exec(t.name);
    if (m === null) continue;
    const name = m[1] !== undefined ? `${m[1]}self_attn.qkv_proj.weight` : `${m[2]}mlp.gate_up_proj.weight`;
    const parts = fusedParts(cfg, name)!.map(([n]) => byName.get(n)!);
    parts.forEach((p) => gone.add(p.name));
    const rows = parts.reduce((n, p) => n + p.shape[0]!, 0);
    fused.push({
      name, dtype: t.dtype, shape: [rows, t.shape[1]!],
      data: () => {
        const bytes = parts.map((p) => {
          const d = p.data();
          return new Uint8Array(d.buffer, d.byteOffset, d.byteLength);
        });
        const out = new Uint8Array(bytes.reduce((n, b) => n + b.length, 0));
        bytes.reduce((at, b) => (out.set(b, at), at + b.length), 0);
        return out;
      },
    });
  }
  const kept = tensors.filter((t) => !gone.has(t.name));
  tensors.splice(0, tensors.length, ...kept, ...fused);
}

function tokenizerVocabSize(tok: Json): number {
  const model = tok.model as { vocab?: Record<string, number> | [string, number][] } | undefined;
  let max = -1;
  const vocab = model?.vocab;
  if (Array.isArray(vocab)) max = vocab.length - 1;
  else if (vocab) for (const id of Object.values(vocab)) max = Math.max(max, id);
  for (const a of (tok.added_tokens ?? []) as { id: number }[]) max = Math.max(max, a.id);
  return max + 1;
}

function tokenId(tok: Json, content: string): number | null {
  for (const a of (tok.added_tokens ?? []) as { id: number; content: string }[]) if (a.content === content) return a.id;
  const vocab = (tok.model as { vocab?: Record<string, number> } | undefined)?.vocab;
  return vocab && !Array.isArray(vocab) && content in vocab ? vocab[content]! : null;
}


/**
 * Exports an HF model directory (safetensors + byte-level BPE tokenizer) to one GGUF file that llama.cpp loads.
 * Q/K rows are permuted for llama-arch as convert_hf_to_gguf does. `type` applies to every matrix (token_embd
 * too); 1-d tensors stay F32, and so do matrices whose rows are not whole 32-element blocks. Q4_0 rounds as
 * llama.cpp's quantize_row_q4_0_ref, which is also what `--quantization int4` computes, so a Q4_0 export holds
 * exactly the int4 weights Kiln runs; likewise MXFP4 and `--quantization mxfp4`. Q4_K, Q5_K and Q6_K need rows of
 * whole 256-element super-blocks: other matrices fall back to Q4_0 (Q4_K) and Q8_0 (as llama.cpp's quantizer falls
 * back to a 32-block type). Q4_K_M mixes them as llama.cpp's Q4_K_M recipe does in the main: Q4_K, with output.weight
 * and the attn_v / ffn_down of the layers its use_more_bits picks (the first and last eighth, every third between) at
 * Q6_K; llama.cpp's further special cases (GQA, MoE and vocabulary-size rules) are not copied. gpt-oss's fused experts are split into llama.cpp's gate / up / down stacks; MXFP4 experts stay MXFP4 (the
 * checkpoint's own codes) whatever `type` is. Tensors are read and encoded one at a time.
 */
/** The type of tensor `name` in a Q4_K_M export (see exportGguf). */
function q4kMType(name: string, layers: number): "Q4_K" | "Q6_K" {
  if (name === "output.weight") return "Q6_K";
  const m = /^blk\.(\d+)\.(attn_v|ffn_down)(_exps)?\.weight$/.exec(name);
  if (!m) return "Q4_K";
  // llama.cpp's use_more_bits(i, n)
  const i = Number(m[1]);
  const more = i < layers / 8 || i >= (7 * layers) / 8 || (i - Math.floor(layers / 8)) % 3 === 2;
  return more ? "Q6_K" : "Q4_K";
}

export function exportGguf(dir: string, outFile: string, type: GgufExportType = "F32"): void {
  const config = JSON.parse(fs.readFileSync(path.join(dir, "config.json"), "utf8")) as Json;
  const cfg = parseHfConfig(config);
  const tokJson = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")) as Json;
  const tokCfgPath = path.join(dir, "tokenizer_config.json");
  const tokCfg = fs.existsSync(tokCfgPath) ? (JSON.parse(fs.readFileSync(tokCfgPath, "utf8")) as Json) : {};
  const metadata = { ...hfConfigToGgufMetadata(config), ...tokenizerJsonToGgufMetadata(tokJson, tokCfg) };
  const weights = inspectModelDir(dir).weights; // one file or shards with their index, as the loader reads them
  if (weights === null || weights.format === "gguf") throw new ModelLoadError(`[convert] ${dir} has no safetensors or PyTorch weights`);
  const st = openCheckpoint(weights);
  // an FP8 checkpoint's weights are dequantized (code * scale) and its scale tensors dropped, as llama.cpp's converter does
  const fp8 = isMxfp4Checkpoint(config) ? null : fp8CheckpointFormat(config);
  const permutes = ["LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "GraniteForCausalLM", "SmolLM3ForCausalLM"].includes(cfg.architecture);
  const family = ggufFamilyOf(cfg.architecture);
  const load = (name: string, rows: number): Float32Array => {
    const data = fp8 ? loadFp8CheckpointTensor(st, name, fp8) : st.loadAsFloat32(name);
    const shift = ggufNormShift(family, name);
    if (shift !== 0) return data.map((x) => x + shift);
    if (!permutes || !/self_attn\.(q|k)_proj\.weight$/.test(name)) return data;
    return permuteQK(data, rows, cfg.numAttentionHeads, name.includes("k_proj") ? cfg.numKeyValueHeads : undefined);
  };
  // 1-d tensors (norms, biases) stay F32 as llama.cpp's converter keeps them; so do rows of partial blocks
  const blocked = type.startsWith("Q") || type === "MXFP4" || type === "IQ4_NL";
  const typeFor = (shape: readonly number[], ggufName = ""): GgmlTypeName => {
    if (shape.length === 1 || (blocked && shape.at(-1)! % 32 !== 0)) return "F32";
    const t = type === "Q4_K_M" ? q4kMType(ggufName, cfg.numHiddenLayers) : type;
    if (shape.at(-1)! % 256 === 0) return t;
    return t === "Q4_K" ? "Q4_0" : t === "Q5_K" || t === "Q6_K" ? "Q8_0" : t;
  };
  // (BF16 of a bfloat16 checkpoint is lossless: its values come back through f32 unchanged)
  const stacked = new Map<string, { shape: number[]; parts: string[] }>();
  const tensors: GgufWriteTensor[] = [];
  try {
    const gptOss = cfg.architecture === "GptOssForCausalLM";
    for (const info of st.tensors) {
      if (gptOss && isGptOssFusedExpertTensor(info.name)) continue; // below, split and stacked as llama.cpp's gpt-oss reads them
      if (fp8 && isFp8ScaleTensor(info.name)) continue;
      const m = hfToGgufTensorName(info.name, family);
      if (!m) throw new ModelLoadError(`${dir}: tensor ${info.name} has no GGUF name`);
      if (m.expert !== undefined) {
        const s = stacked.get(m.name) ?? { shape: info.shape, parts: [] };
        s.parts[m.expert] = info.name;
        stacked.set(m.name, s);
        continue;
      }
      // (the shared-expert gate stays F32, as llama.cpp's converter keeps it)
      const type = m.name.endsWith("ffn_gate_inp_shexp.weight") ? "F32" : typeFor(info.shape, m.name);
      tensors.push({ name: m.name, shape: info.shape, type, load: () => load(info.name, info.shape[0]!) });
    }
    for (const { name, values } of [...phi3RopeFactorTensors(config), ...llama3RopeFreqTensors(config)]) tensors.push({ name, shape: [values.length], type: "F32", load: () => values });
    // llama.cpp's qwen2moe always reads an output head: a tied one is written as the embedding's copy
    if (cfg.architecture === "Qwen2MoeForCausalLM" && cfg.tieWordEmbeddings) {
      const embed = st.tensors.find((t) => t.name === "model.embed_tokens.weight")!;
      tensors.push({ name: "output.weight", shape: embed.shape, type: typeFor(embed.shape, "output.weight"), load: () => load(embed.name, embed.shape[0]!) });
    }
    if (gptOss) tensors.push(...gptOssGgufExpertTensors(st, cfg, typeFor));
    for (const [name, s] of stacked) {
      const per = s.shape.reduce((a, b) => a * b, 1);
      const all = () => {
        const out = new Float32Array(per * s.parts.length);
        s.parts.forEach((p, e) => out.set(load(p, s.shape[0]!), e * per));
        return out;
      };
      tensors.push({ name, shape: [s.parts.length, ...s.shape], type: typeFor(s.shape, name), load: all });
    }
    writeGguf(outFile, metadata, tensors);
  } finally {
    st.close();
  }
}
