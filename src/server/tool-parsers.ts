// Tool-call parsers for tool_choice "auto" (vLLM's --tool-call-parser): they find the tool calls a model wrote in
// its reply text. Kiln implements vLLM's "hermes" format (Hermes 2 Pro, Qwen 2.5 / Qwen 3 and other ChatML
// models): each call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, after optional text.

/** vLLM's --tool-call-parser names that Kiln implements. */
export const TOOL_CALL_PARSERS = ["hermes"] as const;
export type ToolCallParserName = (typeof TOOL_CALL_PARSERS)[number];

/** Calls found in a reply: the text before them (null when none) and each call's name and arguments (JSON text). */
export interface ExtractedToolCalls {
  content: string | null;
  calls: { name: string; arguments: string }[];
}

export interface ToolCallParser {
  /** The text that opens a call: a streamed reply's text is held back from where it (or a prefix of it) starts. */
  readonly start: string;
  /** The calls in a whole reply, or null when it holds none (or a call that does not parse): it is text then. */
  extract(text: string): ExtractedToolCalls | null;
}

const START = "<tool_call>";
const END = "</tool_call>";

/** vLLM's Hermes2ProToolParser reading: each <tool_call> block (the last may be unclosed) is one JSON call. */
const hermes: ToolCallParser = {
  start: START,
  extract(text: string): ExtractedToolCalls | null {
    const first = text.indexOf(START);
    if (first < 0) return null;
    const calls: { name: string; arguments: string }[] = [];
    let at = first;
    while (at >= 0) {
      const bodyStart = at + START.length;
      const end = text.indexOf(END, bodyStart);
      const body = text.slice(bodyStart, end < 0 ? undefined : end).trim();
      let call: unknown;
      try {
        call = JSON.parse(body);
      } catch {
        return null;
      }
      const c = call as { name?: unknown; arguments?: unknown } | null;
      if (typeof c !== "object" || c === null || typeof c.name !== "string") return null;
      calls.push({ name: c.name, arguments: JSON.stringify(c.arguments ?? {}) });
      at = end < 0 ? -1 : text.indexOf(START, end + END.length);
    }
    const content = text.slice(0, first);
    return { content: content.length > 0 ? content : null, calls };
  },
};

export function toolCallParser(name: ToolCallParserName): ToolCallParser {
  switch (name) {
    case "hermes":
      return hermes;
  }
}

/** How much of `text`'s end could be the start of `marker` (the length to hold back while streaming). */
export function partialMarkerLength(text: string, marker: string): number {
  for (let n = Math.min(marker.length - 1, text.length); n > 0; n--) if (text.endsWith(marker.slice(0, n))) return n;
  return 0;
}
