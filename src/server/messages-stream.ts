// A streamed Messages API reply: Anthropic's server-sent events, each named by an `event:` line, in order:
// message_start (the message, empty), then per content block content_block_start, content_block_delta ... (text_delta,
// thinking_delta then a signature_delta, input_json_delta for a tool_use block's input) and content_block_stop;
// last message_delta (stop_reason, stop_sequence, usage) and message_stop. An engine failure mid-stream ends it with
// an `error` event. No ping events are sent (vLLM sends none). The blocks are the chat stream's deltas, read as the
// chat path reads them: the reasoning parser splits thinking from text, the tool-call reader finds the calls
// (a named tool's call streams its arguments as written; "any" and parsed "auto" calls come whole at the end).
import type { FastifyReply } from "fastify";
import type { FinishReason, RequestOutput } from "../engine/types.js";
import { anthropicError } from "./anthropic-protocol.js";
import { ReasoningStream } from "./reasoning-parsers.js";
import { ToolCallStream } from "./serving-chat.js";
import { HarmonyChatStream } from "./serving-chat-harmony.js";
import { SseWriter } from "./serving-context.js";
import { messageObject, stopReasonOf, thinkingSignature, toolUseId, type MessageTurn } from "./messages-output.js";

/** A chat stream delta's tool_calls entry: a new call carries its id and name, later ones arguments only. */
interface CallDelta {
  id?: string;
  function: { name?: string; arguments: string };
}

/** Writes one message's content block events. */
class BlockEvents {
  private open: { type: "text" | "thinking" | "tool_use"; index: number } | null = null;
  private count = 0;
  /** Whether any tool_use block was opened (the reply then ends with stop_reason tool_use). */
  toolUse = false;

  constructor(private readonly sse: SseWriter) {}

  emit(type: string, fields: Record<string, unknown> = {}): Promise<void> {
    return this.sse.send({ type, ...fields }, type);
  }

  async text(text: string): Promise<void> {
    if (text === "") return;
    const index = await this.ensure("text", { type: "text", text: "" });
    await this.emit("content_block_delta", { index, delta: { type: "text_delta", text } });
  }

  async thinking(thinking: string): Promise<void> {
    if (thinking === "") return;
    const index = await this.ensure("thinking", { type: "thinking", thinking: "", signature: "" });
    await this.emit("content_block_delta", { index, delta: { type: "thinking_delta", thinking } });
  }

  /** Opens a tool_use block (closing the block before it), with the first of its input's JSON. */
  async toolCall(name: string, json: string): Promise<void> {
    await this.close();
    this.toolUse = true;
    await this.start("tool_use", { type: "tool_use", id: toolUseId(), name, input: {} });
    await this.inputJson(json);
  }

  async inputJson(partial: string): Promise<void> {
    if (partial === "" || this.open?.type !== "tool_use") return;
    await this.emit("content_block_delta", { index: this.open.index, delta: { type: "input_json_delta", partial_json: partial } });
  }

  /** The open block of `type`'s index, opened (and the one before it closed) when another is open. */
  private async ensure(type: "text" | "thinking", shell: Record<string, unknown>): Promise<number> {
    if (this.open?.type === type) return this.open.index;
    await this.close();
    return this.start(type, shell);
  }

  private async start(type: "text" | "thinking" | "tool_use", shell: Record<string, unknown>): Promise<number> {
    const index = this.count++;
    this.open = { type, index };
    await this.emit("content_block_start", { index, content_block: shell });
    return index;
  }

  /** Closes the open block; a thinking block gets its signature first, as Anthropic sends it. */
  async close(): Promise<void> {
    const open = this.open;
    if (open === null) return;
    this.open = null;
    if (open.type === "thinking")
      await this.emit("content_block_delta", { index: open.index, delta: { type: "signature_delta", signature: thinkingSignature() } });
    await this.emit("content_block_stop", { index: open.index });
  }
}

/** Streams the reply's events; a failure after the first event becomes an `error` event. */
export async function streamMessage(turn: MessageTurn, reply: FastifyReply, outputs: AsyncIterable<RequestOutput>): Promise<void> {
  const { ctx, chat } = turn;
  const sse = new SseWriter(reply);
  const blocks = new BlockEvents(sse);
  let outputTokens = 0;
  let finish: FinishReason = null;
  let stopReason: string | number | null = null;
  try {
    await blocks.emit("message_start", { message: messageObject(turn, [], { stop_reason: null, stop_sequence: null }, 0) });
    const reasoner = turn.thinking === null ? null : new ReasoningStream(turn.thinking);
    const tools = new ToolCallStream(ctx, chat, 1);
    const harmony = ctx.harmony === null ? null : new HarmonyChatStream(ctx, chat, 1);
    for await (const out of outputs) {
      if (sse.closed) break;
      const o = out.outputs[0];
      if (o === undefined || finish !== null) continue; // a finished sample may be listed again, empty
      outputTokens += o.tokenIds.length;
      finish = o.finishReason;
      stopReason = o.stopReason;
      let delta: Record<string, unknown>;
      if (harmony !== null) ({ delta } = harmony.delta(0, o.tokenIds, o.finishReason, o.stopReason));
      else {
        const split = reasoner?.push(o.text, finish !== null) ?? { reasoning: "", content: o.text };
        if (chat.includeReasoning) await blocks.thinking(split.reasoning);
        if (split.content === "" && finish === null) continue; // nothing yet for the tool-call reader (a named call opens on its first text)
        ({ delta } = tools.delta(0, split.content, o.finishReason));
      }
      if (typeof delta.reasoning === "string") await blocks.thinking(delta.reasoning);
      if (typeof delta.content === "string") await blocks.text(delta.content);
      for (const c of (delta.tool_calls ?? []) as CallDelta[]) {
        if (c.id !== undefined) await blocks.toolCall(c.function.name!, c.function.arguments);
        else await blocks.inputJson(c.function.arguments);
      }
    }
    if (sse.closed) return; // the client left: the caller aborts the engine request
    if (finish === null || finish === "abort") throw new Error("The request was aborted before its reply was complete");
    await blocks.close();
    const stop = stopReasonOf(turn, finish, stopReason, blocks.toolUse);
    await blocks.emit("message_delta", { delta: stop, usage: { input_tokens: turn.promptLen, output_tokens: outputTokens } });
    await blocks.emit("message_stop");
  } catch (err) {
    await blocks.emit("error", { error: anthropicError(err).body.error });
  }
  sse.close();
}
