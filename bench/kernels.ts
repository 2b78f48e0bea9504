// Kernel roofline bench: GEMV/GEMM in f32 and bf16 with 1 and 2 threads, compared with this
// run's measured read bandwidth (per thread count) and single-core FMA peak (x threads).
// gemv [1536,576] f32 is 3.5 MB: it fits in L3, so it can exceed the DRAM read bandwidth.
// The "decode batch" rows are x[M,K] @ W[N,K]^T on one SmolLM-135M layer's shapes at continuous-batching
// M, 2 threads; %peak is against 2x this run's single-core FMA peak. The "prefill" rows: M = 512 on the same shapes.
// Usage: npm run bench:kernels [-- --decode-only]   (KILN_NATIVE_ISA=avx2|scalar to bench another path)
import { loadNativeKernels, type NativeKernels } from "../src/backends/cpu/native.js";
import { bandwidthProbe, timeIt } from "./timing.js";

interface Case { name: string; M: number; N: number; K: number }
const cases: Case[] = [
  { name: "gemv [1536,576]", M: 1, N: 1536, K: 576 },
  { name: "gemv [4096,4096]", M: 1, N: 4096, K: 4096 },
  { name: "gemv [14336,4096]", M: 1, N: 14336, K: 4096 },
  { name: "gemm M=8 K=N=2048", M: 8, N: 2048, K: 2048 },
  { name: "gemm M=64 K=N=2048", M: 64, N: 2048, K: 2048 },
  { name: "gemm M=512 K=N=2048", M: 512, N: 2048, K: 2048 },
];

// SmolLM-135M weights [N,K]: q/o proj, gate/up proj, down proj, LM head (tied embedding).
const decodeShapes: { name: string; N: number; K: number }[] = [
  { name: "[576,576]", N: 576, K: 576 },
  { name: "[1536,576]", N: 1536, K: 576 },
  { name: "[576,1536]", N: 576, K: 1536 },
  { name: "[49152,576]", N: 49152, K: 576 },
];
const decodeMs = [1, 8, 32, 64];
const PREFILL_M = 512; // one 512-token prompt: on avx512-bf16, bf16 rows run the vdpbf16ps GEMM (peak 2x the f32 FMA)

/** A matmul's peak relative to the f32 FMA peak: 2 for bf16 weights at M >= bf16DotMinM (vdpbf16ps), else 1. */
function peakFactor(k: NativeKernels, dtype: 0 | 1, M: number): number {
  const minM = k.bf16DotMinM ?? 0;
  return dtype === 1 && minM > 0 && M >= minM ? 2 : 1;
}

function fill(n: number): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = Math.sin(i) * 0.5;
  return a;
}

function decodeBatch(k: NativeKernels, fma: number): void {
  const threads = 2;
  k.setNumThreads(threads);
  console.log(`\ndecode batch: x[M,K] @ W[N,K]^T, ${threads} threads`);
  console.log(["shape [N,K]".padEnd(13), "M".padStart(3), "dtype", "ms".padStart(9), "GFLOP/s".padStart(8), " %peak"].join(" "));
  for (const s of decodeShapes) {
    const wF32 = fill(s.N * s.K);
    const wBf16 = new Uint16Array(s.N * s.K);
    k.f32ToBf16(wF32, wBf16, wF32.length);
    for (const M of decodeMs) {
      const a = fill(M * s.K);
      const out = new Float32Array(M * s.N);
      for (const [dtype, w] of [[1, wBf16], [0, wF32]] as const) {
        const fmaNow = Math.max(fma, k.fmaPeak(1e7));
        // best of 3 spaced-out timings: a neighbour's burst on a shared 2-core machine halves a 2-thread row
        const run = (): void => k.matmul(a, w, out, M, s.N, s.K, true, dtype, 1, 0, 0, 0);
        const ms = Math.min(timeIt(run, 100), timeIt(run, 100), timeIt(run, 100));
        const gflops = (2 * M * s.N * s.K / 1e9) / (ms / 1e3);
        console.log([s.name.padEnd(13), String(M).padStart(3), (dtype ? "bf16" : "f32").padEnd(5), ms.toFixed(3).padStart(9),
          gflops.toFixed(1).padStart(8), `${(100 * gflops / (fmaNow * threads * peakFactor(k, dtype, M))).toFixed(0)}%`.padStart(6)].join(" "));
      }
    }
  }
}

/** x[512,K] @ W[N,K]^T on SmolLM-135M's layer shapes, 2 threads; %peak against the dtype's peak on this table. */
function prefill(k: NativeKernels, fma: number): void {
  const threads = 2;
  k.setNumThreads(threads);
  const dotPeak = peakFactor(k, 1, PREFILL_M);
  console.log(`\nprefill: x[${PREFILL_M},K] @ W[N,K]^T, ${threads} threads (bf16 peak ${dotPeak}x f32's: ${dotPeak > 1 ? "vdpbf16ps, x rounded to bf16" : "exact f32"})`);
  for (const s of decodeShapes.slice(0, 3)) {
    const wF32 = fill(s.N * s.K);
    const wBf16 = new Uint16Array(s.N * s.K);
    k.f32ToBf16(wF32, wBf16, wF32.length);
    const a = fill(PREFILL_M * s.K);
    const out = new Float32Array(PREFILL_M * s.N);
    for (const [dtype, w] of [[1, wBf16], [0, wF32]] as const) {
      const fmaNow = Math.max(fma, k.fmaPeak(1e7));
      const run = (): void => k.matmul(a, w, out, PREFILL_M, s.N, s.K, true, dtype, 1, 0, 0, 0);
      const ms = Math.min(timeIt(run, 100), timeIt(run, 100), timeIt(run, 100));
      const gflops = (2 * PREFILL_M * s.N * s.K / 1e9) / (ms / 1e3);
      const peak = fmaNow * threads * (dtype ? dotPeak : 1);
      console.log([s.name.padEnd(13), (dtype ? "bf16" : "f32").padEnd(5), ms.toFixed(3).padStart(9), gflops.toFixed(1).padStart(8),
        `${(100 * gflops / peak).toFixed(0)}%`.padStart(6)].join(" "));
    }
  }
}

function main(): void {
  const k: NativeKernels = loadNativeKernels();
  if (process.argv.includes("--decode-only")) {
    const fma = Math.max(k.fmaPeak(3e7), k.fmaPeak(3e7));
    console.log(`isa ${k.isa}; FMA peak (1 core) ${fma.toFixed(1)} GFLOP/s`);
    decodeBatch(k, fma);
    return;
  }
  const pct = (x: number): string => `${(100 * x).toFixed(0)}%`.padStart(5);
  const probe = bandwidthProbe(k);
  const fma = Math.max(k.fmaPeak(3e7), k.fmaPeak(3e7));
  const bw: Record<number, number> = {};
  for (const t of [1, 2]) {
    k.setNumThreads(t);
    bw[t] = Math.max(k.memoryReadBandwidth(probe, 4, t), k.memoryReadBandwidth(probe, 4, t));
  }
  console.log(`isa ${k.isa}; FMA peak (1 core) ${fma.toFixed(1)} GFLOP/s; read bandwidth 1T ${bw[1]!.toFixed(1)} GB/s, 2T ${bw[2]!.toFixed(1)} GB/s`);
  console.log(["case".padEnd(22), "dtype", "thr", "ms".padStart(9), "GB/s".padStart(7), "GFLOP/s".padStart(8), " %BW", " %peak"].join(" "));
  for (const c of cases) {
    const a = fill(c.M * c.K);
    const wF32 = fill(c.N * c.K);
    const wBf16 = new Uint16Array(c.N * c.K);
    k.f32ToBf16(wF32, wBf16, wF32.length);
    const out = new Float32Array(c.M * c.N);
    for (const [dtype, w] of [[0, wF32], [1, wBf16]] as const) {
      for (const t of [1, 2]) {
        k.setNumThreads(t);
        // Re-probe next to each row: on a shared 2-core machine, neighbours' load drifts quickly,
        // and a ratio is only meaningful against a roofline measured at the same moment.
        const bwNow = k.memoryReadBandwidth(probe, 2, t);
        const fmaNow = k.fmaPeak(1e7);
        const ms = timeIt(() => k.matmul(a, w, out, c.M, c.N, c.K, true, dtype, 1, 0, 0, 0));
        const rowBw = Math.max(bwNow, k.memoryReadBandwidth(probe, 2, t));
        const rowFma = Math.max(fmaNow, k.fmaPeak(1e7));
        const gbs = (w.byteLength / 1e9) / (ms / 1e3);
        const gflops = (2 * c.M * c.N * c.K / 1e9) / (ms / 1e3);
        console.log([c.name.padEnd(22), (dtype ? "bf16" : "f32").padEnd(5), String(t).padStart(3), ms.toFixed(3).padStart(9),
          gbs.toFixed(1).padStart(7), gflops.toFixed(1).padStart(8), pct(gbs / rowBw), pct(gflops / (rowFma * t * peakFactor(k, dtype, c.M)))].join(" "));
      }
    }
  }
  decodeBatch(k, fma);
  prefill(k, fma);
}

main();
