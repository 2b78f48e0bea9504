// Sends one client request to a worker chosen by the policy and streams the worker's response back as it arrives
// (SSE chunk by chunk, nothing buffered). Until the first byte goes to the client a failure can still be retried:
// a worker that cannot be reached is marked down and the request goes to another, as does one answering 502/503/504
// (unavailable, draining); any other answer, 4xx errors included, passes through unchanged. dispatch() (choose, send,
// retry) and streamBack() are apart so that P/D disaggregation (pd-proxy.ts) runs one per phase.
import * as http from "node:http";
import * as https from "node:https";
import { pipeline } from "node:stream";
import { errorBodyFor, noWorker, RouterError } from "./errors.js";
import type { RouterConfig } from "./router-config.js";
import type { RouterMetrics } from "./router-metrics.js";
import { leastLoaded, type BlockHashesOf, type RoutingPolicy, type RoutingReason } from "./routing-types.js";
import type { WorkerPool, WorkerState } from "./worker-pool.js";

/** What a proxied request needs from the router. */
export interface ProxyContext {
  readonly pool: WorkerPool;
  readonly policy: RoutingPolicy;
  readonly metrics: RouterMetrics;
  readonly config: RouterConfig;
  readonly agents: { http: http.Agent; https: https.Agent };
  log(level: "debug" | "info" | "warning", line: string): void;
}

export interface ProxyRequest {
  /** The route's pattern, for metrics ("/v1/chat/completions"). */
  route: string;
  method: string;
  /** Path and query as the client sent them. */
  url: string;
  headers: http.IncomingHttpHeaders;
  body: Buffer | null;
  /** The routing text (request-text.ts); "" routes by load alone. */
  text: string;
  /** The prompt's chain block hashes per block size (with --tokenizer and KV events), else null. */
  hashesOf?: BlockHashesOf | null;
  /** A 404 tries the next worker (GET of a stored response, which lives on one worker); not counted as a retry. */
  tryNextOn404?: boolean;
  /**
   * A lookup of something one worker holds (a stored response by id): workers are asked least loaded first, without
   * the policy (its prefix tree is not touched, and no cache hit or miss is counted).
   */
  lookup?: boolean;
}

// Hop-by-hop headers (RFC 9110 7.6.1) and those the router sets itself.
const HOP_BY_HOP = new Set(["connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade"]);
const RETRYABLE = new Set([502, 503, 504]);

function forwardHeaders(headers: http.IncomingHttpHeaders, omit: Set<string>): http.OutgoingHttpHeaders {
  const out: http.OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(headers)) if (v !== undefined && !HOP_BY_HOP.has(k) && !omit.has(k)) out[k] = v;
  return out;
}

type Attempt =
  | { kind: "response"; response: http.IncomingMessage }
  | { kind: "unreachable"; error: string; reusedSocket: boolean }
  | { kind: "aborted" };

/** One HTTP exchange with a worker, resolved at its response's head (or at the failure that prevents one). */
function attempt(ctx: ProxyContext, worker: string, req: ProxyRequest, signal: AbortSignal): Promise<Attempt> {
  return new Promise((resolve) => {
    const target = new URL(`${worker}${req.url}`); // worker has no trailing slash, url starts with one
    const isHttps = target.protocol === "https:";
    const headers = forwardHeaders(req.headers, new Set(["host", "content-length"]));
    if (req.body !== null) headers["content-length"] = req.body.length;
    const outgoing = (isHttps ? https : http).request(target, { method: req.method, headers, agent: isHttps ? ctx.agents.https : ctx.agents.http, signal });
    outgoing.once("response", (response) => resolve({ kind: "response", response }));
    // `on`, not `once`: a second error (after the response began, say) must not go unhandled; only the first counts
    outgoing.on("error", (err: NodeJS.ErrnoException) => {
      if (signal.aborted) resolve({ kind: "aborted" });
      else resolve({ kind: "unreachable", error: err.code ?? err.message, reusedSocket: outgoing.reusedSocket });
    });
    outgoing.end(req.body ?? undefined);
  });
}

/** Writes the router's own error as OpenAI's (or on /v1/messages Anthropic's) error object, while nothing has been sent. */
export function sendError(raw: http.ServerResponse, err: RouterError, path: string): void {
  if (raw.headersSent || raw.destroyed) return;
  const body = JSON.stringify(errorBodyFor(err, path));
  raw.writeHead(err.status, { "content-type": "application/json; charset=utf-8", "content-length": Buffer.byteLength(body) });
  raw.end(body);
}

/** One client request's lifetime: `signal` aborts when the client leaves or the request timeout passes. */
export interface Exchange {
  readonly signal: AbortSignal;
  readonly clientGone: AbortSignal;
  /** Resolves when the client's response has closed (ended, or cut). */
  readonly closed: Promise<void>;
}

/** Opens the exchange for `raw`; call it before any await, so that a close that comes early is not missed. */
export function openExchange(raw: http.ServerResponse, config: RouterConfig): Exchange {
  const clientGone = new AbortController();
  const closed = new Promise<void>((resolve) => raw.once("close", resolve));
  raw.once("close", () => {
    if (!raw.writableFinished) clientGone.abort(new Error("client disconnected"));
  });
  const signal = AbortSignal.any([clientGone.signal, AbortSignal.timeout(config.requestTimeoutMs)]);
  return { signal, clientGone: clientGone.signal, closed };
}

/** What dispatch() ends with: a worker's answer that is not retried, the router's own error, or a client gone. */
export type Dispatched =
  | { kind: "response"; worker: WorkerState; reason: RoutingReason; response: http.IncomingMessage; release: () => void }
  | { kind: "failed"; error: RouterError; errorType: string }
  | { kind: "aborted" };

/**
 * Chooses a worker of `ctx.pool` with `ctx.policy` and sends it `req`; a worker that cannot be reached is marked down
 * and another tried, as is one answering 502/503/504 while others are left (both within --max-retries). The answer
 * returned holds its worker's in-flight slot until `release()`.
 */
export async function dispatch(ctx: ProxyContext, req: ProxyRequest, ex: Exchange): Promise<Dispatched> {
  const { pool, policy, metrics, config } = ctx;
  const tried = new Set<string>();
  let retries = 0;
  let staleSocketRetried = false;
  let lastFailure: string | null = null;
  const failed = (error: RouterError, errorType: string): Dispatched => ({ kind: "failed", error, errorType });
  const role = pool.role === "regular" ? "" : `${pool.role} `;

  for (;;) {
    const healthy = pool.healthy().filter((w) => !tried.has(w.url));
    if (healthy.length === 0) {
      const detail = `${pool.all().length} ${role}worker(s) configured, ${pool.healthy().length} healthy${lastFailure === null ? "" : `; last failure: ${lastFailure}`}`;
      return failed(noWorker(detail), "no_healthy_worker");
    }
    const max = config.maxInflightPerWorker;
    const open = max > 0 ? healthy.filter((w) => w.inFlight < max) : healthy;
    if (open.length === 0)
      return failed(new RouterError(429, `Every healthy ${role}worker has ${max} requests in flight (--max-inflight-per-worker); try again later`, "too_many_requests"), "overloaded");
    const now = Date.now();
    const views = open.map((w) => pool.view(w, now));
    const decision = req.lookup === true ? { url: leastLoaded(views).url, reason: "lookup" as const, matchRate: 0 } : policy.select(views, req.text, req.hashesOf ?? null);
    metrics.decision(policy.name, decision);
    ctx.log("debug", `${req.route} -> ${role}${decision.url} (${decision.reason}, match ${decision.matchRate.toFixed(2)})`);
    const worker = pool.get(decision.url)!;
    tried.add(worker.url);
    worker.inFlight++;
    let released = false;
    const release = (): void => {
      if (!released) worker.inFlight--;
      released = true;
    };
    const result = await attempt(ctx, worker.url, req, ex.signal);

    if (result.kind === "aborted") {
      release();
      if (ex.clientGone.aborted) return { kind: "aborted" }; // the client left: nothing to answer
      return failed(new RouterError(504, `The ${role}worker did not answer within ${config.requestTimeoutMs / 1000} s`, "timeout"), "timeout");
    }
    if (result.kind === "unreachable") {
      release();
      lastFailure = `${worker.url}: ${result.error}`;
      if (result.reusedSocket && !staleSocketRetried) {
        // a kept-alive socket the worker had closed: the worker itself may be fine, so try it once more on a
        // fresh connection (not counted as a retry: nothing reached a worker)
        staleSocketRetried = true;
        tried.delete(worker.url);
        continue;
      }
      pool.markDown(worker.url, `request failed: ${result.error}`);
      ctx.log("warning", `${role}worker ${worker.url} unreachable (${result.error})`);
      if (!pool.healthy().some((w) => !tried.has(w.url))) continue; // none left: 503 at the top of the loop
      if (retries >= config.maxRetries) return failed(new RouterError(502, `No ${role}worker could serve the request within --max-retries ${config.maxRetries} (last failure: ${lastFailure})`, "worker_unreachable"), "worker_unreachable");
      retries++;
      metrics.retry();
      continue;
    }

    const { response } = result;
    const status = response.statusCode ?? 502;
    const more = pool.healthy().some((w) => !tried.has(w.url));
    const next404 = req.tryNextOn404 === true && status === 404 && more;
    if (next404 || (RETRYABLE.has(status) && more && retries < config.maxRetries)) {
      response.resume(); // drop its body
      await new Promise<void>((resolve) => response.once("end", resolve).once("error", () => resolve()).once("close", resolve));
      release();
      lastFailure = `${worker.url}: HTTP ${status}`;
      if (!next404) {
        retries++;
        metrics.retry();
      }
      continue;
    }
    return { kind: "response", worker, reason: decision.reason, response, release };
  }
}

/**
 * Routes `req` and streams the chosen worker's answer into `raw`; resolves once the response has ended (or failed).
 * @example await proxyRequest(ctx, { route: "/v1/completions", method: "POST", url: "/v1/completions", headers, body, text }, reply.raw);
 */
export async function proxyRequest(ctx: ProxyContext, req: ProxyRequest, raw: http.ServerResponse): Promise<void> {
  const ex = openExchange(raw, ctx.config);
  const d = await dispatch(ctx, req, ex);
  if (d.kind === "aborted") return;
  if (d.kind === "failed") {
    ctx.metrics.error(req.route, d.errorType);
    return sendError(raw, d.error, req.url);
  }
  streamBack(d, raw, ctx.metrics);
  return ex.closed;
}

/**
 * Pipes the worker's response into the client's, head first, chunk by chunk; a failure on either side ends both.
 * `extraHeaders` go out with the worker's own (the router's x-kiln-* ones).
 */
export function streamBack(
  answer: Extract<Dispatched, { kind: "response" }>, raw: http.ServerResponse, metrics: RouterMetrics, extraHeaders: Record<string, string> = {},
): void {
  const { worker, reason, response, release } = answer;
  if (raw.destroyed) {
    // the client left as the answer arrived
    response.destroy();
    release();
    return;
  }
  const headers = forwardHeaders(response.headers, new Set());
  for (const k of Object.keys(headers)) if (k.startsWith("access-control-")) delete headers[k]; // the router's CORS holds
  headers["x-kiln-worker"] = worker.url;
  headers["x-kiln-routing"] = reason;
  Object.assign(headers, extraHeaders);
  raw.writeHead(response.statusCode ?? 502, response.statusMessage, headers);
  raw.flushHeaders();
  // which side failed first: a client that left has destroyed raw before its failure reaches the worker's answer
  let workerFailed = false;
  response.once("error", () => (workerFailed = !raw.destroyed));
  pipeline(response, raw, (err) => {
    release();
    if (err === undefined || err === null) return metrics.workerAnswered(worker.url);
    if (!raw.destroyed) raw.destroy(); // the worker died mid-response: the client sees the stream cut
    if (workerFailed) metrics.workerBrokeOff(worker.url);
  });
}
