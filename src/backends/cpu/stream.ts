// The host side of the cpu device's in-order stream (native/stream.cc): which buffers pending native
// jobs touch, so that host access waits for exactly the work it depends on.
//
// Invariants:
//  - every ArrayBuffer a pending job reads or writes is in `touched` (this also keeps it alive: the
//    stream thread holds raw pointers into it); the jobs' outputs are also in `written`;
//  - the sets are cleared only when the stream is observed empty (pending === 0 on this thread, the only
//    submitter), so they over-approximate: host code may wait more than needed, never less;
//  - host code (TS kernels, read/write, param updates through `buffer.host`) reaches memory through
//    CpuBuffer.host, which drains the stream first when that buffer is touched.
import type { BufferView, DeviceBuffer } from "../backend.js";
import type { NativeKernels } from "./native.js";

/** Check the stream for emptiness (and cap its depth) once per this many submissions. */
const CHECK_EVERY = 256;
/** Above this many queued jobs the host waits: bounds the memory pinned by pending work. */
const MAX_PENDING = 2048;

/** A cpu allocation; `host` waits for pending stream work on it, `raw` (stream submission only) does not. */
export class CpuBuffer implements DeviceBuffer {
  freed = false;
  constructor(readonly raw: ArrayBuffer, private readonly stream: CpuStream) {}
  get host(): ArrayBuffer {
    this.stream.beforeHostAccess(this.raw);
    return this.raw;
  }
  get byteLength(): number {
    return this.raw.byteLength;
  }
}

/** Memory of a view without waiting on the stream (for arrays handed to stream jobs). */
export function rawOf(buffer: DeviceBuffer): ArrayBuffer {
  if (buffer instanceof CpuBuffer) return buffer.raw;
  const host = buffer.host;
  if (!host) throw new Error("buffer is not host-visible");
  return host;
}

export class CpuStream {
  private readonly touched = new Set<ArrayBuffer>();
  private readonly written = new Set<ArrayBuffer>();
  private sinceCheck = 0;

  constructor(private readonly native: NativeKernels) {}

  /** Whether any of the views' buffers is used by a pending job. */
  touches(views: readonly BufferView[]): boolean {
    if (this.touched.size === 0) return false;
    for (const v of views) if (this.touched.has(rawOf(v.buffer))) return true;
    return false;
  }

  /** Before the host reads index data of these views (bounds checks): wait if a pending job writes them. */
  awaitWrites(views: readonly BufferView[]): void {
    if (this.written.size === 0) return;
    for (const v of views) {
      if (this.written.has(rawOf(v.buffer))) {
        this.drain();
        return;
      }
    }
  }

  /** Before a blocking (debug-mode) call: finish everything this back end enqueued. */
  drainIfTracked(): void {
    if (this.touched.size > 0) this.drain();
  }

  beforeHostAccess(raw: ArrayBuffer): void {
    if (this.touched.has(raw)) this.drain();
  }

  /** Records a job just enqueued: its inputs and outputs stay pinned until the stream is seen empty. */
  track(reads: readonly BufferView[], writes: readonly BufferView[]): void {
    for (const v of reads) this.touched.add(rawOf(v.buffer));
    for (const v of writes) {
      const raw = rawOf(v.buffer);
      this.touched.add(raw);
      this.written.add(raw);
    }
    if (++this.sinceCheck < CHECK_EVERY) return;
    this.sinceCheck = 0;
    const pending = this.native.streamPending();
    if (pending === 0) this.clear();
    else if (pending > MAX_PENDING) this.drain();
  }

  /** Blocks the JS thread until the stream is empty; rethrows a kernel error recorded on it. */
  drain(): void {
    try {
      this.native.streamSync();
    } finally {
      this.clear();
    }
  }

  /** Resolves when everything enqueued so far has run. */
  async synchronize(): Promise<void> {
    if (this.touched.size === 0 && this.native.streamPending() === 0) return;
    try {
      await this.native.streamSyncAsync();
    } finally {
      if (this.native.streamPending() === 0) this.clear();
    }
  }

  private clear(): void {
    this.touched.clear();
    this.written.clear();
    this.sinceCheck = 0;
  }
}
