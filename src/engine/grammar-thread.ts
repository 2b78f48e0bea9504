// Structured output's grammar thread: a worker that compiles grammars against the tokenizer's vocabulary and holds
// the requests' matchers, so that a compile (hundreds of ms for a big schema or many tools) runs beside the
// engine's steps instead of inside one (vLLM compiles on a thread pool; its requests wait in WAITING_FOR_FSM).
// A request whose grammar is compiling is not scheduled; the others keep decoding. A compiled grammar cannot
// leave the wasm instance that compiled it, so its matchers live on that thread too: their calls are synchronous
// (a message, then Atomics.wait on a shared counter the thread bumps after each reply), except the next mask,
// asked for when a step is dispatched and read when it is sampled. Calls queue behind a compile in progress, so
// a structured-output request already running waits for one too.
import { MessageChannel, receiveMessageOnPort, Worker, type MessagePort } from "node:worker_threads";
import type { GrammarVocab } from "../models/tokenizer-types.js";
import type { GrammarMatcher, StructuredOutputSpec } from "./structured-output.js";

/** What the engine's thread asks the grammar thread. */
type GrammarCall =
  | { op: "compile"; spec: StructuredOutputSpec; matchers: number[] }
  | { op: "accept"; matcher: number; tokenId: number }
  | { op: "rollback"; matcher: number; n: number }
  | { op: "mask"; matcher: number }
  | { op: "dispose"; matcher: number };
/** A call as posted: numbered from 1, or 0 when no reply is wanted (dispose). */
export type ToGrammarThread = GrammarCall & { call: number };

/** The grammar thread's answer to one call: a failed compile has `error`. */
export interface GrammarThreadReply {
  call: number;
  ok?: boolean;
  terminated?: boolean;
  mask?: Int32Array;
  error?: string;
}

export interface GrammarThreadData {
  vocab: GrammarVocab;
  vocabSize: number;
  stopTokenIds: number[];
  /** Int32 counter bumped (and notified) after each reply is posted on `replies`. */
  signal: SharedArrayBuffer;
  replies: MessagePort;
}

/** How long a synchronous call waits for the grammar thread before it gives up on it. */
const CALL_TIMEOUT_MS = 120_000;

/** One grammar thread (a vocabulary): compiles specs and answers their matchers' calls. */
export class GrammarThread {
  private readonly worker: Worker;
  private readonly replies: MessagePort;
  private readonly signal: Int32Array;
  private lastCall = 0;
  private lastMatcher = 0;
  /** Replies read while waiting for another, by call. */
  private readonly arrived = new Map<number, GrammarThreadReply>();
  /** Calls whose reply is not wanted any more (a mask asked for ahead, then the matcher moved). */
  private readonly dropped = new Set<number>();
  /** Compiles not answered yet: their matchers. */
  private readonly compiling = new Map<number, RemoteMatcher[]>();
  /** Set by poll() when a compile failed since the last poll. */
  private failedSincePoll = false;
  /** Whether close() has stopped the thread. */
  closed = false;

  /**
   * @param vocab the tokenizer's vocabulary.
   * @param vocabSize the logits' row width (the model's vocab_size, which may exceed the tokenizer's).
   * @param stopTokenIds the ids that end a complete output (the model's EOS ids).
   */
  constructor(vocab: GrammarVocab, vocabSize: number, stopTokenIds: readonly number[]) {
    const { port1, port2 } = new MessageChannel();
    const signal = new SharedArrayBuffer(4);
    const data: GrammarThreadData = { vocab, vocabSize, stopTokenIds: [...stopTokenIds], signal, replies: port2 };
    this.worker = new Worker(new URL("./grammar-thread-main.js", import.meta.url), { workerData: data, transferList: [port2] });
    this.worker.unref(); // an idle grammar thread never keeps the process alive
    this.replies = port1;
    this.signal = new Int32Array(signal);
  }

  /** `n` matchers at the start of a checked spec's grammar: ready once this thread has compiled it. */
  matchers(spec: StructuredOutputSpec, n: number): GrammarMatcher[] {
    const matchers = Array.from({ length: n }, () => new RemoteMatcher(this, ++this.lastMatcher));
    const call = this.send({ op: "compile", spec, matchers: matchers.map((m) => m.id) });
    this.compiling.set(call, matchers);
    return matchers;
  }

  /** Whether a compile has not been answered yet. */
  get isCompiling(): boolean {
    return this.compiling.size > 0;
  }

  /** Reads the replies that have come (marking compiled matchers ready); true when a compile failed since the last poll. */
  poll(): boolean {
    for (let m = receiveMessageOnPort(this.replies); m !== undefined; m = receiveMessageOnPort(this.replies))
      this.file(m.message as GrammarThreadReply);
    const failed = this.failedSincePoll;
    this.failedSincePoll = false;
    return failed;
  }

  /** Waits until a reply comes or `timeoutMs` passes (while the only requests left wait for their grammars). */
  waitForReply(timeoutMs: number): void {
    const seen = Atomics.load(this.signal, 0);
    if (this.readOne()) return;
    Atomics.wait(this.signal, 0, seen, timeoutMs);
  }

  /** Posts a call; returns its number (for take). */
  send(msg: GrammarCall): number {
    if (this.closed && msg.op !== "dispose") throw new Error("[structured output] the grammar thread is closed");
    const call = msg.op === "dispose" ? 0 : ++this.lastCall;
    this.worker.postMessage({ ...msg, call } satisfies ToGrammarThread);
    return call;
  }

  /** Waits for the reply to `call`. */
  take(call: number): GrammarThreadReply {
    const deadline = Date.now() + CALL_TIMEOUT_MS;
    for (;;) {
      const reply = this.arrived.get(call);
      if (reply !== undefined) {
        this.arrived.delete(call);
        if (reply.error !== undefined) throw new Error(`[structured output] the grammar thread failed: ${reply.error}`);
        return reply;
      }
      const seen = Atomics.load(this.signal, 0);
      if (this.readOne()) continue;
      if (this.closed) throw new Error("[structured output] the grammar thread is closed");
      if (Date.now() > deadline) throw new Error(`[structured output] the grammar thread has not answered in ${CALL_TIMEOUT_MS / 1000} s`);
      Atomics.wait(this.signal, 0, seen, 1000);
    }
  }

  /** Stops the thread (its compiled grammars and matchers go with it); resolves once it has exited. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.replies.close();
    await this.worker.terminate();
  }

  /** Forgets a call's reply (read or not). */
  drop(call: number): void {
    if (!this.arrived.delete(call)) this.dropped.add(call);
  }

  /** Reads one reply if one has come. */
  private readOne(): boolean {
    const m = receiveMessageOnPort(this.replies);
    if (m === undefined) return false;
    this.file(m.message as GrammarThreadReply);
    return true;
  }

  private file(reply: GrammarThreadReply): void {
    const compiled = this.compiling.get(reply.call);
    if (compiled !== undefined) {
      this.compiling.delete(reply.call);
      for (const m of compiled) m.compiled(reply.error ?? null);
      if (reply.error !== undefined) this.failedSincePoll = true;
    } else if (!this.dropped.delete(reply.call)) this.arrived.set(reply.call, reply);
  }
}

/** A matcher held by the grammar thread. */
class RemoteMatcher implements GrammarMatcher {
  ready = false;
  /** xgrammar's message when the grammar did not compile. */
  failure: string | null = null;
  private terminated = false;
  /** The call that asked for the next mask ahead (prefetch), not read yet. */
  private maskCall: number | null = null;

  constructor(
    private readonly thread: GrammarThread,
    readonly id: number,
  ) {}

  compiled(error: string | null): void {
    this.ready = error === null;
    this.failure = error;
  }

  acceptToken(tokenId: number): boolean {
    this.forgetMask();
    const r = this.thread.take(this.thread.send({ op: "accept", matcher: this.id, tokenId }));
    this.terminated = r.terminated!;
    return r.ok!;
  }

  rollback(n: number): void {
    this.forgetMask();
    this.terminated = this.thread.take(this.thread.send({ op: "rollback", matcher: this.id, n })).terminated!;
  }

  isTerminated(): boolean {
    return this.terminated;
  }

  prefetch(): void {
    this.maskCall ??= this.thread.send({ op: "mask", matcher: this.id });
  }

  nextTokenBitmask(): Int32Array {
    const call = this.maskCall ?? this.thread.send({ op: "mask", matcher: this.id });
    this.maskCall = null;
    return this.thread.take(call).mask!;
  }

  dispose(): void {
    this.forgetMask();
    this.thread.send({ op: "dispose", matcher: this.id });
  }

  private forgetMask(): void {
    if (this.maskCall !== null) this.thread.drop(this.maskCall);
    this.maskCall = null;
  }
}
