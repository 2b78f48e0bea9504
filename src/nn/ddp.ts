/**
 * DistributedDataParallel (torch.nn.parallel.DistributedDataParallel's role): wraps a module whose replicas train
 * on different shards of each batch. At construction every rank takes the parameters of the group's first rank
 * (broadcast); after each backward() that produced gradients for the module, the gradients are averaged across
 * ranks (all-reduce of flattened buckets of about bucketCapMb, in reverse parameter order as torch fills them), so
 * every replica takes the same optimizer step: the one a single process would take on the global batch when the
 * loss is a mean over equal local batches. noSync(fn) skips the averaging for the backwards inside fn (gradient
 * accumulation: the next synchronized backward averages the accumulated sums).
 *
 * @example
 * initProcessGroup({ backend: "gloo" });
 * const ddp = new DistributedDataParallel(model);
 * const opt = new SGD(ddp.parameters(), { lr: 0.1 });
 * ddp.noSync(() => model.loss(x0, y0).backward()); // accumulate locally
 * model.loss(x1, y1).backward();                    // accumulate, then average across ranks
 * opt.step();
 */
import { broadcast, allReduce, getWorldSize, type ProcessGroup } from "../distributed/index.js";
import { cat, noGrad, registerPostBackwardHook, zerosLike, type Tensor } from "../tensor/index.js";
import { DTYPE_BYTES } from "../backends/dtype.js";
import { Module } from "./module.js";

export interface DdpOptions {
  /** The group whose ranks hold replicas (default: the world). */
  group?: ProcessGroup;
  /** Gradient bucket size in MiB (torch's bucket_cap_mb, default 25): one all-reduce per bucket. */
  bucketCapMb?: number;
  /** Copy the first rank's parameters to every replica at construction (default true, as torch). */
  broadcastParameters?: boolean;
}

/** Groups tensors into runs of one dtype of at most capBytes each (a larger tensor gets a bucket of its own). */
function buckets(tensors: Tensor[], capBytes: number): Tensor[][] {
  const out: Tensor[][] = [];
  let cur: Tensor[] = [];
  let bytes = 0;
  for (const t of tensors) {
    const size = t.numel * DTYPE_BYTES[t.dtype];
    if (cur.length > 0 && (bytes + size > capBytes || cur[0]!.dtype !== t.dtype)) {
      out.push(cur);
      cur = [];
      bytes = 0;
    }
    cur.push(t);
    bytes += size;
  }
  if (cur.length > 0) out.push(cur);
  return out;
}

/** Runs collective on one flat tensor holding the bucket, then copies the result back into each tensor. */
function throughFlat(bucket: Tensor[], collective: (flat: Tensor) => void): void {
  noGrad(() => {
    const flat = bucket.length === 1 && bucket[0]!.isContiguous ? bucket[0]!.reshape(bucket[0]!.numel) : cat(bucket.map((t) => t.reshape(t.numel)));
    collective(flat);
    if (bucket.length > 1 || !bucket[0]!.isContiguous) {
      let offset = 0;
      for (const t of bucket) {
        const part = flat.narrow(0, offset, t.numel).view(...t.shape);
        t.copy_(part);
        part.dispose();
        offset += t.numel;
      }
    }
    flat.dispose();
  });
}

export class DistributedDataParallel<M extends Module = Module> extends Module {
  /** The wrapped module (torch's ddp.module; Module.module is taken by the registration helper). */
  readonly wrapped: M;
  readonly group: ProcessGroup | undefined;
  private readonly capBytes: number;
  /** Parameters that train, in reverse registration order (the order backward produces their grads). */
  private readonly trained: Tensor[];
  private syncEnabled = true;
  /** Each parameter's grad (and its version) after the last synchronization: a backward that changed none did not involve this module. */
  private seen = new Map<Tensor, { grad: Tensor | null; version: number }>();
  private readonly removeHook: () => void;
  /** Gradient all-reduces run so far (buckets), for tests and logs. */
  allReduceCount = 0;

  constructor(module: M, opts: DdpOptions = {}) {
    super();
    this.wrapped = this.addModule("module", module);
    this.group = opts.group;
    this.capBytes = (opts.bucketCapMb ?? 25) * 1024 * 1024;
    getWorldSize(this.group); // throws the typed "not initialized" error first
    const params = module.parameters();
    if (opts.broadcastParameters ?? true) {
      const src = this.group?.ranks[0] ?? 0;
      for (const b of buckets(params, this.capBytes)) throughFlat(b, (flat) => broadcast(flat, src, this.group));
    }
    this.trained = params.filter((p) => p.requiresGrad).reverse();
    this.snapshot();
    this.removeHook = registerPostBackwardHook(() => this.afterBackward());
  }

  /**
   * torch's no_sync(): backwards inside fn accumulate gradients locally; the first synchronized backward after it
   * averages the sums. fn may be async (the scope ends when its promise settles).
   */
  noSync<T>(fn: () => T): T {
    const prev = this.syncEnabled;
    this.syncEnabled = false;
    let result: T;
    try {
      result = fn();
    } catch (err) {
      this.syncEnabled = prev;
      throw err;
    }
    if (result instanceof Promise) return result.finally(() => (this.syncEnabled = prev)) as T;
    this.syncEnabled = prev;
    return result;
  }

  /** Averages the gradients across the group now (what the post-backward hook does); a missing grad counts as zeros. */
  syncGradients(): void {
    // (-1 on a rank outside the group: the all-reduce refuses it, naming the group)
    if (getWorldSize(this.group) !== 1) {
      noGrad(() => {
        for (const p of this.trained) if (p.grad === null) p.grad = zerosLike(p);
      });
      for (const b of buckets(this.trained.map((p) => p.grad!), this.capBytes)) {
        throughFlat(b, (flat) => allReduce(flat, "avg", this.group));
        this.allReduceCount++;
      }
    }
    this.snapshot();
  }

  /** Stops averaging after backward (the wrapper is done; the module stays usable). */
  close(): void {
    this.removeHook();
  }

  private snapshot(): void {
    this.seen = new Map(this.trained.map((p) => [p, { grad: p.grad, version: p.grad?.storage.version ?? 0 }]));
  }

  private afterBackward(): void {
    if (!this.syncEnabled) return;
    const changed = this.trained.some((p) => {
      const s = this.seen.get(p)!;
      return p.grad !== null && (p.grad !== s.grad || p.grad.storage.version !== s.version);
    });
    if (changed) this.syncGradients();
  }
}
