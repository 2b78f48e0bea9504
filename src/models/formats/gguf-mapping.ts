// HF <-> GGUF conventions: tensor names, llama.cpp's Q/K row permutation, and config <-> metadata keys.

import { gguf, GgufValueType, type GgufTypedValue, type GgufValue } from "./gguf.js";
import { ModelFormatError } from "./model-format-error.js";
import { parseHfConfig, type ModelConfig } from "../hf-config.js";

// ---------------------------------------------------------------- tensor names

const GLOBAL_NAMES: [string, string][] = [
  ["model.embed_tokens.weight", "token_embd.weight"],
  ["model.norm.weight", "output_norm.weight"],
  ["lm_head.weight", "output.weight"],
];
/** Per-layer suffixes: HF (after `model.layers.N.`) <-> GGUF (after `blk.N.`), without .weight/.bias. */
const LAYER_NAMES: [string, string][] = [
  ["self_attn.q_proj", "attn_q"],
  ["self_attn.k_proj", "attn_k"],
  ["self_attn.v_proj", "attn_v"],
  ["self_attn.o_proj", "attn_output"],
  ["self_attn.q_norm", "attn_q_norm"],
  ["self_attn.k_norm", "attn_k_norm"],
  ["mlp.gate_proj", "ffn_gate"],
  ["mlp.up_proj", "ffn_up"],
  ["mlp.down_proj", "ffn_down"],
  ["input_layernorm", "attn_norm"],
  ["post_attention_layernorm", "ffn_norm"],
  ["mlp.gate", "ffn_gate_inp"], // Qwen2/3-MoE router
  ["block_sparse_moe.gate", "ffn_gate_inp"], // Mixtral router
  // Qwen2-MoE's shared expert and its gate ([1, hidden]; a 1-d [hidden] in GGUFs whose converter squeezed it)
  ["mlp.shared_expert.gate_proj", "ffn_gate_shexp"],
  ["mlp.shared_expert.up_proj", "ffn_up_shexp"],
  ["mlp.shared_expert.down_proj", "ffn_down_shexp"],
  ["mlp.shared_expert_gate", "ffn_gate_inp_shexp"],
];
/** Gemma's and OLMo 2's norms on the attention's and the MLP's outputs, and Gemma's MLP input norm. */
const OUTPUT_NORM_NAMES: [string, string][] = [
  ["post_attention_layernorm", "post_attention_norm"],
  ["post_feedforward_layernorm", "post_ffw_norm"],
];
const GEMMA3_LAYER_NAMES: [string, string][] = [...OUTPUT_NORM_NAMES, ["pre_feedforward_layernorm", "ffn_norm"]];
/** Phi-3's fused projections, stored fused in GGUF too (phi3's ffn_up holds gate and up, gate first). */
const PHI3_LAYER_NAMES: [string, string][] = [
  ["self_attn.qkv_proj", "attn_qkv"],
  ["mlp.gate_up_proj", "ffn_up"],
];
/**
 * gpt-oss: the MoE's input norm is llama.cpp's attn_post_norm, the router (biased) ffn_gate_inp, and each head's sink
 * logit `attn_sinks.weight` (HF's `self_attn.sinks` has no suffix: see hfToGgufTensorName).
 */
const GPT_OSS_LAYER_NAMES: [string, string][] = [
  ["post_attention_layernorm", "post_attention_norm"],
  ["mlp.router", "ffn_gate_inp"],
];
/**
 * Families whose GGUF tensor names differ: Mixtral's expert names, Gemma's (2 and 3: the same names) and OLMo 2's norms,
 * Phi-3's fusions, gpt-oss's norm, router and sinks. Gemma 1 ("gemma1") has Llama's names, its norms stored as 1 + w.
 */
export type GgufFamily = "mixtral" | "gemma" | "gemma1" | "olmo2" | "phi3" | "gptoss" | "default";
const layerNames = (family: GgufFamily): [string, string][] =>
  family === "gemma" ? [...GEMMA3_LAYER_NAMES, ...LAYER_NAMES]
  : family === "olmo2" ? [...OUTPUT_NORM_NAMES, ...LAYER_NAMES]
  : family === "phi3" ? [...PHI3_LAYER_NAMES, ...LAYER_NAMES]
  : family === "gptoss" ? [...GPT_OSS_LAYER_NAMES, ...LAYER_NAMES]
  : LAYER_NAMES;

/** The tensor-name family of an HF architecture. */
export function ggufFamilyOf(architecture: string): GgufFamily {
  const families: Record<string, GgufFamily> = {
    MixtralForCausalLM: "mixtral", GemmaForCausalLM: "gemma1", Gemma2ForCausalLM: "gemma", Gemma3ForCausalLM: "gemma", Olmo2ForCausalLM: "olmo2", Phi3ForCausalLM: "phi3",
    GptOssForCausalLM: "gptoss",
  };
  return families[architecture] ?? "default";
}

/** Phi-3's longrope factor sets, which llama.cpp reads as tensors (one divisor per rotary frequency). */
export const GGUF_ROPE_FACTORS = { long: "rope_factors_long.weight", short: "rope_factors_short.weight" } as const;

/** llama3 rope scaling as llama.cpp's converter writes it: one divisor per rotary frequency (llama3RopeFreqs). */
export const GGUF_ROPE_FREQS = "rope_freqs.weight";
/** The GGUF architectures whose llama.cpp graphs read GGUF_ROPE_FREQS (others refuse a file that has it). */
const ROPE_FREQS_ARCHS: ReadonlySet<string> = new Set(["llama", "granite"]);

/**
 * What llama.cpp's converter adds to a norm weight (Gemma's (1 + w) norms are stored as 1 + w), so a reader
 * subtracts it.
 */
export function ggufNormShift(family: GgufFamily, hfName: string): number {
  return (family === "gemma" || family === "gemma1") && hfName.endsWith("norm.weight") ? 1 : 0;
}

/** Expert weights: GGUF stacks all experts of a layer into one 3-D tensor [n_expert, out, in]. */
const EXPERT_NAMES: [RegExp, string][] = [
  [/^mlp\.experts\.(\d+)\.gate_proj$/, "ffn_gate_exps"],
  [/^mlp\.experts\.(\d+)\.up_proj$/, "ffn_up_exps"],
  [/^mlp\.experts\.(\d+)\.down_proj$/, "ffn_down_exps"],
  [/^block_sparse_moe\.experts\.(\d+)\.w1$/, "ffn_gate_exps"],
  [/^block_sparse_moe\.experts\.(\d+)\.w3$/, "ffn_up_exps"],
  [/^block_sparse_moe\.experts\.(\d+)\.w2$/, "ffn_down_exps"],
];

export interface GgufNameMapping {
  name: string;
  /** Set for a per-expert HF tensor: its index in the stacked GGUF tensor. */
  expert?: number;
}

/** HF tensor name -> GGUF name (null if it has no GGUF counterpart, e.g. rotary inv_freq). */
export function hfToGgufTensorName(hf: string, family: GgufFamily = "default"): GgufNameMapping | null {
  for (const [h, g] of GLOBAL_NAMES) if (hf === h) return { name: g };
  const sinks = /^model\.layers\.(\d+)\.self_attn\.sinks$/.exec(hf);
  if (sinks && family === "gptoss") return { name: `blk.${sinks[1]}.attn_sinks.weight` };
  const m = /^model\.layers\.(\d+)\.(.+)\.(weight|bias)$/.exec(hf);
  if (!m) return null;
  const [, layer, body, kind] = m;
  for (const [h, g] of layerNames(family)) if (body === h) return { name: `blk.${layer}.${g}.${kind}` };
  for (const [re, g] of EXPERT_NAMES) {
    const e = re.exec(body!);
    if (e) return { name: `blk.${layer}.${g}.${kind}`, expert: Number(e[1]) };
  }
  return null;
}

/**
 * GGUF tensor name -> HF name. For stacked expert tensors the result contains `{expert}` to be
 * substituted per expert (family decides Mixtral's w1/w2/w3 vs Qwen3-MoE's gate/up/down_proj).
 */
export function ggufToHfTensorName(name: string, family: GgufFamily = "default"): string | null {
  for (const [h, g] of GLOBAL_NAMES) if (name === g) return h;
  const m = /^blk\.(\d+)\.(.+)\.(weight|bias)$/.exec(name);
  if (!m) return null;
  const [, layer, body, kind] = m;
  if (family === "gptoss" && body === "attn_sinks" && kind === "weight") return `model.layers.${layer}.self_attn.sinks`;
  if (body === "ffn_gate_inp") return `model.layers.${layer}.${family === "mixtral" ? "block_sparse_moe.gate" : family === "gptoss" ? "mlp.router" : "mlp.gate"}.${kind}`;
  for (const [h, g] of layerNames(family)) if (body === g) return `model.layers.${layer}.${h}.${kind}`;
  const experts: Record<string, [string, string]> = {
    ffn_gate_exps: ["block_sparse_moe.experts.{expert}.w1", "mlp.experts.{expert}.gate_proj"],
    ffn_up_exps: ["block_sparse_moe.experts.{expert}.w3", "mlp.experts.{expert}.up_proj"],
    ffn_down_exps: ["block_sparse_moe.experts.{expert}.w2", "mlp.experts.{expert}.down_proj"],
  };
  const e = experts[body!];
  if (e) return `model.layers.${layer}.${family === "mixtral" ? e[0] : e[1]}.${kind}`;
  return null;
}

// ---------------------------------------------------------------- Q/K permutation

type RowArray = Float32Array | Uint16Array | Uint8Array | Int8Array | Float64Array | Int32Array | Uint32Array;

function permuteRows<T extends RowArray>(w: T, rows: number, nHead: number, nHeadKv: number | undefined, inverse: boolean): T {
  const heads = nHeadKv !== undefined && nHeadKv !== nHead ? nHeadKv : nHead;
  if (rows % (heads * 2) !== 0 || w.length % rows !== 0) {
    throw new ModelFormatError(`[permuteQK] ${rows} rows (${w.length} elements) do not split into ${heads} heads of an even size`);
  }
  const cols = w.length / rows;
  const half = rows / heads / 2;
  const out = new (w.constructor as new (n: number) => T)(w.length);
  // convert_hf_to_gguf: reshape(heads, 2, half, cols).swapaxes(1, 2): new row (h, i, t) <- old row (h, t, i)
  for (let h = 0; h < heads; h++) {
    for (let i = 0; i < half; i++) {
      for (let t = 0; t < 2; t++) {
        const hfRow = h * 2 * half + t * half + i;
        const ggRow = h * 2 * half + i * 2 + t;
        const [dst, src] = inverse ? [hfRow, ggRow] : [ggRow, hfRow];
        out.set(w.subarray(src * cols, (src + 1) * cols), dst * cols);
      }
    }
  }
  return out;
}

/**
 * llama.cpp's `permute(weights, n_head, n_head_kv)` for llama-arch q_proj/k_proj (rows = output
 * features; works on any element type, or on raw rows of quantized blocks). For k_proj pass
 * nHeadKv. Interleaves the two rotary halves of each head: HF rotate-half -> GGUF adjacent pairs.
 */
export function permuteQK<T extends RowArray>(w: T, rows: number, nHead: number, nHeadKv?: number): T {
  return permuteRows(w, rows, nHead, nHeadKv, false);
}

/** Inverse of permuteQK (GGUF -> HF). */
export function unpermuteQK<T extends RowArray>(w: T, rows: number, nHead: number, nHeadKv?: number): T {
  return permuteRows(w, rows, nHead, nHeadKv, true);
}

// ---------------------------------------------------------------- config <-> metadata

const ARCH_TO_GGUF: Record<string, string> = {
  LlamaForCausalLM: "llama", MistralForCausalLM: "llama", MixtralForCausalLM: "llama",
  Qwen2ForCausalLM: "qwen2", Qwen2MoeForCausalLM: "qwen2moe", Qwen3ForCausalLM: "qwen3", Qwen3MoeForCausalLM: "qwen3moe",
  GemmaForCausalLM: "gemma", Gemma2ForCausalLM: "gemma2", Gemma3ForCausalLM: "gemma3",
  GraniteForCausalLM: "granite", Olmo2ForCausalLM: "olmo2", Phi3ForCausalLM: "phi3", GptOssForCausalLM: "gpt-oss",
  SmolLM3ForCausalLM: "smollm3",
};
const GGUF_TO_HF: Record<string, [string, string]> = {
  llama: ["LlamaForCausalLM", "llama"], qwen2: ["Qwen2ForCausalLM", "qwen2"], qwen3: ["Qwen3ForCausalLM", "qwen3"],
  qwen2moe: ["Qwen2MoeForCausalLM", "qwen2_moe"], qwen3moe: ["Qwen3MoeForCausalLM", "qwen3_moe"], gemma: ["GemmaForCausalLM", "gemma"], gemma2: ["Gemma2ForCausalLM", "gemma2"], gemma3: ["Gemma3ForCausalLM", "gemma3_text"], granite: ["GraniteForCausalLM", "granite"],
  olmo2: ["Olmo2ForCausalLM", "olmo2"], phi3: ["Phi3ForCausalLM", "phi3"], "gpt-oss": ["GptOssForCausalLM", "gpt_oss"],
  smollm3: ["SmolLM3ForCausalLM", "smollm3"],
};

/**
 * The attention scalar llama.cpp's gemma2 / gemma3 assume rather than read: head_dim, except in the 27B models (46
 * layers for Gemma 2, 62 for Gemma 3), hidden / heads. (The scale is scalar ** -0.5.)
 */
function gemmaAttnScalar(version: 2 | 3, layers: number, hidden: number, heads: number, headDim: number): number {
  return layers === (version === 2 ? 46 : 62) ? hidden / heads : headDim;
}

/**
 * Refuses a Gemma export whose config says otherwise than llama.cpp assumes (a reader would get another model):
 * Gemma 3, every 6th layer global and the others sliding with rotary base 10000; Gemma 2, the even layers sliding and
 * the odd ones global, both soft-caps applied (absent keys read as 50 and 30: a null cannot be written); both, the
 * attention scalar above.
 */
function checkGemmaExportable(version: 2 | 3, cfg: ModelConfig): void {
  const fail = (what: string): never => {
    throw new ModelFormatError(`[gguf] this Gemma ${version} config cannot be written as gemma${version} GGUF: ${what} (llama.cpp's gemma${version} assumes it)`);
  };
  const want = gemmaAttnScalar(version, cfg.numHiddenLayers, cfg.hiddenSize, cfg.numAttentionHeads, cfg.headDim);
  if (Math.abs(cfg.attnScale - 1 / Math.sqrt(want)) > 1e-9) fail(`query_pre_attn_scalar must be ${want}`);
  if (version === 3) {
    if (cfg.slidingWindow !== null && cfg.slidingWindowLayers.some((s, i) => s !== ((i + 1) % 6 !== 0))) fail("every 6th layer must be global, the others sliding");
    if (cfg.localRopeTheta !== 10000) fail("rope_local_base_freq must be 10000");
    return;
  }
  if (cfg.slidingWindow === null) fail("sliding_window must be set");
  if (cfg.slidingWindowLayers.some((s, i) => s !== (i % 2 === 0))) fail("layer_types must alternate sliding (even layers) and full (odd layers)");
  if (cfg.attnSoftcap === null) fail("attn_logit_softcapping must be set");
  if (cfg.finalSoftcap === null) fail("final_logit_softcapping must be set");
  if (cfg.ropeScaling !== null) fail("rope_scaling must be absent");
}

/** Granite's multipliers: HF config key <-> GGUF key (after `granite.`), as llama.cpp's converter writes them. */
const GRANITE_SCALES: [string, string][] = [
  ["embedding_multiplier", "embedding_scale"], ["residual_multiplier", "residual_scale"],
  ["attention_multiplier", "attention.scale"], ["logits_scaling", "logit_scale"],
];

/** Whether an HF architecture has a GGUF one. */
export function hasGgufArchitecture(architecture: string): boolean {
  return Object.hasOwn(ARCH_TO_GGUF, architecture);
}

/**
 * Does llama.cpp permute q/k rows for this GGUF architecture? (llama, granite and smollm3, whose converters are
 * Llama's, yes; qwen2/qwen3 use NEOX rope, no)
 */
export function ggufArchPermutesQK(ggufArch: string): boolean {
  return ggufArch === "llama" || ggufArch === "granite" || ggufArch === "smollm3";
}

/**
 * Refuses a SmolLM3 export llama.cpp would run otherwise: its smollm3 takes every 4th layer as NoPE (no key says
 * which) and has no sliding window.
 */
function checkSmolLm3Exportable(cfg: ModelConfig): void {
  const fail = (what: string): never => {
    throw new ModelFormatError(`[gguf] this SmolLM3 config cannot be written as smollm3 GGUF: ${what} (llama.cpp's smollm3 assumes it)`);
  };
  if (cfg.ropeLayers.some((rope, i) => rope !== ((i + 1) % 4 !== 0))) fail("no_rope_layers must make every 4th layer NoPE (layers 3, 7, ...) and no other");
  if (cfg.slidingWindow !== null) fail("use_sliding_window must be false");
}

/**
 * Refuses a Gemma (1) export llama.cpp's gemma would run otherwise: it reads the token embedding as the output head
 * and attends without a window.
 */
function checkGemma1Exportable(cfg: ModelConfig): void {
  const fail = (what: string): never => {
    throw new ModelFormatError(`[gguf] this Gemma config cannot be written as gemma GGUF: ${what} (llama.cpp's gemma assumes it)`);
  };
  if (!cfg.tieWordEmbeddings) fail("tie_word_embeddings must be true");
  if (cfg.ropeScaling !== null) fail("rope_scaling must be absent");
}

/**
 * Qwen2-MoE's keys as llama.cpp's converter writes them (the expert and shared-expert sizes), refusing what its
 * qwen2moe cannot express: dense layers (it makes every layer sparse), renormalized top-k weights, no shared expert,
 * a sliding window.
 */
function qwen2MoeMetadata(cfg: ModelConfig): Record<string, GgufTypedValue> {
  const fail = (what: string): never => {
    throw new ModelFormatError(`[gguf] this Qwen2-MoE config cannot be written as qwen2moe GGUF: ${what} (llama.cpp's qwen2moe assumes it)`);
  };
  const moe = cfg.moe!;
  if (cfg.moeLayers.some((sparse) => !sparse)) fail("every layer must be sparse (decoder_sparse_step 1, no mlp_only_layers)");
  if (moe.normTopkProb) fail("norm_topk_prob must be false");
  if (moe.sharedExpertIntermediateSize === null) fail("shared_expert_intermediate_size must be positive");
  if (cfg.slidingWindow !== null) fail("use_sliding_window must be false");
  return {
    "qwen2moe.expert_feed_forward_length": gguf.u32(moe.moeIntermediateSize),
    "qwen2moe.expert_shared_feed_forward_length": gguf.u32(moe.sharedExpertIntermediateSize!),
  };
}

/**
 * The shape keys from the parsed config (a Gemma config leaves out what its class defaults give: head_dim 256 is no
 * hidden / heads).
 */
function parsedShapeMetadata(arch: string, cfg: ModelConfig): Record<string, GgufTypedValue> {
  return {
    [`${arch}.rope.freq_base`]: gguf.f32(cfg.ropeTheta), [`${arch}.attention.key_length`]: gguf.u32(cfg.headDim),
    [`${arch}.attention.value_length`]: gguf.u32(cfg.headDim), [`${arch}.rope.dimension_count`]: gguf.u32(cfg.headDim),
    [`${arch}.attention.head_count_kv`]: gguf.u32(cfg.numKeyValueHeads), [`${arch}.attention.layer_norm_rms_epsilon`]: gguf.f32(cfg.rmsNormEps),
    [`${arch}.context_length`]: gguf.u32(cfg.maxPositionEmbeddings), [`${arch}.vocab_size`]: gguf.u32(cfg.vocabSize),
    [`${arch}.embedding_length`]: gguf.u32(cfg.hiddenSize), [`${arch}.block_count`]: gguf.u32(cfg.numHiddenLayers),
    [`${arch}.feed_forward_length`]: gguf.u32(cfg.intermediateSize), [`${arch}.attention.head_count`]: gguf.u32(cfg.numAttentionHeads),
  };
}

/**
 * HF config.json -> GGUF `general.*` and `<arch>.*` metadata, typed as llama.cpp expects.
 * llama3 rope scaling is not metadata in GGUF: write `llama3RopeFreqs(config)` as `rope_freqs.weight`.
 */
export function hfConfigToGgufMetadata(config: Record<string, unknown>): Record<string, GgufTypedValue> {
  const archName = Array.isArray(config.architectures) ? String(config.architectures[0]) : "";
  const arch = ARCH_TO_GGUF[archName];
  if (!arch) throw new ModelFormatError(`[gguf] no GGUF architecture for "${archName}"`);
  const parsed = parseHfConfig(config);
  if (arch === "gemma2" || arch === "gemma3") checkGemmaExportable(arch === "gemma2" ? 2 : 3, parsed);
  if (arch === "smollm3") checkSmolLm3Exportable(parsed);
  if (arch === "gemma") checkGemma1Exportable(parsed);
  if (parsed.ropeScaling?.type === "longrope" && arch !== "phi3") throw new ModelFormatError(`[gguf] ${archName} with longrope rope scaling has no GGUF form (llama.cpp reads longrope factors for phi3 only)`);
  if (parsed.ropeScaling?.type === "llama3" && !ROPE_FREQS_ARCHS.has(arch)) throw new ModelFormatError(`[gguf] ${archName} with llama3 rope scaling has no GGUF form (llama.cpp reads ${GGUF_ROPE_FREQS} for ${[...ROPE_FREQS_ARCHS].join(" and ")} only)`);
  if (parsed.ropeScaling?.type === "dynamic") throw new ModelFormatError(`[gguf] ${archName} with dynamic rope scaling has no GGUF form (llama.cpp has no dynamic NTK rope)`);
  const num = (k: string) => (typeof config[k] === "number" ? (config[k] as number) : undefined);
  const heads = num("num_attention_heads")!;
  const hidden = num("hidden_size")!;
  const headDim = num("head_dim") ?? hidden / heads;
  const md: Record<string, GgufTypedValue> = {
    "general.architecture": gguf.str(arch),
    [`${arch}.context_length`]: gguf.u32(num("max_position_embeddings") ?? 2048),
    [`${arch}.embedding_length`]: gguf.u32(hidden),
    [`${arch}.block_count`]: gguf.u32(num("num_hidden_layers")!),
    [`${arch}.feed_forward_length`]: gguf.u32(num("intermediate_size")!),
    [`${arch}.attention.head_count`]: gguf.u32(heads),
    [`${arch}.attention.head_count_kv`]: gguf.u32(num("num_key_value_heads") ?? heads),
    [`${arch}.rope.freq_base`]: gguf.f32(num("rope_theta") ?? 10000),
    [`${arch}.attention.layer_norm_rms_epsilon`]: gguf.f32(num("rms_norm_eps") ?? 1e-6),
    [`${arch}.attention.key_length`]: gguf.u32(headDim),
    [`${arch}.attention.value_length`]: gguf.u32(headDim),
    [`${arch}.rope.dimension_count`]: gguf.u32(parsed.rotaryDim),
  };
  if (num("vocab_size") !== undefined) md[`${arch}.vocab_size`] = gguf.u32(num("vocab_size")!);
  const experts = num("num_local_experts") ?? num("num_experts");
  if (experts) {
    md[`${arch}.expert_count`] = gguf.u32(experts);
    md[`${arch}.expert_used_count`] = gguf.u32(num("num_experts_per_tok") ?? 2);
    if (num("moe_intermediate_size") !== undefined) md[`${arch}.expert_feed_forward_length`] = gguf.u32(num("moe_intermediate_size")!);
    if (typeof config.norm_topk_prob === "boolean") md[`${arch}.expert_weights_norm`] = gguf.bool(config.norm_topk_prob);
  }
  const rs = config.rope_scaling as Record<string, unknown> | null | undefined;
  if (rs && typeof rs === "object") {
    const type = String(rs.rope_type ?? rs.type ?? "default");
    if (type === "linear" || type === "yarn") {
      md[`${arch}.rope.scaling.type`] = gguf.str(type);
      md[`${arch}.rope.scaling.factor`] = gguf.f32(Number(rs.factor));
      if (typeof rs.original_max_position_embeddings === "number") md[`${arch}.rope.scaling.original_context_length`] = gguf.u32(rs.original_max_position_embeddings);
      if (typeof rs.attention_factor === "number") md[`${arch}.rope.scaling.attn_factor`] = gguf.f32(rs.attention_factor);
    }
  }
  if (typeof config.sliding_window === "number" && (archName === "MistralForCausalLM" || arch === "gemma3")) md[`${arch}.attention.sliding_window`] = gguf.u32(config.sliding_window);
  if (arch === "phi3") Object.assign(md, phi3Metadata(parsed));
  if (arch === "gemma2") {
    // what a config leaves out as Gemma2Config's defaults (parseHfConfig's reading; checkGemmaExportable refused nulls)
    const cfg = parsed;
    md[`${arch}.attention.sliding_window`] = gguf.u32(cfg.slidingWindow!);
    md[`${arch}.attn_logit_softcapping`] = gguf.f32(cfg.attnSoftcap!);
    md[`${arch}.final_logit_softcapping`] = gguf.f32(cfg.finalSoftcap!);
    Object.assign(md, parsedShapeMetadata(arch, cfg));
  }
  if (arch === "gemma") Object.assign(md, parsedShapeMetadata(arch, parsed)); // (GemmaConfig's defaults filled in)
  if (arch === "qwen2moe") Object.assign(md, qwen2MoeMetadata(parsed));
  if (arch === "granite") for (const [hf, g] of GRANITE_SCALES) if (num(hf) !== undefined) md[`${arch}.${g}`] = gguf.f32(num(hf)!);
  if (arch === "gpt-oss") Object.assign(md, gptOssMetadata(parsed));
  return md;
}

/** What llama.cpp's gpt-oss hard-codes (llama-graph.cpp's LLM_FFN_SWIGLU_OAI_MOE) and its YaRN defaults. */
export const GPT_OSS_LLAMA_CPP = { swigluAlpha: 1.702, swigluLimit: 7, yarnBetaFast: 32, yarnBetaSlow: 1 } as const;

/**
 * gpt-oss's keys as llama.cpp's converter writes them, from the parsed config (GptOssConfig's defaults filled in): the
 * expert size (HF's intermediate_size) both as feed_forward_length and expert_feed_forward_length, the window, YaRN.
 * Refuses what llama.cpp's gpt-oss cannot express: a SwiGLU other than its alpha 1.702 / limit 7, layers other than
 * "even layers slide, odd ones attend fully", rope scaling other than YaRN with its default betas.
 * (llama.cpp rounds YaRN's correction range outward, HF's truncate: true; gpt-oss's own truncate: false is written as
 * it stands, since GGUF has no key for it: README's convert section says how far the two then differ.)
 */
function gptOssMetadata(cfg: ModelConfig): Record<string, GgufTypedValue> {
  const fail = (what: string): never => {
    throw new ModelFormatError(`[gguf] this gpt-oss config cannot be written as gpt-oss GGUF: ${what} (llama.cpp's gpt-oss assumes it)`);
  };
  const moe = cfg.moe!;
  const c = GPT_OSS_LLAMA_CPP;
  if (moe.clampedSwiglu?.alpha !== c.swigluAlpha || moe.clampedSwiglu.limit !== c.swigluLimit) fail(`swiglu_limit must be ${c.swigluLimit} and the SwiGLU alpha ${c.swigluAlpha}`);
  if (cfg.slidingWindow === null || cfg.slidingWindowLayers.some((s, i) => s !== (i % 2 === 0))) fail("layer_types must alternate sliding (even layers) and full (odd layers) attention");
  const rs = cfg.ropeScaling;
  if (rs !== null && rs.type !== "yarn") fail(`rope_scaling must be yarn or absent, not ${rs.type}`);
  if (rs?.type === "yarn" && (rs.betaFast !== c.yarnBetaFast || rs.betaSlow !== c.yarnBetaSlow || rs.attentionFactor !== null || rs.mscale !== null || rs.mscaleAllDim !== null))
    fail(`YaRN must keep beta_fast ${c.yarnBetaFast}, beta_slow ${c.yarnBetaSlow} and no attention_factor / mscale`);
  const a = "gpt-oss";
  const md: Record<string, GgufTypedValue> = {
    [`${a}.context_length`]: gguf.u32(cfg.maxPositionEmbeddings), [`${a}.embedding_length`]: gguf.u32(cfg.hiddenSize),
    [`${a}.block_count`]: gguf.u32(cfg.numHiddenLayers), [`${a}.feed_forward_length`]: gguf.u32(moe.moeIntermediateSize),
    [`${a}.expert_feed_forward_length`]: gguf.u32(moe.moeIntermediateSize), [`${a}.expert_count`]: gguf.u32(moe.numExperts),
    [`${a}.expert_used_count`]: gguf.u32(moe.numExpertsPerTok), [`${a}.attention.head_count`]: gguf.u32(cfg.numAttentionHeads),
    [`${a}.attention.head_count_kv`]: gguf.u32(cfg.numKeyValueHeads), [`${a}.attention.key_length`]: gguf.u32(cfg.headDim),
    [`${a}.attention.value_length`]: gguf.u32(cfg.headDim), [`${a}.rope.dimension_count`]: gguf.u32(cfg.headDim),
    [`${a}.rope.freq_base`]: gguf.f32(cfg.ropeTheta), [`${a}.attention.layer_norm_rms_epsilon`]: gguf.f32(cfg.rmsNormEps),
    [`${a}.attention.sliding_window`]: gguf.u32(cfg.slidingWindow!), [`${a}.vocab_size`]: gguf.u32(cfg.vocabSize),
  };
  if (rs?.type === "yarn") {
    md[`${a}.rope.scaling.type`] = gguf.str("yarn");
    md[`${a}.rope.scaling.factor`] = gguf.f32(rs.factor);
    md[`${a}.rope.scaling.original_context_length`] = gguf.u32(rs.originalMaxPositionEmbeddings);
  }
  return md;
}

/**
 * A gpt-oss GGUF's config as HF's GptOssConfig spells it: the layer pattern, SwiGLU and biases llama.cpp assumes, and
 * YaRN with gpt-oss's own truncate: false (the model as trained and as its HF directory runs; llama.cpp's differs).
 */
function gptOssHfConfig(cfg: Record<string, unknown>, get: (k: string) => number | undefined, need: (k: string) => number): void {
  const layers = cfg.num_hidden_layers as number;
  const rs = cfg.rope_scaling as Record<string, unknown> | undefined;
  if (rs !== undefined && rs.rope_type !== "yarn") throw new ModelFormatError(`[gguf] gpt-oss GGUF with rope scaling ${String(rs.rope_type)}: only yarn is read`);
  Object.assign(cfg, {
    num_local_experts: need("expert_count"), num_experts_per_tok: need("expert_used_count"), sliding_window: need("attention.sliding_window"),
    layer_types: Array.from({ length: layers }, (_, i) => (i % 2 === 0 ? "sliding_attention" : "full_attention")),
    attention_bias: true, swiglu_limit: GPT_OSS_LLAMA_CPP.swigluLimit,
    rope_scaling: rs?.rope_type === "yarn"
      ? {
        rope_type: "yarn", factor: rs.factor, beta_fast: get("rope.scaling.yarn_beta_fast") ?? GPT_OSS_LLAMA_CPP.yarnBetaFast,
        beta_slow: get("rope.scaling.yarn_beta_slow") ?? GPT_OSS_LLAMA_CPP.yarnBetaSlow, truncate: false,
        ...(rs.original_max_position_embeddings === undefined ? {} : { original_max_position_embeddings: rs.original_max_position_embeddings }),
      }
      : { rope_type: "default" }, // (absent, GptOssConfig's default YaRN would be read in)
  });
}

/**
 * Phi-3's keys as llama.cpp's converter writes them: its sliding window (0 for none) and, with longrope, the original
 * context and one cos/sin scale for both factor sets (a config whose two mscales differ cannot be written).
 */
function phi3Metadata(cfg: ModelConfig): Record<string, GgufTypedValue> {
  const md: Record<string, GgufTypedValue> = { "phi3.attention.sliding_window": gguf.u32(cfg.slidingWindow ?? 0) };
  const rs = cfg.ropeScaling;
  if (rs === null) return md;
  if (rs.type !== "longrope") throw new ModelFormatError(`[gguf] phi3 GGUF takes longrope rope scaling only, not ${rs.type}`);
  const orig = rs.originalMaxPositionEmbeddings;
  const scale = cfg.maxPositionEmbeddings / orig;
  const derived = scale <= 1 ? 1 : Math.sqrt(1 + Math.log(scale) / Math.log(orig));
  const [short, long] = [rs.shortMscale ?? derived, rs.longMscale ?? derived];
  if (short !== long) throw new ModelFormatError(`[gguf] this Phi-3 config cannot be written as phi3 GGUF: short_mscale ${short} and long_mscale ${long} differ (llama.cpp has one attn_factor)`);
  md["phi3.rope.scaling.original_context_length"] = gguf.u32(orig);
  md["phi3.rope.scaling.attn_factor"] = gguf.f32(long);
  return md;
}

/** llama3 rope scaling's GGUF_ROPE_FREQS tensor for a GGUF export (none without it). */
export function llama3RopeFreqTensors(config: Record<string, unknown>): { name: string; values: Float32Array }[] {
  return parseHfConfig(config).ropeScaling?.type === "llama3" ? [{ name: GGUF_ROPE_FREQS, values: llama3RopeFreqs(config) }] : [];
}

/** Phi-3's longrope factor tensors for a GGUF export (none without longrope). */
export function phi3RopeFactorTensors(config: Record<string, unknown>): { name: string; values: Float32Array }[] {
  const rs = parseHfConfig(config).ropeScaling;
  if (rs?.type !== "longrope") return [];
  return [{ name: GGUF_ROPE_FACTORS.long, values: Float32Array.from(rs.longFactor) }, { name: GGUF_ROPE_FACTORS.short, values: Float32Array.from(rs.shortFactor) }];
}

/**
 * GGUF metadata -> an HF-style config.json object (feed it to parseHfConfig). Pass the tensor names
 * to detect tied embeddings (no `output.weight`) and Qwen2 biases, and `vector` to read Phi-3's rope factor tensors.
 */
export function ggufToHfConfig(
  metadata: Readonly<Record<string, GgufValue>>, tensorNames?: readonly string[], vector?: (name: string) => Float32Array,
): Record<string, unknown> {
  const arch = metadata["general.architecture"];
  if (typeof arch !== "string" || !GGUF_TO_HF[arch]) throw new ModelFormatError(`[gguf] unsupported general.architecture ${JSON.stringify(arch)}`);
  const get = (k: string): number | undefined => {
    const v = metadata[`${arch}.${k}`];
    return typeof v === "number" ? v : typeof v === "bigint" ? Number(v) : undefined;
  };
  const need = (k: string): number => {
    const v = get(k);
    if (v === undefined) throw new ModelFormatError(`[gguf] missing metadata key "${arch}.${k}"`);
    return v;
  };
  let [architecture, modelType] = GGUF_TO_HF[arch]!;
  const heads = need("attention.head_count");
  const hidden = need("embedding_length");
  const experts = get("expert_count") ?? 0;
  if (arch === "llama" && experts > 0) [architecture, modelType] = ["MixtralForCausalLM", "mixtral"];
  const tokens = metadata["tokenizer.ggml.tokens"];
  const cfg: Record<string, unknown> = {
    architectures: [architecture],
    model_type: modelType,
    vocab_size: get("vocab_size") ?? (Array.isArray(tokens) ? tokens.length : undefined),
    hidden_size: hidden,
    intermediate_size: arch === "gpt-oss" ? (get("expert_feed_forward_length") ?? need("feed_forward_length")) : need("feed_forward_length"),
    num_hidden_layers: need("block_count"),
    num_attention_heads: heads,
    num_key_value_heads: get("attention.head_count_kv") ?? heads,
    head_dim: get("attention.key_length") ?? hidden / heads,
    max_position_embeddings: get("context_length") ?? 2048,
    rms_norm_eps: get("attention.layer_norm_rms_epsilon") ?? 1e-6,
    rope_theta: get("rope.freq_base") ?? 10000,
    hidden_act: "silu",
  };
  if (tensorNames) cfg.tie_word_embeddings = !tensorNames.includes("output.weight");
  if (experts > 0 && arch !== "gpt-oss") {
    if (arch === "llama") cfg.num_local_experts = experts;
    else cfg.num_experts = experts;
    cfg.num_experts_per_tok = get("expert_used_count") ?? 2;
    if (get("expert_feed_forward_length") !== undefined) cfg.moe_intermediate_size = get("expert_feed_forward_length");
    else if (arch === "qwen2moe") cfg.moe_intermediate_size = Math.floor((cfg.intermediate_size as number) / (cfg.num_experts_per_tok as number)); // llama.cpp's fallback
    const norm = metadata[`${arch}.expert_weights_norm`];
    cfg.norm_topk_prob = typeof norm === "boolean" ? norm : arch === "qwen3moe";
  }
  const scalingType = metadata[`${arch}.rope.scaling.type`];
  if (scalingType === "linear" || scalingType === "yarn") {
    const rs: Record<string, unknown> = { rope_type: scalingType, factor: get("rope.scaling.factor") ?? 1 };
    if (get("rope.scaling.original_context_length") !== undefined) rs.original_max_position_embeddings = get("rope.scaling.original_context_length");
    if (get("rope.scaling.attn_factor") !== undefined) rs.attention_factor = get("rope.scaling.attn_factor");
    cfg.rope_scaling = rs;
  }
  if (get("attention.sliding_window") !== undefined) cfg.sliding_window = get("attention.sliding_window");
  if (ROPE_FREQS_ARCHS.has(arch) && tensorNames?.includes(GGUF_ROPE_FREQS) && vector !== undefined) {
    // llama.cpp divides each rotary frequency by its rope_freqs entry: longrope's one-set form with no cos/sin scale
    if (cfg.rope_scaling !== undefined) throw new ModelFormatError(`[gguf] ${arch} GGUF with both ${GGUF_ROPE_FREQS} and rope.scaling.type ${String(scalingType)}: only one is read`);
    const divisors = [...vector(GGUF_ROPE_FREQS)];
    const orig = cfg.max_position_embeddings;
    cfg.rope_scaling = { rope_type: "longrope", short_factor: divisors, long_factor: divisors, original_max_position_embeddings: orig, short_mscale: 1, long_mscale: 1 };
  }
  if (arch === "granite") for (const [hf, g] of GRANITE_SCALES) if (get(g) !== undefined) cfg[hf] = get(g);
  if (arch === "gpt-oss") gptOssHfConfig(cfg, get, need);
  if (arch === "phi3") {
    const rotary = get("rope.dimension_count");
    if (rotary !== undefined && rotary !== cfg.head_dim) cfg.partial_rotary_factor = rotary / (cfg.head_dim as number);
    if (!cfg.sliding_window) delete cfg.sliding_window; // 0: none
    if (tensorNames?.includes(GGUF_ROPE_FACTORS.long) && vector !== undefined) {
      const mscale = get("rope.scaling.attn_factor");
      cfg.rope_scaling = {
        rope_type: "longrope", long_factor: [...vector(GGUF_ROPE_FACTORS.long)], short_factor: [...vector(GGUF_ROPE_FACTORS.short)],
        original_max_position_embeddings: need("rope.scaling.original_context_length"),
        ...(mscale === undefined ? {} : { short_mscale: mscale, long_mscale: mscale }),
      };
    }
  }
  if (arch === "gemma2") {
    // llama.cpp's defaults for absent keys (a window of 4096, soft-caps 50 and 30) and its fixed layer pattern
    const layers = cfg.num_hidden_layers as number;
    Object.assign(cfg, {
      hidden_activation: "gelu_pytorch_tanh", sliding_window: get("attention.sliding_window") ?? 4096,
      layer_types: Array.from({ length: layers }, (_, i) => (i % 2 === 0 ? "sliding_attention" : "full_attention")),
      attn_logit_softcapping: get("attn_logit_softcapping") ?? 50, final_logit_softcapping: get("final_logit_softcapping") ?? 30,
      query_pre_attn_scalar: gemmaAttnScalar(2, layers, hidden, heads, cfg.head_dim as number),
    });
  }
  if (arch === "qwen2moe") {
    // llama.cpp's qwen2moe: every layer sparse with a shared expert (its size feed_forward_length when not given),
    // top-k weights as the softmax left them, q/k/v biases where the file has them
    Object.assign(cfg, {
      shared_expert_intermediate_size: get("expert_shared_feed_forward_length") ?? cfg.intermediate_size, decoder_sparse_step: 1,
      mlp_only_layers: [], norm_topk_prob: false, qkv_bias: tensorNames === undefined || tensorNames.includes("blk.0.attn_q.bias"),
    });
  }
  // llama.cpp's gemma: the token embedding is the output head
  if (arch === "gemma") Object.assign(cfg, { hidden_activation: "gelu_pytorch_tanh", tie_word_embeddings: true });
  if (arch === "gemma3") {
    const layers = cfg.num_hidden_layers as number;
    Object.assign(cfg, { hidden_activation: "gelu_pytorch_tanh", sliding_window_pattern: 6, rope_local_base_freq: 10000, query_pre_attn_scalar: gemmaAttnScalar(3, layers, hidden, heads, cfg.head_dim as number) });
  }
  const bos = metadata["tokenizer.ggml.bos_token_id"];
  const eos = metadata["tokenizer.ggml.eos_token_id"];
  if (typeof bos === "number") cfg.bos_token_id = bos;
  if (typeof eos === "number") cfg.eos_token_id = eos;
  return cfg;
}

/**
 * The `rope_freqs.weight` tensor convert_hf_to_gguf writes for llama3 rope scaling: per rotary
 * frequency pair, the divisor applied to the base frequency (length head_dim / 2).
 */
export function llama3RopeFreqs(config: Record<string, unknown>): Float32Array {
  const rs = config.rope_scaling as Record<string, number>;
  const base = (config.rope_theta as number) ?? 10000;
  const dim = (config.head_dim as number) ?? (config.hidden_size as number) / (config.num_attention_heads as number);
  const factor = rs.factor ?? 8, low = rs.low_freq_factor ?? 1, high = rs.high_freq_factor ?? 4;
  const oldLen = rs.original_max_position_embeddings ?? 8192;
  const lowWavelen = oldLen / low, highWavelen = oldLen / high;
  const out = new Float32Array(dim / 2);
  for (let i = 0; i < dim / 2; i++) {
    const freq = 1 / base ** ((2 * i) / dim);
    const wavelen = (2 * Math.PI) / freq;
    if (wavelen < highWavelen) out[i] = 1;
    else if (wavelen > lowWavelen) out[i] = factor;
    else {
      const smooth = (oldLen / wavelen - low) / (high - low);
      out[i] = 1 / ((1 - smooth) / factor + smooth);
    }
  }
  return out;
}

export { GgufValueType };
