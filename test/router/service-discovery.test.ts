// Kubernetes service discovery (--service-discovery) against a fake API server: pods join the fleet when Running and
// Ready and leave when they stop being so, are deleted or change IP; 410 Gone and dropped watches list again; a 403
// is logged with its reason and retried while the router serves; P/D selectors fill the prefill and decode pools.
// Each fake pod is a fake worker on its own loopback address (127.0.0.x) and one shared port, as pods are.
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, afterEach, describe, it } from "node:test";
import { createRouter, inClusterConnection, KubeClient, podWorker, type Router } from "../../src/router/index.js";
import type { RouterConfig } from "../../src/router/router-config.js";
import { FAKE_API_TLS, pod, startFakeKubeApi, type FakeKubeApi } from "./fake-kube-api.js";
import { deadUrl, fakeKvParams, prefillAnswer, startFakeWorker, type FakeWorker } from "./fake-worker.js";

const routers: Router[] = [];
const apis: FakeKubeApi[] = [];
const workers: FakeWorker[] = [];
afterEach(async () => {
  await Promise.all(routers.splice(0).map((r) => r.close()));
  await Promise.all(apis.splice(0).map((a) => a.close()));
});
after(async () => {
  await Promise.all(workers.map((w) => w.kill().catch(() => undefined)));
});

/** Fake pods' workers on 127.0.0.2, 127.0.0.3, ... all on one port (the first one's free port). */
async function podWorkers(n: number): Promise<{ ws: FakeWorker[]; port: number }> {
  const first = await startFakeWorker("pod0", { host: "127.0.0.2" });
  const port = Number(new URL(first.url).port);
  const rest = await Promise.all(Array.from({ length: n - 1 }, (_, i) => startFakeWorker(`pod${i + 1}`, { host: `127.0.0.${i + 3}`, port })));
  workers.push(first, ...rest);
  return { ws: [first, ...rest], port };
}

async function fakeApi(tls = false): Promise<FakeKubeApi> {
  const api = await startFakeKubeApi({ tls });
  apis.push(api);
  return api;
}

async function router(options: Partial<RouterConfig>, lines: string[] = []): Promise<{ r: Router; url: string }> {
  const r = createRouter(
    { serviceDiscovery: true, serviceDiscoveryNamespace: "default", port: 0, healthCheckIntervalMs: 60_000, logLevel: "info", ...options },
    { log: (line) => lines.push(line), discoveryTiming: { retryInitialMs: 20, retryMaxMs: 100 } },
  );
  routers.push(r);
  return { r, url: await r.listen() };
}

/** Polls `check` until it returns a value other than undefined/false (or throws after `ms`). */
async function until<T>(what: string, check: () => T | undefined | false | Promise<T | undefined | false>, ms = 5000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v !== undefined && v !== false) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

interface WorkersBody {
  workers: { url: string; role: string; healthy: boolean; source: string; pod?: { name: string; namespace: string }; bootstrap_port?: number | null }[];
  service_discovery: { namespace: string | null; port: number; watches: { role: string; selector: string; synced: boolean; last_error: string | null }[]; waiting_pods: { pod: string; reason: string; role: string }[] };
}
const workersOf = async (url: string): Promise<WorkersBody> => (await fetch(`${url}/workers`)).json() as Promise<WorkersBody>;
/** The fleet's URLs once they are healthy, sorted. */
const healthyUrls = async (url: string): Promise<string[]> => (await workersOf(url)).workers.filter((w) => w.healthy).map((w) => w.url).sort();
const complete = (url: string) => fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "tiny", prompt: "hi" }) });

describe("Kubernetes service discovery (fake API server)", () => {
  it("starts with no worker (503), then follows one pod: not ready, ready (requests reach it), deleted", async () => {
    const api = await fakeApi();
    const { ws: [w0], port } = await podWorkers(1);
    const { url } = await router({ selector: { app: "kiln" }, serviceDiscoveryPort: port, serviceDiscoveryApiUrl: api.url });
    await until("the first list", async () => (await workersOf(url)).service_discovery.watches[0]!.synced);
    const none = await complete(url);
    assert.equal(none.status, 503);
    assert.equal(((await none.json()) as { error: { code: string } }).error.code, "no_healthy_worker");
    assert.equal((await fetch(`${url}/health`)).status, 503);
    assert.equal(api.requests[0]!.path, "/api/v1/namespaces/default/pods");
    assert.equal(api.requests[0]!.query.get("labelSelector"), "app=kiln");

    api.setPod(pod("kiln-0", { ip: "127.0.0.2", ready: false }));
    api.setPod(pod("other-0", { ip: "127.0.0.2", labels: { app: "other" } })); // not selected
    const waiting = await until("the unready pod", async () => (await workersOf(url)).service_discovery.waiting_pods.at(0));
    assert.deepEqual(waiting, { pod: "kiln-0", namespace: "default", role: "regular", reason: "not Ready" });
    assert.deepEqual((await workersOf(url)).workers, []);

    api.setPod(pod("kiln-0", { ip: "127.0.0.2" }));
    await until("the ready pod's worker", async () => (await healthyUrls(url)).length === 1);
    const body = await workersOf(url);
    assert.deepEqual(body.workers.map((w) => [w.url, w.role, w.source, w.pod]), [[`http://127.0.0.2:${port}`, "regular", "discovered", { name: "kiln-0", namespace: "default" }]]);
    assert.deepEqual(body.service_discovery.waiting_pods, []);
    const ok = await complete(url);
    assert.equal(ok.status, 200);
    assert.equal(ok.headers.get("x-kiln-worker"), `http://127.0.0.2:${port}`);
    assert.equal(w0!.seen.at(-1)!.path, "/v1/completions");
    assert.equal((await fetch(`${url}/health`)).status, 200);

    api.deletePod("kiln-0");
    await until("the deleted pod's worker to leave", async () => (await workersOf(url)).workers.length === 0);
    assert.equal((await complete(url)).status, 503);
  });

  it("static and discovered workers together: an IP change replaces the worker, not Ready or terminating removes it, a static URL stays", async () => {
    const api = await fakeApi();
    const { ws: [, w1], port } = await podWorkers(2);
    const fixed = await startFakeWorker("static");
    workers.push(fixed);
    const lines: string[] = [];
    const { url } = await router({ workerUrls: [fixed.url], policy: "round_robin", selector: { app: "kiln", tier: "serve" }, serviceDiscoveryPort: port, serviceDiscoveryApiUrl: api.url }, lines);
    const labels = { app: "kiln", tier: "serve" };
    api.setPod(pod("kiln-0", { ip: "127.0.0.2", labels }));
    const [a, b] = [`http://127.0.0.2:${port}`, `http://127.0.0.3:${port}`];
    assert.deepEqual(await until("both workers", async () => ((await healthyUrls(url)).length === 2 ? healthyUrls(url) : false)), [a, fixed.url].sort());
    assert.deepEqual((await workersOf(url)).workers.map((w) => [w.url, w.source]), [[fixed.url, "static"], [a, "discovered"]]);

    // the pod comes back with another IP (a new sandbox): the old URL leaves, the new one joins
    api.setPod(pod("kiln-0", { ip: "127.0.0.3", labels }));
    assert.deepEqual(await until("the new IP", async () => {
      const urls = (await workersOf(url)).workers.map((w) => w.url).sort();
      return urls.includes(b) && !urls.includes(a) && urls;
    }), [b, fixed.url].sort());
    await until("the new IP's health check", async () => (await healthyUrls(url)).includes(b));
    for (let i = 0; i < 4; i++) assert.equal((await complete(url)).status, 200);
    assert.ok(w1!.seen.some((s) => s.path === "/v1/completions"), "requests reach the pod's new address");
    assert.ok(lines.some((l) => l.includes(`worker ${a} removed (pod default/kiln-0: now ${b})`)), lines.join("\n"));

    api.setPod(pod("kiln-0", { ip: "127.0.0.3", labels, ready: false }));
    await until("the unready pod to leave", async () => (await workersOf(url)).workers.length === 1);
    api.setPod(pod("kiln-0", { ip: "127.0.0.3", labels }));
    await until("the pod back", async () => (await workersOf(url)).workers.length === 2);
    api.setPod(pod("kiln-0", { ip: "127.0.0.3", labels, terminating: true }));
    await until("the terminating pod to leave", async () => (await workersOf(url)).workers.length === 1);

    // a pod whose address is a static worker's: not added twice, and its deletion leaves the static worker alone
    const staticIp = new URL(fixed.url);
    const { url: r2 } = await router({ workerUrls: [fixed.url], selector: { app: "kiln" }, serviceDiscoveryPort: Number(staticIp.port), serviceDiscoveryApiUrl: api.url }, lines);
    api.setPod(pod("kiln-s", { ip: staticIp.hostname }));
    await until("the duplicate's warning", () => lines.some((l) => l.includes("pod default/kiln-s is") && l.includes("already a worker (static); not added again")));
    api.deletePod("kiln-s");
    await new Promise((resolve) => setTimeout(resolve, 50));
    assert.deepEqual((await workersOf(r2)).workers.map((w) => [w.url, w.source]), [[fixed.url, "static"]]);
  });

  it("410 Gone lists again at once; a dropped watch lists again after a backoff; changes missed meanwhile are reconciled", async () => {
    const api = await fakeApi();
    const { port } = await podWorkers(3);
    const { url } = await router({ selector: { app: "kiln" }, serviceDiscoveryPort: port, serviceDiscoveryApiUrl: api.url });
    api.setPod(pod("kiln-0", { ip: "127.0.0.2" }));
    api.setPod(pod("kiln-1", { ip: "127.0.0.3" }));
    const u = (i: number): string => `http://127.0.0.${i + 2}:${port}`;
    await until("two workers", async () => (await healthyUrls(url)).length === 2);
    await until("the watch", () => api.openWatches() === 1);

    // missed: kiln-0 deleted, kiln-2 added; then the history is compacted and the watch gets 410
    const lists = api.lists();
    api.silently(() => {
      api.deletePod("kiln-0");
      api.setPod(pod("kiln-2", { ip: "127.0.0.4" }));
    });
    assert.deepEqual((await workersOf(url)).workers.map((w) => w.url), [u(0), u(1)]); // the router cannot know yet
    api.expireWatches();
    assert.deepEqual(await until("the relist after 410", async () => {
      const urls = (await workersOf(url)).workers.map((w) => w.url).sort();
      return urls.length === 2 && urls[0] === u(1) && urls;
    }), [u(1), u(2)]);
    assert.equal(api.lists(), lists + 1);
    await until("the watch again", () => api.openWatches() === 1);
    const rv = Number(api.requests.at(-1)!.query.get("resourceVersion"));
    assert.ok(rv > 100, "the new watch starts from the new list's resourceVersion");

    // the connection cut mid-stream: list again (after the backoff), then watch
    api.silently(() => api.deletePod("kiln-1"));
    api.dropWatches();
    await until("the relist after the dropped watch", async () => (await workersOf(url)).workers.map((w) => w.url).join() === u(2));
    assert.equal(api.lists(), lists + 2);
    await until("the watch after the relist", () => api.openWatches() === 1);
    api.setPod(pod("kiln-0", { ip: "127.0.0.2" })); // and events flow again
    await until("the new pod", async () => (await workersOf(url)).workers.length === 2);
  });

  it("403 (no RBAC) and an unreachable API are logged with the reason and retried; the router serves its static workers meanwhile", async () => {
    const api = await fakeApi();
    const fixed = await startFakeWorker("static");
    workers.push(fixed);
    const { port } = await podWorkers(1);
    api.refuse = { code: 403, reason: "Forbidden", message: 'pods is forbidden: User "system:serviceaccount:default:kiln-router" cannot list resource "pods" in API group "" in the namespace "default"' };
    const lines: string[] = [];
    const { url } = await router({ workerUrls: [fixed.url], selector: { app: "kiln" }, serviceDiscoveryPort: port, serviceDiscoveryApiUrl: api.url }, lines);
    api.setPod(pod("kiln-0", { ip: "127.0.0.2" }));
    await until("two refused lists", () => api.lists() === 0 && api.requests.length >= 2);
    const logged = lines.find((l) => l.includes("403 Forbidden"));
    assert.ok(logged !== undefined, lines.join("\n"));
    assert.match(logged, /WARNING service discovery: listing pods app=kiln in namespace default failed: 403 Forbidden: pods is forbidden: User .*needs get, list and watch on pods in namespace default.*; retrying in/);
    const sd = (await workersOf(url)).service_discovery;
    assert.equal(sd.watches[0]!.synced, false);
    assert.match(sd.watches[0]!.last_error!, /403 Forbidden/);
    assert.equal((await complete(url)).status, 200); // the static worker serves

    api.refuse = null; // the RoleBinding is applied
    await until("the pod after RBAC", async () => (await healthyUrls(url)).length === 2);
    assert.equal((await workersOf(url)).service_discovery.watches[0]!.last_error, null);

    const down: string[] = [];
    const { url: r2 } = await router({ selector: { app: "kiln" }, serviceDiscoveryPort: port, serviceDiscoveryApiUrl: await deadUrl() }, down);
    await until("the connection failure logged twice", () => down.filter((l) => l.includes("failed: ECONNREFUSED")).length >= 2);
    assert.equal((await fetch(`${r2}/health`)).status, 503);
  });

  it("P/D: --prefill-selector pods join the prefill pool (bootstrap port from the annotation), --decode-selector pods the decode pool; relabelling moves a pod", async () => {
    const api = await fakeApi();
    const { ws: [p0, d0], port } = await podWorkers(2);
    p0!.handler = prefillAnswer(fakeKvParams("engine-p0"));
    const { url } = await router({
      pdDisaggregation: true, prefillSelector: { component: "prefill" }, decodeSelector: { app: "kiln" }, serviceDiscoveryPort: port, serviceDiscoveryApiUrl: api.url,
    });
    // the prefill pod matches both selectors: it is a prefill worker only (vllm-router's precedence)
    api.setPod(pod("kiln-prefill-0", { ip: "127.0.0.2", labels: { app: "kiln", component: "prefill" }, annotations: { "vllm.ai/bootstrap-port": "8998" } }));
    api.setPod(pod("kiln-decode-0", { ip: "127.0.0.3", labels: { app: "kiln", component: "decode" } }));
    await until("both pools", async () => (await healthyUrls(url)).length === 2);
    const body = await workersOf(url);
    assert.deepEqual(body.workers.map((w) => [w.role, w.url, w.bootstrap_port, w.pod?.name]), [
      ["prefill", `http://127.0.0.2:${port}`, 8998, "kiln-prefill-0"],
      ["decode", `http://127.0.0.3:${port}`, undefined, "kiln-decode-0"],
    ]);
    assert.deepEqual(body.service_discovery.watches.map((w) => [w.role, w.selector]), [["prefill", "component=prefill"], ["decode", "app=kiln"]]);
    const r = await complete(url);
    assert.equal(r.status, 200);
    assert.equal(r.headers.get("x-kiln-prefill-worker"), `http://127.0.0.2:${port}`);
    assert.equal(r.headers.get("x-kiln-worker"), `http://127.0.0.3:${port}`);
    assert.equal((JSON.parse(d0!.seen.at(-1)!.body) as { kv_transfer_params: { remote_engine_id: string } }).kv_transfer_params.remote_engine_id, "engine-p0");

    // relabelled a prefill pod: it moves pools, whichever of the two watches reports first
    api.setPod(pod("kiln-decode-0", { ip: "127.0.0.3", labels: { app: "kiln", component: "prefill" } }));
    await until("the relabelled pod in the prefill pool", async () => (await workersOf(url)).workers.map((w) => w.role).join() === "prefill,prefill");
    assert.equal((await fetch(`${url}/health`)).status, 503); // no decode worker left
    api.deletePod("kiln-prefill-0");
    api.deletePod("kiln-decode-0");
    await until("the pods gone", async () => (await workersOf(url)).workers.length === 0);
  });
});

/** A self-signed certificate other than the fake API's. */
const OTHER_CA = "-----BEGIN CERTIFICATE-----\nMIIBkjCCATigAwIBAgIUN7SnGR8T7jydOesxIeztfp8NZ1owCgYIKoZIzj0EAwIw\nFTETMBEGA1UEAwwKa3ViZXJuZXRlczAgFw0yNjEyMDUxMDQxMjZaGA8yMTI2MTEx\nMTEwNDEyNlowFTETMBEGA1UEAwwKa3ViZXJuZXRlczBZMBMGByqGSM49AgEGCCqG\nSM49AwEHA0IABAKFT+dfqYnbYKCPcmlpQ02ctQgDK6QNd+v6CIc9Pxn8Mc0BvZXM\ndaXkkyNnvvCMeQBKpFkm8XiLIgvXdZULXEijZDBiMB0GA1UdDgQWBBTXQlsm37Tz\nmb++g1RgHxdmn6dVHTAfBgNVHSMEGDAWgBTXQlsm37Tzmb++g1RgHxdmn6dVHTAP\nBgNVHRMBAf8EBTADAQH/MA8GA1UdEQQIMAaHBH8AAAEwCgYIKoZIzj0EAwIDSAAw\nRQIgA3J+BCntZxiFgObubzOZjJbRDMbgHBVk1RsSGvmSrZcCIQDwFi/p0+Eg/6ih\nhxh9Qsrn71V0Bq3mRPDm4zU96of60A==\n-----END CERTIFICATE-----\n";

describe("pods as workers", () => {
  const spec = { role: "regular" as const, selector: { app: "kiln" } };
  it("Running, Ready, an IP and no deletionTimestamp make a worker; anything less says why not", () => {
    assert.deepEqual(podWorker(pod("a", { ip: "10.1.2.3" }), spec, 8000, "x/y"), { url: "http://10.1.2.3:8000", role: "regular", bootstrapPort: null, pod: "a", namespace: "default" });
    assert.equal((podWorker(pod("a", { ip: "fd00::7" }), spec, 8000, "x/y") as { url: string }).url, "http://[fd00::7]:8000");
    const why = (p: ReturnType<typeof pod>, s: Parameters<typeof podWorker>[1] = spec) => (podWorker(p, s, 8000, "x/y") as { reason: string }).reason;
    assert.equal(why(pod("a", { phase: "Pending", ready: false })), "phase Pending");
    assert.equal(why(pod("a", { ready: false })), "not Ready");
    assert.equal(why(pod("a", { ip: null })), "no pod IP");
    assert.equal(why(pod("a", { terminating: true })), "terminating");
    assert.equal(why(pod("a", { labels: { app: "other" } })), "labels do not match app=kiln");
    assert.match(why(pod("a", { labels: { app: "kiln", role: "p" } }), { ...spec, exclude: { role: "p" } }), /another role's selector/);
    const prefill = { role: "prefill" as const, selector: { app: "kiln" } };
    const port = (v: string) => (podWorker(pod("a", { annotations: { "vllm.ai/bootstrap-port": v } }), prefill, 8000, "vllm.ai/bootstrap-port") as { bootstrapPort: number | null }).bootstrapPort;
    assert.equal(port("8998"), 8998);
    assert.equal(port("99999"), null);
    assert.equal(port("abc"), null);
  });

  it("in-cluster: https://KUBERNETES_SERVICE_HOST:PORT verified with the service account's CA, its token (read again for each request)", async () => {
    assert.throws(() => inClusterConnection({}), /KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set.*--service-discovery-api-url/);
    const dir = mkdtempSync(join(tmpdir(), "kiln-sa-"));
    writeFileSync(join(dir, "token"), "token-1\n");
    writeFileSync(join(dir, "namespace"), "serving");
    assert.deepEqual(inClusterConnection({ KUBERNETES_SERVICE_HOST: "10.96.0.1", KUBERNETES_SERVICE_PORT: "443" }, dir), {
      baseUrl: "https://10.96.0.1:443", tokenFile: join(dir, "token"), caFile: join(dir, "ca.crt"), podNamespace: "serving",
    });
    assert.equal(inClusterConnection({ KUBERNETES_SERVICE_HOST: "fd00::1", KUBERNETES_SERVICE_PORT: "443" }, dir).baseUrl, "https://[fd00::1]:443");

    const api = await fakeApi(true);
    const env = { KUBERNETES_SERVICE_HOST: "127.0.0.1", KUBERNETES_SERVICE_PORT: new URL(api.url).port };
    const client = new KubeClient(inClusterConnection(env, dir));
    const signal = AbortSignal.timeout(5000);
    // no ca.crt mounted yet: the error says which file and why
    await assert.rejects(client.listPods("serving", { app: "kiln" }, signal), /cannot read the service-account CA bundle .*ca\.crt \(ENOENT\)/);
    writeFileSync(join(dir, "ca.crt"), OTHER_CA); // not the API server's: TLS refuses it
    await assert.rejects(client.listPods("serving", { app: "kiln" }, signal), (e: NodeJS.ErrnoException) => /SELF_SIGNED|UNABLE_TO_VERIFY/.test(e.code ?? ""));
    writeFileSync(join(dir, "ca.crt"), FAKE_API_TLS.cert);
    api.setPod(pod("kiln-0", { namespace: "serving" }));
    assert.deepEqual((await client.listPods("serving", { app: "kiln" }, signal)).pods.map((p) => p.metadata.name), ["kiln-0"]);
    writeFileSync(join(dir, "token"), "token-2\n"); // the kubelet rotated it
    await client.listPods(null, { app: "kiln" }, signal);
    assert.deepEqual(api.requests.map((r) => [r.path, r.authorization]), [["/api/v1/namespaces/serving/pods", "Bearer token-1"], ["/api/v1/pods", "Bearer token-2"]]);
  });
});
