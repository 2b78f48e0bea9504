// Feed-forward blocks: the SiLU-gated MLP of Llama-family models (and gpt-oss's clamped SwiGLU) and a top-k routed
// mixture of experts.
import {
  disposeQuantizedActivations, empty, linear, siluMul, siluMulQuantized, softmax, tensor, topk, type QuantizedActivations, type Tensor,
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
}

/** Top-k routed mixture of experts: softmax router, k experts per token, weighted sum of their outputs. */
export class MoE extends Module {
  readonly gate: Linear; // router [numExperts, hidden]
  readonly experts: GatedMLP[] = [];

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
  }

  /** x [T, hidden] -> [T, hidden]. Routing is read back to the host; each expert runs on its tokens only. */
  forward(x: Tensor): Tensor {
    const T = x.shape[0]!;
    const H = this.opts.hidden;
    const k = this.opts.topK;
    const logits = linear(x, this.gate.weight, this.gate.bias);
    const probs = softmax(logits, -1);
    logits.dispose();
    const { values, indices } = topk(probs, k, -1);
    probs.dispose();
    const w = values.dataSync() as Float32Array;
    const ids = indices.dataSync() as Int32Array;
    values.dispose();
    indices.dispose();
    const out = new Float32Array(T * H);
    const byExpert = new Map<number, { rows: number[]; weights: number[] }>();
    for (let t = 0; t < T; t++) {
      let norm = 1;
      if (this.opts.normTopkProb) {
        norm = 0;
        for (let j = 0; j < k; j++) norm += w[t * k + j]!;
      }
      for (let j = 0; j < k; j++) {
        const e = ids[t * k + j]!;
        const entry = byExpert.get(e) ?? { rows: [], weights: [] };
        entry.rows.push(t);
        entry.weights.push(w[t * k + j]! / norm);
        byExpert.set(e, entry);
      }
    }
    for (const [e, { rows, weights }] of byExpert) {
      const idx = tensor(Int32Array.from(rows), { device: x.device });
      const xe = x.indexSelect(0, idx);
      const ye = this.experts[e]!.forward(xe);
      const y = ye.dataSync() as Float32Array;
      for (let r = 0; r < rows.length; r++) {
        const dst = rows[r]! * H;
        const wt = weights[r]!;
        for (let i = 0; i < H; i++) out[dst + i] += wt * y[r * H + i]!;
      }
      for (const t of [idx, xe, ye]) t.dispose();
    }
    const res = empty([T, H], { device: x.device });
    res.device.backend.write(res.storage.buffer, 0, new Uint8Array(out.buffer));
    return res;
  }
}

