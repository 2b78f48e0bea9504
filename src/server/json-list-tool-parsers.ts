// Tool-call parsers for models that write their calls as a JSON list behind a marker (vLLM's --tool-call-parser):
//   - mistral (Mistral 7B v0.3, Mixtral, Mistral Small/Nemo): `[TOOL_CALLS]` then `[{"name": ..., "arguments": {...}}]`;
//     newer models (Mistral's tokenizer v11+: Small 3.1, Magistral, Devstral) write `[TOOL_CALLS]name[ARGS]{...}` per
//     call instead (a `[CALL_ID]id` may sit before `[ARGS]`). The text before the first `[TOOL_CALLS]` is content.
//   - granite (Granite 3.0: `<|tool_call|>`; 3.1+: `<tool_call>`): the reply is the marker then a JSON list of
//     {"name", "arguments"}; it has no content then.
//   - phi4_mini_json (Phi-4-mini): `functools[{"name": ..., "arguments" | "parameters": {...}}, ...]` anywhere in
//     the reply; a reply with calls has no content.
//   - xlam (Salesforce's xLAM): a JSON list of {"name", "arguments"} as the whole reply, after `</think>`, or in a
//     ```json block, after `[TOOL_CALLS]` or inside <tool_call>...</tool_call>; the text around it is content.
// Python's json.loads reads the list and json.dumps(ensure_ascii=False) writes each call's arguments back, as vLLM's
// parsers do (python-json.ts). Anything that does not read as calls stays text.
import { randomInt } from "node:crypto";
import { randomUUID } from "node:crypto";
import { PyDict, pyJsonDecode, pyJsonDumps, pyJsonDumpsAscii, type PyValue } from "./python-json.js";
import type { ExtractedToolCalls, ToolCallParser } from "./tool-parsers.js";

/** Python's json.loads(text): the one JSON value the text holds (JSON whitespace around it), or undefined. */
export function pyJsonLoads(text: string): PyValue | undefined {
  const start = /^[ \t\n\r]*/.exec(text)![0].length;
  const end = text.length - /[ \t\n\r]*$/.exec(text)![0].length;
  try {
    const read = pyJsonDecode(text.slice(0, end), start);
    return read.end === end ? read.value : undefined;
  } catch {
    return undefined;
  }
}

/** How much of `text`'s end could be the start of `marker`. */
function partialSuffix(text: string, marker: string): number {
  for (let n = Math.min(marker.length - 1, text.length); n > 0; n--) if (text.endsWith(marker.slice(0, n))) return n;
  return 0;
}

/** Each {"name": str, <args key>: value} of a JSON list as a call, or null when the list has anything else. */
function listCalls(list: PyValue | undefined, argsKeys: readonly string[]): ExtractedToolCalls["calls"] | null {
  if (!Array.isArray(list)) return null;
  const calls: ExtractedToolCalls["calls"] = [];
  for (const item of list) {
    if (!(item instanceof PyDict)) return null;
    const name = item.get("name");
    const key = argsKeys.find((k) => item.has(k));
    if (typeof name !== "string" || key === undefined) return null;
    calls.push({ name, arguments: pyJsonDumps(item.get(key)!) });
  }
  return calls;
}

const ALPHANUMERIC = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/** A Mistral tool call id: 9 letters and digits, as Mistral's chat templates (mistral_common) require. */
export const mistralToolCallId = (): string => Array.from({ length: 9 }, () => ALPHANUMERIC[randomInt(ALPHANUMERIC.length)]).join("");

const TOOL_CALLS = "[TOOL_CALLS]";
const ARGS = "[ARGS]";
const CALL_ID = "[CALL_ID]";
/** A v11 call: a function name right before its [CALL_ID], [ARGS] or arguments. */
const V11_CALL = /^\s*[\w.-]+(?:\[CALL_ID\]|\[ARGS\]|\{)/;

/**
 * vLLM's MistralToolParser reading. vLLM tells the form by the tokenizer's version (mistral_common's); Kiln, with
 * Hugging Face tokenizers, by what follows the first `[TOOL_CALLS]`. A function name right before `[ARGS]`,
 * `[CALL_ID]` or `{` is the v11 form, one call per `[TOOL_CALLS]`: the name up to `[ARGS]` (or,
 * as Mistral's own tokenizer decodes it without control tokens, up to the first `{`) and the arguments text as
 * written (vLLM returns them unchecked, so that the model sees the call it tried). Anything else is the older JSON
 * list (one `[TOOL_CALLS]` only; when the text does not parse, the first `[{...}]` in it is tried, as vLLM's
 * fallback does). Ids are Mistral's 9 characters.
 */
const mistral: ToolCallParser = {
  streamable(text: string, sent: number): number {
    const at = text.indexOf(TOOL_CALLS, Math.max(0, sent - TOOL_CALLS.length));
    return at >= 0 ? at : text.length - partialSuffix(text, TOOL_CALLS);
  },
  extract(text: string): ExtractedToolCalls | null {
    const first = text.indexOf(TOOL_CALLS);
    if (first < 0) return null;
    const content = text.slice(0, first) || null;
    const segments = text.slice(first + TOOL_CALLS.length).split(TOOL_CALLS);
    let calls: ExtractedToolCalls["calls"] | null;
    if (!V11_CALL.test(segments[0]!)) {
      if (segments.length !== 1) return null;
      const body = segments[0]!.trim();
      calls = listCalls(pyJsonLoads(body), ["arguments"]);
      if (calls === null) {
        const fallback = /\[\{.*\}\]/s.exec(body);
        calls = fallback === null ? null : listCalls(pyJsonLoads(fallback[0]), ["arguments"]);
      }
    } else {
      calls = [];
      for (const segment of segments) {
        const argsAt = segment.indexOf(ARGS);
        const split = argsAt >= 0 ? argsAt : segment.indexOf("{");
        if (split < 0) continue;
        const name = segment.slice(0, split).split(CALL_ID)[0]!.trim();
        calls.push({ name, arguments: segment.slice(argsAt >= 0 ? split + ARGS.length : split).trim() });
      }
    }
    if (calls === null || calls.length === 0) return null;
    return { content, calls: calls.map((c) => ({ ...c, id: mistralToolCallId() })) };
  },
};

const GRANITE_TOKEN = "<|tool_call|>";
const GRANITE_STRING = "<tool_call>";

/** What follows Granite's optional `<|tool_call|>` then `<tool_call>` (no space between them), as vLLM strips them. */
function afterGraniteMarkers(text: string): string {
  let s = text.trimStart();
  if (s.startsWith(GRANITE_TOKEN)) s = s.slice(GRANITE_TOKEN.length);
  if (s.startsWith(GRANITE_STRING)) s = s.slice(GRANITE_STRING.length);
  return s.trimStart();
}

/**
 * vLLM's GraniteToolParser reading: the whole reply, stripped, after the markers, is one JSON list of
 * {"name", "arguments"}. Streamed, the reply is held while it may still open so.
 */
const granite: ToolCallParser = {
  streamable(text: string): number {
    const s = text.trimStart();
    const opening = (rest: string, markers: string[]) => rest === "" || markers.some((m) => m.startsWith(rest));
    if (opening(s, [GRANITE_TOKEN, GRANITE_STRING])) return 0;
    const afterToken = s.startsWith(GRANITE_TOKEN) ? s.slice(GRANITE_TOKEN.length) : null;
    if (afterToken !== null && GRANITE_STRING.startsWith(afterToken)) return 0;
    const rest = afterGraniteMarkers(text);
    return rest === "" || rest.startsWith("[") ? 0 : text.length;
  },
  extract(text: string): ExtractedToolCalls | null {
    const s = afterGraniteMarkers(text.trim());
    if (!s.startsWith("[")) return null;
    const calls = listCalls(pyJsonLoads(s), ["arguments"]);
    return calls === null ? null : { content: null, calls };
  },
};

/**
 * vLLM's Phi4MiniJsonToolParser reading: the first `functools[...]` (up to the first `]`, as vLLM's lazy regex
 * takes it) is the JSON list of calls, each with "arguments" or else "parameters"; the reply then has no content.
 * vLLM streams nothing of these replies; Kiln holds the whole reply and sends its reading in the last chunk.
 */
const phi4MiniJson: ToolCallParser = {
  streamable: () => 0,
  extract(text: string): ExtractedToolCalls | null {
    const m = /functools\[(.*?)\]/s.exec(text);
    if (m === null) return null;
    const calls = listCalls(pyJsonLoads(`[${m[1]!}]`), ["arguments", "parameters"]);
    return calls === null ? null : { content: null, calls };
  },
};

/** xLAM's call blocks, in the order vLLM tries them: a ``` (json) block, `[TOOL_CALLS]` to the line's end, <tool_call> tags. */
const XLAM_BLOCKS = [/```(?:json)?\s*([\s\S]*?)```/g, /\[TOOL_CALLS\]([\s\S]*?)(?=\n|$)/g, /<tool_call>([\s\S]*?)<\/tool_call>/g];
const XLAM_MARKERS = ["```", "[TOOL_CALLS]", "<tool_call>", "</think>"];
const THINK_END = "</think>";

/**
 * xLAM's calls in a JSON value: each {"name", "arguments"} of a list (others skipped, as vLLM logs and skips them),
 * object arguments written by Python's json.dumps (ASCII escapes, as vLLM's xLAM parser writes them), string ones as
 * they are; null when the value is no list, holds no call, or has arguments of another type (vLLM's call then fails
 * and the reply is text).
 */
function xlamCalls(value: PyValue | undefined): ExtractedToolCalls["calls"] | null {
  if (!Array.isArray(value)) return null;
  const calls: ExtractedToolCalls["calls"] = [];
  for (const item of value) {
    if (!(item instanceof PyDict) || !item.has("name") || !item.has("arguments")) continue;
    const [name, args] = [item.get("name"), item.get("arguments")];
    if (typeof name !== "string" || !(args instanceof PyDict || typeof args === "string")) return null;
    calls.push({ name, arguments: typeof args === "string" ? args : pyJsonDumpsAscii(args), id: `call_${calls.length}_${randomUUID().replaceAll("-", "")}` });
  }
  return calls.length > 0 ? calls : null;
}

/** The first match of a call-block pattern in `text` whose inside reads as JSON, by pattern order: [pattern, value]. */
function firstXlamBlock(text: string): [RegExp, PyValue] | null {
  for (const pattern of XLAM_BLOCKS) {
    for (const m of text.matchAll(pattern)) {
      const value = pyJsonLoads(m[1]!);
      if (value !== undefined) return [pattern, value];
    }
  }
  return null;
}

/**
 * vLLM's xLAMToolParser reading of a whole reply: after a `</think>`, the rest as JSON, or the first call block in it
 * that reads as JSON (the content is then the reply up to `</think>`); else the first block in the whole reply that
 * reads as JSON (the content is the reply without that pattern's blocks); else a reply that is one JSON list. Kiln
 * keeps the content's leading whitespace (vLLM strips both ends) so that a streamed reply adds up to the whole
 * reading. Streamed, text goes out up to the first marker (trailing whitespace held), and a reply opening with `[`,
 * `<tool_call>` or `[TOOL_CALLS]` is held whole.
 */
const xlam: ToolCallParser = {
  streamable(text: string): number {
    const start = text.trimStart();
    if (["[", "<tool_call>", "[TOOL_CALLS]"].some((o) => start.startsWith(o) || o.startsWith(start))) return 0;
    let upTo = text.length;
    for (const m of XLAM_MARKERS) {
      const at = text.indexOf(m);
      upTo = Math.min(upTo, at >= 0 ? at : text.length - partialSuffix(text, m));
    }
    return text.slice(0, upTo).trimEnd().length;
  },
  extract(text: string): ExtractedToolCalls | null {
    const orNull = (s: string) => (s === "" ? null : s);
    const think = text.indexOf(THINK_END);
    if (think >= 0) {
      const rest = text.slice(think + THINK_END.length);
      const value = pyJsonLoads(rest) ?? firstXlamBlock(rest)?.[1];
      if (value !== undefined) {
        const calls = xlamCalls(value);
        return calls === null ? null : { content: orNull(text.slice(0, think + THINK_END.length)), calls };
      }
    }
    const block = firstXlamBlock(text);
    if (block !== null) {
      const calls = xlamCalls(block[1]);
      return calls === null ? null : { content: orNull(text.replace(block[0], "").trimEnd()), calls };
    }
    if (!text.trimStart().startsWith("[")) return null;
    const calls = xlamCalls(pyJsonLoads(text));
    return calls === null ? null : { content: null, calls };
  },
};

export const jsonListToolParsers = { mistral, granite, phi4_mini_json: phi4MiniJson, xlam } as const;
