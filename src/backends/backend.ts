// The device back-end interface: allocate, free, copy in/out, run a kernel, synchronize.
// Every op of the tensor layer lowers to one of the primitive kernels below; a back end implements
// them all (the TS reference does) or delegates the ones it lacks to the reference.
import type { DType } from "./dtype.js";

/** An allocation on a device. Host back ends keep an ArrayBuffer; others keep a handle. */
export interface DeviceBuffer {
  readonly byteLength: number;
  /** Host-visible memory for host back ends (cpu, reference); undefined on devices without it. */
  readonly host?: ArrayBuffer;
}

/** Backend.allocate()'s options. */
export interface AllocateOptions {
  /**
   * The caller writes every byte before anything reads them (a kernel's whole output): memory a caching
   * allocator hands out again need not be zeroed.
   */
  uninitialized?: boolean;
}

/** A strided window on a buffer: what a kernel reads or writes. Offsets and strides are in elements. */
export interface BufferView {
  readonly buffer: DeviceBuffer;
  readonly dtype: DType;
  readonly shape: readonly number[];
  readonly strides: readonly number[];
  readonly offset: number;
}

// ---- the primitive op set (one grouped enum, STYLE.md 6) ----

/** Elementwise unary math; inputs are read as float. */
export type UnaryOp =
  | "neg" | "exp" | "log" | "sqrt" | "rsqrt" | "tanh" | "sigmoid" | "silu" | "gelu" | "gelu_tanh"
  | "abs" | "reciprocal" | "sin" | "cos" | "square" | "relu" | "floor" | "ceil" | "round" | "sign"
  | "logical_not";

/** Elementwise binary ops; comparisons produce bool. */
export type BinaryOp =
  | "add" | "sub" | "mul" | "div" | "pow" | "maximum" | "minimum" | "remainder"
  | "eq" | "ne" | "lt" | "le" | "gt" | "ge" | "logical_and" | "logical_or";

/** Weight-only quantization schemes of quant_matmul (vLLM's --quantization names map onto these). */
// int8_g32: group-32 int8 with f16 scales (GGUF Q8_0's blocks, loaded without dequantizing); not an on-load option.
// q4_k: GGUF Q4_K super-blocks of 256 (6-bit sub-block scales and mins, 4-bit codes), also loaded as they are.
// q5_k: GGUF Q5_K super-blocks of 256 (q4_k's with 5-bit codes), loaded as they are.
// q6_k: GGUF Q6_K super-blocks of 256 (int8 scales per sub-block of 16, 6-bit codes), loaded as they are.
// mxfp4: OCP MXFP4, E2M1 codes with an E8M0 scale per group of 32 (also GGUF MXFP4's blocks).
// iq4_nl: GGUF IQ4_NL blocks (4-bit indices into ggml's 16 non-linear levels, an f16 scale per 32), loaded as they are.
export type QuantScheme = "int8" | "int4" | "fp8" | "int8_g32" | "q4_k" | "mxfp4" | "q6_k" | "q5_k" | "iq4_nl";

/**
 * Activation rows quantized as quant_matmul quantizes x: per row, scales[r] = amax/127 (f32) and
 * data[r, i] = round-half-even(x[r, i] * (127/amax)); data int8 [rows, n], scales f32 [rows], both contiguous.
 */
export interface QuantizedRowsView {
  data: BufferView;
  scales: BufferView;
}

export type ReduceOp = "sum" | "max" | "min" | "prod" | "argmax" | "argmin";

export type KernelCall =
  // elementwise: inputs are already broadcast to the output's shape (stride 0 on broadcast dims)
  | { op: "unary"; fn: UnaryOp; x: BufferView; out: BufferView }
  | { op: "binary"; fn: BinaryOp; a: BufferView; b: BufferView; out: BufferView }
  | { op: "where"; cond: BufferView; a: BufferView; b: BufferView; out: BufferView }
  // strided copy with dtype conversion: contiguous(), cast, copy_, expand materialisation
  | { op: "copy"; x: BufferView; out: BufferView }
  | { op: "fill"; out: BufferView; value: number }
  // row-wise ops over contiguous [rows, n] input
  | { op: "reduce"; fn: ReduceOp; x: BufferView; out: BufferView; rows: number; n: number }
  | { op: "softmax"; log: boolean; x: BufferView; out: BufferView; rows: number; n: number }
  | { op: "cumsum"; x: BufferView; out: BufferView; rows: number; n: number }
  // sorts each row; values and int32 indices out. Stable; descending puts the largest first.
  | { op: "sort"; x: BufferView; values: BufferView; indices: BufferView; rows: number; n: number; descending: boolean }
  // out = silu(gate) * up over contiguous [rows, n] (SwiGLU); with xq, also writes out's rows quantized for the
  // quant_matmul that reads them (silu·mul fused with the down projection's activation quantization)
  | { op: "silu_mul"; gate: BufferView; up: BufferView; out: BufferView; rows: number; n: number; xq?: QuantizedRowsView }
  // with xq, also writes out's rows quantized for quant_matmul (rms_norm fused with the next matmuls' quantization)
  | { op: "rms_norm"; x: BufferView; weight: BufferView; out: BufferView; rows: number; n: number; eps: number; xq?: QuantizedRowsView }
  // vLLM's fused_add_rms_norm: sum = x + residual (rounded to the sum's float32, as the add alone), out = rms_norm(sum)
  // over contiguous [rows, n]; with xq, out's rows quantized as rms_norm's are
  | {
      op: "add_rms_norm";
      x: BufferView;
      residual: BufferView;
      weight: BufferView;
      sum: BufferView;
      out: BufferView;
      rows: number;
      n: number;
      eps: number;
      xq?: QuantizedRowsView;
    }
  // out[b] = (aTransposed ? a[b]^T : a[b]) @ (bTransposed ? b[b]^T : b[b]); a [batch, M, K] or [batch, K, M],
  // b [batch, K, N] or [batch, N, K]; contiguous rows
  | {
      op: "matmul";
      a: BufferView;
      b: BufferView;
      out: BufferView;
      batch: number;
      m: number;
      n: number;
      k: number;
      bTransposed: boolean;
      /** a is stored [K, M] (e.g. dW = g^T @ x without materialising g^T); default false. */
      aTransposed?: boolean;
      strideA: number;
      strideB: number;
      strideOut: number;
    }
  // weight-only quantized linear: out [m, n] = x [m, k] @ dequant(w)^T, layouts per scheme in native/quant.h
  // (int8: w int8 [n, k], scales f32 [n], rowSums int32 [n]; int4: w uint8 [n, k/2], scales f16 [n, k/32];
  // fp8: w e4m3fn bytes [n, k], scales f32 [n]; q4_k: w uint8 [n, k/2], scales = meta uint8 [n, k/256*20];
  // q5_k: w uint8 [n, k/256*160], scales as q4_k's; q6_k: w uint8 [n, k/256*192], scales = meta uint8 [n, k/256*18]; mxfp4: w uint8 [n, k/2], scales e8m0 uint8 [n, k/32]).
  // x and out contiguous f32. xq: x already quantized (the int8-activation schemes read it instead of quantizing
  // x; fp8 multiplies f32 x and ignores it).
  | {
      op: "quant_matmul"; scheme: QuantScheme; x: BufferView; w: BufferView; scales: BufferView; rowSums: BufferView | null;
      out: BufferView; m: number; n: number; k: number; xq?: QuantizedRowsView | null;
    }
  // quantizes a contiguous f32 [n, k] weight into the quant_matmul layout of `scheme` (rowSums for int8 only)
  | { op: "quantize_weight"; scheme: QuantScheme; w: BufferView; data: BufferView; scales: BufferView; rowSums: BufferView | null; n: number; k: number }
  // out[i, :] = table[ids[i], :], table [rows, dim] contiguous
  | { op: "gather_rows"; table: BufferView; ids: BufferView; out: BufferView; numIds: number; dim: number; rows: number }
  // out[i, :] = the f32 values of row ids[i] of a quantized [n, k] weight in quant_matmul's layout (a quantized
  // embedding table: GGUF's token embedding kept in its blocks), out [numIds, k] contiguous
  | { op: "quant_gather_rows"; scheme: QuantScheme; w: BufferView; scales: BufferView; ids: BufferView; out: BufferView; numIds: number; n: number; k: number }
  // torch.gather / scatter along the last dim of contiguous [rows, n] (index [rows, m])
  | { op: "gather"; x: BufferView; index: BufferView; out: BufferView; rows: number; n: number; m: number }
  | { op: "scatter"; out: BufferView; index: BufferView; src: BufferView; rows: number; n: number; m: number; accumulate: boolean }
  // out[ids[i], :] = src[i, :] on a contiguous [rows, dim] destination (index_copy_ along dim 0)
  | { op: "index_copy_rows"; out: BufferView; ids: BufferView; src: BufferView; numIds: number; dim: number; rows: number }
  // out[ids[i], :] += src[i, :] in place on a contiguous float32 [rows, dim] (index_add_ along dim 0: an embedding's
  // gradient); ids in order, so repeated ids add up as they would one by one
  | { op: "index_add_rows"; out: BufferView; ids: BufferView; src: BufferView; numIds: number; dim: number; rows: number }
  // rotary embedding on [T, H, D] with cos/sin tables [maxPos, rotaryDim/2]
  | {
      op: "rotary";
      x: BufferView;
      positions: BufferView;
      cos: BufferView;
      sin: BufferView;
      out: BufferView;
      tokens: number;
      heads: number;
      headDim: number;
      rotaryDim: number;
      neox: boolean;
    }
  // ragged paged attention; see PagedAttentionArgs
  | ({ op: "paged_attention" } & PagedAttentionArgs)
  // dense attention without materialized scores (FlashAttentionShape): out [B, Hq, S, D] and each row's log-sum-exp
  // lse [B, Hq, S]; the backward reads q, k, v, o (the forward's out), dout and lse and overwrites dq, dk, dv
  | ({ op: "flash_attention"; out: BufferView; lse: BufferView } & FlashAttentionShape)
  | ({
      op: "flash_attention_backward"; o: BufferView; dout: BufferView; lse: BufferView; dq: BufferView; dk: BufferView; dv: BufferView;
      /** The sinks' gradient [heads] (written when `sinks` is given). */
      dsinks: BufferView | null;
    } & FlashAttentionShape)
  // multi-LoRA (punica's BGMV shrink + expand): out[t] = base[t] + scales[q] * b[q]^T (a[q] x[t]) with q = slots[t]; a
  // slot outside [0, s) (-1: no adapter) adds nothing. base/out [t, n], x [t, k], a [s, r, k], b [s, r, n] (each
  // slot's lora_B transposed), scales [s], slots int32 [t]; all contiguous
  | {
      op: "lora_apply"; base: BufferView; x: BufferView; a: BufferView; b: BufferView; scales: BufferView; slots: BufferView;
      out: BufferView; t: number; n: number; k: number; r: number; s: number;
    }
  // mixture of experts on the device: out[t] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t]), each expert
  // down(act(gate(x), up(x))) with act silu(g) * u or gpt-oss's clamped SwiGLU (see MoeArgs)
  | ({ op: "moe" } & MoeArgs)
  // random fill from a counter-based generator: reproducible per (seed, offset)
  | { op: "random"; dist: "uniform" | "normal"; out: BufferView; seed: number; counter: number; a: number; b: number };

/**
 * Dense attention's operands (native/kernels.h FlashAttentionArgs): q [batch, heads, seq, headDim], k and v
 * [batch, kvHeads, keys, headDim], contiguous f32, keys >= seq with the queries the last seq positions. Query i
 * (position i + keys - seq) sees keys j <= its position, narrowed by `window` (0: none; p - window < j) and by `docs`
 * (int32 [batch * seq], keys === seq: a query sees keys of its own document), widened by bidirectional `spans` [a, e)
 * (a position inside one sees all of it). Scores are scale * q.k, soft-capped (softcap * tanh(s / softcap)) when
 * softcap > 0. The same mask as ops/nn-functional.ts attentionBias.
 */
export interface FlashAttentionShape {
  q: BufferView;
  k: BufferView;
  v: BufferView;
  docs: BufferView | null;
  spans: readonly (readonly [number, number])[];
  batch: number;
  heads: number;
  kvHeads: number;
  seq: number;
  keys: number;
  headDim: number;
  scale: number;
  softcap: number;
  window: number;
  /** Attention sinks (gpt-oss): one f32 logit per query head [heads] joined to each row's softmax; null: none. */
  sinks: BufferView | null;
}

/**
 * Ragged paged attention. Writes kNew/vNew into the paged cache at slotMapping, then attends causally; with
 * `rotary`, q and kNew are taken before rotary and rotated inside (rotary fused with the KV write).
 * q [T, Hq, D]; kNew, vNew [T, Hkv, D]; kCache, vCache [numBlocks, blockSize, Hkv, D];
 * blockTables [numSeqs, maxBlocksPerSeq]; queryStart [numSeqs+1]; seqLens [numSeqs] include the new tokens.
 */
export interface PagedAttentionArgs {
  q: BufferView;
  kNew: BufferView;
  vNew: BufferView;
  kCache: BufferView;
  vCache: BufferView;
  slotMapping: BufferView;
  blockTables: BufferView;
  queryStart: BufferView;
  seqLens: BufferView;
  out: BufferView;
  numSeqs: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  blockSize: number;
  maxBlocksPerSeq: number;
  scale: number;
  slidingWindow: number; // 0 = unlimited
  /** Attention logit soft-capping (Gemma 2): each scaled score s becomes softcap * tanh(s / softcap) before the mask; 0 = none. */
  softcap: number;
  /**
   * Attention sinks (gpt-oss): float32 [numHeads], one learned logit per query head joined to each row's softmax
   * denominator (its value row is zero: it only scales the output down). Absent: none.
   */
  sinks?: BufferView;
  /** Fused rotary: q and kNew are rotated at their positions before the cache write and the attention. */
  rotary?: PagedRotary;
  /** Every query row of a sequence attends as its last position does (all its keys, or the window's). Absent: causal. */
  bidirectional?: boolean;
}

/**
 * One expert projection of the moe kernel: y [rows, n] = x [rows, k] @ W^T (+ bias [n]). W is a float matrix
 * [n, k] (float32 / bfloat16, contiguous) or, with `quant`, a quant_matmul weight (data in `w`, layout per scheme).
 */
export interface MoeProjectionView {
  w: BufferView;
  quant?: { scheme: QuantScheme; scales: BufferView; rowSums: BufferView | null };
  bias: BufferView | null;
}

/** An expert's three projections: gate and up [inter, hidden], down [hidden, inter]. */
export interface MoeExpertView {
  gate: MoeProjectionView;
  up: MoeProjectionView;
  down: MoeProjectionView;
}

/** The expert activation: silu(gate) * up, or gpt-oss's (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit). */
export type MoeActivation = { kind: "silu" } | { kind: "clamped_swiglu"; alpha: number; limit: number };

/**
 * Top-k mixture of experts without the host reading the routing: x float32 [t, h], ids int32 [t, k] (expert of each
 * token's j-th choice), weights float32 [t, k], out float32 [t, h], all contiguous; experts [e]. An id outside
 * [0, e) contributes nothing (replays read ids they were not captured with, so the kernel never trusts them).
 */
export interface MoeArgs {
  x: BufferView;
  ids: BufferView;
  weights: BufferView;
  out: BufferView;
  experts: readonly MoeExpertView[];
  t: number;
  h: number;
  /** The experts' intermediate size. */
  inter: number;
  k: number;
  act: MoeActivation;
}

/** Rotary fused into paged attention: the `rotary` kernel's parameters (positions [T], cos/sin [maxPos, rotaryDim/2]). */
export interface PagedRotary {
  positions: BufferView;
  cos: BufferView;
  sin: BufferView;
  rotaryDim: number;
  neox: boolean;
}

export type KernelName = KernelCall["op"];

export interface RunOptions {
  /** Finish the kernel before returning (debug mode); default false: enqueue it. */
  readonly blocking?: boolean;
}

/**
 * A recorded kernel sequence replayed with one launch (vLLM's CUDA graphs): it reads and writes the same
 * buffers every replay, so per-step inputs go into persistent tensors before launch().
 */
export interface StepGraph {
  /** Kernels recorded. */
  readonly kernels: number;
  /** Enqueues one replay of every recorded kernel, in order, and returns; host reads of its buffers wait for it. */
  launch(): void;
  /** Releases the recording and the memory it pins (a replay already enqueued still runs). Idempotent. */
  dispose(): void;
  /** Optional profiling aid: replays `reps` times synchronously, timing each kernel (best and median of the reps, ns). */
  profile?(reps: number): { op: string; ns: number; medianNs: number }[];
}

/** A step-graph capture as data (Backend.takeRecording): JSON-able metadata plus binary blobs. */
export interface CaptureRecording {
  meta: unknown;
  blobs: Uint8Array[];
}

/** State shared by the replays of one set of recordings (memory an earlier replay re-created). */
export interface ReplaySession {
  /** allocationMark() taken before the model was loaded, as when the recordings were made. */
  readonly mark: number;
  /** The back end's re-created memory by allocation number. */
  readonly recreated: Map<number, unknown>;
  /** Allocation number (relative to the mark) at which the session's first recorded capture began. */
  start?: number;
}

/** One write of Backend.writeAsyncMany: src's bytes into `buffer` at `byteOffset`. */
export interface AsyncWrite {
  buffer: DeviceBuffer;
  byteOffset: number;
  src: Uint8Array;
}

/** A device back end. Small on purpose (STYLE.md 4): everything else is built on these calls. */
export interface Backend {
  readonly name: string;
  /** Human-readable description (ISA, threads) for logs and benchmarks. */
  describe(): string;
  /** New memory reads as zeros unless `options.uninitialized` (the caller writes every byte first). */
  allocate(byteLength: number, options?: AllocateOptions): DeviceBuffer;
  free(buffer: DeviceBuffer): void;
  /** Copies host bytes into the buffer at byteOffset. */
  write(buffer: DeviceBuffer, byteOffset: number, src: Uint8Array): void;
  /** Copies bytes out of the buffer (after all queued work on it has finished). */
  read(buffer: DeviceBuffer, byteOffset: number, byteLength: number): Uint8Array;
  /**
   * Enqueues one kernel on the device's in-order stream (strict mode) and returns; argument and index
   * errors still throw here. `blocking` (debug mode) runs it to completion before returning.
   */
  run(call: KernelCall, options?: RunOptions): void;
  /** Resolves when every kernel enqueued so far has finished. */
  synchronize(): Promise<void>;
  /** Buffers allocated and not yet freed (leak tests). */
  liveBuffers(): number;
  liveBytes(): number;
  /** The most bytes live at once since the back end was made or resetPeakBytes() (torch.cuda.max_memory_allocated). */
  peakBytes(): number;
  /** Starts a new peak from the bytes live now (torch.cuda.reset_peak_memory_stats). */
  resetPeakBytes(): void;
  /** Live bytes plus freed memory a caching allocator holds for reuse (torch.cuda.memory_reserved); absent: no cache. */
  reservedBytes?(): number;
  /** The most reserved bytes at once since the back end was made or resetPeakBytes() (torch.cuda.max_memory_reserved). */
  peakReservedBytes?(): number;
  /** Drops the caching allocator's freed memory (torch.cuda.empty_cache). */
  emptyCache?(): void;

  // ---- optional: step graphs (capture once, replay per step); back ends without them omit these ----

  /**
   * Finishes pending work, then records every kernel run() enqueues instead of running it, until endCapture().
   * Kernels that would run on the host, blocking calls and host reads/writes throw CaptureError meanwhile.
   * Index checks (gather ids, rotary positions, paged-attention metadata) see the values the buffers hold
   * now: replays trust their metadata, so the caller validates it before writing step inputs.
   *
   * @example
   * backend.write(ids.buffer, 0, sampleIds);   // persistent inputs hold real sample metadata
   * backend.beginCapture();
   * try { logits = forward(ids, ctx); } catch (e) { backend.abortCapture?.(); throw e; }
   * const graph = backend.endCapture();
   * backend.writeAsync?.(ids.buffer, 0, nextIds); graph.launch(); backend.read(logits.buffer, 0, n);
   */
  beginCapture?(options?: { record?: boolean }): void;
  /** Ends the capture begun by beginCapture() and returns its recording. */
  endCapture?(): StepGraph;
  /** Ends a capture (if one is open) and drops what it recorded: after a failed capture. */
  abortCapture?(): void;
  /**
   * After endCapture() of a capture begun with `record`: the capture as data, for an on-disk cache. `roots` name
   * the persistent inputs the caller will supply again, `outputs` the buffers the capture made that the caller
   * keeps; memory from before the capture is named by its allocation number relative to `mark` (allocationMark()
   * taken before the model was loaded). Null when the capture cannot be described that way.
   */
  takeRecording?(
    roots: ReadonlyMap<string, DeviceBuffer>,
    outputs: ReadonlyMap<string, DeviceBuffer>,
    mark: number,
    describeCode: (address: bigint) => string | null,
  ): CaptureRecording | null;
  /**
   * Re-creates a recorded capture in this process (the same model loaded the same way after `session.mark`):
   * the step graph and the output buffers by name; null when the recording does not fit this process.
   */
  replayCapture?(
    recording: CaptureRecording,
    roots: ReadonlyMap<string, DeviceBuffer>,
    session: ReplaySession,
    resolveCode: (code: string) => bigint | null,
  ): { graph: StepGraph; outputs: Map<string, DeviceBuffer> } | null;
  /** The allocation number the next buffer gets (see takeRecording). */
  allocationMark?(): number;
  /**
   * Like write(), but ordered on the device stream instead of waiting for it: the bytes are copied now and
   * land after the work already enqueued (e.g. write step N+1's inputs while replay N still runs).
   */
  writeAsync?(buffer: DeviceBuffer, byteOffset: number, src: Uint8Array): void;
  /** writeAsync of several writes at once (a step's inputs): one stream job where the back end can (cpu). */
  writeAsyncMany?(writes: readonly AsyncWrite[]): void;
  /**
   * Enqueues a copy of `byteLength` bytes between device buffers behind the work already enqueued (stream back
   * ends; a step's sampled token ids fed to the next step's inputs without a round trip through the host).
   */
  copyAsync?(src: DeviceBuffer, srcOffset: number, dst: DeviceBuffer, dstOffset: number, byteLength: number): void;
  /** A marker for the work enqueued so far, for readAfter (stream back ends). */
  fence?(): number;
  /**
   * Waits until the work up to `fence` has run (work enqueued after it may still be running: it must not write
   * these bytes), then copies the bytes out; rethrows a kernel error recorded on the stream.
   */
  readAfter?(fence: number, buffer: DeviceBuffer, byteOffset: number, byteLength: number): Uint8Array;

  // ---- optional: host back ends ----

  /**
   * A buffer over a file's bytes [byteOffset, byteOffset + byteLength) without reading or copying them: a
   * private, copy-on-write memory map (weights load in place; a write copies only the page it touches).
   */
  mapFile?(path: string, byteOffset: number, byteLength: number): DeviceBuffer;
  /**
   * Moves these buffers' bytes onto huge (2 MiB) pages where the OS grants them, keeping every handle, view and
   * allocation number: for memory each step reads in full (weights, KV caches). Call it before capturing step
   * graphs (they point at the memory they were captured with). Returns the bytes moved; small buffers stay.
   * `discard`: the bytes are not needed (a fresh KV cache): the buffers get zeroed memory and nothing is copied.
   * `maxBytes`: move at most this many bytes, buffers in the order given, each whole; one that would go past it
   * stays, and later smaller ones may still move (faulting in huge pages can stall on memory compaction: seconds for
   * GiBs). The new pages are faulted in by the move where the OS can (a first write into each would otherwise
   * zero-fill it inside a later step).
   */
  moveToHugePages?(buffers: Iterable<DeviceBuffer>, options?: { discard?: boolean; maxBytes?: number }): number;
  /**
   * Faults these buffers' pages in now, keeping their bytes: for memory later steps write into piece by piece (a KV
   * cache), whose first write into each page would otherwise fault inside a step (~12 us per 4 KiB page on this
   * project's VMs). Memory moved to huge pages was faulted in by the move.
   */
  populate?(buffers: Iterable<DeviceBuffer>): void;
  /**
   * Runs fn with a private memory pool open (as a capture's): memory freed from buffers fn allocates is handed out
   * again to its later allocations of the same size instead of fresh memory, whose first touch costs page faults
   * (~10 us per 4 KiB page on a VM: 200 ms for 70 MB). For eager work over large tensors (a vision tower). Inside a
   * capture or another pool, fn runs in that one.
   */
  withMemoryPool?<T>(fn: () => T): T;
}
