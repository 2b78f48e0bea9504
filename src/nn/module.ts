// Module: a tree of named parameters and submodules, with a state dict whose names match Hugging Face's.
import type { DType } from "../backends/dtype.js";
import { KilnError } from "../util/errors.js";
import { Tensor } from "../tensor/index.js";

export class StateDictError extends KilnError {
  override name = "StateDictError";
}

export class Module {
  private readonly params = new Map<string, Tensor | null>();
  private readonly children = new Map<string, Module>();
  training = false;

  /** Registers (or replaces) a parameter under a local name; null reserves an optional slot. */
  protected param(name: string, t: Tensor | null): Tensor | null {
    this.params.set(name, t);
    return t;
  }

  /** Adds a child module under a name (public form, for containers). */
  addModule<M extends Module>(name: string, m: M): M {
    return this.module(name, m);
  }

  protected module<M extends Module>(name: string, m: M): M {
    this.children.set(name, m);
    return m;
  }

  /** (dotted name, parameter) pairs, depth first in registration order; shared tensors listed once. */
  namedParameters(prefix = "", seen = new Set<Tensor>()): [string, Tensor][] {
    const out: [string, Tensor][] = [];
    for (const [n, t] of this.params) {
      if (t && !seen.has(t)) {
        seen.add(t);
        out.push([prefix + n, t]);
      }
    }
    for (const [n, m] of this.children) out.push(...m.namedParameters(`${prefix}${n}.`, seen));
    return out;
  }

  parameters(): Tensor[] {
    return this.namedParameters().map(([, t]) => t);
  }

  namedModules(prefix = ""): [string, Module][] {
    const out: [string, Module][] = [[prefix.replace(/\.$/, ""), this]];
    for (const [n, m] of this.children) out.push(...m.namedModules(`${prefix}${n}.`));
    return out;
  }

  stateDict(): Map<string, Tensor> {
    return new Map(this.namedParameters());
  }

  /** Replaces the tensor behind a dotted parameter name (the new tensor must have the registered shape). */
  setParameter(name: string, value: Tensor): void {
    const dot = name.lastIndexOf(".");
    const owner = dot < 0 ? this : this.submodule(name.slice(0, dot));
    const local = dot < 0 ? name : name.slice(dot + 1);
    const old = owner.params.get(local);
    if (old === undefined) throw new StateDictError(`unexpected parameter "${name}"`);
    if (old && (old.shape.length !== value.shape.length || old.shape.some((s, i) => s !== value.shape[i])))
      throw new StateDictError(`parameter "${name}": checkpoint shape [${value.shape.join(", ")}] != model shape [${old.shape.join(", ")}]`);
    owner.params.set(local, value);
    if (old && old !== value) old.dispose();
    owner.onParameterReplaced(local, value);
  }

  /** Hook for modules that cache a parameter in a field. */
  protected onParameterReplaced(_local: string, _value: Tensor): void {}

  submodule(path: string): Module {
    return path.split(".").reduce<Module>((m, part) => {
      const c = m.children.get(part);
      if (!c) throw new StateDictError(`no submodule "${path}"`);
      return c;
    }, this);
  }

  getParameter(name: string): Tensor | null {
    const dot = name.lastIndexOf(".");
    const owner = dot < 0 ? this : this.submodule(name.slice(0, dot));
    return owner.params.get(dot < 0 ? name : name.slice(dot + 1)) ?? null;
  }

  /**
   * Loads tensors by name with strict checks: every parameter must be present with its shape, and (when strict)
   * no unexpected names. Tensors are converted to each parameter's dtype.
   */
  loadStateDict(state: Map<string, Tensor>, strict = true): void {
    const own = this.namedParameters();
    const ownNames = new Set(own.map(([n]) => n));
    const missing = own.filter(([n]) => !state.has(n)).map(([n]) => n);
    if (missing.length) throw new StateDictError(`missing parameters: ${missing.slice(0, 8).join(", ")}${missing.length > 8 ? ", ..." : ""}`);
    if (strict) {
      const unexpected = [...state.keys()].filter((n) => !ownNames.has(n));
      if (unexpected.length) throw new StateDictError(`unexpected parameters: ${unexpected.slice(0, 8).join(", ")}`);
    }
    for (const [n, t] of own) {
      const src = state.get(n)!;
      this.setParameter(n, src.dtype === t.dtype ? src : src.to(t.dtype));
    }
  }

  train(on = true): this {
    for (const [, m] of this.namedModules()) m.training = on;
    return this;
  }

  eval(): this {
    return this.train(false);
  }

  /** Total parameter count. */
  numParameters(): number {
    return this.parameters().reduce((s, t) => s + t.numel, 0);
  }

  /** Casts every floating parameter to dtype (used for --dtype). */
  castParameters(dtype: DType, filter: (name: string) => boolean = () => true): void {
    for (const [n, t] of this.namedParameters()) if (filter(n) && t.dtype !== dtype) this.setParameter(n, t.to(dtype));
  }
}
