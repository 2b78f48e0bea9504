// `kiln serve` flags that say where the model's config comes from and how the loader reads it (vLLM's ModelConfig
// and LoadConfig fields beyond serve-model-args.ts'): --hf-config-path, --hf-token, --config-format, --model-impl,
// --override-attention-dtype, --model-loader-extra-config, --ignore-patterns, --lora-dtype, --additional-config and
// --skip-tokenizer-init. What Kiln cannot do is refused, saying why; what cannot change a reply is accepted, said.
import { existsSync, statSync } from "node:fs";
import { Option, type Command } from "commander";
import { jsonObjectFlag, oneOf } from "./serve-flag-values.js";
import { CliUsageError } from "./usage-error.js";

export interface LoadArgs {
  /** vLLM --hf-config-path: a directory whose config.json is read instead of the model's; null = the model's. */
  hfConfigPath: string | null;
  /** vLLM --hf-token: the hub token of a hub id's download; null = HF_TOKEN's. */
  hfToken: string | null;
  /** vLLM --ignore-patterns: glob patterns of weight files (relative to the model directory) not read. */
  ignorePatterns: string[];
  /** vLLM --skip-tokenizer-init: no tokenizer is read; prompts are token ids and outputs carry token ids, no text. */
  skipTokenizerInit: boolean;
  /**
   * vLLM --logits-processor-pattern: a regex of the qualified names a request may list in `logits_processors`; null
   * allows none. Kiln runs no per-request processors (as vLLM V1): a request naming one gets a 400 either way.
   */
  logitsProcessorPattern: string | null;
}

const CONFIG_FORMATS = ["auto", "hf", "mistral"] as const;
const MODEL_IMPLS = ["auto", "vllm", "transformers", "terratorch"] as const;
const ATTENTION_DTYPES = ["float32", "float", "bfloat16", "float16", "half"] as const;
const LORA_DTYPES = ["auto", "float16", "bfloat16", "float32"] as const;
/** The keys vLLM's default (safetensors) loader takes in --model-loader-extra-config; its other loaders take none. */
const LOADER_EXTRA_KEYS = ["enable_multithread_load", "num_threads"];
/** vLLM's default --ignore-patterns: a checkpoint's original/ copy (Meta's consolidated files) is not read. */
export const DEFAULT_IGNORE_PATTERNS = ["original/**/*"];

/** Declares the flags on `cmd` (serve, generate and chat: they are vLLM engine arguments). */
export function addLoadOptions(cmd: Command): Command {
  return cmd
    .option("--hf-config-path <dir>", "a directory whose config.json is read instead of the model's (the weights and tokenizer stay the model's)")
    .option("--hf-token [token]", "the Hugging Face token a hub id is downloaded with (no value: HF_TOKEN's)")
    .addOption(new Option("--config-format <format>", "the model config's format: auto and hf read config.json (mistral's params.json is refused)").choices([...CONFIG_FORMATS]))
    .addOption(new Option("--model-impl <impl>", "the model implementation: auto and vllm run Kiln's own (transformers and terratorch are refused)").choices([...MODEL_IMPLS]))
    .option("--override-attention-dtype <dtype>", `attention's compute dtype (${ATTENTION_DTYPES.join(", ")}): Kiln's attention computes in float32`)
    .option("--model-loader-extra-config <json>", `the loader's extra settings, as JSON (the safetensors loader's keys: ${LOADER_EXTRA_KEYS.join(", ")})`)
    .option("--ignore-patterns <globs...>", `weight files not read, as glob patterns relative to the model directory (default: ${DEFAULT_IGNORE_PATTERNS.join(" ")})`)
    .addOption(new Option("--lora-dtype <dtype>", "LoRA adapters' dtype: Kiln holds and applies them in float32").choices([...LORA_DTYPES]))
    .option("--additional-config <json>", "platform-specific settings, as JSON: accepted for vLLM compatibility (Kiln's CPU platform reads none)")
    .option("--logits-processor-pattern <regex>", "the qualified names a request may list in logits_processors (Kiln, as vLLM V1, runs none per request: a 400 names the pattern)")
    .option("--skip-tokenizer-init", "read no tokenizer: prompts must be token ids; replies carry token ids and no text", false);
}

/** Validates the flags; those accepted with no effect push a line to `warnings`. */
export function parseLoadArgs(model: string, o: Record<string, unknown>, warnings: string[]): LoadArgs {
  const configFormat = oneOf(o.configFormat ?? "auto", "--config-format", CONFIG_FORMATS);
  if (configFormat === "mistral")
    throw new CliUsageError("--config-format mistral is not supported: Kiln reads config.json (Hugging Face format), not Mistral's params.json");
  const impl = oneOf(o.modelImpl ?? "auto", "--model-impl", MODEL_IMPLS);
  if (impl === "transformers" || impl === "terratorch")
    throw new CliUsageError(`--model-impl ${impl} is not supported: Kiln runs its own TypeScript model implementations (no Python ${impl} models)`);
  checkAttentionDtype(o.overrideAttentionDtype, warnings);
  checkLoaderExtraConfig(o.modelLoaderExtraConfig, String(o.loadFormat ?? "auto"), warnings);
  checkLoraDtype(o.loraDtype, warnings);
  if (o.additionalConfig !== undefined) {
    const c = jsonObjectFlag(o.additionalConfig, "--additional-config", '{"key": "value"}');
    if (Object.keys(c).length > 0) warnings.push(`--additional-config: no effect: Kiln's CPU platform reads no platform-specific settings (${Object.keys(c).join(", ")})`);
  }
  return {
    hfConfigPath: parseHfConfigPath(o.hfConfigPath),
    hfToken: parseHfToken(model, o.hfToken, warnings),
    ignorePatterns: parseIgnorePatterns(o.ignorePatterns),
    skipTokenizerInit: Boolean(o.skipTokenizerInit),
    logitsProcessorPattern: parsePattern(o.logitsProcessorPattern),
  };
}

/** --logits-processor-pattern: a regular expression (Python's re and JavaScript's agree on the usual ones). */
function parsePattern(value: unknown): string | null {
  if (value === undefined) return null;
  const p = String(value);
  try {
    new RegExp(p);
  } catch (e) {
    throw new CliUsageError(`--logits-processor-pattern must be a regular expression, got ${JSON.stringify(p)}: ${(e as Error).message}`);
  }
  return p;
}

/** --hf-config-path: a local directory holding config.json (a hub id is not looked up). */
function parseHfConfigPath(value: unknown): string | null {
  if (value === undefined) return null;
  const dir = String(value);
  if (!(existsSync(dir) && statSync(dir).isDirectory()))
    throw new CliUsageError(`--hf-config-path must be a local directory holding config.json, got ${JSON.stringify(dir)}`);
  if (!existsSync(`${dir}/config.json`)) throw new CliUsageError(`--hf-config-path ${JSON.stringify(dir)}: the directory has no config.json`);
  return dir;
}

/** --hf-token: a token, or (given bare) HF_TOKEN's; a local model is not downloaded, so it is unused (said). */
function parseHfToken(model: string, value: unknown, warnings: string[]): string | null {
  if (value === undefined) return null;
  if (value === "") throw new CliUsageError("--hf-token must be a Hugging Face token (or given bare: HF_TOKEN's)");
  if (existsSync(model)) warnings.push(`--hf-token: no effect: ${model} is a local path (nothing is downloaded)`);
  return value === true ? null : String(value);
}

/** --ignore-patterns: one or more glob patterns (vLLM's default when not given). */
function parseIgnorePatterns(value: unknown): string[] {
  if (value === undefined) return DEFAULT_IGNORE_PATTERNS;
  const patterns = (Array.isArray(value) ? value : [value]).map(String);
  const bad = patterns.find((p) => p.trim() === "" || p.startsWith("/"));
  if (bad !== undefined) throw new CliUsageError(`--ignore-patterns takes glob patterns relative to the model directory such as "original/**/*", got ${JSON.stringify(bad)}`);
  return patterns;
}

/** --override-attention-dtype: a dtype name; Kiln's attention computes in float32 whatever the weights' dtype. */
function checkAttentionDtype(value: unknown, warnings: string[]): void {
  if (value === undefined) return;
  const d = oneOf(value, "--override-attention-dtype", ATTENTION_DTYPES);
  if (d !== "float32" && d !== "float") warnings.push(`--override-attention-dtype ${d}: attention computes in float32 on Kiln's CPU kernels (more precise; replies may differ in the last bits)`);
}

/** --model-loader-extra-config: the keys vLLM's loader for the format takes (each accepted: one thread maps the files). */
function checkLoaderExtraConfig(value: unknown, loadFormat: string, warnings: string[]): void {
  if (value === undefined) return;
  const c = jsonObjectFlag(value, "--model-loader-extra-config", '{"enable_multithread_load": true, "num_threads": 8}');
  const safetensors = ["auto", "safetensors", "fastsafetensors", "runai_streamer"].includes(loadFormat);
  const allowed = safetensors ? LOADER_EXTRA_KEYS : [];
  const unknown = Object.keys(c).filter((k) => !allowed.includes(k));
  if (unknown.length > 0)
    throw new CliUsageError(
      `--model-loader-extra-config: unexpected keys for --load-format ${loadFormat}: ${unknown.join(", ")}` +
        (allowed.length > 0 ? ` (it takes ${allowed.join(", ")})` : " (it takes none)"),
    );
  if (c.num_threads !== undefined && !(Number.isInteger(c.num_threads) && (c.num_threads as number) >= 1))
    throw new CliUsageError(`--model-loader-extra-config: num_threads must be an integer >= 1, got ${JSON.stringify(c.num_threads)}`);
  if (c.enable_multithread_load !== undefined && typeof c.enable_multithread_load !== "boolean")
    throw new CliUsageError(`--model-loader-extra-config: enable_multithread_load must be true or false, got ${JSON.stringify(c.enable_multithread_load)}`);
  if (Object.keys(c).length > 0) warnings.push("--model-loader-extra-config: no effect: the safetensors files are memory-mapped by one thread (tensors are read as the model is built)");
}

/** --lora-dtype: Kiln's adapters are float32 (as its kernels compute); another dtype is read into float32, said. */
function checkLoraDtype(value: unknown, warnings: string[]): void {
  if (value === undefined) return;
  const d = oneOf(value, "--lora-dtype", LORA_DTYPES);
  if (d === "float16" || d === "bfloat16") warnings.push(`--lora-dtype ${d}: LoRA adapters are held and applied in float32 (Kiln's CPU kernels compute in float32)`);
}
