// Training checkpoints: a directory per step holding everything an exact resume needs.
//   <root>/step-<n>/model.safetensors      params by name, raw bytes in their own dtype
//   <root>/step-<n>/optimizer.safetensors  optimizer buffers, named "<param index>.<buffer>" (float32)
//   <root>/step-<n>/state.json             step, optimizer scalars, data loader state, RNG state, extras
// A step directory is written under a temporary name and renamed, so a crash never leaves half of one.
import * as fs from "node:fs";
import * as path from "node:path";
import { DTYPE_BYTES, type DType } from "../backends/dtype.js";
import { readSafetensors, writeSafetensors, type SafetensorsDtype } from "../models/formats/safetensors.js";
import { flushDeferred, fromBytes, noGrad, type Tensor } from "../tensor/index.js";
import { KilnError } from "../util/errors.js";
import type { OptimizerStateDict } from "./optim.js";

export class CheckpointError extends KilnError {
  override name = "CheckpointError";
}

const TO_ST: Partial<Record<DType, SafetensorsDtype>> = { float32: "F32", bfloat16: "BF16", float16: "F16" };
const FROM_ST: Partial<Record<SafetensorsDtype, DType>> = { F32: "float32", BF16: "bfloat16", F16: "float16" };

export interface CheckpointState {
  /** Optimizer steps completed. */
  step: number;
  params: [string, Tensor][];
  optimizer: OptimizerStateDict;
  dataLoader?: unknown;
  rng?: unknown;
  /** Anything else the caller wants back (JSON). */
  extra?: unknown;
}

/** Raw bytes of a tensor in its own dtype (row-major). */
function rawBytes(t: Tensor): Uint8Array {
  const c = t.contiguous();
  flushDeferred();
  const bytes = c.device.backend.read(c.storage.buffer, c.offset * DTYPE_BYTES[c.dtype], c.numel * DTYPE_BYTES[c.dtype]);
  if (c !== t) c.dispose();
  return bytes.slice();
}

export function stepDirName(step: number): string {
  return `step-${String(step).padStart(8, "0")}`;
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM"; // someone else's process
  }
}

/** Removes the folders of saves killed mid-write (step-N.tmp-PID of a process no longer running) under root. */
function removeAbandonedSaves(root: string): void {
  for (const name of fs.readdirSync(root)) {
    const m = /^step-\d+\.tmp-(\d+)$/.exec(name);
    if (m !== null && !processAlive(Number(m[1]))) fs.rmSync(path.join(root, name), { recursive: true, force: true });
  }
}

/**
 * Writes a checkpoint for `state.step` under root (into a temporary folder renamed when whole, so a save killed midway
 * never looks like a checkpoint; the next save removes such leftovers); returns its directory.
 */
export function saveCheckpoint(root: string, state: CheckpointState): string {
  const dir = path.join(root, stepDirName(state.step));
  const tmp = `${dir}.tmp-${process.pid}`;
  fs.rmSync(tmp, { recursive: true, force: true });
  fs.mkdirSync(tmp, { recursive: true });
  removeAbandonedSaves(root);
  writeSafetensors(
    path.join(tmp, "model.safetensors"),
    state.params.map(([name, t]) => {
      const dtype = TO_ST[t.dtype];
      if (!dtype) throw new CheckpointError(`[checkpoint] param ${name} has dtype ${t.dtype}, which checkpoints do not store`);
      return { name, dtype, shape: t.shape, data: rawBytes(t) };
    }),
  );
  const buffers: { name: string; dtype: SafetensorsDtype; shape: number[]; data: Float32Array }[] = [];
  const optStates = state.optimizer.states.map((s, i) => {
    if (!s) return null;
    for (const [b, data] of Object.entries(s.buffers)) buffers.push({ name: `${i}.${b}`, dtype: "F32", shape: [data.length], data });
    return { step: s.step, buffers: Object.keys(s.buffers) };
  });
  writeSafetensors(path.join(tmp, "optimizer.safetensors"), buffers);
  const json = {
    format: "kiln-checkpoint-v1",
    step: state.step,
    optimizer: { kind: state.optimizer.kind, lr: state.optimizer.lr, initialLr: state.optimizer.initialLr ?? null, states: optStates },
    dataLoader: state.dataLoader ?? null,
    rng: state.rng ?? null,
    extra: state.extra ?? null,
  };
  fs.writeFileSync(path.join(tmp, "state.json"), JSON.stringify(json, null, 1));
  fs.rmSync(dir, { recursive: true, force: true });
  fs.renameSync(tmp, dir);
  return dir;
}

export interface LoadedCheckpoint {
  step: number;
  optimizer: OptimizerStateDict;
  dataLoader: unknown;
  rng: unknown;
  extra: unknown;
}

/** Copies a checkpoint's params into `params` (by name, shapes and dtypes must match) and returns the rest. */
export function loadCheckpoint(dir: string, params: [string, Tensor][]): LoadedCheckpoint {
  const statePath = path.join(dir, "state.json");
  if (!fs.existsSync(statePath)) throw new CheckpointError(`[checkpoint] ${dir} has no state.json`);
  const json = JSON.parse(fs.readFileSync(statePath, "utf8")) as {
    step: number;
    optimizer: { kind: OptimizerStateDict["kind"]; lr: number; initialLr?: number | null; states: ({ step: number; buffers: string[] } | null)[] };
    dataLoader: unknown;
    rng: unknown;
    extra: unknown;
  };
  const model = readSafetensors(path.join(dir, "model.safetensors"));
  try {
    for (const [name, t] of params) {
      const info = model.get(name);
      if (!info) throw new CheckpointError(`[checkpoint] ${dir} has no param ${name}`);
      const dtype = FROM_ST[info.dtype];
      if (dtype !== t.dtype || info.shape.length !== t.ndim || info.shape.some((s, i) => s !== t.shape[i]))
        throw new CheckpointError(`[checkpoint] param ${name}: checkpoint has ${info.dtype}[${info.shape.join(", ")}], model has ${t.dtype}[${t.shape.join(", ")}]`);
      const src = fromBytes(model.load(name), dtype, t.shape, { device: t.device });
      noGrad(() => t.copy_(src)); // parameters are loaded as torch's load_state_dict copies them, under no_grad
      src.dispose();
    }
  } finally {
    model.close();
  }
  const opt = readSafetensors(path.join(dir, "optimizer.safetensors"));
  try {
    const states = json.optimizer.states.map((s, i) => {
      if (!s) return null;
      const buffers: Record<string, Float32Array> = {};
      for (const b of s.buffers) buffers[b] = opt.loadAsFloat32(`${i}.${b}`);
      return { step: s.step, buffers };
    });
    const { kind, lr, initialLr } = json.optimizer;
    const optimizer: OptimizerStateDict = { kind, lr, ...(typeof initialLr === "number" ? { initialLr } : {}), states };
    return { step: json.step, optimizer, dataLoader: json.dataLoader, rng: json.rng, extra: json.extra };
  } finally {
    opt.close();
  }
}

/** The newest complete step directory under root, or null. */
export function latestCheckpoint(root: string): string | null {
  if (!fs.existsSync(root)) return null;
  const steps = fs
    .readdirSync(root)
    .filter((n) => /^step-\d+$/.test(n) && fs.existsSync(path.join(root, n, "state.json")))
    .sort();
  return steps.length > 0 ? path.join(root, steps[steps.length - 1]!) : null;
}

/** Deletes all but the newest `keep` step directories. */
export function pruneCheckpoints(root: string, keep: number): void {
  if (keep <= 0 || !fs.existsSync(root)) return;
  const steps = fs.readdirSync(root).filter((n) => /^step-\d+$/.test(n)).sort();
  for (const n of steps.slice(0, Math.max(steps.length - keep, 0))) fs.rmSync(path.join(root, n), { recursive: true, force: true });
}
