/**
 * torch.distributed's reduce, gather, scatter, all_to_all and all_to_all_single, built on the gloo collectives of
 * collectives.ts (all-reduce, all-gather, broadcast): each moves size x the bytes of a rooted gloo op, the price of
 * one small primitive set. Same conventions: host tensors, global ranks, blocking (asyncOp returns a completed Work).
 *
 * @example
 * // 2 ranks
 * const t = tensor([getRank() + 1]);
 * reduce(t, 0);                                           // rank 0: [3]; rank 1's t unchanged
 * gather(t, getRank() === 0 ? [zeros([1]), zeros([1])] : null, 0);
 * allToAllSingle(out, tensor([10 * getRank(), 10 * getRank() + 1]));  // rank r's out = [r, 10 + r]
 */
import { DTYPE_BYTES, DTYPES } from "../backends/dtype.js";
import { fromBytes, type Tensor } from "../tensor/index.js";
import {
  agree, checkParts, checkReduce, checkTensor, gatherBytes, readBytes, reduceInPlace, REDUCE_OPS, writeBytes,
  type CollectiveName, type ReduceOpName,
} from "./collectives.js";
import { DistributedError } from "./errors.js";
import { resolveGroup, type ProcessGroup } from "./process-group.js";
import { ranResult, type AsyncResult } from "./work.js";

/** torch.distributed.reduce: rank dst's t = op over every rank's t; the other ranks' t are left as they were. */
export function reduce<A extends boolean = false>(t: Tensor, dst: number, op: ReduceOpName = "sum", group?: ProcessGroup, asyncOp?: A): AsyncResult<A> {
  const name = "reduce";
  const g = resolveGroup(name, group);
  checkTensor(name, t);
  const root = g.groupRankOf(name, dst, "dst");
  checkReduce(name, op, t.dtype);
  if (g.size === 1 || t.numel === 0) return ranResult(asyncOp);
  agree(g, name, t.dtype, t.numel, REDUCE_OPS.indexOf(op) + REDUCE_OPS.length * dst);
  const target = root === g.rank ? t : fromBytes(readBytes(t), t.dtype, [t.numel], { device: t.device });
  reduceInPlace(name, g, target, op);
  if (target !== t) target.dispose();
  return ranResult(asyncOp);
}

/** The list a rooted collective takes on its root only (torch's gather_list / scatter_list): checked, or null elsewhere. */
function rootList(op: string, list: readonly Tensor[] | null | undefined, isRoot: boolean, what: string, t: Tensor, g: ProcessGroup): readonly Tensor[] | null {
  const given = list !== null && list !== undefined && list.length > 0;
  if (isRoot && !given) throw new DistributedError(op, `${what} must be given on the ${op === "gather" ? "destination" : "source"} rank`);
  if (!isRoot && given) throw new DistributedError(op, `${what} must not be given on a rank other than the ${op === "gather" ? "destination" : "source"}`);
  if (!isRoot) return null;
  checkParts(op, list!, t, g, what);
  return list!;
}

/** torch.distributed.gather: on rank dst, gatherList[r] = rank r's t (gatherList is given on dst only, null elsewhere). */
export function gather<A extends boolean = false>(
  t: Tensor, gatherList: readonly Tensor[] | null = null, dst = 0, group?: ProcessGroup, asyncOp?: A,
): AsyncResult<A> {
  const name = "gather";
  const g = resolveGroup(name, group);
  checkTensor(name, t);
  const root = g.groupRankOf(name, dst, "dst");
  const list = rootList(name, gatherList, root === g.rank, "gatherList", t, g);
  const all = gatherBytes(name, g, t, readBytes(t), dst);
  const n = all.byteLength / g.size;
  list?.forEach((p, r) => writeBytes(p, all.subarray(r * n, (r + 1) * n)));
  return ranResult(asyncOp);
}

/** torch.distributed.scatter: every rank's t = rank src's scatterList[its group rank] (scatterList on src only). */
export function scatter<A extends boolean = false>(
  t: Tensor, scatterList: readonly Tensor[] | null = null, src = 0, group?: ProcessGroup, asyncOp?: A,
): AsyncResult<A> {
  const name = "scatter";
  const g = resolveGroup(name, group);
  checkTensor(name, t);
  const root = g.groupRankOf(name, src, "src");
  const list = rootList(name, scatterList, root === g.rank, "scatterList", t, g);
  const n = t.numel * DTYPE_BYTES[t.dtype];
  if (g.size === 1) {
    writeBytes(t, readBytes(list![0]!));
    return ranResult(asyncOp);
  }
  agree(g, name, t.dtype, t.numel, src);
  const all = new Uint8Array(n * g.size);
  list?.forEach((p, r) => all.set(readBytes(p), r * n));
  if (n > 0) g.call(name, (native, h) => native.broadcast(h, all, root));
  writeBytes(t, all.subarray(g.rank * n, (g.rank + 1) * n));
  return ranResult(asyncOp);
}

/**
 * Rank i's sends[j] bytes go to rank j, which expects recvBytes[i] of them from i: one all-gather of every rank's
 * (dtype, sizes) and one of the padded concatenations. A size or dtype that disagrees fails on every rank alike.
 */
function exchange(name: CollectiveName, g: ProcessGroup, like: Tensor, sends: Uint8Array[], recvBytes: readonly number[]): Uint8Array[] {
  if (g.size > 1) agree(g, name, like.dtype, 0, 0);
  const mine = new Float64Array([DTYPES.indexOf(like.dtype), ...sends.map((b) => b.byteLength), ...recvBytes]);
  const table = new Float64Array(mine.length * g.size); // rank r: [dtype, sends to 0..n-1, expects from 0..n-1]
  if (g.size === 1) table.set(mine);
  else g.call(name, (native, h) => native.allgather(h, new Uint8Array(mine.buffer), new Uint8Array(table.buffer)));
  const row = (r: number): Float64Array => table.subarray(r * mine.length, (r + 1) * mine.length);
  const size = DTYPE_BYTES[like.dtype];
  for (let i = 0; i < g.size; i++) {
    if (row(i)[0] !== mine[0])
      throw new DistributedError(name, `ranks disagree: rank ${g.ranks[i]} sends ${DTYPES[row(i)[0]!] ?? "?"} but rank ${g.ranks[g.rank]} ${like.dtype}`);
    for (let j = 0; j < g.size; j++) {
      const [sent, expected] = [row(i)[1 + j]!, row(j)[1 + g.size + i]!];
      if (sent !== expected)
        throw new DistributedError(name, `rank ${g.ranks[i]} sends ${sent / size} elements to rank ${g.ranks[j]}, which expects ${expected / size}`);
    }
  }
  if (g.size === 1) return sends;
  const width = Math.max(...Array.from({ length: g.size }, (_, r) => row(r).subarray(1, 1 + g.size).reduce((a, b) => a + b, 0)));
  const blob = new Uint8Array(width);
  let at = 0;
  for (const b of sends) blob.set(b, (at += b.byteLength) - b.byteLength);
  const all = new Uint8Array(width * g.size);
  if (width > 0) g.call(name, (native, h) => native.allgather(h, blob, all));
  return Array.from({ length: g.size }, (_, j) => {
    const start = j * width + row(j).subarray(1, 1 + g.rank).reduce((a, b) => a + b, 0);
    return all.subarray(start, start + recvBytes[j]!);
  });
}

/** torch.distributed.all_to_all: outputList[j] = rank j's inputList[this rank] (shapes may differ per pair; dtypes agree). */
export function allToAll<A extends boolean = false>(
  outputList: readonly Tensor[], inputList: readonly Tensor[], group?: ProcessGroup, asyncOp?: A,
): AsyncResult<A> {
  const name = "all_to_all";
  const g = resolveGroup(name, group);
  for (const [what, list] of [["outputList", outputList], ["inputList", inputList]] as const) {
    if (list.length !== g.size) throw new DistributedError(name, `${what} has ${list.length} tensors for a group of ${g.size} ranks`);
    list.forEach((p, i) => checkTensor(name, p, `${what}[${i}]`));
  }
  const like = outputList[0]!;
  for (const [what, list] of [["outputList", outputList], ["inputList", inputList]] as const)
    list.forEach((p, i) => {
      if (p.dtype !== like.dtype) throw new DistributedError(name, `${what}[${i}] is ${p.dtype} but outputList[0] is ${like.dtype}`);
    });
  const got = exchange(name, g, like, inputList.map(readBytes), outputList.map((p) => p.numel * DTYPE_BYTES[p.dtype]));
  outputList.forEach((p, j) => writeBytes(p, got[j]!));
  return ranResult(asyncOp);
}

/** Row counts of t's dim 0 per rank: splits, or equal parts (torch's output/input_split_sizes). */
function rowSplits(op: string, t: Tensor, splits: readonly number[] | undefined, what: string, size: number): number[] {
  const rows = t.shape[0] ?? 1;
  if (splits === undefined) {
    if (rows % size !== 0) throw new DistributedError(op, `${what} has ${rows} rows, not divisible by the group's ${size} ranks (give split sizes)`);
    return Array.from({ length: size }, () => rows / size);
  }
  if (splits.length !== size) throw new DistributedError(op, `${what} split sizes have ${splits.length} entries for a group of ${size} ranks`);
  if (splits.some((s) => !Number.isInteger(s) || s < 0)) throw new DistributedError(op, `${what} split sizes must be non-negative integers, got [${splits.join(", ")}]`);
  const sum = splits.reduce((a, b) => a + b, 0);
  if (sum !== rows) throw new DistributedError(op, `${what} split sizes [${splits.join(", ")}] add up to ${sum}, but it has ${rows} rows`);
  return [...splits];
}

/**
 * torch.distributed.all_to_all_single: input's dim 0 is split over the ranks (inputSplitSizes rows each, default
 * equal), and output = the chunks each rank sends this one, in rank order (outputSplitSizes rows from each).
 */
export function allToAllSingle<A extends boolean = false>(
  output: Tensor, input: Tensor, outputSplitSizes?: readonly number[], inputSplitSizes?: readonly number[], group?: ProcessGroup, asyncOp?: A,
): AsyncResult<A> {
  const name = "all_to_all_single";
  const g = resolveGroup(name, group);
  checkTensor(name, output, "output");
  checkTensor(name, input, "input");
  if (output.dtype !== input.dtype) throw new DistributedError(name, `output is ${output.dtype} but the input is ${input.dtype}`);
  const rowBytes = (t: Tensor): number => t.shape.slice(1).reduce((a, b) => a * b, 1) * DTYPE_BYTES[t.dtype];
  if (rowBytes(input) !== rowBytes(output))
    throw new DistributedError(name, `output rows [${output.shape.slice(1).join(", ")}] differ from the input's [${input.shape.slice(1).join(", ")}]`);
  const ins = rowSplits(name, input, inputSplitSizes, "input", g.size);
  const outs = rowSplits(name, output, outputSplitSizes, "output", g.size);
  const bytes = readBytes(input);
  const sends: Uint8Array[] = [];
  let at = 0;
  for (const rows of ins) sends.push(bytes.subarray(at, (at += rows * rowBytes(input))));
  const got = exchange(name, g, output, sends, outs.map((rows) => rows * rowBytes(output)));
  const out = new Uint8Array(output.numel * DTYPE_BYTES[output.dtype]);
  at = 0;
  for (const b of got) out.set(b, (at += b.byteLength) - b.byteLength);
  writeBytes(output, out);
  return ranResult(asyncOp);
}
