// The granite and mistral reasoning parsers: whole replies split as vLLM's GraniteReasoningParser and
// MistralReasoningParser split them (hand-written cases), and streamed replies, cut into deltas at every place, give
// vLLM's streamed reading (the same split wherever vLLM's whole and streamed readings agree).
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { reasoningKeepsSpecialTokens, ReasoningStream, splitReasoning, thinkingMode, type ThinkingMode } from "../../src/server/reasoning-parsers.js";

/** The reasoning and content a stream gives for `text` cut at i and j. */
function streamed(text: string, mode: ThinkingMode, i: number, j: number): { reasoning: string; content: string } {
  const s = new ReasoningStream(mode);
  const parts = [text.slice(0, i), text.slice(i, j), text.slice(j)].map((d, k) => s.push(d, k === 2));
  return { reasoning: parts.map((p) => p.reasoning).join(""), content: parts.map((p) => p.content).join("") };
}

function everyCut(text: string, mode: ThinkingMode, want: { reasoning: string; content: string }): void {
  for (let i = 0; i <= text.length; i++)
    for (let j = i; j <= text.length; j++) assert.deepEqual(streamed(text, mode, i, j), want, `${JSON.stringify(text)} cut at ${i}, ${j}`);
}

describe("granite reasoning parser", () => {
  it("reads the reply its own way, whatever the prompt", () => {
    assert.equal(thinkingMode("granite", {}, "Here is my response: quoted by the system prompt"), "granite");
    assert.equal(reasoningKeepsSpecialTokens("granite"), false);
  });

  it("splits a whole reply at the thought and response phrases, as vLLM's regex does", () => {
    const g = (text: string) => splitReasoning(text, "granite");
    assert.deepEqual(g("Here is my thought process: add 2 and 2. Here is my response: 4"), { reasoning: " add 2 and 2. ", content: " 4" });
    assert.deepEqual(g("Here's my thought process:x\nHere's my response:y"), { reasoning: "x\n", content: "y" }); // "Here's" too
    assert.deepEqual(g("Intro. Here is my thought process:a Here is my response:"), { reasoning: "a ", content: null }); // before: dropped; empty content null
    assert.deepEqual(g("Here is my thought process: never answers"), { reasoning: null, content: "Here is my thought process: never answers" });
    assert.deepEqual(g("Here is my response: r Here is my thought process: t"), { reasoning: null, content: "Here is my response: r Here is my thought process: t" });
    assert.deepEqual(g("a:b Here is my thought process:1Here is my response:2Here is my response:3"), { reasoning: "1", content: "2Here is my response:3" });
  });

  it("streamed in any cut: reasoning after an opening thought phrase until the response phrase, then content", () => {
    everyCut("Here is my thought process: add. Here is my response: 4", "granite", { reasoning: " add. ", content: " 4" });
    everyCut("Here's my thought process:Here a trap:Here is my response:x", "granite", { reasoning: "Here a trap:", content: "x" });
    everyCut("Hello: plain", "granite", { reasoning: "", content: "Hello: plain" });
    everyCut("Here", "granite", { reasoning: "", content: "Here" }); // a held opening comes out at the end
    // vLLM streams these its own way, differing from its whole reading: a thought phrase later in the reply is
    // content, and reasoning that never reaches a response phrase stays reasoning
    everyCut("x Here is my thought process:a Here is my response:b", "granite", { reasoning: "", content: "x Here is my thought process:a Here is my response:b" });
    everyCut("Here is my thought process: cut by max_tokens Here is my", "granite", { reasoning: " cut by max_tokens Here is my", content: "" });
  });
});

describe("mistral reasoning parser", () => {
  it("keeps special tokens ([THINK] is one) and reads the reply whatever the prompt", () => {
    assert.equal(reasoningKeepsSpecialTokens("mistral"), true);
    assert.equal(thinkingMode("mistral", {}, "[THINK]system prompt's example[/THINK]"), "mistral");
  });

  it("splits a whole reply at [THINK] and [/THINK], as vLLM's parser does", () => {
    const m = (text: string) => splitReasoning(text, "mistral");
    assert.deepEqual(m("[THINK]Let me add.[/THINK]4"), { reasoning: "Let me add.", content: "4" });
    assert.deepEqual(m("So [THINK]r[/THINK] then"), { reasoning: "r", content: "So  then" }); // content around the thinking
    assert.deepEqual(m("[THINK]r[/THINK]"), { reasoning: "r", content: null });
    assert.deepEqual(m("pre[THINK]cut by max_tokens"), { reasoning: "cut by max_tokens", content: "pre" });
    assert.deepEqual(m("[THINK]only"), { reasoning: "only", content: null });
    assert.deepEqual(m("a[/THINK]b"), { reasoning: null, content: "ab" }); // an end without a start is dropped
    assert.deepEqual(m("no thinking"), { reasoning: null, content: "no thinking" });
    assert.deepEqual(m(""), { reasoning: null, content: "" });
    assert.deepEqual(m("[THINK]a[/THINK]b[THINK]c[/THINK]"), { reasoning: "a", content: "b[THINK]c[/THINK]" }); // the first pair only
  });

  it("streamed in any cut, the deltas add up to the whole reply's split", () => {
    for (const text of ["[THINK]Let me add.[/THINK]4", "So [THINK]r[/THINK] then", "pre[THINK]cut", "a[/THINK]b", "no [THIN", "[THINK]a[/THINK]b[THINK]c[/THINK]", "x[/THINK]y[/THINK]z"]) {
      const whole = splitReasoning(text, "mistral");
      everyCut(text, "mistral", { reasoning: whole.reasoning ?? "", content: whole.content ?? "" });
    }
  });
});
