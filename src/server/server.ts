// createServer(): the OpenAI-compatible HTTP front end over an EngineClient + TokenizerLike.
import { toolCallParser } from "./tool-parsers.js";
import { harmonyTokens } from "./harmony-parse.js";
import type { HarmonyServing } from "./serving-chat-harmony.js";
import { randomBytes, timingSafeEqual } from "node:crypto";
import type { IncomingMessage } from "node:http";
import type { Server as TlsServer, TLSSocket } from "node:tls";
import Fastify, { errorCodes, LogController, type FastifyInstance, type FastifyReply, type FastifyRequest } from "fastify";
import type { EngineClient, SamplingParams } from "../engine/types.js";
import { MAX_LOGPROBS } from "./protocol.js";
import type { TokenizerLike } from "../models/tokenizer-types.js";
import type { Gemma3ImageInputSpec } from "../models/gemma3-image-processor.js";
import { DEFAULT_IMAGE_LIMIT, DEFAULT_MEDIA_ACCESS, type MediaAccess } from "../models/chat-images.js";
import { ApiError, toApiError } from "./errors.js";
import { ServerMetrics } from "./metrics.js";
import { handleChat } from "./serving-chat.js";
import { handleCompletion } from "./serving-completions.js";
import { registerResponsesRoutes } from "./serving-responses.js";
import { registerMessagesRoutes } from "./serving-messages.js";
import { anthropicError, isMessagesPath } from "./anthropic-protocol.js";
import { handleEmbeddings, refuseOnPoolingRunner } from "./serving-embeddings.js";
import { handleRerank, handleScore } from "./serving-score.js";
import { handleClassify } from "./serving-classify.js";
import { handlePooling } from "./serving-pooling.js";
import type { LoraModule, ServingContext } from "./serving-context.js";
import { loraModelCards, modelPermission, registerLoraRoutes } from "./lora-routes.js";
import { registerTokenizeRoutes, registerTokenizerInfoRoute } from "./tokenize.js";
import type { KvTransferService } from "./kv-transfer.js";
import { registerInvocationsRoute, type Endpoint, type InvocationEndpoint } from "./invocations.js";
import { registerDevRoutes } from "./dev-routes.js";
import { ServerLoad } from "./server-load.js";
import { RequestLog, type RequestLogOptions } from "./request-log.js";
import { watchTlsFiles, type TlsFiles } from "./tls-refresh.js";
import { routeMethods } from "../util/route-methods.js";

/** What the HTTP front end needs before the engine exists. */
export interface ServerAppOptions {
  apiKey?: string;
  /** CORS origins ("*" for any); no CORS headers when absent or empty. */
  allowedOrigins?: string[];
  /** CORS as vLLM's (Starlette's CORSMiddleware) --allow-credentials, --allowed-methods, --allowed-headers ("*": any). */
  cors?: { allowCredentials?: boolean; allowedMethods?: string[]; allowedHeaders?: string[] };
  logRequests?: boolean;
  version: string;
  /** Largest accepted request body in bytes (default 32 MiB); larger gets 413. */
  bodyLimit?: number;
  /** Serve /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING). */
  allowRuntimeLoraUpdating?: boolean;
  /** The log's level when logRequests is on (default info). */
  logLevel?: "fatal" | "error" | "warn" | "info" | "debug" | "trace";
  /** No line per request in the log (vLLM's --disable-uvicorn-access-log). */
  disableRequestLogging?: boolean;
  /** Paths whose requests get no line in the log (vLLM's --disable-access-log-for-endpoints: "/health", "/metrics"). */
  accessLogExcludedPaths?: readonly string[];
  /** Every response carries X-Request-Id: the request's own, else the generated id (vLLM's --enable-request-id-headers). */
  requestIdHeaders?: boolean;
  /** HTTPS with this PEM key and certificate (vLLM's --ssl-keyfile / --ssl-certfile); HTTP when absent. */
  https?: TlsOptions;
  /**
   * The prefix a proxy serves the API under ("/api"): a path under it is served as the path without it, and paths
   * without it still answer (vLLM's --root-path, FastAPI's root_path as Starlette routes it).
   */
  rootPath?: string;
  /** GET /load counts the requests in flight on the engine's endpoints (vLLM's --enable-server-load-tracking); else it says 0. */
  serverLoadTracking?: boolean;
  /** Serve POST /reset_prefix_cache and GET /server_info (vLLM's VLLM_SERVER_DEV_MODE=1). */
  devMode?: boolean;
  /** Serve GET /tokenizer_info (vLLM's --enable-tokenizer-info-endpoint: it shows the chat template and tokenizer settings). */
  tokenizerInfoEndpoint?: boolean;
  /** Write the stack of every error answered to stderr, 4xx included (vLLM's --log-error-stack). */
  logErrorStack?: boolean;
  /** vLLM's request logger: a line per request reaching the engine and, with `outputs`, per finished choice. */
  requestLog?: RequestLogOptions;
}

/**
 * HTTPS: a PEM key and certificate (vLLM's --ssl-keyfile / --ssl-certfile), and client certificates verified against
 * `ca` (--ssl-ca-certs) as --ssl-cert-reqs asks: "required" refuses a connection without a valid one, "optional"
 * asks for one and refuses a request whose certificate does not verify (403), "none" (default) asks for none.
 */
export interface TlsOptions {
  key: string;
  cert: string;
  ca?: string;
  clientCerts?: "none" | "optional" | "required";
  /** vLLM --ssl-ciphers: the cipher suites of TLS 1.2 and below (OpenSSL's list form); default Node's. */
  ciphers?: string;
  /** vLLM --enable-ssl-refresh: the files to re-read when they change (tls-refresh.ts); absent: read once. */
  refreshFrom?: TlsFiles;
}

/** What it serves, bound once the engine is ready. */
export interface ServerEngineOptions {
  engine: EngineClient;
  tokenizer: TokenizerLike;
  servedModelNames: string[];
  /** The model as `kiln serve` was given it (a path or hub id): /v1/models' `root`. Default: the first served name. */
  modelPath?: string;
  maxModelLen: number;
  /** 503 once the engine's waiting queue holds this many requests. */
  maxWaitingRequests?: number;
  /** vLLM's --stream-interval: a streamed reply's tokens per chunk (the first and the last chunk aside). Default 1. */
  streamInterval?: number;
  generationDefaults?: Partial<SamplingParams>;
  chatTemplate?: string;
  /** Requests may carry their own chat_template (vLLM --trust-request-chat-template). Default false, as in vLLM. */
  trustRequestChatTemplate?: boolean;
  /** vLLM --exclude-tools-when-tool-choice-none: a request with tool_choice "none" renders its template without its tools. */
  excludeToolsWhenToolChoiceNone?: boolean;
  /** Serves tool_choice "auto" by parsing the reply with it (vLLM --enable-auto-tool-choice --tool-call-parser). */
  /** A --tool-call-parser name: a built-in's or a registered plugin's (registerToolCallParser). */
  toolCallParser?: string;
  /**
   * The model writes OpenAI's Harmony format (gpt-oss, config.json model_type "gpt_oss"): chat prompts are rendered
   * in it and replies read by channel; the tokenizer must hold its special tokens. Default false.
   */
  harmony?: boolean;
  /** Structured output without free whitespace unless a request says otherwise (vLLM --structured-outputs-config). */
  disableAnyWhitespace?: boolean;
  /** usage.prompt_tokens_details.cached_tokens in chat and completions replies (vLLM --enable-prompt-tokens-details). */
  enablePromptTokensDetails?: boolean;
  /** /v1/completions takes prompt_embeds (vLLM --enable-prompt-embeds); default false. */
  enablePromptEmbeds?: boolean;
  /**
   * LoRA adapters served under their own names (vLLM --lora-modules; the engine has read them), or null/absent when
   * LoRA is not enabled; an empty list serves none at start but lets /v1/load_lora_adapter add some.
   */
  loraModules?: LoraModule[] | null;
  /** "pooling" (vLLM --runner pooling): /v1/embeddings, /score and /rerank are served and the generating APIs are refused. Default "generate". */
  runner?: "generate" | "pooling";
  /** The most logprobs / top_logprobs / prompt_logprobs a request may ask (vLLM --max-logprobs; -1: the vocabulary size). Default 20. */
  maxLogprobs?: number;
  /** The chat reply's role when add_generation_prompt is true (vLLM --response-role). Default "assistant". */
  responseRole?: string;
  /** Logprobs name tokens as "token_id:<id>" unless a request says otherwise (vLLM --return-tokens-as-token-ids). */
  returnTokensAsTokenIds?: boolean;
  /** Streams end with a usage chunk even when the request did not ask (vLLM --enable-force-include-usage). */
  forceIncludeUsage?: boolean;
  /**
   * vLLM --skip-tokenizer-init: the tokenizer is an AbsentTokenizer; completions take token-id prompts only, with no
   * stop strings, bad words or structured output (each a 400), and their choices' text is empty. Default false.
   */
  skipTokenizerInit?: boolean;
  /** vLLM --logits-processor-pattern, named in the 400 a request listing logits_processors gets; default null (none allowed). */
  logitsProcessorPattern?: string | null;
  /** P/D disaggregation (vLLM --kv-transfer-config): the started side channel; requests may then carry kv_transfer_params. */
  kvTransfer?: KvTransferService | null;
  /** The launch arguments GET /server_info reports in dev mode (kiln serve's, without secrets). */
  launchConfig?: Record<string, unknown> | null;
  /**
   * An image-text model's image input (gemma3ImageInputSpec): chat requests may then carry image_url parts. Default
   * none: such requests get a 400, as vLLM answers for a text-only model.
   */
  imageInput?: Gemma3ImageInputSpec | null;
  /** vLLM's --limit-mm-per-prompt: the most images one prompt may carry. Default 999. */
  imageLimit?: number;
  /** file: URLs under a directory, http(s) only from some hosts (vLLM's --allowed-local-media-path, --allowed-media-domains). */
  mediaAccess?: MediaAccess;
  /** vLLM's --interleave-mm-strings: a "string" content format writes a message's images in their place. Default false. */
  interleaveMmStrings?: boolean;
}

export type ServerOptions = ServerAppOptions & ServerEngineOptions;

/** A server whose routes are registered (and may be made ready) before its engine is bound. */
export interface PreparedServer {
  readonly app: FastifyInstance;
  /** Binds the engine the routes serve (once, before listen); returns the app. */
  bind(options: ServerEngineOptions): FastifyInstance;
}

export const DEFAULT_BODY_LIMIT = 32 * 1024 * 1024;

declare module "fastify" {
  interface FastifyInstance {
    /** Aborts every request still running in the engine (used when a shutdown drain times out). */
    kilnAbortAll(): void;
    /** Number of engine requests currently streaming. */
    kilnInflight(): number;
    /** Number of HTTP requests being handled (from arrival until their response is done or their socket closes). */
    kilnActive(): number;
  }
}

/**
 * Builds (but does not start) the server.
 * @example
 * const app = createServer({ engine, tokenizer, servedModelNames: ["kiln"], maxModelLen: 4096, version: "0.1.0" });
 * await app.listen({ port: 8000, host: "127.0.0.1" });
 */
export function createServer(options: ServerOptions): FastifyInstance {
  return prepareServer(options).bind(options);
}

/**
 * Builds the server without its engine, so that fastify's set-up (and `app.ready()`) can run while the engine
 * loads; bind() the engine before listen.
 * @example
 * const server = prepareServer({ version: "0.1.0" });
 * await server.app.ready(); // meanwhile the engine loads
 * await server.bind({ engine, tokenizer, servedModelNames: ["kiln"], maxModelLen: 4096 }).listen({ port: 8000 });
 */
export function prepareServer(options: ServerAppOptions): PreparedServer {
  const bodyLimit = options.bodyLimit ?? DEFAULT_BODY_LIMIT;
  const fastifyOptions = {
    logger: options.logRequests ? { level: options.logLevel ?? "info" } : false,
    // (fastify 5.12 deprecates its top-level disableRequestLogging: the log controller carries it)
    ...(options.disableRequestLogging === true || options.accessLogExcludedPaths?.length
      ? { logController: new LogController({ disableRequestLogging: requestLogOff(options.disableRequestLogging === true, options.accessLogExcludedPaths ?? []) }) }
      : {}),
    bodyLimit,
    return503OnClosing: true,
    // "/v1/models/" is "/v1/models", as vLLM (Starlette) redirects one to the other
    routerOptions: { ignoreTrailingSlash: true },
    // request.id (vLLM's request id): the client's X-Request-Id, else a random hex; chat and completion ids carry it
    requestIdHeader: "x-request-id",
    genReqId: () => randomBytes(16).toString("hex"),
    ...(options.rootPath !== undefined ? { rewriteUrl: (req: IncomingMessage) => withoutRootPath(req.url ?? "/", options.rootPath!) } : {}),
  };
  // an HTTPS server has the same API: only fastify's server type parameter differs
  const tls = options.https;
  const clientCerts = tls?.clientCerts ?? "none";
  const fixedTls = tls?.ciphers !== undefined ? { ciphers: tls.ciphers } : {};
  const https = tls === undefined ? undefined
    : { key: tls.key, cert: tls.cert, ...(tls.ca !== undefined ? { ca: tls.ca } : {}), ...fixedTls, requestCert: clientCerts !== "none", rejectUnauthorized: clientCerts === "required" };
  const app = (https !== undefined ? Fastify({ ...fastifyOptions, https }) : Fastify(fastifyOptions)) as unknown as FastifyInstance;
  if (tls?.refreshFrom !== undefined) {
    const stop = watchTlsFiles(app.server as unknown as TlsServer, tls.refreshFrom, fixedTls, (l) => process.stderr.write(`${l}\n`));
    app.addHook("onClose", async () => stop());
  }
  if (clientCerts === "optional") {
    // a certificate sent must verify (Python's CERT_OPTIONAL); the handshake let it through to say why here
    app.addHook("onRequest", async (request, reply) => {
      const socket = request.raw.socket as TLSSocket;
      if (socket.authorized || Object.keys(socket.getPeerCertificate?.() ?? {}).length === 0) return;
      return reply.code(403).send(new ApiError(403, `the client certificate does not verify: ${String(socket.authorizationError)}`, null, "authentication_error", "invalid_client_certificate").toBody());
    });
  }
  let ctx: ServingContext | null = null;
  const bound = (): ServingContext => {
    if (ctx === null) throw new Error("[server] a request arrived before the engine was bound: bind() before listen()");
    return ctx;
  };
  app.decorate("kilnAbortAll", () => {
    if (ctx === null) return;
    ctx.engine.abort([...ctx.inflight]);
  });
  app.decorate("kilnInflight", () => ctx?.inflight.size ?? 0);
  // A request counts from its arrival, before it reaches the engine: a drain must not cut it off while it is
  // still being parsed, tokenized or queued.
  let active = 0;
  app.decorate("kilnActive", () => active);
  app.addHook("onRequest", async (_request, reply) => {
    active++;
    reply.raw.once("close", () => active--);
  });

  if (options.requestIdHeaders === true) {
    // on the raw response, so that hijacked (SSE) replies carry it too
    app.addHook("onRequest", async (request, reply) => void reply.raw.setHeader("x-request-id", request.id));
  }
  installCors(app, options.allowedOrigins ?? [], options.cors ?? {});
  if (options.apiKey) installAuth(app, options.apiKey);
  new ServerLoad(options.serverLoadTracking === true).install(app); // GET /load, and the count when tracking

  app.setErrorHandler(async (err, request, reply) => {
    const apiErr = toApiError(err);
    if (apiErr.status >= 500) request.log.error({ err }, "request failed");
    if (options.logErrorStack === true) process.stderr.write(`[server] ${request.method} ${request.url}: ${apiErr.status}: ${(err as Error).stack ?? String(err)}\n`);
    // A body rejected before it was read (413, 415): a client still uploading would get EPIPE, not the error.
    // (a body already read to its end, as an injected request's, has nothing left to wait for)
    if (!request.raw.complete && !request.raw.readableEnded && !request.raw.destroyed) await discardBody(request.raw, 4 * bodyLimit, 10_000);
    // the Messages API's routes answer with Anthropic's error object (anthropic-protocol.ts)
    const body = isMessagesPath(request.url.split("?")[0]!) ? anthropicError(apiErr).body : apiErr.toBody();
    return reply.code(apiErr.status).send(body);
  });
  // A body sent without a content type, or as an application/*+json type, is read as JSON, as vLLM's FastAPI reads it
  // (Python's requests.post(url, data=json.dumps(body)) sends none); other types stay a 415.
  const parseJson = app.getDefaultJsonParser("error", "error");
  app.addContentTypeParser("*", { parseAs: "string" }, (request, body, done) => {
    const type = request.headers["content-type"];
    if (type === undefined || /^application\/[^;\s]+\+json\s*(;|$)/i.test(type)) parseJson(request, body as string, done);
    else done(new errorCodes.FST_ERR_CTP_INVALID_MEDIA_TYPE(), undefined);
  });
  // A known path asked with another method gets 405 and Allow, as vLLM's Starlette router answers; others 404 (under
  // /v1/messages, Anthropic's error object, as its routes' other errors).
  const methodsOf = routeMethods(app);
  app.setNotFoundHandler((request, reply) => {
    const path = request.url.split("?")[0]!;
    const body = (err: ApiError) => (isMessagesPath(path) ? anthropicError(err).body : err.toBody());
    const allowed = methodsOf(path);
    if (allowed.length > 0 && !allowed.includes(request.method)) {
      const err = new ApiError(405, `Method ${request.method} not allowed for ${path} (allowed: ${allowed.join(", ")})`, null,
        "invalid_request_error", "method_not_allowed");
      void reply.code(405).header("allow", allowed.join(", ")).send(body(err));
      return;
    }
    const err = new ApiError(404, `Route ${request.method} ${path} not found`, null, "not_found_error");
    void reply.code(404).send(body(err));
  });

  // 503 once the engine has died, as vLLM's (EngineDeadError): every request would fail, and an orchestrator's probe
  // should restart the server
  const health = async (_req: FastifyRequest, reply: FastifyReply) => reply.code((ctx?.engine.deadError?.() ?? null) === null ? 200 : 503).send();
  app.get("/health", health);
  // SageMaker's probe: vLLM answers it on GET and POST with /health's status
  app.route({ method: ["GET", "POST"], url: "/ping", handler: health });
  app.get("/version", async () => ({ version: options.version }));
  app.get("/metrics", async (_req, reply) => {
    const { metrics } = bound();
    return reply.type(metrics.registry.contentType).send(await metrics.render());
  });
  app.get("/v1/models", async () => {
    const ctx = bound();
    const { servedModelNames, maxModelLen } = ctx;
    const created = Math.floor(Date.now() / 1000);
    return {
      object: "list",
      data: [...servedModelNames.map((id) => ({
        id,
        object: "model",
        created,
        owned_by: "kiln",
        root: ctx.modelPath,
        parent: null,
        max_model_len: maxModelLen,
        permission: [modelPermission(created)],
      })), ...loraModelCards(ctx, created)],
    };
  });
  const endpoints: Record<InvocationEndpoint, Endpoint> = {
    chat: async (request, reply) => {
      refuseOnPoolingRunner(bound(), "Chat Completions");
      return handleChat(bound(), request, reply);
    },
    completion: async (request, reply) => {
      refuseOnPoolingRunner(bound(), "Completions");
      return handleCompletion(bound(), request, reply);
    },
    embedding: (request, reply) => handleEmbeddings(bound(), request, reply),
    classify: (request, reply) => handleClassify(bound(), request, reply),
    score: (request, reply) => handleScore(bound(), request, reply),
    rerank: (request, reply) => handleRerank(bound(), request, reply),
    pooling: (request, reply) => handlePooling(bound(), request, reply),
  };
  app.post("/v1/chat/completions", endpoints.chat);
  app.post("/v1/completions", endpoints.completion);
  registerResponsesRoutes(app, bound); // POST /v1/responses, GET /v1/responses/{id}
  registerMessagesRoutes(app, bound); // POST /v1/messages, /v1/messages/count_tokens (Anthropic's API)
  app.post("/v1/embeddings", endpoints.embedding);
  for (const path of ["/score", "/v1/score"]) app.post(path, endpoints.score);
  for (const path of ["/rerank", "/v1/rerank", "/v2/rerank"]) app.post(path, endpoints.rerank);
  for (const path of ["/classify", "/v1/classify"]) app.post(path, endpoints.classify);
  app.post("/pooling", endpoints.pooling);
  registerInvocationsRoute(app, bound, endpoints); // POST /invocations: one of the above, by the body's shape
  registerTokenizeRoutes(app, bound);
  if (options.tokenizerInfoEndpoint === true) registerTokenizerInfoRoute(app, bound);
  if (options.allowRuntimeLoraUpdating === true) registerLoraRoutes(app, bound);
  if (options.devMode === true) {
    registerDevRoutes(app, bound, {
      root_path: options.rootPath ?? null, allowed_origins: options.allowedOrigins ?? [], body_limit: bodyLimit,
      enable_request_id_headers: options.requestIdHeaders === true, enable_server_load_tracking: options.serverLoadTracking === true,
      api_key_required: options.apiKey !== undefined && options.apiKey !== "", https: options.https !== undefined,
    });
  }

  return {
    app,
    bind(engineOptions: ServerEngineOptions): FastifyInstance {
      if (ctx !== null) throw new Error("[server] bind() was called twice");
      if (engineOptions.servedModelNames.length === 0) throw new Error("createServer: servedModelNames must not be empty");
      const harmony = harmonyServing(engineOptions);
      ctx = {
        engine: engineOptions.engine,
        tokenizer: engineOptions.tokenizer,
        metrics: new ServerMetrics(engineOptions.engine, engineOptions.servedModelNames[0]!, engineOptions.maxModelLen, engineOptions.kvTransfer ?? null, engineOptions.launchConfig ?? null),
        servedModelNames: engineOptions.servedModelNames,
        modelPath: engineOptions.modelPath ?? engineOptions.servedModelNames[0]!,
        maxModelLen: engineOptions.maxModelLen,
        maxWaitingRequests: engineOptions.maxWaitingRequests,
        streamInterval: engineOptions.streamInterval ?? 1,
        generationDefaults: engineOptions.generationDefaults ?? {},
        chatTemplate: engineOptions.chatTemplate,
        trustRequestChatTemplate: engineOptions.trustRequestChatTemplate ?? false,
        excludeToolsWhenToolChoiceNone: engineOptions.excludeToolsWhenToolChoiceNone ?? false,
        toolCallParser: engineOptions.toolCallParser === undefined ? null : toolCallParser(engineOptions.toolCallParser),
        disableAnyWhitespace: engineOptions.disableAnyWhitespace ?? false,
        enablePromptTokensDetails: engineOptions.enablePromptTokensDetails ?? false,
        enablePromptEmbeds: engineOptions.enablePromptEmbeds ?? false,
        loraModules: engineOptions.loraModules == null ? null : new Map(engineOptions.loraModules.map((m) => [m.request.name, m])),
        lastLoraId: Math.max(0, ...(engineOptions.loraModules ?? []).map((m) => m.request.id)),
        // a pooling engine says what it pools (a classifier pools whatever the runner flag said)
        poolingTask: engineOptions.engine.poolingTask ?? (engineOptions.runner === "pooling" ? "embed" : null),
        classLabels: engineOptions.engine.classLabels ? [...engineOptions.engine.classLabels] : null,
        useSepToken: engineOptions.engine.useSepToken ?? true,
        maxLogprobs: engineOptions.maxLogprobs === -1 ? engineOptions.tokenizer.vocabSize : (engineOptions.maxLogprobs ?? MAX_LOGPROBS),
        responseRole: engineOptions.responseRole ?? "assistant",
        returnTokensAsTokenIds: engineOptions.returnTokensAsTokenIds ?? false,
        forceIncludeUsage: engineOptions.forceIncludeUsage ?? false,
        logitsProcessorPattern: engineOptions.logitsProcessorPattern ?? null,
        skipTokenizerInit: engineOptions.skipTokenizerInit ?? false,
        reasoningParser: engineOptions.engine.reasoningParser ?? null, // one setting: the engine's gates its grammars
        harmony,
        kvTransfer: engineOptions.kvTransfer ?? null,
        launchConfig: engineOptions.launchConfig ?? null,
        inflight: new Set(),
        unstarted: new Set(),
        requestLog: options.requestLog ? new RequestLog(options.requestLog) : null,
        imageInput: engineOptions.imageInput ?? null,
        imageLimit: engineOptions.imageLimit ?? DEFAULT_IMAGE_LIMIT,
        mediaAccess: engineOptions.mediaAccess ?? DEFAULT_MEDIA_ACCESS,
        interleaveMmStrings: engineOptions.interleaveMmStrings ?? false,
      };
      return app;
    },
  };
}

/** A Harmony model's serving (its special tokens; calls read with --tool-call-parser openai), checked against the other options. */
function harmonyServing(o: ServerEngineOptions): HarmonyServing | null {
  if (o.harmony !== true) {
    if (o.toolCallParser === "openai")
      throw new Error("[server] the openai tool-call parser reads gpt-oss's Harmony format: the served model is not gpt-oss (model_type gpt_oss)");
    return null;
  }
  if (o.toolCallParser !== undefined && o.toolCallParser !== "openai")
    throw new Error(`[server] gpt-oss writes its tool calls in Harmony format: serve it with --tool-call-parser openai, not ${o.toolCallParser}`);
  if (o.engine.reasoningParser != null)
    throw new Error(`[server] gpt-oss's reasoning is its analysis channel: serve it with --reasoning-parser openai_gptoss (or none), not ${o.engine.reasoningParser}`);
  return { tokens: harmonyTokens(o.tokenizer), toolCalls: o.toolCallParser === "openai" };
}

/** `url` without the root path prefix, when it is under it ("/api/v1/models" -> "/v1/models"); else `url`. */
function withoutRootPath(url: string, root: string): string {
  if (url === root || url.startsWith(`${root}?`)) return `/${url.slice(root.length)}`;
  return url.startsWith(`${root}/`) ? url.slice(root.length) : url;
}

/** Reads and drops the rest of a request body, up to `maxBytes` or `timeoutMs`, then resolves. */
function discardBody(raw: IncomingMessage, maxBytes: number, timeoutMs: number): Promise<void> {
  return new Promise((resolve) => {
    let seen = 0;
    const done = (): void => {
      clearTimeout(timer);
      raw.off("data", onData).off("end", done).off("error", done).off("close", done);
      resolve();
    };
    const onData = (chunk: Buffer): void => {
      seen += chunk.length;
      if (seen > maxBytes) done();
    };
    const timer = setTimeout(done, timeoutMs);
    raw.on("data", onData).once("end", done).once("error", done).once("close", done);
    raw.resume();
  });
}

/**
 * The key as `Authorization: Bearer <key>` (the scheme in any case), or as Anthropic's clients send it, `x-api-key:
 * <key>`. As vLLM's AuthenticationMiddleware, only paths under /v1 need it (/health, /metrics, /tokenize, /score,
 * /invocations... stay open), and no preflight does.
 */
function installAuth(app: FastifyInstance, apiKey: string): void {
  const expected = Buffer.from(apiKey);
  const matches = (value: string | undefined): boolean => {
    const got = Buffer.from(value ?? "");
    return got.length === expected.length && timingSafeEqual(got, expected);
  };
  app.addHook("onRequest", async (request, reply) => {
    const path = request.url.split("?")[0]!;
    if (request.method === "OPTIONS" || !path.startsWith("/v1")) return;
    const auth = request.headers.authorization;
    const bearer = auth?.slice(0, 7).toLowerCase() === "bearer " ? auth.slice(7) : undefined;
    const xApiKey = request.headers["x-api-key"];
    if (!matches(bearer) && !matches(typeof xApiKey === "string" ? xApiKey : undefined)) {
      const err = new ApiError(401, "Invalid or missing API key (send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>').", null,
        "authentication_error", "invalid_api_key");
      if (isMessagesPath(path)) return reply.code(401).send(anthropicError(err).body);
      return reply.code(401).send(err.toBody());
    }
  });
}

/** Whether a request's log lines are left out: all of them, or those of the excluded paths (the query ignored). */
function requestLogOff(all: boolean, paths: readonly string[]): boolean | ((req: { url?: string }) => boolean) {
  if (all) return true;
  const excluded = new Set(paths);
  return (req) => excluded.has((req.url ?? "/").split("?")[0]!);
}

/** Starlette's: methods "*" stands for, and request headers a preflight may always ask for. */
const ALL_METHODS = ["DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"];
const SAFELISTED_HEADERS = ["accept", "accept-language", "content-language", "content-type"];

/**
 * CORS as vLLM serves it (Starlette's CORSMiddleware over --allowed-origins, --allow-credentials, --allowed-methods,
 * --allowed-headers; max age 600): a preflight (OPTIONS with Access-Control-Request-Method) is answered here, 200
 * "OK", or 400 "Disallowed CORS origin, method, headers" naming what the lists refuse; other requests from an allowed
 * origin carry Access-Control-Allow-Origin ("*" for any origin, the request's own where credentials need it).
 */
function installCors(app: FastifyInstance, origins: string[], cors: NonNullable<ServerAppOptions["cors"]>): void {
  if (origins.length === 0) return;
  const anyOrigin = origins.includes("*");
  const credentials = cors.allowCredentials === true;
  const methodList = cors.allowedMethods ?? ["*"];
  const methods = methodList.includes("*") ? ALL_METHODS : methodList.map((m) => m.toUpperCase());
  const headerList = cors.allowedHeaders ?? ["*"];
  const anyHeader = headerList.includes("*");
  const headers = [...new Set([...SAFELISTED_HEADERS, ...headerList.map((h) => h.toLowerCase())])].sort();
  const explicitOrigin = !anyOrigin || credentials; // a preflight names the origin back (Vary: Origin)
  const allowed = (origin: string) => anyOrigin || origins.includes(origin);
  app.addHook("onRequest", async (request, reply) => {
    const origin = request.headers.origin;
    if (!origin) return;
    // set on the raw response so that hijacked (SSE) replies carry them too
    const set = (name: string, value: string) => reply.raw.setHeader(name, value);
    const requestedMethod = request.headers["access-control-request-method"];
    if (request.method === "OPTIONS" && typeof requestedMethod === "string") {
      const failures: string[] = [];
      if (explicitOrigin) set("vary", "Origin");
      else set("access-control-allow-origin", "*");
      set("access-control-allow-methods", methods.join(", "));
      set("access-control-max-age", "600");
      if (!anyHeader) set("access-control-allow-headers", headers.join(", "));
      if (credentials) set("access-control-allow-credentials", "true");
      if (allowed(origin)) {
        if (explicitOrigin) set("access-control-allow-origin", origin);
      } else failures.push("origin");
      if (!methods.includes(requestedMethod)) failures.push("method");
      const requestedHeaders = request.headers["access-control-request-headers"];
      if (typeof requestedHeaders === "string") {
        if (anyHeader) set("access-control-allow-headers", requestedHeaders);
        else if (requestedHeaders.split(",").some((h) => !headers.includes(h.trim().toLowerCase()))) failures.push("headers");
      }
      if (failures.length > 0) return reply.code(400).type("text/plain; charset=utf-8").send(`Disallowed CORS ${failures.join(", ")}`);
      return reply.code(200).type("text/plain; charset=utf-8").send("OK");
    }
    if (credentials) set("access-control-allow-credentials", "true");
    // (a request with cookies gets its own origin back, not "*")
    if (anyOrigin && request.headers.cookie === undefined) set("access-control-allow-origin", "*");
    else if (allowed(origin)) {
      set("access-control-allow-origin", origin);
      set("vary", "Origin");
    }
  });
}
