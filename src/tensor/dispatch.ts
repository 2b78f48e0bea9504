// Runs a kernel on a tensor's device under the current eager mode, turning back-end failures into
// typed errors that name the op. strict enqueues on the device's in-order stream and returns (reads wait);
// debug runs synchronously and checks float outputs for NaN/Inf. defer-and-fuse hands kernels to a hook
// that the compile layer installs (tensor/ cannot import compile/): it records the ones it can fuse and
// runs them at the next sync point (flushDeferred: host reads, a kernel it does not defer, a mode change).
import type { DeviceBuffer, KernelCall, RunOptions } from "../backends/backend.js";
import { isFloating } from "../backends/dtype.js";
import { IndexOutOfRangeError, KilnError, NonFiniteError, OpError } from "../util/errors.js";
import type { Device } from "./device.js";
import { eagerMode } from "./mode.js";
import type { Tensor } from "./tensor.js";

let kernelCount = 0;

/**
 * The defer-and-fuse recorder (src/compile/defer.ts). `record` returns true when it took the kernel (its
 * outputs are then written at the next flush); `flush` runs everything recorded; `adoptFree` returns true
 * when pending work uses the buffer, the hook then frees it once that work has run.
 */
export interface DeferHook {
  record(op: string, device: Device, call: KernelCall, outputs: Tensor[]): boolean;
  flush(): void;
  hasPending(): boolean;
  adoptFree(device: Device, buffer: DeviceBuffer): boolean;
}

let deferHook: DeferHook | null = null;
let warnedNoHook = false;

/** Installs (or removes, with null) the defer-and-fuse recorder; pending work of the old one runs first. */
export function setDeferHook(hook: DeferHook | null): void {
  if (deferHook && deferHook !== hook) deferHook.flush();
  deferHook = hook;
}

/** Runs deferred kernels now (a sync point). Cheap when nothing is pending. */
export function flushDeferred(): void {
  if (deferHook?.hasPending()) deferHook.flush();
}

/** Storage.release: true when the hook keeps the buffer until pending work that uses it has run. */
export function deferFree(device: Device, buffer: DeviceBuffer): boolean {
  return deferHook !== null && deferHook.hasPending() && deferHook.adoptFree(device, buffer);
}

/** Counts launches that ran outside runKernel (fused deferred kernels). */
export function countLaunches(n: number): void {
  kernelCount += n;
}

// strict / defer-and-fuse enqueue on the device stream; debug runs each kernel to completion
const ENQUEUE: RunOptions = { blocking: false };
const BLOCKING: RunOptions = { blocking: true };

/** Kernels dispatched so far in this process (defer-and-fuse and the compiler report savings with it). */
export function kernelsDispatched(): number {
  return kernelCount;
}

export function runKernel(op: string, device: Device, call: KernelCall, outputs: Tensor[] = []): void {
  if (eagerMode() === "defer-and-fuse") {
    if (deferHook?.record(op, device, call, outputs)) return;
    if (!deferHook && !warnedNoHook) {
      warnedNoHook = true;
      process.emitWarning('eager mode "defer-and-fuse" needs the compiler: import "kiln/compile" (or call enableDeferAndFuse()); running ops eagerly', "KilnWarning");
    }
  }
  flushDeferred(); // in-order: work recorded before this kernel runs first
  kernelCount++;
  try {
    device.backend.run(call, eagerMode() === "debug" ? BLOCKING : ENQUEUE);
  } catch (e) {
    if (e instanceof KilnError) throw e;
    if (e instanceof RangeError) throw new IndexOutOfRangeError(op, `${e.message} (on ${device.name})`);
    throw new OpError(op, `${(e as Error).message ?? e} (on ${device.name})`);
  }
  if (eagerMode() === "debug") {
    for (const t of outputs) {
      if (!isFloating(t.dtype)) continue;
      const data = t.dataSync() as Float32Array;
      for (let i = 0; i < data.length; i++) {
        if (!Number.isFinite(data[i]!)) {
          throw new NonFiniteError(op, `produced ${data[i]} at flat index ${i} of a ${t.dtype}[${t.shape.join(", ")}] output on ${device.name}`);
        }
      }
    }
  }
}

/** All tensors of one op must share a device. */
export function sameDevice(op: string, ...ts: (Tensor | null | undefined)[]): Device {
  let dev: Device | undefined;
  for (const t of ts) {
    if (!t) continue;
    if (!dev) dev = t.device;
    else if (t.device !== dev) throw new OpError(op, `tensors are on different devices (${dev.name} and ${t.device.name})`);
  }
  if (!dev) throw new OpError(op, "no tensor arguments");
  return dev;
}
