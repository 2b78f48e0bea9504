// Wire protocol: OpenAI/vLLM request bodies (snake_case) validated and mapped to SamplingParams (camelCase).
import type { SamplingParams, StructuredOutputsParams } from "../engine/types.js";
import { ChatInputError, readWireMessages, type ChatImage } from "../models/chat-images.js";
import { applyMmProcessorKwargs, MmProcessorKwargsError, PAN_AND_SCAN_DEFAULTS } from "../models/gemma3-pan-and-scan.js";
import type { ChatMessage } from "../models/tokenizer-types.js";
import { badRequest } from "./errors.js";
import {
  type Json,
  optBool,
  optExtraArgs,
  optInt,
  optIntArray,
  optLogitBias,
  optNumber,
  optObject,
  optStop,
  optString,
  optStringArray,
} from "./fields.js";

export const MAX_LOGPROBS = 20; // vLLM's default --max-logprobs
export const MAX_N = 128;
/** /v1/completions' max_tokens when the request gives none (OpenAI's and vLLM's CompletionRequest default). */
export const COMPLETIONS_MAX_TOKENS = 16;

/** Fields shared by chat and completions requests, already validated. */
export interface CommonRequest {
  model: string | undefined;
  stream: boolean;
  includeUsage: boolean;
  continuousUsageStats: boolean;
  maxTokens: number | undefined; // as requested; the server fills the default from the prompt length
  /** The field maxTokens came from, for errors: max_completion_tokens when the request set it, else max_tokens. */
  maxTokensParam: "max_tokens" | "max_completion_tokens";
  /** The endpoint's own default max_tokens (completions: 16, as OpenAI and vLLM), capped by the room left. */
  maxTokensDefault?: number;
  /** prompt_logprobs was asked for: the response carries them (vLLM's prompt_logprobs field). */
  returnPromptLogprobs: boolean;
  priority: number;
  cacheSalt: string | undefined;
  echo: boolean;
  /** Sampling params without maxTokens (decided once the prompt length is known). */
  params: Partial<SamplingParams>;
  /** vLLM's use_beam_search (n beams) with its length_penalty; null for sampling. */
  beamSearch: { lengthPenalty: number } | null;
  /** vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:<id>"; undefined = the server's --return-tokens-as-token-ids. */
  returnTokensAsTokenIds: boolean | undefined;
  /** vLLM's return_token_ids: the response carries prompt_token_ids and each choice's token_ids (deltas when streamed). */
  returnTokenIds: boolean;
  /** truncate_prompt_tokens: keep the prompt's last N tokens (-1: all that max_tokens leaves room for); the server cuts it. */
  truncatePromptTokens: number | undefined;
}

export interface ChatRequest extends CommonRequest {
  messages: ChatMessage[];
  /** The messages' image_url parts, in order (each message's contentParts place them). */
  images: ChatImage[];
  addGenerationPrompt: boolean;
  continueFinalMessage: boolean;
  chatTemplate: string | undefined;
  chatTemplateKwargs: Record<string, unknown> | undefined;
  /** vLLM's mm_processor_kwargs: the image processor's settings over the server's (checked: Gemma 3's pan-and-scan keys). */
  mmProcessorKwargs?: Record<string, unknown>;
  tools: unknown[] | undefined;
  /** none: a text reply; required or named: the reply is tool calls (its text constrained to their JSON). */
  toolChoice: ToolChoice;
  topLogprobs: number | null; // null = no logprobs
  /** vLLM's include_reasoning: with a reasoning parser, return the reply's reasoning (default true). */
  includeReasoning: boolean;
  /** OpenAI's parallel_tool_calls: false keeps a reply's first tool call only (as vLLM filters them). Default true. */
  parallelToolCalls: boolean;
}

export type PromptInput = { text: string } | { tokenIds: number[] };

export interface CompletionRequest extends CommonRequest {
  /**
   * echo with max_tokens 0: the response is the prompt (with its logprobs) and nothing generated, as OpenAI and vLLM
   * answer it (how lm-evaluation-harness scores a text); the engine runs the prompt for one token that is dropped.
   */
  echoOnly: boolean;
  prompts: PromptInput[];
  /** vLLM's prompt_embeds: base64-encoded torch.save tensors, each a prompt of its own (before `prompts`' in the choices). */
  promptEmbeds: string[];
  logprobs: number | null;
  addSpecialTokens: boolean;
}

export function asJsonBody(body: unknown): Json {
  if (typeof body !== "object" || body === null || Array.isArray(body)) throw badRequest("Request body must be a JSON object");
  return body as Json;
}

function parseCommon(body: Json, vocabSize: number, { allowEchoOnly = false } = {}): CommonRequest {
  const model = optString(body, "model");
  const stream = optBool(body, "stream") ?? false;
  const streamOptions = optObject(body, "stream_options");
  // an empty object counts as unset, as vLLM's check reads it
  if (streamOptions && Object.keys(streamOptions).length > 0 && !stream)
    throw badRequest("Stream options can only be defined when `stream=True`.", "stream_options");
  const includeUsage = streamOptions ? (optBool(streamOptions, "include_usage") ?? false) : false;
  // per-chunk usage only with include_usage (vLLM's should_include_usage)
  const continuousUsageStats = (streamOptions ? (optBool(streamOptions, "continuous_usage_stats") ?? false) : false) && includeUsage;

  // max_tokens 0 only with echo on /v1/completions: the prompt scored, nothing generated (echoOnly below)
  const echo = optBool(body, "echo") ?? false;
  const maxTokens = optInt(body, "max_completion_tokens", { min: 1 }) ??
    optInt(body, "max_tokens", { min: allowEchoOnly && echo ? 0 : 1 });
  const n = optInt(body, "n", { min: 1, max: MAX_N });
  const bestOf = optInt(body, "best_of", { min: 1 });
  if (bestOf !== undefined && bestOf !== (n ?? 1)) throw badRequest("'best_of' other than n is not supported", "best_of");
  const minTokens = optInt(body, "min_tokens", { min: 0 });
  if (minTokens !== undefined && maxTokens !== undefined && minTokens > maxTokens) {
    throw badRequest(`'min_tokens' (${minTokens}) must be <= max_tokens (${maxTokens})`, "min_tokens");
  }
  // the most a request may ask is the server's --max-logprobs (checked with the rest of its sampling params)
  const promptLogprobs = optInt(body, "prompt_logprobs", { min: -1 });
  // a stream has no field for them: refused rather than dropped (vLLM's check; 0 asks for none beyond the token's own)
  if (stream && promptLogprobs !== undefined && promptLogprobs !== 0)
    throw badRequest("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs");
  const stopTokenIds = optIntArray(body, "stop_token_ids");
  const allowedTokenIds = optIntArray(body, "allowed_token_ids");
  for (const [name, ids] of [["stop_token_ids", stopTokenIds], ["allowed_token_ids", allowedTokenIds]] as const) {
    if (ids?.some((id) => id < 0 || id >= vocabSize)) throw badRequest(`'${name}' contains a token id outside the vocabulary`, name);
  }
  const cacheSalt = optString(body, "cache_salt", { nonEmpty: true });
  optString(body, "user"); // accepted and ignored, as in vLLM
  const truncate = optInt(body, "truncate_prompt_tokens", { min: -1 });
  const structuredOutputs = parseStructuredOutputs(body);

  const params: Partial<SamplingParams> = {};
  const set = <K extends keyof SamplingParams>(key: K, value: SamplingParams[K] | undefined): void => {
    if (value !== undefined) params[key] = value;
  };
  set("n", n);
  set("temperature", optNumber(body, "temperature", { min: 0 }));
  set("topP", optNumber(body, "top_p", { min: 0, minExclusive: true, max: 1 }));
  set("topK", optInt(body, "top_k", { min: -1 }));
  set("minP", optNumber(body, "min_p", { min: 0, max: 1 }));
  set("presencePenalty", optNumber(body, "presence_penalty", { min: -2, max: 2 }));
  set("frequencyPenalty", optNumber(body, "frequency_penalty", { min: -2, max: 2 }));
  set("repetitionPenalty", optNumber(body, "repetition_penalty", { min: 0, minExclusive: true }));
  set("seed", optSeed(body));
  set("stop", optStop(body));
  set("stopTokenIds", stopTokenIds);
  set("ignoreEos", optBool(body, "ignore_eos"));
  set("minTokens", minTokens);
  set("promptLogprobs", promptLogprobs === -1 ? vocabSize : promptLogprobs);
  set("logitBias", optLogitBias(body, vocabSize));
  set("allowedTokenIds", allowedTokenIds);
  set("badWords", optStringArray(body, "bad_words"));
  set("includeStopStrInOutput", optBool(body, "include_stop_str_in_output"));
  set("skipSpecialTokens", optBool(body, "skip_special_tokens"));
  set("spacesBetweenSpecialTokens", optBool(body, "spaces_between_special_tokens"));
  set("extraArgs", optExtraArgs(body, "vllm_xargs"));
  set("structuredOutputs", structuredOutputs);

  return {
    model,
    stream,
    includeUsage,
    continuousUsageStats,
    maxTokens,
    maxTokensParam: body.max_completion_tokens != null ? "max_completion_tokens" : "max_tokens",
    priority: optInt(body, "priority") ?? 0,
    cacheSalt,
    echo,
    params,
    returnPromptLogprobs: promptLogprobs !== undefined,
    beamSearch: parseBeamSearch(body, stream, params),
    returnTokensAsTokenIds: optBool(body, "return_tokens_as_token_ids"),
    truncatePromptTokens: truncate,
    returnTokenIds: optBool(body, "return_token_ids") ?? false,
  };
}

/**
 * A request's `logits_processors` (vLLM's extra argument: qualified names, or {"qualname": ...}): refused with a 400
 * as vLLM refuses them, naming the server's --logits-processor-pattern; Kiln, as vLLM V1, runs no per-request ones
 * (the engine-level --logits-processors apply to every request).
 */
export function refuseRequestLogitsProcessors(body: Json, pattern: string | null): void {
  const lps = body.logits_processors;
  if (lps === undefined || lps === null || (Array.isArray(lps) && lps.length === 0)) return;
  if (pattern === null)
    throw badRequest("The `logits_processors` argument is not supported by this server: it was started without --logits-processor-pattern", "logits_processors");
  if (!Array.isArray(lps)) throw badRequest("'logits_processors' must be a list of qualified names (or {\"qualname\": ...} objects)", "logits_processors");
  const allowed = new RegExp(`^(?:${pattern})`); // Python's re.match: anchored at the start
  for (const lp of lps) {
    const name: unknown = typeof lp === "object" && lp !== null ? (lp as { qualname?: unknown }).qualname : lp;
    if (typeof name !== "string") throw badRequest("'logits_processors' must be a list of qualified names (or {\"qualname\": ...} objects)", "logits_processors");
    if (!allowed.test(name)) throw badRequest(`Logits processor '${name}' is not allowed by this server's --logits-processor-pattern ${JSON.stringify(pattern)}`, "logits_processors");
  }
  throw badRequest(
    `Per-request logits processors are not supported (as in vLLM V1), though ${JSON.stringify(pattern)} (--logits-processor-pattern) allows them: start the server with --logits-processors instead`,
    "logits_processors",
  );
}

/** The largest prime below 2^52: a seed of 2^52 or more is folded by it. */
const SAFE_SEED_PRIME = 4503599627370449n;

/**
 * `seed`, a 64-bit integer as vLLM takes it (int64's max, 2^63 - 1, reads as 2^63 in a JSON number). One of 2^52 or
 * more (a random 64-bit seed) is folded below 2^52, the same way every time, so it still reproduces and the seeds
 * of its n samples (seed + i, the engine's) stay distinct safe integers.
 */
function optSeed(body: Json): number | undefined {
  const seed = optInt(body, "seed", { min: -(2 ** 63), max: 2 ** 63 });
  return seed === undefined || Math.abs(seed) < 2 ** 52 ? seed : Number(BigInt(seed) % SAFE_SEED_PRIME);
}

/** use_beam_search and length_penalty, as vLLM takes them; what beam search does not serve is refused. */
function parseBeamSearch(body: Json, stream: boolean, params: Partial<SamplingParams>): CommonRequest["beamSearch"] {
  const on = optBool(body, "use_beam_search") ?? false;
  const lengthPenalty = optNumber(body, "length_penalty") ?? 1;
  if (!on) return null;
  const refuse = (what: string, param: string): never => {
    throw badRequest(`use_beam_search cannot be combined with ${what}`, param);
  };
  if (stream) refuse("stream", "stream");
  // (read from the body: the sample logprobs are set after this, a number on completions, a boolean on chat)
  if ((body.logprobs != null && body.logprobs !== false) || params.promptLogprobs != null) refuse("logprobs", "logprobs");
  if (body.echo === true) refuse("echo", "echo");
  return { lengthPenalty };
}

/**
 * Structured output from every field vLLM reads it from: response_format (json_object, json_schema,
 * structural_tag), structured_outputs (vLLM's StructuredOutputsParams, snake_case) and the older guided_json,
 * guided_regex, guided_choice and guided_grammar. The fields are merged into one StructuredOutputsParams; asking
 * for two kinds at once is refused when the params are normalized (vLLM's "only one kind" error).
 */
function parseStructuredOutputs(body: Json): StructuredOutputsParams | undefined {
  const out: StructuredOutputsParams = {};
  const put = <K extends keyof StructuredOutputsParams>(key: K, value: StructuredOutputsParams[K] | undefined, param: string): void => {
    if (value === undefined || value === null) return;
    if (out[key] !== undefined) throw badRequest(`structured output '${WIRE_NAME[key]}' is given twice`, param);
    out[key] = value;
  };
  const format = optObject(body, "response_format");
  if (format !== undefined) {
    const type = format.type;
    if (type === "json_object") put("jsonObject", true, "response_format");
    else if (type === "json_schema") {
      const js = optObject(format, "json_schema");
      if (js === undefined) throw badRequest("'response_format.json_schema' must be given for type 'json_schema'", "response_format");
      if (typeof js.name !== "string" || js.name.length === 0) throw badRequest("'response_format.json_schema.name' must be a non-empty string", "response_format");
      if (js.strict != null && typeof js.strict !== "boolean") throw badRequest("'response_format.json_schema.strict' must be a boolean", "response_format");
      const schema = js.schema ?? js.json_schema;
      if (typeof schema !== "object" || schema === null || Array.isArray(schema))
        throw badRequest("'response_format.json_schema.schema' must be a JSON schema object", "response_format");
      put("json", schema as Record<string, unknown>, "response_format");
    } else if (type === "structural_tag") put("structuralTag", structuralTag(format), "response_format");
    else if (type !== "text")
      throw badRequest("'response_format.type' must be one of 'text', 'json_object', 'json_schema' or 'structural_tag'", "response_format");
  }
  const so = optObject(body, "structured_outputs");
  if (so !== undefined) {
    for (const k of Object.keys(so)) {
      if (k === "whitespace_pattern") {
        if (so[k] !== null && so[k] !== undefined)
          throw badRequest("'structured_outputs.whitespace_pattern' is not supported by the xgrammar backend", "structured_outputs");
        continue;
      }
      if (!(k in STRUCTURED_OUTPUTS_FIELDS)) {
        throw badRequest(`'structured_outputs.${k}' is not supported (expected one of ${Object.keys(STRUCTURED_OUTPUTS_FIELDS).join(", ")})`, "structured_outputs");
      }
      const v = so[k];
      if (v === undefined || v === null) continue;
      put(STRUCTURED_OUTPUTS_FIELDS[k]!, v as never, "structured_outputs"); // the values are checked when the params are normalized
    }
  }
  const guided = body.guided_json;
  if (guided !== undefined && guided !== null) put("json", guided as string | Record<string, unknown>, "guided_json");
  put("regex", optString(body, "guided_regex"), "guided_regex");
  put("choice", optStringArray(body, "guided_choice"), "guided_choice");
  put("grammar", optString(body, "guided_grammar"), "guided_grammar");
  // vLLM's older name of structured_outputs.whitespace_pattern, refused as it is
  if (optString(body, "guided_whitespace_pattern") !== undefined)
    throw badRequest("'guided_whitespace_pattern' is not supported by the xgrammar backend", "guided_whitespace_pattern");
  const backend = optString(body, "guided_decoding_backend");
  if (backend !== undefined && !["xgrammar", "auto"].includes(backend))
    throw badRequest(`'guided_decoding_backend' ${JSON.stringify(backend)} is not available: Kiln's backend is xgrammar`, "guided_decoding_backend");
  if (optBool(body, "guided_json_object") === true) put("jsonObject", true, "guided_json_object");
  return Object.keys(out).length > 0 ? out : undefined;
}

/** structured_outputs' wire fields and their StructuredOutputsParams names. */
const STRUCTURED_OUTPUTS_FIELDS: Record<string, keyof StructuredOutputsParams> = {
  json: "json",
  regex: "regex",
  choice: "choice",
  grammar: "grammar",
  json_object: "jsonObject",
  structural_tag: "structuralTag",
  disable_any_whitespace: "disableAnyWhitespace",
  disable_additional_properties: "disableAdditionalProperties",
  disable_fallback: "disableFallback",
};
const WIRE_NAME = Object.fromEntries(Object.entries(STRUCTURED_OUTPUTS_FIELDS).map(([wire, key]) => [key, wire])) as Record<string, string>;

/**
 * A structural_tag response_format as xgrammar reads it: {"type": "structural_tag", "format": ...}, or vLLM's
 * older {"structures": [{begin, schema, end}], "triggers": [...]}, turned into the triggered-tags format.
 */
function structuralTag(format: Json): Record<string, unknown> {
  if (format.format !== undefined) return { type: "structural_tag", format: format.format };
  const structures = format.structures;
  const triggers = format.triggers;
  if (!Array.isArray(structures) || !Array.isArray(triggers) || !triggers.every((t) => typeof t === "string"))
    throw badRequest("a structural_tag response_format needs 'format', or 'structures' and 'triggers' lists", "response_format");
  const tags = structures.map((st: unknown, i) => {
    const o = st as Json | null;
    if (typeof o !== "object" || o === null || typeof o.begin !== "string" || typeof o.end !== "string")
      throw badRequest(`'response_format.structures[${i}]' must have string 'begin' and 'end'`, "response_format");
    const schema = o.schema ?? {};
    return { type: "tag", begin: o.begin, content: { type: "json_schema", json_schema: schema }, end: o.end };
  });
  return { type: "structural_tag", format: { type: "triggered_tags", triggers, tags } };
}

/** The tool_choice of a chat request: plain text (none), or a tool call constrained by structured output. */
export type ToolChoice = { kind: "none" } | { kind: "auto" } | { kind: "required" } | { kind: "named"; name: string };

/** A tool call's JSON schema for the argument object of a function (an object of no properties when unset). */
const parametersSchema = (fn: Json): Record<string, unknown> =>
  typeof fn.parameters === "object" && fn.parameters !== null && Object.keys(fn.parameters).length > 0
    ? (fn.parameters as Record<string, unknown>)
    : { type: "object", properties: {} }; // {} is no schema, as in vLLM: the arguments are still an object

/**
 * tools and tool_choice as vLLM validates them: tool_choice defaults to "auto" when tools are given, else "none".
 * "required" and a named function are served as vLLM serves them, by structured output: a named function's
 * arguments follow its parameters schema; "required" is a JSON list of {name, parameters} of the given tools.
 * "auto" needs a tool-call parser (vLLM's --enable-auto-tool-choice --tool-call-parser): without one, a 400.
 */
function parseTools(body: Json, autoTools: boolean): { tools: unknown[] | undefined; toolChoice: ToolChoice; toolSchema?: Record<string, unknown> } {
  const tools = body.tools;
  if (tools !== undefined && tools !== null && !Array.isArray(tools)) throw badRequest("'tools' must be a list", "tools");
  if (Array.isArray(tools) && tools.length === 0) throw badRequest("'tools' must not be an empty array", "tools");
  const fns = new Map<string, Json>();
  (tools ?? []).forEach((t: unknown, i: number) => {
    const fn = (t as Json | null)?.function as Json | null | undefined;
    if (typeof t !== "object" || t === null || (t as Json).type !== "function" || typeof fn !== "object" || fn === null ||
        typeof fn.name !== "string" || !fn.name) {
      throw badRequest(`'tools[${i}]' must be {"type": "function", "function": {"name": ...}}`, "tools");
    }
    if (fn.parameters !== undefined && fn.parameters !== null && (typeof fn.parameters !== "object" || Array.isArray(fn.parameters)))
      throw badRequest(`'tools[${i}].function.parameters' must be a JSON schema object`, "tools");
    fns.set(fn.name, fn);
  });
  const choice = body.tool_choice;
  const list = (tools as unknown[] | null | undefined) ?? undefined;
  if (choice === undefined || choice === null) {
    if (!tools) return { tools: undefined, toolChoice: { kind: "none" } };
    if (!autoTools) throw badRequest(AUTO_TOOLS, "tool_choice");
    return { tools: list, toolChoice: { kind: "auto" } };
  }
  let named: string | undefined;
  if (typeof choice === "object" && !Array.isArray(choice)) {
    const fn = (choice as Json).function as Json | null | undefined;
    if ((choice as Json).type !== "function" || typeof fn !== "object" || fn === null || typeof fn.name !== "string") {
      throw badRequest(BAD_TOOL_CHOICE, "tool_choice");
    }
    named = fn.name;
  } else if (choice !== "none" && choice !== "auto" && choice !== "required") {
    throw badRequest(BAD_TOOL_CHOICE, "tool_choice");
  }
  if (choice === "none") return { tools: list, toolChoice: { kind: "none" } };
  if (!tools) throw badRequest("When using `tool_choice`, `tools` must be set.", "tool_choice");
  if (choice === "auto") {
    if (!autoTools) throw badRequest(AUTO_TOOLS, "tool_choice");
    return { tools: list, toolChoice: { kind: "auto" } };
  }
  if (named !== undefined) {
    const fn = fns.get(named);
    if (fn === undefined) throw badRequest(`Tool '${named}' has not been passed in \`tools\`.`, "tool_choice");
    return { tools: list, toolChoice: { kind: "named", name: named }, toolSchema: parametersSchema(fn) };
  }
  // vLLM's schema for "required": at least one call, each naming one of the tools with that tool's parameters; the
  // tools' $defs move to the top, where their "#/$defs/..." references point from there (vLLM's get_tool_schema_defs)
  const defs: Record<string, unknown> = {};
  const anyOf = [...fns.values()].map((fn) => {
    const { $defs, ...params } = parametersSchema(fn);
    for (const [k, v] of Object.entries(($defs ?? {}) as Record<string, unknown>)) {
      if (k in defs && JSON.stringify(defs[k]) !== JSON.stringify(v))
        throw badRequest(`Tool definition '${k}' has multiple schemas, which is not supported.`, "tools");
      defs[k] = v;
    }
    return { properties: { name: { type: "string", enum: [fn.name] }, parameters: params }, required: ["name", "parameters"] };
  });
  const toolSchema = { type: "array", minItems: 1, items: { type: "object", anyOf }, ...(Object.keys(defs).length > 0 ? { $defs: defs } : {}) };
  return { tools: list, toolChoice: { kind: "required" }, toolSchema };
}

const BAD_TOOL_CHOICE = `'tool_choice' must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}`;
const AUTO_TOOLS = '"auto" tool choice (the default when tools are given) requires --enable-auto-tool-choice and ' +
  '--tool-call-parser to be set; or use tool_choice "required", a named function, or "none"';

/** The messages of an API that takes no images: an image part is a 400 naming it. */
export function parseMessages(body: Json): ChatMessage[] {
  const { messages, images } = parseMessagesWithImages(body);
  if (images.length > 0) throw badRequest("this endpoint takes no images (the chat, Responses and Messages APIs do)", images[0]!.param);
  return messages;
}

/** The messages, and their image_url parts in order (models/chat-images.ts reads them); its errors as 400s naming the field. */
export function parseMessagesWithImages(body: Json): { messages: ChatMessage[]; images: ChatImage[] } {
  try {
    return readWireMessages(body.messages);
  } catch (e) {
    if (e instanceof ChatInputError) throw badRequest(e.message, e.param);
    throw e;
  }
}


/**
 * A request's own chat template (`chat_template`, or `chat_template_kwargs.chat_template`), refused with vLLM's 400
 * unless the server trusts them (--trust-request-chat-template): a template is Jinja the server would run.
 */
export function requestChatTemplate(body: Record<string, unknown>, trusted: boolean): string | undefined {
  const own = optString(body, "chat_template");
  const kwargs = optObject(body, "chat_template_kwargs");
  const inKwargs = kwargs?.chat_template;
  if (inKwargs !== undefined && inKwargs !== null && typeof inKwargs !== "string")
    throw badRequest("'chat_template_kwargs.chat_template' must be a string", "chat_template_kwargs");
  if (!trusted && (own !== undefined || (inKwargs !== undefined && inKwargs !== null)))
    throw badRequest(
      "Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template.",
      own !== undefined ? "chat_template" : "chat_template_kwargs",
    );
  return own ?? (typeof inKwargs === "string" ? inKwargs : undefined);
}

/**
 * `autoTools`: the server has a tool-call parser, so tool_choice "auto" is served; `trustChatTemplate`: a request may
 * bring its own chat template (--trust-request-chat-template).
 */
export function parseChatRequest(raw: unknown, vocabSize: number, { autoTools = false, trustChatTemplate = false } = {}): ChatRequest {
  const body = asJsonBody(raw);
  const chatTemplate = requestChatTemplate(body, trustChatTemplate);
  const { messages, images } = parseMessagesWithImages(body);
  const common = parseCommon(body, vocabSize);
  const wantLogprobs = optBool(body, "logprobs") ?? false;
  // -1: the whole vocabulary, as vLLM (then over the server's --max-logprobs unless that is -1 too)
  const topLogprobsIn = optInt(body, "top_logprobs", { min: -1 });
  const topLogprobs = topLogprobsIn === -1 ? vocabSize : topLogprobsIn;
  if (topLogprobs !== undefined && topLogprobs !== 0 && !wantLogprobs) {
    throw badRequest("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs");
  }
  const addGenerationPrompt = optBool(body, "add_generation_prompt") ?? true;
  const continueFinalMessage = optBool(body, "continue_final_message") ?? false;
  if (addGenerationPrompt && continueFinalMessage) {
    throw badRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.", "continue_final_message");
  }
  const { tools, toolChoice, toolSchema } = parseTools(body, autoTools);
  // the parser reads the calls' markers, which a tokenizer may hold as special tokens: with tools and any tool_choice
  // but "none", special tokens stay in the text (vLLM's adjust_request)
  if (tools !== undefined && toolChoice.kind !== "none" && common.params.skipSpecialTokens === undefined) common.params.skipSpecialTokens = false;
  if (toolSchema !== undefined) {
    // structured_outputs may still set how (disable_any_whitespace), not what
    const { disableAnyWhitespace, ...other } = common.params.structuredOutputs ?? {};
    if (Object.keys(other).length > 0)
      throw badRequest("tool_choice \"required\" or a named function cannot be combined with another structured output", "tool_choice");
    common.params.structuredOutputs = { json: toolSchema, ...(disableAnyWhitespace !== undefined ? { disableAnyWhitespace } : {}) };
  }
  const chatTemplateKwargs = optObject(body, "chat_template_kwargs");
  const mmProcessorKwargs = optObject(body, "mm_processor_kwargs");
  try {
    applyMmProcessorKwargs(PAN_AND_SCAN_DEFAULTS, mmProcessorKwargs);
  } catch (e) {
    if (e instanceof MmProcessorKwargsError) throw badRequest(e.message, "mm_processor_kwargs");
    throw e;
  }
  const topLp = wantLogprobs ? (topLogprobs ?? 0) : null;
  if (topLp !== null) common.params.logprobs = topLp;
  return {
    ...common,
    messages,
    images,
    addGenerationPrompt,
    continueFinalMessage,
    chatTemplate,
    chatTemplateKwargs,
    ...(mmProcessorKwargs !== undefined ? { mmProcessorKwargs } : {}),
    tools,
    toolChoice,
    topLogprobs: topLp,
    includeReasoning: optBool(body, "include_reasoning") ?? true,
    parallelToolCalls: optBool(body, "parallel_tool_calls") ?? true,
  };
}

/** `field` (completions' prompt, embeddings' input): a string, strings, token ids or token id lists. */
export function parsePrompts(body: Json, vocabSize: number, field = "prompt"): PromptInput[] {
  const p = body[field];
  const bad = () => badRequest(`'${field}' must be a string, a list of strings, a list of token ids or a list of token id lists`, field);
  const checkIds = (ids: unknown[]): number[] => {
    for (const id of ids) {
      if (!Number.isInteger(id)) throw bad();
      if ((id as number) < 0 || (id as number) >= vocabSize) throw badRequest(`Token id ${id} is out of vocabulary`, field);
    }
    return ids as number[];
  };
  if (typeof p === "string") return [{ text: p }];
  if (!Array.isArray(p) || p.length === 0) throw p === undefined ? badRequest(`'${field}' is required`, field) : bad();
  if (p.every((x) => typeof x === "string")) return (p as string[]).map((text) => ({ text }));
  if (p.every((x) => typeof x === "number")) return [{ tokenIds: checkIds(p) }];
  if (p.every((x) => Array.isArray(x))) {
    return (p as unknown[][]).map((ids) => {
      if (ids.length === 0) throw badRequest(`'${field}' token lists must not be empty`, field);
      return { tokenIds: checkIds(ids) };
    });
  }
  throw bad();
}

export function parseCompletionRequest(raw: unknown, vocabSize: number): CompletionRequest {
  const body = asJsonBody(raw);
  const embeds = body.prompt_embeds ?? null;
  const promptEmbeds = embeds === null ? [] : typeof embeds === "string" ? [embeds] : embeds;
  if (!Array.isArray(promptEmbeds) || !promptEmbeds.every((e) => typeof e === "string" && e.length > 0))
    throw badRequest("'prompt_embeds' must be a base64 string or a list of them", "prompt_embeds");
  // with prompt_embeds the prompt may be left out (vLLM's: embeddings first, then any prompts)
  const noPrompt = body.prompt === undefined || body.prompt === null || (Array.isArray(body.prompt) && body.prompt.length === 0);
  const prompts = promptEmbeds.length > 0 && noPrompt ? [] : parsePrompts(body, vocabSize);
  if (body.suffix !== undefined && body.suffix !== null) throw badRequest("'suffix' is not currently supported", "suffix");
  const common = parseCommon(body, vocabSize, { allowEchoOnly: true });
  const echoOnly = common.maxTokens === 0;
  if (echoOnly) common.maxTokens = 1;
  const logprobsIn = optInt(body, "logprobs", { min: -1 }) ?? null;
  const logprobs = logprobsIn === -1 ? vocabSize : logprobsIn; // -1: the whole vocabulary, as vLLM
  if (logprobs !== null) common.params.logprobs = logprobs;
  if (common.echo && logprobs !== null && common.params.promptLogprobs === undefined) common.params.promptLogprobs = logprobs;
  // an explicit null max_tokens is vLLM's None (the room left, capped by the generation config), not the default 16
  const nullMax = body.max_tokens === null || body.max_completion_tokens === null;
  return {
    ...common, echoOnly, maxTokensDefault: nullMax ? undefined : COMPLETIONS_MAX_TOKENS, prompts, promptEmbeds: promptEmbeds as string[], logprobs,
    addSpecialTokens: optBool(body, "add_special_tokens") ?? true,
  };
}
