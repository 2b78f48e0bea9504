import { DistributedError, DistributedTimeoutError } from "./errors.js";

/**
 * torch.distributed's Work: what isend / irecv return, and collectives called with asyncOp (torch's async_op=True).
 * A point-to-point Work is in flight until wait(); a collective's has already completed when it is returned (the
 * collective ran before returning, as with asyncOp false: gloo's collectives here block the calling thread).
 *
 * @example
 * const w = isend(t, next);   // returns at once: a ring of isend + recv does not deadlock
 * recv(got, prev);
 * w.wait();                   // true; throws the op's failure (DistributedError, DistributedTimeoutError)
 * irecv(u, prev).wait(500);    // or DistributedTimeoutError after 500 ms; the receive stays posted (wait again)
 */
export class Work {
  /** Set once the op has ended: its failure, or undefined. */
  private outcome: { error: unknown } | null = null;

  /** @internal poll: whether the op has ended; finish: blocks until it has, delivers its result, throws its failure. */
  constructor(
    private readonly poll: () => boolean,
    private readonly finish: () => void,
    /** The op named by a wait(timeoutMs) that expires. */
    private readonly op = "wait",
  ) {}

  /** @internal */
  static completed(): Work {
    return new Work(() => true, () => undefined);
  }

  /** torch's is_completed: whether the op has ended (a received tensor then holds the message; wait() raises a failure). */
  isCompleted(): boolean {
    if (this.outcome === null && this.poll()) this.settle();
    return this.outcome !== null;
  }

  /**
   * torch's wait: blocks until the op has ended and returns true, or throws its failure (every call). With timeoutMs
   * (torch's wait(timeout)) it polls isCompleted() and throws DistributedTimeoutError once timeoutMs have passed; the
   * op stays in flight, so the group stays usable and a later wait() can still complete it.
   */
  wait(timeoutMs?: number): true {
    if (timeoutMs !== undefined && !(typeof timeoutMs === "number" && timeoutMs >= 0 && timeoutMs <= 2 ** 40))
      throw new DistributedError(this.op, `wait's timeoutMs must be a number of milliseconds in [0, 2^40], got ${String(timeoutMs)}`);
    if (timeoutMs !== undefined) {
      const deadline = Date.now() + timeoutMs;
      while (!this.isCompleted()) {
        if (Date.now() >= deadline) throw new DistributedTimeoutError(this.op, `wait timed out after ${timeoutMs} ms (the op is still in flight)`);
        sleepMs(1);
      }
    }
    if (this.outcome === null) this.settle();
    if (this.outcome!.error !== undefined) throw this.outcome!.error;
    return true;
  }

  private settle(): void {
    try {
      this.finish();
      this.outcome = { error: undefined };
    } catch (error) {
      this.outcome = { error };
    }
  }
}

const sleeper = new Int32Array(new SharedArrayBuffer(4));

/** @internal Blocks the calling thread for ms milliseconds (polling loops: Work.wait(timeoutMs), monitoredBarrier). */
export function sleepMs(ms: number): void {
  Atomics.wait(sleeper, 0, 0, ms);
}

/** What a collective returns: a completed Work when called with asyncOp true, else nothing. */
export type AsyncResult<A extends boolean> = A extends true ? Work : void;

/** @internal The return value of a collective that has run. */
export function ranResult<A extends boolean>(asyncOp: A | undefined): AsyncResult<A> {
  return (asyncOp === true ? Work.completed() : undefined) as AsyncResult<A>;
}
