/**
 * torch.distributed.monitored_barrier: a barrier whose root (the group's first rank) names the ranks that did not
 * arrive in time, where barrier() only times out. Each other rank sends the root a one-byte message and waits for its
 * reply; the root polls its receives until every rank arrived or the timeout passed, then replies to all. It runs on
 * point-to-point messages with a tag kept from users (MONITORED_BARRIER_TAG): a consistency all-gather first would
 * itself wait for the missing rank.
 *
 * @example
 * monitoredBarrier(undefined, 10_000, true);
 * // rank 0, when ranks 1 and 2 never came: DistributedTimeoutError
 * //   "[monitored_barrier] Ranks 1, 2 failed to pass monitoredBarrier in 10000 ms"
 */
import { zeros, type Tensor } from "../tensor/index.js";
import { MONITORED_BARRIER_TAG, startRecv, startSend } from "./collectives.js";
import { DistributedError, DistributedTimeoutError } from "./errors.js";
import { resolveGroup, type ProcessGroup } from "./process-group.js";
import { sleepMs, type Work } from "./work.js";

const NAME = "monitored_barrier";

/**
 * Returns when every rank of group (default the world) has entered it. On the root, when some rank has not within
 * timeoutMs (default the group's timeout), throws DistributedTimeoutError naming the first such rank, or all of them
 * with waitAllRanks (torch's wait_all_ranks); the other ranks wait for the root's reply up to the group's timeout, as
 * torch's, and then throw DistributedTimeoutError. Ranks are global ranks.
 */
export function monitoredBarrier(group?: ProcessGroup, timeoutMs?: number, waitAllRanks = false): void {
  const g = resolveGroup(NAME, group);
  const limit = timeoutMs ?? g.timeoutMs;
  if (typeof limit !== "number" || !(limit >= 0 && limit <= 2 ** 40))
    throw new DistributedError(NAME, `timeoutMs must be a number of milliseconds in [0, 2^40], got ${String(limit)}`);
  if (g.size === 1) return;
  const root = g.ranks[0]!;
  const token = (): Tensor => zeros([1], { dtype: "uint8" });
  if (g.rank !== 0) {
    const arrived = startSend(NAME, token(), root, g, MONITORED_BARRIER_TAG, false);
    const release = startRecv(NAME, token(), root, g, MONITORED_BARRIER_TAG, false);
    try {
      arrived.wait();
      release.wait(); // the group's timeout, as torch's: the root may enter long after this rank
    } catch (err) {
      if (!(err instanceof DistributedError)) throw err;
      const Type = err instanceof DistributedTimeoutError ? DistributedTimeoutError : DistributedError;
      throw new Type(NAME, `rank ${g.ranks[g.rank]} reached the barrier but rank ${root} did not release it (see rank ${root}'s error for the ranks that failed to pass): ${err.message.replace(/^\[[^\]]*\] /, "")}`);
    }
    return;
  }
  const deadline = Date.now() + limit;
  const arrivals = g.ranks.slice(1).map((rank) => ({ rank, work: startRecv(NAME, token(), rank, g, MONITORED_BARRIER_TAG, false) }));
  while (arrivals.some((a) => !a.work.isCompleted()) && Date.now() < deadline) sleepMs(1);
  const failed = arrivals.filter((a) => !passed(a.work)).map((a) => a.rank);
  if (failed.length > 0) {
    const which = waitAllRanks ? `Ranks ${failed.join(", ")}` : `Rank ${failed[0]}`;
    throw new DistributedTimeoutError(NAME, `${which} failed to pass monitoredBarrier in ${limit} ms`);
  }
  const releases = arrivals.map((a) => startSend(NAME, token(), a.rank, g, MONITORED_BARRIER_TAG, false));
  for (const w of releases) w.wait();
}

/** Whether a rank's arrival message came (a receive that failed, e.g. its peer exited, did not pass). */
function passed(work: Work): boolean {
  if (!work.isCompleted()) return false;
  try {
    return work.wait();
  } catch {
    return false;
  }
}
