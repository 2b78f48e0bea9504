// LoRA fine-tuning ([lora] enable = true): low-rank adapters on the named projections of a pretrained model (from
// [checkpoint] initial_load_path), trained while the model's own weights stay frozen, and saved in PEFT's format
// (adapter_config.json + adapter_model.safetensors) for `kiln serve --enable-lora --lora-modules name=DIR` or vLLM.
// Initialised as PEFT does: A uniform in +-1/sqrt(in) (kaiming_uniform with a = sqrt(5)), B zero, so training starts
// from the model itself; scaling = alpha / rank (alpha / sqrt(rank) with use_rslora).
import * as fs from "node:fs";
import * as path from "node:path";
import type { CausalLM } from "../models/causal-lm.js";
import { writeSafetensors } from "../models/formats/safetensors.js";
import { LORA_TARGET_MODULES } from "../models/lora.js";
import { Linear } from "../nn/layers.js";
import { Module } from "../nn/module.js";
import { manualSeed, matmul, noGrad, rand, zeros, type Tensor } from "../tensor/index.js";
import { TrainConfigError, type TrainConfig } from "./train-config.js";

/** The adapters being trained, by PEFT tensor name (base_model.model.<module>.lora_A.weight / lora_B.weight). */
export interface TrainedLora {
  named: [string, Tensor][];
  scaling: number;
  modules: string[];
  /** The adapters as one module's parameters (what DistributedDataParallel wraps in a data-parallel run). */
  module: Module;
}

/** The adapter tensors registered as parameters of one module (the model's own modules do not hold them). */
class AdapterSet extends Module {
  constructor(tensors: readonly Tensor[]) {
    super();
    tensors.forEach((t, i) => this.param(`adapter${i}`, t));
  }
}

/** Freezes `model` and puts an adapter on each projection [lora] target_modules names; returns the adapters. */
export function attachLoraAdapters(model: CausalLM, cfg: TrainConfig): TrainedLora {
  const l = cfg.lora;
  const unknown = l.target_modules.filter((t) => !(LORA_TARGET_MODULES as readonly string[]).includes(t));
  if (unknown.length > 0) throw new TrainConfigError(`[lora] target_modules ${unknown.join(", ")}: LoRA goes on ${LORA_TARGET_MODULES.join(", ")}`);
  for (const [, p] of model.namedParameters()) p.requiresGrad = false;
  const scaling = l.use_rslora ? l.alpha / Math.sqrt(l.rank) : l.alpha / l.rank;
  manualSeed(cfg.job.seed);
  const named: [string, Tensor][] = [];
  const modules: string[] = [];
  for (const [name, m] of model.namedModules()) {
    if (!(m instanceof Linear) || !l.target_modules.includes(name.slice(name.lastIndexOf(".") + 1))) continue;
    const bound = 1 / Math.sqrt(m.inFeatures);
    // (in the weights' dtype: the products take one dtype)
    const a = rand([l.rank, m.inFeatures], { low: -bound, high: bound, dtype: m.weight.dtype });
    const b = zeros([m.outFeatures, l.rank], { dtype: m.weight.dtype });
    a.requiresGrad = true;
    b.requiresGrad = true;
    m.adapter = { a, b, scaling };
    named.push([`base_model.model.${name}.lora_A.weight`, a], [`base_model.model.${name}.lora_B.weight`, b]);
    modules.push(name);
  }
  if (modules.length === 0) throw new TrainConfigError(`[lora] target_modules ${l.target_modules.join(", ")}: the model has none of them`);
  return { named, scaling, modules, module: new AdapterSet(named.map(([, t]) => t)) };
}

/**
 * Merges every adapter into its projection's weight, W + scaling * B A (PEFT's merge_and_unload: computed in float32,
 * cast to the weight's dtype), and takes the adapters off: the model then computes what it did with them.
 */
export function mergeAdapters(model: CausalLM): void {
  noGrad(() => {
    const f32 = (t: Tensor): Tensor => (t.dtype === "float32" ? t : t.to("float32"));
    for (const [name, m] of model.namedModules()) {
      if (!(m instanceof Linear) || m.adapter === null) continue;
      const { a, b, scaling } = m.adapter;
      const delta = matmul(f32(b), f32(a)).mul(scaling);
      const w = f32(m.weight).add(delta);
      model.setParameter(`${name}.weight`, w.dtype === m.weight.dtype ? w : w.to(m.weight.dtype));
      m.adapter = null;
    }
  });
}

/** Writes the adapters as a PEFT LoRA directory for the model at `baseDir`. */
export function exportLoraAdapter(dir: string, lora: TrainedLora, cfg: TrainConfig, baseDir: string): void {
  fs.mkdirSync(dir, { recursive: true });
  const config = {
    peft_type: "LORA",
    task_type: "CAUSAL_LM",
    base_model_name_or_path: path.resolve(baseDir),
    r: cfg.lora.rank,
    lora_alpha: cfg.lora.alpha,
    use_rslora: cfg.lora.use_rslora,
    target_modules: [...new Set(lora.modules.map((m) => m.slice(m.lastIndexOf(".") + 1)))],
    lora_dropout: 0,
    bias: "none",
    fan_in_fan_out: false,
    inference_mode: true,
  };
  fs.writeFileSync(path.join(dir, "adapter_config.json"), `${JSON.stringify(config, null, 2)}\n`);
  const tensors = lora.named.map(([name, t]) => ({ name, dtype: "F32" as const, shape: [...t.shape], data: (t.dtype === "float32" ? t : t.to("float32")).dataSync() as Float32Array }));
  writeSafetensors(path.join(dir, "adapter_model.safetensors"), tensors, { format: "pt" });
}
