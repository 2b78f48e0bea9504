// Rotary position embedding tables (cos/sin [maxPositions, rotaryDim/2]) with Hugging Face's scaling
// variants: default, linear, dynamic NTK, llama3, YaRN (transformers' modeling_rope_utils semantics) and Phi-3's
// longrope (vLLM's choice of its factor set: by the served context length, fixed for the engine's life).
import { noGrad, rotaryEmbedding, tensor, type PagedRotaryArgs, type Tensor, type DeviceLike } from "../tensor/index.js";

/** HF rope_scaling variants (models/hf-config.ts parses config.json into this shape). */
export type RopeScaling =
  | { type: "linear"; factor: number }
  | { type: "dynamic"; factor: number; originalMaxPositionEmbeddings: number | null }
  | { type: "llama3"; factor: number; lowFreqFactor: number; highFreqFactor: number; originalMaxPositionEmbeddings: number }
  | {
      type: "yarn";
      factor: number;
      originalMaxPositionEmbeddings: number;
      betaFast: number;
      betaSlow: number;
      attentionFactor: number | null;
      mscale: number | null;
      mscaleAllDim: number | null;
      /** Round the ramp's ends out to whole dimensions (HF's and vLLM's `truncate`; absent: true). gpt-oss: false. */
      truncate?: boolean;
    }
  | {
      type: "longrope";
      /** Per rotary frequency, the divisor of its base frequency within / past the original context. */
      shortFactor: number[];
      longFactor: number[];
      originalMaxPositionEmbeddings: number;
      /** cos/sin scale of each set; null: sqrt(1 + ln(max_pos / orig) / ln(orig)) (1 when max_pos <= orig). */
      shortMscale: number | null;
      longMscale: number | null;
    };

export interface RotaryConfig {
  rotaryDim: number;
  theta: number;
  maxPositions: number;
  scaling: RopeScaling | null;
  /**
   * The longest sequence the tables will serve (the engine's max_model_len; default maxPositions). longrope takes its
   * long factors when this exceeds the original context, as vLLM does, so a sequence's keys never change factor set.
   */
  contextLength?: number;
}

/** Inverse frequencies and the attention scale factor YaRN applies to cos/sin. */
export function rotaryInvFreq(cfg: RotaryConfig): { invFreq: Float64Array; attentionFactor: number; tablePositions: number } {
  const { rotaryDim: dim, scaling } = cfg;
  let base = cfg.theta;
  const half = dim / 2;
  let tablePositions = cfg.maxPositions;
  const plain = (b: number) => Float64Array.from({ length: half }, (_, i) => 1 / Math.pow(b, (2 * i) / dim));
  if (!scaling) return { invFreq: plain(base), attentionFactor: 1, tablePositions };
  switch (scaling.type) {
    case "linear":
      return { invFreq: plain(base).map((f) => f / scaling.factor), attentionFactor: 1, tablePositions };
    case "dynamic": {
      // vLLM's static form of dynamic NTK: the base is stretched for max_position * factor positions at once.
      const orig = scaling.originalMaxPositionEmbeddings ?? cfg.maxPositions;
      const seqLen = orig * scaling.factor;
      base = base * Math.pow((scaling.factor * seqLen) / orig - (scaling.factor - 1), dim / (dim - 2));
      tablePositions = Math.max(tablePositions, seqLen);
      return { invFreq: plain(base), attentionFactor: 1, tablePositions };
    }
    case "llama3": {
      const { factor, lowFreqFactor, highFreqFactor, originalMaxPositionEmbeddings: old } = scaling;
      const lowWavelen = old / lowFreqFactor;
      const highWavelen = old / highFreqFactor;
      const inv = plain(base).map((f) => {
        const wavelen = (2 * Math.PI) / f;
        if (wavelen < highWavelen) return f;
        if (wavelen > lowWavelen) return f / factor;
        const smooth = (old / wavelen - lowFreqFactor) / (highFreqFactor - lowFreqFactor);
        return (1 - smooth) * (f / factor) + smooth * f;
      });
      return { invFreq: inv, attentionFactor: 1, tablePositions };
    }
    case "yarn": {
      const { factor, betaFast, betaSlow, originalMaxPositionEmbeddings: orig } = scaling;
      const getMscale = (scale: number, m = 1) => (scale <= 1 ? 1 : 0.1 * m * Math.log(scale) + 1);
      let attentionFactor = scaling.attentionFactor ?? getMscale(factor);
      if (scaling.attentionFactor === null && scaling.mscale !== null && scaling.mscaleAllDim !== null)
        attentionFactor = getMscale(factor, scaling.mscale) / getMscale(factor, scaling.mscaleAllDim);
      const correctionDim = (rot: number) => (dim * Math.log(orig / (rot * 2 * Math.PI))) / (2 * Math.log(base));
      const round = scaling.truncate === false ? (x: number) => x : null;
      const low = Math.max((round ?? Math.floor)(correctionDim(betaFast)), 0);
      const high = Math.min((round ?? Math.ceil)(correctionDim(betaSlow)), dim - 1);
      const hi = low === high ? high + 0.001 : high;
      const inv = new Float64Array(half);
      for (let i = 0; i < half; i++) {
        const posFreq = Math.pow(base, (2 * i) / dim);
        const extrap = 1 / posFreq;
        const interp = 1 / (factor * posFreq);
        const ramp = Math.min(Math.max((i - low) / (hi - low), 0), 1);
        const extrapFactor = 1 - ramp;
        inv[i] = interp * (1 - extrapFactor) + extrap * extrapFactor;
      }
      return { invFreq: inv, attentionFactor, tablePositions };
    }
    case "longrope": {
      const orig = scaling.originalMaxPositionEmbeddings;
      const long = (cfg.contextLength ?? cfg.maxPositions) > orig;
      const scale = cfg.maxPositions / orig;
      const mscale = (long ? scaling.longMscale : scaling.shortMscale) ?? (scale <= 1 ? 1 : Math.sqrt(1 + Math.log(scale) / Math.log(orig)));
      const factors = long ? scaling.longFactor : scaling.shortFactor;
      return { invFreq: plain(base).map((f, i) => f / factors[i]!), attentionFactor: mscale, tablePositions };
    }
  }
}

/** cos/sin [positions, rotaryDim/2] of a rotary config, with its attention factor applied. */
function rotaryTables(config: RotaryConfig): { cos: Float32Array; sin: Float32Array; positions: number; half: number } {
  const { invFreq, attentionFactor, tablePositions: own } = rotaryInvFreq(config);
  // a context longer than the model's positions (VLLM_ALLOW_LONG_MAX_MODEL_LEN) continues the same rotation
  const tablePositions = Math.max(own, config.contextLength ?? 0);
  const half = invFreq.length;
  const cos = new Float32Array(tablePositions * half);
  const sin = new Float32Array(tablePositions * half);
  for (let p = 0; p < tablePositions; p++)
    for (let i = 0; i < half; i++) {
      const a = p * invFreq[i]!;
      cos[p * half + i] = Math.cos(a) * attentionFactor;
      sin[p * half + i] = Math.sin(a) * attentionFactor;
    }
  return { cos, sin, positions: tablePositions, half };
}

/** Precomputed cos/sin tables and the rotation itself. */
export class RotaryEmbedding {
  cos: Tensor; // [positions, rotaryDim/2]
  sin: Tensor;
  maxPositions: number;

  constructor(
    public config: RotaryConfig,
    device?: DeviceLike,
    readonly neox = true,
  ) {
    const { cos, sin, positions, half } = rotaryTables(config);
    this.maxPositions = positions;
    this.cos = tensor(cos, { shape: [positions, half], device });
    this.sin = tensor(sin, { shape: [positions, half], device });
  }

  /**
   * Serve sequences of at most `n` tokens: longrope's tables switch factor sets when the original context is crossed
   * (rewritten in place, so kernels and graphs holding them see the new values); tables shorter than `n` (a context
   * past max_position_embeddings, which the engine allows only with VLLM_ALLOW_LONG_MAX_MODEL_LEN) are replaced by
   * longer ones, so call this before anything holds them; otherwise a no-op.
   */
  setContextLength(n: number): void {
    const longrope = this.config.scaling?.type === "longrope";
    if (n <= this.maxPositions && (!longrope || n === (this.config.contextLength ?? this.config.maxPositions))) return;
    this.config = { ...this.config, contextLength: n };
    const { cos, sin, positions, half } = rotaryTables(this.config);
    if (positions !== this.maxPositions) {
      const device = this.cos.device;
      this.cos.dispose();
      this.sin.dispose();
      this.maxPositions = positions;
      this.cos = tensor(cos, { shape: [positions, half], device });
      this.sin = tensor(sin, { shape: [positions, half], device });
      return;
    }
    noGrad(() => {
      for (const [t, v] of [[this.cos, cos], [this.sin, sin]] as const) {
        const src = tensor(v, { shape: [positions, half], device: t.device });
        t.copy_(src);
        src.dispose();
      }
    });
  }

  /** x [T, H, D] at positions [T] (int32). */
  apply(x: Tensor, positions: Tensor): Tensor {
    return rotaryEmbedding(x, positions, this.cos, this.sin, this.neox);
  }

  /** The same rotation as pagedAttention()'s fused `rotary` argument (q and k rotated inside the kernel). */
  pagedArgs(positions: Tensor): PagedRotaryArgs {
    return { positions, cos: this.cos, sin: this.sin, neox: this.neox };
  }
}
