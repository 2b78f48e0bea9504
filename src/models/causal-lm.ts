// The decoder-only transformer shared by the Llama family (Llama, Mistral, Qwen2, Qwen3, Mixtral, Qwen2-MoE with its
// gated shared expert, Qwen3-MoE), Gemma 1, 2 and 3 (their differences come from the config: GELU-tanh MLP, (1 + w)
// norms, embeddings scaled by sqrt(hidden); Gemma 2 and 3's four norms per layer and own attention scale, Gemma 3's
// other rotary base on its sliding-window layers, Gemma 2's soft-capped attention scores and logits) and gpt-oss (attention sinks, biased router and
// experts with a clamped SwiGLU; its fused expert tensors are split on load: gpt-oss-experts.ts). Parameter names
// match Hugging Face's.
import {
  Attention, documentIds, documentPositions, Embedding, GatedMLP, Linear, MoE, Module, RMSNorm, RotaryEmbedding, TensorParallelError, divideForTp,
  type DenseContext, type ForwardContext, type LayerOptions, type TensorParallel,
} from "../nn/index.js";
import type { DType } from "../backends/dtype.js";
import {
  add, checkpoint, crossEntropy, disposeQuantizedActivations, indexCopyInto, isGradEnabled, linear, tensor, Tensor, type DeviceLike,
  type SacPolicy,
} from "../tensor/index.js";
import type { ModelConfig } from "./hf-config.js";

/** What a family changes in the shared decoder. */
export interface FamilySpec {
  /** Name of the MLP submodule of a sparse layer ("block_sparse_moe" for Mixtral, "mlp" for Qwen3-MoE). */
  moeModuleName: string;
  /** Expert projection names: [gate, up, down]. */
  expertNames: readonly [string, string, string];
  /** Name of the MoE router ("gate" when absent; gpt-oss: "router"). */
  routerName?: string;
}

export const DEFAULT_FAMILY: FamilySpec = { moeModuleName: "mlp", expertNames: ["gate_proj", "up_proj", "down_proj"] };

/** A decoder layer (exported for draft heads built from the same layers: eagle-head.ts). */
export class DecoderLayer extends Module {
  readonly selfAttn: Attention;
  readonly mlp: GatedMLP | MoE;
  // the norms on the attention's input and output and the MLP's (ModelConfig.normPlacement says which exist)
  readonly attnInNorm: RMSNorm | null;
  readonly attnOutNorm: RMSNorm | null;
  readonly mlpInNorm: RMSNorm | null;
  readonly mlpOutNorm: RMSNorm | null;
  /** Granite's residual_multiplier on both branches, or null. */
  readonly residualScale: number | null;

  /**
   * `rotary`: null for a layer without positions in its attention (SmolLM3's NoPE layers). `noInputNorm`: no
   * input_layernorm (an EAGLE head's first layer, whose input is already a projection of normed states).
   */
  constructor(
    cfg: ModelConfig, i: number, rotary: RotaryEmbedding | null, family: FamilySpec, options: LayerOptions, tp: TensorParallel | null, noInputNorm = false,
  ) {
    super();
    this.selfAttn = this.module(
      "self_attn",
      new Attention(
        {
          hiddenSize: cfg.hiddenSize,
          numHeads: cfg.numAttentionHeads,
          numKvHeads: cfg.numKeyValueHeads,
          headDim: cfg.headDim,
          qkvBias: cfg.qkvBias,
          oBias: cfg.oBias,
          qkNorm: cfg.qkNorm ? cfg.qkNormScope : false,
          rmsNormEps: cfg.rmsNormEps,
          slidingWindow: cfg.slidingWindowLayers[i] ? cfg.slidingWindow : null,
          scale: cfg.attnScale,
          normOffset: cfg.normOffset,
          softcap: cfg.attnSoftcap,
          sinks: cfg.attnSinks,
        },
        i,
        rotary,
        options,
        tp,
      ),
    );
    if (cfg.moe && cfg.moeLayers[i]) {
      if (tp !== null) throw new TensorParallelError(`${cfg.architecture}: mixture-of-experts layers are not supported with tensor parallelism`);
      this.mlp = this.module(
        family.moeModuleName,
        new MoE(
          {
            hidden: cfg.hiddenSize,
            expertIntermediate: cfg.moe.moeIntermediateSize,
            numExperts: cfg.moe.numExperts,
            topK: cfg.moe.numExpertsPerTok,
            normTopkProb: cfg.moe.normTopkProb,
            expertNames: family.expertNames,
            routerName: family.routerName,
            routerBias: cfg.moe.routerBias,
            expertBias: cfg.moe.expertBias,
            clampedSwiglu: cfg.moe.clampedSwiglu,
            sharedExpertIntermediate: cfg.moe.sharedExpertIntermediateSize,
          },
          options,
        ),
      );
    } else {
      this.mlp = this.module("mlp", new GatedMLP(cfg.hiddenSize, cfg.intermediateSize, cfg.mlpBias, options, undefined, cfg.hiddenAct, tp));
    }
    const norm = (name: string) => this.module(name, new RMSNorm(cfg.hiddenSize, cfg.rmsNormEps, options, cfg.normOffset));
    const p = cfg.normPlacement;
    this.attnInNorm = p === "post" || noInputNorm ? null : norm("input_layernorm");
    // HF's post_attention_layernorm is the MLP's input norm in Llama, the attention output's in Gemma 3 and OLMo 2
    const postAttention = norm("post_attention_layernorm");
    this.attnOutNorm = p === "pre" ? null : postAttention;
    this.mlpInNorm = p === "pre" ? postAttention : p === "sandwich" ? norm("pre_feedforward_layernorm") : null;
    this.mlpOutNorm = p === "pre" ? null : norm("post_feedforward_layernorm");
    this.residualScale = cfg.residualScale;
  }

  forward(h: Tensor, ctx: ForwardContext): Tensor {
    // each input norm also quantizes its rows once for quantized q/k/v (gate/up) projections, which then skip it
    const n1 = this.attnInNorm?.forwardFor(h, this.selfAttn.inputProjections) ?? { out: h, xq: null };
    let a = this.selfAttn.forward(n1.out, ctx, n1.xq);
    if (n1.out !== h) n1.out.dispose();
    if (n1.xq) disposeQuantizedActivations(n1.xq);
    if (this.attnOutNorm !== null) a = normed(this.attnOutNorm, a);
    if (this.residualScale !== null) a = scaled(a, this.residualScale);
    const h2 = add(h, a);
    a.dispose();
    let m: Tensor;
    if (this.mlp instanceof GatedMLP) {
      const n2 = this.mlpInNorm?.forwardFor(h2, this.mlp.inputProjections) ?? { out: h2, xq: null };
      m = this.mlp.forward(n2.out, n2.xq, ctx.kind === "paged" ? ctx.loraSlots : null);
      if (n2.out !== h2) n2.out.dispose();
      if (n2.xq) disposeQuantizedActivations(n2.xq);
    } else {
      const n2 = this.mlpInNorm?.forward(h2) ?? h2;
      m = this.mlp.forward(n2, ctx.kind === "paged" ? ctx.loraSlots : null);
      if (n2 !== h2) n2.dispose();
    }
    if (this.mlpOutNorm !== null) m = normed(this.mlpOutNorm, m);
    if (this.residualScale !== null) m = scaled(m, this.residualScale);
    const out = add(h2, m);
    h2.dispose();
    m.dispose();
    return out;
  }

  /** Whether forwardFused() can run this layer: norms before attention and the MLP only (Llama's), no residual scale. */
  get fusesResidualAdds(): boolean {
    return this.attnInNorm !== null && this.attnOutNorm === null && this.mlpInNorm !== null && this.mlpOutNorm === null && this.residualScale === null;
  }

  /**
   * forward() with each residual add fused into the norm after it (vLLM's fused_add_rms_norm; inference only, when
   * fusesResidualAdds): the layer's input is h + pending (pending: the previous layer's MLP output, not yet added;
   * null: h alone), and its own MLP output comes back unadded, for the next layer's input norm (or the final norm) to
   * add. Returns the input (h + pending, made here, or h itself), the residual stream after attention and the MLP's
   * output; the same values as forward(), bit for bit.
   */
  forwardFused(h: Tensor, pending: Tensor | null, ctx: ForwardContext): { input: Tensor; residual: Tensor; branch: Tensor } {
    const inNorm = this.attnInNorm!;
    const projections = this.selfAttn.inputProjections;
    const n1 = pending === null ? { sum: h, ...inNorm.forwardFor(h, projections) } : inNorm.addForwardFor(h, pending, projections);
    const a = this.selfAttn.forward(n1.out, ctx, n1.xq);
    n1.out.dispose();
    if (n1.xq) disposeQuantizedActivations(n1.xq);
    const gated = this.mlp instanceof GatedMLP ? this.mlp : null;
    const n2 = this.mlpInNorm!.addForwardFor(n1.sum, a, gated?.inputProjections ?? []);
    a.dispose();
    const slots = ctx.kind === "paged" ? ctx.loraSlots : null;
    const m = this.mlp instanceof GatedMLP ? this.mlp.forward(n2.out, n2.xq, slots) : this.mlp.forward(n2.out, slots);
    n2.out.dispose();
    if (n2.xq) disposeQuantizedActivations(n2.xq);
    return { input: n1.sum, residual: n2.sum, branch: m };
  }
}

/** x * s, disposing x. */
function scaled(x: Tensor, s: number): Tensor {
  const out = x.mul(s);
  x.dispose();
  return out;
}

/** tanh(x), disposing x. */
function tanhOf(x: Tensor): Tensor {
  const out = x.tanh();
  x.dispose();
  return out;
}

/** norm(x), disposing x. */
function normed(norm: RMSNorm, x: Tensor): Tensor {
  const out = norm.forward(x);
  x.dispose();
  return out;
}

class DecoderBody extends Module {
  readonly embedTokens: Embedding;
  readonly layers: DecoderLayer[] = [];
  readonly norm: RMSNorm;

  /** `rotaryLocal`: the sliding-window layers' rotary (Gemma 3), or null when every layer uses `rotary`. */
  constructor(
    cfg: ModelConfig, rotary: RotaryEmbedding, rotaryLocal: RotaryEmbedding | null, family: FamilySpec, options: LayerOptions, tp: TensorParallel | null,
  ) {
    super();
    // (every Gemma casts its sqrt(hidden) scale to the weights' dtype)
    const gemma = cfg.architecture.startsWith("Gemma");
    this.embedTokens = this.module("embed_tokens", new Embedding(cfg.vocabSize, cfg.hiddenSize, options, cfg.embedScale, gemma));
    const holder = this.module("layers", new Module());
    for (let i = 0; i < cfg.numHiddenLayers; i++) {
      const r = !cfg.ropeLayers[i] ? null : rotaryLocal !== null && cfg.slidingWindowLayers[i] ? rotaryLocal : rotary;
      this.layers.push(holder.addModule(String(i), new DecoderLayer(cfg, i, r, family, options, tp)));
    }
    this.norm = this.module("norm", new RMSNorm(cfg.hiddenSize, cfg.rmsNormEps, options, cfg.normOffset));
  }
}

/**
 * layer.forward(h, ctx) as a checkpointed region. The context's tensors (positions, ...) enter as region inputs, so
 * the recomputation in backward finds them alive after the caller disposed its handles; the trainable tensors are the
 * layer's parameters and the LoRA adapters being trained on its projections. `policy`: the op-level policy (outputs of
 * the ops it saves are kept, not recomputed), or null to recompute the whole layer.
 */
function checkpointedLayer(layer: DecoderLayer, h: Tensor, ctx: DenseContext, policy: SacPolicy | null): Tensor {
  const keys = Object.keys(ctx).filter((k) => ctx[k as keyof DenseContext] instanceof Tensor) as (keyof DenseContext)[];
  const trainable = [...layer.parameters()];
  for (const [, m] of layer.namedModules()) if (m instanceof Linear && m.adapter !== null) trainable.push(m.adapter.a, m.adapter.b);
  const region = (x: Tensor, ...tensors: Tensor[]): Tensor =>
    layer.forward(x, { ...ctx, ...Object.fromEntries(keys.map((k, i) => [k, tensors[i]])) } as DenseContext);
  return checkpoint(region, [h, ...keys.map((k) => ctx[k] as Tensor)], { parameters: trainable, ...(policy !== null ? { policy } : {}) });
}

export interface CausalLMOptions {
  /** Dtype of the large matrices (projections, embeddings); norms stay float32. */
  dtype?: DType;
  device?: DeviceLike;
  family?: FamilySpec;
  /** Leave every parameter unallocated for a loader that assigns them all (a checkpoint load); default false. */
  unallocatedParameters?: boolean;
  /**
   * Tensor parallelism (vLLM's Megatron-style split): this rank holds its share of the attention heads, KV heads and
   * MLP intermediate features (column-parallel q/k/v and gate/up, row-parallel o_proj and down_proj, one all-reduce
   * each); embeddings, norms and the LM head are replicated. Default none.
   */
  tp?: TensorParallel | null;
}

/** Throws a TensorParallelError naming the config field a tensor-parallel split of `size` ranks cannot divide. */
export function checkTensorParallelConfig(config: ModelConfig, size: number): void {
  if (size === 1) return;
  divideForTp("num_attention_heads", config.numAttentionHeads, size);
  divideForTp("num_key_value_heads", config.numKeyValueHeads, size);
  divideForTp("intermediate_size", config.intermediateSize, size);
  if (config.moe) throw new TensorParallelError(`${config.architecture}: mixture-of-experts layers are not supported with tensor parallelism`);
  if (config.qkNorm && config.qkNormScope === "full")
    throw new TensorParallelError(`${config.architecture}: q/k norms over whole projections are not supported with tensor parallelism`);
}

export class CausalLM extends Module {
  readonly model: DecoderBody;
  readonly lmHead: Linear | null; // null when tied to the embeddings, or for a classifier
  /** A sequence classifier's head (HF's `score`, [num_labels, hidden], no bias), or null for a language model. */
  readonly score: Linear | null;
  readonly rotary: RotaryEmbedding;
  /** Gemma 3's sliding-window layers' rotary (rope_local_base_freq, unscaled), or null. */
  readonly rotaryLocal: RotaryEmbedding | null;
  /** This rank's place in a tensor-parallel group, or null (CausalLMOptions.tp). */
  readonly tp: TensorParallel | null;
  /**
   * Activation checkpointing for training (TorchTitan's [activation_checkpoint]): the decoder layers it returns true
   * for keep no activations for backward in a dense forward that records autograd history; they are recomputed
   * (tensor/checkpoint.ts). Null (the default): every activation is kept.
   */
  activationCheckpointing: ((layer: number) => boolean) | null = null;
  /**
   * The op-level policy of those layers (TorchTitan's selective_ac_option "op": opSacPolicy keeps matmul and attention
   * outputs, recomputes the rest), or null (the default) to recompute each checkpointed layer whole.
   */
  activationCheckpointPolicy: SacPolicy | null = null;

  constructor(
    readonly config: ModelConfig,
    options: CausalLMOptions = {},
  ) {
    super();
    this.tp = options.tp ?? null;
    if (this.tp !== null) checkTensorParallelConfig(config, this.tp.size);
    const layerOptions: LayerOptions = { dtype: options.dtype ?? "float32", device: options.device, unallocatedParameters: options.unallocatedParameters };
    this.rotary = new RotaryEmbedding(
      { rotaryDim: config.rotaryDim, theta: config.ropeTheta, maxPositions: config.maxPositionEmbeddings, scaling: config.ropeScaling },
      options.device,
    );
    this.rotaryLocal = config.localRopeTheta === null ? null : new RotaryEmbedding(
      { rotaryDim: config.rotaryDim, theta: config.localRopeTheta, maxPositions: config.maxPositionEmbeddings, scaling: null },
      options.device,
    );
    this.model = this.module("model", new DecoderBody(config, this.rotary, this.rotaryLocal, options.family ?? DEFAULT_FAMILY, layerOptions, this.tp));
    const c = config.classifier;
    this.lmHead = config.tieWordEmbeddings || c !== null ? null : this.module("lm_head", new Linear(config.hiddenSize, config.vocabSize, false, layerOptions));
    this.score = c === null ? null : this.module("score", new Linear(config.hiddenSize, c.numLabels, false, layerOptions));
  }

  /** KV heads this rank caches: all of them, or num_key_value_heads / tp.size under tensor parallelism. */
  get numLocalKvHeads(): number {
    return this.config.numKeyValueHeads / (this.tp?.size ?? 1);
  }

  get device() {
    return this.model.embedTokens.weight.device;
  }

  /**
   * The longest sequence this model will be asked to serve (the engine's max_model_len): Phi-3's longrope picks its
   * factor set from it, as vLLM does; past max_position_embeddings the tables are extended. Call before step graphs
   * are captured; otherwise a no-op.
   */
  setContextLength(n: number): void {
    this.rotary.setContextLength(n);
    this.rotaryLocal?.setContextLength(n);
  }

  /**
   * Token ids [T] (int32) with their context -> final hidden states [T, hidden]. `aux`: also keeps the residual
   * stream entering each of `aux.layers` (vLLM's aux hidden state ids: 0 = the embeddings), in layer order, into
   * `aux.out` (EAGLE-3 heads read them). `embeds`: input embeddings that replace the token embeddings of some rows (an
   * image's features at its placeholder tokens, unscaled, as HF's masked_scatter puts them): rows int32 [R], values
   * float32 [R, hidden].
   */
  forward(ids: Tensor, ctx: ForwardContext, aux?: { layers: readonly number[]; out: Tensor[] }, embeds?: { rows: Tensor; values: Tensor } | null): Tensor {
    let h = this.model.embedTokens.forward(ids);
    if (embeds) {
      // (in the embeddings' dtype: the rest of the prompt runs as a text prompt would)
      const values = embeds.values.dtype === h.dtype ? embeds.values : embeds.values.to(h.dtype);
      indexCopyInto(h, 0, embeds.rows, values);
      if (values !== embeds.values) values.dispose();
    }
    const recompute = this.activationCheckpointing !== null && ctx.kind === "dense" && isGradEnabled() ? this.activationCheckpointing : null;
    if (!isGradEnabled() && this.model.layers.every((l) => l.fusesResidualAdds)) return this.forwardFused(h, ctx, aux);
    this.model.layers.forEach((layer, i) => {
      const next = recompute?.(i) === true ? checkpointedLayer(layer, h, ctx as DenseContext, this.activationCheckpointPolicy) : layer.forward(h, ctx);
      if (aux?.layers.includes(i) === true) aux.out.push(h);
      else h.dispose();
      h = next;
    });
    const out = this.model.norm.forward(h);
    h.dispose();
    return out;
  }

  /** forward()'s layers and final norm, each residual add fused into the norm after it (DecoderLayer.forwardFused). */
  private forwardFused(embedded: Tensor, ctx: ForwardContext, aux?: { layers: readonly number[]; out: Tensor[] }): Tensor {
    let h = embedded;
    let pending: Tensor | null = null;
    for (const [i, layer] of this.model.layers.entries()) {
      const r = layer.forwardFused(h, pending, ctx);
      pending?.dispose();
      if (r.input !== h) h.dispose();
      if (aux?.layers.includes(i) === true) aux.out.push(r.input);
      else r.input.dispose();
      h = r.residual;
      pending = r.branch;
    }
    if (pending === null) {
      const out = this.model.norm.forward(h);
      h.dispose();
      return out;
    }
    const last = this.model.norm.addForwardFor(h, pending, []);
    for (const t of [h, pending, last.sum]) t.dispose();
    return last.out;
  }

  /** A classifier's logits [rows, num_labels] for final hidden states [rows, hidden] (its pooled rows). */
  classify(hidden: Tensor): Tensor {
    if (this.score === null) throw new Error("[model] classify() needs a *ForSequenceClassification model");
    return this.score.forward(hidden);
  }

  /** Logits [rows, vocab] for the given rows of hidden [T, hidden] (all rows when omitted). */
  logits(hidden: Tensor, rows?: Int32Array): Tensor {
    let h = hidden;
    if (rows && rows.length !== hidden.shape[0]) {
      const idx = tensor(rows, { device: hidden.device });
      h = hidden.indexSelect(0, idx);
      idx.dispose();
    }
    const w = this.lmHead ? this.lmHead.weight : this.model.embedTokens.weight;
    let out = linear(h, w);
    if (h !== hidden) h.dispose();
    if (this.config.logitScale !== null) out = scaled(out, 1 / this.config.logitScale); // Granite's logits_scaling
    const cap = this.config.finalSoftcap; // Gemma 2's final_logit_softcapping: cap * tanh(logits / cap)
    if (cap !== null) out = scaled(tanhOf(scaled(out, 1 / cap)), cap);
    return out;
  }

  /**
   * Mean next-token cross-entropy for a dense batch: inputs/targets [batch * seqLen]. Differentiable.
   * `documentSeparator`: a token id ending each packed document (EOS) for TorchTitan's block_causal mask: a token
   * attends only within its own document (the separator belongs to the one it ends), positions restarting at 0 with
   * each document (nn/documents.ts). null: plain causal over the whole row.
   */
  loss(inputs: Int32Array, targets: Int32Array, batch: number, seqLen: number, documentSeparator: number | null = null): Tensor {
    const dev = this.device;
    const ids = tensor(inputs, { device: dev });
    const documents = documentSeparator === null ? null : documentIds(inputs, batch, seqLen, documentSeparator);
    // (without documents, each row is one: positions 0..seqLen-1)
    const positions = tensor(documentPositions(documents ?? new Int32Array(batch * seqLen), batch, seqLen), { device: dev });
    const hidden = this.forward(ids, { kind: "dense", batch, seqLen, positions, documents });
    const logits = this.logits(hidden);
    const tgt = tensor(targets, { device: dev });
    const loss = crossEntropy(logits, tgt);
    for (const t of [ids, positions, hidden, logits, tgt]) t.dispose();
    return loss;
  }
}
