// compile() benchmark: eager vs compiled for a fused elementwise chain on 1M elements and a tiny gated
// MLP, and cold (C compiler) vs warm (disk cache) program build time.
// Run: npx tsc -p . && node dist/bench/compile.js
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k from "../src/tensor/index.js";
import { compile, compileCacheStats, jitUnavailableReason, linear, rmsNorm, siluMul } from "../src/compile/index.js";
import { forgetLoaded } from "../src/compile/cache.js";

process.env.KILN_CACHE_DIR = mkdtempSync(join(tmpdir(), "kiln-bench-compile-"));

type T = any; // eslint-disable-line @typescript-eslint/no-explicit-any -- runs on Tensor and Sym alike
const chain = (x: T, y: T): T => x.mul(1.5).add(y).sub(0.25).tanh().mul(x).add(1).relu().mul(0.5).sigmoid();
const mlp = (x: T, wg: T, wu: T, wd: T, wn: T): T => linear(siluMul(linear(rmsNorm(x, wn, 1e-5), wg), linear(rmsNorm(x, wn, 1e-5), wu)), wd).add(x);

function time(fn: () => k.Tensor, iters: number): number {
  fn().dispose();
  const t0 = performance.now();
  for (let i = 0; i < iters; i++) {
    const out = fn();
    out.dataSync();
    out.dispose();
  }
  return (performance.now() - t0) / iters;
}

function disposeAll(f: () => k.Tensor): () => k.Tensor {
  return f;
}

const N = 1 << 20;
const x = k.randn([N]);
const y = k.randn([N]);
console.log(`device: ${k.defaultDevice().backend.describe()}; jit: ${jitUnavailableReason() ?? "available"}`);
const chainC = compile((a, b) => chain(a, b));
const tCold0 = performance.now();
chainC(x, y);
const coldMs = performance.now() - tCold0;
const eagerChain = time(disposeAll(() => chain(x, y)), 10);
const compiledChain = time(() => chainC(x, y) as k.Tensor, 10);
console.log(`elementwise chain (9 ops, 1M f32): eager ${eagerChain.toFixed(2)} ms, compiled ${compiledChain.toFixed(2)} ms (${(eagerChain / compiledChain).toFixed(1)}x), fused kernels ${chainC.lastInfo?.fusedKernels}`);

const D = 256;
const F = 512;
const xs = k.randn([8, D]);
const wg = k.randn([F, D]).mul(0.05);
const wu = k.randn([F, D]).mul(0.05);
const wd = k.randn([D, F]).mul(0.05);
const wn = k.randn([D]);
const mlpC = compile((a) => mlp(a, wg, wu, wd, wn));
mlpC(xs);
const eagerMlp = time(() => mlp(xs, wg, wu, wd, wn), 50);
const compiledMlp = time(() => mlpC(xs) as k.Tensor, 50);
const info = mlpC.lastInfo!;
console.log(`tiny MLP [8x${D}] -> ${F} -> ${D}: eager ${eagerMlp.toFixed(3)} ms, compiled ${compiledMlp.toFixed(3)} ms (${(eagerMlp / compiledMlp).toFixed(2)}x); ${info.fusedKernels} fused + ${info.opaqueKernels} back-end kernels, arena ${info.arenaBytes} B (unplanned ${info.naiveBytes} B)`);

// warm: a new compile() of the same function in a "fresh process" (loaded libraries forgotten) hits the disk cache
forgetLoaded();
const warm = compile((a, b) => chain(a, b));
const tWarm0 = performance.now();
warm(x, y);
const warmMs = performance.now() - tWarm0;
console.log(`program build incl. first run: cold ${coldMs.toFixed(1)} ms (C compile ${compileCacheStats().compileMs.toFixed(1)} ms total), warm from disk cache ${warmMs.toFixed(1)} ms; cache ${JSON.stringify(compileCacheStats())}`);
