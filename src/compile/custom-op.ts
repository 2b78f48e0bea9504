// defineOp(): user kernels as ordinary ops (the Pallas role). The returned function runs eagerly on
// Tensors (C source compiled and cached like generated code, else the TS kernel/reference) and records a
// `custom` IR node on traced Syms, so it works inside compile() and withDeferAndFuse() too.
import { registerBackward, Tensor, type BackwardRule } from "../tensor/index.js";
import { recordOp } from "../tensor/grad-mode.js";
import { OpError } from "../util/errors.js";
import { registerCustomOp, type CustomOpDef } from "./custom-op-registry.js";
import { Sym } from "./trace.js";

export type { CustomOpDef, HostKernel } from "./custom-op-registry.js";

export type CustomOpFn = {
  (...inputs: Tensor[]): Tensor;
  (...inputs: (Tensor | Sym)[]): Sym;
};

/**
 * @example
 * const square = defineOp({ name: "my_square", shape: ([s]) => s!,
 *   kernels: { cpu: "void my_square(void** b, const long long* n) { ... }", reference: ([x], out) => x!.forEach((v, i) => (out[i] = v * v)) } });
 * square(tensor([1, 2])).toList() // [1, 4]
 */
export function defineOp(def: CustomOpDef & { backward?: BackwardRule }): CustomOpFn {
  const entry = registerCustomOp(def);
  if (def.backward) registerBackward(def.name, def.backward);
  const fn = (...inputs: (Tensor | Sym)[]): Tensor | Sym => {
    const sym = inputs.find((x): x is Sym => x instanceof Sym);
    if (!sym) {
      const out = entry.eager(inputs as Tensor[]);
      if (def.backward) recordOp(def.name, inputs as Tensor[], out, {});
      return out;
    }
    const b = sym.builder;
    const ins = inputs.map((x) => b.lift(x, "float32", def.name));
    for (const s of ins) if (b.dyn[s.id]!.length > 0) throw new OpError(def.name, "custom ops do not take dynamic (bucketed) dims yet");
    return b.push({ kind: "custom", name: def.name, inputs: ins.map((s) => s.id) }, def.shape(ins.map((s) => [...s.shape])), def.dtype ?? "float32");
  };
  return fn as CustomOpFn;
}
