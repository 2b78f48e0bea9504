// `kiln serve` flags (vLLM's names and meanings), parsed into one typed, validated ServeArgs.
import { isPoolingType } from "../engine/model-runner.js";
import { REASONING_PARSERS, type ReasoningParserName } from "../server/reasoning-parsers.js";
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { Command, Option } from "commander";
import type { KvCacheDtype } from "../engine/paged-model-runner.js";
import { LOGPROBS_MODES, type LogprobsMode } from "../engine/sampler.js";
import { resolveSpeculativeConfig, type SpeculativeConfig } from "../engine/speculative.js";
import { parseKvEventsConfig, type KvEventsConfig } from "../engine/kv-events.js";
import { hostname } from "node:os";
import { TOOL_CALL_PARSERS, type ToolCallParserName } from "../server/tool-parsers.js";
import { parseKvTransferConfig, type KvTransferConfig } from "../server/kv-transfer.js";
import { DEFAULT_MODEL_DIR } from "./default-model.js";
import { CliUsageError } from "./usage-error.js";
import { addFrontendOptions, parseFrontendArgs, type FrontendArgs } from "./serve-frontend-args.js";

export type Dtype = "auto" | "float32" | "bfloat16" | "float16";
export type KvCacheDtypeArg = "auto" | "fp8" | KvCacheDtype;
// vLLM's --kv-cache-dtype values ("fp8" = "fp8_e4m3")
const KV_CACHE_DTYPES: readonly KvCacheDtypeArg[] = ["auto", "float32", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"];
export type SchedulingPolicy = "fcfs" | "priority";
export type LogLevel = "debug" | "info" | "warning" | "error" | "critical";

export const QUANTIZATION_METHODS = ["fp8", "int8", "int4", "mxfp4", "gguf", "awq", "gptq"] as const;

export interface ServeArgs extends FrontendArgs {
  model: string; // model directory (or GGUF file)
  host: string; // "0.0.0.0" = all interfaces (vLLM's default of None)
  port: number;
  apiKey: string | null;
  servedModelName: string[] | null; // null = the model argument
  maxModelLen: number | null; // null = from the model config
  maxNumSeqs: number | null;
  maxNumBatchedTokens: number | null;
  blockSize: number | null;
  kvCacheMemoryBytes: number | null; // overrides gpuMemoryUtilization when set
  kvCacheDtype: KvCacheDtypeArg; // auto = the model's dtype (bfloat16 models get a bfloat16 cache), else float32
  gpuMemoryUtilization: number; // fraction of device memory for weights + KV cache
  enablePrefixCaching: boolean | null; // null = engine default (on)
  dtype: Dtype;
  seed: number;
  chatTemplate: string | null; // template text (read from the file when a path was given)
  generationConfig: string; // "auto" | "vllm" | a directory
  enforceEager: boolean;
  asyncScheduling: boolean | null; // null = engine default (on when the runner can dispatch)
  tensorParallelSize: number;
  logLevel: LogLevel;
  logRequests: boolean;
  /** vLLM --enable-prompt-tokens-details: usage reports prompt_tokens_details.cached_tokens (prefix-cache hits). */
  enablePromptTokensDetails: boolean;
  allowedOrigins: string[];
  maxWaitingRequests: number | null;
  quantization: string | null;
  schedulingPolicy: SchedulingPolicy;
  logprobsMode: LogprobsMode;
  /** Engine-level logits processors: module specifiers "path/or/package[:ExportName]" (vLLM --logits-processors). */
  logitsProcessors: string[];
  /** tool_choice "auto" parses tool calls out of the model's text with this parser (vLLM --tool-call-parser); null = refused. */
  toolCallParser: ToolCallParserName | null;
  /** Structured output's default for requests that do not say (vLLM --structured-outputs-config disable_any_whitespace). */
  disableAnyWhitespace: boolean;
  /** vLLM --speculative-config (n-gram drafts), or null. */
  speculativeConfig: SpeculativeConfig | null;
  /** vLLM --kv-events-config: prefix-cache block events published over NATS (engine_id defaults to the served URL); null = off. */
  kvEventsConfig: KvEventsConfig | null;
  /** vLLM --kv-transfer-config: prefill/decode disaggregation over Kiln's K/V side channel (server/kv-transfer.ts); null = off. */
  kvTransferConfig: KvTransferConfig | null;
  /** vLLM --enable-lora, --max-loras, --max-lora-rank, --max-cpu-loras (null: the engine's defaults). */
  enableLora: boolean;
  maxLoras: number | null;
  maxLoraRank: number | null;
  maxCpuLoras: number | null;
  /** vLLM --lora-modules: adapters served under their names from the start. */
  loraModules: LoraModuleArg[];
  /** vLLM --reasoning-parser: chat replies split into reasoning and content; null = none. */
  reasoningParser: ReasoningParserName | null;
  /** vLLM --runner (or the older --task embed): "pooling" serves /v1/embeddings instead of generating. */
  runner: "generate" | "pooling";
  /** vLLM --pooler-config (--override-pooler-config): pooling_type and normalize, or null for the model's default. */
  poolerConfig: { poolingType?: "LAST" | "MEAN" | "CLS"; normalize?: boolean } | null;
  /** vLLM --tokenizer: the directory of tokenizer.json and the chat template; null = the model's. */
  tokenizer: string | null;
  /** vLLM --max-logprobs: the most logprobs / top_logprobs / prompt_logprobs a request may ask (-1: the vocabulary size). */
  maxLogprobs: number;
  /** vLLM --enable-chunked-prefill / --no-enable-chunked-prefill; null = the engine's default (on). */
  enableChunkedPrefill: boolean | null;
  /** vLLM --long-prefill-token-threshold: the most tokens a prompt computes in one step (0: no cap); null = the default (0). */
  longPrefillTokenThreshold: number | null;
  /** vLLM --override-generation-config: generation_config.json keys over --generation-config's (null unsets one). */
  overrideGenerationConfig: Record<string, number | null>;
}

/** One --lora-modules entry: name=path, or JSON {"name", "path", "base_model_name"}. */
export interface LoraModuleArg {
  name: string;
  path: string;
  baseModelName: string | null;
}

export { CliUsageError };

/** Declares every serve flag on `cmd` (also used by generate/chat for the engine-shaping subset). */
export function addEngineOptions(cmd: Command): Command {
  return cmd
    .option("--max-model-len <n>", "model context length (default: from the model config)")
    .option("--max-num-seqs <n>", "maximum number of sequences per iteration")
    .option("--max-num-batched-tokens <n>", "maximum number of batched tokens per iteration")
    .option("--block-size <n>", "KV cache block size in tokens")
    .option("--kv-cache-memory <bytes>", "KV cache size in bytes (suffixes K, M, G, KiB, MiB, GiB); overrides --gpu-memory-utilization")
    .addOption(new Option("--kv-cache-dtype <dtype>", "KV cache element type (auto: the model's dtype)").choices([...KV_CACHE_DTYPES]).default("auto"))
    .option("--gpu-memory-utilization <fraction>", "fraction of device memory for the model and KV cache", "0.9")
    .option("--enable-prefix-caching", "enable automatic prefix caching")
    .option("--no-enable-prefix-caching", "disable automatic prefix caching")
    .addOption(new Option("--dtype <dtype>", "weight and activation dtype").choices(["auto", "float32", "bfloat16", "float16"]).default("auto"))
    .option("--seed <n>", "random seed", "0")
    .option("--speculative-config <json>", 'speculative decoding as JSON: {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}')
    .option(
      "--kv-events-config <json>",
      'publish KV-cache events as JSON: {"enable_kv_cache_events": true, "publisher": "nats", "endpoint": "nats://127.0.0.1:4222", "topic": "kv-events"}',
    )
    .option(
      "--kv-transfer-config <json>",
      'P/D disaggregation as JSON: {"kv_connector": "KilnConnector", "kv_role": "kv_both", "kv_ip": "127.0.0.1", "kv_port": 14579} (NixlConnector is taken as KilnConnector)',
    )
    .option("--generation-config <src>", "'auto' (model's generation_config.json), 'vllm' (none) or a directory", "auto")
    .option(
      "--override-generation-config <json>",
      `generation_config.json keys over --generation-config's, as JSON: {"temperature": 0.5} (${Object.keys(GENERATION_OVERRIDE_KEYS).join(", ")})`,
    )
    .option("--tokenizer <dir>", "directory of the tokenizer (tokenizer.json, tokenizer_config.json, chat template) when not the model's")
    .option("--max-logprobs <n>", "the most logprobs a request may ask for (logprobs, top_logprobs, prompt_logprobs); -1: the vocabulary size", "20")
    .option("--enable-chunked-prefill", "compute long prompts over several steps (the default)")
    .option("--no-enable-chunked-prefill", "compute each prompt in one step (max-num-batched-tokens must hold max-model-len)")
    .option("--long-prefill-token-threshold <n>", "the most tokens a prompt computes in one step, so long prompts share steps (0: no cap)")
    .option("--trust-remote-code", "accepted for vLLM compatibility: Kiln runs no code from the model directory (no Python), so it changes nothing", false)
    .option("--enforce-eager", "no step graphs: every step runs op by op from JS (nothing compiled at start-up)", false)
    .option("--async-scheduling", "schedule the next step while the current one computes (the default)")
    .option("--no-async-scheduling", "schedule each step after the previous one has finished")
    .option("--tensor-parallel-size <n>", "number of tensor parallel ranks", "1")
    .option("--pipeline-parallel-size <n>", "pipeline stages (only 1: Kiln splits a model by tensor parallelism)", "1")
    .option("--data-parallel-size <n>", "engine replicas (only 1 per server: run one kiln serve per replica behind kiln router)", "1")
    .option("--enable-lora", "serve LoRA adapters (requests name them as their model)", false)
    .option("--max-loras <n>", "LoRA adapters in one step (default 1)")
    .option("--max-lora-rank <n>", "the largest LoRA rank served (default 16)")
    .option("--max-cpu-loras <n>", "LoRA adapters kept in host memory while unused (default: --max-loras)")
    .addOption(new Option("--runner <runner>", "generate text, or pool prompts into embeddings (/v1/embeddings)").choices(["auto", "generate", "pooling"]))
    .addOption(new Option("--task <task>", "older vLLM name of --runner: embed = pooling").choices(["auto", "generate", "embed"]))
    .addOption(new Option("--convert <how>", "turn the generative model into an embedding model (with --runner pooling)").choices(["auto", "embed"]))
    .option("--pooler-config <json>", 'pooling of --runner pooling as JSON: {"pooling_type": "LAST"|"MEAN"|"CLS", "normalize": true}')
    .option("--override-pooler-config <json>", "older vLLM name of --pooler-config")
    .option("--quantization <method>", `weight quantization (${QUANTIZATION_METHODS.join(", ")})`)
    .addOption(new Option("--scheduling-policy <policy>", "scheduling policy").choices(["fcfs", "priority"]).default("fcfs"))
    .addOption(
      new Option("--logprobs-mode <mode>", "what logprobs report: the model's (raw) or after sampling's processing")
        .choices([...LOGPROBS_MODES])
        .default("raw_logprobs"),
    )
    .option(
      "--logits-processors <specs...>",
      "engine-level logits processors, each a module path (relative to the current directory) or package, " +
        "with ':ExportName' (default export otherwise); requests steer them with vllm_xargs",
    );
}

export function addServeOptions(cmd: Command): Command {
  addEngineOptions(cmd)
    .option("--host <host>", "host name to listen on (default: all interfaces)")
    .option("--port <port>", "port to listen on", "8000")
    .option("--api-key <key>", "require this key in 'Authorization: Bearer' (env KILN_API_KEY)")
    .option("--served-model-name <names...>", "model name(s) used in the API (default: the model argument)")
    .option("--chat-template <file-or-template>", "chat template file or inline Jinja template")
    .addOption(new Option("--log-level <level>", "log level").choices(["debug", "info", "warning", "error", "critical"]).default("info"))
    .option("--enable-log-requests", "log every request", false)
    .option("--enable-prompt-tokens-details", "report usage.prompt_tokens_details.cached_tokens (prompt tokens read from the prefix cache)", false)
    .option("--disable-log-requests", "do not log requests (the default; kept for vLLM compatibility)", false)
    .option("--allowed-origins <json>", "CORS allowed origins as a JSON list", '["*"]')
    .option("--max-waiting-requests <n>", "reject new requests with 503 once this many are waiting")
    .option("--lora-modules <specs...>", 'LoRA adapters to serve, each name=path or JSON {"name": ..., "path": ..., "base_model_name": ...}')
    .option("--enable-auto-tool-choice", "serve tool_choice \"auto\" by parsing tool calls out of the model's text (needs --tool-call-parser)", false)
    .addOption(new Option("--tool-call-parser <name>", "how tool calls are written in the model's text").choices([...TOOL_CALL_PARSERS]))
    .addOption(new Option("--reasoning-parser <name>", "return the reply's <think> part as the message's reasoning").choices([...REASONING_PARSERS]))
    .option("--structured-outputs-config <json>", 'structured output settings as JSON: {"backend": "xgrammar"|"auto", "disable_any_whitespace": bool}')
    .addOption(new Option("--guided-decoding-backend <name>", "structured output backend (older vLLM flag)").choices(["auto", "xgrammar"]));
  addFrontendOptions(cmd);
  return cmd;
}

function int(value: unknown, flag: string, min: number): number {
  const n = Number(value);
  if (typeof value !== "string" || !/^-?\d+$/.test(value.trim()) || n < min) {
    throw new CliUsageError(`${flag} must be an integer >= ${min}, got ${JSON.stringify(value)}`);
  }
  return n;
}

const optInt = (value: unknown, flag: string, min: number): number | null => (value === undefined ? null : int(value, flag, min));

const SIZE_UNITS: Record<string, number> = { "": 1, k: 1e3, m: 1e6, g: 1e9, t: 1e12, kib: 2 ** 10, mib: 2 ** 20, gib: 2 ** 30, tib: 2 ** 40 };

export function parseBytes(value: string, flag: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$/i.exec(value);
  const unit = m ? SIZE_UNITS[m[2]!.toLowerCase().replace(/b$/, "").replace(/^(.)i$/, "$1ib")] : undefined;
  if (!m || unit === undefined) throw new CliUsageError(`${flag} must be a byte count such as 4294967296, 4G or 4GiB, got ${JSON.stringify(value)}`);
  return Math.floor(Number(m[1]) * unit);
}

/** --logits-processors: a list of non-empty specifiers (commander gives an array, or undefined when absent). */
function parseLogitsProcessors(value: unknown): string[] {
  if (value === undefined) return [];
  const specs = Array.isArray(value) ? value : [value];
  if (specs.length === 0 || !specs.every((x) => typeof x === "string" && x.trim().length > 0)) {
    throw new CliUsageError(`--logits-processors takes module specifiers such as ./my-proc.mjs:MyProc, got ${JSON.stringify(value)}`);
  }
  return specs as string[];
}

/** Validates commander's raw option values (all strings) into ServeArgs. */
export function parseServeArgs(model: string | undefined, o: Record<string, unknown>, env: NodeJS.ProcessEnv = process.env): ServeArgs {
  // > 1: ranks 1..N-1 are processes the engine spawns (engine/tensor-parallel.ts); runs eagerly
  const tp = int(o.tensorParallelSize ?? "1", "--tensor-parallel-size", 1);
  // accepted for pasted vLLM command lines at 1; more is refused, saying what Kiln offers instead
  if (int(o.pipelineParallelSize ?? "1", "--pipeline-parallel-size", 1) !== 1)
    throw new CliUsageError("--pipeline-parallel-size > 1 is not supported: split the model with --tensor-parallel-size");
  if (int(o.dataParallelSize ?? "1", "--data-parallel-size", 1) !== 1)
    throw new CliUsageError("--data-parallel-size > 1 is not supported in one server: run one kiln serve per replica behind kiln router (README, Router)");
  const gmu = Number(o.gpuMemoryUtilization ?? "0.9");
  if (!(gmu > 0 && gmu <= 1)) throw new CliUsageError(`--gpu-memory-utilization must be a fraction in (0, 1], got ${JSON.stringify(o.gpuMemoryUtilization)}`);

  let allowedOrigins: string[] = ["*"];
  if (o.allowedOrigins !== undefined) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(String(o.allowedOrigins));
    } catch {
      parsed = undefined;
    }
    if (!Array.isArray(parsed) || !parsed.every((x) => typeof x === "string")) {
      throw new CliUsageError(`--allowed-origins must be a JSON list of strings such as '["http://localhost:3000"]', got ${String(o.allowedOrigins)}`);
    }
    allowedOrigins = parsed;
  }

  let quantization = (o.quantization as string | undefined) ?? null;
  if (quantization !== null && !(QUANTIZATION_METHODS as readonly string[]).includes(quantization)) {
    throw new CliUsageError(`--quantization must be one of ${QUANTIZATION_METHODS.join(", ")}, got ${JSON.stringify(quantization)}`);
  }
  if (quantization === "gguf") {
    // vLLM's flag for a GGUF model: its tensors keep the file's own types (Kiln reads them so without the flag)
    const m = model ?? DEFAULT_MODEL_DIR;
    const isGguf = m.endsWith(".gguf") || (existsSync(m) && statSync(m).isDirectory() && readdirSync(m).some((f) => f.endsWith(".gguf")));
    if (!isGguf) throw new CliUsageError(`--quantization gguf needs a GGUF model (a .gguf file), got ${JSON.stringify(m)}`);
    quantization = null;
  }

  const logprobsMode = String(o.logprobsMode ?? "raw_logprobs");
  if (!(LOGPROBS_MODES as readonly string[]).includes(logprobsMode))
    throw new CliUsageError(`--logprobs-mode must be one of ${LOGPROBS_MODES.join(", ")}, got ${JSON.stringify(logprobsMode)}`);
  const kvCacheDtype = String(o.kvCacheDtype ?? "auto");
  if (!(KV_CACHE_DTYPES as readonly string[]).includes(kvCacheDtype))
    throw new CliUsageError(`--kv-cache-dtype must be one of ${KV_CACHE_DTYPES.join(", ")}, got ${JSON.stringify(kvCacheDtype)}`);

  const generationConfig = String(o.generationConfig ?? "auto");
  if (generationConfig !== "auto" && generationConfig !== "vllm") {
    if (!(existsSync(generationConfig) && statSync(generationConfig).isDirectory()))
      throw new CliUsageError(`--generation-config must be 'auto', 'vllm' or an existing directory, got ${JSON.stringify(generationConfig)}`);
    if (!existsSync(`${generationConfig}/generation_config.json`))
      throw new CliUsageError(`--generation-config ${JSON.stringify(generationConfig)}: the directory has no generation_config.json`);
  }

  let chatTemplate: string | null = null;
  if (typeof o.chatTemplate === "string") {
    const t = o.chatTemplate;
    // vLLM's rule: a file's contents; else the text itself when it looks like a template ({, } or a newline in it)
    if (existsSync(t) && statSync(t).isFile()) chatTemplate = readFileSync(t, "utf8");
    else if (/[{}\n]/.test(t)) chatTemplate = t;
    else throw new CliUsageError(`--chat-template ${JSON.stringify(t)} looks like a file path, but it cannot be opened`);
  }

  const enableAutoToolChoice = Boolean(o.enableAutoToolChoice);
  const parser = (o.toolCallParser as string | undefined) ?? null;
  if (parser !== null && !(TOOL_CALL_PARSERS as readonly string[]).includes(parser))
    throw new CliUsageError(`--tool-call-parser must be one of ${TOOL_CALL_PARSERS.join(", ")}, got ${JSON.stringify(parser)}`);
  if (enableAutoToolChoice && parser === null) throw new CliUsageError("--enable-auto-tool-choice requires --tool-call-parser");
  const disableAnyWhitespace = parseStructuredOutputsConfig(o.structuredOutputsConfig, o.guidedDecodingBackend);
  const speculativeConfig = parseSpeculativeConfig(o.speculativeConfig);
  if (speculativeConfig !== null && o.asyncScheduling === true)
    throw new CliUsageError("--async-scheduling cannot be combined with --speculative-config");

  const enableLora = Boolean(o.enableLora);
  const loraModules = parseLoraModules(o.loraModules);
  if (loraModules.length > 0 && !enableLora) throw new CliUsageError("--lora-modules needs --enable-lora");
  const maxLoras = optInt(o.maxLoras, "--max-loras", 1);
  const maxCpuLoras = optInt(o.maxCpuLoras, "--max-cpu-loras", 1);
  if (maxCpuLoras !== null && maxCpuLoras < (maxLoras ?? 1))
    throw new CliUsageError(`--max-cpu-loras (${maxCpuLoras}) must be >= --max-loras (${maxLoras ?? 1})`);

  const { runner, poolerConfig } = parseRunner(o);
  if (runner === "pooling" && enableLora) throw new CliUsageError("--enable-lora needs the generate runner");
  if (runner === "pooling" && speculativeConfig !== null) throw new CliUsageError("--speculative-config needs the generate runner");

  const enableChunkedPrefill = (o.enableChunkedPrefill as boolean | undefined) ?? null;
  const maxModelLen = optInt(o.maxModelLen, "--max-model-len", 1);
  const maxNumBatchedTokens = optInt(o.maxNumBatchedTokens, "--max-num-batched-tokens", 1);
  // without chunked prefill a prompt is computed in one step (vLLM's SchedulerConfig check)
  if (enableChunkedPrefill === false && maxModelLen !== null && maxNumBatchedTokens !== null && maxNumBatchedTokens < maxModelLen)
    throw new CliUsageError(
      `--max-num-batched-tokens (${maxNumBatchedTokens}) must be >= --max-model-len (${maxModelLen}) with --no-enable-chunked-prefill: a prompt is computed in one step`,
    );

  const port = int(o.port ?? "8000", "--port", 0);
  if (port > 65535) throw new CliUsageError(`--port must be <= 65535, got ${port}`);
  const host = (o.host as string | undefined) ?? "0.0.0.0";
  const kvEventsConfig = parseKvEventsFlag(o.kvEventsConfig, host, port);
  const kvTransferConfig = parseKvTransferFlag(o.kvTransferConfig, tp, runner);
  const modelPath = model ?? DEFAULT_MODEL_DIR;
  const blockSize = optInt(o.blockSize, "--block-size", 1);
  if (blockSize !== null && (blockSize & (blockSize - 1)) !== 0) throw new CliUsageError(`--block-size must be a power of two, got ${blockSize}`);

  return {
    model: modelPath,
    host,
    port,
    apiKey: (o.apiKey as string | undefined) ?? env.KILN_API_KEY ?? null,
    // the built-in model is served as "kiln-default" (vLLM serves a model under the name it was given)
    servedModelName: (o.servedModelName as string[] | undefined) ?? (model === undefined ? ["kiln-default"] : null),
    maxModelLen,
    maxNumSeqs: optInt(o.maxNumSeqs, "--max-num-seqs", 1),
    maxNumBatchedTokens,
    blockSize,
    kvCacheMemoryBytes: o.kvCacheMemory === undefined ? null : parseBytes(String(o.kvCacheMemory), "--kv-cache-memory"),
    kvCacheDtype: kvCacheDtype as KvCacheDtypeArg,
    gpuMemoryUtilization: gmu,
    enablePrefixCaching: (o.enablePrefixCaching as boolean | undefined) ?? null,
    dtype: (o.dtype as Dtype | undefined) ?? "auto",
    seed: int(o.seed ?? "0", "--seed", 0),
    chatTemplate,
    generationConfig,
    enforceEager: Boolean(o.enforceEager),
    asyncScheduling: (o.asyncScheduling as boolean | undefined) ?? null,
    tensorParallelSize: tp,
    logLevel: (o.logLevel as LogLevel | undefined) ?? "info",
    logRequests: Boolean(o.enableLogRequests) && !o.disableLogRequests,
    enablePromptTokensDetails: Boolean(o.enablePromptTokensDetails),
    allowedOrigins,
    maxWaitingRequests: optInt(o.maxWaitingRequests, "--max-waiting-requests", 1),
    quantization,
    schedulingPolicy: (o.schedulingPolicy as SchedulingPolicy | undefined) ?? "fcfs",
    logprobsMode: logprobsMode as LogprobsMode,
    logitsProcessors: parseLogitsProcessors(o.logitsProcessors),
    toolCallParser: enableAutoToolChoice ? (parser as ToolCallParserName) : null,
    disableAnyWhitespace,
    speculativeConfig,
    kvEventsConfig,
    kvTransferConfig,
    enableLora,
    maxLoras,
    maxLoraRank: optInt(o.maxLoraRank, "--max-lora-rank", 1),
    maxCpuLoras,
    loraModules,
    runner,
    poolerConfig,
    reasoningParser: parseReasoningParser(o.reasoningParser),
    tokenizer: parseTokenizer(o.tokenizer),
    maxLogprobs: int(o.maxLogprobs ?? "20", "--max-logprobs", -1),
    enableChunkedPrefill,
    longPrefillTokenThreshold: optInt(o.longPrefillTokenThreshold, "--long-prefill-token-threshold", 0),
    overrideGenerationConfig: parseGenerationOverride(o.overrideGenerationConfig),
    ...parseFrontendArgs(o),
  };
}

/** --tokenizer: a local directory holding tokenizer.json (a hub id is not looked up). */
function parseTokenizer(value: unknown): string | null {
  if (value === undefined) return null;
  const dir = String(value);
  if (!(existsSync(dir) && statSync(dir).isDirectory()))
    throw new CliUsageError(`--tokenizer must be a local directory holding tokenizer.json, got ${JSON.stringify(dir)}`);
  if (!existsSync(`${dir}/tokenizer.json`)) throw new CliUsageError(`--tokenizer ${JSON.stringify(dir)}: the directory has no tokenizer.json`);
  return dir;
}

/** The generation_config.json keys vLLM reads as sampling defaults (get_diff_sampling_param), each value's rule. */
const GENERATION_OVERRIDE_KEYS: Record<string, { ok: (v: number) => boolean; rule: string }> = {
  temperature: { ok: (v) => v >= 0, rule: "a number >= 0" },
  top_p: { ok: (v) => v > 0 && v <= 1, rule: "a number in (0, 1]" },
  top_k: { ok: (v) => Number.isInteger(v) && v >= -1, rule: "an integer >= -1" },
  min_p: { ok: (v) => v >= 0 && v <= 1, rule: "a number in [0, 1]" },
  repetition_penalty: { ok: (v) => v > 0, rule: "a number > 0" },
  max_new_tokens: { ok: (v) => Number.isInteger(v) && v >= 1, rule: "an integer >= 1" },
};

/** --override-generation-config: a JSON object of GENERATION_OVERRIDE_KEYS, each a valid value or null (unset). */
function parseGenerationOverride(value: unknown): Record<string, number | null> {
  if (value === undefined) return {};
  const c = jsonObjectFlag(value, "--override-generation-config", '{"temperature": 0.5, "max_new_tokens": 512}');
  for (const [k, v] of Object.entries(c)) {
    const key = GENERATION_OVERRIDE_KEYS[k];
    if (key === undefined)
      throw new CliUsageError(`--override-generation-config: ${JSON.stringify(k)} is not a sampling default (${Object.keys(GENERATION_OVERRIDE_KEYS).join(", ")})`);
    if (v !== null && !(typeof v === "number" && Number.isFinite(v) && key.ok(v)))
      throw new CliUsageError(`--override-generation-config: ${k} must be ${key.rule} or null, got ${JSON.stringify(v)}`);
  }
  return c as Record<string, number | null>;
}

function parseReasoningParser(value: unknown): ReasoningParserName | null {
  if (value === undefined) return null;
  if (!(REASONING_PARSERS as readonly unknown[]).includes(value))
    throw new CliUsageError(`--reasoning-parser must be one of ${REASONING_PARSERS.join(", ")}, got ${JSON.stringify(value)}`);
  return value as ReasoningParserName;
}

/** --runner / --task / --convert and --pooler-config (--override-pooler-config), as vLLM reads them. */
function parseRunner(o: Record<string, unknown>): Pick<ServeArgs, "runner" | "poolerConfig"> {
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
  const out: NonNullable<ServeArgs["poolerConfig"]> = {};
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

/** A flag whose value is a JSON object (vLLM's --*-config flags). */
function jsonObjectFlag(value: unknown, flag: string, example: string): Record<string, unknown> {
  let c: unknown;
  try {
    c = JSON.parse(String(value));
  } catch {
    c = undefined;
  }
  if (typeof c !== "object" || c === null || Array.isArray(c)) throw new CliUsageError(`${flag} must be a JSON object such as '${example}', got ${String(value)}`);
  return c as Record<string, unknown>;
}

/** --speculative-config: vLLM's JSON (snake_case keys) for the n-gram method. */
function parseSpeculativeConfig(value: unknown): SpeculativeConfig | null {
  if (value === undefined) return null;
  const c = jsonObjectFlag(value, "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}');
  const keys: Record<string, keyof SpeculativeConfig> = {
    method: "method",
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
    return resolveSpeculativeConfig(out);
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
function parseKvEventsFlag(value: unknown, host: string, port: number): KvEventsConfig | null {
  if (value === undefined) return null;
  const raw = jsonObjectFlag(value, "--kv-events-config", '{"enable_kv_cache_events": true, "publisher": "nats", "endpoint": "nats://127.0.0.1:4222"}');
  let c: KvEventsConfig | null;
  try {
    c = parseKvEventsConfig(raw);
  } catch (e) {
    throw new CliUsageError((e as Error).message);
  }
  if (c === null || c.engineId !== null) return c;
  if (port === 0) throw new CliUsageError('--kv-events-config with --port 0: give "engine_id" (the URL a router lists this server by)');
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
  for (const k of Object.keys(o))
    if (k !== "backend" && k !== "disable_any_whitespace")
      throw new CliUsageError(`--structured-outputs-config: ${JSON.stringify(k)} is not supported (backend, disable_any_whitespace)`);
  if (!backendOk(o.backend)) throw new CliUsageError(`--structured-outputs-config: backend must be auto or xgrammar (Kiln's), got ${JSON.stringify(o.backend)}`);
  if (o.disable_any_whitespace !== undefined && typeof o.disable_any_whitespace !== "boolean")
    throw new CliUsageError("--structured-outputs-config: disable_any_whitespace must be a boolean");
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
