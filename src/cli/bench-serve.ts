// `kiln bench serve`: load generator against an OpenAI-compatible server, as `vllm bench serve`.
// Random prompts are token id lists sent to /v1/completions with streaming; reports throughput and
// TTFT / TPOT / ITL / E2EL statistics as a table and JSON (vLLM's result keys).
import { writeFileSync } from "node:fs";
import { mulberry32 } from "../util/random.js";
import { sseData } from "./openai-client.js";

export interface BenchServeArgs {
  baseUrl: string; // e.g. http://127.0.0.1:8000
  model: string | null; // null = first model of /v1/models
  datasetName: "random" | "prefix-repetition";
  randomInputLen: number;
  randomOutputLen: number;
  randomPrefixLen: number;
  prefixRepetitionPrefixLen: number;
  prefixRepetitionSuffixLen: number;
  prefixRepetitionNumPrefixes: number;
  prefixRepetitionOutputLen: number;
  numPrompts: number;
  requestRate: number; // Infinity = all at once; else Poisson arrivals at this rate (req/s)
  maxConcurrency: number | null;
  ignoreEos: boolean;
  seed: number;
  apiKey: string | null;
  percentiles: number[];
  saveResult: boolean;
  resultFilename: string | null;
  quiet: boolean;
}

interface BenchRequest {
  prompt: number[];
  outputLen: number;
}

interface RequestResult {
  success: boolean;
  error: string;
  promptLen: number;
  outputTokens: number;
  ttft: number; // seconds
  itl: number[]; // seconds between streamed chunks after the first
  latency: number; // seconds
}



function headers(args: BenchServeArgs): Record<string, string> {
  return { "content-type": "application/json", ...(args.apiKey ? { authorization: `Bearer ${args.apiKey}` } : {}) };
}

/** Token ids that are safe to send: whatever the server's tokenizer makes of plain ASCII text. */
/** Plain ASCII text whose tokens make the random prompts (no special tokens among them). */
export const PROMPT_TOKEN_TEXT = "The quick brown fox jumps over the lazy dog. 0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ ,.;:!?";

async function tokenPool(args: BenchServeArgs, model: string): Promise<number[]> {
  const probe = PROMPT_TOKEN_TEXT;
  const res = await fetch(`${args.baseUrl}/tokenize`, {
    method: "POST", headers: headers(args), body: JSON.stringify({ model, prompt: probe, add_special_tokens: false }),
  });
  if (!res.ok) throw new Error(`POST /tokenize failed with ${res.status}: ${await res.text()}`);
  const ids = [...new Set(((await res.json()) as { tokens: number[] }).tokens)];
  if (ids.length === 0) throw new Error("POST /tokenize returned no tokens");
  return ids;
}

export function buildRequests(args: BenchServeArgs, pool: number[]): BenchRequest[] {
  const rand = mulberry32(args.seed);
  const randomIds = (n: number): number[] => Array.from({ length: n }, () => pool[Math.floor(rand() * pool.length)]!);
  if (args.datasetName === "prefix-repetition") {
    const prefixes = Array.from({ length: args.prefixRepetitionNumPrefixes }, () => randomIds(args.prefixRepetitionPrefixLen));
    return Array.from({ length: args.numPrompts }, (_, i) => ({
      prompt: [...prefixes[i % prefixes.length]!, ...randomIds(args.prefixRepetitionSuffixLen)],
      outputLen: args.prefixRepetitionOutputLen,
    })).sort(() => rand() - 0.5);
  }
  const prefix = randomIds(args.randomPrefixLen);
  return Array.from({ length: args.numPrompts }, () => ({ prompt: [...prefix, ...randomIds(args.randomInputLen)], outputLen: args.randomOutputLen }));
}

async function sendRequest(args: BenchServeArgs, model: string, req: BenchRequest): Promise<RequestResult> {
  const result: RequestResult = { success: false, error: "", promptLen: req.prompt.length, outputTokens: 0, ttft: 0, itl: [], latency: 0 };
  const start = performance.now();
  let last = start;
  try {
    const res = await fetch(`${args.baseUrl}/v1/completions`, {
      method: "POST",
      headers: headers(args),
      body: JSON.stringify({
        model, prompt: req.prompt, max_tokens: req.outputLen, temperature: 0, stream: true, stream_options: { include_usage: true },
        ignore_eos: args.ignoreEos,
      }),
    });
    if (!res.ok || !res.body) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
    let chunks = 0;
    for await (const data of sseData(res.body as unknown as AsyncIterable<Uint8Array>)) {
      const msg = JSON.parse(data) as { choices?: { text?: string }[]; usage?: { completion_tokens: number } | null; error?: { message: string } };
      if (msg.error) throw new Error(msg.error.message);
      const now = performance.now();
      // Any chunk with a choice carries tokens, even when their text is empty (a partial UTF-8 character, or an
      // id the tokenizer cannot decode); only the final usage chunk has none. As vLLM's benchmark client.
      if (msg.choices && msg.choices.length > 0) {
        if (chunks === 0) result.ttft = (now - start) / 1000;
        else result.itl.push((now - last) / 1000);
        chunks++;
        last = now;
      }
      if (msg.usage) result.outputTokens = msg.usage.completion_tokens;
    }
    result.latency = (performance.now() - start) / 1000;
    result.success = true;
  } catch (err) {
    result.error = (err as Error).message;
  }
  return result;
}

const mean = (xs: number[]): number => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);
function percentile(xs: number[], p: number): number {
  if (xs.length === 0) return 0;
  const s = [...xs].sort((a, b) => a - b);
  const rank = (p / 100) * (s.length - 1); // linear interpolation, as numpy.percentile
  const lo = Math.floor(rank);
  return s[lo]! + (s[Math.min(lo + 1, s.length - 1)]! - s[lo]!) * (rank - lo);
}

export type BenchResult = Record<string, number | string | null>;

export async function runBenchServe(args: BenchServeArgs, log: (line: string) => void = (l) => process.stdout.write(`${l}\n`)): Promise<BenchResult> {
  let model = args.model;
  if (!model) {
    const res = await fetch(`${args.baseUrl}/v1/models`, { headers: headers(args) });
    if (!res.ok) throw new Error(`GET /v1/models failed with ${res.status}`);
    model = ((await res.json()) as { data: { id: string }[] }).data[0]!.id;
  }
  const requests = buildRequests(args, await tokenPool(args, model));
  const rand = mulberry32(args.seed + 1);
  let active = 0;
  const waiters: (() => void)[] = [];
  const acquire = async (): Promise<void> => {
    if (args.maxConcurrency === null || active < args.maxConcurrency) {
      active++;
      return;
    }
    await new Promise<void>((resolve) => waiters.push(resolve));
  };
  const release = (): void => {
    const next = waiters.shift();
    if (next) next();
    else active--;
  };

  if (!args.quiet) log(`Traffic request rate: ${Number.isFinite(args.requestRate) ? args.requestRate : "inf"}\nMaximum request concurrency: ${args.maxConcurrency ?? "None"}`);
  const start = performance.now();
  const tasks: Promise<RequestResult>[] = [];
  for (const req of requests) {
    tasks.push((async () => {
      await acquire();
      try {
        return await sendRequest(args, model, req);
      } finally {
        release();
      }
    })());
    if (Number.isFinite(args.requestRate)) {
      const wait = (-Math.log(1 - rand()) / args.requestRate) * 1000; // exponential inter-arrival = Poisson process
      await new Promise((r) => setTimeout(r, wait));
    }
  }
  const results = await Promise.all(tasks);
  const duration = (performance.now() - start) / 1000;
  const ok = results.filter((r) => r.success);
  const totalInput = ok.reduce((s, r) => s + r.promptLen, 0);
  const totalOutput = ok.reduce((s, r) => s + r.outputTokens, 0);
  const ms = (xs: number[]) => xs.map((x) => x * 1000);
  const series: Record<string, number[]> = {
    ttft: ms(ok.map((r) => r.ttft)),
    tpot: ms(ok.filter((r) => r.outputTokens > 1).map((r) => (r.latency - r.ttft) / (r.outputTokens - 1))),
    itl: ms(ok.flatMap((r) => r.itl)),
    e2el: ms(ok.map((r) => r.latency)),
  };
  const result: BenchResult = {
    backend: "kiln", model_id: model, num_prompts: args.numPrompts, request_rate: Number.isFinite(args.requestRate) ? args.requestRate : "inf",
    max_concurrency: args.maxConcurrency, duration, completed: ok.length, failed: results.length - ok.length,
    total_input_tokens: totalInput, total_output_tokens: totalOutput,
    request_throughput: ok.length / duration, output_throughput: totalOutput / duration, total_token_throughput: (totalInput + totalOutput) / duration,
  };
  for (const [key, xs] of Object.entries(series)) {
    result[`mean_${key}_ms`] = mean(xs);
    result[`median_${key}_ms`] = percentile(xs, 50);
    result[`std_${key}_ms`] = Math.sqrt(mean(xs.map((x) => (x - mean(xs)) ** 2)));
    for (const p of args.percentiles) result[`p${p}_${key}_ms`] = percentile(xs, p);
  }
  if (!args.quiet) {
    const firstError = results.find((r) => !r.success)?.error;
    if (firstError) log(`First error: ${firstError}`);
    for (const line of formatTable(result, args.percentiles)) log(line);
  }
  if (args.saveResult || args.resultFilename) {
    const file = args.resultFilename ?? `kiln-bench-${args.datasetName}-${Date.now()}.json`;
    writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
    if (!args.quiet) log(`Saved results to ${file}`);
  }
  return result;
}

function formatTable(r: BenchResult, percentiles: number[]): string[] {
  const row = (label: string, v: number | string | null, digits = 2) =>
    `${label.padEnd(40)} ${typeof v === "number" && !Number.isInteger(v) ? v.toFixed(digits) : String(v)}`;
  const lines = [
    `${"=".repeat(12)} Serving Benchmark Result ${"=".repeat(12)}`,
    row("Successful requests:", r.completed),
    row("Failed requests:", r.failed),
    row("Benchmark duration (s):", r.duration),
    row("Total input tokens:", r.total_input_tokens),
    row("Total generated tokens:", r.total_output_tokens),
    row("Request throughput (req/s):", r.request_throughput),
    row("Output token throughput (tok/s):", r.output_throughput),
    row("Total Token throughput (tok/s):", r.total_token_throughput),
  ];
  const sections: [string, string, string][] = [
    ["ttft", "Time to First Token", "TTFT"], ["tpot", "Time per Output Token (excl. 1st token)", "TPOT"],
    ["itl", "Inter-token Latency", "ITL"], ["e2el", "End-to-end Latency", "E2EL"],
  ];
  for (const [key, title, short] of sections) {
    const pad = Math.max(0, 50 - title.length - 2);
    lines.push(`${"-".repeat(Math.floor(pad / 2))} ${title} ${"-".repeat(Math.ceil(pad / 2))}`);
    lines.push(row(`Mean ${short} (ms):`, r[`mean_${key}_ms`]!), row(`Median ${short} (ms):`, r[`median_${key}_ms`]!));
    for (const p of percentiles) lines.push(row(`P${p} ${short} (ms):`, r[`p${p}_${key}_ms`]!));
  }
  lines.push("=".repeat(50));
  return lines;
}
