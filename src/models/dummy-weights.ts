// vLLM's --load-format dummy: each parameter gets random values of its config shape and no checkpoint tensor is read
// (profiling, or trying a model's shape without its weights). The values depend only on the parameter's name, so
// tensor-parallel ranks cut their shards out of the same full tensors.
import type { DType } from "../backends/dtype.js";
import { tensor, type DeviceLike, type Tensor } from "../tensor/index.js";
import { KilnError } from "../util/errors.js";
import { mulberry32 } from "../util/random.js";

/** The standard deviation of the random matrices and biases (init-model's default). */
const STD = 0.02;

/** FNV-1a of the parameter's name: the seed of its own stream. */
function nameSeed(name: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

/**
 * A random parameter of its full shape: norms at scale 1 (`normOffset` 1: Gemma's (1 + w) at w = 0), everything else
 * uniform in [-a, a] with standard deviation 0.02 (uniform: a 1B model's values are drawn in seconds).
 */
export function dummyParameter(name: string, shape: readonly number[], dtype: DType, normOffset: number, device?: DeviceLike): Tensor {
  const n = shape.reduce((a, b) => a * b, 1);
  let v: Float32Array;
  try {
    v = new Float32Array(n);
  } catch (e) {
    if (!(e instanceof RangeError)) throw e;
    throw new KilnError(`[load] load_format "dummy": parameter "${name}" of shape [${shape.join(", ")}] (${n} float32s) cannot be allocated: ${e.message}`);
  }
  if (name.endsWith("norm.weight")) v.fill(1 - normOffset);
  else {
    const u = mulberry32(nameSeed(name));
    const a = STD * Math.sqrt(3);
    for (let i = 0; i < n; i++) v[i] = (2 * u() - 1) * a;
  }
  const f = tensor(v, { shape: [...shape], device });
  if (dtype === "float32") return f;
  const cast = f.to(dtype);
  f.dispose();
  return cast;
}
