// The router's own Prometheus metrics, with vllm-router's names (vllm_router_*), on a per-router Registry: requests
// per route and per worker, routing decisions (cache hits / misses / load-balancing events), retries, errors, the two
// phases of P/D disaggregation (vllm_router_pd_*), and each worker's health and load, labelled with its role
// (regular, prefill, decode), read from the pools at scrape time.
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { RoutingDecision } from "./routing-types.js";
import type { WorkerPool } from "./worker-pool.js";

const DURATION_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640, 1800];

export class RouterMetrics {
  readonly registry = new Registry();
  private readonly requests: Counter<"route">;
  private readonly errors: Counter<"route" | "error_type">;
  private readonly retries: Counter;
  private readonly processed: Counter<"worker">;
  private readonly brokenOff: Counter<"worker">;
  private readonly decisions: Counter<"policy" | "worker">;
  private readonly reasons: Counter<"policy" | "reason">;
  private readonly cacheHits: Counter;
  private readonly cacheMisses: Counter;
  private readonly loadBalancing: Counter;
  private readonly duration: Histogram<"route">;
  private readonly pdRequests: Counter<"route">;
  private readonly pdPhaseRequests: { prefill: Counter<"worker">; decode: Counter<"worker"> };
  private readonly pdPrefillErrors: Counter<"worker">;
  private readonly pdDecodeErrors: Counter<"worker">;
  private readonly pdErrors: Counter<"phase" | "error_type">;
  private readonly pdMissingKv: Counter;
  private readonly pdPrefillDuration: Histogram;

  /** `pools`: every worker pool (one "regular", or the "prefill" and "decode" pools of P/D disaggregation). */
  constructor(pools: readonly WorkerPool[]) {
    const registers = [this.registry];
    this.requests = new Counter({ name: "vllm_router_requests_total", help: "Requests received, per route.", labelNames: ["route"] as const, registers });
    this.errors = new Counter({
      name: "vllm_router_request_errors_total", help: "Requests the router answered with its own error, per route and error type.",
      labelNames: ["route", "error_type"] as const, registers,
    });
    this.retries = new Counter({ name: "vllm_router_retries_total", help: "Requests sent again to another worker.", registers });
    this.processed = new Counter({ name: "vllm_router_processed_requests_total", help: "Requests a worker answered, per worker.", labelNames: ["worker"] as const, registers });
    this.brokenOff = new Counter({
      name: "kiln_router_worker_broken_responses_total", help: "Answers a worker broke off midway (the client's response cut, no error the router could send), per worker.",
      labelNames: ["worker"] as const, registers,
    });
    this.decisions = new Counter({
      name: "vllm_router_policy_decisions_total", help: "Workers chosen by the routing policy.", labelNames: ["policy", "worker"] as const, registers,
    });
    this.reasons = new Counter({
      name: "kiln_router_routing_decisions_total", help: "Routing decisions by reason (cache_hit, cache_miss, load_balanced, or the policy's name).",
      labelNames: ["policy", "reason"] as const, registers,
    });
    this.cacheHits = new Counter({ name: "vllm_router_cache_hits_total", help: "cache_aware decisions whose prefix match was over the threshold.", registers });
    this.cacheMisses = new Counter({ name: "vllm_router_cache_misses_total", help: "cache_aware decisions without a prefix match over the threshold.", registers });
    this.loadBalancing = new Counter({ name: "vllm_router_load_balancing_events_total", help: "cache_aware decisions made by load because the fleet was imbalanced.", registers });
    this.duration = new Histogram({
      name: "vllm_router_request_duration_seconds", help: "Time from arrival to the end of the response, per route.",
      labelNames: ["route"] as const, buckets: DURATION_BUCKETS, registers,
    });
    // registered in P/D mode only (unregistered, they count unseen)
    const pdRegisters = pools.some((p) => p.role !== "regular") ? registers : [];
    this.pdRequests = new Counter({ name: "vllm_router_pd_requests_total", help: "Requests routed through a prefill and a decode worker, per route.", labelNames: ["route"] as const, registers: pdRegisters });
    this.pdPhaseRequests = {
      prefill: new Counter({ name: "vllm_router_pd_prefill_requests_total", help: "Prefill requests a prefill worker answered, per worker.", labelNames: ["worker"] as const, registers: pdRegisters }),
      decode: new Counter({ name: "vllm_router_pd_decode_requests_total", help: "Decode requests a decode worker answered, per worker.", labelNames: ["worker"] as const, registers: pdRegisters }),
    };
    this.pdPrefillErrors = new Counter({
      name: "vllm_router_pd_prefill_errors_total", help: "Prefill answers that were errors (passed to the client) or broke off, per worker.", labelNames: ["worker"] as const, registers: pdRegisters,
    });
    this.pdDecodeErrors = new Counter({ name: "vllm_router_pd_decode_errors_total", help: "Decode answers that were errors, per worker.", labelNames: ["worker"] as const, registers: pdRegisters });
    this.pdErrors = new Counter({
      name: "vllm_router_pd_errors_total", help: "P/D requests the router answered with its own error, per phase (prefill, decode) and error type.",
      labelNames: ["phase", "error_type"] as const, registers: pdRegisters,
    });
    this.pdMissingKv = new Counter({
      name: "kiln_router_pd_missing_kv_transfer_params_total", help: "Prefill answers without kv_transfer_params: the decode worker computed the prompt itself.", registers: pdRegisters,
    });
    this.pdPrefillDuration = new Histogram({
      name: "kiln_router_pd_prefill_duration_seconds", help: "Time from a P/D request's arrival to its prefill worker's answer.", buckets: DURATION_BUCKETS, registers: pdRegisters,
    });
    type Worker = ReturnType<WorkerPool["all"]>[number];
    const perWorker = (name: string, help: string, read: (w: Worker) => number): void => {
      new Gauge({
        name, help, labelNames: ["worker", "role"] as const, registers,
        collect() {
          this.reset();
          for (const pool of pools) for (const w of pool.all()) this.set({ worker: w.url, role: pool.role }, read(w));
        },
      });
    };
    perWorker("vllm_router_worker_health", "Worker health (1 healthy, 0 down).", (w) => (w.healthy ? 1 : 0));
    perWorker("vllm_router_worker_load", "Requests in flight from the router to the worker.", (w) => w.inFlight);
    perWorker("vllm_router_running_requests", "The worker's vllm:num_requests_running at its last scrape (-1 before any).", (w) => w.reported?.running ?? -1);
    new Gauge({ name: "vllm_router_active_workers", help: "Healthy workers (of every role).", registers, collect() { this.set(pools.reduce((n, p) => n + p.healthy().length, 0)); } });
    for (const c of [this.retries, this.cacheHits, this.cacheMisses, this.loadBalancing]) c.inc(0);
  }

  request(route: string): void {
    this.requests.inc({ route });
  }

  error(route: string, errorType: string): void {
    this.errors.inc({ route, error_type: errorType });
  }

  retry(): void {
    this.retries.inc();
  }

  decision(policy: string, d: RoutingDecision): void {
    this.decisions.inc({ policy, worker: d.url });
    this.reasons.inc({ policy, reason: d.reason });
    if (d.reason === "cache_hit") this.cacheHits.inc();
    else if (d.reason === "cache_miss") this.cacheMisses.inc();
    else if (d.reason === "load_balanced") this.loadBalancing.inc();
  }

  workerAnswered(worker: string): void {
    this.processed.inc({ worker });
  }

  workerBrokeOff(worker: string): void {
    this.brokenOff.inc({ worker });
  }

  observe(route: string, seconds: number): void {
    this.duration.observe({ route }, seconds);
  }

  /** A P/D request began (its prefill phase). */
  pdRequest(route: string): void {
    this.pdRequests.inc({ route });
  }

  /** A phase's worker answered (after any retries). */
  pdPhase(phase: "prefill" | "decode", worker: string): void {
    this.pdPhaseRequests[phase].inc({ worker });
  }

  pdPrefillError(worker: string): void {
    this.pdPrefillErrors.inc({ worker });
  }

  pdDecodeError(worker: string): void {
    this.pdDecodeErrors.inc({ worker });
  }

  pdError(phase: "prefill" | "decode", errorType: string): void {
    this.pdErrors.inc({ phase, error_type: errorType });
  }

  pdWithoutKv(): void {
    this.pdMissingKv.inc();
  }

  pdPrefillDone(seconds: number): void {
    this.pdPrefillDuration.observe(seconds);
  }

  render(): Promise<string> {
    return this.registry.metrics();
  }
}
