// Reasoning models (vLLM's --reasoning-parser) at the engine: a reply thinks between markers (<think> and </think>;
// Magistral's [THINK] and [/THINK]) before it answers, and structured output constrains only the answer. As vLLM's
// StructuredOutputManager does, a request's grammar stays idle (no mask, no matcher advance) until the reasoning has
// ended: in the prompt already (a chat template that closed it, e.g. Qwen3's with enable_thinking false), or at a
// sampled end marker; the grammar starts with the token after it. Token markers must be single tokens of the
// tokenizer, as vLLM's parsers require. Granite's markers are phrases ("Here is my thought process:" ... "Here is my
// response:"), which no token marks and its own prompt quotes: vLLM's granite parser has no reasoning end, so its
// grammars never start; Kiln refuses structured output under it instead (textMarkersRefusal).
// The server splits the reply's text into reasoning and content (src/server/reasoning-parsers.ts).
import type { TokenizerLike } from "../models/tokenizer-types.js";

export const REASONING_PARSERS = ["deepseek_r1", "qwen3", "mistral", "granite"] as const;
export type ReasoningParserName = (typeof REASONING_PARSERS)[number];

export const THINK_START = "<think>";
export const THINK_END = "</think>";

/** A parser's markers: single tokens that open and close the reasoning, or phrases of text (any of each list). */
export type ReasoningMarkers =
  | { kind: "token"; start: string; end: string }
  | { kind: "text"; start: readonly string[]; end: readonly string[] };

/** Each parser's markers (vLLM's: granite also takes "Here's", which quantized Granites write). */
export const REASONING_MARKERS: Record<ReasoningParserName, ReasoningMarkers> = {
  deepseek_r1: { kind: "token", start: THINK_START, end: THINK_END },
  qwen3: { kind: "token", start: THINK_START, end: THINK_END },
  mistral: { kind: "token", start: "[THINK]", end: "[/THINK]" },
  granite: {
    kind: "text",
    start: ["Here's my thought process:", "Here is my thought process:"],
    end: ["Here's my response:", "Here is my response:"],
  },
};

/** Why structured output cannot follow `parser`'s reasoning, or null when it can (its markers are tokens). */
export function textMarkersRefusal(parser: ReasoningParserName): string | null {
  const m = REASONING_MARKERS[parser];
  return m.kind === "token"
    ? null
    : `structured output (response_format, structured_outputs, or tool_choice "required" or a named function) cannot follow the ${parser} reasoning parser's ` +
        `reasoning: its markers are text (${JSON.stringify(m.end[1])}), not tokens, so the answer's start cannot be found (vLLM's ${parser} parser never starts the grammar)`;
}

/** The token ids of the reasoning's start and end markers (<think> and </think>, or [THINK] and [/THINK]). */
export interface ThinkMarkers {
  start: number;
  end: number;
}

/** The tokenizer's single-token id of `text`, or null when it spells it with more than one token. */
function singleToken(tokenizer: TokenizerLike, text: string): number | null {
  const ids = tokenizer.encode(text, { addSpecialTokens: false });
  return ids.length === 1 && tokenizer.idToToken(ids[0]!) === text ? ids[0]! : null;
}

/**
 * The markers' ids for `parser`; throws when the tokenizer lacks either as a single token (as vLLM refuses to
 * start), or when the parser's markers are text (see hasTokenMarkers).
 */
export function thinkMarkers(tokenizer: TokenizerLike, parser: ReasoningParserName): ThinkMarkers {
  const m = REASONING_MARKERS[parser];
  if (m.kind !== "token") throw new Error(`[engine] reasoning parser ${parser} has text markers, not tokens`);
  const start = singleToken(tokenizer, m.start);
  const end = singleToken(tokenizer, m.end);
  if (start === null || end === null)
    throw new Error(`[engine] reasoning parser ${parser} needs ${m.start} and ${m.end} as single tokens of the model's tokenizer, which spells ${start === null ? m.start : m.end} with several`);
  return { start, end };
}

/** Whether `parser`'s markers are tokens (thinkMarkers finds them), not phrases. */
export const hasTokenMarkers = (parser: ReasoningParserName): boolean => REASONING_MARKERS[parser].kind === "token";

/**
 * When a reasoning model's reasoning is over, as a request's grammar watches for it: `endedIn(ids)` says whether
 * `ids` (a prompt, or the latest `window` tokens of a reply, the last just sampled) leave it ended.
 * <think> models: the last marker is </think> (a window of one: the token is </think>). Harmony (gpt-oss): the reply
 * has opened its final channel, `<|channel|>final` then `<|message|>` with at most 20 tokens between (a
 * `<|constrain|>json`), after the message's last `<|start|>` (vLLM's GptOssReasoningParser.is_reasoning_end).
 */
export interface ReasoningEnd {
  readonly window: number;
  endedIn(ids: readonly number[]): boolean;
}

/** The <think> markers' end. */
export function thinkEnd(m: ThinkMarkers): ReasoningEnd {
  return { window: 1, endedIn: (ids) => reasoningEnded(ids, m) };
}

const HARMONY_MAX_BETWEEN = 20;

/** Harmony's end (see ReasoningEnd), or null when the tokenizer lacks Harmony's special tokens. */
export function harmonyEnd(tokenizer: TokenizerLike): ReasoningEnd | null {
  let channel: number | null, message: number | null, start: number | null;
  try {
    channel = singleToken(tokenizer, "<|channel|>");
    message = singleToken(tokenizer, "<|message|>");
    start = singleToken(tokenizer, "<|start|>");
  } catch {
    return null; // a tokenizer that cannot spell them (a test's character tokenizer) has no Harmony
  }
  if (channel === null || message === null || start === null) return null;
  const final = tokenizer.encode("final", { addSpecialTokens: false });
  const prefix = [channel, ...final];
  return {
    window: prefix.length + HARMONY_MAX_BETWEEN + 1,
    endedIn(ids) {
      const n = ids.length;
      if (n === 0 || ids[n - 1] !== message) return false;
      // the prefix ends at most HARMONY_MAX_BETWEEN tokens before <|message|>, with no <|start|> after it
      for (let end = n - 1; end >= Math.max(prefix.length, n - 1 - HARMONY_MAX_BETWEEN); end--) {
        if (ids[end - 1] === start) return false;
        if (prefix.every((t, i) => ids[end - prefix.length + i] === t)) return true;
      }
      return false;
    },
  };
}

/** Whether `ids` leave the reasoning ended: their last marker is </think> (vLLM's is_reasoning_end). */
export function reasoningEnded(ids: readonly number[], m: ThinkMarkers): boolean {
  for (let i = ids.length - 1; i >= 0; i--) {
    if (ids[i] === m.start) return false;
    if (ids[i] === m.end) return true;
  }
  return false;
}
