// torch.nn's containers: Sequential (modules applied in order), ModuleList and ModuleDict (modules held under index or
// key names, so their parameters are named "0.weight", "layers.1.bias", "heads.cls.weight" as torch names them), and
// the parameter-free activation modules a Sequential is built from.
import { checkpoint, Tensor, gelu, logSoftmax, relu, sigmoid, silu, softmax, tanh } from "../tensor/index.js";
import { KilnError } from "../util/errors.js";
import { Module } from "./module.js";

/** A module with torch's one-tensor forward (what Sequential chains). */
export interface TensorModule extends Module {
  forward(x: Tensor): Tensor;
}

export class ContainerError extends KilnError {
  override name = "ContainerError";
}

function index(i: number, length: number, what: string): number {
  const k = i < 0 ? i + length : i;
  if (!Number.isInteger(i) || k < 0 || k >= length) throw new ContainerError(`[${what}] index ${i} is out of range for ${length} modules`);
  return k;
}

/** x through the modules in order, each intermediate output disposed once the next is computed. */
function chain(modules: readonly TensorModule[], x: Tensor): Tensor {
  let h = x;
  for (const m of modules) {
    const next = m.forward(h);
    if (h !== x && next !== h) h.dispose();
    h = next;
  }
  return h;
}

/**
 * torch.nn.Sequential: forward(x) runs each module on the previous one's output; parameters are named by position
 * ("0.weight") or by the keys of a record given instead.
 * @example
 *   const mlp = new Sequential(new Linear(2, 8, true), new Tanh(), new Linear(8, 1, true));
 *   mlp.forward(x); [...mlp.stateDict().keys()] // ["0.weight", "0.bias", "2.weight", "2.bias"]
 */
export class Sequential extends Module {
  private readonly list: TensorModule[] = [];

  constructor(...modules: TensorModule[] | [Record<string, TensorModule>]) {
    super();
    const first: unknown = modules[0];
    const isRecord = modules.length === 1 && typeof first === "object" && first !== null && Object.getPrototypeOf(first) === Object.prototype;
    const named = isRecord ? Object.entries(first as Record<string, TensorModule>) : null;
    for (const [i, m] of named ?? (modules as TensorModule[]).map((m, i) => [String(i), m] as const)) {
      if (!(m instanceof Module) || typeof (m as TensorModule).forward !== "function")
        throw new ContainerError(`[Sequential] entry ${i} is not a module with forward(x)`);
      this.list.push(this.addModule(i, m));
    }
  }

  get length(): number {
    return this.list.length;
  }

  at(i: number): TensorModule {
    return this.list[index(i, this.list.length, "Sequential")]!;
  }

  [Symbol.iterator](): Iterator<TensorModule> {
    return this.list[Symbol.iterator]();
  }

  /** x through every module in order; intermediate outputs are disposed (the last is returned). */
  forward(x: Tensor): Tensor {
    return chain(this.list, x);
  }
}

/** torch.nn.ModuleList: modules held in order under "0", "1", ... (no forward of its own). */
export class ModuleList<M extends Module = Module> extends Module {
  private readonly list: M[] = [];

  constructor(modules: Iterable<M> = []) {
    super();
    for (const m of modules) this.append(m);
  }

  append(m: M): this {
    this.list.push(this.addModule(String(this.list.length), m));
    return this;
  }

  get length(): number {
    return this.list.length;
  }

  at(i: number): M {
    return this.list[index(i, this.list.length, "ModuleList")]!;
  }

  [Symbol.iterator](): Iterator<M> {
    return this.list[Symbol.iterator]();
  }
}

/** torch.nn.ModuleDict: modules held under string keys (no forward of its own). */
export class ModuleDict<M extends Module = Module> extends Module {
  private readonly map = new Map<string, M>();

  constructor(modules: Record<string, M> = {}) {
    super();
    for (const [k, m] of Object.entries(modules)) this.set(k, m);
  }

  set(key: string, m: M): this {
    if (key === "" || key.includes(".")) throw new ContainerError(`[ModuleDict] key "${key}" must be non-empty and hold no "."`);
    this.map.set(key, this.addModule(key, m));
    return this;
  }

  get(key: string): M {
    const m = this.map.get(key);
    if (m === undefined) throw new ContainerError(`[ModuleDict] no module "${key}" (keys: ${[...this.map.keys()].join(", ")})`);
    return m;
  }

  has(key: string): boolean {
    return this.map.has(key);
  }

  keys(): IterableIterator<string> {
    return this.map.keys();
  }
}

/** A parameter-free module computing fn(x). */
abstract class Activation extends Module implements TensorModule {
  abstract forward(x: Tensor): Tensor;
}

export class ReLU extends Activation {
  forward(x: Tensor): Tensor {
    return relu(x);
  }
}
export class Tanh extends Activation {
  forward(x: Tensor): Tensor {
    return tanh(x);
  }
}
export class Sigmoid extends Activation {
  forward(x: Tensor): Tensor {
    return sigmoid(x);
  }
}
export class SiLU extends Activation {
  forward(x: Tensor): Tensor {
    return silu(x);
  }
}
export class GELU extends Activation {
  constructor(readonly approximate: "none" | "tanh" = "none") {
    super();
  }
  forward(x: Tensor): Tensor {
    return gelu(x, this.approximate);
  }
}
export class Softmax extends Activation {
  constructor(readonly dim = -1) {
    super();
  }
  forward(x: Tensor): Tensor {
    return softmax(x, this.dim);
  }
}
export class LogSoftmax extends Activation {
  constructor(readonly dim = -1) {
    super();
  }
  forward(x: Tensor): Tensor {
    return logSoftmax(x, this.dim);
  }
}
/** torch.nn.Identity: returns its input (the same tensor). */
export class Identity extends Activation {
  forward(x: Tensor): Tensor {
    return x;
  }
}
/** torch.nn.Flatten: dims startDim..endDim into one (default all but the batch dim). */
export class Flatten extends Activation {
  constructor(readonly startDim = 1, readonly endDim = -1) {
    super();
  }
  forward(x: Tensor): Tensor {
    return x.flatten(this.startDim, this.endDim);
  }
}

/**
 * torch.utils.checkpoint.checkpoint_sequential: runs the modules in `segments` consecutive runs, each but the last
 * checkpointed (tensor/checkpoint.ts: its activations recomputed in backward), for a Sequential's gradients with the
 * activations of one segment kept at a time.
 * @example const out = checkpointSequential(model, 4, x); out.sum().backward();
 */
export function checkpointSequential(modules: Sequential | readonly TensorModule[], segments: number, input: Tensor): Tensor {
  const list = [...modules];
  if (!Number.isInteger(segments) || segments < 1 || segments > Math.max(1, list.length))
    throw new ContainerError(`[checkpointSequential] segments must be an integer in [1, ${list.length}], got ${segments}`);
  const size = Math.ceil(list.length / segments);
  let h = input;
  for (let s = 0; s * size < list.length; s++) {
    const part = list.slice(s * size, (s + 1) * size);
    const last = (s + 1) * size >= list.length;
    const next = last ? chain(part, h) : checkpoint((x) => chain(part, x), [h], { parameters: part.flatMap((m) => m.parameters()) });
    if (h !== input && next !== h) h.dispose();
    h = next;
  }
  return h;
}
