// Public surface of the HTTP server layer.
export {
  createServer, prepareServer, DEFAULT_BODY_LIMIT, type PreparedServer, type ServerAppOptions, type ServerEngineOptions, type ServerOptions,
} from "./server.js";
export { serveUntilSignal, type ServeUntilSignalOptions } from "./shutdown.js";
export { ApiError, toApiError } from "./errors.js";
export { ServerMetrics } from "./metrics.js";
