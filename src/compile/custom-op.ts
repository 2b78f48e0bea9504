// defineOp(): user kernels as ordinary ops (the Pallas role). The returned function runs eagerly on
// Tensors (C source compiled and cached like generated code, else the TS kernel/reference) and records a
// `custom` IR node on traced Syms, so it works inside compile() and withDeferAndFuse() too.
import { hasBackward, registerBackward, Tensor, type BackwardRule } from "../tensor/index.js";
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
  // autograd finds formulas by op name: a built-in's name would put the custom formula on every call of the built-in
  if (hasBackward(def.name)) throw new OpError("defineOp", `"${def.name}" is the name of a built-in op; give the custom op another name`);
  const entry = registerCustomOp(def);
  if (def.backward) registerBackward(def.name, def.backward);
  const fn = (...inputs: (Tensor | Sym)[]): Tensor | Sym => {
    const sym = inputs.find((x): x is Sym => x instanceof Sym);
    if (!sym) {
      const out = entry.eager(inputs as Tensor[]);
      // recorded without a backward too: backward() then throws (torch: autograd not registered) instead of the
      // gradient through this op silently missing
      recordOp(def.name, inputs as Tensor[], out, {});
      return out;
    }
    const b = sym.builder;
    // the kernel reads float32, as in eager mode (an int32 buffer read as float32 gave denormal garbage)
    const ins = inputs.map((x) => b.lift(x, "float32", def.name)).map((s) => (s.dtype === "float32" ? s : s.to("float32")));
    for (const s of ins) if (b.dyn[s.id]!.length > 0) throw new OpError(def.name, "custom ops do not take dynamic (bucketed) dims yet");
    return b.push({ kind: "custom", name: def.name, inputs: ins.map((s) => s.id) }, def.shape(ins.map((s) => [...s.shape])), def.dtype ?? "float32");
  };
  return fn as CustomOpFn;
}
