import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { buildDatasets, DataLoader, Rng, splitDocuments, tokenizeDocuments } from "../../src/train/data-loader.js";

// A byte tokenizer: id = UTF-16 code unit + 1 (0 is EOS).
const charTok = { encode: (s: string): number[] => Array.from(s, (c) => c.charCodeAt(0) + 1) };
const EOS = 0;
const docs = Array.from({ length: 40 }, (_, i) => `document number ${i} ` + "x".repeat(i % 7));

test("tokenizeDocuments puts EOS after every document", () => {
  const t = tokenizeDocuments(["ab", "", "c"], charTok, EOS);
  assert.deepEqual(Array.from(t), [98, 99, 0, 0, 100, 0]);
});

test("validation split: deterministic, disjoint, by document", () => {
  const a = splitDocuments(docs, 0.1, 7);
  const b = splitDocuments(docs, 0.1, 7);
  assert.deepEqual(a, b);
  assert.equal(a.val.length, 4);
  assert.equal(a.train.length, 36);
  const train = new Set(a.train);
  assert.ok(a.val.every((d) => !train.has(d)));
  assert.notDeepEqual(splitDocuments(docs, 0.1, 8).val, a.val);
  assert.equal(splitDocuments(docs.slice(0, 3), 0.01).val.length, 1, "at least one validation doc");
});

test("packing: windows of seqLen+1, targets are inputs shifted by one, each window once per epoch", () => {
  const stream = Int32Array.from({ length: 1001 }, (_, i) => i); // token value = position
  const seqLen = 10;
  const dl = new DataLoader(stream, { batchSize: 4, seqLen, seed: 1 });
  assert.equal(dl.numWindows, 100);
  assert.equal(dl.batchesPerEpoch, 25);
  const starts = new Set<number>();
  for (let s = 0; s < dl.batchesPerEpoch; s++) {
    const { inputs, targets } = dl.next();
    assert.equal(inputs.length, 4 * seqLen);
    for (let b = 0; b < 4; b++) {
      const start = inputs[b * seqLen]!;
      assert.equal(start % seqLen, 0);
      starts.add(start);
      for (let t = 0; t < seqLen; t++) {
        assert.equal(inputs[b * seqLen + t], start + t);
        assert.equal(targets[b * seqLen + t], start + t + 1);
      }
    }
  }
  assert.equal(starts.size, 100, "every window exactly once in the epoch");
  assert.equal(dl.epoch, 0);
  dl.next();
  assert.equal(dl.epoch, 1);
  // Unshuffled: in order.
  const seq = new DataLoader(stream, { batchSize: 2, seqLen, shuffle: false });
  assert.deepEqual(Array.from(seq.next().inputs.subarray(0, 3)), [0, 1, 2]);
  assert.throws(() => new DataLoader(stream.subarray(0, 20), { batchSize: 4, seqLen }), /fewer than one step/);
});

test("state/restore resumes at the same batch and RNG state, across epochs and JSON", () => {
  const stream = Int32Array.from({ length: 513 }, (_, i) => (i * 7919) % 1000);
  const a = new DataLoader(stream, { batchSize: 3, seqLen: 8, seed: 123 });
  for (let i = 0; i < 30; i++) a.next(); // into epoch 1 (21 batches per epoch)
  const saved = JSON.parse(JSON.stringify(a.state())) as ReturnType<DataLoader["state"]>;
  const expected = Array.from({ length: 50 }, () => a.next());
  const b = new DataLoader(stream, { batchSize: 3, seqLen: 8, seed: 999 });
  b.next();
  b.restore(saved);
  for (const e of expected) {
    const got = b.next();
    assert.deepEqual(got.inputs, e.inputs);
    assert.deepEqual(got.targets, e.targets);
  }
  assert.throws(() => new DataLoader(stream, { batchSize: 3, seqLen: 4 }).restore(saved), /state is for/);
  // Different seeds shuffle differently.
  const c = new DataLoader(stream, { batchSize: 3, seqLen: 8, seed: 124 });
  const d = new DataLoader(stream, { batchSize: 3, seqLen: 8, seed: 123 });
  assert.notDeepEqual(c.next().inputs, d.next().inputs);
});

test("data-parallel ranks read disjoint windows", () => {
  const stream = Int32Array.from({ length: 401 }, (_, i) => i);
  const seen = new Set<number>();
  for (let rank = 0; rank < 2; rank++) {
    const dl = new DataLoader(stream, { batchSize: 2, seqLen: 4, seed: 5, rank, worldSize: 2 });
    for (let s = 0; s < dl.batchesPerEpoch; s++) {
      const { inputs } = dl.next();
      for (let b = 0; b < 2; b++) {
        assert.equal(seen.has(inputs[b * 4]!), false);
        seen.add(inputs[b * 4]!);
      }
    }
  }
  assert.equal(seen.size, 100);
});

test("buildDatasets caches tokens in a .bin file keyed by corpus, tokenizer and split", () => {
  const cachePath = join(mkdtempSync(join(tmpdir(), "kiln-dl-")), "cache", "tokens.bin");
  const opts = { docs, tokenizer: charTok, eosId: EOS, valFraction: 0.1, seed: 3, cachePath, tokenizerKey: "char" };
  const first = buildDatasets(opts);
  assert.equal(first.fromCache, false);
  assert.equal(first.valDocs, 4);
  let calls = 0;
  const counting = { encode: (s: string): number[] => (calls++, charTok.encode(s)) };
  const second = buildDatasets({ ...opts, tokenizer: counting });
  assert.equal(second.fromCache, true);
  assert.equal(calls, 0, "no re-tokenization");
  assert.deepEqual(second.train, first.train);
  assert.deepEqual(second.val, first.val);
  assert.equal(buildDatasets({ ...opts, tokenizerKey: "other" }).fromCache, false);
  assert.equal(buildDatasets({ ...opts, docs: [...docs, "new"] }).fromCache, false);
  // Validation tokens come from validation docs only.
  const { val } = splitDocuments(docs, 0.1, 3);
  assert.deepEqual(first.val, tokenizeDocuments(val, charTok, EOS));
});

test("Rng is deterministic and roughly uniform", () => {
  const r = new Rng(42);
  const s = new Rng(r.state());
  assert.equal(r.nextU32(), s.nextU32());
  const counts = new Array<number>(10).fill(0);
  for (let i = 0; i < 10000; i++) counts[r.nextInt(10)]!++;
  assert.ok(
    counts.every((c) => c > 850 && c < 1150),
    String(counts),
  );
});
