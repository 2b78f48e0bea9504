// Typed errors of torch.distributed's role. Each names the collective (`[all_reduce] ...`), as STYLE.md 18 asks.
import { BackendUnavailableError, OpError } from "../util/errors.js";

/** Misuse of a collective or of the process group (not initialized, rank out of range, shape/dtype mismatch). */
export class DistributedError extends OpError {
  override name = "DistributedError";
}

/** A peer did not arrive in time (rendezvous, collective or point-to-point); torch raises after its timeout too. */
export class DistributedTimeoutError extends DistributedError {
  override name = "DistributedTimeoutError";
}

/** The transport failed (a peer exited, a connection dropped): the group is unusable afterwards, as in torch. */
export class DistributedBackendError extends DistributedError {
  override name = "DistributedBackendError";
}

/** The gloo back end is not built (libgloo-dev's headers were missing when the addon was built). */
export class GlooUnavailableError extends BackendUnavailableError {
  override name = "GlooUnavailableError";
  constructor(reason: string) {
    super(
      "gloo",
      `${reason}; install the library (apt-get install libgloo-dev) and rebuild the addon (npx node-gyp rebuild)`,
    );
  }
}
