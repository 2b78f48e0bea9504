// A deterministic fake model for engine tests that also checks the paged KV cache. Each computed token writes
// (position, token, hash of the context up to it) into its slot; before computing, every earlier slot that the
// block table points to must hold an unbroken hash chain for positions 0..start-1. The next-token logits are a
// pure function of that chain hash, so they depend on the whole context and on nothing else in the batch:
// a scheduler or prefix-cache bug gives different tokens or a thrown KvConsistencyError.
import type { KvLayout } from "./kv-transfer.js";
import type { ModelRunner, RunnerOutput, ScheduledBatch, ScheduledSequence } from "./model-runner.js";

/** The KV read by the fake runner is not the context it should be. */
export class KvConsistencyError extends Error {
  override name = "KvConsistencyError";
}

interface SlotEntry {
  pos: number;
  token: number;
  hash: number; // chain hash of tokens[0..pos]
}

const ROOT = 0x9e3779b9;

/** Chain step of the fake model's context hash. */
export function fakeContextHash(prev: number, token: number, pos: number): number {
  let h = Math.imul(prev ^ token, 0x85ebca6b) ^ Math.imul(pos + 1, 0xc2b2ae35);
  h ^= h >>> 15;
  h = Math.imul(h, 0x27d4eb2f);
  return (h ^ (h >>> 13)) >>> 0;
}

/** The fake model's logit of `token` given a context hash: uniform-ish in [-4, 4). */
export function fakeLogit(ctxHash: number, token: number): number {
  const h = fakeContextHash(ctxHash, token, 7919);
  return (h / 4294967296) * 8 - 4;
}

export interface FakeModelRunnerOptions {
  /** Check the block table chain on every step (default true). */
  verify?: boolean;
  /** Edits a logits row, given the full context (tokens 0..pos): for tests that need particular tokens. */
  override?: (context: readonly number[], logits: Float32Array) => void;
}

export class FakeModelRunner implements ModelRunner {
  private readonly store = new Map<number, SlotEntry>();
  /** Context tokens per request as read back from the KV store. */
  private readonly contexts = new Map<string, number[]>();
  numExecuted = 0;
  /** Every batch seen, (requestId, numTokens) per sequence: for scheduling assertions. */
  readonly log: { requestId: string; numTokens: number; start: number }[][] = [];

  constructor(
    readonly vocabSize: number,
    private readonly options: FakeModelRunnerOptions = {},
  ) {}

  /** Sleep mode: the KV store is dropped (as a real cache's contents are lost); a step before restoreKvCache() throws. */
  kvReleased = false;

  releaseKvCache(): void {
    this.store.clear();
    this.contexts.clear();
    this.kvReleased = true;
  }

  restoreKvCache(): void {
    this.kvReleased = false;
  }

  execute(batch: ScheduledBatch): RunnerOutput {
    if (this.kvReleased) throw new KvConsistencyError("a step while the KV cache is released");
    for (const id of batch.finishedRequestIds) this.contexts.delete(id);
    const rows: Float32Array[] = [];
    const promptLogits = new Map<string, Float32Array>();
    this.log.push(batch.sequences.map((s) => ({ requestId: s.requestId, numTokens: s.tokenIds.length, start: s.startPosition })));
    // Sequentially, so a later sequence can read blocks an earlier one wrote this step (as per-layer K/V writes
    // precede attention in a real batched forward).
    for (const seq of batch.sequences) {
      const ctx = this.readContext(seq, batch.blockSize);
      const V = this.vocabSize;
      const prompt = seq.needsPromptLogits ? new Float32Array(seq.tokenIds.length * V) : null;
      let h = seq.startPosition === 0 ? ROOT : this.store.get(slotOf(seq.blockTable, seq.startPosition - 1, batch.blockSize))!.hash;
      for (let j = 0; j < seq.tokenIds.length; j++) {
        const pos = seq.startPosition + j;
        const token = seq.tokenIds[j]!;
        const slot = slotOf(seq.blockTable, pos, batch.blockSize);
        if (seq.slotMapping[j] !== slot)
          throw new KvConsistencyError(`${seq.requestId}: slotMapping[${j}]=${seq.slotMapping[j]} but the block table gives ${slot}`);
        h = fakeContextHash(h, token, pos);
        this.store.set(slot, { pos, token, hash: h });
        ctx.push(token);
        if (prompt !== null) this.fillRow(prompt.subarray(j * V, (j + 1) * V), h, ctx);
        // the last known token's row, and each draft's (speculative decoding)
        if (seq.needsLogits && j >= seq.tokenIds.length - 1 - (seq.numSpecTokens ?? 0)) {
          const row = new Float32Array(this.vocabSize);
          this.fillRow(row, h, ctx);
          rows.push(row);
        }
      }
      if (prompt !== null) promptLogits.set(seq.requestId, prompt);
      this.contexts.set(seq.requestId, ctx);
    }
    const logits = new Float32Array(rows.length * this.vocabSize);
    rows.forEach((r, i) => logits.set(r, i * this.vocabSize));
    this.numExecuted++;
    return { logits, promptLogits };
  }

  /** P/D transfers: one layer whose K row per token is (position, token, context hash) as u32, V zeros. */
  readonly kvLayout: KvLayout = { numLayers: 1, numKvHeads: 1, headDim: 3, dtype: "fake", rowBytes: 12 };

  readKv(blockTable: readonly number[], blockSize: number, numTokens: number): Uint8Array {
    const out = new Uint8Array(24 * numTokens); // [k, v][token][3 x u32 LE]; V stays zero
    const dv = new DataView(out.buffer);
    for (let p = 0; p < numTokens; p++) {
      const e = this.store.get(slotOf(blockTable, p, blockSize));
      if (e === undefined) throw new KvConsistencyError(`readKv: no K/V at position ${p}`);
      [e.pos, e.token, e.hash].forEach((v, i) => dv.setUint32(12 * p + 4 * i, v, true));
    }
    return out;
  }

  writeKv(blockTable: readonly number[], blockSize: number, data: Uint8Array, numTokens: number, from: number, to: number): void {
    if (data.length !== 24 * numTokens) throw new KvConsistencyError(`writeKv: ${data.length} bytes are not ${numTokens} tokens`);
    const dv = new DataView(data.buffer, data.byteOffset, data.byteLength);
    for (let p = from; p < to; p++) {
      const [pos, token, hash] = [0, 1, 2].map((i) => dv.getUint32(12 * p + 4 * i, true)) as [number, number, number];
      this.store.set(slotOf(blockTable, p, blockSize), { pos, token, hash });
    }
    this.numKvWrites += to - from;
  }

  /** Positions written by writeKv (imported K/V). */
  numKvWrites = 0;

  private fillRow(row: Float32Array, h: number, ctx: readonly number[]): void {
    for (let v = 0; v < row.length; v++) row[v] = fakeLogit(h, v);
    this.options.override?.(ctx, row);
  }

  /** Reads tokens 0..start-1 back out of the KV store through the block table, checking the hash chain. */
  private readContext(seq: ScheduledSequence, bs: number): number[] {
    const seen = new Set<number>();
    for (const b of seq.blockTable) {
      if (b === 0) throw new KvConsistencyError(`${seq.requestId}: block table contains the null block 0`);
      if (seen.has(b)) throw new KvConsistencyError(`${seq.requestId}: block ${b} appears twice in its block table`);
      seen.add(b);
    }
    const need = Math.ceil((seq.startPosition + seq.tokenIds.length) / bs);
    if (seq.blockTable.length < need)
      throw new KvConsistencyError(`${seq.requestId}: block table has ${seq.blockTable.length} blocks, needs ${need}`);
    const known = this.contexts.get(seq.requestId);
    if (this.options.verify === false && known !== undefined && known.length >= seq.startPosition) return known.slice(0, seq.startPosition);
    const ctx: number[] = [];
    let h = ROOT;
    for (let p = 0; p < seq.startPosition; p++) {
      const e = this.store.get(slotOf(seq.blockTable, p, bs));
      if (e === undefined || e.pos !== p)
        throw new KvConsistencyError(`${seq.requestId}: slot for position ${p} holds ${e === undefined ? "nothing" : `position ${e.pos}`}`);
      h = fakeContextHash(h, e.token, p);
      if (e.hash !== h) throw new KvConsistencyError(`${seq.requestId}: KV at position ${p} belongs to another context`);
      if (known !== undefined && p < known.length && known[p] !== e.token)
        throw new KvConsistencyError(`${seq.requestId}: token at position ${p} changed from ${known[p]} to ${e.token}`);
      ctx.push(e.token);
    }
    return ctx;
  }
}

function slotOf(blockTable: readonly number[], pos: number, bs: number): number {
  return blockTable[Math.floor(pos / bs)]! * bs + (pos % bs);
}
