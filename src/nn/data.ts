// torch.utils.data's core: a Dataset (length and items by index), TensorDataset over tensors sharing their first dim,
// and DataLoader, which batches a dataset (in order or shuffled by a seeded generator, the last short batch kept or
// dropped) and collates each batch: tensors stacked on a new first dim, numbers into a tensor, arrays and records
// field by field. A TensorDataset's batches are gathered with one indexSelect per tensor.
import { defaultGenerator, indexSelect, rand, sort, stack, tensor, Tensor, type Generator } from "../tensor/index.js";
import { KilnError } from "../util/errors.js";

export class DataError extends KilnError {
  override name = "DataError";
}

/** torch.utils.data.Dataset: `length` items, item i by get(i). */
export interface Dataset<T> {
  readonly length: number;
  get(index: number): T;
}

/** torch.utils.data.TensorDataset: item i is the i-th row of each tensor. */
export class TensorDataset implements Dataset<Tensor[]> {
  readonly tensors: readonly Tensor[];
  constructor(...tensors: Tensor[]) {
    if (tensors.length === 0) throw new DataError("[TensorDataset] needs at least one tensor");
    const n = tensors[0]!.shape[0];
    if (tensors.some((t) => t.ndim === 0 || t.shape[0] !== n))
      throw new DataError(`[TensorDataset] size mismatch between tensors: first dims ${tensors.map((t) => t.shape[0] ?? "scalar").join(", ")}`);
    this.tensors = tensors;
  }
  get length(): number {
    return this.tensors[0]!.shape[0]!;
  }
  get(index: number): Tensor[] {
    if (!Number.isInteger(index) || index < 0 || index >= this.length) throw new DataError(`[TensorDataset] index ${index} is out of range for ${this.length} items`);
    return this.tensors.map((t) => t.select(0, index));
  }
}

type Collated = Tensor | Collated[] | { [key: string]: Collated };

/** torch's default_collate: tensors stacked, numbers (and booleans) into one tensor, arrays and records by field. */
export function defaultCollate(items: readonly unknown[]): Collated {
  const first = items[0];
  if (first instanceof Tensor) return stack(items as Tensor[]);
  if (typeof first === "number") return tensor(Float32Array.from(items as number[]));
  if (typeof first === "boolean") return tensor(Uint8Array.from(items as boolean[], Number), { dtype: "bool" });
  if (Array.isArray(first)) {
    if (items.some((x) => !Array.isArray(x) || x.length !== first.length)) throw new DataError("[DataLoader] each item of a batch must have the same length");
    return first.map((_, k) => defaultCollate(items.map((x) => (x as unknown[])[k])));
  }
  if (typeof first === "object" && first !== null)
    return Object.fromEntries(Object.keys(first).map((key) => [key, defaultCollate(items.map((x) => (x as Record<string, unknown>)[key]))]));
  throw new DataError(`[DataLoader] the default collate does not batch ${typeof first} items: pass collate`);
}

export interface DataLoaderOptions<T, B> {
  /** Items per batch (default 1). */
  batchSize?: number;
  /** A new order each epoch (default false), drawn from `generator` (default: the default generator). */
  shuffle?: boolean;
  /** Leave out the last batch when it is short (default false). */
  dropLast?: boolean;
  generator?: Generator;
  /** How a batch's items become one value (default defaultCollate). */
  collate?: (items: T[]) => B;
}

/**
 * torch.utils.data.DataLoader: iterate it once per epoch.
 * @example
 *   const loader = new DataLoader(new TensorDataset(x, y), { batchSize: 32, shuffle: true });
 *   for (const [xb, yb] of loader) { ... }
 */
export class DataLoader<T, B = T extends readonly Tensor[] ? Tensor[] : Collated> implements Iterable<B> {
  readonly batchSize: number;
  private readonly options: DataLoaderOptions<T, B>;

  constructor(readonly dataset: Dataset<T>, options: DataLoaderOptions<T, B> = {}) {
    this.batchSize = options.batchSize ?? 1;
    if (!Number.isInteger(this.batchSize) || this.batchSize < 1) throw new DataError(`[DataLoader] batchSize must be a positive integer, got ${options.batchSize}`);
    this.options = options;
  }

  /** Batches per epoch. */
  get length(): number {
    const n = this.dataset.length / this.batchSize;
    return this.options.dropLast === true ? Math.floor(n) : Math.ceil(n);
  }

  /** This epoch's item order: 0..n-1, or a permutation drawn from the generator. */
  private order(): number[] {
    const n = this.dataset.length;
    if (this.options.shuffle !== true) return Array.from({ length: n }, (_, i) => i);
    const r = rand([n], { generator: this.options.generator ?? defaultGenerator });
    const { values, indices } = sort(r);
    const perm = indices.toList();
    for (const t of [r, values, indices]) t.dispose();
    return perm;
  }

  private batch(indices: number[]): B {
    if (this.options.collate) return this.options.collate(indices.map((i) => this.dataset.get(i)));
    if (this.dataset instanceof TensorDataset) {
      return this.dataset.tensors.map((t) => {
        const idx = tensor(Int32Array.from(indices), { device: t.device });
        const rows = indexSelect(t, 0, idx);
        idx.dispose();
        return rows;
      }) as B;
    }
    return defaultCollate(indices.map((i) => this.dataset.get(i))) as B;
  }

  *[Symbol.iterator](): Iterator<B> {
    const order = this.order();
    for (let b = 0; b < this.length; b++) yield this.batch(order.slice(b * this.batchSize, (b + 1) * this.batchSize));
  }
}
