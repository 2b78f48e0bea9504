// The host side of the cpu device's in-order stream (native/stream.cc): which buffers pending native
// jobs touch, so that host access waits for exactly the work it depends on; and step graphs, the
// stream captured once and replayed with one native call per step.
//
// Invariants:
//  - every ArrayBuffer a pending job reads or writes is in `touched` (this also keeps it alive: the
//    stream thread holds raw pointers into it); the jobs' outputs are also in `written`; a launched step
//    graph's pins count as touched (and its outputs as written) through `launched`;
//  - the sets are kept per epoch, a stretch of submissions: every CHECK_EVERY tracked jobs the current epoch
//    closes at the stream's submitted count, and a closed epoch is dropped once the stream has completed that
//    many jobs (all of them are seen empty when the stream is). So they over-approximate (host code may wait
//    more than needed, never less) but stay bounded while the stream never empties: clearing them only when the
//    stream was seen empty let a steady decode (the next step always queued behind the running one) pin each
//    step's input copy for as long as the load lasted (2010 of them after one 2000-token generate);
//  - host code (TS kernels, read/write, param updates through `buffer.host`) reaches memory through
//    CpuBuffer.host, which drains the stream first when that buffer is touched;
//  - while capturing, nothing runs: jobs' buffers go to `capture` instead (the graph's pins), and host
//    access to one of them throws CaptureError (it would see memory the replays rewrite).
import type { BufferView, DeviceBuffer, StepGraph } from "../backend.js";
import { CaptureError, OpError } from "../../util/errors.js";
import type { NativeGraphHandle, NativeKernels } from "./native.js";

/** Check the stream for emptiness (and cap its depth) once per this many submissions. */
const CHECK_EVERY = 256;
/** Above this many queued jobs the host waits: bounds the memory pinned by pending work. */
const MAX_PENDING = 2048;

/** A cpu allocation; `host` waits for pending stream work on it, `raw` (stream submission only) does not. */
export class CpuBuffer implements DeviceBuffer {
  freed = false;
  constructor(
    private memory: ArrayBuffer,
    private readonly stream: CpuStream,
  ) {}
  /** The memory, without waiting on the stream. */
  get raw(): ArrayBuffer {
    return this.memory;
  }
  /** Points the buffer at `memory` (same length, bytes copied by the caller, no stream work pending on either). */
  rehome(memory: ArrayBuffer): void {
    if (memory.byteLength !== this.memory.byteLength) throw new RangeError(`rehome: ${memory.byteLength} bytes for a ${this.memory.byteLength}-byte buffer`);
    this.memory = memory;
  }
  get host(): ArrayBuffer {
    this.stream.beforeHostAccess(this.memory);
    return this.memory;
  }
  get byteLength(): number {
    return this.memory.byteLength;
  }
}

/** Memory of a view without waiting on the stream (for arrays handed to stream jobs). */
export function rawOf(buffer: DeviceBuffer): ArrayBuffer {
  if (buffer instanceof CpuBuffer) return buffer.raw;
  const host = buffer.host;
  if (!host) throw new Error("buffer is not host-visible");
  return host;
}

/** Memory a step graph's jobs point into: kept alive by the graph, waited for after each launch. */
export interface GraphPins {
  /** Every ArrayBuffer a recorded job reads or writes (device buffers and private helper arrays). */
  readonly all: ReadonlySet<ArrayBuffer>;
  /** Those a recorded job writes. */
  readonly written: ReadonlySet<ArrayBuffer>;
}

/** The memory of the jobs enqueued in one stretch of submissions (see the invariants above). */
interface Epoch {
  readonly touched: Set<ArrayBuffer>;
  readonly written: Set<ArrayBuffer>;
  /** Step graphs launched in the epoch (their pins are touched). */
  readonly launched: Set<GraphPins>;
}
const newEpoch = (): Epoch => ({ touched: new Set(), written: new Set(), launched: new Set() });
const epochTouches = (e: Epoch, raw: ArrayBuffer): boolean => {
  if (e.touched.has(raw)) return true;
  for (const g of e.launched) if (g.all.has(raw)) return true;
  return false;
};
const epochWrites = (e: Epoch, raw: ArrayBuffer): boolean => {
  if (e.written.has(raw)) return true;
  for (const g of e.launched) if (g.written.has(raw)) return true;
  return false;
};
const isEmpty = (e: Epoch): boolean => e.touched.size === 0 && e.launched.size === 0;

export class CpuStream {
  private current = newEpoch();
  /** The epoch before, closed when the stream had taken `previousEnd` jobs: each job it holds is one of them. */
  private previous: Epoch | null = null;
  private previousEnd = 0;
  private capture: { all: Set<ArrayBuffer>; written: Set<ArrayBuffer> } | null = null;
  private sinceCheck = 0;

  constructor(private readonly native: NativeKernels) {}

  get capturing(): boolean {
    return this.capture !== null;
  }

  /** Whether a pending job (or launched graph) uses this memory. */
  isTouched(raw: ArrayBuffer): boolean {
    return epochTouches(this.current, raw) || (this.previous !== null && epochTouches(this.previous, raw));
  }

  private isWritten(raw: ArrayBuffer): boolean {
    return epochWrites(this.current, raw) || (this.previous !== null && epochWrites(this.previous, raw));
  }

  /** Whether any memory is tracked as used by a pending job. */
  private get tracking(): boolean {
    return !isEmpty(this.current) || (this.previous !== null && !isEmpty(this.previous));
  }

  /** ArrayBuffers and launched graphs tracked as in use by pending jobs (bounded while work keeps coming; tests). */
  get trackedCount(): number {
    const count = (e: Epoch | null) => (e === null ? 0 : e.touched.size + e.launched.size);
    return count(this.current) + count(this.previous);
  }

  /** Whether any of the views' buffers is used by a pending job. */
  touches(views: readonly BufferView[]): boolean {
    if (!this.tracking) return false;
    for (const v of views) if (this.isTouched(rawOf(v.buffer))) return true;
    return false;
  }

  /**
   * Before the host reads index data of these views (bounds checks): wait if a pending job writes them.
   * While capturing nothing is pending (nor waited for): the checks see the values written before the
   * capture, and replays trust whatever metadata the caller writes later.
   */
  awaitWrites(views: readonly BufferView[]): void {
    if (this.capture || !this.tracking) return;
    for (const v of views) {
      if (this.isWritten(rawOf(v.buffer))) {
        this.drain();
        return;
      }
    }
  }

  /** Before a blocking (debug-mode) call: finish everything this back end enqueued. */
  drainIfTracked(): void {
    if (this.tracking) this.drain();
  }

  beforeHostAccess(raw: ArrayBuffer): void {
    if (this.capture?.all.has(raw)) {
      throw new CaptureError("host access", "a buffer used by a captured kernel cannot be read or written on the host while capturing (on cpu)");
    }
    if (this.isTouched(raw)) this.drain();
  }

  /** Records a job just enqueued: its inputs and outputs stay pinned until the stream has run it (counted). */
  track(reads: readonly BufferView[], writes: readonly BufferView[]): void {
    const all = this.capture?.all ?? this.current.touched;
    const written = this.capture?.written ?? this.current.written;
    for (const v of reads) all.add(rawOf(v.buffer));
    for (const v of writes) {
      const raw = rawOf(v.buffer);
      all.add(raw);
      written.add(raw);
    }
    if (!this.capture) this.counted();
  }

  /** track() for raw memory (private arrays a job points into, such as writeAsync's copy of its source). */
  trackRaw(reads: readonly ArrayBuffer[], writes: readonly ArrayBuffer[]): void {
    const all = this.capture?.all ?? this.current.touched;
    const written = this.capture?.written ?? this.current.written;
    for (const raw of reads) all.add(raw);
    for (const raw of writes) {
      all.add(raw);
      written.add(raw);
    }
    if (!this.capture) this.counted();
  }

  /** Records a graph replay just enqueued: its pins count as touched until the stream has run it. */
  trackLaunch(pins: GraphPins): void {
    this.current.launched.add(pins);
    this.counted();
  }

  /**
   * Every CHECK_EVERY tracked jobs (each tracked after its submission, so it is one of the jobs submitted by now):
   * all is released when the stream is empty; else the previous epoch once the stream has completed its jobs, and
   * the current one closes in its place.
   */
  private counted(): void {
    if (++this.sinceCheck < CHECK_EVERY) return;
    this.sinceCheck = 0;
    const submitted = this.native.streamSubmitted();
    const completed = this.native.streamCompleted();
    if (completed === submitted) return this.clear();
    if (submitted - completed > MAX_PENDING) return this.drain();
    if (this.previous !== null && completed >= this.previousEnd) this.previous = null;
    if (this.previous === null) {
      this.previous = this.current;
      this.previousEnd = submitted;
      this.current = newEpoch();
    }
  }

  /** Blocks the JS thread until the stream is empty; rethrows a kernel error recorded on it. */
  drain(): void {
    if (this.capture) throw new CaptureError("synchronize", "cannot wait for the stream while capturing (on cpu)");
    try {
      this.native.streamSync();
    } finally {
      this.clear();
    }
  }

  /** Resolves when everything enqueued so far has run. */
  async synchronize(): Promise<void> {
    if (this.capture) throw new CaptureError("synchronize", "cannot wait for the stream while capturing (on cpu)");
    if (!this.tracking && this.native.streamPending() === 0) return;
    try {
      await this.native.streamSyncAsync();
    } finally {
      if (this.native.streamPending() === 0) this.clear();
    }
  }

  /** Drains the stream, then records jobs instead of running them. */
  beginCapture(): void {
    if (this.capture) throw new CaptureError("begin_capture", "a capture is already open (on cpu)");
    try {
      this.native.streamBeginCapture(); // drains first (rethrowing a recorded error)
    } finally {
      this.clear();
    }
    this.capture = { all: new Set(), written: new Set() };
  }

  /** Ends the capture: the native job list and the memory its jobs point into. */
  endCapture(): { handle: NativeGraphHandle; pins: GraphPins } {
    const pins = this.capture;
    if (!pins) throw new CaptureError("end_capture", "no capture is open (on cpu)");
    this.capture = null;
    return { handle: this.native.streamEndCapture(), pins };
  }

  private clear(): void {
    this.current = newEpoch();
    this.previous = null;
    this.sinceCheck = 0;
  }
}

/**
 * A captured cpu stream. Holds the recorded native jobs and every ArrayBuffer they point into (weights, KV
 * caches, persistent inputs/outputs, and intermediates freed during the capture, which only the graph
 * references now), so replays never touch freed memory. Host access waits for launched replays.
 */
export class CpuStepGraph implements StepGraph {
  readonly kernels: number;
  private handle: NativeGraphHandle | null;
  private pins: GraphPins | null;

  constructor(
    private readonly native: NativeKernels,
    private readonly stream: CpuStream,
    captured: { handle: NativeGraphHandle; pins: GraphPins },
  ) {
    this.handle = captured.handle;
    this.pins = captured.pins;
    this.kernels = native.streamGraphKernels(captured.handle);
  }

  /** Bytes of memory the graph keeps alive (shared with live tensors where they are the same buffers). */
  get pinnedBytes(): number {
    let n = 0;
    for (const raw of this.pins?.all ?? []) n += raw.byteLength;
    return n;
  }

  launch(): void {
    if (!this.handle || !this.pins) throw new OpError("step_graph", "launch() after dispose() (on cpu)");
    if (this.stream.capturing) throw new CaptureError("step_graph", "a step graph cannot be launched while capturing (on cpu)");
    this.native.streamLaunchGraph(this.handle);
    this.stream.trackLaunch(this.pins);
  }

  profile(reps: number): { op: string; ns: number; medianNs: number }[] {
    if (!this.handle || !this.native.streamProfileGraph) throw new OpError("step_graph", "profile() needs a live graph and a current addon (on cpu)");
    const { ops, ns, medianNs } = this.native.streamProfileGraph(this.handle, reps);
    return ops.map((op, i) => ({ op, ns: ns[i]!, medianNs: medianNs?.[i] ?? ns[i]! }));
  }

  dispose(): void {
    if (!this.handle) return;
    this.native.streamReleaseGraph(this.handle);
    this.handle = null;
    // the stream's `launched` set keeps these pins while a replay is still queued
    this.pins = null;
  }
}
