// Gemma 3's vision side: the SigLIP vision tower (HF SiglipVisionModel without a pooling head) and
// Gemma3MultiModalProjector, which turn one image's pixel_values [3, S, S] into mm_tokens_per_image rows of the text
// model's embeddings. Parameter names match HF checkpoints (vision_tower.vision_model.*, multi_modal_projector.*).
import { Embedding, LayerNorm, Linear, Module, RMSNorm, newParameter, type LayerOptions } from "../nn/index.js";
import { add, cat, empty, linear, matmul, noGrad, pagedAttention, tensor, zeros, type Tensor, type TensorOptions } from "../tensor/index.js";
import { VisionConfigError, type Gemma3VisionConfig } from "./gemma3-vision-config.js";

export { VisionConfigError, parseGemma3VisionConfig, type Gemma3VisionConfig } from "./gemma3-vision-config.js";

class SiglipAttention extends Module {
  readonly qProj: Linear;
  readonly kProj: Linear;
  readonly vProj: Linear;
  readonly outProj: Linear;

  constructor(private readonly cfg: Gemma3VisionConfig, options: LayerOptions) {
    super();
    const h = cfg.hiddenSize;
    this.qProj = this.module("q_proj", new Linear(h, h, true, options));
    this.kProj = this.module("k_proj", new Linear(h, h, true, options));
    this.vProj = this.module("v_proj", new Linear(h, h, true, options));
    this.outProj = this.module("out_proj", new Linear(h, h, true, options));
  }

  /**
   * x [N, hidden] -> [N, hidden]: every patch attends to every patch (no mask). Run by the fused paged-attention
   * kernel with bidirectional attention (no [N, N] scores in memory), each head as a sequence of its own: q/k/v
   * head-major [H * N, 1, D], so a head's K/V fill contiguous blocks of a scratch cache, which its work items read
   * while they stay in cache (one sequence of all heads, whose rows interleave the heads' K/V, took 1.5-2x the
   * time for 4096 patches). Head sizes the kernel's tiles do not take (SigLIP's 72) are zero-padded to a multiple of
   * 16 floats: zero q/k lanes add nothing to a score, and the v lanes' zero outputs are dropped.
   */
  forward(x: Tensor): Tensor {
    const { numHeads: H, hiddenSize } = this.cfg;
    const D = hiddenSize / H;
    const Dp = Math.ceil(D / 16) * 16;
    const N = x.shape[0]!;
    const pad = Dp === D ? null : zeros([H, N, Dp - D], { device: x.device });
    const [q, k, v] = [this.qProj, this.kProj, this.vProj].map((p) => {
      const y = p.forward(x);
      const split = y.reshape(N, H, D);
      const heads = split.permute(1, 0, 2); // [H, N, D]
      const major = pad ? cat([heads, pad], 2) : heads.contiguous();
      const rows = major.reshape(H * N, 1, Dp);
      disposeViews(rows, [y, split, heads, major]);
      return rows;
    }) as [Tensor, Tensor, Tensor];
    pad?.dispose();
    const blocks = Math.ceil(N / SCRATCH_BLOCK); // per head
    const cache = empty([2, H * blocks, SCRATCH_BLOCK, 1, Dp], { device: x.device });
    const [kCache, vCache] = [cache.select(0, 0), cache.select(0, 1)];
    const slots = new Int32Array(H * N);
    for (let h = 0; h < H; h++) for (let i = 0; i < N; i++) slots[h * N + i] = h * blocks * SCRATCH_BLOCK + i;
    const meta = {
      slotMapping: tensor(slots, { device: x.device }),
      blockTables: tensor(Int32Array.from({ length: H * blocks }, (_, b) => b), { shape: [H, blocks], device: x.device }),
      queryStart: tensor(Int32Array.from({ length: H + 1 }, (_, h) => h * N), { device: x.device }),
      seqLens: tensor(new Int32Array(H).fill(N), { device: x.device }),
    };
    const attn = pagedAttention({ q, k, v, kCache, vCache, ...meta, scale: 1 / Math.sqrt(D), bidirectional: true }); // [H * N, 1, Dp]
    for (const t of [q, k, v, kCache, vCache, cache, ...Object.values(meta)]) t.dispose();
    const perHead = attn.reshape(H, N, Dp);
    const kept = perHead.narrow(2, 0, D);
    const byPatch = kept.permute(1, 0, 2); // [N, H, D]
    const dense = byPatch.contiguous();
    const flat = dense.reshape(N, hiddenSize);
    disposeViews(flat, [attn, perHead, kept, byPatch, dense]);
    const out = this.outProj.forward(flat);
    flat.dispose();
    return out;
  }
}

/** Disposes each of `chain` (a tensor and the views between it and `keep`) that is not `keep` itself. */
function disposeViews(keep: Tensor, chain: readonly Tensor[]): void {
  for (const t of chain) if (t !== keep) t.dispose();
}

/** Block size of the attention's scratch K/V cache (64: measured faster than 16 for 4096 patches). */
const SCRATCH_BLOCK = 64;

class SiglipMLP extends Module {
  readonly fc1: Linear;
  readonly fc2: Linear;

  constructor(cfg: Gemma3VisionConfig, options: LayerOptions) {
    super();
    this.fc1 = this.module("fc1", new Linear(cfg.hiddenSize, cfg.intermediateSize, true, options));
    this.fc2 = this.module("fc2", new Linear(cfg.intermediateSize, cfg.hiddenSize, true, options));
  }

  forward(x: Tensor): Tensor {
    const a = this.fc1.forward(x);
    const g = a.gelu("tanh");
    a.dispose();
    const out = this.fc2.forward(g);
    g.dispose();
    return out;
  }
}

class SiglipEncoderLayer extends Module {
  readonly layerNorm1: LayerNorm;
  readonly selfAttn: SiglipAttention;
  readonly layerNorm2: LayerNorm;
  readonly mlp: SiglipMLP;

  constructor(cfg: Gemma3VisionConfig, options: LayerOptions) {
    super();
    this.layerNorm1 = this.module("layer_norm1", new LayerNorm(cfg.hiddenSize, cfg.layerNormEps, {}, options));
    this.selfAttn = this.module("self_attn", new SiglipAttention(cfg, options));
    this.layerNorm2 = this.module("layer_norm2", new LayerNorm(cfg.hiddenSize, cfg.layerNormEps, {}, options));
    this.mlp = this.module("mlp", new SiglipMLP(cfg, options));
  }

  /** Pre-norm residual blocks: h + attn(ln1(h)), then h + mlp(ln2(h)). */
  forward(h: Tensor): Tensor {
    const n1 = this.layerNorm1.forward(h);
    const a = this.selfAttn.forward(n1);
    const h2 = add(h, a);
    const n2 = this.layerNorm2.forward(h2);
    const m = this.mlp.forward(n2);
    const out = add(h2, m);
    for (const t of [n1, a, h2, n2, m]) t.dispose();
    return out;
  }
}

/** Conv2d(3, hidden, kernel = stride = patch): weight [hidden, 3, patch, patch], bias [hidden]. */
class PatchEmbedding extends Module {
  weight: Tensor;
  bias: Tensor;

  constructor(hidden: number, patch: number, options: LayerOptions) {
    super();
    const zeros = (shape: number[]) => (o: TensorOptions) => tensor(new Float32Array(shape.reduce((a, b) => a * b, 1)), { ...o, shape });
    this.weight = this.param("weight", newParameter([hidden, 3, patch, patch], options, zeros([hidden, 3, patch, patch])))!;
    this.bias = this.param("bias", newParameter([hidden], { ...options, dtype: "float32" }, zeros([hidden])))!;
  }

  protected override onParameterReplaced(local: string, value: Tensor): void {
    if (local === "weight") this.weight = value;
    else if (local === "bias") this.bias = value;
  }

  /** Patches [N, 3 * patch * patch] (each in (channel, row, column) order) -> [N, hidden]: the conv as a matmul. */
  forward(patches: Tensor): Tensor {
    const [h] = this.weight.shape as [number];
    const w = this.weight.reshape(h, this.weight.numel / h);
    const out = linear(patches, w, this.bias);
    if (w !== this.weight) w.dispose();
    return out;
  }
}

class SiglipEmbeddings extends Module {
  readonly patchEmbedding: PatchEmbedding;
  readonly positionEmbedding: Embedding;

  constructor(private readonly cfg: Gemma3VisionConfig, options: LayerOptions) {
    super();
    const side = cfg.imageSize / cfg.patchSize;
    this.patchEmbedding = this.module("patch_embedding", new PatchEmbedding(cfg.hiddenSize, cfg.patchSize, { ...options, dtype: "float32" }));
    this.positionEmbedding = this.module("position_embedding", new Embedding(side * side, cfg.hiddenSize, { ...options, dtype: "float32" }));
  }

  /** pixel_values [3, S, S] -> patch embeddings plus position embeddings [N, hidden], patches row-major. */
  forward(pixels: Float32Array): Tensor {
    const { patchSize: p, imageSize: S } = this.cfg;
    const side = S / p;
    const K = 3 * p * p;
    // each patch's pixels in the conv weight's (channel, row, column) order
    const patches = new Float32Array(side * side * K);
    for (let py = 0; py < side; py++)
      for (let px = 0; px < side; px++) {
        const base = (py * side + px) * K;
        for (let c = 0; c < 3; c++)
          for (let ky = 0; ky < p; ky++) {
            const src = c * S * S + (py * p + ky) * S + px * p;
            patches.set(pixels.subarray(src, src + p), base + c * p * p + ky * p);
          }
      }
    const x = tensor(patches, { shape: [side * side, K], device: this.positionEmbedding.weight.device });
    const e = this.patchEmbedding.forward(x);
    const out = add(e, this.positionEmbedding.weight);
    x.dispose();
    e.dispose();
    return out;
  }
}

/** HF SiglipVisionTransformer as Gemma 3 uses it: embeddings, encoder, post_layernorm (no pooling head). */
export class SiglipVisionTransformer extends Module {
  readonly embeddings: SiglipEmbeddings;
  readonly layers: SiglipEncoderLayer[] = [];
  readonly postLayernorm: LayerNorm;

  constructor(cfg: Gemma3VisionConfig, options: LayerOptions = {}) {
    super();
    this.embeddings = this.module("embeddings", new SiglipEmbeddings(cfg, options));
    const encoder = this.module("encoder", new Module());
    const holder = encoder.addModule("layers", new Module());
    for (let i = 0; i < cfg.numLayers; i++) this.layers.push(holder.addModule(String(i), new SiglipEncoderLayer(cfg, options)));
    this.postLayernorm = this.module("post_layernorm", new LayerNorm(cfg.hiddenSize, cfg.layerNormEps, {}, options));
  }

  /** pixel_values [3, S, S] -> last_hidden_state [N patches, hidden]. */
  forward(pixels: Float32Array): Tensor {
    let h = this.embeddings.forward(pixels);
    for (const layer of this.layers) {
      const next = layer.forward(h);
      h.dispose();
      h = next;
    }
    const out = this.postLayernorm.forward(h);
    h.dispose();
    return out;
  }
}

/**
 * Gemma3MultiModalProjector: the patch grid average-pooled to sqrt(mm_tokens) a side, Gemma's (1 + w) RMSNorm
 * (`mm_soft_emb_norm`), then `mm_input_projection_weight` [vision hidden, text hidden] (x @ W, no transpose).
 */
export class Gemma3MultiModalProjector extends Module {
  projection: Tensor; // [vision hidden, text hidden]
  readonly norm: RMSNorm;

  constructor(private readonly cfg: Gemma3VisionConfig, options: LayerOptions = {}) {
    super();
    const { hiddenSize: vh, textHiddenSize: th } = cfg;
    this.projection = this.param("mm_input_projection_weight", newParameter([vh, th], options, (o: TensorOptions) => tensor(new Float32Array(vh * th), { ...o, shape: [vh, th] })))!;
    this.norm = this.module("mm_soft_emb_norm", new RMSNorm(vh, cfg.layerNormEps, options, 1));
  }

  protected override onParameterReplaced(local: string, value: Tensor): void {
    if (local === "mm_input_projection_weight") this.projection = value;
  }

  /** Vision outputs [N patches, vision hidden] -> image embeddings [mm_tokens_per_image, text hidden]. */
  forward(x: Tensor): Tensor {
    const side = this.cfg.imageSize / this.cfg.patchSize;
    const tokSide = Math.round(Math.sqrt(this.cfg.mmTokensPerImage));
    const k = side / tokSide;
    const vh = this.cfg.hiddenSize;
    // patches (row, column) row-major: rows split into (token row, kernel row), columns likewise
    const grid = x.reshape(tokSide, k, tokSide, k, vh);
    const pooledGrid = grid.mean([1, 3]); // [tokSide, tokSide, vh]
    const pooled = pooledGrid.reshape(tokSide * tokSide, vh);
    const normed = this.norm.forward(pooled);
    const w = this.projection.dtype === "float32" ? this.projection : this.projection.to("float32");
    const out = matmul(normed, w);
    for (const t of [grid, pooledGrid, pooled, normed]) if (t !== x) t.dispose();
    if (w !== this.projection) w.dispose();
    return out;
  }
}

/** Gemma 3's vision side as one module: `vision_tower.vision_model.*` and `multi_modal_projector.*`. */
export class Gemma3Vision extends Module {
  readonly visionModel: SiglipVisionTransformer;
  readonly projector: Gemma3MultiModalProjector;

  constructor(readonly config: Gemma3VisionConfig, options: LayerOptions = {}) {
    super();
    const tower = this.module("vision_tower", new Module());
    this.visionModel = tower.addModule("vision_model", new SiglipVisionTransformer(config, options));
    this.projector = this.module("multi_modal_projector", new Gemma3MultiModalProjector(config, options));
  }

  /** One image's pixel_values [3, S, S] -> its embeddings [mm_tokens_per_image, text hidden] (float32, host). */
  encode(pixels: Float32Array): Float32Array {
    const S = this.config.imageSize;
    if (pixels.length !== 3 * S * S) throw new VisionConfigError(`[vision] pixel_values must be [3, ${S}, ${S}], got ${pixels.length} values`);
    // the tower's large intermediates (70 MB for an MLP's activations) reuse each other's memory
    const backend = this.projector.projection.device.backend;
    const run = <T>(fn: () => T): T => (backend.withMemoryPool ? backend.withMemoryPool(fn) : fn());
    return run(() => noGrad(() => {
      const h = this.visionModel.forward(pixels);
      const e = this.projector.forward(h);
      const out = Float32Array.from(e.dataSync() as Float32Array);
      h.dispose();
      e.dispose();
      return out;
    }));
  }
}

/** The dtype a vision parameter loads as: the linear layers' matrices in the model dtype, everything else float32. */
export function visionParamDtype(name: string, modelDtype: "float32" | "bfloat16"): "float32" | "bfloat16" {
  return /(_proj|fc[12])\.weight$/.test(name) && !name.endsWith("mm_input_projection_weight") ? modelDtype : "float32";
}
