// vLLM's functiongemma tool-call parser (FunctionGemma, Google's Gemma 3 270M tuned for calls):
//   <start_function_call>call:get_weather{city:<escape>Oslo<escape>,days:<escape>2<escape>}<end_function_call>
// Each call's arguments are its `key:<escape>value<escape>` pairs, a value read as JSON where it parses (2, true,
// "x") and kept as text otherwise; a call left open at the end of the reply runs to the end. The content is the text
// before the first call, stripped of whitespace (null when empty), as vLLM returns it.
import { PyDict, pyJsonDumps } from "./python-json.js";
import { pyJsonLoads } from "./json-list-tool-parsers.js";
import type { ExtractedToolCalls, ToolCallParser } from "./tool-parsers.js";

const START = "<start_function_call>";
// Python's \w is Unicode's letters, digits and underscore
const CALL_RE = /<start_function_call>call:([\p{L}\p{N}_]+)\{(.*?)\}<end_function_call>|<start_function_call>call:([\p{L}\p{N}_]+)\{(.*)/gsu;
const ARG_RE = /([\p{L}\p{N}_]+):<escape>(.*?)<escape>/gsu;

function partialSuffix(text: string, marker: string): number {
  for (let n = Math.min(marker.length - 1, text.length); n > 0; n--) if (text.endsWith(marker.slice(0, n))) return n;
  return 0;
}

export const functionGemma: ToolCallParser = {
  /**
   * The text before a call, as far as it is sure to be the content: not while the reply opens with whitespace, nor
   * whitespace that may end the content (both are stripped when a call follows).
   */
  streamable(text: string, sent: number): number {
    if (/^\s/.test(text)) return 0;
    const at = text.indexOf(START, Math.max(0, sent - START.length));
    const upTo = at >= 0 ? at : text.length - partialSuffix(text, START);
    return Math.max(sent, text.slice(0, upTo).trimEnd().length);
  },
  extract(text: string): ExtractedToolCalls | null {
    if (!text.includes(START)) return null;
    const calls: ExtractedToolCalls["calls"] = [];
    for (const m of text.matchAll(CALL_RE)) {
      const args = new PyDict();
      for (const [, key, value] of (m[2] || m[4] || "").matchAll(ARG_RE)) {
        const json = pyJsonLoads(value!);
        args.set(key!, json === undefined ? value! : json);
      }
      calls.push({ name: m[1] || m[3]!, arguments: pyJsonDumps(args) });
    }
    if (calls.length === 0) return null;
    const start = text.indexOf(START);
    return { content: text.slice(0, start).trim() || null, calls };
  },
};
