// vLLM v1 scheduler: no prefill/decode phases. Each step gives each request a number of tokens within a token
// budget: running requests first (a decode gets 1, a chunked prefill what is left of the budget), then waiting
// requests in policy order. When the KV pool cannot fit a running request, the lowest-priority (fcfs: latest)
// running request is preempted by recompute: its blocks are freed and it goes back to the front of waiting.
import type { IncrementalDetokenizerLike } from "../models/tokenizer-types.js";
import { KvBlocks, type KvCacheManager } from "./kv-cache-manager.js";
import type { ScheduledBatch, ScheduledSequence } from "./model-runner.js";
import type { Request, RequestStatus } from "./request.js";
import { usableTokens, type KvSnapshot } from "./kv-transfer.js";
import { computeLogprobs, type LogprobsEntry, type SampledToken } from "./sampler.js";
import { checkTokenStop, findStopString } from "./stop-checker.js";
import type { TokenLogprobs } from "./types.js";

export type SchedulingPolicy = "fcfs" | "priority";

export interface SchedulerConfig {
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  maxModelLen: number;
  /** A prefill chunk is capped at this many tokens per step (0 = off), so long prompts don't hog the budget. */
  longPrefillTokenThreshold: number;
  schedulingPolicy: SchedulingPolicy;
  /** When false, a waiting request is only admitted if its whole remaining prompt fits the budget. */
  enableChunkedPrefill: boolean;
  /**
   * vLLM's async scheduling: schedule() may run while the previous step is still computing. A request whose
   * token that step samples gets an output placeholder, so the next step already computes its K/V; the
   * caller fills the placeholder's token id in (fillPlaceholders) before running the step.
   */
  asyncScheduling?: boolean;
  /** LoRA: at most this many distinct adapters in a step (vLLM's max_loras); 0 without LoRA. */
  maxLoras?: number;
}

/** One request's share of a step, as the scheduler decided it. */
export interface ScheduledRequest extends ScheduledSequence {
  request: Request;
  /** Blocks allocated by this step (ids), for runners that track block tables incrementally. */
  newBlockIds: number[];
}

export interface SchedulerOutput {
  scheduled: ScheduledRequest[];
  numScheduledTokens: number;
  /** Requests preempted (blocks freed, back in waiting) during this schedule() call. */
  preemptedRequestIds: string[];
  /** Requests finished or preempted since the previous schedule(), for the runner to forget. */
  finishedRequestIds: string[];
  /**
   * P/D disaggregation: K/V to write before this step runs, positions [from, to) of `snapshot` into the request's
   * blocks (admitted this step with those positions counted as computed).
   */
  kvImports: { request: Request; blockTable: number[]; snapshot: KvSnapshot; from: number; to: number }[];
}

/** What changed for one request in update(). */
export interface RequestUpdate {
  request: Request;
  newTokenIds: number[];
  finished: boolean;
}

export class Scheduler {
  /** FCFS order (preempted requests are put back at the front); the priority policy scans it by key. */
  readonly waiting: Request[] = [];
  /** Scheduling order of running requests; preemption takes from the end (fcfs). */
  readonly running: Request[] = [];
  readonly requests = new Map<string, Request>();
  numPreemptions = 0;
  /**
   * Speculative decoding: draft runs verified, their tokens verified and accepted, and the drafts accepted at each
   * position (0: a run's first draft) (vLLM's spec_decode counters).
   */
  readonly specStats = { drafts: 0, draftTokens: 0, acceptedTokens: 0, acceptedPerPosition: [] as number[] };
  private finishedSinceLastStep: string[] = [];
  /** Sampled tokens whose text update() left for flushText() (see update's deferText). */
  private pendingText: { req: Request; tokenId: number; dropText: boolean; finished: boolean }[] = [];

  /**
   * @param decodeToken spells a token for logprobs (tokenizer.idToToken); defaults to String(id).
   */
  constructor(
    readonly config: SchedulerConfig,
    readonly kv: KvCacheManager,
    private readonly decodeToken: (id: number) => string = String,
  ) {}

  addRequest(req: Request): void {
    this.requests.set(req.requestId, req);
    req.status = "WAITING";
    this.waiting.push(req);
  }

  get numWaiting(): number {
    return this.waiting.length;
  }
  get numRunning(): number {
    return this.running.length;
  }
  hasUnfinishedRequests(): boolean {
    return this.waiting.length + this.running.length > 0;
  }

  /** Decides this step's batch. Advances numComputedTokens of every scheduled request. */
  schedule(now = Date.now()): SchedulerOutput {
    const cfg = this.config;
    let budget = cfg.maxNumBatchedTokens;
    const scheduled: ScheduledRequest[] = [];
    const kvImports: SchedulerOutput["kvImports"] = [];
    const preempted: string[] = [];
    const numNewOf = new Map<Request, number>();
    // LoRA adapters of this step's requests: a request whose adapter would be one more than max_loras waits
    const loras = new Set<number>();
    const maxLoras = cfg.maxLoras ?? 0;
    const loraFits = (req: Request): boolean => req.loraId === null || loras.has(req.loraId) || loras.size < maxLoras;

    // 1. Running requests, in order.
    let i = 0;
    while (i < this.running.length && budget > 0) {
      const req = this.running[i]!;
      if (!loraFits(req)) {
        i++;
        continue;
      }
      // its placeholders reach its length limit: it finishes when they are filled, with nothing left to compute
      const pending = req.numOutputPlaceholders;
      if (pending > 0 && (req.numOutputTokens + pending >= req.maxTokens || req.numTokens + pending >= cfg.maxModelLen)) {
        i++;
        continue;
      }
      let numNew = req.numTokens + req.numOutputPlaceholders - req.numComputedTokens;
      if (cfg.longPrefillTokenThreshold > 0) numNew = Math.min(numNew, cfg.longPrefillTokenThreshold);
      numNew = keepImagesWhole(req, req.numComputedTokens, Math.min(numNew, budget));
      if (numNew <= 0) {
        i++;
        continue;
      }
      // a decode (all but its last token computed) with drafts computes them too (as many as the budget leaves)
      const decoding = req.numComputedTokens === req.numTokens - 1 && req.numOutputPlaceholders === 0;
      const numSpec = decoding && numNew === 1 ? Math.min(req.specTokenIds.length, budget - 1) : 0;
      numNew += numSpec;
      let newBlocks: KvBlocks | null = null;
      let selfPreempted = false;
      while ((newBlocks = this.kv.allocateSlots(req, numNew)) === null) {
        const victim = this.pickVictim();
        const vIndex = this.running.indexOf(victim);
        this.running.splice(vIndex, 1);
        if (numNewOf.has(victim)) {
          // Already scheduled this step (priority policy): take back its tokens.
          budget += numNewOf.get(victim)!;
          numNewOf.delete(victim);
          scheduled.splice(
            scheduled.findIndex((s) => s.request === victim),
            1,
          );
        }
        if (vIndex < i) i--;
        this.preempt(victim);
        preempted.push(victim.requestId);
        if (victim === req) {
          selfPreempted = true;
          break;
        }
      }
      if (selfPreempted || newBlocks === null) break;
      if (req.loraId !== null) loras.add(req.loraId);
      scheduled.push(this.describe(req, numNew, newBlocks, numSpec));
      numNewOf.set(req, numNew);
      budget -= numNew;
      i++;
    }

    // 2. Waiting requests, unless this step had to preempt (the pool is full: admitting more would thrash).
    if (preempted.length === 0) {
      // waiting for a LoRA slot or for their grammar to compile (vLLM skips them and keeps their place)
      const skipped = new Set<Request>();
      while (this.waiting.length > skipped.size && budget > 0 && this.running.length < cfg.maxNumSeqs) {
        const wIndex = this.pickWaiting(skipped);
        const req = this.waiting[wIndex]!;
        if (!loraFits(req) || req.grammar?.ready === false) {
          skipped.add(req);
          continue;
        }
        const lookup = req.numComputedTokens === 0;
        const hit = lookup ? this.kv.getComputedBlocks(req) : { blocks: KvBlocks.EMPTY, numComputedTokens: 0 };
        // K/V from a prefill engine covers what the prefix cache does not (never the last token: it gives the logits)
        let computed = hit.numComputedTokens;
        const snapshot = req.numComputedTokens === 0 && req.promptLogprobs === null ? req.kvImport : null;
        const imported = snapshot === null ? 0 : Math.min(usableTokens(snapshot, req.promptTokenIds), req.numTokens - 1);
        if (imported > computed) computed = imported;
        let numNew = req.numTokens - req.numComputedTokens - computed;
        if (!cfg.enableChunkedPrefill && numNew > budget) break;
        if (cfg.longPrefillTokenThreshold > 0) numNew = Math.min(numNew, cfg.longPrefillTokenThreshold);
        numNew = keepImagesWhole(req, req.numComputedTokens + computed, Math.min(numNew, budget));
        if (numNew <= 0) break; // its next image needs a step of its own: wait for the budget
        const newBlocks = this.kv.allocateSlots(req, numNew, hit.blocks, computed);
        if (newBlocks === null) break; // head-of-line: wait for blocks rather than reorder
        if (lookup) this.kv.recordPrefixCacheStats(req, hit.numComputedTokens);
        this.waiting.splice(wIndex, 1);
        this.running.push(req);
        req.status = "RUNNING";
        if (req.loraId !== null) loras.add(req.loraId);
        if (computed > hit.numComputedTokens)
          kvImports.push({ request: req, blockTable: this.kv.getBlockIds(req.requestId), snapshot: snapshot!, from: hit.numComputedTokens, to: computed });
        req.kvImport = null;
        req.numComputedTokens += computed;
        if (req.numCachedTokens < 0) req.numCachedTokens = computed;
        if (req.metrics.firstScheduledTime === null) req.metrics.firstScheduledTime = now;
        scheduled.push(this.describe(req, numNew, newBlocks));
        numNewOf.set(req, numNew);
        budget -= numNew;
      }
    }

    let total = 0;
    for (const s of scheduled) {
      s.request.numComputedTokens += s.tokenIds.length;
      if (cfg.asyncScheduling === true && s.needsLogits) s.request.numOutputPlaceholders++;
      total += s.tokenIds.length;
    }
    const finishedRequestIds = this.finishedSinceLastStep;
    this.finishedSinceLastStep = [];
    return { scheduled, numScheduledTokens: total, preemptedRequestIds: preempted, finishedRequestIds, kvImports };
  }

  /**
   * Async scheduling: after update() of the step that was computing while `out` was scheduled, drops the
   * requests of `out` that have finished since (their blocks are already free) and writes the now-known
   * sampled token ids over their placeholders. Returns `out` with the survivors.
   */
  fillPlaceholders(out: SchedulerOutput): SchedulerOutput {
    const scheduled: ScheduledRequest[] = [];
    let total = 0;
    for (const s of out.scheduled) {
      const req = s.request;
      if (req.isFinished || req.status !== "RUNNING") continue;
      if (s.tokenIds.includes(-1)) {
        const n = s.tokenIds.length;
        if (req.numTokens < s.startPosition + n) throw new Error(`[scheduler] placeholder of ${req.requestId} was never sampled`);
        s.tokenIds = req.allTokenIds.slice(s.startPosition, s.startPosition + n);
      }
      scheduled.push(s);
      total += s.tokenIds.length;
    }
    return { ...out, scheduled, numScheduledTokens: total };
  }

  /** Shape of the step for the model runner. */
  static toBatch(out: SchedulerOutput, blockSize: number): ScheduledBatch {
    return {
      sequences: out.scheduled,
      blockSize,
      numTokens: out.numScheduledTokens,
      finishedRequestIds: [...out.finishedRequestIds, ...out.preemptedRequestIds],
    };
  }

  private describe(req: Request, numNew: number, newBlocks: KvBlocks, numSpec = 0): ScheduledRequest {
    const start = req.numComputedTokens;
    const bs = this.kv.blockSize;
    const blockTable = this.kv.getBlockIds(req.requestId);
    const slotMapping = new Int32Array(numNew);
    for (let j = 0; j < numNew; j++) {
      const p = start + j;
      slotMapping[j] = blockTable[Math.floor(p / bs)]! * bs + (p % bs);
    }
    // Positions past the known tokens are drafts (speculative decoding) or output placeholders (async scheduling,
    // -1 until filled).
    const tokenIds = req.allTokenIds.slice(start, start + numNew - numSpec);
    for (let j = 0; j < numSpec; j++) tokenIds.push(req.specTokenIds[j]!);
    while (tokenIds.length < numNew) tokenIds.push(-1);
    return {
      request: req,
      requestId: req.requestId,
      tokenIds,
      startPosition: start,
      blockTable,
      slotMapping,
      needsLogits: start + numNew - numSpec === req.numTokens + req.numOutputPlaceholders,
      ...(numSpec > 0 ? { numSpecTokens: numSpec } : {}),
      needsPromptLogits: req.promptLogprobs !== null && start < req.numPromptTokens - 1,
      newBlockIds: newBlocks.getBlockIds(),
      ...(req.mmFeatures.length > 0 ? { mmFeatures: req.mmFeatures } : {}),
    };
  }

  /** fcfs: the last running request; priority: the largest (priority, arrival) among running. */
  private pickVictim(): Request {
    if (this.config.schedulingPolicy === "fcfs") return this.running[this.running.length - 1]!;
    let v = this.running[0]!;
    for (const r of this.running) if (r.priority > v.priority || (r.priority === v.priority && r.arrivalTime > v.arrivalTime)) v = r;
    return v;
  }

  /** fcfs: the front; priority: the smallest (priority, arrival), first in queue order on ties; not one of `skipped`. */
  private pickWaiting(skipped: ReadonlySet<Request>): number {
    let best = 0;
    while (skipped.has(this.waiting[best]!)) best++;
    if (this.config.schedulingPolicy === "fcfs") return best;
    for (let k = best + 1; k < this.waiting.length; k++) {
      const r = this.waiting[k]!;
      if (skipped.has(r)) continue;
      const b = this.waiting[best]!;
      if (r.priority < b.priority || (r.priority === b.priority && r.arrivalTime < b.arrivalTime)) best = k;
    }
    return best;
  }

  /** Sleep mode: every running request back to the front of waiting, in order, its blocks freed (it computes them again). */
  preemptAll(): void {
    for (let i = this.running.length - 1; i >= 0; i--) this.preempt(this.running[i]!);
    this.running.length = 0;
  }

  private preempt(req: Request): void {
    this.kv.free(req);
    req.specTokenIds = [];
    req.pooledState = null; // a pooling request reads its prompt again from the start
    req.status = "PREEMPTED";
    req.numComputedTokens = 0;
    req.numPreemptions++;
    this.numPreemptions++;
    this.waiting.unshift(req);
  }

  /**
   * Applies a step's results: appends sampled tokens (one per scheduled request with needsLogits, in order),
   * records logprobs and prompt logprobs, detokenizes, checks stops, frees finished requests.
   */
  update(
    out: SchedulerOutput,
    sampled: readonly SampledToken[],
    promptLogits: Map<string, Float32Array> = new Map(),
    now = Date.now(),
    deferText = false,
  ): RequestUpdate[] {
    const updates: RequestUpdate[] = [];
    let row = 0;
    for (const s of out.scheduled) {
      const req = s.request;
      if (s.needsPromptLogits) this.recordPromptLogprobs(req, s, promptLogits.get(req.requestId));
      if (!s.needsLogits) continue;
      const numSpec = s.numSpecTokens ?? 0;
      if (sampled.length < row + 1 + numSpec) throw new Error(`[scheduler] missing sampled token for ${req.requestId}`);
      const tok = sampled[row]!;
      row += 1 + numSpec;
      if (req.numOutputPlaceholders > 0) req.numOutputPlaceholders--;
      if (req.isFinished) continue; // aborted between schedule() and update()
      if (numSpec > 0) {
        updates.push(this.applySpeculated(req, s, sampled.slice(row - 1 - numSpec, row), now, deferText));
        continue;
      }
      this.appendToken(req, tok, now, deferText);
      updates.push({ request: req, newTokenIds: [tok.tokenId], finished: req.isFinished });
      if (req.isFinished) this.removeFinished(req, now);
    }
    return updates;
  }

  /**
   * Speculative decoding: row j's token is accepted while every draft before it matched the row before it; the
   * first mismatch (or the row after the last draft) gives the model's own token. The accepted tokens are appended
   * one by one (a stop ends the run), and the K/V of the drafts that were not kept is given back: the positions
   * are computed again when tokens reach them.
   */
  private applySpeculated(req: Request, s: ScheduledSequence, rows: readonly SampledToken[], now: number, deferText: boolean): RequestUpdate {
    const drafts = s.tokenIds.slice(s.tokenIds.length - rows.length + 1);
    const newTokenIds: number[] = [];
    let accepted = 0;
    for (let j = 0; j < rows.length && !req.isFinished; j++) {
      this.appendToken(req, rows[j]!, now, deferText);
      newTokenIds.push(rows[j]!.tokenId);
      if (j === drafts.length || rows[j]!.tokenId !== drafts[j]) break;
      accepted++;
    }
    this.specStats.drafts++;
    this.specStats.draftTokens += drafts.length;
    this.specStats.acceptedTokens += accepted;
    for (let j = 0; j < accepted; j++) this.specStats.acceptedPerPosition[j] = (this.specStats.acceptedPerPosition[j] ?? 0) + 1;
    // a run of wrong drafts costs a wider step for one token: back off before drafting for this request again
    const pause = req.specPause;
    if (accepted > 0) pause.next = 1;
    else {
      pause.skip = pause.next;
      pause.next = Math.min(16, pause.next * 2);
    }
    if (req.isFinished) this.removeFinished(req, now);
    else req.numComputedTokens -= drafts.length - accepted;
    return { request: req, newTokenIds, finished: req.isFinished };
  }

  /**
   * Detokenizes the tokens update() appended with deferText, in order. Nothing that decides a request's status
   * waits for it: those tokens belong to requests without stop strings, whose finish is decided by the token ids.
   */
  flushText(): void {
    if (this.pendingText.length === 0) return;
    const pending = this.pendingText;
    this.pendingText = [];
    for (const { req, tokenId, dropText, finished } of pending) req.outputText += this.tokenText(req.detokenizer!, tokenId, dropText, finished);
  }

  private tokenText(det: IncrementalDetokenizerLike, tokenId: number, dropText: boolean, finished: boolean): string {
    const delta = dropText ? "" : det.push([tokenId]);
    return finished ? delta + det.finish() : delta;
  }

  private appendToken(req: Request, tok: SampledToken, now: number, deferText = false): void {
    req.appendOutputToken(tok.tokenId);
    req.grammar?.accept(tok.tokenId);
    if (req.metrics.firstTokenTime === null) req.metrics.firstTokenTime = now;
    req.metrics.lastTokenTime = now;
    if (tok.logprobs !== null && req.logprobs !== null) {
      req.logprobs.push(this.toTokenLogprobs(tok.logprobs, req.params.detokenize));
      req.cumulativeLogprob += tok.logprobs.logprobs[0]!;
    }
    const tokenStopped = checkTokenStop(req, tok.tokenId, this.config.maxModelLen);
    const det = req.detokenizer;
    if (det === null) return;
    const p = req.params;
    const stoppedByToken = tokenStopped && req.status === "FINISHED_STOPPED";
    const dropText = stoppedByToken && !p.includeStopStrInOutput;
    // Without stop strings the text decides nothing here: it can wait until the next step is dispatched.
    if (deferText && p.stop.length === 0) {
      this.pendingText.push({ req, tokenId: tok.tokenId, dropText, finished: req.isFinished });
      return;
    }
    if (this.pendingText.some((e) => e.req === req)) this.flushText(); // keeps the request's text in token order
    const delta = this.tokenText(det, tok.tokenId, dropText, req.isFinished);
    req.outputText += delta;
    // vLLM's detokenizer: stop strings count once more than min_tokens tokens are out, and only those ending in
    // text after the min_tokens-th token (this token's delta)
    if (!stoppedByToken && req.numOutputTokens > p.minTokens) {
      const hit = findStopString(req.outputText, delta.length, p.stop, p.includeStopStrInOutput);
      if (hit !== null) {
        req.outputText = hit.text;
        req.status = "FINISHED_STOPPED";
        req.stopReason = hit.stop;
      }
    }
  }

  private recordPromptLogprobs(req: Request, s: ScheduledRequest, rows: Float32Array | undefined): void {
    if (req.promptLogprobs === null) return;
    const V = rows === undefined ? 0 : rows.length / s.tokenIds.length;
    if (rows === undefined || !Number.isInteger(V)) throw new Error(`[scheduler] missing prompt logits for ${req.requestId}`);
    const n = req.params.promptLogprobs!;
    // Row j (position start+j) scores the token at position start+j+1; skip already-recorded positions.
    for (let j = 0; j < s.tokenIds.length; j++) {
      const target = s.startPosition + j + 1;
      if (target >= req.numPromptTokens) break;
      if (target < req.promptLogprobs.length) continue;
      const entry = computeLogprobs(rows.subarray(j * V, (j + 1) * V), req.promptTokenIds[target]!, n);
      req.promptLogprobs.push(this.toTokenLogprobs(entry, req.params.detokenize));
    }
  }

  private toTokenLogprobs(e: LogprobsEntry, detokenize: boolean): TokenLogprobs {
    const m: TokenLogprobs = new Map();
    for (let k = 0; k < e.tokenIds.length; k++) {
      const id = e.tokenIds[k]!;
      if (!m.has(id)) m.set(id, { logprob: e.logprobs[k]!, rank: e.ranks[k]!, decodedToken: detokenize ? this.decodeToken(id) : null });
    }
    return m;
  }

  private removeFinished(req: Request, now: number): void {
    const k = this.running.indexOf(req);
    if (k >= 0) this.running.splice(k, 1);
    const w = this.waiting.indexOf(req);
    if (w >= 0) this.waiting.splice(w, 1);
    if (req.kvExport && (req.status === "FINISHED_STOPPED" || req.status === "FINISHED_LENGTH_CAPPED"))
      req.exportBlockTable = this.kv.getBlockIds(req.requestId); // freed blocks keep their K/V until the next schedule()
    this.kv.free(req);
    req.grammar?.dispose();
    req.grammar = null;
    this.requests.delete(req.requestId);
    req.metrics.finishedTime = now;
    this.finishedSinceLastStep.push(req.requestId);
  }

  /** Finishes requests from outside (abort): frees their blocks at once. Unknown ids are ignored. */
  finishRequests(requestIds: Iterable<string>, status: RequestStatus = "FINISHED_ABORTED", now = Date.now()): Request[] {
    const done: Request[] = [];
    for (const id of requestIds) {
      const req = this.requests.get(id);
      if (req === undefined || req.isFinished) continue;
      req.status = status;
      this.removeFinished(req, now);
      done.push(req);
    }
    return done;
  }
}

/**
 * `numNew` tokens of `req` from position `start`, cut before an image they would split (vLLM computes a prefix-LM
 * model's image in one step: its tokens attend to each other both ways). 0: the image does not fit this step.
 */
function keepImagesWhole(req: Request, start: number, numNew: number): number {
  const end = start + numNew;
  for (const f of req.mmFeatures) if (f.inputEmbeds === undefined && f.offset < end && f.offset + f.length > end) return Math.max(0, f.offset - start);
  return numNew;
}
