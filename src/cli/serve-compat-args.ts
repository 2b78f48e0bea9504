// vLLM `serve` flags with no counterpart in Kiln, so that a pasted vLLM command line runs: each is accepted where
// it cannot change a reply (said at start-up when the value given would have done something in vLLM), or refused
// where what it asks for cannot be done. Also vLLM's multi-letter short flags (-tp, -pp, -dp), which commander
// cannot declare.
import type { Command } from "commander";
import { int, jsonObjectFlag, num, oneOf } from "./serve-flag-values.js";
import { CliUsageError } from "./usage-error.js";

/** vLLM's short flags of more than one letter, as the long flags they stand for. */
const MULTI_LETTER_SHORT_FLAGS: Record<string, string> = {
  "-tp": "--tensor-parallel-size",
  "-pp": "--pipeline-parallel-size",
  "-dp": "--data-parallel-size",
};

/** `words` with -tp 2 (or -tp=2) written as --tensor-parallel-size 2, and so on; other words as they are. */
export function expandMultiLetterShortFlags(words: string[]): string[] {
  return words.map((w) => {
    const eq = w.indexOf("=");
    const long = MULTI_LETTER_SHORT_FLAGS[eq < 0 ? w : w.slice(0, eq)];
    return long === undefined ? w : eq < 0 ? long : `${long}${w.slice(eq)}`;
  });
}

/**
 * vLLM engine flags for GPU kernels, clusters and caches Kiln does not have, which cannot change a reply: accepted,
 * with a warning when given. `<v>`: the flag takes a value; otherwise it is a switch (warned when on).
 */
const NO_EFFECT_FLAGS: readonly (readonly [flag: string, why: string])[] = [
  ["--max-parallel-loading-workers <v>", "the weights are read by one process"],
  ["--all2all-backend <v>", "one rank holds every expert (no all-to-all)"],
  ["--enable-dbo", "no dual-batch overlap: one CPU stream computes each step"],
  ["--dbo-decode-token-threshold <v>", "no dual-batch overlap"],
  ["--dbo-prefill-token-threshold <v>", "no dual-batch overlap"],
  ["--disable-nccl-for-dp-synchronization", "no NCCL (one engine per server)"],
  ["--enable-eplb", "no expert load balancing: one rank holds every expert"],
  ["--eplb-config <v>", "no expert load balancing: one rank holds every expert"],
  ["--expert-placement-strategy <v>", "one rank holds every expert"],
  ["--ray-workers-use-nsight", "no Ray workers"],
  ["--calculate-kv-scales", "fp8 KV caches store values unscaled (scale 1.0, vLLM's default)"],
  ["--kv-sharing-fast-prefill", "no cross-layer KV sharing"],
  ["--disable-hybrid-kv-cache-manager", "one KV cache manager serves every model"],
  ["--prefix-caching-hash-algo <v>", "prefix blocks are hashed Kiln's way; hits are the same"],
  ["--num-lookahead-slots <v>", "speculative decoding reserves its own slots"],
  ["--mm-processor-cache-gb <v>", "images are processed per request"],
  ["--mm-processor-cache-type <v>", "images are processed per request"],
  ["--mm-shm-cache-max-object-size-mb <v>", "images are processed per request"],
  ["--mm-encoder-tp-mode <v>", "the vision tower runs on one rank"],
  ["--mm-encoder-attn-backend <v>", "the vision tower has one attention kernel"],
  ["--skip-mm-profiling", "no memory profiling run at start-up"],
  ["--disable-mm-preprocessor-cache", "images are processed per request"],
  ["--fully-sharded-loras", "LoRA adapters are not split across ranks"],
  ["--lora-extra-vocab-size <v>", "adapters add no vocabulary"],
  ["--use-tqdm-on-load", "the load's progress is Kiln's own"],
  ["--safetensors-load-strategy <v>", "safetensors files are memory-mapped"],
  ["--pt-load-map-location <v>", "PyTorch checkpoints are not read"],
  ["--aggregate-engine-logging", "one engine per server"],
  ["--show-hidden-metrics-for-version <v>", "Kiln exports its current metrics only"],
  ["--cudagraph-capture-sizes <v...>", "step graphs are captured for powers of two up to --max-cudagraph-capture-size"],
  ["--cuda-graph-sizes <v...>", "step graphs are captured for powers of two up to --max-cudagraph-capture-size"],
  ["--enable-offline-docs", "Kiln serves no API docs pages"],
  ["--h11-max-incomplete-event-size <v>", "Node's HTTP server takes up to 16 KiB of request headers"],
  ["--h11-max-header-count <v>", "Node's HTTP server takes up to 2000 request headers"],
  ["--attention-backend <v>", "attention runs in Kiln's one CPU kernel (paged, with an online softmax)"],
  ["--attention-config <v>", "attention runs in Kiln's one CPU kernel (paged, with an online softmax)"],
  ["--allow-deprecated-quantization", "no quantization method Kiln takes is deprecated"],
  ["--kv-cache-metrics", "Kiln exports no KV-cache residency metrics"],
  ["--kv-cache-metrics-sample <v>", "Kiln exports no KV-cache residency metrics"],
  ["--cudagraph-metrics", "step graphs export no metrics of their own"],
  ["--enable-layerwise-nvtx-tracing", "no NVTX ranges (no CUDA)"],
  ["--enable-mfu-metrics", "Kiln exports no MFU metrics (npm run bench reports rooflines)"],
  ["--enable-logging-iteration-details", "Kiln logs no per-step details"],
  ["--enable-mm-processor-stats", "images are processed per request; no processor statistics"],
  ["--mamba-cache-dtype <v>", "no state-space (Mamba) models are served"],
  ["--mamba-ssm-cache-dtype <v>", "no state-space (Mamba) models are served"],
  ["--mamba-block-size <v>", "no state-space (Mamba) models are served"],
  ["--mamba-cache-mode <v>", "no state-space (Mamba) models are served"],
  ["--ubatch-size <v>", "no dual-batch overlap"],
  ["--dcp-kv-cache-interleave-size <v>", "no context parallelism"],
  ["--cp-kv-cache-interleave-size <v>", "no context parallelism"],
  ["--video-pruning-rate <v>", "no video inputs (images only)"],
  ["--specialize-active-lora", "LoRA steps run the same kernels whatever adapters are active"],
  ["--kv-offloading-size <v>", "the KV cache is in host memory already (size it with --kv-cache-memory)"],
  ["--kv-offloading-backend <v>", "the KV cache is in host memory already (size it with --kv-cache-memory)"],
  ["--profiler-config <v>", "no torch profiler (profile Kiln's JS side with node --cpu-prof)"],
  ["--disable-frontend-multiprocessing", "the API server and the engine share one process already (the engine in a worker thread)"],
  // with --data-parallel-size 1, one engine per server: vLLM's external load balancing starts servers this way
  ["--data-parallel-rank <v>", "one engine per server (--data-parallel-size 1); replicas run behind kiln router"],
  ["--data-parallel-start-rank <v>", "one engine per server (--data-parallel-size 1); replicas run behind kiln router"],
  ["--data-parallel-size-local <v>", "one engine per server (--data-parallel-size 1); replicas run behind kiln router"],
  ["--data-parallel-address <v>", "one engine per server (--data-parallel-size 1); replicas run behind kiln router"],
  ["--data-parallel-rpc-port <v>", "one engine per server (--data-parallel-size 1); replicas run behind kiln router"],
  ["--data-parallel-backend <v>", "one engine per server (--data-parallel-size 1); replicas run behind kiln router"],
  ["--data-parallel-hybrid-lb", "one engine per server (--data-parallel-size 1); replicas run behind kiln router"],
  ["--data-parallel-external-lb", "one engine per server (--data-parallel-size 1); replicas run behind kiln router"],
];

/** vLLM flags naming Python classes or other processes' roles, which Kiln cannot take: refused, saying why. */
const REFUSED_FLAGS: readonly (readonly [flag: string, why: string])[] = [
  ["--worker-cls <v>", "it names a Python class"],
  ["--worker-extension-cls <v>", "it names a Python class"],
  ["--scheduler-cls <v>", "it names a Python class (Kiln's scheduler has --scheduling-policy)"],
  ["--headless", "multi-node data parallelism: run one kiln serve per replica behind kiln router"],
  ["--grpc", "Kiln serves HTTP only"],
  ["--middleware <v>", "it names a Python ASGI middleware"],
  ["--tool-server <v>", "Kiln runs no built-in (demo) or MCP tool servers for the Responses API: tools are the client's"],
  ["--tokens-only", "Kiln has no Tokens In<>Out endpoint to serve alone; /v1/completions takes token-id prompts and return_token_ids"],
  ["--enable-per-request-metrics", "replies carry no per-request timing; the /metrics histograms (vllm:time_to_first_token_seconds, ...) have it"],
  ["--otlp-traces-endpoint <v>", "Kiln exports no OpenTelemetry traces; the /metrics histograms hold the request timings"],
  ["--collect-detailed-traces <v...>", "Kiln exports no OpenTelemetry traces; the /metrics histograms hold the request timings"],
  ["--model-weights <v>", "the weights are read from the model argument's files"],
  ["--enable-return-routed-experts", "replies carry no mixture-of-experts routing"],
  ["--enable-mm-embeds", "images come as pixels (image_url parts); precomputed image embeddings are not taken"],
  ["--mm-encoder-only", "the vision tower runs beside the language model, not alone"],
  ["--io-processor-plugin <v>", "it names a Python plugin"],
  ["--reasoning-parser-plugin <v>", "it names a Python plugin (--reasoning-parser takes Kiln's built-in parsers)"],
  ["--default-mm-loras <v>", "a request names its LoRA adapter as its model; none is picked by modality"],
  ["--enable-tower-connector-lora", "LoRA adapters apply to the language model only"],
  ["--ec-transfer-config <v>", "no encoder-cache transfer: images are encoded by the server that serves them"],
  ["--weight-transfer-config <v>", "no weight transfer between trainer and server"],
];

/** commander's option key of a flag: --enable-dbo <v> -> enableDbo. */
const optionKey = (flag: string): string => flag.split(" ")[0]!.slice(2).replace(/-([a-z0-9])/g, (_, c: string) => c.toUpperCase());
const flagName = (flag: string): string => flag.split(" ")[0]!;

/** Declares the flags on `cmd` (serve, generate and chat: they are vLLM engine arguments). */
export function addCompatOptions(cmd: Command): Command {
  for (const [flag, why] of NO_EFFECT_FLAGS) cmd.option(flag, `accepted for vLLM compatibility: ${why}`);
  for (const [flag, why] of REFUSED_FLAGS) cmd.option(flag, `refused: ${why}`);
  return cmd
    .option("--swap-space <GiB>", "accepted for vLLM compatibility: the KV cache is in host memory already, and a preempted request is recomputed")
    .option("--cpu-offload-gb <GiB>", "accepted for vLLM compatibility: the weights are in host memory already (Kiln computes on the CPU)")
    .option("--max-seq-len-to-capture <n>", "accepted for vLLM compatibility: the step graphs serve every length up to --max-model-len")
    .option("--disable-cascade-attn", "accepted for vLLM compatibility: Kiln has no cascade attention to disable", false)
    .option("--disable-log-stats", "accepted for vLLM compatibility: Kiln logs no periodic engine statistics", false)
    .option("--disable-custom-all-reduce", "accepted for vLLM compatibility: tensor parallelism has one all-reduce (no CUDA custom one)", false)
    .option("--distributed-executor-backend <backend>", "how tensor-parallel ranks run: mp (processes, Kiln's) or uni (one rank); ray is refused")
    .option("--max-num-partial-prefills <n>", "accepted for vLLM compatibility: prompts share each step's token budget, as in vLLM's V1 scheduler")
    .option("--max-long-partial-prefills <n>", "accepted for vLLM compatibility: prompts share each step's token budget, as in vLLM's V1 scheduler")
    .option("--api-server-count <n>", "API server processes: 1 (Kiln's one process; for more, run several kiln serve behind kiln router)")
    .option("--enable-expert-parallel", "accepted for vLLM compatibility: one rank holds every expert (mixture-of-experts models are not split)", false)
    .option("--prefill-context-parallel-size <n>", "context-parallel ranks for prefill (only 1: no context parallelism)")
    .option("--decode-context-parallel-size <n>", "context-parallel ranks for decode (only 1: no context parallelism)")
    .option("--limit-mm-per-prompt <json>", 'multimodal items per prompt, as JSON: {"image": 4} (images only: Gemma 3; default 999; {"image": 0} serves text only)');
}

/** Checks the flags' values; those accepted with no effect push a line to `warnings`. */
export function checkCompatArgs(o: Record<string, unknown>, warnings: string[]): void {
  for (const [flag, why] of REFUSED_FLAGS)
    if (o[optionKey(flag)] !== undefined) throw new CliUsageError(`${flagName(flag)} is not supported: ${why}`);
  for (const [flag, why] of NO_EFFECT_FLAGS) {
    const v = o[optionKey(flag)];
    if (v !== undefined && v !== false) warnings.push(`${flagName(flag)}: no effect: ${why}`);
  }
  if (o.swapSpace !== undefined && num(o.swapSpace, "--swap-space", 0) > 0)
    warnings.push("--swap-space: no effect: the KV cache is in host memory already, and a preempted request is recomputed (as vLLM V1 does)");
  if (o.cpuOffloadGb !== undefined && num(o.cpuOffloadGb, "--cpu-offload-gb", 0) > 0)
    warnings.push("--cpu-offload-gb: no effect: the weights are in host memory already (Kiln computes on the CPU)");
  if (o.maxSeqLenToCapture !== undefined) {
    int(o.maxSeqLenToCapture, "--max-seq-len-to-capture", 1);
    warnings.push("--max-seq-len-to-capture: no effect: the step graphs serve every length up to --max-model-len");
  }
  if (o.distributedExecutorBackend !== undefined) {
    const backend = oneOf(o.distributedExecutorBackend, "--distributed-executor-backend", ["mp", "uni", "ray", "external_launcher"]);
    if (backend === "ray" || backend === "external_launcher")
      throw new CliUsageError(`--distributed-executor-backend ${backend} is not supported: Kiln's tensor-parallel ranks are processes it spawns (mp)`);
  }
  for (const [key, flag] of [["maxNumPartialPrefills", "--max-num-partial-prefills"], ["maxLongPartialPrefills", "--max-long-partial-prefills"]] as const)
    if (o[key] !== undefined && int(o[key], flag, 1) > 1)
      warnings.push(`${flag}: no effect: prompts share each step's token budget with no cap on how many are partly computed (vLLM's V1 scheduler)`);
  if (o.apiServerCount !== undefined && int(o.apiServerCount, "--api-server-count", 1) > 1)
    throw new CliUsageError("--api-server-count above 1 is not supported: one kiln serve runs one API server; run several behind kiln router");
  for (const [key, flag] of [["prefillContextParallelSize", "--prefill-context-parallel-size"], ["decodeContextParallelSize", "--decode-context-parallel-size"]] as const)
    if (o[key] !== undefined && int(o[key], flag, 1) > 1)
      throw new CliUsageError(`${flag} above 1 is not supported: Kiln has no context parallelism (--tensor-parallel-size splits a model)`);
  if (o.enableExpertParallel === true)
    warnings.push("--enable-expert-parallel: no effect: one rank holds every expert (Kiln does not split mixture-of-experts models); replies are the same");
  if (o.limitMmPerPrompt !== undefined && Object.entries(parseMmLimits(o.limitMmPerPrompt)).some(([k, n]) => k !== "image" && n > 0))
    warnings.push("--limit-mm-per-prompt: Kiln takes images only (Gemma 3): a request with audio or video parts gets a 400");
}

/**
 * --limit-mm-per-prompt: vLLM's JSON ({"image": 2, "video": {"count": 1, ...}}) or its older image=2,video=1; the
 * count per modality.
 */
export function parseMmLimits(value: unknown): Record<string, number> {
  const flag = "--limit-mm-per-prompt";
  const s = String(value).trim();
  const raw: Record<string, unknown> = s.startsWith("{")
    ? jsonObjectFlag(s, flag, '{"image": 0}')
    : Object.fromEntries(s.split(",").map((kv) => {
        const [k, v, extra] = kv.split("=").map((x) => x.trim());
        if (!k || v === undefined || extra !== undefined) throw new CliUsageError(`${flag} must be JSON such as '{"image": 0}' or image=0,video=0, got ${JSON.stringify(s)}`);
        return [k, Number(v)];
      }));
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(raw)) {
    const n = typeof v === "object" && v !== null && !Array.isArray(v) ? (v as { count?: unknown }).count : v;
    if (!(typeof n === "number" && Number.isInteger(n) && n >= 0)) throw new CliUsageError(`${flag}: ${k} must be a count >= 0 (or {"count": n}), got ${JSON.stringify(v)}`);
    out[k] = n;
  }
  return out;
}
