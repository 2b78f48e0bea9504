// A device buffer shared by a tensor and all its views. Reference-counted by the tensors that use it;
// freed when the last one is disposed or garbage-collected (FinalizationRegistry safety net).
import type { DeviceBuffer } from "../backends/backend.js";
import type { Device } from "./device.js";
import { deferFree } from "./dispatch.js";

const OVERWRITTEN = { uninitialized: true } as const;

export class Storage {
  private refs = 0;
  private freed = false;
  /**
   * Bumped by every in-place write through a tensor (copy_, fill_, add_, ...), as torch's version counter: autograd
   * refuses a backward whose saved values were modified after they were saved.
   */
  version = 0;

  constructor(
    readonly device: Device,
    readonly buffer: DeviceBuffer,
  ) {}

  get isFreed(): boolean {
    return this.freed;
  }
  /** Tensors (views included) holding this storage; autograd takes a gradient without copying when it is 1. */
  get refCount(): number {
    return this.refs;
  }

  retain(): void {
    this.refs++;
  }

  release(): void {
    if (this.freed) return;
    if (--this.refs <= 0) {
      this.freed = true;
      // defer-and-fuse: pending work that reads or writes the buffer keeps it until the flush
      if (!deferFree(this.device, this.buffer)) this.device.backend.free(this.buffer);
    }
  }

  /** `overwritten`: the caller's kernel writes every byte before anything reads them (memory need not be zeroed). */
  static allocate(device: Device, byteLength: number, overwritten = false): Storage {
    // zero-size tensors still get a (1-byte) buffer so every tensor has storage
    return new Storage(device, device.backend.allocate(Math.max(byteLength, 1), overwritten ? OVERWRITTEN : undefined));
  }
}

/** Releases storage of tensors that were dropped without dispose(). The held value is the storage. */
export const storageFinalizer = new FinalizationRegistry<Storage>((storage) => storage.release());
