// `kiln serve` flags that shape the engine (vLLM's CacheConfig, SchedulerConfig, ParallelConfig, LoRAConfig,
// CompilationConfig and the engine-wide sampling settings): KV cache, batch limits, step graphs, parallelism, LoRA
// slots, logprobs.
import { Option, type Command } from "commander";
import type { KvCacheDtype } from "../engine/paged-model-runner.js";
import { LOGPROBS_MODES, type LogprobsMode } from "../engine/sampler.js";
import { humanInt, int, jsonObjectFlag, oneOf, optInt, parseBytes } from "./serve-flag-values.js";
import { CliUsageError } from "./usage-error.js";

export type KvCacheDtypeArg = "auto" | "fp8" | KvCacheDtype;
// vLLM's --kv-cache-dtype values ("fp8" = "fp8_e4m3")
const KV_CACHE_DTYPES: readonly KvCacheDtypeArg[] = ["auto", "float32", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"];
export type SchedulingPolicy = "fcfs" | "priority";
const SCHEDULING_POLICIES: readonly SchedulingPolicy[] = ["fcfs", "priority"];

export interface EngineFlagArgs {
  maxModelLen: number | null; // null = from the model config
  maxNumSeqs: number | null;
  maxNumBatchedTokens: number | null;
  blockSize: number | null;
  kvCacheMemoryBytes: number | null; // overrides gpuMemoryUtilization when set
  kvCacheDtype: KvCacheDtypeArg; // auto = the model's dtype (bfloat16 models get a bfloat16 cache), else float32
  gpuMemoryUtilization: number; // fraction of device memory for weights + KV cache
  /** vLLM --num-gpu-blocks-override: the KV cache's block count instead of the one sized from memory; null = sized. */
  numGpuBlocksOverride: number | null;
  enablePrefixCaching: boolean | null; // null = engine default (on)
  seed: number;
  enforceEager: boolean;
  /** vLLM --enable-sleep-mode: POST /sleep may free the KV cache (level 1) and the weights (level 2) in dev mode. */
  enableSleepMode: boolean;
  /**
   * The largest step captured as a step graph, in tokens (vLLM's max_cudagraph_capture_size, from --compilation-config
   * or its own flag): decode batches and mixed steps up to it; null = Kiln's defaults (32 sequences, 512 tokens).
   */
  maxCaptureSize: number | null;
  asyncScheduling: boolean | null; // null = engine default (on when the runner can dispatch)
  tensorParallelSize: number;
  schedulingPolicy: SchedulingPolicy;
  logprobsMode: LogprobsMode;
  /** Engine-level logits processors: module specifiers "path/or/package[:ExportName]" (vLLM --logits-processors). */
  logitsProcessors: string[];
  /** vLLM --enable-lora, --max-loras, --max-lora-rank, --max-cpu-loras (null: the engine's defaults). */
  enableLora: boolean;
  maxLoras: number | null;
  maxLoraRank: number | null;
  maxCpuLoras: number | null;
  /** vLLM --max-logprobs: the most logprobs / top_logprobs / prompt_logprobs a request may ask (-1: the vocabulary size). */
  maxLogprobs: number;
  /** vLLM --enable-chunked-prefill / --no-enable-chunked-prefill; null = the engine's default (on). */
  enableChunkedPrefill: boolean | null;
  /** vLLM --long-prefill-token-threshold: the most tokens a prompt computes in one step (0: no cap); null = the default (0). */
  longPrefillTokenThreshold: number | null;
}

/** Declares the engine flags on `cmd` (serve, generate and chat). */
export function addEngineFlagOptions(cmd: Command): Command {
  return cmd
    .option("--max-model-len <n>", "model context length: 2048, 1k (1000) or 1K (1024) (default: from the model config)")
    .option("--max-num-seqs <n>", "maximum number of sequences per iteration")
    .option("--max-num-batched-tokens <n>", "maximum number of batched tokens per iteration")
    .option("--block-size <n>", "KV cache block size in tokens")
    .option("--kv-cache-memory <bytes>", "KV cache size in bytes (suffixes K, M, G, KiB, MiB, GiB); overrides --gpu-memory-utilization")
    .option("--kv-cache-memory-bytes <bytes>", "vLLM's name of --kv-cache-memory")
    .option("--num-gpu-blocks-override <n>", "KV cache blocks (the null block included) instead of the count sized from memory (vLLM's, for testing preemption)")
    .addOption(new Option("--kv-cache-dtype <dtype>", "KV cache element type (auto: the model's dtype)").choices([...KV_CACHE_DTYPES]).default("auto"))
    .option("--gpu-memory-utilization <fraction>", "fraction of device memory for the model and KV cache", "0.9")
    .option("--enable-prefix-caching", "enable automatic prefix caching")
    .option("--no-enable-prefix-caching", "disable automatic prefix caching")
    .option("--seed <n>", "random seed", "0")
    .option("--max-logprobs <n>", "the most logprobs a request may ask for (logprobs, top_logprobs, prompt_logprobs); -1: the vocabulary size", "20")
    .option("--enable-chunked-prefill", "compute long prompts over several steps (the default)")
    .option("--no-enable-chunked-prefill", "compute each prompt in one step (max-num-batched-tokens must hold max-model-len)")
    .option("--long-prefill-token-threshold <n>", "the most tokens a prompt computes in one step, so long prompts share steps (0: no cap)")
    .option("--enforce-eager", "no step graphs: every step runs op by op from JS (nothing compiled at start-up)", false)
    .option("--enable-sleep-mode", "let the engine sleep: with VLLM_SERVER_DEV_MODE=1, POST /sleep frees the KV cache (level 1) and the weights (level 2) until POST /wake_up", false)
    .option(
      "-O, --compilation-config <level-or-json>",
      'step graphs as vLLM\'s compilation settings: -O0 (or {"level": 0}, {"cudagraph_mode": "NONE"}) runs eagerly as --enforce-eager, ' +
        "-O1 to -O3 keep them; max_cudagraph_capture_size caps them (other keys tune nothing here: said at start-up)",
    )
    .option("--optimization-level <n>", "vLLM's optimization level, 0 to 3: 0 runs eagerly as --enforce-eager (no step graphs), 1 to 3 keep the step graphs")
    .option("--max-cudagraph-capture-size <n>", "the largest step captured as a step graph, in tokens (default: 32 decoding sequences, 512 tokens)")
    .option("--async-scheduling", "schedule the next step while the current one computes (the default)")
    .option("--no-async-scheduling", "schedule each step after the previous one has finished")
    .option("--tensor-parallel-size <n>", "number of tensor parallel ranks", "1")
    .option("--pipeline-parallel-size <n>", "pipeline stages (only 1: Kiln splits a model by tensor parallelism)", "1")
    .option("--data-parallel-size <n>", "engine replicas (only 1 per server: run one kiln serve per replica behind kiln router)", "1")
    .option("--enable-lora", "serve LoRA adapters (requests name them as their model)", false)
    .option("--max-loras <n>", "LoRA adapters in one step (default 1)")
    .option("--max-lora-rank <n>", "the largest LoRA rank served (default 16)")
    .option("--max-cpu-loras <n>", "LoRA adapters kept in host memory while unused (default: --max-loras)")
    .addOption(new Option("--scheduling-policy <policy>", "scheduling policy").choices([...SCHEDULING_POLICIES]).default("fcfs"))
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

/** Validates the engine flags; settings accepted with no effect push a line to `warnings`. */
export function parseEngineFlagArgs(o: Record<string, unknown>, warnings: string[]): EngineFlagArgs {
  // > 1: ranks 1..N-1 are processes the engine spawns (engine/tensor-parallel.ts); runs eagerly
  const tp = int(o.tensorParallelSize ?? "1", "--tensor-parallel-size", 1);
  // accepted for pasted vLLM command lines at 1; more is refused, saying what Kiln offers instead
  if (int(o.pipelineParallelSize ?? "1", "--pipeline-parallel-size", 1) !== 1)
    throw new CliUsageError("--pipeline-parallel-size > 1 is not supported: split the model with --tensor-parallel-size");
  if (int(o.dataParallelSize ?? "1", "--data-parallel-size", 1) !== 1)
    throw new CliUsageError("--data-parallel-size > 1 is not supported in one server: run one kiln serve per replica behind kiln router (README, Router)");
  const gmu = Number(o.gpuMemoryUtilization ?? "0.9");
  if (!(gmu > 0 && gmu <= 1)) throw new CliUsageError(`--gpu-memory-utilization must be a fraction in (0, 1], got ${JSON.stringify(o.gpuMemoryUtilization)}`);

  const maxLoras = optInt(o.maxLoras, "--max-loras", 1);
  const maxCpuLoras = optInt(o.maxCpuLoras, "--max-cpu-loras", 1);
  if (maxCpuLoras !== null && maxCpuLoras < (maxLoras ?? 1))
    throw new CliUsageError(`--max-cpu-loras (${maxCpuLoras}) must be >= --max-loras (${maxLoras ?? 1})`);

  const enableChunkedPrefill = (o.enableChunkedPrefill as boolean | undefined) ?? null;
  const maxModelLen = humanInt(o.maxModelLen, "--max-model-len", 1);
  const maxNumBatchedTokens = optInt(o.maxNumBatchedTokens, "--max-num-batched-tokens", 1);
  // without chunked prefill a prompt is computed in one step (vLLM's SchedulerConfig check)
  if (enableChunkedPrefill === false && maxModelLen !== null && maxNumBatchedTokens !== null && maxNumBatchedTokens < maxModelLen)
    throw new CliUsageError(
      `--max-num-batched-tokens (${maxNumBatchedTokens}) must be >= --max-model-len (${maxModelLen}) with --no-enable-chunked-prefill: a prompt is computed in one step`,
    );
  const blockSize = optInt(o.blockSize, "--block-size", 1);
  const compilation = parseCompilationConfig(o.compilationConfig, warnings);
  const optimizationLevel = optInt(o.optimizationLevel, "--optimization-level", 0);
  if (optimizationLevel !== null && optimizationLevel > 3) throw new CliUsageError(`--optimization-level must be 0 to 3, got ${optimizationLevel}`);
  const captureFlag = optInt(o.maxCudagraphCaptureSize, "--max-cudagraph-capture-size", 1);
  if (o.kvCacheMemory !== undefined && o.kvCacheMemoryBytes !== undefined)
    throw new CliUsageError("--kv-cache-memory and --kv-cache-memory-bytes are one setting: give one");
  const kvFlag = o.kvCacheMemory !== undefined ? "--kv-cache-memory" : "--kv-cache-memory-bytes";
  const kvBytes = o.kvCacheMemory ?? o.kvCacheMemoryBytes;
  if (blockSize !== null && (blockSize & (blockSize - 1)) !== 0) throw new CliUsageError(`--block-size must be a power of two, got ${blockSize}`);

  return {
    maxModelLen,
    maxNumSeqs: optInt(o.maxNumSeqs, "--max-num-seqs", 1),
    maxNumBatchedTokens,
    blockSize,
    kvCacheMemoryBytes: kvBytes === undefined ? null : parseBytes(String(kvBytes), kvFlag),
    kvCacheDtype: oneOf(String(o.kvCacheDtype ?? "auto"), "--kv-cache-dtype", KV_CACHE_DTYPES),
    gpuMemoryUtilization: gmu,
    numGpuBlocksOverride: optInt(o.numGpuBlocksOverride, "--num-gpu-blocks-override", 2),
    enablePrefixCaching: (o.enablePrefixCaching as boolean | undefined) ?? null,
    seed: int(o.seed ?? "0", "--seed", 0),
    // vLLM's O0 compiles nothing and captures no graphs: Kiln's eager mode; levels 1-3 tune GPU compilation only
    enforceEager: Boolean(o.enforceEager) || compilation.eager || optimizationLevel === 0,
    enableSleepMode: Boolean(o.enableSleepMode),
    maxCaptureSize: captureFlag ?? compilation.maxCaptureSize,
    asyncScheduling: (o.asyncScheduling as boolean | undefined) ?? null,
    tensorParallelSize: tp,
    schedulingPolicy: oneOf(o.schedulingPolicy ?? "fcfs", "--scheduling-policy", SCHEDULING_POLICIES),
    logprobsMode: oneOf(String(o.logprobsMode ?? "raw_logprobs"), "--logprobs-mode", LOGPROBS_MODES),
    logitsProcessors: parseLogitsProcessors(o.logitsProcessors),
    enableLora: Boolean(o.enableLora),
    maxLoras,
    maxLoraRank: optInt(o.maxLoraRank, "--max-lora-rank", 1),
    maxCpuLoras,
    maxLogprobs: int(o.maxLogprobs ?? "20", "--max-logprobs", -1),
    enableChunkedPrefill,
    longPrefillTokenThreshold: optInt(o.longPrefillTokenThreshold, "--long-prefill-token-threshold", 0),
  };
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

/** vLLM's CompilationConfig keys with a meaning here; the rest tune torch.compile and CUDA graphs, which Kiln has not. */
const COMPILATION_KEYS = ["level", "mode", "cudagraph_mode", "use_cudagraph", "max_cudagraph_capture_size", "cudagraph_capture_sizes"];
const CUDAGRAPH_MODES = ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"];
const COMPILATION_MODES = ["NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE"];

/**
 * -O / --compilation-config: a level (-O0 .. -O3), -O.key=value, or vLLM's JSON. Level / mode 0 ("NONE") and
 * cudagraph_mode NONE run eagerly (vLLM's O0: no compilation, no graphs); max_cudagraph_capture_size (or the largest
 * of cudagraph_capture_sizes: Kiln captures powers of two up to it) caps the step graphs.
 */
function parseCompilationConfig(value: unknown, warnings: string[]): { eager: boolean; maxCaptureSize: number | null } {
  if (value === undefined) return { eager: false, maxCaptureSize: null };
  const flag = "--compilation-config";
  const s = String(value).trim();
  let c: Record<string, unknown>;
  if (/^\d+$/.test(s)) c = { level: Number(s) };
  else if (s.startsWith(".")) {
    // -O.cudagraph_mode=NONE (vLLM's dotted form): one key; its value JSON where it parses
    const eq = s.indexOf("=");
    if (eq < 2) throw new CliUsageError(`${flag}: -O.key=value needs a key and a value, got ${JSON.stringify(s)}`);
    const raw = s.slice(eq + 1);
    let v: unknown = raw;
    try {
      v = JSON.parse(raw);
    } catch {
      v = raw;
    }
    c = { [s.slice(1, eq)]: v };
  } else c = jsonObjectFlag(s, flag, '{"level": 0}');
  const level = c.mode ?? c.level;
  if (level !== undefined && !((typeof level === "number" && Number.isInteger(level) && level >= 0 && level <= 3) || COMPILATION_MODES.includes(level as string)))
    throw new CliUsageError(`${flag}: level / mode must be 0 to 3 (or ${COMPILATION_MODES.join(", ")}), got ${JSON.stringify(level)}`);
  const graphs = c.cudagraph_mode;
  if (graphs !== undefined && !CUDAGRAPH_MODES.includes(graphs as string))
    throw new CliUsageError(`${flag}: cudagraph_mode must be one of ${CUDAGRAPH_MODES.join(", ")}, got ${JSON.stringify(graphs)}`);
  let maxCaptureSize: number | null = null;
  if (c.max_cudagraph_capture_size !== undefined) maxCaptureSize = int(String(c.max_cudagraph_capture_size), `${flag} max_cudagraph_capture_size`, 1);
  const sizes = c.cudagraph_capture_sizes;
  if (sizes !== undefined) {
    if (!Array.isArray(sizes) || sizes.length === 0 || !sizes.every((x) => Number.isInteger(x) && (x as number) >= 1))
      throw new CliUsageError(`${flag}: cudagraph_capture_sizes must be a list of integers >= 1, got ${JSON.stringify(sizes)}`);
    maxCaptureSize ??= Math.max(...(sizes as number[]));
    warnings.push(`${flag}: cudagraph_capture_sizes: Kiln captures powers of two up to ${maxCaptureSize}, not the list's sizes`);
  }
  const other = Object.keys(c).filter((k) => !COMPILATION_KEYS.includes(k));
  if (other.length > 0) warnings.push(`${flag}: ${other.join(", ")}: no effect (they tune torch.compile / CUDA graphs; Kiln's step graphs have no such setting)`);
  const eager = level === 0 || level === "NONE" || graphs === "NONE" || c.use_cudagraph === false;
  return { eager, maxCaptureSize };
}
