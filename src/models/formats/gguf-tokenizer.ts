// GGUF tokenizer metadata <-> tokenizer.json (+ tokenizer_config.json) objects loadable by
// @huggingface/tokenizers. Supports tokenizer.ggml.model "gpt2" (byte-level BPE, pre-tokenizer chosen
// by tokenizer.ggml.pre) and "llama" (SentencePiece BPE with scores, byte fallback).

import { gguf, GgufValueType, type GgufTypedValue, type GgufValue } from "./gguf.js";
import { ModelFormatError } from "./model-format-error.js";

type Json = Record<string, unknown>;

/** llama.cpp token types (llama_token_type). */
export const GgufTokenType = { NORMAL: 1, UNKNOWN: 2, CONTROL: 3, USER_DEFINED: 4, UNUSED: 5, BYTE: 6 } as const;

const LLAMA3_SPLIT = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;
const QWEN2_SPLIT = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;
/** o200k (GPT-4o's and gpt-oss's): llama.cpp's pre-tokenizer "gpt-4o". */
const O200K_SPLIT = String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`;
const BYTE_LEVEL = { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false };
/** Special tokens llama.cpp treats as end of generation besides the EOS (llama-vocab.cpp's special_eog_ids). */
const EOG_TEXTS = new Set(["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "<|end_of_text|>"]);

export interface TokenizerFiles {
  tokenizerJson: Json;
  tokenizerConfig: Json;
}

function strArray(md: Readonly<Record<string, GgufValue>>, key: string): string[] {
  const v = md[key];
  if (!Array.isArray(v) || !v.every((x) => typeof x === "string")) throw new ModelFormatError(`[gguf] tokenizer metadata "${key}" is missing or not a string array`);
  return v as string[];
}
function numArray(md: Readonly<Record<string, GgufValue>>, key: string, length: number): number[] | null {
  const v = md[key];
  if (v === undefined) return null;
  if (!Array.isArray(v) || v.length !== length) throw new ModelFormatError(`[gguf] tokenizer metadata "${key}" must be an array of ${length} numbers`);
  return v.map(Number);
}

function templateProcessing(bos: string, bosId: number): Json {
  const special = { SpecialToken: { id: bos, type_id: 0 } };
  return {
    type: "TemplateProcessing",
    single: [special, { Sequence: { id: "A", type_id: 0 } }],
    pair: [special, { Sequence: { id: "A", type_id: 0 } }, { SpecialToken: { id: bos, type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
    special_tokens: { [bos]: { id: bos, ids: [bosId], tokens: [bos] } },
  };
}

/** HF's SentencePieceExtractor: merges (l, r) for every piece l+r in the vocab, ordered by the piece's score. */
function spmMerges(tokens: string[], scores: number[]): string[][] {
  const vocab = new Map<string, number>();
  tokens.forEach((t, i) => vocab.set(t, i));
  const merges: [string, string, number][] = [];
  tokens.forEach((piece, id) => {
    const local: [string, string, number][] = [];
    const chars = [...piece];
    for (let i = 1; i < chars.length; i++) {
      const l = chars.slice(0, i).join(""), r = chars.slice(i).join("");
      if (vocab.has(l) && vocab.has(r)) local.push([l, r, scores[id]!]);
    }
    local.sort((a, b) => vocab.get(a[0])! - vocab.get(b[0])! || vocab.get(a[1])! - vocab.get(b[1])!);
    merges.push(...local);
  });
  merges.sort((a, b) => b[2] - a[2]); // stable, like Python's sorted(reverse=True)
  return merges.map(([l, r]) => [l, r]);
}

/**
 * Builds tokenizer.json + tokenizer_config.json objects from GGUF metadata.
 * @example const { tokenizerJson, tokenizerConfig } = ggufToTokenizerJson(readGguf(p).metadata);
 */
export function ggufToTokenizerJson(md: Readonly<Record<string, GgufValue>>): TokenizerFiles {
  const model = md["tokenizer.ggml.model"];
  const tokens = strArray(md, "tokenizer.ggml.tokens");
  const types = numArray(md, "tokenizer.ggml.token_type", tokens.length) ?? tokens.map(() => GgufTokenType.NORMAL);
  const id = (k: string) => (typeof md[k] === "number" && (md[k] as number) < tokens.length ? (md[k] as number) : null);
  const bosId = id("tokenizer.ggml.bos_token_id");
  const eosId = id("tokenizer.ggml.eos_token_id");
  const padId = id("tokenizer.ggml.padding_token_id");
  const unkId = id("tokenizer.ggml.unknown_token_id");
  const addBos = md["tokenizer.ggml.add_bos_token"] === true;

  const addedTokens: Json[] = [];
  types.forEach((t, i) => {
    if (t === GgufTokenType.CONTROL || t === GgufTokenType.USER_DEFINED) {
      addedTokens.push({ id: i, content: tokens[i], single_word: false, lstrip: false, rstrip: false, normalized: t !== GgufTokenType.CONTROL, special: t === GgufTokenType.CONTROL });
    }
  });
  const vocab: Record<string, number> = {};
  tokens.forEach((t, i) => {
    if (!(t in vocab)) vocab[t] = i;
  });

  let tokenizerJson: Json;
  if (model === "gpt2") {
    const pre = typeof md["tokenizer.ggml.pre"] === "string" ? (md["tokenizer.ggml.pre"] as string) : "default";
    // The split regex of each pre-tokenizer read here (null: GPT-2's own, which ByteLevel applies; "default": files of
    // Kiln before session 25, which wrote it for GPT-2's); any other would split text as none of these does, so it is
    // refused rather than read as GPT-2's.
    const qwen = pre.startsWith("qwen") || pre === "deepseek-r1-qwen";
    const split = pre === "llama-bpe" || pre === "llama3" ? LLAMA3_SPLIT : qwen ? QWEN2_SPLIT : pre === "gpt-4o" ? O200K_SPLIT : pre === "gpt-2" || pre === "default" ? null : undefined;
    if (split === undefined) {
      throw new ModelFormatError(`[gguf] unsupported tokenizer.ggml.pre ${JSON.stringify(pre)} (supported: gpt-2, llama-bpe, llama3, ` +
        "qwen2, deepseek-r1-qwen, gpt-4o); its text would be split differently from llama.cpp");
    }
    // (required, as llama.cpp requires it: without merges a BPE splits every word into single bytes)
    const merges = strArray(md, "tokenizer.ggml.merges").map((m) => {
      const sp = m.indexOf(" ", 1);
      return sp < 0 ? [m, ""] : [m.slice(0, sp), m.slice(sp + 1)];
    });
    tokenizerJson = {
      version: "1.0", truncation: null, padding: null,
      added_tokens: addedTokens,
      normalizer: qwen ? { type: "NFC" } : null,
      pre_tokenizer: split
        ? { type: "Sequence", pretokenizers: [{ type: "Split", pattern: { Regex: split }, behavior: "Isolated", invert: false }, BYTE_LEVEL] }
        : { ...BYTE_LEVEL, use_regex: true },
      post_processor: addBos && bosId !== null ? templateProcessing(tokens[bosId]!, bosId) : BYTE_LEVEL,
      decoder: BYTE_LEVEL,
      model: {
        type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
        fuse_unk: false, byte_fallback: false, ignore_merges: split === LLAMA3_SPLIT || split === O200K_SPLIT, vocab, merges,
      },
    };
  } else if (model === "llama") {
    const scores = numArray(md, "tokenizer.ggml.scores", tokens.length) ?? tokens.map(() => 0);
    const addSpacePrefix = md["tokenizer.ggml.add_space_prefix"] !== false;
    const normalizers: Json[] = [];
    if (addSpacePrefix) normalizers.push({ type: "Prepend", prepend: "▁" });
    normalizers.push({ type: "Replace", pattern: { String: " " }, content: "▁" });
    const decoders: Json[] = [{ type: "Replace", pattern: { String: "▁" }, content: " " }, { type: "ByteFallback" }, { type: "Fuse" }];
    if (addSpacePrefix) decoders.push({ type: "Strip", content: " ", start: 1, stop: 0 });
    tokenizerJson = {
      version: "1.0", truncation: null, padding: null,
      added_tokens: addedTokens,
      normalizer: { type: "Sequence", normalizers },
      pre_tokenizer: null,
      post_processor: addBos && bosId !== null ? templateProcessing(tokens[bosId]!, bosId) : null,
      decoder: { type: "Sequence", decoders },
      model: {
        type: "BPE", dropout: null, unk_token: unkId !== null ? tokens[unkId] : null, continuing_subword_prefix: null,
        end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, ignore_merges: false, vocab, merges: spmMerges(tokens, scores),
      },
    };
  } else {
    throw new ModelFormatError(`[gguf] unsupported tokenizer.ggml.model ${JSON.stringify(model)} (supported: gpt2, llama)`);
  }
  // Harmony (o200k_harmony, gpt-oss): a turn ends at <|return|> or <|call|>; <|end|> closes a message inside the
  // reply (its analysis channel), so it is no end of generation (llama.cpp drops it from its EOG set likewise)
  const control = new Set(tokens.filter((_, i) => types[i] === GgufTokenType.CONTROL));
  const harmony = control.has("<|return|>") && control.has("<|call|>");
  const eog = harmony ? new Set([...EOG_TEXTS, "<|return|>", "<|call|>"].filter((t) => t !== "<|end|>")) : EOG_TEXTS;
  const tokenizerConfig: Json = {
    add_bos_token: addBos,
    bos_token: bosId !== null ? tokens[bosId] : null,
    eos_token: eosId !== null ? tokens[eosId] : null,
    // end-of-generation ids: the EOS and the special tokens llama.cpp also ends on (its special_eog_ids), since a
    // GGUF keeps one eos_token_id where generation_config.json listed several (the loader stops on every one)
    eos_token_id: [...new Set([...(eosId !== null ? [eosId] : []), ...tokens.flatMap((t, i) =>
      eog.has(t) && (types[i] === GgufTokenType.CONTROL || types[i] === GgufTokenType.USER_DEFINED) ? [i] : [])])],
    pad_token: padId !== null ? tokens[padId] : null,
    unk_token: unkId !== null ? tokens[unkId] : null,
    clean_up_tokenization_spaces: false,
  };
  if (typeof md["tokenizer.chat_template"] === "string") tokenizerConfig.chat_template = md["tokenizer.chat_template"];
  return { tokenizerJson, tokenizerConfig };
}

/** Picks tokenizer.ggml.pre from a tokenizer.json's pre-tokenizer (llama.cpp's names), or refuses one it cannot name. */
function detectPre(tj: Json): string {
  const s = JSON.stringify(tj.pre_tokenizer ?? null);
  if (s.includes(JSON.stringify(LLAMA3_SPLIT).slice(1, -1))) return "llama-bpe";
  if (s.includes(JSON.stringify(QWEN2_SPLIT).slice(1, -1))) return "qwen2";
  if (s.includes(JSON.stringify(O200K_SPLIT).slice(1, -1))) return "gpt-4o";
  const pt = tj.pre_tokenizer as Json | null | undefined;
  if (pt?.type === "ByteLevel" && pt.use_regex !== false) return "gpt-2"; // GPT-2's own split ("default" is another)
  throw new ModelFormatError(`[gguf] cannot name this tokenizer's pre-tokenizer for llama.cpp: ${s.slice(0, 200)}`);
}

/**
 * tokenizer.json (byte-level BPE) + tokenizer_config.json -> GGUF `tokenizer.*` metadata (model "gpt2").
 * @example writeGguf(p, { ...hfConfigToGgufMetadata(cfg), ...tokenizerJsonToGgufMetadata(tj, tc) }, tensors);
 */
export function tokenizerJsonToGgufMetadata(tokenizerJson: Json, tokenizerConfig: Json = {}, options: { pre?: string } = {}): Record<string, GgufTypedValue> {
  const model = tokenizerJson.model as Json | undefined;
  if (!model || model.type !== "BPE" || model.byte_fallback === true) {
    const kind = model?.type === "BPE" ? "BPE with byte fallback (SentencePiece-style, as Gemma's and Llama 2's)" : `model type ${JSON.stringify(model?.type)}`;
    throw new ModelFormatError(`[gguf] only byte-level (GPT-2-style) BPE tokenizers can be exported; this one is ${kind}`);
  }
  const vocab = model.vocab as Record<string, number>;
  const added = (tokenizerJson.added_tokens ?? []) as { id: number; content: string; special?: boolean }[];
  let size = 0;
  for (const i of Object.values(vocab)) size = Math.max(size, i + 1);
  for (const a of added) size = Math.max(size, a.id + 1);
  const tokens: string[] = new Array(size);
  const types: number[] = new Array(size).fill(GgufTokenType.NORMAL);
  for (const [t, i] of Object.entries(vocab)) tokens[i] = t;
  for (const a of added) {
    tokens[a.id] = a.content;
    types[a.id] = a.special ? GgufTokenType.CONTROL : GgufTokenType.USER_DEFINED;
  }
  for (let i = 0; i < size; i++) {
    if (tokens[i] === undefined) {
      tokens[i] = `[PAD${i}]`;
      types[i] = GgufTokenType.UNUSED;
    }
  }
  const merges = ((model.merges ?? []) as (string | string[])[]).map((m) => (Array.isArray(m) ? m.join(" ") : m));
  const idOf = (v: unknown): number | null => {
    const s = typeof v === "string" ? v : v && typeof v === "object" ? ((v as Json).content as string) : null;
    if (s === null) return null;
    const i = tokens.indexOf(s);
    return i < 0 ? null : i;
  };
  const md: Record<string, GgufTypedValue> = {
    "tokenizer.ggml.model": gguf.str("gpt2"),
    "tokenizer.ggml.pre": gguf.str(options.pre ?? detectPre(tokenizerJson)),
    "tokenizer.ggml.tokens": gguf.array(GgufValueType.STRING, tokens),
    "tokenizer.ggml.token_type": gguf.array(GgufValueType.INT32, types),
    "tokenizer.ggml.merges": gguf.array(GgufValueType.STRING, merges),
  };
  const bos = idOf(tokenizerConfig.bos_token);
  const eos = idOf(tokenizerConfig.eos_token);
  const pad = idOf(tokenizerConfig.pad_token);
  if (bos !== null) md["tokenizer.ggml.bos_token_id"] = gguf.u32(bos);
  if (eos !== null) md["tokenizer.ggml.eos_token_id"] = gguf.u32(eos);
  if (pad !== null) md["tokenizer.ggml.padding_token_id"] = gguf.u32(pad);
  const pp = JSON.stringify(tokenizerJson.post_processor ?? null);
  const addBos = bos !== null && pp.includes("TemplateProcessing") && pp.includes(JSON.stringify(tokens[bos]));
  md["tokenizer.ggml.add_bos_token"] = gguf.bool(addBos);
  if (typeof tokenizerConfig.chat_template === "string") md["tokenizer.chat_template"] = gguf.str(tokenizerConfig.chat_template);
  return md;
}
