// Typed errors shared by every layer. Messages name the op, dtype and device where they apply:
// `[matmul] bf16 x int8 not supported on cpu`.

/** Base class of every error Kiln throws on purpose. */
export class KilnError extends Error {
  override name = "KilnError";
}

/** A tensor op was called with arguments it cannot accept (shape, dtype, device, range). */
export class OpError extends KilnError {
  override name = "OpError";
  constructor(
    readonly op: string,
    message: string,
  ) {
    super(`[${op}] ${message}`);
  }
}

/** A dtype/device combination the chosen back end does not implement. */
export class UnsupportedError extends OpError {
  override name = "UnsupportedError";
}

/** An index outside its dimension (checked in debug mode, and always where memory safety needs it). */
export class IndexOutOfRangeError extends OpError {
  override name = "IndexOutOfRangeError";
}

/** A NaN or Inf produced by an op in debug mode. */
export class NonFiniteError extends OpError {
  override name = "NonFiniteError";
}

/** Use of a tensor after dispose(). */
export class DisposedTensorError extends OpError {
  override name = "DisposedTensorError";
}

/**
 * An op or host access that cannot be recorded into a step graph (a captured device stream): a host-side
 * kernel, a blocking call, or reading/writing captured memory on the host while capturing.
 */
export class CaptureError extends OpError {
  override name = "CaptureError";
}

/** A back end that is unknown or cannot load on this machine. */
export class BackendUnavailableError extends KilnError {
  override name = "BackendUnavailableError";
  constructor(
    readonly backend: string,
    readonly reason: string,
  ) {
    super(`back end "${backend}" is unavailable: ${reason}`);
  }
}
