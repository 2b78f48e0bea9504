// EAGLE draft heads (vLLM's speculative methods "eagle" and "eagle3", SafeAILab's EAGLE checkpoints): small decoders
// that read the served (target) model's hidden states and propose its next tokens.
//
// EAGLE-1 (vLLM's llama_eagle.py): the head's input at position p is token p + 1's embedding (the target's
// embed_tokens) and the target's final (normed) hidden state at p, x = fc([embed, hidden]) (2H -> H, optional bias),
// then Llama decoder layers (the first without input_layernorm); its output, the residual stream with no final norm,
// goes through the target's LM head (proposing token p + 2) and is fed back as the next position's hidden state.
// Checkpoint names: fc.weight (fc.bias), layers.{i}.*; embed_tokens, when present, is not read (the target's is).
//
// EAGLE-3 (llama_eagle3.py): the target's hidden states are three of its residual streams (entering aux layers, by
// default 2, L/2 and L-3), fc (3 x target hidden -> H) makes them one; one decoder layer ("midlayer") whose attention
// reads [input_layernorm(embed), hidden_norm(hidden)] (2H) with the hidden state as residual, then its own final norm
// and LM head over a draft vocabulary; d2t[d] maps draft token d to target token d + d2t[d]. The pre-norm residual
// stream is fed back. Checkpoint names: fc.weight, midlayer.*, norm.weight, lm_head.weight, d2t (t2d is unused).
import * as fs from "node:fs";
import * as path from "node:path";
import { Attention, Embedding, GatedMLP, Linear, Module, RMSNorm, RotaryEmbedding, type LayerOptions, type PagedContext } from "../nn/index.js";
import { add, cat, tensor, type DeviceLike, type Tensor } from "../tensor/index.js";
import type { DType } from "../backends/dtype.js";
import { DecoderLayer, DEFAULT_FAMILY, type CausalLM } from "./causal-lm.js";
import { parseHfConfig, type ModelConfig } from "./hf-config.js";
import { readSafetensors, type SafetensorsHandle } from "./formats/safetensors.js";
import { mapOrRead, paramDtype } from "./loader.js";

export type EagleMethod = "eagle" | "eagle3";

/** A head that cannot serve this target (wrong sizes, a checkpoint missing tensors, a config it cannot read). */
export class EagleHeadError extends Error {
  override name = "EagleHeadError";
}

export interface EagleHeadConfig {
  method: EagleMethod;
  /** The decoder layers' config (the head's config.json read as a Llama model's). */
  layer: ModelConfig;
  /** EAGLE-3: the target hidden size fc reads three of (target_hidden_size, default the head's). */
  targetHiddenSize: number;
  /** EAGLE-3: the LM head's vocabulary (draft_vocab_size, default vocab_size). */
  draftVocabSize: number;
  /** EAGLE-3: the target's residual streams read (vLLM's eagle_aux_hidden_state_layer_ids, entering layer i), ascending. */
  auxLayers: readonly number[];
  /** EAGLE-3's norm_before_residual: the residual is the hidden_norm'd hidden state. */
  normBeforeResidual: boolean;
}

type Json = Record<string, unknown>;

/** vLLM's default EAGLE-3 aux layers for a target of `L` layers. */
export function defaultAuxLayers(L: number): number[] {
  return [2, Math.floor(L / 2), L - 3];
}

/** Reads a head's config.json and checks it against the target's config. */
export function parseEagleHeadConfig(json: Json, method: EagleMethod, target: ModelConfig): EagleHeadConfig {
  const fail = (m: string): never => {
    throw new EagleHeadError(m);
  };
  const lm = { ...json, architectures: ["LlamaForCausalLM"], vocab_size: json.vocab_size ?? target.vocabSize };
  let layer: ModelConfig;
  try {
    layer = parseHfConfig(lm);
  } catch (e) {
    return fail(`config.json: ${(e as Error).message}`);
  }
  const H = layer.hiddenSize;
  if (layer.vocabSize !== target.vocabSize) fail(`its vocabulary has ${layer.vocabSize} tokens, the served model's ${target.vocabSize}`);
  if (method === "eagle") {
    if (H !== target.hiddenSize) fail(`its hidden size is ${H}, the served model's ${target.hiddenSize} (an EAGLE head reads the served model's hidden states and embeddings)`);
    return { method, layer, targetHiddenSize: H, draftVocabSize: layer.vocabSize, auxLayers: [], normBeforeResidual: false };
  }
  if (layer.numHiddenLayers !== 1) fail(`an EAGLE-3 head has one decoder layer, this one ${layer.numHiddenLayers}`);
  const targetHiddenSize = typeof json.target_hidden_size === "number" ? json.target_hidden_size : H;
  if (targetHiddenSize !== target.hiddenSize) fail(`it reads hidden states of size ${targetHiddenSize}, the served model's are ${target.hiddenSize}`);
  const draftVocabSize = typeof json.draft_vocab_size === "number" ? json.draft_vocab_size : layer.vocabSize;
  if (!Number.isInteger(draftVocabSize) || draftVocabSize < 1 || draftVocabSize > target.vocabSize)
    fail(`draft_vocab_size ${draftVocabSize} must be in [1, ${target.vocabSize}] (the served model's vocabulary)`);
  const L = target.numHiddenLayers;
  const nested = (json.eagle_config as Json | undefined)?.eagle_aux_hidden_state_layer_ids;
  const given = json.eagle_aux_hidden_state_layer_ids ?? nested;
  const aux = given === undefined ? defaultAuxLayers(L) : given;
  if (!Array.isArray(aux) || aux.length !== 3 || aux.some((i) => !Number.isInteger(i) || (i as number) < 0 || (i as number) >= L) || new Set(aux).size !== 3)
    fail(`aux hidden state layers ${JSON.stringify(aux)} must be 3 distinct layers of the served model's ${L}${given === undefined ? " (the default 2, L/2, L-3; set eagle_aux_hidden_state_layer_ids)" : ""}`);
  return { method, layer, targetHiddenSize, draftVocabSize, auxLayers: [...(aux as number[])].sort((a, b) => a - b), normBeforeResidual: json.norm_before_residual === true };
}

/** EAGLE-3's decoder layer: attention over [embedding, hidden] (2H), the hidden state as the residual. */
class Eagle3Layer extends Module {
  readonly inputLayernorm: RMSNorm;
  readonly hiddenNorm: RMSNorm;
  readonly selfAttn: Attention;
  readonly postAttentionLayernorm: RMSNorm;
  readonly mlp: GatedMLP;

  constructor(cfg: ModelConfig, rotary: RotaryEmbedding, options: LayerOptions, readonly normBeforeResidual: boolean) {
    super();
    const norm = (name: string) => this.module(name, new RMSNorm(cfg.hiddenSize, cfg.rmsNormEps, options));
    this.inputLayernorm = norm("input_layernorm");
    this.hiddenNorm = norm("hidden_norm");
    this.selfAttn = this.module("self_attn", new Attention(
      {
        hiddenSize: cfg.hiddenSize, inputSize: 2 * cfg.hiddenSize, numHeads: cfg.numAttentionHeads, numKvHeads: cfg.numKeyValueHeads, headDim: cfg.headDim,
        qkvBias: cfg.qkvBias, oBias: cfg.oBias, qkNorm: false, rmsNormEps: cfg.rmsNormEps, slidingWindow: null,
      },
      0, rotary, options,
    ));
    this.postAttentionLayernorm = norm("post_attention_layernorm");
    this.mlp = this.module("mlp", new GatedMLP(cfg.hiddenSize, cfg.intermediateSize, cfg.mlpBias, options, undefined, cfg.hiddenAct));
  }

  /** embeds, hidden [T, H] -> the residual stream [T, H] after the layer. */
  forward(embeds: Tensor, hidden: Tensor, ctx: PagedContext): Tensor {
    const e = this.inputLayernorm.forward(embeds);
    const hn = this.hiddenNorm.forward(hidden);
    const x = cat([e, hn], 1);
    const a = this.selfAttn.forward(x, ctx);
    const r = add(a, this.normBeforeResidual ? hn : hidden);
    for (const t of [e, hn, x, a]) t.dispose();
    const n = this.postAttentionLayernorm.forward(r);
    const m = this.mlp.forward(n);
    const out = add(r, m);
    for (const t of [r, n, m]) t.dispose();
    return out;
  }
}

/**
 * An EAGLE head over a loaded target model: `fc`, its decoder layer(s), and (EAGLE-3) its norm, LM head and d2t. The
 * embeddings (and EAGLE-1's LM head) are the target's, unless an EAGLE-3 checkpoint brings its own embed_tokens.
 */
export class EagleHead extends Module {
  readonly fc: Linear;
  readonly layers: DecoderLayer[] = [];
  readonly midlayer: Eagle3Layer | null = null;
  readonly norm: RMSNorm | null = null;
  readonly lmHead: Linear | null = null;
  readonly ownEmbed: Embedding | null = null;
  readonly rotary: RotaryEmbedding;
  /** EAGLE-3: target token of each draft token (d + d2t[d]), or null for a full vocabulary. */
  draftToTarget: Int32Array | null = null;

  constructor(
    readonly config: EagleHeadConfig,
    readonly target: CausalLM,
    options: LayerOptions & { fcBias?: boolean; ownEmbed?: boolean },
  ) {
    super();
    const c = config.layer;
    this.rotary = new RotaryEmbedding({ rotaryDim: c.rotaryDim, theta: c.ropeTheta, maxPositions: c.maxPositionEmbeddings, scaling: c.ropeScaling }, options.device);
    if (config.method === "eagle") {
      this.fc = this.module("fc", new Linear(2 * c.hiddenSize, c.hiddenSize, options.fcBias === true, options));
      const holder = this.module("layers", new Module());
      for (let i = 0; i < c.numHiddenLayers; i++) this.layers.push(holder.addModule(String(i), new DecoderLayer(c, i, this.rotary, DEFAULT_FAMILY, options, null, i === 0)));
    } else {
      this.fc = this.module("fc", new Linear(3 * config.targetHiddenSize, c.hiddenSize, options.fcBias === true, options));
      this.midlayer = this.module("midlayer", new Eagle3Layer(c, this.rotary, options, config.normBeforeResidual));
      this.norm = this.module("norm", new RMSNorm(c.hiddenSize, c.rmsNormEps, options));
      this.lmHead = this.module("lm_head", new Linear(c.hiddenSize, config.draftVocabSize, false, options));
      if (options.ownEmbed === true) this.ownEmbed = this.module("embed_tokens", new Embedding(c.vocabSize, c.hiddenSize, options));
    }
  }

  /** Decoder layers whose K/V the head caches. */
  get numLayers(): number {
    return this.config.method === "eagle" ? this.layers.length : 1;
  }

  /** Width of the target hidden states the head reads per position (EAGLE-3: three streams). */
  get targetRowSize(): number {
    return this.config.method === "eagle" ? this.config.layer.hiddenSize : 3 * this.config.targetHiddenSize;
  }

  get device() {
    return this.fc.weight.device;
  }

  /** Target hidden rows [T, targetRowSize] -> the head's hidden input [T, H]: EAGLE-3's fc, or (EAGLE-1) the rows themselves. */
  combine(targetRows: Tensor): Tensor {
    return this.config.method === "eagle3" ? this.fc.forward(targetRows) : targetRows;
  }

  /** Token ids [T] and hidden inputs [T, H] at ctx's positions -> the residual stream [T, H], fed back as the next hidden. */
  forward(ids: Tensor, hidden: Tensor, ctx: PagedContext): Tensor {
    const embeds = (this.ownEmbed ?? this.target.model.embedTokens).forward(ids);
    if (this.midlayer !== null) {
      const out = this.midlayer.forward(embeds, hidden, ctx);
      embeds.dispose();
      return out;
    }
    const x = cat([embeds, hidden], 1);
    embeds.dispose();
    let h = this.fc.forward(x);
    x.dispose();
    for (const layer of this.layers) {
      const next = layer.forward(h, ctx);
      h.dispose();
      h = next;
    }
    return h;
  }

  /** Logits [rows, draft vocabulary] of the residual stream h [rows, H]. */
  logits(h: Tensor): Tensor {
    if (this.norm === null) return this.target.logits(h); // EAGLE-1: the target's LM head, on the un-normed stream
    const n = this.norm.forward(h);
    const logits = this.lmHead!.forward(n);
    n.dispose();
    return logits;
  }

  /** Draft-vocabulary token ids -> target token ids (EAGLE-3's d2t), in place. */
  toTarget(ids: Int32Array): Int32Array {
    const d2t = this.draftToTarget;
    if (d2t !== null) for (let i = 0; i < ids.length; i++) ids[i] = ids[i]! + d2t[ids[i]!]!;
    return ids;
  }

  /** The greedy target token of each row of the residual stream h [rows, H]. */
  greedy(h: Tensor): Int32Array {
    const logits = this.logits(h);
    const am = logits.argmax(-1);
    logits.dispose();
    const ids = Int32Array.from(am.dataSync() as ArrayLike<number>);
    am.dispose();
    return this.toTarget(ids);
  }
}

/** Checkpoint name -> the head's parameter name (a "model." prefix dropped; vLLM's layers.0 for EAGLE-3's midlayer). */
function headName(name: string, method: EagleMethod): string {
  const n = name.startsWith("model.") ? name.slice("model.".length) : name;
  return method === "eagle3" && n.startsWith("layers.0.") ? `midlayer.${n.slice("layers.0.".length)}` : n;
}

/** The config.json of the EAGLE head in `dir`, checked against the target's config (EagleHeadError when it does not fit). */
export function readEagleHeadConfig(dir: string, method: EagleMethod, target: ModelConfig): EagleHeadConfig {
  const configPath = path.join(dir, "config.json");
  if (!fs.existsSync(configPath)) throw new EagleHeadError(`${dir}: no config.json`);
  let json: Json;
  try {
    json = JSON.parse(fs.readFileSync(configPath, "utf8")) as Json;
  } catch (e) {
    throw new EagleHeadError(`${configPath}: ${(e as Error).message}`);
  }
  return parseEagleHeadConfig(json, method, target);
}

/**
 * Loads the EAGLE head in `dir` (config.json and safetensors) for `target`, in the target's dtype. Throws
 * EagleHeadError when it does not fit the target or its checkpoint lacks tensors.
 */
export function loadEagleHead(dir: string, method: EagleMethod, target: CausalLM, dtype: DType, device?: DeviceLike): EagleHead {
  const config = readEagleHeadConfig(dir, method, target.config);
  let h: SafetensorsHandle;
  try {
    h = readSafetensors(dir);
  } catch (e) {
    throw new EagleHeadError((e as Error).message);
  }
  try {
    const byName = new Map(h.tensors.map((t) => [headName(t.name, method), t.name]));
    const head = new EagleHead(config, target, {
      dtype, device, unallocatedParameters: true, fcBias: byName.has("fc.bias"), ownEmbed: method === "eagle3" && byName.has("embed_tokens.weight"),
    });
    const names = head.namedParameters().map(([n]) => n);
    const missing = names.filter((n) => !byName.has(n));
    if (missing.length > 0) throw new EagleHeadError(`${dir}: checkpoint lacks ${missing.length} parameters, e.g. ${missing.slice(0, 4).join(", ")}`);
    for (const n of names) {
      const stored = byName.get(n)!;
      const want = head.namedParameters().find(([m]) => m === n)![1].shape;
      const got = h.get(stored)!.shape;
      if (got.length !== want.length || got.some((s, i) => s !== want[i])) throw new EagleHeadError(`${dir}: ${stored} has shape [${got.join(", ")}], the head needs [${want.join(", ")}]`);
      const d = paramDtype(n, dtype);
      const info = h.get(stored)!;
      const t = info.dtype === (d === "float32" ? "F32" : "BF16") ? mapOrRead(h, stored, d, want, device) : castFrom(h.loadAsFloat32(stored), want, d, device);
      head.setParameter(n, t);
    }
    if (method === "eagle3" && config.draftVocabSize < target.config.vocabSize) {
      const d2t = byName.get("d2t");
      if (d2t === undefined) throw new EagleHeadError(`${dir}: draft_vocab_size ${config.draftVocabSize} < the vocabulary's ${target.config.vocabSize} needs d2t (draft -> target token offsets)`);
      const off = h.loadAsFloat32(d2t);
      if (off.length !== config.draftVocabSize) throw new EagleHeadError(`${dir}: d2t has ${off.length} entries, draft_vocab_size is ${config.draftVocabSize}`);
      const map = Int32Array.from(off);
      for (let i = 0; i < map.length; i++) {
        const t = i + map[i]!;
        if (t < 0 || t >= target.config.vocabSize) throw new EagleHeadError(`${dir}: d2t maps draft token ${i} to ${t}, outside the vocabulary`);
      }
      head.draftToTarget = map;
    }
    return head;
  } finally {
    h.close();
  }
}

function castFrom(v: Float32Array, shape: readonly number[], dtype: DType, device?: DeviceLike): Tensor {
  const f = tensor(v, { shape: [...shape], device });
  if (dtype === "float32") return f;
  const out = f.to(dtype);
  f.dispose();
  return out;
}
