// Training step throughput at TorchTitan's debug model shape (Llama 3: dim 256, 6 layers, 16 heads, FFN 768, vocab
// 4096; random weights and token ids; AdamW; float32): steps of 4096 tokens and more, with the flash
// attention kernels (the default) and with the composed form (kiln.enableFlashSdp(false): the [B, H, S, S] scores
// materialized), at 8 x 512 and 4 x 1024 tokens, then 2 x 2048 and the recipe's own 8 x 2048 with flash only (composed,
// 2 x 2048 ran this 24 GiB machine out of memory: several 512 MiB score tensors per layer kept for backward). Prints
// tokens/s, the flash/composed ratio measured in the same run, model FLOPs utilization (TorchTitan's FLOPs per token
// over this run's measured FMA peak of every thread) and each step's peak tensor memory.
// Usage: npm run bench:train [-- --steps 3] [--skip-large] [--shapes 8x512,2x2048 (flash only, these shapes)]
import { tryLoadNativeKernels } from "../src/backends/cpu/native.js";
import { CausalLM } from "../src/models/causal-lm.js";
import { parseHfConfig } from "../src/models/hf-config.js";
import { enableFlashSdp, maxMemoryAllocated, maxMemoryReserved, ones, randn, resetPeakMemoryStats, type Tensor } from "../src/tensor/index.js";
import { AdamW } from "../src/train/optimizers/adam.js";
import { flopsPerToken } from "../src/train/recipe.js";
import { mulberry32 } from "../src/util/random.js";

const option = (name: string, dflt: string): string => {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1]! : dflt;
};
const STEPS = Number(option("--steps", "3"));
const VOCAB = 4096;

const native = tryLoadNativeKernels();
if (!native) throw new Error("the native kernels did not load: npm run build");
const threads = native.getNumThreads();
const peak = native.fmaPeak(2e7) * 1e9 * threads;

function model(): CausalLM {
  const m = new CausalLM(parseHfConfig({
    architectures: ["LlamaForCausalLM"], hidden_size: 256, intermediate_size: 768, num_hidden_layers: 6, num_attention_heads: 16,
    num_key_value_heads: 16, vocab_size: VOCAB, max_position_embeddings: 2048, rope_theta: 500000, tie_word_embeddings: true,
  }), { unallocatedParameters: true });
  for (const [n, p] of m.namedParameters()) {
    const t: Tensor = n.endsWith("norm.weight") ? ones(p.shape) : randn(p.shape, { std: 0.02 });
    t.requiresGrad = true;
    m.setParameter(n, t);
  }
  return m;
}

interface Result {
  tokensPerSecond: number;
  mfu: number;
  peakMiB: number;
  /** The host allocator's peak live + cached bytes. */
  reservedMiB: number;
  loss: number;
}

/** STEPS timed steps after one warm-up: the best step's tokens/s. */
function run(batch: number, seq: number, flash: boolean): Result {
  enableFlashSdp(flash);
  const m = model();
  const opt = new AdamW(m.parameters(), { lr: 1e-3 });
  const r = mulberry32(batch * 7919 + seq);
  const ids = () => Int32Array.from({ length: batch * seq }, () => Math.floor(r() * VOCAB));
  let best = Infinity;
  let peakBytes = 0;
  let reservedBytes = 0;
  let loss = 0;
  for (let s = 0; s <= STEPS; s++) {
    const [inp, tgt] = [ids(), ids()];
    resetPeakMemoryStats();
    const t0 = performance.now();
    const l = m.loss(inp, tgt, batch, seq);
    l.backward();
    opt.step();
    opt.zeroGrad();
    loss = (l.dataSync() as Float32Array)[0]!;
    l.dispose();
    const dt = (performance.now() - t0) / 1000;
    if (s > 0) best = Math.min(best, dt);
    peakBytes = Math.max(peakBytes, maxMemoryAllocated());
    reservedBytes = Math.max(reservedBytes, maxMemoryReserved());
  }
  enableFlashSdp(true);
  const tps = (batch * seq) / best;
  const result = { tokensPerSecond: tps, mfu: (tps * flopsPerToken(m, seq)) / peak, peakMiB: peakBytes / 2 ** 20, reservedMiB: reservedBytes / 2 ** 20, loss };
  for (const p of m.parameters()) p.dispose();
  opt.zeroGrad();
  // freed buffers' memory goes back when their ArrayBuffers are collected
  (globalThis as { gc?: () => void }).gc?.();
  return result;
}

const fmt = (x: Result) => `${x.tokensPerSecond.toFixed(0)} tok/s, MFU ${(100 * x.mfu).toFixed(1)}%, peak ${x.peakMiB.toFixed(0)} MiB (reserved ${x.reservedMiB.toFixed(0)})`;
console.log(`debug-model training (dim 256, 6 layers, 16 heads, vocab ${VOCAB}, f32, AdamW), ${threads} threads, FMA peak ${(peak / 1e9).toFixed(0)} GFLOP/s; best of ${STEPS} steps after a warm-up`);
const shapes = option("--shapes", "");
if (shapes !== "") {
  for (const [batch, seq] of shapes.split(",").map((s) => s.split("x").map(Number) as [number, number])) console.log(`${batch} x ${seq}: flash ${fmt(run(batch, seq, true))}`);
  console.log(`max RSS ${(process.resourceUsage().maxRSS / 2 ** 10).toFixed(0)} MiB`);
  process.exit(0);
}
for (const [batch, seq] of [[8, 512], [4, 1024]] as const) {
  const flash = run(batch, seq, true);
  const composed = run(batch, seq, false);
  console.log(`${batch} x ${seq}: flash ${fmt(flash)} | composed ${fmt(composed)} | flash/composed ${(flash.tokensPerSecond / composed.tokensPerSecond).toFixed(2)}x tokens/s, ${(composed.peakMiB / flash.peakMiB).toFixed(2)}x less memory`);
}
console.log(`2 x 2048: flash ${fmt(run(2, 2048, true))}`);
if (!process.argv.includes("--skip-large")) console.log(`8 x 2048 (the recipe's batch): flash ${fmt(run(8, 2048, true))}`);
