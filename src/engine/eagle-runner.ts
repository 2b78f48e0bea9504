// The EAGLE head's forward passes over its own paged KV cache (eagle.ts decides what each feeds): replayed step graphs
// where captured, as a draft model's steps are, else op by op. Two sets of graphs, as the two kinds of step differ in
// their rows: the feed steps (the served model's hidden states, which EAGLE-3 first combines through fc; chunks of
// several positions per request) as mixed buckets, and the draft steps (one position per request, fed with the head's
// own output) as decode buckets. A graph returns its sampled rows' argmax and output hidden states; the draft
// vocabulary's ids are mapped to the target's (d2t) on the host. A step no captured bucket fits runs eagerly.
import { CaptureError } from "../util/errors.js";
import type { DType } from "../backends/dtype.js";
import type { EagleHead } from "../models/eagle-head.js";
import { empty, tensor, type Tensor } from "../tensor/index.js";
import type { ScheduledBatch } from "./model-runner.js";
import { asFloat32, type StepForward } from "./step-forward.js";
import { StepGraphs } from "./step-graphs.js";

/** One sequence of a head forward: tokens at head positions start .., their hidden inputs, and whether its last row is read. */
export interface HeadSequence {
  ids: readonly number[];
  rows: readonly Float32Array[];
  start: number;
  blockTable: readonly number[];
  /** Flat KV slot of each position fed. */
  slots: Int32Array;
  read: boolean;
}

/** A read row: the head's greedy target token there, and its output hidden state (fed back at the next position). */
export interface HeadOutput {
  token: number;
  hidden: Float32Array;
}

/** The buckets the head's graphs capture: decode batch sizes (draft steps) and mixed token counts (feed steps). */
export interface HeadCaptureOptions {
  decodeBuckets: readonly number[];
  mixedBuckets: readonly number[];
  fuse?: boolean;
}

/**
 * The head's step as a step graph computes it: `target` rows are the served model's hidden states (combined first),
 * else the head's own; outputs the sampled rows' logits, argmax and residual stream.
 */
function headStep(head: EagleHead, target: boolean): StepForward {
  return {
    device: head.device,
    vocabSize: head.config.layer.vocabSize,
    inputWidth: target ? head.targetRowSize : head.config.layer.hiddenSize,
    hiddenRows: "sampled",
    trace: ({ ids, positions, slots, queryStart, seqLens, tables, rowIndex, rowInputs }, kvCaches) => {
      const input = target ? head.combine(rowInputs!) : rowInputs!;
      const out = head.forward(ids, input, { kind: "paged", positions, slotMapping: slots, blockTables: tables, queryStart, seqLens, kvCaches });
      if (input !== rowInputs) input.dispose();
      const picked = rowIndex === null ? out : out.indexSelect(0, rowIndex);
      if (picked !== out) out.dispose();
      const logits = head.logits(picked);
      return { logits, argmax: logits.argmax(-1), hidden: asFloat32(picked) };
    },
  };
}

export class EagleHeadRunner {
  private kvCaches: { k: Tensor; v: Tensor }[] = [];
  /** Captured feed and draft steps (capture()), or null: those steps run eagerly. */
  private feed: StepGraphs | null = null;
  private draft: StepGraphs | null = null;
  /** Head forwards replayed, and run eagerly (no graphs, or none that fit the step). */
  replays = 0;
  eagerSteps = 0;
  /** Why the last capture() fell back to eager execution, or null. */
  captureFailure: string | null = null;
  /** The last capture() arguments, to capture again once the KV cache is back (sleep mode). */
  private captureArgs: { maxModelLen: number; options: HeadCaptureOptions } | null = null;

  constructor(
    readonly head: EagleHead,
    readonly blockSize: number,
    private readonly numBlocks: number,
    private readonly kvDtype: DType = "float32",
  ) {
    this.allocate();
  }

  get captured(): boolean {
    return this.feed !== null;
  }

  /**
   * Captures the feed steps (mixed buckets) and the draft steps (decode buckets) for sequences of up to `maxModelLen`
   * positions. False (nothing captured, a warning emitted) when the device or one of the head's ops cannot capture.
   */
  capture(maxModelLen: number, options: HeadCaptureOptions): boolean {
    this.dropGraphs();
    if (!StepGraphs.deviceCaptures(this.head.device)) return false;
    this.captureArgs = { maxModelLen, options };
    const maxBlocks = Math.ceil(maxModelLen / this.blockSize);
    const fuse = options.fuse === true;
    const mixedRows = Math.max(1, ...options.decodeBuckets); // at most one read row per request
    try {
      this.feed = StepGraphs.capture(headStep(this.head, true), this.kvCaches, maxBlocks, { decodeBuckets: [], mixedBuckets: options.mixedBuckets, mixedRows, fuse });
      this.draft = StepGraphs.capture(headStep(this.head, false), this.kvCaches, maxBlocks, { decodeBuckets: options.decodeBuckets, fuse });
    } catch (e) {
      this.dropGraphs();
      if (!(e instanceof CaptureError)) throw e;
      this.captureFailure = e.message;
      process.emitWarning(`Kiln: the EAGLE head's step graphs are unavailable, it runs eagerly: ${e.message}`, "KilnWarning");
      return false;
    }
    return true;
  }

  /**
   * One head forward over `seqs` (`target`: their rows are the served model's); for each sequence with `read`, its
   * last row's greedy token and output hidden state (by sequence index).
   */
  run(seqs: readonly HeadSequence[], target: boolean): (HeadOutput | undefined)[] {
    const T = seqs.reduce((n, s) => n + s.ids.length, 0);
    const width = seqs[0]!.rows[0]!.length;
    const rows = new Float32Array(T * width);
    let at = 0;
    for (const s of seqs) for (const r of s.rows) rows.set(r, (at++) * width);
    const batch: ScheduledBatch = {
      sequences: seqs.map((s) => ({ requestId: "", tokenIds: s.ids, startPosition: s.start, blockTable: s.blockTable, slotMapping: s.slots, needsLogits: s.read, needsPromptLogits: false })),
      blockSize: this.blockSize, numTokens: T, finishedRequestIds: [], sampleOnDevice: true,
    };
    const replay = (target ? this.feed : this.draft)?.launch(batch, rows) ?? null;
    let read: { tokens: Int32Array; hidden: Float32Array } | null = null;
    if (replay !== null) {
      this.replays++;
      // (a step that reads nothing is not waited for: the next one queues behind it)
      if (seqs.some((s) => s.read)) {
        const { tokenIds, hidden } = replay.wait();
        read = { tokens: this.head.toTarget(tokenIds!.slice()), hidden: hidden! };
      }
    } else {
      this.eagerSteps++;
      read = this.runEager(batch, rows, width, target);
    }
    const result: (HeadOutput | undefined)[] = seqs.map(() => undefined);
    if (read === null) return result;
    const H = this.head.config.layer.hiddenSize;
    let k = 0;
    seqs.forEach((s, i) => {
      if (!s.read) return;
      result[i] = { token: read.tokens[k]!, hidden: read.hidden.slice(k * H, (k + 1) * H) };
      k++;
    });
    return result;
  }

  /** The step op by op: the read rows' target tokens and hidden states [reads, H], or null when none is read. */
  private runEager(batch: ScheduledBatch, rows: Float32Array, width: number, target: boolean): { tokens: Int32Array; hidden: Float32Array } | null {
    const dev = this.head.device;
    const seqs = batch.sequences;
    const T = batch.numTokens;
    const ids = new Int32Array(T), positions = new Int32Array(T), slots = new Int32Array(T);
    const queryStart = new Int32Array(seqs.length + 1), seqLens = new Int32Array(seqs.length);
    const maxBlocks = Math.max(1, ...seqs.map((s) => s.blockTable.length));
    const tables = new Int32Array(seqs.length * maxBlocks);
    const readRows: number[] = [];
    let at = 0;
    seqs.forEach((s, i) => {
      const n = s.tokenIds.length;
      ids.set(s.tokenIds, at);
      for (let j = 0; j < n; j++) positions[at + j] = s.startPosition + j;
      slots.set(s.slotMapping, at);
      queryStart[i] = at;
      seqLens[i] = s.startPosition + n;
      tables.set(s.blockTable, i * maxBlocks);
      at += n;
      if (s.needsLogits) readRows.push(at - 1);
    });
    queryStart[seqs.length] = at;
    const t = (a: Int32Array, shape?: number[]) => tensor(a, { device: dev, shape });
    const ctx = {
      kind: "paged" as const, positions: t(positions), slotMapping: t(slots), blockTables: t(tables, [seqs.length, maxBlocks]),
      queryStart: t(queryStart), seqLens: t(seqLens), kvCaches: this.kvCaches,
    };
    const idsT = t(ids);
    const rowsT = tensor(rows, { device: dev, shape: [T, width] });
    const input = target ? this.head.combine(rowsT) : rowsT;
    const outT = this.head.forward(idsT, input, ctx);
    if (input !== rowsT) input.dispose();
    for (const x of [idsT, rowsT, ctx.positions, ctx.slotMapping, ctx.blockTables, ctx.queryStart, ctx.seqLens]) x.dispose();
    let read: { tokens: Int32Array; hidden: Float32Array } | null = null;
    if (readRows.length > 0) {
      const idx = t(Int32Array.from(readRows));
      const picked = outT.indexSelect(0, idx);
      idx.dispose();
      read = { tokens: this.head.greedy(picked), hidden: picked.dataSync() as Float32Array };
      picked.dispose();
    }
    outT.dispose();
    return read;
  }

  private allocate(): void {
    const c = this.head.config.layer;
    const shape = [this.numBlocks, this.blockSize, c.numKeyValueHeads, c.headDim];
    for (let i = 0; i < this.head.numLayers; i++)
      this.kvCaches.push({ k: empty(shape, { device: this.head.device, dtype: this.kvDtype }), v: empty(shape, { device: this.head.device, dtype: this.kvDtype }) });
  }

  private dropGraphs(): void {
    this.feed?.dispose();
    this.draft?.dispose();
    this.feed = this.draft = null;
  }

  private freeCaches(): void {
    this.dropGraphs(); // (they point into the caches)
    for (const c of this.kvCaches) {
      c.k.dispose();
      c.v.dispose();
    }
    this.kvCaches = [];
  }

  /** Sleep mode: frees the head's KV cache and its graphs; restoreKvCache() allocates it again and captures anew. */
  releaseKvCache(): void {
    this.freeCaches();
  }

  restoreKvCache(): void {
    if (this.kvCaches.length > 0) return;
    this.allocate();
    if (this.captureArgs !== null) this.capture(this.captureArgs.maxModelLen, this.captureArgs.options);
  }

  dispose(): void {
    this.freeCaches();
  }
}
