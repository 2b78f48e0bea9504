// The real ModelRunner: turns a scheduled batch into one ragged forward pass over the paged KV cache.
// Builds the flat metadata (token ids, positions, slot mapping, query starts, sequence lengths, block tables),
// runs the model once for all scheduled tokens, and computes logits only for the rows that are sampled.
import * as os from "node:os";
import { DTYPE_BYTES, type DType } from "../backends/dtype.js";
import type { CausalLM } from "../models/causal-lm.js";
import type { ClassifierConfig } from "../models/hf-config.js";
import { LoraSlots } from "../models/lora-slots.js";
import { empty, noGrad, tensor, type Tensor } from "../tensor/index.js";
import { CaptureError } from "../util/errors.js";
import { weightTensors } from "../nn/quantized-linear.js";
import { StepGraphs, type CaptureProgress, type StepGraphOptions } from "./step-graphs.js";
import { causalLmStep } from "./step-forward.js";
import type { KvLayout } from "./kv-transfer.js";
import type { Gemma3Vision } from "../models/siglip.js";
import {
  fillFedTokens, type HiddenStatesRequest, type MultiModalFeature, type ModelRunner, type PendingRunnerOutput, type PoolingType, type RunnerOutput,
  type ScheduledBatch,
} from "./model-runner.js";

/**
 * How many bytes of weights move onto huge pages at start-up (Backend.moveToHugePages; in load order, the rest stays
 * on ordinary pages): half the machine's memory, or of a container's limit, a bound on what the move holds beside the
 * old copies until those are collected. Every decode step reads every weight, and a stream over 4 KiB pages restarts
 * the hardware prefetchers and misses the TLB at each page. Measured decode gains: SmolLM-135M int8 step 4-9% faster;
 * the 1B model's bf16 decode 18.1 -> 21.3 tok/s best, 69% -> 91% of the roofline in runs that saw this VM's fast
 * memory regime; its f32 decode (4.6 GiB, over the former 4 GiB cap) 6.4-6.8 -> 12.5-12.7 tok/s (LLM.generate, 16
 * tokens after 16, 3 runs each). The cost is start-up time, mostly faulting in memory the VM's host had not backed
 * yet: 257 MiB of bf16 weights 0.09-0.66 s, 2357 MiB 5.1 s, the 1B f32 model's 4.6 GiB 8.3 s (setup 1.6 -> 9.9 s).
 */
export function hugePageWeightBudget(): number {
  const limit = process.constrainedMemory?.(); // a container's memory limit (undefined or 0: none known)
  return Math.floor(Math.min(os.totalmem(), limit !== undefined && limit > 0 ? limit : Infinity) / 2);
}
/**
 * A KV cache up to this size gets huge pages. Every KV cache is faulted in at start-up (Backend.populate): left to
 * fault in while serving, its pages stalled the steps whose requests took blocks no earlier one had used (the free
 * block queue hands out the least recently used) by the first write into each page (~12 us per 4 KiB page, more for a
 * 2 MiB one, which can wait on memory compaction).
 */
export const HUGE_PAGE_MAX_KV_BYTES = 2 ** 30;

/**
 * Element type of the paged KV cache (vLLM's --kv-cache-dtype, resolved): bfloat16 halves its bytes, the fp8 formats
 * (e4m3fn, e5m2; values stored unscaled, vLLM's default k_scale = v_scale = 1.0) quarter them.
 */
export type KvCacheDtype = "float32" | "bfloat16" | "fp8_e4m3" | "fp8_e5m2";

/**
 * A step's rows inside images: their embeddings [R, hidden] and what their bidirectional attention pass reads, each
 * image's rows (consecutive) as one sequence that ends at the image's end.
 */
interface ImageRows {
  rows: Int32Array; // [R] rows of the batch
  values: Float32Array; // [R * hidden]
  positions: Int32Array; // [R]
  queryStart: Int32Array; // [I + 1]: image i's rows are rows[queryStart[i] .. queryStart[i + 1])
  seqLens: Int32Array; // [I]: each image's end
  blockTables: Int32Array; // [I * width]: each image's sequence's block table
}

/** Images whose embeddings the encoder cache keeps (each mm_tokens_per_image x hidden floats: 2.6 MB for gemma-3-4b). */
const ENCODER_CACHE_IMAGES = 64;

/** The tensor dtype a KV cache of this type is allocated as. */
export const KV_TENSOR_DTYPE: Record<KvCacheDtype, DType> = {
  float32: "float32",
  bfloat16: "bfloat16",
  fp8_e4m3: "float8_e4m3fn",
  fp8_e5m2: "float8_e5m2",
};

export interface KvCacheSpec {
  numBlocks: number;
  blockSize: number;
  /** Default float32. */
  dtype?: KvCacheDtype;
}

/** Each sequence's share of its pooled state from a step's hidden rows h [T, H] (RunnerOutput.pooled). */
function poolChunks(h: Float32Array, seqs: ScheduledBatch["sequences"], pooling: PoolingType): Map<string, Float32Array> {
  const H = h.length / Math.max(1, seqs.reduce((n, s) => n + s.tokenIds.length, 0));
  const out = new Map<string, Float32Array>();
  let at = 0;
  for (const s of seqs) {
    const n = s.tokenIds.length;
    const row = (j: number): Float32Array => h.slice((at + j) * H, (at + j + 1) * H);
    if (pooling === "LAST" && s.needsLogits) out.set(s.requestId, row(n - 1));
    else if (pooling === "CLS" && s.startPosition === 0) out.set(s.requestId, row(0));
    else if (pooling === "MEAN") {
      const sum = new Float32Array(H);
      for (let j = 0; j < n; j++) for (let i = 0; i < H; i++) sum[i] += h[(at + j) * H + i]!;
      out.set(s.requestId, sum);
    }
    at += n;
  }
  return out;
}

/** A step's hidden rows as the batch asked (ScheduledBatch.hiddenStates): [T, width], aux streams side by side per row. Disposes `aux`. */
function hiddenRows(final: Tensor, want: HiddenStatesRequest, aux: Tensor[]): Float32Array {
  if (want === "final") return final.dataSync() as Float32Array; // (a fresh copy, float32 whatever the dtype)
  const parts = aux.map((t) => {
    const v = t.dataSync() as Float32Array;
    t.dispose();
    return v;
  });
  const T = final.shape[0]!;
  const H = final.shape[1]!;
  const out = new Float32Array(T * H * parts.length);
  for (let r = 0; r < T; r++) parts.forEach((p, i) => out.set(p.subarray(r * H, (r + 1) * H), (r * parts.length + i) * H));
  return out;
}

/** One step's flat model inputs: what each tensor-parallel rank needs to run the same forward. */
export interface StepInputs {
  ids: Int32Array; // [T]
  positions: Int32Array; // [T]
  slotMapping: Int32Array; // [T]
  blockTables: Int32Array; // [numSeqs * maxBlocks], row-major
  queryStart: Int32Array; // [numSeqs + 1]
  seqLens: Int32Array; // [numSeqs]
  loraSlots: Int32Array | null; // [T]
}

/** The batch's flat inputs, the rows to sample (logits) and the prompt-logits rows of each request. */
function stepInputs(batch: ScheduledBatch, lora: boolean): { inputs: StepInputs; rows: number[]; promptRows: Map<string, [number, number]> } {
  const seqs = batch.sequences;
  const T = batch.numTokens;
  const ids = new Int32Array(T);
  const positions = new Int32Array(T);
  const slots = new Int32Array(T);
  const queryStart = new Int32Array(seqs.length + 1);
  const seqLens = new Int32Array(seqs.length);
  let maxBlocks = 1;
  for (const s of seqs) maxBlocks = Math.max(maxBlocks, s.blockTable.length);
  const tables = new Int32Array(seqs.length * maxBlocks);
  const loraSlots = lora ? new Int32Array(T) : null;
  const rows: number[] = [];
  const promptRows = new Map<string, [number, number]>();
  let at = 0;
  seqs.forEach((s, i) => {
    const n = s.tokenIds.length;
    for (let j = 0; j < n; j++) {
      ids[at + j] = s.tokenIds[j]!;
      positions[at + j] = s.startPosition + j;
    }
    slots.set(s.slotMapping, at);
    loraSlots?.fill(s.loraSlot ?? -1, at, at + n);
    queryStart[i] = at;
    seqLens[i] = s.startPosition + n;
    tables.set(s.blockTable, i * maxBlocks);
    if (s.needsPromptLogits) promptRows.set(s.requestId, [at, n]);
    if (s.needsLogits) for (let j = s.numSpecTokens ?? 0; j >= 0; j--) rows.push(at + n - 1 - j);
    at += n;
  });
  queryStart[seqs.length] = at;
  if (at !== T) throw new Error(`batch.numTokens ${T} != sum of sequence tokens ${at}`);
  return { inputs: { ids, positions, slotMapping: slots, blockTables: tables, queryStart, seqLens, loraSlots }, rows, promptRows };
}

/** Bytes of K+V cache one block takes for this model. */
export function kvBytesPerBlock(model: CausalLM, blockSize: number, dtype: KvCacheDtype = "float32"): number {
  const c = model.config;
  return 2 * c.numHiddenLayers * blockSize * model.numLocalKvHeads * c.headDim * DTYPE_BYTES[KV_TENSOR_DTYPE[dtype]];
}

/**
 * captureStepGraphs' options. `hiddenStates`: the graphs also return the hidden rows an EAGLE drafter reads
 * (ScheduledBatch.hiddenStates), so that its steps replay too; absent, they return none (and cost nothing more).
 */
export type CaptureArgs = Omit<StepGraphOptions, "onProgress"> & { onProgress?: (p: CaptureProgress) => void; hiddenStates?: HiddenStatesRequest };

/** Whether two hidden-state requests ask for the same rows. */
const sameHiddenStates = (a: HiddenStatesRequest | undefined, b: HiddenStatesRequest | undefined): boolean =>
  typeof a === "object" && typeof b === "object" ? a.layers.length === b.layers.length && a.layers.every((l, i) => l === b.layers[i]) : a === b;

export class PagedModelRunner implements ModelRunner {
  readonly vocabSize: number;
  /** Bytes of K+V cache per block. */
  readonly bytesPerBlock: number;
  private readonly kvCaches: { k: Tensor; v: Tensor }[] = [];
  /** Captured step graphs (captureStepGraphs), or null: every step runs eagerly. */
  graphs: StepGraphs | null = null;
  /** Why the last captureStepGraphs() fell back to eager execution, or null. */
  captureFailure: string | null = null;
  /** LoRA slots on the model's projections (enableLora), or null. */
  lora: LoraSlots | null = null;
  readonly supportsPooling = true;
  /** Gemma 3's vision tower and projector (an image-text checkpoint), or null: the model reads text only. */
  vision: Gemma3Vision | null = null;
  /** Encoded images by content hash (vLLM's encoder cache), least recently used first. */
  private readonly encoderCache = new Map<string, Float32Array>();

  get supportsImages(): boolean {
    return this.vision !== null;
  }
  /** Prompt embeddings are taken by a single-rank runner (tensor-parallel ranks are fed token ids only). */
  get inputEmbedsWidth(): number | null {
    return this.model.tp === null ? this.model.config.hiddenSize : null;
  }
  /**
   * Called with each eager step's flat inputs before its forward (tensor parallelism: rank 0 broadcasts them so that
   * every rank runs the same forward on its shard; see tensor-parallel.ts). Default none.
   */
  onStepInputs: ((inputs: StepInputs) => void) | null = null;
  /**
   * Sleep level 2 (sleep-mode.ts): reads the model again from the checkpoint it was loaded from (serving.ts sets it), or
   * null for a model built in memory, whose weights a level 2 sleep would lose.
   */
  weightLoader: (() => CausalLM) | null = null;
  private currentModel: CausalLM;
  /** The last captureStepGraphs() arguments, to capture again once released memory is back (their memory moved). */
  private captureArgs: { maxModelLen: number; options: CaptureArgs } | null = null;
  private kvReleased = false;
  private weightsReleased = false;

  /** The model the steps run (a level 2 wake_up reads a fresh one). */
  get model(): CausalLM {
    return this.currentModel;
  }

  get classifier(): ClassifierConfig | null {
    return this.model.config.classifier;
  }

  classify(pooled: Float32Array): Float32Array {
    return noGrad(() => {
      const h = tensor(pooled, { shape: [1, pooled.length], device: this.model.device });
      const logits = this.model.classify(h);
      const out = Float32Array.from(logits.dataSync() as Float32Array);
      h.dispose();
      logits.dispose();
      return out;
    });
  }

  constructor(
    model: CausalLM,
    readonly spec: KvCacheSpec,
  ) {
    this.currentModel = model;
    this.vocabSize = model.config.vocabSize;
    this.bytesPerBlock = kvBytesPerBlock(model, spec.blockSize, spec.dtype);
    this.allocateKvCache();
  }

  private allocateKvCache(): void {
    const model = this.model;
    const c = model.config;
    const spec = this.spec;
    // One allocation for every layer's K and V (views of it): one large buffer comes from fresh zero pages,
    // where 2 x layers buffers of a few MiB each would be zero-filled from the heap (~0.1 s at start-up).
    const shape = [spec.numBlocks, spec.blockSize, model.numLocalKvHeads, c.headDim]; // this rank's KV heads
    const all = empty([2 * c.numHiddenLayers, ...shape], { device: model.device, dtype: KV_TENSOR_DTYPE[spec.dtype ?? "float32"] });
    for (let i = 0; i < c.numHiddenLayers; i++) this.kvCaches.push({ k: all.select(0, 2 * i), v: all.select(0, 2 * i + 1) });
    // every step reads the cache of every sequence it runs: on huge pages (see Backend.moveToHugePages) where the OS grants them
    // and faulted in now, by the move or else by populate (Backend.populate)
    const backend = model.device.backend;
    if (!backend.moveToHugePages?.([all.storage.buffer], { discard: true, maxBytes: HUGE_PAGE_MAX_KV_BYTES })) backend.populate?.([all.storage.buffer]);
    all.dispose(); // the views keep the storage
  }

  execute(batch: ScheduledBatch): RunnerOutput {
    return this.dispatch(batch).wait();
  }

  /**
   * Gives the model `maxLoras` LoRA slots of rank `maxRank` (vLLM's --max-loras, --max-lora-rank): each step's
   * sequences then name theirs (ScheduledSequence.loraSlot). Before captureStepGraphs (the graphs read the slots).
   */
  enableLora(maxLoras: number, maxRank: number): LoraSlots {
    if (this.graphs !== null) throw new Error("[runner] enableLora must come before captureStepGraphs");
    this.lora?.dispose();
    this.lora = new LoraSlots(this.model, maxLoras, maxRank);
    return this.lora;
  }

  /**
   * Captures the forward once per decode and mixed bucket (see step-graphs.ts). Returns false, capturing
   * nothing, when the device or the model cannot capture.
   */
  captureStepGraphs(maxModelLen: number, options: CaptureArgs): boolean {
    if (!StepGraphs.supported(this.model)) return false;
    if (this.kvReleased || this.weightsReleased) throw new Error("[runner] cannot capture step graphs while the KV cache or the weights are released");
    this.graphs?.dispose();
    this.graphs = null;
    // a capture again (after a sleep) records anew: the replay cache names memory as allocated at start-up
    this.captureArgs = { maxModelLen, options: { ...options, cache: undefined, onProgress: undefined } };
    const maxBlocks = Math.ceil(maxModelLen / this.spec.blockSize);
    try {
      this.graphs = StepGraphs.capture(causalLmStep(this.model, options.hiddenStates), this.kvCaches, maxBlocks, { ...options, lora: this.lora !== null });
    } catch (e) {
      // an op with no capturable kernel (CaptureError): such a model runs eagerly, as vLLM falls back
      // when a model cannot be captured.
      if (!(e instanceof CaptureError)) throw e;
      this.captureFailure = e.message;
      process.emitWarning(`Kiln: decode step graphs are unavailable for this model, running eagerly: ${e.message}`, "KilnWarning");
      return false;
    }
    return true;
  }

  /**
   * Queues the forward pass and the logits of the sampled rows (in strict mode the kernels run on the
   * device's stream while this returns); wait() reads the logits back.
   */
  dispatch(batch: ScheduledBatch): PendingRunnerOutput {
    if (this.kvReleased || this.weightsReleased) throw new Error(`[runner] a step while the ${this.kvReleased ? "KV cache" : "weights"} are released (the engine is asleep)`);
    // image rows take their embeddings from the vision tower, prompt-embedding rows from the request: such steps run
    // eagerly (the graphs embed token ids)
    const imageRows = this.imageRows(batch);
    const embedRows = this.promptEmbedRows(batch);
    // pooling steps (prompts only, compute-bound) run eagerly, and so do steps asking for other hidden rows than the
    // graphs return (captured with an EAGLE drafter's)
    const hiddenOk = batch.hiddenStates === undefined || sameHiddenStates(batch.hiddenStates, this.captureArgs?.options.hiddenStates);
    const replay = batch.pooling === undefined && hiddenOk && imageRows === null && embedRows === null ? (this.graphs?.launch(batch) ?? null) : null;
    if (replay !== null) {
      const wait = (): RunnerOutput => {
        const { logits, tokenIds, hidden } = replay.wait();
        return { logits, tokenIds, promptLogits: new Map(), ...(batch.hiddenStates !== undefined ? { hiddenStates: hidden } : {}) };
      };
      return { wait, deviceTokens: replay.deviceTokens };
    }
    const seqs = batch.sequences;
    const { inputs, rows, promptRows } = stepInputs(batch, this.lora !== null);
    if (batch.fedTokens !== undefined) fillFedTokens(inputs.ids, batch.fedTokens); // waits for the step sampling them
    this.onStepInputs?.(inputs); // tensor parallelism: the other ranks run the same forward

    return noGrad(() => {
      const aux = typeof batch.hiddenStates === "object" ? { layers: batch.hiddenStates.layers, out: [] as Tensor[] } : undefined;
      const hidden = this.forwardInputs(inputs, aux, imageRows, embedRows);
      const hiddenStates = batch.hiddenStates === undefined ? undefined : hiddenRows(hidden, batch.hiddenStates, aux?.out ?? []);
      const pooling = batch.pooling;
      if (pooling !== undefined) {
        const h = hidden.dataSync() as Float32Array; // [T, H], final-normed
        hidden.dispose();
        return { wait: () => ({ logits: new Float32Array(0), promptLogits: new Map(), pooled: poolChunks(h, seqs, pooling) }) };
      }
      const logitsT = rows.length > 0 ? this.model.logits(hidden, Int32Array.from(rows)) : null;
      const promptT = new Map<string, Tensor>();
      for (const [id, [start, n]] of promptRows)
        promptT.set(id, this.model.logits(hidden, Int32Array.from({ length: n }, (_, j) => start + j)));
      hidden.dispose();
      return {
        wait: (): RunnerOutput => {
          let logits: Float32Array = new Float32Array(0);
          if (logitsT !== null) {
            logits = logitsT.dataSync() as Float32Array;
            logitsT.dispose();
          }
          const promptLogits = new Map<string, Float32Array>();
          for (const [id, l] of promptT) {
            promptLogits.set(id, l.dataSync() as Float32Array);
            l.dispose();
          }
          return { logits, promptLogits, ...(hiddenStates !== undefined ? { hiddenStates } : {}) };
        },
      };
    });
  }

  /**
   * The batch rows inside an image and their embeddings (rows [R], values [R, hidden]), or null when the step holds
   * none. Each image is encoded once (vision tower + projector) and kept by content hash in the encoder cache.
   */
  private imageRows(batch: ScheduledBatch): ImageRows | null {
    if (!batch.sequences.some((s) => s.mmFeatures !== undefined)) return null;
    const rows: number[] = [];
    const parts: Float32Array[] = [];
    const positions: number[] = [], starts = [0], ends: number[] = [], tables: (readonly number[])[] = [];
    let at = 0;
    for (const s of batch.sequences) {
      const start = s.startPosition, end = start + s.tokenIds.length;
      for (const f of s.mmFeatures ?? []) {
        const lo = Math.max(start, f.offset), hi = Math.min(end, f.offset + f.length);
        if (lo >= hi || f.inputEmbeds !== undefined) continue;
        // the scheduler never splits an image between steps: its later tokens' K/V is written by this step
        if (hi !== f.offset + f.length) throw new Error(`[runner] ${s.requestId}: a step ends inside an image (positions ${f.offset}..${f.offset + f.length})`);
        const features = this.imageFeatures(f);
        const H = features.length / f.length;
        for (let p = lo; p < hi; p++) {
          rows.push(at + p - start);
          positions.push(p);
        }
        starts.push(rows.length);
        ends.push(hi);
        tables.push(s.blockTable);
        parts.push(features.subarray((lo - f.offset) * H, (hi - f.offset) * H));
      }
      at += s.tokenIds.length;
    }
    if (rows.length === 0) return null;
    const values = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
    parts.reduce((o, p) => (values.set(p, o), o + p.length), 0);
    const width = Math.max(1, ...tables.map((t) => t.length));
    const blockTables = new Int32Array(tables.length * width);
    tables.forEach((t, i) => blockTables.set(t, i * width));
    return {
      rows: Int32Array.from(rows), values, positions: Int32Array.from(positions), queryStart: Int32Array.from(starts),
      seqLens: Int32Array.from(ends), blockTables,
    };
  }

  /** The batch rows inside prompt embeddings and their values (rows [R], values [R * hidden]), or null when none. */
  private promptEmbedRows(batch: ScheduledBatch): { rows: Int32Array; values: Float32Array } | null {
    const rows: number[] = [];
    const parts: Float32Array[] = [];
    let at = 0;
    for (const s of batch.sequences) {
      const start = s.startPosition, end = start + s.tokenIds.length;
      for (const f of s.mmFeatures ?? []) {
        const lo = Math.max(start, f.offset), hi = Math.min(end, f.offset + f.length);
        if (lo >= hi || f.inputEmbeds === undefined) continue;
        const H = f.inputEmbeds.length / f.length;
        for (let p = lo; p < hi; p++) rows.push(at + p - start);
        parts.push(f.inputEmbeds.subarray((lo - f.offset) * H, (hi - f.offset) * H));
      }
      at += s.tokenIds.length;
    }
    if (rows.length === 0) return null;
    const values = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
    parts.reduce((o, p) => (values.set(p, o), o + p.length), 0);
    return { rows: Int32Array.from(rows), values };
  }

  /** One image's embeddings [length, hidden]: from the encoder cache, or encoded now (and cached, oldest evicted). */
  private imageFeatures(f: MultiModalFeature): Float32Array {
    const cached = this.encoderCache.get(f.hash);
    if (cached !== undefined) {
      this.encoderCache.delete(f.hash); // most recently used last
      this.encoderCache.set(f.hash, cached);
      return cached;
    }
    if (this.vision === null) throw new Error("[runner] a step holds image tokens but the model has no vision tower");
    const features = this.vision.encode(f.pixelValues);
    if (features.length !== f.length * this.model.config.hiddenSize)
      throw new Error(`[runner] the image encodes to ${features.length / this.model.config.hiddenSize} rows, its placeholder holds ${f.length}`);
    this.encoderCache.set(f.hash, features);
    while (this.encoderCache.size > ENCODER_CACHE_IMAGES) this.encoderCache.delete(this.encoderCache.keys().next().value!);
    return features;
  }

  /**
   * Final hidden states [T, hidden] of one step's flat inputs (every tensor-parallel rank runs this); `aux` also
   * keeps the residual streams entering its layers (CausalLM.forward); `imageRows`: the step's rows inside images.
   */
  forwardInputs(
    inputs: StepInputs, aux?: { layers: readonly number[]; out: Tensor[] }, imageRows: ImageRows | null = null,
    embedRows: { rows: Int32Array; values: Float32Array } | null = null,
  ): Tensor {
    return noGrad(() => {
      const dev = this.model.device;
      const t = (a: Int32Array, shape?: number[]) => tensor(a, { device: dev, shape });
      const numSeqs = inputs.seqLens.length;
      const ctxTensors = {
        positions: t(inputs.positions),
        slotMapping: t(inputs.slotMapping),
        blockTables: t(inputs.blockTables, [numSeqs, inputs.blockTables.length / Math.max(1, numSeqs)]),
        queryStart: t(inputs.queryStart),
        seqLens: t(inputs.seqLens),
        ...(inputs.loraSlots === null ? {} : { loraSlots: t(inputs.loraSlots) }),
      };
      const idsT = t(inputs.ids);
      // rows whose input embeddings are given: images' features, then prompt embeddings
      const given = [imageRows, embedRows].filter((g) => g !== null);
      const R = given.reduce((n, g) => n + g.rows.length, 0);
      const H = this.model.config.hiddenSize;
      const rowsOf = new Int32Array(R);
      const valuesOf = new Float32Array(R * H);
      let at = 0;
      for (const g of given) {
        rowsOf.set(g.rows, at);
        valuesOf.set(g.values, at * H);
        at += g.rows.length;
      }
      const embeds = R === 0 ? null : { rows: t(rowsOf), values: tensor(valuesOf, { device: dev, shape: [R, H] }) };
      // Gemma 3's image tokens see their whole image (vLLM's mm-prefix attention for gemma3)
      const images = imageRows === null ? 0 : imageRows.seqLens.length;
      const mmPrefix = imageRows === null ? null : {
        rows: t(imageRows.rows), positions: t(imageRows.positions), seqLens: t(imageRows.seqLens),
        blockTables: t(imageRows.blockTables, [images, imageRows.blockTables.length / images]),
        queryStart: t(imageRows.queryStart), slotMapping: t(new Int32Array(imageRows.rows.length).fill(-1)),
      };
      const hidden = this.model.forward(idsT, { kind: "paged", ...ctxTensors, kvCaches: this.kvCaches, mmPrefix }, aux, embeds);
      idsT.dispose();
      if (embeds !== null) for (const x of Object.values(embeds)) x.dispose();
      if (mmPrefix !== null) for (const x of Object.values(mmPrefix)) x.dispose();
      for (const x of Object.values(ctxTensors)) x.dispose();
      return hidden;
    });
  }

  /** The KV cache's element type as allocated. */
  get kvCacheDtype(): KvCacheDtype {
    const dtype = this.kvCaches[0]?.k.dtype;
    return (Object.keys(KV_TENSOR_DTYPE) as KvCacheDtype[]).find((k) => KV_TENSOR_DTYPE[k] === dtype) ?? "float32";
  }

  get kvLayout(): KvLayout {
    const k = this.kvCaches[0]!.k;
    const heads = this.model.numLocalKvHeads, dim = this.model.config.headDim;
    return { numLayers: this.kvCaches.length, numKvHeads: heads, headDim: dim, dtype: this.kvCacheDtype, rowBytes: heads * dim * DTYPE_BYTES[k.dtype] };
  }

  /**
   * Each run of positions [p, q) within one block of the table, for every layer's K and V: `at` is the run's byte
   * offset in the cache buffer, `src` in a snapshot of numTokens tokens.
   */
  private kvRuns(blockTable: readonly number[], blockSize: number, numTokens: number, from: number, to: number,
    each: (buffer: Tensor, at: number, src: number, bytes: number) => void): void {
    const { rowBytes } = this.kvLayout;
    if (blockSize !== this.spec.blockSize) throw new Error(`[runner] block size ${blockSize} != the cache's ${this.spec.blockSize}`);
    if (to > blockTable.length * blockSize) throw new Error(`[runner] positions up to ${to} need more than ${blockTable.length} blocks`);
    this.kvCaches.forEach((c, l) => {
      [c.k, c.v].forEach((t, kv) => {
        const base = t.offset * DTYPE_BYTES[t.dtype];
        for (let p = from; p < to; ) {
          const q = Math.min(to, (Math.floor(p / blockSize) + 1) * blockSize);
          const slot = blockTable[Math.floor(p / blockSize)]! * blockSize + (p % blockSize);
          each(t, base + slot * rowBytes, ((2 * l + kv) * numTokens + p) * rowBytes, (q - p) * rowBytes);
          p = q;
        }
      });
    });
  }

  readKv(blockTable: readonly number[], blockSize: number, numTokens: number): Uint8Array {
    const out = new Uint8Array(2 * this.kvCaches.length * numTokens * this.kvLayout.rowBytes);
    const backend = this.model.device.backend;
    this.kvRuns(blockTable, blockSize, numTokens, 0, numTokens, (t, at, src, bytes) => out.set(backend.read(t.storage.buffer, at, bytes), src));
    return out;
  }

  writeKv(blockTable: readonly number[], blockSize: number, data: Uint8Array, numTokens: number, from: number, to: number): void {
    if (data.length !== 2 * this.kvCaches.length * numTokens * this.kvLayout.rowBytes)
      throw new Error(`[runner] ${data.length} bytes of K/V are not ${numTokens} tokens of this cache`);
    const backend = this.model.device.backend;
    const writes: { buffer: Tensor["storage"]["buffer"]; byteOffset: number; src: Uint8Array }[] = [];
    this.kvRuns(blockTable, blockSize, numTokens, from, to, (t, at, src, bytes) => writes.push({ buffer: t.storage.buffer, byteOffset: at, src: data.subarray(src, src + bytes) }));
    if (backend.writeAsyncMany !== undefined) backend.writeAsyncMany(writes);
    else for (const w of writes) (backend.writeAsync ?? backend.write).call(backend, w.buffer, w.byteOffset, w.src);
  }

  /** Sleep mode: frees the KV cache (and the step graphs, which point into it); restoreKvCache() allocates it anew. */
  releaseKvCache(): void {
    if (this.kvReleased) return;
    this.dropGraphs();
    for (const c of this.kvCaches) {
      c.k.dispose();
      c.v.dispose();
    }
    this.kvCaches.length = 0;
    this.kvReleased = true;
    this.model.device.backend.emptyCache?.(); // sleep gives the memory back: none of it stays in the allocator's cache
  }

  restoreKvCache(): void {
    if (!this.kvReleased) return;
    this.allocateKvCache();
    this.kvReleased = false;
    this.recaptureWhenWhole();
  }

  weightsReloadRefusal(): string | null {
    if (this.onStepInputs !== null) return "the other tensor-parallel ranks hold their own shards";
    if (this.lora !== null) return "the LoRA slots live on the model's layers";
    if (this.weightLoader === null) return "the model was built in memory, not loaded from a checkpoint it could be read from again";
    return null;
  }

  /** Sleep level 2: frees every weight (and the step graphs that read them); reloadWeights() reads them again. */
  releaseWeights(): void {
    if (this.weightsReleased) return;
    const refusal = this.weightsReloadRefusal();
    if (refusal !== null) throw new Error(`[runner] the weights cannot be released: ${refusal}`);
    this.dropGraphs();
    const model = this.model;
    for (const t of new Set([...weightTensors(model), ...model.namedParameters().map(([, p]) => p)])) t.dispose();
    this.weightsReleased = true;
    model.device.backend.emptyCache?.();
  }

  reloadWeights(): void {
    if (!this.weightsReleased) return;
    const fresh = this.weightLoader!();
    const c = fresh.config, old = this.model.config;
    if (c.vocabSize !== old.vocabSize || kvBytesPerBlock(fresh, this.spec.blockSize, this.spec.dtype) !== this.bytesPerBlock)
      throw new Error("[runner] the checkpoint read again is another model (its vocabulary or KV shape changed)");
    this.currentModel = fresh;
    this.weightsReleased = false;
    this.recaptureWhenWhole();
  }

  private dropGraphs(): void {
    this.graphs?.dispose();
    this.graphs = null;
  }

  /** Captures the step graphs again once both the KV cache and the weights are back (when there were graphs). */
  private recaptureWhenWhole(): void {
    if (this.kvReleased || this.weightsReleased || this.captureArgs === null) return;
    this.captureStepGraphs(this.captureArgs.maxModelLen, this.captureArgs.options);
  }

  /** Frees the KV cache tensors. */
  dispose(): void {
    this.graphs?.dispose();
    this.graphs = null;
    this.lora?.dispose();
    this.lora = null;
    for (const c of this.kvCaches) {
      c.k.dispose();
      c.v.dispose();
    }
  }
}
