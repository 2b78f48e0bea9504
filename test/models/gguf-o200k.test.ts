// gpt-oss's o200k_harmony tokenizer in GGUF: written with llama.cpp's pre-tokenizer name "gpt-4o" (its o200k split),
// read back by Kiln as HF's tokenizer.json, and tokenized by llama.cpp (node-llama-cpp, the outside oracle) as HF does;
// a Harmony vocabulary's turns end at <|return|> and <|call|>, not at <|end|>.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";
import { writeGguf } from "../../src/models/formats/gguf.js";
import { hfConfigToGgufMetadata } from "../../src/models/formats/gguf-mapping.js";
import { ggufToTokenizerJson, tokenizerJsonToGgufMetadata } from "../../src/models/formats/gguf-tokenizer.js";
import { Tokenizer } from "../../src/models/tokenizer.js";
import { hasLlamaCpp } from "../helpers/llama-cpp.js";
import { tempPath } from "../helpers/tiny-model.js";

const GPTOSS_TOKENIZER = path.resolve("node_modules", "@lenml", "tokenizer-gptoss", "models");
let o200kOnce: Tokenizer | null = null;
/** HF's o200k_harmony tokenizer (built once: ~2 s). */
const o200k = (): Tokenizer => (o200kOnce ??= Tokenizer.fromDir(GPTOSS_TOKENIZER));
const json = (file: string) => JSON.parse(fs.readFileSync(path.join(GPTOSS_TOKENIZER, file), "utf8")) as Record<string, unknown>;

const TEXTS = [
  "The jury said that the city of Atlanta",
  "I'm sure they'll say it's 12345 dollars, isn't it?\n\n  Indented\tline // path/to/file\r\n",
  "CamelCaseWords and ALLCAPS, naïve café, 東京タワー, 🚀🚀 emoji",
  "<|start|>assistant<|channel|>final<|message|>Hi<|return|>",
];

describe("o200k_harmony in GGUF", () => {
  it("the o200k_harmony tokenizer is written with llama.cpp's pre-tokenizer gpt-4o and read back as HF's; its turns end at <|return|> / <|call|>", () => {
    const md = tokenizerJsonToGgufMetadata(json("tokenizer.json"), json("tokenizer_config.json"));
    assert.equal(md["tokenizer.ggml.pre"]!.value, "gpt-4o");
    const files = ggufToTokenizerJson(Object.fromEntries(Object.entries(md).map(([k, v]) => [k, v.value])));
    const [hf, back] = [o200k(), Tokenizer.fromJson(files.tokenizerJson, files.tokenizerConfig)];
    for (const text of TEXTS) assert.deepEqual(back.encode(text, { addSpecialTokens: false }), hf.encode(text, { addSpecialTokens: false }), text);
    const ids = (files.tokenizerConfig as { eos_token_id: number[] }).eos_token_id;
    const id = (t: string) => hf.encode(t, { addSpecialTokens: false })[0]!;
    assert.deepEqual([...ids].sort(), [id("<|return|>"), id("<|call|>"), id("<|endoftext|>")].sort(), "<|end|> closes a message, not the turn");
  });

  it("llama.cpp tokenizes with the exported o200k_harmony vocabulary (pre-tokenizer gpt-4o) as HF's tokenizer does", { skip: hasLlamaCpp ? false : "node-llama-cpp not installed", timeout: 60_000 }, async () => {
    // a vocabulary-only file: a gpt-oss header (201088 tokens) without tensors
    const cfg = {
      architectures: ["GptOssForCausalLM"], vocab_size: 201088, hidden_size: 64, intermediate_size: 64, num_hidden_layers: 2, num_attention_heads: 4,
      num_key_value_heads: 2, head_dim: 16, num_local_experts: 4, num_experts_per_tok: 2, sliding_window: 8,
    };
    const file = tempPath("o200k-vocab.gguf");
    writeGguf(file, { ...hfConfigToGgufMetadata(cfg), ...tokenizerJsonToGgufMetadata(json("tokenizer.json"), json("tokenizer_config.json")) }, []);
    // (node-llama-cpp's memory estimate first loads it whole and logs the missing token_embd.weight; the vocabulary-only
    // load that follows is the one tokenizing)
    const { getLlama } = await import("node-llama-cpp");
    const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" as never });
    const model = await llama.loadModel({ modelPath: file, vocabOnly: true });
    try {
      const hf = o200k();
      for (const text of TEXTS) assert.deepEqual(Array.from(model.tokenize(text, true)), hf.encode(text, { addSpecialTokens: false }), text);
    } finally {
      await model.dispose();
    }
  });
});
