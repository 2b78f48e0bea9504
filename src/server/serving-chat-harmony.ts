// Chat completions for gpt-oss, as vLLM serves them: the prompt in Harmony format (harmony-render.ts) instead of a
// chat template, generation stopped at <|return|> or <|call|>, and the reply read by channel from its token ids
// (harmony-parse.ts): `reasoning` / `reasoning_content` from analysis, `content` from final (and preambles), and
// `tool_calls` from messages to functions.NAME, with finish_reason "tool_calls". As vLLM:
//   - the channels are read without --reasoning-parser too (openai_gptoss is accepted and changes nothing);
//   - tool_choice "auto" is served without --tool-call-parser too, but only --tool-call-parser openai returns the
//     calls: without it a reply's calls are dropped, whole or streamed (vLLM's Harmony parser emits tool segments only
//     with a tool parser; its older streaming path returned them regardless);
//   - tool_choice "none" keeps calls out of the reply;
//   - structured output constrains the final channel only: the engine keeps a request's grammar idle until the reply
//     opens it (`<|channel|>final ... <|message|>`, engine/reasoning.ts harmonyEnd), as vLLM with openai_gptoss;
//   - tool_choice "required" and a named function constrain the whole reply instead (harmony-tool-grammar.ts, vLLM's
//     Harmony structural tag): any analysis and preamble, then one call of a given function (the named one), its
//     arguments following the function's schema. On chat they need --tool-call-parser openai, which reads the calls
//     (vLLM applies the tag only with it; Kiln refuses instead of answering without calls, as vLLM PR #48672 proposes).
// What Harmony serving cannot do is a 400: continuing a message, a request's own chat template, and an effort other
// than low, medium or high.
import type { FinishReason, SamplingParams } from "../engine/types.js";
import { badRequest } from "./errors.js";
import type { Json } from "./fields.js";
import { callName, HarmonyParser, messageKind, readHarmonyReply, type HarmonyTokens, type TokenDelta } from "./harmony-parse.js";
import { harmonyDate, harmonyEffort, renderHarmonyPrompt } from "./harmony-render.js";
import { harmonyToolCallTag } from "./harmony-tool-grammar.js";
import type { ChatRequest } from "./protocol.js";
import { randomId, type ServingContext } from "./serving-context.js";

/** How the server serves a Harmony model: its special tokens, and whether whole replies' calls are read (--tool-call-parser openai). */
export interface HarmonyServing {
  tokens: HarmonyTokens;
  toolCalls: boolean;
}

interface ToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

const toolCall = (name: string, args: string): ToolCall => ({ id: randomId("chatcmpl-tool"), type: "function", function: { name, arguments: args } });

/**
 * The Harmony prompt of a chat request (or a Responses request as one) over its wire messages; `effort` is the
 * request's reasoning effort (reasoning_effort on chat, reasoning.effort on responses) and `param` names it.
 */
export function harmonyChatPrompt(req: ChatRequest, messages: readonly unknown[], effort: unknown, param: string): string {
  if (req.continueFinalMessage)
    throw badRequest("continue_final_message is not supported for gpt-oss: a Harmony reply starts a new assistant message", "continue_final_message");
  if (req.chatTemplate !== undefined)
    throw badRequest("gpt-oss prompts are rendered in Harmony format: a chat template does not apply", "chat_template");
  return renderHarmonyPrompt(messages, { reasoningEffort: harmonyEffort(effort, param), date: harmonyDate(), tools: req.tools });
}

/** The request's effort on the chat API: reasoning_effort, or chat_template_kwargs.reasoning_effort (where Responses puts it). */
export const chatEffort = (body: Json, req: ChatRequest): unknown => body.reasoning_effort ?? req.chatTemplateKwargs?.reasoning_effort;

/**
 * Sampling params that also stop at <|return|> (the answer is done) and <|call|> (a tool must answer), as vLLM adds
 * them; tool_choice "required" or a named function swaps the arguments' schema the request parser set for the
 * grammar of a whole reply that calls the function.
 */
export function harmonyParams(h: HarmonyServing, params: Partial<SamplingParams>, req: ChatRequest): Partial<SamplingParams> {
  const stops = params.stopTokenIds ?? [];
  const add = [h.tokens.return, h.tokens.call].filter((id) => !stops.includes(id));
  const out = { ...params, stopTokenIds: [...stops, ...add] };
  const tc = req.toolChoice;
  if ((tc.kind === "required" || tc.kind === "named") && req.tools !== undefined)
    out.structuredOutputs = { structuralTag: harmonyToolCallTag(req.tools, tc, params.structuredOutputs?.disableAnyWhitespace !== true), harmonyReply: true };
  return out;
}

/** Chat's tool_choice "required" or a named function on gpt-oss needs the calls read: --tool-call-parser openai. */
export function checkHarmonyToolChoice(ctx: ServingContext, req: ChatRequest): void {
  if ((req.toolChoice.kind === "required" || req.toolChoice.kind === "named") && !ctx.harmony!.toolCalls)
    throw badRequest(
      'tool_choice "required" and named functions need --enable-auto-tool-choice --tool-call-parser openai for gpt-oss: without it the calls are not read from the reply',
      "tool_choice",
    );
}

/** A parser over a reply's tokens so far; a stop token the engine left out of them still ends the last message. */
export function parseReply(ctx: ServingContext, ids: readonly number[], finish: FinishReason | "abort", stopReason: string | number | null): HarmonyParser {
  const h = ctx.harmony!;
  const p = new HarmonyParser(ctx.tokenizer, h.tokens);
  for (const id of ids) p.push(id);
  endReply(p, h, finish, stopReason);
  return p;
}

/** Ends a reply's parse: its last stop token when the engine left it out of the ids, else any pending bytes. */
export function endReply(p: HarmonyParser, h: HarmonyServing, finish: FinishReason | "abort", stopReason: string | number | null): TokenDelta | null {
  if (finish === "stop" && p.current !== null && (stopReason === h.tokens.return || stopReason === h.tokens.call)) {
    p.push(stopReason);
    return null;
  }
  return p.finish();
}

/** Whether the request's calls are read in a whole reply (the parser is set and tool_choice is not "none"). */
const readsCalls = (ctx: ServingContext, req: ChatRequest): boolean => ctx.harmony!.toolCalls && req.tools !== undefined && req.toolChoice.kind !== "none";

/** A whole reply as a chat message's reasoning, content and tool calls, and the choice's finish reason. */
export function harmonyMessage(ctx: ServingContext, req: ChatRequest, ids: readonly number[], finish: FinishReason | "abort", stopReason: string | number | null) {
  const r = readHarmonyReply(parseReply(ctx, ids, finish, stopReason));
  let calls = readsCalls(ctx, req) ? r.calls.map((c) => toolCall(c.name, c.arguments)) : [];
  if (!req.parallelToolCalls) calls = calls.slice(0, 1); // (vLLM's maybe_filter_parallel_tool_calls)
  return {
    reasoning: req.includeReasoning ? r.reasoning : null,
    content: r.content,
    toolCalls: calls,
    finishReason: calls.length > 0 ? "tool_calls" : (finish ?? "abort"),
  };
}

/**
 * Streamed replies, one parser per choice: each chunk's tokens become one delta with the content, the reasoning
 * (`reasoning` and `reasoning_content`) and the tool-call deltas they wrote (a call opens with its id and name when
 * its header is read; its arguments follow as written); a choice that called a tool ends with "tool_calls".
 */
export class HarmonyChatStream {
  private readonly parsers: HarmonyParser[];
  /** Per choice: the tool_calls index of each call message (by message index), and how many calls it opened. */
  private readonly calls: Map<number, number>[];

  constructor(
    private readonly ctx: ServingContext,
    private readonly req: ChatRequest,
    n: number,
  ) {
    this.parsers = Array.from({ length: n }, () => new HarmonyParser(ctx.tokenizer, ctx.harmony!.tokens));
    this.calls = Array.from({ length: n }, () => new Map());
  }

  delta(index: number, ids: readonly number[], finish: FinishReason, stopReason: string | number | null): { delta: Record<string, unknown>; finishReason: string | null } {
    const p = this.parsers[index]!;
    const deltas = ids.map((id) => p.push(id));
    if (finish !== null) deltas.push(endReply(p, this.ctx.harmony!, finish, stopReason));
    let content: string | null = null;
    let reasoning = "";
    const toolCalls: { index: number; id?: string; type?: "function"; function: { name?: string; arguments: string } }[] = [];
    const calls = this.calls[index]!;
    for (const d of deltas) {
      if (d === null) continue;
      const kind = messageKind(d.message);
      if (kind === "content" && !d.opened) content = (content ?? "") + d.text;
      else if (kind === "reasoning" && this.req.includeReasoning) reasoning += d.text;
      else if (kind === "call" && readsCalls(this.ctx, this.req)) {
        let at = calls.get(d.index);
        if (at === undefined) {
          if (!this.req.parallelToolCalls && calls.size > 0) continue; // the first call only
          calls.set(d.index, (at = calls.size));
          toolCalls.push({ index: at, ...toolCall(callName(d.message), "") });
        }
        if (d.text === "") continue;
        const last = toolCalls[toolCalls.length - 1];
        if (last?.index === at) last.function.arguments += d.text;
        else toolCalls.push({ index: at, function: { arguments: d.text } });
      }
    }
    const delta: Record<string, unknown> = {};
    if (content !== null) delta.content = content;
    if (reasoning !== "") Object.assign(delta, { reasoning, reasoning_content: reasoning });
    if (toolCalls.length > 0) delta.tool_calls = toolCalls;
    const finishReason = finish === null ? null : calls.size > 0 ? "tool_calls" : finish;
    return { delta, finishReason };
  }
}

/** How many of a reply's tokens are reasoning: the text tokens of its analysis messages (Responses' reasoning_tokens). */
export function harmonyReasoningTokens(ctx: ServingContext, ids: readonly number[]): number {
  const p = new HarmonyParser(ctx.tokenizer, ctx.harmony!.tokens);
  let n = 0;
  for (const id of ids) {
    const d = p.push(id);
    if (d !== null && !d.opened && messageKind(d.message) === "reasoning") n++;
  }
  return n;
}
