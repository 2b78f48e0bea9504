// The reference back end: host memory and the float64 TS kernels. Synchronous, so its stream is trivially in order.
import type { Backend, DeviceBuffer, KernelCall } from "../backend.js";
import { HostBuffer, hostOf } from "./host-memory.js";
import { runReference } from "./reference-kernels.js";

/**
 * Buffers below this size are not recycled: no memory to gain, and 1-byte allocations are host-memory probes
 * that read `.host`, which throws for memory a capture's kernels use.
 */
const POOL_MIN_BYTES = 64;

interface PrivatePool {
  /** Buffers allocated while the pool is open and not yet freed, with their memory. */
  readonly owned: WeakMap<DeviceBuffer, ArrayBuffer>;
  /** Memory freed from those, by byte size (exact: DeviceBuffer.byteLength is the memory's length). */
  readonly free: Map<number, ArrayBuffer[]>;
}

/**
 * Live memory findable by its number (memoryOfNumber, for step-graph replays): past this many entries the dead ones
 * are dropped, and if fewer than half go, later memory is not findable (a replay pointing into it misfits and the
 * caller traces instead). Loading a model numbers a few hundred to a few thousand buffers.
 */
const MAX_FINDABLE = 1 << 16;

/** Host allocation bookkeeping shared by host back ends. */
export class HostAllocator {
  private live = 0;
  private bytes = 0;
  private peak = 0;
  private pool: PrivatePool | null = null;
  /** Every host memory this allocator creates or adopts gets the next number (its allocation order). */
  private nextNumber = 0;
  private readonly numberOf = new WeakMap<ArrayBuffer, number>();
  /** Filled from the first mark() on (a process that never records or replays keeps no WeakRefs). */
  private readonly byNumber = new Map<number, WeakRef<ArrayBuffer>>();
  private findable = false;

  /** `wrap` lets a back end hand out its own buffer type over the ArrayBuffer (the cpu stream's guard). */
  constructor(private readonly wrap: (memory: ArrayBuffer) => DeviceBuffer & { freed: boolean } = (m) => new HostBuffer(m)) {}

  allocate(byteLength: number): DeviceBuffer {
    this.live++;
    this.bytes += byteLength;
    if (this.bytes > this.peak) this.peak = this.bytes;
    const pool = this.pool;
    if (!pool) return this.wrap(this.numbered(new ArrayBuffer(byteLength)));
    const memory = pool.free.get(byteLength)?.pop() ?? this.numbered(new ArrayBuffer(byteLength));
    const buffer = this.wrap(memory); // a fresh wrapper: a stale handle to the previous owner stays freed
    pool.owned.set(buffer, memory);
    return buffer;
  }

  /** Takes host memory someone else allocated (a memory-mapped file) as a buffer, counted like allocate()'s. */
  adopt(memory: ArrayBuffer): DeviceBuffer {
    this.live++;
    this.bytes += memory.byteLength;
    if (this.bytes > this.peak) this.peak = this.bytes;
    return this.wrap(this.numbered(memory));
  }

  private numbered(memory: ArrayBuffer): ArrayBuffer {
    const n = this.nextNumber++;
    this.numberOf.set(memory, n); // every allocator memory has a number: a recording never mistakes it for a private array
    if (!this.findable) return memory;
    if (this.byNumber.size >= MAX_FINDABLE) {
      this.pruneFindable();
      // mostly live: stop here rather than rescan on every allocation
      if (this.byNumber.size >= MAX_FINDABLE / 2) this.findable = false;
    }
    if (this.findable) this.byNumber.set(n, new WeakRef(memory));
    return memory;
  }

  /**
   * The allocation number the next memory gets. A process that repeats the same allocations after taking a
   * mark (loading the same model the same way) gives each the same number relative to it: this is how a
   * cached step-graph recording finds the weights and caches it points into (see CpuBackend.replayCapture).
   */
  mark(): number {
    this.pruneFindable();
    this.findable = this.byNumber.size < MAX_FINDABLE / 2;
    return this.nextNumber;
  }

  private pruneFindable(): void {
    for (const [k, ref] of this.byNumber) if (ref.deref() === undefined) this.byNumber.delete(k);
  }

  /** `memory` replaces `old` (a buffer's memory moved, see CpuBackend.moveToHugePages): it takes old's number. */
  renumber(old: ArrayBuffer, memory: ArrayBuffer): void {
    const n = this.numberOf.get(old);
    if (n === undefined) return;
    this.numberOf.delete(old);
    this.numberOf.set(memory, n);
    if (this.byNumber.has(n)) this.byNumber.set(n, new WeakRef(memory));
  }

  /** The allocation number of host memory this allocator made or adopted, if numbered and alive. */
  numberOfMemory(memory: ArrayBuffer): number | undefined {
    return this.numberOf.get(memory);
  }

  /** The live memory with this allocation number, if any. */
  memoryOfNumber(n: number): ArrayBuffer | undefined {
    const m = this.byNumber.get(n)?.deref();
    if (m === undefined) this.byNumber.delete(n);
    return m;
  }

  free(buffer: DeviceBuffer): void {
    const b = buffer as DeviceBuffer & { freed: boolean };
    if (b.freed) return;
    b.freed = true;
    this.live--;
    this.bytes -= b.byteLength;
    const pool = this.pool;
    const memory = pool?.owned.get(b);
    if (!pool || memory === undefined) return;
    pool.owned.delete(b);
    if (memory.byteLength < POOL_MIN_BYTES) return;
    const list = pool.free.get(memory.byteLength);
    if (list) list.push(memory);
    else pool.free.set(memory.byteLength, [memory]);
  }

  /**
   * Opens a private pool (CUDA graphs' private memory pool): until closePool(), memory freed from buffers
   * allocated since openPool() is handed out again by allocate() of the same byte size. Only for a caller
   * whose every use of the memory is ordered behind the previous owner's (a step-graph capture: replays run
   * the recorded jobs in capture order on an in-order stream). Buffers from before, or live at close, never
   * enter it.
   */
  openPool(): void {
    if (this.pool) throw new Error("a private memory pool is already open");
    this.pool = { owned: new WeakMap(), free: new Map() };
  }

  /** Closes the pool: its free memory is dropped (whoever recorded jobs on it keeps it alive). */
  closePool(): void {
    this.pool = null;
  }

  /** fn with a pool open (see Backend.withMemoryPool); inside an open one, fn alone. */
  withPool<T>(fn: () => T): T {
    if (this.pool) return fn();
    this.openPool();
    try {
      return fn();
    } finally {
      this.closePool();
    }
  }

  write(buffer: DeviceBuffer, byteOffset: number, src: Uint8Array): void {
    new Uint8Array(hostOf(buffer), byteOffset, src.byteLength).set(src);
  }

  read(buffer: DeviceBuffer, byteOffset: number, byteLength: number): Uint8Array {
    return new Uint8Array(hostOf(buffer).slice(byteOffset, byteOffset + byteLength));
  }

  liveBuffers(): number {
    return this.live;
  }

  liveBytes(): number {
    return this.bytes;
  }

  /** The most bytes live at once since creation or the last resetPeakBytes(). */
  peakBytes(): number {
    return this.peak;
  }

  /** Starts a new peak from the bytes live now. */
  resetPeakBytes(): void {
    this.peak = this.bytes;
  }
}

export class ReferenceBackend implements Backend {
  readonly name: string = "reference";
  protected readonly memory = new HostAllocator();

  describe(): string {
    return "reference (pure TypeScript, float64 math)";
  }
  allocate(byteLength: number): DeviceBuffer {
    return this.memory.allocate(byteLength);
  }
  free(buffer: DeviceBuffer): void {
    this.memory.free(buffer);
  }
  write(buffer: DeviceBuffer, byteOffset: number, src: Uint8Array): void {
    this.memory.write(buffer, byteOffset, src);
  }
  read(buffer: DeviceBuffer, byteOffset: number, byteLength: number): Uint8Array {
    return this.memory.read(buffer, byteOffset, byteLength);
  }
  run(call: KernelCall): void {
    runReference(call);
  }
  synchronize(): Promise<void> {
    return Promise.resolve();
  }
  liveBuffers(): number {
    return this.memory.liveBuffers();
  }
  liveBytes(): number {
    return this.memory.liveBytes();
  }
  peakBytes(): number {
    return this.memory.peakBytes();
  }
  resetPeakBytes(): void {
    this.memory.resetPeakBytes();
  }
}
