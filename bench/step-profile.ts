// Where a decode step's time goes: the fused batch-1 step graph of the SmolLM-135M-shaped model (--model 1b: the
// Llama-1B-shaped one) replayed kernel by kernel with a native timer around each (best of --reps per kernel, so a
// shared machine's preemptions mostly drop out, and the median, whose sum is the fairer match for a whole step: one
// replay does not get every kernel at its best), summed per kernel name, next to the best and median of execute()
// (host work included) and of whole replays timed kernel by kernel on this thread (the sum of medians still
// undercounts those: measured 3.49 vs 3.78 ms for int8). bf16 reads the bf16 safetensors; int8, int4 and mxfp4 the
// Q8_0, Q4_0 and MXFP4 GGUF exports.
// Usage: npm run bench:profile [-- --model smollm|1b] [--format bf16|int8|int8-row|fp8|int4|mxfp4] [--reps 20] [--batch 1]
//   [--position 60] [--list]
import { nativeTakesScheme } from "../src/backends/cpu/quant-reference.js";
import { tryLoadNativeKernels } from "../src/backends/cpu/native.js";
import type { ScheduledBatch } from "../src/engine/model-runner.js";
import { createServingSetupSync } from "../src/engine/serving.js";
import { BENCH_MODELS, benchGguf, benchModelDir, decodeBytes, decodeProducts, decodeReads } from "./bench-models.js";
import { bandwidthProbe } from "./timing.js";

const option = (name: string, dflt: string): string => {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1]! : dflt;
};
const modelKey = option("--model", "smollm");
const preset = BENCH_MODELS[modelKey];
if (preset === undefined)
  throw new Error(`--model must be one of ${Object.keys(BENCH_MODELS).join(", ")}, got ${modelKey}`);
const format = option("--format", "bf16");
// the bench's GGUF exports (one file for Kiln and llama.cpp): int8 -> Q8_0, int4 -> Q4_0, mxfp4 -> MXFP4
// int8-row: the f32 weights quantized on load to per-channel int8 (--quantization int8, one scale per row); fp8: to
// e4m3 with a scale per row (--quantization fp8)
const GGUF = { int8: "Q8_0", int4: "Q4_0", mxfp4: "MXFP4" } as const;
const onLoad = format === "int8-row" ? "int8" : format === "fp8" ? "fp8" : null; // --quantization of the f32 weights
if (format !== "bf16" && onLoad === null && !Object.hasOwn(GGUF, format))
  throw new Error(`--format must be bf16, int8, int8-row, fp8, int4 or mxfp4, got ${format}`);
const reps = Number(option("--reps", "20"));
const n = Number(option("--batch", "1"));
const position = Number(option("--position", "60")); // the decoded token's position (its context: 0 .. position)
if (!Number.isInteger(position) || position < 0 || position >= 64)
  throw new Error(`--position must be an integer in [0, 64), got ${position}`);
const native = tryLoadNativeKernels();
if (!native) throw new Error("bench/step-profile needs the native addon (npm run build)");
const model =
  format === "bf16" ? benchModelDir("bfloat16", preset)
  : onLoad !== null ? benchModelDir("float32", preset)
  : format !== "int8" || nativeTakesScheme(native, "int8_g32") ? benchGguf(benchModelDir("float32", preset), GGUF[format as keyof typeof GGUF])
  : benchModelDir("float32", preset);
const setup = createServingSetupSync({
  model,
  quantization: onLoad ?? (format === "int8" && !model.endsWith(".gguf") ? "int8" : null),
  maxModelLen: 256,
  kvCacheMemory: (64 << 20) * Math.ceil((4 * n + 2) / 64), // 64 MiB holds 64+ blocks of either model: 4 per sequence here
  maxNumSeqs: n,
});
const runner = setup.runner;
runner.graphs?.dispose();
runner.captureStepGraphs(256, { decodeBuckets: [n], fuse: true });
const bs = 16;
const batch: ScheduledBatch = {
  blockSize: bs,
  numTokens: n,
  finishedRequestIds: [],
  sampleOnDevice: true,
  sequences: Array.from({ length: n }, (_, i) => ({
    requestId: `r${i}`,
    tokenIds: [5 + i],
    startPosition: position,
    blockTable: Array.from({ length: 4 }, (_, b) => 1 + i * 4 + b),
    slotMapping: Int32Array.of((1 + i * 4 + Math.floor(position / bs)) * bs + (position % bs)),
    needsLogits: true,
    needsPromptLogits: false,
  })),
};
for (let i = 0; i < 5; i++) runner.execute(batch);
const whole: number[] = [];
for (let r = 0; r < reps; r++) {
  const t0 = performance.now();
  runner.execute(batch);
  whole.push(performance.now() - t0);
}
whole.sort((a, b) => a - b);
const prof = runner.graphs!.profileDecode(n, reps)!;
// whole replays timed the same way (one rep each): the sum of per-kernel medians undercounts a replay (each kernel's
// time is skewed to the right, and one replay does not get every kernel at its median)
const replays: number[] = [];
for (let r = 0; r < reps; r++) replays.push(runner.graphs!.profileDecode(n, 1)!.reduce((a, b) => a + b.ns, 0) / 1e6);
replays.sort((a, b) => a - b);
// read bandwidth of both cores (the bench's roofline probe), best of 3, measured right after the step timings
const probe = bandwidthProbe(native);
const reads = decodeReads(setup.loaded.model);
let bw = 0, bwOwn = 0;
for (let i = 0; i < 3; i++) {
  bw = Math.max(bw, native.memoryReadBandwidth(reads, 3, native.getNumThreads()));
  bwOwn = Math.max(bwOwn, native.memoryReadBandwidth(probe, 3, native.getNumThreads()));
}
const hop = native.coreRoundTrip?.(20000); // where the two vCPUs sit (native/thread-pool.h poolRoundTripNs)
const bytes = decodeBytes(setup.loaded.model);
const roofMs = bytes / (bw * 1e9) * 1e3;
const byOp = new Map<string, { count: number; ns: number; medianNs: number }>();
for (const { op, ns, medianNs } of prof) {
  const e = byOp.get(op) ?? { count: 0, ns: 0, medianNs: 0 };
  e.count++;
  e.ns += ns;
  e.medianNs += medianNs;
  byOp.set(op, e);
}
const total = prof.reduce((a, b) => a + b.ns, 0);
const totalMedian = prof.reduce((a, b) => a + b.medianNs, 0);
console.log(`${modelKey} ${format} batch ${n}: step (execute, best of ${reps}) ${whole[0]!.toFixed(2)} ms, median ${whole[reps >> 1]!.toFixed(2)} ms`);
console.log(`weights ${(bytes / 2 ** 20).toFixed(1)} MiB/step, read at ${bw.toFixed(1)} GB/s (the probe's own buffer: ${bwOwn.toFixed(1)}${hop !== undefined && hop > 0 ? `; threads' round trip ${hop.toFixed(0)} ns` : ""}) -> roofline ${roofMs.toFixed(2)} ms; best step at ${((100 * roofMs) / whole[0]!).toFixed(0)}% of roofline speed`);
console.log(`sum of per-kernel bests ${(total / 1e6).toFixed(2)} ms, of medians ${(totalMedian / 1e6).toFixed(2)} ms, over ${prof.length} kernels (${native.getNumThreads()} threads)`);
console.log(`whole replay on this thread, kernel by kernel: best ${replays[0]!.toFixed(2)} ms, median ${replays[reps >> 1]!.toFixed(2)} ms (execute adds the host's work)`);
for (const [op, e] of [...byOp].sort((a, b) => b[1].ns - a[1].ns))
  console.log(`  ${op.padEnd(16)} x${String(e.count).padStart(4)}  ${(e.ns / 1e6).toFixed(3).padStart(7)} ms  ${((e.ns / e.count) / 1e3).toFixed(1).padStart(7)} us each (median ${((e.medianNs / e.count) / 1e3).toFixed(1)})`);
// Per product kind: the bytes its weights hold over the sum of its kernels' median times, next to the probe. In
// one process (SmolLM-135M Q8_0, position 40), with the probe at 58-59 GB/s the LM head (28.7 MiB) streamed at 58
// GB/s, gate/up at 50, down at 46, but q/k/v and o at 35; with it at 34-39 every kind read 27-40 GB/s, q/k/v the
// slowest (27-33): the small products' fixed costs, not the tile's streaming rate, hold a step back in a fast period.
// Stacking q/k/v (and gate/up) into one weight each, as vLLM's QKVParallelLinear does, would not change that: a
// scratch copy of bench/lab/gemv-chain timing each kind's products in both layouts, alternating, read them at the same
// rate within 1-3% in 8 rounds (probe 34-57 GB/s; per kind, e.g. q/k/v 27.3-31.2 separate vs 25.9-31.3 stacked).
const products = n === 1 ? decodeProducts(setup.loaded.model) : null;
const gemvJobs = prof.filter((p) => /^(quantMatmul|matmul)(Group)?$/.test(p.op));
if (products !== null && gemvJobs.length === products.length) {
  const kinds = new Map<string, { bytes: number; ns: number; count: number }>();
  products.forEach((p, i) => {
    const e = kinds.get(p.kind) ?? { bytes: 0, ns: 0, count: 0 };
    e.bytes += p.bytes;
    e.ns += gemvJobs[i]!.medianNs;
    e.count++;
    kinds.set(p.kind, e);
  });
  const serialNs = totalMedian - gemvJobs.reduce((a, p) => a + p.medianNs, 0);
  const cell = ([k, e]: [string, { bytes: number; ns: number; count: number }]) =>
    `${k} ${(e.bytes / e.ns).toFixed(1)} (x${e.count}, ${(e.ns / 1e6).toFixed(2)} ms)`;
  const others = `the other kernels ${(serialNs / 1e6).toFixed(2)} ms`;
  const head = `weight products, GB/s over their kernels' medians (probe ${bw.toFixed(1)})`;
  console.log(`${head}: ${[...kinds].map(cell).join(", ")}; ${others}`);
}
if (process.argv.includes("--list")) prof.slice(0, 40).forEach((p, i) => console.log(`  #${i} ${p.op} ${(p.ns / 1e3).toFixed(1)} us (median ${(p.medianNs / 1e3).toFixed(1)})`));
runner.graphs?.dispose();
