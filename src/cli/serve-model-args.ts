// `kiln serve` flags that say which model is served and how it is read (vLLM's ModelConfig and LoadConfig): the
// model path and hub revision, dtype, quantization, load format, config overrides, tokenizer and the generation
// defaults.
import { existsSync, statSync } from "node:fs";
import { Option, type Command } from "commander";
import { GENERATION_OVERRIDE_KEYS, generationConfigSourceError, generationOverrideError } from "../engine/sampling-params.js";
import { isGgufModel } from "../models/hub.js";
import { LOAD_FORMATS, type LoadFormat } from "../models/load-format.js";
import { DEFAULT_MODEL_DIR } from "./default-model.js";
import { jsonObjectFlag, num, oneOf } from "./serve-flag-values.js";
import { CliUsageError } from "./usage-error.js";

// vLLM's --dtype choices: "half" is float16 and "float" float32
export type Dtype = "auto" | "float32" | "float" | "bfloat16" | "float16" | "half";
const DTYPES: readonly Dtype[] = ["auto", "half", "float16", "bfloat16", "float", "float32"];

export const QUANTIZATION_METHODS = ["fp8", "int8", "int4", "mxfp4", "gguf", "awq", "gptq"] as const;

export interface ModelArgs {
  model: string; // model directory (or GGUF file)
  dtype: Dtype;
  quantization: string | null;
  /** vLLM --tokenizer: the directory of tokenizer.json and the chat template; null = the model's. */
  tokenizer: string | null;
  generationConfig: string; // "auto" | "vllm" | a directory
  /** vLLM --override-generation-config: generation_config.json keys over --generation-config's (null unsets one). */
  overrideGenerationConfig: Record<string, number | null>;
  /** vLLM --load-format: auto, safetensors, gguf, or dummy (random weights of the config's shapes). */
  loadFormat: LoadFormat;
  /** vLLM --hf-overrides (and --rope-scaling / --rope-theta over them): config.json keys over the model's; null = none. */
  hfOverrides: Record<string, unknown> | null;
  /** vLLM --revision: the hub revision (branch, tag or commit) of a hub id; null = main. */
  revision: string | null;
  /** vLLM --download-dir: the hub cache a hub id is looked up in and downloaded to; null = HF_HUB_CACHE's. */
  downloadDir: string | null;
  /** vLLM --disable-sliding-window: max_model_len is capped to the model's sliding window (where full attention equals it). */
  disableSlidingWindow: boolean;
}

/**
 * vLLM's --load-format values with no reader here, each with why; fastsafetensors and runai_streamer read
 * safetensors files (from local disk, the same tensors) and are read as "safetensors".
 */
const REFUSED_LOAD_FORMATS: Record<string, string> = {
  bitsandbytes: "bitsandbytes checkpoints are not read: serve the unquantized checkpoint with --quantization int8 or int4",
  tensorizer: "tensorizer files are not read: serve the safetensors checkpoint",
  sharded_state: "per-rank sharded state files are not read: serve the safetensors checkpoint (with --tensor-parallel-size)",
  runai_streamer_sharded: "per-rank sharded state files are not read: serve the safetensors checkpoint (with --tensor-parallel-size)",
  mistral: "Mistral's consolidated layout (params.json) is not read: serve the Hugging Face layout (config.json) of the model",
};
const SAFETENSORS_READERS = ["fastsafetensors", "runai_streamer"];

/** vLLM's --tokenizer-mode values and what Kiln does with each: one tokenizer, tokenizer.json (HF's fast one). */
const TOKENIZER_MODES = ["auto", "hf", "slow", "mistral", "custom"] as const;

/** Declares the model flags on `cmd` (serve, generate and chat; chat's -q is vLLM's --quick, not --quantization). */
export function addModelOptions(cmd: Command, { quantizationShort = true }: { quantizationShort?: boolean } = {}): Command {
  return cmd
    .addOption(new Option("--dtype <dtype>", "weight and activation dtype").choices([...DTYPES]).default("auto"))
    .option(`${quantizationShort ? "-q, " : ""}--quantization <method>`, `weight quantization (${QUANTIZATION_METHODS.join(", ")})`)
    .option("--tokenizer <dir>", "directory of the tokenizer (tokenizer.json, tokenizer_config.json, chat template) when not the model's")
    .option("--generation-config <src>", "'auto' (model's generation_config.json), 'vllm' (none) or a directory", "auto")
    .option(
      "--override-generation-config <json>",
      `generation_config.json keys over --generation-config's, as JSON: {"temperature": 0.5} (${Object.keys(GENERATION_OVERRIDE_KEYS).join(", ")})`,
    )
    .option("--trust-remote-code", "accepted for vLLM compatibility: Kiln runs no code from the model directory (no Python), so it changes nothing", false)
    .option(
      "--load-format <format>",
      `how the weights are read: ${LOAD_FORMATS.join(", ")} (dummy: random weights of the model config's shapes, no tensor read)`,
      "auto",
    )
    .option("--hf-overrides <json>", 'config.json keys over the model\'s, as JSON: {"max_position_embeddings": 4096} (nested *_config objects merge)')
    .option("--rope-scaling <json>", 'the model\'s rope_scaling, as JSON (older vLLM flag: --hf-overrides \'{"rope_scaling": ...}\')')
    .option("--rope-theta <theta>", "the model's rope_theta (older vLLM flag: --hf-overrides '{\"rope_theta\": ...}')")
    .option("--disable-sliding-window", "cap --max-model-len to the model's sliding window (full attention then equals the window's)", false)
    .option("--revision <rev>", "the hub revision (branch, tag or commit) of a hub id (default: main)")
    .option("--download-dir <dir>", "the hub cache a hub id is looked up in and downloaded to (default: HF_HUB_CACHE)")
    .option("--tokenizer-revision <rev>", "the tokenizer's hub revision: the model's own (Kiln reads the tokenizer from the model's snapshot)")
    .option("--code-revision <rev>", "accepted for vLLM compatibility: Kiln runs no code from the model repository")
    .addOption(
      new Option("--tokenizer-mode <mode>", "the tokenizer: auto and hf read tokenizer.json (slow is read so too; mistral and custom are refused)")
        .choices([...TOKENIZER_MODES])
        .default("auto"),
    );
}

/**
 * Validates the model flags; `model` is the positional argument (or --model), undefined for the built-in model.
 * Flags accepted with no effect push a line to `warnings`.
 */
export function parseModelArgs(model: string | undefined, o: Record<string, unknown>, warnings: string[]): ModelArgs {
  const modelPath = model ?? DEFAULT_MODEL_DIR;
  let quantization = (o.quantization as string | undefined) ?? null;
  if (quantization !== null) oneOf(quantization, "--quantization", QUANTIZATION_METHODS);
  if (quantization === "gguf") {
    // vLLM's flag for a GGUF model: its tensors keep the file's own types (Kiln reads them so without the flag)
    if (!isGgufModel(modelPath)) throw new CliUsageError(`--quantization gguf needs a GGUF model (a .gguf file), got ${JSON.stringify(modelPath)}`);
    quantization = null;
  }
  checkTokenizerMode(o.tokenizerMode, warnings);
  const generationConfig = String(o.generationConfig ?? "auto");
  const sourceError = generationConfigSourceError(generationConfig);
  if (sourceError !== null) throw new CliUsageError(`--generation-config ${sourceError}`);
  return {
    model: modelPath,
    dtype: oneOf(o.dtype ?? "auto", "--dtype", DTYPES),
    quantization,
    tokenizer: parseTokenizer(o.tokenizer),
    generationConfig,
    overrideGenerationConfig: parseGenerationOverride(o.overrideGenerationConfig),
    loadFormat: parseLoadFormat(o.loadFormat, warnings),
    hfOverrides: parseHfOverrides(o),
    ...parseHubFlags(modelPath, o, warnings),
    disableSlidingWindow: Boolean(o.disableSlidingWindow),
  };
}

/** --load-format: Kiln's formats; a vLLM one it has no reader for is refused, saying what to serve instead. */
function parseLoadFormat(value: unknown, warnings: string[]): LoadFormat {
  const f = String(value ?? "auto");
  if (SAFETENSORS_READERS.includes(f)) {
    warnings.push(`--load-format ${f}: read as safetensors (Kiln's reader maps the same tensors from local files)`);
    return "safetensors";
  }
  if (f === "npcache") {
    warnings.push("--load-format npcache: read as pt (the .bin checkpoint is memory-mapped in place; no numpy cache is written)");
    return "pt";
  }
  const why = REFUSED_LOAD_FORMATS[f];
  if (why !== undefined) throw new CliUsageError(`--load-format ${f} is not supported: ${why}`);
  return oneOf(f, "--load-format", LOAD_FORMATS);
}

/** --hf-overrides, with --rope-scaling and --rope-theta over it (as vLLM adds them to hf_overrides). */
function parseHfOverrides(o: Record<string, unknown>): Record<string, unknown> | null {
  const out = o.hfOverrides === undefined ? {} : jsonObjectFlag(o.hfOverrides, "--hf-overrides", '{"max_position_embeddings": 4096}');
  if (o.ropeScaling !== undefined) out.rope_scaling = jsonObjectFlag(o.ropeScaling, "--rope-scaling", '{"rope_type": "linear", "factor": 2.0}');
  if (o.ropeTheta !== undefined) out.rope_theta = num(o.ropeTheta, "--rope-theta", Number.MIN_VALUE);
  return Object.keys(out).length > 0 ? out : null;
}

/**
 * --revision, --download-dir, --tokenizer-revision and --code-revision. A local model has no revisions (vLLM then
 * ignores them too: said here); the tokenizer comes from the model's snapshot, so its revision must be the model's.
 */
function parseHubFlags(modelPath: string, o: Record<string, unknown>, warnings: string[]): Pick<ModelArgs, "revision" | "downloadDir"> {
  const local = existsSync(modelPath);
  const revision = (o.revision as string | undefined) ?? null;
  if (revision !== null && local) warnings.push(`--revision ${revision}: no effect: ${modelPath} is a local path (revisions are a hub id's)`);
  const tokRev = o.tokenizerRevision as string | undefined;
  if (tokRev !== undefined) {
    if (o.tokenizer !== undefined || local) warnings.push(`--tokenizer-revision ${tokRev}: no effect: the tokenizer is read from a local directory`);
    else if (tokRev !== (revision ?? "main"))
      throw new CliUsageError(
        `--tokenizer-revision ${tokRev} is not supported: Kiln reads the tokenizer from the model's snapshot (--revision ${revision ?? "main"}); ` +
          "give the same revision, or download the tokenizer and pass --tokenizer DIR",
      );
  }
  if (o.codeRevision !== undefined) warnings.push(`--code-revision ${String(o.codeRevision)}: no effect: Kiln runs no code from the model repository`);
  return { revision, downloadDir: (o.downloadDir as string | undefined) ?? null };
}

/** --tokenizer-mode: Kiln has one tokenizer, tokenizer.json's (transformers' fast one). */
function checkTokenizerMode(value: unknown, warnings: string[]): void {
  const mode = oneOf(value ?? "auto", "--tokenizer-mode", TOKENIZER_MODES);
  if (mode === "mistral" || mode === "custom")
    throw new CliUsageError(`--tokenizer-mode ${mode} is not supported: Kiln reads the model's tokenizer.json (--tokenizer-mode auto)`);
  if (mode === "slow") warnings.push("--tokenizer-mode slow: the tokenizer is read from tokenizer.json (transformers' fast tokenizer); no slow tokenizer is used");
}

/** A .gguf file, or a directory holding one. */
/** --tokenizer: a local directory holding tokenizer.json (a hub id is not looked up). */
function parseTokenizer(value: unknown): string | null {
  if (value === undefined) return null;
  const dir = String(value);
  if (!(existsSync(dir) && statSync(dir).isDirectory()))
    throw new CliUsageError(`--tokenizer must be a local directory holding tokenizer.json, got ${JSON.stringify(dir)}`);
  if (!existsSync(`${dir}/tokenizer.json`)) throw new CliUsageError(`--tokenizer ${JSON.stringify(dir)}: the directory has no tokenizer.json`);
  return dir;
}

/** --override-generation-config: a JSON object of GENERATION_OVERRIDE_KEYS, each a valid value or null (unset). */
function parseGenerationOverride(value: unknown): Record<string, number | null> {
  if (value === undefined) return {};
  const c = jsonObjectFlag(value, "--override-generation-config", '{"temperature": 0.5, "max_new_tokens": 512}');
  const why = generationOverrideError(c);
  if (why !== null) throw new CliUsageError(`--override-generation-config: ${why}`);
  return c as Record<string, number | null>;
}
