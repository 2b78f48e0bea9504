// Step graphs: the model's forward captured once per bucket at start-up and replayed each step with one
// native call (vLLM's CUDA graphs, on the cpu device's stream). Decode buckets are batch sizes of one-token
// sequences; mixed buckets (prefill chunks with decodes) are token counts. A bucket owns persistent input
// tensors (token ids, positions, KV slots, query starts, sequence lengths, block tables, sampled rows) and its
// logits; a step writes its metadata into them with stream-ordered copies, pads the batch up to the bucket
// with dummy sequences that read and write only the null block 0, and launches the graph. Prompt logprobs
// and batches above the largest buckets run eagerly. What the graph computes is a StepForward (step-forward.ts):
// the served model's forward (with the hidden rows an EAGLE drafter reads, when it needs them), or an EAGLE head's.
import type { AsyncWrite, Backend, DeviceBuffer, ReplaySession, StepGraph } from "../backends/backend.js";
import type { DType } from "../backends/dtype.js";
import type { CausalLM } from "../models/causal-lm.js";
import type { Device } from "../tensor/device.js";
import { compileCacheStats, resolveCodeName } from "../compile/cache.js";
import { enableDeferAndFuse } from "../compile/defer.js";
import { codeName } from "../compile/jit.js";
import { flushDeferred } from "../tensor/dispatch.js";
import { withEagerMode } from "../tensor/mode.js";
import { Storage } from "../tensor/storage.js";
import { noGrad, tensor, Tensor } from "../tensor/index.js";
import { fillFedTokens, type DeviceTokens, type FedTokens, type ScheduledBatch } from "./model-runner.js";
import type { StepForward, StepGraphInputs, StepOutputs } from "./step-forward.js";
import { loadStepGraphRecordings, saveStepGraphRecordings, type BucketRecording } from "./step-graph-cache.js";

/** Decode batch sizes captured by default: powers of two up to maxNumSeqs, at most `cap`. */
export function decodeBuckets(maxNumSeqs: number, cap = 32): number[] {
  return powersOfTwo(1, Math.max(1, Math.min(maxNumSeqs, cap)));
}

/**
 * Token counts of the mixed (prefill/chunked) step graphs: powers of two from 4 up to min(budget, cap). A short
 * prompt pads only to the next of them (vLLM captures 1, 2, 4, 8 too): a 1-token completion of a 3-token prompt on
 * the bf16 SmolLM-135M bench model took 38-40 ms over HTTP padded to 16 tokens (its f32-exact small-M matmuls are
 * compute-bound there) and 17-35 ms at 4.
 */
export function mixedBuckets(maxNumBatchedTokens: number, cap = 512): number[] {
  const top = Math.min(maxNumBatchedTokens, cap);
  return top < 4 ? [] : powersOfTwo(4, top);
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
 * Outputs: logits, their argmax (int32, for batches sampled on the device), and the forward's hidden rows or null.
 */
interface Bucket extends StepGraphInputs, StepOutputs {
  kind: "decode" | "mixed";
  tokens: number;
  rows: number;
  graph: StepGraph;
}

/** What a launch's wait() returns: the sampled rows' logits (or only their ids) and the forward's hidden rows. */
export interface StepResult {
  logits: Float32Array;
  tokenIds?: Int32Array;
  /** StepForward.hiddenRows: [batch tokens or sampled rows, width]. */
  hidden?: Float32Array;
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
  /** The graphs were re-created from recordings in the compile cache (no model trace). */
  replayed: boolean;
}

export interface StepGraphOptions {
  decodeBuckets: readonly number[];
  mixedBuckets?: readonly number[];
  /** Sampled rows a mixed step can return (default: the largest decode bucket). */
  mixedRows?: number;
  /** Record under defer-and-fuse: elementwise chains become generated C kernels (compiled, cached on disk). */
  fuse?: boolean;
  onProgress?: (p: CaptureProgress) => void;
  /**
   * Replay the graphs from recordings stored under `key` in the compile cache when they fit, else trace them and
   * store their recordings there. `key` must name everything the capture depends on (step-graph-cache.ts);
   * `mark` is the back end's allocationMark() taken before the model was loaded.
   */
  cache?: { key: string; mark: number };
  /** The model has LoRA slots: each bucket gets a per-token slot input (ScheduledSequence.loraSlot). */
  lora?: boolean;
}

/** Device-sampled steps whose ids may be unread at once: the engine keeps two in flight, read in order. */
const SAMPLED_SLOTS = 4;

/** One slot of the ring the device-sampled ids are copied to behind each launch; `owner` the step it holds. */
interface SampledSlot {
  buffer: DeviceBuffer;
  owner: SampledIds | null;
}

/** A launch's argmax ids in a ring slot: read() waits for the launch only (later launches may still run). */
class SampledIds implements DeviceTokens {
  private ids: Int32Array | null = null;
  constructor(
    private readonly backend: Backend,
    readonly slot: SampledSlot,
    private readonly fence: number,
    readonly rows: number,
  ) {
    slot.owner = this;
  }

  read(): Int32Array {
    if (this.ids !== null) return this.ids;
    if (this.slot.owner !== this)
      throw new Error(`[step graphs] sampled ids were read after ${SAMPLED_SLOTS} later launches reused their slot`);
    const bytes = this.backend.readAfter!(this.fence, this.slot.buffer, 0, this.rows * 4);
    // assembled from the bytes (little-endian hosts, as the model loaders assume): an Int32Array view would make V8
    // move the small copy's bytes off its heap first (bytes.buffer), an allocation per step
    const ids = new Int32Array(this.rows);
    for (let r = 0, b = 0; r < this.rows; r++, b += 4) ids[r] = bytes[b]! | (bytes[b + 1]! << 8) | (bytes[b + 2]! << 16) | (bytes[b + 3]! << 24);
    this.ids = ids;
    return ids;
  }
}

export class StepGraphs {
  private readonly decode: Bucket[] = [];
  private readonly mixed: Bucket[] = [];
  /** Steps served by a replay, and those of them sampled on the device (for tests and stats). */
  replays = 0;
  mixedReplays = 0;
  deviceSampled = 0;
  /** Replays whose token ids came (in part) from an earlier replay's sampled ids, copied on the device. */
  fedReplays = 0;
  info: CaptureInfo | null = null;

  private readonly vocabSize: number;
  /** Where device-sampled ids go (null until the first such launch, or when the back end cannot read behind a fence). */
  private sampled: SampledSlot[] | null = null;
  private nextSlot = 0;
  private readonly numBlocks: number;
  private readonly blockSize: number;

  private constructor(
    private readonly forward: StepForward,
    kvCaches: { k: Tensor; v: Tensor }[],
    readonly maxBlocksPerSeq: number,
    private readonly lora: boolean,
  ) {
    this.vocabSize = forward.vocabSize;
    const shape = kvCaches[0]!.k.shape; // [numBlocks, blockSize, kvHeads, headDim]
    this.numBlocks = shape[0]!;
    this.blockSize = shape[1]!;
  }

  /**
   * Whether the model's device can capture (the cpu back end with its native stream). A tensor-parallel model cannot:
   * its all-reduces are host calls between kernels, which a replayed graph would skip.
   */
  static supported(model: CausalLM): boolean {
    return (model.tp === null || model.tp.size <= 1) && StepGraphs.deviceCaptures(model.device);
  }

  /** Whether the device's back end can capture and replay step graphs. */
  static deviceCaptures(device: Device): boolean {
    const b = device.backend;
    return typeof b.beginCapture === "function" && typeof b.endCapture === "function" && typeof b.writeAsync === "function";
  }

  /**
   * Captures `forward` once per bucket. `kvCaches` are the runner's paged caches (the graphs write into them).
   * Throws whatever the capture throws (CaptureError for an op that cannot be captured); nothing is kept then.
   */
  static capture(forward: StepForward, kvCaches: { k: Tensor; v: Tensor }[], maxBlocksPerSeq: number, options: StepGraphOptions): StepGraphs {
    const graphs = new StepGraphs(forward, kvCaches, maxBlocksPerSeq, options.lora === true);
    const fuse = options.fuse === true;
    const decode = [...options.decodeBuckets];
    const mixed = [...(options.mixedBuckets ?? [])];
    const rows = options.mixedRows ?? Math.max(1, ...decode);
    // (kind, tokens, rows) of every bucket in capture order
    const plan = [
      ...decode.map((n) => ({ kind: "decode" as const, tokens: n, rows: n })),
      ...mixed.map((n) => ({ kind: "mixed" as const, tokens: n, rows: Math.min(n, rows) })), // a step samples at most one row per token
    ];
    const t0 = performance.now();
    const before = compileCacheStats();
    const info = (replayed: boolean): CaptureInfo => {
      const after = compileCacheStats();
      return {
        decodeBuckets: decode,
        mixedBuckets: mixed,
        kernels: [...graphs.decode, ...graphs.mixed].reduce((a, b) => a + b.graph.kernels, 0),
        programsCompiled: after.misses - before.misses,
        programsFromCache: after.hits - before.hits,
        compileMs: after.compileMs - before.compileMs,
        seconds: (performance.now() - t0) / 1000,
        replayed,
      };
    };
    const backend = forward.device.backend;
    const cache = options.cache !== undefined && backend.replayCapture !== undefined && backend.takeRecording !== undefined ? options.cache : null;
    if (cache !== null && graphs.replay(cache, plan, options.onProgress)) {
      graphs.info = info(true);
      return graphs;
    }
    if (fuse) enableDeferAndFuse({ setMode: false });
    const recordings: BucketRecording[] | null = cache === null ? null : [];
    try {
      plan.forEach((p, i) => {
        (p.kind === "decode" ? graphs.decode : graphs.mixed).push(graphs.captureOne(p.kind, p.tokens, p.rows, kvCaches, fuse, recordings, cache?.mark ?? 0));
        options.onProgress?.({ done: i + 1, total: plan.length, bucket: `${p.kind} ${p.tokens}` });
      });
    } catch (e) {
      graphs.dispose();
      throw e;
    }
    graphs.info = info(false);
    if (cache !== null && recordings !== null && recordings.length === plan.length) saveStepGraphRecordings(cache.key, recordings);
    return graphs;
  }

  /**
   * Re-creates every bucket from the recordings stored under the key; false (nothing kept) when there are none or
   * they do not fit this process, and the caller traces instead.
   */
  private replay(
    cache: { key: string; mark: number },
    plan: { kind: Bucket["kind"]; tokens: number; rows: number }[],
    onProgress: StepGraphOptions["onProgress"],
  ): boolean {
    const stored = loadStepGraphRecordings(cache.key);
    if (stored === null || stored.length !== plan.length) return false;
    if (stored.some((b, i) => b.kind !== plan[i]!.kind || b.tokens !== plan[i]!.tokens || b.rows !== plan[i]!.rows)) return false;
    const session: ReplaySession = { mark: cache.mark, recreated: new Map() };
    for (const [i, rec] of stored.entries()) {
      const bucket = this.replayBucket(rec, session);
      if (bucket === null) {
        this.dispose();
        return false;
      }
      (rec.kind === "decode" ? this.decode : this.mixed).push(bucket);
      onProgress?.({ done: i + 1, total: plan.length, bucket: `${rec.kind} ${rec.tokens}` });
    }
    return true;
  }

  /** One bucket from its recording, or null (nothing kept) when it does not fit this process. */
  private replayBucket(rec: BucketRecording, session: ReplaySession): Bucket | null {
    const dev = this.forward.device;
    const inputs = this.inputs(rec.kind, rec.tokens, rec.rows);
    let replayed: ReturnType<NonNullable<Backend["replayCapture"]>> = null;
    try {
      replayed = dev.backend.replayCapture!(rec.recording, rootsOf(inputs), session, resolveCodeName);
    } catch {
      // a recorded call the addon rejects (a recording from a build the key failed to tell apart): trace instead
    }
    const view = (name: string): Tensor | null => {
      const v = rec.views[name];
      const buffer = replayed?.outputs.get(name);
      return v === undefined || buffer === undefined ? null : new Tensor(new Storage(dev, buffer), v.dtype as DType, v.shape, v.strides, v.offset);
    };
    const logits = view("logits");
    const argmax = view("argmax");
    const hidden = view("hidden");
    if (replayed === null || logits === null || argmax === null || (hidden === null) !== (this.forward.hiddenRows === null)) {
      replayed?.graph.dispose();
      for (const t of [...Object.values(inputs), logits, argmax, hidden]) t?.dispose();
      return null;
    }
    return { kind: rec.kind, tokens: rec.tokens, rows: rec.rows, ...inputs, logits, argmax, hidden, graph: replayed.graph };
  }

  /**
   * A bucket's persistent inputs, holding capture-time metadata (the kernels' index checks read it): every token a
   * one-token sequence at position 0 in the null block 0.
   */
  private inputs(kind: Bucket["kind"], tokens: number, rows: number): StepGraphInputs {
    const dev = this.forward.device;
    const i32 = (a: Int32Array, shape?: number[]) => tensor(a, { device: dev, shape });
    return {
      ids: i32(new Int32Array(tokens)),
      positions: i32(new Int32Array(tokens)),
      slots: i32(new Int32Array(tokens)),
      queryStart: i32(Int32Array.from({ length: tokens + 1 }, (_, i) => i)),
      seqLens: i32(new Int32Array(tokens).fill(1)),
      tables: i32(new Int32Array(tokens * this.maxBlocksPerSeq), [tokens, this.maxBlocksPerSeq]),
      rowIndex: kind === "mixed" ? i32(new Int32Array(rows)) : null,
      loraSlots: this.lora ? i32(new Int32Array(tokens).fill(-1)) : null,
      rowInputs: this.forward.inputWidth > 0 ? tensor(new Float32Array(tokens * this.forward.inputWidth), { device: dev, shape: [tokens, this.forward.inputWidth] }) : null,
    };
  }

  /**
   * With `fuse`, the forward is recorded under the defer-and-fuse eager mode: elementwise chains become
   * generated C kernels (compiled once, then loaded from the on-disk compile cache) captured like any kernel.
   * With `recordings`, the capture is also recorded as data (pushed there when the back end can describe it).
   */
  private captureOne(
    kind: Bucket["kind"],
    tokens: number,
    rows: number,
    kvCaches: { k: Tensor; v: Tensor }[],
    fuse: boolean,
    recordings: BucketRecording[] | null,
    mark: number,
  ): Bucket {
    const backend = this.forward.device.backend;
    const inputs = this.inputs(kind, tokens, rows);
    let out: StepOutputs | null = null;
    backend.beginCapture!({ record: recordings !== null });
    try {
      const run = (): void => void (out = this.forward.trace(inputs, kvCaches));
      noGrad(() => (fuse ? withEagerMode("defer-and-fuse", run) : run()));
      flushDeferred();
    } catch (e) {
      backend.abortCapture?.();
      const o = out as StepOutputs | null;
      for (const t of [...Object.values(inputs), o?.logits, o?.argmax, o?.hidden]) t?.dispose();
      throw e;
    }
    const graph: StepGraph = backend.endCapture!();
    const { logits, argmax, hidden } = out!;
    if (recordings !== null) {
      const named = Object.entries({ logits, argmax, hidden }).filter((e): e is [string, Tensor] => e[1] !== null);
      const outputs = new Map(named.map(([k, t]) => [k, t.storage.buffer]));
      const recording = backend.takeRecording?.(rootsOf(inputs), outputs, mark, codeName) ?? null;
      const views = Object.fromEntries(named.map(([k, t]) => [k, { dtype: t.dtype, shape: [...t.shape], strides: [...t.strides], offset: t.offset }]));
      if (recording !== null) recordings.push({ kind, tokens, rows, recording, views });
    }
    return { kind, tokens, rows: kind === "decode" ? tokens : rows, ...inputs, logits, argmax, hidden, graph };
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
      if (s.needsLogits) sampled += 1 + (s.numSpecTokens ?? 0);
    }
    if (decodeOnly) {
      const b = this.decode.find((x) => x.tokens >= n);
      if (b !== undefined) return b;
    }
    return this.mixed.find((x) => x.tokens >= batch.numTokens && x.rows >= sampled) ?? null;
  }

  /**
   * Enqueues the step (metadata copies, then the replay); wait() returns the logits of the sampled rows, or
   * with batch.sampleOnDevice only their argmax ids, and the forward's hidden rows. `rowInputs`: each token's float
   * row [numTokens, inputWidth] when the forward takes them. Null (nothing enqueued) when no captured bucket fits:
   * the caller runs the step eagerly.
   */
  launch(batch: ScheduledBatch, rowInputs?: Float32Array): { wait(): StepResult; deviceTokens?: DeviceTokens } | null {
    const b = this.bucketFor(batch);
    if (b === null) return null;
    const width = this.forward.inputWidth;
    if ((rowInputs?.length ?? 0) !== batch.numTokens * width)
      throw new RangeError(`[step graphs] ${rowInputs?.length ?? 0} row inputs for ${batch.numTokens} tokens of width ${width}`);
    const backend = this.forward.device.backend;
    const fed = batch.fedTokens;
    // fed tokens still in this object's ring are copied on the device; any others are read here
    const from = fed?.from;
    const fedOnDevice = from instanceof SampledIds && from.slot.owner === from && this.sampled?.includes(from.slot) === true;
    const fedAt = new Uint8Array(fed === undefined ? 0 : b.tokens);
    if (fed !== undefined) for (const at of fed.at) fedAt[at] = 1;
    const numSlots = this.numBlocks * this.blockSize;
    const T = b.tokens;
    const W = this.maxBlocksPerSeq;
    const bs = this.blockSize;
    // the inputs side by side in one array (written to the device as one stream job, writeAsyncMany)
    const staging = new Int32Array(5 * T + 1 + T * W + b.rows + (b.loraSlots === null ? 0 : T));
    let end = 0;
    const take = (n: number): Int32Array => staging.subarray(end, (end += n));
    const ids = take(T);
    const positions = take(T);
    const slots = take(T);
    const queryStart = take(T + 1);
    const seqLens = take(T);
    const tables = take(T * W); // dummy and empty sequences read the null block
    const rowIndex = take(b.rows);
    const loraSlots = b.loraSlots === null ? null : take(T).fill(-1); // padding tokens use no adapter
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
        const id = fedAt[at + j] === 1 ? 0 : s.tokenIds[j]!;
        const slot = s.slotMapping[j]!;
        if (id < 0 || id >= this.vocabSize) throw new RangeError(`token id ${id} out of range`);
        if (slot < 0 || slot >= numSlots) throw new RangeError(`KV slot ${slot} out of range`);
        ids[at + j] = id;
        positions[at + j] = s.startPosition + j;
        slots[at + j] = slot;
      }
      if (loraSlots !== null) loraSlots.fill(s.loraSlot ?? -1, at, at + len);
      at += len;
      if (s.needsLogits) for (let j = s.numSpecTokens ?? 0; j >= 0; j--) rowIndex[row++] = at - 1 - j;
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
    if (fed !== undefined && !fedOnDevice) {
      fillFedTokens(ids, fed); // waits for the step that samples them
      for (const at of fed.at) if (ids[at]! < 0 || ids[at]! >= this.vocabSize) throw new RangeError(`token id ${ids[at]} out of range`);
    }
    const writes: AsyncWrite[] = [];
    const put = (t: Tensor, a: Int32Array): void => {
      const v = t.view_("step graph input");
      writes.push({ buffer: v.buffer, byteOffset: v.offset * 4, src: new Uint8Array(a.buffer, a.byteOffset, a.byteLength) });
    };
    put(b.ids, ids);
    put(b.positions, positions);
    put(b.slots, slots);
    put(b.queryStart, queryStart);
    put(b.seqLens, seqLens);
    put(b.tables, tables);
    if (b.rowIndex !== null) put(b.rowIndex, rowIndex);
    if (b.loraSlots !== null) put(b.loraSlots, loraSlots!);
    // (rows of padding tokens keep earlier values: each is a sequence of its own, read by no real row)
    if (b.rowInputs !== null) writes.push({ buffer: b.rowInputs.view_("step graph input").buffer, byteOffset: b.rowInputs.offset * 4, src: new Uint8Array(rowInputs!.buffer, rowInputs!.byteOffset, rowInputs!.byteLength) });
    if (backend.writeAsyncMany) backend.writeAsyncMany(writes);
    else for (const w of writes) backend.writeAsync!(w.buffer, w.byteOffset, w.src);
    if (fedOnDevice && fed !== undefined && fed.at.length > 0) {
      this.copyFed(fed, b.ids);
      this.fedReplays++;
    }
    b.graph.launch();
    this.replays++;
    if (b.kind === "mixed") this.mixedReplays++;
    const V = b.logits.shape[1]!;
    const hiddenOf = (): { hidden?: Float32Array } => (b.hidden === null ? {} : { hidden: firstRows(b.hidden, this.forward.hiddenRows === "tokens" ? batch.numTokens : row) });
    if (batch.sampleOnDevice === true) {
      this.deviceSampled++;
      const ring = this.sampledRing();
      if (ring === null) {
        return { wait: () => ({ logits: new Float32Array(0), tokenIds: (b.argmax.dataSync() as Int32Array).slice(0, row), ...hiddenOf() }) };
      }
      // the ids go to a ring slot behind the replay, so that the next launch (queued before they are read) can
      // neither overwrite them nor make reading them wait for it
      const slot = ring[this.nextSlot]!;
      this.nextSlot = (this.nextSlot + 1) % ring.length;
      const v = b.argmax.view_("sampled ids");
      backend.copyAsync!(v.buffer, v.offset * 4, slot.buffer, 0, row * 4);
      const tokens = new SampledIds(backend, slot, backend.fence!(), row);
      return { wait: () => ({ logits: new Float32Array(0), tokenIds: tokens.read(), ...hiddenOf() }), deviceTokens: tokens };
    }
    return { wait: () => ({ logits: (b.logits.dataSync() as Float32Array).slice(0, row * V), ...hiddenOf() }) };
  }

  /** The ring of device-sampled ids, allocated on first use; null when the back end cannot copy and read behind a fence. */
  private sampledRing(): SampledSlot[] | null {
    if (this.sampled !== null) return this.sampled;
    const backend = this.forward.device.backend;
    if (backend.copyAsync === undefined || backend.fence === undefined || backend.readAfter === undefined) return null;
    const rows = Math.max(...[...this.decode, ...this.mixed].map((b) => b.rows));
    this.sampled = Array.from({ length: SAMPLED_SLOTS }, () => ({ buffer: backend.allocate(rows * 4), owner: null }));
    return this.sampled;
  }

  /** Stream-ordered copies of the fed ids from their ring slot into the bucket's token ids, one per run of consecutive rows. */
  private copyFed(fed: FedTokens, ids: Tensor): void {
    const from = fed.from as SampledIds;
    const backend = this.forward.device.backend;
    const v = ids.view_("step graph input");
    for (let k = 0; k < fed.at.length; ) {
      const row = fed.rows[k]!;
      if (row < 0 || row >= from.rows) throw new RangeError(`fed token row ${row} outside the ${from.rows} sampled rows`);
      let n = 1;
      while (k + n < fed.at.length && fed.at[k + n] === fed.at[k]! + n && fed.rows[k + n] === row + n && row + n < from.rows) n++;
      backend.copyAsync!(from.slot.buffer, row * 4, v.buffer, (v.offset + fed.at[k]!) * 4, n * 4);
      k += n;
    }
  }

  /** Per-kernel replay times of the decode bucket for `n` sequences (bench/step-profile), or null. */
  profileDecode(n: number, reps: number): { op: string; ns: number; medianNs: number }[] | null {
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
      for (const t of [b.ids, b.positions, b.slots, b.queryStart, b.seqLens, b.tables, b.rowIndex, b.loraSlots, b.rowInputs, b.logits, b.argmax, b.hidden]) t?.dispose();
    }
    this.decode.length = 0;
    this.mixed.length = 0;
    for (const slot of this.sampled ?? []) this.forward.device.backend.free(slot.buffer);
    this.sampled = null;
  }
}

/** The first `n` rows of a float32 output [rows, width], read from the device (after the work queued on it). */
function firstRows(t: Tensor, n: number): Float32Array {
  const v = t.narrow(0, 0, n);
  const out = v.dataSync() as Float32Array;
  v.dispose();
  return out;
}

/** The inputs' buffers by name, as recordings name their roots. */
function rootsOf(inputs: StepGraphInputs): Map<string, DeviceBuffer> {
  const roots = new Map<string, DeviceBuffer>();
  for (const [name, t] of Object.entries(inputs)) if (t !== null) roots.set(name, t.storage.buffer);
  return roots;
}
