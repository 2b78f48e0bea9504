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
