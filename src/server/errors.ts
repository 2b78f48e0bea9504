// OpenAI-style HTTP errors: every failure leaves the server as `{error: {message, type, param, code}}`.

export type ApiErrorType =
  | "invalid_request_error"
  | "authentication_error"
  | "not_found_error"
  | "service_unavailable_error"
  | "server_error";

/** An error that maps to one HTTP status and one OpenAI error object. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
    readonly type: ApiErrorType = defaultType(status),
    readonly code: string | null = null,
  ) {
    super(message);
    this.name = "ApiError";
  }

  toBody(): ErrorBody {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

export interface ErrorBody {
  error: { message: string; type: string; param: string | null; code: string | null };
}

function defaultType(status: number): ApiErrorType {
  if (status === 401) return "authentication_error";
  if (status === 404) return "not_found_error";
  if (status === 503) return "service_unavailable_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

export const badRequest = (message: string, param: string | null = null): ApiError => new ApiError(400, message, param);

/**
 * Turns anything thrown inside a handler into an ApiError without leaking stack traces.
 * Engine input errors (anything carrying a string `param`) become 400s, as vLLM's EngineInputError does.
 */
export function toApiError(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  const e = err as { name?: unknown; statusCode?: unknown; code?: unknown; message?: unknown; param?: unknown } | null;
  const message = typeof e?.message === "string" && e.message ? e.message : "Internal server error";
  if (typeof e?.param === "string") return new ApiError(400, message, e.param);
  // (NoTokenizerError: text asked of a model served with --skip-tokenizer-init)
  if (e?.name === "EngineInputError" || e?.name === "ValueError" || e?.name === "NoTokenizerError") return new ApiError(400, message, null);
  // (by name: it crosses from the engine worker as a plain Error carrying it)
  if (e?.name === "EngineSleepingError") return new ApiError(503, message.replace(/^\[engine\] /, ""), null, "service_unavailable_error", "engine_sleeping");
  const status = typeof e?.statusCode === "number" ? e.statusCode : 500;
  switch (e?.code) {
    case "FST_ERR_CTP_BODY_TOO_LARGE":
      return new ApiError(413, "Request body is too large", null, "invalid_request_error", "request_too_large");
    case "FST_ERR_CTP_INVALID_JSON_BODY":
    case "FST_ERR_CTP_EMPTY_JSON_BODY":
      return new ApiError(400, `Malformed JSON body: ${message}`, null, "invalid_request_error", "invalid_json");
    case "FST_ERR_CTP_INVALID_MEDIA_TYPE":
      return new ApiError(415, message, null, "invalid_request_error", "unsupported_media_type");
  }
  if (status >= 400 && status < 500) return new ApiError(status, message);
  return new ApiError(500, `Internal server error: ${message}`, null, "server_error");
}
