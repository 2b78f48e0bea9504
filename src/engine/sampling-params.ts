// vLLM SamplingParams defaults and validation (vllm/sampling_params.py `_verify_args`), one typed error per parameter.
import { existsSync, statSync } from "node:fs";
import { join } from "node:path";
import { EngineInputError } from "./errors.js";
import { camelCaseHint } from "../util/names.js";
import { loadGenerationConfig, parseGenerationConfig, type GenerationConfig } from "../models/tokenizer.js";
import { checkStructuredOutputSpec, structuredOutputSpec } from "./structured-output.js";
import type { ExtraArgs, SamplingParams, StructuredOutputsParams } from "./types.js";

/** Below this temperature a request is greedy (vLLM's _SAMPLING_EPS). */
export const SAMPLING_EPS = 1e-5;

/** vLLM's default `max_logprobs` (model config): the largest `logprobs` / `prompt_logprobs` accepted. */
export const DEFAULT_MAX_LOGPROBS = 20;

/**
 * The sampling defaults a model's generation_config.json sets (vLLM's get_diff_sampling_param): temperature, top_p,
 * top_k, min_p, repetition_penalty, and max_new_tokens as maxTokens; undefined when it sets none.
 */
export function generationConfigDefaults(gen: GenerationConfig | null): Partial<SamplingParams> | undefined {
  if (!gen) return undefined;
  const out: Partial<SamplingParams> = {};
  if (gen.temperature !== undefined) out.temperature = gen.temperature;
  if (gen.topP !== undefined) out.topP = gen.topP;
  if (gen.topK !== undefined) out.topK = gen.topK;
  if (gen.minP !== undefined) out.minP = gen.minP;
  if (gen.repetitionPenalty !== undefined) out.repetitionPenalty = gen.repetitionPenalty;
  if (gen.maxNewTokens !== undefined) out.maxTokens = gen.maxNewTokens;
  return Object.keys(out).length ? out : undefined;
}

/** The generation_config.json keys vLLM reads as sampling defaults (get_diff_sampling_param), each value's rule. */
export const GENERATION_OVERRIDE_KEYS: Readonly<Record<string, { ok: (v: number) => boolean; rule: string }>> = {
  temperature: { ok: (v) => v >= 0, rule: "a number >= 0" },
  top_p: { ok: (v) => v > 0 && v <= 1, rule: "a number in (0, 1]" },
  top_k: { ok: (v) => Number.isInteger(v) && v >= -1, rule: "an integer >= -1" },
  min_p: { ok: (v) => v >= 0 && v <= 1, rule: "a number in [0, 1]" },
  repetition_penalty: { ok: (v) => v > 0, rule: "a number > 0" },
  max_new_tokens: { ok: (v) => Number.isInteger(v) && v >= 1, rule: "an integer >= 1" },
};

/** Why `mode` is no generation config source ('auto', 'vllm' or a directory holding generation_config.json), or null. */
export function generationConfigSourceError(mode: string): string | null {
  if (mode === "auto" || mode === "vllm") return null;
  if (!(existsSync(mode) && statSync(mode).isDirectory())) return `must be 'auto', 'vllm' or an existing directory, got ${JSON.stringify(mode)}`;
  if (!existsSync(join(mode, "generation_config.json"))) return `${JSON.stringify(mode)}: the directory has no generation_config.json`;
  return null;
}

/** Why `override` is no generation config override (GENERATION_OVERRIDE_KEYS, each a valid value or null), or null. */
export function generationOverrideError(override: Record<string, unknown>): string | null {
  for (const [k, v] of Object.entries(override)) {
    const key = GENERATION_OVERRIDE_KEYS[k];
    if (key === undefined) return `${JSON.stringify(k)} is not a sampling default (${Object.keys(GENERATION_OVERRIDE_KEYS).join(", ")})`;
    if (v !== null && !(typeof v === "number" && Number.isFinite(v) && key.ok(v))) return `${k} must be ${key.rule} or null, got ${JSON.stringify(v)}`;
  }
  return null;
}

/**
 * vLLM's --generation-config: "auto" applies the model's generation_config.json sampling defaults, "vllm" ignores
 * them, and a directory applies its own generation_config.json's; --override-generation-config's keys go over any
 * of them (a null unsets one), as vLLM's get_diff_sampling_param merges them.
 */
export function generationDefaults(
  mode: string, modelGen: GenerationConfig | null, override: Record<string, unknown> = {},
): Partial<SamplingParams> | undefined {
  const base = mode === "vllm" ? null : mode === "auto" ? modelGen : loadGenerationConfig(mode);
  if (Object.keys(override).length === 0) return generationConfigDefaults(base);
  return generationConfigDefaults(parseGenerationConfig({ ...(base?.raw ?? {}), ...override }));
}

/** vLLM's SamplingParams defaults (max_tokens=16 as in vLLM's Python class; the server passes its own). */
export function defaultSamplingParams(): SamplingParams {
  return {
    n: 1,
    temperature: 1.0,
    topP: 1.0,
    topK: 0,
    minP: 0.0,
    presencePenalty: 0.0,
    frequencyPenalty: 0.0,
    repetitionPenalty: 1.0,
    seed: null,
    stop: [],
    stopTokenIds: [],
    ignoreEos: false,
    maxTokens: 16,
    minTokens: 0,
    logprobs: null,
    promptLogprobs: null,
    logitBias: null,
    allowedTokenIds: null,
    badWords: null,
    includeStopStrInOutput: false,
    skipSpecialTokens: true,
    spacesBetweenSpecialTokens: true,
    detokenize: true,
    truncatePromptTokens: null,
    logitsProcessors: [],
    extraArgs: null,
    structuredOutputs: null,
    pooling: null,
  };
}

export interface NormalizeOptions {
  /** Largest accepted `logprobs` / `prompt_logprobs` (vLLM `--max-logprobs`, default 20). */
  maxLogprobs?: number;
  /** When known, token ids in stop_token_ids / logit_bias / allowed_token_ids are checked against it. */
  vocabSize?: number;
}

const isInt = (x: unknown): x is number => typeof x === "number" && Number.isInteger(x);
const isNum = (x: unknown): x is number => typeof x === "number" && Number.isFinite(x);
/** A refused value as the message shows it: a string quoted, so "0.5" does not read as the valid number 0.5. */
const shown = (x: unknown): string => (typeof x === "string" ? JSON.stringify(x) : String(x));

function need(cond: boolean, param: string, message: string): void {
  if (!cond) throw new EngineInputError(param, message);
}

/**
 * Fills vLLM defaults into a partial SamplingParams and validates every field with vLLM's rules.
 * Throws {@link EngineInputError} naming the parameter (snake_case, as on the wire).
 *
 * @example
 * const p = normalizeSamplingParams({ temperature: 0, maxTokens: 8 }); // p.topP === 1, p.n === 1
 */
export function normalizeSamplingParams(partial: Partial<SamplingParams> = {}, options: NormalizeOptions = {}): SamplingParams {
  const p: SamplingParams = { ...defaultSamplingParams() };
  for (const [k, v] of Object.entries(partial)) {
    // vLLM's SamplingParams(max_token=...) is a TypeError; a key here that is silently dropped would be worse
    if (!(k in p)) throw new EngineInputError(k, `is not a sampling parameter${camelCaseHint(k, (name) => name in p)}`);
    if (v !== undefined) (p as unknown as Record<string, unknown>)[k] = v;
  }
  // Copy arrays so later edits by the caller don't reach a running request.
  p.stop = typeof p.stop === "string" ? [p.stop] : [...(p.stop ?? [])];
  p.stopTokenIds = [...(p.stopTokenIds ?? [])];
  p.logitsProcessors = [...(p.logitsProcessors ?? [])];
  const maxLogprobs = options.maxLogprobs ?? DEFAULT_MAX_LOGPROBS;
  const vocab = options.vocabSize;
  const tokenOk = (t: unknown): boolean => isInt(t) && t >= 0 && (vocab === undefined || t < vocab);

  need(isInt(p.n) && p.n >= 1, "n", `must be an integer >= 1, got ${shown(p.n)}`);
  need(
    isNum(p.presencePenalty) && p.presencePenalty >= -2 && p.presencePenalty <= 2,
    "presence_penalty",
    `must be in [-2, 2], got ${shown(p.presencePenalty)}`,
  );
  need(
    isNum(p.frequencyPenalty) && p.frequencyPenalty >= -2 && p.frequencyPenalty <= 2,
    "frequency_penalty",
    `must be in [-2, 2], got ${shown(p.frequencyPenalty)}`,
  );
  need(isNum(p.repetitionPenalty) && p.repetitionPenalty > 0, "repetition_penalty", `must be > 0, got ${shown(p.repetitionPenalty)}`);
  need(isNum(p.temperature) && p.temperature >= 0, "temperature", `must be a finite number >= 0, got ${shown(p.temperature)}`);
  need(isNum(p.topP) && p.topP > 0 && p.topP <= 1, "top_p", `must be in (0, 1], got ${shown(p.topP)}`);
  need(isInt(p.topK) && (p.topK === -1 || p.topK >= 0), "top_k", `must be 0 or -1 (disable), or at least 1, got ${shown(p.topK)}`);
  if (p.topK === -1) p.topK = 0; // vLLM normalizes -1 to 0 (disabled)
  need(isNum(p.minP) && p.minP >= 0 && p.minP <= 1, "min_p", `must be in [0, 1], got ${shown(p.minP)}`);
  need(p.seed === null || (isInt(p.seed) && Number.isSafeInteger(p.seed)), "seed", `must be an integer or null, got ${shown(p.seed)}`);
  need(p.maxTokens === null || (isInt(p.maxTokens) && p.maxTokens >= 1), "max_tokens", `must be an integer >= 1, got ${shown(p.maxTokens)}`);
  need(isInt(p.minTokens) && p.minTokens >= 0, "min_tokens", `must be an integer >= 0, got ${shown(p.minTokens)}`);
  need(p.maxTokens === null || p.minTokens <= p.maxTokens, "min_tokens", `must be <= max_tokens=${p.maxTokens}, got ${shown(p.minTokens)}`);
  need(p.logprobs === null || (isInt(p.logprobs) && p.logprobs >= 0), "logprobs", `must be an integer >= 0, got ${shown(p.logprobs)}`);
  // vLLM's text (SamplingParams._validate_logprobs)
  need(p.logprobs === null || p.logprobs <= maxLogprobs, "logprobs", `Requested sample logprobs of ${p.logprobs}, which is greater than max allowed: ${maxLogprobs}`);
  need(
    p.promptLogprobs === null || (isInt(p.promptLogprobs) && p.promptLogprobs >= 0),
    "prompt_logprobs",
    `must be an integer >= 0, got ${shown(p.promptLogprobs)}`,
  );
  need(
    p.promptLogprobs === null || p.promptLogprobs <= maxLogprobs,
    "prompt_logprobs",
    `Requested prompt logprobs of ${p.promptLogprobs}, which is greater than max allowed: ${maxLogprobs}`,
  );
  need(
    p.truncatePromptTokens === null || (isInt(p.truncatePromptTokens) && p.truncatePromptTokens >= 1),
    "truncate_prompt_tokens",
    `must be an integer >= 1, got ${shown(p.truncatePromptTokens)}`,
  );
  need(Array.isArray(p.stop) && p.stop.every((s) => typeof s === "string"), "stop", "must be a string or a list of strings");
  need(
    p.stop.every((s) => s.length > 0),
    "stop",
    "cannot contain an empty string",
  );
  // stop strings are searched in the text, which detokenize false does not make (vLLM refuses them too)
  need(p.detokenize !== false || p.stop.length === 0, "stop", "stop strings are only supported when detokenize is true");
  need(
    p.stopTokenIds.every(tokenOk),
    "stop_token_ids",
    `must be token ids in [0, ${vocab ?? "vocab"}), got ${JSON.stringify(p.stopTokenIds)}`,
  );
  if (p.logitBias !== null) {
    need(typeof p.logitBias === "object", "logit_bias", "must be a map of token id -> bias");
    for (const [k, v] of Object.entries(p.logitBias)) {
      need(tokenOk(Number(k)), "logit_bias", `token id ${k} is out of vocabulary range`);
      need(isNum(v), "logit_bias", `bias for token ${k} must be a finite number, got ${shown(v)}`);
    }
  }
  if (p.allowedTokenIds !== null) {
    need(Array.isArray(p.allowedTokenIds) && p.allowedTokenIds.length > 0, "allowed_token_ids", "must be a non-empty list of token ids");
    need(p.allowedTokenIds.every(tokenOk), "allowed_token_ids", "contains a token id out of vocabulary range");
    p.allowedTokenIds = [...p.allowedTokenIds];
  }
  if (p.badWords !== null) {
    need(
      Array.isArray(p.badWords) && p.badWords.every((w) => typeof w === "string" && w.length > 0),
      "bad_words",
      "must be a list of non-empty strings",
    );
    p.badWords = [...p.badWords];
  }
  need(
    p.logitsProcessors.every((f) => typeof f === "function"),
    "logits_processors",
    "must be functions",
  );
  if (p.extraArgs !== null) p.extraArgs = copyExtraArgs(p.extraArgs);
  p.structuredOutputs = normalizeStructuredOutputs(p.structuredOutputs);
  if (p.pooling !== null) {
    need(typeof p.pooling === "object" && !Array.isArray(p.pooling), "pooling", "must be an object {normalize?, activation?}");
    for (const [k, v] of Object.entries(p.pooling)) {
      need(k === "normalize" || k === "activation", "pooling", `has no field ${JSON.stringify(k)} (normalize, activation)`);
      need(v === undefined || v === null || typeof v === "boolean", `pooling.${k}`, "must be a boolean");
    }
    p.pooling = { ...p.pooling };
  }
  for (const k of ["ignoreEos", "includeStopStrInOutput", "skipSpecialTokens", "spacesBetweenSpecialTokens", "detokenize"] as const) {
    need(
      typeof p[k] === "boolean",
      k.replace(/[A-Z]/g, (c) => "_" + c.toLowerCase()),
      "must be a boolean",
    );
  }
  if (p.temperature < SAMPLING_EPS) {
    // Greedy: vLLM resets the truncation knobs so they cannot change the argmax.
    p.topP = 1.0;
    p.topK = 0;
    p.minP = 0.0;
  }
  return p;
}

/**
 * The params' structured output as one checked field (a JSON schema as text), or null: a bad schema, regex or
 * grammar is an EngineInputError here, before the request is queued.
 */
function normalizeStructuredOutputs(so: StructuredOutputsParams | null): StructuredOutputsParams | null {
  const spec = structuredOutputSpec(so);
  if (spec === null) return null;
  checkStructuredOutputSpec(spec);
  const dw = { disableAnyWhitespace: !spec.anyWhitespace };
  switch (spec.kind) {
    case "json":
      return { json: spec.source, ...dw };
    case "json_object":
      return { jsonObject: true, ...dw };
    case "regex":
      return { regex: spec.source, ...dw };
    case "choice":
      return { choice: [...so!.choice!], ...dw };
    case "grammar":
      return { grammar: spec.source, ...dw };
    case "structural_tag":
      return { structuralTag: spec.source, ...dw, ...(spec.harmonyReply === true ? { harmonyReply: true } : {}) };
  }
}

const isPlainObject = (x: unknown): x is Record<string, unknown> =>
  typeof x === "object" && x !== null && !Array.isArray(x) && [Object.prototype, null].includes(Object.getPrototypeOf(x) as object | null);

/** Deep copy of extra_args, checking it is JSON-like data (strings, numbers, booleans, null, lists, objects). */
function copyExtraArgs(x: unknown): ExtraArgs {
  need(isPlainObject(x), "extra_args", "must be an object of key -> JSON value");
  const copy = (v: unknown, where: string, depth: number): unknown => {
    need(depth <= 32, "extra_args", `is nested too deeply at ${where}`);
    if (v === null || typeof v === "string" || typeof v === "boolean") return v;
    if (typeof v === "number") {
      need(Number.isFinite(v), "extra_args", `${where} must be a finite number, got ${v}`);
      return v;
    }
    if (Array.isArray(v)) return v.map((e, i) => copy(e, `${where}[${i}]`, depth + 1));
    need(isPlainObject(v), "extra_args", `${where} must be a string, number, boolean, null, list or object, got ${typeof v}`);
    return Object.fromEntries(Object.entries(v as Record<string, unknown>).map(([k, e]) => [k, copy(e, `${where}.${k}`, depth + 1)]));
  };
  return copy(x, "extra_args", 0) as ExtraArgs;
}

/** True when the request samples greedily (argmax). */
export const isGreedy = (p: SamplingParams): boolean => p.temperature < SAMPLING_EPS;
