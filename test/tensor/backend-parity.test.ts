// Property tests: every op on "cpu" (native fast paths + reference fallback) against "reference" (float64 TS),
// on random shapes (rank 0-4), random non-contiguous views (permuted, strided slices, expanded) and broadcasting.
//
// Tolerances, and why:
// - float32 outputs, elementwise: rtol 1e-5 / atol 1e-6. Native computes in f32 (eps 1.2e-7) with SIMD
//   polynomial exp/tanh/erf; the reference computes in f64 and rounds once. A few f32 ulps plus ~1e-6 of
//   approximation error in the transcendental kernels fit well inside.
// - float32 accumulations (sum, matmul, softmax, rms_norm, attention; <= 64 terms of |x| <= 3 here): f32 summation
//   error grows ~sqrt(n) eps * sum|x|, so rtol 1e-4 / atol 1e-4.
// - bfloat16 outputs: 8 significant bits (ulp 2^-7 relative at worst); a tiny f32 difference can flip a rounding,
//   so allow one ulp: rtol 2^-7. float16: 11 bits, rtol 2^-10.
// - linear with bf16 weights over many rows: where the native kernel rounds the activations to bf16 (avx512-bf16,
//   rows >= bf16DotMinM), the reference gets the rounded input too, and the f32 accumulation tolerance holds.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import * as k from "../../src/tensor/index.js";
import type { DType, Tensor } from "../../src/tensor/index.js";
import { isBackendAvailable } from "../../src/backends/registry.js";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { assertClose, prng } from "./suite.js";

const TOL = {
  elementwise: { rtol: 1e-5, atol: 1e-6 },
  accumulate: { rtol: 1e-4, atol: 1e-4 },
  bfloat16: { rtol: 2 ** -7, atol: 1e-6 },
  float16: { rtol: 2 ** -10, atol: 1e-6 },
} as const;

type Rng = () => number;
const int = (rnd: Rng, lo: number, hi: number) => lo + Math.floor(rnd() * (hi - lo + 1));
const pick = <T>(rnd: Rng, xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)]!;

function randomShape(rnd: Rng, minRank = 0, maxRank = 4): number[] {
  return Array.from({ length: int(rnd, minRank, maxRank) }, () => int(rnd, 1, 4));
}

/** A recipe for a (possibly non-contiguous) view of `shape`: the base shape to allocate and how to view it. */
function randomView(rnd: Rng, shape: number[], allowExpand = true): { base: number[]; view: (t: Tensor) => Tensor; kind: string } {
  const rank = shape.length;
  const kinds = rank === 0 ? ["contiguous"] : ["contiguous", "permuted", "strided", ...(allowExpand ? ["expanded"] : [])];
  const kind = pick(rnd, kinds);
  if (kind === "permuted") {
    const p = Array.from({ length: rank }, (_, i) => i).sort(() => rnd() - 0.5);
    const base = new Array<number>(rank);
    p.forEach((src, i) => (base[src] = shape[i]!));
    return { base, view: (t) => t.permute(...p), kind };
  }
  if (kind === "strided") {
    const d = int(rnd, 0, rank - 1);
    const step = int(rnd, 2, 3);
    const start = int(rnd, 0, 1);
    const base = [...shape];
    base[d] = start + (shape[d]! - 1) * step + 1;
    return { base, view: (t) => t.slice(d, start, base[d], step), kind };
  }
  if (kind === "expanded") {
    const base = shape.map((s) => (rnd() < 0.5 ? 1 : s));
    return { base, view: (t) => t.expand(...shape), kind };
  }
  return { base: [...shape], view: (t) => t, kind };
}

/** The same random values as a view on both back ends. */
function pair(rnd: Rng, shape: number[], opts: { lo?: number; hi?: number; dtype?: DType; allowExpand?: boolean } = {}) {
  const { lo = -3, hi = 3, dtype = "float32", allowExpand = true } = opts;
  const v = randomView(rnd, shape, allowExpand);
  const n = v.base.reduce((a, b) => a * b, 1);
  const data = Float32Array.from({ length: n }, () => lo + (hi - lo) * rnd());
  const make = (device: string) => v.view(k.tensor(data, { device, shape: v.base }).to(dtype));
  return { ref: make("reference"), cpu: make("cpu"), kind: v.kind };
}

/** A shape that broadcasts against `shape`: drops some leading dims and sets some dims to 1. */
function broadcastable(rnd: Rng, shape: number[]): number[] {
  const drop = int(rnd, 0, shape.length);
  return shape.slice(drop).map((s) => (rnd() < 0.3 ? 1 : s));
}

function check(name: string, ref: Tensor, cpu: Tensor, tol: { rtol: number; atol: number }): void {
  assert.deepEqual([...cpu.shape], [...ref.shape], `${name}: shape`);
  assert.equal(cpu.dtype, ref.dtype, `${name}: dtype`);
  const tl = ref.dtype === "bfloat16" ? TOL.bfloat16 : ref.dtype === "float16" ? TOL.float16 : tol;
  assertClose(cpu, ref.toList(), { ...tl, msg: name });
}

const TRIALS = 25;
const cpuAvailable = isBackendAvailable("cpu");
const dotMinM = tryLoadNativeKernels()?.bf16DotMinM ?? 0; // see NativeKernels.bf16DotMinM

describe("cpu vs reference parity", { skip: cpuAvailable ? false : 'back end "cpu" is unavailable on this machine' }, () => {
  it("unary math on random views", () => {
    const rnd = prng(101);
    const fns: [string, (t: Tensor) => Tensor, number?][] = [
      ["neg", k.neg], ["exp", k.exp], ["tanh", k.tanh], ["sigmoid", k.sigmoid], ["silu", k.silu], ["gelu", (t) => k.gelu(t)],
      ["gelu_tanh", (t) => k.gelu(t, "tanh")], ["abs", k.abs], ["sin", k.sin], ["cos", k.cos], ["square", k.square], ["relu", k.relu],
      ["floor", k.floor], ["round", k.round], ["log", k.log, 0.05], ["sqrt", k.sqrt, 0.05], ["rsqrt", k.rsqrt, 0.05], ["reciprocal", k.reciprocal, 0.05],
    ];
    for (let i = 0; i < TRIALS; i++)
      for (const [name, f, lo] of fns) {
        const shape = randomShape(rnd);
        const dtype = pick(rnd, ["float32", "float32", "float32", "bfloat16"] as DType[]);
        const p = pair(rnd, shape, { lo: lo ?? -3, hi: 3, dtype });
        check(`${name} ${dtype} [${shape}] ${p.kind}`, f(p.ref), f(p.cpu), TOL.elementwise);
      }
  });

  it("binary ops and comparisons with broadcasting", () => {
    const rnd = prng(202);
    const ops = ["add", "sub", "mul", "div", "maximum", "minimum", "pow", "eq", "lt", "ge"] as const;
    for (let i = 0; i < TRIALS * 4; i++) {
      const op = pick(rnd, ops);
      const shape = randomShape(rnd);
      const bShape = broadcastable(rnd, shape);
      const swap = rnd() < 0.3;
      const a = pair(rnd, swap ? bShape : shape, { lo: op === "pow" ? 0.1 : -3 });
      const b = pair(rnd, swap ? shape : bShape, { lo: op === "pow" ? -2 : op === "div" ? 0.5 : -3, hi: op === "pow" ? 2 : 3 });
      const f = k[op] as (x: Tensor, y: Tensor) => Tensor;
      check(`${op} [${a.ref.shape}] ${a.kind} x [${b.ref.shape}] ${b.kind}`, f(a.ref, b.ref), f(a.cpu, b.cpu), TOL.elementwise);
      const s = Math.round(rnd() * 40) / 10 + 0.5;
      check(`${op} scalar`, f(a.ref, s as unknown as Tensor), f(a.cpu, s as unknown as Tensor), TOL.elementwise);
    }
  });

  it("where, casts and copies between dtypes", () => {
    const rnd = prng(303);
    const dtypes: DType[] = ["float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "int32", "int8", "bool"];
    for (let i = 0; i < TRIALS * 2; i++) {
      const shape = randomShape(rnd);
      const c = pair(rnd, broadcastable(rnd, shape));
      const a = pair(rnd, shape);
      const b = pair(rnd, broadcastable(rnd, shape));
      check(`where [${shape}]`, k.where(c.ref.gt(0), a.ref, b.ref), k.where(c.cpu.gt(0), a.cpu, b.cpu), TOL.elementwise);
      const from = pick(rnd, dtypes);
      const to = pick(rnd, dtypes);
      const x = pair(rnd, shape, { dtype: from, lo: -100, hi: 100 });
      const exact = { rtol: 0, atol: 0 }; // a cast rounds once: both back ends must agree bit for bit
      const rc = x.ref.to(to);
      const cc = x.cpu.to(to);
      assert.equal(cc.dtype, to);
      assertClose(cc, rc.toList(), { ...exact, msg: `cast ${from} -> ${to} ${x.kind}` });
      assertClose(x.cpu.contiguous(), x.ref.contiguous().toList(), { ...exact, msg: `contiguous ${from} ${x.kind}` });
    }
  });

  it("reductions, softmax family and cumsum over random dims", () => {
    const rnd = prng(404);
    for (let i = 0; i < TRIALS * 2; i++) {
      const shape = randomShape(rnd, 1);
      const p = pair(rnd, shape);
      const d = int(rnd, -shape.length, shape.length - 1);
      const keep = rnd() < 0.5;
      const tag = `[${shape}] ${p.kind} dim ${d}`;
      check(`sum ${tag}`, p.ref.sum(d, keep), p.cpu.sum(d, keep), TOL.accumulate);
      check(`sum all ${tag}`, p.ref.sum(), p.cpu.sum(), TOL.accumulate);
      check(`mean ${tag}`, p.ref.mean(d, keep), p.cpu.mean(d, keep), TOL.accumulate);
      check(`max ${tag}`, p.ref.max(d, keep), p.cpu.max(d, keep), TOL.elementwise);
      check(`min ${tag}`, p.ref.min(d, keep), p.cpu.min(d, keep), TOL.elementwise);
      check(`argmax ${tag}`, p.ref.argmax(d, keep), p.cpu.argmax(d, keep), { rtol: 0, atol: 0 });
      check(`argmin ${tag}`, p.ref.argmin(d), p.cpu.argmin(d), { rtol: 0, atol: 0 });
      check(`softmax ${tag}`, p.ref.softmax(d), p.cpu.softmax(d), TOL.accumulate);
      check(`log_softmax ${tag}`, p.ref.logSoftmax(d), p.cpu.logSoftmax(d), TOL.accumulate);
      check(`logsumexp ${tag}`, p.ref.logsumexp(d), p.cpu.logsumexp(d), TOL.accumulate);
      check(`cumsum ${tag}`, p.ref.cumsum(d), p.cpu.cumsum(d), TOL.accumulate);
      const desc = rnd() < 0.5;
      const sr = k.sort(p.ref, d, desc);
      const sc = k.sort(p.cpu, d, desc);
      check(`sort values ${tag}`, sr.values, sc.values, { rtol: 0, atol: 0 });
      check(`sort indices ${tag}`, sr.indices, sc.indices, { rtol: 0, atol: 0 });
    }
  });

  it("matmul (batched, broadcast, transposed operands), linear with f32 and bf16 weights", () => {
    const rnd = prng(505);
    for (let i = 0; i < TRIALS * 2; i++) {
      const M = int(rnd, 1, 5), K = int(rnd, 1, 9), N = int(rnd, 1, 6);
      const batch = randomShape(rnd, 0, 2);
      const bBatch = rnd() < 0.5 ? batch : broadcastable(rnd, batch);
      const a = pair(rnd, [...batch, M, K], { allowExpand: false });
      const b = pair(rnd, [...bBatch, K, N]);
      check(`matmul [${a.ref.shape}] ${a.kind} @ [${b.ref.shape}] ${b.kind}`, k.matmul(a.ref, b.ref), k.matmul(a.cpu, b.cpu), TOL.accumulate);
      const v = pair(rnd, [K]);
      check(`matmul vec`, k.matmul(a.ref, v.ref), k.matmul(a.cpu, v.cpu), TOL.accumulate);
      const wdt = pick(rnd, ["float32", "bfloat16"] as DType[]);
      const w = pair(rnd, [N, K], { dtype: wdt, allowExpand: false });
      const bias = pair(rnd, [N]);
      // avx512-bf16: a bf16 linear over >= bf16DotMinM rows rounds its input to bf16 (as torch does); so does the reference here
      const rounds = wdt === "bfloat16" && dotMinM > 0 && a.ref.numel / K >= dotMinM;
      const xRef = rounds ? a.ref.to("bfloat16").to("float32") : a.ref;
      check(`linear ${wdt} w ${w.kind}${rounds ? " (x rounded to bf16)" : ""}`, k.linear(xRef, w.ref, bias.ref), k.linear(a.cpu, w.cpu, bias.cpu), TOL.accumulate);
    }
  });

  it("embedding, index_select, gather, rms_norm, rotary", () => {
    const rnd = prng(606);
    for (let i = 0; i < TRIALS; i++) {
      const rows = int(rnd, 1, 6), dim = int(rnd, 1, 8);
      const dtype = pick(rnd, ["float32", "bfloat16"] as DType[]);
      const w = pair(rnd, [rows, dim], { dtype, allowExpand: false });
      const ids = Int32Array.from({ length: int(rnd, 1, 6) }, () => int(rnd, 0, rows - 1));
      check(`embedding ${dtype} ${w.kind}`, k.embedding(k.tensor(ids, { device: "reference" }), w.ref), k.embedding(k.tensor(ids, { device: "cpu" }), w.cpu), TOL.elementwise);
      const cols = Int32Array.from({ length: 3 }, () => int(rnd, 0, dim - 1));
      check(`index_select dim 1`, k.indexSelect(w.ref, 1, k.tensor(cols, { device: "reference" })), k.indexSelect(w.cpu, 1, k.tensor(cols, { device: "cpu" })), TOL.elementwise);
      const gi = Int32Array.from({ length: rows * 2 }, () => int(rnd, 0, dim - 1));
      check(`gather`, w.ref.gather(1, k.tensor(gi, { device: "reference", shape: [rows, 2] })), w.cpu.gather(1, k.tensor(gi, { device: "cpu", shape: [rows, 2] })), TOL.elementwise);
      const x = pair(rnd, [int(rnd, 1, 3), int(rnd, 1, 3), dim], { dtype: pick(rnd, ["float32", "bfloat16"] as DType[]) });
      const g = pair(rnd, [dim], { allowExpand: false });
      check(`rms_norm ${x.kind}`, k.rmsNorm(x.ref, g.ref, 1e-5), k.rmsNorm(x.cpu, g.cpu, 1e-5), TOL.accumulate);
      const D = 2 * int(rnd, 1, 4);
      const half = int(rnd, 1, D / 2);
      const T = int(rnd, 1, 4), H = int(rnd, 1, 3), maxPos = 8;
      const xr = pair(rnd, [T, H, D]);
      const ang = Float32Array.from({ length: maxPos * half }, () => rnd() * 6);
      const pos = Int32Array.from({ length: T }, () => int(rnd, 0, maxPos - 1));
      const neox = rnd() < 0.5;
      const rot = (dev: string, xt: Tensor) =>
        k.rotaryEmbedding(xt, k.tensor(pos, { device: dev }), k.tensor(ang.map(Math.cos), { device: dev, shape: [maxPos, half] }), k.tensor(ang.map(Math.sin), { device: dev, shape: [maxPos, half] }), neox);
      check(`rotary neox=${neox} D=${D} rd=${2 * half} ${xr.kind}`, rot("reference", xr.ref), rot("cpu", xr.cpu), TOL.accumulate);
    }
  });

  /** Paged attention of one random ragged batch on both back ends: output and both caches (float32, bfloat16 or fp8). */
  function pagedAttentionCase(
    rnd: Rng,
    c: {
      Hq: number; Hkv: number; D: number; blockSize: number; lens: number[]; newTok: number[]; window: number; cacheDtype: DType; softcap?: number; sinks?: boolean;
      bidirectional?: boolean;
    },
  ): void {
    const { Hq, Hkv, D, blockSize, lens, newTok, window, cacheDtype, softcap = 0 } = c;
    // gpt-oss's attention sinks: per-head logits around the scores' scale, some far above (rows then shrink toward 0)
    const sinkValues = c.sinks ? Float32Array.from({ length: Hq }, (_, h) => (h % 4 === 3 ? 6 : rnd() * 4 - 2)) : null;
    const numSeqs = lens.length, maxBlocks = Math.max(...lens.map((l) => Math.ceil(l / blockSize))), numBlocks = numSeqs * maxBlocks;
    const perm = Array.from({ length: numBlocks }, (_, j) => j).sort(() => rnd() - 0.5);
    const tables = Int32Array.from({ length: numSeqs * maxBlocks }, (_, j) => perm[j]!);
    const slots: number[] = [];
    const qStart = [0];
    lens.forEach((l, s) => {
      for (let p = l - newTok[s]!; p < l; p++) slots.push(tables[s * maxBlocks + Math.floor(p / blockSize)]! * blockSize + (p % blockSize));
      qStart.push(qStart[s]! + newTok[s]!);
    });
    const T = slots.length;
    const cacheData = Float32Array.from({ length: numBlocks * blockSize * Hkv * D * 2 }, () => rnd() * 2 - 1);
    const q = pair(rnd, [T, Hq, D]), kn = pair(rnd, [T, Hkv, D]), vn = pair(rnd, [T, Hkv, D]);
    const run = (dev: string, qq: Tensor, kk: Tensor, vv: Tensor) => {
      const kc = k.tensor(cacheData.subarray(0, cacheData.length / 2), { device: dev, shape: [numBlocks, blockSize, Hkv, D] }).to(cacheDtype);
      const vc = k.tensor(cacheData.subarray(cacheData.length / 2), { device: dev, shape: [numBlocks, blockSize, Hkv, D] }).to(cacheDtype);
      const out = k.pagedAttention({
        q: qq, k: kk, v: vv, kCache: kc, vCache: vc,
        slotMapping: k.tensor(Int32Array.from(slots), { device: dev }),
        blockTables: k.tensor(tables, { device: dev, shape: [numSeqs, maxBlocks] }),
        queryStart: k.tensor(Int32Array.from(qStart), { device: dev }),
        seqLens: k.tensor(Int32Array.from(lens), { device: dev }),
        scale: 1 / Math.sqrt(D), slidingWindow: window, softcap,
        sinks: sinkValues && k.tensor(sinkValues, { device: dev }), bidirectional: c.bidirectional === true,
      });
      return { out, kc, vc };
    };
    const r = run("reference", q.ref, kn.ref, vn.ref);
    const cpu = run("cpu", q.cpu, kn.cpu, vn.cpu);
    const tag = `seqs ${lens} new ${newTok} Hq ${Hq} Hkv ${Hkv} D ${D} bs ${blockSize} window ${window} softcap ${softcap} sinks ${c.sinks === true} bidirectional ${c.bidirectional === true} ${cacheDtype} cache`;
    assert.equal(cpu.kc.dtype, cacheDtype);
    check(`paged attention ${tag}`, r.out, cpu.out, TOL.accumulate);
    check(`k cache ${tag}`, r.kc, cpu.kc, { rtol: 0, atol: 0 });
    check(`v cache ${tag}`, r.vc, cpu.vc, { rtol: 0, atol: 0 });
  }

  it("paged attention: random ragged batches, GQA, sliding windows, soft-capped scores, attention sinks, bidirectional", () => {
    const rnd = prng(707);
    for (let i = 0; i < TRIALS; i++) {
      const Hkv = int(rnd, 1, 2), blockSize = pick(rnd, [1, 2, 4]);
      const lens = Array.from({ length: int(rnd, 1, 3) }, () => int(rnd, 1, 6 * blockSize));
      const window = rnd() < 0.5 ? 0 : int(rnd, 1, 6);
      pagedAttentionCase(rnd, {
        Hq: Hkv * int(rnd, 1, 3), Hkv, D: pick(rnd, [4, 8, 16, 20, 48]), blockSize, lens,
        newTok: lens.map((l) => int(rnd, 1, Math.min(l, 5))), window,
        cacheDtype: pick(rnd, ["float32", "bfloat16", "float8_e4m3fn", "float8_e5m2"] as DType[]), softcap: rnd() < 0.5 ? 0 : 0.2 + rnd(),
        sinks: i % 2 === 1, bidirectional: i % 3 !== 0,
      });
    }
  });

  // Decode of a few sequences splits each one's keys between work items (all of a position's heads per item),
  // then combines the splits' softmax sums: long sequences, one or a few new tokens, head counts over and under
  // the 16 rows an item takes, on 1 and 2 threads (the split count follows the thread count).
  it("paged attention: decode of a few long sequences (keys split between work items)", () => {
    const rnd = prng(708);
    const native = tryLoadNativeKernels();
    const threads = native?.getNumThreads() ?? 1;
    const heads: [number, number][] = [[9, 3], [32, 8], [20, 1], [4, 4], [6, 2]];
    // every cpu case must run the native kernel (a dtype it declined would fall back to the reference kernel)
    let nativeCalls = 0;
    const launcher = native?.stream as { pagedAttention: (...a: unknown[]) => void } | undefined;
    const launch = launcher?.pagedAttention;
    if (launcher && launch)
      launcher.pagedAttention = (...a: unknown[]) => {
        nativeCalls++;
        launch.apply(launcher, a);
      };
    try {
      for (const t of native ? [1, 2] : [1]) {
        native?.setNumThreads(t);
        for (let i = 0; i < 12; i++) {
          const [Hq, Hkv] = heads[i % heads.length]!;
          const lens = Array.from({ length: int(rnd, 1, 2) }, () => int(rnd, 33, 300));
          pagedAttentionCase(rnd, {
            Hq, Hkv, D: pick(rnd, [32, 64]), blockSize: pick(rnd, [4, 16]), lens,
            newTok: lens.map(() => (rnd() < 0.7 ? 1 : int(rnd, 2, 3))), window: rnd() < 0.7 ? 0 : int(rnd, 8, 100),
            cacheDtype: (["float32", "bfloat16", "float8_e4m3fn", "float8_e5m2"] as const)[i % 4]!, softcap: i % 3 === 0 ? 0.3 : 0,
            sinks: i % 2 === 0,
          });
        }
      }
      if (native) assert.equal(nativeCalls, 24, "native paged attention calls");
    } finally {
      native?.setNumThreads(threads);
      if (launcher && launch) launcher.pagedAttention = launch;
    }
  });

  it("random streams are identical", () => {
    for (const seed of [0, 1, 12345]) {
      assert.deepEqual(k.rand([50], { device: "cpu", generator: new k.Generator(seed) }).toList(), k.rand([50], { device: "reference", generator: new k.Generator(seed) }).toList());
    }
  });
});
