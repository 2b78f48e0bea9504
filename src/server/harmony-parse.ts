// gpt-oss replies read by Harmony channel, token by token, as vLLM reads them with openai-harmony's StreamableParser:
// the reply continues the prompt's `<|start|>assistant`, so it opens with the first message's header; each message
// is `{header}<|message|>{text}` ended by <|end|>, <|return|> or <|call|>, and later ones start with <|start|>.
// A header names the channel (`<|channel|>analysis`), a recipient (`to=functions.get_weather`) and a content type
// (`json` or `<|constrain|>json`). What the chat API makes of the messages (vLLM's parse_chat_output, its `openai`
// tool-call parser and its streamed deltas):
//   - analysis -> reasoning; final and recipient-less commentary (preambles) -> content; several messages of a kind
//     are joined with "\n";
//   - a message to `functions.NAME` -> a tool call of NAME, its text the arguments (JSON text re-serialized as
//     Python's json.dumps writes it when the content type is json or absent);
//   - messages from other authors, and tokens outside any message, are not shown.
// Text is decoded from the token ids (the engine's detokenized text drops the special tokens the headers are made of).
import type { TokenizerLike } from "../models/tokenizer-types.js";
import { PyJsonError, pyJsonDecode, pyJsonDumpsAscii } from "./python-json.js";

/** The special tokens Harmony is written with, by id. */
export interface HarmonyTokens {
  start: number;
  message: number;
  end: number;
  return: number;
  call: number;
  channel: number;
  constrain: number;
}

const SPECIALS = { start: "<|start|>", message: "<|message|>", end: "<|end|>", return: "<|return|>", call: "<|call|>", channel: "<|channel|>", constrain: "<|constrain|>" };

/** The tokenizer's ids of Harmony's special tokens; throws naming the first it spells with more than one token. */
export function harmonyTokens(tokenizer: TokenizerLike): HarmonyTokens {
  const out: Partial<HarmonyTokens> = {};
  for (const [key, text] of Object.entries(SPECIALS) as [keyof HarmonyTokens, string][]) {
    const ids = tokenizer.encode(text, { addSpecialTokens: false });
    if (ids.length !== 1) throw new Error(`the tokenizer has no single token ${text}: it is not a Harmony (gpt-oss, o200k_harmony) tokenizer`);
    out[key] = ids[0]!;
  }
  return out as HarmonyTokens;
}

/** A message of the reply, whole or (the last) still being written. */
export interface ParsedMessage {
  /** assistant, or another role / a tool's name when the model wrote one after <|start|>. */
  author: string;
  recipient: string | null;
  channel: string | null;
  contentType: string | null;
  text: string;
}

/**
 * What one token did: opened a message (its header read: `opened`, no text), or added text to one ("" while a
 * character's bytes are pending).
 */
export interface TokenDelta {
  message: ParsedMessage;
  /** The message's place among the reply's messages (0 for the first). */
  index: number;
  text: string;
  opened: boolean;
}

/** Reads a reply's tokens into messages (see the file comment); push() each token, in order. */
export class HarmonyParser {
  /** The messages ended so far. */
  readonly messages: ParsedMessage[] = [];
  /** The message being written (its header read), or null. */
  current: ParsedMessage | null = null;
  private state: "header" | "content" | "between" = "header";
  private header: number[] = [];
  private role: string | null = "assistant"; // the prompt's <|start|>assistant names the first message's author
  private pending: number[] = []; // content tokens whose text is not yet whole characters
  private readonly stops: Set<number>;

  constructor(
    private readonly tokenizer: TokenizerLike,
    private readonly t: HarmonyTokens,
  ) {
    this.stops = new Set([t.end, t.return, t.call]);
  }

  /** Feeds one token; returns the text it added to a message's content, or null when it added none. */
  push(id: number): TokenDelta | null {
    switch (this.state) {
      case "between":
        // a new message, or a stray token (openai-harmony fails the reply; here it is not shown)
        if (id === this.t.start) {
          this.state = "header";
          this.role = null;
          this.header = [];
        }
        return null;
      case "header":
        if (id === this.t.message) {
          this.current = { ...this.readHeader(), text: "" };
          this.state = "content";
          return { message: this.current, index: this.messages.length, text: "", opened: true };
        } else if (this.stops.has(id)) this.state = "between"; // a header that never opened its text: dropped
        else this.header.push(id);
        return null;
      case "content": {
        const m = this.current!;
        if (this.stops.has(id)) {
          m.text += this.flush();
          this.messages.push(m);
          this.current = null;
          this.state = "between";
          return null;
        }
        this.pending.push(id);
        const text = this.tokenizer.decode(this.pending, { skipSpecialTokens: false });
        if (text.endsWith("\uFFFD")) return { message: m, index: this.messages.length, text: "", opened: false }; // a character's bytes continue
        this.pending = [];
        m.text += text;
        return { message: m, index: this.messages.length, text, opened: false };
      }
    }
  }

  /** The reply ended: the text of any pending bytes goes to the unfinished message (the last, if any). */
  finish(): TokenDelta | null {
    const m = this.current;
    if (m === null || this.pending.length === 0) return null;
    const text = this.flush();
    m.text += text;
    return { message: m, index: this.messages.length, text, opened: false };
  }

  /** Every message: those ended and the one being written. */
  all(): ParsedMessage[] {
    return this.current === null ? [...this.messages] : [...this.messages, this.current];
  }

  private flush(): string {
    const text = this.pending.length === 0 ? "" : this.tokenizer.decode(this.pending, { skipSpecialTokens: false });
    this.pending = [];
    return text;
  }

  /** openai-harmony's header reading: the channel after <|channel|>, then `[role] [to=recipient] [content type]`. */
  private readHeader(): Omit<ParsedMessage, "text"> {
    let h = this.tokenizer.decode(this.header, { skipSpecialTokens: false });
    let channel: string | null = null;
    const at = h.indexOf(SPECIALS.channel);
    if (at >= 0) {
      const after = h.slice(at + SPECIALS.channel.length);
      const len = after.search(/[\s<]/);
      const value = len < 0 ? after : after.slice(0, len);
      if (value !== "") channel = value;
      h = h.slice(0, at) + after.slice(value.length);
    }
    h = h.trim().replaceAll(SPECIALS.constrain, ` ${SPECIALS.constrain}`).trim();
    const parts = h.split(/\s+/).filter((p) => p !== "");
    // after <|start|> the header names its author: a role, or a tool's name (functions.x) standing in for the tool role
    let author = this.role;
    if (author === null) author = parts.shift() ?? "";
    else if (parts[0] === author) parts.shift();
    let recipient: string | null = null;
    let contentType: string | null = null;
    const last = parts.pop();
    if (last !== undefined) {
      if (last.startsWith("to=")) recipient = last.slice(3);
      else if (parts.length === 0) recipient = last;
      else {
        contentType = last;
        const r = parts.pop()!;
        recipient = r.startsWith("to=") ? r.slice(3) : r;
      }
    }
    return { author, recipient, channel, contentType };
  }
}

/** A tool call read from a reply: the function's name and its arguments' text. */
export interface HarmonyCall {
  name: string;
  arguments: string;
}

/** A reply as the chat API shows it. */
export interface HarmonyReply {
  reasoning: string | null;
  content: string | null;
  /** The calls of the ended messages to functions (a call cut short is not one). */
  calls: HarmonyCall[];
}

const FUNCTIONS = "functions.";

/** Whether a message is a call to a function tool. */
export const isFunctionCall = (m: ParsedMessage): boolean => m.author === "assistant" && m.recipient !== null && m.recipient.startsWith(FUNCTIONS);

/** A message's place in the reply: reasoning, content, a function call, or nothing shown. */
export function messageKind(m: ParsedMessage): "reasoning" | "content" | "call" | null {
  if (m.author !== "assistant") return null;
  if (isFunctionCall(m)) return "call";
  if (m.channel === "analysis") return "reasoning";
  if (m.channel === "final" || (m.channel === "commentary" && m.recipient === null)) return "content";
  return null;
}

/** The function a call message addresses (`functions.NAME`: NAME). */
export const callName = (m: ParsedMessage): string => m.recipient!.slice(FUNCTIONS.length);

/**
 * A call's arguments as vLLM's openai tool-call parser returns them: JSON (content type json, or none) as Python's
 * json.dumps(json.loads(text)) writes it; other text, or JSON that does not parse, as written.
 */
export function callArguments(m: ParsedMessage): string {
  if (m.contentType !== null && !m.contentType.includes("json")) return m.text;
  try {
    const { value, end } = pyJsonDecode(m.text, m.text.search(/\S|$/));
    if (m.text.slice(end).trim() !== "") return m.text;
    return pyJsonDumpsAscii(value);
  } catch (e) {
    if (e instanceof PyJsonError) return m.text;
    throw e;
  }
}

/** The whole reply (see the file comment); the message cut short by the end of the reply counts as far as it got. */
export function readHarmonyReply(parser: HarmonyParser): HarmonyReply {
  const reasoning: string[] = [];
  const content: string[] = [];
  const calls: HarmonyCall[] = [];
  for (const m of parser.messages) {
    const kind = messageKind(m);
    if (kind === "reasoning") reasoning.push(m.text);
    else if (kind === "content") content.push(m.text);
    else if (kind === "call") calls.push({ name: callName(m), arguments: callArguments(m) });
  }
  const cur = parser.current;
  if (cur !== null && cur.text !== "") {
    const kind = messageKind(cur);
    if (kind === "reasoning") reasoning.push(cur.text);
    else if (kind === "content") content.push(cur.text);
  }
  return { reasoning: reasoning.join("\n") || null, content: content.join("\n") || null, calls };
}

/** Parses a whole reply's token ids. */
export function parseHarmonyReply(tokenizer: TokenizerLike, t: HarmonyTokens, ids: readonly number[]): HarmonyReply {
  const p = new HarmonyParser(tokenizer, t);
  for (const id of ids) p.push(id);
  p.finish();
  return readHarmonyReply(p);
}
