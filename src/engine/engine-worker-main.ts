// The engine worker thread (spawned by WorkerEngine): loads the model, then runs the EngineCore step loop
// (schedule -> execute -> sample -> update, detokenization included) off the caller's thread. One "update"
// message per step carries every request's new tokens and text plus a stats snapshot. Idle, it waits for
// messages without spinning: steps are chained with setImmediate only while requests are unfinished, and
// messages (adds, aborts) are handled between steps.
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { parentPort, workerData, type MessagePort } from "node:worker_threads";
import { EngineCore, resolveEngineArgs } from "./engine-core.js";
import { instantiateLogitsProcessors, loadLogitsProcessors } from "./logits-processors.js";
import { createServingSetup } from "./serving.js";
import { createKvEventPublisher } from "./kv-events-publisher.js";
import {
  toWireError,
  type FromWorker,
  type TokenizerSource,
  type ToWorker,
  type WireError,
  type WireOutput,
  type WorkerReply,
  type WorkerServingArgs,
} from "./engine-worker-protocol.js";
import type { EngineStats, RequestOutput, TokenStep } from "./types.js";
import { epochNow, outputPacer, type OutputPacer } from "./output-pacing.js";
import type { SleepLevel } from "./sleep-mode.js";

/** What was already sent of one request, to turn EngineCore's cumulative outputs into deltas. */
interface Sent {
  seq: number;
  requestId: string;
  tokens: number[]; // per sample index
  chars: number[];
  promptLogprobs: number;
  promptSent: boolean;
  /** Which steps' outputs go out (null: every step's). */
  pacer: OutputPacer | null;
}

const port: MessagePort = (() => {
  if (parentPort === null) throw new Error("[engine-worker] must run in a worker thread (spawned by WorkerEngine)");
  return parentPort;
})();
const post = (m: FromWorker): void => port.postMessage(m);

function tokenizerSource(loadedPath: string, model: string, tokenizer: string | undefined): TokenizerSource {
  const loadedDir = fs.statSync(loadedPath).isDirectory();
  const dir = fs.statSync(model, { throwIfNoEntry: false })?.isDirectory() ? model : null;
  // --tokenizer: its files, with the model directory's generation_config.json where there is one (as the loader reads them)
  if (tokenizer !== undefined) return { kind: "dir", dir: tokenizer, generationConfigDir: loadedDir ? loadedPath : (dir ?? tokenizer) };
  if (loadedDir) return { kind: "dir", dir: loadedPath };
  // A GGUF file inside a model directory takes that directory's tokenizer.json, as the loader does.
  if (dir !== null && path.resolve(path.dirname(loadedPath)) === path.resolve(dir) && fs.existsSync(path.join(dir, "tokenizer.json")))
    return { kind: "dir", dir };
  return { kind: "gguf", file: loadedPath };
}

function toWire(out: RequestOutput, sent: Sent, tokenSteps: TokenStep[] | null): WireOutput {
  const w: WireOutput = {
    seq: sent.seq,
    finished: out.finished,
    numCachedTokens: out.numCachedTokens,
    metrics: out.metrics,
    promptLogprobs: null,
    outputs: out.outputs.map((o) => {
      const t = sent.tokens[o.index] ?? 0;
      const c = sent.chars[o.index] ?? 0;
      sent.tokens[o.index] = o.tokenIds.length;
      sent.chars[o.index] = o.text.length;
      return {
        index: o.index,
        text: o.text.slice(c),
        tokenIds: o.tokenIds.slice(t),
        logprobs: o.logprobs === null ? null : o.logprobs.slice(t),
        cumulativeLogprob: o.cumulativeLogprob,
        finishReason: o.finishReason,
        stopReason: o.stopReason,
      };
    }),
  };
  if (out.pooled != null) w.pooled = out.pooled;
  if (out.kvSnapshot !== undefined) w.kvSnapshot = out.kvSnapshot;
  if (tokenSteps !== null) w.tokenSteps = tokenSteps;
  if (!sent.promptSent) {
    w.promptTokenIds = out.promptTokenIds;
    sent.promptSent = true;
  }
  if (out.promptLogprobs !== null) {
    w.promptLogprobs = out.promptLogprobs.slice(sent.promptLogprobs);
    sent.promptLogprobs = out.promptLogprobs.length;
  }
  return w;
}

/** The serving args: from workerData, or (a worker spawned ahead of them, see prespawnEngineWorker) the first message. */
function servingArgs(): Promise<WorkerServingArgs> {
  if (workerData !== null && workerData !== undefined) return Promise.resolve(workerData as WorkerServingArgs);
  return new Promise((resolve) => port.once("message", (m: ToWorker) => resolve((m as Extract<ToWorker, { type: "start" }>).args)));
}

async function main(): Promise<void> {
  const { logitsProcessors: specifiers = [], ...args } = await servingArgs();
  // Before the model: a bad specifier fails start-up at once (LogitsProcessorLoadError, sent as "fatal").
  const processorExports = await loadLogitsProcessors(specifiers);
  // The caller's thread builds its own tokenizer meanwhile; this one needs only the EOS ids before "ready", then
  // a decoder (no BPE merges: this thread encodes only bad_words).
  const setup = await createServingSetup({ ...args, onProgress: (stage, fraction) => post({ type: "progress", stage, fraction }) }, { deferTokenizerBuild: true });
  const { loaded, runner, engineArgs, kvTokens, tp, draft } = setup;
  const logitsProcessors = instantiateLogitsProcessors(processorExports, { vocabSize: runner.vocabSize }, specifiers);
  const core = new EngineCore(engineArgs, runner, { tokenizer: loaded.tokenizer, logitsProcessors, draft });
  const resolved = resolveEngineArgs(engineArgs);
  // each step's KV-cache events go out from this thread, so a slow or lost NATS server never delays the caller's
  const kvEvents = args.kvEventsConfig == null ? null : createKvEventPublisher(args.kvEventsConfig, `${os.hostname()}:${process.pid}`);
  const stats = (): EngineStats => (kvEvents === null ? core.stats() : { ...core.stats(), kvEvents: { ...kvEvents.stats } });

  const sentBySeq = new Map<number, Sent>();
  const seqOfRequest = new Map<string, number>(); // live engine request id -> seq
  let pendingOutputs: WireOutput[] = [];
  let pendingErrors: { seq: number; error: WireError }[] = [];
  let pendingSyncs: number[] = [];
  let pendingReplies: WorkerReply[] = [];
  let scheduled = false;
  let lastStats = ""; // the stats of the last update sent (JSON)
  /** A "wait" sleep: the call to answer once the requests running have finished. */
  let sleepAfterDrain: { id: number; level: SleepLevel } | null = null;
  const reply = (id: number, run: () => boolean | void): void => {
    try {
      const value = run();
      pendingReplies.push({ id, error: null, ...(typeof value === "boolean" ? { value } : {}) });
    } catch (err) {
      pendingReplies.push({ id, error: toWireError(err) });
    }
  };

  const wire = (outs: RequestOutput[]): void => {
    for (const out of outs) {
      const seq = seqOfRequest.get(out.requestId);
      const sent = seq === undefined ? undefined : sentBySeq.get(seq);
      if (sent === undefined) continue;
      // a paced request's held-back steps go out with a later output (outputs are cumulative)
      const steps = sent.pacer === null ? null : sent.pacer.offer(out, epochNow());
      if (sent.pacer === null || steps !== null) pendingOutputs.push(toWire(out, sent, steps));
      if (out.finished) {
        sentBySeq.delete(sent.seq);
        seqOfRequest.delete(out.requestId);
      }
    }
  };

  const tick = (): void => {
    scheduled = false;
    try {
      if (core.hasWork()) wire(core.step());
      if (sleepAfterDrain !== null && !core.hasWork()) {
        const { id, level } = sleepAfterDrain;
        sleepAfterDrain = null;
        reply(id, () => void wire(core.sleep(level, "keep")));
      }
      kvEvents?.publish(core.takeKvEvents());
    } catch (err) {
      // A failed step leaves the engine state untrustworthy: fail every stream (as AsyncLLM does) and stop.
      post({ type: "fatal", error: toWireError(tp?.explain(err) ?? err) });
      void tp?.shutdown(0, false); // the other ranks may wait in a collective of the failed step
      port.close();
      return;
    }
    // an update with nothing in it but unchanged stats is not sent: each one wakes the caller's thread
    const snapshot = stats();
    const key = JSON.stringify(snapshot);
    const empty = pendingOutputs.length === 0 && pendingErrors.length === 0 && pendingSyncs.length === 0 && pendingReplies.length === 0;
    if (!empty || key !== lastStats) post({ type: "update", outputs: pendingOutputs, errors: pendingErrors, syncIds: pendingSyncs, replies: pendingReplies, stats: snapshot });
    lastStats = key;
    pendingOutputs = [];
    pendingErrors = [];
    pendingSyncs = [];
    pendingReplies = [];
    if (core.hasWork()) kick();
  };
  const kick = (): void => {
    if (scheduled) return;
    scheduled = true;
    setImmediate(tick);
  };

  port.on("message", (m: ToWorker) => {
    switch (m.type) {
      case "add": {
        try {
          core.sampler.validateParams(m.params);
          const pacer = outputPacer(m);
          core.addRequest({
            requestId: m.requestId,
            promptTokenIds: m.promptTokenIds,
            params: m.params,
            priority: m.priority,
            cacheSalt: m.cacheSalt,
            arrivalTime: m.arrivalTime,
            loraRequest: m.loraRequest,
            kvTransfer: m.kvTransfer,
            mmFeatures: m.mmFeatures,
          });
          seqOfRequest.set(m.requestId, m.seq);
          sentBySeq.set(m.seq, { seq: m.seq, requestId: m.requestId, tokens: [], chars: [], promptLogprobs: 0, promptSent: false, pacer });
        } catch (err) {
          pendingErrors.push({ seq: m.seq, error: toWireError(err) });
        }
        break;
      }
      case "abort": {
        // a stream that finished (or was rejected) before the abort arrived has no entry: nothing to abort
        const ids = m.seqs.flatMap((seq) => sentBySeq.get(seq)?.requestId ?? []);
        if (ids.length > 0) wire(core.abortRequest(ids)); // their blocks are freed now, before the next step
        break;
      }
      case "sync":
        pendingSyncs.push(m.id);
        break;
      case "addLora":
        try {
          core.addLora(m.lora);
          pendingReplies.push({ id: m.id, error: null });
        } catch (err) {
          pendingReplies.push({ id: m.id, error: toWireError(err) });
        }
        break;
      case "removeLora":
        pendingReplies.push({ id: m.id, error: null, value: core.removeLora(m.loraId) });
        break;
      case "resetPrefixCache":
        pendingReplies.push({ id: m.id, error: null, value: core.resetPrefixCache() });
        break;
      case "sleep":
        if (m.mode !== "wait") reply(m.id, () => void wire(core.sleep(m.level, m.mode as "abort" | "keep")));
        else if (sleepAfterDrain !== null) pendingReplies.push({ id: m.id, error: toWireError(new Error("[engine] a sleep is already waiting for the requests to finish")) });
        else {
          try {
            core.beginDrain();
            sleepAfterDrain = { id: m.id, level: m.level }; // answered by the tick that finds the engine idle
          } catch (err) {
            pendingReplies.push({ id: m.id, error: toWireError(err) });
          }
        }
        break;
      case "wakeUp":
        reply(m.id, () => core.wakeUp(m.tags));
        break;
      case "close":
        void Promise.all([core.close(), tp?.shutdown()]).then(() => post({ type: "closed" }));
        return;
    }
    kick();
  });

  // a tensor-parallel rank that dies while the engine idles fails it now, not at the next request
  tp?.onFailure((err) => {
    post({ type: "fatal", error: toWireError(err) });
    void tp.shutdown(0, false); // the surviving ranks, if any
    port.close();
  });
  post({
    type: "ready",
    maxModelLen: engineArgs.maxModelLen,
    reasoningParser: resolved.reasoningParser,
    poolingTask: core.poolingTask,
    classLabels: core.classLabels,
    useSepToken: core.useSepToken,
    kvTokens,
    kvCacheDtype: runner.kvCacheDtype,
    numBlocks: resolved.numGpuBlocks,
    blockSize: resolved.blockSize,
    vocabSize: runner.vocabSize,
    maxLogprobs: resolved.maxLogprobs,
    engineArgs: resolved,
    tokenizer: args.skipTokenizerInit === true
      ? { kind: "none", vocabSize: loaded.tokenizer.vocabSize, eosTokenIds: [...loaded.tokenizer.eosTokenIds], bosTokenId: loaded.tokenizer.bosTokenId }
      : tokenizerSource(loaded.path, args.model, args.tokenizer),
    generationConfig: loaded.generationConfig,
    stats: stats(),
  });
  // Detokenization needs the decoder; a build error (a tokenizer.json the caller's thread rejects too) is fatal.
  setImmediate(() => {
    try {
      loaded.tokenizer.buildDecoder();
    } catch (err) {
      post({ type: "fatal", error: toWireError(err) });
      port.close();
    }
  });
}

main().catch((err: unknown) => {
  post({ type: "fatal", error: toWireError(err) });
  port.close();
});
