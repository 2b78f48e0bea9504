// `kiln serve`'s HTTP front-end flags, vLLM's FrontendArgs (vllm/entrypoints/openai/cli_args.py): where it listens,
// TLS, root path, API key, CORS, the served names and LoRA adapters, request id headers, logprobs' token form, server
// load tracking, and uvicorn's log flags mapped onto fastify's log. (The chat flags are serve-chat-args.ts'.)
import { readFileSync, realpathSync, statSync } from "node:fs";
import { createSecureContext } from "node:tls";
import { Option, type Command } from "commander";
import { int, jsonObjectFlag, optInt } from "./serve-flag-values.js";
import { CliUsageError } from "./usage-error.js";
import type { MediaAccess } from "../models/chat-images.js";
import type { TlsOptions } from "../server/server.js";

/** vLLM's --uvicorn-log-level values. */
export const UVICORN_LOG_LEVELS = ["critical", "error", "warning", "info", "debug", "trace"] as const;
export type UvicornLogLevel = (typeof UVICORN_LOG_LEVELS)[number];
export type LogLevel = "debug" | "info" | "warning" | "error" | "critical";

/** One --lora-modules entry: name=path, or JSON {"name", "path", "base_model_name"}. */
export interface LoraModuleArg {
  name: string;
  path: string;
  baseModelName: string | null;
}

export interface FrontendArgs {
  host: string; // "0.0.0.0" = all interfaces (vLLM's default of None)
  port: number;
  /** vLLM --uds: listen on this Unix domain socket instead of host and port; null = TCP. */
  uds: string | null;
  apiKey: string | null;
  servedModelName: string[] | null; // null = the model argument
  logLevel: LogLevel;
  logRequests: boolean;
  /** vLLM --enable-prompt-tokens-details: usage reports prompt_tokens_details.cached_tokens (prefix-cache hits). */
  enablePromptTokensDetails: boolean;
  /** vLLM --enable-prompt-embeds: /v1/completions takes prompt_embeds (base64 torch.save tensors). */
  enablePromptEmbeds: boolean;
  allowedOrigins: string[];
  maxWaitingRequests: number | null;
  /** vLLM --stream-interval: a streamed reply's tokens per chunk (the first and the last aside). */
  streamInterval: number;
  /** vLLM --lora-modules: adapters served under their names from the start. */
  loraModules: LoraModuleArg[];
  /** vLLM --return-tokens-as-token-ids: logprobs name tokens as "token_id:<id>" (a request's return_tokens_as_token_ids overrides). */
  returnTokensAsTokenIds: boolean;
  /** vLLM --enable-force-include-usage: every stream ends with a usage chunk. */
  enableForceIncludeUsage: boolean;
  /** vLLM --enable-request-id-headers: every response carries X-Request-Id. */
  enableRequestIdHeaders: boolean;
  /** The PEM key and certificate read from --ssl-keyfile / --ssl-certfile: HTTPS; null serves HTTP. */
  tls: TlsOptions | null;
  /** vLLM --root-path: the path prefix a proxy serves Kiln under ("/api"), or null. */
  rootPath: string | null;
  /** vLLM --uvicorn-log-level: the HTTP server log's level; null when not given (the log is on with it or --enable-log-requests). */
  httpLogLevel: UvicornLogLevel | null;
  /** vLLM --disable-uvicorn-access-log: the HTTP server log has no line per request. */
  disableAccessLog: boolean;
  /** vLLM --disable-access-log-for-endpoints: paths whose requests get no line in the HTTP log. */
  accessLogExcludedPaths: string[];
  /** vLLM --enable-server-load-tracking: GET /load counts the requests in flight on the engine's endpoints. */
  enableServerLoadTracking: boolean;
  /** vLLM --enable-tokenizer-info-endpoint: GET /tokenizer_info is served. */
  enableTokenizerInfoEndpoint: boolean;
  /** vLLM --log-error-stack: every error response's stack goes to stderr (default: VLLM_SERVER_DEV_MODE=1). */
  logErrorStack: boolean | null;
  /** vLLM --allowed-local-media-path (resolved) and --allowed-media-domains: where image URLs may point. */
  mediaAccess: MediaAccess;
  /** vLLM --allow-credentials, --allowed-methods, --allowed-headers (CORS, with allowedOrigins). */
  cors: { allowCredentials: boolean; allowedMethods: string[]; allowedHeaders: string[] };
  /** vLLM --max-log-len: characters of a logged prompt or output, and ids of a logged token list (null: all). */
  maxLogLen: number | null;
  /** vLLM --enable-log-outputs: with --enable-log-requests, each finished choice is logged too. */
  logOutputs: boolean;
  /** vLLM --enable-log-deltas (default true): streamed outputs are logged delta by delta too. */
  logDeltas: boolean;
}

/** Declares the front-end flags on `cmd` (serve only). */
export function addFrontendOptions(cmd: Command): Command {
  return cmd
    .option("--host <host>", "host name to listen on (default: all interfaces)")
    .option("--port <port>", "port to listen on", "8000")
    .option("--uds <path>", "listen on this Unix domain socket instead of --host and --port")
    .option("--api-key <key>", "require this key in 'Authorization: Bearer' (env KILN_API_KEY)")
    .option("--served-model-name <names...>", "model name(s) used in the API (default: the model argument)")
    .addOption(new Option("--log-level <level>", "log level").choices(["debug", "info", "warning", "error", "critical"]).default("info"))
    .option("--enable-log-requests", "log every request: the HTTP log, and a line per request reaching the engine (prompt, params, token ids)", false)
    .option("--max-log-len <n>", "characters of a logged prompt or output, and ids of a logged token list (default: all)")
    .option("--enable-log-outputs", "with --enable-log-requests, also log what each request generated", false)
    .option("--enable-log-deltas", "with --enable-log-outputs, a streamed reply is logged delta by delta, then whole (the default)")
    .option("--no-enable-log-deltas", "with --enable-log-outputs, a streamed reply is logged whole only")
    .option("--enable-prompt-tokens-details", "report usage.prompt_tokens_details.cached_tokens (prompt tokens read from the prefix cache)", false)
    .option("--enable-prompt-embeds", "take prompt_embeds in /v1/completions (base64-encoded torch.save tensors [seq, hidden]); only for trusted users, as vLLM warns", false)
    .option("--disable-log-requests", "do not log requests (the default; kept for vLLM compatibility)", false)
    .option("--allowed-origins <json>", "CORS allowed origins as a JSON list", '["*"]')
    .option("--disable-access-log-for-endpoints <paths>", "comma-separated paths whose requests get no line in the HTTP log (\"/health,/metrics\")")
    .option("--allowed-local-media-path <dir>", "image file: URLs may name files under this directory (trusted clients only: they read the server's files)")
    .option("--allowed-media-domains <hosts...>", "image http(s) URLs only from these hosts (default: any)")
    .option("--allow-credentials", "CORS: allow credentials (cookies, authorization) from the allowed origins", false)
    .option("--allowed-methods <json>", "CORS allowed methods as a JSON list", '["*"]')
    .option("--allowed-headers <json>", "CORS allowed request headers as a JSON list", '["*"]')
    .option("--max-waiting-requests <n>", "reject new requests with 503 once this many are waiting")
    .option("--stream-interval <n>", "tokens per chunk of a streamed reply (the first token and the end go at once); above 1 saves host work per token", "1")
    .option("--lora-modules <specs...>", 'LoRA adapters to serve, each name=path or JSON {"name": ..., "path": ..., "base_model_name": ...}')
    .option("--return-tokens-as-token-ids", 'logprobs name their tokens as "token_id:<id>" (chat and completions)', false)
    .option("--enable-request-id-headers", "every response carries X-Request-Id: the request's own, else a generated one", false)
    .option("--ssl-keyfile <file>", "PEM private key for HTTPS (default: read from --ssl-certfile)")
    .option("--ssl-certfile <file>", "PEM certificate (chain) for HTTPS: Kiln serves HTTPS with it")
    .option("--ssl-ca-certs <file>", "PEM certificates of the CAs whose client certificates are accepted (with --ssl-cert-reqs)")
    .option("--ssl-cert-reqs <n>", "client certificates, as Python's ssl: 0 none asked (default), 1 optional (verified when sent), 2 required")
    .option("--ssl-ciphers <list>", "HTTPS cipher suites of TLS 1.2 and below, OpenSSL's form: ECDHE-RSA-AES256-GCM-SHA384:ECDHE-RSA-CHACHA20-POLY1305")
    .option("--enable-ssl-refresh", "re-read --ssl-keyfile, --ssl-certfile and --ssl-ca-certs when they change (new connections get the new ones)", false)
    .option("--log-config-file <file>", "vLLM's logging config (JSON, Python's dictConfig): the vllm and uvicorn loggers' levels are used (env VLLM_LOGGING_CONFIG_PATH)")
    .option("--root-path <path>", "path prefix a proxy serves Kiln under: /prefix/v1/... is served as /v1/... (both answer)")
    .addOption(
      new Option("--uvicorn-log-level <level>", "level of the HTTP server's log (fastify's, as vLLM's uvicorn's; giving it turns the log on)")
        .choices([...UVICORN_LOG_LEVELS]),
    )
    .option("--disable-uvicorn-access-log", "no line per request in the HTTP server's log (--enable-log-requests or --uvicorn-log-level)", false)
    .option("--enable-force-include-usage", "streamed chat and completions end with a usage chunk even without stream_options.include_usage", false)
    .option("--enable-server-load-tracking", "GET /load reports the requests in flight on the generation, pooling, score and rerank endpoints", false)
    .option("--enable-tokenizer-info-endpoint", "serve GET /tokenizer_info (tokenizer_config.json's settings and the chat template)", false)
    .option("--log-error-stack", "write the stack of every error response to stderr (default: on with VLLM_SERVER_DEV_MODE=1)")
    .option("--no-log-error-stack", "no stacks of error responses, even in dev mode")
    .option("--disable-fastapi-docs", "accepted for vLLM compatibility: Kiln serves no /docs, /redoc or /openapi.json anyway", false);
}

/** Reads a PEM file named by `flag`, or says which file could not be read. */
function readPem(file: string, flag: string): string {
  try {
    return readFileSync(file, "utf8");
  } catch (e) {
    throw new CliUsageError(`${flag} ${JSON.stringify(file)} cannot be read: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
}

/**
 * --ssl-keyfile / --ssl-certfile, read and checked (the key must match the certificate) before the model loads. The
 * key defaults to the certificate file, as Python's load_cert_chain reads a PEM holding both.
 */
function parseTls(o: Record<string, unknown>): FrontendArgs["tls"] {
  const tls = parsePems(o.sslKeyfile, o.sslCertfile, o.sslCaCerts, o.sslCertReqs);
  if (tls === null) {
    if (o.sslCiphers !== undefined || o.enableSslRefresh === true) throw new CliUsageError("--ssl-ciphers and --enable-ssl-refresh need --ssl-certfile (they are HTTPS settings)");
    return null;
  }
  if (o.sslCiphers !== undefined) {
    const ciphers = String(o.sslCiphers);
    try {
      createSecureContext({ ciphers });
    } catch (e) {
      throw new CliUsageError(`--ssl-ciphers ${JSON.stringify(ciphers)}: no cipher suite OpenSSL knows: ${(e as Error).message}`);
    }
    tls.ciphers = ciphers;
  }
  if (o.enableSslRefresh === true)
    tls.refreshFrom = { keyfile: String(o.sslKeyfile ?? o.sslCertfile), certfile: String(o.sslCertfile), ...(o.sslCaCerts !== undefined ? { caCerts: String(o.sslCaCerts) } : {}) };
  return tls;
}

/** The PEM files of --ssl-keyfile, --ssl-certfile and --ssl-ca-certs, with --ssl-cert-reqs. */
function parsePems(keyfile: unknown, certfile: unknown, caCerts: unknown, certReqs: unknown): FrontendArgs["tls"] {
  const reqs = certReqs === undefined ? 0 : int(certReqs, "--ssl-cert-reqs", 0);
  if (reqs > 2) throw new CliUsageError(`--ssl-cert-reqs must be 0 (none), 1 (optional) or 2 (required), got ${reqs}`);
  if (certfile === undefined) {
    // uvicorn would quietly serve plain HTTP: say so instead
    if (keyfile !== undefined) throw new CliUsageError("--ssl-keyfile needs --ssl-certfile (HTTPS needs a certificate)");
    if (caCerts !== undefined || reqs > 0) throw new CliUsageError("--ssl-ca-certs and --ssl-cert-reqs need --ssl-certfile (client certificates are a part of HTTPS)");
    return null;
  }
  if (reqs > 0 && caCerts === undefined) throw new CliUsageError(`--ssl-cert-reqs ${reqs} needs --ssl-ca-certs (the CAs client certificates are verified against)`);
  const cert = readPem(String(certfile), "--ssl-certfile");
  const key = keyfile === undefined ? cert : readPem(String(keyfile), "--ssl-keyfile");
  try {
    createSecureContext({ key, cert });
  } catch (e) {
    const flags = keyfile === undefined ? "--ssl-certfile (no --ssl-keyfile: the key is read from it)" : "--ssl-keyfile / --ssl-certfile";
    throw new CliUsageError(`${flags}: not a usable PEM key and certificate: ${(e as Error).message}`);
  }
  if (caCerts === undefined) return { key, cert };
  const ca = readPem(String(caCerts), "--ssl-ca-certs");
  try {
    createSecureContext({ ca });
  } catch (e) {
    throw new CliUsageError(`--ssl-ca-certs: not usable PEM certificates: ${(e as Error).message}`);
  }
  return { key, cert, ca, clientCerts: reqs === 2 ? "required" : reqs === 1 ? "optional" : "none" };
}

/** Python logging's level names (and numbers), as Kiln's --log-level names them. */
const PY_LEVELS: Record<string, LogLevel> = { DEBUG: "debug", INFO: "info", WARNING: "warning", WARN: "warning", ERROR: "error", CRITICAL: "critical", FATAL: "critical" };
const PY_LEVEL_NUMBERS: [number, LogLevel][] = [[50, "critical"], [40, "error"], [30, "warning"], [20, "info"], [0, "debug"]];

/**
 * --log-config-file (else VLLM_LOGGING_CONFIG_PATH): vLLM's logging config, a JSON dictConfig. Its "vllm" logger's
 * level (else the root's) is the log level, and its "uvicorn" logger's (or "uvicorn.access"'s) the HTTP log's;
 * handlers and formatters are Python's and are not used (said).
 */
function parseLogConfig(file: unknown, warnings: string[]): { logLevel: LogLevel | null; httpLogLevel: UvicornLogLevel | null } {
  if (file === undefined || file === "") return { logLevel: null, httpLogLevel: null };
  const flag = "--log-config-file";
  let text: string;
  try {
    text = readFileSync(String(file), "utf8");
  } catch (e) {
    throw new CliUsageError(`${flag} ${JSON.stringify(file)} cannot be read: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
  const c = jsonObjectFlag(text, `${flag} ${String(file)}`, '{"version": 1, "loggers": {"vllm": {"level": "DEBUG"}}}');
  const level = (logger: unknown, where: string): LogLevel | null => {
    if (typeof logger !== "object" || logger === null) return null;
    const l = (logger as { level?: unknown }).level;
    if (l === undefined) return null;
    const named = typeof l === "string" ? PY_LEVELS[l.toUpperCase()] : typeof l === "number" ? PY_LEVEL_NUMBERS.find(([n]) => l >= n)?.[1] : undefined;
    if (named === undefined) throw new CliUsageError(`${flag}: ${where}'s level must be a Python logging level (DEBUG, INFO, WARNING, ERROR, CRITICAL), got ${JSON.stringify(l)}`);
    return named;
  };
  const loggers = (typeof c.loggers === "object" && c.loggers !== null ? c.loggers : {}) as Record<string, unknown>;
  const http = level(loggers.uvicorn, "loggers.uvicorn") ?? level(loggers["uvicorn.access"], "loggers.uvicorn.access");
  if (c.handlers !== undefined || c.formatters !== undefined) warnings.push(`${flag}: only the loggers' levels are used (handlers and formatters are Python's)`);
  return { logLevel: level(loggers.vllm, "loggers.vllm") ?? level(c.root, "root"), httpLogLevel: http };
}

/** --root-path: "/" followed by path segments; trailing slashes dropped, "/" alone is no prefix. */
function parseRootPath(value: unknown): string | null {
  if (value === undefined || value === "") return null;
  const p = String(value);
  if (!/^\/[^\s?#]*$/.test(p)) throw new CliUsageError(`--root-path must be a URL path such as /api/llm, got ${JSON.stringify(p)}`);
  const trimmed = p.replace(/\/+$/, "");
  return trimmed === "" ? null : trimmed;
}

/** --uds: a socket path (a stale socket there is replaced when the server listens; any other file is refused then). */
function parseUds(value: unknown): string | null {
  if (value === undefined) return null;
  const p = String(value);
  if (p.trim() === "") throw new CliUsageError("--uds must be a socket path such as /tmp/kiln.sock");
  return p;
}

/** --disable-access-log-for-endpoints: comma-separated paths, each starting with "/". */
function parseExcludedPaths(value: unknown): string[] {
  if (value === undefined) return [];
  const paths = String(value).split(",").map((p) => p.trim()).filter((p) => p !== "");
  const bad = paths.find((p) => !p.startsWith("/"));
  if (bad !== undefined) throw new CliUsageError(`--disable-access-log-for-endpoints takes paths such as "/health,/metrics", got ${JSON.stringify(bad)}`);
  return paths;
}

/** --allowed-local-media-path: an existing directory, links resolved (file URLs are checked against its real path). */
function parseLocalMediaPath(value: unknown): string | null {
  if (value === undefined) return null;
  let real: string;
  try {
    real = realpathSync(String(value));
  } catch {
    throw new CliUsageError(`--allowed-local-media-path ${String(value)} does not exist`);
  }
  if (!statSync(real).isDirectory()) throw new CliUsageError(`--allowed-local-media-path ${String(value)} is not a directory`);
  return real;
}

/** --allowed-origins, --allowed-methods, --allowed-headers: a JSON list of strings (default ["*"]: any). */
function parseJsonList(value: unknown, flag: string, example: string): string[] {
  if (value === undefined) return ["*"];
  let parsed: unknown;
  try {
    parsed = JSON.parse(String(value));
  } catch {
    parsed = undefined;
  }
  if (!Array.isArray(parsed) || !parsed.every((x) => typeof x === "string"))
    throw new CliUsageError(`${flag} must be a JSON list of strings such as '${example}', got ${String(value)}`);
  return parsed;
}

/** --lora-modules: name=path or a JSON object per entry (vLLM's LoRAParserAction); names must differ. */
function parseLoraModules(value: unknown): LoraModuleArg[] {
  if (value === undefined) return [];
  const specs = (Array.isArray(value) ? value : [value]) as unknown[];
  const out: LoraModuleArg[] = [];
  for (const spec of specs) {
    const s = String(spec).trim();
    let m: LoraModuleArg | null = null;
    if (s.startsWith("{")) {
      const c = jsonObjectFlag(s, "--lora-modules", '{"name": "sql", "path": "/adapters/sql"}');
      if (typeof c.name === "string" && c.name !== "" && typeof c.path === "string" && c.path !== "")
        m = { name: c.name, path: c.path, baseModelName: typeof c.base_model_name === "string" ? c.base_model_name : null };
    } else {
      const eq = s.indexOf("=");
      if (eq > 0 && eq < s.length - 1) m = { name: s.slice(0, eq), path: s.slice(eq + 1), baseModelName: null };
    }
    if (m === null) throw new CliUsageError(`--lora-modules entries are name=path or JSON with "name" and "path", got ${JSON.stringify(s)}`);
    if (out.some((x) => x.name === m.name)) throw new CliUsageError(`--lora-modules names ${JSON.stringify(m.name)} twice`);
    out.push(m);
  }
  return out;
}

/**
 * Validates commander's raw values of the front-end flags. `model` is the model as given (undefined: the built-in
 * one, served as "kiln-default"); `env` gives KILN_API_KEY.
 */
export function parseFrontendArgs(model: string | undefined, o: Record<string, unknown>, env: NodeJS.ProcessEnv, warnings: string[] = []): FrontendArgs {
  const logConfig = parseLogConfig(o.logConfigFile ?? env.VLLM_LOGGING_CONFIG_PATH, warnings);
  const level = o.uvicornLogLevel ?? logConfig.httpLogLevel ?? undefined;
  if (level !== undefined && !(UVICORN_LOG_LEVELS as readonly unknown[]).includes(level))
    throw new CliUsageError(`--uvicorn-log-level must be one of ${UVICORN_LOG_LEVELS.join(", ")}, got ${JSON.stringify(level)}`);
  const port = int(o.port ?? "8000", "--port", 0);
  if (port > 65535) throw new CliUsageError(`--port must be <= 65535, got ${port}`);
  return {
    host: (o.host as string | undefined) ?? "0.0.0.0",
    port,
    uds: parseUds(o.uds),
    apiKey: (o.apiKey as string | undefined) ?? env.KILN_API_KEY ?? null,
    // the built-in model is served as "kiln-default" (vLLM serves a model under the name it was given)
    servedModelName: (o.servedModelName as string[] | undefined) ?? (model === undefined ? ["kiln-default"] : null),
    // a log config's level stands over --log-level's default (vLLM's dictConfig replaces its default config)
    logLevel: logConfig.logLevel ?? (o.logLevel as LogLevel | undefined) ?? "info",
    logRequests: Boolean(o.enableLogRequests) && !o.disableLogRequests,
    enablePromptTokensDetails: Boolean(o.enablePromptTokensDetails),
    enablePromptEmbeds: Boolean(o.enablePromptEmbeds),
    allowedOrigins: parseJsonList(o.allowedOrigins, "--allowed-origins", '["http://localhost:3000"]'),
    mediaAccess: { localPath: parseLocalMediaPath(o.allowedLocalMediaPath), domains: (o.allowedMediaDomains as string[] | undefined) ?? null },
    cors: {
      allowCredentials: Boolean(o.allowCredentials),
      allowedMethods: parseJsonList(o.allowedMethods, "--allowed-methods", '["GET", "POST"]'),
      allowedHeaders: parseJsonList(o.allowedHeaders, "--allowed-headers", '["authorization", "content-type"]'),
    },
    maxWaitingRequests: optInt(o.maxWaitingRequests, "--max-waiting-requests", 1),
    streamInterval: optInt(o.streamInterval, "--stream-interval", 1) ?? 1,
    loraModules: parseLoraModules(o.loraModules),
    returnTokensAsTokenIds: Boolean(o.returnTokensAsTokenIds),
    enableForceIncludeUsage: Boolean(o.enableForceIncludeUsage),
    enableRequestIdHeaders: Boolean(o.enableRequestIdHeaders),
    tls: parseTls(o),
    rootPath: parseRootPath(o.rootPath),
    httpLogLevel: (level as UvicornLogLevel | undefined) ?? null,
    disableAccessLog: Boolean(o.disableUvicornAccessLog),
    accessLogExcludedPaths: parseExcludedPaths(o.disableAccessLogForEndpoints),
    enableServerLoadTracking: Boolean(o.enableServerLoadTracking),
    enableTokenizerInfoEndpoint: Boolean(o.enableTokenizerInfoEndpoint),
    logErrorStack: (o.logErrorStack as boolean | undefined) ?? null,
    maxLogLen: optInt(o.maxLogLen, "--max-log-len", 0),
    logOutputs: Boolean(o.enableLogOutputs),
    logDeltas: o.enableLogDeltas !== false,
  };
}

/** The fastify (pino) level of a uvicorn log level. */
export function pinoLevel(level: UvicornLogLevel): "fatal" | "error" | "warn" | "info" | "debug" | "trace" {
  return level === "critical" ? "fatal" : level === "warning" ? "warn" : level;
}
