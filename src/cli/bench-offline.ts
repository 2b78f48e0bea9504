// `kiln bench latency` and `kiln bench throughput`, as `vllm bench latency|throughput`: the engine loaded in this
// process (every serve flag applies), random prompts of --input-len token ids, --output-len tokens each (EOS
// ignored). latency: a batch of --batch-size requests end to end, --num-iters-warmup then --num-iters times;
// throughput: --num-prompts requests at once. Both print vLLM's lines and, with --output-json, its JSON keys.
import { randomUUID } from "node:crypto";
import { writeFileSync } from "node:fs";
import type { SamplingParams } from "../engine/types.js";
import { mulberry32 } from "../util/random.js";
import type { EngineFactory, LoadedEngine } from "./engine-factory.js";
import { PROMPT_TOKEN_TEXT } from "./bench-serve.js";
import { loadEngine } from "./generate.js";
import type { ServeArgs } from "./serve-args.js";

export interface BenchOfflineArgs {
  inputLen: number;
  outputLen: number;
  seed: number;
  outputJson: string | null;
}

export interface BenchLatencyArgs extends BenchOfflineArgs {
  batchSize: number;
  numItersWarmup: number;
  numIters: number;
}

export interface BenchThroughputArgs extends BenchOfflineArgs {
  numPrompts: number;
}

/** Token ids that plain ASCII text encodes to (no special tokens), to draw random prompts from. */
function tokenPool(loaded: LoadedEngine): number[] {
  const ids = [...new Set(loaded.tokenizer.encode(PROMPT_TOKEN_TEXT, { addSpecialTokens: false }))];
  if (ids.length === 0) throw new Error("the tokenizer encodes no text: cannot make random prompts");
  return ids;
}

function randomPrompts(pool: readonly number[], count: number, len: number, seed: number): number[][] {
  const rand = mulberry32(seed);
  return Array.from({ length: count }, () => Array.from({ length: len }, () => pool[Math.floor(rand() * pool.length)]!));
}

/** Runs every prompt at once to the end; returns the output tokens generated. */
async function runBatch(loaded: LoadedEngine, prompts: number[][], params: Partial<SamplingParams>): Promise<number> {
  const counts = await Promise.all(prompts.map(async (promptTokenIds) => {
    let n = 0;
    for await (const out of loaded.engine.generate({ promptTokenIds }, params, { requestId: randomUUID(), delta: true }))
      for (const o of out.outputs) n += o.tokenIds.length;
    return n;
  }));
  return counts.reduce((a, b) => a + b, 0);
}

function checkFits(loaded: LoadedEngine, a: BenchOfflineArgs): void {
  if (a.inputLen + a.outputLen > loaded.maxModelLen)
    throw new Error(`--input-len ${a.inputLen} + --output-len ${a.outputLen} exceed the model's max_model_len ${loaded.maxModelLen}`);
}

const paramsFor = (a: BenchOfflineArgs): Partial<SamplingParams> => ({ temperature: 1, topP: 1, maxTokens: a.outputLen, ignoreEos: true });

/** Linear-interpolated percentile of sorted values (numpy's default). */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return NaN;
  const x = (p / 100) * (sorted.length - 1);
  const lo = Math.floor(x), hi = Math.ceil(x);
  return sorted[lo]! + (sorted[hi]! - sorted[lo]!) * (x - lo);
}

export async function runBenchLatency(args: ServeArgs, a: BenchLatencyArgs, factory: EngineFactory, out: NodeJS.WritableStream = process.stdout): Promise<{ latencies: number[] }> {
  const loaded = await loadEngine(args, factory);
  try {
    checkFits(loaded, a);
    const prompts = randomPrompts(tokenPool(loaded), a.batchSize, a.inputLen, a.seed);
    const params = paramsFor(a);
    for (let i = 0; i < a.numItersWarmup; i++) await runBatch(loaded, prompts, params);
    const latencies: number[] = [];
    for (let i = 0; i < a.numIters; i++) {
      const t0 = performance.now();
      const n = await runBatch(loaded, prompts, params);
      latencies.push((performance.now() - t0) / 1000);
      if (n !== a.batchSize * a.outputLen) throw new Error(`the batch generated ${n} tokens, expected ${a.batchSize * a.outputLen}`);
    }
    const sorted = [...latencies].sort((x, y) => x - y);
    const avg = latencies.reduce((s, x) => s + x, 0) / latencies.length;
    const ps = [10, 25, 50, 75, 90, 99];
    out.write(`Avg latency: ${avg} seconds\n`);
    for (const p of ps) out.write(`${p}% percentile latency: ${percentile(sorted, p)} seconds\n`);
    if (a.outputJson !== null)
      writeFileSync(a.outputJson, JSON.stringify({ avg_latency: avg, latencies, percentiles: Object.fromEntries(ps.map((p) => [String(p), percentile(sorted, p)])) }, null, 4));
    return { latencies };
  } finally {
    await loaded.close();
  }
}

export async function runBenchThroughput(args: ServeArgs, a: BenchThroughputArgs, factory: EngineFactory, out: NodeJS.WritableStream = process.stdout): Promise<{ outputTokens: number; elapsed: number }> {
  const loaded = await loadEngine(args, factory);
  try {
    checkFits(loaded, a);
    const prompts = randomPrompts(tokenPool(loaded), a.numPrompts, a.inputLen, a.seed);
    const t0 = performance.now();
    const outputTokens = await runBatch(loaded, prompts, paramsFor(a));
    const elapsed = (performance.now() - t0) / 1000;
    const promptTokens = a.numPrompts * a.inputLen;
    const total = promptTokens + outputTokens;
    out.write(
      `Throughput: ${(a.numPrompts / elapsed).toFixed(2)} requests/s, ${(total / elapsed).toFixed(2)} total tokens/s, ` +
        `${(outputTokens / elapsed).toFixed(2)} output tokens/s\n`,
    );
    out.write(`Total num prompt tokens:  ${promptTokens}\nTotal num output tokens:  ${outputTokens}\n`);
    if (a.outputJson !== null)
      writeFileSync(a.outputJson, JSON.stringify({
        elapsed_time: elapsed, num_requests: a.numPrompts, total_num_tokens: total, total_output_tokens: outputTokens,
        requests_per_second: a.numPrompts / elapsed, tokens_per_second: total / elapsed,
      }, null, 4));
    return { outputTokens, elapsed };
  } finally {
    await loaded.close();
  }
}
