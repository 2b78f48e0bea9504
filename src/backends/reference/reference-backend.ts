// The reference back end: host memory and the float64 TS kernels. Synchronous, so its stream is trivially in order.
import type { Backend, DeviceBuffer, KernelCall } from "../backend.js";
import { HostBuffer, hostOf } from "./host-memory.js";
import { runReference } from "./reference-kernels.js";

/** Host allocation bookkeeping shared by host back ends. */
export class HostAllocator {
  private live = 0;
  private bytes = 0;

  /** `wrap` lets a back end hand out its own buffer type over the ArrayBuffer (the cpu stream's guard). */
  constructor(private readonly wrap: (memory: ArrayBuffer) => DeviceBuffer & { freed: boolean } = (m) => new HostBuffer(m)) {}

  allocate(byteLength: number): DeviceBuffer {
    this.live++;
    this.bytes += byteLength;
    return this.wrap(new ArrayBuffer(byteLength));
  }

  free(buffer: DeviceBuffer): void {
    const b = buffer as DeviceBuffer & { freed: boolean };
    if (b.freed) return;
    b.freed = true;
    this.live--;
    this.bytes -= b.byteLength;
  }

  write(buffer: DeviceBuffer, byteOffset: number, src: Uint8Array): void {
    new Uint8Array(hostOf(buffer), byteOffset, src.byteLength).set(src);
  }

  read(buffer: DeviceBuffer, byteOffset: number, byteLength: number): Uint8Array {
    return new Uint8Array(hostOf(buffer).slice(byteOffset, byteOffset + byteLength));
  }

  liveBuffers(): number {
    return this.live;
  }

  liveBytes(): number {
    return this.bytes;
  }
}

export class ReferenceBackend implements Backend {
  readonly name: string = "reference";
  protected readonly memory = new HostAllocator();

  describe(): string {
    return "reference (pure TypeScript, float64 math)";
  }
  allocate(byteLength: number): DeviceBuffer {
    return this.memory.allocate(byteLength);
  }
  free(buffer: DeviceBuffer): void {
    this.memory.free(buffer);
  }
  write(buffer: DeviceBuffer, byteOffset: number, src: Uint8Array): void {
    this.memory.write(buffer, byteOffset, src);
  }
  read(buffer: DeviceBuffer, byteOffset: number, byteLength: number): Uint8Array {
    return this.memory.read(buffer, byteOffset, byteLength);
  }
  run(call: KernelCall): void {
    runReference(call);
  }
  synchronize(): Promise<void> {
    return Promise.resolve();
  }
  liveBuffers(): number {
    return this.memory.liveBuffers();
  }
  liveBytes(): number {
    return this.memory.liveBytes();
  }
}
