// Prometheus metrics with vLLM's names (`vllm:*`, label model_name), on a per-server Registry.
// Gauges are read from engine.stats() at scrape time; latencies are measured here, around each request's stream.
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { KvTransferService } from "./kv-transfer.js";
import type { EngineClient, FinishReason, RequestMetrics, TokenStep } from "../engine/types.js";
import type { ResolvedEngineArgs } from "../engine/engine-core.js";
import { epochNow } from "../engine/output-pacing.js";
import { sleepStateGauge } from "../engine/sleep-mode.js";

// Bucket edges as in vLLM's v1 metrics loggers (seconds).
const TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560];
const ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80];
const LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680];
const N_BUCKETS = [1, 2, 5, 10, 20];

/** vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max (token-count histograms up to max_model_len). */
export function buckets125(max: number): number[] {
  const out: number[] = [];
  for (let exp = 1; ; exp *= 10)
    for (const m of [1, 2, 5]) {
      if (m * exp > max) return out;
      out.push(m * exp);
    }
}

/** What one finished engine request (one prompt, its n choices) adds to the per-request histograms. */
export interface FinishedRequestStats {
  promptTokens: number;
  /** Generated tokens of each of the request's n choices. */
  choiceTokens: number[];
  maxTokens: number | null;
  /** The engine's timestamps for the request, when it reported them. */
  times: RequestMetrics | null;
}

/**
 * vLLM's CacheConfig fields that its vllm:cache_config_info labels name (metrics_info(): each field as Python's str()
 * writes it), and the engine index; an info metric, always 1.
 */
const CACHE_CONFIG_LABELS = [
  "block_size", "gpu_memory_utilization", "cache_dtype", "is_attention_free", "num_gpu_blocks_override", "sliding_window",
  "enable_prefix_caching", "prefix_caching_hash_algo", "mamba_block_size", "mamba_cache_dtype", "mamba_ssm_cache_dtype",
  "mamba_cache_mode", "num_gpu_blocks", "num_cpu_blocks", "kv_sharing_fast_prefill", "kv_cache_memory_bytes",
  "kv_offloading_size", "kv_offloading_backend", "engine",
] as const;

/** A value as Python's str() writes it: True, None, 0.9, and 1.0 for a float that is whole. */
function pyStr(v: unknown, float = false): string {
  if (v === null || v === undefined) return "None";
  if (typeof v === "boolean") return v ? "True" : "False";
  return float && typeof v === "number" && Number.isInteger(v) ? v.toFixed(1) : String(v);
}

/** The labels of vllm:cache_config_info: the engine's pool, and kiln serve's cache flags (vLLM's defaults without them). */
function cacheConfigInfo(args: Readonly<ResolvedEngineArgs>, launch: Record<string, unknown>): Record<(typeof CACHE_CONFIG_LABELS)[number], string> {
  return {
    block_size: pyStr(args.blockSize), gpu_memory_utilization: pyStr(launch.gpuMemoryUtilization ?? 0.9, true),
    cache_dtype: pyStr(launch.kvCacheDtype ?? "auto"), is_attention_free: "False",
    num_gpu_blocks_override: pyStr(launch.numGpuBlocksOverride), sliding_window: "None",
    enable_prefix_caching: pyStr(args.enablePrefixCaching), prefix_caching_hash_algo: "sha256", // kv-cache-manager.ts hashes so
    mamba_block_size: "None", mamba_cache_dtype: "auto", mamba_ssm_cache_dtype: "auto", mamba_cache_mode: "none",
    num_gpu_blocks: pyStr(args.numGpuBlocks), num_cpu_blocks: "None", kv_sharing_fast_prefill: "False",
    kv_cache_memory_bytes: pyStr(launch.kvCacheMemoryBytes), kv_offloading_size: "None", kv_offloading_backend: "native",
    engine: "0",
  };
}

export class ServerMetrics {
  readonly registry = new Registry();
  private readonly labels: { model_name: string };
  private readonly promptTokens: Counter<"model_name">;
  private readonly generationTokens: Counter<"model_name">;
  private readonly requestSuccess: Counter<"model_name" | "finished_reason">;
  private readonly ttft: Histogram<"model_name">;
  private readonly itl: Histogram<"model_name">;
  private readonly e2e: Histogram<"model_name">;
  private readonly queueTime: Histogram<"model_name">;
  private readonly requestPromptTokens: Histogram<"model_name">;
  private readonly requestGenerationTokens: Histogram<"model_name">;
  private readonly requestMaxGenerationTokens: Histogram<"model_name">;
  private readonly paramsN: Histogram<"model_name">;
  private readonly paramsMaxTokens: Histogram<"model_name">;
  private readonly prefillTime: Histogram<"model_name">;
  private readonly decodeTime: Histogram<"model_name">;
  private readonly inferenceTime: Histogram<"model_name">;
  /** The per-token series bound to this server's labels (recordTokens runs per token: no label hashing there). */
  private readonly perToken: { tokens: { inc(n: number): void }; ttft: { observe(v: number): void }; itl: { observe(v: number): void } };

  /** maxModelLen bounds the token-count histograms' buckets, as vLLM's max_model_len does. */
  /** @param kvTransfer P/D disaggregation's side channel (--kv-transfer-config), whose counters are exported too. */
  /** @param launchConfig kiln serve's arguments (its cache flags label vllm:cache_config_info), or null: their defaults. */
  constructor(
    engine: EngineClient, modelName: string, maxModelLen: number, kvTransfer: Pick<KvTransferService, "counts" | "holding"> | null = null,
    launchConfig: Record<string, unknown> | null = null,
  ) {
    const registers = [this.registry];
    if (engine.engineArgs !== undefined) {
      const info = new Gauge({ name: "vllm:cache_config_info", help: "Information of the LLMEngine CacheConfig", labelNames: CACHE_CONFIG_LABELS, registers });
      info.set(cacheConfigInfo(engine.engineArgs, launchConfig ?? {}), 1);
    }
    const labelNames = ["model_name"] as const;
    this.labels = { model_name: modelName };
    const labels = this.labels;
    const gauge = (name: string, help: string, read: () => number): void => {
      new Gauge({ name, help, labelNames, registers, collect() { this.set(labels, read()); } });
    };
    gauge("vllm:num_requests_running", "Number of requests in model execution batches.", () => engine.stats().numRunning);
    gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", () => engine.stats().numWaiting);
    gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", () => engine.stats().kvCacheUsage);
    gauge("kiln:kv_cache_free_blocks", "Free blocks in the KV cache pool.", () => engine.stats().numFreeBlocks);
    gauge("kiln:kv_cache_total_blocks", "Total blocks in the KV cache pool.", () => engine.stats().numTotalBlocks);

    // Cumulative engine counters: each scrape adds the growth since the previous scrape, from the server's start (a
    // fresh server's are 0, as vLLM's: kiln serve's warm-up request before it is not counted).
    const counterFromStats = (name: string, help: string, read: () => number): void => {
      let last = read();
      new Counter({
        name, help, labelNames, registers,
        collect() {
          const now = read();
          this.inc(labels, Math.max(0, now - last)); // a zero counter is exported as 0, as vLLM's are
          last = Math.max(last, now);
        },
      });
    };
    counterFromStats("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", () => engine.stats().prefixCacheQueries);
    counterFromStats("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", () => engine.stats().prefixCacheHits);
    counterFromStats("vllm:num_preemptions_total", "Cumulative number of preemptions from the engine.", () => engine.stats().numPreemptions);
    if (engine.stats().specDraftTokens !== undefined) {
      counterFromStats("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", () => engine.stats().specDrafts ?? 0);
      counterFromStats("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", () => engine.stats().specDraftTokens ?? 0);
      counterFromStats("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", () => engine.stats().specAcceptedTokens ?? 0);
      // one series per draft position, each growing by its own increase since the previous scrape
      const lastPerPosition: number[] = [...(engine.stats().specAcceptedPerPosition ?? [])];
      new Counter({
        name: "vllm:spec_decode_num_accepted_tokens_per_pos_total", help: "Accepted tokens per draft position.",
        labelNames: ["model_name", "position"] as const, registers,
        collect() {
          (engine.stats().specAcceptedPerPosition ?? []).forEach((now, pos) => {
            this.inc({ ...labels, position: String(pos) }, Math.max(0, now - (lastPerPosition[pos] ?? 0)));
            lastPerPosition[pos] = Math.max(lastPerPosition[pos] ?? 0, now);
          });
        },
      });
    }

    if (engine.stats().kvEvents !== undefined) {
      const ev = () => engine.stats().kvEvents!;
      counterFromStats("kiln:kv_events_published_batches_total", "KV-cache event batches published (--kv-events-config).", () => ev().publishedBatches);
      counterFromStats("kiln:kv_events_dropped_batches_total", "KV-cache event batches dropped: the publisher was not connected.", () => ev().droppedBatches);
      counterFromStats("kiln:kv_events_dropped_events_total", "KV-cache events in the dropped batches.", () => ev().droppedEvents);
    }

    if (kvTransfer !== null) {
      const c = kvTransfer.counts;
      counterFromStats("kiln:kv_transfer_exported_total", "Prefills whose prompt K/V was kept for a remote decode.", () => c.exported);
      counterFromStats("kiln:kv_transfer_served_total", "K/V snapshots read by decode servers over the side channel.", () => c.served);
      counterFromStats("kiln:kv_transfer_expired_total", "K/V snapshots dropped unread after their timeout.", () => c.expired);
      counterFromStats("kiln:kv_transfer_evicted_total", "K/V snapshots dropped unread to stay under the held-bytes cap.", () => c.evicted);
      counterFromStats("kiln:kv_transfer_imported_total", "Decodes that read a prefill server's K/V.", () => c.imported);
      counterFromStats("kiln:kv_transfer_import_failures_total", "Decodes whose prefill K/V could not be fetched (they computed the prompt).", () => c.importFailures);
      gauge("kiln:kv_transfer_held_bytes", "Bytes of K/V snapshots held for decode servers.", () => kvTransfer.holding.bytes);
    }

    if (engine.stats().sleep !== undefined) {
      // (--enable-sleep-mode) vLLM's three series: awake 1 when awake; weights_offloaded / discard_all 1 at level 1 / 2
      new Gauge({
        name: "vllm:engine_sleep_state",
        help: "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
        labelNames: ["model_name", "sleep_state"] as const, registers,
        collect() {
          for (const [state, v] of Object.entries(sleepStateGauge(engine.stats().sleep))) this.set({ ...labels, sleep_state: state }, v);
        },
      });
    }

    if (engine.stats().lora !== undefined) {
      // vLLM's info gauge: the adapters in use as labels, the scrape time (seconds) as the value
      new Gauge({
        name: "vllm:lora_requests_info", help: "Running stats on lora requests.",
        labelNames: ["max_lora", "running_lora_adapters", "waiting_lora_adapters"] as const, registers,
        collect() {
          const l = engine.stats().lora!;
          this.reset();
          this.set({ max_lora: String(l.maxLoras), running_lora_adapters: l.running.join(","), waiting_lora_adapters: l.waiting.join(",") }, Date.now() / 1000);
        },
      });
    }

    this.promptTokens = new Counter({ name: "vllm:prompt_tokens_total", help: "Number of prefill tokens processed.", labelNames, registers });
    this.generationTokens = new Counter({ name: "vllm:generation_tokens_total", help: "Number of generation tokens processed.", labelNames, registers });
    this.requestSuccess = new Counter({
      name: "vllm:request_success_total", help: "Count of successfully processed requests.",
      labelNames: ["model_name", "finished_reason"] as const, registers,
    });
    // Exported as 0 before the first request, as vLLM's are (a missing series reads as "no data" in rate()).
    this.promptTokens.inc(labels, 0);
    this.generationTokens.inc(labels, 0);
    const histogram = (name: string, help: string, buckets: number[]) => new Histogram({ name, help, buckets, labelNames, registers });
    this.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS);
    this.itl = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS);
    this.perToken = { tokens: this.generationTokens.labels(labels), ttft: this.ttft.labels(labels), itl: this.itl.labels(labels) };
    this.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", LATENCY_BUCKETS);
    this.queueTime = histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", LATENCY_BUCKETS);
    this.inferenceTime = histogram("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", LATENCY_BUCKETS);
    this.prefillTime = histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", LATENCY_BUCKETS);
    this.decodeTime = histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", LATENCY_BUCKETS);
    const tokenBuckets = buckets125(Math.max(1, maxModelLen));
    this.requestPromptTokens = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokenBuckets);
    this.requestGenerationTokens = histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", tokenBuckets);
    this.requestMaxGenerationTokens = histogram("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.", tokenBuckets);
    this.paramsN = histogram("vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS);
    this.paramsMaxTokens = histogram("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tokenBuckets);
    for (const r of ["stop", "length", "abort"]) this.requestSuccess.inc({ ...labels, finished_reason: r }, 0);
  }

  /** Starts timing one engine request (one prompt); call the returned tracker as outputs arrive. */
  track(promptTokens: number): RequestTracker {
    this.promptTokens.inc(this.labels, promptTokens);
    return new RequestTracker(this);
  }

  /** @internal */ recordTokens(n: number, sinceLastS: number | null, firstS: number | null): void {
    if (n > 0) this.perToken.tokens.inc(n);
    if (firstS !== null) this.perToken.ttft.observe(firstS);
    if (sinceLastS !== null) this.perToken.itl.observe(sinceLastS);
  }

  /** @internal */ recordFinish(reason: FinishReason | "error", e2eS: number, queueS: number | null, stats: FinishedRequestStats | null): void {
    this.requestSuccess.inc({ ...this.labels, finished_reason: reason ?? "abort" });
    this.e2e.observe(this.labels, e2eS);
    if (queueS !== null && queueS >= 0) this.queueTime.observe(this.labels, queueS);
    if (stats === null) return;
    // as vLLM's per-request histograms: one observation per prompt, its choices' tokens summed (and their most)
    this.requestPromptTokens.observe(this.labels, stats.promptTokens);
    this.requestGenerationTokens.observe(this.labels, stats.choiceTokens.reduce((a, b) => a + b, 0));
    this.requestMaxGenerationTokens.observe(this.labels, Math.max(0, ...stats.choiceTokens));
    this.paramsN.observe(this.labels, stats.choiceTokens.length);
    if (stats.maxTokens !== null) this.paramsMaxTokens.observe(this.labels, stats.maxTokens);
    // phases from the engine's own timestamps: prefill = first token - first scheduled, decode = last - first token
    const t = stats.times;
    if (t?.firstScheduledTime != null && t.firstTokenTime != null && t.lastTokenTime != null) {
      this.prefillTime.observe(this.labels, Math.max(0, t.firstTokenTime - t.firstScheduledTime) / 1000);
      this.decodeTime.observe(this.labels, Math.max(0, t.lastTokenTime - t.firstTokenTime) / 1000);
      this.inferenceTime.observe(this.labels, Math.max(0, t.lastTokenTime - t.firstScheduledTime) / 1000);
    }
  }

  async render(): Promise<string> {
    return this.registry.metrics();
  }
}

/**
 * Per-request latency bookkeeping (TTFT from server arrival, ITL between token-bearing engine steps: the steps an
 * output carries when the engine held some back, RequestOutput.tokenSteps, else the output's arrival).
 */
export class RequestTracker {
  private readonly start = epochNow();
  private lastTokenAt: number | null = null;
  private done = false;

  constructor(private readonly metrics: ServerMetrics) {}

  onTokens(n: number, steps?: readonly TokenStep[]): void {
    if (n <= 0) return;
    if (steps === undefined || steps.length === 0) return this.step(n, epochNow());
    for (const s of steps) this.step(s.tokens, s.time);
  }

  private step(n: number, at: number): void {
    const first = this.lastTokenAt === null ? Math.max(0, at - this.start) / 1000 : null;
    const gap = this.lastTokenAt !== null ? Math.max(0, at - this.lastTokenAt) / 1000 : null;
    this.metrics.recordTokens(n, gap, first);
    this.lastTokenAt = at;
  }

  /** stats: the request's token counts and engine times, when it ran to a finish the engine reported. */
  finish(reason: FinishReason | "error", queueSeconds: number | null = null, stats: FinishedRequestStats | null = null): void {
    if (this.done) return;
    this.done = true;
    this.metrics.recordFinish(reason, (epochNow() - this.start) / 1000, queueSeconds, stats);
  }
}
