// Reasoning models (vLLM's --reasoning-parser) at the engine: a reply thinks between <think> and </think> before it
// answers, and structured output constrains only the answer. As vLLM's StructuredOutputManager does, a request's
// grammar stays idle (no mask, no matcher advance) until the reasoning has ended: in the prompt already (a chat
// template that closed it, e.g. Qwen3's with enable_thinking false), or at a sampled </think>; the grammar starts
// with the token after it. The markers must be single tokens of the tokenizer, as vLLM's parsers require.
// The server splits the reply's text into reasoning and content (src/server/reasoning-parsers.ts).
import type { TokenizerLike } from "../models/tokenizer-types.js";

export const REASONING_PARSERS = ["deepseek_r1", "qwen3"] as const;
export type ReasoningParserName = (typeof REASONING_PARSERS)[number];

export const THINK_START = "<think>";
export const THINK_END = "</think>";

/** The token ids of <think> and </think>. */
export interface ThinkMarkers {
  start: number;
  end: number;
}

/** The tokenizer's single-token id of `text`, or null when it spells it with more than one token. */
function singleToken(tokenizer: TokenizerLike, text: string): number | null {
  const ids = tokenizer.encode(text, { addSpecialTokens: false });
  return ids.length === 1 && tokenizer.idToToken(ids[0]!) === text ? ids[0]! : null;
}

/** The markers' ids for `parser`; throws when the tokenizer lacks either as a single token (as vLLM refuses to start). */
export function thinkMarkers(tokenizer: TokenizerLike, parser: ReasoningParserName): ThinkMarkers {
  const start = singleToken(tokenizer, THINK_START);
  const end = singleToken(tokenizer, THINK_END);
  if (start === null || end === null)
    throw new Error(`[engine] reasoning parser ${parser} needs ${THINK_START} and ${THINK_END} as single tokens of the model's tokenizer, which spells ${start === null ? THINK_START : THINK_END} with several`);
  return { start, end };
}

/** Whether `ids` leave the reasoning ended: their last marker is </think> (vLLM's is_reasoning_end). */
export function reasoningEnded(ids: readonly number[], m: ThinkMarkers): boolean {
  for (let i = ids.length - 1; i >= 0; i--) {
    if (ids[i] === m.start) return false;
    if (ids[i] === m.end) return true;
  }
  return false;
}
