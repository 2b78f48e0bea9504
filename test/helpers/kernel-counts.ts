// Kernels launched on a device while a function runs, counted by kind ("matmul", "flash_attention", "unary:tanh", ...):
// the tests' way to see which implementation ran and what a recomputation repeated.
import type { KernelCall } from "../../src/backends/backend.js";
import { device } from "../../src/tensor/index.js";

export function countKernels(deviceName: string, fn: () => void): Map<string, number> {
  const backend = device(deviceName).backend;
  const counts = new Map<string, number>();
  const run = backend.run.bind(backend);
  backend.run = (call: KernelCall, options) => {
    const kind = call.op === "unary" || call.op === "binary" ? `${call.op}:${call.fn}` : call.op;
    counts.set(kind, (counts.get(kind) ?? 0) + 1);
    run(call, options);
  };
  try {
    fn();
  } finally {
    delete (backend as { run?: unknown }).run;
  }
  return counts;
}
