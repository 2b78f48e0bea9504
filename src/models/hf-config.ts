// Typed, validated model configuration parsed from a Hugging Face config.json.
// Anything that would change numerics and that Kiln does not implement is rejected by name.

import type { RopeScaling } from "../nn/rotary.js";

export class ModelConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ModelConfigError";
  }
}

export const SUPPORTED_ARCHITECTURES = [
  "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM",
  "Qwen3MoeForCausalLM", "GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM", "GraniteForCausalLM", "Olmo2ForCausalLM", "Phi3ForCausalLM", "GptOssForCausalLM",
  "SmolLM3ForCausalLM",
] as const;
export type Architecture = (typeof SUPPORTED_ARCHITECTURES)[number];

/** HF rope_scaling variants; the rotary tables are built from it in nn/rotary.ts. */
export type { RopeScaling };

export interface MoeConfig {
  numExperts: number;
  numExpertsPerTok: number;
  /** Hidden size of each expert's MLP. */
  moeIntermediateSize: number;
  /** Renormalize the top-k routing weights to sum to 1 (Mixtral always does). */
  normTopkProb: boolean;
  /** Qwen2/3-MoE: layer i is sparse iff !mlpOnlyLayers.includes(i) && (i + 1) % decoderSparseStep == 0. */
  decoderSparseStep: number;
  mlpOnlyLayers: number[];
  /** gpt-oss: the router (`mlp.router`) and every expert projection carry biases; Mixtral and Qwen3-MoE have none. */
  routerBias: boolean;
  expertBias: boolean;
  /**
   * gpt-oss's clamped SwiGLU (swiglu_limit, alpha 1.702) in place of silu(gate) * up: gate = min(gate, limit),
   * up = clamp(up, -limit, limit), out = (up + 1) * gate * sigmoid(alpha * gate). null: silu(gate) * up.
   */
  clampedSwiglu: { alpha: number; limit: number } | null;
  /**
   * Qwen2-MoE: the hidden size of the shared expert every token also runs (shared_expert_intermediate_size), its
   * output scaled by sigmoid(shared_expert_gate(x)) before it joins the routed experts' sum; null: none.
   */
  sharedExpertIntermediateSize: number | null;
}

/**
 * A sequence classifier (HF's *ForSequenceClassification over a supported decoder): `score` maps the last token's
 * final hidden state to num_labels logits.
 */
export interface ClassifierConfig {
  numLabels: number;
  /** id2label, in label order (LABEL_i where the config names none). */
  labels: string[];
  /** HF's problem_type: how the logits become scores (vLLM: softmax over 2+ labels, sigmoid for one; see the pooler). */
  problemType: "single_label_classification" | "multi_label_classification" | "regression" | null;
  /**
   * vLLM's use_sep_token (config.json's use_sep_token, or its deprecated use_pad_token; default true): a
   * cross-encoder (one label) scores the tokenizer's text pair; false, as an LLM converted to a reranker says, the
   * two texts joined into one.
   */
  useSepToken: boolean;
}

export interface ModelConfig {
  /** The decoder's architecture (for a classifier, the *ForCausalLM it is built on). */
  architecture: Architecture;
  /** Set for a *ForSequenceClassification checkpoint: its classification head; null for a language model. */
  classifier: ClassifierConfig | null;
  modelType: string;
  vocabSize: number;
  hiddenSize: number;
  /** Dense MLP hidden size (for Mixtral, the expert size). */
  intermediateSize: number;
  numHiddenLayers: number;
  numAttentionHeads: number;
  numKeyValueHeads: number;
  headDim: number;
  rmsNormEps: number;
  ropeTheta: number;
  ropeScaling: RopeScaling | null;
  /** Head dimensions the rotary turns (the first ones of each head): head_dim * partial_rotary_factor (Phi-4-mini 0.75). */
  rotaryDim: number;
  maxPositionEmbeddings: number;
  tieWordEmbeddings: boolean;
  /** The gated MLP's activation: SiLU, or GELU's tanh approximation (Gemma's gelu_pytorch_tanh). */
  hiddenAct: "silu" | "gelu_tanh";
  /** Attention's softmax scale (Gemma 3: query_pre_attn_scalar ** -0.5; else head_dim ** -0.5). */
  attnScale: number;
  /**
   * The embeddings' output is multiplied by this (Gemma: sqrt(hidden_size), rounded to the weights' dtype as HF casts
   * it; Granite: embedding_multiplier), or null.
   */
  embedScale: number | null;
  /** Granite: each layer's attention and MLP outputs are scaled by this before their residual add (residual_multiplier). */
  residualScale: number | null;
  /** Granite: the logits are divided by this (logits_scaling). */
  logitScale: number | null;
  /** RMSNorm scales by (offset + weight): 1 for Gemma, whose norm weights are stored as w with (1 + w) applied. */
  normOffset: number;
  /**
   * Where a layer's norms sit. "pre" (Llama): input_layernorm before the attention, post_attention_layernorm before
   * the MLP. "sandwich" (Gemma 3): those around the attention (post_attention_layernorm normalizes its output before
   * the residual add), pre_feedforward_layernorm and post_feedforward_layernorm around the MLP. "post" (OLMo 2):
   * post_attention_layernorm and post_feedforward_layernorm on the two outputs only.
   */
  normPlacement: "pre" | "sandwich" | "post";
  /**
   * Gemma 2: attention scores s (already scaled) become cap * tanh(s / cap) before the mask and softmax
   * (attn_logit_softcapping); null: none.
   */
  attnSoftcap: number | null;
  /** Gemma 2: the logits become cap * tanh(logits / cap) (final_logit_softcapping); null: none. */
  finalSoftcap: number | null;
  /**
   * gpt-oss: each attention layer has `sinks` [num_attention_heads], one learned logit per head joined to the softmax
   * denominator (its probability dropped).
   */
  attnSinks: boolean;
  /** Gemma 3: the sliding-window layers' rotary base (rope_local_base_freq, no scaling); null: all layers share one. */
  localRopeTheta: number | null;
  /** Bias on q/k/v projections (always for Qwen2, `attention_bias` for Llama/Qwen3). */
  qkvBias: boolean;
  /** Bias on the output projection (`attention_bias` for Llama/Qwen3; never for Qwen2). */
  oBias: boolean;
  mlpBias: boolean;
  /** RMSNorm of q and k before rotary: Qwen3 and Gemma 3 over each head ("head"), OLMo 2 over the whole projection ("full"). */
  qkNorm: boolean;
  qkNormScope: "head" | "full";
  /**
   * Per layer: does its attention rotate q and k? All true but for SmolLM3's NoPE layers (no_rope_layers, 0 = no
   * rotary; by default every no_rope_layer_interval-th layer, 4).
   */
  ropeLayers: boolean[];
  /** Sliding attention window size in tokens, or null. */
  slidingWindow: number | null;
  /** Per layer: does it use the sliding window? (all false when slidingWindow is null) */
  slidingWindowLayers: boolean[];
  moe: MoeConfig | null;
  /** Per layer: is the MLP a sparse MoE block? */
  moeLayers: boolean[];
  torchDtype: string | null;
  bosTokenId: number | null;
  eosTokenIds: number[];
  /** The original JSON, for fields the model code may want to inspect. */
  raw: Readonly<Record<string, unknown>>;
}

type Json = Record<string, unknown>;

/** HF's Gemma3TextConfig defaults: a Gemma 3 config.json (or text_config) leaves out what equals them. */
const GEMMA3_TEXT_DEFAULTS: Json = {
  vocab_size: 262_208, hidden_size: 2304, intermediate_size: 9216, num_hidden_layers: 26, num_attention_heads: 8,
  num_key_value_heads: 4, head_dim: 256, hidden_activation: "gelu_pytorch_tanh", max_position_embeddings: 131_072,
  rms_norm_eps: 1e-6, rope_theta: 1_000_000, attention_bias: false, query_pre_attn_scalar: 256, sliding_window: 4096,
  rope_local_base_freq: 10_000, sliding_window_pattern: 6, tie_word_embeddings: true, bos_token_id: 2, eos_token_id: 1,
};

/**
 * HF's GemmaConfig defaults (configuration_gemma.py; gemma-7b's shape), for what a Gemma config.json leaves out. Its
 * hidden_activation default (None) is read apart: see parseHfConfig.
 */
const GEMMA_DEFAULTS: Json = {
  vocab_size: 256_000, hidden_size: 3072, intermediate_size: 24_576, num_hidden_layers: 28, num_attention_heads: 16,
  num_key_value_heads: 16, head_dim: 256, max_position_embeddings: 8192, rms_norm_eps: 1e-6, rope_theta: 10_000,
  attention_bias: false, tie_word_embeddings: true, bos_token_id: 2, eos_token_id: 1,
};

/** HF's Gemma2Config defaults (transformers' configuration_gemma2.py), for what a Gemma 2 config.json leaves out. */
const GEMMA2_DEFAULTS: Json = {
  vocab_size: 256_000, hidden_size: 2304, intermediate_size: 9216, num_hidden_layers: 26, num_attention_heads: 8,
  num_key_value_heads: 4, head_dim: 256, hidden_activation: "gelu_pytorch_tanh", max_position_embeddings: 8192,
  rms_norm_eps: 1e-6, rope_theta: 10_000, attention_bias: false, query_pre_attn_scalar: 256, sliding_window: 4096,
  final_logit_softcapping: 30, attn_logit_softcapping: 50, tie_word_embeddings: true, bos_token_id: 2, eos_token_id: 1,
};

/**
 * HF's GptOssConfig defaults (transformers' configuration_gpt_oss.py) for what a gpt-oss config.json leaves out; its
 * rope default (YaRN, factor 32 over 4096 positions, truncate false) is filled apart, only when no rope is given.
 */
const GPT_OSS_DEFAULTS: Json = {
  num_hidden_layers: 36, num_local_experts: 128, vocab_size: 201_088, hidden_size: 2880, intermediate_size: 2880, head_dim: 64,
  num_attention_heads: 64, num_key_value_heads: 8, sliding_window: 128, tie_word_embeddings: false, max_position_embeddings: 131_072,
  rms_norm_eps: 1e-5, rope_theta: 150_000, num_experts_per_tok: 4, swiglu_limit: 7.0, attention_bias: true,
};
/**
 * SmolLM3's rotary layers: no_rope_layers (one 0/1 per layer, at least as many as layers; 1 = rotary), else a NoPE
 * layer every no_rope_layer_interval-th (layers interval-1, 2*interval-1, ...), as SmolLM3Config derives it.
 */
function smolLm3RopeLayers(cfg: Json, layers: number): boolean[] {
  const arch = "SmolLM3ForCausalLM";
  const given = cfg.no_rope_layers;
  if (given === undefined || given === null) {
    const interval = optInt(cfg, "no_rope_layer_interval", arch, 4);
    return Array.from({ length: layers }, (_, i) => (i + 1) % interval !== 0);
  }
  if (!Array.isArray(given) || given.length < layers || !given.every((v) => v === 0 || v === 1))
    throw new ModelConfigError(`[config] ${arch}: no_rope_layers must list 0 or 1 for each of the ${layers} layers, got ${JSON.stringify(given)}`);
  return (given as number[]).slice(0, layers).map((v) => v === 1);
}

/**
 * HF's SmolLM3Config defaults (configuration_smollm3.py) for what a SmolLM3 config.json leaves out: notably the tied
 * head and a rotary base of 2e6 (no_rope_layers is derived apart, from no_rope_layer_interval).
 */
const SMOLLM3_DEFAULTS: Json = {
  vocab_size: 128_256, hidden_size: 2048, intermediate_size: 11_008, num_hidden_layers: 36, num_attention_heads: 16,
  num_key_value_heads: 4, hidden_act: "silu", max_position_embeddings: 32_768, rms_norm_eps: 1e-6, rope_theta: 2_000_000,
  attention_bias: false, mlp_bias: false, tie_word_embeddings: true, bos_token_id: 128_000, eos_token_id: 128_001,
  use_sliding_window: false, no_rope_layer_interval: 4,
};
const GPT_OSS_ROPE: Json = { rope_type: "yarn", factor: 32, beta_fast: 32, beta_slow: 1, truncate: false, original_max_position_embeddings: 4096 };
/** gpt-oss's SwiGLU gain (HF's GptOssExperts.alpha; not a config field in the released checkpoints). */
const GPT_OSS_SWIGLU_ALPHA = 1.702;

/**
 * Qwen2-MoE's mlp_only_layers (Qwen3-MoE's too): layer indices whose MLP stays dense; absent or null: none. (An index
 * past the last layer names no layer, as in HF.)
 */
function mlpOnlyLayers(cfg: Json, arch: string): number[] {
  const v = cfg.mlp_only_layers;
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v) || !v.every((i) => Number.isInteger(i) && (i as number) >= 0))
    throw new ModelConfigError(`[config] ${arch}: mlp_only_layers must list layer indices (non-negative integers), got ${JSON.stringify(v)}`);
  return v as number[];
}

/**
 * The language model's config of a checkpoint: the config itself, or for Gemma 3's image-text checkpoints
 * (Gemma3ForConditionalGeneration, e.g. gemma-3-4b-it) its text_config as a Gemma3ForCausalLM, which Kiln serves
 * text-only. `textWeights` says where its weights sit in the checkpoint (null: under their own names).
 */
export function languageModelConfig(json: Json): { config: Json; textWeights: "language_model" | null } {
  const arch = Array.isArray(json.architectures) ? json.architectures[0] : undefined;
  if (arch !== "Gemma3ForConditionalGeneration") return { config: json, textWeights: null };
  const text = json.text_config;
  if (text === null || typeof text !== "object" || Array.isArray(text))
    throw new ModelConfigError("[config] Gemma3ForConditionalGeneration: text_config must be an object");
  const outer = Object.fromEntries(["torch_dtype", "dtype", "eos_token_id", "bos_token_id", "tie_word_embeddings"].filter((k) => json[k] !== undefined).map((k) => [k, json[k]]));
  return { config: { ...outer, ...(text as Json), architectures: ["Gemma3ForCausalLM"], model_type: "gemma3_text" }, textWeights: "language_model" };
}

function req(cfg: Json, key: string, arch: string): number {
  const v = cfg[key];
  if (typeof v !== "number" || !Number.isInteger(v) || v <= 0) throw new ModelConfigError(`[config] ${arch}: "${key}" must be a positive integer, got ${JSON.stringify(v)}`);
  return v;
}
function optInt(cfg: Json, key: string, arch: string, dflt: number): number {
  return cfg[key] === undefined || cfg[key] === null ? dflt : req(cfg, key, arch);
}
function optNum(cfg: Json, key: string, arch: string, dflt: number): number {
  const v = cfg[key];
  if (v === undefined || v === null) return dflt;
  if (typeof v !== "number" || !Number.isFinite(v)) throw new ModelConfigError(`[config] ${arch}: "${key}" must be a number, got ${JSON.stringify(v)}`);
  return v;
}
function optBool(cfg: Json, key: string, dflt: boolean): boolean {
  const v = cfg[key];
  return typeof v === "boolean" ? v : dflt;
}
function idList(v: unknown): number[] {
  if (typeof v === "number") return [v];
  if (Array.isArray(v)) return v.filter((x): x is number => typeof x === "number");
  return [];
}

function parseRopeScaling(raw: unknown, arch: string, maxPos: number, cfg: Json, rotaryDim: number): RopeScaling | null {
  if (raw === undefined || raw === null) return null;
  if (typeof raw !== "object") throw new ModelConfigError(`[config] ${arch}: rope_scaling must be an object`);
  const r = raw as Json;
  const type = (r.rope_type ?? r.type ?? "default") as string;
  const num = (k: string, d?: number): number => {
    const v = r[k];
    if (typeof v === "number" && Number.isFinite(v)) return v;
    if ((v === undefined || v === null) && d !== undefined) return d;
    throw new ModelConfigError(`[config] ${arch}: rope_scaling (${type}) needs numeric "${k}", got ${JSON.stringify(v)}`);
  };
  const nullable = (k: string): number | null => (typeof r[k] === "number" ? (r[k] as number) : null);
  switch (type) {
    case "default": return null;
    case "linear": return { type, factor: num("factor") };
    case "dynamic": return { type, factor: num("factor"), originalMaxPositionEmbeddings: nullable("original_max_position_embeddings") };
    case "llama3":
      return {
        type, factor: num("factor"), lowFreqFactor: num("low_freq_factor"), highFreqFactor: num("high_freq_factor"),
        originalMaxPositionEmbeddings: num("original_max_position_embeddings"),
      };
    case "yarn": {
      const factor = num("factor");
      return {
        type, factor, originalMaxPositionEmbeddings: num("original_max_position_embeddings", maxPos / factor),
        betaFast: num("beta_fast", 32), betaSlow: num("beta_slow", 1),
        attentionFactor: nullable("attention_factor"), mscale: nullable("mscale"), mscaleAllDim: nullable("mscale_all_dim"),
        ...(typeof r.truncate === "boolean" ? { truncate: r.truncate } : {}),
      };
    }
    case "longrope":
    case "su": {
      // Phi-3.5 / Phi-4-mini: per-frequency divisors, one set for contexts within the original length and one past it
      const factors = (k: string): number[] => {
        const v = r[k];
        if (!Array.isArray(v) || v.length !== rotaryDim / 2 || !v.every((x) => typeof x === "number" && Number.isFinite(x) && x > 0))
          throw new ModelConfigError(`[config] ${arch}: rope_scaling (longrope) "${k}" must be ${rotaryDim / 2} positive numbers (one per rotary frequency), got ${JSON.stringify(v)?.slice(0, 80)}`);
        return v as number[];
      };
      const orig = r.original_max_position_embeddings ?? cfg.original_max_position_embeddings;
      if (typeof orig !== "number" || !Number.isInteger(orig) || orig <= 0)
        throw new ModelConfigError(`[config] ${arch}: rope_scaling (longrope) needs original_max_position_embeddings (in rope_scaling or the config), got ${JSON.stringify(orig)}`);
      return {
        type: "longrope", shortFactor: factors("short_factor"), longFactor: factors("long_factor"), originalMaxPositionEmbeddings: orig,
        shortMscale: nullable("short_mscale"), longMscale: nullable("long_mscale"),
      };
    }
    default:
      throw new ModelConfigError(`[config] ${arch}: unsupported rope_scaling type "${type}" (supported: default, linear, dynamic, llama3, yarn, longrope)`);
  }
}

/** A *ForSequenceClassification's head: num_labels from id2label (else num_labels, else HF's default 2). */
function parseClassifier(cfg: Json, arch: string): ClassifierConfig {
  const id2label = cfg.id2label;
  if (id2label !== undefined && id2label !== null && (typeof id2label !== "object" || Array.isArray(id2label)))
    throw new ModelConfigError(`[config] ${arch}: id2label must be an object of label names by id`);
  const named = (id2label ?? {}) as Record<string, unknown>;
  const numLabels = Object.keys(named).length || optInt(cfg, "num_labels", arch, 2);
  const labels = Array.from({ length: numLabels }, (_, i) => (typeof named[String(i)] === "string" ? (named[String(i)] as string) : `LABEL_${i}`));
  const p = cfg.problem_type ?? null;
  if (p !== null && p !== "single_label_classification" && p !== "multi_label_classification" && p !== "regression")
    throw new ModelConfigError(`[config] ${arch}: unknown problem_type ${JSON.stringify(p)}`);
  const sep = cfg.use_pad_token ?? cfg.use_sep_token ?? true; // vLLM reads the deprecated name first
  if (typeof sep !== "boolean") throw new ModelConfigError(`[config] ${arch}: use_sep_token must be true or false, got ${JSON.stringify(sep)}`);
  return { numLabels, labels, problemType: p, useSepToken: sep };
}

/**
 * Parses and validates a config.json object.
 * @example const cfg = parseHfConfig(JSON.parse(fs.readFileSync("config.json", "utf8")));
 */
export function parseHfConfig(json: unknown): ModelConfig {
  if (json === null || typeof json !== "object" || Array.isArray(json)) throw new ModelConfigError("[config] config.json is not an object");
  let cfg = json as Json;
  let archs = cfg.architectures;
  const classifierArch = Array.isArray(archs) && typeof archs[0] === "string" && archs[0].endsWith("ForSequenceClassification") ? archs[0] : null;
  if (classifierArch !== null) archs = [classifierArch.replace(/ForSequenceClassification$/, "ForCausalLM")];
  const classDefaults = Array.isArray(archs)
    ? { GemmaForCausalLM: GEMMA_DEFAULTS, Gemma3ForCausalLM: GEMMA3_TEXT_DEFAULTS, Gemma2ForCausalLM: GEMMA2_DEFAULTS, GptOssForCausalLM: GPT_OSS_DEFAULTS, SmolLM3ForCausalLM: SMOLLM3_DEFAULTS }[archs[0] as string]
    : undefined;
  if (classDefaults !== undefined) {
    // HF fills what a config leaves out from the class defaults (null counts as set: softcapping null is "none")
    cfg = { ...classDefaults, ...Object.fromEntries(Object.entries(cfg).filter(([, v]) => v !== undefined)) };
  }
  if (classDefaults === GPT_OSS_DEFAULTS && cfg.rope_scaling == null && cfg.rope_parameters == null) cfg = { ...cfg, rope_scaling: GPT_OSS_ROPE };
  const arch = Array.isArray(archs) && typeof archs[0] === "string" ? (archs[0] as string) : undefined;
  if (!arch) throw new ModelConfigError('[config] missing "architectures"');
  if (!(SUPPORTED_ARCHITECTURES as readonly string[]).includes(arch)) {
    const supported = [...SUPPORTED_ARCHITECTURES, ...SUPPORTED_ARCHITECTURES.map((a) => a.replace(/ForCausalLM$/, "ForSequenceClassification"))];
    throw new ModelConfigError(`[config] unsupported architecture "${classifierArch ?? arch}" (supported: ${supported.join(", ")})`);
  }
  const architecture = arch as Architecture;

  const gemma3 = architecture === "Gemma3ForCausalLM";
  const gemma2 = architecture === "Gemma2ForCausalLM";
  // Gemma (1): GELU-tanh MLP, (1 + w) norms, embeddings scaled by sqrt(hidden), tied head, in Llama's layer
  const gemma1 = architecture === "GemmaForCausalLM";
  // what Gemma 2 and 3 add: four norms per layer, query_pre_attn_scalar
  const gemma = gemma3 || gemma2;
  // Gemma names it hidden_activation (and keeps a hidden_act it does not use)
  const actKey = (gemma || gemma1 ? ["hidden_activation", "hidden_act"] : ["hidden_act", "hidden_activation"]).find((k) => cfg[k] != null) ?? "hidden_act";
  // Gemma 1.0's configs shipped hidden_act "gelu" (exact) by mistake for the tanh GELU it was trained with: without a
  // hidden_activation, vLLM (and HF before 2024-12) run gelu_pytorch_tanh whatever hidden_act says
  const act = gemma1 && cfg.hidden_activation == null ? "gelu_pytorch_tanh" : (cfg[actKey] ?? "silu");
  const hiddenAct = act === "silu" || act === "swish" ? "silu" : act === "gelu_pytorch_tanh" || act === "gelu_new" ? "gelu_tanh" : null;
  if (hiddenAct === null) throw new ModelConfigError(`[config] ${arch}: unsupported ${actKey} "${String(act)}" (silu, gelu_pytorch_tanh)`);
  const granite = architecture === "GraniteForCausalLM";
  const multipliers = ["logits_scaling", "embedding_multiplier", "residual_multiplier", "attention_multiplier"];
  const softcaps = ["attn_logit_softcapping", "final_logit_softcapping"];
  const unsupported = [...(gemma2 ? [] : softcaps), ...(granite ? [] : multipliers), ...(gemma ? [] : ["query_pre_attn_scalar"])];
  for (const key of unsupported) {
    if (cfg[key] !== undefined && cfg[key] !== null) throw new ModelConfigError(`[config] ${arch}: unsupported field "${key}" = ${JSON.stringify(cfg[key])}`);
  }
  if (cfg.use_bidirectional_attention === true) throw new ModelConfigError(`[config] ${arch}: use_bidirectional_attention (an encoder, not a causal LM) is not supported`);
  const softcap = (key: string): number | null => {
    if (!gemma2 || cfg[key] === null) return null;
    const v = optNum(cfg, key, arch, 0);
    if (v <= 0) throw new ModelConfigError(`[config] ${arch}: "${key}" must be a positive number or null, got ${JSON.stringify(cfg[key])}`);
    return v;
  };
  if (cfg.pretraining_tp !== undefined && cfg.pretraining_tp !== 1 && cfg.pretraining_tp !== null) {
    throw new ModelConfigError(`[config] ${arch}: unsupported pretraining_tp ${JSON.stringify(cfg.pretraining_tp)}`);
  }

  const hiddenSize = req(cfg, "hidden_size", arch);
  const numAttentionHeads = req(cfg, "num_attention_heads", arch);
  const numKeyValueHeads = optInt(cfg, "num_key_value_heads", arch, numAttentionHeads);
  if (numAttentionHeads % numKeyValueHeads !== 0) {
    throw new ModelConfigError(`[config] ${arch}: num_attention_heads ${numAttentionHeads} is not a multiple of num_key_value_heads ${numKeyValueHeads}`);
  }
  const headDimDefault = hiddenSize / numAttentionHeads;
  const headDim = optInt(cfg, "head_dim", arch, Number.isInteger(headDimDefault) ? headDimDefault : 0);
  if (!headDim) throw new ModelConfigError(`[config] ${arch}: hidden_size ${hiddenSize} is not divisible by num_attention_heads and head_dim is absent`);
  const numHiddenLayers = req(cfg, "num_hidden_layers", arch);
  // Phi-3's attention turns the first head_dim * partial_rotary_factor dimensions of each head (Phi-4-mini: 0.75)
  const rotaryFraction = cfg.partial_rotary_factor ?? 1;
  const rotaryDim = typeof rotaryFraction === "number" ? Math.floor(headDim * rotaryFraction) : NaN;
  if (rotaryFraction !== 1 && (architecture !== "Phi3ForCausalLM" || !(rotaryDim >= 2 && rotaryDim <= headDim && rotaryDim % 2 === 0)))
    throw new ModelConfigError(
      architecture === "Phi3ForCausalLM"
        ? `[config] ${arch}: partial_rotary_factor ${JSON.stringify(rotaryFraction)} must turn an even number of each head's ${headDim} dimensions (0 < factor <= 1)`
        : `[config] ${arch}: partial_rotary_factor ${JSON.stringify(rotaryFraction)} is not supported (rotary over the whole head only)`,
    );
  const maxPositionEmbeddings = optInt(cfg, "max_position_embeddings", arch, 2048);

  // transformers v5 moved rope settings into rope_parameters.
  // transformers v5 moved rope settings into rope_parameters; a model with two kinds of layers (Gemma 3) keeps one
  // set per layer type there
  const byType = cfg.rope_parameters as Record<string, Json> | undefined;
  const perType = byType !== null && typeof byType === "object" && typeof byType.full_attention === "object";
  const ropeParams = ((perType ? byType.full_attention : cfg.rope_parameters) ?? null) as Json | null;
  const ropeTheta = optNum(ropeParams ?? {}, "rope_theta", arch, optNum(cfg, "rope_theta", arch, 10000));
  const ropeScaling = parseRopeScaling(cfg.rope_scaling ?? ropeParams ?? null, arch, maxPositionEmbeddings, cfg, rotaryDim);
  const localRope = perType && typeof byType.sliding_attention === "object" ? byType.sliding_attention : null;

  const ropeLayers = architecture === "SmolLM3ForCausalLM" ? smolLm3RopeLayers(cfg, numHiddenLayers) : Array.from({ length: numHiddenLayers }, () => true);
  const isQwen = architecture.startsWith("Qwen");
  let slidingWindow: number | null = typeof cfg.sliding_window === "number" && cfg.sliding_window > 0 ? cfg.sliding_window : null;
  let slidingWindowLayers: boolean[];
  if (Array.isArray(cfg.layer_types)) {
    slidingWindowLayers = (cfg.layer_types as unknown[]).map((t) => t === "sliding_attention");
    if (slidingWindowLayers.length !== numHiddenLayers) throw new ModelConfigError(`[config] ${arch}: layer_types has ${slidingWindowLayers.length} entries for ${numHiddenLayers} layers`);
    if (!slidingWindowLayers.some(Boolean)) slidingWindow = null;
  } else if (gemma2) {
    // configs without layer_types (before transformers 4.53): the even layers slide, the odd ones are global
    slidingWindowLayers = Array.from({ length: numHiddenLayers }, (_, i) => slidingWindow !== null && i % 2 === 0);
  } else if (gemma3) {
    // older Gemma 3 configs: every sliding_window_pattern-th layer is global, the others slide
    const pattern = optInt(cfg, "sliding_window_pattern", arch, 6);
    slidingWindowLayers = Array.from({ length: numHiddenLayers }, (_, i) => slidingWindow !== null && (i + 1) % pattern !== 0);
  } else if (architecture === "GptOssForCausalLM") {
    // configs without layer_types: the even layers slide, the odd ones attend fully (HF's GptOssConfig)
    slidingWindowLayers = Array.from({ length: numHiddenLayers }, (_, i) => slidingWindow !== null && i % 2 === 0);
  } else if (isQwen) {
    // Qwen: the window applies only with use_sliding_window, and only to layers >= max_window_layers.
    if (!optBool(cfg, "use_sliding_window", false)) slidingWindow = null;
    const maxWindowLayers = typeof cfg.max_window_layers === "number" ? cfg.max_window_layers : numHiddenLayers;
    slidingWindowLayers = Array.from({ length: numHiddenLayers }, (_, i) => slidingWindow !== null && i >= maxWindowLayers);
  } else if (architecture === "SmolLM3ForCausalLM") {
    // SmolLM3Config: with use_sliding_window, its NoPE layers slide
    if (!optBool(cfg, "use_sliding_window", false)) slidingWindow = null;
    slidingWindowLayers = ropeLayers.map((rope) => slidingWindow !== null && !rope);
  } else {
    if (architecture === "LlamaForCausalLM" || granite || architecture === "Olmo2ForCausalLM" || gemma1) slidingWindow = null;
    slidingWindowLayers = Array.from({ length: numHiddenLayers }, () => slidingWindow !== null);
  }
  if (slidingWindow !== null && !slidingWindowLayers.some(Boolean)) slidingWindow = null;

  let moe: MoeConfig | null = null;
  let moeLayers = Array.from({ length: numHiddenLayers }, () => false);
  const intermediateSize = req(cfg, "intermediate_size", arch);
  if (architecture === "MixtralForCausalLM") {
    moe = {
      numExperts: optInt(cfg, "num_local_experts", arch, 8), numExpertsPerTok: optInt(cfg, "num_experts_per_tok", arch, 2),
      moeIntermediateSize: intermediateSize, normTopkProb: true, decoderSparseStep: 1, mlpOnlyLayers: [],
      routerBias: false, expertBias: false, clampedSwiglu: null, sharedExpertIntermediateSize: null,
    };
    moeLayers = moeLayers.map(() => true);
  } else if (architecture === "GptOssForCausalLM") {
    // softmax over the top-k router logits = the top-k of the softmax over all, renormalized (normTopkProb)
    const limit = optNum(cfg, "swiglu_limit", arch, 7);
    if (!(limit > 0)) throw new ModelConfigError(`[config] ${arch}: swiglu_limit must be positive, got ${limit}`);
    moe = {
      numExperts: req(cfg, "num_local_experts", arch), numExpertsPerTok: req(cfg, "num_experts_per_tok", arch),
      moeIntermediateSize: intermediateSize, normTopkProb: true, decoderSparseStep: 1, mlpOnlyLayers: [],
      routerBias: true, expertBias: true, clampedSwiglu: { alpha: optNum(cfg, "swiglu_alpha", arch, GPT_OSS_SWIGLU_ALPHA), limit },
      sharedExpertIntermediateSize: null,
    };
    moeLayers = moeLayers.map(() => true);
  } else if (architecture === "Qwen3MoeForCausalLM" || architecture === "Qwen2MoeForCausalLM") {
    // Qwen2-MoE adds a shared expert (0: none, as vLLM reads it); both default to unnormalized top-k weights
    const shared = architecture === "Qwen2MoeForCausalLM" ? cfg.shared_expert_intermediate_size : null;
    if (shared !== null && !(Number.isInteger(shared) && (shared as number) >= 0))
      throw new ModelConfigError(`[config] ${arch}: "shared_expert_intermediate_size" must be a non-negative integer, got ${JSON.stringify(shared)}`);
    const normTopk = cfg.norm_topk_prob ?? false;
    if (typeof normTopk !== "boolean") throw new ModelConfigError(`[config] ${arch}: "norm_topk_prob" must be true or false, got ${JSON.stringify(normTopk)}`);
    moe = {
      numExperts: req(cfg, "num_experts", arch), numExpertsPerTok: req(cfg, "num_experts_per_tok", arch),
      moeIntermediateSize: req(cfg, "moe_intermediate_size", arch), normTopkProb: normTopk,
      decoderSparseStep: optInt(cfg, "decoder_sparse_step", arch, 1), mlpOnlyLayers: mlpOnlyLayers(cfg, arch),
      routerBias: false, expertBias: false, clampedSwiglu: null, sharedExpertIntermediateSize: shared === 0 ? null : (shared as number | null),
    };
    const m = moe;
    moeLayers = moeLayers.map((_, i) => !m.mlpOnlyLayers.includes(i) && (i + 1) % m.decoderSparseStep === 0);
  }
  if (moe && (moe.numExpertsPerTok > moe.numExperts)) throw new ModelConfigError(`[config] ${arch}: num_experts_per_tok ${moe.numExpertsPerTok} > experts ${moe.numExperts}`);

  const attentionBias = optBool(cfg, "attention_bias", false);
  const eos = idList(cfg.eos_token_id);
  return {
    architecture,
    classifier: classifierArch === null ? null : parseClassifier(cfg, classifierArch),
    modelType: typeof cfg.model_type === "string" ? cfg.model_type : architecture,
    vocabSize: req(cfg, "vocab_size", arch),
    hiddenSize, intermediateSize, numHiddenLayers, numAttentionHeads, numKeyValueHeads, headDim,
    rmsNormEps: optNum(cfg, "rms_norm_eps", arch, 1e-6),
    ropeTheta, ropeScaling, rotaryDim, maxPositionEmbeddings,
    tieWordEmbeddings: optBool(cfg, "tie_word_embeddings", gemma || gemma1),
    hiddenAct,
    attnScale: granite ? optNum(cfg, "attention_multiplier", arch, 1 / Math.sqrt(headDim)) : 1 / Math.sqrt(gemma ? optNum(cfg, "query_pre_attn_scalar", arch, headDim) : headDim),
    embedScale: gemma || gemma1 ? Math.sqrt(hiddenSize) : granite ? optNum(cfg, "embedding_multiplier", arch, 1) : null,
    residualScale: granite ? optNum(cfg, "residual_multiplier", arch, 1) : null,
    logitScale: granite ? optNum(cfg, "logits_scaling", arch, 1) : null,
    normOffset: gemma || gemma1 ? 1 : 0,
    normPlacement: gemma ? "sandwich" : architecture === "Olmo2ForCausalLM" ? "post" : "pre",
    attnSoftcap: softcap("attn_logit_softcapping"),
    finalSoftcap: softcap("final_logit_softcapping"),
    localRopeTheta: gemma3 ? optNum(localRope ?? {}, "rope_theta", arch, optNum(cfg, "rope_local_base_freq", arch, 10000)) : null,
    attnSinks: architecture === "GptOssForCausalLM",
    // (Qwen2-MoE: Qwen2MoeConfig.qkv_bias, default true)
    qkvBias: architecture === "Qwen2ForCausalLM" ? true : architecture === "Qwen2MoeForCausalLM" ? optBool(cfg, "qkv_bias", true) : architecture === "MistralForCausalLM" || architecture === "MixtralForCausalLM" ? false : attentionBias,
    oBias: architecture === "LlamaForCausalLM" || architecture === "Qwen3ForCausalLM" || architecture === "Qwen3MoeForCausalLM" || gemma || gemma1 || granite ||
      architecture === "Olmo2ForCausalLM" || architecture === "GptOssForCausalLM" || architecture === "SmolLM3ForCausalLM" ? attentionBias : false,
    mlpBias: optBool(cfg, "mlp_bias", false),
    qkNorm: architecture === "Qwen3ForCausalLM" || architecture === "Qwen3MoeForCausalLM" || gemma3 || architecture === "Olmo2ForCausalLM",
    qkNormScope: architecture === "Olmo2ForCausalLM" ? "full" : "head",
    ropeLayers, slidingWindow, slidingWindowLayers, moe, moeLayers,
    torchDtype: typeof (cfg.torch_dtype ?? cfg.dtype) === "string" ? ((cfg.torch_dtype ?? cfg.dtype) as string) : null,
    bosTokenId: typeof cfg.bos_token_id === "number" ? cfg.bos_token_id : null,
    eosTokenIds: eos,
    raw: cfg,
  };
}
