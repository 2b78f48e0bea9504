// `kiln serve`'s HTTP front-end flags, vLLM's FrontendArgs (vllm/entrypoints/openai/cli_args.py): TLS, root path,
// request id headers, the reply role, logprobs' token form, server load tracking, and uvicorn's log flags mapped onto
// fastify's log.
import { readFileSync } from "node:fs";
import { createSecureContext } from "node:tls";
import { Option, type Command } from "commander";
import { CliUsageError } from "./usage-error.js";

/** vLLM's --uvicorn-log-level values. */
export const UVICORN_LOG_LEVELS = ["critical", "error", "warning", "info", "debug", "trace"] as const;
export type UvicornLogLevel = (typeof UVICORN_LOG_LEVELS)[number];

export interface FrontendArgs {
  /** vLLM --response-role: the chat reply's role when the request's add_generation_prompt is true. */
  responseRole: string;
  /** vLLM --return-tokens-as-token-ids: logprobs name tokens as "token_id:<id>" (a request's return_tokens_as_token_ids overrides). */
  returnTokensAsTokenIds: boolean;
  /** vLLM --enable-request-id-headers: every response carries X-Request-Id. */
  enableRequestIdHeaders: boolean;
  /** The PEM key and certificate read from --ssl-keyfile / --ssl-certfile: HTTPS; null serves HTTP. */
  tls: { key: string; cert: string } | null;
  /** vLLM --root-path: the path prefix a proxy serves Kiln under ("/api"), or null. */
  rootPath: string | null;
  /** vLLM --uvicorn-log-level: the HTTP server log's level; null when not given (the log is on with it or --enable-log-requests). */
  httpLogLevel: UvicornLogLevel | null;
  /** vLLM --disable-uvicorn-access-log: the HTTP server log has no line per request. */
  disableAccessLog: boolean;
  /** vLLM --enable-server-load-tracking: GET /load counts the requests in flight on the engine's endpoints. */
  enableServerLoadTracking: boolean;
}

/** Declares the front-end flags on `cmd` (serve only). */
export function addFrontendOptions(cmd: Command): Command {
  return cmd
    .option("--response-role <role>", "the chat reply's role when the request's add_generation_prompt is true", "assistant")
    .option("--return-tokens-as-token-ids", 'logprobs name their tokens as "token_id:<id>" (chat and completions)', false)
    .option("--enable-request-id-headers", "every response carries X-Request-Id: the request's own, else a generated one", false)
    .option("--ssl-keyfile <file>", "PEM private key for HTTPS (default: read from --ssl-certfile)")
    .option("--ssl-certfile <file>", "PEM certificate (chain) for HTTPS: Kiln serves HTTPS with it")
    .option("--root-path <path>", "path prefix a proxy serves Kiln under: /prefix/v1/... is served as /v1/... (both answer)")
    .addOption(
      new Option("--uvicorn-log-level <level>", "level of the HTTP server's log (fastify's, as vLLM's uvicorn's; giving it turns the log on)")
        .choices([...UVICORN_LOG_LEVELS]),
    )
    .option("--disable-uvicorn-access-log", "no line per request in the HTTP server's log (--enable-log-requests or --uvicorn-log-level)", false)
    .option("--enable-server-load-tracking", "GET /load reports the requests in flight on the generation, pooling, score and rerank endpoints", false)
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
function parseTls(keyfile: unknown, certfile: unknown): FrontendArgs["tls"] {
  if (certfile === undefined) {
    // uvicorn would quietly serve plain HTTP: say so instead
    if (keyfile !== undefined) throw new CliUsageError("--ssl-keyfile needs --ssl-certfile (HTTPS needs a certificate)");
    return null;
  }
  const cert = readPem(String(certfile), "--ssl-certfile");
  const key = keyfile === undefined ? cert : readPem(String(keyfile), "--ssl-keyfile");
  try {
    createSecureContext({ key, cert });
  } catch (e) {
    const flags = keyfile === undefined ? "--ssl-certfile (no --ssl-keyfile: the key is read from it)" : "--ssl-keyfile / --ssl-certfile";
    throw new CliUsageError(`${flags}: not a usable PEM key and certificate: ${(e as Error).message}`);
  }
  return { key, cert };
}

/** --root-path: "/" followed by path segments; trailing slashes dropped, "/" alone is no prefix. */
function parseRootPath(value: unknown): string | null {
  if (value === undefined || value === "") return null;
  const p = String(value);
  if (!/^\/[^\s?#]*$/.test(p)) throw new CliUsageError(`--root-path must be a URL path such as /api/llm, got ${JSON.stringify(p)}`);
  const trimmed = p.replace(/\/+$/, "");
  return trimmed === "" ? null : trimmed;
}

/** Validates commander's raw values of the front-end flags. */
export function parseFrontendArgs(o: Record<string, unknown>): FrontendArgs {
  const role = o.responseRole ?? "assistant";
  if (typeof role !== "string" || role.trim() === "") throw new CliUsageError(`--response-role must be a non-empty role name, got ${JSON.stringify(role)}`);
  const level = o.uvicornLogLevel;
  if (level !== undefined && !(UVICORN_LOG_LEVELS as readonly unknown[]).includes(level))
    throw new CliUsageError(`--uvicorn-log-level must be one of ${UVICORN_LOG_LEVELS.join(", ")}, got ${JSON.stringify(level)}`);
  return {
    responseRole: role,
    returnTokensAsTokenIds: Boolean(o.returnTokensAsTokenIds),
    enableRequestIdHeaders: Boolean(o.enableRequestIdHeaders),
    tls: parseTls(o.sslKeyfile, o.sslCertfile),
    rootPath: parseRootPath(o.rootPath),
    httpLogLevel: (level as UvicornLogLevel | undefined) ?? null,
    disableAccessLog: Boolean(o.disableUvicornAccessLog),
    enableServerLoadTracking: Boolean(o.enableServerLoadTracking),
  };
}

/** The fastify (pino) level of a uvicorn log level. */
export function pinoLevel(level: UvicornLogLevel): "fatal" | "error" | "warn" | "info" | "debug" | "trace" {
  return level === "critical" ? "fatal" : level === "warning" ? "warn" : level;
}
