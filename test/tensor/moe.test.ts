// moe (the on-device mixture of experts) against a float64 reference written here from the definition, for random
// routings over several token counts, top-k and expert counts, with an expert no token chooses and one every token
// chooses; f32 / bf16 weights on every back end, int8 / int4 experts on cpu (quant_matmul's reference for their
// products); gpt-oss's clamped SwiGLU with biases; ids outside [0, E) add nothing; a cpu step graph replayed with a
// new routing; the native row sort (topk) against the reference's; and the typed errors.
import assert from "node:assert/strict";
import { describe, it, test } from "node:test";
import type { MoeActivation, QuantScheme } from "../../src/backends/backend.js";
import type { CpuBackend } from "../../src/backends/cpu/cpu-backend.js";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { newScales, quantMatmulRef, quantScaleBytes, quantScaleCount } from "../../src/backends/cpu/quant-reference.js";
import * as k from "../../src/tensor/index.js";
import type { MoeExpert, Tensor } from "../../src/tensor/index.js";
import { quantizeWeight, type QuantizedWeight } from "../../src/tensor/ops/linalg.js";
import { OpError } from "../../src/util/errors.js";
import { bytesOfTensor } from "../helpers/model-logits.js";
import { BACKENDS, prng } from "./suite.js";

const native = tryLoadNativeKernels();

type WeightKind = "float32" | "bfloat16" | QuantScheme;

/** A problem as host data: x [T, H], ids / weights [T, K], per expert gate/up [I, H], down [H, I], biases. */
interface Problem {
  T: number; H: number; I: number; K: number; E: number;
  x: Float32Array; ids: Int32Array; w: Float32Array;
  experts: { gate: Float32Array; up: Float32Array; down: Float32Array; bg: Float32Array; bu: Float32Array; bd: Float32Array }[];
}

const uniform = (rand: () => number, n: number, scale = 1) => Float32Array.from({ length: n }, () => (rand() * 2 - 1) * scale);

/**
 * Random routing where expert 0 is every token's first choice and expert E - 1 nobody's; the other choices are
 * distinct experts in [1, E - 2].
 */
function problem(T: number, K: number, E: number, seed: number, H = 64, I = 128): Problem {
  assert.ok(K <= E - 1);
  const rand = prng(seed);
  const ids = new Int32Array(T * K);
  for (let t = 0; t < T; t++) {
    const pool = Array.from({ length: E - 2 }, (_, i) => i + 1);
    ids[t * K] = 0;
    for (let j = 1; j < K; j++) ids[t * K + j] = pool.splice(Math.floor(rand() * pool.length), 1)[0]!;
  }
  const experts = Array.from({ length: E }, () => ({
    gate: uniform(rand, I * H, 0.2), up: uniform(rand, I * H, 0.2), down: uniform(rand, H * I, 0.2),
    bg: uniform(rand, I, 0.5), bu: uniform(rand, I, 0.5), bd: uniform(rand, H, 0.5),
  }));
  return { T, H, I, K, E, x: uniform(rand, T * H), ids, w: Float32Array.from({ length: T * K }, () => rand()), experts };
}

/** The weights as the device holds them (bf16 rounded, quantized) and the host's view of them for the reference. */
interface Held {
  experts: MoeExpert[];
  /** y = W x for one row, as the reference computes it with these weights. */
  project: (e: number, which: "gate" | "up" | "down", x: Float64Array) => Float64Array;
  dispose: () => void;
}

function hold(p: Problem, kind: WeightKind, device: string, biases: boolean): Held {
  const made: Tensor[] = [];
  const quants: QuantizedWeight[] = [];
  const host = new Map<string, { f?: Float64Array; q?: QuantizedWeight }>();
  const weight = (data: Float32Array, n: number, kk: number, key: string): Tensor | QuantizedWeight => {
    const f = k.tensor(data, { device, shape: [n, kk] });
    if (kind === "float32") {
      made.push(f);
      host.set(key, { f: Float64Array.from(data) });
      return f;
    }
    if (kind === "bfloat16") {
      const b = f.to("bfloat16");
      f.dispose();
      made.push(b);
      host.set(key, { f: Float64Array.from(b.toList().flat(2) as number[]) });
      return b;
    }
    const q = quantizeWeight(f, kind);
    f.dispose();
    quants.push(q);
    host.set(key, { q });
    return q;
  };
  const bias = (data: Float32Array) => {
    const t = k.tensor(data, { device });
    made.push(t);
    return t;
  };
  const { H, I } = p;
  const experts = p.experts.map((ex, e) => ({
    gate: { weight: weight(ex.gate, I, H, `${e}.gate`), bias: biases ? bias(ex.bg) : null },
    up: { weight: weight(ex.up, I, H, `${e}.up`), bias: biases ? bias(ex.bu) : null },
    down: { weight: weight(ex.down, H, I, `${e}.down`), bias: biases ? bias(ex.bd) : null },
  }));
  const project = (e: number, which: "gate" | "up" | "down", x: Float64Array): Float64Array => {
    const [n, kk] = which === "down" ? [H, I] : [I, H];
    const { f, q } = host.get(`${e}.${which}`)!;
    if (q) {
      // quant_matmul's reference: the activation rounding of the int8-activation schemes included
      const count = quantScaleCount(q.scheme, n, kk);
      const scales = newScales(q.scheme, count, bytesOfTensor(q.scales).slice(0, count * quantScaleBytes(q.scheme)).buffer);
      const rowSums = q.rowSums ? new Int32Array(bytesOfTensor(q.rowSums).slice().buffer) : new Int32Array(0);
      return Float64Array.from(quantMatmulRef(q.scheme, Float32Array.from(x), { data: bytesOfTensor(q.data).slice(), scales, rowSums }, 1, n, kk));
    }
    const y = new Float64Array(n);
    for (let i = 0; i < n; i++) for (let j = 0; j < kk; j++) y[i] += f![i * kk + j]! * x[j]!;
    return y;
  };
  const dispose = () => {
    for (const t of made) t.dispose();
    for (const q of quants) for (const t of [q.data, q.scales, q.rowSums]) t?.dispose();
  };
  return { experts, project, dispose };
}

/** out[t] = sum_j w[t, j] * down(act(gate x_t + bg, up x_t + bu)) + bd, in float64, straight from the definition. */
function expected(p: Problem, held: Held, act: MoeActivation, biases: boolean, ids = p.ids): Float64Array {
  const out = new Float64Array(p.T * p.H);
  for (let t = 0; t < p.T; t++) {
    const xt = Float64Array.from(p.x.subarray(t * p.H, (t + 1) * p.H));
    for (let j = 0; j < p.K; j++) {
      const e = ids[t * p.K + j]!;
      if (e < 0 || e >= p.E) continue;
      const ex = p.experts[e]!;
      const g = held.project(e, "gate", xt);
      const u = held.project(e, "up", xt);
      const h = new Float64Array(p.I);
      for (let i = 0; i < p.I; i++) {
        const gi = g[i]! + (biases ? ex.bg[i]! : 0);
        const ui = u[i]! + (biases ? ex.bu[i]! : 0);
        if (act.kind === "silu") h[i] = (gi / (1 + Math.exp(-gi))) * ui;
        else {
          const gc = Math.min(gi, act.limit);
          h[i] = (Math.max(-act.limit, Math.min(act.limit, ui)) + 1) * (gc / (1 + Math.exp(-act.alpha * gc)));
        }
      }
      const y = held.project(e, "down", h);
      for (let i = 0; i < p.H; i++) out[t * p.H + i] += p.w[t * p.K + j]! * (y[i]! + (biases ? ex.bd[i]! : 0));
    }
  }
  return out;
}

const TOL: Record<WeightKind, number> = { float32: 2e-5, bfloat16: 1e-2, int8: 3e-2, int4: 3e-2, fp8: 3e-2, int8_g32: 3e-2, q4_k: 3e-2, mxfp4: 3e-2, q6_k: 3e-2, q5_k: 3e-2, iq4_nl: 3e-2 };

function check(got: number[], want: Float64Array, kind: WeightKind, what: string): void {
  const scale = want.reduce((a, v) => Math.max(a, Math.abs(v)), 0);
  assert.ok(scale > 0.02, `${what}: a non-trivial output`);
  for (let i = 0; i < want.length; i++)
    if (!(Math.abs(got[i]! - want[i]!) <= TOL[kind] * scale)) assert.fail(`${what}: element ${i}: got ${got[i]}, want ${want[i]} (scale ${scale})`);
}

function run(p: Problem, held: Held, device: string, act: MoeActivation, ids = p.ids): number[] {
  const x = k.tensor(p.x, { device, shape: [p.T, p.H] });
  const idt = k.tensor(ids, { device, shape: [p.T, p.K] });
  const w = k.tensor(p.w, { device, shape: [p.T, p.K] });
  const out = k.moe(x, idt, w, held.experts, act);
  assert.deepEqual([...out.shape], [p.T, p.H]);
  const got = out.toList().flat() as number[];
  for (const t of [x, idt, w, out]) t.dispose();
  return got;
}

const SILU: MoeActivation = { kind: "silu" };
const CLAMPED: MoeActivation = { kind: "clamped_swiglu", alpha: 1.702, limit: 0.6 };

describe("moe against the float64 definition", () => {
  const shapes = [
    { T: 1, K: 1, E: 3 },
    { T: 1, K: 2, E: 8 },
    { T: 5, K: 2, E: 4 },
    { T: 16, K: 4, E: 8 },
  ];
  for (const device of BACKENDS) {
    const kinds: WeightKind[] = device === "cpu" && native ? ["float32", "bfloat16", "int8", "int4"] : ["float32", "bfloat16"];
    for (const kind of kinds)
      it(`${device}, ${kind} experts: T, K, E in ${shapes.map((s) => `(${s.T}, ${s.K}, ${s.E})`).join(" ")}`, () => {
        shapes.forEach((s, n) => {
          const p = problem(s.T, s.K, s.E, 100 + n);
          const held = hold(p, kind, device, false);
          check(run(p, held, device, SILU), expected(p, held, SILU, false), kind, `T=${s.T} K=${s.K} E=${s.E}`);
          held.dispose();
        });
      });
    it(`${device}: gpt-oss's clamped SwiGLU with expert biases (the clamp bites)`, () => {
      const p = problem(6, 2, 5, 7);
      const held = hold(p, "float32", device, true);
      const want = expected(p, held, CLAMPED, true);
      check(run(p, held, device, CLAMPED), want, "float32", "clamped");
      // the limit matters here: the unclamped definition differs
      const loose = expected(p, held, { ...CLAMPED, limit: 100 }, true);
      assert.ok(want.some((v, i) => Math.abs(v - loose[i]!) > 1e-3), "the clamp changes the output");
      held.dispose();
    });
    it(`${device}: ids outside [0, E) add nothing`, () => {
      const p = problem(3, 2, 4, 9);
      const held = hold(p, "float32", device, false);
      const ids = Int32Array.from(p.ids);
      ids[1] = -1;
      ids[4] = 4;
      const want = expected(p, held, SILU, false, ids);
      check(run(p, held, device, SILU, ids), want, "float32", "bad ids");
      assert.ok(want.some((v, i) => Math.abs(v - expected(p, held, SILU, false)[i]!) > 1e-3), "dropping the choices changes the output");
      held.dispose();
    });
  }
});

test("moe: cpu step graphs (the native job, never the host path) replay with new routings, read when the kernel runs", { skip: !native && "native kernels not built" }, async () => {
  const be = k.device("cpu").backend as CpuBackend;
  const cases: { kind: WeightKind; act: MoeActivation; biases: boolean }[] = [
    { kind: "float32", act: SILU, biases: false },
    { kind: "bfloat16", act: SILU, biases: false },
    { kind: "int8", act: SILU, biases: false },
    { kind: "int4", act: CLAMPED, biases: true },
  ];
  for (const c of cases) {
    const p = problem(4, 2, 6, 21);
    const held = hold(p, c.kind, "cpu", c.biases);
    const x = k.tensor(p.x, { device: "cpu", shape: [p.T, p.H] });
    const ids = k.tensor(p.ids, { device: "cpu", shape: [p.T, p.K] });
    const w = k.tensor(p.w, { device: "cpu", shape: [p.T, p.K] });
    await be.synchronize();
    be.beginCapture(); // a kernel without a native path throws CaptureError here
    let out: Tensor;
    try {
      out = k.moe(x, ids, w, held.experts, c.act);
    } catch (e) {
      be.abortCapture();
      throw e;
    }
    const graph = be.endCapture();
    const routings = [p.ids, Int32Array.from([5, 1, 5, 1, 5, 1, 5, 1]), Int32Array.from([2, 3, 0, 4, 1, 2, 3, 0])];
    for (const [r, routing] of routings.entries()) {
      be.writeAsync(ids.storage.buffer, ids.offset * 4, new Uint8Array(routing.buffer));
      graph.launch();
      check(out.toList().flat() as number[], expected(p, held, c.act, c.biases, routing), c.kind, `${c.kind} replay ${r}`);
    }
    graph.dispose();
    for (const t of [x, ids, w, out]) t.dispose();
    held.dispose();
  }
});

test("topk's row sort: native equals the reference's (stable, NaN largest, ties in index order)", { skip: !native && "native kernels not built" }, () => {
  const rand = prng(5);
  const data = Float32Array.from({ length: 7 * 33 }, () => Math.round(rand() * 8) / 4); // many ties
  data[3] = NaN;
  data[40] = -Infinity;
  data[41] = -0;
  for (const descending of [true, false]) {
    const run1 = (device: string) => {
      const s = k.sort(k.tensor(data, { device, shape: [7, 33] }), -1, descending);
      return [s.values.toList(), s.indices.toList()];
    };
    assert.deepEqual(run1("cpu"), run1("reference"), `descending ${descending}`);
  }
  const { values, indices } = k.topk(k.tensor(Float32Array.from([0.1, 0.5, 0.2, 0.5]), { shape: [1, 4] }), 2);
  assert.deepEqual([values.toList().flat(), indices.toList().flat()], [[0.5, 0.5], [1, 3]]);
});

test("moe: typed errors name the op and the bad input", () => {
  const p = problem(2, 1, 3, 1, 64, 64);
  const held = hold(p, "float32", "cpu", false);
  const x = k.tensor(p.x, { shape: [2, 64] });
  const ids = k.tensor(p.ids, { shape: [2, 1] });
  const w = k.tensor(p.w, { shape: [2, 1] });
  assert.throws(() => k.moe(x, ids.to("float32"), w, held.experts, SILU), (e: unknown) => e instanceof OpError && /ids must be int32/.test(e.message));
  assert.throws(() => k.moe(x, ids, k.ones([2, 2]), held.experts, SILU), (e: unknown) => e instanceof OpError && /must both be \[2, K\]/.test(e.message));
  assert.throws(() => k.moe(x, ids, w, [], SILU), (e: unknown) => e instanceof OpError && /at least one expert/.test(e.message));
  const bad = [{ ...held.experts[0]!, down: { weight: k.ones([64, 32]) } }];
  assert.throws(() => k.moe(x, ids, w, bad, SILU), (e: unknown) => e instanceof OpError && /expert 0 down: weight must be a float or quantized \[64, 64\]/.test(e.message));
  assert.throws(() => k.moe(x, ids, w, held.experts, { kind: "clamped_swiglu", alpha: 1, limit: 0 }), (e: unknown) => e instanceof OpError && /limit > 0/.test(e.message));
  held.dispose();
});
