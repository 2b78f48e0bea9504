/**
 * Process groups (torch.distributed's init_process_group / new_group / destroy_process_group) over gloo.
 * Rendezvous: env:// and tcp://host:port use a TCP store hosted by rank 0 (reachable across machines: each rank
 * then serves collectives on the interface that reaches MASTER_ADDR, or on GLOO_SOCKET_IFNAME); file:///path uses
 * gloo's FileStore (one machine, or a shared file system with GLOO_SOCKET_IFNAME; as torch's, the directory must be
 * fresh for each job, or stale keys of an earlier one would be read). A world of one rank needs no
 * peer and no addon: every collective is a local no-op.
 *
 * @example
 * // launched by `kiln run --nproc-per-node 2 script.js` (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)
 * initProcessGroup({ backend: "gloo" });
 * const t = tensor([getRank() + 1]);
 * allReduce(t);           // t = [3] on both ranks
 * destroyProcessGroup();
 */
import { env } from "../util/env.js";
import { DistributedBackendError, DistributedError, DistributedTimeoutError } from "./errors.js";
import { loadGloo, type GlooNative, type NativeHandle } from "./gloo-native.js";

export type DistributedBackend = "gloo";

export interface InitProcessGroupOptions {
  backend?: DistributedBackend;
  /** "env://" (default: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), "tcp://host:port" or "file:///path". */
  initMethod?: string;
  rank?: number;
  worldSize?: number;
  /** Rendezvous and per-collective timeout (torch's default for gloo: 30 minutes). */
  timeoutMs?: number;
  /**
   * Before each collective, ranks exchange (op, dtype, numel, root/op) and raise a DistributedError naming the
   * mismatch instead of exchanging garbage or hanging (torch's TORCH_DISTRIBUTED_DEBUG=DETAIL). One small
   * all-gather per collective, and a small header before each send so that recv refuses a message of another
   * size or dtype (every rank must agree on this option); default true.
   */
  consistencyChecks?: boolean;
}

export const DEFAULT_TIMEOUT_MS = 30 * 60 * 1000;

/** A set of ranks that run collectives together. Obtained from initProcessGroup (the world) or newGroup. */
export class ProcessGroup {
  /** @internal */
  constructor(
    /** Global ranks of the members, in group-rank order. */
    readonly ranks: readonly number[],
    /** This process's rank inside the group, -1 when it is not a member. */
    readonly rank: number,
    /** @internal null for a group of one and for non-members. */
    readonly handle: NativeHandle | null,
    readonly timeoutMs: number,
    readonly consistencyChecks: boolean,
    /** @internal */
    readonly native: GlooNative | null,
  ) {}

  private destroyed = false;

  get size(): number {
    return this.ranks.length;
  }
  get isMember(): boolean {
    return this.rank >= 0;
  }
  get isDestroyed(): boolean {
    return this.destroyed;
  }

  /** The group rank of a global rank; throws a DistributedError naming op and role when it is not a member. */
  groupRankOf(op: string, globalRank: number, role: string): number {
    const world = state?.world.size ?? 0;
    if (!Number.isInteger(globalRank) || globalRank < 0 || globalRank >= world)
      throw new DistributedError(op, `${role} rank ${globalRank} is out of range for a world of ${world} ranks`);
    const r = this.ranks.indexOf(globalRank);
    if (r < 0) throw new DistributedError(op, `${role} rank ${globalRank} is not a member of the group [${this.ranks.join(", ")}]`);
    return r;
  }

  /** Runs a native call, turning its coded failures into typed errors naming op. */
  call<T>(op: string, fn: (native: GlooNative, handle: NativeHandle) => T): T {
    if (this.native === null || this.handle === null) throw new DistributedError(op, "internal: a group of one has no transport");
    return callNative(op, this.timeoutMs, () => fn(this.native!, this.handle!));
  }

  /** @internal */
  destroy(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    if (this.handle !== null) this.native?.destroy(this.handle, true);
  }
}

/** Runs fn, mapping the addon's coded errors (KILN_DIST_TIMEOUT, KILN_DIST_BACKEND) to typed errors. */
export function callNative<T>(op: string, timeoutMs: number, fn: () => T): T {
  try {
    return fn();
  } catch (err) {
    const code = (err as { code?: unknown }).code;
    const message = err instanceof Error ? err.message : String(err);
    if (code === "KILN_DIST_TIMEOUT") throw new DistributedTimeoutError(op, `timed out after ${timeoutMs} ms: ${message}`);
    if (code === "KILN_DIST_BACKEND") throw new DistributedBackendError(op, message);
    throw err;
  }
}

interface State {
  world: ProcessGroup;
  native: GlooNative | null;
  store: NativeHandle | null;
  /** This rank's address for gloo's pairs ("iface:<name>" for GLOO_SOCKET_IFNAME). */
  address: string;
  /** Key prefix of this initialization (ranks init and destroy in the same order, so it agrees across ranks). */
  prefix: string;
  groups: ProcessGroup[];
  nextGroupId: number;
}

let state: State | null = null;
let generation = 0;

interface Rendezvous {
  kind: "tcp" | "file";
  host: string;
  port: number;
  path: string;
  rank: number;
  worldSize: number;
}

function parseInitMethod(opts: InitProcessGroupOptions): Rendezvous {
  const op = "init_process_group";
  const method = opts.initMethod ?? "env://";
  const need = (v: number | undefined, what: string): number => {
    if (v === undefined) throw new DistributedError(op, `${method} needs ${what}`);
    return v;
  };
  let r: Rendezvous;
  if (method === "env://") {
    const e = env.dist;
    if (e.masterAddr === undefined) throw new DistributedError(op, "env:// needs MASTER_ADDR (set by `kiln run`)");
    r = {
      kind: "tcp",
      host: e.masterAddr,
      port: need(e.masterPort, "MASTER_PORT (set by `kiln run`)"),
      path: "",
      rank: need(opts.rank ?? e.rank, "RANK (or the rank option)"),
      worldSize: need(opts.worldSize ?? e.worldSize, "WORLD_SIZE (or the worldSize option)"),
    };
  } else if (method.startsWith("tcp://")) {
    const m = /^tcp:\/\/(\[[^\]]+\]|[^:/]+):(\d+)\/?$/.exec(method);
    if (m === null) throw new DistributedError(op, `cannot parse init method ${method} (expected tcp://host:port)`);
    r = {
      kind: "tcp", host: m[1]!.replace(/^\[|\]$/g, ""), port: Number(m[2]), path: "",
      rank: need(opts.rank, "the rank option"), worldSize: need(opts.worldSize, "the worldSize option"),
    };
  } else if (method.startsWith("file://")) {
    const path = decodeURIComponent(method.slice("file://".length));
    if (!path.startsWith("/")) throw new DistributedError(op, `file init method needs an absolute path (file:///dir), got ${method}`);
    r = { kind: "file", host: "", port: 0, path, rank: need(opts.rank, "the rank option"), worldSize: need(opts.worldSize, "the worldSize option") };
  } else {
    throw new DistributedError(op, `unknown init method ${method} (env://, tcp://host:port, file:///path)`);
  }
  if (!Number.isInteger(r.worldSize) || r.worldSize < 1) throw new DistributedError(op, `world size must be a positive integer, got ${r.worldSize}`);
  if (!Number.isInteger(r.rank) || r.rank < 0 || r.rank >= r.worldSize)
    throw new DistributedError(op, `rank ${r.rank} is out of range for a world of ${r.worldSize} ranks`);
  if (r.kind === "tcp" && (!Number.isInteger(r.port) || r.port < 1 || r.port > 65535))
    throw new DistributedError(op, `port ${r.port} is not a TCP port`);
  return r;
}

/** The longest timeout taken (~35 years): the addon's clocks add it to now() in nanoseconds. */
const MAX_TIMEOUT_MS = 2 ** 40;

/** timeoutMs checked: the addon reads whole milliseconds (Infinity or NaN would read as 0: every wait failing at once). */
function checkTimeout(op: string, timeoutMs: number): number {
  if (typeof timeoutMs !== "number" || !(timeoutMs >= 1 && timeoutMs <= MAX_TIMEOUT_MS))
    throw new DistributedError(op, `timeoutMs must be a number of milliseconds in [1, 2^40], got ${timeoutMs}`);
  return timeoutMs;
}

/** torch.distributed.init_process_group: joins this process to the world group (blocks until every rank joined). */
export function initProcessGroup(opts: InitProcessGroupOptions = {}): ProcessGroup {
  const op = "init_process_group";
  if (state !== null) throw new DistributedError(op, "the default process group is already initialized (call destroyProcessGroup() first)");
  const backend = opts.backend ?? "gloo";
  if (backend !== "gloo") throw new DistributedError(op, `back end "${String(backend)}" is not supported (gloo is)`);
  const timeoutMs = checkTimeout(op, opts.timeoutMs ?? DEFAULT_TIMEOUT_MS);
  const checks = opts.consistencyChecks ?? true;
  const r = parseInitMethod(opts);
  const prefix = `kiln/${generation++}`;
  if (r.worldSize === 1) {
    const world = new ProcessGroup([0], 0, null, timeoutMs, checks, null);
    state = { world, native: null, store: null, address: "", prefix, groups: [], nextGroupId: 0 };
    return world;
  }
  const native = loadGloo();
  let store: NativeHandle;
  let address: string;
  if (r.kind === "tcp") {
    const s = callNative(op, timeoutMs, () => native.createTcpStore(r.host, r.port, r.rank === 0, timeoutMs));
    store = s.handle;
    address = s.localAddress;
  } else {
    store = callNative(op, timeoutMs, () => native.createFileStore(r.path, timeoutMs));
    address = "127.0.0.1";
  }
  const ifname = env.dist.socketIfname;
  if (ifname !== undefined) address = `iface:${ifname}`;
  let handle: NativeHandle;
  try {
    handle = callNative(op, timeoutMs, () => native.connect(store, `${prefix}/world`, r.rank, r.worldSize, address, timeoutMs));
  } catch (err) {
    native.destroy(store, false);
    throw err;
  }
  const ranks = Array.from({ length: r.worldSize }, (_, i) => i);
  const world = new ProcessGroup(ranks, r.rank, handle, timeoutMs, checks, native);
  state = { world, native, store, address, prefix, groups: [], nextGroupId: 0 };
  return world;
}

export function isInitialized(): boolean {
  return state !== null;
}

/** The world group; throws a DistributedError naming op when initProcessGroup has not run. */
export function worldGroup(op: string): ProcessGroup {
  if (state === null) throw new DistributedError(op, "the default process group is not initialized (call initProcessGroup() first)");
  return state.world;
}

/** The group a collective runs on (default: the world), checked to be alive and to contain this rank. */
export function resolveGroup(op: string, group?: ProcessGroup): ProcessGroup {
  const world = worldGroup(op);
  const g = group ?? world;
  if (g.isDestroyed) throw new DistributedError(op, `the group [${g.ranks.join(", ")}] was destroyed`);
  if (!g.isMember) throw new DistributedError(op, `rank ${world.rank} is not a member of the group [${g.ranks.join(", ")}]`);
  return g;
}

/** torch.distributed.get_rank: this process's rank in group (default the world), -1 when not a member. */
export function getRank(group?: ProcessGroup): number {
  return (group ?? worldGroup("get_rank")).rank;
}

/** torch.distributed.get_world_size: the number of ranks in group (default the world), -1 when not a member. */
export function getWorldSize(group?: ProcessGroup): number {
  const g = group ?? worldGroup("get_world_size");
  return g.isMember ? g.size : -1;
}

/** torch.distributed.get_backend: the back end of group (default the world): "gloo"; a non-member's group is refused, as torch's. */
export function getBackend(group?: ProcessGroup): DistributedBackend {
  const op = "get_backend";
  const world = worldGroup(op);
  const g = group ?? world;
  if (g.isDestroyed) throw new DistributedError(op, `the group [${g.ranks.join(", ")}] was destroyed`);
  if (!g.isMember) throw new DistributedError(op, `invalid process group: rank ${world.rank} is not a member of the group [${g.ranks.join(", ")}]`);
  return "gloo";
}

/** torch.distributed.get_process_group_ranks: the global ranks of group's members, in group-rank order (a copy). */
export function getProcessGroupRanks(group: ProcessGroup): number[] {
  worldGroup("get_process_group_ranks");
  if (!(group instanceof ProcessGroup)) throw new DistributedError("get_process_group_ranks", `expected a ProcessGroup, got ${String(group)}`);
  return [...group.ranks];
}

/**
 * torch.distributed.new_group: every rank of the world must call it, in the same order, with the same ranks
 * (default: all). Members connect among themselves; the others get a non-member group (getRank(g) === -1).
 */
export function newGroup(ranks?: readonly number[], opts: { timeoutMs?: number } = {}): ProcessGroup {
  const op = "new_group";
  const world = worldGroup(op);
  const s = state!;
  const members = [...new Set(ranks ?? world.ranks)].sort((a, b) => a - b);
  if (members.length === 0) throw new DistributedError(op, "a group needs at least one rank");
  for (const r of members)
    if (!Number.isInteger(r) || r < 0 || r >= world.size) throw new DistributedError(op, `rank ${r} is out of range for a world of ${world.size} ranks`);
  const id = s.nextGroupId++;
  const timeoutMs = checkTimeout(op, opts.timeoutMs ?? world.timeoutMs);
  const rank = members.indexOf(world.rank);
  let handle: NativeHandle | null = null;
  if (rank >= 0 && members.length > 1) {
    const native = s.native!;
    handle = callNative(op, timeoutMs, () => native.connect(s.store!, `${s.prefix}/group${id}`, rank, members.length, s.address, timeoutMs));
  }
  const g = new ProcessGroup(members, rank, handle, timeoutMs, world.consistencyChecks, s.native);
  s.groups.push(g);
  return g;
}

/** torch.distributed.destroy_process_group: one group, or (default) every group and the store. */
export function destroyProcessGroup(group?: ProcessGroup): void {
  if (state === null) return;
  if (group !== undefined && group !== state.world) {
    group.destroy();
    state.groups = state.groups.filter((g) => g !== group);
    return;
  }
  for (const g of state.groups) g.destroy();
  state.world.destroy();
  if (state.store !== null) state.native?.destroy(state.store, false);
  state = null;
}
