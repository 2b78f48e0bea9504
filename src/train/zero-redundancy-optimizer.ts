/**
 * ZeroRedundancyOptimizer (torch.distributed.optim.ZeroRedundancyOptimizer's role, ZeRO stage 1): wraps an optimizer
 * over a model's parameters and shards its state across the ranks of a group. Each parameter belongs to one rank
 * (torch's sorted-greedy partition: largest first, each to the rank with the fewest elements so far); each rank
 * builds the inner optimizer over its own parameters only, so Adam's moments exist once across the group. step()
 * updates the owned parameters from their (already averaged: DistributedDataParallel) gradients, then broadcasts
 * each rank's parameters from it, so every replica stays identical: the step one optimizer takes over all of them.
 *
 * State dicts are torch's: consolidateStateDict(to) is a collective that gathers every rank's state on group rank
 * `to`, whose stateDict() then returns the whole optimizer's state in global parameter order (the plain optimizer's
 * format, so the same optimizer at any world size, or a single process, loads it); loadStateDict() takes such a
 * whole state on every rank and keeps this rank's part.
 *
 * @example
 * const ddp = new DistributedDataParallel(model);
 * const opt = new ZeroRedundancyOptimizer(ddp.parameters(), AdamW, { lr: 3e-4 });
 * model.loss(x, y).backward(); opt.step(); opt.zeroGrad();
 * opt.consolidateStateDict(0);                    // every rank
 * if (getRank() === 0) save(opt.stateDict());
 */
import { broadcast, getRank, getWorldSize, recv, send, type ProcessGroup } from "../distributed/index.js";
import { cat, fromBytes, noGrad, zeros, type Tensor } from "../tensor/index.js";
import { Optimizer, OptimizerError, type OptimizerStateDict, type ParamState, type SteppableOptimizer } from "./optim.js";

/** An optimizer class as torch's optimizer_class: constructed over a list of params with its options. */
export type OptimizerClass<O> = new (params: readonly Tensor[], options: O) => Optimizer;

export interface ZeroOptions {
  /** The group whose ranks share the state (default: the world). */
  group?: ProcessGroup;
}

/**
 * torch's sorted-greedy partition: params by element count, largest first (a stable sort: ties keep their order),
 * each to the rank holding the fewest elements so far (the lowest such rank). Returns each rank's global indices,
 * ascending.
 */
export function partitionParameters(numels: readonly number[], worldSize: number): number[][] {
  const sizes = new Array<number>(worldSize).fill(0);
  const parts: number[][] = Array.from({ length: worldSize }, () => []);
  const order = numels.map((n, i) => ({ n, i })).sort((a, b) => b.n - a.n);
  for (const { n, i } of order) {
    const rank = sizes.indexOf(Math.min(...sizes));
    parts[rank]!.push(i);
    sizes[rank]! += n;
  }
  return parts.map((p) => p.sort((a, b) => a - b));
}

function isOptimizerClass<O>(f: OptimizerClass<O> | ((params: readonly Tensor[]) => Optimizer)): f is OptimizerClass<O> {
  return (f as { prototype?: unknown }).prototype instanceof Optimizer;
}

/** Per-param state metadata sent ahead of its float32 buffers (consolidation). */
type StateMeta = { index: number; step: number; buffers: string[]; lengths: number[] } | { index: number; step: null };

export class ZeroRedundancyOptimizer<O = unknown> implements SteppableOptimizer {
  /** Every parameter, in the caller's order (global indices). */
  readonly params: readonly Tensor[];
  readonly group: ProcessGroup | undefined;
  /** This rank's place in the group and the group's size. */
  readonly rank: number;
  readonly worldSize: number;
  /** Global parameter indices owned by each group rank (torch's _partition_parameters()). */
  readonly partition: readonly (readonly number[])[];
  /** The inner optimizer over this rank's parameters only (torch's `optim`). */
  readonly localOptimizer: Optimizer;
  private readonly owned: readonly number[];
  /** The whole state, on the rank consolidateStateDict() targeted, until the next step or load. */
  private consolidated: OptimizerStateDict | null = null;

  /** `optimizer`: an optimizer class built with `options` (torch's optimizer_class, **defaults), or a function building one. */
  constructor(params: readonly Tensor[], optimizer: OptimizerClass<O> | ((params: readonly Tensor[]) => Optimizer), options?: O, zero: ZeroOptions = {}) {
    if (new Set(params).size !== params.length) throw new OptimizerError("[zero_redundancy_optimizer] a parameter appears more than once");
    this.params = [...params];
    this.group = zero.group;
    this.worldSize = getWorldSize(this.group); // throws the typed "not initialized" error first
    this.rank = this.group?.rank ?? getRank();
    if (this.rank < 0) throw new OptimizerError("[zero_redundancy_optimizer] this rank is not a member of the group");
    this.partition = partitionParameters(this.params.map((p) => p.numel), this.worldSize);
    this.owned = this.partition[this.rank]!;
    const mine = this.owned.map((i) => this.params[i]!);
    this.localOptimizer = isOptimizerClass(optimizer) ? new optimizer(mine, options as O) : optimizer(mine);
  }

  get lr(): number {
    return this.localOptimizer.lr;
  }
  set lr(v: number) {
    this.localOptimizer.lr = v;
  }
  get initialLr(): number | undefined {
    return this.localOptimizer.initialLr;
  }
  set initialLr(v: number | undefined) {
    this.localOptimizer.initialLr = v;
  }

  /** Updates this rank's parameters, then broadcasts every rank's so all replicas hold the new values. */
  step(): void {
    this.consolidated = null;
    this.localOptimizer.step();
    for (let r = 0; r < this.worldSize; r++) this.broadcastShard(r);
  }

  /** Drops every parameter's gradient, owned or not (torch's zero_grad(set_to_none=True)). */
  zeroGrad(): void {
    for (const p of this.params) {
      p.grad?.dispose();
      p.grad = null;
    }
  }

  /**
   * Gathers the whole optimizer state on group rank `to` (a collective: every rank of the group calls it); that
   * rank's stateDict() returns it until the next step() or loadStateDict().
   */
  consolidateStateDict(to = 0): void {
    if (!Number.isInteger(to) || to < 0 || to >= this.worldSize)
      throw new OptimizerError(`[zero_redundancy_optimizer] consolidateStateDict(to = ${to}): not a rank of this group of ${this.worldSize}`);
    const local = this.localOptimizer.stateDict();
    this.consolidated = null;
    if (this.rank !== to) {
      this.sendShard(local, to);
      return;
    }
    const states: (ParamState | null)[] = this.params.map(() => null);
    this.owned.forEach((g, k) => {
      const s = local.states[k];
      states[g] = s ? copyState(s) : null;
    });
    for (let r = 0; r < this.worldSize; r++) if (r !== to) for (const [g, s] of this.recvShard(r)) states[g] = s;
    const initial = local.initialLr !== undefined ? { initialLr: local.initialLr } : {};
    this.consolidated = { kind: local.kind, lr: local.lr, ...initial, states };
  }

  /** The whole state (consolidateStateDict() must have targeted this rank since the last step). */
  stateDict(): OptimizerStateDict {
    if (this.consolidated === null)
      throw new OptimizerError(
        `[zero_redundancy_optimizer] optimizer state has not been consolidated on rank ${this.rank} since the last step: ` +
          "call consolidateStateDict(to) on all ranks first, then stateDict() on rank `to`",
      );
    return this.consolidated;
  }

  /** Loads a whole state (a consolidated stateDict(), or a plain optimizer's over the same params) and keeps this rank's part. */
  loadStateDict(sd: OptimizerStateDict): void {
    if (sd.states.length !== this.params.length)
      throw new OptimizerError(`[zero_redundancy_optimizer] state has ${sd.states.length} params, the optimizer has ${this.params.length}`);
    this.consolidated = null;
    const initial = sd.initialLr !== undefined ? { initialLr: sd.initialLr } : {};
    this.localOptimizer.loadStateDict({ kind: sd.kind, lr: sd.lr, ...initial, states: this.owned.map((g) => sd.states[g] ?? null) });
  }

  /** Bytes of optimizer state this rank holds (its shard's buffers, master weights included). */
  localStateBytes(): number {
    return this.localOptimizer.stateDict().states.reduce((s, st) => s + (st ? Object.values(st.buffers).reduce((b, x) => b + x.byteLength, 0) : 0), 0);
  }

  /** Global rank of a group rank. */
  private globalRank(r: number): number {
    return this.group?.ranks[r] ?? r;
  }

  /** Every rank receives group rank r's parameters (one broadcast per dtype, through a flat copy). */
  private broadcastShard(r: number): void {
    const mine = this.partition[r]!.map((i) => this.params[i]!);
    const dtypes = [...new Set(mine.map((p) => p.dtype))];
    for (const dtype of dtypes) {
      const bucket = mine.filter((p) => p.dtype === dtype);
      noGrad(() => {
        const flat = cat(bucket.map((p) => p.reshape(p.numel)));
        broadcast(flat, this.globalRank(r), this.group);
        if (r !== this.rank) {
          let offset = 0;
          for (const p of bucket) {
            const part = flat.narrow(0, offset, p.numel).view(...p.shape);
            p.copy_(part);
            part.dispose();
            offset += p.numel;
          }
        }
        flat.dispose();
      });
    }
  }

  /**
   * Sends this rank's states to group rank `to`: a JSON header (its length first; each state's buffer names and
   * lengths), then the buffers in one float32 message.
   */
  private sendShard(local: OptimizerStateDict, to: number): void {
    const meta: StateMeta[] = this.owned.map((g, k) => {
      const s = local.states[k];
      return s ? { index: g, step: s.step, buffers: Object.keys(s.buffers), lengths: Object.values(s.buffers).map((b) => b.length) } : { index: g, step: null };
    });
    const header = new TextEncoder().encode(JSON.stringify(meta));
    const padded = new Uint8Array(Math.ceil(header.byteLength / 4) * 4).fill(32); // (spaces: JSON.parse ignores them)
    padded.set(header);
    const dst = this.globalRank(to);
    const send32 = (t: Tensor): void => {
      send(t, dst, this.group);
      t.dispose();
    };
    send32(fromBytes(new Uint8Array(new Int32Array([padded.byteLength]).buffer), "int32", [1]));
    send32(fromBytes(padded, "int32", [padded.byteLength / 4]));
    const data = local.states.flatMap((s) => (s ? Object.values(s.buffers) : []));
    const total = data.reduce((n, b) => n + b.length, 0);
    const flat = new Float32Array(total);
    let offset = 0;
    for (const b of data) {
      flat.set(b, offset);
      offset += b.length;
    }
    if (total > 0) send32(fromBytes(new Uint8Array(flat.buffer), "float32", [total]));
  }

  /** Receives group rank r's states (sendShard's messages) as [global index, state] pairs. */
  private recvShard(r: number): [number, ParamState | null][] {
    const src = this.globalRank(r);
    const recvInto = (t: Tensor): Uint8Array => {
      recv(t, src, this.group);
      const bytes = new Uint8Array((t.dataSync() as Int32Array | Float32Array).slice().buffer);
      t.dispose();
      return bytes;
    };
    const length = new Int32Array(recvInto(zeros([1], { dtype: "int32" })).buffer)[0]!;
    const meta = JSON.parse(new TextDecoder().decode(recvInto(zeros([length / 4], { dtype: "int32" })))) as StateMeta[];
    const total = meta.reduce((n, m) => n + (m.step === null ? 0 : m.lengths.reduce((a, b) => a + b, 0)), 0);
    const flat = total > 0 ? new Float32Array(recvInto(zeros([total])).buffer) : new Float32Array(0);
    let offset = 0;
    return meta.map((m): [number, ParamState | null] => {
      if (m.step === null) return [m.index, null];
      const buffers: Record<string, Float32Array> = {};
      m.buffers.forEach((name, b) => {
        buffers[name] = flat.slice(offset, offset + m.lengths[b]!);
        offset += m.lengths[b]!;
      });
      return [m.index, { step: m.step, buffers }];
    });
  }
}

function copyState(s: ParamState): ParamState {
  return { step: s.step, buffers: Object.fromEntries(Object.entries(s.buffers).map(([k, b]) => [k, Float32Array.from(b)])) };
}
