// The native batched sampling kernel (native/sampling.cc) against the JS sampler path it replaces: same token
// ids, same processed logits (bit-equal), same logprobs. Skipped when the addon is not built.
import { test } from "node:test";
import assert from "node:assert/strict";
import type { LogitsProcessor } from "../../src/engine/logits-processors.js";
import { nativeSampleRows, Sampler, type SamplingRow } from "../../src/engine/sampler.js";
import { normalizeSamplingParams } from "../../src/engine/sampling-params.js";
import { Rng } from "../../src/engine/rng.js";
import type { SamplingParams } from "../../src/engine/types.js";

const kernel = nativeSampleRows();
const skip = kernel === null ? "native addon not built" : false;

/** A generator that always returns `u` (for uniforms at the ends of [0, 1)). */
const fixed = (u: number): Rng => ({ nextFloat: () => u }) as unknown as Rng;

let nextId = 0;
function row(params: Partial<SamplingParams>, generator: Rng | null): SamplingRow {
  return {
    requestId: `r${nextId++}`,
    params: normalizeSamplingParams(params),
    promptTokenIds: [],
    outputTokenIds: [],
    isFinished: false,
    generator,
    badWordsTokenIds: [],
    eosTokenIds: [],
  };
}

/** Samples a copy of `logits` with the JS path and the native path; asserts identical ids, logits and logprobs. */
function assertSame(
  V: number,
  logits: Float32Array,
  makeRows: () => SamplingRow[],
  processors: () => LogitsProcessor[] = () => [],
  what = "",
): void {
  const jsLogits = Float32Array.from(logits);
  const nativeLogits = Float32Array.from(logits);
  const js = new Sampler(V, new Rng(99), processors(), null).sample(jsLogits, makeRows());
  const native = new Sampler(V, new Rng(99), processors(), kernel).sample(nativeLogits, makeRows());
  assert.deepEqual(
    native.map((t) => t.tokenId),
    js.map((t) => t.tokenId),
    `token ids ${what}`,
  );
  assert.deepEqual(native, js, `logprobs ${what}`);
  const a = new Uint32Array(jsLogits.buffer);
  const b = new Uint32Array(nativeLogits.buffer);
  for (let i = 0; i < a.length; i++)
    if (a[i] !== b[i]) assert.fail(`processed logit ${i} (row ${Math.floor(i / V)}) ${jsLogits[i]} vs ${nativeLogits[i]} ${what}`);
}

/** Deterministic logits of one row in one of several shapes. */
function fillRow(l: Float32Array, kind: number, rnd: Rng): void {
  const V = l.length;
  const normal = (): number => Math.sqrt(-2 * Math.log(1 - rnd.nextFloat())) * Math.cos(2 * Math.PI * rnd.nextFloat());
  for (let v = 0; v < V; v++) {
    switch (kind) {
      case 0: // smooth
        l[v] = 3 * normal();
        break;
      case 1: // heavy ties
        l[v] = Math.floor(rnd.nextFloat() * 4) * 0.75;
        break;
      case 2: // one finite token
        l[v] = -Infinity;
        break;
      case 3: // peaked with some masked tokens
        l[v] = rnd.nextFloat() < 0.2 ? -Infinity : normal() - (v % 7 === 0 ? 0 : 8);
        break;
      case 4: // a wide ramp (beyond the kernel's 80-nat value bins) in shuffled order
        l[v] = -200 * rnd.nextFloat();
        break;
      default: // all equal
        l[v] = 1.5;
    }
  }
  if (kind === 2) l[Math.floor(rnd.nextFloat() * V)] = normal();
}

const TEMPERATURES = [0, 0.3, 1, 2.5];
const TOP_K = [0, 1, 2, 5, 50, 100000];
const TOP_P = [1, 0.95, 0.9, 0.5, 0.01];
const MIN_P = [0, 0.05, 0.5];
const UNIFORMS = [0, 1e-12, 0.5, 1 - 1e-9, 1 - 2 ** -53];

test("native sampling: same token ids and processed logits as the JS path on random batches", { skip }, () => {
  const rnd = new Rng(7);
  const pick = <T>(a: readonly T[]): T => a[Math.floor(rnd.nextFloat() * a.length)]!;
  for (let batch = 0; batch < 120; batch++) {
    const V = batch === 0 ? 49152 : 1 + Math.floor(rnd.nextFloat() ** 2 * 5000);
    const n = 1 + Math.floor(rnd.nextFloat() * 8);
    const logits = new Float32Array(n * V);
    for (let r = 0; r < n; r++) fillRow(logits.subarray(r * V, (r + 1) * V), Math.floor(rnd.nextFloat() * 6), rnd);
    const specs = Array.from({ length: n }, () => ({
      params: {
        temperature: pick(TEMPERATURES),
        topK: rnd.nextFloat() < 0.5 ? 0 : pick(TOP_K),
        topP: rnd.nextFloat() < 0.4 ? 1 : pick(TOP_P),
        minP: rnd.nextFloat() < 0.6 ? 0 : pick(MIN_P),
        logprobs: rnd.nextFloat() < 0.3 ? 3 : null,
      },
      u: rnd.nextFloat() < 0.5 ? pick(UNIFORMS) : null, // null: the shared (engine) generator
    }));
    assertSame(V, logits, () => specs.map((s) => row(s.params, s.u === null ? null : fixed(s.u))), undefined, `batch ${batch}`);
  }
});

test("native sampling: large vocabularies (the kernel's binned top-k/top-p selection)", { skip }, () => {
  const rnd = new Rng(21);
  for (const V of [4096, 8192, 49152]) {
    const kinds = [0, 1, 3, 4, 5];
    const logits = new Float32Array(kinds.length * V);
    kinds.forEach((kind, r) => fillRow(logits.subarray(r * V, (r + 1) * V), kind, rnd));
    for (const [topK, topP] of [
      [0, 0.9],
      [0, 0.5],
      [0, 0.999999],
      [50, 1],
      [4000, 1],
      [5000, 0.95],
      [1, 0.3],
      [0, 0.01],
    ] as const)
      for (const temperature of [0.3, 1, 2.5]) {
        const rows = (): SamplingRow[] => kinds.map((_, r) => row({ temperature, topK, topP, logprobs: 1 }, fixed(r / kinds.length)));
        assertSame(V, logits, rows, undefined, `V=${V} top_k=${topK} top_p=${topP} T=${temperature}`);
      }
  }
});

test("native sampling: seeded and shared generators advance in row order", { skip }, () => {
  const V = 300;
  const rnd = new Rng(3);
  const logits = new Float32Array(6 * V);
  for (let r = 0; r < 6; r++) fillRow(logits.subarray(r * V, (r + 1) * V), 0, rnd);
  const params = [0.8, 0, 1, 0, 2.5, 0.3].map((temperature, i) => ({ temperature, topP: 0.9, seed: i % 2 === 0 ? 40 + i : undefined }));
  const rows = (): SamplingRow[] => params.map((p) => row(p, p.seed === undefined ? null : new Rng(p.seed)));
  for (let step = 0; step < 5; step++) assertSame(V, logits, rows, undefined, `step ${step}`);
});

/** Argmax-invariant: shifts every row by a per-row constant (runs between the scale and draw kernels). */
class ShiftRows implements LogitsProcessor {
  isArgmaxInvariant(): boolean {
    return true;
  }
  apply(logits: Float32Array, rows: readonly unknown[], V: number): void {
    for (let r = 0; r < rows.length; r++) for (let v = 0; v < V; v++) logits[r * V + v]! -= 0.5 + r;
  }
}

/** Not argmax-invariant: bans token 0 (runs before both paths). */
class BanZero implements LogitsProcessor {
  apply(logits: Float32Array, rows: readonly unknown[], V: number): void {
    for (let r = 0; r < rows.length; r++) logits[r * V] = -Infinity;
  }
}

test("native sampling: argmax-invariant processors keep their place (split kernel calls)", { skip }, () => {
  const V = 777;
  const rnd = new Rng(11);
  const logits = new Float32Array(5 * V);
  for (let r = 0; r < 5; r++) fillRow(logits.subarray(r * V, (r + 1) * V), r % 2 === 0 ? 0 : 1, rnd);
  const rows = (): SamplingRow[] =>
    [0, 0.7, 0, 1.3, 1].map((temperature, i) => row({ temperature, topK: 40, topP: 0.8, minP: 0.02, logprobs: 2 }, fixed(i / 5)));
  assertSame(V, logits, rows, () => [new ShiftRows(), new BanZero()], "with processors");
  const greedyOnly = (): SamplingRow[] => [row({ temperature: 0, logprobs: 1 }, null), row({ temperature: 0 }, null)];
  assertSame(V, logits.subarray(0, 2 * V), greedyOnly, () => [new ShiftRows()], "greedy only");
});

test("native sampling: the kernel validates its arguments", { skip }, () => {
  const k = kernel!;
  const call = (rows: number, u: number): void =>
    k(
      new Float32Array(8),
      rows,
      4,
      new Float64Array([0, 1]),
      new Int32Array(2),
      new Float64Array([1, 1]),
      new Float64Array(2),
      new Float64Array([0, u]),
      new Int32Array(2),
    );
  call(2, 0.5);
  assert.throws(() => call(2, 1), /\[sampleRows\] uniform must be in \[0, 1\) \(row 1\)/);
  assert.throws(() => call(3, 0.5), RangeError);
});
