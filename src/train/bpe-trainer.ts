// Byte-level BPE tokenizer trainer (GPT-2 style) writing a Hugging Face tokenizer.json, plus a small
// encoder/decoder over the result that matches @huggingface/tokenizers token for token.
//
// Training: split special tokens out, pre-tokenize with the GPT-2 regex, count unique pre-token
// words, then merge greedily. Pair counts are updated incrementally from the words that contain
// the merged pair (an inverted index pair -> words), and the best pair comes from a max-heap with
// lazy invalidation (an entry whose count is stale is re-pushed with the current count), as HF
// tokenizers' BpeTrainer does. Ties go to the smaller (left id, right id) pair.
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { KilnError } from "../util/errors.js";

export class BpeError extends KilnError {
  override name = "BpeError";
}

/** GPT-2's pre-tokenizer regex (identical in HF tokenizers' ByteLevel pre-tokenizer). */
export const GPT2_SPLIT_REGEX = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

/**
 * GPT-2's byte -> unicode table: printable bytes map to themselves, the other 68 to U+0100.. in
 * byte order, so every byte string is a printable unicode string with no spaces.
 */
export const BYTE_TO_UNICODE: readonly string[] = (() => {
  const table: string[] = new Array<string>(256);
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    table[b] = String.fromCharCode(printable ? b : 256 + n++);
  }
  return table;
})();

const UNICODE_TO_BYTE = new Map<string, number>(BYTE_TO_UNICODE.map((c, b) => [c, b]));

/** Bytes in the vocabulary's order: by mapped code point (printable first, as in GPT-2's vocab). */
const BYTES_BY_CODEPOINT: number[] = Array.from({ length: 256 }, (_, b) => b).sort(
  (a, b) => BYTE_TO_UNICODE[a]!.charCodeAt(0) - BYTE_TO_UNICODE[b]!.charCodeAt(0),
);

export interface BpeTrainOptions {
  /** Total vocabulary size, special tokens and the 256 byte tokens included. */
  vocabSize: number;
  /** Given ids 0..n-1, in order; never split and never merged. e.g. ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] */
  specialTokens?: string[];
  /** Stop merging when the best pair occurs fewer times than this (default 2). */
  minFrequency?: number;
  /** Called every `every` merges with (merges done, target). */
  onProgress?: (done: number, total: number) => void;
}

/** The subset of HF's tokenizer.json that this trainer writes (see tokenizers' `Tokenizer` serde). */
export interface TokenizerJson {
  version: "1.0";
  truncation: null;
  padding: null;
  added_tokens: AddedTokenJson[];
  normalizer: null;
  pre_tokenizer: { type: "ByteLevel"; add_prefix_space: boolean; trim_offsets: boolean; use_regex: boolean };
  post_processor: null;
  decoder: { type: "ByteLevel"; add_prefix_space: boolean; trim_offsets: boolean; use_regex: boolean };
  model: {
    type: "BPE";
    dropout: null;
    unk_token: null;
    continuing_subword_prefix: null;
    end_of_word_suffix: null;
    fuse_unk: false;
    byte_fallback: false;
    ignore_merges: false;
    vocab: Record<string, number>;
    /** "left right" in rank order (byte-level tokens never contain a space). */
    merges: string[];
  };
}

export interface AddedTokenJson {
  id: number;
  content: string;
  single_word: false;
  lstrip: false;
  rstrip: false;
  normalized: false;
  special: true;
}

const KEY_BASE = 1 << 21; // pair key = left * KEY_BASE + right (ids < 2^21, key < 2^42: exact in a double)
const pairKey = (a: number, b: number): number => a * KEY_BASE + b;

/**
 * Trains a byte-level BPE tokenizer.
 * @example
 *   const tok = trainBpeTokenizer(loadCorpus({ source: "brown" }), { vocabSize: 4096, specialTokens: ["<|endoftext|>"] });
 *   tok.decode(tok.encode("Hello world")) === "Hello world";
 *   writeFileSync("tokenizer.json", JSON.stringify(tok.json));
 */
export function trainBpeTokenizer(docs: string[], opts: BpeTrainOptions): ByteLevelBpe {
  const specials = opts.specialTokens ?? [];
  const minFrequency = opts.minFrequency ?? 2;
  if (new Set(specials).size !== specials.length) throw new BpeError(`duplicate special tokens: ${specials.join(", ")}`);
  const base = specials.length + 256;
  if (opts.vocabSize < base) throw new BpeError(`vocabSize ${opts.vocabSize} < ${base} (special tokens + 256 bytes)`);
  if (opts.vocabSize >= KEY_BASE) throw new BpeError(`vocabSize ${opts.vocabSize} too large (max ${KEY_BASE - 1})`);

  // 1. Unique pre-token words and their frequencies.
  const splitter = new SpecialSplitter(specials);
  const wordFreq = new Map<string, number>();
  for (const doc of docs) {
    for (const piece of splitter.split(doc)) {
      if (piece.special) continue;
      for (const m of piece.text.matchAll(GPT2_SPLIT_REGEX)) wordFreq.set(m[0], (wordFreq.get(m[0]) ?? 0) + 1);
    }
  }

  // 2. Initial symbols: byte ids (special tokens first, then the 256 bytes by code point).
  const byteId = new Int32Array(256);
  BYTES_BY_CODEPOINT.forEach((b, i) => (byteId[b] = specials.length + i));
  const encoder = new TextEncoder();
  const words: number[][] = [];
  const freqs: number[] = [];
  for (const [w, f] of wordFreq) {
    const bytes = encoder.encode(w);
    words.push(Array.from(bytes, (b) => byteId[b]!));
    freqs.push(f);
  }

  // 3. Pair counts and the inverted index pair -> word indices (may hold stale entries).
  const pairCount = new Map<number, number>();
  const where = new Map<number, number[]>();
  for (let w = 0; w < words.length; w++) {
    const sym = words[w]!;
    for (let i = 0; i + 1 < sym.length; i++) {
      const k = pairKey(sym[i]!, sym[i + 1]!);
      pairCount.set(k, (pairCount.get(k) ?? 0) + freqs[w]!);
      const list = where.get(k);
      if (list === undefined) where.set(k, [w]);
      else if (list[list.length - 1] !== w) list.push(w);
    }
  }
  const heap = new PairHeap();
  for (const [k, c] of pairCount) heap.push(c, k);

  // 4. Merge loop.
  const merges: [number, number][] = [];
  const stamp = new Int32Array(words.length).fill(-1); // last merge that visited each word
  const target = opts.vocabSize - base;
  while (merges.length < target && heap.size > 0) {
    const { count, key } = heap.pop();
    const current = pairCount.get(key) ?? 0;
    if (current !== count) {
      if (current > 0) heap.push(current, key); // stale entry: requeue with its true count
      continue;
    }
    if (count < minFrequency || count === 0) break;
    const a = Math.floor(key / KEY_BASE);
    const b = key % KEY_BASE;
    const newId = base + merges.length;
    merges.push([a, b]);
    const touched = new Set<number>(); // pairs containing newId whose count rose
    for (const w of where.get(key) ?? []) {
      if (stamp[w] === merges.length) continue;
      stamp[w] = merges.length;
      const sym = words[w]!;
      const f = freqs[w]!;
      let found = false;
      for (let i = 0; i + 1 < sym.length; i++) if (sym[i] === a && sym[i + 1] === b) found = true;
      if (!found) continue;
      for (let i = 0; i + 1 < sym.length; i++) addCount(pairCount, pairKey(sym[i]!, sym[i + 1]!), -f);
      const merged: number[] = [];
      for (let i = 0; i < sym.length; i++) {
        if (i + 1 < sym.length && sym[i] === a && sym[i + 1] === b) {
          merged.push(newId);
          i++;
        } else merged.push(sym[i]!);
      }
      words[w] = merged;
      for (let i = 0; i + 1 < merged.length; i++) {
        const l = merged[i]!;
        const r = merged[i + 1]!;
        const k = pairKey(l, r);
        addCount(pairCount, k, f);
        if (l === newId || r === newId) {
          touched.add(k);
          const list = where.get(k);
          if (list === undefined) where.set(k, [w]);
          else if (list[list.length - 1] !== w) list.push(w);
        }
      }
    }
    pairCount.delete(key);
    where.delete(key);
    for (const k of touched) {
      const c = pairCount.get(k) ?? 0;
      if (c > 0) heap.push(c, k);
    }
    if (opts.onProgress && merges.length % 500 === 0) opts.onProgress(merges.length, target);
  }

  // 5. Vocabulary strings.
  const tokens: string[] = [...specials, ...BYTES_BY_CODEPOINT.map((b) => BYTE_TO_UNICODE[b]!)];
  for (const [l, r] of merges) tokens.push(tokens[l]! + tokens[r]!);
  return ByteLevelBpe.fromJson(buildTokenizerJson(tokens, merges, specials));
}

function addCount(m: Map<number, number>, k: number, d: number): void {
  const c = (m.get(k) ?? 0) + d;
  if (c === 0) m.delete(k);
  else m.set(k, c);
}

function buildTokenizerJson(tokens: string[], merges: [number, number][], specials: string[]): TokenizerJson {
  const vocab: Record<string, number> = {};
  tokens.forEach((t, i) => {
    if (vocab[t] !== undefined) throw new BpeError(`duplicate token ${JSON.stringify(t)} (ids ${vocab[t]} and ${i})`);
    vocab[t] = i;
  });
  const byteLevel = { type: "ByteLevel" as const, add_prefix_space: false, trim_offsets: true, use_regex: true };
  return {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: specials.map((content, id) => ({
      id,
      content,
      single_word: false,
      lstrip: false,
      rstrip: false,
      normalized: false,
      special: true,
    })),
    normalizer: null,
    pre_tokenizer: byteLevel,
    post_processor: null,
    decoder: byteLevel,
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab,
      merges: merges.map(([l, r]) => `${tokens[l]} ${tokens[r]}`),
    },
  };
}

/** Max-heap of (count, pair key): larger count first, then smaller key (= smaller (left, right)). */
class PairHeap {
  private counts: number[] = [];
  private keys: number[] = [];
  get size(): number {
    return this.counts.length;
  }
  private above(i: number, j: number): boolean {
    const ci = this.counts[i]!;
    const cj = this.counts[j]!;
    return ci > cj || (ci === cj && this.keys[i]! < this.keys[j]!);
  }
  private swap(i: number, j: number): void {
    [this.counts[i], this.counts[j]] = [this.counts[j]!, this.counts[i]!];
    [this.keys[i], this.keys[j]] = [this.keys[j]!, this.keys[i]!];
  }
  push(count: number, key: number): void {
    this.counts.push(count);
    this.keys.push(key);
    for (let i = this.counts.length - 1; i > 0;) {
      const p = (i - 1) >> 1;
      if (!this.above(i, p)) break;
      this.swap(i, p);
      i = p;
    }
  }
  pop(): { count: number; key: number } {
    const top = { count: this.counts[0]!, key: this.keys[0]! };
    const lastC = this.counts.pop()!;
    const lastK = this.keys.pop()!;
    const n = this.counts.length;
    if (n > 0) {
      this.counts[0] = lastC;
      this.keys[0] = lastK;
      for (let i = 0; ;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < n && this.above(l, m)) m = l;
        if (r < n && this.above(r, m)) m = r;
        if (m === i) break;
        this.swap(i, m);
        i = m;
      }
    }
    return top;
  }
}

/** Splits text around special tokens, leftmost-longest (as HF's added-token splitter does). */
class SpecialSplitter {
  private readonly re: RegExp | null;
  constructor(specials: string[]) {
    const sorted = [...specials].sort((x, y) => y.length - x.length);
    const esc = sorted.map((s) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
    this.re = specials.length > 0 ? new RegExp(esc.join("|"), "gu") : null;
  }
  split(text: string): { text: string; special: boolean }[] {
    if (this.re === null) return [{ text, special: false }];
    const out: { text: string; special: boolean }[] = [];
    let last = 0;
    for (const m of text.matchAll(this.re)) {
      if (m.index! > last) out.push({ text: text.slice(last, m.index), special: false });
      out.push({ text: m[0], special: true });
      last = m.index! + m[0].length;
    }
    if (last < text.length) out.push({ text: text.slice(last), special: false });
    return out;
  }
}

/**
 * Encoder/decoder for a byte-level BPE tokenizer.json (ours, or GPT-2-like ones without a
 * normalizer). Matches @huggingface/tokenizers' encode (no post-processor) and decode with
 * clean_up_tokenization_spaces false.
 */
export class ByteLevelBpe {
  readonly vocabSize: number;
  readonly specialTokens: ReadonlyMap<string, number>;
  private readonly tokens: string[];
  private readonly tokenBytes: Uint8Array[]; // per id; empty for special tokens
  private readonly isSpecialId: Uint8Array;
  private readonly mergeRank = new Map<number, number>(); // pair key -> merge rank (lower merges first)
  private readonly mergeResult: Int32Array; // merge rank -> merged token id
  private readonly byteId = new Int32Array(256);
  private readonly splitter: SpecialSplitter;
  private readonly cache = new Map<string, number[]>();
  private readonly encoder = new TextEncoder();
  private readonly decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });

  private constructor(readonly json: TokenizerJson) {
    const vocab = json.model.vocab;
    const tokens: string[] = [];
    for (const [t, id] of Object.entries(vocab)) tokens[id] = t;
    for (const a of json.added_tokens) tokens[a.id] = a.content;
    this.tokens = tokens;
    this.vocabSize = tokens.length;
    this.specialTokens = new Map(json.added_tokens.map((a) => [a.content, a.id]));
    this.isSpecialId = new Uint8Array(tokens.length);
    for (const id of this.specialTokens.values()) this.isSpecialId[id] = 1;
    this.tokenBytes = tokens.map((t, id) => {
      if (this.isSpecialId[id]) return new Uint8Array(0);
      return Uint8Array.from(Array.from(t, (c) => UNICODE_TO_BYTE.get(c) ?? 0x3f));
    });
    for (let b = 0; b < 256; b++) {
      const id = vocab[BYTE_TO_UNICODE[b]!];
      if (id === undefined) throw new BpeError(`tokenizer.json lacks the byte token for 0x${b.toString(16)}`);
      this.byteId[b] = id;
    }
    this.mergeResult = new Int32Array(json.model.merges.length);
    (json.model.merges as (string | [string, string])[]).forEach((m, rank) => {
      const [l, r] = typeof m === "string" ? m.split(" ") : m; // tokenizers >= 0.20 writes [left, right]
      const li = vocab[l!];
      const ri = vocab[r!];
      const to = vocab[l! + r!];
      if (li === undefined || ri === undefined || to === undefined) throw new BpeError(`merge ${rank} "${m}" names unknown tokens`);
      if (!this.mergeRank.has(pairKey(li, ri))) this.mergeRank.set(pairKey(li, ri), rank);
      this.mergeResult[rank] = to;
    });
    this.splitter = new SpecialSplitter([...this.specialTokens.keys()]);
  }

  /** Wraps a tokenizer.json object (as written by trainBpeTokenizer or read from disk). */
  static fromJson(json: TokenizerJson): ByteLevelBpe {
    if (json.model?.type !== "BPE") throw new BpeError(`tokenizer.json model type ${String(json.model?.type)} is not BPE`);
    return new ByteLevelBpe(json);
  }

  /** Token ids of `text`; special tokens in the text become their ids. */
  encode(text: string): number[] {
    const out: number[] = [];
    for (const piece of this.splitter.split(text)) {
      if (piece.special) {
        out.push(this.specialTokens.get(piece.text)!);
        continue;
      }
      for (const m of piece.text.matchAll(GPT2_SPLIT_REGEX)) {
        const ids = this.bpeWord(m[0]);
        for (let i = 0; i < ids.length; i++) out.push(ids[i]!);
      }
    }
    return out;
  }

  /** Text of `ids`; invalid UTF-8 byte runs decode to U+FFFD as in HF. */
  decode(ids: ArrayLike<number>, opts: { skipSpecialTokens?: boolean } = {}): string {
    let text = "";
    let buf: number[] = [];
    const flush = (): void => {
      if (buf.length > 0) text += this.decoder.decode(Uint8Array.from(buf));
      buf = [];
    };
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i]!;
      if (id < 0 || id >= this.vocabSize) throw new BpeError(`token id ${id} out of range [0, ${this.vocabSize})`);
      if (this.isSpecialId[id]) {
        if (opts.skipSpecialTokens) continue;
        flush();
        text += this.tokens[id];
      } else for (const b of this.tokenBytes[id]!) buf.push(b);
    }
    flush();
    return text;
  }

  tokenToId(token: string): number | undefined {
    return this.json.model.vocab[token] ?? this.specialTokens.get(token);
  }
  idToToken(id: number): string | undefined {
    return this.tokens[id];
  }
  isSpecial(id: number): boolean {
    return this.isSpecialId[id] === 1;
  }

  /** BPE of one pre-token: repeatedly merge the best-ranked adjacent pair, all its occurrences left to right. */
  private bpeWord(word: string): number[] {
    const hit = this.cache.get(word);
    if (hit !== undefined) return hit;
    let sym = Array.from(this.encoder.encode(word), (b) => this.byteId[b]!);
    while (sym.length > 1) {
      let bestRank = Infinity;
      let bestL = -1;
      let bestR = -1;
      for (let i = 0; i + 1 < sym.length; i++) {
        const rank = this.mergeRank.get(pairKey(sym[i]!, sym[i + 1]!));
        if (rank !== undefined && rank < bestRank) {
          bestRank = rank;
          bestL = sym[i]!;
          bestR = sym[i + 1]!;
        }
      }
      if (bestRank === Infinity) break;
      const bestTo = this.mergeResult[bestRank]!;
      const next: number[] = [];
      for (let i = 0; i < sym.length; i++) {
        if (i + 1 < sym.length && sym[i] === bestL && sym[i + 1] === bestR) {
          next.push(bestTo);
          i++;
        } else next.push(sym[i]!);
      }
      sym = next;
    }
    if (this.cache.size > 200_000) this.cache.clear();
    this.cache.set(word, sym);
    return sym;
  }
}

export interface TokenizerConfigOptions {
  bosToken?: string | null;
  eosToken?: string;
  padToken?: string | null;
  modelMaxLength?: number;
  chatTemplate?: string;
}

/** ChatML (Qwen-style): `<|im_start|>role\ncontent<|im_end|>\n` per message, then the assistant header. */
export const CHATML_TEMPLATE =
  "{%- for message in messages %}" +
  "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}" +
  "{%- endfor %}" +
  "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/** A tokenizer_config.json for a trained tokenizer (transformers' PreTrainedTokenizerFast fields). */
export function makeTokenizerConfig(tok: ByteLevelBpe, opts: TokenizerConfigOptions = {}): Record<string, unknown> {
  const specials = [...tok.specialTokens.keys()];
  const need = (t: string | null | undefined): string | null => {
    if (t === undefined || t === null) return null;
    if (!tok.specialTokens.has(t)) throw new BpeError(`"${t}" is not one of the special tokens ${specials.join(", ")}`);
    return t;
  };
  const eos = need(opts.eosToken ?? (tok.specialTokens.has("<|im_end|>") ? "<|im_end|>" : specials[0]));
  const decoderEntries = Object.fromEntries(
    tok.json.added_tokens.map((a) => [
      String(a.id),
      { content: a.content, lstrip: false, normalized: false, rstrip: false, single_word: false, special: true },
    ]),
  );
  return {
    add_bos_token: false,
    add_prefix_space: false,
    added_tokens_decoder: decoderEntries,
    additional_special_tokens: specials.filter((s) => s !== eos),
    bos_token: need(opts.bosToken ?? null),
    chat_template: opts.chatTemplate ?? CHATML_TEMPLATE,
    clean_up_tokenization_spaces: false,
    eos_token: eos,
    errors: "replace",
    model_max_length: opts.modelMaxLength ?? 2048,
    pad_token: need(opts.padToken === undefined ? (tok.specialTokens.has("<|endoftext|>") ? "<|endoftext|>" : eos) : opts.padToken),
    split_special_tokens: false,
    tokenizer_class: "PreTrainedTokenizerFast",
    unk_token: null,
  };
}

/** Writes tokenizer.json and tokenizer_config.json into `dir` (created if missing). */
export function saveTokenizer(dir: string, tok: ByteLevelBpe, config: TokenizerConfigOptions = {}): void {
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(tok.json, null, 2));
  writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify(makeTokenizerConfig(tok, config), null, 2));
}
