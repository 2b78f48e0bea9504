// The prompt a worker will compute for a request, as token ids, and its chain block hashes: what the precise prefix
// policy matches against the workers' KV-cache events. Chat requests go through the model's chat template as the
// server renders them (serving-chat.ts: text parts joined by newlines, the generation prompt added unless the request
// says not to, no special tokens added on encoding); a completion's prompt is encoded as the server encodes it (a
// string with special tokens unless add_special_tokens is false; token ids as they are). Other requests: none, and
// none for a chat with images (the engine keys an image's blocks by the hash of its processed pixels, which the router
// does not compute): those route by load.
import { chainBlockHashes } from "../engine/kv-cache-manager.js";
import { Tokenizer } from "../models/tokenizer.js";
import type { ChatMessage, TokenizerLike } from "../models/tokenizer-types.js";

type Json = unknown;
const isRecord = (v: Json): v is Record<string, Json> => typeof v === "object" && v !== null && !Array.isArray(v);

/** A message's content as the server reads it: a string, null, or text parts joined by newlines; undefined otherwise. */
function contentOf(content: Json): string | null | undefined {
  if (content === null || content === undefined || typeof content === "string") return content ?? null;
  if (!Array.isArray(content)) return undefined;
  const texts: string[] = [];
  for (const p of content) {
    if (!isRecord(p) || p.type !== "text" || typeof p.text !== "string") return undefined;
    texts.push(p.text);
  }
  return texts.join("\n");
}

export class RequestTokenizer {
  /** `chatTemplate`: the workers' --chat-template text, when they were given one (else the tokenizer's). */
  constructor(
    readonly tokenizer: TokenizerLike,
    readonly chatTemplate: string | null = null,
  ) {}

  /** The tokenizer of a model directory (its tokenizer.json and chat template), as `kiln serve` loads it. */
  static fromDir(dir: string, chatTemplate: string | null = null): RequestTokenizer {
    return new RequestTokenizer(Tokenizer.fromDir(dir), chatTemplate);
  }

  /** The prompt's token ids for a parsed body on `route`, or null when the router cannot tell them. */
  promptTokenIds(route: string, body: Json): number[] | null {
    if (!isRecord(body)) return null;
    if (route === "/v1/chat/completions") return this.chatTokenIds(body);
    if (route === "/v1/completions") {
      const p = body.prompt;
      if (typeof p === "string") return this.tokenizer.encode(p, { addSpecialTokens: body.add_special_tokens !== false });
      if (Array.isArray(p) && p.length > 0 && p.every((x) => Number.isInteger(x))) return p as number[];
      if (Array.isArray(p) && p.length === 1) return this.promptTokenIds(route, { ...body, prompt: p[0] });
    }
    return null;
  }

  private chatTokenIds(body: Record<string, Json>): number[] | null {
    if (!Array.isArray(body.messages)) return null;
    const messages: ChatMessage[] = [];
    for (const m of body.messages) {
      if (!isRecord(m) || typeof m.role !== "string") return null;
      const content = contentOf(m.content);
      if (content === undefined) return null; // images and the like: not a prompt the router can render
      const msg: ChatMessage = { role: m.role, content };
      if (typeof m.name === "string") msg.name = m.name;
      if (Array.isArray(m.tool_calls)) msg.tool_calls = m.tool_calls;
      if (typeof m.tool_call_id === "string") msg.tool_call_id = m.tool_call_id;
      messages.push(msg);
    }
    try {
      const text = this.tokenizer.applyChatTemplate(messages, {
        addGenerationPrompt: body.add_generation_prompt !== false,
        continueFinalMessage: body.continue_final_message === true,
        ...(typeof body.chat_template === "string" ? { chatTemplate: body.chat_template } : this.chatTemplate !== null ? { chatTemplate: this.chatTemplate } : {}),
        ...(Array.isArray(body.tools) ? { tools: body.tools } : {}),
        ...(isRecord(body.chat_template_kwargs) ? { chatTemplateKwargs: body.chat_template_kwargs } : {}),
      });
      return this.tokenizer.encode(text, { addSpecialTokens: false });
    } catch {
      return null; // the worker will answer 400: any worker will do
    }
  }

  /**
   * A lazy `blockSize -> chain hashes` of the request's prompt: tokenized on the first call, hashed once per block
   * size asked; [] when the prompt is not known. The cache salt enters the first block as the engine's does.
   */
  blockHashes(route: string, body: Json): (blockSize: number) => readonly string[] {
    let ids: number[] | null | undefined;
    const salt = isRecord(body) && typeof body.cache_salt === "string" ? body.cache_salt : null;
    const memo = new Map<number, string[]>();
    return (blockSize) => {
      ids ??= this.promptTokenIds(route, body);
      if (ids === null) return [];
      let h = memo.get(blockSize);
      if (h === undefined) memo.set(blockSize, (h = chainBlockHashes(ids, blockSize, { lora: null, cacheSalt: salt })));
      return h;
    };
  }
}
