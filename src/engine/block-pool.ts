// The KV block pool (vLLM v1 core/block_pool.py): fixed blocks with ref counts, an LRU free queue and the
// prefix-cache map blockHash -> block. Block 0 is reserved as the null block (as in vLLM): it is never handed
// out, so runners can pad block tables with 0. Usable blocks are 1..numBlocks-1.

/** A block hash: hex of a sha256 over (parent hash, token ids, extra keys); see kv-cache-manager.ts. */
export type BlockHash = string;

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

  /**
   * @param numBlocks total blocks including the reserved null block 0 (so numBlocks-1 are usable).
   * @param enableCaching keep a hash -> block map for prefix caching.
   */
  constructor(
    readonly numBlocks: number,
    readonly enableCaching: boolean,
  ) {
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
    for (let i = 0; i < n; i++) {
      const b = this.freeQueue.popLeft();
      this.evict(b);
      b.refCnt = 1;
      out.push(b);
    }
    this.counters.allocated += n;
    return out;
  }

  private evict(b: KvCacheBlock): void {
    if (b.blockHash === null) return;
    if (this.cached.get(b.blockHash) === b) this.cached.delete(b.blockHash);
    b.blockHash = null;
    this.counters.evicted++;
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
   * another block is left alone (the duplicate block stays uncached and is simply freed later).
   */
  cacheFullBlocks(blocks: readonly KvCacheBlock[], hashes: readonly BlockHash[], from: number, to: number): void {
    if (!this.enableCaching) return;
    for (let i = from; i < to; i++) {
      const b = blocks[i]!;
      const h = hashes[i];
      if (h === undefined) throw new Error(`[block-pool] missing hash for block index ${i}`);
      if (b.blockHash !== null) continue; // a prefix hit: already cached under this chain
      if (this.cached.has(h)) continue;
      b.blockHash = h;
      this.cached.set(h, b);
    }
  }

  /** Number of cached hashes (free or in use). */
  get numCachedBlocks(): number {
    return this.cached.size;
  }

  /** Drops every cached hash; only allowed when no block is in use (as vLLM's reset_prefix_cache). */
  resetPrefixCache(): boolean {
    if (this.freeQueue.size !== this.numUsableBlocks) return false;
    for (const b of this.cached.values()) b.blockHash = null;
    this.cached.clear();
    return true;
  }
}
