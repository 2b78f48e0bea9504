// Step-graph capture memory on the cpu back end: memory freed during a capture is reused by the capture's later
// allocations of the same size (CUDA graphs' private pool), so a graph pins about one layer's working set, not
// every intermediate of the forward. Replays stay bit-identical to eager runs; memory allocated before the
// capture, or still live at its end, is never handed out again; accounting returns to where it started.
import assert from "node:assert/strict";
import { test } from "node:test";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import * as k from "../../src/tensor/index.js";
import type { Tensor } from "../../src/tensor/index.js";
import type { CpuBackend } from "../../src/backends/cpu/cpu-backend.js";
import { CpuBuffer, type CpuStepGraph } from "../../src/backends/cpu/stream.js";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";

const skip = !tryLoadNativeKernels() && "native kernels not built";
const cpu = (): CpuBackend => k.device("cpu").backend as CpuBackend;
setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

let seed = 11;
const rand = (n: number): Float32Array => Float32Array.from({ length: n }, () => {
  seed = (seed * 1103515245 + 12345) >>> 0;
  return seed / 2 ** 31 - 1;
});
const f32 = (data: Float32Array, shape: number[]) => k.tensor(data, { device: "cpu", shape });
const raw = (t: Tensor): ArrayBuffer => (t.storage.buffer as CpuBuffer).raw;
const values = (t: Tensor) => t.dataSync() as Float32Array;
const put = (t: Tensor, data: Float32Array) =>
  cpu().writeAsync(t.storage.buffer, t.offset * 4, new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
const disposeAll = (ts: Iterable<Tensor>) => { for (const t of ts) t.dispose(); };

const N = 32, LAYERS = 8;
interface Layer { w: Tensor; norm: Tensor }
const layers = (): Layer[] => Array.from({ length: LAYERS }, () => ({ w: f32(rand(N * N).map((v) => v * 0.3), [N, N]), norm: f32(rand(N), [N]) }));

/**
 * A residual stack freeing every intermediate as soon as the next op has read it; `created` collects each
 * intermediate (for the test's bookkeeping) before it is disposed. Returns the output, still live.
 */
function stack(x: Tensor, ls: Layer[], created: Tensor[] = []): Tensor {
  const keep = <T extends Tensor>(t: T): T => (created.push(t), t);
  let h = x;
  for (const { w, norm } of ls) {
    const n = keep(k.rmsNorm(h, norm, 1e-5));
    const m = keep(k.matmul(n, w));
    const a = keep(k.silu(m));
    const at = k.transpose(a, 0, 1);
    const t = keep(at.contiguous()); // a strided copy into recycled memory
    const r = keep(k.add(h, t));
    disposeAll([n, m, a, at, t]);
    if (h !== x) h.dispose();
    h = r;
  }
  const out = k.softmax(h, -1);
  if (h !== x) h.dispose();
  return out;
}

test("a captured stack freeing its intermediates replays bit-identically to eager and pins one layer's worth", { skip }, async () => {
  const be = cpu();
  await be.synchronize();
  const start = be.liveBuffers();
  const startBytes = be.liveBytes();
  const ls = layers();
  const inputs = [rand(N * N), rand(N * N), rand(N * N)];
  const want = inputs.map((v) => {
    const x = f32(v, [N, N]);
    const out = stack(x, ls);
    const r = values(out).slice();
    disposeAll([x, out]);
    return r;
  });

  const x = f32(inputs[0]!, [N, N]);
  const before = new Set([x, ...ls.flatMap((l) => [l.w, l.norm])].map(raw));
  const created: Tensor[] = [];
  be.beginCapture();
  const out = stack(x, ls, created);
  const graph = be.endCapture() as CpuStepGraph;
  assert.equal(be.liveBuffers(), start + 1 + 2 * LAYERS + 1, "weights, the input and the output");

  const intermediateBytes = created.reduce((s, t) => s + t.storage.buffer.byteLength, 0);
  const distinct = new Set(created.map(raw));
  assert.ok(distinct.size < created.length / 4, `${created.length} intermediates share ${distinct.size} memories`);
  for (const r of distinct) assert.ok(!before.has(r), "memory from before the capture is never handed out");
  const beforeBytes = [...before].reduce((s, r) => s + r.byteLength, 0);
  const privateBytes = graph.pinnedBytes - beforeBytes;
  assert.ok(privateBytes < intermediateBytes / 4, `graph-private ${privateBytes} B vs ${intermediateBytes} B of intermediates`);

  gc(); // the freed intermediates are referenced only by the graph; fill unrelated memory before the replays
  const junk = Array.from({ length: 32 }, () => k.full([N, N], 1e6, { device: "cpu" }));
  for (const [i, v] of inputs.entries()) {
    put(x, v);
    graph.launch();
    assert.deepEqual(values(out), want[i], `replay ${i}`);
  }
  graph.dispose();
  disposeAll([...junk, x, out, ...ls.flatMap((l) => [l.w, l.norm])]);
  await be.synchronize();
  assert.equal(be.liveBuffers(), start);
  assert.equal(be.liveBytes(), startBytes);
});

test("memory freed before the capture, or live at its end, is never recycled", { skip }, async () => {
  const be = cpu();
  await be.synchronize();
  const start = be.liveBuffers();
  const startBytes = be.liveBytes();
  const a = f32(rand(256), [16, 16]);
  const spare = f32(rand(256), [16, 16]); // allocated before, freed during the capture
  be.beginCapture();
  const b = k.exp(a);
  spare.dispose();
  const c = k.exp(b); // b's memory is free for the capture, spare's is not
  b.dispose();
  const d = k.exp(c); // reuses b's memory
  const graph1 = be.endCapture() as CpuStepGraph;
  assert.equal(raw(d), raw(b), "same-size memory freed during the capture is reused");
  assert.notEqual(raw(d), raw(spare));

  // d and c are live at the end: freeing them afterwards returns nothing to any pool
  const graph1Memory = [raw(a), raw(c), raw(d)];
  c.dispose();
  d.dispose();
  be.beginCapture();
  const fresh = Array.from({ length: 4 }, () => k.exp(a));
  for (const t of fresh) for (const m of graph1Memory) assert.notEqual(raw(t), m, "another capture never gets graph 1's memory");
  disposeAll(fresh);
  const again = k.exp(a);
  assert.ok(fresh.some((t) => raw(t) === raw(again)), "...but recycles its own");
  const graph2 = be.endCapture();
  const after = k.exp(a); // eager allocations after the capture never get pool memory
  assert.ok(fresh.every((t) => raw(t) !== raw(after)));

  graph1.launch();
  graph2.launch();
  assert.deepEqual(values(again), values(after));
  graph1.dispose();
  graph2.dispose();
  disposeAll([a, again, after]);
  await be.synchronize();
  assert.equal(be.liveBuffers(), start);
  assert.equal(be.liveBytes(), startBytes);
});

test("tiny buffers are not recycled: a 1-byte host-memory probe during a capture still works", { skip }, () => {
  const be = cpu();
  const flag = k.zeros([1], { dtype: "bool", device: "cpu" });
  be.beginCapture();
  try {
    const t = k.full([1], 1, { dtype: "bool", device: "cpu" }); // captured, then freed
    t.dispose();
    const probe = be.allocate(1); // compile/defer.ts probes host visibility like this
    assert.ok(probe.host instanceof ArrayBuffer);
    be.free(probe);
  } finally {
    be.abortCapture();
  }
  // an aborted capture closes its pool too
  const x = f32(rand(64), [8, 8]);
  be.beginCapture();
  const y = k.exp(x);
  y.dispose();
  be.abortCapture();
  const z = k.exp(x);
  assert.notEqual(raw(z), raw(y));
  disposeAll([flag, x, z]);
});

test("a stream that never empties (each replay queued behind the last) keeps a bounded set of pinned memory", { skip }, async () => {
  // Async decode queues step n + 1 before reading step n: the stream is never seen empty. The memory pending jobs
  // use (each step's private copy of its inputs above all) must still be released once those jobs have run.
  const be = cpu();
  await be.synchronize();
  const stream = (be as unknown as { stream: { trackedCount: number; isTouched(r: ArrayBuffer): boolean } }).stream;
  const ls = layers();
  const x = f32(rand(N * N), [N, N]);
  be.beginCapture();
  const out = stack(x, ls);
  const graph = be.endCapture() as CpuStepGraph;
  const early = k.exp(f32(rand(N), [N])); // an eager job in the first steps' epoch, its memory never used again
  const inputs = [rand(N * N), rand(N * N)];
  let fence = be.fence!();
  let most = 0;
  const steps = 1500;
  for (let i = 0; i < steps; i++) {
    put(x, inputs[i % 2]!); // x is the graph's input: a stream job with a private copy of the bytes
    graph.launch();
    const previous = fence;
    fence = be.fence!();
    be.readAfter!(previous, out.storage.buffer, 0, 4); // the step before this one (this one may still run)
    most = Math.max(most, stream.trackedCount);
  }
  assert.ok(most < 600, `at most ${most} buffers tracked over ${steps} steps (before: one more per step)`);
  assert.equal(stream.isTouched(raw(early)), false, "memory of a job that ran long ago is not waited for");
  const last = values(out).slice();
  const want = (() => {
    const y = f32(inputs[(steps - 1) % 2]!, [N, N]);
    const o = stack(y, ls);
    const r = values(o).slice();
    disposeAll([y, o]);
    return r;
  })();
  assert.deepEqual(last, want, "the last replay read the last input");
  graph.dispose();
  disposeAll([x, out, early, ...ls.flatMap((l) => [l.w, l.norm])]);
  await be.synchronize();
});
