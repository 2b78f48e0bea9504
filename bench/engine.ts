// Engine throughput bench: a SmolLM-135M-shaped random model (30 layers, hidden 576, vocab 49152) served by
// the in-process LLM with 1, 8 and 32 concurrent requests of random prompts (ignore_eos). Two request shapes
// by default: decode-heavy (~32 prompt tokens, 128 output tokens) and prefill-heavy (~128 prompt, 64 output).
// Reports output tokens/s (generated tokens / wall time, prefill included, as vLLM's `bench throughput`)
// and the 32-vs-1 ratio: how much continuous batching buys. `--engines llm,worker` also runs each
// concurrency through WorkerEngine (the engine in a worker thread, as `kiln serve` uses it) with an output per step
// (a streamed reply's), and `worker-final` with final-only outputs (GenerateOptions.finalOnly: a non-streaming
// reply's); each worker row prints its ratio to the in-process LLM's row of the same shape and concurrency.
// The model and tokenizer are written once under <tmpdir>/kiln-bench-models and reused.
// Usage: npm run bench:engine [-- --dtype float32|bfloat16] [--engines llm,worker,worker-final] [--concurrency 1,8,32]
//        [--shapes 32x128,128x64]   (prompt tokens x output tokens)  [--enforce-eager]  (no step graphs)
import * as os from "node:os";
import * as path from "node:path";
import { tryLoadNativeKernels } from "../src/backends/cpu/native.js";
import { LLM } from "../src/engine/llm-engine.js";
import type { ServingArgs } from "../src/engine/serving.js";
import type { SamplingParams } from "../src/engine/types.js";
import { WorkerEngine } from "../src/engine/worker-engine.js";
import { TOKENIZER_VOCAB, benchModelDir } from "./bench-models.js";

let PROMPT_LEN = 128;
let OUTPUT_LEN = 64;

function option(name: string): string | undefined {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : undefined;
}

/** Deterministic random prompts of PROMPT_LEN ± PROMPT_LEN/16 token ids drawn from the tokenizer's range. */
function randomPrompts(n: number, seed: number): number[][] {
  let s = seed >>> 0;
  const next = (): number => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
  return Array.from({ length: n }, () =>
    Array.from({ length: PROMPT_LEN - (PROMPT_LEN >> 4) + Math.floor(next() * ((PROMPT_LEN >> 3) + 1)) }, () => 3 + Math.floor(next() * (TOKENIZER_VOCAB - 3))),
  );
}

interface Row {
  shape: string;
  engine: string;
  concurrency: number;
  seconds: number;
  promptTokens: number;
  outputTokens: number;
}

const params = (): Partial<SamplingParams> => ({ temperature: 0, maxTokens: OUTPUT_LEN, ignoreEos: true });
const shapeName = (): string => `${PROMPT_LEN}x${OUTPUT_LEN}`;

function runInProcess(llm: LLM, prompts: number[][]): Row {
  const t0 = performance.now();
  const outs = llm.generate(
    prompts.map((promptTokenIds) => ({ promptTokenIds })),
    params(),
  );
  const outputTokens = outs.reduce((a, o) => a + o.outputs[0]!.tokenIds.length, 0);
  return row("LLM (in-process)", prompts, t0, outputTokens);
}

/** One result row, timed from t0 to now. */
function row(engine: string, prompts: number[][], t0: number, outputTokens: number): Row {
  return {
    shape: shapeName(),
    engine,
    concurrency: prompts.length,
    seconds: (performance.now() - t0) / 1000,
    promptTokens: prompts.reduce((a, p) => a + p.length, 0),
    outputTokens,
  };
}

async function runWorker(engine: WorkerEngine, prompts: number[][], tag: string, finalOnly: boolean): Promise<Row> {
  const t0 = performance.now();
  const counts = await Promise.all(
    prompts.map(async (promptTokenIds, i) => {
      let n = 0;
      for await (const out of engine.generate({ promptTokenIds }, params(), { requestId: `${tag}-${i}`, delta: true, finalOnly }))
        n += out.outputs[0]!.tokenIds.length;
      return n;
    }),
  );
  return row(finalOnly ? "WorkerEngine final" : "WorkerEngine", prompts, t0, counts.reduce((a, b) => a + b, 0));
}

async function main(): Promise<void> {
  const dtype = (option("--dtype") ?? "bfloat16") as "float32" | "bfloat16";
  const concurrencies = (option("--concurrency") ?? "1,8,32").split(",").map(Number);
  const engines = (option("--engines") ?? "llm").split(",");
  const shapes = (option("--shapes") ?? "32x128,128x64").split(",").map((x) => x.split("x").map(Number) as [number, number]);
  const model = benchModelDir(dtype);
  // f32 KV cache: 30 layers x 3 KV heads x 64 dims x (K, V) x 4 B = 45 KiB per token; room for every request
  // at once, so that no run is limited by preemption.
  const maxConc = Math.max(...concurrencies);
  const args: ServingArgs = { model, enforceEager: process.argv.includes("--enforce-eager"), maxModelLen: 224, maxNumSeqs: maxConc, kvCacheMemory: (maxConc + 2) * 14 * 16 * 46080 };
  const native = tryLoadNativeKernels();
  const backend = native === null ? "cpu (TS reference: native addon not built)" : `cpu native (${native.isa})`;
  console.log(
    `${backend}; ${os.cpus().length} cores; model ${path.basename(model)}${args.enforceEager === true ? " (--enforce-eager)" : ""}; shapes (prompt x output tokens) ${shapes.map((s) => s.join("x")).join(", ")}; greedy, ignore_eos`,
  );

  const rows: Row[] = [];
  if (engines.includes("llm")) {
    const llm = new LLM(args);
    runInProcess(llm, randomPrompts(2, 99)); // warm-up (first-touch of weights, compile caches)
    for (const [p, o] of shapes) {
      [PROMPT_LEN, OUTPUT_LEN] = [p, o];
      for (const c of concurrencies) rows.push(runInProcess(llm, randomPrompts(c, c)));
    }
  }
  const modes = [false, true].filter((final) => engines.includes(final ? "worker-final" : "worker"));
  if (modes.length > 0) {
    const engine = await WorkerEngine.create(args);
    try {
      await runWorker(engine, randomPrompts(2, 99), "warm", false);
      for (const [p, o] of shapes) {
        [PROMPT_LEN, OUTPUT_LEN] = [p, o];
        // both delivery modes back to back per concurrency, so that they see the same moment of a noisy machine
        for (const c of concurrencies) for (const final of modes) rows.push(await runWorker(engine, randomPrompts(c, c), `${p}x${o}c${c}${final ? "f" : ""}`, final));
      }
    } finally {
      await engine.close();
    }
  }

  console.log(
    [
      "shape".padEnd(7),
      "engine".padEnd(18),
      "conc",
      "wall s".padStart(8),
      "prompt tok".padStart(10),
      "out tok".padStart(8),
      "out tok/s".padStart(10),
      "total tok/s".padStart(11),
    ].join(" "),
  );
  for (const r of rows) {
    console.log(
      [
        r.shape.padEnd(7),
        r.engine.padEnd(18),
        String(r.concurrency).padStart(4),
        r.seconds.toFixed(2).padStart(8),
        String(r.promptTokens).padStart(10),
        String(r.outputTokens).padStart(8),
        (r.outputTokens / r.seconds).toFixed(1).padStart(10),
        ((r.promptTokens + r.outputTokens) / r.seconds).toFixed(1).padStart(11),
      ].join(" "),
    );
  }
  for (const r of rows.filter((x) => x.engine !== "LLM (in-process)")) {
    const ref = rows.find((x) => x.engine === "LLM (in-process)" && x.shape === r.shape && x.concurrency === r.concurrency);
    if (ref !== undefined)
      console.log(`${r.shape} ${r.engine} at ${r.concurrency}: output tok/s ${(r.outputTokens / r.seconds / (ref.outputTokens / ref.seconds)).toFixed(2)}x the in-process LLM's`);
  }
  for (const key of new Set(rows.map((r) => `${r.shape} ${r.engine}`))) {
    const mine = rows.filter((r) => `${r.shape} ${r.engine}` === key);
    const one = mine.find((r) => r.concurrency === 1);
    const max = mine.at(-1)!;
    if (one !== undefined && max !== one)
      console.log(
        `${key}: output tok/s at ${max.concurrency} concurrent vs 1 = ${(max.outputTokens / max.seconds / (one.outputTokens / one.seconds)).toFixed(2)}x`,
      );
  }
}

await main();
