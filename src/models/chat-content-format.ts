// How a chat template sees a message's content (vLLM's --chat-template-content-format): "string" renders it as text,
// "openai" as a list of OpenAI content parts ([{type: "text", text}]) for templates that loop over them, and "auto"
// picks "openai" for a template with such a loop, else "string" (vLLM's _detect_content_format, over the source).
// Also an earlier turn's tool call as templates read it, and the wrapper that gives a tokenizer's every chat render a
// server's defaults (--default-chat-template-kwargs).
import type { ChatMessage, ChatTemplateOptions, TokenizerLike } from "./tokenizer-types.js";

export const CHAT_CONTENT_FORMATS = ["auto", "string", "openai"] as const;
export type ChatContentFormat = (typeof CHAT_CONTENT_FORMATS)[number];

/** `{% for part in message['content'] %}` or `message.content`, filters allowed: the template walks content parts. */
const CONTENT_LOOP = /\{%-?\s*for\s+\w+\s+in\s+\w+\s*(?:\[\s*(['"])content\1\s*\]|\.content)\s*(?:\|[^%]*)?-?%\}/;

/** "openai" for a template that loops over a message's content, else "string". */
export function detectContentFormat(template: string): "string" | "openai" {
  return CONTENT_LOOP.test(template) ? "openai" : "string";
}

/**
 * A template's messages: content as text ("string": null is "", the join of no text parts, as vLLM, so that a
 * template's `+` takes an assistant tool-call turn), or as OpenAI content parts ("openai": the message's own parts,
 * images as {type: "image"}, else one text part; null is no parts, as vLLM; a tool message's text stays a string, as
 * vLLM normalizes it). An empty tool_calls list is dropped, as vLLM's _postprocess_messages drops it, so that a
 * template testing `'tool_calls' in message` (Llama 3.1's) takes a reply without calls (`"tool_calls": []`, as chat
 * replies carry it) as a plain turn.
 */
export function messagesForTemplate(messages: ChatMessage[], format: "string" | "openai"): unknown[] {
  return messages.map(({ contentParts, tool_calls, ...rest }) => {
    const m = tool_calls === undefined || tool_calls.length === 0 ? rest : { ...rest, tool_calls };
    if (format === "string") return m.content === null ? { ...m, content: "" } : m;
    // a tool result of text alone stays text, as vLLM gives it (templates print a tool message's content whole)
    if (m.role === "tool" && (contentParts ?? []).every((p) => p.type === "text")) return { ...m, content: m.content ?? "" };
    return { ...m, content: contentParts ?? (m.content === null ? [] : [{ type: "text", text: m.content }]) };
  });
}

/**
 * An earlier turn's tool call as chat templates read it: its arguments as an object, parsed from the wire's JSON
 * text (empty: {}), as vLLM's _postprocess_messages does, so that `arguments | tojson` is not encoded twice.
 */
export function templateToolCall(call: unknown): unknown {
  const fn = (call as Record<string, unknown> | null)?.function as Record<string, unknown> | null | undefined;
  if (typeof fn !== "object" || fn === null || typeof fn.arguments !== "string") return call;
  let args: unknown = {};
  if (fn.arguments.trim() !== "") {
    try {
      args = JSON.parse(fn.arguments);
    } catch {
      return call; // not JSON: the template gets the text
    }
  }
  return { ...(call as Record<string, unknown>), function: { ...fn, arguments: args } };
}

/** What a server gives every chat render unless the request says otherwise. */
export interface ChatTemplateDefaults {
  contentFormat: ChatContentFormat;
  /** vLLM's --default-chat-template-kwargs: under each request's chat_template_kwargs (the request's keys win). */
  kwargs: Record<string, unknown> | null;
}

/**
 * `tokenizer` whose applyChatTemplate renders with `defaults` under each call's own options; everything else is the
 * tokenizer's (its methods bound to it, so its caches stay its own).
 * @example server.bind({ tokenizer: withChatTemplateDefaults(tok, { contentFormat: "auto", kwargs: { enable_thinking: false } }) })
 */
export function withChatTemplateDefaults<T extends TokenizerLike>(tokenizer: T, defaults: ChatTemplateDefaults): T {
  const apply = (messages: ChatMessage[], options: ChatTemplateOptions = {}): string => {
    const kwargs = defaults.kwargs === null ? options.chatTemplateKwargs : { ...defaults.kwargs, ...options.chatTemplateKwargs };
    return tokenizer.applyChatTemplate(messages, { contentFormat: defaults.contentFormat, ...options, ...(kwargs ? { chatTemplateKwargs: kwargs } : {}) });
  };
  return new Proxy(tokenizer, {
    get(target, prop) {
      if (prop === "applyChatTemplate") return apply;
      const value: unknown = Reflect.get(target, prop, target);
      return typeof value === "function" ? (value as (...a: unknown[]) => unknown).bind(target) : value;
    },
  });
}
