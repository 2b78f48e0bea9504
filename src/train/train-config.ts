// `kiln train --config FILE.toml`: TorchTitan-style sections, parsed with smol-toml, validated
// against one schema table (types, ranges, enums, defaults, aliases), and returned as a typed
// TrainConfig. Unknown sections and keys are errors that name them and suggest the closest key.
import { readFileSync } from "node:fs";
import { parse as parseToml } from "smol-toml";
import { KilnError } from "../util/errors.js";
import { OPTIMIZER_NAMES, resolveOptimizerConfig, type OptimizerName } from "./optimizer-config.js";

export class TrainConfigError extends KilnError {
  override name = "TrainConfigError";
}

export interface JobConfig {
  dump_folder: string;
  description: string;
  seed: number;
  /** TorchTitan's: log the whole config at the start. */
  print_args: boolean;
  use_for_integration_test: boolean;
}

export interface ModelConfig {
  /** The Llama architecture (TorchTitan's "llama3" names it too). */
  name: "llama" | "llama3";
  flavor: string | null;
  dim: number;
  n_layers: number;
  n_heads: number;
  n_kv_heads: number;
  /** null: take the trained/loaded tokenizer's vocabulary size. */
  vocab_size: number | null;
  ffn_dim: number;
  norm_eps: number;
  rope_theta: number;
  max_seq_len: number;
  /** A tokenizer.json file or a directory holding one; null: train one on the dataset. */
  tokenizer_path: string | null;
  tokenizer_vocab_size: number;
  tokenizer_min_frequency: number;
  tokenizer_special_tokens: string[];
  /** TorchTitan's model converters (float8, mx): none is supported (a TrainConfigError names them). */
  converters: string[];
  /**
   * TorchTitan's attention mask over packed documents: "causal" (a token sees every earlier token of its row) or
   * "block_causal" (only those of its own document; documents end at the EOS separator, which belongs to the one it ends).
   */
  attn_mask_type: AttnMaskType;
  /** TorchTitan's attention kernel ("sdpa", "flex", "varlen"; varlen needs block_causal): Kiln's one dense path runs either mask. */
  attn_type: "sdpa" | "flex" | "varlen";
  /** TorchTitan's earlier switch to FlexAttention (no effect here, as attn_type). */
  use_flex_attn: boolean;
}

/** The attention masks [model] attn_mask_type takes. */
export const ATTN_MASK_TYPES = ["causal", "block_causal"] as const;
export type AttnMaskType = (typeof ATTN_MASK_TYPES)[number];

export interface OptimizerConfig {
  /** torch.optim's name; optimizer-config.ts says which of the keys below each reads. */
  name: OptimizerName;
  lr: number;
  eps: number;
  beta1: number;
  beta2: number;
  weight_decay: number;
  momentum: number;
  /** SGD. */
  dampening: number;
  nesterov: boolean;
  /** Adam, AdamW. */
  amsgrad: boolean;
  /** RMSprop: the squared-gradient average's smoothing constant, and whether to normalize by the variance. */
  alpha: number;
  centered: boolean;
  /** Adagrad. */
  lr_decay: number;
  initial_accumulator_value: number;
  /** NAdam. */
  momentum_decay: number;
  /** NAdam, RAdam: AdamW-style decay instead of the L2 penalty. */
  decoupled_weight_decay: boolean;
  /** TorchTitan's (for-loop, foreach, fused): accepted; Kiln's optimizers update in one loop over float32 arrays. */
  implementation: "for-loop" | "foreach" | "fused";
}

export interface LrSchedulerConfig {
  warmup_steps: number;
  decay_type: "linear" | "cosine" | "sqrt";
  /** The floor the decay ends at (TorchTitan's min_lr_factor x lr when that is given). */
  lr_min: number;
  /** TorchTitan's: the fraction of the steps spent decaying, after a stable phase (warmup-stable-decay); null: all after warmup. */
  decay_ratio: number | null;
  /** TorchTitan's: lr_min as a fraction of [optimizer] lr (null: lr_min as given). */
  min_lr_factor: number | null;
}

/**
 * TorchTitan's [parallelism]: Kiln trains data-parallel over `kiln run`'s ranks (DistributedDataParallel, each rank
 * the whole model), so the degrees must describe that: replicate x shard = the world (-1: the rest), the others 1.
 * shard > 1 splits the optimizer state over each run of shard ranks (ZeRO-1: recipe.ts, zero-redundancy-optimizer.ts).
 */
export interface ParallelismConfig {
  data_parallel_replicate_degree: number;
  data_parallel_shard_degree: number;
  tensor_parallel_degree: number;
  pipeline_parallel_degree: number;
  context_parallel_degree: number;
  expert_parallel_degree: number;
  fsdp_reshard_after_forward: "default" | "never" | "always";
  enable_async_tensor_parallel: boolean;
}

export interface TrainingConfig {
  local_batch_size: number;
  seq_len: number;
  steps: number;
  max_norm: number;
  gradient_accumulation_steps: number;
  /**
   * TorchTitan's: local_batch_size x data-parallel ranks x gradient accumulation steps; -1 = whatever those make. Given,
   * it sets the accumulation steps for the run's ranks (checked where the ranks are known).
   */
  global_batch_size: number;
  /** TorchTitan's: a local path to read the dataset from (Kiln's formats: text files or directories, .jsonl). */
  dataset_path: string | null;
  /** "brown", "nlp-corpus", or a path to a text file or directory. */
  dataset: string;
  mixed_precision_param: "bfloat16" | "float32";
  /** Share of documents rewritten as ChatML turns (user: the opening, assistant: the continuation). */
  chat_format_fraction: number;
}

export interface CheckpointConfig {
  enable: boolean;
  folder: string;
  interval: number;
  keep_latest_k: number;
  export_dtype: "float32" | "bfloat16" | "float16";
  last_save_model_only: boolean;
  async_mode: "disabled" | "async" | "async_with_pinned_mem";
  /** TorchTitan's: resume from this step's checkpoint (-1: the newest). */
  load_step: number;
  /** TorchTitan's: the last save in Hugging Face format (Kiln always exports one). */
  last_save_in_hf: boolean;
  /** TorchTitan's: a Hugging Face model directory to start from (fine-tuning) instead of random weights; the model's shape and tokenizer are its own. */
  initial_load_path: string | null;
  /** TorchTitan's: initial_load_path is in Hugging Face format (the only one Kiln reads: must be true with a path). */
  initial_load_in_hf: boolean;
  /** TorchTitan's: load the model only, not the optimizer or step (a Hugging Face directory holds only the model). */
  initial_load_model_only: boolean;
}

export interface MetricsConfig {
  log_freq: number;
  enable_tensorboard: boolean; // accepted for TorchTitan compatibility, ignored (a warning says so)
  save_tb_folder: string;
  enable_wandb: boolean;
  disable_color_printing: boolean;
  /** SVG loss curve, relative to dump_folder unless absolute; "" disables. */
  loss_curve: string;
}

export interface ValidationConfig {
  enable: boolean;
  /** TorchTitan's: the data validated on (as [training] dataset); null: a held-out [validation] fraction of the training documents. */
  dataset: string | null;
  freq: number;
  steps: number;
  /** Fraction of documents held out for validation. */
  fraction: number;
}

/** LoRA fine-tuning (Kiln's section, in PEFT's LoraConfig terms): adapters trained on a frozen initial_load_path model. */
export interface LoraTrainConfig {
  enable: boolean;
  rank: number;
  alpha: number;
  /** The projections adapted (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj). */
  target_modules: string[];
  use_rslora: boolean;
  /** Also export the model with the adapters merged into its weights (PEFT's merge_and_unload), beside the adapter. */
  export_merged: boolean;
}

/** TorchTitan sections Kiln reads only to say what it does not do (profiling, activation checkpointing, compile, float8). */
type Accepted = Record<string, unknown>;

export interface TrainConfig {
  job: JobConfig;
  model: ModelConfig;
  optimizer: OptimizerConfig;
  lr_scheduler: LrSchedulerConfig;
  training: TrainingConfig;
  checkpoint: CheckpointConfig;
  metrics: MetricsConfig;
  validation: ValidationConfig;
  lora: LoraTrainConfig;
  parallelism: ParallelismConfig;
  profiling: Accepted;
  activation_checkpoint: { mode: "none" | "selective" | "full"; selective_ac_option: string };
  compile: Accepted;
  float8: Accepted;
  comm: Accepted;
  /** What the recipe accepted without acting on it (TorchTitan settings for GPUs): one line each, logged at the start. */
  warnings: string[];
}

/** Llama flavors sized for CPU training (explicit dims in [model] override them). */
export const LLAMA_FLAVORS: Record<string, Partial<ModelConfig>> = {
  debugmodel: { dim: 256, n_layers: 6, n_heads: 16, n_kv_heads: 16 }, // TorchTitan's debugmodel
  // TorchTitan's debugmodel with FlexAttention / varlen attention over packed documents
  debugmodel_flex_attn: { dim: 256, n_layers: 6, n_heads: 16, n_kv_heads: 16, attn_mask_type: "block_causal" },
  debugmodel_varlen_attn: { dim: 256, n_layers: 6, n_heads: 16, n_kv_heads: 16, attn_mask_type: "block_causal" },
  tiny: { dim: 128, n_layers: 4, n_heads: 4, n_kv_heads: 2 },
  small: { dim: 384, n_layers: 6, n_heads: 6, n_kv_heads: 2 },
  medium: { dim: 512, n_layers: 8, n_heads: 8, n_kv_heads: 4 },
};

// ---------------------------------------------------------------- schema

type FieldType =
  | { kind: "int"; min?: number }
  | { kind: "float"; min?: number }
  | { kind: "bool" }
  | { kind: "string" }
  | { kind: "enum"; values: readonly string[] }
  | { kind: "strings" };

interface Field {
  type: FieldType;
  /** undefined: required after flavor/derivation; null allowed where the type says so. */
  def: unknown;
  nullable?: boolean;
  aliases?: string[];
}

const int = (def: unknown, min?: number, nullable = false): Field => ({ type: { kind: "int", min }, def, nullable });
const float = (def: number, min?: number): Field => ({ type: { kind: "float", min }, def });
const bool = (def: boolean): Field => ({ type: { kind: "bool" }, def });
const str = (def: unknown, nullable = false): Field => ({ type: { kind: "string" }, def, nullable });
const oneOf = (values: readonly string[], def: string): Field => ({ type: { kind: "enum", values }, def });

const SCHEMA: Record<Exclude<keyof TrainConfig, "warnings">, Record<string, Field>> = {
  job: {
    dump_folder: str("./outputs"),
    description: str(""),
    seed: int(0, 0),
    print_args: bool(false),
    use_for_integration_test: bool(false),
  },
  model: {
    name: { ...oneOf(["llama", "llama3"], "llama"), aliases: ["architecture"] },
    flavor: str(null, true),
    dim: { ...int(null, 1, true), aliases: ["hidden_size"] },
    n_layers: { ...int(null, 1, true), aliases: ["num_hidden_layers"] },
    n_heads: { ...int(null, 1, true), aliases: ["num_attention_heads"] },
    n_kv_heads: { ...int(null, 1, true), aliases: ["num_key_value_heads"] },
    vocab_size: int(null, 1, true),
    ffn_dim: { ...int(null, 1, true), aliases: ["intermediate_size"] },
    norm_eps: { ...float(1e-5, 0), aliases: ["rms_norm_eps"] },
    rope_theta: float(10000, 0),
    max_seq_len: { ...int(null, 1, true), aliases: ["max_position_embeddings"] },
    tokenizer_path: { ...str(null, true), aliases: ["hf_assets_path"] },
    converters: { type: { kind: "strings" }, def: [] },
    attn_mask_type: oneOf(ATTN_MASK_TYPES, "causal"),
    attn_type: oneOf(["sdpa", "flex", "varlen"], "sdpa"),
    use_flex_attn: bool(false),
    tokenizer_vocab_size: int(4096, 257),
    tokenizer_min_frequency: int(2, 0),
    tokenizer_special_tokens: { type: { kind: "strings" }, def: ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] },
  },
  optimizer: {
    // (the defaults are AdamW's; optimizer-config.ts fills the named optimizer's and refuses keys it does not read)
    name: oneOf(OPTIMIZER_NAMES, "AdamW"),
    lr: float(8e-4, 0),
    eps: float(1e-8, 0),
    beta1: float(0.9, 0),
    beta2: float(0.95, 0),
    weight_decay: float(0.1, 0),
    momentum: float(0.9, 0),
    dampening: float(0),
    nesterov: bool(false),
    amsgrad: bool(false),
    alpha: float(0.99, 0),
    centered: bool(false),
    lr_decay: float(0, 0),
    initial_accumulator_value: float(0, 0),
    momentum_decay: float(4e-3, 0),
    decoupled_weight_decay: bool(false),
    implementation: oneOf(["for-loop", "foreach", "fused"], "fused"),
  },
  lr_scheduler: {
    warmup_steps: int(100, 0),
    decay_type: oneOf(["linear", "cosine", "sqrt"], "cosine"),
    lr_min: float(0, 0),
    decay_ratio: { type: { kind: "float", min: 0 }, def: null, nullable: true },
    min_lr_factor: { type: { kind: "float", min: 0 }, def: null, nullable: true },
  },
  training: {
    local_batch_size: { ...int(8, 1), aliases: ["batch_size"] },
    seq_len: int(256, 1),
    steps: int(1000, 1),
    max_norm: float(1.0, 0),
    gradient_accumulation_steps: int(1, 1),
    global_batch_size: int(-1, -1),
    dataset_path: str(null, true),
    // TorchTitan's, with nothing to change here (Kiln's CPU training is deterministic for a seed, reduces in float32 and
    // keeps everything in memory)
    gc_freq: int(50, 1),
    deterministic: bool(false),
    mixed_precision_reduce: oneOf(["float32"], "float32"),
    enable_cpu_offload: bool(false),
    dataset: str("brown"),
    mixed_precision_param: oneOf(["bfloat16", "float32"], "float32"),
    chat_format_fraction: float(0, 0),
    seed: int(null, 0, true), // TorchTitan keeps the seed here; moved to job.seed
  },
  checkpoint: {
    enable: { ...bool(false), aliases: ["enable_checkpoint"] },
    last_save_model_only: bool(false),
    async_mode: oneOf(["disabled", "async", "async_with_pinned_mem"], "disabled"),
    load_step: int(-1, -1),
    last_save_in_hf: bool(false),
    folder: str("checkpoint"),
    interval: int(500, 1),
    keep_latest_k: int(0, 0),
    export_dtype: oneOf(["float32", "bfloat16", "float16"], "float32"),
    initial_load_path: str(null, true),
    initial_load_in_hf: bool(false),
    initial_load_model_only: bool(true),
  },
  metrics: {
    log_freq: int(10, 1),
    enable_tensorboard: bool(false),
    save_tb_folder: str("tb"),
    enable_wandb: bool(false),
    disable_color_printing: bool(false),
    loss_curve: { ...str("loss_curve.svg"), aliases: ["save_loss_curve"] },
  },
  validation: {
    enable: { ...bool(true), aliases: ["enabled"] },
    dataset: str(null, true),
    freq: int(100, 1),
    steps: int(10, 1),
    fraction: float(0.05, 0),
  },
  lora: {
    enable: bool(false),
    rank: { ...int(8, 1), aliases: ["r"] },
    alpha: { ...float(16, 0), aliases: ["lora_alpha"] },
    target_modules: { type: { kind: "strings" }, def: ["q_proj", "v_proj"] },
    use_rslora: bool(false),
    export_merged: bool(false),
  },
  parallelism: {
    data_parallel_replicate_degree: int(1, 1),
    data_parallel_shard_degree: int(-1, -1),
    tensor_parallel_degree: int(1, 1),
    pipeline_parallel_degree: int(1, 1),
    context_parallel_degree: int(1, 1),
    expert_parallel_degree: int(1, 1),
    fsdp_reshard_after_forward: oneOf(["default", "never", "always"], "default"),
    enable_async_tensor_parallel: bool(false),
  },
  profiling: {
    enable_profiling: bool(false),
    save_traces_folder: str("profile_traces"),
    profile_freq: int(10, 1),
    enable_memory_snapshot: bool(false),
    save_memory_snapshot_folder: str("memory_snapshot"),
  },
  activation_checkpoint: {
    mode: oneOf(["none", "selective", "full"], "selective"),
    selective_ac_option: str("2"),
  },
  compile: {
    enable: bool(false),
    components: { type: { kind: "strings" }, def: ["model", "loss"] },
  },
  float8: {
    enable_fsdp_float8_all_gather: bool(false),
    precompute_float8_dynamic_scale_for_fsdp: bool(false),
    filter_fqns: { type: { kind: "strings" }, def: [] },
  },
  comm: {
    init_timeout_seconds: int(300, 1),
    train_timeout_seconds: int(100, 1),
    trace_buf_size: int(20000, 0),
  },
};

// ---------------------------------------------------------------- parsing

/** Reads and validates a TOML config file. `overrides` are "section.key" -> value (CLI flags). */
export function loadTrainConfig(path: string, overrides: Record<string, unknown> = {}): TrainConfig {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new TrainConfigError(`cannot read config ${path}: ${(e as Error).message}`);
  }
  return parseTrainConfig(text, overrides, path);
}

/**
 * Parses TOML text into a validated TrainConfig with every default filled in.
 * @example
 *   const cfg = parseTrainConfig('[model]\nflavor = "tiny"\n[training]\nsteps = 50\n');
 *   cfg.model.dim === 128 && cfg.training.steps === 50;
 */
export function parseTrainConfig(text: string, overrides: Record<string, unknown> = {}, source = "config"): TrainConfig {
  let raw: Record<string, unknown>;
  try {
    raw = parseToml(text) as Record<string, unknown>;
  } catch (e) {
    throw new TrainConfigError(`${source}: invalid TOML: ${(e as Error).message}`);
  }
  for (const [path, value] of Object.entries(overrides)) {
    const dot = path.indexOf(".");
    if (dot < 0) throw new TrainConfigError(`override "${path}" must be section.key`);
    const section = path.slice(0, dot);
    const table = (raw[section] ??= {}) as Record<string, unknown>;
    if (typeof table !== "object" || table === null || Array.isArray(table))
      throw new TrainConfigError(`${source}: [${section}] is not a table`);
    const key = path.slice(dot + 1);
    // the override replaces the file's value under any of its names (--checkpoint.enable over enable_checkpoint)
    const fields = (SCHEMA as Record<string, Record<string, Field>>)[section] ?? {};
    const canonical = (k: string) => (k in fields ? k : Object.keys(fields).find((n) => fields[n]!.aliases?.includes(k)));
    const name = canonical(key);
    if (name !== undefined) for (const k of Object.keys(table)) if (k !== key && canonical(k) === name) delete table[k];
    table[key] = value;
  }
  return validate(raw, source);
}

function validate(raw: Record<string, unknown>, source: string): TrainConfig {
  const sections = Object.keys(SCHEMA);
  for (const name of Object.keys(raw)) {
    if (!(name in SCHEMA))
      throw new TrainConfigError(`${source}: unknown section [${name}]${suggest(name, sections)} (known: ${sections.join(", ")})`);
  }
  const out: Record<string, Record<string, unknown>> = {};
  for (const [section, fields] of Object.entries(SCHEMA)) {
    const table = raw[section] ?? {};
    if (typeof table !== "object" || table === null || Array.isArray(table))
      throw new TrainConfigError(`${source}: [${section}] must be a table`);
    out[section] = validateSection(section, table as Record<string, unknown>, fields, source);
  }
  const cfg = out as unknown as TrainConfig & { training: { seed?: number | null } };
  cfg.warnings = [];
  // TorchTitan's [training] seed: accept it, keep one seed in [job].
  const tseed = cfg.training.seed;
  delete cfg.training.seed;
  if (tseed !== null && tseed !== undefined) {
    if ("seed" in ((raw.job as object | undefined) ?? {}) && cfg.job.seed !== tseed)
      throw new TrainConfigError(`${source}: [job] seed = ${cfg.job.seed} and [training] seed = ${tseed} disagree`);
    cfg.job.seed = tseed;
  }
  checkTorchTitan(cfg, raw, source);
  resolveOptimizerConfig(cfg.optimizer, Object.keys((raw.optimizer as object | undefined) ?? {}), (msg) => {
    throw new TrainConfigError(`${source}: ${msg}`);
  }, (msg) => cfg.warnings.push(msg));
  if (cfg.lora.enable && cfg.checkpoint.initial_load_path === null)
    throw new TrainConfigError(`${source}: [lora] enable = true adapts a pretrained model: set [checkpoint] initial_load_path (and initial_load_in_hf = true)`);
  if (cfg.checkpoint.initial_load_path !== null) checkInitialLoad(cfg, raw, source);
  else {
    resolveModel(cfg, raw, source);
    checkModel(cfg, source);
  }
  const m = cfg.model;
  if (m.attn_type === "varlen" && m.attn_mask_type !== "block_causal")
    throw new TrainConfigError(`${source}: [model] attn_type varlen runs packed documents apart: it needs attn_mask_type = "block_causal" (as TorchTitan's)`);
  checkTraining(cfg, source);
  return cfg;
}

function validateSection(
  section: string,
  table: Record<string, unknown>,
  fields: Record<string, Field>,
  source: string,
): Record<string, unknown> {
  const canonical = new Map<string, string>();
  for (const [k, f] of Object.entries(fields)) {
    canonical.set(k, k);
    for (const a of f.aliases ?? []) canonical.set(a, k);
  }
  const out: Record<string, unknown> = {};
  const seen = new Map<string, string>();
  for (const [key, value] of Object.entries(table)) {
    const name = canonical.get(key);
    if (name === undefined)
      throw new TrainConfigError(
        `${source}: unknown key "${key}" in [${section}]${suggest(key, [...canonical.keys()])} (known: ${Object.keys(fields).join(", ")})`,
      );
    const prev = seen.get(name);
    if (prev !== undefined) throw new TrainConfigError(`${source}: [${section}] sets ${name} twice ("${prev}" and "${key}")`);
    seen.set(name, key);
    out[name] = coerce(`[${section}] ${key}`, value, fields[name]!, source);
  }
  for (const [k, f] of Object.entries(fields)) if (!(k in out)) out[k] = Array.isArray(f.def) ? [...(f.def as unknown[])] : f.def;
  return out;
}

function coerce(where: string, v: unknown, f: Field, source: string): unknown {
  const fail = (want: string): never => {
    throw new TrainConfigError(`${source}: ${where}: expected ${want}, got ${JSON.stringify(v)}`);
  };
  if (v === null || v === "none" || v === "None") {
    if (f.nullable) return null;
  }
  const t = f.type;
  switch (t.kind) {
    case "int": {
      const n = typeof v === "string" && v.trim() !== "" ? Number(v) : v;
      if (typeof n !== "number" || !Number.isInteger(n)) return fail("an integer");
      if (t.min !== undefined && n < t.min) return fail(`an integer >= ${t.min}`);
      return n;
    }
    case "float": {
      const n = typeof v === "string" && v.trim() !== "" ? Number(v) : v;
      if (typeof n !== "number" || !Number.isFinite(n)) return fail("a number");
      if (t.min !== undefined && n < t.min) return fail(`a number >= ${t.min}`);
      return n;
    }
    case "bool":
      if (typeof v === "boolean") return v;
      if (v === "true" || v === "false") return v === "true";
      return fail("true or false");
    case "string":
      return typeof v === "string" ? v : fail("a string");
    case "enum": {
      const hit = typeof v === "string" ? t.values.find((x) => x.toLowerCase() === v.toLowerCase()) : undefined;
      return hit ?? fail(`one of ${t.values.map((x) => `"${x}"`).join(", ")}`);
    }
    case "strings":
      if (typeof v === "string")
        return v
          .split(",")
          .map((s) => s.trim())
          .filter((s) => s.length > 0);
      if (Array.isArray(v) && v.every((x) => typeof x === "string")) return [...(v as string[])];
      return fail("a list of strings");
  }
}

/** The [model] keys a recipe starting from a Hugging Face directory may set: the architecture and the attention mask. */
const INITIAL_LOAD_MODEL_KEYS = new Set(["name", "architecture", "attn_mask_type", "attn_type", "use_flex_attn"]);

/**
 * A recipe starting from a Hugging Face directory: the model's shape and tokenizer are the directory's, so [model]
 * may name the architecture (and the attention mask) only; the checkpoint must be read as Hugging Face's, model only.
 */
function checkInitialLoad(cfg: TrainConfig, raw: Record<string, unknown>, source: string): void {
  const err = (msg: string): never => {
    throw new TrainConfigError(`${source}: ${msg}`);
  };
  const c = cfg.checkpoint;
  if (!c.initial_load_in_hf)
    err(`[checkpoint] initial_load_path is read as a Hugging Face directory only: set initial_load_in_hf = true (a Kiln checkpoint folder resumes through [checkpoint] folder)`);
  if (!c.initial_load_model_only) err(`[checkpoint] initial_load_model_only = false: a Hugging Face directory holds the model only (no optimizer or step)`);
  const set = Object.keys((raw.model as Record<string, unknown> | undefined) ?? {}).filter((k) => !INITIAL_LOAD_MODEL_KEYS.has(k));
  if (set.length > 0) err(`[model] ${set.join(", ")}: the model's shape and tokenizer come from [checkpoint] initial_load_path ${c.initial_load_path} (remove them)`);
}

/** Fills model dims from the flavor, derives ffn_dim (Llama's 2/3 * 4 * dim rounded up to 64) and max_seq_len. */
function resolveModel(cfg: TrainConfig, raw: Record<string, unknown>, source: string): void {
  const m = cfg.model;
  if (m.flavor !== null) {
    const fl = LLAMA_FLAVORS[m.flavor];
    if (!fl)
      throw new TrainConfigError(`${source}: unknown [model] flavor "${m.flavor}" (known: ${Object.keys(LLAMA_FLAVORS).join(", ")})`);
    const given = (raw.model as Record<string, unknown> | undefined) ?? {};
    for (const [k, v] of Object.entries(fl)) {
      const rec = m as unknown as Record<string, unknown>;
      // (the mask has a default of its own: the flavor's applies unless [model] names one)
      if (rec[k] === null || (k === "attn_mask_type" && !(k in given))) rec[k] = v;
    }
  }
  const missing = (["dim", "n_layers", "n_heads"] as const).filter((k) => m[k] === null);
  if (missing.length > 0)
    throw new TrainConfigError(
      `${source}: [model] needs a flavor (${Object.keys(LLAMA_FLAVORS).join(", ")}) or explicit ${missing.join(", ")}`,
    );
  if (m.n_kv_heads === null) m.n_kv_heads = m.n_heads;
  if (m.ffn_dim === null) m.ffn_dim = Math.ceil((2 * 4 * m.dim) / 3 / 64) * 64;
  if (m.max_seq_len === null) m.max_seq_len = Math.max(cfg.training.seq_len, 2048);
}

/** Datasets TorchTitan downloads from the Hugging Face hub, which this machine cannot reach. */
const HUB_DATASETS = /^c4(_test|_validation)?$/;

/**
 * TorchTitan's settings: the ones Kiln has are read (min_lr_factor, decay_ratio, the degrees of data parallelism),
 * the ones it cannot honour refused, and GPU-side ones it has no use for accepted with a line in cfg.warnings.
 */
function checkTorchTitan(cfg: TrainConfig, raw: Record<string, unknown>, source: string): void {
  const err = (msg: string): never => {
    throw new TrainConfigError(`${source}: ${msg}`);
  };
  const given = (section: string): Record<string, unknown> => (raw[section] as Record<string, unknown> | undefined) ?? {};
  const l = cfg.lr_scheduler;
  if (l.min_lr_factor !== null) {
    if (l.min_lr_factor > 1) err(`[lr_scheduler] min_lr_factor must be in [0, 1], got ${l.min_lr_factor}`);
    const lrMin = cfg.optimizer.lr * l.min_lr_factor;
    if ("lr_min" in given("lr_scheduler") && Math.abs(l.lr_min - lrMin) > 1e-12) err(`[lr_scheduler] lr_min ${l.lr_min} and min_lr_factor ${l.min_lr_factor} (x lr = ${lrMin}) disagree`);
    l.lr_min = lrMin;
  }
  if (l.decay_ratio !== null && l.decay_ratio > 1) err(`[lr_scheduler] decay_ratio must be in [0, 1], got ${l.decay_ratio}`);
  if (cfg.model.converters.length > 0) err(`[model] converters ${cfg.model.converters.join(", ")}: not supported (Kiln trains in float32 or bfloat16: [training] mixed_precision_param)`);
  const p = cfg.parallelism;
  for (const k of ["tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree", "expert_parallel_degree"] as const)
    if (p[k] !== 1) err(`[parallelism] ${k} ${p[k]}: Kiln trains data-parallel only (kiln run --nproc-per-node N: each rank a whole replica)`);
  if (p.data_parallel_shard_degree === 0) err("[parallelism] data_parallel_shard_degree must be -1 (the rest of the ranks) or >= 1");
  // dataset_path: where TorchTitan reads a named dataset from; Kiln reads that path in its own formats
  if (cfg.training.dataset_path !== null) cfg.training.dataset = cfg.training.dataset_path;
  if (cfg.training.global_batch_size === 0) err("[training] global_batch_size must be -1 or >= 1");
  const hub = cfg.training.dataset.split("+").find((d) => HUB_DATASETS.test(d));
  if (hub !== undefined) err(`[training] dataset ${hub} is downloaded from the Hugging Face hub, which Kiln cannot reach: use brown, nlp-corpus, a text file or directory, or a .jsonl file`);
  const w = cfg.warnings;
  const pr = cfg.profiling;
  if (pr.enable_profiling === true || pr.enable_memory_snapshot === true) w.push("[profiling]: not supported, no traces or memory snapshots are written");
  checkActivationCheckpoint(cfg, Object.keys(given("activation_checkpoint")).length > 0, err);
  if (cfg.compile.enable === true) w.push("[compile] enable: no effect, training runs eagerly");
  if (cfg.float8.enable_fsdp_float8_all_gather === true || cfg.float8.precompute_float8_dynamic_scale_for_fsdp === true) w.push("[float8]: no effect (no float8 training)");
  if (cfg.metrics.enable_tensorboard || cfg.metrics.enable_wandb) w.push("[metrics] enable_tensorboard / enable_wandb: not written; the loss curve is drawn to [metrics] loss_curve");
  if (cfg.checkpoint.async_mode !== "disabled") w.push(`[checkpoint] async_mode ${cfg.checkpoint.async_mode}: checkpoints are saved synchronously`);
  const val = cfg.validation.dataset;
  if (cfg.validation.enable && val !== null && val.split("+").some((d) => HUB_DATASETS.test(d)))
    err(`[validation] dataset ${val} is downloaded from the Hugging Face hub, which Kiln cannot reach: use a text file or directory or a .jsonl file (or leave it out to hold out [validation] fraction of the training data)`);
  if (Object.keys(given("comm")).length > 0) w.push("[comm]: the collectives' timeout is KILN_DIST_TIMEOUT's (the section is not read)");
  if (cfg.model.attn_type !== "sdpa" || cfg.model.use_flex_attn)
    w.push(`[model] ${cfg.model.use_flex_attn ? "use_flex_attn" : `attn_type ${cfg.model.attn_type}`}: the kernel changes nothing here (one dense attention runs either mask; attn_mask_type picks it)`);
}

/**
 * [activation_checkpoint] as TorchTitan reads it: mode "full" checkpoints every decoder layer, "selective" with
 * selective_ac_option N (digits) every Nth (layers N-1, 2N-1, ...: TorchTitan counts its wrapped blocks from 1; N = 0
 * every layer), "op" every layer under TorchTitan's op-level policy (matmul and attention outputs kept, the rest
 * recomputed: tensor/selective-checkpoint.ts). A config without the section keeps every activation (TorchTitan's
 * default, selective every 2nd layer, trades time for memory a small run does not need).
 */
function checkActivationCheckpoint(cfg: TrainConfig, given: boolean, err: (msg: string) => never): void {
  const ac = cfg.activation_checkpoint;
  if (!given) ac.mode = "none";
  const option = String(ac.selective_ac_option);
  if (ac.mode === "selective" && option !== "op" && !/^\d+$/.test(option))
    err(`[activation_checkpoint] selective_ac_option must be "op" or a layer frequency (a non-negative integer), got ${JSON.stringify(ac.selective_ac_option)}`);
}

/**
 * Which decoder layers recompute their activations in backward under the config's [activation_checkpoint] (for
 * CausalLM.activationCheckpointing), or null when every activation is kept.
 */
export function activationCheckpointLayers(cfg: TrainConfig): ((layer: number) => boolean) | null {
  const { mode, selective_ac_option: option } = cfg.activation_checkpoint;
  if (mode === "none") return null;
  const every = mode === "full" || String(option) === "op" ? 1 : Number(option);
  return every <= 1 ? () => true : (layer) => (layer + 1) % every === 0;
}

/**
 * Whether the checkpointed layers run under TorchTitan's op-level policy (mode "selective", selective_ac_option "op":
 * CausalLM.activationCheckpointPolicy = opSacPolicy) rather than being recomputed whole.
 */
export function opLevelActivationCheckpoint(cfg: TrainConfig): boolean {
  const { mode, selective_ac_option: option } = cfg.activation_checkpoint;
  return mode === "selective" && String(option) === "op";
}

/** The recipe's own model shape (not one read from initial_load_path). */
function checkModel(cfg: TrainConfig, source: string): void {
  const m = cfg.model;
  const err = (msg: string): never => {
    throw new TrainConfigError(`${source}: ${msg}`);
  };
  if (m.dim % m.n_heads !== 0) err(`[model] dim ${m.dim} is not divisible by n_heads ${m.n_heads}`);
  if ((m.dim / m.n_heads) % 2 !== 0) err(`[model] head dim ${m.dim / m.n_heads} must be even for rotary embeddings`);
  if (m.n_heads % m.n_kv_heads !== 0) err(`[model] n_heads ${m.n_heads} is not a multiple of n_kv_heads ${m.n_kv_heads}`);
  if (cfg.training.seq_len > m.max_seq_len) err(`[training] seq_len ${cfg.training.seq_len} > [model] max_seq_len ${m.max_seq_len}`);
  if (m.vocab_size !== null && m.tokenizer_path === null && m.vocab_size < m.tokenizer_vocab_size)
    err(`[model] vocab_size ${m.vocab_size} < tokenizer_vocab_size ${m.tokenizer_vocab_size}`);
}

/** The optimizer, schedule, validation and export settings, whatever the model. */
function checkTraining(cfg: TrainConfig, source: string): void {
  const err = (msg: string): never => {
    throw new TrainConfigError(`${source}: ${msg}`);
  };
  if (cfg.optimizer.beta1 >= 1 || cfg.optimizer.beta2 >= 1) err(`[optimizer] beta1 and beta2 must be < 1`);
  if (cfg.lr_scheduler.lr_min > cfg.optimizer.lr)
    err(`[lr_scheduler] lr_min ${cfg.lr_scheduler.lr_min} > [optimizer] lr ${cfg.optimizer.lr}`);
  if (cfg.validation.fraction >= 1) err(`[validation] fraction must be < 1`);
  if (cfg.training.chat_format_fraction > 1) err(`[training] chat_format_fraction must be in [0, 1], got ${cfg.training.chat_format_fraction}`);
  if (cfg.training.mixed_precision_param === "bfloat16" && cfg.checkpoint.export_dtype === "float16")
    err(`[checkpoint] export_dtype float16 from bfloat16 params loses range; export float32 or bfloat16`);
}

/** " (did you mean "x"?)" when a known name is within edit distance 2. */
function suggest(name: string, known: string[]): string {
  let best = "";
  let bestD = 3;
  for (const k of known) {
    const d = editDistance(name.toLowerCase(), k.toLowerCase());
    if (d < bestD) {
      bestD = d;
      best = k;
    }
  }
  return best ? ` (did you mean "${best}"?)` : "";
}

function editDistance(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const cur = [i];
    for (let j = 1; j <= b.length; j++) cur[j] = Math.min(prev[j]! + 1, cur[j - 1]! + 1, prev[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1));
    prev = cur;
  }
  return prev[b.length]!;
}
