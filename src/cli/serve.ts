// `kiln serve`: build the engine through the injected factory, start the HTTP server, drain on SIGTERM.
import type { EngineFactory, LoadedEngine } from "./engine-factory.js";
import { createProgress } from "./progress.js";
import type { ServeArgs } from "./serve-args.js";
import { KILN_VERSION } from "./version.js";
import { CliUsageError, type LoraModuleArg } from "./serve-args.js";
import { pinoLevel } from "./serve-frontend-args.js";
import { existsSync, lstatSync, readFileSync, unlinkSync } from "node:fs";
import * as path from "node:path";
import type { EngineClient } from "../engine/types.js";
import { withChatTemplateDefaults } from "../models/chat-content-format.js";
import type { LoraModule } from "../server/serving-context.js";
import type { KvTransferService } from "../server/kv-transfer.js";
import type { ServerEngineOptions } from "../server/server.js";
import { missingParserTokens } from "../server/tool-parsers.js";
import { env } from "../util/env.js";
import type { TokenizerLike } from "../models/tokenizer-types.js";
import { DEFAULT_IMAGE_LIMIT } from "../models/chat-images.js";

export async function runServe(args: ServeArgs, factory: EngineFactory, out: NodeJS.WritableStream = process.stdout): Promise<void> {
  const progress = createProgress();
  // The server is built and made ready on this thread (fastify's set-up, route schemas) while the engine loads,
  // and the engine is bound to it once loaded (no request can arrive before listen). The set-up starts from the
  // factory's whileLoading hook, once the engine worker runs: importing and building it first would delay the
  // worker's start by ~0.1 s.
  let startServer!: () => void;
  const prepared = new Promise<void>((resolve) => (startServer = resolve)).then(async () => {
    const [{ prepareServer }, { serveUntilSignal }] = await Promise.all([import("../server/index.js"), import("../server/shutdown.js")]);
    const server = prepareServer({
      version: KILN_VERSION,
      allowedOrigins: args.allowedOrigins,
      cors: args.cors,
      // the HTTP log (vLLM's uvicorn's): on with --enable-log-requests or --uvicorn-log-level
      logRequests: args.logRequests || args.httpLogLevel !== null,
      logLevel: pinoLevel(args.httpLogLevel ?? "info"),
      disableRequestLogging: args.disableAccessLog,
      accessLogExcludedPaths: args.accessLogExcludedPaths,
      requestIdHeaders: args.enableRequestIdHeaders,
      ...(args.tls !== null ? { https: args.tls } : {}),
      ...(args.rootPath !== null ? { rootPath: args.rootPath } : {}),
      ...(args.apiKey ? { apiKey: args.apiKey } : {}),
      allowRuntimeLoraUpdating: args.enableLora && env.allowRuntimeLoraUpdating,
      serverLoadTracking: args.enableServerLoadTracking,
      devMode: env.serverDevMode,
      tokenizerInfoEndpoint: args.enableTokenizerInfoEndpoint,
      logErrorStack: args.logErrorStack ?? env.serverDevMode,
      ...(args.logRequests ? { requestLog: { maxLen: args.maxLogLen, outputs: args.logOutputs, deltas: args.logDeltas } } : {}),
    });
    await server.app.ready();
    return { server, serveUntilSignal };
  });
  prepared.catch(() => undefined); // awaited below; a failing factory must not leave it unhandled
  const loaded = await factory(args, progress, () => startServer());
  startServer(); // a factory that never called whileLoading
  let ready: Awaited<typeof prepared>;
  try {
    ready = await prepared;
  } catch (err) {
    await loaded.close(); // the engine is up: do not leave its worker running
    throw err;
  }
  const { server, serveUntilSignal } = ready;
  progress.done();
  const names = args.servedModelName ?? [loaded.modelName];
  let loraModules: LoraModule[] | null = null;
  try {
    loraModules = args.enableLora ? await addLoraModules(loaded.engine, args.loraModules, names) : null;
  } catch (err) {
    await loaded.close();
    throw err;
  }
  // gpt-oss (config.json model_type gpt_oss, or a gpt-oss GGUF) is served in Harmony format, as vLLM serves it
  let harmony: boolean;
  try {
    harmony = await writesHarmony(args);
  } catch (err) {
    await loaded.close();
    throw err;
  }
  // P/D disaggregation: the side channel decode servers pull prefills' K/V from
  let kvTransfer: KvTransferService | null = null;
  if (args.kvTransferConfig !== null) {
    const { KvTransferService } = await import("../server/kv-transfer.js");
    kvTransfer = new KvTransferService(args.kvTransferConfig, names[0]!, { bindHost: args.host, warn: (l) => process.stderr.write(`[kv-transfer] ${l}\n`) });
    try {
      await kvTransfer.start();
    } catch (err) {
      await loaded.close();
      throw new CliUsageError(`--kv-transfer-config: the K/V side channel cannot listen on ${args.host}:${args.kvTransferConfig.kvPort}: ${(err as Error).message}`);
    }
  }
  const closeAll = async (): Promise<void> => {
    await kvTransfer?.close();
    await loaded.close();
  };
  let images: ServedImageOptions;
  try {
    images = await servedImageOptions(args, loaded.tokenizer);
  } catch (err) {
    await closeAll();
    throw err;
  }
  const app = server.bind({ ...serverEngineOptions(args, loaded, names, loraModules, kvTransfer, harmony), ...images });
  try {
    if (args.uds !== null) removeStaleSocket(args.uds);
    await app.listen(args.uds !== null ? { path: args.uds } : { host: args.host, port: args.port });
  } catch (err) {
    await closeAll();
    throw err;
  }
  const scheme = args.tls !== null ? "https" : "http";
  if (args.uds !== null) out.write(`Kiln serving ${names[0]} at unix:${args.uds} (${scheme}, /v1)\n`);
  else {
    const addr = app.server.address();
    const port = addr && typeof addr === "object" ? addr.port : args.port;
    out.write(`Kiln serving ${names[0]} at ${scheme}://${args.host}:${port}/v1\n`);
  }
  if (kvTransfer !== null) out.write(`K/V side channel (${args.kvTransferConfig!.kvRole}) on ${args.host}:${kvTransfer.sidePort}\n`);
  await serveUntilSignal(app, { onClosed: closeAll });
}

/** What the server serves for `kiln serve`'s flags (run-batch binds the same). */
export function serverEngineOptions(
  args: ServeArgs, loaded: LoadedEngine, names: string[], loraModules: LoraModule[] | null, kvTransfer: KvTransferService | null,
  harmony: boolean,
): ServerEngineOptions {
  const missing = args.toolCallParser === null ? [] : missingParserTokens(args.toolCallParser, loaded.tokenizer);
  if (missing.length > 0)
    throw new CliUsageError(`--tool-call-parser ${args.toolCallParser} needs ${missing.join(" and ")} as tokens of the model's tokenizer, which spells them with several (vLLM refuses to start too)`);
  return {
    engine: loaded.engine,
    // --chat-template-content-format and --default-chat-template-kwargs reach every chat render (chat, responses, /tokenize)
    tokenizer: withChatTemplateDefaults(loaded.tokenizer, { contentFormat: args.chatTemplateContentFormat, kwargs: args.defaultChatTemplateKwargs }),
    servedModelNames: names,
    modelPath: args.model,
    maxModelLen: loaded.maxModelLen,
    ...(args.maxWaitingRequests !== null ? { maxWaitingRequests: args.maxWaitingRequests } : {}),
    streamInterval: args.streamInterval,
    ...(loaded.generationDefaults ? { generationDefaults: loaded.generationDefaults } : {}),
    ...(args.chatTemplate !== null ? { chatTemplate: args.chatTemplate } : {}),
    trustRequestChatTemplate: args.trustRequestChatTemplate,
    excludeToolsWhenToolChoiceNone: args.excludeToolsWhenToolChoiceNone,
    ...(args.toolCallParser !== null ? { toolCallParser: args.toolCallParser } : {}),
    harmony,
    disableAnyWhitespace: args.disableAnyWhitespace,
    enablePromptTokensDetails: args.enablePromptTokensDetails,
    enablePromptEmbeds: args.enablePromptEmbeds,
    loraModules,
    runner: args.runner,
    maxLogprobs: args.maxLogprobs,
    responseRole: args.responseRole,
    returnTokensAsTokenIds: args.returnTokensAsTokenIds,
    forceIncludeUsage: args.enableForceIncludeUsage,
    logitsProcessorPattern: args.logitsProcessorPattern,
    skipTokenizerInit: args.skipTokenizerInit,
    kvTransfer,
    launchConfig: launchConfig(args),
  };
}

export type ServedImageOptions = Required<Pick<ServerEngineOptions, "imageInput" | "imageLimit" | "mediaAccess" | "interleaveMmStrings">>;

/**
 * The served model's image input (an image-text Gemma 3 directory, its processor under --mm-processor-kwargs; null for
 * any other model, or with --limit-mm-per-prompt image 0: requests with images get a 400) and the images a prompt may
 * hold (run-batch's too).
 */
export async function servedImageOptions(args: ServeArgs, tokenizer: TokenizerLike): Promise<ServedImageOptions> {
  const imageLimit = args.limitMmPerPrompt?.image ?? DEFAULT_IMAGE_LIMIT;
  const { mediaAccess, interleaveMmStrings } = args;
  if (imageLimit === 0) return { imageInput: null, imageLimit, mediaAccess, interleaveMmStrings };
  const { resolveModel } = await import("../models/hub.js");
  const { gemma3ImageInputSpec } = await import("../models/gemma3-vision-weights.js");
  const { withMmProcessorKwargs } = await import("../models/gemma3-image-processor.js");
  const resolved = await resolveModel(args.model, { ...(args.revision !== null ? { revision: args.revision } : {}), ...(args.downloadDir !== null ? { cacheDir: args.downloadDir } : {}) });
  const spec = resolved.kind === "gguf" ? null : gemma3ImageInputSpec(resolved.path, tokenizer);
  // (--mm-processor-kwargs was checked when the flags were parsed)
  return { imageInput: spec === null ? null : withMmProcessorKwargs(spec, args.mmProcessorKwargs), imageLimit, mediaAccess, interleaveMmStrings };
}

/**
 * Whether the served model writes OpenAI's Harmony format: its config.json says model_type "gpt_oss" (vLLM's test), or
 * its GGUF file (given, or alone in a directory without config.json) general.architecture "gpt-oss".
 * --reasoning-parser openai_gptoss and --tool-call-parser openai read Harmony only: with another model, a usage error.
 */
export async function writesHarmony(args: ServeArgs): Promise<boolean> {
  const { resolveModel } = await import("../models/hub.js");
  const resolved = await resolveModel(args.model, { ...(args.revision !== null ? { revision: args.revision } : {}), ...(args.downloadDir !== null ? { cacheDir: args.downloadDir } : {}) });
  const config = path.join(args.hfConfigPath ?? resolved.path, "config.json");
  const ggufIsGptOss = async (file: string): Promise<boolean> => {
    const { readGguf } = await import("../models/formats/gguf.js");
    const g = readGguf(file);
    try {
      return g.metadata["general.architecture"] === "gpt-oss";
    } finally {
      g.close();
    }
  };
  let harmony: boolean;
  if (resolved.kind === "gguf") harmony = await ggufIsGptOss(resolved.path);
  else if (existsSync(config)) harmony = (JSON.parse(readFileSync(config, "utf8")) as { model_type?: unknown }).model_type === "gpt_oss";
  else {
    const { inspectModelDir } = await import("../models/model-dir.js");
    const weights = inspectModelDir(resolved.path).weights;
    harmony = weights?.format === "gguf" && (await ggufIsGptOss(weights.files[0]!));
  }
  if (!harmony && args.reasoningParser === "openai_gptoss")
    throw new CliUsageError("--reasoning-parser openai_gptoss reads gpt-oss's Harmony format: the model is not gpt-oss (config.json model_type gpt_oss, or a gpt-oss GGUF)");
  if (!harmony && args.toolCallParser === "openai")
    throw new CliUsageError("--tool-call-parser openai reads gpt-oss's Harmony format: the model is not gpt-oss (config.json model_type gpt_oss, or a gpt-oss GGUF)");
  if (harmony && args.skipTokenizerInit)
    throw new CliUsageError("gpt-oss's Harmony format is read through its tokenizer's special tokens: it cannot be served with --skip-tokenizer-init");
  if (harmony && args.toolCallParser !== null && args.toolCallParser !== "openai")
    throw new CliUsageError(`gpt-oss writes its tool calls in Harmony format: serve it with --tool-call-parser openai, not ${args.toolCallParser}`);
  return harmony;
}

/** --uds: a socket left by a server that did not close is replaced (as asyncio, under uvicorn, does); any other file is refused. */
function removeStaleSocket(path: string): void {
  const st = lstatSync(path, { throwIfNoEntry: false });
  if (st === undefined) return;
  if (!st.isSocket()) throw new CliUsageError(`--uds ${path}: the path exists and is not a socket`);
  unlinkSync(path);
}

/** The arguments GET /server_info reports (dev mode): all of them but the API key and the TLS key and certificate. */
function launchConfig(args: ServeArgs): Record<string, unknown> {
  const { apiKey, tls, ...rest } = args;
  return { ...rest, apiKey: apiKey ? "<set>" : null, tls: tls !== null };
}

/** Reads every --lora-modules adapter into the engine (ids 1, 2, ...); a bad one stops the start-up, named. */
async function addLoraModules(engine: EngineClient, specs: LoraModuleArg[], names: string[]): Promise<LoraModule[]> {
  const out: LoraModule[] = [];
  for (const [i, m] of specs.entries()) {
    if (names.includes(m.name)) throw new CliUsageError(`--lora-modules ${m.name}: the name is the served model's own; give the adapter another`);
    const request = { name: m.name, id: i + 1, path: m.path };
    try {
      await engine.addLora!(request);
    } catch (e) {
      throw new CliUsageError(`--lora-modules ${m.name}: ${(e as Error).message}`);
    }
    // as vLLM: a base_model_name that is not a served model's leaves the first served name as the parent
    out.push({ request, baseModelName: m.baseModelName !== null && names.includes(m.baseModelName) ? m.baseModelName : names[0]! });
  }
  return out;
}
