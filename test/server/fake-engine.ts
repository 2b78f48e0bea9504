// A deterministic EngineClient + TokenizerLike for server tests: a character-level tokenizer and an engine
// that "generates" tokens from a hash of the context, with a block pool so that freeing is observable.
import type {
  CompletionOutput, EngineClient, EngineStats, FinishReason, Logprob, RequestOutput, SamplingParams, TokenLogprobs,
} from "../../src/engine/types.js";
import type { ChatMessage, ChatTemplateOptions, TokenizerLike } from "../../src/models/tokenizer-types.js";
import type { ReasoningParserName } from "../../src/engine/reasoning.js";

// Vocabulary: 0 <s>, 1 </s>, 2 <unk>, 3.. printable ASCII (32..126), then "\n".
const SPECIALS = ["<s>", "</s>", "<unk>"];
const CHARS = [...Array.from({ length: 95 }, (_, i) => String.fromCharCode(32 + i)), "\n"];
export const BOS = 0;
export const EOS = 1;
// Tokens the fake model samples from: lower-case letters and space, so that outputs read like words.
const GEN_TOKENS = [..."abcdefghijklmnopqrstuvwxyz    "].map((ch) => SPECIALS.length + CHARS.indexOf(ch));

export class FakeTokenizer implements TokenizerLike {
  readonly vocabSize = SPECIALS.length + CHARS.length;
  readonly eosTokenIds = [EOS];
  readonly bosTokenId = BOS;

  encode(text: string, options: { addSpecialTokens?: boolean } = {}): number[] {
    const ids = [...text].map((ch) => {
      const i = CHARS.indexOf(ch);
      return i < 0 ? 2 : SPECIALS.length + i;
    });
    return options.addSpecialTokens ?? true ? [BOS, ...ids] : ids;
  }

  decode(ids: readonly number[], options: { skipSpecialTokens?: boolean } = {}): string {
    const skip = options.skipSpecialTokens ?? true;
    return ids.map((id) => (id < SPECIALS.length ? (skip ? "" : SPECIALS[id]) : (CHARS[id - SPECIALS.length] ?? ""))).join("");
  }

  idToToken(id: number): string | undefined {
    return id < SPECIALS.length ? SPECIALS[id] : CHARS[id - SPECIALS.length];
  }

  isSpecial(id: number): boolean {
    return id < SPECIALS.length;
  }

  applyChatTemplate(messages: ChatMessage[], options: ChatTemplateOptions = {}): string {
    if (options.chatTemplate === "broken") throw new Error("template syntax error");
    let text = messages.map((m) => `${m.role}: ${m.content ?? ""}\n`).join("");
    // the template "tools" writes the tools' names first (as a real template lists the tools it is given)
    if (options.chatTemplate === "tools" && options.tools?.length) text = `tools: ${options.tools.map((t) => JSON.stringify(t)).join(" ")}\n${text}`;
    if (options.continueFinalMessage) text = text.slice(0, -1);
    if (options.addGenerationPrompt ?? true) text += "assistant:";
    return text;
  }
}

/** FNV-1a over numbers, then a splitmix-style generator. */
function hash(values: readonly number[], seed = 0): number {
  let h = 0x811c9dc5 ^ seed;
  for (const v of values) {
    h ^= v & 0xffff;
    h = Math.imul(h, 0x01000193);
    h ^= v >>> 16;
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x9e3779b9) >>> 0;
    let z = s;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
    return ((z ^ (z >>> 16)) >>> 0) / 2 ** 32;
  };
}

export class FakeEngineInputError extends Error {
  constructor(message: string, readonly param: string) {
    super(message);
    this.name = "EngineInputError";
  }
}

export interface FakeEngineOptions {
  maxModelLen?: number;
  numBlocks?: number;
  blockSize?: number;
  stepDelayMs?: number; // pause between generated tokens
  eosProbability?: number; // per step, once minTokens is reached (unless ignoreEos)
  /** A pooling engine: each request finishes at its first step with a vector from its prompt's hash. */
  pooling?: { task: "embed" } | { task: "classify"; labels: string[] };
  /**
   * The reply to write, character by character then EOS, for a prompt's text (null: the usual random letters), so
   * that a test can show how the server reads a given reply (tool calls, reasoning).
   */
  script?: (prompt: string) => string | null;
  /** The reasoning parser the engine reports (the server splits replies with it). */
  reasoningParser?: ReasoningParserName;
}

interface Live {
  aborted: boolean;
  blocks: number;
  wake: (() => void) | null;
}

export class FakeEngine implements EngineClient {
  readonly maxModelLen: number;
  readonly tokenizer = new FakeTokenizer();
  readonly numTotalBlocks: number;
  readonly blockSize: number;
  private freeBlocks: number;
  private readonly live = new Map<string, Live>();
  /** Forces stats().numWaiting (to test the queue-full 503). */
  forcedWaiting = 0;
  /** Prompt text that makes the iterator throw after a few outputs. */
  failMarker = "FAIL_MID_STREAM";
  readonly aborted: string[] = [];
  /** The live ids of each abort() call that found some (a worker engine sends each call as one message). */
  readonly abortCalls: string[][] = [];
  private prefixQueries = 0;
  /** The sampling params of the latest generate() call, as the server sent them. */
  lastParams: Partial<SamplingParams> | null = null;

  get reasoningParser(): ReasoningParserName | null {
    return this.options.reasoningParser ?? null;
  }

  get poolingTask(): "embed" | "classify" | null {
    return this.options.pooling?.task ?? null;
  }

  get classLabels(): string[] | null {
    const p = this.options.pooling;
    return p?.task === "classify" ? p.labels : null;
  }

  /** An embedding (8 dims, unit length) or class probabilities (softmax), a function of the prompt. */
  pooledVector(ids: readonly number[]): Float32Array {
    const r = rng(hash(ids));
    const v = Float32Array.from({ length: this.classLabels?.length ?? 8 }, () => r() * 2 - 1);
    if (this.classLabels === null) {
      const norm = Math.hypot(...v);
      return v.map((x) => x / norm);
    }
    const e = v.map(Math.exp);
    const sum = e.reduce((a, b) => a + b, 0);
    return e.map((x) => x / sum);
  }

  constructor(private readonly options: FakeEngineOptions = {}) {
    this.maxModelLen = options.maxModelLen ?? 256;
    this.numTotalBlocks = options.numBlocks ?? 4096;
    this.blockSize = options.blockSize ?? 16;
    this.freeBlocks = this.numTotalBlocks;
  }

  stats(): EngineStats {
    return {
      numRunning: this.live.size,
      numWaiting: this.forcedWaiting,
      kvCacheUsage: 1 - this.freeBlocks / this.numTotalBlocks,
      numFreeBlocks: this.freeBlocks,
      numTotalBlocks: this.numTotalBlocks,
      prefixCacheQueries: this.prefixQueries,
      prefixCacheHits: Math.floor(this.prefixQueries / 2),
      numPreemptions: 0,
    };
  }

  abort(requestIds: string | readonly string[]): void {
    const ids = typeof requestIds === "string" ? [requestIds] : [...requestIds];
    const live = ids.flatMap((id) => (this.live.get(id)?.aborted === false ? [id] : []));
    if (live.length > 0) this.abortCalls.push(live);
    for (const id of live) {
      const l = this.live.get(id)!;
      l.aborted = true;
      this.aborted.push(id);
      this.release(id, l);
      l.wake?.();
    }
  }

  private allocate(live: Live, tokens: number): void {
    const need = Math.ceil(tokens / this.blockSize) - live.blocks;
    if (need <= 0) return;
    if (need > this.freeBlocks) throw new Error("fake engine: out of KV blocks");
    this.freeBlocks -= need;
    live.blocks += need;
  }

  private release(requestId: string, live: Live): void {
    this.freeBlocks += live.blocks;
    live.blocks = 0;
    this.live.delete(requestId);
  }

  async *generate(
    prompt: { promptTokenIds: number[]; prompt?: string },
    params: Partial<SamplingParams>,
    options: { requestId: string; priority?: number; delta?: boolean; cacheSalt?: string },
  ): AsyncGenerator<RequestOutput> {
    const ids = prompt.promptTokenIds;
    this.lastParams = params;
    if (ids.length >= this.maxModelLen) throw new FakeEngineInputError(`prompt of ${ids.length} tokens is too long`, "prompt");
    if (this.live.has(options.requestId)) throw new FakeEngineInputError(`duplicate request id ${options.requestId}`, "request_id");
    const n = params.n ?? 1;
    const maxTokens = Math.min(params.maxTokens ?? this.maxModelLen - ids.length, this.maxModelLen - ids.length);
    const temperature = params.temperature ?? 1;
    const baseSeed = temperature === 0 ? 0 : (params.seed ?? Math.floor(Math.random() * 2 ** 31));
    const stops = params.stop ?? [];
    const holdBack = params.includeStopStrInOutput ? 0 : Math.max(0, ...stops.map((s) => s.length - 1));
    const topN = params.logprobs ?? null;
    const fails = (prompt.prompt ?? this.tokenizer.decode(ids)).includes(this.failMarker);
    const scripted = this.options.script?.(prompt.prompt ?? this.tokenizer.decode(ids)) ?? null;
    const script = scripted === null ? null : [...this.tokenizer.encode(scripted, { addSpecialTokens: false }), EOS];
    const arrival = Date.now();
    let firstTokenAt: number | null = null;

    const live: Live = { aborted: false, blocks: 0, wake: null };
    this.live.set(options.requestId, live);
    this.prefixQueries += ids.length;
    this.allocate(live, ids.length * n);

    const samples = Array.from({ length: n }, (_, i) => ({
      tokens: [] as number[],
      logprobs: [] as TokenLogprobs[],
      text: "",
      emitted: 0, // chars of text already sent
      sentTokens: 0,
      finish: null as FinishReason,
      stopReason: null as string | number | null,
      rand: rng(hash(ids, baseSeed * 31 + i)),
    }));
    try {
      for (let step = 0; samples.some((s) => s.finish === null); step++) {
        if (this.options.stepDelayMs) {
          await new Promise<void>((resolve) => {
            live.wake = resolve;
            setTimeout(resolve, this.options.stepDelayMs);
          });
        } else {
          await new Promise<void>((resolve) => setImmediate(resolve));
        }
        if (live.aborted) return;
        if (fails && step === 2) throw new Error("fake engine exploded");
        if (this.options.pooling !== undefined) {
          const done: CompletionOutput = { index: 0, text: "", tokenIds: [], cumulativeLogprob: null, logprobs: null, finishReason: "length", stopReason: null };
          yield {
            requestId: options.requestId, prompt: prompt.prompt ?? null, promptTokenIds: ids, promptLogprobs: null, outputs: [done], finished: true,
            numCachedTokens: 0, pooled: this.pooledVector(ids),
          };
          return;
        }
        for (const s of samples) {
          if (s.finish !== null) continue;
          const r = s.rand();
          // (a failing request never ends before its failure: a random early EOS made tests of it flaky)
          const canEos = !params.ignoreEos && !fails && s.tokens.length >= (params.minTokens ?? 0);
          const tok =
            script !== null ? script[s.tokens.length]! : canEos && r < (this.options.eosProbability ?? 0.02) ? EOS : GEN_TOKENS[Math.floor(s.rand() * GEN_TOKENS.length)]!;
          s.tokens.push(tok);
          if (topN !== null) s.logprobs.push(this.fakeLogprobs(tok, topN, s.rand));
          if (tok === EOS) {
            s.finish = "stop";
          } else if (params.stopTokenIds?.includes(tok)) {
            s.finish = "stop";
            s.stopReason = tok;
          } else {
            s.text += this.tokenizer.decode([tok]);
            for (const stop of stops) {
              const at = s.text.indexOf(stop);
              if (at >= 0) {
                s.text = s.text.slice(0, params.includeStopStrInOutput ? at + stop.length : at);
                s.finish = "stop";
                s.stopReason = stop;
                break;
              }
            }
          }
          if (s.finish === null && s.tokens.length >= maxTokens) s.finish = "length";
        }
        this.allocate(live, (ids.length + Math.max(...samples.map((s) => s.tokens.length))) * n);
        const tokenAt = Date.now();
        firstTokenAt ??= tokenAt;
        const finished = samples.every((s) => s.finish !== null);
        const outputs: CompletionOutput[] = [];
        samples.forEach((s, index) => {
          if (s.sentTokens === s.tokens.length && s.finish === null) return;
          if (s.sentTokens === s.tokens.length && s.emitted === s.text.length) return; // already reported as finished
          const textEnd = s.finish !== null ? s.text.length : Math.max(s.emitted, s.text.length - holdBack);
          const delta = options.delta ?? false;
          outputs.push({
            index,
            text: delta ? s.text.slice(s.emitted, textEnd) : s.text.slice(0, textEnd),
            tokenIds: delta ? s.tokens.slice(s.sentTokens) : [...s.tokens],
            cumulativeLogprob: null,
            logprobs: topN === null ? null : delta ? s.logprobs.slice(s.sentTokens) : [...s.logprobs],
            finishReason: s.finish,
            stopReason: s.stopReason,
          });
          s.emitted = textEnd;
          s.sentTokens = s.tokens.length;
        });
        yield {
          requestId: options.requestId,
          prompt: prompt.prompt ?? null,
          promptTokenIds: ids,
          promptLogprobs: params.promptLogprobs != null ? ids.map((id, i) => (i === 0 ? null : this.fakeLogprobs(id, params.promptLogprobs!, rng(id)))) : null,
          outputs,
          finished,
          numCachedTokens: 0,
          metrics: { arrivalTime: arrival, firstScheduledTime: arrival, firstTokenTime: firstTokenAt, lastTokenTime: tokenAt, finishedTime: finished ? tokenAt : null },
        };
      }
    } finally {
      if (this.live.get(options.requestId) === live) this.release(options.requestId, live);
    }
  }

  private fakeLogprobs(chosen: number, top: number, rand: () => number): TokenLogprobs {
    const map: TokenLogprobs = new Map();
    const ranked = [chosen, ...GEN_TOKENS.filter((t) => t !== chosen)].slice(0, Math.max(top, 1));
    let lp = -0.1 - rand();
    ranked.forEach((id, i) => {
      const entry: Logprob = { logprob: lp, rank: i + 1, decodedToken: this.tokenizer.decode([id], { skipSpecialTokens: false }) };
      map.set(id, entry);
      lp -= 0.5 + rand();
    });
    return map;
  }
}
