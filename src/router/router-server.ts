// createRouter(): the fleet's front door, a fastify app that serves the OpenAI API by proxying each request to one
// worker (proxy.ts) chosen by the policy, or with P/D disaggregation each completion to a prefill worker and then a
// decode worker (pd-proxy.ts), plus its own /health, /metrics, /workers, /v1/models (the workers' models) and
// vllm-router's admin routes (/list_workers, /add_worker?url=, /remove_worker?url=). With service discovery the
// fleet also follows the Kubernetes pods a label selector matches (pod-discovery.ts), through the same add and remove
// paths as the admin routes.
import * as http from "node:http";
import * as https from "node:https";
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from "fastify";
import { errorBodyFor, noWorker, RouterError, toRouterError } from "./errors.js";
import { KvBlockIndex } from "./kv-block-index.js";
import { KvEventsSubscriber } from "./kv-events-subscriber.js";
import { inClusterConnection, KubeClient, urlConnection } from "./kube-api.js";
import { createPolicy } from "./policies.js";
import { isJsonObject, proxyDisaggregated, type PdContexts } from "./pd-proxy.js";
import { PodDiscovery, type DiscoveredWorker, type DiscoverySink, type PodWatchSpec } from "./pod-discovery.js";
import { proxyRequest, type ProxyContext, type ProxyRequest } from "./proxy.js";
import { resolveRouterConfig, type RouterConfig } from "./router-config.js";
import { RouterMetrics } from "./router-metrics.js";
import type { PolicyName, RoutingPolicy, WorkerOrigin, WorkerRole } from "./routing-types.js";
import { routingText } from "./request-text.js";
import { RequestTokenizer } from "./request-tokens.js";
import { describeFetchError, normalizeWorkerUrl, WorkerPool } from "./worker-pool.js";
import { routeMethods, withoutTrailingSlash } from "../util/route-methods.js";

/** OpenAI (and vLLM) endpoints, and Anthropic's Messages, proxied to one worker, routed by their request body's text. */
export const PROXIED_POST_ROUTES = [
  "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens",
  "/tokenize", "/detokenize", "/pooling",
  "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/classify", "/v1/classify",
] as const;

/** The routes P/D disaggregation splits in a prefill and a decode phase; the others go to a decode worker whole. */
export const PD_ROUTES: ReadonlySet<string> = new Set(["/v1/completions", "/v1/chat/completions"]);

const LOG_RANK = { debug: 0, info: 1, warning: 2, error: 3, critical: 4 } as const;

/** Workers of one role and the policy that chooses among them. */
export interface WorkerGroup {
  readonly pool: WorkerPool;
  readonly policy: RoutingPolicy;
}

export interface Router {
  readonly app: FastifyInstance;
  /** The workers that answer clients: every worker, or with P/D disaggregation the decode workers. */
  readonly pool: WorkerPool;
  readonly policy: RoutingPolicy;
  /** With P/D disaggregation the prefill workers and their policy, else null. */
  readonly prefill: WorkerGroup | null;
  readonly metrics: RouterMetrics;
  readonly config: RouterConfig;
  /** Which workers hold which prefix-cache blocks, from their KV-cache events (null without --kv-events-endpoint). */
  readonly kvIndex: KvBlockIndex | null;
  /** The Kubernetes pod watches (null without --service-discovery); they start with listen(). */
  readonly discovery: PodDiscovery | null;
  /** Checks the workers once, starts the periodic checks and eviction, listens; resolves with the base URL. */
  listen(): Promise<string>;
  /**
   * Stops the timers and new connections, lets in-flight responses finish, then drops every remaining connection
   * (idle keep-alive ones, and those a client opened without sending anything) and the kept-alive worker sockets.
   */
  close(): Promise<void>;
}

export interface RouterDeps {
  /** Uniform [0, 1) source for random and power_of_two. */
  random?: () => number;
  /** Where log lines go (stderr by default). */
  log?: (line: string) => void;
  /** Service discovery's retry backoff and watch length (tests shorten them). */
  discoveryTiming?: { retryInitialMs?: number; retryMaxMs?: number; watchTimeoutSecs?: number };
}

/**
 * @example
 * const router = createRouter({ workerUrls: ["http://127.0.0.1:8001", "http://127.0.0.1:8002"], port: 30000 });
 * console.log(await router.listen()); // http://127.0.0.1:30000
 */
export function createRouter(options: Partial<RouterConfig>, deps: RouterDeps = {}): Router {
  const config = resolveRouterConfig(options);
  const write = deps.log ?? ((line: string) => process.stderr.write(`${line}\n`));
  const log = (level: keyof typeof LOG_RANK, line: string): void => {
    if (LOG_RANK[level] >= LOG_RANK[config.logLevel]) write(`[router] ${level.toUpperCase()} ${line}`);
  };
  const kvIndex = config.kvEventsEndpoint === null ? null : new KvBlockIndex();
  const tokens = config.tokenizer === null ? null : RequestTokenizer.fromDir(config.tokenizer, { ...config.workerPrompt, chatTemplate: config.chatTemplate });
  const group = (role: WorkerRole, urls: readonly string[], policyName: PolicyName): WorkerGroup => {
    const policy = createPolicy(policyName, { ...config, kvBlockIndex: kvIndex, ...(deps.random ? { random: deps.random } : {}) });
    const named = role === "regular" ? "worker" : `${role} worker`;
    const pool = new WorkerPool(urls, {
      ...config,
      role,
      onHealthChange: (w, healthy, reason) => {
        log(healthy ? "info" : "warning", `${named} ${w.url} is ${healthy ? "healthy" : "down"} (${reason})`);
        if (!healthy) {
          policy.forgetWorker(w.url); // its KV cache is gone or unreachable: stop steering prefixes to it
          kvIndex?.removeWorker(w.url);
        }
      },
    });
    return { pool, policy };
  };
  const pd = config.pdDisaggregation;
  const prefill = pd ? group("prefill", config.prefillUrls.map((p) => p.url), config.prefillPolicy ?? config.policy) : null;
  const main = pd ? group("decode", config.decodeUrls, config.decodePolicy ?? config.policy) : group("regular", config.workerUrls, config.policy);
  const { pool, policy } = main;
  const groups: WorkerGroup[] = prefill === null ? [main] : [prefill, main];
  const bootstrapPorts = new Map(config.prefillUrls.map((p) => [p.url, p.bootstrapPort]));
  const holderOf = (url: string): WorkerGroup | undefined => groups.find((g) => g.pool.get(url) !== undefined);
  const named = (g: WorkerGroup): string => `${g.pool.role === "regular" ? "" : `${g.pool.role} `}worker`;
  /** Puts `url` in `target`'s pool, unchecked (not routed to) until its first health check; false when it was there. */
  const addWorker = (target: WorkerGroup, url: string, origin: WorkerOrigin, bootstrapPort: number | null = null): boolean => {
    if (!target.pool.add(url, origin)) return false;
    if (target.pool.role === "prefill") bootstrapPorts.set(url, bootstrapPort);
    return true;
  };
  /** Takes `url` out of `holder`'s pool: its policy state, KV-events index entries and health state go with it. */
  const removeWorker = (holder: WorkerGroup, url: string): void => {
    holder.pool.remove(url);
    holder.policy.forgetWorker(url);
    kvIndex?.removeWorker(url);
    bootstrapPorts.delete(url);
  };
  const groupOf = (role: WorkerRole): WorkerGroup => (role === "prefill" ? prefill! : main);
  /** Whether `url` is held by `d`'s own pod (a static worker, or another pod's, may sit at the same URL). */
  const isPods = (url: string, d: DiscoveredWorker): boolean => {
    const o = holderOf(url)?.pool.get(url)?.origin;
    return o?.source === "discovered" && o.pod === d.pod && o.namespace === d.namespace;
  };
  const discovery = config.serviceDiscovery ? createDiscovery(config, deps, log, {
    join(d) {
      const target = groupOf(d.role);
      const holder = holderOf(d.url);
      // relabelled from decode to prefill (or back): the other role's watch may report its leaving after this join
      if (holder !== undefined && holder !== target && isPods(d.url, d)) removeWorker(holder, d.url);
      else if (holder !== undefined) {
        const o = holder.pool.get(d.url)!.origin;
        log("warning", `service discovery: pod ${d.namespace}/${d.pod} is ${d.url}, already a ${named(holder)} (${o.source === "discovered" ? `pod ${o.namespace}/${o.pod}` : o.source}); not added again`);
        return;
      }
      addWorker(target, d.url, { source: "discovered", pod: d.pod, namespace: d.namespace }, d.bootstrapPort);
      log("info", `${named(target)} ${d.url} added (pod ${d.namespace}/${d.pod}${d.bootstrapPort === null ? "" : `, bootstrap port ${d.bootstrapPort}`})`);
      void target.pool.checkWorker(d.url);
    },
    leave(d, why) {
      const holder = holderOf(d.url);
      if (holder !== groupOf(d.role) || !isPods(d.url, d)) return; // not this pod's worker of this role
      removeWorker(holder, d.url);
      log("info", `${named(holder)} ${d.url} removed (pod ${d.namespace}/${d.pod}: ${why})`);
    },
  }) : null;
  let subscriber: KvEventsSubscriber | null = null;
  const metrics = new RouterMetrics(groups.map((g) => g.pool));
  const agents = { http: new http.Agent({ keepAlive: true }), https: new https.Agent({ keepAlive: true }) };
  const ctx: ProxyContext = { pool, policy, metrics, config, agents, log };
  const pdContexts: PdContexts | null = prefill === null ? null : { prefill: { ...ctx, ...prefill }, decode: ctx };

  // "/v1/models/" is "/v1/models", as the workers (vLLM's Starlette, `kiln serve`) serve it
  const app = Fastify({ logger: false, bodyLimit: config.maxPayloadSize, return503OnClosing: true, routerOptions: { ignoreTrailingSlash: true } }) as unknown as FastifyInstance;
  // bodies are forwarded byte for byte; JSON is parsed here only to read the routing text
  app.removeAllContentTypeParsers();
  app.addContentTypeParser("*", { parseAs: "buffer" }, (_req, body, done) => done(null, body));
  installCors(app, config.corsAllowedOrigins);
  app.setErrorHandler(async (err, request, reply) => {
    // a client gone while sending its body: nobody to answer, and no error of the router's
    if (request.raw.socket?.destroyed) return reply.hijack();
    const e = toRouterError(err);
    metrics.error(request.routeOptions.url ?? request.url, e.code ?? "error");
    return reply.code(e.status).send(errorBodyFor(e, request.url));
  });
  // a known path asked with another method gets 405 and Allow, as the workers (vLLM's Starlette) answer; others 404
  const methodsOf = routeMethods(app);
  app.setNotFoundHandler((request, reply) => {
    const path = request.url.split("?")[0]!;
    const allowed = methodsOf(path);
    if (allowed.length > 0) {
      const err = new RouterError(405, `Method ${request.method} not allowed for ${path} (allowed: ${allowed.join(", ")})`, "method_not_allowed");
      return void reply.code(405).header("allow", allowed.join(", ")).send(errorBodyFor(err, request.url));
    }
    void reply.code(404).send(errorBodyFor(new RouterError(404, `Route ${request.method} ${path} not found`), request.url));
  });

  /** The parsed JSON body of a request that must have one (400 with OpenAI's error object otherwise). */
  const jsonBody = (request: FastifyRequest): unknown => {
    const body = request.body as Buffer | undefined;
    const type = request.headers["content-type"] ?? "application/json";
    if (!type.includes("json")) return null; // forwarded as is: the worker judges it
    if (body === undefined || body.length === 0) throw new RouterError(400, "Malformed JSON body: the body is empty", "invalid_json");
    try {
      return JSON.parse(body.toString("utf8")) as unknown;
    } catch (e) {
      throw new RouterError(400, `Malformed JSON body: ${(e as Error).message}`, "invalid_json");
    }
  };

  let active = 0; // proxied responses not yet ended: close() waits for them
  /** Proxies the request (its parsed JSON body, where it has one, is `parsed`); P/D splits the PD_ROUTES' JSON objects. */
  const forward = async (
    request: FastifyRequest, reply: FastifyReply, route: string, text: string, { tryNextOn404 = false, parsed, lookup = false }: { tryNextOn404?: boolean; parsed?: unknown; lookup?: boolean } = {},
  ): Promise<void> => {
    const started = performance.now();
    metrics.request(route);
    reply.hijack();
    active++;
    reply.raw.once("close", () => {
      active--;
      metrics.observe(route, (performance.now() - started) / 1000);
    });
    const body = (request.body as Buffer | undefined) ?? null;
    const hashesOf = tokens === null || kvIndex === null || parsed === undefined ? null : tokens.blockHashes(route, parsed);
    // the route's own path (a trailing slash dropped: vLLM would answer it with a redirect) and the client's query
    const url = withoutTrailingSlash(request.url);
    const req: ProxyRequest = { route, method: request.method, url, headers: request.headers, body, text, tryNextOn404, hashesOf, lookup };
    if (pdContexts !== null && PD_ROUTES.has(route) && body !== null && isJsonObject(parsed)) await proxyDisaggregated(pdContexts, { ...req, body }, parsed, reply.raw);
    else await proxyRequest(ctx, req, reply.raw);
  };

  for (const route of PROXIED_POST_ROUTES) {
    app.post(route, async (request, reply) => {
      const body = jsonBody(request);
      // a continued Responses conversation is stored on the worker that answered its previous turn: the others
      // answer 404 (previous_response_id not found) at once, and the request tries the next worker
      const continued = route === "/v1/responses" && typeof (body as { previous_response_id?: unknown } | null)?.previous_response_id === "string";
      return forward(request, reply, route, routingText(route, body), { tryNextOn404: continued, parsed: body });
    });
  }
  // a stored response lives on the worker that made it: ask each until one has it
  app.get("/v1/responses/:id", async (request, reply) => forward(request, reply, "/v1/responses/{id}", "", { tryNextOn404: true, lookup: true }));
  app.post("/v1/responses/:id/cancel", async (request, reply) => forward(request, reply, "/v1/responses/{id}/cancel", "", { tryNextOn404: true, lookup: true }));

  app.get("/v1/models", async (request, reply) => {
    metrics.request("/v1/models");
    const healthy = pool.healthy();
    if (healthy.length === 0) throw noWorker(`${pool.all().length} worker(s) configured, none healthy`);
    const headers: Record<string, string> = {};
    if (request.headers.authorization !== undefined) headers.authorization = request.headers.authorization;
    const answers = await Promise.all(healthy.map(async (w) => {
      try {
        const res = await fetch(`${w.url}/v1/models`, { headers, signal: AbortSignal.timeout(config.healthCheckTimeoutMs) });
        return { status: res.status, body: (await res.json()) as { data?: unknown } | null };
      } catch (e) {
        log("warning", `worker ${w.url} /v1/models failed: ${describeFetchError(e)}`);
        return null;
      }
    }));
    const ok = answers.filter((a) => a !== null && a.status === 200);
    if (ok.length === 0) {
      const refused = answers.find((a) => a !== null); // e.g. 401 from workers that want an API key: theirs to say
      if (refused) return reply.code(refused.status).send(refused.body);
      throw noWorker("no worker answered /v1/models");
    }
    const seen = new Map<string, unknown>();
    // a worker's list that is not one (a proxy's page, a broken worker) adds nothing rather than failing the listing
    for (const a of ok) {
      const data = a!.body?.data;
      if (!Array.isArray(data)) continue;
      for (const m of data as unknown[]) {
        const id = (m as { id?: unknown } | null)?.id;
        if (typeof id === "string" && !seen.has(id)) seen.set(id, m);
      }
    }
    return { object: "list", data: [...seen.values()] };
  });

  // healthy while every role has a healthy worker (P/D needs a prefill and a decode worker)
  app.get("/health", async (_request, reply) => {
    const down = groups.find((g) => g.pool.healthy().length === 0);
    if (down !== undefined)
      return reply.code(503).send(noWorker(`${down.pool.all().length} ${down.pool.role === "regular" ? "" : `${down.pool.role} `}worker(s) configured, none healthy`).toBody());
    const count = (f: (p: WorkerPool) => number) => groups.reduce((n, g) => n + f(g.pool), 0);
    return {
      status: "ok", healthy_workers: count((p) => p.healthy().length), workers: count((p) => p.all().length),
      ...(prefill === null ? {} : { healthy_prefill_workers: prefill.pool.healthy().length, healthy_decode_workers: pool.healthy().length }),
    };
  });
  app.get("/metrics", async (_request, reply) => reply.type(metrics.registry.contentType).send(await metrics.render()));
  const urlsOf = (p: WorkerPool): string[] => p.all().map((w) => w.url);
  app.get("/list_workers", async () => ({
    urls: groups.flatMap((g) => urlsOf(g.pool)),
    ...(prefill === null ? {} : { prefill: urlsOf(prefill.pool), decode: urlsOf(pool) }),
  }));
  app.get("/workers", async () => ({
    policy: config.policy,
    ...(prefill === null ? {} : { pd_disaggregation: true, prefill_policy: prefill.policy.name, decode_policy: policy.name }),
    ...(kvIndex === null ? {} : { kv_events: { ...kvIndex.stats } }),
    ...(discovery === null ? {} : { service_discovery: discovery.status() }),
    workers: groups.flatMap(({ pool: p }) => p.all().map((w) => ({
      url: w.url, role: p.role, ...(p.role === "prefill" ? { bootstrap_port: bootstrapPorts.get(w.url) ?? null } : {}),
      source: w.origin.source, ...(w.origin.source === "discovered" ? { pod: { name: w.origin.pod, namespace: w.origin.namespace } } : {}),
      healthy: w.healthy, in_flight: w.inFlight, load: p.view(w).load, last_error: w.lastError,
      ...(kvIndex === null ? {} : { kv_blocks: kvIndex.size(w.url) }),
      reported: w.reported === null ? null : { running: w.reported.running, waiting: w.reported.waiting, kv_cache_usage_perc: w.reported.kvCacheUsage },
    }))),
  }));
  /** The ?url= of an admin request, normalized (400 when missing or not an http(s) URL). */
  const urlParam = (request: FastifyRequest): string => {
    const url = (request.query as Record<string, unknown>).url;
    if (typeof url !== "string" || url === "") throw new RouterError(400, "missing ?url= (the worker's base URL, e.g. http://127.0.0.1:8001)", null, "invalid_request_error", "url");
    try {
      return normalizeWorkerUrl(url);
    } catch (e) {
      throw new RouterError(400, (e as Error).message, null, "invalid_request_error", "url");
    }
  };
  /** The group an added worker joins: with P/D its ?role= (prefill or decode) says which; without, there is one. */
  const groupParam = (request: FastifyRequest): WorkerGroup => {
    const role = (request.query as Record<string, unknown>).role;
    if (prefill === null) {
      if (role === undefined || role === "regular") return main;
      throw new RouterError(400, `?role=${String(role)} needs P/D disaggregation (--pd-disaggregation)`, null, "invalid_request_error", "role");
    }
    if (role === "prefill") return prefill;
    if (role === "decode") return main;
    throw new RouterError(400, "with P/D disaggregation ?role= must say prefill or decode", null, "invalid_request_error", "role");
  };
  app.post("/add_worker", async (request) => {
    const url = urlParam(request);
    const target = groupParam(request);
    const other = groups.find((g) => g !== target && g.pool.get(url) !== undefined);
    if (other !== undefined) throw new RouterError(400, `worker ${url} is already a ${other.pool.role} worker`, null, "invalid_request_error", "url");
    const added = addWorker(target, url, { source: "api" });
    if (added) await target.pool.checkWorker(url);
    log("info", `${named(target)} ${url} ${added ? "added" : "was already in the fleet"}`);
    return { url, ...(prefill === null ? {} : { role: target.pool.role }), added, healthy: target.pool.get(url)!.healthy };
  });
  app.post("/remove_worker", async (request) => {
    const url = urlParam(request);
    const holder = holderOf(url);
    if (holder === undefined) throw new RouterError(404, `worker ${url} is not in the fleet`, null, "not_found_error", "url");
    removeWorker(holder, url);
    log("info", `${named(holder)} ${url} removed`);
    return { url, removed: true };
  });

  let evictTimer: NodeJS.Timeout | null = null;
  return {
    app, pool, policy, prefill, metrics, config, kvIndex, discovery,
    async listen() {
      // subscribed in the background: routing falls back to load until events arrive
      if (kvIndex !== null) subscriber = new KvEventsSubscriber(config.kvEventsEndpoint!, config.kvEventsTopic, kvIndex, (level, line) => log(level, line));
      await Promise.all(groups.map((g) => g.pool.start()));
      discovery?.start(); // in the background: the router serves (503 until a pod is ready) while it lists
      evictTimer = setInterval(() => {
        for (const g of groups) g.policy.maintain();
      }, config.evictionIntervalMs);
      evictTimer.unref();
      await app.listen({ host: config.host, port: config.port });
      const addr = app.server.address();
      const port = addr !== null && typeof addr === "object" ? addr.port : config.port;
      return `http://${config.host.includes(":") ? `[${config.host}]` : config.host}:${port}`;
    },
    async close() {
      for (const g of groups) g.pool.stop();
      await Promise.all([subscriber?.close(), discovery?.close()]);
      if (evictTimer !== null) clearInterval(evictTimer);
      const closed = app.close();
      const sweeper = setInterval(() => {
        if (active === 0) app.server.closeAllConnections();
      }, 50);
      try {
        await closed;
      } finally {
        clearInterval(sweeper);
      }
      agents.http.destroy();
      agents.https.destroy();
    },
  };
}

/** The pod watches of --service-discovery: one per selector; with P/D a pod matching both selectors is a prefill worker. */
function createDiscovery(config: RouterConfig, deps: RouterDeps, log: (level: "debug" | "info" | "warning" | "error", line: string) => void, sink: DiscoverySink): PodDiscovery {
  const url = config.serviceDiscoveryApiUrl;
  const client = new KubeClient(url === null ? inClusterConnection() : urlConnection(url));
  const isSet = (selector: Record<string, string>): boolean => Object.keys(selector).length > 0;
  const watches: PodWatchSpec[] = !config.pdDisaggregation ? [{ role: "regular", selector: config.selector }] : [
    ...(isSet(config.prefillSelector) ? [{ role: "prefill" as const, selector: config.prefillSelector }] : []),
    ...(isSet(config.decodeSelector) ? [{ role: "decode" as const, selector: config.decodeSelector, ...(isSet(config.prefillSelector) ? { exclude: config.prefillSelector } : {}) }] : []),
  ];
  return new PodDiscovery(client, sink, {
    namespace: config.serviceDiscoveryNamespace, port: config.serviceDiscoveryPort, bootstrapPortAnnotation: config.bootstrapPortAnnotation,
    watches, log, ...deps.discoveryTiming,
  });
}

/**
 * CORS as vllm-router's --cors-allowed-origins: any origin when the list is empty, else only those listed; preflight
 * OPTIONS answered here (the workers' own CORS headers are dropped from proxied answers: the router's policy holds).
 */
function installCors(app: FastifyInstance, origins: string[]): void {
  app.addHook("onRequest", async (request, reply) => {
    const origin = request.headers.origin;
    if (origin === undefined || (origins.length > 0 && !origins.includes(origin))) return;
    // on the raw response, so that hijacked (proxied) answers carry them too
    reply.raw.setHeader("access-control-allow-origin", origins.length === 0 ? "*" : origin);
    if (origins.length > 0) reply.raw.setHeader("vary", "Origin");
    if (request.method === "OPTIONS") {
      reply.raw.setHeader("access-control-allow-methods", "GET, POST, OPTIONS");
      reply.raw.setHeader("access-control-allow-headers", request.headers["access-control-request-headers"] ?? "*");
      reply.raw.setHeader("access-control-max-age", "600");
      return reply.code(204).send();
    }
  });
}
