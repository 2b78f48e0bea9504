// torch.utils.data's DataLoader over a TensorDataset and over a plain dataset: every item once per epoch, batch shapes,
// drop_last, a seeded shuffle (reproducible, new each epoch), default_collate of numbers, arrays and records.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { DataError, DataLoader, defaultCollate, TensorDataset, type Dataset } from "../../src/nn/index.js";
import * as k from "../../src/tensor/index.js";

describe("DataLoader", () => {
  const x = k.tensor(Float32Array.from({ length: 10 * 3 }, (_, i) => i), { shape: [10, 3] });
  const y = k.tensor(Int32Array.from({ length: 10 }, (_, i) => 100 + i));

  it("in order: batches of a TensorDataset are its rows; the last short batch kept or dropped", () => {
    const loader = new DataLoader(new TensorDataset(x, y), { batchSize: 4 });
    assert.equal(loader.length, 3);
    const batches = [...loader];
    assert.deepEqual(batches.map(([xb]) => xb!.shape), [[4, 3], [4, 3], [2, 3]]);
    assert.deepEqual(batches.flatMap(([, yb]) => yb!.toList()), Array.from({ length: 10 }, (_, i) => 100 + i));
    assert.deepEqual(batches[1]![0]!.toList(), Array.from({ length: 12 }, (_, i) => 12 + i));
    assert.equal(new DataLoader(new TensorDataset(x, y), { batchSize: 4, dropLast: true }).length, 2);
    assert.equal([...new DataLoader(new TensorDataset(x, y), { batchSize: 4, dropLast: true })].length, 2);
  });

  it("shuffled: every item once per epoch, the same order for the same seed, another order next epoch", () => {
    const epoch = (loader: DataLoader<k.Tensor[], k.Tensor[]>) => [...loader].flatMap(([, yb]) => yb!.toList());
    const g = new k.Generator(7);
    const loader = new DataLoader<k.Tensor[], k.Tensor[]>(new TensorDataset(x, y), { batchSize: 3, shuffle: true, generator: g });
    const first = epoch(loader);
    const second = epoch(loader);
    assert.deepEqual([...first].sort((a, b) => a - b), Array.from({ length: 10 }, (_, i) => 100 + i));
    assert.notDeepEqual(first, Array.from({ length: 10 }, (_, i) => 100 + i), "shuffled");
    assert.notDeepEqual(second, first, "a new order each epoch");
    const again = new DataLoader<k.Tensor[], k.Tensor[]>(new TensorDataset(x, y), { batchSize: 3, shuffle: true, generator: new k.Generator(7) });
    assert.deepEqual(epoch(again), first, "reproducible from the seed");
  });

  it("default_collate: numbers, arrays and records; a custom collate", () => {
    const ds: Dataset<{ a: number; b: [number, boolean] }> = { length: 3, get: (i) => ({ a: i * 1.5, b: [i, i % 2 === 0] }) };
    const [batch] = [...new DataLoader(ds, { batchSize: 3 })] as { a: k.Tensor; b: [k.Tensor, k.Tensor] }[];
    assert.deepEqual(batch!.a.toList(), [0, 1.5, 3]);
    assert.deepEqual(batch!.b[0].toList(), [0, 1, 2]);
    assert.equal(batch!.b[1].dtype, "bool");
    assert.deepEqual(batch!.b[1].toList(), [1, 0, 1]);
    const sums = [...new DataLoader(ds, { batchSize: 2, collate: (items) => items.reduce((s, it) => s + it.a, 0) })];
    assert.deepEqual(sums, [1.5, 3]);
    assert.deepEqual((defaultCollate([k.ones([2]), k.zeros([2])]) as k.Tensor).shape, [2, 2]);
  });

  it("refused: tensors of different lengths, a bad batch size, items the default collate cannot batch", () => {
    assert.throws(() => new TensorDataset(x, k.zeros([9])), (e) => e instanceof DataError && /first dims 10, 9/.test(e.message));
    assert.throws(() => new DataLoader(new TensorDataset(x), { batchSize: 0 }), /batchSize must be a positive integer, got 0/);
    assert.throws(() => [...new DataLoader({ length: 2, get: () => "s" }, { batchSize: 2 })], /does not batch string items: pass collate/);
  });
});
