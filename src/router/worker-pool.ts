// The fleet: each worker's URL, health and load. A periodic check GETs each worker's health endpoint (vllm-router's
// --health-check-*: a worker goes down after `failureThreshold` failed checks in a row, comes back after
// `successThreshold` good ones) and, when healthy, reads the load gauges of its Prometheus /metrics
// (vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc). A request that cannot connect
// marks its worker down at once.
import type { WorkerOrigin, WorkerRole, WorkerView } from "./routing-types.js";

/** The load a worker reported in its /metrics at `at` (ms since epoch). */
export interface ReportedLoad {
  running: number;
  waiting: number;
  kvCacheUsage: number;
  at: number;
}

export interface WorkerState {
  readonly url: string;
  readonly origin: WorkerOrigin;
  healthy: boolean;
  /** False until the first health check has answered (its result decides at once, without thresholds). */
  checked: boolean;
  /** Requests the router has sent and not yet seen finish. */
  inFlight: number;
  consecutiveFailures: number;
  consecutiveSuccesses: number;
  reported: ReportedLoad | null;
  /** Why it last went down, for /workers and the log. */
  lastError: string | null;
}

export interface WorkerPoolOptions {
  /** What the pool's workers do ("regular" unless P/D disaggregation splits the fleet in two pools). */
  role?: WorkerRole;
  healthCheckIntervalMs: number;
  healthCheckTimeoutMs: number;
  healthFailureThreshold: number;
  healthSuccessThreshold: number;
  /** Path of the health endpoint on each worker ("/health"). */
  healthCheckEndpoint: string;
  /** Called when a worker goes healthy -> down or down -> healthy. */
  onHealthChange?: (worker: WorkerState, healthy: boolean, reason: string) => void;
}

/** The sum of every sample of `name` in a Prometheus text exposition (all label sets), or null when absent. */
export function readGauge(text: string, name: string): number | null {
  let sum: number | null = null;
  for (const line of text.split("\n")) {
    if (!line.startsWith(name) || (line[name.length] !== "{" && line[name.length] !== " ")) continue;
    const v = Number(line.slice(line.lastIndexOf(" ") + 1));
    if (Number.isFinite(v)) sum = (sum ?? 0) + v;
  }
  return sum;
}

/** "http://host:port" with no trailing slash; throws on anything but an http(s) URL without query or fragment. */
export function normalizeWorkerUrl(url: string): string {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw new Error(`worker URL ${JSON.stringify(url)} is not a URL (expected e.g. http://127.0.0.1:8000)`);
  }
  if ((u.protocol !== "http:" && u.protocol !== "https:") || u.search !== "" || u.hash !== "" || u.username !== "")
    throw new Error(`worker URL ${JSON.stringify(url)} must be http:// or https:// with no query, fragment or credentials`);
  const path = u.pathname.replace(/\/+$/, "");
  // the router appends each request's own path (/v1/chat/completions, /health, ...): a base that ends in /v1 would
  // send /v1/v1/... (a path prefix before it, as a worker behind --root-path has, is fine)
  if (/\/v1$/.test(path)) throw new Error(`worker URL ${JSON.stringify(url)} ends in /v1: give the server's base URL (e.g. ${u.protocol}//${u.host}${path.slice(0, -3)})`);
  return `${u.protocol}//${u.host}${path}`;
}

export class WorkerPool {
  readonly role: WorkerRole;
  private readonly byUrl = new Map<string, WorkerState>();
  private timer: NodeJS.Timeout | null = null;
  private checking: Promise<void> | null = null;

  constructor(urls: readonly string[], private readonly options: WorkerPoolOptions) {
    this.role = options.role ?? "regular";
    for (const url of urls) this.add(url);
  }

  /** Every worker, in the order they were added. */
  all(): WorkerState[] {
    return [...this.byUrl.values()];
  }

  get(url: string): WorkerState | undefined {
    return this.byUrl.get(url);
  }

  healthy(): WorkerState[] {
    return this.all().filter((w) => w.healthy);
  }

  /** Adds a worker (unchecked, so not yet routed to until a check answers); returns false when it was there already. */
  add(rawUrl: string, origin: WorkerOrigin = { source: "static" }): boolean {
    const url = normalizeWorkerUrl(rawUrl);
    if (this.byUrl.has(url)) return false;
    this.byUrl.set(url, {
      url, origin, healthy: false, checked: false, inFlight: 0, consecutiveFailures: 0, consecutiveSuccesses: 0, reported: null, lastError: null,
    });
    return true;
  }

  remove(rawUrl: string): boolean {
    return this.byUrl.delete(normalizeWorkerUrl(rawUrl));
  }

  /** A request could not reach the worker: down at once, until `successThreshold` checks pass. */
  markDown(url: string, reason: string): void {
    const w = this.byUrl.get(url);
    if (w === undefined) return;
    w.consecutiveSuccesses = 0;
    w.lastError = reason;
    w.checked = true;
    if (w.healthy) {
      w.healthy = false;
      this.options.onHealthChange?.(w, false, reason);
    }
  }

  /** The view a policy chooses from; the worker's reported load counts while fresh (three check intervals). */
  view(w: WorkerState, now = Date.now()): WorkerView {
    const r = w.reported;
    const fresh = r !== null && now - r.at <= 3 * this.options.healthCheckIntervalMs;
    return { url: w.url, load: Math.max(w.inFlight, fresh ? r.running + r.waiting : 0), kvCacheUsage: fresh ? r.kvCacheUsage : null };
  }

  /** Checks every worker once (concurrently); resolves when all have answered or timed out. */
  checkAll(): Promise<void> {
    this.checking ??= Promise.all(this.all().map((w) => this.check(w))).then(() => {
      this.checking = null;
    });
    return this.checking;
  }

  /** Checks one worker now (a worker just added at run time). */
  async checkWorker(url: string): Promise<void> {
    const w = this.byUrl.get(url);
    if (w !== undefined) await this.check(w);
  }

  /** Runs a first round of checks, then one every interval (unref'd: it never keeps the process alive). */
  async start(): Promise<void> {
    await this.checkAll();
    this.timer = setInterval(() => void this.checkAll(), this.options.healthCheckIntervalMs);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  private async check(w: WorkerState): Promise<void> {
    const { healthCheckTimeoutMs, healthCheckEndpoint } = this.options;
    let error: string | null = null;
    try {
      const res = await fetch(`${w.url}${healthCheckEndpoint}`, { signal: AbortSignal.timeout(healthCheckTimeoutMs) });
      await res.arrayBuffer();
      if (res.status !== 200) error = `health check answered ${res.status}`;
    } catch (e) {
      error = `health check failed: ${describeFetchError(e)}`;
    }
    if (!this.byUrl.has(w.url)) return; // removed meanwhile
    if (error === null) await this.scrapeLoad(w);
    this.record(w, error);
  }

  private record(w: WorkerState, error: string | null): void {
    const { healthFailureThreshold, healthSuccessThreshold } = this.options;
    const first = !w.checked;
    w.checked = true;
    if (error === null) {
      w.consecutiveFailures = 0;
      w.consecutiveSuccesses++;
      if (!w.healthy && (first || w.consecutiveSuccesses >= healthSuccessThreshold)) {
        w.healthy = true;
        w.lastError = null;
        this.options.onHealthChange?.(w, true, "health check passed");
      }
    } else {
      w.consecutiveSuccesses = 0;
      w.consecutiveFailures++;
      w.lastError = error;
      if (w.healthy && w.consecutiveFailures >= healthFailureThreshold) {
        w.healthy = false;
        this.options.onHealthChange?.(w, false, error);
      }
    }
  }

  /** Reads the worker's load gauges; a worker without /metrics (or an unreadable one) keeps router-counted load only. */
  private async scrapeLoad(w: WorkerState): Promise<void> {
    try {
      const res = await fetch(`${w.url}/metrics`, { signal: AbortSignal.timeout(this.options.healthCheckTimeoutMs) });
      const text = await res.text();
      if (res.status !== 200) return;
      const running = readGauge(text, "vllm:num_requests_running");
      const waiting = readGauge(text, "vllm:num_requests_waiting");
      if (running === null || waiting === null) return;
      w.reported = { running, waiting, kvCacheUsage: readGauge(text, "vllm:kv_cache_usage_perc") ?? 0, at: Date.now() };
    } catch {
      // the health check passed: the worker is up, its metrics are simply not available
    }
  }
}

/** A fetch failure's cause as "ECONNREFUSED" or the abort's reason, not undici's generic "fetch failed". */
export function describeFetchError(e: unknown): string {
  const err = e as { name?: string; message?: string; cause?: { code?: string; message?: string } };
  if (err?.name === "TimeoutError") return "timed out";
  return err?.cause?.code ?? err?.cause?.message ?? err?.message ?? String(e);
}
