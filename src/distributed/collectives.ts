/**
 * Collectives on host tensors, in place and blocking like torch.distributed's (async_op=False; with asyncOp they
 * return a completed Work); isend/irecv return at once. Ranks are global ranks (torch's src/dst), groups default to
 * the world. Reductions run in gloo on float32, int32 and int64; bfloat16/float16 are reduced in float32 and rounded
 * back (gloo has no bf16 math); "avg" divides a float sum by the group size; band/bor/bxor take integers only.
 * Non-reducing collectives (broadcast, all_gather, send/recv) move raw bytes of any dtype.
 *
 * @example
 * const t = tensor([getRank() + 1, 10]);      // rank 0: [1, 10], rank 1: [2, 10]
 * allReduce(t, "max");                        // both: [2, 10]
 * const parts = [zeros([2]), zeros([2])];
 * allGather(parts, t);                        // both: [[2, 10], [2, 10]]
 */
import { DTYPE_BYTES, DTYPES, type DType } from "../backends/dtype.js";
import { fromBytes, noGrad, flushDeferred, type Tensor } from "../tensor/index.js";
import { UnsupportedError } from "../util/errors.js";
import { DistributedError } from "./errors.js";
import { NativeReduce, type NativeElement, type NativeWork } from "./gloo-native.js";
import { callNative, resolveGroup, type ProcessGroup } from "./process-group.js";
import { ranResult, Work, type AsyncResult } from "./work.js";

export type ReduceOpName = "sum" | "avg" | "product" | "min" | "max" | "band" | "bor" | "bxor";
/** torch.distributed.ReduceOp's names (BAND, BOR, BXOR: integer tensors only). */
export const ReduceOp = {
  SUM: "sum", AVG: "avg", PRODUCT: "product", MIN: "min", MAX: "max", BAND: "band", BOR: "bor", BXOR: "bxor",
} as const satisfies Record<string, ReduceOpName>;
export const REDUCE_OPS: readonly ReduceOpName[] = ["sum", "avg", "product", "min", "max", "band", "bor", "bxor"];
const BITWISE_OPS: readonly ReduceOpName[] = ["band", "bor", "bxor"];

/** Op codes exchanged by the consistency check (index = code). */
const OPS = [
  "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "barrier",
  "reduce", "gather", "scatter", "all_to_all", "all_to_all_single",
  "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
] as const;
export type CollectiveName = (typeof OPS)[number];

// ---- host bytes of a tensor ----

export function checkTensor(op: string, t: Tensor, what = "tensor"): void {
  t.view_(op); // disposed check
  if (t.storage.buffer.host === undefined)
    throw new UnsupportedError(op, `${what} on ${t.device.name}: the gloo back end takes host (cpu) tensors`);
}

/**
 * t's elements as row-major bytes: t's own host memory when it is contiguous (waiting for pending work on it, no
 * copy), else a contiguous staging copy. finish(true) makes writes into bytes visible in t (bumping its version like
 * any in-place op, or copying the staging tensor back through t's strides); every use ends with finish.
 */
export function hostBytes(t: Tensor): { bytes: Uint8Array; finish(written: boolean): void } {
  flushDeferred();
  const c = t.isContiguous ? t : noGrad(() => t.contiguous());
  const size = DTYPE_BYTES[c.dtype];
  const bytes = new Uint8Array(c.storage.buffer.host!, c.offset * size, c.numel * size); // .host waits for the stream
  return {
    bytes,
    finish(written: boolean): void {
      if (written && c === t) t.storage.version++;
      if (written && c !== t) noGrad(() => t.copy_(c));
      if (c !== t) c.dispose();
    },
  };
}

/** A copy of t's elements in row-major order. */
export function readBytes(t: Tensor): Uint8Array {
  const h = hostBytes(t);
  const copy = h.bytes.slice();
  h.finish(false);
  return copy;
}

/** Writes row-major bytes into t in place (any strides). */
export function writeBytes(t: Tensor, bytes: Uint8Array): void {
  const h = hostBytes(t);
  h.bytes.set(bytes);
  h.finish(true);
}

function nativeElement(dtype: DType): NativeElement | null {
  return dtype === "float32" ? 0 : dtype === "int32" ? 1 : dtype === "int64" ? 2 : null;
}

export function checkReduce(op: string, reduce: ReduceOpName, dtype: DType): void {
  if (!REDUCE_OPS.includes(reduce)) throw new DistributedError(op, `unknown reduce op "${String(reduce)}" (${REDUCE_OPS.join(", ")})`);
  if (BITWISE_OPS.includes(reduce) && dtype !== "int32" && dtype !== "int64")
    throw new UnsupportedError(op, `${reduce} needs an integer tensor (int32, int64), got ${dtype}`);
  const viaF32 = dtype === "bfloat16" || dtype === "float16";
  if (nativeElement(dtype) === null && !viaF32) throw new UnsupportedError(op, `${dtype} reductions are not supported (float32, bfloat16, float16, int32, int64)`);
  if (reduce === "avg" && (dtype === "int32" || dtype === "int64"))
    throw new UnsupportedError(op, `avg of ${dtype} would truncate: use sum and divide, or a float dtype`);
}

/** Reduces t across g in place (t already checked). bf16/f16 travel as float32. */
export function reduceInPlace(op: string, g: ProcessGroup, t: Tensor, reduce: ReduceOpName): void {
  if (t.dtype === "bfloat16" || t.dtype === "float16") {
    const f = noGrad(() => t.to("float32"));
    reduceInPlace(op, g, f, reduce);
    noGrad(() => t.copy_(f));
    f.dispose();
    return;
  }
  const host = hostBytes(t);
  const { buffer, byteOffset } = host.bytes;
  const el = nativeElement(t.dtype)!;
  const n = t.numel;
  const view = el === 0 ? new Float32Array(buffer, byteOffset, n) : el === 1 ? new Int32Array(buffer, byteOffset, n) : new BigInt64Array(buffer, byteOffset, n);
  try {
    g.call(op, (native, h) => native.allreduce(h, view, el, NativeReduce[reduce === "avg" ? "sum" : reduce]));
    if (reduce === "avg") {
      const f = view as Float32Array;
      for (let i = 0; i < n; i++) f[i] = f[i]! / g.size;
    }
  } finally {
    host.finish(true);
  }
}

/**
 * With consistencyChecks, every rank shares (op, dtype, numel, arg) and all raise the same DistributedError when
 * they differ: a mismatched collective would otherwise exchange garbage or wait for the timeout.
 */
export function agree(g: ProcessGroup, op: CollectiveName, dtype: DType | null, numel: number, arg: number): void {
  if (!g.consistencyChecks) return;
  const mine = new Int32Array([OPS.indexOf(op), dtype === null ? -1 : DTYPES.indexOf(dtype), numel, arg]);
  const all = new Int32Array(mine.length * g.size);
  g.call(op, (native, h) => native.allgather(h, new Uint8Array(mine.buffer), new Uint8Array(all.buffer)));
  const describe = (r: number): string => {
    const [o, d, n, a] = all.subarray(r * 4, r * 4 + 4);
    const name = OPS[o!] ?? "?";
    const reduceOp = REDUCE_OPS[a! % REDUCE_OPS.length] ?? a;
    const arg =
      name === "broadcast" || name === "scatter" || name === "broadcast_object_list" || name === "scatter_object_list" ? `src ${a}`
      : name === "gather" || name === "gather_object" ? `dst ${a}`
      : name === "reduce" ? `${reduceOp}, dst ${Math.floor(a! / REDUCE_OPS.length)}`
      : name === "all_reduce" || name.startsWith("reduce_scatter") ? `${reduceOp}`
      : "";
    const what = d! >= 0 ? `${DTYPES[d!]} x ${n}` : name === "broadcast_object_list" ? `${n} objects` : "";
    return `${name}(${[what, arg].filter((p) => p !== "").join(", ")})`;
  };
  for (let r = 0; r < g.size; r++) {
    if (all.subarray(r * 4, r * 4 + 4).every((v, i) => v === mine[i])) continue;
    throw new DistributedError(op, `ranks disagree: group rank ${g.rank} called ${describe(g.rank)} but group rank ${r} called ${describe(r)}`);
  }
}

// ---- collectives ----

/** torch.distributed.all_reduce: t = op over every rank's t, in place. */
export function allReduce<A extends boolean = false>(t: Tensor, op: ReduceOpName = "sum", group?: ProcessGroup, asyncOp?: A): AsyncResult<A> {
  const name = "all_reduce";
  const g = resolveGroup(name, group);
  checkTensor(name, t);
  checkReduce(name, op, t.dtype);
  if (g.size > 1) {
    agree(g, name, t.dtype, t.numel, REDUCE_OPS.indexOf(op));
    if (t.numel > 0) reduceInPlace(name, g, t, op);
  }
  return ranResult(asyncOp);
}

/** torch.distributed.broadcast: every rank's t = rank src's t (src is a global rank). */
export function broadcast<A extends boolean = false>(t: Tensor, src: number, group?: ProcessGroup, asyncOp?: A): AsyncResult<A> {
  const name = "broadcast";
  const g = resolveGroup(name, group);
  checkTensor(name, t);
  const root = g.groupRankOf(name, src, "src");
  if (g.size === 1) return ranResult(asyncOp);
  agree(g, name, t.dtype, t.numel, src);
  if (t.numel === 0) return ranResult(asyncOp);
  const host = hostBytes(t);
  try {
    g.call(name, (native, h) => native.broadcast(h, host.bytes, root));
  } finally {
    host.finish(root !== g.rank);
  }
  return ranResult(asyncOp);
}

export function checkParts(op: string, parts: readonly Tensor[], like: Tensor, g: ProcessGroup, what: string): void {
  if (parts.length !== g.size) throw new DistributedError(op, `${what} has ${parts.length} tensors for a group of ${g.size} ranks`);
  parts.forEach((p, i) => {
    checkTensor(op, p, `${what}[${i}]`);
    if (p.dtype !== like.dtype) throw new DistributedError(op, `${what}[${i}] is ${p.dtype} but the tensor is ${like.dtype}`);
    if (p.shape.length !== like.shape.length || p.shape.some((d, k) => d !== like.shape[k]))
      throw new DistributedError(op, `${what}[${i}] has shape [${p.shape.join(", ")}] but the tensor has [${like.shape.join(", ")}]`);
  });
}

/** torch.distributed.all_gather: outList[r] = rank r's t (outList has one tensor of t's shape and dtype per rank). */
export function allGather<A extends boolean = false>(outList: readonly Tensor[], t: Tensor, group?: ProcessGroup, asyncOp?: A): AsyncResult<A> {
  const name = "all_gather";
  const g = resolveGroup(name, group);
  checkTensor(name, t);
  checkParts(name, outList, t, g, "outList");
  const out = gatherBytes(name, g, t, readBytes(t));
  const n = out.byteLength / g.size;
  outList.forEach((p, r) => writeBytes(p, out.subarray(r * n, (r + 1) * n)));
  return ranResult(asyncOp);
}

/** Every rank's bytes (of like's dtype and numel, checked across ranks) in group-rank order: all_gather's exchange. */
export function gatherBytes(name: CollectiveName, g: ProcessGroup, like: Tensor, bytes: Uint8Array, arg = 0): Uint8Array {
  if (g.size === 1) return bytes;
  agree(g, name, like.dtype, like.numel, arg);
  const out = new Uint8Array(bytes.byteLength * g.size);
  if (bytes.byteLength > 0) g.call(name, (native, h) => native.allgather(h, bytes, out));
  return out;
}

/** torch.distributed.all_gather_into_tensor: out (size x t.numel elements, e.g. [size * n] or [size, n]) = the ranks' t in rank order. */
export function allGatherIntoTensor<A extends boolean = false>(out: Tensor, t: Tensor, group?: ProcessGroup, asyncOp?: A): AsyncResult<A> {
  const name = "all_gather_into_tensor";
  const g = resolveGroup(name, group);
  checkTensor(name, t);
  checkTensor(name, out, "output");
  if (out.dtype !== t.dtype) throw new DistributedError(name, `output is ${out.dtype} but the input is ${t.dtype}`);
  if (out.numel !== t.numel * g.size)
    throw new DistributedError(name, `output has ${out.numel} elements; a group of ${g.size} ranks gathering ${t.numel} needs ${t.numel * g.size}`);
  const bytes = readBytes(t);
  if (g.size === 1) {
    writeBytes(out, bytes);
    return ranResult(asyncOp);
  }
  agree(g, name, t.dtype, t.numel, 0);
  const all = hostBytes(out); // gathered straight into out's memory when it is contiguous
  try {
    if (bytes.byteLength > 0) g.call(name, (native, h) => native.allgather(h, bytes, all.bytes));
  } finally {
    all.finish(true);
  }
  return ranResult(asyncOp);
}

/** Reduces the concatenation of every rank's inputs and keeps this rank's chunk (an all-reduce: 2x the bytes of a ring reduce-scatter). */
function reduceScatterBytes(name: CollectiveName, g: ProcessGroup, out: Tensor, concat: Uint8Array, op: ReduceOpName): void {
  const whole = fromBytes(concat, out.dtype, [out.numel * g.size], { device: out.device });
  reduceInPlace(name, g, whole, op);
  const chunk = whole.narrow(0, g.rank * out.numel, out.numel);
  writeBytes(out, readBytes(chunk));
  chunk.dispose();
  whole.dispose();
}

/** torch.distributed.reduce_scatter: out = op over ranks of inputList[this rank]. */
export function reduceScatter<A extends boolean = false>(
  out: Tensor, inputList: readonly Tensor[], op: ReduceOpName = "sum", group?: ProcessGroup, asyncOp?: A,
): AsyncResult<A> {
  const name = "reduce_scatter";
  const g = resolveGroup(name, group);
  checkTensor(name, out, "output");
  checkParts(name, inputList, out, g, "inputList");
  checkReduce(name, op, out.dtype);
  if (g.size === 1) {
    writeBytes(out, readBytes(inputList[0]!));
    return ranResult(asyncOp);
  }
  agree(g, name, out.dtype, out.numel, REDUCE_OPS.indexOf(op));
  const n = out.numel * DTYPE_BYTES[out.dtype];
  const concat = new Uint8Array(n * g.size);
  inputList.forEach((t, r) => concat.set(readBytes(t), r * n));
  if (n > 0) reduceScatterBytes(name, g, out, concat, op);
  return ranResult(asyncOp);
}

/** torch.distributed.reduce_scatter_tensor: input holds size x out.numel elements; out = op over ranks of this rank's chunk. */
export function reduceScatterTensor<A extends boolean = false>(
  out: Tensor, input: Tensor, op: ReduceOpName = "sum", group?: ProcessGroup, asyncOp?: A,
): AsyncResult<A> {
  const name = "reduce_scatter_tensor";
  const g = resolveGroup(name, group);
  checkTensor(name, out, "output");
  checkTensor(name, input, "input");
  if (input.dtype !== out.dtype) throw new DistributedError(name, `input is ${input.dtype} but the output is ${out.dtype}`);
  if (input.numel !== out.numel * g.size)
    throw new DistributedError(name, `input has ${input.numel} elements; a group of ${g.size} ranks scattering ${out.numel} each needs ${out.numel * g.size}`);
  checkReduce(name, op, out.dtype);
  if (g.size === 1) {
    writeBytes(out, readBytes(input));
    return ranResult(asyncOp);
  }
  agree(g, name, out.dtype, out.numel, REDUCE_OPS.indexOf(op));
  if (out.numel > 0) reduceScatterBytes(name, g, out, readBytes(input), op);
  return ranResult(asyncOp);
}

/** torch.distributed.barrier: returns when every rank of the group has entered it. */
export function barrier<A extends boolean = false>(group?: ProcessGroup, asyncOp?: A): AsyncResult<A> {
  const name = "barrier";
  const g = resolveGroup(name, group);
  if (g.size > 1) {
    agree(g, name, null, 0, 0);
    g.call(name, (native, h) => native.barrier(h));
  }
  return ranResult(asyncOp);
}

export function peer(op: string, g: ProcessGroup, globalRank: number, role: string): number {
  const r = g.groupRankOf(op, globalRank, role);
  if (r === g.rank) throw new DistributedError(op, `${role} rank ${globalRank} is this rank: a rank cannot ${op} to itself`);
  return r;
}

/** The tag of monitoredBarrier's messages, kept from users so that they never match a user's send or recv. */
export const MONITORED_BARRIER_TAG = 0xffffffff;

function checkTag(op: string, tag: number): void {
  if (!Number.isInteger(tag) || tag < 0 || tag >= MONITORED_BARRIER_TAG)
    throw new DistributedError(op, `tag must be an integer in [0, 2^32 - 1), got ${tag} (2^32 - 1 is monitored_barrier's)`);
}

/** torch.distributed.send: blocks until rank dst (global) has received t (matched by tag). */
export function send(t: Tensor, dst: number, group?: ProcessGroup, tag = 0): void {
  checkTag("send", tag);
  startSend("send", t, dst, group, tag, true).wait();
}

/**
 * torch.distributed.recv: fills t from rank src (global), matched by tag; returns src. The dtypes and sizes must
 * agree: with consistencyChecks (the default) a message of another dtype or size is received and dropped, and recv
 * throws a DistributedError naming both (t is left as it was, the sender carries on); without them gloo aborts the
 * process on a longer message and fills only the front of t from a shorter one.
 */
export function recv(t: Tensor, src: number, group?: ProcessGroup, tag = 0): number {
  checkTag("recv", tag);
  startRecv("recv", t, src, group, tag, true).wait();
  return src;
}

/**
 * torch.distributed.isend: posts the send of (a copy of) t to rank dst and returns at once; the Work's wait() blocks
 * until dst has received it. Matches recv and irecv as send does.
 */
export function isend(t: Tensor, dst: number, group?: ProcessGroup, tag = 0): Work {
  checkTag("isend", tag);
  return startSend("isend", t, dst, group, tag, false);
}

/**
 * torch.distributed.irecv: posts the receive of a message from rank src into t and returns at once; t holds the
 * message once the Work's wait() has returned or isCompleted() is true. Receives from one rank and tag take its
 * messages in the order they were posted; a message of another dtype or size is refused as recv refuses it.
 */
export function irecv(t: Tensor, src: number, group?: ProcessGroup, tag = 0): Work {
  checkTag("irecv", tag);
  return startRecv("irecv", t, src, group, tag, false);
}

/**
 * With consistencyChecks a message is preceded by a header (dtype, byte length) on the same tag, so that the receiver
 * can refuse a message of another size: gloo itself aborts the receiving process on a longer message and silently
 * fills only the front of a shorter one.
 */
function messageHeader(dtype: DType, byteLength: number): Uint8Array {
  return new Uint8Array(new Float64Array([DTYPES.indexOf(dtype), byteLength]).buffer);
}

/** Why a message with this header cannot be received into t, or null when its dtype and size are t's. */
function refusal(header: Float64Array, t: Tensor, src: number, tag: number): string | null {
  const [dtypeIndex, byteLength] = [header[0]!, header[1]!];
  const sentDtype = DTYPES[dtypeIndex] ?? `dtype #${dtypeIndex}`;
  if (sentDtype === t.dtype && byteLength === t.numel * DTYPE_BYTES[t.dtype]) return null;
  const sentNumel = DTYPES[dtypeIndex] === undefined ? "?" : String(byteLength / DTYPE_BYTES[DTYPES[dtypeIndex]]);
  return `rank ${src} sent ${sentDtype} x ${sentNumel} (tag ${tag}) but this rank receives into ${t.dtype} x ${t.numel}`;
}

/** @internal (tag checked by the caller) Posts the send of a copy of t (taken by the native side, which waits for the send on its own thread unless blocking). */
export function startSend(name: string, t: Tensor, dst: number, group: ProcessGroup | undefined, tag: number, blocking: boolean): Work {
  const g = resolveGroup(name, group);
  checkTensor(name, t);
  const to = peer(name, g, dst, "dst");
  const host = hostBytes(t);
  const header = g.consistencyChecks ? messageHeader(t.dtype, host.bytes.byteLength) : null;
  let work: NativeWork;
  try {
    work = g.call(name, (native, h) => native.isend(h, header, host.bytes, to, tag, blocking));
  } finally {
    host.finish(false);
  }
  const native = g.native!;
  return new Work(
    () => native.workDone(work),
    () => callNative(name, g.timeoutMs, () => native.workWait(work, null)),
    name,
  );
}

/** @internal (tag checked by the caller) Posts the receive of a message into t, written into t when the Work is waited for (or found completed). */
export function startRecv(name: string, t: Tensor, src: number, group: ProcessGroup | undefined, tag: number, blocking: boolean): Work {
  const g = resolveGroup(name, group);
  checkTensor(name, t);
  const from = peer(name, g, src, "src");
  const byteLength = t.numel * DTYPE_BYTES[t.dtype];
  const expected = g.consistencyChecks ? messageHeader(t.dtype, byteLength) : null;
  const work = g.call(name, (native, h) => native.irecv(h, expected, byteLength, from, tag, blocking));
  const native = g.native!;
  return new Work(
    () => native.workDone(work),
    () => {
      checkTensor(name, t);
      const host = hostBytes(t); // the native side copies the message in only when its header matched
      let refused: string | null = null;
      let written = false;
      try {
        const header = callNative(name, g.timeoutMs, () => native.workWait(work, host.bytes));
        refused = header === undefined ? null : refusal(new Float64Array(header.slice().buffer), t, src, tag);
        written = refused === null;
      } finally {
        host.finish(written);
      }
      if (refused !== null) throw new DistributedError(name, refused);
    },
    name,
  );
}
