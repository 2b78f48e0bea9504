// The router's KV-block index (llm-d-kv-cache-manager's kvblock.Index): which workers hold which prefix-cache blocks,
// learned from the engines' KV-cache events (src/engine/kv-events.ts) rather than guessed from request text. A worker
// is named by its engine_id (the URL it serves at). Its entries go when it clears its cache or leaves the fleet.
import type { KvCacheEvent, KvEventBatch } from "../engine/kv-events.js";

export interface KvBlockIndexStats {
  batches: number;
  events: number;
  /** Batches a worker numbered past the one expected: some were lost on the way (entries may be stale). */
  gaps: number;
  /** Batches numbered below the one expected: the engine restarted (with an empty cache), its old entries dropped. */
  restarts: number;
}

export class KvBlockIndex {
  /** block hash -> workers holding it */
  private readonly holders = new Map<string, Set<string>>();
  /** worker -> its block hashes (to drop them all at once) */
  private readonly blocksOf = new Map<string, Set<string>>();
  /** worker -> block size its events reported */
  private readonly blockSizeOf = new Map<string, number>();
  private readonly nextSeq = new Map<string, number>();
  readonly stats: KvBlockIndexStats = { batches: 0, events: 0, gaps: 0, restarts: 0 };

  /** Applies one engine's batch, in order. `worker` is its normalized URL (the batch's engine_id by default). */
  applyBatch(batch: KvEventBatch, worker: string = batch.engine_id): void {
    this.stats.batches++;
    const expected = this.nextSeq.get(worker);
    if (expected !== undefined && batch.seq > expected) this.stats.gaps++;
    if (expected !== undefined && batch.seq < expected) {
      this.stats.restarts++;
      this.removeWorker(worker);
    }
    this.nextSeq.set(worker, batch.seq + 1);
    for (const e of batch.events) this.apply(worker, e);
  }

  apply(worker: string, e: KvCacheEvent): void {
    this.stats.events++;
    switch (e.type) {
      case "BlockStored": {
        this.blockSizeOf.set(worker, e.block_size);
        let mine = this.blocksOf.get(worker);
        if (mine === undefined) this.blocksOf.set(worker, (mine = new Set()));
        for (const h of e.block_hashes) {
          mine.add(h);
          let set = this.holders.get(h);
          if (set === undefined) this.holders.set(h, (set = new Set()));
          set.add(worker);
        }
        break;
      }
      case "BlockRemoved":
        for (const h of e.block_hashes) this.drop(worker, h);
        break;
      case "AllBlocksCleared":
        this.removeWorker(worker, false);
        break;
    }
  }

  private drop(worker: string, h: string): void {
    this.blocksOf.get(worker)?.delete(h);
    const set = this.holders.get(h);
    if (set === undefined) return;
    set.delete(worker);
    if (set.size === 0) this.holders.delete(h);
  }

  /** Forgets every block of `worker` (it went down, was removed, or cleared its cache). */
  removeWorker(worker: string, forgetSeq = true): void {
    const mine = this.blocksOf.get(worker);
    if (mine !== undefined) for (const h of [...mine]) this.drop(worker, h);
    this.blocksOf.delete(worker);
    if (forgetSeq) this.nextSeq.delete(worker);
  }

  /** The block sizes the workers' events reported (one per distinct size, for hashing a request once per size). */
  blockSizes(): Set<number> {
    return new Set(this.blockSizeOf.values());
  }

  blockSize(worker: string): number | undefined {
    return this.blockSizeOf.get(worker);
  }

  /** Blocks indexed for `worker`. */
  size(worker: string): number {
    return this.blocksOf.get(worker)?.size ?? 0;
  }

  /** Workers holding `hash`. */
  holdersOf(hash: string): ReadonlySet<string> {
    return this.holders.get(hash) ?? new Set();
  }

  /**
   * How many leading blocks of the chain `hashes` each of `workers` holds (llm-d's longest-prefix score: a worker
   * counts block i only if it holds blocks 0..i, as the engine reads its cache).
   * @example index.longestPrefix(["h0", "h1", "h2"], ["http://a", "http://b"]) // Map { "http://a" => 2, "http://b" => 0 }
   */
  longestPrefix(hashes: readonly string[], workers: readonly string[]): Map<string, number> {
    const out = new Map<string, number>(workers.map((w) => [w, 0]));
    let alive = new Set(workers);
    for (let i = 0; i < hashes.length && alive.size > 0; i++) {
      const held = this.holders.get(hashes[i]!);
      const next = new Set<string>();
      for (const w of alive) if (held?.has(w)) {
        next.add(w);
        out.set(w, i + 1);
      }
      alive = next;
    }
    return out;
  }
}
