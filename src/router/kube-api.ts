// The two Kubernetes API calls service discovery makes, list and watch pods, over plain node:http(s): in-cluster
// (https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT with the pod's service-account token and CA, as
// client-go's rest.InClusterConfig) or at a given base URL without credentials (`kubectl proxy`, a test's fake).
import { readFileSync } from "node:fs";
import * as http from "node:http";
import * as https from "node:https";
import { join } from "node:path";
import { KilnError } from "../util/errors.js";

/** Where the kubelet mounts a pod's service-account token, CA bundle and namespace. */
export const SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount";

/** The fields of a core/v1 Pod that discovery reads. */
export interface Pod {
  metadata: {
    name?: string;
    namespace?: string;
    resourceVersion?: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
    deletionTimestamp?: string | null;
  };
  status?: { phase?: string; podIP?: string; conditions?: { type: string; status: string }[] };
}

/** A meta/v1 Status: an error answer, or a watch's ERROR event (410 when its resourceVersion is too old). */
export interface KubeStatus {
  kind?: string;
  code?: number;
  reason?: string;
  message?: string;
}

/** One line of a watch stream (BOOKMARK carries only metadata.resourceVersion). */
export type PodWatchEvent = { type: "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK"; object: Pod } | { type: "ERROR"; object: KubeStatus };

export interface KubeConnection {
  /** http(s)://host:port, no trailing slash. */
  readonly baseUrl: string;
  /** File holding the bearer token, read again for every request (the kubelet rotates bound tokens); null: none. */
  readonly tokenFile: string | null;
  /** File of the PEM bundle that verifies the API server; null: the system's CAs. */
  readonly caFile: string | null;
  /** The router pod's own namespace (for hints in error messages); null outside a pod. */
  readonly podNamespace: string | null;
}

/** The API could not be asked: not in a pod and no API URL given (a configuration error, not retried). */
export class KubeConfigError extends KilnError {
  override name = "KubeConfigError";
}

/** An answer other than 200, or a watch's ERROR event: `status` is its HTTP code (410 Gone, 403 Forbidden, ...). */
export class KubeApiError extends KilnError {
  override name = "KubeApiError";
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

/** The in-cluster connection; throws KubeConfigError when KUBERNETES_SERVICE_HOST/PORT are not set. */
export function inClusterConnection(env: NodeJS.ProcessEnv = process.env, dir = SERVICE_ACCOUNT_DIR): KubeConnection {
  // set by the kubelet in every container (the API server's Service); read here, the one place that needs them
  const host = env.KUBERNETES_SERVICE_HOST;
  const port = env.KUBERNETES_SERVICE_PORT;
  if (!host || !port)
    throw new KubeConfigError("service discovery needs the Kubernetes API: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set (not in a pod); give --service-discovery-api-url (e.g. http://127.0.0.1:8001 with `kubectl proxy`)");
  let podNamespace: string | null = null;
  try {
    podNamespace = readFileSync(join(dir, "namespace"), "utf8").trim() || null;
  } catch {
    // no service account mounted: the requests will say so (401/403), with this missing namespace in the hint
  }
  return { baseUrl: `https://${host.includes(":") ? `[${host}]` : host}:${port}`, tokenFile: join(dir, "token"), caFile: join(dir, "ca.crt"), podNamespace };
}

/** A connection to `baseUrl` as it is: no token, the system's CAs. */
export function urlConnection(baseUrl: string): KubeConnection {
  return { baseUrl: baseUrl.replace(/\/+$/, ""), tokenFile: null, caFile: null, podNamespace: null };
}

/** `{app: "kiln", tier: "serve"}` as the API's labelSelector: "app=kiln,tier=serve". */
export function selectorText(selector: Readonly<Record<string, string>>): string {
  return Object.entries(selector).map(([k, v]) => `${k}=${v}`).join(",");
}

export class KubeClient {
  constructor(readonly connection: KubeConnection) {}

  /** Pods of `namespace` (null: every namespace) matching `selector`, and the list's resourceVersion to watch from. */
  async listPods(namespace: string | null, selector: Readonly<Record<string, string>>, signal: AbortSignal): Promise<{ resourceVersion: string; pods: Pod[] }> {
    const res = await this.get(this.podsPath(namespace, { labelSelector: selectorText(selector) }), signal);
    const list = JSON.parse(await readAll(res)) as { metadata?: { resourceVersion?: string }; items?: Pod[] };
    return { resourceVersion: list.metadata?.resourceVersion ?? "", pods: list.items ?? [] };
  }

  /**
   * The watch's events from `resourceVersion` on, one per line as they come; ends when the server closes the watch
   * (after about `timeoutSecs`), throws when the connection drops. Leaving the loop closes the connection.
   */
  async *watchPods(
    namespace: string | null, selector: Readonly<Record<string, string>>, resourceVersion: string, timeoutSecs: number, signal: AbortSignal,
  ): AsyncGenerator<PodWatchEvent> {
    const query = { labelSelector: selectorText(selector), watch: "true", resourceVersion, allowWatchBookmarks: "true", timeoutSeconds: String(timeoutSecs) };
    // a connection that goes silent (no reset, no close) would hang the watch: give up a minute after the server's end
    const res = await this.get(this.podsPath(namespace, query), AbortSignal.any([signal, AbortSignal.timeout((timeoutSecs + 60) * 1000)]));
    try {
      res.setEncoding("utf8");
      let pending = "";
      for await (const chunk of res as AsyncIterable<string>) {
        pending += chunk;
        let nl: number;
        while ((nl = pending.indexOf("\n")) >= 0) {
          const line = pending.slice(0, nl).trim();
          pending = pending.slice(nl + 1);
          if (line !== "") yield JSON.parse(line) as PodWatchEvent;
        }
      }
      if (!res.complete) throw new Error("the watch connection was cut");
    } finally {
      res.destroy();
    }
  }

  private podsPath(namespace: string | null, query: Record<string, string>): string {
    const base = namespace === null ? "/api/v1/pods" : `/api/v1/namespaces/${encodeURIComponent(namespace)}/pods`;
    return `${base}?${new URLSearchParams(query).toString()}`;
  }

  /** GETs `path`; resolves with a 200 answer's head, else throws KubeApiError with the Status's reason and message. */
  private async get(path: string, signal: AbortSignal): Promise<http.IncomingMessage> {
    const { baseUrl, tokenFile, caFile } = this.connection;
    const url = new URL(`${baseUrl}${path}`);
    const headers: Record<string, string> = { accept: "application/json" };
    if (tokenFile !== null) headers.authorization = `Bearer ${readSecret(tokenFile, "token").trim()}`;
    const tls = url.protocol === "https:" && caFile !== null ? { ca: readSecret(caFile, "CA bundle") } : {};
    const res = await new Promise<http.IncomingMessage>((resolve, reject) => {
      const req = (url.protocol === "https:" ? https : http).request(url, { headers, signal, ...tls }, resolve);
      req.on("error", reject);
      req.end();
    });
    if (res.statusCode === 200) return res;
    const text = await readAll(res).catch(() => "");
    let status: KubeStatus = {};
    try {
      status = JSON.parse(text) as KubeStatus;
    } catch {
      // not a Status (a proxy's page): the code says enough
    }
    const code = res.statusCode ?? 0;
    throw new KubeApiError(code, `${code} ${status.reason ?? res.statusMessage ?? ""}${status.message ? `: ${status.message}` : ""}`);
  }
}

function readSecret(file: string, what: string): string {
  try {
    return readFileSync(file, "utf8");
  } catch (e) {
    throw new Error(`cannot read the service-account ${what} ${file} (${(e as NodeJS.ErrnoException).code ?? (e as Error).message}): is a service account token mounted in the router's pod?`);
  }
}

async function readAll(res: http.IncomingMessage): Promise<string> {
  res.setEncoding("utf8");
  let text = "";
  for await (const chunk of res as AsyncIterable<string>) text += chunk;
  return text;
}
