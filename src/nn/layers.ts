// Basic layers: Linear ([out, in] weights, as nn.Linear), Embedding and RMSNorm.
import type { DType } from "../backends/dtype.js";
import {
  embedding, empty, linear, loraApply, quantizedShadowOf, rmsNorm, rmsNormQuantized, takesQuantizedActivations, unallocated, type DeviceLike,
  type QuantizedActivations, type Tensor,
} from "../tensor/index.js";
import { Module } from "./module.js";

export interface LayerOptions {
  dtype?: DType;
  device?: DeviceLike;
  /** Parameters start unallocated (shape and dtype only) for a loader that assigns every one; default: allocated. */
  unallocatedParameters?: boolean;
}

/** A new parameter of `shape` in `dtype` (default the layer dtype). */
function newParameter(shape: number[], options: LayerOptions, dtype = options.dtype): Tensor {
  const o = { dtype, device: options.device };
  return options.unallocatedParameters ? unallocated(shape, o) : empty(shape, o);
}

/**
 * A Linear's LoRA slots (vLLM's max_loras adapters resident at once, each of rank maxRank; smaller ranks are
 * zero-padded, and a module an adapter leaves out has scale 0): slot s adds scales[s] * B_s (A_s x).
 */
export interface LinearLoraSlots {
  a: Tensor; // [slots, rank, inFeatures]: lora_A
  b: Tensor; // [slots, rank, outFeatures]: lora_B transposed
  scales: Tensor; // [slots]
}

export class Linear extends Module {
  weight: Tensor; // [outFeatures, inFeatures]
  bias: Tensor | null; // [outFeatures]
  /** LoRA slots (models/lora-slots.ts), or null when the model serves no adapters. */
  lora: LinearLoraSlots | null = null;

  constructor(
    readonly inFeatures: number,
    readonly outFeatures: number,
    bias = false,
    options: LayerOptions = {},
  ) {
    super();
    this.weight = this.param("weight", newParameter([outFeatures, inFeatures], options))!;
    this.bias = bias ? this.param("bias", newParameter([outFeatures], options, "float32")) : null;
  }

  protected override onParameterReplaced(local: string, value: Tensor): void {
    if (local === "weight") this.weight = value;
    else if (local === "bias") this.bias = value;
  }

  /** x [..., in] -> [..., out]. `xq`: x's rows already quantized (RMSNorm.forwardFor), read by a quantized weight. */
  forward(x: Tensor, xq?: QuantizedActivations | null): Tensor {
    return linear(x, this.weight, this.bias, xq);
  }

  /** forward(x, xq) plus each row's LoRA delta (withLora). */
  project(x: Tensor, xq: QuantizedActivations | null | undefined, loraSlots: Tensor | null | undefined): Tensor {
    return this.withLora(this.forward(x, xq), x, loraSlots);
  }

  /**
   * out (this layer's forward(x)) plus each row's LoRA delta: `loraSlots` int32 [T] names row t's slot (-1: none;
   * PagedContext.loraSlots), one loraApply kernel. Consumes out; without slots, or without LoRA on this layer,
   * returns out itself. Kept apart from forward so that projections of one input run back to back (the step graphs
   * merge such products into one job).
   */
  withLora(out: Tensor, x: Tensor, loraSlots: Tensor | null | undefined): Tensor {
    if (this.lora === null || loraSlots === null || loraSlots === undefined) return out;
    const sum = loraApply(out, x, this.lora.a, this.lora.b, this.lora.scales, loraSlots);
    out.dispose();
    return sum;
  }

  /** Whether forward() reads pre-quantized activations (a weight-only quantized weight whose scheme quantizes x). */
  takesQuantizedActivations(): boolean {
    const q = quantizedShadowOf(this.weight);
    return q !== undefined && takesQuantizedActivations(q.scheme);
  }
}

export class Embedding extends Module {
  weight: Tensor; // [numEmbeddings, dim]

  /**
   * `scale`: each looked-up row is multiplied by it, or null; `roundScale`: the scale first rounded to the weights'
   * dtype (Gemma's sqrt(hidden), which HF casts to it; Granite's embedding_multiplier is used as it is).
   */
  constructor(
    readonly numEmbeddings: number,
    readonly dim: number,
    options: LayerOptions = {},
    readonly scale: number | null = null,
    readonly roundScale = false,
  ) {
    super();
    this.weight = this.param("weight", newParameter([numEmbeddings, dim], options))!;
  }

  protected override onParameterReplaced(local: string, value: Tensor): void {
    if (local === "weight") this.weight = value;
  }

  forward(ids: Tensor): Tensor {
    const rows = embedding(ids, this.weight);
    if (this.scale === null) return rows;
    const out = rows.mul(this.roundScale && this.weight.dtype === "bfloat16" ? bf16Round(this.scale) : this.scale);
    rows.dispose();
    return out;
  }
}

/** x rounded to the nearest bfloat16 (ties to even). */
function bf16Round(x: number): number {
  const f = new Float32Array([x]);
  const u = new Uint32Array(f.buffer);
  u[0] = ((u[0]! + 0x7fff + ((u[0]! >>> 16) & 1)) >>> 16) << 16;
  return f[0]!;
}

export class RMSNorm extends Module {
  weight: Tensor; // [dim], kept in float32

  /** `offset`: the norm scales by offset + weight (Gemma's (1 + w)); 0 for Llama's. */
  constructor(
    readonly dim: number,
    readonly eps: number,
    options: LayerOptions = {},
    readonly offset = 0,
  ) {
    super();
    this.weight = this.param("weight", newParameter([dim], options, "float32"))!;
  }

  protected override onParameterReplaced(local: string, value: Tensor): void {
    if (local === "weight") this.weight = value;
  }

  forward(x: Tensor): Tensor {
    return this.withScale((w) => rmsNorm(x, w, this.eps));
  }

  /**
   * forward(x), and when a consumer is a quantized Linear, its rows quantized once in the same kernel (rms_norm fused
   * with the activation quantization) for every consumer's forward(out, xq). The caller disposes xq.
   */
  forwardFor(x: Tensor, consumers: readonly Linear[]): { out: Tensor; xq: QuantizedActivations | null } {
    if (!consumers.some((c) => c.takesQuantizedActivations())) return { out: this.forward(x), xq: null };
    return this.withScale((w) => rmsNormQuantized(x, w, this.eps));
  }

  /** f of the scale: the weight, or offset + weight made per call (a [dim] add; training sees the weight's gradient). */
  private withScale<T>(f: (scale: Tensor) => T): T {
    if (this.offset === 0) return f(this.weight);
    const scale = this.weight.add(this.offset);
    try {
      return f(scale);
    } finally {
      scale.dispose();
    }
  }
}
