// Step graphs merge consecutive GEMVs of one x (the q/k/v and gate/up projections of a decode step) into one
// parallel job at capture end, as vLLM merges those weights, but without copying them together. The merged job must
// give every output bit for bit as the separate kernels run eagerly give it, and must not merge launches that are
// not independent products of the same x.
import assert from "node:assert/strict";
import { test } from "node:test";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { quantizeQ4kRef } from "../../src/backends/cpu/q4k-reference.js";

const native = tryLoadNativeKernels();
const skip = !native && "native kernels not built";

let seed = 11;
const rand = (n: number): Float32Array =>
  Float32Array.from({ length: n }, () => {
    seed = (seed * 1103515245 + 12345) >>> 0;
    return seed / 2 ** 31 - 1;
  });

// q/k/v-like row counts that split unevenly over 2 threads and 4 streams per thread
const ROWS = [72, 13, 19];
const K = 256; // q4_k's super-block; also two int4 chunk pairs (int4 also runs at K = 320: a tail chunk)

type Scheme = 0 | 1 | 2 | 3 | 4 | 5; // int8, int4, fp8, int8 group-32, q4_k, mxfp4
/** One quantized weight [n, K] in the scheme's layout (the native quantizer's; q4_k: the reference encoder's). */
function quantWeight(scheme: Scheme, n: number, K = 256) {
  const w = rand(n * K);
  if (scheme === 4) return { ...quantizeQ4kRef(w, n, K), rowSums: new Int32Array(0) };
  const data = new Uint8Array(scheme === 1 || scheme === 5 ? (n * K) / 2 : n * K);
  const scales = scheme === 0 || scheme === 2 ? new Float32Array(n) : scheme === 5 ? new Uint8Array((n * K) / 32) : new Uint16Array((n * K) / 32);
  const rowSums = new Int32Array(scheme === 0 ? n : 0);
  native!.quantizeWeights(w, n, K, scheme, data, scales, rowSums);
  return { data, scales, rowSums };
}

const bf16 = (x: Float32Array) => {
  const out = new Uint16Array(x.length);
  native!.f32ToBf16(x, out, x.length);
  return out;
};

for (const threads of [1, 2]) {
  const cases: [Scheme, boolean, number][] = [[0, true, K], [1, true, K], [1, true, 320], [3, true, K], [4, true, K], [5, true, K], [3, false, K], [4, false, K], [2, false, K], [2, false, 216]]; // fp8: f32 x (K = 216: 3 lines, a 16-code step and 8 codes left)
  for (const [scheme, preQuantized, K] of cases) {
    const how = preQuantized ? "x quantized by rmsNormQuant" : "x quantized by the kernel";
    test(`quant scheme ${scheme}, K = ${K}, ${how}: q/k/v GEMVs of one x run as one job, outputs equal the eager kernels' (${threads} thread(s))`, { skip }, () => {
      const n = native!;
      n.setNumThreads(threads);
      const x = new Float32Array(K);
      const xq = new Int8Array(K);
      const xs = new Float32Array(1);
      n.rmsNormQuant(rand(K), rand(K), x, 1, K, 1e-5, xq, xs);
      const [qx, qs] = preQuantized ? [xq, xs] : [undefined, undefined];
      const ws = ROWS.map((r) => quantWeight(scheme, r, K));
      const eager = ROWS.map((r, i) => {
        const out = new Float32Array(r);
        n.quantMatmul(x, ws[i]!.data, ws[i]!.scales, ws[i]!.rowSums, out, 1, r, K, scheme, qx, qs);
        return out;
      });
      const outs = ROWS.map((r) => new Float32Array(r).fill(Number.NaN));
      n.streamBeginCapture();
      ROWS.forEach((r, i) => n.stream.quantMatmul(x, ws[i]!.data, ws[i]!.scales, ws[i]!.rowSums, outs[i]!, 1, r, K, scheme, qx, qs));
      const g = n.streamEndCapture();
      assert.equal(n.streamGraphKernels(g), 1, "three GEMVs of one x merge into one job");
      n.streamLaunchGraph(g);
      n.streamSync();
      outs.forEach((o, i) => assert.deepEqual(o, eager[i], `weight ${i}`));
      assert.ok(eager.every((o) => o.some((v) => v !== 0)), "the products are not trivially zero");
      n.streamReleaseGraph(g);
    });
  }

  for (const dtype of ["f32", "bf16"] as const) {
    test(`${dtype} gate/up-like GEMVs of one x run as one job, outputs equal the eager kernels' (${threads} thread(s))`, { skip }, () => {
      const n = native!;
      n.setNumThreads(threads);
      const x = rand(K);
      const ws = ROWS.map((r) => (dtype === "bf16" ? bf16(rand(r * K)) : rand(r * K)));
      const code = dtype === "bf16" ? 1 : 0;
      const eager = ROWS.map((r, i) => {
        const out = new Float32Array(r);
        n.matmul(x, ws[i]!, out, 1, r, K, true, code, 1, 0, 0, 0);
        return out;
      });
      const outs = ROWS.map((r) => new Float32Array(r).fill(Number.NaN));
      n.streamBeginCapture();
      ROWS.forEach((r, i) => n.stream.matmul(x, ws[i]!, outs[i]!, 1, r, K, true, code, 1, 0, 0, 0));
      const g = n.streamEndCapture();
      assert.equal(n.streamGraphKernels(g), 1);
      n.streamLaunchGraph(g);
      n.streamSync();
      outs.forEach((o, i) => assert.deepEqual(o, eager[i], `weight ${i}`));
      n.streamReleaseGraph(g);
    });
  }
}

test("GEMVs that are not independent products of one x stay separate jobs", { skip }, () => {
  const n = native!;
  n.setNumThreads(2);
  const x = rand(K);
  const w1 = rand(K * K), w2 = rand(K * K), w3 = rand(32 * K);
  const y = new Float32Array(K), z = new Float32Array(K), u = new Float32Array(32);
  // z = W2 (W1 x): the second reads the first's output
  n.streamBeginCapture();
  n.stream.matmul(x, w1, y, 1, K, K, true, 0, 1, 0, 0, 0);
  n.stream.matmul(y, w2, z, 1, K, K, true, 0, 1, 0, 0, 0);
  const chain = n.streamEndCapture();
  assert.equal(n.streamGraphKernels(chain), 2);
  // an output that overwrites the shared x, second or first
  n.streamBeginCapture();
  n.stream.matmul(x, w3, u, 1, 32, K, true, 0, 1, 0, 0, 0);
  n.stream.matmul(x, w3, x.subarray(0, 32), 1, 32, K, true, 0, 1, 0, 0, 0);
  const clobber = n.streamEndCapture();
  assert.equal(n.streamGraphKernels(clobber), 2);
  n.streamBeginCapture();
  n.stream.matmul(x, w3, x.subarray(32, 64), 1, 32, K, true, 0, 1, 0, 0, 0);
  n.stream.matmul(x, w3, u, 1, 32, K, true, 0, 1, 0, 0, 0);
  const clobberFirst = n.streamEndCapture();
  assert.equal(n.streamGraphKernels(clobberFirst), 2);
  // batched rows (M = 2) are not GEMVs
  n.streamBeginCapture();
  const x2 = rand(2 * K);
  n.stream.matmul(x2, w3, new Float32Array(64), 2, 32, K, true, 0, 1, 0, 0, 0);
  n.stream.matmul(x2, w3, new Float32Array(64), 2, 32, K, true, 0, 1, 0, 0, 0);
  const batched = n.streamEndCapture();
  assert.equal(n.streamGraphKernels(batched), 2);
  // the chain still computes W2 (W1 x) in order
  n.streamLaunchGraph(chain);
  n.streamSync();
  const yRef = new Float32Array(K), zRef = new Float32Array(K);
  n.matmul(x, w1, yRef, 1, K, K, true, 0, 1, 0, 0, 0);
  n.matmul(yRef, w2, zRef, 1, K, K, true, 0, 1, 0, 0, 0);
  assert.deepEqual(z, zRef);
  for (const g of [chain, clobber, clobberFirst, batched]) n.streamReleaseGraph(g);

  // quantized: an output over the shared pre-quantized x, and a later weight that an earlier launch writes
  const q = () => {
    const data = new Uint8Array(32 * K), scales = new Float32Array(32), rowSums = new Int32Array(32);
    n.quantizeWeights(rand(32 * K), 32, K, 0, data, scales, rowSums);
    return { data, scales, rowSums };
  };
  const [qa, qb] = [q(), q()];
  const xq = new Int8Array(K), xs = new Float32Array(1);
  n.rmsNormQuant(rand(K), rand(K), x, 1, K, 1e-5, xq, xs);
  const overXq = new Float32Array(xq.buffer, 0, 8);
  n.streamBeginCapture();
  n.stream.quantMatmul(x, qa.data, qa.scales, qa.rowSums, new Float32Array(32), 1, 32, K, 0, xq, xs);
  n.stream.quantMatmul(x, qb.data, qb.scales, qb.rowSums, new Float32Array(32), 1, 32, K, 0, xq, xs);
  const independentPair = n.streamEndCapture();
  assert.equal(n.streamGraphKernels(independentPair), 1, "the control: two independent products of one x merge");
  n.streamBeginCapture();
  n.stream.quantMatmul(x, qa.data, qa.scales, qa.rowSums, new Float32Array(32), 1, 32, K, 0, xq, xs);
  n.stream.quantMatmul(x, qb.data, qb.scales, qb.rowSums, overXq, 1, 8, K, 0, xq, xs);
  const writesXq = n.streamEndCapture();
  assert.equal(n.streamGraphKernels(writesXq), 2);
  n.streamBeginCapture();
  n.stream.quantMatmul(x, qa.data, qa.scales, qa.rowSums, new Float32Array(qb.scales.buffer), 1, 32, K, 0, xq, xs);
  n.stream.quantMatmul(x, qb.data, qb.scales, qb.rowSums, new Float32Array(32), 1, 32, K, 0, xq, xs);
  const writesScales = n.streamEndCapture();
  assert.equal(n.streamGraphKernels(writesScales), 2, "the first writes the second's weight scales");
  for (const g of [independentPair, writesXq, writesScales]) n.streamReleaseGraph(g);
});

test("streamProfileGraph replays the graph job by job: each job's best and median time, and the jobs' real outputs", { skip }, () => {
  const n = native!;
  n.setNumThreads(2);
  const x = rand(K);
  const ws = ROWS.map((r) => rand(r * K));
  const eager = ROWS.map((r, i) => {
    const out = new Float32Array(r);
    n.matmul(x, ws[i]!, out, 1, r, K, true, 0, 1, 0, 0, 0);
    return out;
  });
  const outs = ROWS.map((r) => new Float32Array(r).fill(Number.NaN));
  const normed = new Float32Array(K);
  n.streamBeginCapture();
  ROWS.forEach((r, i) => n.stream.matmul(x, ws[i]!, outs[i]!, 1, r, K, true, 0, 1, 0, 0, 0));
  n.stream.rmsNorm(x, rand(K), normed, 1, K, 1e-5);
  const g = n.streamEndCapture();
  const reps = 7;
  const prof = n.streamProfileGraph!(g, reps);
  assert.deepEqual(prof.ops, ["matmulGroup", "rmsNorm"], "the merged GEMV group, then the norm");
  assert.equal(prof.ns.length, 2);
  assert.equal(prof.medianNs?.length, 2);
  for (let i = 0; i < 2; i++) {
    assert.ok(prof.ns[i]! > 0, `job ${i} took time`);
    assert.ok(prof.ns[i]! <= prof.medianNs![i]!, `job ${i}: best <= median`);
  }
  outs.forEach((o, i) => assert.deepEqual(o, eager[i], `weight ${i}: the profiled replay computed it`));
  n.streamReleaseGraph(g);
});

// With 2 threads each share of a decode GEMV can be handed over in halves while it runs (native/thread-pool.h,
// parallelStackedSpans): across many runs, with hand-overs at whatever tile the timing gives, every row must be
// written, once, with the value one thread computes for it.
test("2 threads hand rows over mid-run: 300 replays of merged GEMVs equal the 1-thread outputs every time", { skip }, () => {
  const n = native!;
  const rows = [1536, 384, 384];
  const KK = 512;
  const x = rand(KK);
  const xq = new Int8Array(KK);
  const xs = new Float32Array(1);
  const xn = new Float32Array(KK);
  n.rmsNormQuant(x, rand(KK), xn, 1, KK, 1e-5, xq, xs);
  const qw = rows.map((r) => quantWeight(3, r, KK));
  const bw = rows.map((r) => bf16(rand(r * KK)));
  const launchAll = (qo: Float32Array[], bo: Float32Array[]) => {
    n.streamBeginCapture();
    rows.forEach((r, i) => n.stream.quantMatmul(xn, qw[i]!.data, qw[i]!.scales, qw[i]!.rowSums, qo[i]!, 1, r, KK, 3, xq, xs));
    rows.forEach((r, i) => n.stream.matmul(xn, bw[i]!, bo[i]!, 1, r, KK, true, 1, 1, 0, 0, 0));
    return n.streamEndCapture();
  };
  n.setNumThreads(1);
  const qRef = rows.map((r) => new Float32Array(r)),
    bRef = rows.map((r) => new Float32Array(r));
  const one = launchAll(qRef, bRef);
  n.streamLaunchGraph(one);
  n.streamSync();
  n.streamReleaseGraph(one);
  n.setNumThreads(2);
  const qo = rows.map((r) => new Float32Array(r)),
    bo = rows.map((r) => new Float32Array(r));
  const g = launchAll(qo, bo);
  assert.equal(n.streamGraphKernels(g), 2, "q/k/v-like products merge into one job per dtype");
  for (let rep = 0; rep < 300; rep++) {
    for (const o of [...qo, ...bo]) o.fill(Number.NaN);
    n.streamLaunchGraph(g);
    n.streamSync();
    qo.forEach((o, i) => assert.deepEqual(o, qRef[i], `int8 group-32 weight ${i}, run ${rep}`));
    bo.forEach((o, i) => assert.deepEqual(o, bRef[i], `bf16 weight ${i}, run ${rep}`));
  }
  n.streamReleaseGraph(g);
});
