/**
 * Loader and typed interface of the native CPU kernel addon (native/*.cc, built by
 * `node-gyp rebuild` into build/Release/kiln_native.node).
 *
 * The addon picks AVX-512 (+ AVX512-BF16 where the CPU has it), AVX2+FMA or a portable scalar path at load
 * time (`KILN_NATIVE_ISA=avx512-bf16|avx512|avx2|scalar` forces one; it is read once per process).
 * All arrays are typed-array views used in place (their byteOffset is honoured); sizes are
 * element counts; float math is f32. bf16 and f16 data travel as Uint16Array.
 * Each kernel also has an enqueue variant on `k.stream` (one in-order native stream thread per JS
 * thread); a synchronous call first drains that stream, so direct calls stay in order.
 *
 * @example
 * const k = loadNativeKernels();
 * const out = new Float32Array(4096);
 * k.matmul(x, weight, out, 1, 4096, 4096, true, 0, 1, 0, 0, 0); // out = x @ weight^T
 */
import { createRequire } from "node:module";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { env } from "../../util/env.js";
import { KilnError } from "../../util/errors.js";

export const NATIVE_ISAS = ["avx512-bf16", "avx512", "avx2", "scalar"] as const;
export type NativeIsa = (typeof NATIVE_ISAS)[number];

/** Op codes of `unary`. */
export const UnaryOp = {
  neg: 0, exp: 1, log: 2, sqrt: 3, rsqrt: 4, tanh: 5, sigmoid: 6, silu: 7, gelu: 8,
  geluTanh: 9, abs: 10, reciprocal: 11, sin: 12, cos: 13, square: 14, relu: 15,
} as const;
/** Op codes of `binary`. */
export const BinaryOp = { add: 0, sub: 1, mul: 2, div: 3, maximum: 4, minimum: 5, pow: 6 } as const;
/** Op codes of `reduce`. */
export const ReduceOp = { sum: 0, max: 1, min: 2 } as const;

export interface NativeKernels extends NativeStream {
  isa: NativeIsa;
  /** Table of the quantized kernels: "avx512-vnni" or "scalar". */
  quantIsa: string;
  /**
   * bf16 matmuls with B = [N,K] (bTransposed, A not transposed) and M >= this round A to bf16 (nearest even)
   * and multiply with vdpbf16ps, f32 accumulation (as PyTorch/oneDNN and llama.cpp do); smaller M stays exact
   * f32 (decode batches of 24 rows or more round too). 0 (every ISA but avx512-bf16): always exact f32. Absent in an addon built before it.
   */
  bf16DotMinM?: number;
  /**
   * fp8 quantMatmul products (scheme 2) with M >= this round x to bf16 and run on the vdpbf16ps tiles, the e4m3 codes
   * read as their exact bf16 values and each output column times its row scale; smaller M multiply unrounded x in f32.
   * 0 (every ISA but avx512-bf16): always f32. Absent in an addon built before it.
   */
  fp8DotMinM?: number;
  /**
   * amx: large-M int8 / int8 group-32 products and (avx512-bf16 table) bf16 GEMMs run on the CPU's AMX tiles; KILN_AMX=0
   * turns it off (older addons lack the field).
   */
  features(): { avx512f: boolean; avx512bf16: boolean; avx512vnni: boolean; avx2: boolean; fma: boolean; amx?: boolean };
  setNumThreads(n: number): void;
  getNumThreads(): number;
  /** The file's bytes [byteOffset, byteOffset + byteLength) as an ArrayBuffer over a private copy-on-write map. */
  mapFile(path: string, byteOffset: number, byteLength: number): ArrayBuffer;
  /**
   * Zeroed memory carved from 2 MiB-aligned chunks advised for transparent huge pages, faulted in where the kernel
   * can (MADV_POPULATE_WRITE) (older addons lack it).
   */
  allocHugeMemory?(byteLength: number): ArrayBuffer;
  /** Faults the memory's pages in now, without writing it (MADV_POPULATE_WRITE where the kernel has it; older addons lack it). */
  populate?(memory: ArrayBuffer): void;
  /**
   * GGUF blocks of ggml type `type` (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4) of an [N, K] tensor -> quantMatmul's data
   * and scale bytes, as formats/gguf-repack.ts's repackGgufBlocks computes them (older addons lack it).
   */
  ggufRepack?(type: number, src: Uint8Array, N: number, K: number, data: Uint8Array, scales: Uint8Array): void;
  /**
   * out[b] = a[b] @ B[b]. a: [M,K] row-major f32, or [K,M] when aTransposed (out = a^T @ B, e.g. the
   * linear weight gradient g^T @ x with no transposed copy). bTransposed: B is [N,K] (nn.Linear weight,
   * out = a @ B^T), else [K,N]. bDtype 0 = f32, 1 = bf16 (see bf16DotMinM). Strides in elements per batch item (0 = broadcast).
   */
  matmul(
    a: Float32Array, b: Float32Array | Uint16Array, out: Float32Array, M: number, N: number, K: number,
    bTransposed: boolean, bDtype: 0 | 1, batch: number, strideA: number, strideB: number, strideOut: number,
    aTransposed?: boolean,
  ): void;
  /**
   * out [M,N] = x [M,K] @ dequant(W)^T for a weight-only quantized W (scheme 0 int8, 1 int4, 2 fp8, 3 int8
   * group-32, 4 q4_k, 5 mxfp4, 6 q6_k, 7 q5_k, 8 iq4_nl; layouts in native/quant.h). x rows are quantized to int8 on the fly (per-row scale)
   * and dotted with VNNI when available. rowSums is read for int8 only (pass an empty Int32Array otherwise); scales
   * are f16 bits for int4 / int8 group-32 / iq4_nl, meta bytes for q4_k / q5_k / q6_k, e8m0 bytes for mxfp4. xq [M,K] / xs [M] (optional):
   * x already quantized (as rmsNormQuant writes it), read instead of quantizing x; fp8 ignores them (its x stays f32,
   * rounded to bf16 at M >= fp8DotMinM).
   */
  quantMatmul(
    x: Float32Array, w: Uint8Array, scales: Float32Array | Uint16Array | Uint8Array, rowSums: Int32Array, out: Float32Array,
    M: number, N: number, K: number, scheme: 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 | 8, xq?: Int8Array, xs?: Float32Array,
  ): void;
  /** Quantizes f32 W [N,K] into data/scales(/rowSums for int8) in the layout of quantMatmul's scheme (not the k-quants). */
  quantizeWeights(
    w: Float32Array, N: number, K: number, scheme: 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 | 8, data: Uint8Array, scales: Float32Array | Uint16Array | Uint8Array,
    rowSums: Int32Array,
  ): void;
  /** See {@link UnaryOp} for op codes. */
  unary(op: number, x: Float32Array, out: Float32Array, n: number): void;
  /** out[i] = a[i] op b[i % bn]; bn divides n. See {@link BinaryOp}. */
  binary(op: number, a: Float32Array, b: Float32Array, out: Float32Array, n: number, bn: number): void;
  /**
   * dst[i] = src[i] over a strided [shape] window, as a byte copy of `elemBytes`-wide elements (any dtype).
   * Arrays are positioned at each view's offset; strides are in elements, >= 0 (0 on src = broadcast,
   * never 0 on dst); rank <= 8. Transposes, row copies and broadcasts have fast paths.
   */
  copyStrided(
    src: ArrayBufferView, dst: ArrayBufferView, shape: Int32Array, srcStrides: Int32Array, dstStrides: Int32Array,
    elemBytes: 1 | 2 | 4 | 8,
  ): void;
  /** src's bytes in consecutive pieces into dsts (piece i: dsts[i].byteLength bytes); the pieces cover src exactly. */
  copyPieces(src: Uint8Array, dsts: Uint8Array[]): void;
  /** out = a op b over [shape], out contiguous, a/b read through element strides >= 0 (0 = broadcast). See {@link BinaryOp}. */
  binaryStrided(
    op: number, a: Float32Array, aStrides: Int32Array, b: Float32Array, bStrides: Int32Array, out: Float32Array,
    shape: Int32Array,
  ): void;
  /** out = a op b as bytes 0/1 (op: 0 eq, 1 ne, 2 lt, 3 le, 4 gt, 5 ge; NaN compares false but ne), strided as binaryStrided. */
  compareStrided(op: number, a: Float32Array, aStrides: Int32Array, b: Float32Array, bStrides: Int32Array, out: Uint8Array, shape: Int32Array): void;
  /** out = cond ? a : b over [shape] (cond bytes nonzero = true), out contiguous, strided inputs as binaryStrided. */
  whereStrided(
    cond: Uint8Array, condStrides: Int32Array, a: Float32Array, aStrides: Int32Array, b: Float32Array,
    bStrides: Int32Array, out: Float32Array, shape: Int32Array,
  ): void;
  /** out = silu(gate) * up */
  siluMul(gate: Float32Array, up: Float32Array, out: Float32Array, n: number): void;
  /** siluMul over [rows, n], then out's rows quantized as quantMatmul quantizes x: xq int8 [rows, n], xs [rows]. */
  siluMulQuant(gate: Float32Array, up: Float32Array, out: Float32Array, rows: number, n: number, xq: Int8Array, xs: Float32Array): void;
  /** out = x * rsqrt(mean(x^2) + eps) * weight, per row of n. */
  rmsNorm(x: Float32Array, weight: Float32Array, out: Float32Array, rows: number, n: number, eps: number): void;
  /** rmsNorm, then out's rows quantized as quantMatmul quantizes x: xq int8 [rows, n], xs [rows] (one job). */
  rmsNormQuant(
    x: Float32Array, weight: Float32Array, out: Float32Array, rows: number, n: number, eps: number, xq: Int8Array, xs: Float32Array,
  ): void;
  /**
   * sum = x + residual, out = rmsNorm(sum) (one job; bit for bit the separate kernels), then with xq and xs out's rows
   * quantized as rmsNormQuant does.
   */
  addRmsNorm(
    x: Float32Array, residual: Float32Array, weight: Float32Array, sum: Float32Array, out: Float32Array, rows: number, n: number, eps: number,
    xq?: Int8Array, xs?: Float32Array,
  ): void;
  /**
   * out [numIds, k] = rows ids of an [n, k] quantized weight (quantMatmul's layouts and scheme codes), dequantized
   * exactly as the products read them; ids out of [0, n) throw a RangeError.
   */
  quantEmbedding(
    w: Uint8Array, scales: Float32Array | Uint16Array | Uint8Array, ids: Int32Array, out: Float32Array, numIds: number, n: number, k: number,
    scheme: number,
  ): void;
  /** out[ids[i], :] += src[i, :] over [rows, dim] (rows = out.length / dim), ids in order; ids out of range throw a RangeError. */
  indexAddRows(out: Float32Array, ids: Int32Array, src: Float32Array, numIds: number, dim: number): void;
  softmax(x: Float32Array, out: Float32Array, rows: number, n: number, log: boolean): void;
  /** See {@link ReduceOp}. */
  reduce(op: number, x: Float32Array, out: Float32Array, rows: number, n: number): void;
  /** First index of the max of each row. */
  argmax(x: Float32Array, out: Int32Array, rows: number, n: number): void;
  /** x: [T,H,D] (out may be x); cos/sin: [maxPos, rotaryDim/2]; neox pairs (i, i+rd/2), else (2i, 2i+1). */
  rotary(
    x: Float32Array, positions: Int32Array, cos: Float32Array, sin: Float32Array, out: Float32Array,
    T: number, H: number, D: number, rotaryDim: number, neox: boolean,
  ): void;
  /**
   * Ragged paged attention: writes kNew/vNew into the cache at slotMapping, then each query token
   * attends causally (optionally within slidingWindow) over its sequence's cached positions.
   * q/out: [T,Hq,D]; kNew/vNew: [T,Hkv,D]; caches: [numBlocks, blockSize, Hkv, D], both f32 or both bf16 bits (written
   * rounded to nearest even, read back exactly). With positions..neox, q and
   * kNew are rotated first (as rotary()) and k is written rotated: rotary fused with the KV write.
   */
  pagedAttention(
    q: Float32Array, kNew: Float32Array, vNew: Float32Array,
    kCache: Float32Array | Uint16Array | Uint8Array, vCache: Float32Array | Uint16Array | Uint8Array,
    slotMapping: Int32Array, blockTables: Int32Array, queryStart: Int32Array, seqLens: Int32Array,
    out: Float32Array, numSeqs: number, Hq: number, Hkv: number, D: number, blockSize: number,
    maxBlocksPerSeq: number, scale: number, slidingWindow: number,
    positions?: Int32Array, cos?: Float32Array, sin?: Float32Array, rotaryDim?: number, neox?: boolean,
    /** Uint8Array caches: 1 = fp8 e4m3fn, 2 = fp8 e5m2 */
    fp8Format?: 1 | 2,
    /** Attention logit soft-capping: scores s -> softcap * tanh(s / softcap) before the mask (0 / absent: none). */
    softcap?: number,
    /** Attention sinks [Hq]: one logit per query head joined to the softmax denominator (absent: none). */
    sinks?: Float32Array,
    /** Every query row of a sequence attends as its last position does (all its keys, or the window's); absent: causal. */
    bidirectional?: boolean,
  ): void;
  embedding(table: Float32Array | Uint16Array, tableDtype: 0 | 1, ids: Int32Array, out: Float32Array, numIds: number, dim: number): void;
  /**
   * Dense attention without the scores (backend.ts FlashAttentionShape): out [B,Hq,S,D] and each row's log-sum-exp
   * lse [B,Hq,S]. docs int32 [B*S] or null; spans flattened [a, e) pairs; window 0 / softcap 0: none.
   */
  flashAttention(
    q: Float32Array, k: Float32Array, v: Float32Array, out: Float32Array, lse: Float32Array, docs: Int32Array | null, spans: Int32Array,
    B: number, Hq: number, Hkv: number, S: number, Sk: number, D: number, scale: number, softcap: number, window: number,
    sinks?: Float32Array | null,
  ): void;
  /** flashAttention's gradients: dq, dk, dv (and dsinks with sinks) overwritten from q, k, v, o (its out), dout and lse. */
  flashAttentionBackward(
    q: Float32Array, k: Float32Array, v: Float32Array, o: Float32Array, dout: Float32Array, lse: Float32Array,
    dq: Float32Array, dk: Float32Array, dv: Float32Array, docs: Int32Array | null, spans: Int32Array,
    B: number, Hq: number, Hkv: number, S: number, Sk: number, D: number, scale: number, softcap: number, window: number,
    sinks?: Float32Array | null, dsinks?: Float32Array | null,
  ): void;
  /**
   * Multi-LoRA (BGMV): out[t] = base[t] + scales[s] * B_s^T (A_s x[t]) with s = slots[t]; a slot outside [0, S)
   * (-1: no adapter) adds nothing (out may be base). base/out [T,N], x [T,K], a [S,R,K], b [S,R,N] (each slot's lora_B
   * transposed), scales [S]. Slots are read when the kernel runs and never trusted (a step-graph replay may change them).
   */
  loraApply(
    base: Float32Array, x: Float32Array, a: Float32Array, b: Float32Array, scales: Float32Array, slots: Int32Array,
    out: Float32Array, T: number, N: number, K: number, R: number, S: number,
  ): void;
  /**
   * Top-k mixture of experts (native/moe.h MoeArgs): out [T, H] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t]).
   * kinds [3E]: per projection (gate, up, down of each expert in turn) 0 f32, 1 bf16, 2 + quant scheme code;
   * projections [3E]: [w, scales, rowSums, bias] (null where absent). act 0 silu(g) * u, 1 gpt-oss's clamped SwiGLU
   * (alpha, limit). Ids are read when the kernel runs; one outside [0, E) adds nothing.
   */
  moe(
    x: Float32Array, ids: Int32Array, weights: Float32Array, out: Float32Array, T: number, H: number, I: number, K: number, E: number,
    act: 0 | 1, alpha: number, limit: number, kinds: Int32Array, projections: MoeProjectionArrays[],
  ): void;
  /** Stable sort of each row of x [rows, n] into values and int32 indices (NaN largest, as torch). */
  sortRows(x: Float32Array, values: Float32Array, indices: Int32Array, rows: number, n: number, descending: boolean): void;
  f32ToBf16(src: Float32Array, dst: Uint16Array, n: number): void;
  bf16ToF32(src: Uint16Array, dst: Float32Array, n: number): void;
  f16ToF32(src: Uint16Array, dst: Float32Array, n: number): void;
  f32ToF16(src: Float32Array, dst: Uint16Array, n: number): void;
  /**
   * One token per row of logits [rows, vocab], rows in parallel, with the semantics of src/engine/sampler.ts:
   * temperature[r] 0 = greedy (argmax, lowest id on ties); else logits *= 1/T, min_p, top-k/top-p masks
   * (topK 0 / topP 1 / minP 0 = off), then an inverse-CDF draw in token-id order with uniform[r] in [0, 1).
   * The logits end up holding the processed (scaled, masked) values. stages: 1 = greedy argmax + temperature
   * only, 2 = masks + draw of the non-greedy rows only, 3 (default) = both. Synchronous (drains the stream
   * first). Absent in an addon built before it.
   */
  sampleRows?(
    logits: Float32Array, rows: number, vocab: number, temperature: Float64Array, topK: Int32Array, topP: Float64Array,
    minP: Float64Array, uniform: Float64Array, out: Int32Array, stages?: 1 | 2 | 3,
  ): void;
  /** Read bandwidth in GB/s of `threads` threads reading buf (or the arrays in order, as one run of bytes split between the threads). */
  memoryReadBandwidth(buf: ArrayBufferView | ArrayBufferView[], iterations: number, threads: number): number;
  /** FMA peak of one core in GFLOP/s for the selected ISA. */
  fmaPeak(iterations: number): number;
  /**
   * Mean ns of a cache line's round trip between two pool threads, over `iterations` round trips (0 with one thread,
   * -1 when the second thread did not answer within 100 ms, as when another caller's job holds the pool): the least a
   * hand-off between a job's threads costs (native/thread-pool.h poolRoundTripNs). Absent in older builds.
   */
  coreRoundTrip?(iterations: number): number;
  /**
   * How decode products run (native/thread-pool.h DecodeTuning: the stream tiles' prefetch distances for quantized
   * and f32 / bf16 weights and its cache level, and the least bytes of a product whose two shares are balanced
   * while they run), chosen for the CPU at load. Sets the fields given (for measuring settings against each other
   * in one process) and returns the setting in force. Absent in older builds.
   */
  decodeTuning?(setting?: Partial<DecodeTuning>): DecodeTuning;
}

/** One moe projection's arrays: weight (f32, bf16 bits or quantized bytes), scales, int8 row sums, f32 bias. */
export type MoeProjectionArrays = [Float32Array | Uint16Array | Uint8Array, Float32Array | Uint16Array | Uint8Array | null, Int32Array | null, Float32Array | null];

/** native/thread-pool.h DecodeTuning. */
export interface DecodeTuning {
  quantAhead: number;
  gemvAhead: number;
  prefetchIntoL1: boolean;
  handOverMinBytes: number;
}

/** Kernels with a stream variant: `k.stream.<name>(...)` takes the same arguments as `k.<name>(...)`. */
export type StreamKernelName =
  | "matmul" | "quantMatmul" | "quantizeWeights" | "unary" | "binary" | "copyStrided" | "copyPieces" | "binaryStrided" | "compareStrided" | "whereStrided"
  | "siluMul" | "rmsNorm"
  | "rmsNormQuant" | "siluMulQuant" | "addRmsNorm" | "quantEmbedding" | "indexAddRows" | "softmax" | "reduce" | "argmax" | "rotary" | "pagedAttention" | "embedding" | "f32ToBf16" | "bf16ToF32"
  | "flashAttention" | "flashAttentionBackward" | "f16ToF32" | "f32ToF16" | "loraApply" | "moe" | "sortRows";

/**
 * Enqueue variants of the kernels on this thread's in-order native stream. Arguments are validated (and
 * index arrays bounds-checked) at the call, which throws like the synchronous kernel; the kernel runs later
 * on the stream thread. Returns the job's sequence number. The caller must keep every array alive (and
 * leave it unread/unwritten) until the stream has completed that job.
 */
export type NativeStreamKernels = { [K in StreamKernelName]: (...args: Parameters<NativeKernels[K]>) => number };

export interface NativeStream {
  readonly stream: NativeStreamKernels;
  /**
   * Enqueues one call `void f(void** bufs, const int64_t* sizes)` of generated code at `address` (kiln_jit),
   * bufs[i] = buffers[i] + byteOffsets[i]. Absent in an addon older than the compiler's stream calls.
   */
  streamCallFn?(address: bigint, buffers: ArrayBuffer[], byteOffsets: BigInt64Array, sizes?: BigInt64Array): number;
  /** Blocks until every enqueued job has run; rethrows the first kernel error recorded on the stream. */
  streamSync(): void;
  /** Resolves when every job enqueued so far has run (rejects with a recorded error); never keeps an idle loop alive. */
  streamSyncAsync(): Promise<void>;
  /** Jobs enqueued and not yet finished. */
  streamPending(): number;
  /** Jobs finished since the stream started (sequence numbers up to this have run). */
  streamCompleted(): number;
  /** Jobs enqueued since the stream started (the sequence number of the last one). */
  streamSubmitted(): number;
  /** Blocks until the jobs up to sequence number `seq` have run (later ones may still run); rethrows a recorded error. */
  streamWaitFor(seq: number): void;
  /**
   * Drains the stream (rethrowing a recorded error), then records every enqueued job instead of running it
   * until streamEndCapture. Meanwhile synchronous kernels, streamSync(Async) and graph launches throw.
   */
  streamBeginCapture(): void;
  /** Ends the capture; the handle holds the recorded jobs (freed by streamReleaseGraph or garbage collection). */
  streamEndCapture(): NativeGraphHandle;
  /** Whether this thread's stream is capturing. */
  streamCapturing(): boolean;
  /**
   * Enqueues ONE job that re-runs the recorded jobs in order (stopping at the first failure, which is recorded
   * like any kernel error); returns its sequence number. The caller keeps every array the jobs use alive.
   */
  streamLaunchGraph(graph: NativeGraphHandle): number;
  /** Jobs recorded in the graph (0 once released). */
  streamGraphKernels(graph: NativeGraphHandle): number;
  /** Drains the stream, then replays the graph `reps` times on this thread timing each job: best and median ns per job (profiling aid). */
  streamProfileGraph?(graph: NativeGraphHandle, reps: number): { ops: string[]; ns: Float64Array; medianNs?: Float64Array };
  /** Drops the recorded jobs now; a replay already enqueued keeps its own reference until it has run. */
  streamReleaseGraph(graph: NativeGraphHandle): void;
}

declare const nativeGraph: unique symbol;
/** Opaque (type-tagged External) handle of a captured job list. */
export interface NativeGraphHandle {
  readonly [nativeGraph]: true;
}

/** The native addon could not be loaded; `reason` says why (missing build, ABI mismatch...). */
export class NativeUnavailableError extends Error {
  override readonly name = "NativeUnavailableError";
  constructor(readonly reason: string, readonly path: string) {
    super(`[cpu] native kernels unavailable: ${reason} (looked for ${path}; build with \`npx node-gyp rebuild\`)`);
  }
}

/** Package root: the nearest ancestor of this file holding package.json (dist/src/backends/cpu -> root). */
function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, "package.json")) && existsSync(join(dir, "binding.gyp"))) return dir;
    const parent = dirname(dir);
    if (parent === dir) return join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..");
    dir = parent;
  }
}

let cached: NativeKernels | undefined;
let lastError: NativeUnavailableError | undefined;

/** Why the last load attempt failed ("" when it has not failed). */
export function nativeLoadError(): string {
  return lastError?.reason ?? "";
}

/** Loads the addon once per process; throws {@link NativeUnavailableError} if it cannot. */
export function loadNativeKernels(): NativeKernels {
  if (cached) return cached;
  const root = packageRoot();
  const path = join(root, "build", "Release", "kiln_native.node");
  if (!existsSync(path)) throw (lastError = new NativeUnavailableError("addon not built", path));
  // (the addon reads it, and would take a misspelled value for "scalar": the slowest path, silently)
  const isa = env.nativeIsa;
  if (isa !== undefined && !(NATIVE_ISAS as readonly string[]).includes(isa))
    throw new KilnError(`KILN_NATIVE_ISA=${isa} is not one of ${NATIVE_ISAS.join(", ")}`);
  const require = createRequire(join(root, "package.json"));
  try {
    cached = require(path) as NativeKernels;
  } catch (err) {
    throw (lastError = new NativeUnavailableError(err instanceof Error ? err.message : String(err), path));
  }
  lastError = undefined;
  return cached;
}

/** Like {@link loadNativeKernels} but returns null when the addon is unavailable. */
export function tryLoadNativeKernels(): NativeKernels | null {
  try {
    return loadNativeKernels();
  } catch (err) {
    if (err instanceof NativeUnavailableError) return null;
    throw err;
  }
}
