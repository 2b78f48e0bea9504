// Module: a tree of named parameters and submodules, with a state dict whose names match Hugging Face's.
import { isFloating, type DType } from "../backends/dtype.js";
import { KilnError } from "../util/errors.js";
import { noGrad, Tensor } from "../tensor/index.js";

export class StateDictError extends KilnError {
  override name = "StateDictError";
}

/** What loadStateDict(state, false) skipped (torch's _IncompatibleKeys). */
export interface IncompatibleKeys {
  missingKeys: string[];
  unexpectedKeys: string[];
}

export class Module {
  private readonly params = new Map<string, Tensor | null>();
  private readonly children = new Map<string, Module>();
  /** Training mode (torch's default for a new module); eval() clears it. */
  training = true;

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

  /**
   * Installs `value` itself as the parameter behind a dotted name (it must have the registered shape): no copy, and
   * value keeps its dtype, storage and requiresGrad. This is how model loaders put memory-mapped, quantized or
   * freshly read tensors in place; the old tensor is disposed, so anything holding it (an optimizer) is left with a
   * dead tensor. loadStateDict copies into the existing parameters instead.
   */
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
   * torch's load_state_dict: copies each tensor of `state` into the parameter of that name, in place under noGrad
   * (converting dtype and device), so the parameters keep their identity, dtype, requiresGrad and .grad, an optimizer
   * built on them keeps training them, and nothing shares storage with `state`. Shapes must match (StateDictError,
   * checked before anything is written). strict: every parameter present and no other names, else the names that did
   * not match are returned. assign: install state's tensors instead of copying (torch's assign=True; needed for a
   * module built with unallocatedParameters, torch's meta device): each keeps its dtype and storage and takes the
   * parameter's requiresGrad.
   * @example const opt = new SGD(model.parameters(), { lr: 0.1 }); model.loadStateDict(ckpt); // opt still trains model
   */
  loadStateDict(state: ReadonlyMap<string, Tensor>, strict = true, assign = false): IncompatibleKeys {
    const own = this.namedParameters();
    const ownNames = new Set(own.map(([n]) => n));
    const missingKeys = own.filter(([n]) => !state.has(n)).map(([n]) => n);
    const unexpectedKeys = [...state.keys()].filter((n) => !ownNames.has(n));
    const list = (names: string[]) => `${names.slice(0, 8).join(", ")}${names.length > 8 ? ", ..." : ""}`;
    if (strict && missingKeys.length) throw new StateDictError(`missing parameters: ${list(missingKeys)}`);
    if (strict && unexpectedKeys.length) throw new StateDictError(`unexpected parameters: ${list(unexpectedKeys)}`);
    const pairs = own.flatMap(([n, t]) => (state.has(n) ? [[n, t, state.get(n)!] as const] : []));
    for (const [n, t, src] of pairs) {
      if (t.shape.length !== src.shape.length || t.shape.some((s, i) => s !== src.shape[i]))
        throw new StateDictError(`size mismatch for "${n}": copying a parameter of shape [${src.shape.join(", ")}], the shape in the model is [${t.shape.join(", ")}]`);
      if (!assign && t.isDisposed)
        throw new StateDictError(`parameter "${n}" is unallocated (a module built with unallocatedParameters): load it with assign = true`);
    }
    noGrad(() => {
      for (const [n, t, src] of pairs) {
        if (assign) {
          const p = src.detach(); // a view: the caller's tensor keeps its own requiresGrad
          p.requiresGrad = t.requiresGrad && isFloating(p.dtype);
          this.setParameter(n, p);
          continue;
        }
        const moved = src.device === t.device ? src : src.to(t.device);
        t.copy_(moved);
        if (moved !== src) moved.dispose();
      }
    });
    return { missingKeys, unexpectedKeys };
  }

  /** (name, module) of the direct submodules, in registration order (torch's named_children). */
  namedChildren(): [string, Module][] {
    return [...this.children];
  }

  /** This module and every submodule, depth first (torch's modules()). */
  modules(): Module[] {
    return this.namedModules().map(([, m]) => m);
  }

  /**
   * Calls fn on every submodule, children before parents, then on this one (torch's apply, e.g. a custom init).
   * @example model.apply((m) => { if (m instanceof Linear) noGrad(() => m.weight.fill_(0)); });
   */
  apply(fn: (m: Module) => void): this {
    for (const [, m] of this.children) m.apply(fn);
    fn(this);
    return this;
  }

  /** Drops every parameter's gradient (torch's zero_grad(set_to_none=True)). */
  zeroGrad(): void {
    for (const t of this.parameters()) {
      t.grad?.dispose();
      t.grad = null;
    }
  }

  /** Sets requiresGrad on every floating parameter (torch's requires_grad_: false freezes the module). */
  requiresGrad_(on = true): this {
    for (const t of this.parameters()) if (isFloating(t.dtype)) t.requiresGrad = on;
    return this;
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

  /** Casts every parameter `filter` selects to dtype (used for --dtype); a cast parameter keeps its requiresGrad. */
  castParameters(dtype: DType, filter: (name: string) => boolean = () => true): void {
    noGrad(() => {
      for (const [n, t] of this.namedParameters()) {
        if (!filter(n) || t.dtype === dtype) continue;
        const cast = t.to(dtype);
        cast.requiresGrad = t.requiresGrad && isFloating(dtype);
        this.setParameter(n, cast);
      }
    });
  }
}
