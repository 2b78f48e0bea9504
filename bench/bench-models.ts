// Benchmark models shared by the benches: a BPE tokenizer trained on Brown and random Llama models of real
// shapes (SmolLM-135M, Llama-3.2-1B), written once under <tmpdir>/kiln-bench-models and reused; plus GGUF
// exports of them for llama.cpp comparisons. Writing and exporting stream tensor by tensor, so the 1B model
// (5 GB in f32) never sits in memory whole.
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { exportGguf, initModel, PRESETS, type GgufExportType } from "../src/models/init-model.js";
import { DTYPE_BYTES } from "../src/backends/dtype.js";
import type { CpuBuffer } from "../src/backends/cpu/stream.js";
import type { Tensor } from "../src/tensor/tensor.js";
import type { CausalLM } from "../src/models/causal-lm.js";
import { Linear } from "../src/nn/layers.js";
import { quantizedWeightOf } from "../src/nn/quantized-linear.js";
import { quantizedShadowOf, type QuantizedWeight } from "../src/tensor/ops/linalg.js";
import { loadCorpus } from "../src/train/corpus.js";
import { saveTokenizer, trainBpeTokenizer } from "../src/train/bpe-trainer.js";

export const TOKENIZER_VOCAB = 4096; // the tokenizer's; the model keeps its preset's vocabulary (LM head cost as the real one)
export const BENCH_ROOT = path.join(os.tmpdir(), "kiln-bench-models");

/** Writes (once) the 4096-token BPE tokenizer; returns its directory. */
export function benchTokenizerDir(): string {
  const tokDir = path.join(BENCH_ROOT, `brown-bpe-${TOKENIZER_VOCAB}`);
  if (!fs.existsSync(path.join(tokDir, "tokenizer.json"))) {
    process.stdout.write(`training a ${TOKENIZER_VOCAB}-token BPE tokenizer on Brown... `);
    const docs = loadCorpus({ source: "brown", maxDocs: 200 });
    saveTokenizer(tokDir, trainBpeTokenizer(docs, { vocabSize: TOKENIZER_VOCAB, specialTokens: ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] }));
    console.log("done");
  }
  return tokDir;
}

/**
 * The tokenizer with its vocabulary padded by never-produced tokens to `size` entries, so that its GGUF export
 * has one token per embedding row (llama.cpp requires n_vocab == rows of token_embd).
 */
export function paddedTokenizerDir(size: number): string {
  const src = benchTokenizerDir();
  const dir = path.join(BENCH_ROOT, `brown-bpe-${TOKENIZER_VOCAB}-pad${size}`);
  if (!fs.existsSync(path.join(dir, "tokenizer.json"))) {
    const tok = JSON.parse(fs.readFileSync(path.join(src, "tokenizer.json"), "utf8")) as { model: { vocab: Record<string, number> } };
    for (let id = Object.keys(tok.model.vocab).length; id < size; id++) tok.model.vocab[`<unused_${id}>`] = id;
    fs.mkdirSync(dir, { recursive: true });
    fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(tok));
    fs.copyFileSync(path.join(src, "tokenizer_config.json"), path.join(dir, "tokenizer_config.json"));
  }
  return dir;
}

/** The benches' short model names (--model / --models) and the presets they stand for. */
export const BENCH_MODELS: Readonly<Record<string, string>> = { smollm: "smollm-135m", "1b": "llama-1b" };

/**
 * Writes (once) a random model of a preset ("smollm-135m", "llama-1b") in a dtype; returns the directory.
 * The tokenizer is the 4096-token BPE padded to the preset's vocabulary (so llama.cpp loads the GGUF export).
 */
export function benchModelDir(dtype: "float32" | "bfloat16", preset = "smollm-135m"): string {
  const vocab = (PRESETS[preset]?.vocab_size as number | undefined) ?? TOKENIZER_VOCAB;
  const tokDir = paddedTokenizerDir(vocab);
  const dir = path.join(BENCH_ROOT, `${preset}-random-${dtype}-v${vocab}`);
  if (!fs.existsSync(path.join(dir, "model.safetensors"))) {
    process.stdout.write(`writing a random ${preset}-shaped model (${dtype}) to ${dir}... `);
    initModel(dir, { architecture: "LlamaForCausalLM", preset, tokenizerDir: tokDir, seed: 1, dtype });
    console.log("done");
  }
  return dir;
}

/** Exports (once) a bench model to GGUF of the given type next to it; returns the file. */
export function benchGguf(dir: string, type: GgufExportType): string {
  const file = path.join(dir, `model-${type}.gguf`);
  if (!fs.existsSync(file)) {
    process.stdout.write(`exporting ${path.basename(dir)} to GGUF ${type}... `);
    exportGguf(dir, file, type);
    console.log("done");
  }
  return file;
}

/** The tensors a decode step reads for weight `w`: its quantized data, scales and row sums when it has them, else `w`. */
function readsOf(w: Tensor, q: QuantizedWeight | undefined): Tensor[] {
  return q ? [q.data, q.scales, q.rowSums].filter((t): t is Tensor => t != null) : [w];
}

/** The weight memory one decode step reads, as byte views: every matrix once (quantized data + scales), the tied LM head once. */
export function decodeReads(model: CausalLM): Uint8Array[] {
  const views: Uint8Array[] = [];
  const view = (t: Tensor) => {
    const raw = (t.storage.buffer as CpuBuffer).raw;
    if (!(raw instanceof ArrayBuffer)) throw new Error("decodeReads: the bench model's weights must be on the cpu device");
    const bytes = DTYPE_BYTES[t.dtype];
    views.push(new Uint8Array(raw, t.offset * bytes, t.numel * bytes));
  };
  const skip = new Set<string>();
  for (const [name, m] of model.namedModules()) {
    if (!(m instanceof Linear)) continue;
    const q = quantizedWeightOf(m);
    if (!q) continue;
    skip.add(name ? `${name}.weight` : "weight");
    readsOf(m.weight, q).forEach(view);
  }
  for (const [name, t] of model.namedParameters()) {
    if (skip.has(name)) continue;
    readsOf(t, quantizedShadowOf(t)).forEach(view); // a tied LM head read through its quantized copy
  }
  return views;
}

/**
 * The decode step's weight products in the order a fused batch-1 step graph runs them, with the bytes each reads:
 * per layer the q/k/v group, the output projection, the gate/up group and the down projection, then the LM head
 * (the lm_head Linear, or the tied embedding's quantized copy, or the embedding itself). Null for a model whose
 * Linears are not laid out that way (so a caller can skip a per-product breakdown).
 */
export function decodeProducts(model: CausalLM): { kind: string; bytes: number }[] | null {
  const bytesOf = (ts: Tensor[]) => ts.reduce((n, t) => n + t.numel * DTYPE_BYTES[t.dtype], 0);
  const weightBytes = (m: Linear) => bytesOf(readsOf(m.weight, quantizedWeightOf(m)));
  const kinds: Record<string, string> = {
    q_proj: "q/k/v", k_proj: "q/k/v", v_proj: "q/k/v", o_proj: "o",
    gate_proj: "gate/up", up_proj: "gate/up", down_proj: "down",
  };
  const out: { kind: string; bytes: number; layer: string }[] = [];
  let head: number | null = null;
  for (const [name, m] of model.namedModules()) {
    if (!(m instanceof Linear)) continue;
    if (name === "lm_head") {
      head = weightBytes(m);
      continue;
    }
    const layer = /^(.*\.layers\.\d+)\./.exec(name)?.[1];
    const kind = kinds[name.split(".").at(-1)!];
    if (layer === undefined || kind === undefined) return null;
    const last = out.at(-1);
    if (last && last.layer === layer && last.kind === kind) last.bytes += weightBytes(m);
    else out.push({ kind, bytes: weightBytes(m), layer });
  }
  if (head === null) {
    const embed = [...model.namedParameters()].find(([n]) => n.endsWith("embed_tokens.weight"))?.[1];
    if (embed === undefined) return null;
    head = bytesOf(readsOf(embed, quantizedShadowOf(embed)));
  }
  return [...out.map(({ kind, bytes }) => ({ kind, bytes })), { kind: "LM head", bytes: head }];
}

/** Bytes of weights one decode step reads (decodeReads). */
export function decodeBytes(model: CausalLM): number {
  return decodeReads(model).reduce((n, v) => n + v.byteLength, 0);
}
