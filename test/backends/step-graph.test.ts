// Step graphs on the cpu back end: the native stream captured once and replayed with one call (vLLM's CUDA
// graphs). A replay with new input values must equal running the same ops eagerly on those values, bit for bit;
// host paths and host access while capturing throw CaptureError; the graph pins the memory its jobs use.
import assert from "node:assert/strict";
import { test } from "node:test";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import * as k from "../../src/tensor/index.js";
import type { Tensor } from "../../src/tensor/index.js";
import type { CpuBackend } from "../../src/backends/cpu/cpu-backend.js";
import { CpuBuffer } from "../../src/backends/cpu/stream.js";
import { tryLoadNativeKernels } from "../../src/backends/cpu/native.js";
import { CausalLM } from "../../src/models/causal-lm.js";
import { parseHfConfig } from "../../src/models/hf-config.js";
import { CaptureError } from "../../src/util/errors.js";

const skip = !tryLoadNativeKernels() && "native kernels not built";
const cpu = (): CpuBackend => k.device("cpu").backend as CpuBackend;
setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void; // a real collection: freed intermediates must stay pinned

let seed = 7;
const rand = (n: number): Float32Array => Float32Array.from({ length: n }, () => {
  seed = (seed * 1103515245 + 12345) >>> 0;
  return seed / 2 ** 31 - 1;
});
const f32 = (data: Float32Array, shape: number[]) => k.tensor(data, { device: "cpu", shape });
const i32 = (data: number[], shape?: number[]) => k.tensor(Int32Array.from(data), { device: "cpu", shape });
/** Writes values into a persistent input (ordered on the stream behind pending replays). */
const put = (t: Tensor, data: Int32Array | Float32Array) =>
  cpu().writeAsync(t.storage.buffer, t.offset * 4, new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
const values = (t: Tensor) => t.dataSync() as Float32Array;

// ---- one decoder-like chain over every hot kernel: gather_rows, binary, rms_norm, matmul, rotary,
// paged_attention, softmax, a scalar op (fill + broadcast binary), silu (unary) ----
const T = 3, V = 20, E = 32, Hq = 4, Hkv = 2, D = 8, BS = 4, NB = 6, MAXB = 2;

interface Weights { table: Tensor; norm: Tensor; wq: Tensor; wkv: Tensor; cos: Tensor; sin: Tensor }
interface Inputs { ids: Tensor; x: Tensor; positions: Tensor; slots: Tensor; tables: Tensor; qStart: Tensor; seqLens: Tensor }
interface Step { ids: number[]; x: Float32Array; positions: number[]; slots: number[]; tables: number[]; qStart: number[]; seqLens: number[] }

function weights(): Weights {
  const angles = rand(64 * (D / 2));
  return {
    table: f32(rand(V * E), [V, E]), norm: f32(rand(E), [E]), wq: f32(rand(Hq * D * E), [Hq * D, E]),
    wkv: f32(rand(2 * Hkv * D * E), [2 * Hkv * D, E]), cos: k.cos(f32(angles, [64, D / 2])), sin: k.sin(f32(angles, [64, D / 2])),
  };
}
function inputs(s: Step): Inputs {
  return {
    ids: i32(s.ids), x: f32(s.x, [T, E]), positions: i32(s.positions), slots: i32(s.slots),
    tables: i32(s.tables, [2, MAXB]), qStart: i32(s.qStart), seqLens: i32(s.seqLens),
  };
}
const TABLES = [[0, 1], [3, 4]]; // [seq][block of the sequence] -> cache block
const slotOf = (s: number, pos: number) => TABLES[s]![Math.floor(pos / BS)]! * BS + (pos % BS);
/** Two sequences, the first with 2 new tokens, the second with 1, at the given context lengths. */
function step(len0: number, len1: number): Step {
  const pos = [len0 - 2, len0 - 1, len1 - 1];
  return {
    ids: pos.map((p) => (p * 7 + 3) % V), x: rand(T * E), positions: pos,
    slots: [slotOf(0, pos[0]!), slotOf(0, pos[1]!), slotOf(1, pos[2]!)],
    tables: TABLES.flat(), qStart: [0, 2, 3], seqLens: [len0, len1],
  };
}

/** The chain; disposes every intermediate and returns [attention output, final output]. */
function chain(w: Weights, inp: Inputs, caches: { k: Tensor; v: Tensor }): Tensor[] {
  const e = k.embedding(inp.ids, w.table);
  const h = k.add(e, inp.x);
  const n = k.rmsNorm(h, w.norm, 1e-5);
  const q = k.linear(n, w.wq).view(T, Hq, D);
  const kv = k.linear(n, w.wkv);
  const halves = k.chunk(kv, 2, 1);
  const [kk, vv] = halves.map((t) => t.reshape(T, Hkv, D)) as [Tensor, Tensor]; // strided: real copies
  const qr = k.rotaryEmbedding(q, inp.positions, w.cos, w.sin);
  const kr = k.rotaryEmbedding(kk, inp.positions, w.cos, w.sin);
  const attn = k.pagedAttention({
    q: qr, k: kr, v: vv, kCache: caches.k, vCache: caches.v, slotMapping: inp.slots, blockTables: inp.tables,
    queryStart: inp.qStart, seqLens: inp.seqLens, scale: 1 / Math.sqrt(D),
  });
  const flat = attn.reshape(T, Hq * D);
  const sm = k.softmax(flat, -1);
  const scaled = k.mul(sm, 3);
  const out = k.silu(scaled);
  for (const t of [e, h, n, q, kv, ...halves, kk, vv, qr, kr, flat, sm, scaled]) t.dispose();
  return [attn, out];
}
const newCaches = () => ({ k: k.zeros([NB, BS, Hkv, D], { device: "cpu" }), v: k.zeros([NB, BS, Hkv, D], { device: "cpu" }) });
function writeStep(inp: Inputs, s: Step): void {
  put(inp.ids, Int32Array.from(s.ids));
  put(inp.x, s.x);
  put(inp.positions, Int32Array.from(s.positions));
  put(inp.slots, Int32Array.from(s.slots));
  put(inp.tables, Int32Array.from(s.tables));
  put(inp.qStart, Int32Array.from(s.qStart));
  put(inp.seqLens, Int32Array.from(s.seqLens));
}
const disposeAll = (ts: Iterable<Tensor>) => { for (const t of ts) t.dispose(); };

test("dispose() releases the graph; live buffers return to where they started", { skip }, async () => {
  const be = cpu();
  await be.synchronize();
  const start = be.liveBuffers();
  const startBytes = be.liveBytes();
  const x = f32(rand(256), [16, 16]);
  be.beginCapture();
  const t1 = k.matmul(x, x);
  const t2 = k.softmax(t1, -1);
  t1.dispose();
  const graph = be.endCapture();
  graph.launch();
  graph.launch();
  graph.dispose();
  graph.dispose(); // idempotent
  assert.throws(() => graph.launch(), /after dispose/);
  assert.equal(values(t2).length, 256); // the queued replays still ran
  disposeAll([x, t2]);
  await be.synchronize();
  assert.equal(be.liveBuffers(), start);
  assert.equal(be.liveBytes(), startBytes);
});

test("a captured chain replayed with new inputs equals the eager run on them, after GC and reallocation", { skip }, () => {
  const be = cpu();
  const w = weights();
  const steps = [step(2, 1), step(4, 2), step(6, 3), step(8, 4)];
  // eager reference: its own caches, fresh input tensors each step
  const eagerCaches = newCaches();
  const want = steps.map((s) => {
    const inp = inputs(s);
    const outs = chain(w, inp, eagerCaches).map((t) => {
      const v = values(t).slice();
      t.dispose();
      return v;
    });
    disposeAll(Object.values(inp));
    return outs;
  });

  const caches = newCaches();
  const inp = inputs(steps[0]!); // real sample metadata before the capture
  be.beginCapture();
  const outs = chain(w, inp, caches);
  const graph = be.endCapture();
  assert.equal(graph.kernels, 14, "embedding, add, rms_norm, 2 matmuls, 2 copies, 2 rotary, paged_attention, softmax, fill, mul, silu");
  // intermediates freed during the capture are referenced only by the graph now: collect garbage and
  // allocate/fill unrelated memory before any replay
  gc();
  const junk = Array.from({ length: 40 }, () => k.full([T, Hq * D], 1e6, { device: "cpu" }));
  for (const [i, s] of steps.entries()) {
    writeStep(inp, s);
    graph.launch();
    assert.deepEqual(values(outs[0]!), want[i]![0], `attention output, step ${i}`);
    assert.deepEqual(values(outs[1]!), want[i]![1], `final output, step ${i}`);
  }
  assert.deepEqual(values(caches.k), values(eagerCaches.k), "the replays wrote the KV cache like the eager steps");
  graph.dispose();
  disposeAll([...junk, ...outs, ...Object.values(inp), caches.k, caches.v, eagerCaches.k, eagerCaches.v, ...Object.values(w)]);
});

test("back-to-back launches with writeAsync between them run in order", { skip }, async () => {
  const be = cpu();
  const n = 4096; // large enough that the copies and matmul take a while on the stream
  const x = f32(new Float32Array(n), [64, 64]);
  const wgt = f32(rand(n), [64, 64]);
  const acc = k.zeros([64, 64], { device: "cpu" });
  be.beginCapture();
  const y = k.matmul(x, wgt);
  const sum = k.add(acc, y);
  k.copyInto(acc, sum); // acc += x @ w: each replay must see its own x
  sum.dispose();
  const graph = be.endCapture();
  const xs = [rand(n), rand(n), rand(n)];
  const eager = xs.map((v) => {
    const xt = f32(v, [64, 64]);
    const r = k.matmul(xt, wgt);
    xt.dispose();
    return r;
  });
  // read after each launch
  put(x, xs[0]!);
  graph.launch();
  assert.deepEqual(values(y), values(eager[0]!));
  // back to back: the second write is queued behind the first replay, the third behind the second
  put(x, xs[1]!);
  graph.launch();
  put(x, xs[2]!);
  graph.launch();
  assert.deepEqual(values(y), values(eager[2]!));
  const expectAcc = k.add(k.add(eager[0]!, eager[1]!), eager[2]!);
  assert.deepEqual(values(acc), values(expectAcc));
  await be.synchronize();
  graph.dispose();
  disposeAll([x, wgt, acc, y, expectAcc, ...eager]);
});

test("writeAsyncMany: several inputs per launch as one stream job, in order behind pending replays", { skip }, async () => {
  const be = cpu();
  const n = 4096;
  const x = f32(new Float32Array(n), [64, 64]);
  const scale = f32(new Float32Array(64), [1, 64]);
  const wgt = f32(rand(n), [64, 64]);
  const acc = k.zeros([64, 64], { device: "cpu" });
  be.beginCapture();
  const y = k.mul(k.matmul(x, wgt), scale);
  const sum = k.add(acc, y);
  k.copyInto(acc, sum);
  sum.dispose();
  const graph = be.endCapture();
  const steps = [0, 1, 2].map(() => ({ x: rand(n), scale: rand(64) }));
  const eager = steps.map((st) => k.mul(k.matmul(f32(st.x, [64, 64]), wgt), f32(st.scale, [1, 64])));
  const bytes = (a: Float32Array) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  const putBoth = (st: { x: Float32Array; scale: Float32Array }) => {
    const src = { x: st.x.slice(), scale: st.scale.slice() };
    be.writeAsyncMany([
      { buffer: x.storage.buffer, byteOffset: x.offset * 4, src: bytes(src.x) },
      { buffer: scale.storage.buffer, byteOffset: scale.offset * 4, src: bytes(src.scale) },
    ]);
    src.x.fill(NaN); // the caller may reuse its arrays at once: the queued job copied them
    src.scale.fill(NaN);
  };
  putBoth(steps[0]!);
  graph.launch();
  putBoth(steps[1]!); // behind the first replay
  graph.launch();
  putBoth(steps[2]!);
  graph.launch();
  assert.deepEqual(values(y), values(eager[2]!));
  const expectAcc = k.add(k.add(eager[0]!, eager[1]!), eager[2]!);
  assert.deepEqual(values(acc), values(expectAcc));
  assert.throws(() => be.writeAsyncMany([{ buffer: scale.storage.buffer, byteOffset: 4, src: new Uint8Array(256) }]), RangeError);
  await be.synchronize();
  graph.dispose();
  disposeAll([x, scale, wgt, acc, y, expectAcc, ...eager]);
});

test("host access, host-only ops and blocking calls while capturing throw CaptureError", { skip }, () => {
  const be = cpu();
  const a = f32(rand(64), [8, 8]);
  be.beginCapture();
  try {
    const b = k.exp(a);
    assert.throws(() => b.dataSync(), CaptureError, "reading a captured output");
    assert.throws(() => a.dataSync(), CaptureError, "backend.read while capturing");
    assert.throws(() => (b.storage.buffer as CpuBuffer).host, CaptureError, "CpuBuffer.host of a captured buffer");
    assert.throws(() => be.write(a.storage.buffer, 0, new Uint8Array(4)), CaptureError, "backend.write while capturing");
    assert.throws(() => k.floor(a), (e: unknown) => e instanceof CaptureError && /\[floor\]|unary floor/.test(e.message), "a host-only kernel names the op");
    assert.throws(() => k.withEagerMode("debug", () => k.exp(a)), CaptureError, "a blocking (debug-mode) kernel");
    assert.throws(() => be.writeAsync(a.storage.buffer, 0, new Uint8Array(4)), CaptureError);
    assert.throws(() => be.beginCapture(), CaptureError, "nested capture");
    assert.throws(() => be.native.rmsNorm(new Float32Array(4), new Float32Array(4), new Float32Array(4), 1, 4, 1e-5), /captured/, "a synchronous native call");
    b.dispose();
  } finally {
    be.abortCapture();
  }
  // the back end is usable again, and the stream ran nothing that was recorded
  const c = k.exp(a);
  assert.equal(values(c).length, 64);
  disposeAll([a, c]);
});

test("native graph handles: kernel count, release, type tag", { skip }, () => {
  const h = cpu().native;
  h.streamBeginCapture();
  assert.equal(h.streamCapturing(), true);
  const pending = h.streamPending();
  h.stream.rmsNorm(new Float32Array(4), new Float32Array(4), new Float32Array(4), 1, 4, 1e-5);
  assert.equal(h.streamPending(), pending, "a captured job is recorded, not queued");
  const handle = h.streamEndCapture();
  assert.equal(h.streamCapturing(), false);
  assert.equal(h.streamGraphKernels(handle), 1);
  h.streamReleaseGraph(handle);
  assert.equal(h.streamGraphKernels(handle), 0);
  assert.throws(() => h.streamLaunchGraph(handle), /released/);
  assert.throws(() => h.streamLaunchGraph({} as never), /step-graph handle/);
  assert.throws(() => h.streamEndCapture(), /without streamBeginCapture/);
});

// ---- the paged forward of a tiny model ----
function tinyModel(): CausalLM {
  const cfg = parseHfConfig({
    architectures: ["LlamaForCausalLM"], hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
    num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 64, max_position_embeddings: 64, tie_word_embeddings: true,
  });
  const m = new CausalLM(cfg, { device: "cpu" });
  for (const [name, p] of m.namedParameters()) {
    const v = name.endsWith("norm.weight") ? k.ones(p.shape, { device: "cpu" }) : f32(rand(p.numel).map((x) => x * 0.2), [...p.shape]);
    m.setParameter(name, v);
  }
  return m;
}

test("the paged forward of a tiny model captures and replays to the eager logits", { skip }, () => {
  const be = cpu();
  const m = tinyModel();
  const c = m.config;
  const blockSize = 4, numBlocks = 16, maxBlocks = 4, prompt = [5, 9, 13, 2, 7];
  const caches = () => Array.from({ length: c.numHiddenLayers }, () => ({
    k: k.zeros([numBlocks, blockSize, c.numKeyValueHeads, c.headDim], { device: "cpu" }),
    v: k.zeros([numBlocks, blockSize, c.numKeyValueHeads, c.headDim], { device: "cpu" }),
  }));
  // sequence 0 owns blocks [0, 1, ...], sequence 1 blocks [8, 9, ...]
  const blocks = [[0, 1, 2, 3], [8, 9, 10, 11]];
  const slot = (s: number, pos: number) => blocks[s]![Math.floor(pos / blockSize)]! * blockSize + (pos % blockSize);
  type Meta = { ids: number[]; positions: number[]; slots: number[]; qStart: number[]; seqLens: number[] };
  const decodeMeta = (ids: [number, number], len: number): Meta => ({
    ids, positions: [len, len], slots: [slot(0, len), slot(1, len)], qStart: [0, 1, 2], seqLens: [len + 1, len + 1],
  });
  const forward = (meta: Meta, kv: { k: Tensor; v: Tensor }[], persistent?: Record<string, Tensor>) => {
    const t = persistent ?? {
      ids: i32(meta.ids), positions: i32(meta.positions), slotMapping: i32(meta.slots),
      blockTables: i32(blocks.flat(), [2, maxBlocks]), queryStart: i32(meta.qStart), seqLens: i32(meta.seqLens),
    };
    const hidden = k.noGrad(() => m.forward(t.ids!, {
      kind: "paged", positions: t.positions!, slotMapping: t.slotMapping!, blockTables: t.blockTables!,
      queryStart: t.queryStart!, seqLens: t.seqLens!, kvCaches: kv,
    }));
    const logits = k.noGrad(() => m.logits(hidden));
    hidden.dispose();
    if (!persistent) disposeAll(Object.values(t));
    return logits;
  };
  // prefill both sequences (same prompt, eagerly) into both cache sets
  const prefill: Meta = {
    ids: [...prompt, ...prompt], positions: [...prompt.keys(), ...prompt.keys()],
    slots: [...prompt.keys()].map((p) => slot(0, p)).concat([...prompt.keys()].map((p) => slot(1, p))),
    qStart: [0, prompt.length, 2 * prompt.length], seqLens: [prompt.length, prompt.length],
  };
  const eagerKv = caches();
  const graphKv = caches();
  forward(prefill, eagerKv).dispose();
  forward(prefill, graphKv).dispose();
  const decode: [number, number][] = [[11, 3], [40, 17], [1, 63], [22, 22]];
  const want = decode.map((ids, i) => {
    const l = forward(decodeMeta(ids, prompt.length + i), eagerKv);
    const v = values(l).slice();
    l.dispose();
    return v;
  });

  const first = decodeMeta(decode[0]!, prompt.length);
  const inp = {
    ids: i32(first.ids), positions: i32(first.positions), slotMapping: i32(first.slots),
    blockTables: i32(blocks.flat(), [2, maxBlocks]), queryStart: i32(first.qStart), seqLens: i32(first.seqLens),
  };
  const liveBefore = be.liveBuffers();
  be.beginCapture();
  let logits: Tensor;
  try {
    logits = forward(first, graphKv, inp);
  } catch (e) {
    be.abortCapture();
    throw e;
  }
  const graph = be.endCapture();
  assert.equal(be.liveBuffers(), liveBefore + 1, "only the logits outlive the capture");
  gc();
  for (const [i, ids] of decode.entries()) {
    const meta = decodeMeta(ids, prompt.length + i);
    put(inp.ids, Int32Array.from(meta.ids));
    put(inp.positions, Int32Array.from(meta.positions));
    put(inp.slotMapping, Int32Array.from(meta.slots));
    put(inp.seqLens, Int32Array.from(meta.seqLens));
    graph.launch();
    assert.deepEqual(values(logits), want[i], `decode step ${i}`);
  }
  graph.dispose();
  disposeAll([logits, ...Object.values(inp), ...eagerKv.flatMap((x) => [x.k, x.v]), ...graphKv.flatMap((x) => [x.k, x.v])]);
});
