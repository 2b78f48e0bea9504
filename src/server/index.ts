// Public surface of the HTTP server layer.
export { createServer, DEFAULT_BODY_LIMIT, type ServerOptions } from "./server.js";
export { serveUntilSignal, type ServeUntilSignalOptions } from "./shutdown.js";
export { ApiError, toApiError } from "./errors.js";
export { ServerMetrics } from "./metrics.js";
