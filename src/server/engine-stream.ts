// One engine request as seen by the server: abort wiring, metrics, and merging several prompts' streams.
import type { EngineClient, GenerateOptions, RequestOutput, SamplingParams } from "../engine/types.js";
import type { LoraRequest } from "../engine/lora-manager.js";
import type { ServerMetrics } from "./metrics.js";
import type { RequestLog } from "./request-log.js";

export interface EngineRequest {
  requestId: string;
  promptTokenIds: number[];
  prompt?: string;
  params: Partial<SamplingParams>;
  priority: number;
  cacheSalt?: string;
  /** The LoRA adapter the request's model name serves (null: the base model). */
  loraRequest?: LoraRequest | null;
  /** P/D disaggregation: export the prompt's K/V, or import a prefill's (server/kv-transfer.ts). */
  kvTransfer?: GenerateOptions["kvTransfer"];
  /** The prompt's images (an image-text model). */
  mmFeatures?: GenerateOptions["mmFeatures"];
  /**
   * The client reads the reply streamed (how the request log logs its outputs). false: only the finished output
   * matters (GenerateOptions.finalOnly, as vLLM's server asks FINAL_ONLY for non-streaming requests).
   */
  stream?: boolean;
  /** A streamed reply's tokens per chunk (vLLM's --stream-interval; default 1). */
  streamInterval?: number;
}

/** Live engine request ids, so that shutdown can abort whatever is left after the drain timeout. */
export type InflightSet = Set<string>;

/**
 * Engine request ids submitted but without a first output yet: the server's own count of waiting requests,
 * because the engine's stats lag behind a burst of arrivals when the engine runs in a worker thread.
 */
export type UnstartedSet = Set<string>;

/**
 * Streams delta outputs for one request. Aborts the engine request when `signal` fires, and also when the
 * consumer stops early or an error escapes, so that KV blocks are freed at once in every case.
 */
export async function* streamEngineRequest(
  engine: EngineClient,
  metrics: ServerMetrics,
  inflight: InflightSet,
  unstarted: UnstartedSet,
  req: EngineRequest,
  signal: AbortSignal,
  log: RequestLog | null = null,
): AsyncGenerator<RequestOutput> {
  if (signal.aborted) return;
  log?.received(req.requestId, req.prompt, req.promptTokenIds, req.params, req.loraRequest);
  const prompt = req.prompt === undefined ? { promptTokenIds: req.promptTokenIds } : { promptTokenIds: req.promptTokenIds, prompt: req.prompt };
  const options = {
    requestId: req.requestId, priority: req.priority, delta: true, ...(req.cacheSalt ? { cacheSalt: req.cacheSalt } : {}),
    ...(req.loraRequest ? { loraRequest: req.loraRequest } : {}),
    ...(req.kvTransfer ? { kvTransfer: req.kvTransfer } : {}),
    ...(req.mmFeatures ? { mmFeatures: req.mmFeatures } : {}),
    ...(req.stream === false ? { finalOnly: true } : {}),
    ...(req.stream === true && req.streamInterval !== undefined ? { streamInterval: req.streamInterval } : {}),
  };
  // An engine may reject the request synchronously (EngineInputError): nothing to abort or count then.
  const outputs = engine.generate(prompt, req.params, options);
  const tracker = metrics.track(req.promptTokenIds.length);
  let finished = false;
  let queueSeconds: number | null = null;
  const choiceTokens: number[] = [];
  // each choice's text and tokens so far, for the output log (delta outputs carry only what is new)
  const logged = log?.logsOutputs ? new Map<number, { text: string; tokenIds: number[] }>() : null;
  const onAbort = (): void => engine.abort(req.requestId);
  inflight.add(req.requestId);
  unstarted.add(req.requestId);
  signal.addEventListener("abort", onAbort, { once: true });
  try {
    for await (const out of outputs) {
      unstarted.delete(req.requestId);
      if (signal.aborted) break;
      tracker.onTokens(out.outputs.reduce((sum, o) => sum + o.tokenIds.length, 0), out.tokenSteps);
      for (const o of out.outputs) {
        choiceTokens[o.index] = (choiceTokens[o.index] ?? 0) + o.tokenIds.length;
        if (logged === null) continue;
        const c = logged.get(o.index) ?? { text: "", tokenIds: [] };
        c.text += o.text;
        c.tokenIds.push(...o.tokenIds);
        logged.set(o.index, c);
        const n = req.params.n ?? 1;
        const streamed = req.stream === true;
        if (streamed && log!.logsDeltas && (o.text !== "" || o.tokenIds.length > 0)) log!.generated(req.requestId, o.index, n, o.text, o.tokenIds, o.finishReason, "delta");
        if (o.finishReason !== null) log!.generated(req.requestId, o.index, n, c.text, c.tokenIds, o.finishReason, streamed ? "complete" : null);
      }
      const m = out.metrics;
      if (queueSeconds === null && m?.firstScheduledTime != null) queueSeconds = (m.firstScheduledTime - m.arrivalTime) / 1000;
      if (out.finished) {
        finished = true;
        const reasons = out.outputs.map((o) => o.finishReason);
        const stats = {
          promptTokens: req.promptTokenIds.length, choiceTokens: Array.from({ length: req.params.n ?? 1 }, (_, i) => choiceTokens[i] ?? 0),
          maxTokens: req.params.maxTokens ?? null, times: out.metrics ?? null,
        };
        tracker.finish(reasons.includes("abort") ? "abort" : (reasons.find((r) => r !== null) ?? "stop"), queueSeconds, stats);
      }
      yield out;
      if (finished) break;
    }
  } finally {
    signal.removeEventListener("abort", onAbort);
    inflight.delete(req.requestId);
    unstarted.delete(req.requestId);
    if (!finished) {
      engine.abort(req.requestId);
      tracker.finish("abort", queueSeconds);
    }
  }
}

/** Interleaves several async streams, tagging each value with its stream's index. */
export async function* mergeStreams<T>(streams: AsyncIterable<T>[]): AsyncGenerator<[number, T]> {
  const iters = streams.map((s) => s[Symbol.asyncIterator]());
  const pending = new Map<number, Promise<{ i: number; r: IteratorResult<T> }>>();
  const pull = (i: number): void => {
    const p = iters[i]!.next().then((r) => ({ i, r }));
    p.catch(() => undefined); // a stream failing after we stopped listening must not become an unhandled rejection
    pending.set(i, p);
  };
  iters.forEach((_, i) => pull(i));
  try {
    while (pending.size > 0) {
      const { i, r } = await Promise.race(pending.values());
      if (r.done) {
        pending.delete(i);
        continue;
      }
      pull(i);
      yield [i, r.value];
    }
  } finally {
    // Early exit or error: close every stream still open. Not awaited: a generator parked on the engine only
    // returns after its next output; the caller's AbortSignal is what aborts the engine request at once.
    iters.forEach((it, i) => {
      if (pending.has(i)) void it.return?.()?.catch(() => undefined);
    });
  }
}

/**
 * Awaits a stream's first value before anything is sent, so that an engine that rejects the request
 * (e.g. an input error with a `param`) still gets a proper HTTP status instead of an error event.
 */
export async function primeStream<T>(stream: AsyncIterable<T>): Promise<AsyncIterable<T>> {
  const it = stream[Symbol.asyncIterator]();
  const first = await it.next();
  return {
    [Symbol.asyncIterator]: () => {
      let replayed = false;
      return {
        next: async () => {
          if (!replayed) {
            replayed = true;
            return first;
          }
          return it.next();
        },
        return: async (value?: unknown) => (it.return ? it.return(value) : { done: true as const, value: undefined as T }),
      };
    },
  };
}
