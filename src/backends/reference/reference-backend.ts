// The reference back end: host memory and the float64 TS kernels. Synchronous, so its stream is trivially in order.
import type { AllocateOptions, Backend, DeviceBuffer, KernelCall } from "../backend.js";
import { HostBuffer, hostOf } from "./host-memory.js";
import { runReference } from "./reference-kernels.js";
import { totalmem } from "node:os";
import { env } from "../../util/env.js";

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

/**
 * Default cap of the freed-memory cache (KILN_HOST_CACHE_BYTES overrides it; 0 disables the cache): an eighth of the
 * machine's memory. The debug-model training step at the recipe's 8 x 2048 tokens re-allocates all of its ~7 GiB per
 * step from the cache under a 2.9 GiB cap (24 GiB machine); under 1 GiB it missed 1.8 GiB a step.
 */
const defaultCacheBytes = (): number => Math.floor(totalmem() / 8);

/** A buffer type over host memory: `raw` is the memory without waiting on any stream. */
export type HostWrapped = DeviceBuffer & { freed: boolean; readonly raw: ArrayBuffer };

export interface HostAllocatorOptions {
  /** Hands out the back end's buffer type over the memory (the cpu stream's guard). */
  wrap?: (memory: ArrayBuffer) => HostWrapped;
  /** Whether queued work (a pending cpu stream job) still reads or writes the memory: the host must not zero it now. */
  inUse?: (memory: ArrayBuffer) => boolean;
  /**
   * Zeroes memory that queued jobs use, ordered behind them (a fill enqueued on the cpu stream); false when it
   * cannot (then the cache hands out other memory). Absent: such memory is not handed out zeroed.
   */
  zeroLater?: (memory: ArrayBuffer) => boolean;
  /** Whether freed memory may be handed out again (not when a step graph's jobs point into it). */
  reusable?: (memory: ArrayBuffer) => boolean;
  /** Bytes the freed-memory cache holds at most (default KILN_HOST_CACHE_BYTES, else an eighth of memory; 0: no cache). */
  cacheBytes?: number;
}

/**
 * Host allocation bookkeeping shared by host back ends, with a caching allocator (PyTorch's CUDA caching
 * allocator, on host memory): freed memory is kept by exact byte size and handed out again by allocate(), which
 * saves the kernel's page faults and zero-filling of fresh pages. Exact sizes, because a buffer's byteLength is
 * its memory's (views, rehome, recordings rely on it).
 *
 * Invariants: cached memory is owned by no buffer, counted in `cached` and not in `bytes`, unnumbered (it gets
 * the next allocation number when handed out, so numbering follows allocation order with or without the cache),
 * and `reusable` (never memory a step graph points into); it is handed out zeroed unless the caller opted out,
 * by the host only when no queued job uses it, else by a fill ordered behind those jobs (zeroLater). While a
 * private pool is open nothing enters the cache.
 */
export class HostAllocator {
  private live = 0;
  private bytes = 0;
  private peak = 0;
  private pool: PrivatePool | null = null;
  private readonly wrap: (memory: ArrayBuffer) => HostWrapped;
  private readonly inUse: (memory: ArrayBuffer) => boolean;
  private readonly reusable: (memory: ArrayBuffer) => boolean;
  private readonly zeroLater: (memory: ArrayBuffer) => boolean;
  private readonly cacheCap: number;
  /** Freed memory by byte size, least recently freed first. */
  private readonly cache = new Map<number, ArrayBuffer[]>();
  /** Every cached memory, least recently freed first (Map iteration order), for eviction. */
  private readonly cacheOrder = new Set<ArrayBuffer>();
  private cached = 0;
  private reservedPeak = 0;
  /** Memory adopted from elsewhere (mapped files): never cached. */
  private readonly adopted = new WeakSet<ArrayBuffer>();
  /** Every host memory this allocator creates or adopts gets the next number (its allocation order). */
  private nextNumber = 0;
  private readonly numberOf = new WeakMap<ArrayBuffer, number>();
  /** Filled from the first mark() on (a process that never records or replays keeps no WeakRefs). */
  private readonly byNumber = new Map<number, WeakRef<ArrayBuffer>>();
  private findable = false;

  constructor(options: HostAllocatorOptions = {}) {
    this.wrap = options.wrap ?? ((m) => new HostBuffer(m));
    this.inUse = options.inUse ?? (() => false);
    this.reusable = options.reusable ?? (() => true);
    this.zeroLater = options.zeroLater ?? (() => false);
    this.cacheCap = Math.max(0, options.cacheBytes ?? env.hostCacheBytes ?? defaultCacheBytes());
  }

  allocate(byteLength: number, options?: AllocateOptions): DeviceBuffer {
    this.live++;
    this.bytes += byteLength;
    if (this.bytes > this.peak) this.peak = this.bytes;
    const pool = this.pool;
    // a pool's memory is not zeroed: replays rewrite it anyway, and nothing ran on it during the capture
    const memory = pool?.free.get(byteLength)?.pop() ?? this.fromCache(byteLength, options?.uninitialized === true) ?? this.numbered(new ArrayBuffer(byteLength));
    if (this.bytes + this.cached > this.reservedPeak) this.reservedPeak = this.bytes + this.cached;
    const buffer = this.wrap(memory); // a fresh wrapper: a stale handle to the previous owner stays freed
    if (pool) pool.owned.set(buffer, memory);
    return buffer;
  }

  /**
   * Cached memory of this size, numbered as a new allocation, or undefined: the most recently freed that no queued
   * job uses, zeroed now unless `uninitialized`; if queued jobs use them all, the most recent, zeroed behind those
   * jobs (zeroLater). Memory queued jobs use is safe to hand out: whatever its next owner enqueues runs after them
   * on the in-order stream, and host access (CpuBuffer.host) waits for them; it is only the second choice because
   * a host kernel writing it would have to wait.
   */
  private fromCache(byteLength: number, uninitialized: boolean): ArrayBuffer | undefined {
    const list = this.cache.get(byteLength);
    if (list === undefined) return undefined;
    let i = list.length - 1;
    while (i >= 0 && this.inUse(list[i]!)) i--;
    const busy = i < 0;
    if (busy) i = list.length - 1;
    const memory = list[i]!;
    if (busy && !uninitialized && !this.zeroLater(memory)) return undefined;
    if (i === list.length - 1) list.pop();
    else list.splice(i, 1);
    if (list.length === 0) this.cache.delete(byteLength);
    this.cacheOrder.delete(memory);
    this.cached -= byteLength;
    if (!uninitialized && !busy) new Uint8Array(memory).fill(0);
    return this.numbered(memory);
  }

  /** Keeps freed memory for reuse, evicting the least recently freed past the cap. */
  private toCache(memory: ArrayBuffer): void {
    const n = memory.byteLength;
    if (n < POOL_MIN_BYTES || n > this.cacheCap || this.adopted.has(memory) || !this.reusable(memory)) return;
    this.unnumber(memory);
    const list = this.cache.get(n);
    if (list) list.push(memory);
    else this.cache.set(n, [memory]);
    this.cacheOrder.add(memory);
    this.cached += n;
    while (this.cached > this.cacheCap) this.evictOldest();
  }

  private evictOldest(): void {
    const memory = this.cacheOrder.values().next().value as ArrayBuffer;
    this.cacheOrder.delete(memory);
    const n = memory.byteLength;
    const list = this.cache.get(n)!;
    // the least recently freed overall is the least recently freed of its size: the list's first
    list.shift();
    if (list.length === 0) this.cache.delete(n);
    this.cached -= n;
  }

  /** Drops the cached memory (torch.cuda.empty_cache); it goes back to the system when collected. */
  emptyCache(): void {
    this.cache.clear();
    this.cacheOrder.clear();
    this.cached = 0;
  }

  /** Bytes of freed memory held for reuse. */
  cachedBytes(): number {
    return this.cached;
  }

  /** Live plus cached bytes (torch.cuda.memory_reserved). */
  reservedBytes(): number {
    return this.bytes + this.cached;
  }

  /** The most reserved bytes at once since creation or the last resetPeakBytes() (torch.cuda.max_memory_reserved). */
  peakReservedBytes(): number {
    return this.reservedPeak;
  }

  /** Takes host memory someone else allocated (a memory-mapped file) as a buffer, counted like allocate()'s. */
  adopt(memory: ArrayBuffer): DeviceBuffer {
    this.live++;
    this.bytes += memory.byteLength;
    if (this.bytes > this.peak) this.peak = this.bytes;
    if (this.bytes + this.cached > this.reservedPeak) this.reservedPeak = this.bytes + this.cached;
    this.adopted.add(memory);
    return this.wrap(this.numbered(memory));
  }

  private numbered(memory: ArrayBuffer): ArrayBuffer {
    this.unnumber(memory); // memory from the cache: its old number named the previous owner
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

  /** Forgets memory's number (it enters the cache: memoryOfNumber must not find it for a replay). */
  private unnumber(memory: ArrayBuffer): void {
    const n = this.numberOf.get(memory);
    if (n === undefined) return;
    this.numberOf.delete(memory);
    if (this.byNumber.get(n)?.deref() === memory) this.byNumber.delete(n);
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
    const b = buffer as HostWrapped;
    if (b.freed) return;
    b.freed = true;
    this.live--;
    this.bytes -= b.byteLength;
    const pool = this.pool;
    // while a pool is open (a capture) memory from before it may be a captured job's: it is not cached
    if (!pool) {
      if (b.raw instanceof ArrayBuffer) this.toCache(b.raw);
      return;
    }
    const memory = pool.owned.get(b);
    if (memory === undefined) return;
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

  /** Starts a new peak from the bytes live now (and the reserved peak from the bytes reserved now). */
  resetPeakBytes(): void {
    this.peak = this.bytes;
    this.reservedPeak = this.bytes + this.cached;
  }
}

/**
 * The Backend methods of a back end over host memory that its HostAllocator answers: allocation and the
 * torch.cuda-style memory statistics (cpu and reference share them).
 */
export abstract class HostMemoryBackend {
  protected abstract readonly memory: HostAllocator;

  allocate(byteLength: number, options?: AllocateOptions): DeviceBuffer {
    return this.memory.allocate(byteLength, options);
  }
  free(buffer: DeviceBuffer): void {
    this.memory.free(buffer);
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
  reservedBytes(): number {
    return this.memory.reservedBytes();
  }
  peakReservedBytes(): number {
    return this.memory.peakReservedBytes();
  }
  emptyCache(): void {
    this.memory.emptyCache();
  }
}

export class ReferenceBackend extends HostMemoryBackend implements Backend {
  readonly name: string = "reference";
  protected readonly memory = new HostAllocator();

  describe(): string {
    return "reference (pure TypeScript, float64 math)";
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
}
