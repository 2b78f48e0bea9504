/**
 * torch.distributed's object collectives (all_gather_object, broadcast_object_list, gather_object,
 * scatter_object_list) over the byte collectives. torch pickles the objects; Kiln serializes them with the structured
 * clone algorithm (node:v8 serialize): plain objects and arrays, primitives (bigint, undefined, NaN included), Map,
 * Set, Date, RegExp, Error, ArrayBuffer and typed arrays, and cycles arrive intact. Functions, symbols and class
 * instances (a Tensor included: send tensors with the tensor collectives) are refused with a DistributedError rather
 * than arriving as plain objects without their prototype. Like torch's, these block, and every rank must call them.
 *
 * @example
 * const all: unknown[] = new Array(getWorldSize());
 * allGatherObject(all, { rank: getRank(), loss: 0.5 });   // every rank: [{ rank: 0, ... }, { rank: 1, ... }]
 * const cfg: unknown[] = [null];
 * broadcastObjectList(getRank() === 0 ? [{ lr: 1e-3 }] : cfg, 0);   // every rank's list: [{ lr: 0.001 }]
 */
import { deserialize, serialize } from "node:v8";
import { agree, type CollectiveName } from "./collectives.js";
import { DistributedError } from "./errors.js";
import { resolveGroup, type ProcessGroup } from "./process-group.js";

/** Prototypes the structured clone algorithm reproduces (a typed array's are checked with ArrayBuffer.isView). */
const CLONEABLE = new Set<unknown>([null, Object.prototype, Array.prototype, Map.prototype, Set.prototype, Date.prototype, RegExp.prototype, ArrayBuffer.prototype]);

/** Refuses what structured clone would drop or flatten: functions, symbols, class instances (path names the place). */
function checkCloneable(op: string, value: unknown, path: string, seen: Set<object>): void {
  if (typeof value === "function" || typeof value === "symbol")
    throw new DistributedError(op, `${path} is a ${typeof value}, which cannot be sent (objects travel as structured clones)`);
  if (typeof value !== "object" || value === null || seen.has(value)) return;
  seen.add(value);
  if (ArrayBuffer.isView(value) || value instanceof Error) return;
  const proto: unknown = Object.getPrototypeOf(value);
  if (!CLONEABLE.has(proto)) {
    const name = (value as { constructor?: { name?: string } }).constructor?.name ?? "an object with a custom prototype";
    throw new DistributedError(op, `${path} is a ${name} instance, which would arrive as a plain object: send plain data (tensors with the tensor collectives)`);
  }
  if (value instanceof Map) for (const [k, v] of value) { checkCloneable(op, k, `${path} key`, seen); checkCloneable(op, v, `${path}.get(${String(k)})`, seen); }
  else if (value instanceof Set) for (const v of value) checkCloneable(op, v, `${path} element`, seen);
  else for (const [k, v] of Object.entries(value)) checkCloneable(op, v, Array.isArray(value) ? `${path}[${k}]` : `${path}.${k}`, seen);
}

/** value's bytes, or the DistributedError that refuses it (exchanged as a length of -1 so that every rank fails alike). */
function encode(op: string, value: unknown, what: string): Uint8Array | DistributedError {
  try {
    checkCloneable(op, value, what, new Set());
    return serialize(value);
  } catch (err) {
    if (err instanceof DistributedError) return err;
    return new DistributedError(op, `${what} cannot be serialized: ${err instanceof Error ? err.message : String(err)}`);
  }
}

const decode = (bytes: Uint8Array): unknown => deserialize(bytes);

/** Throws mine when this rank's object was refused, or names the first rank (global) whose length is -1 (refused). */
function checkEncoded(op: string, g: ProcessGroup, mine: Uint8Array | DistributedError, lengths: ArrayLike<number>): asserts mine is Uint8Array {
  if (mine instanceof DistributedError) throw mine;
  const r = Array.from(lengths).indexOf(-1);
  if (r >= 0) throw new DistributedError(op, `rank ${g.ranks[r]}'s object cannot be serialized (see its error)`);
}

const lengthBytes = (mine: Uint8Array | DistributedError): Uint8Array =>
  new Uint8Array(new Float64Array([mine instanceof DistributedError ? -1 : mine.byteLength]).buffer);

/** Every rank's bytes (of any length) in group-rank order: one all-gather of the lengths, one of the padded bytes. */
function allGatherBlobs(op: CollectiveName, g: ProcessGroup, mine: Uint8Array | DistributedError, arg: number): Uint8Array[] {
  if (g.size === 1) {
    checkEncoded(op, g, mine, []);
    return [mine];
  }
  agree(g, op, null, 0, arg);
  const lengths = new Float64Array(g.size);
  g.call(op, (native, h) => native.allgather(h, lengthBytes(mine), new Uint8Array(lengths.buffer)));
  checkEncoded(op, g, mine, lengths);
  const width = Math.max(...lengths);
  const padded = new Uint8Array(width);
  padded.set(mine);
  const all = new Uint8Array(width * g.size);
  g.call(op, (native, h) => native.allgather(h, padded, all));
  return Array.from(lengths, (n, r) => all.subarray(r * width, r * width + n));
}

/** Group rank root's bytes (mine there, null elsewhere) on every rank: one broadcast of the length, one of the bytes. */
function broadcastBlob(op: CollectiveName, g: ProcessGroup, mine: Uint8Array | DistributedError | null, root: number): Uint8Array {
  const length = new Float64Array(1);
  if (mine !== null) length.set(new Float64Array(lengthBytes(mine).buffer));
  if (g.size > 1) g.call(op, (native, h) => native.broadcast(h, new Uint8Array(length.buffer), root));
  const lengths = g.ranks.map((_, r) => (r === root ? length[0]! : 0));
  const bytes = mine ?? new Uint8Array(Math.max(0, length[0]!));
  checkEncoded(op, g, bytes, lengths);
  if (g.size > 1 && bytes.byteLength > 0) g.call(op, (native, h) => native.broadcast(h, bytes, root));
  return bytes;
}

function checkListLength(op: string, list: unknown[], g: ProcessGroup, what: string): void {
  if (!Array.isArray(list) || list.length !== g.size)
    throw new DistributedError(op, `${what} must be an array of ${g.size} entries (one per rank of the group), got ${Array.isArray(list) ? `${list.length} entries` : String(list)}`);
}

/** torch.distributed.all_gather_object: objectList[r] = rank r's obj on every rank (objectList has one entry per rank). */
export function allGatherObject(objectList: unknown[], obj: unknown, group?: ProcessGroup): void {
  const name = "all_gather_object";
  const g = resolveGroup(name, group);
  checkListLength(name, objectList, g, "objectList");
  allGatherBlobs(name, g, encode(name, obj, "obj"), 0).forEach((b, r) => (objectList[r] = decode(b)));
}

/**
 * torch.distributed.broadcast_object_list: every rank's objectList[i] = rank src's objectList[i], in place (every
 * rank passes a list of the same length; src is a global rank).
 */
export function broadcastObjectList(objectList: unknown[], src = 0, group?: ProcessGroup): void {
  const name = "broadcast_object_list";
  const g = resolveGroup(name, group);
  if (!Array.isArray(objectList)) throw new DistributedError(name, `objectList must be an array, got ${String(objectList)}`);
  const root = g.groupRankOf(name, src, "src");
  const mine = root === g.rank ? encode(name, objectList, "objectList") : null;
  if (g.size > 1) agree(g, name, null, objectList.length, src);
  const got = decode(broadcastBlob(name, g, mine, root)) as unknown[];
  if (root !== g.rank) got.forEach((o, i) => (objectList[i] = o));
}

/** torch.distributed.gather_object: on rank dst, objectGatherList[r] = rank r's obj (the list on dst only, null elsewhere). */
export function gatherObject(obj: unknown, objectGatherList: unknown[] | null = null, dst = 0, group?: ProcessGroup): void {
  const name = "gather_object";
  const g = resolveGroup(name, group);
  const root = g.groupRankOf(name, dst, "dst");
  const given = objectGatherList !== null && objectGatherList !== undefined;
  if (root === g.rank) checkListLength(name, objectGatherList!, g, "objectGatherList");
  else if (given) throw new DistributedError(name, "objectGatherList must not be given on a rank other than the destination");
  const all = allGatherBlobs(name, g, encode(name, obj, "obj"), dst);
  if (root === g.rank) all.forEach((b, r) => (objectGatherList![r] = decode(b)));
}

/**
 * torch.distributed.scatter_object_list: scatterObjectOutputList[0] = rank src's scatterObjectInputList[this group
 * rank] (the input list, one entry per rank, is read on src only; the output list is non-empty).
 */
export function scatterObjectList(
  scatterObjectOutputList: unknown[], scatterObjectInputList: unknown[] | null = null, src = 0, group?: ProcessGroup,
): void {
  const name = "scatter_object_list";
  const g = resolveGroup(name, group);
  if (!Array.isArray(scatterObjectOutputList) || scatterObjectOutputList.length === 0)
    throw new DistributedError(name, "scatterObjectOutputList must be a non-empty array (its first entry receives this rank's object)");
  const root = g.groupRankOf(name, src, "src");
  if (root === g.rank) checkListLength(name, scatterObjectInputList!, g, "scatterObjectInputList");
  if (g.size > 1) agree(g, name, null, 0, src);
  const mine = root === g.rank ? encode(name, scatterObjectInputList, "scatterObjectInputList") : null;
  const all = decode(broadcastBlob(name, g, mine, root)) as unknown[];
  scatterObjectOutputList[0] = all[g.rank];
}
