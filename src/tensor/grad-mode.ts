// Whether ops record autograd history, and the hook through which they record it.
// The autograd engine (tensor/autograd.ts) installs the recorder; ops only describe what they did.
import type { Tensor } from "./tensor.js";

let enabled = true;

export function isGradEnabled(): boolean {
  return enabled;
}

/** Runs fn without recording autograd history (torch.no_grad). */
export function noGrad<T>(fn: () => T): T {
  const prev = enabled;
  enabled = false;
  try {
    return fn();
  } finally {
    enabled = prev;
  }
}

export function setGradEnabled(on: boolean): void {
  enabled = on;
}

let checkpointDepth = 0;

/**
 * Whether a checkpointed region (checkpoint.ts) is running, its forward without history or its recomputation with
 * it: ops that pick an implementation by grad mode (causalAttention) pick the same one in both passes.
 */
export function inCheckpointRegion(): boolean {
  return checkpointDepth > 0;
}

/** Runs fn as (part of) a checkpointed region's pass. */
export function asCheckpointRegion<T>(fn: () => T): T {
  checkpointDepth++;
  try {
    return fn();
  } finally {
    checkpointDepth--;
  }
}

/** What an op saves for its backward: its name, inputs, and op-specific attributes. */
export interface OpRecord {
  op: string;
  inputs: (Tensor | null)[];
  output: Tensor;
  attrs: Record<string, unknown>;
}

type Recorder = (record: OpRecord) => void;
let recorder: Recorder | null = null;

export function setGradRecorder(r: Recorder | null): void {
  recorder = r;
}

/** Called by every differentiable op after it computed `output`. Cheap when nothing requires grad. */
export function recordOp(op: string, inputs: (Tensor | null)[], output: Tensor, attrs: Record<string, unknown> = {}): void {
  if (!enabled || recorder === null) return;
  let needs = false;
  for (const t of inputs) if (t && t.requiresGrad) needs = true;
  if (!needs) return;
  recorder({ op, inputs, output, attrs });
}

/** Options of Tensor.backward(). */
export interface BackwardOptions {
  /** Keep the saved tensors so backward can run through this graph again (torch's retain_graph). */
  retainGraph?: boolean;
}

type BackwardFn = (root: Tensor, grad: Tensor | undefined, options: BackwardOptions) => void;
let backwardFn: BackwardFn | null = null;

/** Installed by tensor/autograd.ts; late-bound so tensor.ts need not import the engine. */
export function setBackwardHook(fn: BackwardFn | null): void {
  backwardFn = fn;
}

export function runBackward(root: Tensor, grad: Tensor | undefined, options: BackwardOptions = {}): void {
  if (backwardFn === null) throw new Error("[backward] autograd is not loaded: import the tensor package (src/tensor/index.ts)");
  backwardFn(root, grad, options);
  for (const hook of [...postBackwardHooks]) hook();
}

const postBackwardHooks = new Set<() => void>();

/**
 * Runs fn after every backward() has filled the leaves' grads (torch's queue_callback, which DDP uses to all-reduce
 * the gradients once backward is done). Returns the function that removes the hook.
 */
export function registerPostBackwardHook(fn: () => void): () => void {
  postBackwardHooks.add(fn);
  return () => postBackwardHooks.delete(fn);
}
