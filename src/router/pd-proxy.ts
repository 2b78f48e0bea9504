// Prefill/decode disaggregation of one completion, in vLLM's NixlConnector protocol as vLLM's toy P/D proxy and
// vllm-router's PD mode run it. Phase 1: a prefill worker gets the client's body rewritten to compute the prompt only
// (max_tokens 1, no stream) with kv_transfer_params {do_remote_decode: true}, and answers with kv_transfer_params
// saying where the prompt's KV blocks wait. Phase 2: a decode worker gets the client's original body plus those
// kv_transfer_params, pulls the blocks itself and generates; its answer (streamed or not) is the client's. Each phase
// chooses its worker with its own pool's policy and retries (proxy.ts dispatch()) before anything reaches the client.
import { randomUUID } from "node:crypto";
import type * as http from "node:http";
import { RouterError } from "./errors.js";
import { dispatch, openExchange, sendError, streamBack, type Dispatched, type ProxyContext, type ProxyRequest } from "./proxy.js";

/** The kv_transfer_params a prefill request carries: keep the prompt's KV blocks for a remote decode to pull. */
export const PREFILL_KV_TRANSFER_PARAMS = {
  do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null,
} as const;

/** A JSON object body (what P/D can rewrite; anything else is proxied to a decode worker unchanged). */
export type JsonObject = Record<string, unknown>;

export const isJsonObject = (v: unknown): v is JsonObject => typeof v === "object" && v !== null && !Array.isArray(v);

/**
 * The prefill worker's body: the client's with stream false, max_tokens 1 (and max_completion_tokens 1 when given),
 * no stream_options, n (and best_of, which must equal it) 1 when given, no min_tokens (over max_tokens 1 it is a 400;
 * the decode worker still gets it), and PREFILL_KV_TRANSFER_PARAMS.
 * @example prefillBody({ prompt: "hi", max_tokens: 64, stream: true }) // {prompt: "hi", max_tokens: 1, stream: false, kv_transfer_params: {...}}
 */
export function prefillBody(body: JsonObject): JsonObject {
  const out: JsonObject = { ...body, stream: false, max_tokens: 1 };
  if (Object.hasOwn(body, "max_completion_tokens")) out.max_completion_tokens = 1;
  if (Object.hasOwn(body, "n")) out.n = 1;
  if (Object.hasOwn(body, "best_of")) out.best_of = 1;
  delete out.stream_options;
  delete out.min_tokens;
  out.kv_transfer_params = { ...PREFILL_KV_TRANSFER_PARAMS };
  return out;
}

/**
 * The decode worker's body: the client's original with kv_transfer_params set to the prefill's (`kv`), or without
 * any when the prefill gave none (the decode worker then computes the prompt itself). A body without its own
 * kv_transfer_params keeps the client's bytes (integers past 2^53 stay exact), the parameters appended as its last key.
 */
export function decodeBody(original: Buffer, body: JsonObject, kv: JsonObject | null): Buffer {
  if (!Object.hasOwn(body, "kv_transfer_params")) {
    if (kv === null) return original;
    const inner = original.toString("utf8").trimEnd().slice(0, -1).trimEnd(); // the object without its closing brace
    return Buffer.from(`${inner}${inner.endsWith("{") ? "" : ","}"kv_transfer_params":${JSON.stringify(kv)}}`, "utf8");
  }
  const { kv_transfer_params: _clients, ...rest } = body; // the router owns the field in P/D mode
  return Buffer.from(JSON.stringify(kv === null ? rest : { ...rest, kv_transfer_params: kv }), "utf8");
}

/** The kv_transfer_params object of a prefill worker's JSON answer, or null (absent, null, not an object, not JSON). */
export function kvTransferParamsOf(answer: string): JsonObject | null {
  try {
    const parsed = JSON.parse(answer) as unknown;
    return isJsonObject(parsed) && isJsonObject(parsed.kv_transfer_params) ? parsed.kv_transfer_params : null;
  } catch {
    return null;
  }
}

/** A response's whole body as text, at most `limit` bytes; null when it broke, was cut, or grew past the limit. */
function readText(response: http.IncomingMessage, limit: number): Promise<string | null> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    response.on("data", (c: Buffer) => {
      size += c.length;
      if (size > limit) {
        response.destroy();
        resolve(null);
      } else chunks.push(c);
    });
    response.once("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    response.once("error", () => resolve(null));
    response.once("close", () => resolve(response.complete ? Buffer.concat(chunks).toString("utf8") : null));
  });
}

/** The prefill and decode workers' pools and policies (with the router's metrics, config and agents). */
export interface PdContexts {
  readonly prefill: ProxyContext;
  readonly decode: ProxyContext;
}

/**
 * Runs `req` (a completion whose parsed JSON body is `body`) through a prefill worker, then a decode worker whose
 * answer streams into `raw`; resolves once that response has ended. A prefill worker's own error answer (4xx, or a
 * 5xx no other worker could replace) is the client's answer, and no decode request is made.
 * @example await proxyDisaggregated({ prefill, decode }, { route: "/v1/completions", ...rest }, { prompt: "hi" }, reply.raw);
 */
export async function proxyDisaggregated(pd: PdContexts, req: ProxyRequest & { body: Buffer }, body: JsonObject, raw: http.ServerResponse): Promise<void> {
  const { metrics, config } = pd.decode;
  const ex = openExchange(raw, config);
  const fail = (phase: "prefill" | "decode", d: Extract<Dispatched, { kind: "failed" }>): void => {
    metrics.error(req.route, d.errorType);
    metrics.pdError(phase, d.errorType);
    sendError(raw, d.error, req.url);
  };
  metrics.pdRequest(req.route);
  const started = performance.now();
  // one request id for both phases: the two workers' logs (and their x-request-id answers) name the same request
  const clientId = req.headers["x-request-id"];
  const headers = { ...req.headers, "x-request-id": (Array.isArray(clientId) ? clientId[0] : clientId) || randomUUID() };

  const prefillHeaders = { ...headers, "accept-encoding": "identity" }; // the router reads this answer: no gzip
  const prefill = await dispatch(pd.prefill, { ...req, headers: prefillHeaders, body: Buffer.from(JSON.stringify(prefillBody(body)), "utf8") }, ex);
  if (prefill.kind === "aborted") return;
  if (prefill.kind === "failed") return fail("prefill", prefill);
  metrics.pdPhase("prefill", prefill.worker.url);
  const status = prefill.response.statusCode ?? 502;
  if (status < 200 || status >= 300) {
    // the prefill worker's own answer (a bad parameter, say) is the client's: the decode worker would say the same
    metrics.pdPrefillError(prefill.worker.url);
    streamBack(prefill, raw, metrics, { "x-kiln-pd-phase": "prefill" });
    return ex.closed;
  }
  const answer = await readText(prefill.response, config.maxPayloadSize);
  prefill.release();
  if (ex.clientGone.aborted) return;
  if (ex.signal.aborted)
    return fail("prefill", { kind: "failed", error: new RouterError(504, `The prefill worker did not answer within ${config.requestTimeoutMs / 1000} s`, "timeout"), errorType: "timeout" });
  metrics.pdPrefillDone((performance.now() - started) / 1000);
  const kv = answer === null ? null : kvTransferParamsOf(answer);
  if (kv === null) {
    // the decode worker can still serve the request whole, computing the prompt itself
    if (answer === null) metrics.pdPrefillError(prefill.worker.url);
    metrics.pdWithoutKv();
    pd.decode.log(answer === null ? "warning" : "debug", `${req.route}: prefill worker ${prefill.worker.url} ${answer === null ? "broke off its answer" : "answered without kv_transfer_params"}; the decode worker computes the prompt`);
  }

  const decode = await dispatch(pd.decode, { ...req, headers, body: decodeBody(req.body, body, kv) }, ex);
  if (decode.kind === "aborted") return;
  if (decode.kind === "failed") return fail("decode", decode);
  metrics.pdPhase("decode", decode.worker.url);
  const decodeStatus = decode.response.statusCode ?? 502;
  if (decodeStatus < 200 || decodeStatus >= 300) metrics.pdDecodeError(decode.worker.url);
  streamBack(decode, raw, metrics, { "x-kiln-prefill-worker": prefill.worker.url, "x-kiln-prefill-routing": prefill.reason });
  return ex.closed;
}
