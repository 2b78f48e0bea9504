// Feed-forward blocks: the SiLU-gated MLP of Llama-family models (and gpt-oss's clamped SwiGLU) and a top-k routed
// mixture of experts (with Qwen2-MoE's gated shared expert).
import type { MoeActivation } from "../backends/backend.js";
import {
  disposeQuantizedActivations, linear, moe, quantizedShadowOf, siluMul, siluMulQuantized, softmax, topk, type MoeExpert, type MoeProjection,
  type QuantizedActivations, type Tensor,
} from "../tensor/index.js";
import { Linear, type LayerOptions } from "./layers.js";
import { Module } from "./module.js";
import { ColumnParallelLinear, RowParallelLinear, type TensorParallel } from "./parallel.js";

/** gpt-oss's clamped SwiGLU parameters (MoeConfig.clampedSwiglu). */
export interface ClampedSwiglu {
  alpha: number;
  limit: number;
}

/**
 * down(act(gate(x)) * up(x)), act SiLU (Llama) or GELU-tanh (Gemma), or gpt-oss's clamped SwiGLU (`clamped`); HF
 * names gate_proj / up_proj / down_proj.
 */
export class GatedMLP extends Module {
  readonly gateProj: Linear;
  readonly upProj: Linear;
  readonly downProj: Linear;

  constructor(
    hidden: number,
    intermediate: number,
    bias = false,
    options: LayerOptions = {},
    names = ["gate_proj", "up_proj", "down_proj"] as const,
    readonly act: "silu" | "gelu_tanh" = "silu",
    /** Split the intermediate features over the tensor-parallel ranks: gate/up column-parallel, down row-parallel. */
    readonly tp: TensorParallel | null = null,
    /** gpt-oss: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit), in place of act. */
    readonly clamped: ClampedSwiglu | null = null,
  ) {
    super();
    const column = (): Linear => (tp === null ? new Linear(hidden, intermediate, bias, options) : new ColumnParallelLinear(hidden, intermediate, bias, tp, options));
    this.gateProj = this.module(names[0], column());
    this.upProj = this.module(names[1], column());
    this.downProj = this.module(names[2], tp === null ? new Linear(intermediate, hidden, bias, options) : new RowParallelLinear(intermediate, hidden, bias, tp, options));
  }

  /** The projections that read forward()'s x (for RMSNorm.forwardFor). */
  get inputProjections(): readonly Linear[] {
    return [this.gateProj, this.upProj];
  }

  /**
   * x [T, hidden] -> [T, hidden]. `xq`: x's rows already quantized, for quantized gate/up projections; `loraSlots`:
   * each row's LoRA slot (PagedContext.loraSlots).
   */
  forward(x: Tensor, xq?: QuantizedActivations | null, loraSlots?: Tensor | null): Tensor {
    // both products first, then their LoRA deltas (see Linear.withLora)
    const g0 = this.gateProj.forward(x, xq);
    const u0 = this.upProj.forward(x, xq);
    const g = this.gateProj.withLora(g0, x, loraSlots);
    const u = this.upProj.withLora(u0, x, loraSlots);
    // a quantized down projection reads its input's rows quantized by the silu·mul kernel itself
    const h = this.clamped !== null ? { out: clampedSwiglu(g, u, this.clamped), xq: null }
      : this.act === "gelu_tanh" ? { out: geluTanhMul(g, u), xq: null }
      : this.downProj.takesQuantizedActivations() ? siluMulQuantized(g, u) : { out: siluMul(g, u), xq: null };
    g.dispose();
    u.dispose();
    const out = this.downProj.project(h.out, h.xq, loraSlots);
    h.out.dispose();
    if (h.xq) disposeQuantizedActivations(h.xq);
    return out;
  }
}

/** gelu_tanh(gate) * up: Gemma's GeGLU. */
function geluTanhMul(gate: Tensor, up: Tensor): Tensor {
  const g = gate.gelu("tanh");
  const out = g.mul(up);
  g.dispose();
  return out;
}

/** gpt-oss's activation: g = min(gate, limit), (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g). */
export function clampedSwiglu(gate: Tensor, up: Tensor, { alpha, limit }: ClampedSwiglu): Tensor {
  const g = gate.clamp(undefined, limit);
  const ag = g.mul(alpha);
  const sig = ag.sigmoid();
  const glu = g.mul(sig);
  const uc = up.clamp(-limit, limit);
  const u1 = uc.add(1);
  const out = u1.mul(glu);
  for (const t of [g, ag, sig, glu, uc, u1]) t.dispose();
  return out;
}

export interface MoeOptions {
  hidden: number;
  expertIntermediate: number;
  numExperts: number;
  topK: number;
  normTopkProb: boolean;
  /** Mixtral names experts' projections w1 (gate), w3 (up), w2 (down); Qwen3-MoE uses gate/up/down_proj. */
  expertNames: readonly [string, string, string];
  /** The router's name: "gate" (Mixtral, Qwen3-MoE) or "router" (gpt-oss). Default "gate". */
  routerName?: string;
  /** gpt-oss: biases on the router and on every expert projection. Default false. */
  routerBias?: boolean;
  expertBias?: boolean;
  /** gpt-oss's expert activation (GatedMLP's `clamped`); null / absent: silu(gate) * up. */
  clampedSwiglu?: ClampedSwiglu | null;
  /**
   * Qwen2-MoE: the hidden size of a shared expert (`shared_expert`, a SiLU GatedMLP every token runs) whose output is
   * scaled by sigmoid(shared_expert_gate(x)) ([1, hidden], no bias) and added to the routed sum; null / absent: none.
   */
  sharedExpertIntermediate?: number | null;
}

/**
 * Top-k routed mixture of experts: softmax router, k experts per token, weighted sum of their outputs (plus, for
 * Qwen2-MoE, a sigmoid-gated shared expert).
 */
export class MoE extends Module {
  readonly gate: Linear; // router [numExperts, hidden]
  readonly experts: GatedMLP[] = [];
  readonly sharedExpert: GatedMLP | null = null;
  readonly sharedExpertGate: Linear | null = null; // [1, hidden]

  constructor(
    readonly opts: MoeOptions,
    options: LayerOptions = {},
  ) {
    super();
    this.gate = this.module(opts.routerName ?? "gate", new Linear(opts.hidden, opts.numExperts, opts.routerBias === true, options));
    const holder = this.module("experts", new Module());
    for (let e = 0; e < opts.numExperts; e++) {
      const names = opts.expertNames as unknown as readonly ["gate_proj", "up_proj", "down_proj"];
      const mlp = new GatedMLP(opts.hidden, opts.expertIntermediate, opts.expertBias === true, options, names, "silu", null, opts.clampedSwiglu ?? null);
      holder.addModule(String(e), mlp);
      this.experts.push(mlp);
    }
    const shared = opts.sharedExpertIntermediate ?? null;
    if (shared !== null) {
      this.sharedExpert = this.module("shared_expert", new GatedMLP(opts.hidden, shared, false, options));
      this.sharedExpertGate = this.module("shared_expert_gate", new Linear(opts.hidden, 1, false, options));
    }
  }

  /**
   * x [T, hidden] -> [T, hidden]. The router's top-k stays on the device: one moe kernel runs each expert on the
   * tokens that chose it and sums their weighted outputs, with no host read (so step graphs capture it).
   * `loraSlots`: each row's LoRA slot, for adapters on the shared expert's projections (PagedContext.loraSlots).
   */
  forward(x: Tensor, loraSlots: Tensor | null = null): Tensor {
    const { values, indices } = this.route(x);
    const routed = moe(x, indices, values, this.expertWeights(), this.activation);
    values.dispose();
    indices.dispose();
    if (this.sharedExpert === null || this.sharedExpertGate === null) return routed;
    // routed + sigmoid(x · g) * shared(x): the gate [T, 1] scales each token's shared-expert row
    const s = this.sharedExpert.forward(x, null, loraSlots);
    const logit = this.sharedExpertGate.forward(x);
    const g = logit.sigmoid();
    const gated = s.mul(g);
    const out = routed.add(gated);
    for (const t of [routed, s, logit, g, gated]) t.dispose();
    return out;
  }

  /**
   * The router's choice, on the device: softmax over all experts, the top k, renormalised to sum 1 where
   * normTopkProb (gpt-oss's softmax over its top-k logits is that: the renormalised top-k of the full softmax).
   * values float32 [T, topK], indices int32 [T, topK].
   */
  route(x: Tensor): { values: Tensor; indices: Tensor } {
    const logits = linear(x, this.gate.weight, this.gate.bias);
    const probs = softmax(logits, -1);
    logits.dispose();
    const { values, indices } = topk(probs, this.opts.topK, -1);
    probs.dispose();
    if (!this.opts.normTopkProb) return { values, indices };
    const total = values.sum(-1, true);
    const normed = values.div(total);
    values.dispose();
    total.dispose();
    return { values: normed, indices };
  }

  /**
   * The experts' weights as the moe kernel takes them: the quantized weight a quantized Linear's parameter stands
   * for (installQuantizedWeight), else the float parameter.
   */
  expertWeights(): MoeExpert[] {
    const proj = (l: Linear): MoeProjection => ({ weight: quantizedShadowOf(l.weight) ?? l.weight, bias: l.bias });
    return this.experts.map((m) => ({ gate: proj(m.gateProj), up: proj(m.upProj), down: proj(m.downProj) }));
  }

  private get activation(): MoeActivation {
    const c = this.opts.clampedSwiglu;
    return c ? { kind: "clamped_swiglu", alpha: c.alpha, limit: c.limit } : { kind: "silu" };
  }
}

