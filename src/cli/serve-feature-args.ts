// `kiln serve` flags that turn optional engine features on, most as vLLM's JSON --*-config values: the pooling
// runner, speculative decoding, KV-cache events, P/D disaggregation, structured output and reasoning parsing.
import { hostname } from "node:os";
import { Option, type Command } from "commander";
import { isPoolingType } from "../engine/model-runner.js";
import { parseKvEventsConfig, type KvEventsConfig } from "../engine/kv-events.js";
import { resolveSpeculativeConfig, type SpeculativeConfig } from "../engine/speculative.js";
import { REASONING_PARSERS, type ReasoningParserName } from "../server/reasoning-parsers.js";
import { parseKvTransferConfig, type KvTransferConfig } from "../server/kv-transfer.js";
import { jsonObjectFlag, oneOf } from "./serve-flag-values.js";
import { CliUsageError } from "./usage-error.js";

export interface FeatureArgs {
  /** vLLM --runner (or the older --task embed): "pooling" serves /v1/embeddings instead of generating. */
  runner: "generate" | "pooling";
  /** vLLM --pooler-config (--override-pooler-config): pooling_type and normalize, or null for the model's default. */
  poolerConfig: { poolingType?: "LAST" | "MEAN" | "CLS"; normalize?: boolean } | null;
  /** vLLM --speculative-config (n-gram drafts, a draft model or an EAGLE head), or null. */
  speculativeConfig: SpeculativeConfig | null;
  /** vLLM --kv-events-config: prefix-cache block events published over NATS (engine_id defaults to the served URL); null = off. */
  kvEventsConfig: KvEventsConfig | null;
  /** vLLM --kv-transfer-config: prefill/decode disaggregation over Kiln's K/V side channel (server/kv-transfer.ts); null = off. */
  kvTransferConfig: KvTransferConfig | null;
  /** Structured output's default for requests that do not say (vLLM --structured-outputs-config disable_any_whitespace). */
  disableAnyWhitespace: boolean;
  /**
   * vLLM --reasoning-parser: chat replies split into reasoning and content; null = none. openai_gptoss names gpt-oss's
   * (Harmony's analysis channel, read by the server for gpt-oss with or without it).
   */
  reasoningParser: ServeReasoningParser | null;
}

/** --reasoning-parser's names: the engine's (<think>, [THINK] or Granite's phrases) and gpt-oss's, which only the server reads. */
export const SERVE_REASONING_PARSERS = [...REASONING_PARSERS, "openai_gptoss"] as const;
export type ServeReasoningParser = ReasoningParserName | "openai_gptoss";

/** Declares the feature flags on `cmd` (the engine's on serve, generate and chat; the structured output ones on serve). */
export function addFeatureOptions(cmd: Command): Command {
  return cmd
    .option("--speculative-config <json>", 'speculative decoding as JSON: {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}, a draft model: {"model": "path/to/small-model", "num_speculative_tokens": 3}, or an EAGLE head: {"method": "eagle3", "model": "path/to/head", "num_speculative_tokens": 3}')
    .option(
      "--kv-events-config <json>",
      'publish KV-cache events as JSON: {"enable_kv_cache_events": true, "publisher": "nats", "endpoint": "nats://127.0.0.1:4222", "topic": "kv-events"}',
    )
    .option(
      "--kv-transfer-config <json>",
      'P/D disaggregation as JSON: {"kv_connector": "KilnConnector", "kv_role": "kv_both", "kv_ip": "127.0.0.1", "kv_port": 14579} (NixlConnector is taken as KilnConnector)',
    )
    .addOption(new Option("--runner <runner>", "generate text, or pool prompts into embeddings (/v1/embeddings)").choices(["auto", "generate", "pooling"]))
    .addOption(new Option("--task <task>", "older vLLM name of --runner: embed = pooling").choices(["auto", "generate", "embed"]))
    .addOption(new Option("--convert <how>", "turn the generative model into an embedding model (with --runner pooling)").choices(["auto", "embed"]))
    .option("--pooler-config <json>", 'pooling of --runner pooling as JSON: {"pooling_type": "LAST"|"MEAN"|"CLS", "normalize": true}')
    .option("--override-pooler-config <json>", "older vLLM name of --pooler-config");
}

/** The structured output and reasoning flags (serve only). */
export function addStructuredOutputOptions(cmd: Command): Command {
  return cmd
    .addOption(
      new Option("--reasoning-parser <name>", "return the reply's reasoning (<think> or [THINK] part, Granite's thought process; gpt-oss: its analysis channel) as the message's reasoning").choices([
        ...SERVE_REASONING_PARSERS,
      ]),
    )
    .option("--structured-outputs-config <json>", 'structured output settings as JSON: {"backend": "xgrammar"|"auto", "disable_any_whitespace": bool} (disable_fallback, disable_additional_properties: accepted, no effect)')
    .addOption(new Option("--guided-decoding-backend <name>", "structured output backend (older vLLM flag)").choices(["auto", "xgrammar"]));
}

/** Where the server listens and how many ranks it runs: KV events and K/V transfer depend on them. */
export interface FeatureContext {
  host: string;
  port: number;
  uds: string | null;
  tensorParallelSize: number;
}

/** Validates the feature flags. */
export function parseFeatureArgs(o: Record<string, unknown>, at: FeatureContext): FeatureArgs {
  const { runner, poolerConfig } = parseRunner(o);
  return {
    runner,
    poolerConfig,
    speculativeConfig: parseSpeculativeConfig(o.speculativeConfig),
    kvEventsConfig: parseKvEventsFlag(o.kvEventsConfig, at),
    kvTransferConfig: parseKvTransferFlag(o.kvTransferConfig, at.tensorParallelSize, runner),
    disableAnyWhitespace: parseStructuredOutputsConfig(o.structuredOutputsConfig, o.guidedDecodingBackend),
    reasoningParser: o.reasoningParser === undefined ? null : oneOf(o.reasoningParser, "--reasoning-parser", SERVE_REASONING_PARSERS),
  };
}

/** --runner / --task / --convert and --pooler-config (--override-pooler-config), as vLLM reads them. */
function parseRunner(o: Record<string, unknown>): Pick<FeatureArgs, "runner" | "poolerConfig"> {
  const task = o.task as string | undefined;
  let runner = (o.runner as string | undefined) ?? "auto";
  if (task === "embed" || o.convert === "embed") {
    if (runner === "generate") throw new CliUsageError(`--${task === "embed" ? "task" : "convert"} embed needs --runner pooling (or auto)`);
    runner = "pooling";
  }
  if (runner !== "auto" && runner !== "generate" && runner !== "pooling") throw new CliUsageError(`--runner must be auto, generate or pooling, got ${JSON.stringify(runner)}`);
  const resolved = runner === "pooling" ? "pooling" : "generate";
  const raw = o.poolerConfig ?? o.overridePoolerConfig;
  if (raw === undefined) return { runner: resolved, poolerConfig: null };
  const flag = o.poolerConfig !== undefined ? "--pooler-config" : "--override-pooler-config";
  if (resolved !== "pooling") throw new CliUsageError(`${flag} needs --runner pooling`);
  const c = jsonObjectFlag(raw, flag, '{"pooling_type": "MEAN", "normalize": true}');
  const out: NonNullable<FeatureArgs["poolerConfig"]> = {};
  for (const [k, v] of Object.entries(c)) {
    if (k === "pooling_type") {
      if (!isPoolingType(v)) throw new CliUsageError(`${flag}: pooling_type must be LAST, MEAN or CLS, got ${JSON.stringify(v)}`);
      out.poolingType = v;
    } else if (k === "normalize") {
      if (typeof v !== "boolean") throw new CliUsageError(`${flag}: normalize must be true or false, got ${JSON.stringify(v)}`);
      out.normalize = v;
    } else throw new CliUsageError(`${flag}: ${JSON.stringify(k)} is not supported (pooling_type, normalize)`);
  }
  return { runner: "pooling", poolerConfig: out };
}

/** --speculative-config: vLLM's JSON (snake_case keys) for the n-gram method, a draft model or an EAGLE head. */
function parseSpeculativeConfig(value: unknown): SpeculativeConfig | null {
  if (value === undefined) return null;
  const c = jsonObjectFlag(value, "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}');
  const keys: Record<string, string> = {
    method: "method",
    model: "model",
    num_speculative_tokens: "numSpeculativeTokens",
    prompt_lookup_max: "promptLookupMax",
    prompt_lookup_min: "promptLookupMin",
  };
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(c)) {
    const key = keys[k];
    if (key === undefined) throw new CliUsageError(`--speculative-config: ${JSON.stringify(k)} is not supported (${Object.keys(keys).join(", ")})`);
    out[key] = v;
  }
  try {
    return resolveSpeculativeConfig(out as Parameters<typeof resolveSpeculativeConfig>[0]);
  } catch (e) {
    // the engine names its camelCase fields; the flag's are snake_case
    let m = (e as Error).message.replace("[engine] speculativeConfig: ", "");
    for (const [wire, key] of Object.entries(keys)) m = m.replaceAll(key, wire);
    throw new CliUsageError(`--speculative-config: ${m}`);
  }
}

/**
 * --kv-events-config: vLLM's JSON; engine_id defaults to the URL the server is reached at (what a router lists it
 * by): http://host:port, this machine's name for a wildcard host; with --port 0 it must be given.
 */
function parseKvEventsFlag(value: unknown, { host, port, uds }: FeatureContext): KvEventsConfig | null {
  if (value === undefined) return null;
  const raw = jsonObjectFlag(value, "--kv-events-config", '{"enable_kv_cache_events": true, "publisher": "nats", "endpoint": "nats://127.0.0.1:4222"}');
  let c: KvEventsConfig | null;
  try {
    c = parseKvEventsConfig(raw);
  } catch (e) {
    throw new CliUsageError((e as Error).message);
  }
  if (c === null || c.engineId !== null) return c;
  if (port === 0 || uds !== null)
    throw new CliUsageError(`--kv-events-config with ${uds !== null ? "--uds" : "--port 0"}: give "engine_id" (the URL a router lists this server by)`);
  const h = host === "0.0.0.0" || host === "::" || host === "" ? hostname() : host.includes(":") ? `[${host}]` : host;
  return { ...c, engineId: `http://${h}:${port}` };
}

/**
 * --structured-outputs-config (a JSON object of backend and disable_any_whitespace) and the older
 * --guided-decoding-backend: the backend can only be xgrammar (or auto); returns disable_any_whitespace.
 */
function parseStructuredOutputsConfig(config: unknown, backend: unknown): boolean {
  const backendOk = (b: unknown): boolean => b === undefined || b === "auto" || b === "xgrammar";
  if (!backendOk(backend)) throw new CliUsageError(`--guided-decoding-backend must be auto or xgrammar, got ${JSON.stringify(backend)}`);
  if (config === undefined) return false;
  const o = jsonObjectFlag(config, "--structured-outputs-config", '{"backend": "xgrammar"}');
  // disable_fallback (there is no other backend to fall back to) and disable_additional_properties (guidance's) change
  // nothing here, as the request-level fields
  const keys = ["backend", "disable_any_whitespace", "disable_fallback", "disable_additional_properties"];
  for (const k of Object.keys(o))
    if (!keys.includes(k)) throw new CliUsageError(`--structured-outputs-config: ${JSON.stringify(k)} is not supported (${keys.join(", ")})`);
  if (!backendOk(o.backend)) throw new CliUsageError(`--structured-outputs-config: backend must be auto or xgrammar (Kiln's), got ${JSON.stringify(o.backend)}`);
  for (const k of keys.slice(1))
    if (o[k] !== undefined && typeof o[k] !== "boolean") throw new CliUsageError(`--structured-outputs-config: ${k} must be a boolean`);
  return o.disable_any_whitespace === true;
}

/** --kv-transfer-config: vLLM's JSON (server/kv-transfer.ts reads it); one rank of a generating model moves its K/V. */
function parseKvTransferFlag(value: unknown, tp: number, runner: string): KvTransferConfig | null {
  if (value === undefined) return null;
  if (tp > 1) throw new CliUsageError("--kv-transfer-config with --tensor-parallel-size > 1 is not supported: each rank holds a share of the KV heads");
  if (runner !== "generate") throw new CliUsageError("--kv-transfer-config needs the generate runner");
  try {
    return parseKvTransferConfig(String(value));
  } catch (e) {
    throw new CliUsageError((e as Error).message);
  }
}
