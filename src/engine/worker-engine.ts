// EngineClient whose EngineCore runs in a worker thread (engine-worker-main.ts), so the caller's event loop
// (an HTTP server's) is never blocked by scheduling, the forward pass, sampling or detokenization. The
// caller's thread keeps only the tokenizer (for /tokenize and chat templates) and per-request streams; the
// worker sends one batched message per engine step with every request's new tokens and text.
import * as fs from "node:fs";
import * as path from "node:path";
import { Worker } from "node:worker_threads";
import type { GenerationConfig, Tokenizer } from "../models/tokenizer.js";
import { EngineInputError, EngineRequestIdError } from "./errors.js";
import { streamIntervalOf } from "./output-pacing.js";
import {
  fromWireError,
  type FromWorker,
  type TokenizerSource,
  type ToWorker,
  type WireOutput,
  type WorkerServingArgs,
} from "./engine-worker-protocol.js";
import { normalizeSamplingParams } from "./sampling-params.js";
import type { KvCacheDtype } from "./paged-model-runner.js";
import type { ServingArgs } from "./serving.js";
import type { CompletionOutput, EngineClient, EngineStats, GenerateOptions, RequestOutput, SamplingParams, TokenLogprobs } from "./types.js";
import type { LoraRequest } from "./lora-manager.js";
import type { ReasoningParserName } from "./reasoning.js";
import { EngineSleepingError, type PauseMode, type SleepLevel, type WakeTag } from "./sleep-mode.js";
import type { ResolvedEngineArgs } from "./engine-core.js";

type ReadyMessage = Extract<FromWorker, { type: "ready" }>;

/**
 * Serving arguments plus engine-level logits processors as module specifiers ("path/or/package[:Export]",
 * relative paths against the cwd), imported inside the worker at start-up (vLLM `logits_processors`).
 */
export interface WorkerEngineArgs extends ServingArgs {
  logitsProcessors?: readonly string[];
}

/** One generate() call on this side: its queue of outputs and, for cumulative streams, what came so far. */
interface Stream {
  seq: number;
  requestId: string;
  prompt: string | null;
  delta: boolean;
  promptTokenIds: number[];
  promptLogprobs: (TokenLogprobs | null)[] | null;
  texts: string[]; // per sample, cumulative (unused for delta streams)
  tokenIds: number[][];
  logprobs: (TokenLogprobs[] | null)[];
  queue: RequestOutput[];
  wake: (() => void) | null;
  done: boolean;
  error: Error | null;
}

/**
 * @example
 * const engine = await WorkerEngine.create({ model: "models/kiln-default", maxModelLen: 2048 });
 * const ids = engine.tokenizer.encode("Hello");
 * for await (const out of engine.generate({ promptTokenIds: ids }, { maxTokens: 8 }, { requestId: "a", delta: true }))
 *   process.stdout.write(out.outputs[0]!.text);
 * await engine.close();
 */
export class WorkerEngine implements EngineClient {
  readonly tokenizer: Tokenizer;
  readonly generationConfig: GenerationConfig | null;
  readonly maxModelLen: number;
  readonly reasoningParser: ReasoningParserName | null;
  readonly poolingTask: "embed" | "classify" | null;
  readonly classLabels: string[] | null;
  readonly useSepToken: boolean | null;
  /** KV capacity in tokens, and the pool's shape (block 0 is the engine's null block). */
  readonly kvTokens: number;
  /** The KV cache's element type. */
  readonly kvCacheDtype: KvCacheDtype;
  readonly numBlocks: number;
  readonly blockSize: number;
  readonly vocabSize: number;
  readonly engineArgs: Readonly<ResolvedEngineArgs>;
  private readonly maxLogprobs: number;
  private snapshot: EngineStats;
  private readonly streams = new Map<number, Stream>(); // seq -> stream, until its final output or error
  private readonly live = new Map<string, number>(); // request id -> seq, until finished or aborted
  private readonly syncs = new Map<number, (s: EngineStats) => void>();
  /** Calls waiting for their reply (addLora, removeLora, resetPrefixCache), by id. */
  private readonly calls = new Map<number, { resolve: (value: boolean | undefined) => void; reject: (e: Error) => void }>();
  private nextSeq = 1;
  private fatal: Error | null = null;
  private closed = false;
  private exited = false;

  private constructor(
    private readonly worker: Worker,
    ready: ReadyMessage,
    early: EarlyTokenizer | null,
    modules: TokenizerModules,
  ) {
    const src = ready.tokenizer;
    const same = early !== null && src.kind === "dir" && path.resolve(src.dir) === early.dir && path.resolve(src.generationConfigDir ?? src.dir) === early.genDir;
    this.tokenizer = same ? early.tokenizer : loadTokenizer(src, modules);
    this.generationConfig = ready.generationConfig;
    this.maxModelLen = ready.maxModelLen;
    this.reasoningParser = ready.reasoningParser;
    this.poolingTask = ready.poolingTask;
    this.classLabels = ready.classLabels;
    this.useSepToken = ready.useSepToken;
    this.kvTokens = ready.kvTokens;
    this.kvCacheDtype = ready.kvCacheDtype;
    this.numBlocks = ready.numBlocks;
    this.blockSize = ready.blockSize;
    this.vocabSize = ready.vocabSize;
    this.maxLogprobs = ready.maxLogprobs;
    this.engineArgs = ready.engineArgs;
    this.snapshot = ready.stats;
    worker.on("message", (m: FromWorker) => this.onMessage(m));
    worker.on("error", (err) => this.failAll(err));
    worker.on("exit", (code) => {
      this.exited = true;
      if (!this.closed) this.failAll(new Error(`[engine] the engine worker exited (code ${code})`));
    });
  }

  /**
   * Spawns the worker, which imports the logits processors, loads the model and sizes the KV cache
   * (createServingSetup); resolves once it is ready to serve, or rejects with the worker's error (a
   * LogitsProcessorLoadError naming the specifier that failed). Loading progress is forwarded to
   * `onProgress` (or `args.onProgress`).
   */
  static create(args: WorkerEngineArgs, onProgress?: (stage: string, fraction: number) => void): Promise<WorkerEngine> {
    const { onProgress: argsProgress, logitsProcessors, ...servingArgs } = args;
    const progress = onProgress ?? argsProgress;
    const workerArgs: WorkerServingArgs = { ...servingArgs, logitsProcessors: [...(logitsProcessors ?? [])] };
    // The worker starts first: the tokenizer's modules (the @huggingface libraries, GGUF) load on this thread
    // only after it, and then this thread reads the tokenizer the worker will most likely name.
    const worker = takePrespawned() ?? new Worker(new URL("./engine-worker-main.js", import.meta.url));
    worker.postMessage({ type: "start", args: workerArgs } satisfies ToWorker);
    // --tokenizer: its files, with the model directory's generation_config.json (the worker names the same)
    const dir = path.resolve(servingArgs.tokenizer ?? servingArgs.model);
    const genDir = servingArgs.tokenizer !== undefined && fs.statSync(servingArgs.model, { throwIfNoEntry: false })?.isDirectory() ? path.resolve(servingArgs.model) : dir;
    const tokenizing = importTokenizerModules().then((modules) => {
      let early: EarlyTokenizer | null = null;
      if (servingArgs.skipTokenizerInit !== true && fs.existsSync(path.join(dir, "tokenizer.json"))) {
        try {
          early = { dir, genDir, tokenizer: modules.Tokenizer.fromDir(dir, { generationConfigDir: genDir }) };
        } catch {
          // the worker reports what is wrong with the model directory
        }
      }
      return { modules, early };
    });
    tokenizing.catch(() => undefined); // handled once the worker is ready; a worker that fails first reports its own error
    return new Promise((resolve, reject) => {
      const fail = (err: Error): void => {
        if (settled) return;
        settled = true;
        worker.off("message", onMessage);
        void worker.terminate();
        reject(err);
      };
      // The start-up listeners stay until the engine takes over with its own (after this thread's tokenizer is
      // ready): a fatal message, error or exit in between fails the start instead of going unheard.
      let settled = false;
      const onMessage = (m: FromWorker): void => {
        if (m.type === "progress") progress?.(m.stage, m.fraction);
        else if (m.type === "fatal") fail(fromWireError(m.error));
        else if (m.type === "ready") {
          tokenizing.then(
            ({ modules, early }) => {
              if (settled) return;
              worker.off("message", onMessage);
              worker.off("error", fail);
              worker.off("exit", onExit);
              try {
                const engine = new WorkerEngine(worker, m, early, modules);
                settled = true;
                resolve(engine);
              } catch (err) {
                fail(err as Error);
              }
            },
            (err: unknown) => fail(err as Error),
          );
        }
      };
      const onExit = (code: number): void => fail(new Error(`[engine] the engine worker exited during start-up (code ${code})`));
      worker.on("message", onMessage);
      worker.on("error", fail);
      worker.on("exit", onExit);
    });
  }

  /**
   * Validates on this thread what it can (sampling params, prompt ids and length), throwing EngineInputError
   * synchronously; the worker checks the rest (KV pool fit, bad words), and then the stream's first
   * iteration throws. Leaving the loop early aborts the request.
   */
  generate(
    prompt: { promptTokenIds: number[]; prompt?: string },
    params: Partial<SamplingParams>,
    options: GenerateOptions,
  ): AsyncIterable<RequestOutput> {
    if (this.fatal !== null) throw this.fatal;
    if (this.closed) throw new Error("[engine] the engine is closed");
    const { requestId } = options;
    if (this.isSleeping()) throw new EngineSleepingError(); // (a request racing a sleep call is refused by the worker)
    if (typeof requestId !== "string" || requestId.length === 0) throw new EngineInputError("request_id", "must be a non-empty string");
    if (this.live.has(requestId)) throw new EngineRequestIdError(requestId, "is already in use");
    if ((params.logitsProcessors?.length ?? 0) > 0)
      throw new EngineInputError(
        "logits_processors",
        "per-request logits processors are functions and cannot cross to the engine worker; load an engine-level " +
          "processor at start-up instead (`kiln serve --logits-processors ./my-proc.mjs:MyProc`, engine arg " +
          "logitsProcessors) and steer it per request with extraArgs (`vllm_xargs` over HTTP), or use the " +
          "in-process engine (KILN_ENGINE_IN_PROCESS=1) or the offline LLM",
      );
    const streamInterval = streamIntervalOf(options); // checked here, so that a bad one throws from generate() itself
    const p = normalizeSamplingParams(params, { maxLogprobs: this.maxLogprobs, vocabSize: this.vocabSize });
    const ids = prompt.promptTokenIds;
    if (!Array.isArray(ids) || ids.length === 0) throw new EngineInputError("prompt", "the prompt is empty");
    for (const t of ids)
      if (!Number.isInteger(t) || t < 0 || t >= this.vocabSize)
        throw new EngineInputError("prompt_token_ids", `token id ${t} is out of vocabulary range [0, ${this.vocabSize})`);
    const promptLen = p.truncatePromptTokens === null ? ids.length : Math.min(ids.length, p.truncatePromptTokens);
    if (promptLen > this.maxModelLen)
      throw new EngineInputError(
        "prompt",
        `the prompt (length ${promptLen}) is longer than the maximum model length of ${this.maxModelLen}`,
      );

    const seq = this.nextSeq++;
    const stream: Stream = {
      seq,
      requestId,
      prompt: prompt.prompt ?? null,
      delta: options.delta ?? false,
      promptTokenIds: ids,
      promptLogprobs: null,
      texts: [],
      tokenIds: [],
      logprobs: [],
      queue: [],
      wake: null,
      done: false,
      error: null,
    };
    this.streams.set(seq, stream);
    this.live.set(requestId, seq);
    this.send({
      type: "add",
      seq,
      requestId,
      promptTokenIds: [...ids],
      params: p,
      priority: options.priority ?? 0,
      cacheSalt: options.cacheSalt ?? null,
      arrivalTime: Date.now(),
      loraRequest: options.loraRequest ?? null,
      kvTransfer: options.kvTransfer ?? null,
      mmFeatures: options.mmFeatures ?? [],
      streamInterval,
      finalOnly: options.finalOnly ?? false,
    });
    return this.iterate(stream);
  }

  private async *iterate(stream: Stream): AsyncGenerator<RequestOutput> {
    let finished = false;
    try {
      for (;;) {
        while (stream.queue.length === 0 && !stream.done) await new Promise<void>((resolve) => (stream.wake = resolve));
        const out = stream.queue.shift();
        if (out === undefined) {
          if (stream.error !== null) throw stream.error;
          return;
        }
        finished = out.finished;
        yield out;
        if (finished) return;
      }
    } finally {
      if (!finished && stream.error === null) this.abortSeqs([stream]);
    }
  }

  /**
   * Aborts requests in one message: the worker frees their blocks as soon as it reads it (one message for many ids, so
   * that no engine step runs between them); their streams end with "abort".
   */
  abort(requestIds: string | readonly string[]): void {
    const seqs = (typeof requestIds === "string" ? [requestIds] : requestIds).flatMap((id) => this.live.get(id) ?? []);
    this.abortSeqs(seqs.flatMap((seq) => this.streams.get(seq) ?? []));
  }

  private abortSeqs(streams: Stream[]): void {
    const seqs: number[] = [];
    for (const stream of streams) {
      if (this.live.get(stream.requestId) !== stream.seq) continue; // already finished or aborted
      this.live.delete(stream.requestId); // the id is free again: the worker reads this abort before any re-add
      seqs.push(stream.seq);
    }
    if (seqs.length > 0) this.send({ type: "abort", seqs });
  }

  /** The error that failed the engine (its worker or a tensor-parallel rank died), or null while it serves. */
  deadError(): Error | null {
    return this.fatal;
  }

  /** The stats snapshot the worker pushed after its last step (synchronous, as the server's metrics need). */
  stats(): EngineStats {
    return { ...this.snapshot };
  }

  /** Fresh stats after every message sent so far was handled by the worker (e.g. after an abort). */
  refreshStats(): Promise<EngineStats> {
    if (this.fatal !== null) return Promise.reject(this.fatal);
    const id = this.nextSeq++;
    return new Promise((resolve) => {
      this.syncs.set(id, resolve);
      this.send({ type: "sync", id });
    });
  }

  /** Reads and checks a LoRA adapter in the worker's engine; rejects with its EngineInputError. */
  addLora(lora: LoraRequest): Promise<void> {
    return this.call((id) => ({ type: "addLora", id, lora })).then(() => undefined);
  }

  /** Drops an adapter no request uses; false when unknown or in use. */
  removeLora(loraId: number): Promise<boolean> {
    return this.call((id) => ({ type: "removeLora", id, loraId })).then((removed) => removed === true);
  }

  /** Drops the prefix cache in the worker, between two of its steps; true when every cached block was dropped. */
  resetPrefixCache(): Promise<boolean> {
    return this.call((id) => ({ type: "resetPrefixCache", id })).then((all) => all === true);
  }

  /** Sleep mode in the worker's engine (AsyncLLM.sleep): resolves once it sleeps. */
  sleep(level: SleepLevel, mode: PauseMode): Promise<void> {
    return this.call((id) => ({ type: "sleep", id, level, mode })).then(() => undefined);
  }

  wakeUp(tags: readonly WakeTag[] | null): Promise<void> {
    return this.call((id) => ({ type: "wakeUp", id, tags: tags === null ? null : [...tags] })).then(() => undefined);
  }

  /** As of the worker's last update (a sleep or wake_up call has resolved after the update that shows it). */
  isSleeping(): boolean {
    return this.snapshot.sleep?.isSleeping === true;
  }

  /** Sends a call and resolves with its reply's value (rejects with its error). */
  private call(message: (id: number) => ToWorker): Promise<boolean | undefined> {
    if (this.fatal !== null) return Promise.reject(this.fatal);
    if (this.closed) return Promise.reject(new Error("[engine] the engine is closed"));
    const id = this.nextSeq++;
    return new Promise((resolve, reject) => {
      this.calls.set(id, { resolve, reject });
      this.send(message(id));
    });
  }

  /**
   * Ends every stream and terminates the worker (the model and KV cache go with it), after it has stopped any
   * tensor-parallel ranks it spawned (waiting at most `graceMs` for that).
   */
  async close(graceMs = 5000): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.failAll(new Error("[engine] the engine was closed"));
    if (!this.exited) {
      await new Promise<void>((resolve) => {
        const done = (): void => {
          clearTimeout(timer);
          this.worker.off("message", onMessage);
          this.worker.off("exit", done);
          resolve();
        };
        const onMessage = (m: FromWorker): void => {
          if (m.type === "closed") done();
        };
        const timer = setTimeout(done, graceMs);
        this.worker.on("message", onMessage);
        this.worker.once("exit", done);
        try {
          this.send({ type: "close" });
        } catch {
          done();
        }
      });
    }
    await this.worker.terminate();
  }

  private send(m: ToWorker): void {
    this.worker.postMessage(m);
  }

  private onMessage(m: FromWorker): void {
    switch (m.type) {
      case "update":
        this.snapshot = m.stats;
        for (const { seq, error } of m.errors) {
          const s = this.streams.get(seq);
          if (s !== undefined) this.end(s, fromWireError(error));
        }
        for (const w of m.outputs) this.deliver(w);
        for (const r of m.replies) {
          const waiting = this.calls.get(r.id);
          this.calls.delete(r.id);
          if (r.error !== null) waiting?.reject(fromWireError(r.error));
          else waiting?.resolve(r.value);
        }
        for (const id of m.syncIds) {
          this.syncs.get(id)?.(m.stats);
          this.syncs.delete(id);
        }
        break;
      case "fatal":
        this.failAll(fromWireError(m.error));
        break;
      default:
        break; // late progress messages
    }
  }

  private deliver(w: WireOutput): void {
    const s = this.streams.get(w.seq);
    if (s === undefined) return;
    if (w.promptTokenIds !== undefined) s.promptTokenIds = w.promptTokenIds;
    if (w.promptLogprobs !== null) s.promptLogprobs = [...(s.promptLogprobs ?? []), ...w.promptLogprobs];
    const outputs: CompletionOutput[] = s.delta ? w.outputs : w.outputs.map((o) => accumulate(s, o));
    s.queue.push({
      requestId: s.requestId,
      prompt: s.prompt,
      promptTokenIds: s.promptTokenIds,
      promptLogprobs: s.promptLogprobs === null ? null : [...s.promptLogprobs],
      outputs,
      finished: w.finished,
      numCachedTokens: w.numCachedTokens,
      metrics: w.metrics,
      ...(w.pooled !== undefined ? { pooled: w.pooled } : {}),
      ...(w.kvSnapshot !== undefined ? { kvSnapshot: w.kvSnapshot } : {}),
      ...(w.tokenSteps !== undefined ? { tokenSteps: w.tokenSteps } : {}),
    });
    if (w.finished) this.end(s, null);
    else this.wake(s);
  }

  private end(s: Stream, error: Error | null): void {
    s.done = true;
    s.error = error;
    this.streams.delete(s.seq);
    if (this.live.get(s.requestId) === s.seq) this.live.delete(s.requestId);
    this.wake(s);
  }

  private wake(s: Stream): void {
    s.wake?.();
    s.wake = null;
  }

  private failAll(err: Error): void {
    this.fatal ??= err;
    for (const s of [...this.streams.values()]) this.end(s, err);
    for (const r of this.calls.values()) r.reject(err);
    this.calls.clear();
  }
}

/** Appends one update to a cumulative stream and returns the sample's full output so far. */
function accumulate(s: Stream, o: WireOutput["outputs"][number]): CompletionOutput {
  const i = o.index;
  s.texts[i] = (s.texts[i] ?? "") + o.text;
  const ids = (s.tokenIds[i] ??= []);
  for (const t of o.tokenIds) ids.push(t);
  if (o.logprobs !== null) {
    const lp = (s.logprobs[i] ??= []);
    for (const l of o.logprobs) lp.push(l);
  }
  const lp = s.logprobs[i] ?? null;
  return { ...o, text: s.texts[i], tokenIds: [...ids], logprobs: lp === null || o.logprobs === null ? null : [...lp] };
}

/** A tokenizer this thread loaded from a model directory while the worker started. */
interface EarlyTokenizer {
  dir: string;
  /** Where its generation_config.json was read. */
  genDir: string;
  tokenizer: Tokenizer;
}

/** A worker spawned before its serving args were known (prespawnEngineWorker), until create() takes it. */
let prespawned: Worker | null = null;

/**
 * Spawns the engine worker now, so that it loads its modules while this thread is still parsing the command line
 * (`kiln serve` calls this first thing: it saves the ~0.05 s between process start and the args being ready).
 * The next WorkerEngine.create() takes it; unused, it keeps nothing alive and is stopped at exit.
 */
export function prespawnEngineWorker(): void {
  if (prespawned !== null) return;
  const worker = new Worker(new URL("./engine-worker-main.js", import.meta.url));
  worker.unref();
  // a worker that fails before create() takes it is dropped (create() spawns a fresh one, which reports the error)
  const drop = (): void => {
    if (prespawned === worker) prespawned = null;
  };
  worker.once("error", drop);
  worker.once("exit", drop);
  prespawned = worker;
}

function takePrespawned(): Worker | null {
  const w = prespawned;
  prespawned = null;
  w?.ref();
  return w;
}

interface TokenizerModules {
  Tokenizer: typeof Tokenizer;
  AbsentTokenizer: typeof import("../models/absent-tokenizer.js").AbsentTokenizer;
  parseGenerationConfig: typeof import("../models/tokenizer.js").parseGenerationConfig;
  readGguf: typeof import("../models/formats/gguf.js").readGguf;
  ggufToTokenizerJson: typeof import("../models/formats/gguf-tokenizer.js").ggufToTokenizerJson;
}

async function importTokenizerModules(): Promise<TokenizerModules> {
  const [{ Tokenizer, parseGenerationConfig }, { readGguf }, { ggufToTokenizerJson }, { AbsentTokenizer }] = await Promise.all([
    import("../models/tokenizer.js"),
    import("../models/formats/gguf.js"),
    import("../models/formats/gguf-tokenizer.js"),
    import("../models/absent-tokenizer.js"),
  ]);
  return { Tokenizer, AbsentTokenizer, parseGenerationConfig, readGguf, ggufToTokenizerJson };
}

function loadTokenizer(src: TokenizerSource, { Tokenizer, AbsentTokenizer, parseGenerationConfig, readGguf, ggufToTokenizerJson }: TokenizerModules): Tokenizer {
  if (src.kind === "none") return AbsentTokenizer.of(src);
  if (src.kind === "dir") return Tokenizer.fromDir(src.dir, { generationConfigDir: src.generationConfigDir });
  const g = readGguf(src.file);
  try {
    const files = ggufToTokenizerJson(g.metadata);
    const eos = (files.tokenizerConfig as { eos_token_id?: number }).eos_token_id;
    const gen = eos !== undefined ? parseGenerationConfig({ eos_token_id: eos }) : null;
    return Tokenizer.fromJson(files.tokenizerJson, files.tokenizerConfig, { generationConfig: gen?.raw ?? null });
  } finally {
    g.close();
  }
}
