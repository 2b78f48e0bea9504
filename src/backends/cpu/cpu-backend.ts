// The cpu back end: host memory, native SIMD kernels for the hot dtype/layout combinations,
// and the TS reference for everything else. Unless a call is blocking (debug mode), native kernels are
// enqueued on the in-order native stream (./stream.ts) and run() returns at once; host-side kernels and
// reads wait for the pending work on the buffers they touch. Step graphs (beginCapture/endCapture) record
// the enqueued kernels for replay; while capturing, every kernel must take a native path.
import type {
  AsyncWrite, Backend, BinaryOp, BufferView, CaptureRecording, DeviceBuffer, KernelCall, QuantizedRowsView, QuantScheme, ReplaySession, RunOptions,
  StepGraph, UnaryOp,
} from "../backend.js";
import { CaptureRecorder, replayCalls, serializeRecording, type RawRecording } from "./capture-recording.js";
import { BackendUnavailableError, CaptureError } from "../../util/errors.js";
import { env } from "../../util/env.js";
import { DTYPE_BYTES, type DType } from "../dtype.js";
import { isContiguous, numel } from "../reference/host-memory.js";
import { HostAllocator, HostMemoryBackend } from "../reference/reference-backend.js";
import { runReference } from "../reference/reference-kernels.js";
import { binaryStrided, copyStrided, fillStrided, gatherRows, isDirect, scatterRows, unaryStrided, whereStrided } from "./strided.js";
import { tryLoadNativeKernels, nativeLoadError, type MoeProjectionArrays, type NativeKernels, type StreamKernelName } from "./native.js";
import { CpuBuffer, CpuStepGraph, CpuStream, rawOf } from "./stream.js";
import {
  dequantizeRef, nativeQuantCode, nativeTakesScheme, newScales, quantDataBytes, quantKMultiple, quantMatmulRef, quantScaleBytes, quantScaleCount, quantScaleDtype, quantizeWeightsRef,
} from "./quant-reference.js";
import { isSuperBlockScheme } from "../quant-layout.js";

/** One raw call of generated code: bufs[i] = buffers[i] memory + byteOffsets[i]; reads/writes name what it touches. */
export interface RawStreamCall {
  /** Code address (kiln_jit `address(entry)`); the library must never be unloaded. */
  address: bigint;
  buffers: readonly DeviceBuffer[];
  byteOffsets: BigInt64Array;
  sizes?: BigInt64Array;
  reads: readonly DeviceBuffer[];
  writes: readonly DeviceBuffer[];
}

const QUANT_SCHEMES: readonly QuantScheme[] = ["int8", "int4", "fp8", "int8_g32", "q4_k", "mxfp4", "q6_k", "q5_k", "iq4_nl"];

/** The kernels as run now (k) or enqueued (k.stream): same arguments. */
type Launcher = { [K in StreamKernelName]: (...args: Parameters<NativeKernels[K]>) => unknown };

/** KernelCall fields a kernel writes; every other BufferView field is read. */
const WRITTEN_FIELDS = new Set(["out", "sum", "values", "indices", "kCache", "vCache", "lse", "dq", "dk", "dv", "dsinks"]);
const QUANTIZE_WRITES = new Set(["data", "scales", "rowSums"]);
function operands(call: KernelCall): { reads: BufferView[]; writes: BufferView[] } {
  const reads: BufferView[] = [];
  const writes: BufferView[] = [];
  const written = call.op === "quantize_weight" ? QUANTIZE_WRITES : WRITTEN_FIELDS;
  // for-in, not Object.entries: this runs for every enqueued kernel (thousands per step-graph capture)
  for (const key in call) {
    const v = (call as unknown as Record<string, unknown>)[key];
    if (typeof v === "object" && v !== null && "buffer" in v) (written.has(key) ? writes : reads).push(v as BufferView);
  }
  // nested operands: paged attention's fused rotary (read), quantized activation rows (written by rms_norm, read by quant_matmul)
  if (call.op === "paged_attention" && call.rotary) reads.push(call.rotary.positions, call.rotary.cos, call.rotary.sin);
  if ((call.op === "rms_norm" || call.op === "add_rms_norm" || call.op === "silu_mul") && call.xq) writes.push(call.xq.data, call.xq.scales);
  if (call.op === "quant_matmul" && call.xq) reads.push(call.xq.data, call.xq.scales);
  // the experts' weights (moe)
  if (call.op === "moe")
    for (const ex of call.experts)
      for (const p of [ex.gate, ex.up, ex.down]) {
        reads.push(p.w);
        if (p.quant) reads.push(p.quant.scales, ...(p.quant.rowSums ? [p.quant.rowSums] : []));
        if (p.bias) reads.push(p.bias);
      }
  return { reads, writes };
}

const UNARY_CODES: Partial<Record<UnaryOp, number>> = {
  neg: 0, exp: 1, log: 2, sqrt: 3, rsqrt: 4, tanh: 5, sigmoid: 6, silu: 7, gelu: 8, gelu_tanh: 9,
  abs: 10, reciprocal: 11, sin: 12, cos: 13, square: 14, relu: 15,
};
const BINARY_CODES: Partial<Record<BinaryOp, number>> = { add: 0, sub: 1, mul: 2, div: 3, maximum: 4, minimum: 5, pow: 6 };
const REDUCE_CODES = { sum: 0, max: 1, min: 2 } as const;
const COMPARE_CODES: Partial<Record<BinaryOp, number>> = { eq: 0, ne: 1, lt: 2, le: 3, gt: 4, ge: 5 };

function f32(v: BufferView): Float32Array | null {
  if (v.dtype !== "float32" || !isContiguous(v.shape, v.strides)) return null;
  return new Float32Array(rawOf(v.buffer), v.offset * 4, numel(v.shape));
}
function u16(v: BufferView): Uint16Array | null {
  if ((v.dtype !== "bfloat16" && v.dtype !== "float16") || !isContiguous(v.shape, v.strides)) return null;
  return new Uint16Array(rawOf(v.buffer), v.offset * 2, numel(v.shape));
}
/** fp8 bytes (either format) of a contiguous view. */
function u8(v: BufferView): Uint8Array | null {
  if ((v.dtype !== "float8_e4m3fn" && v.dtype !== "float8_e5m2") || !isContiguous(v.shape, v.strides)) return null;
  return new Uint8Array(rawOf(v.buffer), v.offset, numel(v.shape));
}
function i32(v: BufferView): Int32Array | null {
  if (v.dtype !== "int32" || !isContiguous(v.shape, v.strides)) return null;
  return new Int32Array(rawOf(v.buffer), v.offset * 4, numel(v.shape));
}
/** A float32 array starting at the view's offset spanning `length` elements (for kernels given explicit sizes). */
function f32Span(v: BufferView, length: number): Float32Array | null {
  if (v.dtype !== "float32") return null;
  return new Float32Array(rawOf(v.buffer), v.offset * 4, length);
}
function u16Span(v: BufferView, length: number): Uint16Array | null {
  if (v.dtype !== "bfloat16") return null;
  return new Uint16Array(rawOf(v.buffer), v.offset * 2, length);
}

/** Below this many elements the TS strided loops beat a native call's fixed cost (~1-2 us). */
const NATIVE_STRIDED_MIN = 512;
// moveToHugePages: smaller buffers (norm weights, biases) are not worth a copy; memory already moved stays. The group
// scales of small matrices stay too: a scratch copy of bench/lab/gemv-chain with those of the SmolLM-135M-shaped Q8_0
// step (all under 64 KiB, 5% of its bytes) copied onto ordinary pages took 0.99-1.03x the time in 9 rounds, slow and
// fast periods.
const HUGE_PAGE_MIN_BYTES = 64 << 10;
const hugeMemory = new WeakSet<ArrayBuffer>();
/** The source of zeroOnStream's broadcast copies (8 zero bytes, never written). */
const ZERO_ELEMENT = new Uint8Array(8);

/** Shape or strides for the native strided kernels, or null when a stride is negative / rank > 8. */
function dims(xs: readonly number[]): Int32Array | null {
  if (xs.length > 8) return null;
  for (const x of xs) if (x < 0 || x > 0x7fffffff) return null;
  return Int32Array.from(xs);
}
/** The buffer's bytes from the view's offset on (the native strided kernels bounds-check each view). */
function bytesFrom(v: BufferView, elemBytes: number): Uint8Array {
  return new Uint8Array(rawOf(v.buffer), v.offset * elemBytes);
}
/** One element of `dtype` holding `value`, encoded by the reference fill (any dtype, incl. bf16/f16/int64). */
function elementBytes(dtype: DType, value: number, elemBytes: number): ArrayBuffer {
  const host = new ArrayBuffer(elemBytes);
  runReference({ op: "fill", out: { buffer: { byteLength: elemBytes, host }, dtype, shape: [1], strides: [1], offset: 0 }, value });
  return host;
}
/** The widest copy element (8/4/2/1 bytes) that divides both the byte offset and the length. */
function copyElemBytes(byteOffset: number, byteLength: number): 1 | 2 | 4 | 8 {
  for (const eb of [8, 4, 2] as const) if (byteOffset % eb === 0 && byteLength % eb === 0) return eb;
  return 1;
}
function f32From(v: BufferView): Float32Array | null {
  if (v.dtype !== "float32") return null;
  const host = rawOf(v.buffer);
  return new Float32Array(host, v.offset * 4, Math.max(0, (host.byteLength >>> 2) - v.offset));
}

/** Two float32 operands of an output of `shape` for binaryStrided / compareStrided, or null when a kernel cannot take them. */
function stridedPair(a: BufferView, b: BufferView, shape: readonly number[]) {
  const dimsOut = dims(shape);
  const as = dims(a.strides);
  const bs = dims(b.strides);
  const af = f32From(a);
  const bf = f32From(b);
  return dimsOut && as && bs && af && bf ? { shape: dimsOut, as, bs, a: af, b: bf } : null;
}

/**
 * For a broadcast operand b (same shape as out, stride 0 on broadcast dims) returns how many trailing
 * elements repeat (bn, so out[i] = a[i] op b[i % bn]) and the dense source, or null if b is not of that form.
 */
function broadcastRow(b: BufferView): { data: Float32Array; bn: number } | null {
  if (b.dtype !== "float32") return null;
  const { shape, strides } = b;
  let d = shape.length - 1;
  let expected = 1;
  while (d >= 0 && (shape[d] === 1 || strides[d] === expected) && strides[d] !== 0) {
    expected *= shape[d]!;
    d--;
  }
  for (let e = d; e >= 0; e--) if (strides[e] !== 0 && shape[e] !== 1) return null;
  return { data: new Float32Array(rawOf(b.buffer), b.offset * 4, expected), bn: expected };
}

/**
 * Typed views of a quantized weight's data, scales (f16 bits per group for int4/int8_g32, q4_k / q6_k meta bytes, e8m0
 * bytes for mxfp4) and rowSums (int8's, unless `readsRowSums` is false; else empty).
 */
function quantArrays(scheme: QuantScheme, data: BufferView, scales: BufferView, rowSums: BufferView | null, n: number, k: number, readsRowSums = scheme === "int8") {
  if (data.dtype !== "int8" && data.dtype !== "uint8") return null;
  const raw = rawOf(data.buffer);
  const bytes = new Uint8Array(raw, data.offset, quantDataBytes(scheme, n, k));
  const ns = quantScaleCount(scheme, n, k);
  const want = quantScaleDtype(scheme);
  let sc: Float32Array | Uint16Array | Uint8Array | null = null;
  if (want === "float32") sc = f32Span(scales, ns);
  else if (scales.dtype === want) sc = want === "uint8" ? new Uint8Array(rawOf(scales.buffer), scales.offset, ns) : new Uint16Array(rawOf(scales.buffer), scales.offset * 2, ns);
  let rs = new Int32Array(0);
  if (readsRowSums) {
    if (!rowSums || rowSums.dtype !== "int32") return null;
    rs = new Int32Array(rawOf(rowSums.buffer), rowSums.offset * 4, n);
  }
  return sc ? { data: bytes, scales: sc, rowSums: rs } : null;
}

/** Typed arrays of quantized activation rows (int8 [rows, n], f32 [rows]), or null for another layout. */
function quantizedRows(v: QuantizedRowsView, rows: number, n: number): { data: Int8Array; scales: Float32Array } | null {
  const scales = f32Span(v.scales, rows);
  if (v.data.dtype !== "int8" || !scales) return null;
  return { data: new Int8Array(rawOf(v.data.buffer), v.data.offset, rows * n), scales };
}

/** Host (TS reference) path of the quantized ops, for layouts the native kernels do not take. */
function runQuantHost(call: Extract<KernelCall, { op: "quant_matmul" | "quantize_weight" | "quant_gather_rows" }>): void {
  const hostF32 = (v: BufferView, len: number) => new Float32Array(v.buffer.host!, v.offset * 4, len);
  const hostBytes = (v: BufferView, len: number, bytes: number) => new Uint8Array(v.buffer.host!, v.offset * bytes, len * bytes);
  const scaleBytes = quantScaleBytes(call.scheme);
  const ns = quantScaleCount(call.scheme, call.n, call.k);
  if (call.op === "quantize_weight") {
    const q = quantizeWeightsRef(call.scheme, hostF32(call.w, call.n * call.k).slice(), call.n, call.k);
    hostBytes(call.data, q.data.length, 1).set(q.data);
    hostBytes(call.scales, ns, scaleBytes).set(new Uint8Array(q.scales.buffer));
    if (call.rowSums) hostBytes(call.rowSums, q.rowSums.length, 4).set(new Uint8Array(q.rowSums.buffer));
    return;
  }
  const data = hostBytes(call.w, quantDataBytes(call.scheme, call.n, call.k), 1).slice();
  const sb = hostBytes(call.scales, ns, scaleBytes).slice();
  const scales = newScales(call.scheme, ns, sb.buffer);
  if (call.op === "quant_gather_rows") {
    const ids = new Int32Array(call.ids.buffer.host!, call.ids.offset * 4, call.numIds);
    for (const id of ids) if (id < 0 || id >= call.n) throw new RangeError(`id ${id} out of range [0, ${call.n})`);
    const table = dequantizeRef(call.scheme, { data, scales, rowSums: new Int32Array(0) }, call.n, call.k);
    const out = hostF32(call.out, call.numIds * call.k);
    ids.forEach((id, i) => out.set(table.subarray(id * call.k, (id + 1) * call.k), i * call.k));
    return;
  }
  const rowSums = call.rowSums ? new Int32Array(hostBytes(call.rowSums, call.n, 4).slice().buffer) : new Int32Array(0);
  const pre = call.xq
    ? { xq: new Int8Array(hostBytes(call.xq.data, call.m * call.k, 1).slice().buffer), xs: hostF32(call.xq.scales, call.m).slice() }
    : undefined;
  const out = quantMatmulRef(call.scheme, hostF32(call.x, call.m * call.k).slice(), { data, scales, rowSums }, call.m, call.n, call.k, pre);
  hostF32(call.out, call.m * call.n).set(out);
}

export class CpuBackend extends HostMemoryBackend implements Backend {
  readonly name = "cpu";
  readonly native: NativeKernels;
  private readonly stream: CpuStream;
  private readonly quantSchemes = new Set<QuantScheme>();
  protected readonly memory: HostAllocator;
  /** The open capture's recorder (beginCapture({ record: true })), and the last recorded capture's calls. */
  private recorder: CaptureRecorder | null = null;
  private recording: RawRecording | null = null;
  /** Memory a step graph's jobs point into (captured, replayed or aborted): the allocator never reuses it. */
  private readonly graphMemory = new WeakSet<ArrayBuffer>();

  constructor() {
    super();
    const native = tryLoadNativeKernels();
    if (!native) throw new BackendUnavailableError("cpu", `native kernels did not load (${nativeLoadError()}); run \`npm run build\`, or use device "reference"`);
    this.native = native;
    this.stream = new CpuStream(native);
    const stream = this.stream;
    const graphMemory = this.graphMemory;
    this.memory = new HostAllocator({
      wrap: (m) => new CpuBuffer(m, stream),
      // a queued job still using freed memory runs before whatever the stream enqueues for its next owner, and
      // CpuBuffer.host waits for it; only the allocator's own zero-fill (a host write) must not touch it
      inUse: (m) => stream.isTouched(m),
      zeroLater: (m) => this.zeroOnStream(m),
      // a step graph's replays write its memory for as long as the graph lives: never handed out again
      reusable: (m) => !graphMemory.has(m) && !hugeMemory.has(m),
    });
    // Which quant schemes this addon's kernels take, probed now with synchronous calls on scratch arrays: a
    // probe through the stream launcher would enqueue a job writing arrays nobody keeps alive.
    for (const scheme of QUANT_SCHEMES) if (nativeTakesScheme(native, scheme)) this.quantSchemes.add(scheme);
    const threads = env.numThreads;
    if (threads !== undefined) native.setNumThreads(threads);
  }

  describe(): string {
    return `cpu (native ${this.native.isa}, ${this.native.getNumThreads()} threads)`;
  }
  mapFile(path: string, byteOffset: number, byteLength: number): DeviceBuffer {
    return this.memory.adopt(this.native.mapFile(path, byteOffset, byteLength));
  }
  moveToHugePages(buffers: Iterable<DeviceBuffer>, options: { discard?: boolean; maxBytes?: number } = {}): number {
    const alloc = this.native.allocHugeMemory;
    if (alloc === undefined) return 0;
    if (this.stream.capturing) throw new CaptureError("move_to_huge_pages", "memory cannot move during a capture (on cpu)");
    const todo = [...new Set(buffers)].filter(
      (b): b is CpuBuffer => b instanceof CpuBuffer && !b.freed && b.byteLength >= HUGE_PAGE_MIN_BYTES && !hugeMemory.has(b.raw),
    );
    const maxBytes = options.maxBytes ?? Infinity;
    if (!todo.some((b) => b.byteLength <= maxBytes)) return 0;
    this.stream.drain();
    let moved = 0;
    for (const b of todo) {
      if (moved + b.byteLength > maxBytes) continue; // past the budget: stays on ordinary pages
      let memory: ArrayBuffer;
      try {
        memory = alloc.call(this.native, b.byteLength);
      } catch {
        break; // out of address space or memory: the rest stays on ordinary pages
      }
      if (options.discard !== true) new Uint8Array(memory).set(new Uint8Array(b.raw));
      this.memory.renumber(b.raw, memory);
      b.rehome(memory);
      hugeMemory.add(memory);
      moved += memory.byteLength;
    }
    return moved;
  }
  populate(buffers: Iterable<DeviceBuffer>): void {
    const populate = this.native.populate;
    if (populate === undefined) return;
    for (const b of buffers) if (b instanceof CpuBuffer && !b.freed) populate.call(this.native, b.raw);
  }
  withMemoryPool<T>(fn: () => T): T {
    // the stream runs jobs in order and host access waits for the jobs touching the memory (beforeHostAccess), so a
    // new owner's uses follow the previous owner's, as in a capture
    return this.memory.withPool(fn);
  }
  write(buffer: DeviceBuffer, byteOffset: number, src: Uint8Array): void {
    if (this.stream.capturing) throw new CaptureError("write", "host writes cannot be captured: write step inputs before launch(), outside the capture (on cpu)");
    this.memory.write(buffer, byteOffset, src);
  }
  read(buffer: DeviceBuffer, byteOffset: number, byteLength: number): Uint8Array {
    if (this.stream.capturing) throw new CaptureError("read", "host reads cannot be captured: read outputs after launch() (on cpu)");
    return this.memory.read(buffer, byteOffset, byteLength);
  }
  synchronize(): Promise<void> {
    return this.stream.synchronize();
  }

  /**
   * Enqueues a copy of `src` (taken now, so the caller may reuse it) into the buffer behind the work already
   * enqueued; writes at once when no pending work uses the buffer. Not capturable.
   */
  writeAsync(buffer: DeviceBuffer, byteOffset: number, src: Uint8Array): void {
    this.writeAsyncMany([{ buffer, byteOffset, src }]);
  }

  /** writeAsync of each write, those behind pending work as one stream job copying one private copy of their bytes. */
  writeAsyncMany(writes: readonly AsyncWrite[]): void {
    if (this.stream.capturing) throw new CaptureError("write_async", "step inputs are written before launch(), outside the capture (on cpu)");
    const checked = writes.map(({ buffer, byteOffset, src }) => {
      const raw = rawOf(buffer);
      const n = src.byteLength;
      if (!Number.isInteger(byteOffset) || byteOffset < 0 || byteOffset + n > raw.byteLength)
        throw new RangeError(`[write_async] ${n} bytes at offset ${byteOffset} outside a ${raw.byteLength}-byte buffer`);
      return { raw, byteOffset, src };
    });
    // every write is checked before any lands; those into memory no pending work uses land now
    const later: typeof checked = [];
    for (const w of checked) {
      if (w.src.byteLength === 0) continue;
      if (this.stream.isTouched(w.raw)) later.push(w);
      else new Uint8Array(w.raw, w.byteOffset, w.src.byteLength).set(w.src);
    }
    if (later.length === 0) return;
    const copy = new Uint8Array(later.reduce((n, w) => n + w.src.byteLength, 0)); // the job reads it later
    let at = 0;
    for (const w of later) {
      copy.set(w.src, at);
      at += w.src.byteLength;
    }
    this.native.stream.copyPieces(copy, later.map((w) => new Uint8Array(w.raw, w.byteOffset, w.src.byteLength)));
    this.stream.trackRaw([copy.buffer], later.map((w) => w.raw));
  }

  /** Enqueues a zero fill of memory (behind the queued jobs that use it), as run()'s fills: a broadcast byte copy. */
  private zeroOnStream(memory: ArrayBuffer): boolean {
    if (this.stream.capturing) return false;
    const n = memory.byteLength;
    const eb = copyElemBytes(0, n);
    if (n / eb > 0x7fffffff) return false;
    this.native.stream.copyStrided(ZERO_ELEMENT, new Uint8Array(memory), Int32Array.of(n / eb), Int32Array.of(0), Int32Array.of(1), eb);
    this.stream.trackRaw([], [memory]); // ZERO_ELEMENT lives as long as the module
    return true;
  }

  copyAsync(src: DeviceBuffer, srcOffset: number, dst: DeviceBuffer, dstOffset: number, byteLength: number): void {
    if (this.stream.capturing) throw new CaptureError("copy_async", "step inputs are copied before launch(), outside the capture (on cpu)");
    const from = rawOf(src);
    const to = rawOf(dst);
    const n = byteLength;
    for (const [raw, at] of [[from, srcOffset], [to, dstOffset]] as const)
      if (!Number.isInteger(at) || at < 0 || at + n > raw.byteLength)
        throw new RangeError(`[copy_async] ${n} bytes at offset ${at} outside a ${raw.byteLength}-byte buffer`);
    if (n === 0) return;
    const eb = Math.min(copyElemBytes(srcOffset, n), copyElemBytes(dstOffset, n)) as 1 | 2 | 4 | 8;
    const len = Int32Array.of(n / eb);
    const one = Int32Array.of(1);
    this.native.stream.copyStrided(new Uint8Array(from, srcOffset, n), new Uint8Array(to, dstOffset, n), len, one, one, eb);
    this.stream.trackRaw([from], [to]);
  }

  fence(): number {
    if (this.stream.capturing) throw new CaptureError("fence", "cannot mark the stream while capturing (on cpu)");
    return this.native.streamSubmitted();
  }

  readAfter(fence: number, buffer: DeviceBuffer, byteOffset: number, byteLength: number): Uint8Array {
    if (this.stream.capturing) throw new CaptureError("read_after", "cannot wait for the stream while capturing (on cpu)");
    const raw = rawOf(buffer);
    if (!Number.isInteger(byteOffset) || byteOffset < 0 || byteOffset + byteLength > raw.byteLength)
      throw new RangeError(`[read_after] ${byteLength} bytes at offset ${byteOffset} outside a ${raw.byteLength}-byte buffer`);
    this.native.streamWaitFor(fence);
    return new Uint8Array(raw, byteOffset, byteLength).slice();
  }

  /**
   * Drains the stream, then records the kernels run() enqueues (see Backend.beginCapture). Memory freed
   * during the capture from buffers allocated during it is reused by the capture's later allocations of the
   * same size (CUDA graphs' private pool): replays run the jobs in capture order on the in-order stream, so
   * the previous owner's last job precedes the new owner's first. The graph pins it all until dispose().
   * So a buffer allocated during the capture that outlives it is a graph output: replays rewrite its memory.
   */
  beginCapture(options?: { record?: boolean }): void {
    this.stream.beginCapture();
    this.memory.openPool();
    this.recording = null;
    this.recorder = options?.record === true ? new CaptureRecorder(this.native.stream, this.memory.mark()) : null;
  }
  endCapture(): StepGraph {
    this.memory.closePool();
    const captured = this.stream.endCapture();
    for (const m of captured.pins.all) this.graphMemory.add(m);
    this.recording = this.recorder?.finish(captured.pins) ?? null;
    this.recorder = null;
    return new CpuStepGraph(this.native, this.stream, captured);
  }
  abortCapture(): void {
    this.memory.closePool();
    this.recorder = null;
    if (!this.stream.capturing) return;
    const aborted = this.stream.endCapture();
    for (const m of aborted.pins.all) this.graphMemory.add(m); // released below, but kept out of the cache all the same
    this.native.streamReleaseGraph(aborted.handle);
  }
  takeRecording(
    roots: ReadonlyMap<string, DeviceBuffer>,
    outputs: ReadonlyMap<string, DeviceBuffer>,
    mark: number,
    describeCode: (address: bigint) => string | null,
  ): CaptureRecording | null {
    const rec = this.recording;
    this.recording = null;
    return rec === null ? null : serializeRecording(rec, this.memory, roots, outputs, mark, describeCode);
  }
  replayCapture(
    recording: CaptureRecording,
    roots: ReadonlyMap<string, DeviceBuffer>,
    session: ReplaySession,
    resolveCode: (code: string) => bigint | null,
  ): { graph: StepGraph; outputs: Map<string, DeviceBuffer> } | null {
    const native = this.native;
    const stream = native.stream as unknown as Record<string, (...a: unknown[]) => number>;
    const launch = (fn: string, args: unknown[]): void => {
      if (fn === "@call") native.streamCallFn!(...(args as [bigint, ArrayBuffer[], BigInt64Array, BigInt64Array?]));
      else stream[fn]!(...args);
    };
    this.stream.beginCapture();
    let replayed: ReturnType<typeof replayCalls> = null;
    try {
      replayed = replayCalls(recording, this.memory, launch, roots, session, resolveCode);
    } finally {
      if (replayed === null) this.native.streamReleaseGraph(this.stream.endCapture().handle);
    }
    if (replayed === null) return null;
    for (const m of replayed.all) this.graphMemory.add(m);
    this.stream.trackRaw(replayed.all, replayed.written);
    return { graph: new CpuStepGraph(this.native, this.stream, this.stream.endCapture()), outputs: replayed.outputs };
  }
  allocationMark(): number {
    return this.memory.mark();
  }

  /** Whether submitRaw() can enqueue generated code (the addon has streamCallFn). */
  get takesRawCalls(): boolean {
    return typeof this.native.streamCallFn === "function";
  }

  /**
   * Enqueues generated code on the stream, in order with this back end's kernels (step-graph captures record
   * it like any kernel), and tracks its buffers so later host access waits for it.
   */
  submitRaw(call: RawStreamCall): void {
    if (!this.native.streamCallFn) throw new BackendUnavailableError("cpu", "the native addon predates raw stream calls; rebuild it");
    const asView = (buffer: DeviceBuffer) => ({ buffer }) as BufferView; // track() looks at the buffer only
    const args = [call.address, call.buffers.map(rawOf), call.byteOffsets, call.sizes] as const;
    this.native.streamCallFn(...args);
    this.recorder?.recordCode([...args]);
    this.stream.track(call.reads.map(asView), call.writes.map(asView));
  }

  run(call: KernelCall, options?: RunOptions): void {
    const blocking = options?.blocking ?? false;
    const capturing = this.stream.capturing;
    if (capturing && blocking) throw new CaptureError(call.op, "blocking (debug-mode) kernels cannot be captured; capture in strict mode (on cpu)");
    if (blocking) this.stream.drainIfTracked();
    if (this.runNative(call, blocking)) {
      if (!blocking) {
        const { reads, writes } = operands(call);
        this.stream.track(reads, writes);
      }
      return;
    }
    if (capturing) throw new CaptureError(call.op, `no native kernel for ${describeOperands(call)}; it would run on the host, which cannot be captured (on cpu)`);
    // host kernels reach memory through CpuBuffer.host, which waits for pending work on that buffer
    if (call.op === "quant_matmul" || call.op === "quantize_weight" || call.op === "quant_gather_rows") return runQuantHost(call);
    if (!runHostFast(call)) runReference(call);
  }

  /** A small strided op runs on the host unless that would wait for the stream (or is being captured). */
  private preferHost(n: number, blocking: boolean, views: readonly BufferView[]): boolean {
    if (this.stream.capturing) return false;
    return n < NATIVE_STRIDED_MIN && (blocking || !this.stream.touches(views));
  }

  /**
   * Runs (blocking) or enqueues the call natively when the dtypes and layouts have a native kernel;
   * returns false otherwise. Index data read here for bounds checks is waited for first; while capturing
   * the checks see the values written before the capture (replays trust their metadata).
   */
  private runNative(call: KernelCall, blocking: boolean): boolean {
    const k: Launcher = blocking ? this.native : (this.recorder?.launcher ?? this.native.stream);
    switch (call.op) {
      case "unary": {
        const code = UNARY_CODES[call.fn];
        const x = f32(call.x);
        const out = f32(call.out);
        if (code === undefined || !x || !out) return false;
        k.unary(code, x, out, out.length);
        return true;
      }
      case "binary": {
        const cmp = COMPARE_CODES[call.fn];
        if (cmp !== undefined) {
          // float32 operands, bool bytes out
          if (call.out.dtype !== "bool" || !isContiguous(call.out.shape, call.out.strides)) return false;
          if (this.preferHost(numel(call.out.shape), blocking, [call.a, call.b, call.out])) return false;
          const p = stridedPair(call.a, call.b, call.out.shape);
          if (!p) return false;
          k.compareStrided(cmp, p.a, p.as, p.b, p.bs, new Uint8Array(rawOf(call.out.buffer), call.out.offset, numel(call.out.shape)), p.shape);
          return true;
        }
        const code = BINARY_CODES[call.fn];
        const out = f32(call.out);
        if (code === undefined || !out) return false;
        const a = f32(call.a);
        const b = a ? broadcastRow(call.b) : null;
        if (a && b && out.length % b.bn === 0) {
          k.binary(code, a, b.data, out, out.length, b.bn);
          return true;
        }
        // general broadcasting / strided operands (scalar - x, column broadcasts, transposed inputs)
        if (this.preferHost(out.length, blocking, [call.a, call.b, call.out])) return false;
        const p = stridedPair(call.a, call.b, call.out.shape);
        if (!p) return false;
        k.binaryStrided(code, p.a, p.as, p.b, p.bs, out, p.shape);
        return true;
      }
      case "where": {
        const out = f32(call.out);
        const cd = call.cond.dtype;
        if (!out || (cd !== "bool" && cd !== "uint8")) return false;
        if (this.preferHost(out.length, blocking, [call.cond, call.a, call.b, call.out])) return false;
        const shape = dims(call.out.shape);
        const cs = dims(call.cond.strides);
        const as = dims(call.a.strides);
        const bs = dims(call.b.strides);
        const af = f32From(call.a);
        const bf = f32From(call.b);
        if (!shape || !cs || !as || !bs || !af || !bf) return false;
        k.whereStrided(bytesFrom(call.cond, 1), cs, af, as, bf, bs, out, shape);
        return true;
      }
      case "copy": {
        const n = numel(call.out.shape);
        const xf = f32(call.x);
        const of = f32(call.out);
        if (xf && of) {
          if (blocking) of.set(xf);
          else k.copyStrided(xf, of, Int32Array.of(n), Int32Array.of(1), Int32Array.of(1), 4);
          return true;
        }
        const xh = u16(call.x);
        const oh = u16(call.out);
        if (xf && oh) {
          if (call.out.dtype === "bfloat16") k.f32ToBf16(xf, oh, n);
          else k.f32ToF16(xf, oh, n);
          return true;
        }
        if (xh && of) {
          if (call.x.dtype === "bfloat16") k.bf16ToF32(xh, of, n);
          else k.f16ToF32(xh, of, n);
          return true;
        }
        // same dtype, any layout: a strided byte copy (transposes, expand materialisation, slices)
        const eb = DTYPE_BYTES[call.x.dtype];
        if (call.x.dtype !== call.out.dtype || (eb !== 1 && eb !== 2 && eb !== 4 && eb !== 8)) return false;
        if (isDirect(call.x.dtype) && this.preferHost(n, blocking, [call.x, call.out])) return false; // tiny: the TS loop is cheaper
        const shape = dims(call.out.shape);
        const xs = dims(call.x.strides);
        const os = dims(call.out.strides);
        if (!shape || !xs || !os) return false;
        for (let d = 0; d < shape.length; d++) if (os[d] === 0 && shape[d]! > 1) return false; // overlapping dst
        k.copyStrided(bytesFrom(call.x, eb), bytesFrom(call.out, eb), shape, xs, os, eb);
        return true;
      }
      case "fill": {
        // a broadcast byte copy from one encoded element: keeps fills on the stream (and capturable)
        const eb = DTYPE_BYTES[call.out.dtype];
        const n = numel(call.out.shape);
        if ((eb !== 1 && eb !== 2 && eb !== 4 && eb !== 8) || this.preferHost(n, blocking, [call.out])) return false;
        const shape = dims(call.out.shape);
        const os = dims(call.out.strides);
        if (!shape || !os) return false;
        for (let d = 0; d < shape.length; d++) if (os[d] === 0 && shape[d]! > 1) return false; // overlapping dst
        const value = elementBytes(call.out.dtype, call.value, eb);
        k.copyStrided(new Uint8Array(value), bytesFrom(call.out, eb), shape, new Int32Array(shape.length), os, eb);
        if (!blocking) this.stream.trackRaw([value], []);
        return true;
      }
      case "reduce": {
        const x = f32(call.x);
        if (!x) return false;
        if (call.fn === "argmax") {
          const out = i32(call.out);
          if (!out) return false;
          k.argmax(x, out, call.rows, call.n);
          return true;
        }
        const code = (REDUCE_CODES as Record<string, number | undefined>)[call.fn];
        const out = f32(call.out);
        if (code === undefined || !out) return false;
        k.reduce(code, x, out, call.rows, call.n);
        return true;
      }
      case "softmax": {
        const x = f32(call.x);
        const out = f32(call.out);
        if (!x || !out) return false;
        k.softmax(x, out, call.rows, call.n, call.log);
        return true;
      }
      case "rms_norm": {
        const x = f32(call.x);
        const w = f32(call.weight);
        const out = f32(call.out);
        if (!x || !w || !out) return false;
        if (call.xq) {
          const xq = quantizedRows(call.xq, call.rows, call.n);
          if (!xq) return false;
          k.rmsNormQuant(x, w, out, call.rows, call.n, call.eps, xq.data, xq.scales);
          return true;
        }
        k.rmsNorm(x, w, out, call.rows, call.n, call.eps);
        return true;
      }
      case "add_rms_norm": {
        const x = f32(call.x);
        const r = f32(call.residual);
        const w = f32(call.weight);
        const sum = f32(call.sum);
        const out = f32(call.out);
        const xq = call.xq ? quantizedRows(call.xq, call.rows, call.n) : null;
        if (!x || !r || !w || !sum || !out || (call.xq && !xq)) return false;
        k.addRmsNorm(x, r, w, sum, out, call.rows, call.n, call.eps, xq?.data, xq?.scales);
        return true;
      }
      case "silu_mul": {
        const gate = f32(call.gate);
        const up = f32(call.up);
        const out = f32(call.out);
        if (!gate || !up || !out) return false;
        if (call.xq) {
          const xq = quantizedRows(call.xq, call.rows, call.n);
          if (!xq) return false;
          k.siluMulQuant(gate, up, out, call.rows, call.n, xq.data, xq.scales);
          return true;
        }
        k.siluMul(gate, up, out, out.length);
        return true;
      }
      case "matmul": {
        const { batch, m, n, k: kk, strideA, strideB, strideOut, bTransposed } = call;
        const aTransposed = call.aTransposed ?? false;
        const a = f32Span(call.a, (batch - 1) * strideA + m * kk);
        const out = f32Span(call.out, (batch - 1) * strideOut + m * n);
        const bLen = (batch - 1) * strideB + n * kk;
        const b = call.b.dtype === "bfloat16" ? u16Span(call.b, bLen) : f32Span(call.b, bLen);
        if (!a || !out || !b) return false;
        k.matmul(a, b, out, m, n, kk, bTransposed, call.b.dtype === "bfloat16" ? 1 : 0, batch, strideA, strideB, strideOut, aTransposed);
        return true;
      }
      case "quant_matmul": {
        const q = quantArrays(call.scheme, call.w, call.scales, call.rowSums, call.n, call.k);
        const x = f32Span(call.x, call.m * call.k);
        const out = f32Span(call.out, call.m * call.n);
        if (!q || !x || !out || call.k % quantKMultiple(call.scheme) !== 0 || !this.quantSchemes.has(call.scheme)) return false;
        const xq = call.xq ? quantizedRows(call.xq, call.m, call.k) : null;
        if (call.xq && !xq) return false;
        k.quantMatmul(x, q.data, q.scales, q.rowSums, out, call.m, call.n, call.k, nativeQuantCode(call.scheme), xq?.data, xq?.scales);
        return true;
      }
      case "quantize_weight": {
        const q = quantArrays(call.scheme, call.data, call.scales, call.rowSums, call.n, call.k);
        const w = f32Span(call.w, call.n * call.k);
        // the k-quants and iq4_nl have no native quantizer (their weights are GGUF blocks): the TS encoders run on the host
        if (!q || !w || call.k % quantKMultiple(call.scheme) !== 0 || isSuperBlockScheme(call.scheme) || call.scheme === "iq4_nl" || !this.quantSchemes.has(call.scheme)) return false;
        k.quantizeWeights(w, call.n, call.k, nativeQuantCode(call.scheme), q.data, q.scales, q.rowSums);
        return true;
      }
      case "quant_gather_rows": {
        const q = quantArrays(call.scheme, call.w, call.scales, null, call.n, call.k, false); // int8's row sums serve products only
        const ids = i32(call.ids);
        const out = f32(call.out);
        if (!q || !ids || !out || call.k % quantKMultiple(call.scheme) !== 0 || !this.quantSchemes.has(call.scheme)) return false;
        this.stream.awaitWrites([call.ids]); // the kernel checks the ids as it is made
        k.quantEmbedding(q.data, q.scales, ids, out, call.numIds, call.n, call.k, nativeQuantCode(call.scheme));
        return true;
      }
      case "index_add_rows": {
        const ids = i32(call.ids);
        const src = f32(call.src);
        const out = f32(call.out);
        if (!ids || !src || !out || out.length !== call.rows * call.dim) return false;
        this.stream.awaitWrites([call.ids]); // the kernel checks the ids as it is made
        k.indexAddRows(out, ids, src, call.numIds, call.dim);
        return true;
      }
      case "gather_rows": {
        const ids = i32(call.ids);
        const out = f32(call.out);
        const tableLen = call.rows * call.dim;
        const table = call.table.dtype === "bfloat16" ? u16Span(call.table, tableLen) : f32Span(call.table, tableLen);
        if (!ids || !out || !table) return false;
        this.stream.awaitWrites([call.ids]);
        for (let i = 0; i < ids.length; i++) {
          const id = ids[i]!;
          // memory safety: native code trusts the ids
          if (id < 0 || id >= call.rows) throw new RangeError(`index ${id} out of range for ${call.rows} rows`);
        }
        k.embedding(table, call.table.dtype === "bfloat16" ? 1 : 0, ids, out, call.numIds, call.dim);
        return true;
      }
      case "rotary": {
        const x = f32(call.x);
        const pos = i32(call.positions);
        const cos = f32(call.cos);
        const sin = f32(call.sin);
        const out = f32(call.out);
        if (!x || !pos || !cos || !sin || !out) return false;
        this.stream.awaitWrites([call.positions]);
        checkRotaryPositions(pos, cos.length / (call.rotaryDim / 2));
        k.rotary(x, pos, cos, sin, out, call.tokens, call.heads, call.headDim, call.rotaryDim, call.neox);
        return true;
      }
      case "paged_attention": {
        const q = f32(call.q);
        const kNew = f32(call.kNew);
        const vNew = f32(call.vNew);
        // caches: float32, bfloat16 or one of the fp8 formats (both the same)
        const cacheDtype = call.kCache.dtype === call.vCache.dtype ? call.kCache.dtype : null;
        const fp8Format = cacheDtype === "float8_e4m3fn" ? 1 : cacheDtype === "float8_e5m2" ? 2 : 0;
        const cache = (v: BufferView) => (cacheDtype === "bfloat16" ? u16(v) : fp8Format > 0 ? u8(v) : f32(v));
        const kCache = cache(call.kCache);
        const vCache = cache(call.vCache);
        const slots = i32(call.slotMapping);
        const tables = i32(call.blockTables);
        const qStart = i32(call.queryStart);
        const seqLens = i32(call.seqLens);
        const out = f32(call.out);
        if (!q || !kNew || !vNew || !kCache || !vCache || !slots || !tables || !qStart || !seqLens || !out) return false;
        const rot = call.rotary;
        const pos = rot ? i32(rot.positions) : null;
        const cos = rot ? f32(rot.cos) : null;
        const sin = rot ? f32(rot.sin) : null;
        if (rot && (!pos || !cos || !sin)) return false;
        const sinks = call.sinks ? f32(call.sinks) : null;
        if (call.sinks && !sinks) return false;
        this.stream.awaitWrites([call.slotMapping, call.blockTables, call.queryStart, call.seqLens, ...(rot ? [rot.positions] : [])]);
        checkPagedAttentionIndices(call, kCache.length, slots, tables, qStart, seqLens);
        if (rot && pos && cos) checkRotaryPositions(pos, cos.length / (rot.rotaryDim / 2));
        k.pagedAttention(
          q, kNew, vNew, kCache, vCache, slots, tables, qStart, seqLens, out,
          call.numSeqs, call.numHeads, call.numKvHeads, call.headDim, call.blockSize, call.maxBlocksPerSeq,
          call.scale, call.slidingWindow,
          pos ?? undefined, cos ?? undefined, sin ?? undefined, rot?.rotaryDim, rot?.neox, fp8Format || undefined, call.softcap,
          sinks ?? undefined, call.bidirectional === true,
        );
        return true;
      }
      case "flash_attention":
      case "flash_attention_backward": {
        const docs = call.docs === null ? null : i32(call.docs);
        if (call.docs !== null && docs === null) return false;
        const spans = Int32Array.from(call.spans.flat());
        const dims = [call.batch, call.heads, call.kvHeads, call.seq, call.keys, call.headDim, call.scale, call.softcap, call.window] as const;
        const sinks = call.sinks === null ? null : f32(call.sinks);
        if (call.sinks !== null && sinks === null) return false;
        if (call.op === "flash_attention") {
          const [q, kk, v, out, lse] = [call.q, call.k, call.v, call.out, call.lse].map(f32);
          if (!q || !kk || !v || !out || !lse) return false;
          k.flashAttention(q, kk, v, out, lse, docs, spans, ...dims, sinks);
        } else {
          const [q, kk, v, o, dout, lse, dq, dk, dv] = [call.q, call.k, call.v, call.o, call.dout, call.lse, call.dq, call.dk, call.dv].map(f32);
          const dsinks = call.dsinks === null ? null : f32(call.dsinks);
          if (!q || !kk || !v || !o || !dout || !lse || !dq || !dk || !dv || (call.dsinks !== null && !dsinks)) return false;
          k.flashAttentionBackward(q, kk, v, o, dout, lse, dq, dk, dv, docs, spans, ...dims, sinks, dsinks);
        }
        return true;
      }
      case "lora_apply": {
        // out is the only write (WRITTEN_FIELDS); the kernel bounds-checks slots itself when it runs
        const [base, x, a, b, scales, out] = [call.base, call.x, call.a, call.b, call.scales, call.out].map(f32);
        const slots = i32(call.slots);
        if (!base || !x || !a || !b || !scales || !out || !slots) return false;
        k.loraApply(base, x, a, b, scales, slots, out, call.t, call.n, call.k, call.r, call.s);
        return true;
      }
      case "sort": {
        const x = f32(call.x);
        const values = f32(call.values);
        const indices = i32(call.indices);
        if (!x || !values || !indices) return false;
        k.sortRows(x, values, indices, call.rows, call.n, call.descending);
        return true;
      }
      case "moe":
        return this.runMoe(k, call);
      default:
        return false;
    }
  }

  /** moe natively when every projection has a native layout (f32 / bf16, or a quant scheme this addon takes). */
  private runMoe(k: Launcher, call: Extract<KernelCall, { op: "moe" }>): boolean {
    const [x, ids, weights, out] = [f32(call.x), i32(call.ids), f32(call.weights), f32(call.out)];
    if (!x || !ids || !weights || !out) return false;
    const E = call.experts.length;
    const kinds = new Int32Array(3 * E);
    const projections: MoeProjectionArrays[] = [];
    for (let e = 0; e < E; e++) {
      const ex = call.experts[e]!;
      for (const [r, p] of [ex.gate, ex.up, ex.down].entries()) {
        const [n, kk] = r < 2 ? [call.inter, call.h] : [call.h, call.inter];
        const bias = p.bias ? f32(p.bias) : null;
        if (p.bias && !bias) return false;
        if (p.quant) {
          const scheme = p.quant.scheme;
          if (!this.quantSchemes.has(scheme) || kk % quantKMultiple(scheme) !== 0) return false;
          const q = quantArrays(scheme, p.w, p.quant.scales, p.quant.rowSums, n, kk);
          if (!q) return false;
          kinds[3 * e + r] = 2 + nativeQuantCode(scheme);
          projections.push([q.data, q.scales, scheme === "int8" ? q.rowSums : null, bias]);
          continue;
        }
        const w = p.w.dtype === "bfloat16" ? u16(p.w) : f32(p.w);
        if (!w || numel(p.w.shape) !== n * kk) return false;
        kinds[3 * e + r] = p.w.dtype === "bfloat16" ? 1 : 0;
        projections.push([w, null, null, bias]);
      }
    }
    const act = call.act.kind === "silu" ? { code: 0 as const, alpha: 0, limit: 0 } : { code: 1 as const, alpha: call.act.alpha, limit: call.act.limit };
    k.moe(x, ids, weights, out, call.t, call.h, call.inter, call.k, E, act.code, act.alpha, act.limit, kinds, projections);
    return true;
  }
}

/** "float32[4, 8] (strided), int32[4]" for CaptureError messages. */
function describeOperands(call: KernelCall): string {
  const { reads, writes } = operands(call);
  const fn = "fn" in call ? ` ${call.fn}` : "";
  const views = [...reads, ...writes].map((v) => `${v.dtype}[${v.shape.join(", ")}]${isContiguous(v.shape, v.strides) ? "" : " (strided)"}`);
  return `${call.op}${fn} on ${views.join(", ")}`;
}

/** Strided TS loops for direct dtypes: faster than the float64 reference, used where no native kernel fits. */
function runHostFast(call: KernelCall): boolean {
  switch (call.op) {
    case "copy":
      return copyStrided(call.x, call.out);
    case "unary":
      return unaryStrided(call.fn, call.x, call.out);
    case "binary":
      return binaryStrided(call.fn, call.a, call.b, call.out);
    case "where":
      return whereStrided(call.cond, call.a, call.b, call.out);
    case "fill":
      return fillStrided(call.out, call.value);
    case "gather":
      return gatherRows(call.x, call.index, call.out, call.rows, call.n, call.m);
    case "scatter":
      return scatterRows(call.out, call.index, call.src, call.rows, call.n, call.m, call.accumulate);
    default:
      return false;
  }
}

/** Rotary positions index the cos/sin tables: the native kernels trust them. */
function checkRotaryPositions(pos: Int32Array, maxPos: number): void {
  for (let i = 0; i < pos.length; i++) {
    const p = pos[i]!;
    if (p < 0 || p >= maxPos) throw new RangeError(`position ${p} out of range for ${maxPos} rotary positions`);
  }
}

/** Bounds checks before native paged attention: the kernel trusts its metadata. O(tokens + seqs), cheap. */
function checkPagedAttentionIndices(
  call: Extract<KernelCall, { op: "paged_attention" }>,
  cacheLen: number,
  slots: Int32Array,
  tables: Int32Array,
  qStart: Int32Array,
  seqLens: Int32Array,
): void {
  const slotElems = call.numKvHeads * call.headDim;
  const numSlots = cacheLen / slotElems;
  const numBlocks = numSlots / call.blockSize;
  for (let i = 0; i < slots.length; i++)
    if (slots[i]! >= numSlots) throw new RangeError(`slot ${slots[i]} out of range for ${numSlots} KV slots`);
  const totalTokens = call.q.shape[0]!;
  if (qStart[0] !== 0 || qStart[call.numSeqs] !== totalTokens) throw new RangeError("queryStart must run from 0 to the token count");
  for (let s = 0; s < call.numSeqs; s++) {
    const qlen = qStart[s + 1]! - qStart[s]!;
    const len = seqLens[s]!;
    if (qlen < 0 || len < qlen) throw new RangeError(`sequence ${s}: seqLen ${len} shorter than its ${qlen} new tokens`);
    const blocks = Math.ceil(len / call.blockSize);
    if (blocks > call.maxBlocksPerSeq) throw new RangeError(`sequence ${s} needs ${blocks} blocks > maxBlocksPerSeq ${call.maxBlocksPerSeq}`);
    for (let b = 0; b < blocks; b++) {
      const id = tables[s * call.maxBlocksPerSeq + b]!;
      if (id < 0 || id >= numBlocks) throw new RangeError(`block id ${id} out of range for ${numBlocks} blocks`);
    }
  }
}
