// Native CPU kernels vs straightforward JS references, on random inputs with odd sizes and tails.
// The parent process runs the suite once per ISA the machine supports, each in a child process
// with KILN_NATIVE_ISA set (the addon reads it once at load).
import { test } from "node:test";
import v8 from "node:v8";
import vm from "node:vm";
import { Worker } from "node:worker_threads";
import assert from "node:assert/strict";
import { tryLoadNativeKernels, type NativeKernels } from "../../src/backends/cpu/native.js";
import { runIsaChildren, supportedIsas } from "../helpers/isa-children.js";
import { mulberry32 } from "../../src/util/random.js";
import { f32ToFp8Bits, fp8BitsToF32 } from "../../src/backends/dtype.js";

const k = tryLoadNativeKernels();
const childIsa = process.env.KILN_NATIVE_TEST_CHILD ? process.env.KILN_NATIVE_ISA : undefined;

// ---------------------------------------------------------------- helpers
const rand = mulberry32(12345); // deterministic inputs so failures reproduce
function randArray(n: number, lo = -1, hi = 1): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = lo + (hi - lo) * rand();
  return a;
}
const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);
function bf16Round(x: number): number {
  // round-to-nearest-even to the upper 16 bits
  f32[0] = x;
  const u = u32[0]!;
  if ((u & 0x7fffffff) > 0x7f800000) return ((u >>> 16) | 0x40) & 0xffff;
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}
function bf16Value(h: number): number {
  u32[0] = (h << 16) >>> 0;
  return f32[0]!;
}
function f16Value(h: number): number {
  const s = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? NaN : s * Infinity;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}
function close(got: ArrayLike<number>, want: ArrayLike<number>, tol: (i: number) => number, what: string): void {
  assert.equal(got.length >= want.length, true, `${what}: length`);
  for (let i = 0; i < want.length; i++) {
    const g = got[i]!, w = want[i]!;
    if (Number.isNaN(w) && Number.isNaN(g)) continue;
    if (g === w) continue;
    const err = Math.abs(g - w);
    if (!(err <= tol(i))) assert.fail(`${what}: index ${i}: got ${g}, want ${w} (|err| ${err} > ${tol(i)})`);
  }
}
function erf(x: number): number {
  // Maclaurin series in double precision; exact to ~1e-10 for |x| <= 4, and erf = ±1 to 1.6e-8 beyond.
  if (Math.abs(x) > 4) return Math.sign(x);
  let sum = 0, term = x;
  for (let n = 0; n < 200; n++) {
    const t = term / (2 * n + 1);
    sum += t;
    term *= (-x * x) / (n + 1);
    if (Math.abs(t) < 1e-17) break;
  }
  return (2 / Math.sqrt(Math.PI)) * sum;
}

// ---------------------------------------------------------------- parent: one child per ISA
if (!childIsa) {
  test("native kernels: every supported ISA", { skip: k ? false : "native addon not built" }, () => {
    runIsaChildren(import.meta.url, supportedIsas(k!), "KILN_NATIVE_TEST_CHILD");
  });
} else {
  runSuite(k!, childIsa);
}

/**
 * A worker_thread that loads the addon and runs n x n matmuls back to back: `until` is the loop's JS condition (t0
 * is its start time). It posts "busy" once the loop starts and "done" if the loop ends; `busy` resolves on the first.
 */
function matmulWorker(n: number, until: string): { worker: Worker; busy: Promise<void> } {
  const native = new URL("../../src/backends/cpu/native.js", import.meta.url).href;
  const worker = new Worker(
    `const { parentPort } = require("node:worker_threads");
    import(${JSON.stringify(native)}).then(({ tryLoadNativeKernels }) => {
      const k = tryLoadNativeKernels(), n = ${n};
      const a = new Float32Array(n * n).fill(1), b = new Float32Array(n * n).fill(1), o = new Float32Array(n * n);
      parentPort.postMessage("busy");
      const t0 = Date.now();
      while (${until}) k.matmul(a, b, o, n, n, n, false, 0, 1, 0, 0, 0);
      parentPort.postMessage("done");
    });`,
    { eval: true },
  );
  const busy = new Promise<void>((resolve, reject) => {
    worker.on("error", reject);
    worker.on("message", (m) => m === "busy" && resolve());
  });
  return { worker, busy };
}

function runSuite(k: NativeKernels, isa: string): void {
  test(`[${isa}] selected ISA`, () => assert.equal(k.isa, isa));

  for (const threads of [1, 2]) {
    test(`[${isa}] matmul, ${threads} thread(s)`, () => {
      k.setNumThreads(threads);
      assert.equal(k.getNumThreads(), threads);
      const cases: [number, number, number][] = [
        [1, 1, 1], [1, 33, 17], [1, 67, 300], [2, 50, 129], [3, 17, 64], [4, 31, 33], [5, 100, 257],
        [7, 64, 40], [8, 129, 515], [9, 33, 100], [13, 65, 31], [17, 130, 300], [29, 97, 513], [70, 300, 515],
      ];
      for (const [M, N, K] of cases)
        for (const bT of [true, false])
          for (const dtype of [0, 1] as const) checkMatmul(k, M, N, K, bT, dtype, 1);
      // batched, including a broadcast B (strideB = 0) and padded output strides
      checkMatmul(k, 3, 20, 24, true, 0, 4);
      checkMatmul(k, 6, 17, 9, false, 1, 3, true);
      checkMatmul(k, 40, 70, 33, true, 0, 3, true);
    });
  }

  test(`[${isa}] unary ops`, () => {
    k.setNumThreads(2);
    const n = 70001; // above the parallel threshold, with a tail
    const x = randArray(n, -10, 10);
    x[0] = 0; x[1] = -0.01; x[2] = 0.03; x[3] = 90; x[4] = -90; x[5] = 1e-8;
    const pos = randArray(n, 1e-3, 50);
    const refs: [number, (v: number) => number, Float32Array, number][] = [
      // [op, reference, input, tolerance relative to max(1,|ref|)]; the fast exp is ~2 ulp, tanh/sigmoid
      // derive from it (abs error ~2e-7), gelu uses an erf approximation with |error| <= 1.5e-7.
      [0, (v) => -v, x, 0],
      [1, Math.exp, x, 1e-6],
      [2, Math.log, pos, 1e-6],
      [3, Math.sqrt, pos, 1e-6],
      [4, (v) => 1 / Math.sqrt(v), pos, 1e-6],
      [5, Math.tanh, x, 1e-6],
      [6, (v) => 1 / (1 + Math.exp(-v)), x, 1e-6],
      [7, (v) => v / (1 + Math.exp(-v)), x, 2e-6],
      [8, (v) => 0.5 * v * (1 + erf(v / Math.SQRT2)), x, 2e-6],
      [9, (v) => 0.5 * v * (1 + Math.tanh(0.7978845608028654 * (v + 0.044715 * v ** 3))), x, 2e-6],
      [10, Math.abs, x, 0],
      [11, (v) => 1 / v, pos, 1e-6],
      [12, Math.sin, x, 1e-6],
      [13, Math.cos, x, 1e-6],
      [14, (v) => v * v, x, 1e-6],
      [15, (v) => Math.max(v, 0), x, 0],
    ];
    for (const [op, ref, input, tol] of refs) {
      for (const len of [n, 1, 15, 37]) {
        const out = new Float32Array(len);
        k.unary(op, input.subarray(0, len), out, len);
        const want = Array.from(input.subarray(0, len), (v) => Math.fround(ref(v))); // f32 overflow -> inf
        close(out, want, (i) => tol * Math.max(1, Math.abs(want[i]!)) + 1e-30, `unary ${op} n=${len}`);
      }
    }
  });

  test(`[${isa}] binary ops with broadcasting`, () => {
    const n = 3 * 40007;
    const a = randArray(n, 0.1, 5);
    const refs: ((x: number, y: number) => number)[] = [
      (x, y) => x + y, (x, y) => x - y, (x, y) => x * y, (x, y) => x / y,
      Math.max, Math.min, (x, y) => x ** y,
    ];
    for (const bn of [1, n, 40007, 3]) {
      const b = randArray(bn, -3, 3);
      for (let op = 0; op < refs.length; op++) {
        const out = new Float32Array(n);
        k.binary(op, a, b, out, n, bn);
        const want = Array.from(a, (v, i) => Math.fround(refs[op]!(v, b[i % bn]!)));
        // + - * / max min are correctly rounded f32 ops; powf is within a few ulp.
        close(out, want, (i) => (op === 6 ? 4e-7 * Math.abs(want[i]!) : 0), `binary ${op} bn=${bn}`);
      }
    }
    assert.throws(() => k.binary(0, a, a, new Float32Array(n), n, 7), /bn must divide n/);
  });

  test(`[${isa}] siluMul, rmsNorm, softmax, reduce, argmax`, () => {
    const rows = 37, n = 1003;
    const x = randArray(rows * n, -4, 4);
    const up = randArray(rows * n);
    const out = new Float32Array(rows * n);
    k.siluMul(x, up, out, rows * n);
    close(out, Array.from(x, (v, i) => (v / (1 + Math.exp(-v))) * up[i]!), () => 2e-6, "siluMul");

    const w = randArray(n, 0.5, 1.5);
    k.rmsNorm(x, w, out, rows, n, 1e-5);
    const wantNorm: number[] = [];
    for (let r = 0; r < rows; r++) {
      let ss = 0;
      for (let i = 0; i < n; i++) ss += x[r * n + i]! ** 2;
      const inv = 1 / Math.sqrt(ss / n + 1e-5);
      for (let i = 0; i < n; i++) wantNorm.push(x[r * n + i]! * inv * w[i]!);
    }
    // sum of squares in f32 over n=1003 terms: relative error ~ sqrt(n) * 2^-24
    close(out, wantNorm, (i) => 1e-5 * Math.max(1, Math.abs(wantNorm[i]!)), "rmsNorm");

    for (const log of [false, true]) {
      k.softmax(x, out, rows, n, log);
      const want: number[] = [];
      for (let r = 0; r < rows; r++) {
        const row = Array.from(x.subarray(r * n, (r + 1) * n));
        const m = Math.max(...row);
        const s = row.reduce((acc, v) => acc + Math.exp(v - m), 0);
        for (const v of row) want.push(log ? v - m - Math.log(s) : Math.exp(v - m) / s);
      }
      close(out, want, (i) => 2e-6 * Math.max(log ? 1 : 1e-3, Math.abs(want[i]!)), `softmax log=${log}`);
    }

    const red = new Float32Array(rows);
    for (const [op, f] of [[0, (r: number[]) => r.reduce((a, b) => a + b, 0)], [1, (r: number[]) => Math.max(...r)], [2, (r: number[]) => Math.min(...r)]] as const) {
      k.reduce(op, x, red, rows, n);
      const want = Array.from({ length: rows }, (_, r) => f(Array.from(x.subarray(r * n, (r + 1) * n))));
      // f32 sum of 1003 terms in [-4,4]: error well under 1e-4 absolute
      close(red, want, () => (op === 0 ? 1e-4 : 0), `reduce ${op}`);
    }

    const xa = x.slice();
    for (let r = 0; r < rows; r++) { xa[r * n + 5] = 10; xa[r * n + (r % 2 ? 700 : 6)] = 10; } // ties: first index wins
    const am = new Int32Array(rows);
    k.argmax(xa, am, rows, n);
    for (let r = 0; r < rows; r++) assert.equal(am[r], 5, `argmax row ${r}`);
    k.argmax(x.subarray(0, 13), am, 1, 13);
    const row = Array.from(x.subarray(0, 13));
    assert.equal(am[0], row.indexOf(Math.max(...row)));
    // deep in a long row, tied within its vector and with a later one: the first index still wins
    const long = Float32Array.from({ length: 1000 }, (_, i) => Math.sin(i));
    long[517] = 9; long[519] = 9; long[900] = 9;
    k.argmax(long, am, 1, 1000);
    assert.equal(am[0], 517);
    // tied in lanes of different vectors (an earlier index in a later lane group, as AVX2's 4 chains of 8 hold 40 and 70)
    const tied = long.slice();
    tied[70] = 11; tied[40] = 11;
    k.argmax(tied, am, 1, 1000);
    assert.equal(am[0], 40);
    long[3] = Number.NaN;
    k.argmax(long, am, 1, 1000);
    assert.equal(am[0], 3, "a NaN counts as the largest value, as in torch (and the reference kernel): the first NaN wins");
    long[800] = Number.NaN;
    k.argmax(long, am, 1, 1000);
    assert.equal(am[0], 3);
  });

  test(`[${isa}] rotary (neox and GPT-J, partial rotary dim, in place)`, () => {
    const T = 7, H = 3, D = 40, maxPos = 50;
    for (const [rd, neox] of [[40, true], [40, false], [24, true], [16, false]] as const) {
      const half = rd / 2;
      const cos = new Float32Array(maxPos * half), sin = new Float32Array(maxPos * half);
      for (let p = 0; p < maxPos; p++)
        for (let i = 0; i < half; i++) {
          const ang = p / 10000 ** ((2 * i) / rd);
          cos[p * half + i] = Math.cos(ang);
          sin[p * half + i] = Math.sin(ang);
        }
      const x = randArray(T * H * D);
      const positions = Int32Array.from({ length: T }, (_, t) => (t * 7) % maxPos);
      const want = Array.from(x);
      for (let t = 0; t < T; t++)
        for (let h = 0; h < H; h++)
          for (let i = 0; i < half; i++) {
            const base = (t * H + h) * D;
            const [i1, i2] = neox ? [i, i + half] : [2 * i, 2 * i + 1];
            const c = cos[positions[t]! * half + i]!, s = sin[positions[t]! * half + i]!;
            want[base + i1] = x[base + i1]! * c - x[base + i2]! * s;
            want[base + i2] = x[base + i2]! * c + x[base + i1]! * s;
          }
      const out = new Float32Array(T * H * D);
      k.rotary(x, positions, cos, sin, out, T, H, D, rd, neox);
      close(out, want, () => 1e-6, `rotary rd=${rd} neox=${neox}`);
      k.rotary(x, positions, cos, sin, x, T, H, D, rd, neox); // in place
      close(x, want, () => 1e-6, `rotary in place rd=${rd}`);
    }
  });

  // D = 36: the one-row kernel on every ISA; the others the blocked kernel where D / vector width is one of its tile
  // widths (2, 3, 4, 5, 6, 8, 10, 12, 16): 48, 80 and 96 on AVX-512 (3, 5, 6), 40 on AVX2 (5); else the one-row kernel
  for (const D of [36, 40, 48, 64, 32, 80, 96, 128])
    for (const slidingWindow of [0, 9]) {
      test(`[${isa}] paged attention (GQA, mixed decode/prefill, D ${D}, window ${slidingWindow})`, () => {
        checkPagedAttention(k, D, slidingWindow, [1, 20, 5], [37, 20, 70]);
      });
    }
  // Gemma 2's attention logit soft-capping (0.3: well under the scores' range, so it changes every row) in the blocked
  // kernel (D 64, 32: decode, prefill, window, bf16), the one-row kernel (D 40) and decode with split keys
  test(`[${isa}] paged attention with soft-capped scores`, () => {
    for (const D of [40, 64, 32]) checkPagedAttention(k, D, 9, [1, 20, 5], [37, 20, 70], "f32", 0.3);
    checkPagedAttention(k, 64, 0, [1, 20, 5], [37, 20, 70], "bf16", 0.3);
    checkPagedAttention(k, 64, 0, [1], [150], "f32", 0.3);
  });
  test(`[${isa}] paged attention: decode of one sequence (one head per work item), long prefill`, () => {
    checkPagedAttention(k, 64, 0, [1], [150]);
    checkPagedAttention(k, 64, 0, [90], [90]);
    checkPagedAttention(k, 64, 50, [33, 1], [140, 66]);
  });
  // bidirectional (an encoder's full attention): every row of a sequence sees all its keys, its later tokens' too;
  // whole prompts (a vision tower's patches), new tokens after cached ones, decode rows; blocked and one-row kernels
  for (const D of [36, 64, 80])
    test(`[${isa}] bidirectional paged attention (D ${D})`, () => {
      checkPagedAttention(k, D, 0, [40], [40], "f32", 0, true);
      checkPagedAttention(k, D, 0, [1, 20, 5], [37, 20, 70], "f32", 0, true);
      checkPagedAttention(k, D, 0, [1, 20, 5], [37, 20, 70], "bf16", 0.3, true);
      checkPagedAttention(k, D, 0, [1], [150], "f32", 0, true);
    });
  // with a sliding window every row sees the window ending at its sequence's last position
  test(`[${isa}] bidirectional paged attention within a sliding window`, () => {
    for (const D of [36, 64]) checkPagedAttention(k, D, 9, [1, 20, 5], [37, 20, 70], "f32", 0, true);
  });
  // bf16 caches: the keys of a GQA group are widened to f32 once per tile and scored by each of its rows
  for (const D of [40, 64, 128])
    test(`[${isa}] paged attention over a bf16 KV cache (D ${D}): decode, prefill, window`, () => {
      checkPagedAttention(k, D, 0, [1, 20, 5], [37, 20, 70], "bf16");
      checkPagedAttention(k, D, 9, [1, 20, 5], [37, 20, 70], "bf16");
      checkPagedAttention(k, D, 0, [1], [150], "bf16");
    });
  // fp8 caches (--kv-cache-dtype fp8_e4m3 / fp8_e5m2): bytes decoded in vector registers, rows written rounded
  for (const kind of ["fp8_e4m3", "fp8_e5m2"] as const) {
    for (const D of [40, 64])
      test(`[${isa}] paged attention over an ${kind} KV cache (D ${D}): decode, prefill, window`, () => {
        checkPagedAttention(k, D, 0, [1, 20, 5], [37, 20, 70], kind);
        checkPagedAttention(k, D, 9, [1, 20, 5], [37, 20, 70], kind);
        checkPagedAttention(k, D, 0, [1], [150], kind);
      });
    test(`[${isa}] ${kind} KV cache: all 256 codes decode, edge values encode as backends/dtype.ts does`, () => checkFp8CacheCodes(k, FP8_FORMAT[kind]));
  }

  test(`[${isa}] embedding and dtype conversions`, () => {
    const rows = 50, dim = 37, numIds = 11;
    const table = randArray(rows * dim);
    const ids = Int32Array.from({ length: numIds }, () => Math.floor(rand() * rows));
    const out = new Float32Array(numIds * dim);
    k.embedding(table, 0, ids, out, numIds, dim);
    close(out, Array.from(out, (_, i) => table[ids[Math.floor(i / dim)]! * dim + (i % dim)]!), () => 0, "embedding f32");
    const tb = new Uint16Array(rows * dim);
    k.f32ToBf16(table, tb, rows * dim);
    k.embedding(tb, 1, ids, out, numIds, dim);
    close(out, Array.from(out, (_, i) => bf16Value(tb[ids[Math.floor(i / dim)]! * dim + (i % dim)]!)), () => 0, "embedding bf16");
    assert.throws(() => k.embedding(table, 0, Int32Array.of(rows), out, 1, dim), /out of range/);

    // bf16: bit-exact round-to-nearest-even, including ties, NaN and infinities
    const n = 100003;
    const src = randArray(n, -1e4, 1e4);
    const srcBits = new Uint32Array(src.buffer);
    srcBits[0] = 0x3f808000; // exact tie, even -> round down
    srcBits[1] = 0x3f818000; // exact tie, odd -> round up
    src[2] = NaN; src[3] = Infinity; src[4] = -Infinity; src[5] = 3.4e38;
    const bf = new Uint16Array(n);
    k.f32ToBf16(src, bf, n);
    for (let i = 0; i < n; i++) if (bf[i] !== bf16Round(src[i]!)) assert.fail(`f32ToBf16 index ${i}: ${bf[i]} vs ${bf16Round(src[i]!)}`);
    const back = new Float32Array(n);
    k.bf16ToF32(bf, back, n);
    close(back, Array.from(bf, bf16Value), () => 0, "bf16ToF32");

    // f16: decode every half exactly; encode must pick the nearest half (ties to even)
    const all = Uint16Array.from({ length: 65536 }, (_, i) => i);
    const dec = new Float32Array(65536);
    k.f16ToF32(all, dec, 65536);
    close(dec, Array.from(all, f16Value), () => 0, "f16ToF32");
    const vals = randArray(n, -70000, 70000);
    for (let i = 0; i < 2000; i++) vals[i] = (rand() - 0.5) * 2 ** (-30 + Math.floor(rand() * 20)); // subnormals
    vals[2000] = NaN; vals[2001] = 65519; vals[2002] = 65520; vals[2003] = 2 ** -25; vals[2004] = 3 * 2 ** -25;
    const h = new Uint16Array(n);
    k.f32ToF16(vals, h, n);
    for (let i = 0; i < n; i++) {
      const x = vals[i]!, got = f16Value(h[i]!);
      if (Number.isNaN(x)) { assert.ok(Number.isNaN(got)); continue; }
      if (Math.abs(x) >= 65520) { assert.equal(got, Math.sign(x) * Infinity, `f32ToF16 overflow ${x}`); continue; }
      const err = Math.abs(got - x);
      for (const nb of [h[i]! - 1, h[i]! + 1]) {
        if ((nb & 0x7c00) === 0x7c00 || nb < 0 || ((nb ^ h[i]!) & 0x8000)) continue;
        const e2 = Math.abs(f16Value(nb) - x);
        if (e2 < err || (e2 === err && (h[i]! & 1))) assert.fail(`f32ToF16(${x}) = ${got}, neighbour ${f16Value(nb)} is nearer/even`);
      }
    }
  });

  test(`[${isa}] thread pool: many back-to-back jobs, then idle without spinning`, async () => {
    k.setNumThreads(2);
    const n = 40000; // above the inline threshold: split into chunks shared by both threads
    const a = randArray(n), out = new Float32Array(n);
    for (let it = 0; it < 2000; it++) {
      k.binary(0, a, Float32Array.of(it), out, n, 1);
      if (out[it % n] !== Math.fround(a[it % n]! + it) || out[n - 1] !== Math.fround(a[n - 1]! + it)) assert.fail(`job ${it} incomplete`);
    }
    // workers spin ~150 us after a job, then sleep: an idle 300 ms must cost far less CPU than that. The process's
    // CPU time also counts V8's background threads (a compile or GC can land in the window), so the best of three
    // windows counts: a pool that never sleeps would spin through all of them.
    let best = Infinity;
    for (let w = 0; w < 3 && best >= 60_000; w++) {
      const before = process.cpuUsage();
      await new Promise((r) => setTimeout(r, 300));
      const used = process.cpuUsage(before);
      best = Math.min(best, used.user + used.system);
    }
    assert.ok(best < 60_000, `idle pool used ${best} us of CPU in the best of three 300 ms windows`);
  });

  test(`[${isa}] thread pool: a cache line's round trip between two threads`, () => {
    if (!k.coreRoundTrip) return;
    k.setNumThreads(1);
    assert.equal(k.coreRoundTrip(1000), 0); // no second thread to answer
    k.setNumThreads(2);
    // A line crossing between two cores and back takes tens of ns on any x86 (a loop that did not wait for the other
    // thread would time ~1 ns); a time-sliced CI runner can stretch it, hence the loose upper bound.
    const ns = k.coreRoundTrip(200);
    assert.ok(ns > 5 && ns < 5e6, `round trip ${ns} ns`);
    assert.throws(() => k.coreRoundTrip!(0), /coreRoundTrip.*iterations must be an integer >= 1/);
    assert.throws(() => k.coreRoundTrip!(1.5), RangeError);
  });

  test(`[${isa}] thread pool: the round trip returns while another thread's jobs hold the pool`, async () => {
    if (!k.coreRoundTrip) return;
    k.setNumThreads(2);
    // A worker_thread runs matmuls back to back on the shared pool. A call that finds the pool taken runs both of its
    // chunks on the calling thread, where the second never answers the first: it must give up (-1), not spin forever.
    const { worker: w, busy } = matmulWorker(768, "Date.now() - t0 < 1500");
    const done = new Promise<void>((resolve) => w.on("message", (m) => m === "done" && resolve()));
    await busy;
    await new Promise((r) => setTimeout(r, 100));
    const results = Array.from({ length: 5 }, () => k.coreRoundTrip!(500));
    await done; // (terminating the worker inside a native call would abort the process)
    // whether a call met the pool taken depends on the moment; each must return, -1 or a real round trip
    for (const ns of results) assert.ok(ns === -1 || (ns > 5 && ns < 5e6), `round trip ${ns} ns`);
  });

  test(`[${isa}] a huge-page buffer collected while stream jobs read it is unmapped only after they ran`, async () => {
    if (!k.allocHugeMemory) return;
    // A Worker terminated mid-step finalizes its buffers in its environment's teardown, before the stream's cleanup
    // hook joins the stream thread (seen: a segfault in paged attention while LLM.generate's Worker was terminated).
    // The same here without a Worker: the weight (36.9 MB, a huge-page chunk of its own) loses its last reference
    // with 24 products on it queued, and a forced GC finalizes it. Unmapping it at once crashed this process.
    v8.setFlagsFromString("--expose-gc");
    const gc = vm.runInNewContext("gc") as () => void;
    const N = 9000, K = 1024;
    const x = new Float32Array(K).fill(1), out = new Float32Array(N);
    for (let round = 0; round < 3; round++) {
      (() => {
        const w = new Float32Array(k.allocHugeMemory!(N * K * 4)).fill(0.5);
        for (let i = 0; i < 24; i++) k.stream.matmul(x, w, out, 1, N, K, true, 0, 1, 0, 0, 0);
      })();
      gc();
      await new Promise((r) => setImmediate(r)); // the finalizer runs here, or at the next GC
      gc();
    }
    k.streamSync();
    assert.equal(out[0], 512); // 1024 x 0.5: the last product ran on intact memory
    assert.equal(out[N - 1], 512);
  });

  test(`[${isa}] a Worker terminated while it calls into the addon leaves this process running`, async () => {
    // Once terminating, every call the Worker makes fails; the error that cannot be thrown into the dying thread
    // used to escape as a C++ exception and abort the whole process (binding.gyp NODE_API_SWALLOW_UNTHROWABLE_EXCEPTIONS).
    const { worker: w, busy } = matmulWorker(256, "true");
    await busy;
    await new Promise((r) => setTimeout(r, 50));
    await w.terminate();
    // still here: the addon keeps working on this thread
    const out = new Float32Array(2);
    k.unary(14, Float32Array.of(5, 2), out, 2);
    assert.deepEqual(Array.from(out), [25, 4]);
  });

  test(`[${isa}] argument validation`, () => {
    assert.throws(() => k.matmul(new Float32Array(3), new Float32Array(4), new Float32Array(4), 2, 2, 2, true, 0, 1, 0, 0, 0), RangeError);
    assert.throws(() => k.unary(0, new Float64Array(4) as unknown as Float32Array, new Float32Array(4), 4), TypeError);
    // byteOffset of views is honoured
    const buf = new Float32Array(10).fill(2);
    buf[3] = 5;
    const out = new Float32Array(2);
    k.unary(14, buf.subarray(3, 5), out, 2);
    assert.deepEqual(Array.from(out), [25, 4]);
    assert.ok(k.memoryReadBandwidth(new Float32Array(1 << 16), 2, 1) > 0);
    // a list of arrays (of any element type) reads as one run of bytes
    assert.ok(k.memoryReadBandwidth([new Uint8Array(1 << 16), new Float32Array(1 << 14).subarray(16)], 2, 2) > 0);
    const notArray = 3 as unknown as Float32Array;
    assert.throws(() => k.memoryReadBandwidth([new Float32Array(64), notArray], 1, 1), /memoryReadBandwidth.*typed array/);
    assert.ok(k.fmaPeak(1000) > 0);
    // copyPieces: src's bytes in order into each destination, which must cover src exactly
    const dsts = [new Uint8Array(2), new Uint8Array(8).subarray(3, 6)];
    k.copyPieces(Uint8Array.of(1, 2, 3, 4, 5), dsts);
    assert.deepEqual([...dsts[0]!, ...dsts[1]!], [1, 2, 3, 4, 5]);
    assert.throws(() => k.copyPieces(Uint8Array.of(1, 2, 3), [new Uint8Array(2)]), RangeError);
  });
}

function checkMatmul(k: NativeKernels, M: number, N: number, K: number, bT: boolean, dtype: 0 | 1, batch: number, broadcastB = false): void {
  const strideA = M * K, strideB = broadcastB ? 0 : N * K, strideOut = M * N + 3;
  const a = randArray((batch - 1) * strideA + M * K);
  const bf = randArray((batch - 1) * strideB + N * K);
  let b: Float32Array | Uint16Array = bf;
  const bVal = new Float32Array(bf.length);
  // avx512-bf16: large-M bf16 products against [N,K] round a to bf16 (k.bf16DotMinM); the reference does too
  const dotMinM = k.bf16DotMinM ?? 0;
  const roundA = dtype === 1 && bT && dotMinM > 0 && M >= dotMinM;
  const aVal = roundA ? a.map((v) => bf16Value(bf16Round(v))) : a;
  if (dtype === 1) {
    const bh = new Uint16Array(bf.length);
    for (let i = 0; i < bf.length; i++) { bh[i] = bf16Round(bf[i]!); bVal[i] = bf16Value(bh[i]!); }
    b = bh;
  } else bVal.set(bf);
  const out = new Float32Array((batch - 1) * strideOut + M * N).fill(NaN);
  k.matmul(a, b, out, M, N, K, bT, dtype, batch, strideA, strideB, strideOut);
  for (let bi = 0; bi < batch; bi++)
    for (let m = 0; m < M; m++)
      for (let n = 0; n < N; n++) {
        let dot = 0, abs = 0;
        for (let kk = 0; kk < K; kk++) {
          const w = bVal[bi * strideB + (bT ? n * K + kk : kk * N + n)]!;
          const p = aVal[bi * strideA + m * K + kk]! * w;
          dot += p;
          abs += Math.abs(p);
        }
        // The reference uses the same (bf16-decoded) weights, so bf16 needs no extra slack. f32
        // accumulation in any order errs ~sqrt(K)*2^-24*sum|a*b| typically: allow 1e-5*sqrt(K)*sum|a*b|.
        const got = out[bi * strideOut + m * N + n]!;
        const tol = 1e-5 * Math.sqrt(K) * abs + 1e-30;
        if (!(Math.abs(got - dot) <= tol))
          assert.fail(`matmul M=${M} N=${N} K=${K} bT=${bT} dtype=${dtype} batch=${batch} at [${bi},${m},${n}]: got ${got}, want ${dot}`);
      }
}

/** qlens[s] new tokens of sequence s, whose length (cached + new) is lens[s]; random K/V everywhere. */
type CacheKind = "f32" | "bf16" | "fp8_e4m3" | "fp8_e5m2";
const FP8_FORMAT = { fp8_e4m3: "e4m3fn", fp8_e5m2: "e5m2" } as const;

function checkPagedAttention(
  k: NativeKernels, D: number, slidingWindow: number, qlens: number[], lens: number[], cacheKind: CacheKind = "f32", softcap = 0, bidirectional = false,
): void {
  const bf16Cache = cacheKind === "bf16";
  const fp8 = cacheKind === "fp8_e4m3" || cacheKind === "fp8_e5m2" ? FP8_FORMAT[cacheKind] : null;
  k.setNumThreads(2);
  const Hq = 6, Hkv = 2, blockSize = 16, maxBlocksPerSeq = 10;
  const S = qlens.length, seqLens = Int32Array.from(lens);
  const queryStart = Int32Array.from([0, ...qlens.map((_, i) => qlens.slice(0, i + 1).reduce((a, b) => a + b, 0))]);
  const T = queryStart[S]!;
  const numBlocks = S * maxBlocksPerSeq;
  const blockTables = new Int32Array(S * maxBlocksPerSeq).fill(-1);
  const ids = Array.from({ length: numBlocks }, (_, i) => i).sort(() => rand() - 0.5);
  let next = 0;
  for (let s = 0; s < S; s++)
    for (let b = 0; b < Math.ceil(seqLens[s]! / blockSize); b++) blockTables[s * maxBlocksPerSeq + b] = ids[next++]!;
  const slotSize = Hkv * D;
  const kCache = randArray(numBlocks * blockSize * slotSize), vCache = randArray(numBlocks * blockSize * slotSize);
  const q = randArray(T * Hq * D), kNew = randArray(T * slotSize), vNew = randArray(T * slotSize);
  const slotOf = (s: number, p: number): number => blockTables[s * maxBlocksPerSeq + Math.floor(p / blockSize)]! * blockSize + (p % blockSize);
  const slotMapping = new Int32Array(T);
  for (let s = 0; s < S; s++)
    for (let j = 0; j < qlens[s]!; j++) slotMapping[queryStart[s]! + j] = slotOf(s, seqLens[s]! - qlens[s]! + j);
  if (T > 3) slotMapping[3] = -1; // skipped write: attention then reads whatever the cache holds there
  // a bf16 cache holds bf16 bits; the kernel reads them exactly and writes new rows rounded to nearest even
  const toBf16 = (x: Float32Array): Uint16Array => {
    const o = new Uint16Array(x.length);
    k.f32ToBf16(x, o, x.length);
    return o;
  };
  const fromBf16 = (x: Uint16Array): Float32Array => {
    const o = new Float32Array(x.length);
    k.bf16ToF32(x, o, x.length);
    return o;
  };
  // an fp8 cache holds fp8 bytes: the TS encoder/decoder of backends/dtype.ts is the reference for both directions
  const toFp8 = (x: Float32Array): Uint8Array => Uint8Array.from(x, (v) => f32ToFp8Bits(v, fp8!));
  const fromFp8 = (x: Uint8Array): Float32Array => Float32Array.from(x, (b) => fp8BitsToF32(b, fp8!));
  const asCache = (x: Float32Array): Float32Array => (bf16Cache ? fromBf16(toBf16(x)) : fp8 ? fromFp8(toFp8(x)) : x.slice());
  const kRef = asCache(kCache), vRef = asCache(vCache);
  for (let t = 0; t < T; t++) {
    if (slotMapping[t]! < 0) continue;
    kRef.set(asCache(kNew.subarray(t * slotSize, (t + 1) * slotSize)), slotMapping[t]! * slotSize);
    vRef.set(asCache(vNew.subarray(t * slotSize, (t + 1) * slotSize)), slotMapping[t]! * slotSize);
  }
  const scale = 1 / Math.sqrt(D);
  const want = new Float64Array(T * Hq * D);
  for (let s = 0; s < S; s++)
    for (let j = 0; j < qlens[s]!; j++) {
      // the last position row j sees: its own (causal) or the sequence's last (bidirectional)
      const t = queryStart[s]! + j, p = bidirectional ? seqLens[s]! - 1 : seqLens[s]! - qlens[s]! + j;
      const lo = slidingWindow ? Math.max(0, p - slidingWindow + 1) : 0;
      for (let h = 0; h < Hq; h++) {
        const kvh = Math.floor(h / (Hq / Hkv));
        const scores: number[] = [];
        for (let c = lo; c <= p; c++) {
          let dot = 0;
          for (let d = 0; d < D; d++) dot += q[(t * Hq + h) * D + d]! * kRef[slotOf(s, c) * slotSize + kvh * D + d]!;
          scores.push(softcap > 0 ? softcap * Math.tanh((dot * scale) / softcap) : dot * scale);
        }
        const m = Math.max(...scores);
        const e = scores.map((v) => Math.exp(v - m));
        const sum = e.reduce((a, b) => a + b, 0);
        for (let c = lo; c <= p; c++)
          for (let d = 0; d < D; d++)
            want[(t * Hq + h) * D + d] += (e[c - lo]! / sum) * vRef[slotOf(s, c) * slotSize + kvh * D + d]!;
      }
    }
  const out = new Float32Array(T * Hq * D);
  const [kC, vC] = bf16Cache ? [toBf16(kCache), toBf16(vCache)] : fp8 ? [toFp8(kCache), toFp8(vCache)] : [kCache, vCache];
  const fp8Format = fp8 === "e4m3fn" ? 1 : fp8 === "e5m2" ? 2 : undefined;
  k.pagedAttention(q, kNew, vNew, kC, vC, slotMapping, blockTables, queryStart, seqLens, out,
    S, Hq, Hkv, D, blockSize, maxBlocksPerSeq, scale, slidingWindow, undefined, undefined, undefined, undefined, undefined, fp8Format, softcap,
    undefined, bidirectional);
  const asF32 = (c: Float32Array | Uint16Array | Uint8Array) => (c instanceof Uint16Array ? fromBf16(c) : c instanceof Uint8Array ? fromFp8(c) : c);
  close(asF32(kC), kRef, () => 0, "kCache written");
  close(asF32(vC), vRef, () => 0, "vCache written");
  // outputs are convex combinations of values in [-1,1]; f32 dot/exp error stays ~1e-6
  close(out, want, () => 2e-6, "attention output");
  const bad = blockTables.slice();
  bad[0] = numBlocks;
  assert.throws(() => k.pagedAttention(q, kNew, vNew, kC, vC, slotMapping, bad, queryStart, seqLens, out,
    S, Hq, Hkv, D, blockSize, maxBlocksPerSeq, scale, slidingWindow, undefined, undefined, undefined, undefined, undefined, fp8Format), /out of range/);
}

/**
 * fp8 caches bit for bit: every one of the 256 codes decodes as backends/dtype.ts decodes it (one key per sequence,
 * so the output is its value row times 1), and new rows are written as its encoder rounds them (nearest even,
 * saturating; e5m2 overflows to inf from 61440 on), edge cases included.
 */
function checkFp8CacheCodes(k: NativeKernels, format: "e4m3fn" | "e5m2"): void {
  const code = format === "e4m3fn" ? 1 : 2;
  const D = 64, Hq = 1, Hkv = 1, blockSize = 16, numBlocks = 4;
  const kC = new Uint8Array(numBlocks * blockSize * D), vC = new Uint8Array(numBlocks * blockSize * D);
  for (let s = 0; s < 4; s++) for (let d = 0; d < D; d++) vC[s * blockSize * D + d] = s * D + d; // codes 0..255
  const out = new Float32Array(4 * D);
  const i32 = (...xs: number[]) => Int32Array.from(xs);
  k.pagedAttention(new Float32Array(4 * D), new Float32Array(4 * D), new Float32Array(4 * D), kC, vC, i32(-1, -1, -1, -1),
    i32(0, 1, 2, 3), i32(0, 1, 2, 3, 4), i32(1, 1, 1, 1), out, 4, Hq, Hkv, D, blockSize, 1, 1, 0,
    undefined, undefined, undefined, undefined, undefined, code);
  for (let c = 0; c < 256; c++) {
    const want = fp8BitsToF32(c, format);
    // (-0 comes out +0: the output row is accumulated from +0)
    assert.ok(out[c] === want || (Number.isNaN(out[c]) && Number.isNaN(want)), `${format} code ${c}: got ${out[c]}, want ${want}`);
  }
  const edge = [0, -0, 1, -1, 0.1, 1 / 3, 447, 448, 449, 464, 480, 500, -1e4, 57344, 59000, 61439, 61440, 1e6, -Infinity, Infinity, NaN,
    2 ** -6, 2 ** -7, 2 ** -9, 2 ** -10, 3 * 2 ** -11, 2 ** -14, 2 ** -16, 2 ** -17, 3 * 2 ** -18, 1e-30, 1.0625, 1.1875, 2.5, 3.5, 240, 248];
  const kNew = new Float32Array(D), vNew = new Float32Array(D);
  edge.forEach((v, i) => (kNew[i] = v));
  randArray(D - edge.length, -300, 300).forEach((v, i) => (kNew[edge.length + i] = v));
  vNew.set(randArray(D, -2, 2));
  k.pagedAttention(new Float32Array(D), kNew, vNew, kC, vC, i32(5), i32(0), i32(0, 1), i32(6), new Float32Array(D), 1, Hq, Hkv, D, blockSize, 1, 1, 0,
    undefined, undefined, undefined, undefined, undefined, code);
  for (let d = 0; d < D; d++) {
    assert.equal(kC[5 * D + d], f32ToFp8Bits(kNew[d]!, format), `${format} key ${kNew[d]} written`);
    assert.equal(vC[5 * D + d], f32ToFp8Bits(vNew[d]!, format), `${format} value ${vNew[d]} written`);
  }
}
