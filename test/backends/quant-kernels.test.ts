// Quantized matmul kernels (native/quant-impl.inc) vs the TS reference (src/backends/cpu/quant-reference.ts).
// Bound: the kernel rounds each activation row to xq * xs with |x - xq*xs| <= xs/2, so against the dequantized
// weight Wdq its error is at most (xs/2) * sum_k |Wdq[n,k]| (+ f32 rounding). The parent runs the suite per ISA
// (scalar loops, AVX2, AVX-512 VNNI) in child processes with KILN_NATIVE_ISA set.
import { test } from "node:test";
import assert from "node:assert/strict";
import type { QuantScheme } from "../../src/backends/backend.js";
import { tryLoadNativeKernels, type NativeKernels } from "../../src/backends/cpu/native.js";
import {
  dequantizeRef, isGroupScheme, nativeQuantCode, nativeTakesScheme, newQuantScales, quantDataBytes, quantMatmulRef, quantizeActivationsRef,
  quantizeWeightsRef,
} from "../../src/backends/cpu/quant-reference.js";
import { runIsaChildren, supportedIsas } from "../helpers/isa-children.js";
import { mulberry32 } from "../../src/util/random.js";

const k = tryLoadNativeKernels();
const childIsa = process.env.KILN_QUANT_TEST_CHILD ? process.env.KILN_NATIVE_ISA : undefined;

const rand = mulberry32(4242); // deterministic inputs so failures reproduce
function randn(n: number, scale = 1): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = scale * Math.sqrt(-2 * Math.log(Math.max(rand(), 1e-12))) * Math.cos(2 * Math.PI * rand());
  return a;
}

function nativeQuantize(k: NativeKernels, scheme: QuantScheme, w: Float32Array, n: number, kk: number) {
  if (scheme === "iq4_nl") return quantizeWeightsRef(scheme, w, n, kk); // no native quantizer: GGUF IQ4_NL blocks
  const data = new Uint8Array(quantDataBytes(scheme, n, kk));
  const scales = newQuantScales(scheme, n, kk);
  const rowSums = new Int32Array(scheme === "int8" ? n : 0);
  k.quantizeWeights(w, n, kk, nativeQuantCode(scheme), data, scales, rowSums);
  return { data, scales, rowSums };
}

if (!childIsa) {
  test("quantized kernels: every supported ISA", { skip: k ? false : "native addon not built", timeout: 120_000 }, () => {
    runIsaChildren(import.meta.url, supportedIsas(k!, { bf16: false, amxOff: true }), "KILN_QUANT_TEST_CHILD");
  });
} else {
  runSuite(k!, childIsa);
}

function runSuite(k: NativeKernels, isa: string): void {
  // VNNI with the AVX-512 tables; vpmaddubsw (AVX2) with any other vector table, an AVX-512 CPU without VNNI included
  test(`[${isa}] quant table`, () =>
    assert.equal(k.quantIsa, isa.startsWith("avx512") && k.features().avx512vnni ? "avx512-vnni" : isa === "scalar" ? "scalar" : "avx2"));
  test(`[${isa}] AMX is off when KILN_AMX=0`, { skip: process.env.KILN_AMX === "0" ? false : "AMX not turned off here" }, () =>
    assert.equal(k.features().amx ?? false, false));

  // int8_g32 (GGUF Q8_0 blocks) needs an addon that takes scheme code 3
  const skipScheme = (s: QuantScheme) => (nativeTakesScheme(k, s) ? false : "addon rejects this scheme code");
  for (const scheme of ["int8", "int4", "fp8", "int8_g32", "mxfp4"] as const) {
    test(`[${isa}] ${scheme} weight quantization matches the reference`, { skip: skipScheme(scheme) }, () => {
      const n = 37;
      const kk = 192;
      const w = randn(n * kk, 0.05);
      const a = nativeQuantize(k, scheme, w, n, kk);
      const b = quantizeWeightsRef(scheme, w, n, kk);
      assert.deepEqual(a.data, b.data);
      assert.deepEqual(a.scales, b.scales);
      assert.deepEqual(a.rowSums, b.rowSums);
      // the dequantized weight is close to the original: |w - wdq| <= step/2 per element
      const dq = dequantizeRef(scheme, b, n, kk);
      let maxErr = 0;
      for (let i = 0; i < w.length; i++) maxErr = Math.max(maxErr, Math.abs(w[i]! - dq[i]!));
      const bound = { int8: 0.003, int8_g32: 0.003, fp8: 0.02, int4: 0.03, mxfp4: 0.05 }[scheme]; // mxfp4: <= amax/4 of a group
      assert.ok(maxErr < bound, `${scheme} weight error ${maxErr}`);
    });
  }

  for (const threads of [1, 2]) {
    for (const scheme of ["int8", "int4", "fp8", "int8_g32", "mxfp4", "iq4_nl"] as const) {
      test(`[${isa}] ${scheme} quantMatmul, M = 1..130, ${threads} thread(s)`, { skip: skipScheme(scheme) }, () => {
        k.setNumThreads(threads);
        // VNNI batched tiles (native/quant-tiles.inc): rows of x in blocks of 16 (a last block of <= 4 / <= 8 rows
        // reads 16 / 8 bytes of k per row and step), 12 (int8) or 6 / 12 (groups) weight rows per tile, then 4s and
        // 1s; K = 1536 / 2050 with M >= 64 takes several passes over x. N = 67, 29, 13 leave partial tiles. Where AMX
        // runs (quant-amx.inc), int8 at M >= 16 and int8 group-32 at M >= 128 with K % 64 == 0 take it: odd numbers of
        // 16-row blocks of x and of weight blocks (N = 67, 29), partial last blocks (M = 33, 130). AVX2's group-32
        // schemes at M > 4 slice K into panels of 3072 (unsigned codes: int4, mxfp4) or 2048 elements (signed: int8
        // group-32, iq4_nl; quant-panel.inc kCodesPanelBytes): K = 3200 takes two.
        const shapes: [number, number][] = isGroupScheme(scheme)
          ? [[33, 64], [8, 128], [67, 576], [13, 320], [29, 1536], [5, 3200]]
          : [[33, 17], [8, 100], [67, 576], [13, 129], [5, 1000], [29, 2050], [29, 128]];
        const ms = [1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 31, 32, 33, 64, 65, 70, 128, 130];
        for (const [n, kk] of shapes) {
          const w = randn(n * kk, 0.05);
          const q = nativeQuantize(k, scheme, w, n, kk);
          const wdq = dequantizeRef(scheme, q, n, kk);
          for (const m of ms) {
            const x = randn(m * kk);
            const out = new Float32Array(m * n);
            k.quantMatmul(x, q.data, q.scales, q.rowSums, out, m, n, kk, nativeQuantCode(scheme));
            const ref = quantMatmulRef(scheme, x, q, m, n, kk);
            const { xs } = quantizeActivationsRef(x, m, kk);
            for (let r = 0; r < m; r++)
              for (let c = 0; c < n; c++) {
                let exact = 0;
                let absSum = 0;
                let wAbs = 0;
                for (let i = 0; i < kk; i++) {
                  exact += x[r * kk + i]! * wdq[c * kk + i]!;
                  absSum += Math.abs(x[r * kk + i]! * wdq[c * kk + i]!);
                  wAbs += Math.abs(wdq[c * kk + i]!);
                }
                const got = out[r * n + c]!;
                const fp = 2e-6 * absSum + 1e-7;
                // same arithmetic as the reference, up to f32 rounding
                assert.ok(Math.abs(got - ref[r * n + c]!) <= fp, `${scheme} M=${m} N=${n} K=${kk} [${r},${c}]: ${got} vs reference ${ref[r * n + c]}`);
                // the derived activation-quantization bound against the dequantized weight (0 for fp8: f32 x)
                const bound = (scheme === "fp8" ? 0 : (xs[r]! / 2) * wAbs) + fp;
                assert.ok(Math.abs(got - exact) <= bound, `${scheme} M=${m} [${r},${c}]: |${got} - ${exact}| > ${bound}`);
              }
          }
        }
      });
    }
  }

  // Codes at both ends of int8: -128 (which llama.cpp's and Kiln's quantizers never write, but a GGUF Q8_0 file may
  // hold) has no positive counterpart, so a kernel that flips a weight's sign (AVX2's vpsignb) must not flip it; x
  // with a maximal element in every group puts activation codes at +-127. Each output is an integer dot product
  // times scales: checked against the reference's exact sums.
  for (const scheme of ["int8", "int8_g32"] as const) {
    test(`[${isa}] ${scheme} weights holding codes -128 and 127`, { skip: skipScheme(scheme) }, () => {
      const n = 13, kk = 320;
      const codes = new Int8Array(n * kk);
      for (let i = 0; i < codes.length; i++) codes[i] = i % 3 === 0 ? -128 : i % 3 === 1 ? 127 : Math.floor(rand() * 256) - 128;
      const scales = newQuantScales(scheme, n, kk);
      if (scales instanceof Float32Array) scales.fill(0.01);
      else scales.fill(0x211f); // f16 ~0.01
      const rowSums = new Int32Array(scheme === "int8" ? n : 0);
      for (let r = 0; r < rowSums.length; r++) for (let i = 0; i < kk; i++) rowSums[r]! += codes[r * kk + i]!;
      const q = { data: new Uint8Array(codes.buffer), scales, rowSums };
      for (const m of [1, 2, 3, 5, 8, 33]) {
        const x = randn(m * kk);
        for (let r = 0; r < m; r++) for (let g = 0; g < kk; g += 32) x[r * kk + g + (g % 7)] = (g % 64 ? -1 : 1) * 8; // |x| max: code +-127
        const out = new Float32Array(m * n);
        k.quantMatmul(x, q.data, q.scales, q.rowSums, out, m, n, kk, nativeQuantCode(scheme));
        const ref = quantMatmulRef(scheme, x, q, m, n, kk);
        for (let i = 0; i < m * n; i++)
          assert.ok(Math.abs(out[i]! - ref[i]!) <= 1e-5 * Math.max(1, Math.abs(ref[i]!)), `${scheme} M=${m} [${i}]: ${out[i]} vs ${ref[i]}`);
      }
    });
  }

  test(`[${isa}] the decode tuning changes no result, and is checked`, { skip: k.decodeTuning ? false : "older addon" }, () => {
    const dt = k.decodeTuning!;
    const initial = dt();
    // chosen for the CPU at load (native/thread-pool.h DecodeTuning): Zen 4's setting (and every other CPU's) or Zen 5's
    const zen4 = { quantAhead: 1536, gemvAhead: 1024, prefetchIntoL1: false, handOverMinBytes: 0 };
    const zen5 = { quantAhead: 2048, gemvAhead: 1024, prefetchIntoL1: true, handOverMinBytes: 4 << 20 };
    assert.ok([zen4, zen5].some((d) => JSON.stringify(d) === JSON.stringify(initial)), JSON.stringify(initial));
    k.setNumThreads(2);
    // M = 1 products on the stream tiles (int8, int4, int8 group-32, mxfp4, iq4_nl; f32 and bf16 weights), split between two
    // threads: a prefetch only moves lines and the split only moves rows between the threads, so every setting gives
    // the same bits, including distances past the weights' end (prefetches of any address never fault)
    const n = 301, kk = 576;
    const w = randn(n * kk, 0.05), x = randn(kk);
    const wbf = new Uint16Array(n * kk);
    for (let i = 0; i < wbf.length; i++) wbf[i] = new Uint32Array(Float32Array.of(w[i]!).buffer)[0]! >>> 16;
    const products = (["int8", "int4", "int8_g32", "mxfp4", "iq4_nl"] as const).filter((s) => nativeTakesScheme(k, s)).map((scheme) => {
      const q = nativeQuantize(k, scheme, w, n, kk);
      return () => {
        const out = new Float32Array(n);
        k.quantMatmul(x, q.data, q.scales, q.rowSums, out, 1, n, kk, nativeQuantCode(scheme));
        return out;
      };
    });
    for (const [b, dtype] of [[w, 0], [wbf, 1]] as const)
      products.push(() => {
        const out = new Float32Array(n);
        k.matmul(x, b, out, 1, n, kk, true, dtype, 1, 0, 0, 0);
        return out;
      });
    const want = products.map((f) => f());
    try {
      for (const setting of [
        { quantAhead: 4096, gemvAhead: 3072, prefetchIntoL1: !initial.prefetchIntoL1, handOverMinBytes: 0 },
        { quantAhead: 0, gemvAhead: 65536, prefetchIntoL1: initial.prefetchIntoL1, handOverMinBytes: 2 ** 40 },
      ]) {
        assert.deepEqual(dt(setting), setting);
        for (let rep = 0; rep < 3; rep++) // runRows' cut moves with each run's timing
          products.forEach((f, i) => assert.deepEqual(f(), want[i], `product ${i} under ${JSON.stringify(setting)}`));
      }
      // the fields given are set, the others kept
      assert.deepEqual(dt({ handOverMinBytes: 1 }), { quantAhead: 0, gemvAhead: 65536, prefetchIntoL1: initial.prefetchIntoL1, handOverMinBytes: 1 });
      for (const bad of [{ quantAhead: -64 }, { gemvAhead: 1.5 }, { quantAhead: 65600 }, { prefetchIntoL1: 1 }, { handOverMinBytes: -1 }, { handOverMinBytes: 2 ** 53 }])
        assert.throws(() => dt(bad as never), /\[decodeTuning\] (quantAhead|gemvAhead|prefetchIntoL1|handOverMinBytes) must be/);
      // a bad field sets nothing, not even the good fields given with it
      assert.throws(() => dt({ quantAhead: 512, prefetchIntoL1: 0 } as never), /prefetchIntoL1 must be a boolean/);
      assert.equal(dt().quantAhead, 0);
      assert.throws(() => dt(7 as never), /\[decodeTuning\] setting must be an object/);
    } finally {
      dt(initial);
    }
    assert.deepEqual(dt(), initial);
  });

  test(`[${isa}] argument checks`, () => {
    const x = new Float32Array(64);
    assert.throws(() => k.quantMatmul(x, new Uint8Array(10), new Uint16Array(2), new Int32Array(0), new Float32Array(1), 1, 1, 48, 1), /multiple of 64/);
    assert.throws(() => k.quantMatmul(x, new Uint8Array(10), new Float32Array(1), new Int32Array(1), new Float32Array(1), 1, 1, 64, 0), /RangeError|needs/);
  });
}
