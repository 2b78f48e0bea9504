// Quantized kernel roofline bench: int8 / int4 / fp8 / int8_g32 (Q8_0) weight GEMV/GEMM (native/quant-impl.inc) next to bf16 on the
// same shapes, 1 and 2 threads, against this run's read bandwidth (re-probed per row: neighbours' load drifts).
// Usage: node dist/bench/quant-kernels.js   (KILN_NATIVE_ISA=scalar to bench the portable path)
import { loadNativeKernels } from "../src/backends/cpu/native.js";
import { isGroupScheme, nativeQuantCode, nativeTakesScheme, quantDataBytes, quantScaleCount } from "../src/backends/cpu/quant-reference.js";
import type { QuantScheme } from "../src/backends/backend.js";
import { timeIt } from "./timing.js";

const cases = [
  { name: "gemv [1536,576]", M: 1, N: 1536, K: 576 },
  { name: "gemv [4096,4096]", M: 1, N: 4096, K: 4096 },
  { name: "gemv [8192,2048]", M: 1, N: 8192, K: 2048 },
  { name: "gemm M=8 [2048,2048]", M: 8, N: 2048, K: 2048 },
  { name: "gemm M=32 [2048,2048]", M: 32, N: 2048, K: 2048 },
  { name: "gemm M=512 [2048,2048]", M: 512, N: 2048, K: 2048 },
];

const fill = (n: number) => Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37) * 0.5);

const k = loadNativeKernels();
const probe = fill(64 << 20);
console.log(`isa ${k.isa}, quant ${k.quantIsa}`);
console.log(["case".padEnd(24), "dtype", "thr", "ms".padStart(8), "GB/s".padStart(7), "GOP/s".padStart(7), " %BW", "vs bf16"].join(" "));
for (const c of cases) {
  const x = fill(c.M * c.K);
  const w = fill(c.N * c.K);
  const out = new Float32Array(c.M * c.N);
  const bf = new Uint16Array(c.N * c.K);
  k.f32ToBf16(w, bf, w.length);
  for (const t of [1, 2]) {
    k.setNumThreads(t);
    const bfMs = timeIt(() => k.matmul(x, bf, out, c.M, c.N, c.K, true, 1, 1, 0, 0, 0));
    const rows: [string, number, number][] = [["bf16", bfMs, bf.byteLength]];
    for (const scheme of (["int8", "int4", "fp8", "int8_g32"] as QuantScheme[]).filter((s) => nativeTakesScheme(k, s) && (!isGroupScheme(s) || c.K % 64 === 0))) {
      const data = new Uint8Array(quantDataBytes(scheme, c.N, c.K));
      const ns = quantScaleCount(scheme, c.N, c.K);
      const scales = isGroupScheme(scheme) ? new Uint16Array(ns) : new Float32Array(ns);
      const rs = new Int32Array(c.N);
      const code = nativeQuantCode(scheme);
      k.quantizeWeights(w, c.N, c.K, code, data, scales, rs);
      const ms = timeIt(() => k.quantMatmul(x, data, scales, rs, out, c.M, c.N, c.K, code));
      rows.push([scheme, ms, data.byteLength + scales.byteLength + (scheme === "int8" ? rs.byteLength : 0)]);
    }
    const bw = k.memoryReadBandwidth(probe, 2, t);
    for (const [dtype, ms, bytes] of rows) {
      const gbs = bytes / 1e6 / ms;
      console.log([c.name.padEnd(24), dtype.padEnd(5), String(t).padStart(3), ms.toFixed(3).padStart(8), gbs.toFixed(1).padStart(7),
        ((2 * c.M * c.N * c.K) / 1e6 / ms).toFixed(0).padStart(7), `${((100 * gbs) / bw).toFixed(0)}%`.padStart(4), `${(bfMs / ms).toFixed(2)}x`.padStart(7)].join(" "));
    }
  }
}
