// Quantized matmul bench (native/quant-impl.inc, quant-tiles.inc, quant-q4k.inc, quant-q6k.inc, quant-mxfp4.inc):
// int8 / int4 / int8_g32 (Q8_0) / q4_k (Q4_K) / q5_k (Q5_K) / q6_k (Q6_K) / mxfp4 weights x f32 activations on SmolLM-135M's
// layer shapes and two of Llama-3.2-1B's (q4_k and q6_k take in_features % 256 == 0 only: SmolLM's down and the 1B
// ones), for M = 1 (decode GEMV),
// 8 / 32 (batched decode) and 128 / 512 (prefill). GOP/s = 2 * M * N * K / time, against this run's measured vpdpbusd
// peak on the same threads (k.quantDotPeak), and for M = 1 the weight read rate against the measured read bandwidth
// (shapes that fit the L2/L3 stay there across calls and read faster than DRAM; this VM's L3 holds even the 28 MB LM
// head, so %BW above 100 means cache-resident, not a bad probe). A busy neighbour core shows
// as a lower peak measured after the rows (reported); compare runs whose peaks agree.
// Usage: node dist/bench/quant-kernels.js [--threads=1,2] [--schemes=int8,int4,int8_g32,q4_k,q5_k,q6_k,mxfp4,iq4_nl,fp8] [--ms=1,8,32,128,512]
//        (KILN_NATIVE_ISA=scalar to bench the portable path)
import { loadNativeKernels, type NativeKernels } from "../src/backends/cpu/native.js";
import { quantizeQ4kRef } from "../src/backends/cpu/q4k-reference.js";
import { quantizeQ6kRef } from "../src/backends/cpu/q6k-reference.js";
import { nativeQuantCode, nativeTakesScheme, newScales, quantDataBytes, quantKMultiple, quantScaleCount, quantizeWeightsRef } from "../src/backends/cpu/quant-reference.js";
import type { QuantScheme } from "../src/backends/backend.js";
import { bandwidthProbe, timeIt } from "./timing.js";

const shapes = [
  { name: "q/o [576,576]", N: 576, K: 576 },
  { name: "gate/up [1536,576]", N: 1536, K: 576 },
  { name: "down [576,1536]", N: 576, K: 1536 },
  { name: "lm_head [49152,576]", N: 49152, K: 576 },
  { name: "1B q/o [2048,2048]", N: 2048, K: 2048 },
  { name: "1B gate/up [8192,2048]", N: 8192, K: 2048 },
];

const arg = (name: string, dflt: string) => (process.argv.find((a) => a.startsWith(`--${name}=`))?.split("=")[1] ?? dflt).split(",");
const threadsList = arg("threads", "1,2").map(Number);
const schemes = arg("schemes", "int8,int4,int8_g32,q4_k,mxfp4") as QuantScheme[];
const ms = arg("ms", "1,8,32,128,512").map(Number);

// quantDotPeak is the quant table's vpdpbusd peak (native/quant.h)
const k = loadNativeKernels() as NativeKernels & { quantDotPeak?: (iterations: number, threads: number) => number };
const fill = (n: number) => Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37) * 0.5);
const probe = bandwidthProbe(k);
const pad = (s: string | number, n: number) => String(s).padStart(n);

console.log(`isa ${k.isa}, quant ${k.quantIsa}`);
for (const t of threadsList) {
  k.setNumThreads(t);
  const peak = k.quantDotPeak ? Math.max(...[0, 1, 2].map(() => k.quantDotPeak!(1e7, t))) : 0;  // first call wakes the pool
  const bw = Math.max(...[0, 1, 2].map(() => k.memoryReadBandwidth(probe, 2, t))); // best of 3, as bench/serving
  console.log(`\n${t} thread(s): vpdpbusd peak ${peak.toFixed(0)} GOP/s, read bandwidth ${bw.toFixed(1)} GB/s; GOP/s (% of peak), M = 1 also GB/s (% of bandwidth)`);
  console.log(["shape".padEnd(20), "scheme".padEnd(8), ...ms.map((m) => pad(`M=${m}`, m === 1 ? 25 : 12))].join(" "));
  for (const s of shapes) {
    const w = fill(s.N * s.K);
    for (const scheme of schemes.filter((sc) => nativeTakesScheme(k, sc) && s.K % quantKMultiple(sc) === 0)) {
      let data: Uint8Array = new Uint8Array(quantDataBytes(scheme, s.N, s.K));
      let scales = newScales(scheme, quantScaleCount(scheme, s.N, s.K));
      const rs = new Int32Array(s.N);
      const code = nativeQuantCode(scheme);
      if (scheme === "q4_k" || scheme === "q5_k") ({ data, scales } = quantizeQ4kRef(w, s.N, s.K, scheme === "q4_k" ? 4 : 5)); // no native k-quant quantizer
      else if (scheme === "q6_k") ({ data, scales } = quantizeQ6kRef(w, s.N, s.K));
      else if (scheme === "iq4_nl") ({ data, scales } = quantizeWeightsRef(scheme, w, s.N, s.K)); // GGUF blocks: no native quantizer
      else k.quantizeWeights(w, s.N, s.K, code, data, scales, rs);
      const bytes = data.byteLength + scales.byteLength + (scheme === "int8" ? rs.byteLength : 0);
      const cells = ms.map((m) => {
        const x = fill(m * s.K);
        const out = new Float32Array(m * s.N);
        const ms_ = timeIt(() => k.quantMatmul(x, data, scales, rs, out, m, s.N, s.K, code));
        const gops = (2 * m * s.N * s.K) / 1e6 / ms_;
        const cell = `${pad(gops.toFixed(0), 5)} ${peak > 0 ? pad(`(${((100 * gops) / peak).toFixed(0)}%)`, 6) : ""}`;
        if (m !== 1) return pad(cell, 12);
        const gbs = bytes / 1e6 / ms_;
        return pad(`${cell} ${pad(gbs.toFixed(1), 5)} ${pad(`(${((100 * gbs) / bw).toFixed(0)}%)`, 6)}`, 25);
      });
      console.log([s.name.padEnd(20), scheme.padEnd(8), ...cells].join(" "));
    }
  }
  // a neighbour that took a core meanwhile shows as a lower peak now: rerun then
  const after = k.quantDotPeak ? Math.max(k.quantDotPeak(1e7, t), k.quantDotPeak(1e7, t)) : 0;
  if (after < 0.9 * peak) console.log(`(peak now ${after.toFixed(0)} GOP/s: the machine got busier, numbers above are low)`);
}
