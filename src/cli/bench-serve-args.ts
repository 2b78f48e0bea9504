// `kiln bench serve`'s flags: vLLM's `vllm bench serve` flags, so that a benchmark command line runs unchanged.
// Flags that only configure vLLM's local tokenizer (Kiln counts with the server's /tokenize) are accepted as such.
import { Command, Option } from "commander";
import { BENCH_METRICS, benchServeDefaults, type BenchBackend, type BenchDataset, type BenchMetric, type BenchServeArgs, type GoodputMetric } from "./bench-serve.js";
import { int, jsonObjectFlag, num, oneOf } from "./serve-flag-values.js";
import { CliUsageError } from "./usage-error.js";

const BACKENDS: readonly BenchBackend[] = ["vllm", "openai", "openai-chat"];
const DATASETS: readonly BenchDataset[] = ["random", "prefix-repetition", "custom", "sharegpt"];
const CHAT_ENDPOINT = "/v1/chat/completions";

export function addBenchServeOptions(cmd: Command): Command {
  const d = benchServeDefaults();
  return cmd
    .addOption(new Option("--backend <name>", "API the requests use: vllm and openai send completions, openai-chat chat completions").choices([...BACKENDS]).default(d.backend))
    .option("--endpoint <path>", "route of the requests (default: /v1/completions, /v1/chat/completions for openai-chat)")
    .option("--base-url <url>", "server URL (default: http://--host:--port)")
    .option("--host <host>", "server host", "127.0.0.1")
    .option("--port <n>", "server port", "8000")
    .option("--model <name>", "model name (default: the server's first model)")
    .option("--served-model-name <name>", "the name requests use, when not --model")
    .option("--tokenizer <name>", "accepted for vLLM compatibility: prompts are counted by the server's /tokenize")
    .option("--trust-remote-code", "accepted for vLLM compatibility (no local tokenizer is loaded)", false)
    .option("--dataset-name <name>", `${DATASETS.join(" | ")}`, d.datasetName)
    .option("--dataset-path <file>", "the dataset file: custom: JSONL with a \"prompt\" per line; sharegpt: ShareGPT's JSON")
    .option("--random-input-len <n>", "input tokens per request", String(d.randomInputLen))
    .option("--random-output-len <n>", "output tokens per request", String(d.randomOutputLen))
    .option("--random-prefix-len <n>", "shared prefix tokens before each random input", String(d.randomPrefixLen))
    .option("--random-range-ratio <r>", "draw each length uniformly within len * (1 -+ r), 0 <= r < 1", String(d.randomRangeRatio))
    .option("--prefix-repetition-prefix-len <n>", "prefix tokens", String(d.prefixRepetitionPrefixLen))
    .option("--prefix-repetition-suffix-len <n>", "suffix tokens", String(d.prefixRepetitionSuffixLen))
    .option("--prefix-repetition-num-prefixes <n>", "distinct prefixes", String(d.prefixRepetitionNumPrefixes))
    .option("--prefix-repetition-output-len <n>", "output tokens per request", String(d.prefixRepetitionOutputLen))
    .option("--custom-output-len <n>", "output tokens per custom-dataset request", String(d.customOutputLen))
    .option("--custom-skip-chat-template", "send custom prompts as written, not in the chat template", false)
    .option("--sharegpt-output-len <n>", "output tokens per ShareGPT request (default: its reply's length)")
    .option("--no-oversample", "with fewer usable prompts than --num-prompts, send those only")
    .option("--disable-shuffle", "keep the dataset's order", false)
    .option("--num-prompts <n>", "number of requests", String(d.numPrompts))
    .option("--num-warmups <n>", "requests sent one at a time before the measured run", String(d.numWarmups))
    .option("--request-rate <r>", "mean requests per second, or inf (all at once)", "inf")
    .option("--burstiness <f>", "arrival gamma shape: 1 Poisson, < 1 burstier, > 1 more even", String(d.burstiness))
    .option("--max-concurrency <n>", "maximum concurrent requests")
    .option("--ignore-eos", "ask the server to ignore EOS", false)
    .option("--seed <n>", "random seed", String(d.seed))
    .option("--temperature <t>", "sampling temperature (default 0: greedy)")
    .option("--top-p <p>", "nucleus sampling probability")
    .option("--top-k <k>", "top-k sampling")
    .option("--min-p <p>", "min-p sampling")
    .option("--extra-body <json>", "JSON object merged into every request body")
    .option("--api-key <key>", "API key (env KILN_API_KEY, else OPENAI_API_KEY)")
    .option("--percentile-metrics <list>", `comma-separated metrics to report (${BENCH_METRICS.join(", ")})`, d.percentileMetrics.join(","))
    .option("--metric-percentiles <list>", "comma-separated percentiles", "99")
    .option("--goodput <slo...>", "SLOs in ms as KEY:VALUE (ttft, tpot, e2el): requests meeting all count toward request goodput")
    .option("--request-id-prefix <prefix>", "each request's X-Request-Id is this prefix and its index", d.requestIdPrefix)
    .option("--ready-check-timeout-sec <s>", "how long to wait for the server to come up (0: not at all)", String(d.readyCheckTimeoutSec))
    .option("--label <name>", "the result's label and file name prefix (default: the backend)")
    .option("--metadata <kv...>", "KEY=VALUE pairs added to the result JSON")
    .option("--save-result", "write the JSON result to a file", false)
    .option("--save-detailed", "with --save-result: also each request's lengths, timings, text and error", false)
    .option("--result-dir <dir>", "directory of the result file (default: the current one)")
    .option("--result-filename <file>", "JSON result file name")
    .option("--disable-tqdm", "accepted for vLLM compatibility (Kiln draws no progress bar)", false);
}

/** Validates commander's values (strings) into BenchServeArgs. */
export function parseBenchServeArgs(o: Record<string, unknown>, env: NodeJS.ProcessEnv = process.env): BenchServeArgs {
  const d = benchServeDefaults();
  const i = (flag: string, key: string, min = 0) => int(o[key], flag, min);
  const backend = oneOf(o.backend, "--backend", BACKENDS);
  const datasetName = oneOf(o.datasetName, "--dataset-name", DATASETS);
  const endpoint = (o.endpoint as string | undefined) ?? (backend === "openai-chat" ? CHAT_ENDPOINT : "/v1/completions");
  if ((backend === "openai-chat") !== (endpoint === CHAT_ENDPOINT))
    throw new CliUsageError(`--backend ${backend} sends ${backend === "openai-chat" ? "chat completions: --endpoint must be /v1/chat/completions" : `completions: --endpoint ${endpoint} is the chat route (use --backend openai-chat)`}`);
  const datasetPath = (o.datasetPath as string | undefined) ?? null;
  if ((datasetName === "custom" || datasetName === "sharegpt") && datasetPath === null) throw new CliUsageError(`--dataset-name ${datasetName} needs --dataset-path`);
  const ratio = num(o.randomRangeRatio, "--random-range-ratio", 0);
  if (ratio >= 1) throw new CliUsageError(`--random-range-ratio must be in [0, 1), got ${String(o.randomRangeRatio)}`);
  const requestRate = o.requestRate === "inf" ? Infinity : num(o.requestRate, "--request-rate", 0);
  if (requestRate === 0) throw new CliUsageError("--request-rate must be > 0 or inf");
  const burstiness = num(o.burstiness, "--burstiness", 0);
  if (burstiness === 0) throw new CliUsageError("--burstiness must be > 0");
  const sampling: Record<string, number> = {};
  if (o.temperature !== undefined) sampling.temperature = num(o.temperature, "--temperature", 0);
  if (o.topP !== undefined) sampling.top_p = num(o.topP, "--top-p", 0);
  if (o.topK !== undefined) sampling.top_k = int(o.topK, "--top-k", -1);
  if (o.minP !== undefined) sampling.min_p = num(o.minP, "--min-p", 0);
  const metrics = String(o.percentileMetrics).split(",").map((m) => oneOf(m.trim(), "--percentile-metrics", BENCH_METRICS)) as BenchMetric[];
  return {
    ...d,
    baseUrl: (typeof o.baseUrl === "string" ? o.baseUrl : `http://${String(o.host)}:${i("--port", "port", 1)}`).replace(/\/+$/, "").replace(/\/v1$/, ""),
    model: (o.model as string | undefined) ?? null,
    servedModelName: (o.servedModelName as string | undefined) ?? null,
    backend,
    endpoint,
    datasetName,
    datasetPath,
    randomInputLen: i("--random-input-len", "randomInputLen", 1),
    randomOutputLen: i("--random-output-len", "randomOutputLen", 1),
    randomPrefixLen: i("--random-prefix-len", "randomPrefixLen"),
    randomRangeRatio: ratio,
    prefixRepetitionPrefixLen: i("--prefix-repetition-prefix-len", "prefixRepetitionPrefixLen"),
    prefixRepetitionSuffixLen: i("--prefix-repetition-suffix-len", "prefixRepetitionSuffixLen"),
    prefixRepetitionNumPrefixes: i("--prefix-repetition-num-prefixes", "prefixRepetitionNumPrefixes", 1),
    prefixRepetitionOutputLen: i("--prefix-repetition-output-len", "prefixRepetitionOutputLen", 1),
    customOutputLen: i("--custom-output-len", "customOutputLen", 1),
    customSkipChatTemplate: o.customSkipChatTemplate === true,
    sharegptOutputLen: o.sharegptOutputLen === undefined ? null : i("--sharegpt-output-len", "sharegptOutputLen", 1),
    noOversample: o.oversample === false,
    disableShuffle: o.disableShuffle === true,
    numPrompts: i("--num-prompts", "numPrompts", 1),
    numWarmups: i("--num-warmups", "numWarmups"),
    requestRate,
    burstiness,
    maxConcurrency: o.maxConcurrency === undefined ? null : i("--max-concurrency", "maxConcurrency", 1),
    ignoreEos: o.ignoreEos === true,
    seed: i("--seed", "seed"),
    apiKey: (o.apiKey as string | undefined) ?? env.KILN_API_KEY ?? env.OPENAI_API_KEY ?? null,
    sampling,
    extraBody: o.extraBody === undefined ? {} : jsonObjectFlag(o.extraBody, "--extra-body", '{"seed": 42}'),
    percentileMetrics: [...new Set(metrics)],
    percentiles: String(o.metricPercentiles).split(",").map((p) => {
      const v = num(p.trim(), "--metric-percentiles", 0);
      if (v > 100) throw new CliUsageError(`--metric-percentiles must be in [0, 100], got ${p}`);
      return v;
    }),
    goodput: o.goodput === undefined ? null : parseGoodput(o.goodput as string[]),
    requestIdPrefix: String(o.requestIdPrefix),
    readyCheckTimeoutSec: num(o.readyCheckTimeoutSec, "--ready-check-timeout-sec", 0),
    label: (o.label as string | undefined) ?? null,
    metadata: Object.fromEntries(((o.metadata as string[] | undefined) ?? []).map((kv) => {
      const at = kv.indexOf("=");
      if (at <= 0) throw new CliUsageError(`--metadata takes KEY=VALUE pairs, got ${JSON.stringify(kv)}`);
      return [kv.slice(0, at), kv.slice(at + 1)];
    })),
    saveResult: o.saveResult === true,
    saveDetailed: o.saveDetailed === true,
    resultDir: (o.resultDir as string | undefined) ?? null,
    resultFilename: (o.resultFilename as string | undefined) ?? null,
    quiet: false,
  };
}

/** vLLM's --goodput: KEY:VALUE pairs, VALUE in ms (>= 0), KEY one of ttft, tpot, e2el. */
function parseGoodput(pairs: string[]): Partial<Record<GoodputMetric, number>> {
  const slo: Partial<Record<GoodputMetric, number>> = {};
  for (const pair of pairs) {
    const [key, value, extra] = pair.split(":");
    if (value === undefined || extra !== undefined) throw new CliUsageError(`--goodput takes KEY:VALUE pairs (ttft:500 tpot:50), got ${JSON.stringify(pair)}`);
    const metric = oneOf(key, "--goodput's key", ["ttft", "tpot", "e2el"] as const);
    slo[metric] = num(value, `--goodput ${metric}`, 0);
  }
  return slo;
}
