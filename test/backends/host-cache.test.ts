// The caching host allocator (PyTorch's CUDA caching allocator, on host memory): freed memory is handed out again
// by allocate() of the same byte size, zeroed; the cache is capped (least recently freed evicted first), dropped by
// emptyCache(), counted by memoryReserved(); memory a queued cpu kernel still uses is zeroed behind that kernel, and
// memory a step graph points into is never reused.
import assert from "node:assert/strict";
import { test } from "node:test";
import * as k from "../../src/tensor/index.js";
import type { Tensor } from "../../src/tensor/index.js";
import type { CpuBackend } from "../../src/backends/cpu/cpu-backend.js";
import type { CpuBuffer, CpuStepGraph } from "../../src/backends/cpu/stream.js";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { HostAllocator, type HostWrapped } from "../../src/backends/reference/reference-backend.js";

const skip = !tryLoadNativeKernels() && "native kernels not built";
const cpu = (): CpuBackend => k.device("cpu").backend as CpuBackend;
const raw = (t: Tensor): ArrayBuffer => (t.storage.buffer as CpuBuffer).raw;
const memoryOf = (b: unknown): ArrayBuffer => (b as HostWrapped).raw;
const KB4 = 4096;

test("freed memory is handed out again by an allocation of the same size, reading zeros", () => {
  const a = new HostAllocator({ cacheBytes: 1 << 20 });
  const x = a.allocate(KB4);
  new Uint8Array(memoryOf(x)).fill(7);
  a.free(x);
  assert.equal(a.cachedBytes(), KB4);
  const other = a.allocate(KB4 * 2); // another size: fresh memory
  assert.notEqual(memoryOf(other), memoryOf(x));
  const y = a.allocate(KB4);
  assert.equal(memoryOf(y), memoryOf(x), "the same ArrayBuffer");
  assert.notEqual(y, x, "a fresh wrapper: the stale handle stays freed");
  assert.ok(new Uint8Array(memoryOf(y)).every((v) => v === 0), "reused memory reads as zeros");
  assert.equal(a.cachedBytes(), 0);
  // the opt-out hands the memory out as it is
  new Uint8Array(memoryOf(y)).fill(9);
  a.free(y);
  const z = a.allocate(KB4, { uninitialized: true });
  assert.equal(memoryOf(z), memoryOf(x));
  assert.equal(new Uint8Array(memoryOf(z))[0], 9);
});

test("the cache holds at most its cap, evicting the least recently freed; emptyCache drops it", () => {
  const a = new HostAllocator({ cacheBytes: 3 * KB4 });
  const bs = [a.allocate(KB4), a.allocate(KB4), a.allocate(KB4), a.allocate(KB4)];
  const mems = bs.map(memoryOf);
  for (const b of bs) a.free(b);
  assert.equal(a.cachedBytes(), 3 * KB4, "capped");
  const again = [a.allocate(KB4), a.allocate(KB4), a.allocate(KB4), a.allocate(KB4)].map(memoryOf);
  assert.deepEqual(again.slice(0, 3), [mems[3], mems[2], mems[1]], "most recently freed first; the first freed was evicted");
  assert.ok(!mems.includes(again[3]!), "then fresh memory");
  // a buffer larger than the cap never enters it
  const big = a.allocate(4 * KB4);
  a.free(big);
  assert.equal(a.cachedBytes(), 0);
  const c = a.allocate(KB4 * 2);
  a.free(c);
  assert.equal(a.cachedBytes(), 2 * KB4);
  a.emptyCache();
  assert.equal(a.cachedBytes(), 0);
  assert.notEqual(memoryOf(a.allocate(KB4 * 2)), memoryOf(c));
});

test("reserved = live + cached bytes, with its own peak; live bytes and their peak count live memory only", () => {
  const a = new HostAllocator({ cacheBytes: 1 << 20 });
  const x = a.allocate(KB4);
  const y = a.allocate(2 * KB4);
  a.free(y);
  assert.equal(a.liveBytes(), KB4);
  assert.equal(a.peakBytes(), 3 * KB4);
  assert.equal(a.reservedBytes(), 3 * KB4);
  a.free(x);
  assert.equal(a.liveBytes(), 0);
  assert.equal(a.reservedBytes(), 3 * KB4);
  a.allocate(2 * KB4); // from the cache: reserved stays
  assert.equal(a.reservedBytes(), 3 * KB4);
  assert.equal(a.peakReservedBytes(), 3 * KB4);
  a.allocate(8 * KB4); // fresh
  assert.equal(a.reservedBytes(), 11 * KB4);
  assert.equal(a.peakReservedBytes(), 11 * KB4);
  a.emptyCache();
  assert.equal(a.reservedBytes(), a.liveBytes());
  a.resetPeakBytes();
  assert.equal(a.peakReservedBytes(), 10 * KB4);
});

test("KILN_HOST_CACHE_BYTES=0 disables the cache; tiny, adopted and pool-time frees never enter it", () => {
  const saved = process.env.KILN_HOST_CACHE_BYTES;
  process.env.KILN_HOST_CACHE_BYTES = "0";
  try {
    const off = new HostAllocator();
    const x = off.allocate(KB4);
    off.free(x);
    assert.equal(off.cachedBytes(), 0);
    assert.notEqual(memoryOf(off.allocate(KB4)), memoryOf(x));
    process.env.KILN_HOST_CACHE_BYTES = String(2 * KB4);
    const capped = new HostAllocator();
    capped.free(capped.allocate(KB4));
    capped.free(capped.allocate(KB4 * 3));
    assert.equal(capped.cachedBytes(), KB4, "the variable sets the cap");
  } finally {
    if (saved === undefined) delete process.env.KILN_HOST_CACHE_BYTES;
    else process.env.KILN_HOST_CACHE_BYTES = saved;
  }
  const a = new HostAllocator({ cacheBytes: 1 << 20 });
  a.free(a.allocate(8));
  a.free(a.adopt(new ArrayBuffer(KB4)));
  assert.equal(a.cachedBytes(), 0);
  const before = a.allocate(KB4);
  a.openPool();
  a.free(before); // a capture's jobs may point into it
  a.closePool();
  assert.equal(a.cachedBytes(), 0);
});

test("reused memory is numbered as a new allocation, and cached memory is not findable by its old number", () => {
  const a = new HostAllocator({ cacheBytes: 1 << 20 });
  const mark = a.mark();
  const x = a.allocate(KB4);
  const n = a.numberOfMemory(memoryOf(x));
  assert.equal(n, mark);
  assert.equal(a.memoryOfNumber(mark), memoryOf(x));
  a.free(x);
  assert.equal(a.numberOfMemory(memoryOf(x)), undefined);
  assert.equal(a.memoryOfNumber(mark), undefined, "a replay must not find memory the cache will hand out");
  a.allocate(2 * KB4);
  const y = a.allocate(KB4);
  assert.equal(memoryOf(y), memoryOf(x));
  assert.equal(a.numberOfMemory(memoryOf(y)), mark + 2, "numbers follow allocation order, cache or not");
  assert.equal(a.memoryOfNumber(mark + 2), memoryOf(y));
});

test("memoryReserved / maxMemoryReserved / emptyCache on the devices", () => {
  for (const name of skip ? ["reference"] : ["reference", "cpu"]) {
    k.emptyCache(name);
    assert.equal(k.memoryReserved(name), k.memoryAllocated(name));
    const t = k.zeros([1 << 18], { device: name });
    const live = k.memoryAllocated(name);
    t.dispose();
    assert.equal(k.memoryAllocated(name), live - (1 << 20));
    assert.equal(k.memoryReserved(name), k.memoryAllocated(name) + (1 << 20), name);
    assert.ok(k.maxMemoryReserved(name) >= k.memoryReserved(name));
    k.emptyCache(name);
    assert.equal(k.memoryReserved(name), k.memoryAllocated(name));
  }
});

/** Enqueues enough matmul work that kernels submitted next are still queued for a while. */
function busy(): Tensor[] {
  const a = k.randn([384, 384], { device: "cpu" });
  const out: Tensor[] = [a];
  let h = a;
  for (let i = 0; i < 12; i++) out.push((h = k.matmul(h, a)));
  return out;
}

test("memory freed while a queued kernel still reads it is zeroed behind that kernel, not before", { skip }, async () => {
  const be = cpu();
  await be.synchronize();
  k.emptyCache("cpu");
  const n = 3 * 1024 + 5; // a size nothing else here allocates
  const data = Float32Array.from({ length: n }, (_, i) => i + 1);
  const x = k.tensor(data, { device: "cpu" });
  await be.synchronize();
  const work = busy();
  const y = k.mul(x, 2); // queued behind the matmuls, reads x
  const mem = raw(x);
  x.dispose();
  assert.ok(be.native.streamPending() > 0, "the kernel reading x is still queued");
  const z = k.zeros([n], { device: "cpu" }); // takes x's memory: zeroing it now would change y
  assert.equal(raw(z), mem, "x's memory was reused");
  const w = k.tensor(data.map((v) => -v), { device: "cpu" }); // fresh memory: x's is taken
  assert.deepEqual(y.dataSync(), data.map((v) => 2 * v));
  assert.ok((z.dataSync() as Float32Array).every((v) => v === 0));
  assert.deepEqual(w.dataSync(), data.map((v) => -v));
  for (const t of [...work, y, z, w]) t.dispose();
});

test("a host write into reused memory a queued kernel still reads lands after that kernel", { skip }, async () => {
  const be = cpu();
  await be.synchronize();
  k.emptyCache("cpu");
  const n = 5 * 1024 + 3;
  const data = Float32Array.from({ length: n }, (_, i) => (i % 97) - 48);
  const x = k.tensor(data, { device: "cpu" });
  await be.synchronize();
  const work = busy();
  const y = k.exp(k.mul(x, 0.01));
  const mem = raw(x);
  x.dispose();
  assert.ok(be.native.streamPending() > 0);
  const w = k.tensor(data.map((v) => v * 3), { device: "cpu" });
  assert.equal(raw(w), mem);
  const want = Float32Array.from(data, (v) => Math.fround(Math.exp(Math.fround(v * 0.01))));
  const got = y.dataSync() as Float32Array;
  for (let i = 0; i < n; i++) assert.ok(Math.abs(got[i]! - want[i]!) <= 1e-6 * Math.abs(want[i]!), `y[${i}]`);
  assert.deepEqual(w.dataSync(), data.map((v) => v * 3));
  for (const t of [...work, y, w]) t.dispose();
});

test("a kernel output taking memory a queued kernel still reads (not zeroed) is written after that kernel", { skip }, async () => {
  const be = cpu();
  await be.synchronize();
  k.emptyCache("cpu");
  const n = 6 * 1024 + 7;
  const data = Float32Array.from({ length: n }, (_, i) => (i % 31) - 15);
  const x = k.tensor(data, { device: "cpu" });
  const w = k.tensor(data.map((v) => v + 100), { device: "cpu" });
  await be.synchronize();
  const work = busy();
  const y = k.mul(x, 2);
  const mem = raw(x);
  x.dispose();
  assert.ok(be.native.streamPending() > 0);
  const z = k.add(w, 1); // an elementwise output: handed x's memory as it is, the add enqueued behind y's read
  assert.equal(raw(z), mem);
  assert.deepEqual(y.dataSync(), data.map((v) => 2 * v));
  assert.deepEqual(z.dataSync(), data.map((v) => v + 101));
  for (const t of [...work, y, z, w]) t.dispose();
});

test("memory a step graph points into is never handed out again, even once its tensors are freed", { skip }, async () => {
  const be = cpu();
  await be.synchronize();
  k.emptyCache("cpu");
  const n = 7 * 1024 + 1;
  const data = Float32Array.from({ length: n }, (_, i) => i % 13);
  const x = k.tensor(data, { device: "cpu" });
  const before = k.tensor(data, { device: "cpu" });
  be.beginCapture();
  const tmp = k.mul(x, 2);
  before.dispose(); // allocated before the capture, freed during it
  const out = k.add(tmp, 1);
  tmp.dispose();
  const graph = be.endCapture() as CpuStepGraph;
  const [xm, outm] = [raw(x), raw(out)];
  x.dispose(); // the graph still reads it on every replay
  const fresh = [k.zeros([n], { device: "cpu" }), k.zeros([n], { device: "cpu" }), k.zeros([n], { device: "cpu" })];
  for (const f of fresh) assert.ok(raw(f) !== xm && raw(f) !== outm);
  graph.launch();
  await be.synchronize();
  assert.deepEqual(out.dataSync(), data.map((v) => 2 * v + 1));
  out.dispose();
  assert.ok(k.zeros([n], { device: "cpu" }).dataSync().every((v) => v === 0));
  for (const f of fresh) assert.ok((f.dataSync() as Float32Array).every((v) => v === 0));
  graph.dispose();
});
