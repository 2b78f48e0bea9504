// `kiln serve` flags that say which model is served and how it is read (vLLM's ModelConfig and LoadConfig): the
// model path, dtype, quantization, tokenizer and the generation defaults.
import { existsSync, readdirSync, statSync } from "node:fs";
import { Option, type Command } from "commander";
import { DEFAULT_MODEL_DIR } from "./default-model.js";
import { jsonObjectFlag, oneOf } from "./serve-flag-values.js";
import { CliUsageError } from "./usage-error.js";

export type Dtype = "auto" | "float32" | "bfloat16" | "float16";
const DTYPES: readonly Dtype[] = ["auto", "float32", "bfloat16", "float16"];

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
}

/** The generation_config.json keys vLLM reads as sampling defaults (get_diff_sampling_param), each value's rule. */
const GENERATION_OVERRIDE_KEYS: Record<string, { ok: (v: number) => boolean; rule: string }> = {
  temperature: { ok: (v) => v >= 0, rule: "a number >= 0" },
  top_p: { ok: (v) => v > 0 && v <= 1, rule: "a number in (0, 1]" },
  top_k: { ok: (v) => Number.isInteger(v) && v >= -1, rule: "an integer >= -1" },
  min_p: { ok: (v) => v >= 0 && v <= 1, rule: "a number in [0, 1]" },
  repetition_penalty: { ok: (v) => v > 0, rule: "a number > 0" },
  max_new_tokens: { ok: (v) => Number.isInteger(v) && v >= 1, rule: "an integer >= 1" },
};

/** Declares the model flags on `cmd` (serve, generate and chat). */
export function addModelOptions(cmd: Command): Command {
  return cmd
    .addOption(new Option("--dtype <dtype>", "weight and activation dtype").choices([...DTYPES]).default("auto"))
    .option("--quantization <method>", `weight quantization (${QUANTIZATION_METHODS.join(", ")})`)
    .option("--tokenizer <dir>", "directory of the tokenizer (tokenizer.json, tokenizer_config.json, chat template) when not the model's")
    .option("--generation-config <src>", "'auto' (model's generation_config.json), 'vllm' (none) or a directory", "auto")
    .option(
      "--override-generation-config <json>",
      `generation_config.json keys over --generation-config's, as JSON: {"temperature": 0.5} (${Object.keys(GENERATION_OVERRIDE_KEYS).join(", ")})`,
    )
    .option("--trust-remote-code", "accepted for vLLM compatibility: Kiln runs no code from the model directory (no Python), so it changes nothing", false);
}

/** Validates the model flags; `model` is the positional argument (or --model), undefined for the built-in model. */
export function parseModelArgs(model: string | undefined, o: Record<string, unknown>): ModelArgs {
  const modelPath = model ?? DEFAULT_MODEL_DIR;
  let quantization = (o.quantization as string | undefined) ?? null;
  if (quantization !== null) oneOf(quantization, "--quantization", QUANTIZATION_METHODS);
  if (quantization === "gguf") {
    // vLLM's flag for a GGUF model: its tensors keep the file's own types (Kiln reads them so without the flag)
    if (!isGgufModel(modelPath)) throw new CliUsageError(`--quantization gguf needs a GGUF model (a .gguf file), got ${JSON.stringify(modelPath)}`);
    quantization = null;
  }
  const generationConfig = String(o.generationConfig ?? "auto");
  if (generationConfig !== "auto" && generationConfig !== "vllm") {
    if (!(existsSync(generationConfig) && statSync(generationConfig).isDirectory()))
      throw new CliUsageError(`--generation-config must be 'auto', 'vllm' or an existing directory, got ${JSON.stringify(generationConfig)}`);
    if (!existsSync(`${generationConfig}/generation_config.json`))
      throw new CliUsageError(`--generation-config ${JSON.stringify(generationConfig)}: the directory has no generation_config.json`);
  }
  return {
    model: modelPath,
    dtype: oneOf(o.dtype ?? "auto", "--dtype", DTYPES),
    quantization,
    tokenizer: parseTokenizer(o.tokenizer),
    generationConfig,
    overrideGenerationConfig: parseGenerationOverride(o.overrideGenerationConfig),
  };
}

/** A .gguf file, or a directory holding one. */
function isGgufModel(m: string): boolean {
  return m.endsWith(".gguf") || (existsSync(m) && statSync(m).isDirectory() && readdirSync(m).some((f) => f.endsWith(".gguf")));
}

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
  for (const [k, v] of Object.entries(c)) {
    const key = GENERATION_OVERRIDE_KEYS[k];
    if (key === undefined)
      throw new CliUsageError(`--override-generation-config: ${JSON.stringify(k)} is not a sampling default (${Object.keys(GENERATION_OVERRIDE_KEYS).join(", ")})`);
    if (v !== null && !(typeof v === "number" && Number.isFinite(v) && key.ok(v)))
      throw new CliUsageError(`--override-generation-config: ${k} must be ${key.rule} or null, got ${JSON.stringify(v)}`);
  }
  return c as Record<string, number | null>;
}
