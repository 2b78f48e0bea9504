// Devices by name. A Device wraps a back end from the registry; core code never names a concrete back end.
import type { Backend } from "../backends/backend.js";
import { getBackend, isBackendAvailable } from "../backends/registry.js";
import { env } from "../util/env.js";

export class Device {
  constructor(
    readonly name: string,
    readonly backend: Backend,
  ) {}
  toString(): string {
    return this.name;
  }
}

const devices = new Map<string, Device>();
let defaultName: string | undefined;

/** `device("cpu")`: the device for a back-end name. Throws BackendUnavailableError when it cannot load. */
export function device(name: string): Device {
  let d = devices.get(name);
  if (!d) {
    d = new Device(name, getBackend(name));
    devices.set(name, d);
  }
  return d;
}

/** The process default: KILN_DEVICE, else cpu when its native kernels load, else the TS reference (with a warning). */
export function defaultDevice(): Device {
  if (defaultName === undefined) {
    const wanted = env.device;
    if (wanted) defaultName = wanted;
    else if (isBackendAvailable("cpu")) defaultName = "cpu";
    else {
      defaultName = "reference";
      process.emitWarning("Kiln: native cpu kernels unavailable, using the slow TS reference back end", "KilnWarning");
    }
  }
  return device(defaultName);
}

export function setDefaultDevice(name: string): void {
  device(name); // validate now
  defaultName = name;
}

export type DeviceLike = Device | string | undefined;

export function resolveDevice(d: DeviceLike): Device {
  if (d === undefined) return defaultDevice();
  return typeof d === "string" ? device(d) : d;
}

/** Bytes of tensor memory live on the device now (torch.cuda.memory_allocated). */
export function memoryAllocated(d?: DeviceLike): number {
  return resolveDevice(d).backend.liveBytes();
}

/**
 * The most tensor bytes live at once on the device since it was first used or resetPeakMemoryStats() (torch.cuda's
 * max_memory_allocated).
 * @example
 *   resetPeakMemoryStats();
 *   model.loss(inputs, targets, B, S).backward();
 *   console.log(`peak ${maxMemoryAllocated() / 2 ** 20} MiB during the step`);
 */
export function maxMemoryAllocated(d?: DeviceLike): number {
  return resolveDevice(d).backend.peakBytes();
}

/**
 * Bytes the device's allocator holds: live tensor memory plus freed memory it keeps for reuse (torch.cuda's
 * memory_reserved). Equals memoryAllocated() on a back end without a caching allocator.
 * @example
 *   console.log(`${memoryAllocated() / 2 ** 20} MiB in tensors, ${memoryReserved() / 2 ** 20} MiB reserved`);
 */
export function memoryReserved(d?: DeviceLike): number {
  const b = resolveDevice(d).backend;
  return b.reservedBytes?.() ?? b.liveBytes();
}

/** The most bytes reserved at once since the device was first used or resetPeakMemoryStats() (torch.cuda.max_memory_reserved). */
export function maxMemoryReserved(d?: DeviceLike): number {
  const b = resolveDevice(d).backend;
  return b.peakReservedBytes?.() ?? b.peakBytes();
}

/**
 * Drops the freed memory the device's allocator keeps for reuse (torch.cuda.empty_cache): memoryReserved() falls
 * to memoryAllocated(); the host memory goes back to the system once collected.
 * @example
 *   model.dispose();
 *   emptyCache();
 */
export function emptyCache(d?: DeviceLike): void {
  resolveDevice(d).backend.emptyCache?.();
}

/** Starts the peak maxMemoryAllocated() reports from the bytes live now (torch.cuda.reset_peak_memory_stats). */
export function resetPeakMemoryStats(d?: DeviceLike): void {
  resolveDevice(d).backend.resetPeakBytes();
}
