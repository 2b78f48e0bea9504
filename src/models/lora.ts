// LoRA adapters in PEFT's on-disk format (adapter_config.json + adapter_model.safetensors), as vLLM serves them:
// W x + scaling * B (A x) on the projections they name, scaling = lora_alpha / r (lora_alpha / sqrt(r) with
// use_rslora). Kiln applies them to the attention and dense MLP projections (q/k/v/o, gate/up/down, or Phi-3's fused
// qkv_proj and gate_up_proj), the modules vLLM's Llama-family models take LoRA on; anything else an adapter holds is
// refused rather than dropped.
import * as fs from "node:fs";
import * as path from "node:path";
import { readSafetensors } from "./formats/safetensors.js";
import { readTorchCheckpoint } from "./formats/torch-checkpoint.js";

/** An adapter that cannot be loaded: missing, malformed, unsupported, or not made for this model. */
export class LoraError extends Error {
  constructor(
    message: string,
    /** "not_found" when the adapter's directory or files are missing (vLLM answers 404), else "invalid". */
    readonly kind: "not_found" | "invalid" = "invalid",
  ) {
    super(message);
    this.name = "LoraError";
  }
}

/** The projections an adapter may target (the last part of the module name). */
export const LORA_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] as const;

/** Fused projections as checkpoints that store them so (Phi-3) name them: served adapters may target them too (LoraSlots). */
export const LORA_FUSED_MODULES = ["qkv_proj", "gate_up_proj"] as const;

/** One adapted projection: A [rank, in] and B [out, rank], row-major float32 as stored. */
export interface LoraModuleWeights {
  a: Float32Array;
  b: Float32Array;
  inFeatures: number;
  outFeatures: number;
}

/** A loaded adapter (host memory); the engine copies it into a device slot when a request uses it. */
export interface LoraAdapter {
  name: string;
  path: string;
  rank: number;
  alpha: number;
  /** lora_alpha / rank, or lora_alpha / sqrt(rank) with use_rslora. */
  scaling: number;
  /** By module name as the model names it, e.g. "model.layers.0.self_attn.q_proj". */
  modules: Map<string, LoraModuleWeights>;
}

const CONFIG_FILE = "adapter_config.json";
const WEIGHTS_FILE = "adapter_model.safetensors";

/**
 * Reads a PEFT LoRA adapter directory. Checks what does not depend on the model (format, rank <= maxRank,
 * supported options and modules); LoraSlots.check() then checks it against the model's shapes.
 *
 * @example
 * const adapter = readLoraAdapter("sql", "/adapters/sql-lora", { maxRank: 16 });
 */
export function readLoraAdapter(name: string, dir: string, options: { maxRank: number }): LoraAdapter {
  const where = `LoRA adapter "${name}" (${dir})`;
  const configPath = path.join(dir, CONFIG_FILE);
  if (!fs.existsSync(configPath)) throw new LoraError(`${where}: no ${CONFIG_FILE} found`, "not_found");
  let config: Record<string, unknown>;
  try {
    config = JSON.parse(fs.readFileSync(configPath, "utf8")) as Record<string, unknown>;
  } catch (e) {
    throw new LoraError(`${where}: ${CONFIG_FILE} is not valid JSON (${(e as Error).message})`);
  }
  if (typeof config !== "object" || config === null || Array.isArray(config)) throw new LoraError(`${where}: ${CONFIG_FILE} must hold an object`);
  const peftType = config.peft_type ?? "LORA";
  if (peftType !== "LORA") throw new LoraError(`${where}: peft_type ${JSON.stringify(peftType)} is not supported (only LORA)`);
  const rank = config.r;
  if (typeof rank !== "number" || !Number.isInteger(rank) || rank < 1) throw new LoraError(`${where}: "r" must be a positive integer, got ${JSON.stringify(rank)}`);
  if (rank > options.maxRank)
    throw new LoraError(`${where}: LoRA rank ${rank} is greater than max_lora_rank ${options.maxRank} (raise --max-lora-rank)`);
  const alpha = config.lora_alpha ?? 8;
  if (typeof alpha !== "number" || !Number.isFinite(alpha)) throw new LoraError(`${where}: "lora_alpha" must be a number, got ${JSON.stringify(alpha)}`);
  if (config.use_dora === true) throw new LoraError(`${where}: DoRA adapters (use_dora) are not supported`);
  if (config.bias !== undefined && config.bias !== null && config.bias !== "none")
    throw new LoraError(`${where}: adapter bias ${JSON.stringify(config.bias)} is not supported (only "none")`);
  const nonEmpty = (k: string): boolean => {
    const v = config[k];
    return v !== undefined && v !== null && (Array.isArray(v) ? v.length > 0 : typeof v === "object" ? Object.keys(v).length > 0 : true);
  };
  if (nonEmpty("modules_to_save")) throw new LoraError(`${where}: modules_to_save is not supported (the adapter replaces whole modules)`);
  for (const k of ["rank_pattern", "alpha_pattern"])
    if (nonEmpty(k)) throw new LoraError(`${where}: per-module ranks or alphas (${k}) are not supported`);
  if (config.fan_in_fan_out === true) throw new LoraError(`${where}: fan_in_fan_out adapters (GPT-2 Conv1D layers) are not supported`);
  const scaling = config.use_rslora === true ? alpha / Math.sqrt(rank) : alpha / rank;

  // PEFT's safetensors, else its PyTorch file (save_pretrained(safe_serialization=False)), as vLLM reads either
  const weightsPath = path.join(dir, WEIGHTS_FILE);
  const binPath = path.join(dir, "adapter_model.bin");
  const bin = !fs.existsSync(weightsPath) && fs.existsSync(binPath);
  if (!fs.existsSync(weightsPath) && !bin) throw new LoraError(`${where}: no ${WEIGHTS_FILE} (or adapter_model.bin) found`, "not_found");
  const handle = (() => {
    try {
      return bin ? readTorchCheckpoint(binPath) : readSafetensors(weightsPath);
    } catch (e) {
      throw new LoraError(`${where}: ${(e as Error).message}`);
    }
  })();
  try {
    // PEFT's names: base_model.model.<module>.lora_A.weight (an adapter name may follow lora_A: lora_A.default.weight)
    const parts = new Map<string, { a?: string; b?: string }>();
    for (const t of handle.tensors) {
      const m = /^base_model\.model\.(.+)\.lora_([AB])(?:\.[^.]+)?\.weight$/.exec(t.name);
      if (m === null) {
        if (/lora_embedding_[AB]/.test(t.name)) throw new LoraError(`${where}: embedding LoRA (${t.name}) is not supported`);
        throw new LoraError(`${where}: tensor "${t.name}" is not a LoRA A or B weight (modules_to_save and bias tensors are not supported)`);
      }
      const module = m[1]!;
      const last = module.slice(module.lastIndexOf(".") + 1);
      const supported: readonly string[] = [...LORA_TARGET_MODULES, ...LORA_FUSED_MODULES];
      if (!supported.includes(last)) throw new LoraError(`${where}: module "${module}" is not supported for LoRA (supported: ${supported.join(", ")})`);
      const e = parts.get(module) ?? {};
      if (m[2] === "A") e.a = t.name;
      else e.b = t.name;
      parts.set(module, e);
    }
    if (parts.size === 0) throw new LoraError(`${where}: ${WEIGHTS_FILE} holds no LoRA weights`);
    const modules = new Map<string, LoraModuleWeights>();
    for (const [module, { a, b }] of parts) {
      if (a === undefined || b === undefined) throw new LoraError(`${where}: module "${module}" has lora_${a === undefined ? "A" : "B"} missing`);
      const sa = handle.get(a)!.shape, sb = handle.get(b)!.shape;
      if (sa.length !== 2 || sb.length !== 2 || sa[0] !== rank || sb[1] !== rank)
        throw new LoraError(`${where}: module "${module}" has lora_A [${sa.join(", ")}] and lora_B [${sb.join(", ")}], expected [${rank}, in] and [out, ${rank}]`);
      modules.set(module, { a: handle.loadAsFloat32(a), b: handle.loadAsFloat32(b), inFeatures: sa[1]!, outFeatures: sb[0]! });
    }
    return { name, path: dir, rank, alpha, scaling, modules };
  } finally {
    handle.close();
  }
}
