// The router's HTTP errors as OpenAI's error object {error: {message, type, param, code}} (the server's shape; the
// router may not import src/server, so it keeps its own small copy of the type), or on the Messages API's paths as
// Anthropic's {type: "error", error: {type, message}}, as the server answers there.
import { anthropicErrorBody, isMessagesPath, type AnthropicErrorBody } from "../util/anthropic-errors.js";

export type RouterErrorType = "invalid_request_error" | "not_found_error" | "rate_limit_error" | "service_unavailable_error" | "server_error";

export interface RouterErrorBody {
  error: { message: string; type: string; param: string | null; code: string | null };
}

/** A failure of the router itself (not a worker's own error response, which passes through unchanged). */
export class RouterError extends Error {
  override name = "RouterError";
  constructor(
    readonly status: number,
    message: string,
    readonly code: string | null = null,
    readonly type: RouterErrorType = defaultType(status),
    readonly param: string | null = null,
  ) {
    super(message);
  }

  toBody(): RouterErrorBody {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

function defaultType(status: number): RouterErrorType {
  if (status === 404) return "not_found_error";
  if (status === 429) return "rate_limit_error";
  if (status === 503) return "service_unavailable_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

/** The router's error as the API of `path` words it: Anthropic's object on /v1/messages*, else OpenAI's. */
export function errorBodyFor(err: RouterError, path: string): RouterErrorBody | AnthropicErrorBody {
  return isMessagesPath(path.split("?")[0]!) ? anthropicErrorBody(err.status, err.message) : err.toBody();
}

/** No healthy worker could take the request (503). */
export const noWorker = (detail: string): RouterError =>
  new RouterError(503, `No healthy worker is available: ${detail}`, "no_healthy_worker");

/** Anything thrown in a handler, as a RouterError (fastify's own body errors keep their 4xx status). */
export function toRouterError(err: unknown): RouterError {
  if (err instanceof RouterError) return err;
  const e = err as { statusCode?: unknown; code?: unknown; message?: unknown } | null;
  const message = typeof e?.message === "string" && e.message ? e.message : "Internal router error";
  if (e?.code === "FST_ERR_CTP_BODY_TOO_LARGE") return new RouterError(413, "Request body is too large", "request_too_large");
  const status = typeof e?.statusCode === "number" ? e.statusCode : 500;
  if (status >= 400 && status < 500) return new RouterError(status, message);
  return new RouterError(500, `Internal router error: ${message}`);
}
