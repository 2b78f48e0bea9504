// Kubernetes service discovery (vllm-router's --service-discovery): the pods a label selector matches become workers
// http://<podIP>:<port> while they can serve, and leave the fleet when they stop (not Ready, deleted, a new IP).
//
// One list-then-watch loop per selector (regular; or P/D's prefill and decode): the list gives the full set and a
// resourceVersion, the watch streams each change after it within milliseconds (a pod that fails its readiness probe
// stops getting requests at once, where a periodic list would route to it until the next poll), and the API server
// holds one connection per selector instead of answering a list every few seconds. A watch the server ends (its
// timeout) resumes from the last resourceVersion; 410 Gone (history compacted) lists again at once; any other
// failure (API unreachable, 403 without RBAC, a cut connection) is logged with its reason and retried after a
// backoff (1 s doubling to 30 s), listing again: the router keeps serving whatever workers it has.
import { setTimeout as sleep } from "node:timers/promises";
import { KubeApiError, selectorText, type KubeClient, type Pod } from "./kube-api.js";
import type { WorkerRole } from "./routing-types.js";

/** A pod that can serve, as the worker it stands for. */
export interface DiscoveredWorker {
  readonly url: string;
  readonly role: WorkerRole;
  /** Prefill pods: the KV bootstrap port from --bootstrap-port-annotation (null when absent or not a port). */
  readonly bootstrapPort: number | null;
  readonly pod: string;
  readonly namespace: string;
}

/** Where discovered workers go: the router's add and remove paths. `why` says what changed ("deleted", "not Ready"). */
export interface DiscoverySink {
  join(worker: DiscoveredWorker): void;
  leave(worker: DiscoveredWorker, why: string): void;
}

/** One selector's pods and the role they take; pods matching `exclude` belong to another watch (P/D: prefill wins). */
export interface PodWatchSpec {
  readonly role: WorkerRole;
  readonly selector: Readonly<Record<string, string>>;
  readonly exclude?: Readonly<Record<string, string>>;
}

export interface PodDiscoveryOptions {
  /** null: every namespace (needs a ClusterRole), as vllm-router without --service-discovery-namespace. */
  namespace: string | null;
  /** The workers' port on each pod IP. */
  port: number;
  bootstrapPortAnnotation: string;
  watches: readonly PodWatchSpec[];
  log(level: "debug" | "info" | "warning" | "error", line: string): void;
  retryInitialMs?: number;
  retryMaxMs?: number;
  /** The server ends each watch after this (client-go picks 5-10 min); the loop then watches on from where it was. */
  watchTimeoutSecs?: number;
}

/** What /workers shows of discovery: each watch's state and the matching pods that are not workers (and why). */
export interface DiscoveryStatus {
  namespace: string | null;
  port: number;
  watches: { role: WorkerRole; selector: string; synced: boolean; last_error: string | null }[];
  waiting_pods: { pod: string; namespace: string; role: WorkerRole; reason: string }[];
}

export function matchesSelector(labels: Readonly<Record<string, string>> | undefined, selector: Readonly<Record<string, string>>): boolean {
  const entries = Object.entries(selector);
  return entries.length > 0 && entries.every(([k, v]) => labels?.[k] === v);
}

/** Why a pod is no worker; `foreign`: it is not this selector's pod at all (labels changed, or another role's). */
export interface NotAWorker {
  readonly reason: string;
  readonly foreign?: boolean;
}

/**
 * The worker `pod` is for `spec`, or why it is none: it must match the selector (not `exclude`), be Running with
 * condition Ready True, have an IP and no deletionTimestamp (terminating pods drain, they take no new requests).
 */
export function podWorker(pod: Pod, spec: PodWatchSpec, port: number, bootstrapPortAnnotation: string): DiscoveredWorker | NotAWorker {
  const { metadata: m, status: s } = pod;
  if (!matchesSelector(m.labels, spec.selector)) return { reason: `labels do not match ${selectorText(spec.selector)}`, foreign: true };
  if (spec.exclude !== undefined && matchesSelector(m.labels, spec.exclude)) return { reason: `matches ${selectorText(spec.exclude)} too (another role's selector)`, foreign: true };
  if (m.deletionTimestamp) return { reason: "terminating" };
  if (s?.phase !== "Running") return { reason: `phase ${s?.phase ?? "unknown"}` };
  if (!s.conditions?.some((c) => c.type === "Ready" && c.status === "True")) return { reason: "not Ready" };
  if (!s.podIP) return { reason: "no pod IP" };
  const raw = spec.role === "prefill" ? m.annotations?.[bootstrapPortAnnotation] : undefined;
  const bootstrapPort = raw !== undefined && /^\d+$/.test(raw) && Number(raw) <= 65535 ? Number(raw) : null;
  const host = s.podIP.includes(":") ? `[${s.podIP}]` : s.podIP;
  return { url: `http://${host}:${port}`, role: spec.role, bootstrapPort, pod: m.name ?? "", namespace: m.namespace ?? "" };
}

const sameWorker = (a: DiscoveredWorker, b: DiscoveredWorker): boolean => a.url === b.url && a.role === b.role && a.bootstrapPort === b.bootstrapPort;

/** One selector's loop state: the pods it sees, as workers or as the reason they are not. */
interface Watch {
  readonly spec: PodWatchSpec;
  readonly workers: Map<string, DiscoveredWorker>;
  readonly waiting: Map<string, { pod: string; namespace: string; reason: string }>;
  synced: boolean;
  lastError: string | null;
}

export class PodDiscovery {
  private readonly watches: Watch[];
  private readonly abort = new AbortController();
  private loops: Promise<void>[] = [];

  constructor(private readonly client: KubeClient, private readonly sink: DiscoverySink, private readonly options: PodDiscoveryOptions) {
    this.watches = options.watches.map((spec) => ({ spec, workers: new Map(), waiting: new Map(), synced: false, lastError: null }));
  }

  /** Starts the loops in the background: the router serves (503 until a worker joins) while they list. */
  start(): void {
    this.loops = this.watches.map((w) => this.run(w));
  }

  /** Stops the loops and closes their connections (the workers stay in the fleet). */
  async close(): Promise<void> {
    this.abort.abort();
    await Promise.all(this.loops);
  }

  status(): DiscoveryStatus {
    return {
      namespace: this.options.namespace,
      port: this.options.port,
      watches: this.watches.map((w) => ({ role: w.spec.role, selector: selectorText(w.spec.selector), synced: w.synced, last_error: w.lastError })),
      waiting_pods: this.watches.flatMap((w) => [...w.waiting.values()].map((p) => ({ ...p, role: w.spec.role }))),
    };
  }

  private async run(w: Watch): Promise<void> {
    const { namespace, log, retryInitialMs = 1000, retryMaxMs = 30_000, watchTimeoutSecs = 300 } = this.options;
    const signal = this.abort.signal;
    const what = `${w.spec.role === "regular" ? "" : `${w.spec.role} `}pods ${selectorText(w.spec.selector)} in ${namespace === null ? "every namespace" : `namespace ${namespace}`}`;
    let delay = retryInitialMs;
    let resourceVersion: string | null = null;
    let expiredAgain = false; // a 410 right after a relist's watch began: back off rather than list in a tight loop
    const pause = async (ms: number): Promise<boolean> => sleep(ms, undefined, { signal }).then(() => true, () => false);
    while (!signal.aborted) {
      let step = "listing";
      try {
        if (resourceVersion === null) {
          const list = await this.client.listPods(namespace, w.spec.selector, signal);
          this.replaceAll(w, list.pods);
          resourceVersion = list.resourceVersion;
          if (!w.synced || w.lastError !== null) log("info", `service discovery: watching ${what} (${w.workers.size} serving, ${w.waiting.size} waiting)`);
          w.synced = true;
          w.lastError = null;
          delay = retryInitialMs;
        }
        step = "watching";
        const started = Date.now();
        for await (const event of this.client.watchPods(namespace, w.spec.selector, resourceVersion, watchTimeoutSecs, signal)) {
          if (event.type === "ERROR") throw new KubeApiError(event.object.code ?? 500, `${event.object.code ?? ""} ${event.object.reason ?? ""}: ${event.object.message ?? ""}`);
          resourceVersion = event.object.metadata.resourceVersion ?? resourceVersion;
          expiredAgain = false;
          if (event.type !== "BOOKMARK") this.apply(w, event.object, event.type === "DELETED");
        }
        // the server ended the watch (timeoutSeconds): watch on from resourceVersion (not in a loop if it ends at once)
        if (Date.now() - started < 1000 && !(await pause(retryInitialMs))) return;
      } catch (e) {
        if (signal.aborted) return;
        resourceVersion = null;
        if (step === "watching" && e instanceof KubeApiError && e.status === 410 && !expiredAgain) {
          log("info", `service discovery: the watch of ${what} expired (${e.message.trim()}); listing again`);
          expiredAgain = true;
          continue;
        }
        w.lastError = `${step} ${what} failed: ${describe(e)}${this.hint(e)}`;
        log("warning", `service discovery: ${w.lastError}; retrying in ${delay / 1000} s`);
        if (!(await pause(delay))) return; // closed while waiting
        delay = Math.min(delay * 2, retryMaxMs);
      }
    }
  }

  /** A full list: pods gone from it leave; the others are applied as if each had just changed. */
  private replaceAll(w: Watch, pods: readonly Pod[]): void {
    const listed = new Set(pods.map(podKey));
    for (const [key, worker] of w.workers) {
      if (listed.has(key)) continue;
      w.workers.delete(key);
      this.sink.leave(worker, "no longer listed");
    }
    for (const key of w.waiting.keys()) if (!listed.has(key)) w.waiting.delete(key);
    for (const pod of pods) this.apply(w, pod, false);
  }

  /** A pod changed (or was deleted): its worker joins, leaves, or is replaced (a new IP or bootstrap port). */
  private apply(w: Watch, pod: Pod, deleted: boolean): void {
    const { port, bootstrapPortAnnotation } = this.options;
    const key = podKey(pod);
    const next: DiscoveredWorker | NotAWorker = deleted ? { reason: "deleted" } : podWorker(pod, w.spec, port, bootstrapPortAnnotation);
    const prev = w.workers.get(key);
    if ("url" in next && prev !== undefined && sameWorker(prev, next)) return;
    if (prev !== undefined) {
      w.workers.delete(key);
      this.sink.leave(prev, "url" in next ? `now ${next.url}${next.bootstrapPort === null ? "" : ` (bootstrap port ${next.bootstrapPort})`}` : next.reason);
    }
    if ("url" in next) {
      w.waiting.delete(key);
      w.workers.set(key, next);
      this.sink.join(next);
    } else if (deleted || next.foreign === true) {
      w.waiting.delete(key); // not this watch's pod (any more)
    } else {
      w.waiting.set(key, { pod: pod.metadata.name ?? "", namespace: pod.metadata.namespace ?? "", reason: next.reason });
    }
  }

  private hint(e: unknown): string {
    if (!(e instanceof KubeApiError)) return "";
    const ns = this.options.namespace;
    if (e.status === 403)
      return ns === null
        ? " (the router's service account needs get, list and watch on pods in every namespace (a ClusterRole); or give --service-discovery-namespace with a Role there, as deploy/k8s/router-rbac.yaml)"
        : ` (the router's service account needs get, list and watch on pods in namespace ${ns}: a Role and RoleBinding as deploy/k8s/router-rbac.yaml)`;
    if (e.status === 401) return " (the API server refused the router's service-account token)";
    return "";
  }
}

const podKey = (pod: Pod): string => `${pod.metadata.namespace ?? ""}/${pod.metadata.name ?? ""}`;

/** A failure's reason: the API's status line, or the connection error's code (ECONNREFUSED, ...). */
function describe(e: unknown): string {
  const err = e as { name?: string; message?: string; code?: string; cause?: { code?: string } };
  if (err?.name === "TimeoutError") return "timed out";
  return err?.code ?? err?.cause?.code ?? err?.message ?? String(e);
}
