// The KV block pool (vLLM v1 core/block_pool.py): fixed blocks with ref counts, an LRU free queue and the
// prefix-cache map blockHash -> block. Block 0 is reserved as the null block (as in vLLM): it is never handed
// out, so runners can pad block tables with 0. Usable blocks are 1..numBlocks-1. With KV-cache events on, the pool
// records every hash it enters (BlockStored), drops (BlockRemoved) and clears (AllBlocksCleared), in order.
import type { BlockStored, KvCacheEvent } from "./kv-events.js";

/** A block hash: hex of a sha256 over (parent hash, token ids, extra keys); see kv-cache-manager.ts. */
export type BlockHash = string;

/** The medium KV-cache events name (vLLM's name for the engine's device KV cache). */
export const KV_MEDIUM = "GPU";

/** One KV block. `prev`/`next` link it into the free queue while it is free (refCnt 0). */
export class KvCacheBlock {
  refCnt = 0;
  /** Set while the block is a full, cached block of some token chain; dropped on eviction. */
  blockHash: BlockHash | null = null;
  prev: KvCacheBlock | null = null;
  next: KvCacheBlock | null = null;
  constructor(
    readonly blockId: number,
    readonly isNull = false,
  ) {}
}

/**
 * Doubly linked list of free blocks in eviction order: the head is evicted first (LRU), freed blocks are
 * appended at the tail. O(1) popleft, append and remove from the middle (a prefix-cache hit revives a block).
 */
export class FreeBlockQueue {
  private readonly head = new KvCacheBlock(-1);
  private readonly tail = new KvCacheBlock(-1);
  size = 0;

  constructor(blocks: KvCacheBlock[]) {
    this.head.next = this.tail;
    this.tail.prev = this.head;
    for (const b of blocks) this.append(b);
  }

  popLeft(): KvCacheBlock {
    const b = this.head.next!;
    if (b === this.tail) throw new Error("[block-pool] no free blocks");
    this.remove(b);
    return b;
  }

  remove(b: KvCacheBlock): void {
    if (b.prev === null || b.next === null) throw new Error(`[block-pool] block ${b.blockId} is not in the free queue`);
    b.prev.next = b.next;
    b.next.prev = b.prev;
    b.prev = b.next = null;
    this.size--;
  }

  append(b: KvCacheBlock): void {
    const last = this.tail.prev!;
    last.next = b;
    b.prev = last;
    b.next = this.tail;
    this.tail.prev = b;
    this.size++;
  }

  /** Block ids head (next evicted) to tail; for tests and debugging. */
  blockIds(): number[] {
    const ids: number[] = [];
    for (let b = this.head.next!; b !== this.tail; b = b.next!) ids.push(b.blockId);
    return ids;
  }
}

/** Counters of the pool, cumulative since construction. */
export interface BlockPoolCounters {
  allocated: number; // fresh blocks handed out
  evicted: number; // cached blocks whose hash was dropped to reuse them
  revived: number; // cached free blocks taken back by a prefix-cache hit
}

/**
 * Owns every block. Invariants: a block is in the free queue iff refCnt == 0 (null block excepted);
 * `cached.get(h).blockHash === h`; a cached block keeps its hash while free until it is reallocated.
 */
export class BlockPool {
  readonly blocks: KvCacheBlock[];
  readonly nullBlock: KvCacheBlock;
  readonly freeQueue: FreeBlockQueue;
  private readonly cached = new Map<BlockHash, KvCacheBlock>();
  readonly counters: BlockPoolCounters = { allocated: 0, evicted: 0, revived: 0 };
  /** KV-cache events since the last takeEvents(), or null when events are off. */
  private events: KvCacheEvent[] | null;

  /**
   * @param numBlocks total blocks including the reserved null block 0 (so numBlocks-1 are usable).
   * @param enableCaching keep a hash -> block map for prefix caching.
   * @param enableEvents record KV-cache events (vLLM's enable_kv_cache_events) for takeEvents().
   */
  constructor(
    readonly numBlocks: number,
    readonly enableCaching: boolean,
    enableEvents = false,
  ) {
    this.events = enableEvents && enableCaching ? [] : null;
    if (!Number.isInteger(numBlocks) || numBlocks < 2) throw new Error(`[block-pool] numBlocks must be an integer >= 2, got ${numBlocks}`);
    this.blocks = Array.from({ length: numBlocks }, (_, i) => new KvCacheBlock(i, i === 0));
    this.nullBlock = this.blocks[0]!;
    this.freeQueue = new FreeBlockQueue(this.blocks.slice(1));
  }

  /** Usable blocks (excludes the null block). */
  get numUsableBlocks(): number {
    return this.numBlocks - 1;
  }

  get numFreeBlocks(): number {
    return this.freeQueue.size;
  }

  /** Fraction of usable blocks held by requests, in [0, 1]. */
  get usage(): number {
    return 1 - this.freeQueue.size / this.numUsableBlocks;
  }

  /** The cached block for a hash, or null. Does not touch ref counts. */
  getCachedBlock(hash: BlockHash): KvCacheBlock | null {
    return this.cached.get(hash) ?? null;
  }

  /** Takes `n` blocks from the head of the free queue (LRU first), evicting their hashes. refCnt becomes 1. */
  getNewBlocks(n: number): KvCacheBlock[] {
    if (n > this.freeQueue.size) throw new Error(`[block-pool] cannot get ${n} blocks, only ${this.freeQueue.size} free`);
    const out: KvCacheBlock[] = [];
    const removed: BlockHash[] = [];
    for (let i = 0; i < n; i++) {
      const b = this.freeQueue.popLeft();
      const h = this.evict(b);
      if (h !== null) removed.push(h);
      b.refCnt = 1;
      out.push(b);
    }
    this.counters.allocated += n;
    // one event per allocation, hashes in eviction order (vLLM sends one per block)
    if (this.events !== null && removed.length > 0) this.events.push({ type: "BlockRemoved", block_hashes: removed, medium: KV_MEDIUM });
    return out;
  }

  /** Drops the block's hash; returns it when it was the cached entry of that hash (it left the prefix cache). */
  private evict(b: KvCacheBlock): BlockHash | null {
    const h = b.blockHash;
    if (h === null) return null;
    b.blockHash = null;
    this.counters.evicted++;
    if (this.cached.get(h) !== b) return null;
    this.cached.delete(h);
    return h;
  }

  /** Drops the blocks' hashes from the prefix cache (their K/V was never written): one BlockRemoved for them. */
  uncacheBlocks(blocks: readonly KvCacheBlock[]): void {
    const removed: BlockHash[] = [];
    for (const b of blocks) {
      const h = b.blockHash;
      if (h === null) continue;
      b.blockHash = null;
      if (this.cached.get(h) !== b) continue;
      this.cached.delete(h);
      removed.push(h);
    }
    if (this.events !== null && removed.length > 0) this.events.push({ type: "BlockRemoved", block_hashes: removed, medium: KV_MEDIUM });
  }

  /** Takes a reference on prefix-cache hits; a free cached block leaves the free queue (revived). */
  touch(blocks: readonly KvCacheBlock[]): void {
    for (const b of blocks) {
      if (b.refCnt === 0 && !b.isNull) {
        this.freeQueue.remove(b);
        this.counters.revived++;
      }
      b.refCnt++;
    }
  }

  /**
   * Drops one reference per block, in the given order; blocks reaching 0 go to the free-queue tail.
   * Callers pass a request's blocks in reverse so its tail blocks are evicted before its prefix.
   */
  freeBlocks(orderedBlocks: readonly KvCacheBlock[]): void {
    for (const b of orderedBlocks) {
      if (b.refCnt <= 0) throw new Error(`[block-pool] double free of block ${b.blockId}`);
      b.refCnt--;
      if (b.refCnt === 0 && !b.isNull) this.freeQueue.append(b);
    }
  }

  /**
   * Marks `blocks[i]` as holding the chain hash `hashes[i]` for i in [from, to). A hash already cached by
   * another block is left alone (the duplicate block stays uncached and is simply freed later). With events on,
   * each run of newly cached consecutive blocks is one BlockStored; `source` gives their tokens (the chain's
   * tokens from index 0) and LoRA id.
   */
  cacheFullBlocks(
    blocks: readonly KvCacheBlock[],
    hashes: readonly BlockHash[],
    from: number,
    to: number,
    source?: { tokenIds: readonly number[]; blockSize: number; loraId: number | null },
  ): void {
    if (!this.enableCaching) return;
    let run: BlockStored | null = null;
    for (let i = from; i < to; i++) {
      const b = blocks[i]!;
      const h = hashes[i];
      if (h === undefined) throw new Error(`[block-pool] missing hash for block index ${i}`);
      if (b.blockHash !== null || this.cached.has(h)) {
        run = null; // a prefix hit (already cached under this chain) or a duplicate: ends the run
        continue;
      }
      b.blockHash = h;
      this.cached.set(h, b);
      if (this.events === null || source === undefined) continue;
      const bs = source.blockSize;
      if (run === null) {
        run = { type: "BlockStored", block_hashes: [], parent_block_hash: i === 0 ? null : hashes[i - 1]!, token_ids: [], block_size: bs, lora_id: source.loraId, medium: KV_MEDIUM };
        this.events.push(run);
      }
      run.block_hashes.push(h);
      for (let t = i * bs; t < (i + 1) * bs; t++) run.token_ids.push(source.tokenIds[t]!);
    }
  }

  /** The KV-cache events recorded since the last call, oldest first ([] when events are off). */
  takeEvents(): KvCacheEvent[] {
    if (this.events === null || this.events.length === 0) return [];
    const out = this.events;
    this.events = [];
    return out;
  }

  /** Number of cached hashes (free or in use). */
  get numCachedBlocks(): number {
    return this.cached.size;
  }

  /**
   * Drops the prefix cache (vLLM's reset_prefix_cache): every free (ref count 0) block loses its hash, so no later
   * request hits it. With no block in use that is the whole cache: one AllBlocksCleared event, and true. Blocks that
   * requests hold keep theirs (their K/V is still being read; vLLM refuses the whole reset then): one BlockRemoved
   * for the hashes dropped, and false.
   */
  resetPrefixCache(): boolean {
    if (this.freeQueue.size === this.numUsableBlocks) {
      for (const b of this.cached.values()) b.blockHash = null;
      this.cached.clear();
      this.events?.push({ type: "AllBlocksCleared" });
      return true;
    }
    const removed: BlockHash[] = [];
    for (const [h, b] of this.cached) {
      if (b.refCnt !== 0) continue;
      b.blockHash = null;
      this.cached.delete(h); // deleting the entry being visited is safe in a Map iteration
      removed.push(h);
    }
    if (this.events !== null && removed.length > 0) this.events.push({ type: "BlockRemoved", block_hashes: removed, medium: KV_MEDIUM });
    return false;
  }
}
