// `kiln bench serve`: load generator against an OpenAI-compatible server, as `vllm bench serve`.
// Datasets: random token ids (exact lengths, optionally spread by --random-range-ratio), prefix repetition, and text
// prompts from a ShareGPT JSON file or a custom JSONL file (vLLM's formats, filters and shuffling). Requests go to
// /v1/completions (backends vllm, openai) or /v1/chat/completions (openai-chat), streamed, arriving all at once or
// as a gamma process (Poisson at --burstiness 1); reports throughput, goodput against SLOs and TTFT / TPOT / ITL /
// E2EL statistics as a table and JSON with vLLM's result keys. Prompt lengths are counted by the server's own
// /tokenize (vLLM counts with a local copy of the tokenizer).
import { readFileSync, writeFileSync } from "node:fs";
import { basename, join } from "node:path";
import { mulberry32 } from "../util/random.js";
import { sseData } from "./openai-client.js";

export type BenchBackend = "vllm" | "openai" | "openai-chat";
export type BenchDataset = "random" | "prefix-repetition" | "custom" | "sharegpt";
export type BenchMetric = "ttft" | "tpot" | "itl" | "e2el";
export const BENCH_METRICS: readonly BenchMetric[] = ["ttft", "tpot", "itl", "e2el"];
/** The metrics --goodput can bound (ms). */
export type GoodputMetric = "ttft" | "tpot" | "e2el";

export interface BenchServeArgs {
  baseUrl: string; // e.g. http://127.0.0.1:8000
  model: string | null; // null = first model of /v1/models
  /** The name requests use (vLLM's --served-model-name), else `model`. */
  servedModelName: string | null;
  backend: BenchBackend;
  /** The route requests go to: /v1/completions, or /v1/chat/completions for openai-chat. */
  endpoint: string;
  datasetName: BenchDataset;
  datasetPath: string | null;
  randomInputLen: number;
  randomOutputLen: number;
  randomPrefixLen: number;
  /** Lengths drawn uniformly within len * (1 -+ ratio) (vLLM's --random-range-ratio; 0 = exact). */
  randomRangeRatio: number;
  prefixRepetitionPrefixLen: number;
  prefixRepetitionSuffixLen: number;
  prefixRepetitionNumPrefixes: number;
  prefixRepetitionOutputLen: number;
  customOutputLen: number;
  /** Send the custom dataset's prompts as written instead of in the chat template (completions backends). */
  customSkipChatTemplate: boolean;
  /** Output tokens per ShareGPT request; null = the length of the conversation's reply. */
  sharegptOutputLen: number | null;
  /** A dataset with fewer usable prompts than --num-prompts sends fewer instead of repeating some. */
  noOversample: boolean;
  disableShuffle: boolean;
  numPrompts: number;
  /** Requests sent (one at a time) before the measured run. */
  numWarmups: number;
  requestRate: number; // Infinity = all at once; else gamma-distributed arrivals at this mean rate (req/s)
  /** The arrivals' gamma shape: 1 = Poisson, lower = burstier, higher = more even. */
  burstiness: number;
  maxConcurrency: number | null;
  ignoreEos: boolean;
  seed: number;
  apiKey: string | null;
  /** Request fields from the command line (temperature, top_p, top_k, min_p); temperature 0 unless given. */
  sampling: Record<string, number>;
  /** Fields merged into every request body (vLLM's --extra-body). */
  extraBody: Record<string, unknown>;
  percentileMetrics: BenchMetric[];
  percentiles: number[];
  /** SLOs in ms (vLLM's --goodput): requests meeting every one count toward request_goodput; null = not reported. */
  goodput: Partial<Record<GoodputMetric, number>> | null;
  /** Each request's X-Request-Id is this prefix and its index. */
  requestIdPrefix: string;
  /** How long to wait for the server to answer /v1/models before giving up (0: do not wait). */
  readyCheckTimeoutSec: number;
  label: string | null;
  /** Extra key=value pairs for the result JSON. */
  metadata: Record<string, string>;
  saveResult: boolean;
  /** Also save each request's lengths, timings, text and error. */
  saveDetailed: boolean;
  resultDir: string | null;
  resultFilename: string | null;
  quiet: boolean;
}

/** vLLM's defaults, for callers that set a few fields. */
export function benchServeDefaults(): BenchServeArgs {
  return {
    baseUrl: "http://127.0.0.1:8000", model: null, servedModelName: null, backend: "vllm", endpoint: "/v1/completions",
    datasetName: "random", datasetPath: null, randomInputLen: 1024, randomOutputLen: 128, randomPrefixLen: 0, randomRangeRatio: 0,
    prefixRepetitionPrefixLen: 256, prefixRepetitionSuffixLen: 256, prefixRepetitionNumPrefixes: 10, prefixRepetitionOutputLen: 128,
    customOutputLen: 256, customSkipChatTemplate: false, sharegptOutputLen: null, noOversample: false, disableShuffle: false,
    numPrompts: 1000, numWarmups: 0, requestRate: Infinity, burstiness: 1, maxConcurrency: null, ignoreEos: false, seed: 0, apiKey: null,
    sampling: {}, extraBody: {}, percentileMetrics: ["ttft", "tpot", "itl"], percentiles: [99], goodput: null, requestIdPrefix: "bench-",
    readyCheckTimeoutSec: 600, label: null, metadata: {}, saveResult: false, saveDetailed: false, resultDir: null, resultFilename: null, quiet: false,
  };
}

/** One request: token ids (exact length) or text, its prompt length in the server's tokens, and its output length. */
export interface BenchRequest {
  prompt: number[] | string;
  promptLen: number;
  outputLen: number;
}

interface RequestResult {
  success: boolean;
  error: string;
  promptLen: number;
  outputTokens: number;
  text: string;
  ttft: number; // seconds
  itl: number[]; // seconds between streamed chunks after the first
  latency: number; // seconds
}

function headers(args: BenchServeArgs): Record<string, string> {
  return { "content-type": "application/json", ...(args.apiKey ? { authorization: `Bearer ${args.apiKey}` } : {}) };
}

/** Plain ASCII text whose tokens make the random prompts (no special tokens among them). */
export const PROMPT_TOKEN_TEXT = "The quick brown fox jumps over the lazy dog. 0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ ,.;:!?";

/** The server's /tokenize and /detokenize for `model`. */
class ServerTokenizer {
  constructor(
    private readonly args: BenchServeArgs,
    private readonly model: string,
  ) {}

  private async post<T>(route: string, body: object): Promise<T> {
    const res = await fetch(`${this.args.baseUrl}${route}`, { method: "POST", headers: headers(this.args), body: JSON.stringify({ model: this.model, ...body }) });
    if (!res.ok) throw new Error(`POST ${route} failed with ${res.status}: ${await res.text()}`);
    return (await res.json()) as T;
  }

  async encode(prompt: string, addSpecialTokens = true): Promise<number[]> {
    return (await this.post<{ tokens: number[] }>("/tokenize", { prompt, add_special_tokens: addSpecialTokens })).tokens;
  }

  /** A user message in the chat template with the generation prompt, as the chat API would feed it. */
  async encodeChat(content: string): Promise<number[]> {
    return (await this.post<{ tokens: number[] }>("/tokenize", { messages: [{ role: "user", content }], add_generation_prompt: true })).tokens;
  }

  async decode(tokens: number[]): Promise<string> {
    return (await this.post<{ prompt: string }>("/detokenize", { tokens })).prompt;
  }
}

/** Token ids that are safe to send: whatever the server's tokenizer makes of plain ASCII text. */
async function tokenPool(tok: ServerTokenizer): Promise<number[]> {
  const ids = [...new Set(await tok.encode(PROMPT_TOKEN_TEXT, false))];
  if (ids.length === 0) throw new Error("POST /tokenize returned no tokens");
  return ids;
}

/** A uniform integer in [floor(n (1 - r)), ceil(n (1 + r))], at least `min` (n itself when r is 0). */
function spread(n: number, r: number, rand: () => number, min: number): number {
  if (r === 0) return n;
  const lo = Math.max(min, Math.floor(n * (1 - r)));
  const hi = Math.max(lo, Math.ceil(n * (1 + r)));
  return lo + Math.floor(rand() * (hi - lo + 1));
}

/** The random and prefix-repetition datasets: prompts of token ids drawn from `pool`. */
export function buildRequests(args: BenchServeArgs, pool: number[]): BenchRequest[] {
  const rand = mulberry32(args.seed);
  const randomIds = (n: number): number[] => Array.from({ length: n }, () => pool[Math.floor(rand() * pool.length)]!);
  const req = (prompt: number[], outputLen: number): BenchRequest => ({ prompt, promptLen: prompt.length, outputLen });
  if (args.datasetName === "prefix-repetition") {
    const prefixes = Array.from({ length: args.prefixRepetitionNumPrefixes }, () => randomIds(args.prefixRepetitionPrefixLen));
    return Array.from({ length: args.numPrompts }, (_, i) => req([...prefixes[i % prefixes.length]!, ...randomIds(args.prefixRepetitionSuffixLen)], args.prefixRepetitionOutputLen))
      .sort(() => rand() - 0.5);
  }
  const prefix = randomIds(args.randomPrefixLen);
  return Array.from({ length: args.numPrompts }, () => {
    const input = spread(args.randomInputLen, args.randomRangeRatio, rand, 1);
    return req([...prefix, ...randomIds(input)], spread(args.randomOutputLen, args.randomRangeRatio, rand, 1));
  });
}

/** Fisher-Yates with the seeded generator. */
function shuffle<T>(xs: T[], rand: () => number): T[] {
  for (let i = xs.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [xs[i], xs[j]] = [xs[j]!, xs[i]!];
  }
  return xs;
}

/** vLLM's is_valid_sequence: prompts of 4..1024 tokens, outputs of 4 or more, 2048 in all. */
function validSequence(promptLen: number, outputLen: number, fixedOutput: boolean): boolean {
  return promptLen >= 4 && (fixedOutput || outputLen >= 4) && promptLen <= 1024 && promptLen + outputLen <= 2048;
}

/** A dataset file's entries, with the file named in every error. */
function readDataset(args: BenchServeArgs): unknown[] {
  const path = args.datasetPath;
  if (path === null) throw new Error(`--dataset-name ${args.datasetName} needs --dataset-path`);
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new Error(`--dataset-path ${path}: ${(e as Error).message}`);
  }
  try {
    if (args.datasetName === "custom") {
      if (!path.endsWith(".jsonl")) throw new Error("the custom dataset is a JSONL file (.jsonl), one {\"prompt\": ...} per line");
      return text.split("\n").filter((l) => l.trim() !== "").map((l) => JSON.parse(l) as unknown);
    }
    const data = JSON.parse(text) as unknown;
    if (!Array.isArray(data)) throw new Error("a ShareGPT file is a JSON list of {\"conversations\": [...]} entries");
    return data;
  } catch (e) {
    throw new Error(`--dataset-path ${path}: ${(e as Error).message}`);
  }
}

/** The custom and ShareGPT datasets: text prompts, shuffled by the seed, filtered and measured as vLLM's are. */
async function textRequests(args: BenchServeArgs, tok: ServerTokenizer, rand: () => number): Promise<BenchRequest[]> {
  const entries = readDataset(args);
  const out: BenchRequest[] = [];
  const chat = args.backend === "openai-chat";
  if (args.datasetName === "custom") {
    const prompts = entries.map((e, i) => {
      const p = (e as { prompt?: unknown } | null)?.prompt;
      if (typeof p !== "string") throw new Error(`--dataset-path ${args.datasetPath}: line ${i + 1} has no "prompt" string`);
      return p;
    });
    if (!args.disableShuffle) shuffle(prompts, rand);
    for (const p of prompts.slice(0, args.numPrompts)) {
      // (the chat template as the server's chat API applies it, sent as ids; the chat backend's server applies it itself)
      if (!chat && !args.customSkipChatTemplate) {
        const ids = await tok.encodeChat(p);
        out.push({ prompt: ids, promptLen: ids.length, outputLen: args.customOutputLen });
      } else out.push({ prompt: p, promptLen: (await tok.encode(p)).length, outputLen: args.customOutputLen });
    }
  } else {
    const turns = entries
      .map((e) => (e as { conversations?: unknown } | null)?.conversations)
      .filter((c): c is { value?: unknown }[] => Array.isArray(c) && c.length >= 2);
    if (!args.disableShuffle) shuffle(turns, rand);
    for (const [first, second] of turns) {
      if (out.length >= args.numPrompts) break;
      if (typeof first!.value !== "string" || typeof second!.value !== "string") continue;
      const promptLen = (await tok.encode(first!.value)).length;
      const outputLen = args.sharegptOutputLen ?? (await tok.encode(second!.value)).length;
      if (validSequence(promptLen, outputLen, args.sharegptOutputLen !== null)) out.push({ prompt: first!.value, promptLen, outputLen });
    }
  }
  if (out.length === 0) throw new Error(`--dataset-path ${args.datasetPath}: no usable prompt`);
  // (vLLM's maybe_oversample_requests: repeat random ones up to --num-prompts)
  const n = out.length;
  while (!args.noOversample && out.length < args.numPrompts) out.push(out[Math.floor(rand() * n)]!);
  return out;
}

async function sendRequest(args: BenchServeArgs, model: string, req: BenchRequest, id: string): Promise<RequestResult> {
  const result: RequestResult = { success: false, error: "", promptLen: req.promptLen, outputTokens: 0, text: "", ttft: 0, itl: [], latency: 0 };
  const chat = args.backend === "openai-chat";
  const start = performance.now();
  let last = start;
  try {
    const body = {
      model,
      ...(chat ? { messages: [{ role: "user", content: req.prompt }], max_completion_tokens: req.outputLen } : { prompt: req.prompt, max_tokens: req.outputLen }),
      temperature: 0,
      ...args.sampling,
      stream: true,
      stream_options: { include_usage: true },
      ...(args.ignoreEos ? { ignore_eos: true } : {}),
      ...args.extraBody,
    };
    const res = await fetch(`${args.baseUrl}${args.endpoint}`, { method: "POST", headers: { ...headers(args), "x-request-id": id }, body: JSON.stringify(body) });
    if (!res.ok || !res.body) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
    let chunks = 0;
    for await (const data of sseData(res.body as unknown as AsyncIterable<Uint8Array>)) {
      type Choice = { text?: string; delta?: { content?: string | null; reasoning_content?: string | null } };
      const msg = JSON.parse(data) as { choices?: Choice[]; usage?: { completion_tokens: number } | null; error?: { message: string } };
      if (msg.error) throw new Error(msg.error.message);
      const now = performance.now();
      // Any chunk with a choice carries tokens, even when their text is empty (a partial UTF-8 character, or an
      // id the tokenizer cannot decode); only the final usage chunk has none. As vLLM's benchmark client.
      const choice = msg.choices?.[0];
      if (choice !== undefined) {
        if (chunks === 0) result.ttft = (now - start) / 1000;
        else result.itl.push((now - last) / 1000);
        chunks++;
        last = now;
        result.text += (chat ? (choice.delta?.content ?? choice.delta?.reasoning_content) : choice.text) ?? "";
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

/** A standard normal draw (Box-Muller) from the seeded uniform generator. */
function normal(rand: () => number): number {
  return Math.sqrt(-2 * Math.log(1 - rand())) * Math.cos(2 * Math.PI * rand());
}

/** A gamma(shape, 1) draw (Marsaglia and Tsang; shape < 1 boosted by U^(1/shape)). */
export function gammaDraw(shape: number, rand: () => number): number {
  if (shape < 1) return gammaDraw(shape + 1, rand) * Math.pow(1 - rand(), 1 / shape);
  const d = shape - 1 / 3;
  const c = 1 / Math.sqrt(9 * d);
  for (;;) {
    const z = normal(rand);
    const v = (1 + c * z) ** 3;
    if (v <= 0) continue;
    const u = 1 - rand();
    if (Math.log(u) < 0.5 * z * z + d - d * v + d * Math.log(v)) return d * v;
  }
}

/** Waits until GET /v1/models answers (the server is up), for at most `seconds`. */
async function waitReady(args: BenchServeArgs): Promise<Response> {
  const deadline = performance.now() + args.readyCheckTimeoutSec * 1000;
  for (;;) {
    try {
      return await fetch(`${args.baseUrl}/v1/models`, { headers: headers(args) });
    } catch (e) {
      if (performance.now() >= deadline) throw new Error(`${args.baseUrl} did not answer within --ready-check-timeout-sec ${args.readyCheckTimeoutSec}: ${(e as Error).message}`);
      await new Promise((r) => setTimeout(r, 500));
    }
  }
}

export type BenchResult = Record<string, unknown>;

export async function runBenchServe(args: BenchServeArgs, log: (line: string) => void = (l) => process.stdout.write(`${l}\n`)): Promise<BenchResult> {
  const res = await waitReady(args);
  if (!res.ok) throw new Error(`GET /v1/models failed with ${res.status}: ${await res.text()}`);
  const model = args.servedModelName ?? args.model ?? ((await res.json()) as { data: { id: string }[] }).data[0]!.id;
  const tok = new ServerTokenizer(args, model);
  const rand = mulberry32(args.seed + 1);
  let requests = args.datasetName === "random" || args.datasetName === "prefix-repetition"
    ? buildRequests(args, await tokenPool(tok))
    : await textRequests(args, tok, mulberry32(args.seed));
  // the chat API takes text: random ids are sent as their decoded text (their count stays the prompt length)
  if (args.backend === "openai-chat")
    requests = await Promise.all(requests.map(async (r) => (typeof r.prompt === "string" ? r : { ...r, prompt: await tok.decode(r.prompt) })));

  if (args.numWarmups > 0) {
    if (!args.quiet) log(`Warming up with ${args.numWarmups} requests...`);
    for (let i = 0; i < args.numWarmups; i++) await sendRequest(args, model, requests[i % requests.length]!, `${args.requestIdPrefix}warmup-${i}`);
  }
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

  if (!args.quiet) {
    log(`Traffic request rate: ${Number.isFinite(args.requestRate) ? args.requestRate : "inf"}`);
    log(`Burstiness factor: ${args.burstiness} (${args.burstiness === 1 ? "Poisson process" : "Gamma distribution"})`);
    log(`Maximum request concurrency: ${args.maxConcurrency ?? "None"}`);
  }
  const start = performance.now();
  const tasks: Promise<RequestResult>[] = [];
  for (const [i, req] of requests.entries()) {
    tasks.push((async () => {
      await acquire();
      try {
        return await sendRequest(args, model, req, `${args.requestIdPrefix}${i}`);
      } finally {
        release();
      }
    })());
    if (Number.isFinite(args.requestRate)) {
      // gamma inter-arrivals of mean 1 / rate (shape = burstiness; exponential at 1: a Poisson process)
      const wait = (gammaDraw(args.burstiness, rand) / (args.requestRate * args.burstiness)) * 1000;
      await new Promise((r) => setTimeout(r, wait));
    }
  }
  const results = await Promise.all(tasks);
  const duration = (performance.now() - start) / 1000;
  const result = summarize(args, model, results, duration);
  if (!args.quiet) {
    const firstError = results.find((r) => !r.success)?.error;
    if (firstError) log(`First error: ${firstError}`);
    for (const line of formatTable(result, args)) log(line);
  }
  if (args.saveResult || args.resultFilename !== null) {
    const rate = Number.isFinite(args.requestRate) ? args.requestRate : "inf";
    const name = args.resultFilename ?? `${args.label ?? args.backend}-${rate}qps${args.maxConcurrency !== null ? `-concurrency${args.maxConcurrency}` : ""}-${basename(model)}-${String(result.date)}.json`;
    const file = args.resultDir !== null ? join(args.resultDir, name) : name;
    writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
    if (!args.quiet) log(`Saved results to ${file}`);
  }
  return result;
}

/** vLLM's result keys (and, with --save-detailed, each request's). */
function summarize(args: BenchServeArgs, model: string, results: RequestResult[], duration: number): BenchResult {
  const ok = results.filter((r) => r.success);
  const totalInput = ok.reduce((s, r) => s + r.promptLen, 0);
  const totalOutput = ok.reduce((s, r) => s + r.outputTokens, 0);
  const tpot = (r: RequestResult): number => (r.outputTokens > 1 ? (r.latency - r.ttft) / (r.outputTokens - 1) : 0);
  const ms = (xs: number[]) => xs.map((x) => x * 1000);
  const series: Record<BenchMetric, number[]> = {
    ttft: ms(ok.map((r) => r.ttft)),
    tpot: ms(ok.filter((r) => r.outputTokens > 1).map(tpot)),
    itl: ms(ok.flatMap((r) => r.itl)),
    e2el: ms(ok.map((r) => r.latency)),
  };
  let goodput: number | null = null;
  if (args.goodput !== null) {
    const slo = args.goodput;
    const good = ok.filter((r) =>
      (slo.ttft === undefined || r.ttft * 1000 <= slo.ttft) && (slo.tpot === undefined || tpot(r) * 1000 <= slo.tpot) && (slo.e2el === undefined || r.latency * 1000 <= slo.e2el));
    goodput = good.length / duration;
  }
  const now = new Date();
  const pad = (n: number) => String(n).padStart(2, "0");
  const result: BenchResult = {
    date: `${now.getFullYear()}${pad(now.getMonth() + 1)}${pad(now.getDate())}-${pad(now.getHours())}${pad(now.getMinutes())}${pad(now.getSeconds())}`,
    endpoint_type: args.backend, backend: args.backend, label: args.label, model_id: model, tokenizer_id: model,
    num_prompts: results.length, request_rate: Number.isFinite(args.requestRate) ? args.requestRate : "inf", burstiness: args.burstiness,
    max_concurrency: args.maxConcurrency, duration, completed: ok.length, failed: results.length - ok.length,
    total_input_tokens: totalInput, total_output_tokens: totalOutput,
    request_throughput: ok.length / duration, request_goodput: goodput, output_throughput: totalOutput / duration, total_token_throughput: (totalInput + totalOutput) / duration,
    ...args.metadata,
  };
  for (const key of args.percentileMetrics) {
    const xs = series[key];
    result[`mean_${key}_ms`] = mean(xs);
    result[`median_${key}_ms`] = percentile(xs, 50);
    result[`std_${key}_ms`] = Math.sqrt(mean(xs.map((x) => (x - mean(xs)) ** 2)));
    for (const p of args.percentiles) result[`p${p}_${key}_ms`] = percentile(xs, p);
  }
  if (args.saveDetailed) {
    result.input_lens = results.map((r) => r.promptLen);
    result.output_lens = results.map((r) => r.outputTokens);
    result.ttfts = results.map((r) => r.ttft);
    result.itls = results.map((r) => r.itl);
    result.generated_texts = results.map((r) => r.text);
    result.errors = results.map((r) => r.error);
  }
  return result;
}

function formatTable(r: BenchResult, args: BenchServeArgs): string[] {
  const row = (label: string, v: unknown, digits = 2) =>
    `${label.padEnd(40)} ${typeof v === "number" && !Number.isInteger(v) ? v.toFixed(digits) : String(v)}`;
  const lines = [
    `${"=".repeat(12)} Serving Benchmark Result ${"=".repeat(12)}`,
    row("Successful requests:", r.completed),
    row("Failed requests:", r.failed),
    ...(args.maxConcurrency !== null ? [row("Maximum request concurrency:", args.maxConcurrency)] : []),
    row("Benchmark duration (s):", r.duration),
    row("Total input tokens:", r.total_input_tokens),
    row("Total generated tokens:", r.total_output_tokens),
    row("Request throughput (req/s):", r.request_throughput),
    ...(r.request_goodput !== null ? [row("Request goodput (req/s):", r.request_goodput)] : []),
    row("Output token throughput (tok/s):", r.output_throughput),
    row("Total Token throughput (tok/s):", r.total_token_throughput),
  ];
  const titles: Record<BenchMetric, [string, string]> = {
    ttft: ["Time to First Token", "TTFT"], tpot: ["Time per Output Token (excl. 1st token)", "TPOT"],
    itl: ["Inter-token Latency", "ITL"], e2el: ["End-to-end Latency", "E2EL"],
  };
  for (const key of args.percentileMetrics) {
    const [title, short] = titles[key];
    const pad = Math.max(0, 50 - title.length - 2);
    lines.push(`${"-".repeat(Math.floor(pad / 2))} ${title} ${"-".repeat(Math.ceil(pad / 2))}`);
    lines.push(row(`Mean ${short} (ms):`, r[`mean_${key}_ms`]), row(`Median ${short} (ms):`, r[`median_${key}_ms`]));
    for (const p of args.percentiles) lines.push(row(`P${p} ${short} (ms):`, r[`p${p}_${key}_ms`]));
  }
  lines.push("=".repeat(50));
  return lines;
}
