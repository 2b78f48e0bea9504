// Engine-level logits processors (vLLM v1 `logits_processors`): objects built once when the engine starts,
// from module specifiers ("path/or/package[:exportName]", loaded with import()) or passed in-process, that
// edit the whole batch's logits every step. Requests steer them with SamplingParams.extraArgs (vLLM
// `extra_args`, the server's `vllm_xargs`): plain data, so it crosses to the engine worker where functions
// cannot. Where they run in the sampler's order is documented in sampler.ts.
import * as fs from "node:fs";
import { createRequire } from "node:module";
import * as path from "node:path";
import { pathToFileURL } from "node:url";
import { KilnError } from "../util/errors.js";
import { EngineInputError } from "./errors.js";
import { normalizeSamplingParams } from "./sampling-params.js";
import type { ExtraArgs, SamplingParams } from "./types.js";

/** One row of the batch as a processor sees it. Row `r` of `logits` is `logits[r * vocabSize, (r + 1) * vocabSize)`. */
export interface LogitsProcessorRow {
  readonly requestId: string; // engine request id (`${i}_${id}` for sample i of an n > 1 request)
  readonly promptTokenIds: readonly number[];
  readonly outputTokenIds: readonly number[]; // generated so far; live, grows between steps
  readonly extraArgs: Readonly<ExtraArgs>; // the request's extraArgs, {} when it set none
  readonly params: Readonly<SamplingParams>;
}

/** What a processor class's constructor gets (vLLM passes its VllmConfig). */
export interface LogitsProcessorConfig {
  vocabSize: number;
}

/**
 * An engine-level logits processor: one instance per engine, applied to every sampled row of every step.
 * Per-request behaviour is keyed on `row.extraArgs`; a processor leaves the rows of requests that did not
 * ask for it untouched.
 *
 * Only `apply` is required. Optional hooks:
 * - `isArgmaxInvariant()`: true if it never changes a row's argmax (e.g. a min-p style filter). Such a
 *   processor runs after temperature, only in steps with a random-sampling row, and its edits to greedy
 *   rows are ignored (vLLM's split). Default false: it runs before penalties and temperature.
 * - `validateParams(params)`: throw to reject a request with bad extraArgs (a 400 over HTTP, param
 *   `extra_args`); called once when the request is added.
 * - `addRequest(row)` / `removeRequest(requestId)`: per-request state (vLLM's BatchUpdate). `addRequest` runs
 *   before a request's first `apply`; `removeRequest` at the first step, after it finished or was aborted,
 *   in which it has no row (the engine has no end-of-request hook into the sampler yet).
 *
 * @example
 * // ban-token.mjs: bans token `ban_token` for the requests that ask for it ({"vllm_xargs": {"ban_token": 42}}).
 * export default class BanToken {
 *   constructor({ vocabSize }) { this.vocabSize = vocabSize; }
 *   validateParams(params) {
 *     const t = params.extraArgs?.ban_token;
 *     if (t !== undefined && !(Number.isInteger(t) && t >= 0 && t < this.vocabSize)) throw new Error("ban_token must be a token id");
 *   }
 *   apply(logits, rows, vocabSize) {
 *     rows.forEach((row, r) => {
 *       const t = row.extraArgs.ban_token;
 *       if (typeof t === "number") logits[r * vocabSize + t] = -Infinity;
 *     });
 *   }
 * }
 * // kiln serve --logits-processors ./ban-token.mjs     or, in-process:  new LLM({ ..., logitsProcessors: [BanToken] })
 */
export interface LogitsProcessor {
  /** Edits `logits` ([rows.length, vocabSize], row-major) in place. */
  apply(logits: Float32Array, rows: readonly LogitsProcessorRow[], vocabSize: number): void;
  isArgmaxInvariant?(): boolean;
  validateParams?(params: Readonly<SamplingParams>): void;
  addRequest?(row: LogitsProcessorRow): void;
  removeRequest?(requestId: string): void;
}

export type LogitsProcessorClass = new (config: LogitsProcessorConfig) => LogitsProcessor;

/** What engines accept in-process: a ready instance, or a class they construct with {@link LogitsProcessorConfig}. */
export type LogitsProcessorInput = LogitsProcessor | LogitsProcessorClass;

/** A logits processor that could not be loaded or constructed; `specifier` names it as it was given. */
export class LogitsProcessorLoadError extends KilnError {
  override name = "LogitsProcessorLoadError";
  constructor(
    readonly specifier: string,
    message: string,
  ) {
    super(`[logits-processors] cannot load ${JSON.stringify(specifier)}: ${message}`);
  }
}

const IDENTIFIER = /^[A-Za-z_$][\w$]*$/;

/** "dir/proc.mjs:BanToken" -> module "dir/proc.mjs", export "BanToken"; no ":Name" -> the default export. */
export function parseLogitsProcessorSpecifier(specifier: string): { module: string; exportName: string } {
  const i = specifier.lastIndexOf(":");
  if (i > 0 && IDENTIFIER.test(specifier.slice(i + 1))) return { module: specifier.slice(0, i), exportName: specifier.slice(i + 1) };
  return { module: specifier, exportName: "default" };
}

/**
 * A file path (relative ones against `cwd`) or file: URL becomes a file URL; a bare package name resolves
 * from `cwd`'s node_modules, else from Kiln's own (ESM-only packages that `require.resolve` cannot see).
 */
function moduleUrl(module: string, cwd: string): string {
  if (module.startsWith("file:")) return module;
  const abs = path.resolve(cwd, module);
  if (module.startsWith(".") || path.isAbsolute(module) || fs.existsSync(abs)) return pathToFileURL(abs).href;
  try {
    return pathToFileURL(createRequire(path.join(cwd, "index.js")).resolve(module)).href;
  } catch {
    return module;
  }
}

const isProcessor = (x: unknown): x is LogitsProcessor =>
  typeof x === "object" && x !== null && typeof (x as { apply?: unknown }).apply === "function";

/**
 * Imports each specifier's export (a class or an instance). Throws {@link LogitsProcessorLoadError} naming
 * the first one that fails. Construct them with {@link instantiateLogitsProcessors} once the vocabulary is known.
 *
 * @example
 * const procs = await loadLogitsProcessors(["./ban-token.mjs", "my-package:TopicFilter"]);
 * const llm = new LLM({ model: "models/kiln-default", logitsProcessors: procs });
 */
export async function loadLogitsProcessors(specifiers: readonly string[], cwd = process.cwd()): Promise<LogitsProcessorInput[]> {
  const out: LogitsProcessorInput[] = [];
  for (const spec of specifiers) {
    if (typeof spec !== "string" || spec.length === 0)
      throw new LogitsProcessorLoadError(String(spec), "the specifier must be a non-empty string");
    const { module, exportName } = parseLogitsProcessorSpecifier(spec);
    let ns: Record<string, unknown>;
    try {
      ns = (await import(moduleUrl(module, cwd))) as Record<string, unknown>;
    } catch (e) {
      throw new LogitsProcessorLoadError(spec, `import failed: ${(e as Error).message ?? String(e)}`);
    }
    const value = ns[exportName];
    if (value === undefined) {
      const names = Object.keys(ns).join(", ") || "none";
      throw new LogitsProcessorLoadError(
        spec,
        `the module has no export ${JSON.stringify(exportName)} (exports: ${names}); name one as "${module}:Name"`,
      );
    }
    if (typeof value !== "function" && !isProcessor(value))
      throw new LogitsProcessorLoadError(
        spec,
        `export ${JSON.stringify(exportName)} is neither a class nor an object with an apply() method`,
      );
    out.push(value as LogitsProcessorInput);
  }
  return out;
}

/**
 * Constructs the classes among `inputs` (instances pass through) and checks each has `apply`. `labels` name
 * them in errors (the specifiers they came from; default: the class name).
 */
export function instantiateLogitsProcessors(
  inputs: readonly LogitsProcessorInput[],
  config: LogitsProcessorConfig,
  labels: readonly string[] = [],
): LogitsProcessor[] {
  return inputs.map((input, i) => {
    const label = labels[i] ?? ((input as { name?: unknown }).name || (input as object).constructor?.name || `#${i}`);
    if (typeof input === "string")
      throw new LogitsProcessorLoadError(input, "module specifiers must be loaded first: pass `await loadLogitsProcessors([...])`");
    let proc: unknown = input;
    if (typeof input === "function") {
      try {
        proc = new input(config);
      } catch (e) {
        throw new LogitsProcessorLoadError(String(label), `its constructor threw: ${(e as Error).message ?? String(e)}`);
      }
    }
    if (!isProcessor(proc)) throw new LogitsProcessorLoadError(String(label), "it has no apply(logits, rows, vocabSize) method");
    return proc;
  });
}

/** What the processors need of one engine request; the engine's Request satisfies it. */
export interface ProcessorRequestSource {
  readonly requestId: string;
  readonly params: SamplingParams;
  readonly promptTokenIds: readonly number[];
  readonly outputTokenIds: readonly number[];
  readonly isFinished: boolean;
}

const NO_EXTRA_ARGS: Readonly<ExtraArgs> = Object.freeze({});

interface Live {
  source: ProcessorRequestSource;
  row: { -readonly [K in keyof LogitsProcessorRow]: LogitsProcessorRow[K] };
}

/**
 * The engine's processors split by argmax invariance, plus the per-request bookkeeping that drives their
 * addRequest/removeRequest hooks (vLLM's LogitsProcessors + BatchUpdateBuilder, keyed by request id
 * because Kiln's batch has no persistent row slots).
 */
export class LogitsProcessorSet {
  readonly nonArgmaxInvariant: readonly LogitsProcessor[];
  readonly argmaxInvariant: readonly LogitsProcessor[];
  private readonly all: readonly LogitsProcessor[];
  private readonly validators: readonly LogitsProcessor[];
  private readonly live = new Map<string, Live>();

  constructor(processors: readonly LogitsProcessor[]) {
    this.all = processors;
    this.argmaxInvariant = processors.filter((p) => p.isArgmaxInvariant?.() === true);
    this.nonArgmaxInvariant = processors.filter((p) => p.isArgmaxInvariant?.() !== true);
    this.validators = processors.filter((p) => typeof p.validateParams === "function");
  }

  get size(): number {
    return this.all.length;
  }

  /**
   * Runs every processor's validateParams on a request's params. Throws EngineInputError (param
   * `extra_args`) with the processor's message; invalid standard params throw as normalizeSamplingParams does.
   */
  validateParams(partial: Partial<SamplingParams>): void {
    if (this.validators.length === 0) return;
    // maxLogprobs unbounded: the engine checks it against its own limit when the request is added.
    const params = normalizeSamplingParams(partial, { maxLogprobs: Number.MAX_SAFE_INTEGER });
    for (const p of this.validators) {
      try {
        p.validateParams!(params);
      } catch (e) {
        throw new EngineInputError("extra_args", `${p.constructor?.name ?? "logits processor"}: ${(e as Error).message ?? String(e)}`);
      }
    }
  }

  /**
   * The rows of this step, in order. First fires removeRequest for tracked requests that finished (or whose
   * id now belongs to a new request) and addRequest for requests seen for the first time.
   */
  rowsFor(sources: readonly ProcessorRequestSource[]): LogitsProcessorRow[] {
    this.releaseFinished(sources);
    return sources.map((source) => {
      let live = this.live.get(source.requestId);
      if (live === undefined) {
        live = {
          source,
          row: {
            requestId: source.requestId,
            promptTokenIds: source.promptTokenIds,
            outputTokenIds: source.outputTokenIds,
            extraArgs: source.params.extraArgs ?? NO_EXTRA_ARGS,
            params: source.params,
          },
        };
        this.live.set(source.requestId, live);
        for (const p of this.all) p.addRequest?.(live.row);
      }
      live.row.outputTokenIds = source.outputTokenIds;
      return live.row;
    });
  }

  /**
   * Fires removeRequest for every tracked request that finished and has no row in `current` (a request
   * aborted while its step computed still gets that row processed), or whose id `current` gives to a new request.
   */
  releaseFinished(current: readonly ProcessorRequestSource[] = []): void {
    if (this.live.size === 0) return;
    const inStep = new Map<string, ProcessorRequestSource>();
    for (const s of current) inStep.set(s.requestId, s);
    for (const [id, live] of this.live) {
      const s = inStep.get(id);
      if (s === live.source || (s === undefined && !live.source.isFinished)) continue;
      this.live.delete(id);
      for (const p of this.all) p.removeRequest?.(id);
    }
  }

  /** Number of requests whose per-request state the processors currently hold. */
  get numTracked(): number {
    return this.live.size;
  }
}
