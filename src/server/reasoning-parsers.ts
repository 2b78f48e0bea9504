// Reasoning parsers (vLLM's --reasoning-parser): a reasoning model's reply holds its thinking between <think> and
// </think>; the chat API returns that part as the message's `reasoning` (and `reasoning_content`, its older name)
// and the rest as `content`. As vLLM's parsers read a whole reply:
//   - a <think> in the reply is dropped with what came before it (templates usually put it in the prompt);
//   - with </think>: reasoning is the text before it, content the text after (null when empty);
//   - without: deepseek_r1 reads it all as reasoning (cut before it ended thinking); qwen3 the same, unless the
//     request turned thinking off (chat_template_kwargs.enable_thinking false): then it is all content.
// Streamed, the same split comes out delta by delta: reasoning until </think> (a marker, or a prefix of one at a
// delta's end, is held back until it is known), content after it.
// A reply to a prompt that already ended the reasoning (its last marker is </think>: a template that closed it, or an
// earlier turn's thinking kept in the prompt) is read in the third mode, "tagged": it has a thinking part only when it
// opens with <think>; otherwise it is all content. That matches the engine, whose structured output starts at once
// after such a prompt and after the reply's </think> otherwise (src/engine/reasoning.ts).
// granite and mistral read replies their own way, whatever the prompt (granite-mistral-reasoning.ts).
import { THINK_END as END, THINK_START as START, type ReasoningParserName } from "../engine/reasoning.js";
import { GraniteReasoningStream, MistralReasoningStream, splitGranite, splitMistral } from "./granite-mistral-reasoning.js";

export { REASONING_PARSERS, type ReasoningParserName } from "../engine/reasoning.js";

/** A reply's reasoning and content (either may be null), as vLLM's extract_reasoning splits it. */
export interface ReasoningSplit {
  reasoning: string | null;
  content: string | null;
}

/**
 * How a reply is read: "on" (reasoning first), "off" (all content: qwen3 with thinking turned off), or "tagged"
 * (the prompt ended the reasoning: reasoning only when the reply opens with <think>); "granite" and "mistral" by
 * those parsers' rules.
 */
export type ThinkingMode = "on" | "off" | "tagged" | "granite" | "mistral";

/**
 * Whether replies keep special tokens in their text unless a request says otherwise: Magistral's [THINK] and
 * [/THINK] are special tokens of its tokenizer, which the reply's text must show for the parser to read them.
 */
export const reasoningKeepsSpecialTokens = (parser: ReasoningParserName | null): boolean => parser === "mistral";

export function thinkingMode(parser: ReasoningParserName, chatTemplateKwargs: Record<string, unknown> | undefined, prompt: string): ThinkingMode {
  if (parser === "granite" || parser === "mistral") return parser;
  if (parser === "qwen3" && chatTemplateKwargs?.enable_thinking === false) return "off";
  const end = prompt.lastIndexOf(END);
  return end >= 0 && end > prompt.lastIndexOf(START) ? "tagged" : "on";
}

/** Splits a whole reply (see the file comment). */
export function splitReasoning(text: string, mode: ThinkingMode): ReasoningSplit {
  if (mode === "granite") return splitGranite(text);
  if (mode === "mistral") return splitMistral(text);
  if (mode === "off" || (mode === "tagged" && !text.startsWith(START))) return { reasoning: null, content: text };
  const s = text.indexOf(START);
  const body = s >= 0 ? text.slice(s + START.length) : text;
  const e = body.indexOf(END);
  if (e >= 0) return { reasoning: body.slice(0, e), content: body.slice(e + END.length) || null };
  return { reasoning: body, content: null };
}

/** Length of the longest suffix of `text` that is a proper prefix of `marker`. */
function partialSuffix(text: string, marker: string): number {
  for (let n = Math.min(marker.length - 1, text.length); n > 0; n--) if (marker.startsWith(text.slice(text.length - n))) return n;
  return 0;
}

/** One sample's reply split while it streams: push() each text delta, then the last with `final`. */
export class ReasoningStream {
  private held = "";
  private inContent: boolean;
  /** "tagged" until the reply's opening shows whether it starts with <think>. */
  private undecided: boolean;
  /** granite's or mistral's stream, which reads the reply instead. */
  private readonly other: GraniteReasoningStream | MistralReasoningStream | null;

  constructor(mode: ThinkingMode) {
    this.inContent = mode === "off";
    this.undecided = mode === "tagged";
    this.other = mode === "granite" ? new GraniteReasoningStream() : mode === "mistral" ? new MistralReasoningStream() : null;
  }

  /** The reasoning and content this delta adds (empty strings when it adds none of one). */
  push(delta: string, final: boolean): { reasoning: string; content: string } {
    if (this.other !== null) return this.other.push(delta, final);
    if (this.undecided) {
      const t = this.held + delta;
      if (t.length < START.length && START.startsWith(t) && !final) {
        this.held = t;
        return { reasoning: "", content: "" };
      }
      this.undecided = false;
      this.held = "";
      if (!t.startsWith(START)) {
        this.inContent = true;
        return { reasoning: "", content: t };
      }
      delta = t;
    }
    if (this.inContent) return { reasoning: "", content: delta };
    let t = (this.held + delta).replaceAll(START, "");
    this.held = "";
    const e = t.indexOf(END);
    if (e >= 0) {
      this.inContent = true;
      return { reasoning: t.slice(0, e), content: t.slice(e + END.length) };
    }
    if (!final) {
      const keep = Math.max(partialSuffix(t, END), partialSuffix(t, START));
      this.held = t.slice(t.length - keep);
      t = t.slice(0, t.length - keep);
    }
    return { reasoning: t, content: "" };
  }
}
