// TorchTitan's [checkpoint] initial_load_path with initial_load_in_hf: the recipe starts from a Hugging Face
// model directory (fine-tuning) instead of random weights. The model's shape, weights and tokenizer are the
// directory's (any dense text architecture Kiln serves); the export writes its config.json (torch_dtype set to the
// export dtype) and copies its tokenizer and generation files, so the result serves as the original does.
import { createHash } from "node:crypto";
import * as fs from "node:fs";
import * as path from "node:path";
import type { CausalLM } from "../models/causal-lm.js";
import { languageModelConfig } from "../models/hf-config.js";
import { loadLocalModel } from "../models/loader.js";
import type { Tokenizer } from "../models/tokenizer.js";
import { TrainConfigError, type TrainConfig } from "./train-config.js";

/** A pretrained model to train further, with what the recipe needs of its directory. */
export interface InitialModel {
  model: CausalLM;
  tokenizer: Tokenizer;
  /** The directory's config.json, as read. */
  hfConfig: Record<string, unknown>;
  /** Identifies the tokenizer in the token cache's key. */
  tokenizerKey: string;
  dir: string;
}

/** The files copied beside the exported weights (those the directory has). */
const COPIED_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "chat_template.json", "generation_config.json"];

/** Loads [checkpoint] initial_load_path for training in [training] mixed_precision_param, every parameter trainable. */
export function loadInitialModel(cfg: TrainConfig): InitialModel {
  const dir = cfg.checkpoint.initial_load_path!;
  const fail = (m: string): never => {
    throw new TrainConfigError(`[checkpoint] initial_load_path ${dir}: ${m}`);
  };
  const st = fs.statSync(dir, { throwIfNoEntry: false });
  if (!st) fail("no such directory");
  if (!st!.isDirectory()) fail("a Hugging Face model directory is needed (config.json, model.safetensors, tokenizer.json); GGUF files are not trained");
  const configPath = path.join(dir, "config.json");
  if (!fs.existsSync(configPath)) fail("no config.json");
  const hfConfig = JSON.parse(fs.readFileSync(configPath, "utf8")) as Record<string, unknown>;
  if (languageModelConfig(hfConfig).textWeights !== null) fail("image-text checkpoints are not trained (their vision tower would be left out of the export)");
  let loaded;
  try {
    loaded = loadLocalModel(dir, { dtype: cfg.training.mixed_precision_param, loadVision: false, onNote: () => undefined });
  } catch (e) {
    return fail((e as Error).message);
  }
  if ((loaded.quantization ?? null) !== null) fail(`its weights are quantized (${loaded.quantization}): training needs float weights`);
  if (loaded.config.moe !== null) fail(`${loaded.config.architecture} is a mixture of experts: the recipe trains dense models`);
  if (cfg.training.seq_len > loaded.config.maxPositionEmbeddings)
    fail(`[training] seq_len ${cfg.training.seq_len} > its max_position_embeddings ${loaded.config.maxPositionEmbeddings}`);
  for (const [, p] of loaded.model.namedParameters()) p.requiresGrad = true;
  const tokenizerKey = `hf:${createHash("sha256").update(fs.readFileSync(path.join(dir, "tokenizer.json"))).digest("hex")}`;
  return { model: loaded.model, tokenizer: loaded.tokenizer, hfConfig, tokenizerKey, dir };
}

/**
 * The token that separates packed documents: `<|endoftext|>` where the vocabulary has it (GPT-2-style and Qwen
 * tokenizers, and the recipe's own), else the tokenizer's first EOS.
 */
export function documentSeparator(tok: Tokenizer, dir: string): number {
  const id = tok.tokenToId("<|endoftext|>") ?? tok.eosTokenIds[0];
  if (id === undefined) throw new TrainConfigError(`[checkpoint] initial_load_path ${dir}: its tokenizer has no EOS token to end documents with`);
  return id;
}

/** The directory's config.json with torch_dtype = the export dtype, and its tokenizer and generation files copied. */
export function exportInitialModelFiles(init: InitialModel, out: string, exportDtype: string): Record<string, unknown> {
  fs.mkdirSync(out, { recursive: true });
  for (const f of COPIED_FILES) {
    const from = path.join(init.dir, f);
    if (fs.existsSync(from)) fs.copyFileSync(from, path.join(out, f));
  }
  return { ...init.hfConfig, torch_dtype: exportDtype };
}
