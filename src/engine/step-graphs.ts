// Decode step graphs: the model's decode forward captured once per batch-size bucket at start-up and
// replayed each step with one native call (vLLM's CUDA graphs, on the cpu device's stream). A bucket owns
// persistent input tensors (token ids, positions, KV slots, query starts, sequence lengths, block tables)
// and its logits; a step writes its metadata into them with stream-ordered copies, pads the batch up to
// the bucket with dummy sequences that read and write only the null block 0, and launches the graph.
// Prefill and mixed batches, prompt logprobs and batches above the largest bucket run eagerly.
import type { StepGraph } from "../backends/backend.js";
import type { CausalLM } from "../models/causal-lm.js";
import { compileCacheStats } from "../compile/cache.js";
import { enableDeferAndFuse } from "../compile/defer.js";
import { flushDeferred } from "../tensor/dispatch.js";
import { withEagerMode } from "../tensor/mode.js";
import { noGrad, tensor, type Tensor } from "../tensor/index.js";
import type { ScheduledBatch } from "./model-runner.js";

/** Batch sizes captured by default: powers of two up to maxNumSeqs, at most `cap`. */
export function decodeBuckets(maxNumSeqs: number, cap = 32): number[] {
  const top = Math.max(1, Math.min(maxNumSeqs, cap));
  const out: number[] = [];
  for (let b = 1; b < top; b *= 2) out.push(b);
  out.push(top);
  return out;
}

interface Bucket {
  size: number;
  ids: Tensor;
  positions: Tensor;
  slots: Tensor;
  queryStart: Tensor;
  seqLens: Tensor;
  tables: Tensor;
  logits: Tensor;
  /** argmax of each logits row (int32), for batches sampled on the device. */
  argmax: Tensor;
  graph: StepGraph;
}

export interface CaptureProgress {
  done: number;
  total: number;
  bucket: number;
}

/** What a start-up capture did: reported by `kiln serve`, checked by tests and bench/startup. */
export interface CaptureInfo {
  buckets: number[];
  /** Kernels recorded over all buckets. */
  kernels: number;
  /** Fused-kernel libraries built by the C compiler during the capture, and those loaded from the compile cache. */
  programsCompiled: number;
  programsFromCache: number;
  compileMs: number;
  seconds: number;
}

export class DecodeGraphs {
  private readonly buckets: Bucket[] = [];
  /** Steps served by a replay, and those of them sampled on the device (for tests and stats). */
  replays = 0;
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
  static capture(
    model: CausalLM,
    kvCaches: { k: Tensor; v: Tensor }[],
    buckets: readonly number[],
    maxBlocksPerSeq: number,
    options: { fuse?: boolean; onProgress?: (p: CaptureProgress) => void } = {},
  ): DecodeGraphs {
    const graphs = new DecodeGraphs(model, kvCaches, maxBlocksPerSeq);
    const onProgress = options.onProgress;
    if (options.fuse === true) enableDeferAndFuse({ setMode: false });
    const t0 = performance.now();
    const before = compileCacheStats();
    try {
      buckets.forEach((size, i) => {
        graphs.buckets.push(graphs.captureOne(size, kvCaches, options.fuse === true));
        onProgress?.({ done: i + 1, total: buckets.length, bucket: size });
      });
    } catch (e) {
      graphs.dispose();
      throw e;
    }
    const after = compileCacheStats();
    graphs.info = {
      buckets: [...buckets],
      kernels: graphs.buckets.reduce((a, b) => a + b.graph.kernels, 0),
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
  private captureOne(size: number, kvCaches: { k: Tensor; v: Tensor }[], fuse: boolean): Bucket {
    const dev = this.model.device;
    const backend = dev.backend;
    const i32 = (n: number, shape?: number[]) => tensor(new Int32Array(n), { device: dev, shape });
    // Dummy metadata: every sequence is one token at position 0 in the null block 0.
    const ids = i32(size);
    const positions = i32(size);
    const slots = i32(size);
    const queryStart = tensor(Int32Array.from({ length: size + 1 }, (_, i) => i), { device: dev });
    const seqLens = tensor(new Int32Array(size).fill(1), { device: dev });
    const tables = i32(size * this.maxBlocksPerSeq, [size, this.maxBlocksPerSeq]);
    let logits: Tensor | null = null;
    let argmax: Tensor | null = null;
    backend.beginCapture!();
    try {
      const run = (): void => {
        const hidden = this.model.forward(ids, { kind: "paged", positions, slotMapping: slots, blockTables: tables, queryStart, seqLens, kvCaches });
        logits = this.model.logits(hidden);
        argmax = logits.argmax(-1);
        hidden.dispose();
      };
      noGrad(() => (fuse ? withEagerMode("defer-and-fuse", run) : run()));
      flushDeferred();
    } catch (e) {
      backend.abortCapture?.();
      for (const t of [ids, positions, slots, queryStart, seqLens, tables, logits, argmax]) t?.dispose();
      throw e;
    }
    const graph: StepGraph = backend.endCapture!();
    return { size, ids, positions, slots, queryStart, seqLens, tables, logits: logits!, argmax: argmax!, graph };
  }

  /** The smallest captured bucket for a decode-only batch, or null when the batch must run eagerly. */
  bucketFor(batch: ScheduledBatch): number | null {
    const n = batch.sequences.length;
    if (n === 0 || batch.numTokens !== n) return null;
    for (const s of batch.sequences) if (s.tokenIds.length !== 1 || !s.needsLogits || s.needsPromptLogits || s.blockTable.length > this.maxBlocksPerSeq) return null;
    const b = this.buckets.find((x) => x.size >= n);
    return b === undefined ? null : b.size;
  }

  /**
   * Enqueues the step (metadata copies, then the replay); wait() returns the logits of the real rows, or
   * with batch.sampleOnDevice only their argmax ids.
   */
  launch(batch: ScheduledBatch): { wait(): { logits: Float32Array; tokenIds?: Int32Array } } {
    const n = batch.sequences.length;
    const b = this.buckets.find((x) => x.size >= n)!;
    const S = b.size;
    const W = this.maxBlocksPerSeq;
    const ids = new Int32Array(S);
    const positions = new Int32Array(S);
    const slots = new Int32Array(S); // padding rows write the null block's slot 0
    const queryStart = Int32Array.from({ length: S + 1 }, (_, i) => i);
    const seqLens = new Int32Array(S).fill(1);
    const tables = new Int32Array(S * W); // padding rows read the null block
    batch.sequences.forEach((s, i) => {
      ids[i] = s.tokenIds[0]!;
      positions[i] = s.startPosition;
      slots[i] = s.slotMapping[0]!;
      seqLens[i] = s.startPosition + 1;
      tables.set(s.blockTable, i * W);
    });
    const numSlots = this.numBlocks * this.blockSize;
    for (let i = 0; i < n; i++) {
      // replays trust their metadata: check what the kernels would have checked
      if (ids[i]! < 0 || ids[i]! >= this.vocabSize) throw new RangeError(`token id ${ids[i]} out of range`);
      if (slots[i]! < 0 || slots[i]! >= numSlots) throw new RangeError(`KV slot ${slots[i]} out of range`);
    }
    for (const id of tables) if (id < 0 || id >= this.numBlocks) throw new RangeError(`block id ${id} out of range`);
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
    b.graph.launch();
    this.replays++;
    const V = b.logits.shape[1]!;
    if (batch.sampleOnDevice === true) {
      this.deviceSampled++;
      return { wait: () => ({ logits: new Float32Array(0), tokenIds: (b.argmax.dataSync() as Int32Array).slice(0, n) }) };
    }
    return { wait: () => ({ logits: (b.logits.dataSync() as Float32Array).slice(0, n * V) }) };
  }

  /** Bytes the graphs pin (CpuStepGraph.pinnedBytes), summed: buffers every graph uses (weights, KV caches) count once per graph. */
  get pinnedBytes(): number {
    let n = 0;
    for (const b of this.buckets) n += (b.graph as { pinnedBytes?: number }).pinnedBytes ?? 0;
    return n;
  }

  dispose(): void {
    for (const b of this.buckets) {
      b.graph.dispose();
      for (const t of [b.ids, b.positions, b.slots, b.queryStart, b.seqLens, b.tables, b.logits, b.argmax]) t.dispose();
    }
    this.buckets.length = 0;
  }
}
