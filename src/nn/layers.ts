// Basic layers: Linear ([out, in] weights, as nn.Linear), Embedding, RMSNorm and LayerNorm.
import { isFloating, type DType } from "../backends/dtype.js";
import {
  dropout, embedding, full, type Generator, layerNorm, linear, loraApply, quantizedEmbedding, quantizedShadowOf, rand, randn, rmsNorm, rmsNormQuantized, addRmsNorm, takesQuantizedActivations, unallocated,
  type DeviceLike, type QuantizedActivations, type Tensor, type TensorOptions,
} from "../tensor/index.js";
import type { QuantizedWeight } from "../tensor/ops/linalg.js";
import { OpError } from "../util/errors.js";
import { Module } from "./module.js";

export interface LayerOptions {
  dtype?: DType;
  device?: DeviceLike;
  /**
   * Parameters start unallocated (shape and dtype only; torch's device="meta" / skip_init): no memory and no random
   * init, for a loader that installs every one (Module.setParameter, or loadStateDict with assign). Default: allocated
   * and initialised as torch's reset_parameters does (from the default generator: manualSeed makes it reproducible).
   */
  unallocatedParameters?: boolean;
}

/**
 * A new parameter of `shape` in `dtype` (default the layer dtype), filled by `init` unless unallocated. Like
 * nn.Parameter it requires grad (floating dtypes); a loader's setParameter installs tensors as they come instead.
 */
export function newParameter(shape: number[], options: LayerOptions, init: (o: TensorOptions) => Tensor, dtype = options.dtype): Tensor {
  const o = { dtype: dtype ?? "float32", device: options.device };
  const t = options.unallocatedParameters ? unallocated(shape, o) : init(o);
  t.requiresGrad = isFloating(t.dtype);
  return t;
}

/** torch.nn.init.uniform_(-bound, bound) on a new tensor. */
const uniform = (shape: number[], bound: number) => (o: TensorOptions) => rand(shape, { ...o, low: -bound, high: bound });

/**
 * A Linear's LoRA slots (vLLM's max_loras adapters resident at once, each of rank maxRank; smaller ranks are
 * zero-padded, and a module an adapter leaves out has scale 0): slot s adds scales[s] * B_s (A_s x).
 */
export interface LinearLoraSlots {
  a: Tensor; // [slots, rank, inFeatures]: lora_A
  b: Tensor; // [slots, rank, outFeatures]: lora_B transposed
  scales: Tensor; // [slots]
}

/** A low-rank adapter being trained on a Linear (LoRA fine-tuning): forward adds scaling * B (A x). */
export interface LinearAdapter {
  a: Tensor; // [rank, inFeatures]
  b: Tensor; // [outFeatures, rank]
  scaling: number;
}

/**
 * torch.nn.Linear: y = x W^T + b, W [out, in]. A new layer is initialised as torch's, its parameters require grad.
 * @example const l = new Linear(3, 2, true); l.forward(ones([4, 3])).sum().backward(); l.weight.grad // [2, 3]
 */
export class Linear extends Module {
  weight: Tensor; // [outFeatures, inFeatures]
  bias: Tensor | null; // [outFeatures]
  /** LoRA slots (models/lora-slots.ts), or null when the model serves no adapters. */
  lora: LinearLoraSlots | null = null;
  /** The adapter a LoRA fine-tune trains (src/train/lora-train.ts), or null; not a parameter of the module. */
  adapter: LinearAdapter | null = null;

  constructor(
    readonly inFeatures: number,
    readonly outFeatures: number,
    bias = true, // torch's nn.Linear default
    options: LayerOptions = {},
  ) {
    super();
    // torch's reset_parameters: kaiming_uniform_(a=sqrt(5)) on [out, in] is U(-1/sqrt(in), 1/sqrt(in)), as is the bias
    const bound = inFeatures > 0 ? 1 / Math.sqrt(inFeatures) : 0;
    this.weight = this.param("weight", newParameter([outFeatures, inFeatures], options, uniform([outFeatures, inFeatures], bound)))!;
    // the bias takes the module dtype, as torch's (checkpoint loaders install float32 biases: models/loader.ts)
    this.bias = bias ? this.param("bias", newParameter([outFeatures], options, uniform([outFeatures], bound))) : null;
  }

  protected override onParameterReplaced(local: string, value: Tensor): void {
    if (local === "weight") this.weight = value;
    else if (local === "bias") this.bias = value;
  }

  /** x [..., in] -> [..., out]. `xq`: x's rows already quantized (RMSNorm.forwardFor), read by a quantized weight. */
  forward(x: Tensor, xq?: QuantizedActivations | null): Tensor {
    const out = linear(x, this.weight, this.bias, xq);
    if (this.adapter === null) return out;
    const { a, b, scaling } = this.adapter;
    const ax = linear(x, a, null);
    const bax = linear(ax, b, null);
    ax.dispose();
    const delta = bax.mul(scaling);
    bax.dispose();
    const sum = out.add(delta);
    out.dispose();
    delta.dispose();
    return sum;
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

/** torch.nn.Embedding: rows of weight [numEmbeddings, dim] (initialised N(0, 1), requiring grad) looked up by id. */
export class Embedding extends Module {
  weight: Tensor; // [numEmbeddings, dim]
  /** The table the lookups read when it is kept quantized (readQuantized), else null: the weight itself. */
  private quantizedTable: QuantizedWeight | null = null;

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
    this.weight = this.param("weight", newParameter([numEmbeddings, dim], options, (o) => randn([numEmbeddings, dim], o)))!; // N(0, 1), as torch
  }

  protected override onParameterReplaced(local: string, value: Tensor): void {
    if (local !== "weight") return;
    this.weight = value;
    this.quantizedTable = null;
  }

  /**
   * Looks rows up in `q` (a quantized [numEmbeddings, dim] table, quantized_embedding) from now on, until the weight is
   * replaced: the weight itself is then a placeholder (installQuantizedEmbedding). Inference only.
   */
  readQuantized(q: QuantizedWeight): void {
    if (q.outFeatures !== this.numEmbeddings || q.inFeatures !== this.dim)
      throw new RangeError(`[embedding] quantized table is [${q.outFeatures}, ${q.inFeatures}], the embedding is [${this.numEmbeddings}, ${this.dim}]`);
    this.quantizedTable = q;
  }

  forward(ids: Tensor): Tensor {
    const rows = this.quantizedTable ? quantizedEmbedding(ids, this.quantizedTable) : embedding(ids, this.weight);
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

/**
 * torch.nn.LayerNorm: normalises the trailing `normalizedShape` dims, then (elementwiseAffine) scales by `weight`
 * (ones to start) and shifts by `bias` (zeros; none with bias false), both of normalizedShape, kept in float32.
 * @example const ln = new LayerNorm(4); ln.forward(tensor([1, 2, 3, 4])) // [-1.342, -0.447, 0.447, 1.342]
 */
export class LayerNorm extends Module {
  readonly normalizedShape: number[];
  weight: Tensor | null;
  bias: Tensor | null;

  constructor(
    normalizedShape: number | readonly number[],
    readonly eps = 1e-5,
    { elementwiseAffine = true, bias = true }: { elementwiseAffine?: boolean; bias?: boolean } = {},
    options: LayerOptions = {},
  ) {
    super();
    const shape = typeof normalizedShape === "number" ? [normalizedShape] : [...normalizedShape];
    if (shape.length === 0 || shape.some((d) => !Number.isInteger(d) || d < 1))
      throw new OpError("layer_norm", `normalized_shape must be positive integers, got [${shape.join(", ")}]`);
    this.normalizedShape = shape;
    this.weight = elementwiseAffine ? this.param("weight", newParameter(shape, options, (o) => full(shape, 1, o), "float32"))! : null;
    this.bias = elementwiseAffine && bias ? this.param("bias", newParameter(shape, options, (o) => full(shape, 0, o), "float32"))! : null;
  }

  protected override onParameterReplaced(local: string, value: Tensor): void {
    if (local === "weight") this.weight = value;
    if (local === "bias") this.bias = value;
  }

  forward(x: Tensor): Tensor {
    return layerNorm(x, this.normalizedShape, this.weight, this.bias, this.eps);
  }
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
    // a scale of 1 to start with (torch's RMSNorm: ones; Gemma's offset 1 with a zero weight)
    this.weight = this.param("weight", newParameter([dim], options, (o) => full([dim], 1 - offset, o), "float32"))!;
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

  /**
   * x + residual and this norm of the sum in one kernel (vLLM's fused_add_rms_norm), the normed rows also quantized
   * for quantized consumers as forwardFor quantizes them. Inference only. Inputs addRmsNorm() does not take (other
   * than float32, or of two shapes) run as add() then forwardFor(). The caller disposes sum, out and xq.
   */
  addForwardFor(x: Tensor, residual: Tensor, consumers: readonly Linear[]): { sum: Tensor; out: Tensor; xq: QuantizedActivations | null } {
    if (x.dtype !== "float32" || residual.dtype !== "float32" || x.shape.join() !== residual.shape.join()) {
      const sum = x.add(residual);
      return { sum, ...this.forwardFor(sum, consumers) };
    }
    const quantize = consumers.some((c) => c.takesQuantizedActivations());
    return this.withScale((w) => addRmsNorm(x, residual, w, this.eps, quantize));
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

/**
 * torch.nn.Dropout: dropout(x, p) while training (each element zeroed with probability p, the rest scaled by
 * 1 / (1 - p)); the identity (an alias of x) after eval(). No parameters.
 * @example const drop = new Dropout(0.1); drop.forward(x); drop.eval().forward(x) // x
 */
export class Dropout extends Module {
  constructor(
    readonly p = 0.5,
    /** The masks' random stream (default: the global generator, which manualSeed() seeds). */
    readonly generator?: Generator,
  ) {
    super();
    if (!(p >= 0 && p <= 1)) throw new OpError("dropout", `dropout probability has to be between 0 and 1, but got ${p}`);
  }

  forward(x: Tensor): Tensor {
    return dropout(x, this.p, this.training, this.generator);
  }
}
