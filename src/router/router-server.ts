// createRouter(): the fleet's front door, a fastify app that serves the OpenAI API by proxying each request to one
// worker (proxy.ts) chosen by the policy, plus its own /health, /metrics, /v1/models (the workers' models) and
// vllm-router's admin routes (/list_workers, /add_worker?url=, /remove_worker?url=).
import * as http from "node:http";
import * as https from "node:https";
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from "fastify";
import { noWorker, RouterError, toRouterError } from "./errors.js";
import { KvBlockIndex } from "./kv-block-index.js";
import { KvEventsSubscriber } from "./kv-events-subscriber.js";
import { createPolicy } from "./policies.js";
import { proxyRequest, type ProxyContext } from "./proxy.js";
import { resolveRouterConfig, type RouterConfig } from "./router-config.js";
import { RouterMetrics } from "./router-metrics.js";
import type { RoutingPolicy } from "./routing-types.js";
import { routingText } from "./request-text.js";
import { RequestTokenizer } from "./request-tokens.js";
import { describeFetchError, normalizeWorkerUrl, WorkerPool } from "./worker-pool.js";

/** OpenAI (and vLLM) endpoints proxied to one worker, routed by their request body's text. */
export const PROXIED_POST_ROUTES = [
  "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
  "/tokenize", "/detokenize", "/pooling",
  "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/classify", "/v1/classify",
] as const;

const LOG_RANK = { debug: 0, info: 1, warning: 2, error: 3, critical: 4 } as const;

export interface Router {
  readonly app: FastifyInstance;
  readonly pool: WorkerPool;
  readonly policy: RoutingPolicy;
  readonly metrics: RouterMetrics;
  readonly config: RouterConfig;
  /** Which workers hold which prefix-cache blocks, from their KV-cache events (null without --kv-events-endpoint). */
  readonly kvIndex: KvBlockIndex | null;
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
}

/**
 * @example
 * const router = createRouter({ workerUrls: ["http://127.0.0.1:8001", "http://127.0.0.1:8002"], port: 30000 });
 * console.log(await router.listen()); // http://127.0.0.1:30000
 */
export function createRouter(options: Partial<RouterConfig> & { workerUrls: string[] }, deps: RouterDeps = {}): Router {
  const config = resolveRouterConfig(options);
  const write = deps.log ?? ((line: string) => process.stderr.write(`${line}\n`));
  const log = (level: keyof typeof LOG_RANK, line: string): void => {
    if (LOG_RANK[level] >= LOG_RANK[config.logLevel]) write(`[router] ${level.toUpperCase()} ${line}`);
  };
  const kvIndex = config.kvEventsEndpoint === null ? null : new KvBlockIndex();
  const tokens = config.tokenizer === null ? null : RequestTokenizer.fromDir(config.tokenizer, config.chatTemplate);
  const policy = createPolicy(config.policy, { ...config, kvBlockIndex: kvIndex, ...(deps.random ? { random: deps.random } : {}) });
  const pool = new WorkerPool(config.workerUrls, {
    ...config,
    onHealthChange: (w, healthy, reason) => {
      log(healthy ? "info" : "warning", `worker ${w.url} is ${healthy ? "healthy" : "down"} (${reason})`);
      if (!healthy) {
        policy.forgetWorker(w.url); // its KV cache is gone or unreachable: stop steering prefixes to it
        kvIndex?.removeWorker(w.url);
      }
    },
  });
  let subscriber: KvEventsSubscriber | null = null;
  const metrics = new RouterMetrics(pool);
  const agents = { http: new http.Agent({ keepAlive: true }), https: new https.Agent({ keepAlive: true }) };
  const ctx: ProxyContext = { pool, policy, metrics, config, agents, log };

  const app = Fastify({ logger: false, bodyLimit: config.maxPayloadSize, return503OnClosing: true }) as unknown as FastifyInstance;
  // bodies are forwarded byte for byte; JSON is parsed here only to read the routing text
  app.removeAllContentTypeParsers();
  app.addContentTypeParser("*", { parseAs: "buffer" }, (_req, body, done) => done(null, body));
  installCors(app, config.corsAllowedOrigins);
  app.setErrorHandler(async (err, request, reply) => {
    // a client gone while sending its body: nobody to answer, and no error of the router's
    if (request.raw.socket?.destroyed) return reply.hijack();
    const e = toRouterError(err);
    metrics.error(request.routeOptions.url ?? request.url, e.code ?? "error");
    return reply.code(e.status).send(e.toBody());
  });
  app.setNotFoundHandler((request, reply) => {
    void reply.code(404).send(new RouterError(404, `Route ${request.method} ${request.url.split("?")[0]} not found`).toBody());
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
  const forward = async (request: FastifyRequest, reply: FastifyReply, route: string, text: string, tryNextOn404 = false, parsed?: unknown, lookup = false): Promise<void> => {
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
    await proxyRequest(ctx, { route, method: request.method, url: request.url, headers: request.headers, body, text, tryNextOn404, hashesOf, lookup }, reply.raw);
  };

  for (const route of PROXIED_POST_ROUTES) {
    app.post(route, async (request, reply) => {
      const body = jsonBody(request);
      // a continued Responses conversation is stored on the worker that answered its previous turn: the others
      // answer 404 (previous_response_id not found) at once, and the request tries the next worker
      const continued = route === "/v1/responses" && typeof (body as { previous_response_id?: unknown } | null)?.previous_response_id === "string";
      return forward(request, reply, route, routingText(route, body), continued, body);
    });
  }
  // a stored response lives on the worker that made it: ask each until one has it
  app.get("/v1/responses/:id", async (request, reply) => forward(request, reply, "/v1/responses/{id}", "", true, undefined, true));
  app.post("/v1/responses/:id/cancel", async (request, reply) => forward(request, reply, "/v1/responses/{id}/cancel", "", true, undefined, true));

  app.get("/v1/models", async (request, reply) => {
    metrics.request("/v1/models");
    const healthy = pool.healthy();
    if (healthy.length === 0) throw noWorker(`${pool.all().length} worker(s) configured, none healthy`);
    const headers: Record<string, string> = {};
    if (request.headers.authorization !== undefined) headers.authorization = request.headers.authorization;
    const answers = await Promise.all(healthy.map(async (w) => {
      try {
        const res = await fetch(`${w.url}/v1/models`, { headers, signal: AbortSignal.timeout(config.healthCheckTimeoutMs) });
        return { status: res.status, body: (await res.json()) as { data?: { id: string }[] } };
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
    for (const a of ok) for (const m of a!.body.data ?? []) if (!seen.has(m.id)) seen.set(m.id, m);
    return { object: "list", data: [...seen.values()] };
  });

  app.get("/health", async (_request, reply) => {
    const healthy = pool.healthy().length;
    if (healthy === 0) return reply.code(503).send(noWorker(`${pool.all().length} worker(s) configured, none healthy`).toBody());
    return { status: "ok", healthy_workers: healthy, workers: pool.all().length };
  });
  app.get("/metrics", async (_request, reply) => reply.type(metrics.registry.contentType).send(await metrics.render()));
  app.get("/list_workers", async () => ({ urls: pool.all().map((w) => w.url) }));
  app.get("/workers", async () => ({
    policy: policy.name,
    ...(kvIndex === null ? {} : { kv_events: { ...kvIndex.stats } }),
    workers: pool.all().map((w) => ({
      url: w.url, healthy: w.healthy, in_flight: w.inFlight, load: pool.view(w).load, last_error: w.lastError,
      ...(kvIndex === null ? {} : { kv_blocks: kvIndex.size(w.url) }),
      reported: w.reported === null ? null : { running: w.reported.running, waiting: w.reported.waiting, kv_cache_usage_perc: w.reported.kvCacheUsage },
    })),
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
  app.post("/add_worker", async (request) => {
    const url = urlParam(request);
    const added = pool.add(url);
    if (added) await pool.checkWorker(url);
    log("info", `worker ${url} ${added ? "added" : "was already in the fleet"}`);
    return { url, added, healthy: pool.get(url)!.healthy };
  });
  app.post("/remove_worker", async (request) => {
    const url = urlParam(request);
    if (!pool.remove(url)) throw new RouterError(404, `worker ${url} is not in the fleet`, null, "not_found_error", "url");
    policy.forgetWorker(url);
    kvIndex?.removeWorker(url);
    log("info", `worker ${url} removed`);
    return { url, removed: true };
  });

  let evictTimer: NodeJS.Timeout | null = null;
  return {
    app, pool, policy, metrics, config, kvIndex,
    async listen() {
      // subscribed in the background: routing falls back to load until events arrive
      if (kvIndex !== null) subscriber = new KvEventsSubscriber(config.kvEventsEndpoint!, config.kvEventsTopic, kvIndex, (level, line) => log(level, line));
      await pool.start();
      evictTimer = setInterval(() => policy.maintain(), config.evictionIntervalMs);
      evictTimer.unref();
      await app.listen({ host: config.host, port: config.port });
      const addr = app.server.address();
      const port = addr !== null && typeof addr === "object" ? addr.port : config.port;
      return `http://${config.host.includes(":") ? `[${config.host}]` : config.host}:${port}`;
    },
    async close() {
      pool.stop();
      await subscriber?.close();
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
