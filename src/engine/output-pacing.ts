// How often a request's outputs reach its consumer: after every engine step (the default), every `streamInterval`
// tokens (vLLM's --stream-interval), or only when finished (vLLM's RequestOutputKind.FINAL_ONLY, which its server
// uses for non-streaming requests). Skipped steps cost nothing: outputs are cumulative, so the next one delivered
// carries their tokens and text. Behind a worker thread each delivery is a message and a wake-up of the caller's
// thread, which on a small machine takes CPU time from the step itself: one non-streaming request on the
// SmolLM-135M-shaped Q8_0 model decoded at 277-285 tok/s through `kiln serve` final-only against 230-272 with an
// output per step (2-vCPU VM, three alternating server starts of 6 requests of 256 tokens); the server's main thread
// went from ~225 to ~39 us of CPU per token.
import { EngineInputError } from "./errors.js";
import type { RequestOutput, TokenStep } from "./types.js";

/**
 * A final-only request still delivers its first output (the server counts a request without one as waiting) and, at
 * most this often, a partial one carrying its steps' token times (tokenSteps), so that the per-token metrics
 * (generation tokens, inter-token latency) stay current during a long request.
 */
export const FINAL_ONLY_FLUSH_MS = 250;

/** This thread's clock origin (ms since the epoch), read once (Node's getter takes ~0.17 us a call, now() ~0.08). */
const ORIGIN = performance.timeOrigin;
/** Milliseconds since the epoch with a high-resolution clock's precision, comparable between threads. */
export const epochNow = (): number => ORIGIN + performance.now();

/** One request's pacing. */
export class OutputPacer {
  private steps: TokenStep[] = [];
  private seenTokens = 0;
  private pendingTokens = 0;
  private delivered = false;
  private deliveredTokens = false;
  private lastDelivery = 0;

  /** streamInterval: tokens per delivery (an integer >= 1); finalOnly: deliver only as FINAL_ONLY_FLUSH_MS says. */
  constructor(
    private readonly streamInterval: number,
    private readonly finalOnly: boolean,
  ) {
    if (!Number.isInteger(streamInterval) || streamInterval < 1) throw new RangeError(`stream interval must be an integer >= 1, got ${streamInterval}`);
  }

  /** Whether any step can be held back (otherwise every output is delivered as it comes, without tokenSteps). */
  get paced(): boolean {
    return this.finalOnly || this.streamInterval > 1;
  }

  /**
   * Records one step's cumulative output of the request at `now` (epochNow). Returns the steps whose tokens no
   * delivered output has carried yet when this output is to be delivered now (the finished one always is; so are
   * the first output and the first with tokens), else null: its tokens wait for a later delivery.
   */
  offer(out: RequestOutput, now: number): TokenStep[] | null {
    let total = 0;
    for (const o of out.outputs) total += o.tokenIds.length;
    if (total > this.seenTokens) {
      this.steps.push({ time: now, tokens: total - this.seenTokens });
      this.pendingTokens += total - this.seenTokens;
      this.seenTokens = total;
    }
    const due =
      out.finished ||
      !this.delivered ||
      (!this.deliveredTokens && total > 0) ||
      (this.finalOnly ? now - this.lastDelivery >= FINAL_ONLY_FLUSH_MS : this.pendingTokens >= this.streamInterval);
    if (!due) return null;
    const steps = this.steps;
    this.steps = [];
    this.pendingTokens = 0;
    this.delivered = true;
    this.deliveredTokens ||= total > 0;
    this.lastDelivery = now;
    return steps;
  }
}

/**
 * The pacer of a request's GenerateOptions (streamInterval default 1, finalOnly default false), or null when every
 * step's output is delivered. An interval that is not an integer >= 1 is an EngineInputError naming stream_interval.
 */
export function outputPacer(options: { streamInterval?: number; finalOnly?: boolean }): OutputPacer | null {
  const pacer = new OutputPacer(streamIntervalOf(options), options.finalOnly ?? false);
  return pacer.paced ? pacer : null;
}

/** A request's stream interval (default 1); one not an integer >= 1 is an EngineInputError (stream_interval). */
export function streamIntervalOf(options: { streamInterval?: number }): number {
  const interval = options.streamInterval ?? 1;
  if (!Number.isInteger(interval) || interval < 1) throw new EngineInputError("stream_interval", `must be an integer >= 1, got ${interval}`);
  return interval;
}
