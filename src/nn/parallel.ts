// Megatron-style tensor parallelism (vLLM's ColumnParallelLinear / RowParallelLinear): a column-parallel layer holds
// rows [rank * out/size, (rank + 1) * out/size) of W [out, in] and yields its slice of the output features, with no
// communication; a row-parallel layer holds the matching columns of W, multiplies its slice of the input features and
// all-reduces the partial sums (bias added once, after the sum). Column then row (q/k/v -> o_proj, gate/up ->
// down_proj) costs one all-reduce per block. Kiln keeps q/k/v and gate/up as separate projections, so vLLM's fused
// QKVParallelLinear / MergedColumnParallelLinear are each a column-parallel layer per part here (Phi-3's fused
// checkpoints are split before loading). Forward only: the all-reduce is not differentiable (serving).
import { allReduce, type ProcessGroup } from "../distributed/index.js";
import { add, linear, type QuantizedActivations, type Tensor } from "../tensor/index.js";
import { KilnError } from "../util/errors.js";
import { Linear, type LayerOptions } from "./layers.js";
import type { Module } from "./module.js";

/** This process's place in a tensor-parallel group. */
export interface TensorParallel {
  group: ProcessGroup;
  /** Rank within the group (0 .. size-1). */
  rank: number;
  size: number;
}

/** The tensor-parallel context of a group (every member calls the same collectives in the same order). */
export function tensorParallelOf(group: ProcessGroup): TensorParallel {
  if (!group.isMember) throw new TensorParallelError(`this rank is not a member of the group [${group.ranks.join(", ")}]`);
  return { group, rank: group.rank, size: group.size };
}

/** A model or argument that cannot be split over the tensor-parallel ranks. */
export class TensorParallelError extends KilnError {
  override name = "TensorParallelError";
  constructor(message: string) {
    super(`[tensor_parallel] ${message}`);
  }
}

/** n / size, or a TensorParallelError naming `what` when size does not divide n (vLLM's divide()). */
export function divideForTp(what: string, n: number, size: number): number {
  if (n % size !== 0) throw new TensorParallelError(`${what} (${n}) is not divisible by tensor_parallel_size (${size})`);
  return n / size;
}

/** How a parameter of the full checkpoint is cut for one rank: `size` equal slices along `dim`, slice `rank` kept. */
export interface ShardSpec {
  dim: 0 | 1;
  rank: number;
  size: number;
}

/** W [out/size, in]: this rank's output features. The bias (if any) is sharded with them. */
export class ColumnParallelLinear extends Linear {
  constructor(
    inFeatures: number,
    readonly fullOutFeatures: number,
    bias: boolean,
    readonly tp: TensorParallel,
    options: LayerOptions = {},
  ) {
    super(inFeatures, divideForTp("output features", fullOutFeatures, tp.size), bias, options);
  }

  /** The slice of the full checkpoint's `local` parameter ("weight" | "bias") this rank holds. */
  shardOf(local: string): ShardSpec | null {
    return local === "weight" || local === "bias" ? { dim: 0, rank: this.tp.rank, size: this.tp.size } : null;
  }
}

/** W [out, in/size]: reads this rank's slice of the input features; the output is all-reduced (full on every rank). */
export class RowParallelLinear extends Linear {
  constructor(
    readonly fullInFeatures: number,
    outFeatures: number,
    bias: boolean,
    readonly tp: TensorParallel,
    options: LayerOptions = {},
  ) {
    super(divideForTp("input features", fullInFeatures, tp.size), outFeatures, bias, options);
  }

  shardOf(local: string): ShardSpec | null {
    return local === "weight" ? { dim: 1, rank: this.tp.rank, size: this.tp.size } : null; // the bias is replicated
  }

  /** x [..., in/size] (this rank's features) -> [..., out], summed over the ranks, plus the bias once. */
  override forward(x: Tensor, xq?: QuantizedActivations | null): Tensor {
    const partial = linear(x, this.weight, null, xq);
    allReduce(partial, "sum", this.tp.group);
    if (this.bias === null) return partial;
    const out = add(partial, this.bias);
    partial.dispose();
    return out;
  }
}

/** Every parameter of `root` that a rank holds a slice of, by full name. */
export function shardedParameters(root: Module): Map<string, ShardSpec> {
  const out = new Map<string, ShardSpec>();
  for (const [name, m] of root.namedModules()) {
    if (!(m instanceof ColumnParallelLinear) && !(m instanceof RowParallelLinear)) continue;
    for (const local of ["weight", "bias"]) {
      const spec = m.shardOf(local);
      if (spec !== null && (local === "weight" || m.bias !== null)) out.set(name ? `${name}.${local}` : local, spec);
    }
  }
  return out;
}

/** This rank's slice of a full checkpoint tensor (a contiguous copy; `full` is left to the caller). */
export function narrowToShard(full: Tensor, spec: ShardSpec, name = "tensor"): Tensor {
  const n = full.shape[spec.dim]!;
  const len = divideForTp(`${name} dim ${spec.dim}`, n, spec.size);
  const view = full.narrow(spec.dim, spec.rank * len, len);
  const out = view.clone(); // its own contiguous memory, not a view keeping the whole tensor alive
  view.dispose();
  return out;
}
