// The granite and mistral reasoning parsers (vLLM's --reasoning-parser of those names), whole and streamed.
// granite (Granite 3.2+, with chat_template_kwargs {"thinking": true}): the reply writes "Here is my thought process:"
// (or "Here's"), its thinking, then "Here is my response:" and its answer. Whole, as vLLM's regex reads it: the first
// thought marker and the first response marker after it split the reply (what precedes the thought marker is
// dropped); without both, the reply is all content. Streamed, as vLLM streams it: the reply must open with the
// thought marker (else it is all content), and what follows it is reasoning until a response marker, or to the end.
// mistral (Magistral: [THINK] ... [/THINK], kept in the text as special tokens are for it): whole, as vLLM's
// MistralReasoningParser reads it: the reasoning is between the first [THINK] and the first [/THINK] after it (to
// the end without one); the content is the rest, the markers dropped; a [/THINK] without a [THINK] is dropped; no
// [THINK], no reasoning. Streamed the same: content, reasoning from [THINK], content again from [/THINK].
// Streams hold back a marker's possible start at a delta's end until the next delta shows whether it is one.
import { REASONING_MARKERS, type ReasoningMarkers } from "../engine/reasoning.js";

type Split = { reasoning: string | null; content: string | null };
type Delta = { reasoning: string; content: string };

function markersOf<K extends ReasoningMarkers["kind"]>(m: ReasoningMarkers, kind: K): Extract<ReasoningMarkers, { kind: K }> {
  if (m.kind !== kind) throw new Error(`[server] expected ${kind} markers`);
  return m as Extract<ReasoningMarkers, { kind: K }>;
}

const GRANITE = markersOf(REASONING_MARKERS.granite, "text");
const GRANITE_RE = /(?:Here's|Here is) my thought process:(.*?)(?:Here's|Here is) my response:(.*)/s;

export function splitGranite(text: string): Split {
  const m = GRANITE_RE.exec(text);
  return m === null ? { reasoning: null, content: text } : { reasoning: m[1]!, content: m[2] || null };
}

/** Length of the longest suffix of `text` that is a proper prefix of one of `markers`. */
function heldSuffix(text: string, markers: readonly string[]): number {
  let n = 0;
  for (const marker of markers)
    for (let k = Math.min(marker.length - 1, text.length); k > n; k--) if (marker.startsWith(text.slice(text.length - k))) n = k;
  return n;
}

/** The first of `markers` in `text`: where it starts and its length, or null. */
function firstMarker(text: string, markers: readonly string[]): { at: number; length: number } | null {
  let best: { at: number; length: number } | null = null;
  for (const marker of markers) {
    const at = text.indexOf(marker);
    if (at >= 0 && (best === null || at < best.at)) best = { at, length: marker.length };
  }
  return best;
}

/** One sample's granite reply, delta by delta (see the file comment). */
export class GraniteReasoningStream {
  private state: "opening" | "reasoning" | "content" = "opening";
  private held = "";

  push(delta: string, final: boolean): Delta {
    const t = this.held + delta;
    this.held = "";
    if (this.state === "content") return { reasoning: "", content: t };
    if (this.state === "opening") {
      const start = GRANITE.start.find((m) => t.startsWith(m));
      if (start === undefined) {
        if (!final && GRANITE.start.some((m) => m.startsWith(t))) {
          this.held = t;
          return { reasoning: "", content: "" };
        }
        this.state = "content";
        return { reasoning: "", content: t };
      }
      this.state = "reasoning";
      return this.reason(t.slice(start.length), final);
    }
    return this.reason(t, final);
  }

  private reason(t: string, final: boolean): Delta {
    const end = firstMarker(t, GRANITE.end);
    if (end !== null) {
      this.state = "content";
      return { reasoning: t.slice(0, end.at), content: t.slice(end.at + end.length) };
    }
    const keep = final ? 0 : heldSuffix(t, GRANITE.end);
    this.held = t.slice(t.length - keep);
    return { reasoning: t.slice(0, t.length - keep), content: "" };
  }
}

const MISTRAL = markersOf(REASONING_MARKERS.mistral, "token");
const THINK = MISTRAL.start;
const END_THINK = MISTRAL.end;

export function splitMistral(text: string): Split {
  if (text === "") return { reasoning: null, content: "" };
  const s = text.indexOf(THINK);
  if (s < 0) {
    const e = text.indexOf(END_THINK);
    return { reasoning: null, content: e < 0 ? text : text.slice(0, e) + text.slice(e + END_THINK.length) };
  }
  const before = text.slice(0, s);
  const after = text.slice(s + THINK.length);
  const e = after.indexOf(END_THINK);
  if (e < 0) return { reasoning: after, content: before || null };
  return { reasoning: after.slice(0, e), content: before + after.slice(e + END_THINK.length) || null };
}

/** One sample's mistral reply, delta by delta (see the file comment). */
export class MistralReasoningStream {
  private state: "before" | "reasoning" | "after" = "before";
  private held = "";
  private droppedLoneEnd = false;

  push(delta: string, final: boolean): Delta {
    let t = this.held + delta;
    this.held = "";
    const out: Delta = { reasoning: "", content: "" };
    for (;;) {
      if (this.state === "after") {
        out.content += t;
        return out;
      }
      if (this.state === "before") {
        const s = t.indexOf(THINK);
        const lone = this.droppedLoneEnd ? -1 : t.indexOf(END_THINK);
        if (lone >= 0 && (s < 0 || lone < s)) {
          this.droppedLoneEnd = true;
          t = t.slice(0, lone) + t.slice(lone + END_THINK.length);
          continue;
        }
        if (s >= 0) {
          out.content += t.slice(0, s);
          this.state = "reasoning";
          t = t.slice(s + THINK.length);
          continue;
        }
        const keep = final ? 0 : heldSuffix(t, this.droppedLoneEnd ? [THINK] : [THINK, END_THINK]);
        this.held = t.slice(t.length - keep);
        out.content += t.slice(0, t.length - keep);
        return out;
      }
      const e = t.indexOf(END_THINK);
      if (e >= 0) {
        out.reasoning += t.slice(0, e);
        this.state = "after";
        t = t.slice(e + END_THINK.length);
        continue;
      }
      const keep = final ? 0 : heldSuffix(t, [END_THINK]);
      this.held = t.slice(t.length - keep);
      out.reasoning += t.slice(0, t.length - keep);
      return out;
    }
  }
}
