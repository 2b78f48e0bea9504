// A scriptable stand-in for the Kubernetes API server's pod endpoints (plain node:http), for service-discovery tests:
// GET /api/v1/[namespaces/NS/]pods with labelSelector lists, and with watch=true streams newline-delimited events
// from a resourceVersion on, as the real server does: a pod that stops matching a watch's selector is DELETED for
// it, one that starts matching is ADDED, and a resourceVersion older than the kept history is answered 410 Gone
// (an ERROR event). Tests change pods, compact history, drop connections and refuse requests (403).
import * as http from "node:http";
import * as https from "node:https";
import type { AddressInfo } from "node:net";
import type { Pod } from "../../src/router/kube-api.js";

/**
 * The fake's TLS identity for in-cluster tests: a self-signed certificate for IP 127.0.0.1, valid 2020-2120, that
 * stands for the service account's ca.crt (a test fixture: the key guards nothing).
 */
export const FAKE_API_TLS = {
  key: `-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgpcigoTLNe65ntCVm
m1MDBT0ilNZLl9S7vx9UpMDdnkWhRANCAAQdUR95sZgmFarYT1zDpNiA/erZhJbb
kHR3ofHZ8jQFoEN8rfhKsnMLF8MyyM2PgPH9ku7jlYseNci6Fra1GhiA
-----END PRIVATE KEY-----`,
  cert: `-----BEGIN CERTIFICATE-----
MIIBXTCCAQSgAwIBAgIBATAKBggqhkjOPQQDAjAVMRMwEQYDVQQDDAprdWJlcm5l
dGVzMCAXDTIwMDEwMTAwMDAwMFoYDzIxMjAwMTAxMDAwMDAwWjAVMRMwEQYDVQQD
DAprdWJlcm5ldGVzMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEHVEfebGYJhWq
2E9cw6TYgP3q2YSW25B0d6Hx2fI0BaBDfK34SrJzCxfDMsjNj4Dx/ZLu45WLHjXI
uha2tRoYgKNDMEEwDwYDVR0TAQH/BAUwAwEB/zAPBgNVHREECDAGhwR/AAABMB0G
A1UdDgQWBBQh1CJ1R3lzCfIUAXZ+Ny9o5xsFOjAKBggqhkjOPQQDAgNHADBEAiAb
aCxM1vpSUoigLNjk+Zx29RTACBYveL4ozkTLLQ1LNwIgeqqEhcpBkngG0AB/moSq
G8IBFVsdCIAyt7uSFA14/EE=
-----END CERTIFICATE-----`,
};

export interface PodSpec {
  ip?: string | null;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  phase?: string;
  ready?: boolean;
  terminating?: boolean;
  namespace?: string;
}

/** A pod as the API returns it (Running and Ready unless told otherwise). */
export function pod(name: string, s: PodSpec = {}): Pod {
  return {
    metadata: {
      name, namespace: s.namespace ?? "default", labels: s.labels ?? { app: "kiln" }, annotations: s.annotations ?? {},
      ...(s.terminating === true ? { deletionTimestamp: "2025-01-01T00:00:00Z" } : {}),
    },
    status: {
      phase: s.phase ?? "Running",
      ...(s.ip === null ? {} : { podIP: s.ip ?? "127.0.0.2" }),
      conditions: [{ type: "PodScheduled", status: "True" }, { type: "Ready", status: s.ready === false ? "False" : "True" }],
    },
  };
}

export interface SeenApiRequest {
  path: string;
  query: URLSearchParams;
  authorization: string | undefined;
}

interface Change {
  rv: number;
  prev: Pod | null;
  next: Pod | null;
}

interface OpenWatch {
  namespace: string | null;
  selector: Record<string, string>;
  res: http.ServerResponse;
}

export interface FakeKubeApi {
  readonly url: string;
  readonly requests: SeenApiRequest[];
  /** Every request is answered with this Status (403 Forbidden, ...) while set. */
  refuse: { code: number; reason: string; message: string } | null;
  /** Creates or replaces a pod (ADDED / MODIFIED to the watches it matches). */
  setPod(p: Pod): void;
  deletePod(name: string, namespace?: string): void;
  /** Runs `change` without telling the open watches, then drops the history: only a new list shows what changed. */
  silently(change: () => void): void;
  /** Sends 410 Gone (an ERROR event) to every open watch and ends it; older resourceVersions are refused likewise. */
  expireWatches(): void;
  /** Cuts every open watch's connection mid-stream. */
  dropWatches(): void;
  /** Watches open now. */
  openWatches(): number;
  lists(): number;
  close(): Promise<void>;
}

const parseSelector = (text: string | null): Record<string, string> =>
  Object.fromEntries((text ?? "").split(",").filter((x) => x !== "").map((kv) => kv.split("=") as [string, string]));
const matches = (p: Pod | null, w: { namespace: string | null; selector: Record<string, string> }): boolean =>
  p !== null && (w.namespace === null || p.metadata.namespace === w.namespace) && Object.entries(w.selector).every(([k, v]) => p.metadata.labels?.[k] === v);
const withRv = (p: Pod, rv: number): Pod => ({ ...p, metadata: { ...p.metadata, resourceVersion: String(rv) } });

/** Starts the fake on 127.0.0.1 and a free port, over HTTPS with FAKE_API_TLS when `tls`. */
export async function startFakeKubeApi({ tls = false }: { tls?: boolean } = {}): Promise<FakeKubeApi> {
  const pods = new Map<string, Pod>();
  let rv = 100;
  let history: Change[] = [];
  let oldestKept = rv; // a watch from before this is 410 Gone
  let listCount = 0;
  let quiet = false;
  const watches = new Set<OpenWatch>();

  /** The event a change is for one watch, if any (selector-filtered, as the API server does it). */
  const eventFor = (c: Change, w: OpenWatch): string | null => {
    const [was, is] = [matches(c.prev, w), matches(c.next, w)];
    if (!was && !is) return null;
    const type = !was ? "ADDED" : !is ? "DELETED" : "MODIFIED";
    return `${JSON.stringify({ type, object: withRv((is ? c.next : c.prev)!, c.rv) })}\n`;
  };
  const record = (key: string, next: Pod | null): void => {
    const change = { rv: ++rv, prev: pods.get(key) ?? null, next };
    if (next === null) pods.delete(key);
    else pods.set(key, next);
    if (quiet) return;
    history.push(change);
    for (const w of watches) {
      const line = eventFor(change, w);
      if (line !== null) w.res.write(line);
    }
  };
  const gone = (): string => `${JSON.stringify({ type: "ERROR", object: { kind: "Status", apiVersion: "v1", status: "Failure", code: 410, reason: "Expired", message: "too old resource version" } })}\n`;

  const api: FakeKubeApi = {
    url: "", requests: [], refuse: null,
    setPod: (p) => record(`${p.metadata.namespace}/${p.metadata.name}`, p),
    deletePod: (name, namespace = "default") => record(`${namespace}/${name}`, null),
    silently(change) {
      quiet = true;
      try {
        change();
      } finally {
        quiet = false;
      }
      history = [];
      oldestKept = rv;
    },
    expireWatches() {
      history = [];
      oldestKept = rv;
      for (const w of watches) w.res.end(gone());
      watches.clear();
    },
    dropWatches() {
      for (const w of watches) w.res.destroy();
      watches.clear();
    },
    openWatches: () => watches.size,
    lists: () => listCount,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };

  const handle = (req: http.IncomingMessage, res: http.ServerResponse): void => {
    const url = new URL(req.url ?? "/", "http://x");
    api.requests.push({ path: url.pathname, query: url.searchParams, authorization: req.headers.authorization });
    const m = /^\/api\/v1\/(?:namespaces\/([^/]+)\/)?pods$/.exec(url.pathname);
    const json = (code: number, body: unknown): void => void res.writeHead(code, { "content-type": "application/json" }).end(JSON.stringify(body));
    if (api.refuse !== null) return json(api.refuse.code, { kind: "Status", apiVersion: "v1", status: "Failure", ...api.refuse });
    if (m === null) return json(404, { kind: "Status", code: 404, reason: "NotFound", message: `the server could not find the requested resource` });
    const w: OpenWatch = { namespace: m[1] === undefined ? null : decodeURIComponent(m[1]), selector: parseSelector(url.searchParams.get("labelSelector")), res };
    if (url.searchParams.get("watch") !== "true") {
      listCount++;
      const items = [...pods.values()].filter((p) => matches(p, w)).map((p) => withRv(p, rv));
      return json(200, { kind: "PodList", apiVersion: "v1", metadata: { resourceVersion: String(rv) }, items });
    }
    res.writeHead(200, { "content-type": "application/json", "transfer-encoding": "chunked" });
    res.flushHeaders();
    const from = Number(url.searchParams.get("resourceVersion"));
    if (from < oldestKept) return void res.end(gone());
    for (const c of history) {
      const line = c.rv > from ? eventFor(c, w) : null;
      if (line !== null) res.write(line);
    }
    watches.add(w);
    res.on("close", () => watches.delete(w));
  };
  const server = tls ? https.createServer(FAKE_API_TLS, handle) : http.createServer(handle);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  (api as { url: string }).url = `${tls ? "https" : "http"}://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return api;
}
