// Language-model data pipeline: documents -> token stream (EOS after every document) -> windows of
// seqLen+1 tokens -> shuffled batches of (inputs, targets = inputs shifted by one).
//
// Window i covers tokens [i*seqLen, i*seqLen + seqLen] (inclusive), so consecutive windows share one
// token and every token but the first is a target exactly once per epoch (nanoGPT/llm.c packing).
// The shuffle RNG state at the start of the epoch plus the batch cursor is the whole loader state:
// restore() regenerates the same permutation and resumes at the same batch.
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, writeFileSync, renameSync } from "node:fs";
import { dirname } from "node:path";
import { KilnError } from "../util/errors.js";

export class DataLoaderError extends KilnError {
  override name = "DataLoaderError";
}

/** What the data pipeline needs from a tokenizer (ByteLevelBpe and HF wrappers satisfy it). */
export interface TextEncoderLike {
  encode(text: string, options?: { addSpecialTokens?: boolean }): number[];
}

/** A part of a document and whether its tokens are trained on as targets (a chat's assistant turns) or not (prompts). */
export interface DocumentSegment {
  text: string;
  train: boolean;
}

/** Plain text (every token a target), or segments (chat fine-tuning: only the `train` segments' tokens are). */
export type TrainingDocument = string | readonly DocumentSegment[];

/** The target cross-entropy skips (torch's ignore_index). */
export const MASKED_TARGET = -100;

// In a token stream, a token that is never a target is stored as -(id + 1) (ids are >= 0): the stream and its cache
// keep one int32 per token, and the loader reads the id back for the inputs and MASKED_TARGET for the targets.
const masked = (id: number): number => -id - 1;
const idOf = (v: number): number => (v >= 0 ? v : -v - 1);

// ---------------------------------------------------------------- RNG

/** xoshiro128** (32-bit, 4 words of state); seeded with splitmix32 so any integer seed is fine. */
export class Rng {
  private s: Uint32Array;
  constructor(seed: number | readonly number[]) {
    if (typeof seed !== "number") {
      if (seed.length !== 4) throw new DataLoaderError(`Rng state needs 4 words, got ${seed.length}`);
      this.s = Uint32Array.from(seed);
      return;
    }
    let x = seed >>> 0;
    this.s = new Uint32Array(4);
    for (let i = 0; i < 4; i++) {
      x = (x + 0x9e3779b9) >>> 0;
      let z = x;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
      this.s[i] = (z ^ (z >>> 16)) >>> 0;
    }
    if (this.s.every((v) => v === 0)) this.s[0] = 1;
  }
  /** Uniform uint32. */
  nextU32(): number {
    const s = this.s;
    const result = Math.imul(rotl(Math.imul(s[1], 5), 7), 9) >>> 0;
    const t = (s[1] << 9) >>> 0;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 11);
    return result;
  }
  /** Uniform integer in [0, n) (n <= 2^32; the modulo bias is below 2^-32 * n). */
  nextInt(n: number): number {
    return Math.floor((this.nextU32() / 4294967296) * n);
  }
  state(): number[] {
    return Array.from(this.s);
  }
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}

/** In-place Fisher-Yates shuffle. */
export function shuffleInPlace(arr: Int32Array | number[], rng: Rng): void {
  for (let i = arr.length - 1; i > 0; i--) {
    const j = rng.nextInt(i + 1);
    const t = arr[i]!;
    arr[i] = arr[j]!;
    arr[j] = t;
  }
}

// ---------------------------------------------------------------- split + tokenize

/**
 * Deterministic held-out split by document: a seeded permutation picks round(fraction * n) docs
 * (at least one when fraction > 0 and n >= 2) for validation; both lists keep corpus order.
 */
export function splitDocuments<T extends TrainingDocument>(docs: T[], valFraction: number, seed = 0): { train: T[]; val: T[] } {
  if (!(valFraction >= 0 && valFraction < 1)) throw new DataLoaderError(`validation fraction ${valFraction} not in [0, 1)`);
  const n = docs.length;
  let nVal = Math.round(valFraction * n);
  if (valFraction > 0 && n >= 2) nVal = Math.max(1, nVal);
  const order = Int32Array.from({ length: n }, (_, i) => i);
  shuffleInPlace(order, new Rng(seed ^ 0x5eed));
  const isVal = new Uint8Array(n);
  for (let i = 0; i < nVal; i++) isVal[order[i]!] = 1;
  const train: T[] = [];
  const val: T[] = [];
  docs.forEach((d, i) => (isVal[i] ? val : train).push(d));
  return { train, val };
}

/** One token stream: doc0 tokens, EOS, doc1 tokens, EOS, ... */
/**
 * Documents as one token stream, an EOS after each. A segmented document's segments are encoded one by one (no
 * special tokens added: a chat template writes its own), the untrained ones' tokens and its closing EOS stored masked.
 */
export function tokenizeDocuments(docs: readonly TrainingDocument[], tok: TextEncoderLike, eosId: number): Int32Array {
  const parts: number[][] = [];
  let total = 0;
  for (const d of docs) {
    const ids = typeof d === "string" ? [...tok.encode(d), eosId] : [...d.flatMap((seg) => tok.encode(seg.text, { addSpecialTokens: false }).map((id) => (seg.train ? id : masked(id)))), masked(eosId)];
    parts.push(ids);
    total += ids.length;
  }
  const out = new Int32Array(total);
  let o = 0;
  for (const ids of parts) {
    out.set(ids, o);
    o += ids.length;
  }
  return out;
}

export interface TokenDatasets {
  train: Int32Array;
  val: Int32Array;
  trainDocs: number;
  valDocs: number;
  /** True when the tokens came from the .bin cache. */
  fromCache: boolean;
}

export interface BuildDatasetsOptions {
  docs: TrainingDocument[];
  tokenizer: TextEncoderLike;
  eosId: number;
  valFraction: number;
  seed?: number;
  /** Path of a .bin token cache; reused when its key (tokenizer, corpus, split) matches. */
  cachePath?: string;
  /** Part of the cache key that identifies the tokenizer (e.g. JSON.stringify(tokenizer.json)). */
  tokenizerKey?: string;
}

const CACHE_MAGIC = "KILNTOK1";

/**
 * Splits, tokenizes and (optionally) caches a corpus.
 * Cache file: "KILNTOK1", uint32 header length, JSON header {key, train, val, trainDocs, valDocs}
 * padded to 4 bytes, then int32 little-endian train tokens followed by val tokens.
 */
export function buildDatasets(opts: BuildDatasetsOptions): TokenDatasets {
  const seed = opts.seed ?? 0;
  const key = opts.cachePath ? cacheKey(opts) : "";
  if (opts.cachePath && existsSync(opts.cachePath)) {
    const cached = readTokenCache(opts.cachePath, key);
    if (cached) return cached;
  }
  const { train, val } = splitDocuments(opts.docs, opts.valFraction, seed);
  const ds: TokenDatasets = {
    train: tokenizeDocuments(train, opts.tokenizer, opts.eosId),
    val: tokenizeDocuments(val, opts.tokenizer, opts.eosId),
    trainDocs: train.length,
    valDocs: val.length,
    fromCache: false,
  };
  if (opts.cachePath) writeTokenCache(opts.cachePath, key, ds);
  return ds;
}

function cacheKey(opts: BuildDatasetsOptions): string {
  const h = createHash("sha256");
  h.update(`${CACHE_MAGIC}|${opts.tokenizerKey ?? ""}|${opts.eosId}|${opts.valFraction}|${opts.seed ?? 0}|${opts.docs.length}|`);
  for (const d of opts.docs) {
    h.update(typeof d === "string" ? d : JSON.stringify(d));
    h.update("\u0000");
  }
  return h.digest("hex");
}

function writeTokenCache(path: string, key: string, ds: TokenDatasets): void {
  const header = JSON.stringify({ key, train: ds.train.length, val: ds.val.length, trainDocs: ds.trainDocs, valDocs: ds.valDocs });
  const headerBytes = Buffer.from(header.padEnd(Math.ceil((header.length + 12) / 4) * 4 - 12, " "), "utf8");
  const body = Buffer.alloc(12 + headerBytes.length + 4 * (ds.train.length + ds.val.length));
  body.write(CACHE_MAGIC, 0, "latin1");
  body.writeUInt32LE(headerBytes.length, 8);
  headerBytes.copy(body, 12);
  let o = 12 + headerBytes.length;
  for (const arr of [ds.train, ds.val]) {
    Buffer.from(arr.buffer, arr.byteOffset, arr.byteLength).copy(body, o); // little-endian hosts only
    o += arr.byteLength;
  }
  mkdirSync(dirname(path), { recursive: true });
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, body);
  renameSync(tmp, path); // atomic: a concurrent reader never sees half a file
}

function readTokenCache(path: string, key: string): TokenDatasets | null {
  const buf = readFileSync(path);
  if (buf.length < 12 || buf.toString("latin1", 0, 8) !== CACHE_MAGIC) return null;
  const hlen = buf.readUInt32LE(8);
  const header = JSON.parse(buf.toString("utf8", 12, 12 + hlen)) as {
    key: string;
    train: number;
    val: number;
    trainDocs: number;
    valDocs: number;
  };
  if (header.key !== key) return null;
  const start = 12 + hlen;
  if (buf.length !== start + 4 * (header.train + header.val)) return null;
  const all = new Int32Array(header.train + header.val);
  new Uint8Array(all.buffer).set(buf.subarray(start));
  return {
    train: all.subarray(0, header.train),
    val: all.subarray(header.train),
    trainDocs: header.trainDocs,
    valDocs: header.valDocs,
    fromCache: true,
  };
}

// ---------------------------------------------------------------- loader

export interface DataLoaderOptions {
  batchSize: number;
  seqLen: number;
  seed?: number;
  /** false: windows in order, for validation (default true). */
  shuffle?: boolean;
  /** Data parallel: this rank reads batch `rank` of every `worldSize` consecutive batches. */
  rank?: number;
  worldSize?: number;
}

export interface Batch {
  inputs: Int32Array; // [batch * seqLen], row-major (batch, seqLen)
  targets: Int32Array; // [batch * seqLen], targets[b, t] = inputs[b, t + 1] within a window
}

/** Everything needed to resume a DataLoader at the same batch; JSON-serializable. */
export interface DataLoaderState {
  epoch: number;
  /** Next window index into this epoch's permutation. */
  cursor: number;
  /** Shuffle RNG state before this epoch's permutation was drawn. */
  epochRng: number[];
  /** Guards against restoring into a loader over different data. */
  numWindows: number;
  seqLen: number;
  batchSize: number;
}

/**
 * Seeded, resumable batch iterator over a token stream.
 * @example
 *   const dl = new DataLoader(ds.train, { batchSize: 8, seqLen: 256, seed: 42 });
 *   const { inputs, targets } = dl.next(); // Int32Array(8 * 256) each
 *   const saved = dl.state();  ...  dl.restore(saved);
 */
export class DataLoader {
  readonly batchSize: number;
  readonly seqLen: number;
  readonly numWindows: number;
  private readonly shuffle: boolean;
  private readonly rank: number;
  private readonly worldSize: number;
  private readonly seed: number;
  private rng: Rng;
  private epochRng: number[];
  private order: Int32Array;
  private cursor = 0;
  private epochNum = 0;

  constructor(
    private readonly tokens: Int32Array,
    opts: DataLoaderOptions,
  ) {
    this.batchSize = opts.batchSize;
    this.seqLen = opts.seqLen;
    this.shuffle = opts.shuffle ?? true;
    this.rank = opts.rank ?? 0;
    this.worldSize = opts.worldSize ?? 1;
    if (!(this.batchSize >= 1 && this.seqLen >= 1)) throw new DataLoaderError(`batchSize and seqLen must be >= 1`);
    if (!(this.rank >= 0 && this.rank < this.worldSize)) throw new DataLoaderError(`rank ${this.rank} not in [0, ${this.worldSize})`);
    this.numWindows = tokens.length > 1 ? Math.floor((tokens.length - 1) / this.seqLen) : 0;
    const perStep = this.batchSize * this.worldSize;
    if (this.numWindows < perStep)
      throw new DataLoaderError(
        `${tokens.length} tokens give ${this.numWindows} windows of ${this.seqLen}+1, fewer than one step's ${perStep} (batch ${this.batchSize} x world ${this.worldSize})`,
      );
    this.seed = opts.seed ?? 0;
    this.rng = new Rng(this.seed);
    this.epochRng = this.rng.state();
    this.order = this.permutation();
  }

  /** Full batches per epoch for this rank (the tail that does not fill a step is skipped). */
  get batchesPerEpoch(): number {
    return Math.floor(this.numWindows / (this.batchSize * this.worldSize));
  }
  get epoch(): number {
    return this.epochNum;
  }

  next(): Batch {
    const perStep = this.batchSize * this.worldSize;
    if (this.cursor + perStep > this.numWindows) this.startEpoch();
    const { seqLen } = this;
    const inputs = new Int32Array(this.batchSize * seqLen);
    const targets = new Int32Array(this.batchSize * seqLen);
    const first = this.cursor + this.rank * this.batchSize;
    for (let b = 0; b < this.batchSize; b++) {
      const start = this.order[first + b]! * seqLen;
      for (let t = 0; t < seqLen; t++) {
        const x = this.tokens[start + t]!;
        const y = this.tokens[start + t + 1]!;
        inputs[b * seqLen + t] = idOf(x);
        targets[b * seqLen + t] = y >= 0 ? y : MASKED_TARGET;
      }
    }
    this.cursor += perStep;
    return { inputs, targets };
  }

  state(): DataLoaderState {
    return {
      epoch: this.epochNum,
      cursor: this.cursor,
      epochRng: [...this.epochRng],
      numWindows: this.numWindows,
      seqLen: this.seqLen,
      batchSize: this.batchSize,
    };
  }

  restore(s: DataLoaderState): void {
    if (s.numWindows !== this.numWindows || s.seqLen !== this.seqLen || s.batchSize !== this.batchSize)
      throw new DataLoaderError(
        `state is for ${s.numWindows} windows, seqLen ${s.seqLen}, batch ${s.batchSize}; this loader has ${this.numWindows}, ${this.seqLen}, ${this.batchSize}`,
      );
    this.rng = new Rng(s.epochRng);
    this.epochRng = [...s.epochRng];
    this.order = this.permutation();
    this.epochNum = s.epoch;
    this.cursor = s.cursor;
  }

  /** Back to epoch 0, batch 0 (validation loaders call this before each evaluation). */
  reset(): void {
    this.rng = new Rng(this.seed);
    this.epochRng = this.rng.state();
    this.order = this.permutation();
    this.epochNum = 0;
    this.cursor = 0;
  }

  private startEpoch(): void {
    this.epochNum++;
    this.epochRng = this.rng.state();
    this.order = this.permutation();
    this.cursor = 0;
  }

  /** This epoch's window order; draws from the RNG only when shuffling. */
  private permutation(): Int32Array {
    const order = Int32Array.from({ length: this.numWindows }, (_, i) => i);
    if (this.shuffle) shuffleInPlace(order, this.rng);
    return order;
  }
}
