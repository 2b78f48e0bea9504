// Step-graph captures as data, for the on-disk step-graph cache (src/engine/step-graph-cache.ts): a warm start
// re-issues the recorded native stream calls inside a fresh capture instead of tracing the model again, the way
// XLA loads a serialized executable instead of re-lowering. A recording is the list of native stream calls the
// capture made (kernel name + arguments) and, for every ArrayBuffer those arguments point into, how to find or
// rebuild it in another process:
//  - root: a buffer the caller names and supplies again (a step graph's persistent inputs);
//  - output: made by the capture and handed back to the caller (logits), re-created by the replay;
//  - prior: memory from before the capture (weights, KV caches, rotary tables), found by its allocation number
//    relative to the caller's mark (HostAllocator.mark): loading the same model the same way numbers it alike.
//    Its size and first and last bytes are checked, so a process that allocated differently gets no replay;
//  - new: memory allocated during the capture (intermediates, constants), re-created with its initial bytes;
//  - data: private arrays a kernel launch made (offsets, small index tables), stored whole.
// Nothing runs during a capture, so every buffer's bytes at its end are its initial bytes.
import type { CaptureRecording, DeviceBuffer, ReplaySession } from "../backend.js";
import type { HostAllocator } from "../reference/reference-backend.js";
import type { NativeStreamKernels } from "./native.js";
import { rawOf } from "./stream.js";

/** A native stream call as made: kernel name ("@call" for generated code) and its arguments. */
interface RawCall {
  fn: string;
  args: unknown[];
}

/** What a recorded capture made, before serialization. */
export interface RawRecording {
  calls: RawCall[];
  all: ReadonlySet<ArrayBuffer>;
  written: ReadonlySet<ArrayBuffer>;
  /** HostAllocator.mark() when the capture began: memory numbered from here on was allocated during it. */
  start: number;
}

type RecBuffer =
  | { kind: "root"; name: string; bytes: number }
  | { kind: "output"; name: string; bytes: number; blob?: number }
  | { kind: "prior"; n: number; bytes: number; sample: string }
  | { kind: "new"; n: number; bytes: number; blob?: number }
  | { kind: "data"; bytes: number; blob: number };

type RecArg =
  | number
  | boolean
  | string
  | null
  | { u: 1 }
  | { v: number; t: string; o: number; n: number }
  | { ab: number }
  | { big: string }
  | { code: string }
  | RecArg[];

interface RecordingMeta {
  /** Allocation number (relative to the mark) at which the capture began. */
  start: number;
  calls: { fn: string; args: RecArg[] }[];
  buffers: RecBuffer[];
  all: number[];
  written: number[];
}

const VIEW_TYPES: Record<string, new (b: ArrayBuffer, o: number, n: number) => ArrayBufferView> = {
  Float32Array,
  Float64Array,
  Int32Array,
  Uint32Array,
  Int16Array,
  Uint16Array,
  Int8Array,
  Uint8Array,
  BigInt64Array,
  BigUint64Array,
};

/** Records the stream calls of one capture while passing them through. */
export class CaptureRecorder {
  readonly calls: RawCall[] = [];
  readonly launcher: NativeStreamKernels;

  constructor(
    stream: NativeStreamKernels,
    readonly start: number,
  ) {
    const calls = this.calls;
    this.launcher = new Proxy(stream, {
      get(target, name: string) {
        const f = (target as unknown as Record<string, (...a: unknown[]) => number>)[name];
        if (typeof f !== "function") return f;
        return (...args: unknown[]) => {
          const r = f.apply(target, args); // validates first: a throwing call is not recorded
          calls.push({ fn: name, args });
          return r;
        };
      },
    });
  }

  /** A call of generated code (CpuBackend.submitRaw), after it was enqueued. */
  recordCode(args: unknown[]): void {
    this.calls.push({ fn: "@call", args });
  }

  finish(pins: { all: ReadonlySet<ArrayBuffer>; written: ReadonlySet<ArrayBuffer> }): RawRecording {
    return { calls: this.calls, all: pins.all, written: pins.written, start: this.start };
  }
}

function isZero(bytes: Uint8Array): boolean {
  const n = bytes.byteLength;
  const words = bytes.byteOffset % 8 === 0 ? new BigUint64Array(bytes.buffer, bytes.byteOffset, n >>> 3) : null;
  if (words) {
    for (let i = 0; i < words.length; i++) if (words[i] !== 0n) return false;
  } else {
    for (let i = 0; i < n - (n % 8); i++) if (bytes[i] !== 0) return false;
  }
  for (let i = n - (n % 8); i < n; i++) if (bytes[i] !== 0) return false;
  return true;
}

/** 16 bytes at 9 evenly spaced places (both ends included): tells one weight matrix from another of its size. */
function sampleOf(memory: ArrayBuffer): string {
  const n = memory.byteLength;
  const len = Math.min(16, n);
  const parts: string[] = [];
  for (let i = 0; i <= 8; i++) {
    const at = Math.floor(((n - len) * i) / 8);
    parts.push(Buffer.from(new Uint8Array(memory, at, len)).toString("hex"));
  }
  return parts.join(":");
}

/** Private arrays above this size make a recording uncacheable (they would bloat the cache entry). */
const MAX_DATA_BYTES = 1 << 20;

/**
 * Serializes a recording. `roots` and `outputs` name the caller's buffers; `mark` is the caller's allocation mark
 * (prior memory is numbered relative to it); `describeCode` names generated code by its address. Null when the
 * capture used memory the recording cannot name (unnumbered memory from before it, or code it cannot describe).
 */
export function serializeRecording(
  rec: RawRecording,
  memory: HostAllocator,
  roots: ReadonlyMap<string, DeviceBuffer>,
  outputs: ReadonlyMap<string, DeviceBuffer>,
  mark: number,
  describeCode: (address: bigint) => string | null,
): CaptureRecording | null {
  const named = new Map<ArrayBuffer, { kind: "root" | "output"; name: string }>();
  for (const [name, b] of roots) named.set(rawOf(b), { kind: "root", name });
  for (const [name, b] of outputs) named.set(rawOf(b), { kind: "output", name });
  const ids = new Map<ArrayBuffer, number>();
  const buffers: RecBuffer[] = [];
  const blobs: Uint8Array[] = [];
  let failed = false;
  const blobOf = (memory: ArrayBuffer): number | undefined => {
    const bytes = new Uint8Array(memory);
    if (isZero(bytes)) return undefined;
    blobs.push(bytes.slice());
    return blobs.length - 1;
  };
  const idOf = (m: ArrayBuffer): number => {
    let id = ids.get(m);
    if (id !== undefined) return id;
    id = buffers.length;
    ids.set(m, id);
    const bytes = m.byteLength;
    const name = named.get(m);
    const n = memory.numberOfMemory(m);
    if (name?.kind === "root") buffers.push({ kind: "root", name: name.name, bytes });
    else if (name?.kind === "output") {
      const blob = blobOf(m);
      buffers.push(blob === undefined ? { kind: "output", name: name.name, bytes } : { kind: "output", name: name.name, bytes, blob });
    } else if (n !== undefined && n >= rec.start) {
      const blob = blobOf(m);
      buffers.push(blob === undefined ? { kind: "new", n: n - mark, bytes } : { kind: "new", n: n - mark, bytes, blob });
    } else if (n !== undefined && n >= mark) buffers.push({ kind: "prior", n: n - mark, bytes, sample: sampleOf(m) });
    else if (n === undefined && bytes <= MAX_DATA_BYTES) {
      // not allocator memory (every allocation is numbered): a private array a launch made
      blobs.push(new Uint8Array(m).slice());
      buffers.push({ kind: "data", bytes, blob: blobs.length - 1 });
    } else failed = true; // memory from before the mark, or unnumbered and large: not findable in another process
    return id;
  };
  const encode = (a: unknown): RecArg => {
    if (a === undefined) return { u: 1 };
    // JSON would turn NaN and the infinities into null and -0 into 0
    if (typeof a === "number" && (!Number.isFinite(a) || Object.is(a, -0))) {
      failed = true;
      return null;
    }
    if (a === null || typeof a === "number" || typeof a === "boolean" || typeof a === "string") return a;
    if (typeof a === "bigint") return { big: a.toString() };
    if (Array.isArray(a)) return a.map(encode);
    if (a instanceof ArrayBuffer) return { ab: idOf(a) };
    if (ArrayBuffer.isView(a) && !(a instanceof DataView)) {
      const t = a.constructor.name;
      if (!(t in VIEW_TYPES) || !(a.buffer instanceof ArrayBuffer)) {
        failed = true;
        return null;
      }
      const per = (a as unknown as { BYTES_PER_ELEMENT: number }).BYTES_PER_ELEMENT;
      return { v: idOf(a.buffer), t, o: a.byteOffset, n: a.byteLength / per };
    }
    failed = true;
    return null;
  };
  const calls = rec.calls.map(({ fn, args }) => {
    if (fn !== "@call") return { fn, args: args.map(encode) };
    const code = describeCode(args[0] as bigint);
    if (code === null) failed = true;
    return { fn, args: [{ code: code ?? "" }, ...args.slice(1).map(encode)] };
  });
  const all = [...rec.all].map(idOf);
  const written = [...rec.written].map(idOf);
  if (failed) return null;
  const meta: RecordingMeta = { start: rec.start - mark, calls, buffers, all, written };
  return { meta, blobs };
}

/**
 * Re-creates a recorded capture's native calls (inside a capture the caller opened) against this process's
 * memory. Returns the pins and the output buffers, or null when the recording does not fit this process (a prior
 * buffer missing or different, generated code not loadable): the caller aborts the capture and traces instead.
 */
export function replayCalls(
  recording: CaptureRecording,
  memory: HostAllocator,
  launch: (fn: string, args: unknown[]) => void,
  roots: ReadonlyMap<string, DeviceBuffer>,
  session: ReplaySession,
  resolveCode: (code: string) => bigint | null,
): { all: ArrayBuffer[]; written: ArrayBuffer[]; outputs: Map<string, DeviceBuffer> } | null {
  const meta = recording.meta as RecordingMeta;
  const recreated = session.recreated as Map<number, ArrayBuffer>;
  // Memory numbered after the session's first capture began differs between processes (the replays allocate
  // differently from the traces): such prior memory must be what an earlier replay of the session re-created.
  session.start ??= meta.start;
  const firstStart = session.start;
  const outputs = new Map<string, DeviceBuffer>();
  const mems: ArrayBuffer[] = [];
  const fill = (m: ArrayBuffer, blob: number | undefined): ArrayBuffer => {
    if (blob !== undefined) new Uint8Array(m).set(recording.blobs[blob]!);
    return m;
  };
  const misfit = (): null => {
    for (const d of outputs.values()) memory.free(d);
    return null;
  };
  // resolve every buffer before the first call, so a misfit leaves nothing half-recorded
  for (const b of meta.buffers) {
    let m: ArrayBuffer | undefined;
    switch (b.kind) {
      case "root": {
        const r = roots.get(b.name);
        m = r === undefined ? undefined : rawOf(r);
        break;
      }
      case "output": {
        const d = memory.allocate(b.bytes);
        outputs.set(b.name, d);
        m = fill(rawOf(d), b.blob);
        break;
      }
      case "prior":
        m = recreated.get(b.n) ?? (b.n < firstStart ? memory.memoryOfNumber(session.mark + b.n) : undefined);
        if (m !== undefined && sampleOf(m) !== b.sample) m = undefined;
        break;
      case "new":
        m = fill(new ArrayBuffer(b.bytes), b.blob);
        recreated.set(b.n, m);
        break;
      case "data":
        m = fill(new ArrayBuffer(b.bytes), b.blob);
        break;
    }
    if (m === undefined || m.byteLength !== b.bytes) return misfit();
    mems.push(m);
  }
  const codes = new Map<string, bigint>();
  for (const c of meta.calls) {
    if (c.fn !== "@call") continue;
    const code = (c.args[0] as { code: string }).code;
    const address = codes.get(code) ?? resolveCode(code);
    if (address === null) return misfit();
    codes.set(code, address);
  }
  const decode = (a: RecArg): unknown => {
    if (a === null || typeof a !== "object") return a;
    if (Array.isArray(a)) return a.map(decode);
    if ("u" in a) return undefined;
    if ("big" in a) return BigInt(a.big);
    if ("ab" in a) return mems[a.ab]!;
    if ("code" in a) return codes.get(a.code)!;
    return new VIEW_TYPES[a.t]!(mems[a.v]!, a.o, a.n);
  };
  try {
    for (const c of meta.calls) launch(c.fn, c.args.map(decode));
  } catch (e) {
    misfit();
    throw e;
  }
  return { all: meta.all.map((i) => mems[i]!), written: meta.written.map((i) => mems[i]!), outputs };
}
