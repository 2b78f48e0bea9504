import { test } from "node:test";
import assert from "node:assert/strict";
import { BlockPool } from "../../src/engine/block-pool.js";
import { KvCacheManager, ROOT_BLOCK_HASH, hashBlockTokens } from "../../src/engine/kv-cache-manager.js";
import { Request } from "../../src/engine/request.js";
import { normalizeSamplingParams } from "../../src/engine/sampling-params.js";

function req(id: string, tokens: number[], extra: { cacheSalt?: string } = {}): Request {
  return new Request({
    requestId: id,
    prompt: null,
    promptTokenIds: tokens,
    params: normalizeSamplingParams({}),
    eosTokenIds: [2],
    maxTokens: 16,
    ...extra,
  });
}
const range = (a: number, b: number): number[] => Array.from({ length: b - a }, (_, i) => a + i);

test("block pool: null block reserved, LRU hand-out, frees go to the tail", () => {
  const pool = new BlockPool(6, true);
  assert.equal(pool.numFreeBlocks, 5);
  assert.deepEqual(pool.freeQueue.blockIds(), [1, 2, 3, 4, 5]);
  const a = pool.getNewBlocks(2);
  const b = pool.getNewBlocks(2);
  assert.deepEqual(
    a.map((x) => x.blockId),
    [1, 2],
  );
  assert.deepEqual(
    b.map((x) => x.blockId),
    [3, 4],
  );
  assert.deepEqual(pool.freeQueue.blockIds(), [5]);
  pool.freeBlocks([...a].reverse()); // a request's blocks are freed tail first
  assert.deepEqual(pool.freeQueue.blockIds(), [5, 2, 1]);
  pool.freeBlocks([...b].reverse());
  assert.deepEqual(pool.freeQueue.blockIds(), [5, 2, 1, 4, 3]);
  assert.throws(() => pool.freeBlocks([a[0]!]), /double free/);
  assert.throws(() => pool.getNewBlocks(6), /cannot get/);
});

test("block pool: cached free blocks are revived by a hit and evicted when reallocated", () => {
  const pool = new BlockPool(5, true);
  const blocks = pool.getNewBlocks(3); // 1, 2, 3
  pool.cacheFullBlocks(blocks, ["h1", "h2"], 0, 2);
  assert.equal(pool.getCachedBlock("h1")?.blockId, 1);
  pool.freeBlocks([...blocks].reverse());
  assert.deepEqual(pool.freeQueue.blockIds(), [4, 3, 2, 1]);
  // Still cached while free.
  assert.equal(pool.getCachedBlock("h2")?.blockId, 2);
  pool.touch([pool.getCachedBlock("h1")!]);
  assert.deepEqual(pool.freeQueue.blockIds(), [4, 3, 2]);
  assert.equal(pool.counters.revived, 1);
  // Allocating 3 fresh blocks takes 4, 3, then 2 (evicting h2).
  const fresh = pool.getNewBlocks(3);
  assert.deepEqual(
    fresh.map((b) => b.blockId),
    [4, 3, 2],
  );
  assert.equal(pool.getCachedBlock("h2"), null);
  assert.equal(pool.getCachedBlock("h1")?.blockId, 1);
  assert.equal(pool.counters.evicted, 1);
});

test("kv cache manager: hash chain, prefix hits never cover the last token, eviction order", () => {
  const kv = new KvCacheManager({ numBlocks: 9, blockSize: 4, enablePrefixCaching: true });
  const a = req("a", range(10, 20)); // 10 tokens: 2 full blocks
  assert.equal(kv.getComputedBlocks(a).numComputedTokens, 0);
  assert.deepEqual(kv.allocateSlots(a, 10)!.getBlockIds(), [1, 2, 3]);
  const h0 = hashBlockTokens(ROOT_BLOCK_HASH, range(10, 14), null);
  const h1 = hashBlockTokens(h0, range(14, 18), null);
  assert.deepEqual(a.blockHashes, [h0, h1]);
  assert.equal(kv.pool.getCachedBlock(h1)?.blockId, 2);

  // Same first 8 tokens: both blocks hit. Exactly 8 tokens: only the first block (last token recomputed).
  const b = req("b", [...range(10, 18), 40, 41]);
  const hitB = kv.getComputedBlocks(b);
  assert.equal(hitB.numComputedTokens, 8);
  assert.deepEqual(hitB.blocks.getBlockIds(), [1, 2]);
  const c = req("c", range(10, 18));
  assert.deepEqual(kv.getComputedBlocks(c).blocks.getBlockIds(), [1]);
  // A cache salt changes the whole chain.
  assert.equal(kv.getComputedBlocks(req("d", range(10, 20), { cacheSalt: "s" })).numComputedTokens, 0);

  kv.allocateSlots(b, 2, hitB.blocks, hitB.numComputedTokens);
  b.numComputedTokens = 10;
  assert.deepEqual(kv.getBlockIds("b"), [1, 2, 4]);
  assert.equal(kv.pool.blocks[1]!.refCnt, 2);
  kv.free(a);
  assert.deepEqual(kv.pool.freeQueue.blockIds(), [5, 6, 7, 8, 3]);
  kv.free(b);
  assert.deepEqual(kv.pool.freeQueue.blockIds(), [5, 6, 7, 8, 3, 4, 2, 1]);
  assert.equal(kv.numFreeBlocks, 8);
  // lookups count nothing: the scheduler records the one it admits
  assert.deepEqual(kv.prefixCacheStats, { queries: 0, hits: 0 });
  kv.recordPrefixCacheStats(b, hitB.numComputedTokens);
  assert.deepEqual(kv.prefixCacheStats, { queries: 10, hits: 8 });
});

test("kv cache manager: allocation fails cleanly when the pool is short; caching off hashes nothing", () => {
  const kv = new KvCacheManager({ numBlocks: 4, blockSize: 4, enablePrefixCaching: false });
  const a = req("a", range(0, 13));
  assert.equal(kv.allocateSlots(a, 13), null); // needs 4 blocks, 3 usable
  assert.equal(kv.numFreeBlocks, 3);
  assert.ok(kv.allocateSlots(a, 12));
  assert.deepEqual(a.blockHashes, []);
  assert.equal(kv.getComputedBlocks(req("b", range(0, 13))).numComputedTokens, 0);
});

test("block pool: reset_prefix_cache drops the hashes of free blocks; blocks in use keep theirs until all are free", () => {
  const pool = new BlockPool(6, true, true);
  const a = pool.getNewBlocks(2); // 1, 2: held by a running request
  const b = pool.getNewBlocks(2); // 3, 4: freed, still cached
  pool.cacheFullBlocks(a, ["a1", "a2"], 0, 2);
  pool.cacheFullBlocks(b, ["b1", "b2"], 0, 2);
  pool.freeBlocks([...b].reverse());
  pool.takeEvents();
  assert.equal(pool.resetPrefixCache(), false, "blocks 1 and 2 are in use");
  assert.deepEqual(pool.takeEvents(), [{ type: "BlockRemoved", block_hashes: ["b1", "b2"], medium: "GPU" }]);
  assert.equal(pool.getCachedBlock("b1"), null);
  assert.equal(pool.getCachedBlock("b2"), null);
  assert.deepEqual([b[0]!.blockHash, b[1]!.blockHash], [null, null]);
  assert.equal(pool.getCachedBlock("a1")?.blockId, 1, "a running request's blocks keep their hashes");
  assert.deepEqual(pool.freeQueue.blockIds(), [5, 4, 3], "the free queue is untouched");
  pool.freeBlocks([...a].reverse());
  assert.equal(pool.resetPrefixCache(), true, "nothing in use: the whole cache goes");
  assert.deepEqual(pool.takeEvents(), [{ type: "AllBlocksCleared" }]);
  assert.equal(pool.numCachedBlocks, 0);
  assert.deepEqual([a[0]!.blockHash, a[1]!.blockHash], [null, null]);
});
