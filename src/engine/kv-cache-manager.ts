// Per-request block tables over the BlockPool, and the prefix-cache lookups (vLLM v1 core/kv_cache_manager.py).
// Block hash chain: h_i = sha256(h_{i-1} || token ids of block i || extra keys), with the root parent a fixed
// constant so hashes are stable across processes (the router can match them). Extra keys: the LoRA id on
// every block, the cache salt on the first block only (it then propagates through the chain, as in vLLM), and the
// content hash of each image whose placeholder positions the block holds.
import { createHash } from "node:crypto";
import { BlockPool, type BlockHash, type KvCacheBlock } from "./block-pool.js";
import type { KvCacheEvent } from "./kv-events.js";
import type { Request } from "./request.js";

/** Parent hash of the first block of every chain. */
export const ROOT_BLOCK_HASH: BlockHash = createHash("sha256").update("kiln-kv-root").digest("hex");

/** Chain hash of one full block. `tokenIds` is exactly blockSize ids. */
export function hashBlockTokens(parent: BlockHash, tokenIds: readonly number[], extraKeys: string | null): BlockHash {
  const h = createHash("sha256");
  h.update(parent, "hex");
  const buf = Buffer.allocUnsafe(4 * tokenIds.length);
  for (let i = 0; i < tokenIds.length; i++) buf.writeInt32LE(tokenIds[i]!, 4 * i);
  h.update(buf);
  if (extraKeys !== null) h.update(extraKeys, "utf8");
  return h.digest("hex");
}

/**
 * The blocks the KV cache manager hands the scheduler: opaque on purpose (vLLM's KVCacheBlocks) so the
 * scheduler decides policy without touching ref counts or hashes.
 */
export class KvBlocks {
  /** @internal */
  constructor(readonly blocks: readonly KvCacheBlock[]) {}
  static readonly EMPTY = new KvBlocks([]);
  get length(): number {
    return this.blocks.length;
  }
  getBlockIds(): number[] {
    return this.blocks.map((b) => b.blockId);
  }
}

export interface KvCacheManagerConfig {
  /** Total blocks including the reserved null block 0. */
  numBlocks: number;
  blockSize: number;
  enablePrefixCaching: boolean;
  /** Record KV-cache events (BlockStored / BlockRemoved / AllBlocksCleared) for takeEvents(); default off. */
  enableKvEvents?: boolean;
}

/** Prefix-cache counters in tokens, cumulative. */
export interface PrefixCacheStats {
  queries: number;
  hits: number;
}

export class KvCacheManager {
  readonly pool: BlockPool;
  readonly blockSize: number;
  readonly enablePrefixCaching: boolean;
  private readonly reqBlocks = new Map<string, KvCacheBlock[]>();
  /** How many leading blocks of each request are already in the prefix-cache map. */
  private readonly numCachedBlocks = new Map<string, number>();
  readonly prefixCacheStats: PrefixCacheStats = { queries: 0, hits: 0 };

  constructor(config: KvCacheManagerConfig) {
    if (!Number.isInteger(config.blockSize) || config.blockSize < 1)
      throw new Error(`[kv-cache] blockSize must be >= 1, got ${config.blockSize}`);
    this.blockSize = config.blockSize;
    this.enablePrefixCaching = config.enablePrefixCaching;
    this.pool = new BlockPool(config.numBlocks, config.enablePrefixCaching, config.enableKvEvents ?? false);
  }

  /** Blocks a sequence of `numTokens` tokens needs. */
  blocksFor(numTokens: number): number {
    return Math.ceil(numTokens / this.blockSize);
  }

  get numFreeBlocks(): number {
    return this.pool.numFreeBlocks;
  }

  get usage(): number {
    return this.pool.usage;
  }

  /** Extends `request.blockHashes` to cover every full block of its known tokens. */
  updateBlockHashes(request: Request): void {
    if (!this.enablePrefixCaching) return;
    const bs = this.blockSize;
    const full = Math.floor(request.numTokens / bs);
    const hashes = request.blockHashes;
    for (let i = hashes.length; i < full; i++) {
      const parent = i === 0 ? ROOT_BLOCK_HASH : hashes[i - 1]!;
      const extra = extraKeysOf(request, i, bs);
      hashes.push(hashBlockTokens(parent, request.allTokenIds.slice(i * bs, (i + 1) * bs), extra));
    }
  }

  /**
   * The longest run of cached full blocks that prefixes the request (never all of it: the last known token
   * is always recomputed so the step yields logits). Requests asking for prompt logprobs skip the cache.
   * Counts nothing: the scheduler records the lookup it admits (recordPrefixCacheStats).
   */
  getComputedBlocks(request: Request): { blocks: KvBlocks; numComputedTokens: number } {
    if (!this.enablePrefixCaching || request.params.promptLogprobs !== null) return { blocks: KvBlocks.EMPTY, numComputedTokens: 0 };
    this.updateBlockHashes(request);
    const maxBlocks = Math.floor((request.numTokens - 1) / this.blockSize);
    const hit: KvCacheBlock[] = [];
    for (let i = 0; i < maxBlocks; i++) {
      const b = this.pool.getCachedBlock(request.blockHashes[i]!);
      if (b === null) break;
      hit.push(b);
    }
    return { blocks: new KvBlocks(hit), numComputedTokens: hit.length * this.blockSize };
  }

  /**
   * Counts an admitted request's lookup, in tokens, into `prefixCacheStats`, as vLLM records it: once, at admission
   * (a request waiting for blocks is looked up again each step), and for new requests only (a preempted request
   * reading back its own blocks goes to vLLM's preempted_* stats, not vllm:prefix_cache_queries/hits).
   */
  recordPrefixCacheStats(request: Request, numHits: number): void {
    if (!this.enablePrefixCaching || request.params.promptLogprobs !== null || request.numPreemptions > 0) return;
    this.prefixCacheStats.queries += request.numTokens;
    this.prefixCacheStats.hits += numHits;
  }

  /**
   * Makes room for `numNewTokens` more tokens of `request` after its computed ones (plus `computed`, a prefix
   * hit from getComputedBlocks for a request being scheduled from waiting). Returns the newly allocated
   * blocks, or null (touching nothing) when the pool cannot fit them. Full blocks that this step completes
   * are entered in the prefix cache now, as vLLM does: their KV is written by this step's forward pass.
   */
  allocateSlots(request: Request, numNewTokens: number, computed: KvBlocks = KvBlocks.EMPTY, numNewComputedTokens = 0): KvBlocks | null {
    if (numNewTokens <= 0) throw new Error(`[kv-cache] numNewTokens must be > 0, got ${numNewTokens}`);
    const blocks = this.reqBlocks.get(request.requestId) ?? [];
    const numComputed = request.numComputedTokens + numNewComputedTokens;
    const needed = this.blocksFor(numComputed + numNewTokens);
    const numNew = Math.max(0, needed - blocks.length - computed.length);
    // Hit blocks with refCnt 0 sit in the free queue: touching them takes them out of it.
    let revivable = 0;
    for (const b of computed.blocks) if (b.refCnt === 0) revivable++;
    if (numNew > this.pool.numFreeBlocks - revivable) return null;

    if (computed.length > 0) {
      this.pool.touch(computed.blocks);
      for (const b of computed.blocks) blocks.push(b);
      this.numCachedBlocks.set(request.requestId, blocks.length);
    }
    const fresh = this.pool.getNewBlocks(numNew);
    for (const b of fresh) blocks.push(b);
    this.reqBlocks.set(request.requestId, blocks);

    if (this.enablePrefixCaching) {
      const numFull = Math.floor(Math.min(numComputed + numNewTokens, request.numTokens) / this.blockSize);
      const from = this.numCachedBlocks.get(request.requestId) ?? 0;
      if (numFull > from) {
        this.updateBlockHashes(request);
        const source = { tokenIds: request.allTokenIds, blockSize: this.blockSize, loraId: request.lora?.id ?? null };
        this.pool.cacheFullBlocks(blocks, request.blockHashes, from, numFull, source);
        this.numCachedBlocks.set(request.requestId, numFull);
      }
    }
    return new KvBlocks(fresh);
  }

  /**
   * Releases the request's blocks, tail first, so its last blocks are evicted before its prefix. Full blocks entered
   * in the prefix cache past its computed tokens (a request preempted in the schedule() that allocated them, before
   * any step wrote their K/V) leave the cache first: a later hit would read K/V nobody computed.
   */
  free(request: Request): void {
    const blocks = this.reqBlocks.get(request.requestId);
    const numCached = this.numCachedBlocks.get(request.requestId) ?? 0;
    this.reqBlocks.delete(request.requestId);
    this.numCachedBlocks.delete(request.requestId);
    if (blocks === undefined) return;
    const numComputedBlocks = Math.floor(request.numComputedTokens / this.blockSize);
    if (numCached > numComputedBlocks) this.pool.uncacheBlocks(blocks.slice(numComputedBlocks, numCached));
    this.pool.freeBlocks([...blocks].reverse());
  }

  /** The request's block table (block ids in sequence order); [] when it holds none. */
  getBlockIds(requestId: string): number[] {
    return (this.reqBlocks.get(requestId) ?? []).map((b) => b.blockId);
  }

  /** The block pool's KV-cache events since the last call (see kv-events.ts). */
  takeEvents(): KvCacheEvent[] {
    return this.pool.takeEvents();
  }

  /** Drops the prefix cache: the hashes of every block no request holds; true when that was all of it (BlockPool.resetPrefixCache). */
  resetPrefixCache(): boolean {
    return this.pool.resetPrefixCache();
  }
}

/** What a block's hash reads of its request besides the token ids. */
type HashedRequest = Pick<Request, "lora" | "cacheSalt"> & { mmFeatures?: readonly Pick<Request["mmFeatures"][number], "hash" | "offset" | "length">[] };

function extraKeysOf(request: HashedRequest, blockIndex: number, blockSize: number): string | null {
  const parts: string[] = [];
  // the images whose positions the block holds, by content (vLLM's mm_hash): the same placeholder tokens of two
  // different images never share K/V
  const from = blockIndex * blockSize, to = from + blockSize;
  for (const f of request.mmFeatures ?? []) if (f.offset < to && f.offset + f.length > from) parts.push(`mm:${f.hash}`);
  // id, name and path (vLLM hashes the name): an id reused for another adapter, or an adapter reloaded in place
  // under a new id, never reads blocks another adapter's weights computed
  const lora = request.lora;
  if (lora !== null) parts.push(`lora:${lora.id}\u0000${lora.name}\u0000${lora.path}`);
  if (blockIndex === 0 && request.cacheSalt !== null) parts.push(`salt:${request.cacheSalt}`);
  return parts.length === 0 ? null : parts.join("\u0000");
}

/**
 * The chain hashes of every full block of `tokenIds`, exactly as the engine computes them for a request with that
 * prompt, cache salt and adapter (a router matches them against the engines' KV-cache events).
 * @example chainBlockHashes(promptIds, 16) // one hash per 16 tokens, the partial tail block left out
 */
export function chainBlockHashes(
  tokenIds: readonly number[],
  blockSize: number,
  extra: HashedRequest = { lora: null, cacheSalt: null },
): BlockHash[] {
  const out: BlockHash[] = [];
  for (let i = 0; (i + 1) * blockSize <= tokenIds.length; i++)
    out.push(hashBlockTokens(i === 0 ? ROOT_BLOCK_HASH : out[i - 1]!, tokenIds.slice(i * blockSize, (i + 1) * blockSize), extraKeysOf(extra, i, blockSize)));
  return out;
}
