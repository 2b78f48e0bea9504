// Kernel roofline bench: GEMV/GEMM in f32 and bf16 with 1 and 2 threads, compared with this
// run's measured read bandwidth (per thread count) and single-core FMA peak (x threads).
// gemv [1536,576] f32 is 3.5 MB: it fits in L3, so it can exceed the DRAM read bandwidth.
// Usage: npm run bench:kernels   (KILN_NATIVE_ISA=avx2|scalar to bench another path)
import { loadNativeKernels, type NativeKernels } from "../src/backends/cpu/native.js";
import { timeIt } from "./timing.js";

interface Case { name: string; M: number; N: number; K: number }
const cases: Case[] = [
  { name: "gemv [1536,576]", M: 1, N: 1536, K: 576 },
  { name: "gemv [4096,4096]", M: 1, N: 4096, K: 4096 },
  { name: "gemv [14336,4096]", M: 1, N: 14336, K: 4096 },
  { name: "gemm M=8 K=N=2048", M: 8, N: 2048, K: 2048 },
  { name: "gemm M=64 K=N=2048", M: 64, N: 2048, K: 2048 },
  { name: "gemm M=512 K=N=2048", M: 512, N: 2048, K: 2048 },
];


function fill(n: number): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = Math.sin(i) * 0.5;
  return a;
}

function main(): void {
  const k: NativeKernels = loadNativeKernels();
  const pct = (x: number): string => `${(100 * x).toFixed(0)}%`.padStart(5);
  const probe = fill(64 << 20); // 256 MiB: far beyond the caches
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
          gbs.toFixed(1).padStart(7), gflops.toFixed(1).padStart(8), pct(gbs / rowBw), pct(gflops / (rowFma * t))].join(" "));
      }
    }
  }
}

main();
