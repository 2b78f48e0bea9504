// Seeded random generators. A Generator is a (seed, counter) pair over a counter-based stream, so a
// given seed always yields the same numbers, whatever else runs.
import { OpError } from "../../util/errors.js";
import { runKernel } from "../dispatch.js";
import { empty, Tensor, type Shape, type TensorOptions } from "../tensor.js";
import { cumsum } from "./reduce.js";

export class Generator {
  private counter = 0;
  constructor(private seed_: number = Date.now() >>> 0) {}
  manualSeed(seed: number): this {
    this.seed_ = seed >>> 0;
    this.counter = 0;
    return this;
  }
  get seed(): number {
    return this.seed_;
  }
  /** Reserves n counters and returns the first. */
  take(n: number): number {
    const c = this.counter;
    this.counter += n;
    return c;
  }
  getState(): { seed: number; counter: number } {
    return { seed: this.seed_, counter: this.counter };
  }
  setState(state: { seed: number; counter: number }): void {
    this.seed_ = state.seed;
    this.counter = state.counter;
  }
}

export const defaultGenerator = new Generator(0x5eed);

/** torch.manual_seed for the default generator. */
export function manualSeed(seed: number): void {
  defaultGenerator.manualSeed(seed);
}

type RandOptions = TensorOptions & { generator?: Generator };

function random(dist: "uniform" | "normal", shape: Shape, a: number, b: number, options: RandOptions): Tensor {
  const gen = options.generator ?? defaultGenerator;
  const out = empty(shape, { ...options, dtype: options.dtype ?? "float32" });
  const n = out.numel;
  const counter = gen.take(dist === "normal" ? 2 * n : n);
  runKernel("random", out.device, { op: "random", dist, out: out.view_(dist), seed: gen.seed, counter, a, b }, [out]);
  return out;
}

/** Uniform [low, high). */
export const rand = (shape: Shape, options: RandOptions & { low?: number; high?: number } = {}): Tensor =>
  random("uniform", shape, options.low ?? 0, options.high ?? 1, options);

/** Normal(mean, std). */
export const randn = (shape: Shape, options: RandOptions & { mean?: number; std?: number } = {}): Tensor =>
  random("normal", shape, options.mean ?? 0, options.std ?? 1, options);

/** Draws numSamples indices per row of non-negative weights [rows, n] (or [n]). */
export function multinomial(probs: Tensor, numSamples: number, replacement = false, generator?: Generator): Tensor {
  const rows = probs.ndim === 1 ? 1 : probs.shape[0]!;
  const n = probs.shape[probs.ndim - 1]!;
  if (!replacement && numSamples > n) throw new OpError("multinomial", `cannot draw ${numSamples} samples without replacement from ${n} categories`);
  const w = Float64Array.from(probs.to("float32").dataSync() as Float32Array);
  for (const x of w) if (!(x >= 0) || !Number.isFinite(x)) throw new OpError("multinomial", "weights must be finite and non-negative");
  const u = rand([rows * numSamples], { generator, device: probs.device });
  const draws = u.dataSync() as Float32Array;
  u.dispose();
  const out = new Int32Array(rows * numSamples);
  for (let r = 0; r < rows; r++) {
    const row = w.subarray(r * n, (r + 1) * n);
    for (let s = 0; s < numSamples; s++) {
      let total = 0;
      for (const x of row) total += x;
      if (total <= 0) throw new OpError("multinomial", `row ${r} has no positive weight`);
      let target = draws[r * numSamples + s]! * total;
      let pick = n - 1;
      for (let i = 0; i < n; i++) {
        target -= row[i]!;
        if (target < 0 && row[i]! > 0) {
          pick = i;
          break;
        }
      }
      out[r * numSamples + s] = pick;
      if (!replacement) row[pick] = 0;
    }
  }
  const t = empty(probs.ndim === 1 ? [numSamples] : [rows, numSamples], { dtype: "int32", device: probs.device });
  t.device.backend.write(t.storage.buffer, 0, new Uint8Array(out.buffer));
  return t;
}

export { cumsum };
