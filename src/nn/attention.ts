// Multi-head attention with GQA/MQA, optional q/k RMSNorm (Qwen3), qkv bias (Qwen2), sliding windows, attention
// logit soft-capping (Gemma 2) and attention sinks (gpt-oss).
// Two paths over one set of weights: paged (serving, ragged batches over the paged KV cache) and dense
// (training: [batch, seq] with a causal or block-causal mask, differentiable).
import { causalAttention, indexCopyInto, pagedAttention, zeros, type QuantizedActivations, type Tensor } from "../tensor/index.js";
import { Linear, newParameter, RMSNorm, type LayerOptions } from "./layers.js";
import { Module } from "./module.js";
import { ColumnParallelLinear, divideForTp, RowParallelLinear, TensorParallelError, type TensorParallel } from "./parallel.js";
import type { RotaryEmbedding } from "./rotary.js";

/** Per-step metadata of a ragged serving batch (built by the engine's model runner). */
export interface PagedContext {
  kind: "paged";
  positions: Tensor; // int32 [T]
  slotMapping: Tensor; // int32 [T]
  blockTables: Tensor; // int32 [numSeqs, maxBlocksPerSeq]
  queryStart: Tensor; // int32 [numSeqs + 1]
  seqLens: Tensor; // int32 [numSeqs], context length including the new tokens
  kvCaches: { k: Tensor; v: Tensor }[]; // per layer, [numBlocks, blockSize, Hkv, D]
  /** Each token's LoRA slot, int32 [T] (-1: no adapter); absent when the model serves no adapters (Linear.withLora). */
  loraSlots?: Tensor | null;
  /**
   * Rows that also see later keys of their own image (Gemma 3's bidirectional attention among one image's tokens,
   * vLLM's mm-prefix attention): each image's rows attend again, bidirectionally, as one sequence whose context
   * ends at the image's end (every row as the image's last position would; K/V written by the first pass,
   * slotMapping -1 writes none), and those outputs replace their rows. Absent: none.
   */
  mmPrefix?: {
    rows: Tensor; // int32 [R], rows of the batch, each image's consecutive
    positions: Tensor; // int32 [R]
    blockTables: Tensor; // int32 [I, maxBlocksPerSeq], each image's sequence's table
    queryStart: Tensor; // int32 [I + 1], each image's rows
    seqLens: Tensor; // int32 [I], each image's end
    slotMapping: Tensor; // int32 [R] of -1
  } | null;
}

/** A dense [batch, seq] batch of token rows (training, scoring). */
export interface DenseContext {
  kind: "dense";
  batch: number;
  seqLen: number;
  positions: Tensor; // int32 [batch * seqLen]
  /** Spans [start, end) of each row whose tokens see each other whatever the order (one image's tokens, as HF's Gemma 3 masks them). */
  bidirectionalSpans?: readonly (readonly [number, number])[];
  /**
   * Packed documents (TorchTitan's block_causal mask): each token's document index, int32 [batch * seqLen] row-major
   * (nn/documents.ts's documentIds); a query sees only earlier keys of its own document. Absent: one document per row.
   */
  documents?: Int32Array | null;
}

export type ForwardContext = PagedContext | DenseContext;

export interface AttentionConfig {
  hiddenSize: number;
  /** Features q/k/v read (default hiddenSize; an EAGLE-3 head's attention reads [embedding, hidden]: 2 x hidden). */
  inputSize?: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  qkvBias: boolean;
  oBias: boolean;
  /** RMSNorm of q and k before rotary: over each head ("head" or true: Qwen3, Gemma 3) or the whole projection ("full": OLMo 2). */
  qkNorm: boolean | "head" | "full";
  rmsNormEps: number;
  slidingWindow: number | null;
  /** The softmax scale (default head_dim ** -0.5). */
  scale?: number;
  /** q/k norms scale by normOffset + weight (Gemma: 1). Default 0. */
  normOffset?: number;
  /** Gemma 2's attn_logit_softcapping: scaled scores s become softcap * tanh(s / softcap) before the mask; null: none. */
  softcap?: number | null;
  /** gpt-oss: a learned `sinks` logit per head [numHeads] (float32) joins each softmax denominator. Default false. */
  sinks?: boolean;
}

export class Attention extends Module {
  readonly qProj: Linear;
  readonly kProj: Linear;
  readonly vProj: Linear;
  readonly oProj: Linear;
  readonly qNorm: RMSNorm | null;
  readonly kNorm: RMSNorm | null;
  /** Attention sinks [numHeads] (float32), or null. */
  sinks: Tensor | null;
  /** The heads this rank computes: all of them, or numHeads / tp.size (and numKvHeads / tp.size) under tensor parallelism. */
  readonly numHeads: number;
  readonly numKvHeads: number;

  /**
   * `tp`: split the heads over the tensor-parallel ranks (vLLM's QKVParallelLinear + RowParallelLinear): q/k/v are
   * column-parallel (this rank's heads), o_proj row-parallel (one all-reduce); each rank's KV cache holds its KV heads.
   */
  constructor(
    readonly cfg: AttentionConfig,
    readonly layerIndex: number,
    readonly rotary: RotaryEmbedding | null,
    options: LayerOptions = {},
    readonly tp: TensorParallel | null = null,
  ) {
    super();
    const { hiddenSize, numHeads, numKvHeads, headDim } = cfg;
    const inputSize = cfg.inputSize ?? hiddenSize;
    this.numHeads = tp === null ? numHeads : divideForTp("num_attention_heads", numHeads, tp.size);
    this.numKvHeads = tp === null ? numKvHeads : divideForTp("num_key_value_heads", numKvHeads, tp.size);
    if (tp !== null && cfg.qkNorm === "full")
      throw new TensorParallelError("q/k norms over whole projections (OLMo 2) are not supported with tensor parallelism");
    const column = (name: string, out: number): Linear =>
      this.module(name, tp === null ? new Linear(inputSize, out, cfg.qkvBias, options) : new ColumnParallelLinear(inputSize, out, cfg.qkvBias, tp, options));
    this.qProj = column("q_proj", numHeads * headDim);
    this.kProj = column("k_proj", numKvHeads * headDim);
    this.vProj = column("v_proj", numKvHeads * headDim);
    this.oProj = this.module(
      "o_proj",
      tp === null ? new Linear(numHeads * headDim, hiddenSize, cfg.oBias, options) : new RowParallelLinear(numHeads * headDim, hiddenSize, cfg.oBias, tp, options),
    );
    const full = cfg.qkNorm === "full";
    const qkNorm = (name: string, heads: number) => this.module(name, new RMSNorm(full ? heads * headDim : headDim, cfg.rmsNormEps, options, cfg.normOffset ?? 0));
    this.qNorm = cfg.qkNorm !== false ? qkNorm("q_norm", numHeads) : null;
    this.kNorm = cfg.qkNorm !== false ? qkNorm("k_norm", numKvHeads) : null;
    if (cfg.sinks === true && tp !== null) throw new TensorParallelError("attention sinks (gpt-oss) are not supported with tensor parallelism");
    // float32 whatever the layer dtype: the kernels read them as they are, once per row
    this.sinks = cfg.sinks === true ? this.param("sinks", newParameter([numHeads], options, (o) => zeros([numHeads], o), "float32")) : null;
  }

  protected override onParameterReplaced(local: string, value: Tensor): void {
    if (local === "sinks") this.sinks = value;
  }

  /** The projections that read forward()'s x (for RMSNorm.forwardFor). */
  get inputProjections(): readonly Linear[] {
    return [this.qProj, this.kProj, this.vProj];
  }

  /** x [T, hidden] -> [T, hidden]. `xq`: x's rows already quantized, for quantized q/k/v projections. */
  forward(x: Tensor, ctx: ForwardContext, xq?: QuantizedActivations | null): Tensor {
    const { numHeads: H, numKvHeads: Hkv } = this;
    const D = this.cfg.headDim;
    const T = x.shape[0]!;
    const loraSlots = ctx.kind === "paged" ? ctx.loraSlots : null;
    // the three products first, then their LoRA deltas: products of one input back to back merge into one job
    const flats = this.inputProjections.map((p) => p.forward(x, xq));
    const full = this.cfg.qkNorm === "full";
    const heads = (proj: Linear, flat0: Tensor, n: number, norm: RMSNorm | null): Tensor => {
      let flat = proj.withLora(flat0, x, loraSlots);
      if (norm !== null && full) {
        const normed = norm.forward(flat); // over the whole projection (OLMo 2), before the split into heads
        flat.dispose();
        flat = normed;
      }
      const v = flat.view(T, n, D);
      flat.dispose();
      if (norm === null || full) return v;
      const normed = norm.forward(v);
      v.dispose();
      return normed;
    };
    const q0 = heads(this.qProj, flats[0]!, H, this.qNorm);
    const k0 = heads(this.kProj, flats[1]!, Hkv, this.kNorm);
    const v = heads(this.vProj, flats[2]!, Hkv, null);
    let q: Tensor;
    let k: Tensor;
    let attn: Tensor;
    if (ctx.kind === "paged") {
      // rotary fused with the KV write: the kernel rotates q and the new k rows itself
      const cache = ctx.kvCaches[this.layerIndex]!;
      [q, k] = [q0, k0];
      // image rows' un-rotated q (taken before the kernel runs) for their second, bidirectional pass
      const mm = ctx.mmPrefix ?? null;
      const mmQkv = mm === null ? null : [q, k, v].map((t) => t.indexSelect(0, mm.rows));
      attn = pagedAttention({
        q, k, v, kCache: cache.k, vCache: cache.v,
        slotMapping: ctx.slotMapping, blockTables: ctx.blockTables, queryStart: ctx.queryStart, seqLens: ctx.seqLens,
        scale: this.cfg.scale ?? 1 / Math.sqrt(D), slidingWindow: this.cfg.slidingWindow ?? 0, softcap: this.cfg.softcap ?? 0,
        rotary: this.rotary?.pagedArgs(ctx.positions) ?? null, sinks: this.sinks,
      });
      if (mm !== null && mmQkv !== null) {
        const [qi, ki, vi] = mmQkv as [Tensor, Tensor, Tensor];
        const again = pagedAttention({
          q: qi, k: ki, v: vi, kCache: cache.k, vCache: cache.v,
          slotMapping: mm.slotMapping, blockTables: mm.blockTables, queryStart: mm.queryStart, seqLens: mm.seqLens,
          scale: this.cfg.scale ?? 1 / Math.sqrt(D), slidingWindow: this.cfg.slidingWindow ?? 0, softcap: this.cfg.softcap ?? 0,
          rotary: this.rotary?.pagedArgs(mm.positions) ?? null, sinks: this.sinks, bidirectional: true,
        });
        indexCopyInto(attn, 0, mm.rows, again);
        for (const t of [qi, ki, vi, again]) t.dispose();
      }
    } else if (this.rotary === null) {
      [q, k] = [q0, k0]; // (a NoPE layer: attention over content alone)
      attn = this.denseAttention(q, k, v, ctx);
    } else {
      q = this.rotary.apply(q0, ctx.positions);
      k = this.rotary.apply(k0, ctx.positions);
      q0.dispose();
      k0.dispose();
      attn = this.denseAttention(q, k, v, ctx);
    }
    for (const t of [q, k, v]) t.dispose();
    const flat = attn.reshape(T, H * D);
    attn.dispose();
    const out = this.oProj.project(flat, null, loraSlots);
    flat.dispose();
    return out;
  }

  private denseAttention(q: Tensor, k: Tensor, v: Tensor, ctx: DenseContext): Tensor {
    const { numHeads: H, numKvHeads: Hkv } = this;
    const D = this.cfg.headDim;
    const { batch: B, seqLen: S } = ctx;
    const views: Tensor[] = [];
    const toHeads = (t: Tensor, n: number) => {
      const v4 = t.view(B, S, n, D);
      const th = v4.transpose(1, 2); // [B, n, S, D]
      views.push(v4, th);
      return th;
    };
    const o = causalAttention(toHeads(q, H), toHeads(k, Hkv), toHeads(v, Hkv), this.cfg.scale, this.cfg.slidingWindow ?? undefined, this.cfg.softcap, this.sinks, ctx.bidirectionalSpans, ctx.documents); // [B, H, S, D]
    const ot = o.transpose(1, 2);
    const out = ot.reshape(B * S, H, D);
    for (const t of [...views, o, ot]) t.dispose();
    return out;
  }
}
