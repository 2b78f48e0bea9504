// A Messages API reply as Anthropic's objects: the message, its content blocks and its stop reason. Shared by whole
// replies (serving-messages.ts) and streamed ones (messages-stream.ts), so that both end a reply the same way.
import { randomBytes } from "node:crypto";
import type { FinishReason, SamplingParams } from "../engine/types.js";
import type { MessagesRequest } from "./anthropic-protocol.js";
import type { Json } from "./fields.js";
import type { ChatRequest } from "./protocol.js";
import type { ThinkingMode } from "./reasoning-parsers.js";
import type { ServingContext } from "./serving-context.js";

/** What one request fixed before the engine ran: the message's identity and how to read the reply. */
export interface MessageTurn {
  ctx: ServingContext;
  id: string;
  model: string;
  req: MessagesRequest;
  chat: ChatRequest;
  params: Partial<SamplingParams>;
  promptLen: number;
  /** How the reasoning parser reads the reply (null: no parser). */
  thinking: ThinkingMode | null;
}

/** An Anthropic content block of a reply. */
export type ContentBlock =
  | { type: "text"; text: string }
  | { type: "thinking"; thinking: string; signature: string }
  | { type: "tool_use"; id: string; name: string; input: Json };

const hex = (): string => randomBytes(12).toString("hex");
/** Anthropic's tool_use ids (toolu_...). */
export const toolUseId = (): string => `toolu_${hex()}`;
/**
 * A thinking block's signature. Anthropic signs its thinking so that it can be handed back; Kiln, as vLLM, gives an
 * opaque random value (a client echoes it back, and the prompt leaves thinking blocks out).
 */
export const thinkingSignature = (): string => hex();

/**
 * The reply's stop_reason and stop_sequence: max_tokens when cut by it, tool_use when it ended with calls,
 * stop_sequence (naming it) when one of the request's stop_sequences stopped it, else end_turn.
 */
export function stopReasonOf(turn: MessageTurn, finish: FinishReason, stopReason: string | number | null, toolUse: boolean) {
  if (finish === "length") return { stop_reason: "max_tokens", stop_sequence: null };
  if (toolUse) return { stop_reason: "tool_use", stop_sequence: null };
  if (typeof stopReason === "string" && turn.req.stopSequences.includes(stopReason)) return { stop_reason: "stop_sequence", stop_sequence: stopReason };
  return { stop_reason: "end_turn", stop_sequence: null };
}

/** The message object (stop and usage as they stand: a stream's message_start carries it empty). */
export function messageObject(turn: MessageTurn, content: ContentBlock[], stop: { stop_reason: string | null; stop_sequence: string | null }, outputTokens: number): Json {
  return {
    id: turn.id,
    type: "message",
    role: "assistant",
    model: turn.model,
    content,
    ...stop,
    usage: { input_tokens: turn.promptLen, output_tokens: outputTokens },
  };
}
