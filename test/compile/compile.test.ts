// compile(): compiled results equal eager ones; bucketed dynamic dims bound recompiles; the on-disk cache
// is shared across processes and rebuilds corrupt entries; no C compiler falls back op by op.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import * as k from "../../src/tensor/index.js";
import { compile, compileCacheStats, jitUnavailableReason, where } from "../../src/compile/index.js";
import { forgetLoaded } from "../../src/compile/cache.js";
import { assertClose } from "../tensor/suite.js";
import { chain, gatedMlp, normScale } from "./fixtures.js";

const cacheDir = mkdtempSync(join(tmpdir(), "kiln-compile-test-"));
process.env.KILN_CACHE_DIR = cacheDir;
const hasJit = jitUnavailableReason() === null;

const rand = (shape: number[], seed: number) => {
  let s = seed;
  const n = shape.reduce((a, b) => a * b, 1);
  return k.tensor(Float32Array.from({ length: n }, () => ((s = (s * 1103515245 + 12345) % 2147483648) / 2147483648) * 2 - 1), { shape });
};

describe("compile: compiled equals eager", () => {
  it("fuses an elementwise chain with broadcasting into one kernel", () => {
    const x = rand([16, 33], 1);
    const y = rand([33], 2);
    const f = compile((a, b) => chain(a, b));
    assertClose(f(x, y) as k.Tensor, chain(x, y).dataSync() as Float32Array, { rtol: 1e-5, atol: 1e-6 });
    if (hasJit) {
      assert.equal(f.lastInfo!.jit, true);
      assert.equal(f.lastInfo!.fusedKernels, 1);
      assert.equal(f.lastInfo!.segments, 1);
    }
  });

  it("fuses residual add -> rms_norm -> scale", () => {
    const x = rand([5, 64], 3);
    const w = rand([64], 4);
    const r = rand([5, 64], 5);
    const f = compile((a, b, c) => normScale(a, b, c) as never);
    assertClose(f(x, w, r) as k.Tensor, (normScale(x, w, r) as k.Tensor).dataSync() as Float32Array, { rtol: 1e-4, atol: 1e-5 });
    if (hasJit) assert.equal(f.lastInfo!.fusedKernels, 1);
  });

  it("runs a gated MLP (matmuls through the back end, silu*mul and residual fused)", () => {
    const D = 32;
    const F = 48;
    const x = rand([6, D], 6);
    const wg = rand([F, D], 7);
    const wu = rand([F, D], 8);
    const wd = rand([D, F], 9);
    const wn = rand([D], 10);
    // weights captured by closure become params
    const f = compile((a) => gatedMlp(a, wg, wu, wd, wn));
    assertClose(f(x) as k.Tensor, gatedMlp(x, wg, wu, wd, wn).dataSync() as Float32Array, { rtol: 1e-4, atol: 1e-4 });
    if (hasJit) {
      assert.equal(f.lastInfo!.opaqueKernels, 3);
      assert.ok(f.lastInfo!.fusedKernels <= 3, `fused kernels ${f.lastInfo!.fusedKernels}`);
      assert.ok(f.lastInfo!.arenaBytes <= f.lastInfo!.naiveBytes);
    }
  });

  it("handles reductions, softmax and transposed reads", () => {
    const x = rand([4, 10], 11);
    const f = compile((a: any) => [a.mul(2).softmax(-1), a.exp().sum(-1), a.T.add(1), a.max(-1, true).sub(a.mean())]);
    const got = f(x) as k.Tensor[];
    assertClose(got[0]!, x.mul(2).softmax(-1).dataSync() as Float32Array, { rtol: 1e-5, atol: 1e-6 });
    assertClose(got[1]!, x.exp().sum(-1).dataSync() as Float32Array, { rtol: 1e-5, atol: 1e-5 });
    assertClose(got[2]!, x.T.add(1).dataSync() as Float32Array);
    assert.deepEqual(got[2]!.shape, [10, 4]);
    assertClose(got[3]!, x.max(-1, true).sub(x.mean()).dataSync() as Float32Array, { rtol: 1e-5, atol: 1e-5 });
  });
});

describe("compile: result shapes equal eager's", () => {
  it("T of a 3-d tensor reverses every dim (mT swaps the last two); sum / mean over all dims with keepdim keep each dim", () => {
    const x = rand([2, 3, 4], 21);
    const fn = (a: any) => [a.T.mul(1), a.sum(undefined, true), a.mean(undefined, true), a.max()];
    const want = [x.T.mul(1), x.sum(undefined, true), x.mean(undefined, true), x.max()];
    for (const capture of ["symbolic", "dispatch"] as const) {
      const got = compile(fn, { capture })(x) as k.Tensor[];
      assert.deepEqual(got.map((t) => [...t.shape]), [[4, 3, 2], [1, 1, 1], [1, 1, 1], []], capture);
      got.forEach((t, i) => assertClose(t, want[i]!.dataSync() as Float32Array, { shape: [...want[i]!.shape], rtol: 1e-5, atol: 1e-5, msg: capture }));
    }
    const mT = compile((a: any) => a.mT.mul(1), { capture: "symbolic" })(x) as k.Tensor;
    assertClose(mT, x.mT.mul(1).dataSync() as Float32Array, { shape: [2, 4, 3] });
  });

  it("a traced unsqueeze out of range or a reshape with two -1 throws eager's error (unsqueeze(5) of a 2-d x gave [.., 1])", () => {
    const x = rand([2, 3], 24);
    for (const capture of ["symbolic", "auto"] as const) {
      assert.throws(() => compile((a: any) => a.unsqueeze(5).mul(1), { capture })(x), /\[unsqueeze\] dimension 5 out of range/, capture);
      assert.throws(() => compile((a: any) => a.reshape(-1, -1).mul(1), { capture })(x), /\[reshape\] only one dimension can be -1/, capture);
    }
    assert.deepEqual([...(compile((a: any) => a.unsqueeze(-1).mul(1), { capture: "symbolic" })(x) as k.Tensor).shape], [2, 3, 1]);
  });

  it("matmul with a 1-d operand returns eager's squeezed shape (dispatch capture returned [1, N])", () => {
    const v = rand([3], 22);
    const m = rand([3, 2], 23);
    for (const capture of ["auto", "dispatch"] as const) {
      const got = compile((a: any, b: any) => a.matmul(b), { capture })(v, m) as k.Tensor;
      assert.deepEqual([...got.shape], [2], capture);
      assertClose(got, v.matmul(m).dataSync() as Float32Array, { rtol: 1e-5, atol: 1e-6 });
    }
  });
});

describe("compile: paged attention", () => {
  it("keeps bidirectional attention (one sequence whose rows all see every key) in the program", () => {
    const [T, H, D, BS] = [12, 2, 16, 4];
    const i32 = (xs: number[]) => k.tensor(Int32Array.from(xs));
    const args = [rand([T, H, D], 3), rand([T, H, D], 4), rand([T, H, D], 5)];
    const meta = [i32(Array.from({ length: T }, (_, i) => i)), k.tensor(Int32Array.of(0, 1, 2), { shape: [1, 3] }), i32([0, T]), i32([T])];
    const attend = (q: k.Tensor, kk: k.Tensor, vv: k.Tensor, kc: k.Tensor, vc: k.Tensor, slots: k.Tensor, tables: k.Tensor, qs: k.Tensor, lens: k.Tensor, bidirectional = true) =>
      k.pagedAttention({ q, k: kk, v: vv, kCache: kc, vCache: vc, slotMapping: slots, blockTables: tables, queryStart: qs, seqLens: lens, scale: 0.25, bidirectional });
    const caches = () => [k.zeros([3, BS, H, D]), k.zeros([3, BS, H, D])];
    const f = compile((q, kk, vv, kc, vc, slots, tables, qs, lens) => attend(q, kk, vv, kc, vc, slots, tables, qs, lens));
    const got = (f(...args, ...caches(), ...meta) as k.Tensor).dataSync() as Float32Array;
    const [a, b, c] = args as [k.Tensor, k.Tensor, k.Tensor];
    const [kc, vc] = caches() as [k.Tensor, k.Tensor];
    const [slots, tables, qs, lens] = meta as [k.Tensor, k.Tensor, k.Tensor, k.Tensor];
    assertClose(got, attend(a, b, c, kc, vc, slots, tables, qs, lens).dataSync() as Float32Array, { rtol: 1e-5, atol: 1e-6 });
    // the first row sees later keys: causal attention gives another first row
    const [kc2, vc2] = caches() as [k.Tensor, k.Tensor];
    const causal = attend(a, b, c, kc2, vc2, slots, tables, qs, lens, false).dataSync() as Float32Array;
    assert.ok(Math.abs(causal[0]! - got[0]!) > 1e-4, "the first row attended bidirectionally");
  });
});

describe("compile: traced dtypes follow eager's promotion", () => {
  it("bool and int operands with scalars, where with a scalar, sums of 8-bit ints; bool subtraction raises", () => {
    const b = k.tensor([true, false, true]);
    const i = k.tensor(new Int32Array([1, 2, 3]));
    const u = k.tensor(new Uint8Array([200, 100, 255]));
    const f = compile((b: any, i: any, u: any) => [b.add(1), where(b, i, 0.5), u.sum(), where(b, 1, i), b.mul(2.5)]);
    const got = f(b, i, u) as k.Tensor[];
    const want = [b.add(1), k.where(b, i, 0.5), u.sum(), k.where(b, 1, i), b.mul(2.5)];
    assert.deepEqual(got.map((t) => t.dtype), ["int32", "float32", "int32", "int32", "float32"]);
    got.forEach((t, j) => {
      assert.equal(t.dtype, want[j]!.dtype);
      assert.deepEqual(t.toList(), want[j]!.toList());
    });
    assert.throws(() => compile((x: any) => x.sub(1))(b), /\[sub\] Subtraction, the `-` operator, with a bool tensor is not supported/);
  });
});

describe("compile: buckets and guards", () => {
  it("reuses a program within a bucket and recompiles for a new bucket or dtype", () => {
    const f = compile((a: any) => a.mul(3).add(1).relu(), { dynamic: { argIndex: 0, dim: 0, max: 64 } });
    for (const n of [5, 7, 8]) {
      const x = rand([n, 4], n);
      const y = f(x) as k.Tensor;
      assert.deepEqual(y.shape, [n, 4]);
      assertClose(y, x.mul(3).add(1).relu().dataSync() as Float32Array);
    }
    assert.equal(f.stats.compiles, 1);
    assert.equal(f.stats.recompiles, 0);
    f(rand([9, 4], 9)); // bucket 16
    assert.equal(f.stats.recompiles, 1);
    f(rand([12, 4], 12)); // still bucket 16
    assert.equal(f.stats.recompiles, 1);
    f(k.ones([3, 4], { dtype: "int32" })); // dtype guard
    assert.equal(f.stats.recompiles, 2);
    f(rand([3, 5], 3)); // non-bucketed dim guard
    assert.equal(f.stats.recompiles, 3);
  });

  it("guards captured scalars", () => {
    const f = compile((a: any, s) => a.mul(s));
    const x = rand([4], 1);
    assertClose(f(x, 2) as k.Tensor, x.mul(2).dataSync() as Float32Array);
    f(x, 2);
    assert.equal(f.stats.compiles, 1);
    assertClose(f(x, 3) as k.Tensor, x.mul(3).dataSync() as Float32Array);
    assert.equal(f.stats.recompiles, 1);
    // -0 is its own scalar (x / -0 is -inf; it reused 0's program) and a -0 literal keeps its sign in generated C
    const d = compile((a: any, s) => a.div(s));
    const one = k.tensor([1, -2]);
    assert.deepEqual((d(one, 0) as k.Tensor).toList(), [Infinity, -Infinity]);
    assert.deepEqual((d(one, -0) as k.Tensor).toList(), [-Infinity, Infinity]);
    assert.deepEqual((compile((a: any) => a.div(-0).exp())(one) as k.Tensor).toList(), [0, Infinity]);
  });

  it("refuses a dynamic dim that its argument does not have", () => {
    const f = (dynamic: { argIndex: number; dim: number; max: number }) => compile((a: any) => a.mul(2), { dynamic });
    assert.throws(() => f({ argIndex: 0, dim: 2, max: 8 })(rand([3, 2], 1)), /\[compile\] dynamic dim 2 is out of range for argument 0 of rank 2/);
    assert.throws(() => f({ argIndex: 1, dim: 0, max: 8 })(rand([3, 2], 1)), /\[compile\] dynamic dim 0 names argument 1, which is not a tensor/);
  });
});

describe("compile: disk cache", { skip: hasJit ? false : "no C compiler / kiln_jit" }, () => {
  const child = fileURLToPath(new URL("./cache-child.js", import.meta.url));
  const runChild = (env: NodeJS.ProcessEnv) => {
    const r = spawnSync(process.execPath, [child], { env: { ...process.env, ...env }, encoding: "utf8" });
    assert.equal(r.status, 0, r.stderr);
    return JSON.parse(r.stdout.trim().split("\n").pop()!) as { stats: { cacheHits: number }; cache: { hits: number; misses: number; corrupt: number }; jit: boolean; sum: number };
  };

  it("a second process hits the cache and does not compile", () => {
    const dir = mkdtempSync(join(tmpdir(), "kiln-cache-x-"));
    const first = runChild({ KILN_CACHE_DIR: dir });
    assert.equal(first.cache.misses, 1);
    const second = runChild({ KILN_CACHE_DIR: dir });
    assert.equal(second.jit, true);
    assert.equal(second.cache.misses, 0);
    assert.equal(second.cache.hits, 1);
    assert.equal(second.stats.cacheHits, 1);
    assert.equal(second.sum, first.sum);
  });

  it("rebuilds a truncated library and bad metadata", () => {
    const dir = mkdtempSync(join(tmpdir(), "kiln-cache-c-"));
    runChild({ KILN_CACHE_DIR: dir });
    const entry = join(dir, "compile", readdirSync(join(dir, "compile"))[0]!);
    const lib = readdirSync(entry).find((f) => f.endsWith(".so"))!;
    const bytes = readFileSync(join(entry, lib));
    writeFileSync(join(entry, lib), bytes.subarray(0, bytes.length >> 1));
    const afterTruncate = runChild({ KILN_CACHE_DIR: dir });
    assert.equal(afterTruncate.cache.corrupt, 1);
    assert.equal(afterTruncate.cache.misses, 1);
    writeFileSync(join(entry, "meta.json"), "{ not json");
    const afterMeta = runChild({ KILN_CACHE_DIR: dir });
    assert.equal(afterMeta.cache.corrupt, 1);
    assert.equal(afterMeta.cache.misses, 1);
    const healthy = runChild({ KILN_CACHE_DIR: dir });
    assert.equal(healthy.cache.misses, 0);
    assert.equal(healthy.sum, afterMeta.sum);
  });

  it("two processes compiling the same graph at once both succeed and leave one valid entry", async () => {
    const dir = mkdtempSync(join(tmpdir(), "kiln-cache-race-"));
    const startAt = String(Date.now() + 1500); // both children are loaded by then and start compiling together
    const race = () =>
      new Promise<{ cache: { misses: number; hits: number }; jit: boolean; values: number[] }>((resolve, reject) => {
        const p = spawn(process.execPath, [child], { env: { ...process.env, KILN_CACHE_DIR: dir, KILN_TEST_START_AT: startAt } });
        let out = "";
        let err = "";
        p.stdout.on("data", (d: Buffer) => (out += d.toString()));
        p.stderr.on("data", (d: Buffer) => (err += d.toString()));
        p.on("error", reject);
        p.on("close", (code) => (code === 0 ? resolve(JSON.parse(out.trim().split("\n").pop()!)) : reject(new Error(`child exited ${code}: ${err}`))));
      });
    const [a, b] = await Promise.all([race(), race()]);
    // the eager value of the same chain on the same inputs
    const x = k.tensor(Float32Array.from({ length: 96 }, (_, i) => Math.sin(i)), { shape: [8, 12] });
    const y = k.tensor(Float32Array.from({ length: 12 }, (_, i) => Math.cos(i)), { shape: [12] });
    const eager = chain(x, y).dataSync() as Float32Array;
    for (const r of [a, b]) {
      assert.equal(r.jit, true);
      assertClose(r.values, eager, { rtol: 1e-5, atol: 1e-6 });
    }
    assert.ok(a.cache.misses + b.cache.misses >= 1);
    const entries = readdirSync(join(dir, "compile"));
    assert.equal(entries.length, 1, `one entry, got ${entries.join(", ")}`);
    const entry = join(dir, "compile", entries[0]!);
    const files = readdirSync(entry).sort();
    const meta = JSON.parse(readFileSync(join(entry, "meta.json"), "utf8")) as { key: string; lib: string; sha256: string; bytes: number };
    assert.equal(meta.key, entries[0]);
    assert.deepEqual(files, ["meta.json", meta.lib, "source.c"].sort(), "no temp files or orphan libraries left");
    const lib = readFileSync(join(entry, meta.lib));
    assert.equal(lib.length, meta.bytes);
    assert.equal(createHash("sha256").update(lib).digest("hex"), meta.sha256, "checksum verified");
    const after = runChild({ KILN_CACHE_DIR: dir });
    assert.equal(after.cache.misses, 0);
    assert.equal(after.cache.hits, 1);
  });

  it("counts in-process hits", () => {
    const before = compileCacheStats();
    forgetLoaded();
    const f = compile((a, b) => chain(a, b));
    f(rand([8, 12], 1), rand([12], 2));
    const after = compileCacheStats();
    assert.equal(after.hits + after.misses, before.hits + before.misses + 1);
  });
});

describe("compile: no C compiler", () => {
  it("runs op by op with a warning, never an error", () => {
    const prev = process.env.KILN_CC;
    process.env.KILN_CC = "/nonexistent";
    const warnings: string[] = [];
    const onWarn = (w: Error) => warnings.push(w.message);
    process.on("warning", onWarn);
    try {
      const x = rand([4, 16], 1);
      const y = rand([16], 2);
      const f = compile((a, b) => chain(a, b).mul(2));
      assertClose(f(x, y) as k.Tensor, chain(x, y).mul(2).dataSync() as Float32Array);
      assert.equal(f.lastInfo!.jit, false);
      assert.equal(f.stats.fallbackCalls, 1);
    } finally {
      if (prev === undefined) delete process.env.KILN_CC;
      else process.env.KILN_CC = prev;
    }
    return new Promise<void>((resolve) =>
      setImmediate(() => {
        process.off("warning", onWarn);
        assert.ok(warnings.some((w) => w.includes("op by op")), `warnings: ${warnings.join("; ")}`);
        resolve();
      }),
    );
  });
});
