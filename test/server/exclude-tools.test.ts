// --exclude-tools-when-tool-choice-none (vLLM's): a chat request with tool_choice "none" renders the chat template
// without its tools; without the flag the template sees them (and writes them into the prompt).
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { MODEL, startTestServer } from "./helpers.js";

/** The fake tokenizer's template that writes the tools it is given before the messages. */
const TEMPLATE = "tools";
const TOOL = { type: "function", function: { name: "get_weather", parameters: { type: "object", properties: {} } } };

describe("--exclude-tools-when-tool-choice-none", () => {
  it("tool_choice none renders the prompt without the tools with the flag, with them without it", async () => {
    for (const exclude of [true, false]) {
      const s = await startTestServer({ chatTemplate: TEMPLATE, excludeToolsWhenToolChoiceNone: exclude });
      try {
        const promptTokens = async (extra: Record<string, unknown>) => {
          const res = await fetch(`${s.url}/v1/chat/completions`, {
            method: "POST", headers: { "content-type": "application/json" },
            body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "What is the weather in Paris?" }], max_tokens: 1, ...extra }),
          });
          assert.equal(res.status, 200);
          return ((await res.json()) as { usage: { prompt_tokens: number } }).usage.prompt_tokens;
        };
        const plain = await promptTokens({});
        const none = await promptTokens({ tools: [TOOL], tool_choice: "none" });
        if (exclude) assert.equal(none, plain, "the tools left out of the prompt");
        else assert.ok(none > plain, `the tools in the prompt (${none} vs ${plain} tokens)`);
      } finally {
        await s.close();
      }
    }
  });
});
