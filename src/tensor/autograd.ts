// Reverse-mode autograd. Ops describe what they did through recordOp (grad-mode.ts); the recorder here
// turns each record into a node on the output's gradFn, saving (as detached views that hold the storage)
// only the values the op's backward formula needs. backward() walks the graph from the output in
// reverse topological order, sums gradients per tensor, reduces broadcast gradients to input shapes,
// accumulates into leaves' .grad, and frees intermediate gradients and saved values as it goes.
//
// In-place writes bump their storage's version (storage.ts): a backward through a node whose saved values were
// modified after they were saved throws, as torch's does. In-place ops on tensors that require grad are refused
// (elementwise.ts checkInPlace).
import { isFloating } from "../backends/dtype.js";
import { OpError } from "../util/errors.js";
import * as ew from "./ops/elementwise.js";
import * as rd from "./ops/reduce.js";
import * as sh from "./ops/shape.js";
import { noGrad, setBackwardHook, setGradRecorder, type BackwardOptions, type OpRecord } from "./grad-mode.js";
import { onesLike, Tensor, type GradNode, type Shape } from "./tensor.js";
import { elementwiseRules } from "./backward/elementwise.js";
import { nnRules } from "./backward/nn.js";
import { structuralRules } from "./backward/structural.js";
import type { BackwardContext, BackwardRule, RuleTable } from "./backward/types.js";

export type { BackwardContext, BackwardRule } from "./backward/types.js";

const rules: RuleTable = { ...elementwiseRules, ...structuralRules, ...nnRules };

/** Registers (or replaces) the backward formula of an op name (custom ops). */
export function registerBackward(op: string, rule: BackwardRule): void {
  rules[op] = rule;
}

/** Whether an op name has a backward formula (a built-in op's, or one registered before). */
export function hasBackward(op: string): boolean {
  return Object.hasOwn(rules, op);
}

/**
 * What backward() calls on a tensor's gradFn: the vector-Jacobian product, one gradient per input, and the release of
 * what the node saved. AutogradNode is the node of one recorded op; checkpoint.ts's node recomputes a region instead.
 */
export interface BackwardNode extends GradNode {
  backward(g: Tensor): (Tensor | null)[];
  release(): void;
}

/** The autograd node on a tensor's gradFn. */
export class AutogradNode implements BackwardNode {
  private saved: (Tensor | null)[] | null;
  private savedOutput: Tensor | null;
  private readonly savedVersions: number[];
  private freed = false;
  readonly inputShapes: (Shape | null)[];

  constructor(
    readonly op: string,
    readonly inputs: (Tensor | null)[],
    readonly attrs: Record<string, unknown>,
    readonly rule: BackwardRule | undefined,
    output: Tensor,
  ) {
    this.inputShapes = inputs.map((t) => (t ? t.shape : null));
    const saves = rule?.saves ?? "none";
    this.saved = saves === "inputs" || saves === "both" ? inputs.map((t) => (t ? sh.detach(t) : null)) : null;
    this.savedOutput = saves === "output" || saves === "both" ? sh.detach(output) : null;
    this.savedVersions = this.savedValues().map((t) => t?.storage.version ?? 0);
  }

  /** What backward reads: saved inputs, the saved output, and the attrs' tensors (indices, where's condition). */
  private savedValues(): (Tensor | null)[] {
    return [...(this.saved ?? []), this.savedOutput, ...Object.values(this.attrs).filter((v): v is Tensor => v instanceof Tensor)];
  }

  /** Throws when a saved value was written in place after it was saved (torch's version-counter check). */
  private checkVersions(): void {
    this.savedValues().forEach((t, i) => {
      if (t === null || t.storage.version === this.savedVersions[i]) return;
      throw new OpError(this.op, "one of the tensors needed for gradient computation has been modified by an in-place operation " +
        `(storage version ${t.storage.version}, saved at ${this.savedVersions[i]}); clone() it before modifying it`);
    });
  }

  /** Vector-Jacobian product: one gradient per input (null where none flows). */
  backward(g: Tensor): (Tensor | null)[] {
    if (!this.rule) throw new OpError(this.op, "has no backward formula (autograd)");
    if (this.freed)
      throw new OpError(this.op, "backward through a graph whose saved values were already freed; pass { retainGraph: true } to the first backward()");
    this.checkVersions();
    const ctx: BackwardContext = {
      op: this.op,
      inputs: this.saved ?? this.inputs.map(() => null),
      output: this.savedOutput,
      attrs: this.attrs,
      needsGrad: this.inputs.map((t) => t !== null && t.requiresGrad),
      inputShapes: this.inputShapes,
    };
    return this.rule.grad(g, ctx);
  }

  /** Drops the saved values (after a backward without retainGraph). */
  release(): void {
    if (this.freed) return;
    this.freed = true;
    for (const t of this.saved ?? []) t?.dispose();
    this.savedOutput?.dispose();
    for (const v of Object.values(this.attrs)) if (v instanceof Tensor) v.dispose();
    this.saved = null;
    this.savedOutput = null;
  }
}

function record({ op, inputs, output, attrs }: OpRecord): void {
  // integer and bool outputs (comparisons, argmax) are not differentiable
  if (!isFloating(output.dtype)) return;
  // tensors in attrs (indices, masks, rotary tables) are kept alive by the node, whatever the op disposes
  const owned: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(attrs)) owned[k] = v instanceof Tensor ? sh.detach(v) : v;
  output.gradFn = new AutogradNode(op, inputs, owned, rules[op], output);
  output.requiresGrad = true;
}

/** Tensors reachable from root through requiresGrad edges, inputs before the outputs that use them. */
function topologicalOrder(root: Tensor): Tensor[] {
  const order: Tensor[] = [];
  const seen = new Set<Tensor>([root]);
  const stack: [Tensor, number][] = [[root, 0]];
  while (stack.length > 0) {
    const top = stack[stack.length - 1]!;
    const inputs = top[0].gradFn?.inputs ?? [];
    if (top[1] < inputs.length) {
      const child = inputs[top[1]++];
      if (child && child.requiresGrad && !seen.has(child)) {
        seen.add(child);
        stack.push([child, 0]);
      }
    } else {
      stack.pop();
      order.push(top[0]);
    }
  }
  return order;
}

/** Sums g over the dims it was broadcast along so it has `shape` (numpy broadcasting in reverse). */
export function sumToShape(g: Tensor, shape: Shape): Tensor {
  if (g.ndim === shape.length && g.shape.every((s, i) => s === shape[i])) return g;
  const lead = g.ndim - shape.length;
  if (lead < 0) throw new OpError("backward", `gradient [${g.shape.join(", ")}] has fewer dims than its input [${shape.join(", ")}]`);
  const dims: number[] = [];
  for (let i = 0; i < g.ndim; i++) if (i < lead || (shape[i - lead] === 1 && g.shape[i] !== 1)) dims.push(i);
  const s = dims.length > 0 ? rd.sum(g, dims, true) : g;
  if (s.numel !== shape.reduce((a, b) => a * b, 1))
    throw new OpError("backward", `gradient [${g.shape.join(", ")}] does not reduce to its input's shape [${shape.join(", ")}]`);
  const out = s.reshape(...shape);
  if (s !== g && s !== out) s.dispose();
  return out;
}

/**
 * Adds g into t.grad (a fresh contiguous tensor of t's dtype the first time; in place afterwards).
 * `exclusive`: g is held by nothing else, so it may become t.grad without a copy; returns true if it did.
 */
function accumulateGrad(t: Tensor, g: Tensor, exclusive: boolean): boolean {
  const dtype = isFloating(t.dtype) ? t.dtype : "float32";
  if (t.grad === null) {
    if (exclusive && g.dtype === dtype && g.isContiguous && g.storage.refCount === 1 && g.shape.length === t.shape.length) {
      t.grad = g;
      return true;
    }
    t.grad = g.dtype === dtype ? g.clone() : g.to(dtype);
    return false;
  }
  t.grad.add_(g);
  return false;
}

function runBackward(root: Tensor, grad: Tensor | undefined, options: BackwardOptions): void {
  if (!root.requiresGrad) throw new OpError("backward", "the tensor does not require grad and has no gradFn");
  if (grad === undefined && root.numel !== 1)
    throw new OpError("backward", `grad can be implied only for one-element outputs, got [${root.shape.join(", ")}]`);
  // torch.autograd.backward's _make_grads: the grad has exactly the output's shape (no broadcasting at the root)
  if (grad && (grad.shape.length !== root.shape.length || grad.shape.some((d, i) => d !== root.shape[i])))
    throw new OpError("backward", `Mismatch in shape: grad has a shape of [${grad.shape.join(", ")}] and the output has a shape of [${root.shape.join(", ")}]`);
  const order = topologicalOrder(root);
  noGrad(() => {
    const seed = grad ?? onesLike(root, { dtype: "float32" });
    // gradients in flight, with reference counts: a formula may pass one tensor to several inputs
    const pending = new Map<Tensor, Tensor>();
    const refs = new Map<Tensor, number>();
    const retain = (t: Tensor) => refs.set(t, (refs.get(t) ?? 0) + 1);
    const release = (t: Tensor) => {
      const n = (refs.get(t) ?? 0) - 1;
      if (n > 0) refs.set(t, n);
      else {
        refs.delete(t);
        if (t !== grad) t.dispose();
      }
    };
    retain(seed);
    pending.set(root, seed);
    for (let i = order.length - 1; i >= 0; i--) {
      const t = order[i]!;
      const g = pending.get(t);
      if (!g) continue;
      pending.delete(t);
      const node = t.gradFn as BackwardNode | null;
      if (node === null || t.retainsGrad) {
        // a leaf's gradient nobody else holds becomes its .grad as is (saves a copy per parameter)
        const exclusive = node === null && g !== grad && refs.get(g) === 1;
        if (accumulateGrad(t, g, exclusive)) {
          refs.delete(g);
          continue;
        }
      }
      if (node !== null) {
        const grads = node.backward(g);
        node.inputs.forEach((input, j) => {
          const gi = grads[j];
          if (!input || !input.requiresGrad || !gi) {
            if (gi && gi !== g) gi.dispose();
            return;
          }
          const shaped = sumToShape(gi, input.shape);
          retain(shaped);
          if (shaped !== gi) {
            retain(gi);
            release(gi);
          }
          const prev = pending.get(input);
          if (prev) {
            const sum = ew.add(prev, shaped);
            retain(sum);
            release(prev);
            release(shaped);
            pending.set(input, sum);
          } else pending.set(input, shaped);
        });
        if (!options.retainGraph) node.release();
      }
      release(g);
    }
  });
}

setGradRecorder(record);
setBackwardHook(runBackward);

/** torch.autograd.backward: runs backward from `root` (same as root.backward(grad, options)). */
export function backward(root: Tensor, grad?: Tensor, options: BackwardOptions = {}): void {
  runBackward(root, grad, options);
}

/** Turns autograd recording on (it is on once the tensor package is imported; kept for explicitness). */
export function enableAutograd(): void {
  setGradRecorder(record);
  setBackwardHook(runBackward);
}
