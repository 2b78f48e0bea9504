// vLLM's development endpoints, served only with VLLM_SERVER_DEV_MODE=1 (util/env.ts; otherwise they 404 like any
// unknown path): POST /reset_prefix_cache drops the engine's prefix cache, GET /server_info reports the configuration,
// and sleep mode's POST /sleep?level=&mode=, POST /wake_up?tags= and GET /is_sleeping (engine/sleep-mode.ts; /sleep
// and /wake_up are refused with a 400 unless the engine was started with --enable-sleep-mode).
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { ApiError, badRequest } from "./errors.js";
import { parsePauseMode, parseSleepLevel, parseWakeTags } from "../engine/sleep-mode.js";
import type { Json } from "./fields.js";
import type { ServingContext } from "./serving-context.js";

type Query = Record<string, string | string[] | undefined>;

/** A query parameter's value (the last one when repeated), or undefined. */
function queryValue(query: Query, name: string): string | undefined {
  const v = query[name];
  return Array.isArray(v) ? v.at(-1) : v;
}

/** A query flag as FastAPI reads a bool (true/false, 1/0, yes/no, on/off); absent = false. */
function queryFlag(query: Query, name: string): boolean {
  const v = query[name];
  if (v === undefined) return false;
  const s = (Array.isArray(v) ? v.at(-1)! : v).toLowerCase();
  if (["true", "1", "yes", "on"].includes(s)) return true;
  if (["false", "0", "no", "off"].includes(s)) return false;
  throw badRequest(`'${name}' must be a boolean, got ${JSON.stringify(v)}`, name);
}

/**
 * What /server_info reports (vLLM's VllmConfig, as far as Kiln has one): the served model, the engine's resolved
 * arguments, the server's settings, and the launch arguments `kiln serve` passed (secrets left out).
 */
export function serverConfig(ctx: ServingContext, app: Json): Json {
  return {
    model: ctx.servedModelNames[0]!,
    served_model_name: ctx.servedModelNames,
    max_model_len: ctx.maxModelLen,
    runner: ctx.poolingTask === null ? "generate" : "pooling",
    pooling_task: ctx.poolingTask,
    engine: ctx.engine.engineArgs ?? null,
    server: {
      ...app,
      max_waiting_requests: ctx.maxWaitingRequests ?? null,
      max_logprobs: ctx.maxLogprobs,
      response_role: ctx.responseRole,
      return_tokens_as_token_ids: ctx.returnTokensAsTokenIds,
      enable_prompt_tokens_details: ctx.enablePromptTokensDetails,
      enable_prompt_embeds: ctx.enablePromptEmbeds,
      disable_any_whitespace: ctx.disableAnyWhitespace,
      reasoning_parser: ctx.reasoningParser,
      enable_auto_tool_choice: ctx.toolCallParser !== null || ctx.harmony !== null,
      lora_modules: ctx.loraModules === null ? null : [...ctx.loraModules.keys()],
      kv_transfer_role: ctx.kvTransfer?.config.kvRole ?? null,
      generation_defaults: ctx.generationDefaults,
    },
    launch: ctx.launchConfig,
  };
}

/** Registers the development endpoints; `app` is the HTTP front end's own settings, for /server_info. */
export function registerDevRoutes(app: FastifyInstance, bound: () => ServingContext, appConfig: Json): void {
  // vLLM's answer is an empty 200 (it does not check that the cache was dropped); Kiln drops what no request holds
  app.post("/reset_prefix_cache", async (request: FastifyRequest<{ Querystring: Query }>, reply: FastifyReply) => {
    const ctx = bound();
    for (const name of ["reset_running_requests", "reset_external"]) {
      if (queryFlag(request.query, name)) throw badRequest(`'${name}' is not supported: running requests keep their blocks, and there is no external cache`, name);
    }
    if (ctx.engine.resetPrefixCache === undefined) throw new ApiError(501, "The engine cannot reset its prefix cache", null, "server_error");
    const all = await ctx.engine.resetPrefixCache();
    request.log.info(`prefix cache reset (${all ? "all of it" : "blocks in use kept"})`);
    return reply.code(200).send();
  });
  // vLLM answers both with an empty 200 once done (/sleep with mode=wait: once the running requests have finished)
  app.post("/sleep", async (request: FastifyRequest<{ Querystring: Query }>, reply: FastifyReply) => {
    const engine = bound().engine;
    const level = parseSleepLevel(queryValue(request.query, "level") ?? "1");
    const mode = parsePauseMode(queryValue(request.query, "mode") ?? "abort");
    if (engine.sleep === undefined) throw new ApiError(501, "The engine has no sleep mode", null, "server_error");
    await engine.sleep(level, mode);
    request.log.info(`the engine sleeps (level ${level}, mode ${mode})`);
    return reply.code(200).send();
  });
  app.post("/wake_up", async (request: FastifyRequest<{ Querystring: Query }>, reply: FastifyReply) => {
    const engine = bound().engine;
    const raw = request.query.tags;
    const tags = parseWakeTags(raw === undefined ? null : Array.isArray(raw) ? raw : [raw]);
    if (engine.wakeUp === undefined) throw new ApiError(501, "The engine has no sleep mode", null, "server_error");
    await engine.wakeUp(tags);
    request.log.info(`wake up the engine with tags: ${tags === null ? "all" : tags.join(", ")}`);
    return reply.code(200).send();
  });
  app.get("/is_sleeping", async () => ({ is_sleeping: bound().engine.isSleeping?.() ?? false }));
  app.get("/server_info", async (request: FastifyRequest<{ Querystring: Query }>) => {
    const format = request.query.config_format ?? "text";
    if (format !== "text" && format !== "json") throw badRequest(`'config_format' must be "text" or "json", got ${JSON.stringify(format)}`, "config_format");
    const config = serverConfig(bound(), appConfig);
    // vLLM's key; "text" gives the configuration as one string (here: its JSON), "json" as an object
    return { vllm_config: format === "text" ? JSON.stringify(config) : config };
  });
}
