// Typed errors of the serving engine. An input error rejects one request; the engine keeps serving the others.
import { KilnError } from "../util/errors.js";

/** A request the engine refuses at add time (bad sampling parameter, prompt too long, can never fit the KV pool). */
export class EngineInputError extends KilnError {
  override name = "EngineInputError";
  /**
   * @param param the offending parameter, in vLLM's snake_case wire name (`top_p`, `prompt`, `max_tokens`...)
   */
  constructor(
    readonly param: string,
    message: string,
  ) {
    super(`[engine] invalid ${param}: ${message}`);
  }
}

/** A request id that is unknown or already in use. */
export class EngineRequestIdError extends KilnError {
  override name = "EngineRequestIdError";
  constructor(
    readonly requestId: string,
    message: string,
  ) {
    super(`[engine] request ${JSON.stringify(requestId)}: ${message}`);
  }
}
