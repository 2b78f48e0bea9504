// Raw native calls on the cpu stream: generated code (compiled programs, src/compile) enqueued as one
// stream job `void f(void** bufs, const int64_t* sizes)` (kiln_native's streamCallFn), in order with the
// back end's own kernels, with its buffers tracked so later host access waits for exactly this work.
//
// TODO(lead): CpuBackend keeps its stream private and native.ts does not declare streamCallFn yet; this file
// reads both structurally. A public `CpuBackend.submitRaw(call: RawStreamCall)` holding streamCall()'s body
// (and `streamCallFn` in NativeKernels) would remove that.
import type { Backend, BufferView, DeviceBuffer } from "../backend.js";
import { CpuBackend } from "./cpu-backend.js";
import type { NativeKernels } from "./native.js";
import { rawOf, type CpuStream } from "./stream.js";

/** One raw call: bufs[i] = buffers[i] memory + byteOffsets[i]; reads/writes name what the code touches. */
export interface RawStreamCall {
  /** Code address (kiln_jit `address(entry)`); the library must never be unloaded. */
  address: bigint;
  buffers: readonly DeviceBuffer[];
  byteOffsets: BigInt64Array;
  sizes?: BigInt64Array;
  reads: readonly DeviceBuffer[];
  writes: readonly DeviceBuffer[];
}

interface StreamCallNative {
  streamCallFn?(address: bigint, buffers: ArrayBuffer[], byteOffsets: BigInt64Array, sizes?: BigInt64Array): number;
}
interface CpuInternals {
  native: NativeKernels & StreamCallNative;
  stream: CpuStream;
}

/** The back end's stream, when it has one that takes raw calls (the cpu back end with a current addon). */
function internals(backend: Backend): CpuInternals | null {
  if (!(backend instanceof CpuBackend)) return null;
  const b = backend as unknown as CpuInternals;
  return typeof b.native.streamCallFn === "function" ? b : null;
}

/** Whether streamCall() can enqueue on this back end (else the caller runs the code now, on host memory). */
export function canStreamCall(backend: Backend): boolean {
  return internals(backend) !== null;
}

const asView = (buffer: DeviceBuffer) => ({ buffer }) as BufferView; // track() looks at the buffer only

/** Enqueues the call on the back end's stream and tracks its buffers; false (nothing done) without a stream. */
export function streamCall(backend: Backend, call: RawStreamCall): boolean {
  const b = internals(backend);
  if (!b) return false;
  b.native.streamCallFn!(call.address, call.buffers.map(rawOf), call.byteOffsets, call.sizes);
  b.stream.track(call.reads.map(asView), call.writes.map(asView));
  return true;
}
