// LoRA test fixtures: random PEFT adapters for a model directory, and the same adapter merged into a copy of the
// model's weights (W + scaling * B A, computed here in float64): the outside expectation a served adapter must match.
import * as fs from "node:fs";
import * as path from "node:path";
import { readSafetensors, writeSafetensors } from "../../src/models/formats/safetensors.js";
import { mulberry32 } from "../../src/util/random.js";

export interface AdapterOptions {
  rank: number;
  alpha: number;
  /** Module names as the model names them, e.g. "model.layers.0.self_attn.q_proj". */
  modules: string[];
  seed: number;
  /** Spread of A and B's entries (uniform in [-std, std]); default 0.2. */
  std?: number;
  /** Extra adapter_config.json fields. */
  config?: Record<string, unknown>;
}

/** Every adaptable projection of a Llama-family model with `layers` layers. */
export function allProjections(layers: number): string[] {
  const out: string[] = [];
  for (let i = 0; i < layers; i++) {
    for (const p of ["q_proj", "k_proj", "v_proj", "o_proj"]) out.push(`model.layers.${i}.self_attn.${p}`);
    for (const p of ["gate_proj", "up_proj", "down_proj"]) out.push(`model.layers.${i}.mlp.${p}`);
  }
  return out;
}

/** Writes a PEFT adapter (adapter_config.json + adapter_model.safetensors) for the model in `modelDir` to `outDir`. */
export function writeLoraAdapter(modelDir: string, outDir: string, o: AdapterOptions): string {
  const weights = readSafetensors(path.join(modelDir, "model.safetensors"));
  const next = mulberry32(o.seed);
  const std = o.std ?? 0.2;
  const tensors = [];
  for (const m of o.modules) {
    const w = weights.get(`${m}.weight`);
    if (w === undefined) throw new Error(`the model has no ${m}.weight`);
    const [out, inF] = w.shape as [number, number];
    const a = Float32Array.from({ length: o.rank * inF }, () => (2 * next() - 1) * std);
    const b = Float32Array.from({ length: out * o.rank }, () => (2 * next() - 1) * std);
    tensors.push({ name: `base_model.model.${m}.lora_A.weight`, dtype: "F32" as const, shape: [o.rank, inF], data: a });
    tensors.push({ name: `base_model.model.${m}.lora_B.weight`, dtype: "F32" as const, shape: [out, o.rank], data: b });
  }
  weights.close();
  fs.mkdirSync(outDir, { recursive: true });
  const targets = [...new Set(o.modules.map((m) => m.slice(m.lastIndexOf(".") + 1)))];
  const config = { peft_type: "LORA", r: o.rank, lora_alpha: o.alpha, target_modules: targets, bias: "none", task_type: "CAUSAL_LM", ...o.config };
  fs.writeFileSync(path.join(outDir, "adapter_config.json"), JSON.stringify(config, null, 2));
  writeSafetensors(path.join(outDir, "adapter_model.safetensors"), tensors);
  return outDir;
}

/** Copies the model in `modelDir` to `outDir` with the adapter merged into its weights (float32 models). */
export function mergeLoraIntoModel(modelDir: string, adapterDir: string, outDir: string): string {
  const config = JSON.parse(fs.readFileSync(path.join(adapterDir, "adapter_config.json"), "utf8")) as { r: number; lora_alpha: number; use_rslora?: boolean };
  const scaling = config.use_rslora === true ? config.lora_alpha / Math.sqrt(config.r) : config.lora_alpha / config.r;
  const adapter = readSafetensors(path.join(adapterDir, "adapter_model.safetensors"));
  const weights = readSafetensors(path.join(modelDir, "model.safetensors"));
  const tensors = weights.tensors.map((t) => {
    if (t.dtype !== "F32") throw new Error(`mergeLoraIntoModel takes float32 models, ${t.name} is ${t.dtype}`);
    const w = weights.loadAsFloat32(t.name).slice();
    const module = t.name.replace(/\.weight$/, "");
    const aName = `base_model.model.${module}.lora_A.weight`;
    if (adapter.has(aName)) {
      const a = adapter.loadAsFloat32(aName);
      const b = adapter.loadAsFloat32(`base_model.model.${module}.lora_B.weight`);
      const [out, inF] = t.shape as [number, number];
      const r = config.r;
      for (let n = 0; n < out; n++)
        for (let k = 0; k < inF; k++) {
          let d = 0;
          for (let j = 0; j < r; j++) d += b[n * r + j]! * a[j * inF + k]!;
          w[n * inF + k] = w[n * inF + k]! + scaling * d;
        }
    }
    return { name: t.name, dtype: "F32" as const, shape: t.shape, data: w };
  });
  weights.close();
  adapter.close();
  fs.mkdirSync(outDir, { recursive: true });
  for (const f of fs.readdirSync(modelDir)) if (f !== "model.safetensors") fs.copyFileSync(path.join(modelDir, f), path.join(outDir, f));
  writeSafetensors(path.join(outDir, "model.safetensors"), tensors);
  return outDir;
}
