// Reasoning parsers: whole replies split as vLLM's qwen3 / deepseek_r1 parsers split them (hand-written cases), and
// streamed replies, cut into deltas at every place (markers split across deltas included), add up to the same split.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { ReasoningStream, splitReasoning, thinkingMode, type ThinkingMode } from "../../src/server/reasoning-parsers.js";

/** The reasoning and content a stream gives for `text` cut at i and j. */
function streamed(text: string, mode: ThinkingMode, i: number, j: number): { reasoning: string; content: string } {
  const s = new ReasoningStream(mode);
  const parts = [text.slice(0, i), text.slice(i, j), text.slice(j)].map((d, k) => s.push(d, k === 2));
  return { reasoning: parts.map((p) => p.reasoning).join(""), content: parts.map((p) => p.content).join("") };
}

describe("reasoning parsers", () => {
  it("split whole replies as vLLM's parsers do", () => {
    assert.deepEqual(splitReasoning("<think>a plan</think>The answer.", "on"), { reasoning: "a plan", content: "The answer." });
    assert.deepEqual(splitReasoning("a plan</think>\n\nThe answer.", "on"), { reasoning: "a plan", content: "\n\nThe answer." }); // <think> in the prompt
    assert.deepEqual(splitReasoning("x<think>a plan</think>", "on"), { reasoning: "a plan", content: null }); // text before <think> dropped, empty content null
    assert.deepEqual(splitReasoning("still thinking", "on"), { reasoning: "still thinking", content: null }); // cut before </think>
    assert.deepEqual(splitReasoning("no thinking here", "off"), { reasoning: null, content: "no thinking here" });
    assert.deepEqual(splitReasoning("a</think>b</think>c", "on"), { reasoning: "a", content: "b</think>c" });
    // the prompt ended the reasoning: reasoning only when the reply opens with <think>
    assert.deepEqual(splitReasoning('{"a": 1}', "tagged"), { reasoning: null, content: '{"a": 1}' });
    assert.deepEqual(splitReasoning("<think>x</think>{}", "tagged"), { reasoning: "x", content: "{}" });
    const user = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    assert.equal(thinkingMode("qwen3", { enable_thinking: false }, `${user}<think>\n\n</think>\n\n`), "off");
    assert.equal(thinkingMode("qwen3", {}, user), "on");
    assert.equal(thinkingMode("deepseek_r1", {}, `${user}<think>\n`), "on"); // the template opened it
    assert.equal(thinkingMode("qwen3", {}, `${user}<think>\n\n</think>\n\n`), "tagged"); // closed by the prompt
    assert.equal(thinkingMode("qwen3", {}, `<think>a</think>b${user}<think>`), "on"); // the last marker counts
    assert.equal(thinkingMode("deepseek_r1", { enable_thinking: false }, user), "on");
  });

  it("streamed in any cut, the deltas add up to the whole reply's split", () => {
    const replies = ["<think>a plan</think>The answer.", "plan</think>ans", "<think>never ends", "no tags at all", "a</think>", "<thi", "x </thin", "<think></think>y", '{"k": "<think>"}'];
    for (const text of replies) {
      for (const mode of ["on", "tagged"] as const) {
        // text before a later <think>: dropped whole, kept streamed (vLLM's parsers differ the same way)
        if (mode === "on" && text.indexOf("<think>") > 0) continue;
        const want = splitReasoning(text, mode);
        for (let i = 0; i <= text.length; i++) {
          for (let j = i; j <= text.length; j++) {
            const got = streamed(text, mode, i, j);
            const what = `${mode} ${JSON.stringify(text)} cut at ${i}, ${j}`;
            assert.equal(got.reasoning, want.reasoning ?? "", `${what}: reasoning`);
            assert.equal(got.content, want.content ?? "", `${what}: content`);
            // thinking off (qwen3, enable_thinking false): the stream is all content, as vLLM routes it
            assert.deepEqual(streamed(text, "off", i, j), { reasoning: "", content: text });
          }
        }
      }
    }
  });
});
