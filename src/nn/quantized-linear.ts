// Weight-only quantization of a model's Linear layers (vLLM's --quantization): each selected Linear keeps its
// module and parameter name, but its forward runs the quantized kernel and its float weight is released.
import type { QuantScheme } from "../backends/backend.js";
import { empty, type Tensor } from "../tensor/index.js";
import { canQuantize, quantizedLinear, quantizedShadowOf, quantizeWeight, setQuantizedShadow, type QuantizedWeight } from "../tensor/ops/linalg.js";
import { type Embedding, Linear } from "./layers.js";
import type { Module } from "./module.js";

export interface QuantizeOptions {
  /** Which Linear layers (by dotted module name) to quantize; default: all but lm_head and MoE routers. */
  filter?: (name: string, layer: Linear) => boolean;
  /** Scheme per layer (default: the scheme argument). */
  schemeFor?: (name: string, layer: Linear) => QuantScheme;
  /** Called after each layer. */
  onProgress?: (done: number, total: number) => void;
  /** Called for each layer that takes int8 instead of the scheme it was given (its in_features do not fit it). */
  onFallback?: (name: string, wanted: QuantScheme, used: QuantScheme) => void;
}

/**
 * The default selection: projections only (lm_head, MoE routers and Qwen2-MoE's shared-expert gate stay in the model
 * dtype, as in vLLM).
 */
export function defaultQuantFilter(name: string): boolean {
  return name !== "lm_head" && !/(^|\.)(gate|router|shared_expert_gate)$/.test(name); // MoE routers (gpt-oss: router) stay float
}

const quantized = new WeakMap<Linear, QuantizedWeight>();

/** The quantized weight behind a Linear, if it was quantized. */
export function quantizedWeightOf(layer: Linear): QuantizedWeight | undefined {
  return quantized.get(layer);
}

/**
 * Every tensor holding weights of `model`: its parameters, its quantized Linears' data, scales and row sums, and the
 * quantized copies float weights are read through (a tied LM head's).
 */
export function weightTensors(model: Module): Tensor[] {
  const out = new Set<Tensor>();
  const add = (q: QuantizedWeight | undefined): void => {
    if (!q) return;
    out.add(q.data);
    out.add(q.scales);
    if (q.rowSums) out.add(q.rowSums);
  };
  for (const [, m] of model.namedModules()) if (m instanceof Linear) add(quantized.get(m));
  for (const t of model.parameters()) {
    out.add(t);
    add(quantizedShadowOf(t));
  }
  return [...out];
}

/**
 * Quantizes the selected Linear layers in place; returns the number quantized. int4 and mxfp4 layers whose
 * in_features is not a multiple of 64 fall back to int8. The layer's "weight" parameter becomes the quantized data
 * when it has the weight's shape (int8, fp8), else a zero-stride placeholder of that shape (int4, mxfp4).
 *
 * @example
 * quantizeLinears(model, "int8"); // model.forward now runs int8 x f32 GEMV/GEMM kernels
 */
export function quantizeLinears(model: Module, scheme: QuantScheme, options: QuantizeOptions = {}): number {
  const filter = options.filter ?? defaultQuantFilter;
  const layers = model.namedModules().filter((e): e is [string, Linear] => e[1] instanceof Linear && !quantized.has(e[1]) && filter(e[0], e[1]));
  layers.forEach(([name, layer], i) => {
    const want = options.schemeFor?.(name, layer) ?? scheme;
    const s: QuantScheme = canQuantize(want, layer.inFeatures) ? want : "int8";
    if (s !== want) options.onFallback?.(name, want, s);
    installQuantizedWeight(model, name, layer, quantizeWeight(layer.weight, s));
    options.onProgress?.(i + 1, layers.length);
  });
  return layers.length;
}

/**
 * Makes the Linear `name` of `model` run on an already quantized weight (e.g. GGUF Q4_0 blocks repacked to int4
 * on load): its forward runs quant_matmul and its "weight" parameter becomes the quantized data (or a zero-stride
 * placeholder of the weight's shape when the data is packed, as for int4).
 */
export function installQuantizedWeight(model: Module, name: string, layer: Linear, q: QuantizedWeight): void {
  if (q.outFeatures !== layer.outFeatures || q.inFeatures !== layer.inFeatures)
    throw new RangeError(`[quantize] ${name}: quantized weight is [${q.outFeatures}, ${q.inFeatures}], layer is [${layer.outFeatures}, ${layer.inFeatures}]`);
  quantized.set(layer, q);
  const pname = name ? `${name}.weight` : "weight";
  let param = q.data;
  if (q.data.shape.length !== 2 || q.data.shape[1] !== layer.inFeatures) {
    const z = empty([1, 1], { dtype: "int8", device: q.data.device });
    param = z.expand(layer.outFeatures, layer.inFeatures);
  }
  model.setParameter(pname, param);
  // code that calls linear(x, layer.weight) itself (CausalLM.logits with an untied lm_head) reads q too
  setQuantizedShadow(param, q);
  layer.forward = (x, xq) => quantizedLinear(x, q, layer.bias, xq);
}

/**
 * Keeps an embedding table quantized (a GGUF token embedding in its own blocks, as llama.cpp reads it): lookups
 * dequantize the rows they read (Embedding.readQuantized), and the parameter `name`.weight becomes a zero-stride
 * placeholder of the table's shape whose quantized shadow is `q`, so that a tied LM head's linear() reads the same
 * blocks. Inference only.
 */
export function installQuantizedEmbedding(model: Module, name: string, emb: Embedding, q: QuantizedWeight): void {
  const param = empty([1, 1], { dtype: "float32", device: q.data.device }).expand(emb.numEmbeddings, emb.dim);
  model.setParameter(`${name}.weight`, param);
  setQuantizedShadow(param, q);
  emb.readQuantized(q);
}

/**
 * Quantizes a tied LM head (the embedding table read by linear() for logits): linear() then reads an int8/fp8
 * copy while the embedding lookup keeps the float table (+1 byte per element of memory).
 */
export function quantizeTiedHead(embedding: Tensor, scheme: QuantScheme): void {
  if (!quantizedShadowOf(embedding)) setQuantizedShadow(embedding, quantizeWeight(embedding, scheme));
}
