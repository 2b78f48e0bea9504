// Finish conditions after each sampled token (vLLM v1 check_stop + the detokenizer's stop-string search).
import type { Request } from "./request.js";

/**
 * Token-level stops, in vLLM's order (after a complete structured output): max_model_len; nothing before
 * min_tokens; EOS (unless ignore_eos); stop_token_ids; max_tokens. Sets the request's status and stopReason;
 * returns true when it finished.
 */
export function checkTokenStop(req: Request, tokenId: number, maxModelLen: number): boolean {
  const p = req.params;
  // a structured output whose grammar took its stop token is complete (before min_tokens too: nothing may follow)
  if (req.grammar?.isTerminated === true && !p.ignoreEos) {
    req.status = "FINISHED_STOPPED";
    req.stopReason = tokenId === req.eosTokenIds[0] ? null : tokenId;
    return true;
  }
  // the length limits first, as vLLM's check_stop: min_tokens never runs a request past max_model_len
  if (req.numTokens >= maxModelLen) {
    req.status = "FINISHED_LENGTH_CAPPED";
    return true;
  }
  if (req.numOutputTokens < p.minTokens) return false;
  if (!p.ignoreEos && req.eosTokenIds.includes(tokenId)) {
    req.status = "FINISHED_STOPPED";
    // the tokenizer's EOS reports no reason; generation_config's other end ids are stop tokens in vLLM, named
    req.stopReason = tokenId === req.eosTokenIds[0] ? null : tokenId;
    return true;
  }
  if (p.stopTokenIds.includes(tokenId)) {
    req.status = "FINISHED_STOPPED";
    req.stopReason = tokenId;
    return true;
  }
  if (req.numOutputTokens >= req.maxTokens) {
    req.status = "FINISHED_LENGTH_CAPPED";
    return true;
  }
  return false;
}

/**
 * Looks for a stop string that ends inside the last `newChars` characters of `text` (so a string spanning a
 * token boundary is found once its last character arrives). Returns the earliest match, with the text
 * truncated before it (or after it with includeStopStr), or null.
 */
export function findStopString(
  text: string,
  newChars: number,
  stops: readonly string[],
  includeStopStr: boolean,
): { stop: string; text: string } | null {
  if (newChars <= 0 || stops.length === 0) return null;
  let best: { stop: string; index: number } | null = null;
  for (const s of stops) {
    const from = Math.max(0, text.length - newChars - s.length + 1);
    const i = text.indexOf(s, from);
    if (i >= 0 && (best === null || i < best.index)) best = { stop: s, index: i };
  }
  if (best === null) return null;
  const end = includeStopStr ? best.index + best.stop.length : best.index;
  return { stop: best.stop, text: text.slice(0, end) };
}

/** Characters held back from streamed text while a stop string might still be forming (vLLM stop_buffer_length). */
export function stopHoldback(req: Request): number {
  const p = req.params;
  if (p.stop.length === 0 || p.includeStopStrInOutput) return 0;
  let m = 0;
  for (const s of p.stop) m = Math.max(m, s.length);
  return m - 1;
}
