// Runs a kernel on a tensor's device under the current eager mode, turning back-end failures into
// typed errors that name the op. strict enqueues on the device's in-order stream and returns (reads wait);
// debug runs synchronously and checks float outputs for NaN/Inf.
import type { KernelCall, RunOptions } from "../backends/backend.js";
import { isFloating } from "../backends/dtype.js";
import { IndexOutOfRangeError, KilnError, NonFiniteError, OpError } from "../util/errors.js";
import type { Device } from "./device.js";
import { eagerMode } from "./mode.js";
import type { Tensor } from "./tensor.js";

let kernelCount = 0;

// strict / defer-and-fuse enqueue on the device stream; debug runs each kernel to completion
const ENQUEUE: RunOptions = { blocking: false };
const BLOCKING: RunOptions = { blocking: true };

/** Kernels dispatched so far in this process (defer-and-fuse and the compiler report savings with it). */
export function kernelsDispatched(): number {
  return kernelCount;
}

export function runKernel(op: string, device: Device, call: KernelCall, outputs: Tensor[] = []): void {
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
