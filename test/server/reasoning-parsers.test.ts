// Reasoning parsers: whole replies split as vLLM's qwen3 / deepseek_r1 parsers split them (hand-written cases), and
// streamed replies, cut into deltas at every place (markers split across deltas included), add up to the same split.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { ReasoningStream, splitReasoning, thinkingOn } from "../../src/server/reasoning-parsers.js";

/** The reasoning and content a stream gives for `text` cut at i and j. */
function streamed(text: string, thinking: boolean, i: number, j: number): { reasoning: string; content: string } {
  const s = new ReasoningStream(thinking);
  const parts = [text.slice(0, i), text.slice(i, j), text.slice(j)].map((d, k) => s.push(d, k === 2));
  return { reasoning: parts.map((p) => p.reasoning).join(""), content: parts.map((p) => p.content).join("") };
}

describe("reasoning parsers", () => {
  it("split whole replies as vLLM's parsers do", () => {
    assert.deepEqual(splitReasoning("<think>a plan</think>The answer.", true), { reasoning: "a plan", content: "The answer." });
    assert.deepEqual(splitReasoning("a plan</think>\n\nThe answer.", true), { reasoning: "a plan", content: "\n\nThe answer." }); // <think> in the prompt
    assert.deepEqual(splitReasoning("x<think>a plan</think>", true), { reasoning: "a plan", content: null }); // text before <think> dropped, empty content null
    assert.deepEqual(splitReasoning("still thinking", true), { reasoning: "still thinking", content: null }); // cut before </think>
    assert.deepEqual(splitReasoning("no thinking here", false), { reasoning: null, content: "no thinking here" });
    assert.deepEqual(splitReasoning("a</think>b</think>c", true), { reasoning: "a", content: "b</think>c" });
    assert.equal(thinkingOn("qwen3", { enable_thinking: false }), false);
    assert.equal(thinkingOn("qwen3", {}), true);
    assert.equal(thinkingOn("deepseek_r1", { enable_thinking: false }), true);
  });

  it("streamed in any cut, the deltas add up to the whole reply's split", () => {
    const replies = ["<think>a plan</think>The answer.", "plan</think>ans", "<think>never ends", "no tags at all", "a</think>", "<thi", "x </thin", "<think></think>y"];
    for (const text of replies) {
      const want = splitReasoning(text, true);
      for (let i = 0; i <= text.length; i++) {
        for (let j = i; j <= text.length; j++) {
          const got = streamed(text, true, i, j);
          assert.equal(got.reasoning, want.reasoning ?? "", `${JSON.stringify(text)} cut at ${i}, ${j}: reasoning`);
          assert.equal(got.content, want.content ?? "", `${JSON.stringify(text)} cut at ${i}, ${j}: content`);
          // thinking off (qwen3, enable_thinking false): the stream is all content, as vLLM routes it
          assert.deepEqual(streamed(text, false, i, j), { reasoning: "", content: text });
        }
      }
    }
  });
});
