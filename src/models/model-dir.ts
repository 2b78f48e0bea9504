// Finds the files of a model directory (HF layout) or a single GGUF file.

import * as fs from "node:fs";
import * as path from "node:path";
import { ModelFormatError } from "./formats/model-format-error.js";
import { readSafetensors, type SafetensorsHandle } from "./formats/safetensors.js";
import { readTorchCheckpoint } from "./formats/torch-checkpoint.js";

export type ModelWeights =
  | { format: "safetensors" | "pt"; files: string[]; indexPath: string | null }
  | { format: "gguf"; files: string[] };

export interface ModelDirInfo {
  dir: string;
  configPath: string | null;
  generationConfigPath: string | null;
  weights: ModelWeights | null;
  tokenizerJsonPath: string | null;
  tokenizerConfigPath: string | null;
  /** chat_template.jinja or chat_template.json, when present. */
  chatTemplatePath: string | null;
  specialTokensMapPath: string | null;
}

export interface InspectOptions {
  /**
   * vLLM's --ignore-patterns: weight files (.safetensors, .gguf) whose names match one of these globs (fnmatch's:
   * `*` any run of characters, `?` one, `[abc]` one of a set; `**` as `*`) are not listed.
   */
  ignorePatterns?: readonly string[];
}

/** A glob as a whole-name RegExp, as Python's fnmatch reads it (`*` matches "/" too). */
export function globToRegExp(glob: string): RegExp {
  let re = "";
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i]!;
    const close = c === "[" ? glob.indexOf("]", i + 2) : -1;
    if (c === "*") re += ".*";
    else if (c === "?") re += ".";
    else if (close > 0) {
      const set = glob.slice(i + 1, close).replace(/\\/g, "\\\\");
      re += set.startsWith("!") ? `[^${set.slice(1)}]` : `[${set}]`;
      i = close;
    } else re += c.replace(/[.+^${}()|[\]\\]/g, "\\$&");
  }
  return new RegExp(`^${re}$`, "s");
}

/**
 * Lists what a model directory holds. A path to a .gguf file is treated as a directory with just it.
 * @example const info = inspectModelDir("/models/Qwen3-0.6B"); // info.weights?.format === "safetensors"
 */
export function inspectModelDir(p: string, options: InspectOptions = {}): ModelDirInfo {
  const stat = fs.statSync(p, { throwIfNoEntry: false });
  if (!stat) throw new ModelFormatError(`[model-dir] ${p}: no such file or directory`, p);
  if (stat.isFile()) {
    if (!p.endsWith(".gguf")) throw new ModelFormatError(`[model-dir] ${p}: a model path must be a directory or a .gguf file`, p);
    return {
      dir: path.dirname(p), configPath: null, generationConfigPath: null, weights: { format: "gguf", files: [path.resolve(p)] },
      tokenizerJsonPath: null, tokenizerConfigPath: null, chatTemplatePath: null, specialTokensMapPath: null,
    };
  }
  const dir = path.resolve(p);
  const ignored = (options.ignorePatterns ?? []).map(globToRegExp);
  const isIgnored = (n: string): boolean => (n.endsWith(".safetensors") || n.endsWith(".gguf")) && ignored.some((re) => re.test(n));
  const names = new Set(fs.readdirSync(dir).filter((n) => !isIgnored(n)));
  const has = (n: string) => (names.has(n) ? path.join(dir, n) : null);
  let weights: ModelWeights | null = null;
  const index = has("model.safetensors.index.json");
  const safetensors = [...names].filter((n) => n.endsWith(".safetensors")).sort();
  const ggufs = [...names].filter((n) => n.endsWith(".gguf")).sort();
  if (index) {
    const map = (readJsonFile(index) as { weight_map?: Record<string, string> }).weight_map ?? {};
    const left = Object.values(map).find(isIgnored);
    if (left !== undefined) throw new ModelFormatError(`[model] ${index} names ${left}, which --ignore-patterns leaves out: its tensors would be missing`);
    weights = { format: "safetensors", files: [...new Set(Object.values(map))].sort().map((f) => path.join(dir, f)), indexPath: index };
  } else if (names.has("model.safetensors")) weights = { format: "safetensors", files: [path.join(dir, "model.safetensors")], indexPath: null };
  else if (safetensors.length) weights = { format: "safetensors", files: safetensors.map((f) => path.join(dir, f)), indexPath: null };
  else if (ggufs.length) weights = { format: "gguf", files: ggufs.map((f) => path.join(dir, f)) };
  // PyTorch checkpoints, read only when no safetensors are there (as vLLM prefers safetensors)
  else if (names.has("pytorch_model.bin.index.json")) {
    const index = path.join(dir, "pytorch_model.bin.index.json");
    const map = (readJsonFile(index) as { weight_map?: Record<string, string> }).weight_map ?? {};
    weights = { format: "pt", files: [...new Set(Object.values(map))].sort().map((f) => path.join(dir, f)), indexPath: index };
  }
  else if (names.has("pytorch_model.bin")) weights = { format: "pt", files: [path.join(dir, "pytorch_model.bin")], indexPath: null };
  return {
    dir,
    configPath: has("config.json"),
    generationConfigPath: has("generation_config.json"),
    weights,
    tokenizerJsonPath: has("tokenizer.json"),
    tokenizerConfigPath: has("tokenizer_config.json"),
    chatTemplatePath: has("chat_template.jinja") ?? has("chat_template.json"),
    specialTokensMapPath: has("special_tokens_map.json"),
  };
}

/** The weights of a safetensors or PyTorch directory, opened behind the safetensors handle's interface. */
export function openCheckpoint(weights: Extract<ModelWeights, { indexPath: string | null }>): SafetensorsHandle {
  const p = weights.indexPath ?? weights.files[0]!;
  return weights.format === "pt" ? readTorchCheckpoint(p) : readSafetensors(p);
}

function readJsonFile(file: string): unknown {
  try {
    return JSON.parse(fs.readFileSync(file, "utf8"));
  } catch (e) {
    throw new ModelFormatError(`[model] ${file} is not valid JSON: ${(e as Error).message}`);
  }
}
