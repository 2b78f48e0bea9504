// Step graphs: the model's forward captured once per bucket at start-up and replayed each step with one
// native call (vLLM's CUDA graphs, on the cpu device's stream). Decode buckets are batch sizes of one-token
// sequences; mixed buckets (prefill chunks with decodes) are token counts. A bucket owns persistent input
// tensors (token ids, positions, KV slots, query starts, sequence lengths, block tables, sampled rows) and its
// logits; a step writes its metadata into them with stream-ordered copies, pads the batch up to the bucket
// with dummy sequences that read and write only the null block 0, and launches the graph. Prompt logprobs
// and batches above the largest buckets run eagerly.
import type { StepGraph } from "../backends/backend.js";
import type { CausalLM } from "../models/causal-lm.js";
import { compileCacheStats } from "../compile/cache.js";
import { enableDeferAndFuse } from "../compile/defer.js";
import { flushDeferred } from "../tensor/dispatch.js";
import { withEagerMode } from "../tensor/mode.js";
import { noGrad, tensor, type Tensor } from "../tensor/index.js";
import type { ScheduledBatch } from "./model-runner.js";

/** Decode batch sizes captured by default: powers of two up to maxNumSeqs, at most `cap`. */
export function decodeBuckets(maxNumSeqs: number, cap = 32): number[] {
  return powersOfTwo(1, Math.max(1, Math.min(maxNumSeqs, cap)));
}

/** Token counts of the mixed (prefill/chunked) step graphs: powers of two from 16 up to min(budget, cap). */
export function mixedBuckets(maxNumBatchedTokens: number, cap = 512): number[] {
  const top = Math.min(maxNumBatchedTokens, cap);
  return top < 16 ? [] : powersOfTwo(16, top);
}

function powersOfTwo(from: number, top: number): number[] {
  const out: number[] = [];
  for (let b = from; b < top; b *= 2) out.push(b);
  out.push(top);
  return out;
}

/**
 * A captured step. Decode buckets: `tokens` one-token sequences, logits for every row. Mixed buckets (prefill
 * chunks and decodes together): `tokens` token slots and as many sequence slots, logits for up to `rows`
 * sampled rows picked by `rowIndex`. Unused token slots become one-token dummy sequences in the null block,
 * unused sequence slots are empty (no tokens, no context), so padding costs little and touches no real block.
 */
interface Bucket {
  kind: "decode" | "mixed";
  tokens: number;
  rows: number;
  ids: Tensor;
  positions: Tensor;
  slots: Tensor;
  queryStart: Tensor;
  seqLens: Tensor;
  tables: Tensor;
  rowIndex: Tensor | null;
  logits: Tensor;
  /** argmax of each logits row (int32), for batches sampled on the device. */
  argmax: Tensor;
  graph: StepGraph;
}

export interface CaptureProgress {
  done: number;
  total: number;
  bucket: string;
}

/** What a start-up capture did: reported by `kiln serve`, checked by tests and bench/startup. */
export interface CaptureInfo {
  decodeBuckets: number[];
  mixedBuckets: number[];
  /** Kernels recorded over all buckets. */
  kernels: number;
  /** Fused-kernel libraries built by the C compiler during the capture, and those loaded from the compile cache. */
  programsCompiled: number;
  programsFromCache: number;
  compileMs: number;
  seconds: number;
}

export interface StepGraphOptions {
  decodeBuckets: readonly number[];
  mixedBuckets?: readonly number[];
  /** Sampled rows a mixed step can return (default: the largest decode bucket). */
  mixedRows?: number;
  /** Record under defer-and-fuse: elementwise chains become generated C kernels (compiled, cached on disk). */
  fuse?: boolean;
  onProgress?: (p: CaptureProgress) => void;
}

export class StepGraphs {
  private readonly decode: Bucket[] = [];
  private readonly mixed: Bucket[] = [];
  /** Steps served by a replay, and those of them sampled on the device (for tests and stats). */
  replays = 0;
  mixedReplays = 0;
  deviceSampled = 0;
  info: CaptureInfo | null = null;

  private readonly vocabSize: number;
  private readonly numBlocks: number;
  private readonly blockSize: number;

  private constructor(
    private readonly model: CausalLM,
    kvCaches: { k: Tensor; v: Tensor }[],
    readonly maxBlocksPerSeq: number,
  ) {
    this.vocabSize = model.config.vocabSize;
    const shape = kvCaches[0]!.k.shape; // [numBlocks, blockSize, kvHeads, headDim]
    this.numBlocks = shape[0]!;
    this.blockSize = shape[1]!;
  }

  /** Whether the model's device can capture (the cpu back end with its native stream). */
  static supported(model: CausalLM): boolean {
    const b = model.device.backend;
    return typeof b.beginCapture === "function" && typeof b.endCapture === "function" && typeof b.writeAsync === "function";
  }

  /**
   * Captures one graph per bucket. `kvCaches` are the runner's paged caches (the graphs write into them).
   * Throws whatever the capture throws (CaptureError for an op that cannot be captured); nothing is kept then.
   */
  static capture(model: CausalLM, kvCaches: { k: Tensor; v: Tensor }[], maxBlocksPerSeq: number, options: StepGraphOptions): StepGraphs {
    const graphs = new StepGraphs(model, kvCaches, maxBlocksPerSeq);
    const fuse = options.fuse === true;
    if (fuse) enableDeferAndFuse({ setMode: false });
    const decode = [...options.decodeBuckets];
    const mixed = [...(options.mixedBuckets ?? [])];
    const rows = options.mixedRows ?? Math.max(1, ...decode);
    const total = decode.length + mixed.length;
    const t0 = performance.now();
    const before = compileCacheStats();
    try {
      decode.forEach((n, i) => {
        graphs.decode.push(graphs.captureOne("decode", n, n, kvCaches, fuse));
        options.onProgress?.({ done: i + 1, total, bucket: `decode ${n}` });
      });
      mixed.forEach((n, i) => {
        graphs.mixed.push(graphs.captureOne("mixed", n, Math.min(n, rows), kvCaches, fuse)); // a step samples at most one row per token
        options.onProgress?.({ done: decode.length + i + 1, total, bucket: `mixed ${n}` });
      });
    } catch (e) {
      graphs.dispose();
      throw e;
    }
    const after = compileCacheStats();
    graphs.info = {
      decodeBuckets: decode,
      mixedBuckets: mixed,
      kernels: [...graphs.decode, ...graphs.mixed].reduce((a, b) => a + b.graph.kernels, 0),
      programsCompiled: after.misses - before.misses,
      programsFromCache: after.hits - before.hits,
      compileMs: after.compileMs - before.compileMs,
      seconds: (performance.now() - t0) / 1000,
    };
    return graphs;
  }

  /**
   * With `fuse`, the forward is recorded under the defer-and-fuse eager mode: elementwise chains become
   * generated C kernels (compiled once, then loaded from the on-disk compile cache) captured like any kernel.
   */
  private captureOne(kind: Bucket["kind"], tokens: number, rows: number, kvCaches: { k: Tensor; v: Tensor }[], fuse: boolean): Bucket {
    const dev = this.model.device;
    const backend = dev.backend;
    const i32 = (a: Int32Array, shape?: number[]) => tensor(a, { device: dev, shape });
    // Capture-time metadata (the kernels' index checks read it): every token a one-token sequence at position 0
    // in the null block 0.
    const ids = i32(new Int32Array(tokens));
    const positions = i32(new Int32Array(tokens));
    const slots = i32(new Int32Array(tokens));
    const queryStart = i32(Int32Array.from({ length: tokens + 1 }, (_, i) => i));
    const seqLens = i32(new Int32Array(tokens).fill(1));
    const tables = i32(new Int32Array(tokens * this.maxBlocksPerSeq), [tokens, this.maxBlocksPerSeq]);
    const rowIndex = kind === "mixed" ? i32(new Int32Array(rows)) : null;
    let logits: Tensor | null = null;
    let argmax: Tensor | null = null;
    backend.beginCapture!();
    try {
      const run = (): void => {
        const hidden = this.model.forward(ids, { kind: "paged", positions, slotMapping: slots, blockTables: tables, queryStart, seqLens, kvCaches });
        const picked = rowIndex === null ? hidden : hidden.indexSelect(0, rowIndex);
        logits = this.model.logits(picked);
        argmax = logits.argmax(-1);
        if (picked !== hidden) picked.dispose();
        hidden.dispose();
      };
      noGrad(() => (fuse ? withEagerMode("defer-and-fuse", run) : run()));
      flushDeferred();
    } catch (e) {
      backend.abortCapture?.();
      for (const t of [ids, positions, slots, queryStart, seqLens, tables, rowIndex, logits, argmax]) t?.dispose();
      throw e;
    }
    const graph: StepGraph = backend.endCapture!();
    return { kind, tokens, rows: kind === "decode" ? tokens : rows, ids, positions, slots, queryStart, seqLens, tables, rowIndex, logits: logits!, argmax: argmax!, graph };
  }

  /** The captured bucket that serves this batch, or null when it must run eagerly. */
  private bucketFor(batch: ScheduledBatch): Bucket | null {
    const n = batch.sequences.length;
    if (n === 0) return null;
    let decodeOnly = batch.numTokens === n;
    let sampled = 0;
    for (const s of batch.sequences) {
      if (s.needsPromptLogits || s.blockTable.length > this.maxBlocksPerSeq) return null;
      if (s.tokenIds.length !== 1 || !s.needsLogits) decodeOnly = false;
      if (s.needsLogits) sampled++;
    }
    if (decodeOnly) {
      const b = this.decode.find((x) => x.tokens >= n);
      if (b !== undefined) return b;
    }
    return this.mixed.find((x) => x.tokens >= batch.numTokens && x.rows >= sampled) ?? null;
  }

  /**
   * Enqueues the step (metadata copies, then the replay); wait() returns the logits of the sampled rows, or
   * with batch.sampleOnDevice only their argmax ids. Null (nothing enqueued) when no captured bucket fits:
   * the caller runs the step eagerly.
   */
  launch(batch: ScheduledBatch): { wait(): { logits: Float32Array; tokenIds?: Int32Array } } | null {
    const b = this.bucketFor(batch);
    if (b === null) return null;
    const numSlots = this.numBlocks * this.blockSize;
    const T = b.tokens;
    const W = this.maxBlocksPerSeq;
    const bs = this.blockSize;
    const ids = new Int32Array(T);
    const positions = new Int32Array(T);
    const slots = new Int32Array(T);
    const queryStart = new Int32Array(T + 1);
    const seqLens = new Int32Array(T);
    const tables = new Int32Array(T * W); // dummy and empty sequences read the null block
    const rowIndex = new Int32Array(b.rows);
    let at = 0;
    let row = 0;
    let seq = 0;
    for (const s of batch.sequences) {
      const len = s.tokenIds.length;
      queryStart[seq] = at;
      seqLens[seq] = s.startPosition + len;
      // replays trust their metadata: check what the kernels' index checks would have (padding is in range)
      for (const id of s.blockTable) if (id < 0 || id >= this.numBlocks) throw new RangeError(`block id ${id} out of range`);
      tables.set(s.blockTable, seq * W);
      for (let j = 0; j < len; j++) {
        const id = s.tokenIds[j]!;
        const slot = s.slotMapping[j]!;
        if (id < 0 || id >= this.vocabSize) throw new RangeError(`token id ${id} out of range`);
        if (slot < 0 || slot >= numSlots) throw new RangeError(`KV slot ${slot} out of range`);
        ids[at + j] = id;
        positions[at + j] = s.startPosition + j;
        slots[at + j] = slot;
      }
      at += len;
      if (s.needsLogits) rowIndex[row++] = at - 1;
      seq++;
    }
    // Unused token slots: one-token dummy sequences writing the null block (slots 0..blockSize-1).
    for (let k = 0; at < T; k++, at++, seq++) {
      queryStart[seq] = at;
      seqLens[seq] = 1;
      slots[at] = k % bs;
    }
    // Unused sequence slots (mixed buckets): empty.
    for (; seq <= T; seq++) queryStart[seq] = T;
    const backend = this.model.device.backend;
    const put = (t: Tensor, a: Int32Array): void => {
      const v = t.view_("step graph input");
      backend.writeAsync!(v.buffer, v.offset * 4, new Uint8Array(a.buffer, a.byteOffset, a.byteLength));
    };
    put(b.ids, ids);
    put(b.positions, positions);
    put(b.slots, slots);
    put(b.queryStart, queryStart);
    put(b.seqLens, seqLens);
    put(b.tables, tables);
    if (b.rowIndex !== null) put(b.rowIndex, rowIndex);
    b.graph.launch();
    this.replays++;
    if (b.kind === "mixed") this.mixedReplays++;
    const V = b.logits.shape[1]!;
    if (batch.sampleOnDevice === true) {
      this.deviceSampled++;
      return { wait: () => ({ logits: new Float32Array(0), tokenIds: (b.argmax.dataSync() as Int32Array).slice(0, row) }) };
    }
    return { wait: () => ({ logits: (b.logits.dataSync() as Float32Array).slice(0, row * V) }) };
  }

  /** Per-kernel replay times of the decode bucket for `n` sequences (bench/step-profile), or null. */
  profileDecode(n: number, reps: number): { op: string; ns: number }[] | null {
    const b = this.decode.find((x) => x.tokens === n);
    return b?.graph.profile?.(reps) ?? null;
  }

  /** Bytes the graphs pin (CpuStepGraph.pinnedBytes), summed: buffers every graph uses (weights, KV caches) count once per graph. */
  get pinnedBytes(): number {
    let n = 0;
    for (const b of [...this.decode, ...this.mixed]) n += (b.graph as { pinnedBytes?: number }).pinnedBytes ?? 0;
    return n;
  }

  dispose(): void {
    for (const b of [...this.decode, ...this.mixed]) {
      b.graph.dispose();
      for (const t of [b.ids, b.positions, b.slots, b.queryStart, b.seqLens, b.tables, b.rowIndex, b.logits, b.argmax]) t?.dispose();
    }
    this.decode.length = 0;
    this.mixed.length = 0;
  }
}
