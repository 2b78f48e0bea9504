// Registry of user ops from defineOp(): how to run one on host buffers (compiled C entry, a TS
// function, or the TS reference) and in eager mode. compile()'s executor and interpreter look ops up here.
import { DTYPE_BYTES, type DType } from "../backends/dtype.js";
import { OpError } from "../util/errors.js";
import * as k from "../tensor/index.js";
import type { Tensor } from "../tensor/index.js";
import { cacheKey, getLibrary } from "./cache.js";
import { jitUnavailableReason, type JitLibrary } from "./jit.js";

/**
 * Host kernel: inputs and output as dense Float32Arrays, with the input shapes. For an op of another dtype, the
 * values written to `out` are converted to it afterwards (as `.to(dtype)` would).
 */
export type HostKernel = (inputs: Float32Array[], out: Float32Array, inputShapes: number[][]) => void;

export interface CustomOpDef {
  name: string;
  /** Output shape from the input shapes. */
  shape: (inputShapes: number[][]) => number[];
  /** Output dtype (default float32; inputs are converted to float32). */
  dtype?: DType;
  kernels: {
    /**
     * C source defining `void <entry>(void** bufs, const int64_t* sizes)` with bufs = [in0.., out] and
     * sizes = [numel(in0).., numel(out)] (compiled and cached like generated code), or a TS function.
     */
    cpu?: string | HostKernel;
    /** The readable reference (used when no C compiler is available and by tests). */
    reference: HostKernel;
  };
  /** C entry name in kernels.cpu (default: the op name with non-identifier characters as _). */
  entry?: string;
}

export interface HostOperand {
  host: ArrayBuffer;
  byteOffset: number;
  shape: readonly number[];
}

const registry = new Map<string, CustomOpEntry>();

export class CustomOpEntry {
  constructor(readonly def: CustomOpDef) {}

  get entryName(): string {
    return this.def.entry ?? this.def.name.replace(/[^A-Za-z0-9_]/g, "_");
  }

  /** Runs the op on dense host operands, preferring the compiled C kernel. */
  runHost(inputs: HostOperand[], out: HostOperand): void {
    const cpu = this.def.kernels.cpu;
    const numel = (s: readonly number[]) => s.reduce((p, d) => p * d, 1);
    if (typeof cpu === "string" && jitUnavailableReason() === null) {
      const key = cacheKey(`custom:${this.def.name}\n${cpu}`, "cpu");
      let entry: ReturnType<JitLibrary["entry"]>;
      try {
        entry = getLibrary(key, cpu).lib.entry(this.entryName);
      } catch (e) {
        throw new OpError(this.def.name, `its C kernel (entry ${this.entryName}) cannot be built or found: ${(e as Error).message}`);
      }
      const bufs = [...inputs, out].map((o) => new Uint8Array(o.host, o.byteOffset));
      entry(bufs, BigInt64Array.from([...inputs, out].map((o) => BigInt(numel(o.shape)))));
      return;
    }
    const fn = typeof cpu === "function" ? cpu : this.def.kernels.reference;
    const f32 = (o: HostOperand) => new Float32Array(o.host, o.byteOffset, numel(o.shape));
    const dtype = this.def.dtype ?? "float32";
    if (dtype === "float32") return fn(inputs.map(f32), f32(out), inputs.map((i) => [...i.shape]));
    // another dtype: the kernel writes float32 values, converted into the output's bytes
    const values = new Float32Array(numel(out.shape));
    fn(inputs.map(f32), values, inputs.map((i) => [...i.shape]));
    const converted = k.tensor(values).to(dtype);
    k.flushDeferred();
    const bytes = numel(out.shape) * DTYPE_BYTES[dtype];
    new Uint8Array(out.host, out.byteOffset, bytes).set(new Uint8Array(converted.storage.buffer.host!, converted.offset * DTYPE_BYTES[dtype], bytes));
    converted.dispose();
  }

  /** Eager execution on tensors (inputs made dense float32 first). */
  eager(inputs: Tensor[]): Tensor {
    const dense = inputs.map((t) => (t.dtype === "float32" && t.isContiguous ? t : t.to("float32").contiguous()));
    const out = k.empty(this.def.shape(dense.map((t) => [...t.shape])), { dtype: this.def.dtype ?? "float32", device: inputs[0]?.device });
    k.flushDeferred();
    const host = (t: Tensor): HostOperand => {
      const h = t.storage.buffer.host;
      if (!h) throw new OpError(this.def.name, `custom ops need a host back end (got ${t.device.name})`);
      return { host: h, byteOffset: t.offset * 4, shape: t.shape };
    };
    this.runHost(dense.map(host), host(out));
    for (let i = 0; i < dense.length; i++) if (dense[i] !== inputs[i]) dense[i]!.dispose();
    return out;
  }
}

export function registerCustomOp(def: CustomOpDef): CustomOpEntry {
  if (registry.has(def.name)) throw new OpError("defineOp", `an op named "${def.name}" is already defined`);
  const e = new CustomOpEntry(def);
  registry.set(def.name, e);
  return e;
}

export function customOp(name: string): CustomOpEntry {
  const e = registry.get(name);
  if (!e) throw new OpError("custom", `no op named "${name}" (defineOp it first)`);
  return e;
}
