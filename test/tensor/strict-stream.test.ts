// Eager `strict` mode on the cpu back end: kernels are enqueued on the native in-order stream and the
// op returns at once; reads wait. Results must equal `debug` mode (synchronous) bit for bit.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import * as k from "../../src/tensor/index.js";
import type { Tensor } from "../../src/tensor/index.js";
import type { CpuBackend } from "../../src/backends/cpu/cpu-backend.js";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { IndexOutOfRangeError } from "../../src/util/errors.js";

const hasCpu = tryLoadNativeKernels() !== null;
const cpu = (): CpuBackend => k.device("cpu").backend as CpuBackend;
const gen = (seed: number) => new k.Generator(seed);
const randn = (shape: number[], seed: number) => k.randn(shape, { device: "cpu", generator: gen(seed) });

/** A decoder-layer-like chain touching every hot native kernel, plus host-side ops in between. */
function chain(): Float32Array[] {
  const T = 6, dim = 64, Hq = 4, Hkv = 2, D = 16, blockSize = 4, numBlocks = 8, vocab = 50;
  const x = randn([T, dim], 1);
  const norm = k.rmsNorm(x, k.ones([dim], { device: "cpu" }), 1e-5);
  const q = k.matmul(norm, randn([dim, Hq * D], 2)).reshape(T, Hq, D);
  const kv = k.matmul(norm, randn([dim, 2 * Hkv * D], 3));
  const [kk, vv] = k.chunk(kv, 2, 1).map((t) => t.reshape(T, Hkv, D)) as [Tensor, Tensor];
  const positions = k.tensor(Int32Array.from({ length: T }, (_, i) => i), { device: "cpu" });
  const table = randn([32, D / 2], 4);
  const qr = k.rotaryEmbedding(q, positions, k.cos(table), k.sin(table));
  const kCache = k.zeros([numBlocks, blockSize, Hkv, D], { device: "cpu" });
  const vCache = k.zeros([numBlocks, blockSize, Hkv, D], { device: "cpu" });
  const i32 = (xs: number[], shape?: number[]) => k.tensor(Int32Array.from(xs), { device: "cpu", shape });
  const attn = k.pagedAttention({
    q: qr, k: kk, v: vv, kCache, vCache,
    slotMapping: i32([12, 13, 14, 5, 6, 7]),
    blockTables: i32([3, 0, 1, 2], [2, 2]),
    queryStart: i32([0, 3, 6]),
    seqLens: i32([3, 3]),
    scale: 1 / Math.sqrt(D),
  }).reshape(T, Hq * D);
  const up = k.matmul(attn, randn([Hq * D, 96], 5));
  const gate = k.matmul(attn, randn([Hq * D, 96], 6));
  const act = k.siluMul(gate, up);
  const logits = k.matmul(act, randn([96, vocab], 7));
  const probs = k.softmax(logits, -1);
  const next = k.argmax(logits, -1).to("int32"); // ids produced on the stream, then read by a bounds check
  const emb = k.embedding(next, randn([vocab, dim], 8));
  const mixed = emb.add(x.mul(0.5)).transpose(0, 1).contiguous().sum(0);
  return [norm, qr, attn, act, probs, emb, mixed, kCache].map((t) => t.dataSync() as Float32Array);
}

describe("strict mode: the cpu device stream", { skip: !hasCpu && "native kernels not built" }, () => {
  it("gives the same results as debug mode, bit for bit", () => {
    const strict = k.withEagerMode("strict", chain);
    const debug = k.withEagerMode("debug", chain);
    assert.equal(strict.length, debug.length);
    strict.forEach((s, i) => assert.deepEqual(s, debug[i], `output ${i}`));
  });

  it("returns from a big matmul before the kernel finished; await toArray() gives its values", async () => {
    const n = 1024;
    const a = randn([n, n], 11);
    const b = randn([n, n], 12);
    k.withEagerMode("debug", () => k.matmul(a, b).dispose()); // warm up: pool threads, page faults
    // minimum of a few tries each: a loaded 2-core machine can preempt any single measurement
    let syncMs = Infinity;
    let c: Tensor | undefined;
    for (let i = 0; i < 3; i++) {
      c?.dispose();
      const t0 = performance.now();
      c = k.withEagerMode("debug", () => k.matmul(a, b));
      syncMs = Math.min(syncMs, performance.now() - t0);
    }
    let dispatchMs = Infinity;
    for (let i = 0; i < 5; i++) {
      const t1 = performance.now();
      const d = k.withEagerMode("strict", () => k.matmul(a, b));
      dispatchMs = Math.min(dispatchMs, performance.now() - t1);
      const pending = cpu().native.streamPending();
      assert.ok(pending > 0, `a job should be pending right after dispatch (pending ${pending})`);
      assert.deepEqual(await d.toArray(), c!.dataSync());
      d.dispose();
    }
    assert.ok(dispatchMs * 4 < syncMs, `dispatch ${dispatchMs.toFixed(3)} ms vs synchronous matmul ${syncMs.toFixed(3)} ms`);
    assert.equal(cpu().native.streamPending(), 0);
  });

  it("item() and dataSync() wait for the pending work", () => {
    const x = k.withEagerMode("strict", () => {
      const a = randn([512, 512], 21);
      return k.matmul(a, a).softmax(-1).sum();
    });
    assert.ok(Math.abs(x.item() - 512) < 1e-2, `${x.item()}`);
  });

  it("keeps inputs alive while a job is pending even when the tensors are dropped", () => {
    setFlagsFromString("--expose-gc");
    const gc = runInNewContext("gc") as () => void;
    const expected = k.withEagerMode("debug", () => k.matmul(randn([256, 512], 31), randn([512, 256], 32)).dataSync());
    const out = k.withEagerMode("strict", () => {
      const a = randn([256, 512], 31);
      const b = randn([512, 256], 32);
      const r = k.matmul(a, b);
      a.dispose();
      b.dispose();
      return r;
    });
    gc();
    assert.deepEqual(out.dataSync(), expected);
  });

  it("still throws out-of-range indices at dispatch, naming the op", () => {
    k.withEagerMode("strict", () => {
      const w = randn([3, 4], 41);
      const busy = k.matmul(randn([256, 256], 42), randn([256, 256], 43)); // keep the stream busy
      const produced = k.tensor(Int32Array.of(1, 9), { device: "cpu" }).clone(); // ids written on the host side
      assert.throws(() => k.embedding(produced, w), (e: unknown) => e instanceof IndexOutOfRangeError && e.op === "embedding" && /9/.test(e.message));
      const pos = k.tensor(Int32Array.of(0, 40), { device: "cpu" });
      const tab = randn([4, 2], 44);
      assert.throws(() => k.rotaryEmbedding(randn([2, 1, 4], 45), pos, tab, tab), (e: unknown) => e instanceof IndexOutOfRangeError && e.op === "rotary");
      busy.dispose();
    });
  });

  it("orders host-side kernels and writes after pending native work", () => {
    const run = () => {
      let x = randn([64, 64], 51);
      for (let i = 0; i < 50; i++) {
        const y = k.matmul(x, x).mul(1 / 8).tanh(); // native, enqueued
        const z = y.slice(0, 0, 3).mul(100).to("int64").to("float32").mul(0.001); // int64 kernels run on the host
        x.dispose();
        x = y.add(z.sum());
        y.dispose();
        z.dispose();
      }
      return x.dataSync();
    };
    assert.deepEqual(k.withEagerMode("strict", run), k.withEagerMode("debug", run));
  });
});
