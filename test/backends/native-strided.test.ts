// Native strided kernels (copyStrided, binaryStrided, whereStrided, matmul with A transposed) vs
// straightforward JS loops, on random views: rank 0-6, permuted layouts, stepped slices, stride-0
// broadcasts, offsets. Like native-kernels.test.ts, the parent runs the suite once per ISA in a child.
import { test } from "node:test";
import assert from "node:assert/strict";
import { tryLoadNativeKernels, type NativeKernels } from "../../src/backends/cpu/native.js";
import { CpuBackend } from "../../src/backends/cpu/cpu-backend.js";
import { runReference } from "../../src/backends/reference/reference-kernels.js";
import type { BufferView, KernelCall } from "../../src/backends/backend.js";
import { runIsaChildren, supportedIsas } from "../helpers/isa-children.js";
import { mulberry32 } from "../../src/util/random.js";

const k = tryLoadNativeKernels();
const childIsa = process.env.KILN_NATIVE_TEST_CHILD ? process.env.KILN_NATIVE_ISA : undefined;

const rand = mulberry32(987654321); // deterministic inputs so failures reproduce
const randInt = (lo: number, hi: number): number => lo + Math.floor(rand() * (hi - lo + 1)); // inclusive
const numel = (shape: readonly number[]): number => shape.reduce((a, b) => a * b, 1);

/** A random strided layout of `shape`: permuted memory order, steps, padding, broadcasts, offset. */
interface Layout {
  strides: number[];
  offset: number;
  span: number; // elements the backing array needs from index 0
}
function randomLayout(shape: readonly number[], allowBroadcast: boolean): Layout {
  const r = shape.length;
  const order = [...Array(r).keys()];
  if (rand() < 0.7)
    for (let i = r - 1; i > 0; i--) {
      const j = randInt(0, i);
      [order[i], order[j]] = [order[j]!, order[i]!];
    }
  const strides = new Array<number>(r).fill(0);
  let acc = 1;
  for (let i = r - 1; i >= 0; i--) {
    const d = order[i]!;
    if (allowBroadcast && rand() < 0.15) continue; // stride 0
    const step = rand() < 0.8 ? 1 : 2;
    strides[d] = acc * step;
    acc *= (shape[d]! - 1) * step + 1 + (rand() < 0.2 ? randInt(1, 3) : 0);
  }
  const offset = rand() < 0.5 ? 0 : randInt(1, 7);
  return { strides, offset, span: offset + acc + randInt(0, 5) };
}
function randomShape(): number[] {
  const rank = randInt(0, 6);
  const sizes = [1, 2, 3, 4, 5, 7, 16, 17, 33, 40];
  for (;;) {
    const s = Array.from({ length: rank }, () => sizes[randInt(0, sizes.length - 1)]!);
    if (numel(s) <= 60000) return s;
  }
}
/** Storage offset of each element of the view, in row-major logical order. */
function offsetsOf(shape: readonly number[], l: Layout): number[] {
  const out: number[] = [];
  const idx = new Array<number>(shape.length).fill(0);
  const n = numel(shape);
  for (let i = 0; i < n; i++) {
    let o = l.offset;
    for (let d = 0; d < shape.length; d++) o += idx[d]! * l.strides[d]!;
    out.push(o);
    for (let d = shape.length - 1; d >= 0; d--) {
      if (++idx[d]! < shape[d]!) break;
      idx[d] = 0;
    }
  }
  return out;
}
const i32 = (xs: readonly number[]): Int32Array => Int32Array.from(xs);

type Ctor = Uint8ArrayConstructor | Uint16ArrayConstructor | Float32ArrayConstructor | Float64ArrayConstructor;
const byBytes: Record<1 | 2 | 4 | 8, Ctor> = { 1: Uint8Array, 2: Uint16Array, 4: Float32Array, 8: Float64Array };

function checkCopy(k: NativeKernels, shape: number[], eb: 1 | 2 | 4 | 8, contiguousDst: boolean): void {
  const C = byBytes[eb];
  const sl = randomLayout(shape, true);
  const dl = contiguousDst ? { strides: contig(shape), offset: randInt(0, 3), span: 0 } : randomLayout(shape, false);
  if (contiguousDst) dl.span = dl.offset + numel(shape);
  const src = new C(sl.span);
  for (let i = 0; i < src.length; i++) src[i] = eb === 1 ? randInt(0, 255) : eb === 2 ? randInt(0, 65535) : rand() * 100 - 50;
  const dst = new C(dl.span).fill(7);
  const want = new C(dl.span).fill(7);
  const so = offsetsOf(shape, sl);
  const dO = offsetsOf(shape, dl);
  for (let i = 0; i < so.length; i++) want[dO[i]!] = src[so[i]!]!;
  k.copyStrided(src.subarray(sl.offset), dst.subarray(dl.offset), i32(shape), i32(sl.strides), i32(dl.strides), eb);
  for (let i = 0; i < want.length; i++)
    if (dst[i] !== want[i])
      assert.fail(`copy shape [${shape}] src strides [${sl.strides}] dst strides [${dl.strides}] eb ${eb}: index ${i} got ${dst[i]} want ${want[i]}`);
}
function contig(shape: readonly number[]): number[] {
  const s: number[] = [];
  let acc = 1;
  for (let d = shape.length - 1; d >= 0; d--) {
    s[d] = acc;
    acc *= shape[d]!;
  }
  return s;
}

const BIN: ((x: number, y: number) => number)[] = [
  (x, y) => x + y, (x, y) => x - y, (x, y) => x * y, (x, y) => x / y,
  (x, y) => (Number.isNaN(x) || Number.isNaN(y) ? NaN : Math.max(x, y)),
  (x, y) => (Number.isNaN(x) || Number.isNaN(y) ? NaN : Math.min(x, y)),
  (x, y) => x ** y,
];
function randF32(n: number, lo: number, hi: number): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = lo + (hi - lo) * rand();
  return a;
}

function checkBinary(k: NativeKernels, shape: number[], op: number): void {
  const al = randomLayout(shape, true);
  const bl = randomLayout(shape, true);
  const lo = op === 6 ? 0.1 : -2;
  const a = randF32(al.span, lo, 2);
  const b = randF32(bl.span, lo, 2);
  const n = numel(shape);
  const out = new Float32Array(n + 2).fill(NaN);
  k.binaryStrided(op, a.subarray(al.offset), i32(al.strides), b.subarray(bl.offset), i32(bl.strides), out.subarray(1), i32(shape));
  const ao = offsetsOf(shape, al);
  const bo = offsetsOf(shape, bl);
  assert.ok(Number.isNaN(out[0]!) && Number.isNaN(out[n + 1]!), "wrote outside out");
  for (let i = 0; i < n; i++) {
    const want = Math.fround(BIN[op]!(a[ao[i]!]!, b[bo[i]!]!));
    const got = out[i + 1]!;
    // + - * / max min are correctly rounded in f32 (exact match); powf within 1e-6 relative
    const tol = op === 6 ? 1e-6 * Math.abs(want) : 0;
    if (!(Math.abs(got - want) <= tol))
      assert.fail(`binary op ${op} shape [${shape}] a [${al.strides}] b [${bl.strides}]: index ${i} got ${got} want ${want}`);
  }
}

function checkWhere(k: NativeKernels, shape: number[]): void {
  const cl = randomLayout(shape, true);
  const al = randomLayout(shape, true);
  const bl = randomLayout(shape, true);
  const c = new Uint8Array(cl.span);
  for (let i = 0; i < c.length; i++) c[i] = rand() < 0.5 ? 0 : randInt(1, 3);
  const a = randF32(al.span, -1, 1);
  const b = randF32(bl.span, -1, 1);
  const n = numel(shape);
  const out = new Float32Array(n).fill(NaN);
  k.whereStrided(c.subarray(cl.offset), i32(cl.strides), a.subarray(al.offset), i32(al.strides), b.subarray(bl.offset), i32(bl.strides), out, i32(shape));
  const co = offsetsOf(shape, cl), ao = offsetsOf(shape, al), bo = offsetsOf(shape, bl);
  for (let i = 0; i < n; i++) {
    const want = c[co[i]!] ? a[ao[i]!]! : b[bo[i]!]!;
    if (out[i] !== want) assert.fail(`where shape [${shape}]: index ${i} got ${out[i]} want ${want}`);
  }
}

function checkMatmulAT(k: NativeKernels, M: number, N: number, K: number, bT: boolean, batch: number): void {
  const strideA = M * K + 1, strideB = N * K, strideOut = M * N;
  const a = randF32((batch - 1) * strideA + M * K, -1, 1); // each item stored [K, M]
  const b = randF32((batch - 1) * strideB + N * K, -1, 1);
  const out = new Float32Array((batch - 1) * strideOut + M * N).fill(NaN);
  k.matmul(a, b, out, M, N, K, bT, 0, batch, strideA, strideB, strideOut, true);
  for (let bi = 0; bi < batch; bi++)
    for (let m = 0; m < M; m++)
      for (let n = 0; n < N; n++) {
        let dot = 0, abs = 0;
        for (let kk = 0; kk < K; kk++) {
          const p = a[bi * strideA + kk * M + m]! * b[bi * strideB + (bT ? n * K + kk : kk * N + n)]!;
          dot += p;
          abs += Math.abs(p);
        }
        const got = out[bi * strideOut + m * N + n]!;
        if (!(Math.abs(got - dot) <= 1e-5 * Math.sqrt(K) * abs + 1e-30))
          assert.fail(`matmul aT M=${M} N=${N} K=${K} bT=${bT} batch=${batch} at [${bi},${m},${n}]: got ${got}, want ${dot}`);
      }
}

if (!childIsa) {
  test("native strided kernels: every supported ISA", { skip: k ? false : "native addon not built" }, () => {
    runIsaChildren(import.meta.url, supportedIsas(k!, { bf16: false }), "KILN_NATIVE_TEST_CHILD"); // same as avx512 here
  });
  test("cpu backend routes strided copy / binary / where / aTransposed matmul like the reference", { skip: k ? false : "native addon not built" }, () => {
    checkBackendRouting();
  });
} else {
  runSuite(k!, childIsa);
}

function runSuite(k: NativeKernels, isa: string): void {
  for (const threads of [1, 2]) {
    test(`[${isa}] copyStrided, ${threads} thread(s)`, () => {
      k.setNumThreads(threads);
      for (let t = 0; t < 300; t++) {
        const eb = ([1, 2, 4, 8] as const)[t % 4]!;
        checkCopy(k, randomShape(), eb, t % 3 !== 0);
      }
      // large transposes (tile + AVX-512 paths, parallel split) with ragged edges
      checkCopy(k, [8, 37, 3, 64], 4, true);
      for (const [R, C] of [[300, 513], [64, 64], [17, 1000]] as const)
        for (const eb of [1, 2, 4, 8] as const) {
          const src = new (byBytes[eb])(R * C);
          for (let i = 0; i < src.length; i++) src[i] = i % 251;
          const dst = new (byBytes[eb])(R * C);
          k.copyStrided(src, dst, i32([C, R]), i32([1, C]), i32([R, 1]), eb); // dst = src^T
          for (let r = 0; r < R; r++)
            for (let c = 0; c < C; c++)
              if (dst[c * R + r] !== src[r * C + c]) assert.fail(`transpose ${R}x${C} eb ${eb} at ${r},${c}`);
        }
    });
    test(`[${isa}] binaryStrided, ${threads} thread(s)`, () => {
      k.setNumThreads(threads);
      for (let t = 0; t < 280; t++) checkBinary(k, randomShape(), t % 7);
      checkBinary(k, [300, 1000], 1); // above the parallel threshold
    });
    test(`[${isa}] whereStrided, ${threads} thread(s)`, () => {
      k.setNumThreads(threads);
      for (let t = 0; t < 100; t++) checkWhere(k, randomShape());
    });
    test(`[${isa}] matmul with A transposed, ${threads} thread(s)`, () => {
      k.setNumThreads(threads);
      for (const [M, N, K] of [[1, 7, 5], [3, 33, 17], [8, 64, 100], [9, 40, 33], [30, 70, 257], [70, 129, 64]] as const)
        for (const bT of [false, true]) checkMatmulAT(k, M, N, K, bT, 1);
      checkMatmulAT(k, 20, 17, 9, false, 3);
    });
  }
  test(`[${isa}] strided kernels reject bad arguments`, () => {
    const a = new Float32Array(4);
    assert.throws(() => k.copyStrided(a, new Float32Array(4), i32([2, 2]), i32([2, 1]), i32([0, 1]), 4), /must not be 0/);
    assert.throws(() => k.copyStrided(a, new Float32Array(4), i32([3, 2]), i32([2, 1]), i32([2, 1]), 4), RangeError);
    assert.throws(() => k.binaryStrided(0, a, i32([4, 1]), a, i32([1, 1]), new Float32Array(4), i32([2, 2])), RangeError);
    assert.throws(() => k.binaryStrided(0, a, i32([-1]), a, i32([1]), new Float32Array(4), i32([4])), /must be >= 0/);
  });
}

// ---------------------------------------------------------------- backend routing
function view(buffer: BufferView["buffer"], dtype: BufferView["dtype"], shape: number[], strides: number[], offset = 0): BufferView {
  return { buffer, dtype, shape, strides, offset };
}
function checkBackendRouting(): void {
  const be = new CpuBackend();
  const fill = (n: number, bytes = 4) => {
    const buf = be.allocate(n * bytes);
    const f = new Float32Array(buf.host!, 0, (n * bytes) >>> 2);
    for (let i = 0; i < f.length; i++) f[i] = rand() * 4 - 2;
    return buf;
  };
  const same = (call: (out: BufferView) => KernelCall, shape: number[], dtype: BufferView["dtype"] = "float32", bytes = 4) => {
    const n = numel(shape);
    const o1 = be.allocate(n * bytes), o2 = be.allocate(n * bytes);
    be.run(call(view(o1, dtype, shape, contig(shape))));
    runReference(call(view(o2, dtype, shape, contig(shape))));
    assert.deepEqual(new Uint8Array(o1.host!), new Uint8Array(o2.host!));
  };
  // sizes above the backend's native threshold (tiny views stay on the TS loops)
  const src = fill(4 * 10 * 6 * 8);
  same((out) => ({ op: "copy", x: view(src, "float32", [4, 6, 10, 8], [480, 8, 48, 1]), out }), [4, 6, 10, 8]);
  same((out) => ({ op: "copy", x: view(src, "bfloat16", [16, 7], [1, 16], 3), out }), [16, 7], "bfloat16", 2);
  same((out) => ({ op: "copy", x: view(src, "int32", [8, 12, 10], [0, 1, 12]), out }), [8, 12, 10], "int32");
  const s = fill(1), x = fill(64 * 33);
  same((out) => ({ op: "binary", fn: "sub", a: view(s, "float32", [64, 33], [0, 0]), b: view(x, "float32", [64, 33], [33, 1]), out }), [64, 33]);
  same((out) => ({ op: "binary", fn: "div", a: view(x, "float32", [64, 33], [1, 64]), b: view(x, "float32", [64, 33], [1, 0], 5), out }), [64, 33]);
  const cond = be.allocate(64 * 33);
  new Uint8Array(cond.host!).forEach((_, i, c) => (c[i] = i % 3 === 0 ? 1 : 0));
  same((out) => ({ op: "where", cond: view(cond, "bool", [33, 64], [1, 33]), a: view(x, "float32", [33, 64], [64, 1]), b: view(s, "float32", [33, 64], [0, 0]), out }), [33, 64]);
  // aTransposed matmul: the reference sums in f64, so compare with a tolerance
  const M = 12, N = 9, K = 20;
  const a = fill(K * M), b = fill(K * N);
  const o1 = be.allocate(M * N * 4), o2 = be.allocate(M * N * 4);
  const mm = (o: BufferView["buffer"]): KernelCall => ({
    op: "matmul", a: view(a, "float32", [K, M], [M, 1]), b: view(b, "float32", [K, N], [N, 1]), out: view(o, "float32", [M, N], [N, 1]),
    batch: 1, m: M, n: N, k: K, bTransposed: false, aTransposed: true, strideA: 0, strideB: 0, strideOut: 0,
  });
  be.run(mm(o1));
  runReference(mm(o2));
  const g = new Float32Array(o1.host!), w = new Float32Array(o2.host!);
  for (let i = 0; i < M * N; i++) assert.ok(Math.abs(g[i]! - w[i]!) <= 1e-5 * (1 + Math.abs(w[i]!)), `matmul aT at ${i}: ${g[i]} vs ${w[i]}`);
}
