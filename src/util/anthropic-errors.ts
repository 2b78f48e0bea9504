// Anthropic's error object ({type: "error", error: {type, message}}), which the Messages API's routes answer with on
// the server (server/anthropic-protocol.ts) and on the router in front of it (router/errors.ts): here, below both.

/** Whether a path is one of the Messages API's (its errors, a 401 included, are Anthropic's objects). */
export const isMessagesPath = (path: string): boolean => path === "/v1/messages" || path.startsWith("/v1/messages/");

/** Anthropic's error type for an HTTP status (its documented types; 503, a full queue or no worker, is its overloaded_error). */
export function anthropicErrorType(status: number): string {
  switch (status) {
    case 400:
    case 405:
    case 415:
    case 422:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
    case 529:
      return "overloaded_error";
    case 504:
      return "timeout_error";
  }
  return status >= 500 ? "api_error" : "invalid_request_error";
}

export interface AnthropicErrorBody {
  type: "error";
  error: { type: string; message: string };
}

/** The error object of a status and message. */
export const anthropicErrorBody = (status: number, message: string): AnthropicErrorBody => ({ type: "error", error: { type: anthropicErrorType(status), message } });
