// Sends one client request to a worker chosen by the policy and streams the worker's response back as it arrives
// (SSE chunk by chunk, nothing buffered). Until the first byte goes to the client a failure can still be retried:
// a worker that cannot be reached is marked down and the request goes to another, as does one answering 502/503/504
// (unavailable, draining); any other answer, 4xx errors included, passes through unchanged.
import * as http from "node:http";
import * as https from "node:https";
import { pipeline } from "node:stream";
import { noWorker, RouterError } from "./errors.js";
import type { RouterConfig } from "./router-config.js";
import type { RouterMetrics } from "./router-metrics.js";
import { leastLoaded, type BlockHashesOf, type RoutingPolicy } from "./routing-types.js";
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

/** Writes the router's own error as OpenAI's error object (only while nothing has been sent). */
export function sendError(raw: http.ServerResponse, err: RouterError): void {
  if (raw.headersSent || raw.destroyed) return;
  const body = JSON.stringify(err.toBody());
  raw.writeHead(err.status, { "content-type": "application/json; charset=utf-8", "content-length": Buffer.byteLength(body) });
  raw.end(body);
}

/**
 * Routes `req` and streams the chosen worker's answer into `raw`; resolves once the response has ended (or failed).
 * @example await proxyRequest(ctx, { route: "/v1/completions", method: "POST", url: "/v1/completions", headers, body, text }, reply.raw);
 */
export async function proxyRequest(ctx: ProxyContext, req: ProxyRequest, raw: http.ServerResponse): Promise<void> {
  const { pool, policy, metrics, config } = ctx;
  const clientGone = new AbortController();
  // registered before any await, so a close that comes early is not missed
  const closed = new Promise<void>((resolve) => raw.once("close", resolve));
  raw.once("close", () => {
    if (!raw.writableFinished) clientGone.abort(new Error("client disconnected"));
  });
  const deadline = AbortSignal.timeout(config.requestTimeoutMs);
  const signal = AbortSignal.any([clientGone.signal, deadline]);
  const tried = new Set<string>();
  let retries = 0;
  let staleSocketRetried = false;
  let lastFailure: string | null = null;
  const fail = (err: RouterError, errorType: string): void => {
    metrics.error(req.route, errorType);
    sendError(raw, err);
  };

  for (;;) {
    const healthy = pool.healthy().filter((w) => !tried.has(w.url));
    if (healthy.length === 0) {
      const detail = `${pool.all().length} worker(s) configured, ${pool.healthy().length} healthy${lastFailure === null ? "" : `; last failure: ${lastFailure}`}`;
      return fail(noWorker(detail), "no_healthy_worker");
    }
    const max = config.maxInflightPerWorker;
    const open = max > 0 ? healthy.filter((w) => w.inFlight < max) : healthy;
    if (open.length === 0)
      return fail(new RouterError(429, `Every healthy worker has ${max} requests in flight (--max-inflight-per-worker); try again later`, "too_many_requests"), "overloaded");
    const now = Date.now();
    const views = open.map((w) => pool.view(w, now));
    const decision = req.lookup === true ? { url: leastLoaded(views).url, reason: "lookup" as const, matchRate: 0 } : policy.select(views, req.text, req.hashesOf ?? null);
    metrics.decision(policy.name, decision);
    ctx.log("debug", `${req.route} -> ${decision.url} (${decision.reason}, match ${decision.matchRate.toFixed(2)})`);
    const worker = pool.get(decision.url)!;
    tried.add(worker.url);
    worker.inFlight++;
    let released = false;
    const release = (): void => {
      if (!released) worker.inFlight--;
      released = true;
    };
    const result = await attempt(ctx, worker.url, req, signal);

    if (result.kind === "aborted") {
      release();
      if (deadline.aborted && !clientGone.signal.aborted) return fail(new RouterError(504, `The worker did not answer within ${config.requestTimeoutMs / 1000} s`, "timeout"), "timeout");
      return; // the client left: nothing to answer
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
      ctx.log("warning", `worker ${worker.url} unreachable (${result.error})`);
      if (!pool.healthy().some((w) => !tried.has(w.url))) continue; // none left: 503 at the top of the loop
      if (retries >= config.maxRetries) return fail(new RouterError(502, `No worker could serve the request within --max-retries ${config.maxRetries} (last failure: ${lastFailure})`, "worker_unreachable"), "worker_unreachable");
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
    streamBack(worker, decision.reason, response, raw, release, metrics);
    return closed;
  }
}

/** Pipes the worker's response into the client's, head first, chunk by chunk; a failure on either side ends both. */
function streamBack(
  worker: WorkerState, reason: string, response: http.IncomingMessage, raw: http.ServerResponse, release: () => void, metrics: RouterMetrics,
): void {
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
  raw.writeHead(response.statusCode ?? 502, response.statusMessage, headers);
  raw.flushHeaders();
  pipeline(response, raw, (err) => {
    release();
    if (err === undefined || err === null) metrics.workerAnswered(worker.url);
    else if (!raw.destroyed) raw.destroy(); // the worker died mid-response: the client sees the stream cut
  });
}
