// Streaming engine client (vLLM's AsyncLLM): requests stream RequestOutputs while one loop drives
// EngineCore.step(), yielding to the event loop between steps. EngineCore is a plain class so this loop can
// later move to a worker thread with the same EngineClient surface.
import type { Drafter } from "./speculative.js";
import type { TokenizerLike } from "../models/tokenizer-types.js";
import { EngineCore, type EngineArgs, type ResolvedEngineArgs } from "./engine-core.js";
import type { LogitsProcessorInput } from "./logits-processors.js";
import type { ModelRunner } from "./model-runner.js";
import type { LoraRequest } from "./lora-manager.js";
import type { ReasoningParserName } from "./reasoning.js";
import type { PauseMode, SleepLevel, WakeTag } from "./sleep-mode.js";
import type { EngineClient, EngineStats, GenerateOptions, RequestOutput, SamplingParams } from "./types.js";
import { epochNow, outputPacer, type OutputPacer } from "./output-pacing.js";

interface Stream {
  /** Which steps' outputs it gets (null: every step's). */
  pacer: OutputPacer | null;
  queue: RequestOutput[];
  wake: (() => void) | null;
  done: boolean;
  error: unknown;
}

const yieldToEventLoop = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

export interface AsyncLLMOptions {
  runner: ModelRunner;
  tokenizer: TokenizerLike | null;
  engineArgs: EngineArgs;
  /** Engine-level logits processors (vLLM `logits_processors`): instances, or classes built with {vocabSize}. */
  logitsProcessors?: readonly LogitsProcessorInput[];
  /** The drafter of speculativeConfig's draft_model, eagle and eagle3 methods (ServingSetup.draft). */
  draft?: Drafter | null;
}

/**
 * @example
 * const llm = new AsyncLLM({ runner, tokenizer, engineArgs: { maxModelLen: 2048, numGpuBlocks: 512 } });
 * for await (const out of llm.generate({ promptTokenIds: [1, 2, 3] }, { maxTokens: 8 }, { requestId: "a", delta: true }))
 *   process.stdout.write(out.outputs[0]!.text);
 */
export class AsyncLLM implements EngineClient {
  readonly engine: EngineCore;
  private readonly streams = new Map<string, Stream>();
  private looping = false;
  private fatal: Error | null = null;

  constructor(options: AsyncLLMOptions) {
    this.engine = new EngineCore(options.engineArgs, options.runner, {
      tokenizer: options.tokenizer,
      logitsProcessors: options.logitsProcessors,
      draft: options.draft ?? null,
    });
  }

  get maxModelLen(): number {
    return this.engine.maxModelLen;
  }

  get reasoningParser(): ReasoningParserName | null {
    return this.engine.args.reasoningParser;
  }

  get poolingTask(): "embed" | "classify" | null {
    return this.engine.poolingTask;
  }

  get classLabels(): string[] | null {
    return this.engine.classLabels;
  }

  get useSepToken(): boolean | null {
    return this.engine.useSepToken;
  }

  /**
   * Adds the request at once (throwing EngineInputError synchronously if it is invalid) and streams its
   * outputs. Leaving the loop early aborts the request.
   */
  generate(
    prompt: { promptTokenIds: number[]; prompt?: string },
    params: Partial<SamplingParams>,
    options: GenerateOptions,
  ): AsyncIterable<RequestOutput> {
    if (this.fatal !== null) throw this.fatal;
    const { requestId } = options;
    const pacer = outputPacer(options);
    this.engine.sampler.validateParams(params);
    this.engine.addRequest({
      requestId,
      promptTokenIds: prompt.promptTokenIds,
      prompt: prompt.prompt ?? null,
      params,
      priority: options.priority,
      cacheSalt: options.cacheSalt ?? null,
      loraRequest: options.loraRequest ?? null,
      kvTransfer: options.kvTransfer ?? null,
      ...(options.mmFeatures ? { mmFeatures: options.mmFeatures } : {}),
    });
    const stream: Stream = { pacer, queue: [], wake: null, done: false, error: null };
    this.streams.set(requestId, stream);
    this.startLoop();
    return this.iterate(requestId, stream, options.delta ?? false);
  }

  private async *iterate(requestId: string, stream: Stream, delta: boolean): AsyncGenerator<RequestOutput> {
    const sentTokens: number[] = [];
    const sentChars: number[] = [];
    let finished = false;
    try {
      for (;;) {
        while (stream.queue.length === 0 && !stream.done) await new Promise<void>((resolve) => (stream.wake = resolve));
        if (stream.error !== null) throw stream.error;
        const out = stream.queue.shift();
        if (out === undefined) return;
        finished = out.finished;
        yield delta ? toDelta(out, sentTokens, sentChars) : out;
        if (finished) return;
      }
    } finally {
      if (!finished) this.abort(requestId);
      this.streams.delete(requestId);
    }
  }

  private deliver(out: RequestOutput): void {
    const s = this.streams.get(out.requestId);
    if (s === undefined || s.done) return;
    if (s.pacer !== null) {
      const tokenSteps = s.pacer.offer(out, epochNow());
      if (tokenSteps === null) return; // held back: outputs are cumulative, the next one delivered carries it
      out = { ...out, tokenSteps };
    }
    s.queue.push(out);
    if (out.finished) s.done = true;
    s.wake?.();
    s.wake = null;
  }

  private startLoop(): void {
    if (this.looping) return;
    this.looping = true;
    void (async () => {
      try {
        while (this.engine.hasWork()) {
          for (const out of this.engine.step()) this.deliver(out);
          await yieldToEventLoop();
        }
      } catch (err) {
        // A failed step takes every stream down with it (the engine state is not trustworthy anymore).
        this.fail(err as Error);
      } finally {
        this.looping = false;
      }
    })();
  }

  /** The error that failed the engine (a step threw, or fail() was called), or null while it serves. */
  deadError(): Error | null {
    return this.fatal;
  }

  /**
   * Fails the engine, as the worker engine fails on its worker's fatal message: every stream ends with `err`, later
   * requests are refused with it, and deadError() reports it (the server's /health answers 503). For a failure seen
   * outside the step loop, such as a tensor-parallel rank dying while the engine idles.
   */
  fail(err: Error): void {
    this.fatal ??= err;
    for (const s of this.streams.values()) {
      s.error = err;
      s.done = true;
      s.wake?.();
    }
  }

  /**
   * vLLM's AsyncLLM.shutdown: every stream ends with an error, later requests are refused, the running requests are
   * aborted and the engine's grammar threads stopped (EngineCore.close). The caller still owns the runner.
   */
  async close(): Promise<void> {
    this.fail(new Error("[engine] the engine was closed"));
    this.engine.abortRequest([...this.streams.keys()]);
    await this.engine.close();
  }

  /** Aborts requests: their blocks are freed now and their streams end with finishReason "abort". */
  abort(requestIds: string | readonly string[]): void {
    for (const out of this.engine.abortRequest(typeof requestIds === "string" ? [requestIds] : requestIds)) this.deliver(out);
  }

  stats(): EngineStats {
    return this.engine.stats();
  }

  addLora(lora: LoraRequest): Promise<void> {
    try {
      this.engine.addLora(lora);
      return Promise.resolve();
    } catch (e) {
      return Promise.reject(e as Error);
    }
  }

  removeLora(id: number): Promise<boolean> {
    return Promise.resolve(this.engine.removeLora(id));
  }

  /** Drops the prefix cache between two steps (the loop yields to the event loop after each). */
  resetPrefixCache(): Promise<boolean> {
    return Promise.resolve(this.engine.resetPrefixCache());
  }

  /**
   * vLLM's sleep, between two steps (see EngineCore.sleep): "abort" ends the requests' streams with finish reason abort,
   * "wait" refuses new requests and resolves once the others have finished and the engine sleeps.
   */
  async sleep(level: SleepLevel, mode: PauseMode): Promise<void> {
    if (mode === "wait") {
      this.engine.beginDrain(); // (refused without sleep mode)
      // the step loop runs the requests to their end (a paused engine's never end: it is asleep already)
      while (this.engine.hasWork()) await new Promise((resolve) => setTimeout(resolve, 1));
    }
    for (const out of this.engine.sleep(level, mode === "wait" ? "keep" : mode)) this.deliver(out);
  }

  /** vLLM's wake_up; the requests a "keep" sleep kept resume once nothing is asleep. */
  wakeUp(tags: readonly WakeTag[] | null): Promise<void> {
    try {
      this.engine.wakeUp(tags);
    } catch (e) {
      return Promise.reject(e as Error);
    }
    this.startLoop();
    return Promise.resolve();
  }

  isSleeping(): boolean {
    return this.engine.sleepStatus().isSleeping;
  }

  get engineArgs(): Readonly<ResolvedEngineArgs> {
    return this.engine.args;
  }
}

/** Turns a cumulative output into a delta (new tokens and text only), tracking what was sent per sample. */
function toDelta(out: RequestOutput, sentTokens: number[], sentChars: number[]): RequestOutput {
  return {
    ...out,
    outputs: out.outputs.map((o) => {
      const t = sentTokens[o.index] ?? 0;
      const c = sentChars[o.index] ?? 0;
      sentTokens[o.index] = o.tokenIds.length;
      sentChars[o.index] = o.text.length;
      return { ...o, tokenIds: o.tokenIds.slice(t), text: o.text.slice(c), logprobs: o.logprobs === null ? null : o.logprobs.slice(t) };
    }),
  };
}
