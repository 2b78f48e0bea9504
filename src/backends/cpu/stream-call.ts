// Raw native calls on the cpu stream: generated code (compiled programs, src/compile) enqueued as one
// stream job `void f(void** bufs, const int64_t* sizes)`, in order with the back end's own kernels, with its
// buffers tracked so later host access waits for exactly this work (CpuBackend.submitRaw).
import type { Backend } from "../backend.js";
import { CpuBackend, type RawStreamCall } from "./cpu-backend.js";

export type { RawStreamCall };

/** Whether streamCall() can enqueue on this back end (else the caller runs the code now, on host memory). */
export function canStreamCall(backend: Backend): boolean {
  return backend instanceof CpuBackend && backend.takesRawCalls;
}

/** Enqueues the call on the back end's stream and tracks its buffers; false (nothing done) without a stream. */
export function streamCall(backend: Backend, call: RawStreamCall): boolean {
  if (!canStreamCall(backend)) return false;
  (backend as CpuBackend).submitRaw(call);
  return true;
}
