// A streamed Responses API reply: OpenAI's typed server-sent events, each named by an `event:` line and numbered by
// sequence_number from 0, with no closing [DONE]. In order: response.created, response.in_progress, then for each
// output item response.output_item.added, its parts (content_part.added, *.delta ..., *.done, content_part.done for
// reasoning and message text; function_call_arguments.delta ..., .done for a call) and response.output_item.done;
// last response.completed, or response.incomplete when max_output_tokens cut the reply (response.failed when the
// engine aborted it). The items are those a whole reply gives (responses-output.ts): the reasoning parser and the
// chat API's tool-call reader split the text as it comes.
import type { FastifyReply } from "fastify";
import type { FinishReason, RequestOutput } from "../engine/types.js";
import { toApiError } from "./errors.js";
import type { Json } from "./fields.js";
import { ReasoningStream } from "./reasoning-parsers.js";
import {
  functionCallItem,
  messageItem,
  newItemIds,
  reasoningItem,
  responseObject,
  statusOf,
  usageOf,
  type Turn,
} from "./responses-output.js";
import { chatLogprobs, ToolCallStream, type ChatLogprob } from "./serving-chat.js";
import { callName, HarmonyParser, messageKind, type TokenDelta } from "./harmony-parse.js";
import { endReply } from "./serving-chat-harmony.js";
import { SseWriter } from "./serving-context.js";

const FINAL_EVENT = { completed: "response.completed", incomplete: "response.incomplete", failed: "response.failed" } as const;

/** An output item being streamed: its kind, id, place in the output, and text (a call's arguments) so far. */
interface OpenItem {
  kind: "reasoning" | "message" | "call";
  id: string;
  index: number;
  text: string;
  call?: { callId: string; name: string };
}

/** Writes the events of one response, and keeps the items it closed for the final response object. */
class ResponseEvents {
  private seq = 0;
  private open: OpenItem | null = null;
  readonly items: Json[] = [];
  /** With logprobs asked for: those not yet on a text delta, and every one so far (the message's output_text holds all). */
  private pending: ChatLogprob[] = [];
  private all: ChatLogprob[] = [];

  constructor(
    private readonly sse: SseWriter,
    private readonly logprobs: boolean,
  ) {}

  /** A chunk's logprobs: they ride on the next text delta (a chunk read as reasoning or a call has none of its own). */
  addLogprobs(lps: ChatLogprob[]): void {
    this.pending.push(...lps);
    this.all.push(...lps);
  }

  emit(type: string, fields: Json): Promise<void> {
    return this.sse.send({ type, sequence_number: this.seq++, ...fields }, type);
  }

  async reasoning(delta: string): Promise<void> {
    if (delta === "") return;
    const item = await this.textItem("reasoning");
    item.text += delta;
    await this.emit("response.reasoning_text.delta", { item_id: item.id, output_index: item.index, content_index: 0, delta });
  }

  async text(delta: string): Promise<void> {
    if (delta === "") return;
    const item = await this.textItem("message");
    item.text += delta;
    const logprobs = this.pending;
    this.pending = [];
    await this.emit("response.output_text.delta", { item_id: item.id, output_index: item.index, content_index: 0, delta, logprobs });
  }

  /** Opens a function_call item (closing the item before it), with the first of its arguments. */
  async call(name: string, args: string): Promise<void> {
    await this.close("completed");
    const item: OpenItem = {
      kind: "call",
      id: newItemIds.call(),
      index: this.items.length,
      text: "",
      call: { callId: newItemIds.callId(), name },
    };
    this.open = item;
    await this.emit("response.output_item.added", {
      output_index: item.index,
      item: functionCallItem(item.id, item.call!.callId, name, "", "in_progress"),
    });
    await this.callArguments(args);
  }

  async callArguments(delta: string): Promise<void> {
    const item = this.open;
    if (delta === "" || item?.kind !== "call") return;
    item.text += delta;
    await this.emit("response.function_call_arguments.delta", { item_id: item.id, output_index: item.index, delta });
  }

  /** The open reasoning or message item, opened (and the one before it closed) when another kind is open. */
  private async textItem(kind: "reasoning" | "message"): Promise<OpenItem> {
    if (this.open?.kind === kind) return this.open;
    await this.close("completed");
    const item: OpenItem = {
      kind,
      id: kind === "message" ? newItemIds.message() : newItemIds.reasoning(),
      index: this.items.length,
      text: "",
    };
    this.open = item;
    const shell =
      kind === "message"
        ? { ...messageItem(item.id, "", "in_progress"), content: [] }
        : { ...reasoningItem(item.id, "", "in_progress"), content: [] };
    await this.emit("response.output_item.added", { output_index: item.index, item: shell });
    await this.emit("response.content_part.added", {
      item_id: item.id,
      output_index: item.index,
      content_index: 0,
      part: textPart(kind, ""),
    });
    return item;
  }

  /** Closes the open item with its done events (`status`: the item's own), and keeps it. */
  async close(status: "completed" | "incomplete"): Promise<void> {
    const item = this.open;
    if (item === null) return;
    this.open = null;
    const at = { item_id: item.id, output_index: item.index };
    let done: Json;
    if (item.kind === "call") {
      await this.emit("response.function_call_arguments.done", { ...at, arguments: item.text });
      done = functionCallItem(item.id, item.call!.callId, item.call!.name, item.text, status);
    } else {
      const message = item.kind === "message";
      await this.emit(message ? "response.output_text.done" : "response.reasoning_text.done", {
        ...at,
        content_index: 0,
        text: item.text,
        ...(message ? { logprobs: this.logprobs ? this.all : [] } : {}),
      });
      const itemLogprobs = message && this.logprobs ? this.all : null;
      await this.emit("response.content_part.done", { ...at, content_index: 0, part: textPart(item.kind, item.text, itemLogprobs) });
      done = message ? messageItem(item.id, item.text, status, itemLogprobs) : reasoningItem(item.id, item.text, status);
    }
    this.items.push(done);
    await this.emit("response.output_item.done", { output_index: item.index, item: done });
  }
}

const textPart = (kind: "reasoning" | "message", text: string, logprobs: ChatLogprob[] | null = null): Json =>
  kind === "message" ? { type: "output_text", text, annotations: [], ...(logprobs === null ? {} : { logprobs }) } : { type: "reasoning_text", text };

/**
 * A gpt-oss reply's events: one item per Harmony message (as harmonyOutputItems gives them), opened when its text
 * begins (a function call when its header is read) and closed when the next message opens.
 */
class HarmonyItems {
  private readonly parser: HarmonyParser;
  private calls = 0;
  private inCall = false; // the open message is a call being streamed as an item

  constructor(
    private readonly turn: Turn,
    private readonly events: ResponseEvents,
  ) {
    this.parser = new HarmonyParser(turn.ctx.tokenizer, turn.ctx.harmony!.tokens);
  }

  async push(ids: readonly number[], finish: FinishReason, stopReason: string | number | null): Promise<void> {
    for (const id of ids) await this.event(this.parser.push(id));
    if (finish !== null) await this.event(endReply(this.parser, this.turn.ctx.harmony!, finish, stopReason));
  }

  private async event(d: TokenDelta | null): Promise<void> {
    if (d === null) return;
    const kind = messageKind(d.message);
    if (d.opened) {
      await this.events.close("completed"); // each message its own item
      const chat = this.turn.chat;
      this.inCall = kind === "call" && chat.toolChoice.kind !== "none" && (chat.parallelToolCalls || this.calls === 0);
      if (this.inCall) {
        this.calls++;
        await this.events.call(callName(d.message), "");
      }
      return;
    }
    if (kind === "reasoning") await this.events.reasoning(d.text);
    else if (kind === "content") await this.events.text(d.text);
    else if (this.inCall) await this.events.callArguments(d.text);
  }
}

/** A chat tool_calls delta entry: a new call carries its id and name, later ones arguments only. */
interface CallDelta {
  id?: string;
  function: { name?: string; arguments: string };
}

/**
 * Streams the reply's events and returns the final response object, or null when the client left or the stream
 * failed (an `error` event then ends it, as OpenAI sends one).
 */
export async function streamResponse(turn: Turn, reply: FastifyReply, outputs: AsyncIterable<RequestOutput>): Promise<Json | null> {
  const sse = new SseWriter(reply);
  const top = turn.chat.topLogprobs;
  const events = new ResponseEvents(sse, top !== null);
  const tokenIds: number[] = [];
  let cached = 0;
  let finish: FinishReason | "abort" = null;
  try {
    const shell = responseObject(turn, "in_progress", [], null);
    await events.emit("response.created", { response: shell });
    await events.emit("response.in_progress", { response: shell });
    const reasoner = turn.thinking === null ? null : new ReasoningStream(turn.thinking);
    const tools = new ToolCallStream(turn.ctx, turn.chat, 1);
    const harmony = turn.ctx.harmony === null ? null : new HarmonyItems(turn, events);
    for await (const out of outputs) {
      if (sse.closed) break;
      cached = out.numCachedTokens;
      const o = out.outputs[0];
      if (o === undefined || finish !== null) continue; // a finished sample may be listed again, empty
      tokenIds.push(...o.tokenIds);
      if (top !== null) events.addLogprobs(chatLogprobs(turn.ctx, o, top, false));
      finish = o.finishReason;
      const final = finish !== null;
      if (harmony !== null) {
        await harmony.push(o.tokenIds, o.finishReason, o.stopReason);
        continue;
      }
      const split = reasoner?.push(o.text, final) ?? { reasoning: "", content: o.text };
      await events.reasoning(split.reasoning);
      if (split.content === "" && !final) continue; // nothing yet for the tool-call reader (a named call opens on its first text)
      const { delta } = tools.delta(0, split.content, o.finishReason);
      if (typeof delta.content === "string") await events.text(delta.content);
      for (const c of (delta.tool_calls ?? []) as CallDelta[]) {
        if (c.id !== undefined) await events.call(c.function.name!, c.function.arguments);
        else await events.callArguments(c.function.arguments);
      }
    }
    if (sse.closed) return null; // the client left: the engine request is aborted by the caller
    const status = statusOf(finish ?? "abort");
    await events.close(status === "incomplete" ? "incomplete" : "completed");
    const response = responseObject(turn, status, events.items, usageOf(turn, tokenIds, cached));
    await events.emit(FINAL_EVENT[status], { response });
    sse.close();
    return response;
  } catch (err) {
    const e = toApiError(err);
    await events.emit("error", { code: e.code, message: e.message, param: e.param });
    sse.close();
    return null;
  }
}
