// A drafter's own paged KV cache bookkeeping (draft-model.ts, eagle.ts): a free list of blocks and, per request, its
// block table. Block 0, which padded rows of a step graph write, is never handed out.

/** What a drafter keeps per request: its block table, and how many positions its cache holds. */
export interface DraftKvState {
  blocks: number[];
  /** Positions 0 .. computed-1 of the drafter's sequence are in its cache. */
  computed: number;
}

export class DraftKvBlocks<S extends DraftKvState> {
  readonly states = new Map<string, S>();
  private readonly free: number[];

  constructor(
    readonly blockSize: number,
    numBlocks: number,
  ) {
    this.free = Array.from({ length: numBlocks - 1 }, (_, i) => numBlocks - 1 - i);
  }

  get numFree(): number {
    return this.free.length;
  }

  /** Gives back the blocks of every request not in `running`. */
  keepOnly(running: ReadonlySet<string>): void {
    for (const id of [...this.states.keys()]) if (!running.has(id)) this.release(id);
  }

  release(id: string): void {
    const st = this.states.get(id);
    if (st === undefined) return;
    this.free.push(...st.blocks);
    this.states.delete(id);
  }

  releaseAll(): void {
    this.keepOnly(new Set());
  }

  /** Blocks for `positions` positions; false (nothing taken) when the cache has too few left. */
  grow(st: S, positions: number): boolean {
    const need = Math.ceil(positions / this.blockSize) - st.blocks.length;
    if (need <= 0) return true;
    if (need > this.free.length) return false;
    for (let i = 0; i < need; i++) st.blocks.push(this.free.pop()!);
    return true;
  }

  /** The flat slot of each of `n` positions from `start`. */
  slots(st: S, start: number, n: number): Int32Array {
    const out = new Int32Array(n);
    for (let j = 0; j < n; j++) {
      const p = start + j;
      out[j] = st.blocks[Math.floor(p / this.blockSize)]! * this.blockSize + (p % this.blockSize);
    }
    return out;
  }
}
