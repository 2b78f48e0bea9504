/**
 * torch.distributed's Work: what isend / irecv return, and collectives called with asyncOp (torch's async_op=True).
 * A point-to-point Work is in flight until wait(); a collective's has already completed when it is returned (the
 * collective ran before returning, as with asyncOp false: gloo's collectives here block the calling thread).
 *
 * @example
 * const w = isend(t, next);   // returns at once: a ring of isend + recv does not deadlock
 * recv(got, prev);
 * w.wait();                   // true; throws the op's failure (DistributedError, DistributedTimeoutError)
 */
export class Work {
  /** Set once the op has ended: its failure, or undefined. */
  private outcome: { error: unknown } | null = null;

  /** @internal poll: whether the op has ended; finish: blocks until it has, delivers its result, throws its failure. */
  constructor(
    private readonly poll: () => boolean,
    private readonly finish: () => void,
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

  /** torch's wait: blocks until the op has ended and returns true, or throws its failure (every call). */
  wait(): true {
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

/** What a collective returns: a completed Work when called with asyncOp true, else nothing. */
export type AsyncResult<A extends boolean> = A extends true ? Work : void;

/** @internal The return value of a collective that has run. */
export function ranResult<A extends boolean>(asyncOp: A | undefined): AsyncResult<A> {
  return (asyncOp === true ? Work.completed() : undefined) as AsyncResult<A>;
}
