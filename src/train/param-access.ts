// Element access for optimizer updates. Params on host back ends (cpu, reference) that are contiguous
// float32 are updated in place through a Float32Array over `tensor.storage.buffer.host` at
// `tensor.offset` (reading `.host` waits for queued stream work on that buffer, and deferred kernels are
// flushed first); any other
// param (bf16, non-host device, strided) is read with dataSync() and written back with copy_().
import { flushDeferred, noGrad, tensor, type Tensor } from "../tensor/index.js";

/** A live float32 view of the tensor's elements, or null when the tensor is not host float32 contiguous. */
export function hostFloat32(t: Tensor): Float32Array | null {
  flushDeferred(); // defer-and-fuse: recorded kernels may read or write this param
  const host = t.storage.buffer.host;
  if (!host || t.dtype !== "float32" || !t.isContiguous) return null;
  return new Float32Array(host, t.offset * 4, t.numel);
}

/** The elements as float32 (a copy unless the tensor is host float32 contiguous). */
export function readFloat32(t: Tensor): Float32Array {
  return hostFloat32(t) ?? (t.dataSync() as Float32Array);
}

/** Writes float32 values into t (converting to t's dtype); a no-op when `values` is t's live view. */
export function writeFloat32(t: Tensor, values: Float32Array): void {
  const live = hostFloat32(t);
  if (live) {
    if (live.buffer !== values.buffer || live.byteOffset !== values.byteOffset) live.set(values);
    return;
  }
  const src = tensor(values, { shape: t.shape, device: t.device });
  noGrad(() => t.copy_(src)); // a parameter's new value, as torch writes it under no_grad
  src.dispose();
}
