// gpt-oss's Harmony format over the real o200k_harmony tokenizer: prompts rendered as vLLM renders them, checked
// token for token against hand-written Harmony text encoded piece by piece as openai-harmony encodes it (special
// tokens by id, text pieces on their own); replies built from token sequences read by channel, whole and streamed
// in chunks cut anywhere (also inside a character's bytes), into reasoning, content and tool calls.
import assert from "node:assert/strict";
import * as path from "node:path";
import { describe, it } from "node:test";
import { Tokenizer } from "../../src/models/tokenizer.js";
import { ApiError } from "../../src/server/errors.js";
import { callArguments, harmonyTokens, HarmonyParser, parseHarmonyReply } from "../../src/server/harmony-parse.js";
import { harmonyEffort, renderHarmonyPrompt } from "../../src/server/harmony-render.js";
import type { ChatRequest } from "../../src/server/protocol.js";
import { createServer } from "../../src/server/index.js";
import { checkHarmonyToolChoice, HarmonyChatStream, harmonyMessage, harmonyParams, parseReply } from "../../src/server/serving-chat-harmony.js";
import { FakeEngine } from "./fake-engine.js";
import type { ServingContext } from "../../src/server/serving-context.js";

const tok = Tokenizer.fromDir(path.resolve("node_modules", "@lenml", "tokenizer-gptoss", "models"));
const T = harmonyTokens(tok);

// openai-harmony's ids of the o200k_harmony special tokens (its test data: <|channel|>analysis<|message|>...<|return|>)
const SPECIAL_IDS: Record<string, number> = {
  "<|start|>": 200006, "<|end|>": 200007, "<|message|>": 200008, "<|channel|>": 200005, "<|constrain|>": 200003, "<|return|>": 200002, "<|call|>": 200012,
};

/** Harmony text as openai-harmony encodes it: each special token by its id, each text piece encoded on its own. */
function piecewise(text: string): number[] {
  return text
    .split(/(<\|[a-z_]+\|>)/)
    .filter((p) => p !== "")
    .flatMap((p) => (p in SPECIAL_IDS ? [SPECIAL_IDS[p]!] : tok.encode(p, { addSpecialTokens: false })));
}

const encode = (text: string) => tok.encode(text, { addSpecialTokens: false });

/** The hand-written expectation, checked as text and as the tokens the server sends (whole-text encoding). */
function assertPrompt(rendered: string, expected: string): void {
  assert.equal(rendered, expected);
  assert.deepEqual(encode(rendered), piecewise(expected));
}

const SYSTEM = (effort: string, date = "2025-08-05", tools = false) =>
  "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n" +
  `Current date: ${date}\n\nReasoning: ${effort}\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.` +
  (tools ? "\nCalls to these tools must go to the commentary channel: 'functions'." : "") +
  "<|end|>";

const WEATHER = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather in a city.",
    parameters: { type: "object", properties: { city: { type: "string", description: "City name" }, unit: { type: "string", enum: ["c", "f"], default: "c" } }, required: ["city"] },
  },
};

describe("Harmony prompts (vLLM's rendering)", () => {
  it("the special tokens are the single ids openai-harmony renders", () => {
    assert.deepEqual(T, { start: 200006, message: 200008, end: 200007, return: 200002, call: 200012, channel: 200005, constrain: 200003 });
  });

  it("a user message: system message with the default effort, no developer message", () => {
    const out = renderHarmonyPrompt([{ role: "user", content: "What is 2 + 2?" }], { reasoningEffort: null, date: "2025-08-05", tools: undefined });
    assertPrompt(out, `${SYSTEM("medium")}<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant`);
    // the tokens as a reader would count them: 200006 "system" 200008 ... ; the prompt ends <|start|> "assistant"
    assert.deepEqual(encode(out).slice(-2), [200006, ...encode("assistant")]);
  });

  it("instructions and tools make the developer message; reasoning_effort reaches the system message", () => {
    const out = renderHarmonyPrompt(
      [{ role: "system", content: "Answer in French." }, { role: "user", content: [{ type: "text", text: "Weather " }, { type: "text", text: "in Oslo?" }] }],
      { reasoningEffort: "high", date: "2025-08-05", tools: [WEATHER, { type: "function", function: { name: "now" } }] },
    );
    const developer =
      "<|start|>developer<|message|># Instructions\n\nAnswer in French.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n" +
      "// Current weather in a city.\ntype get_weather = (_: {\n// City name\ncity: string,\nunit?: \"c\" | \"f\", // default: c\n}) => any;\n\n" +
      "type now = () => any;\n\n} // namespace functions<|end|>";
    assertPrompt(out, `${SYSTEM("high", "2025-08-05", true)}${developer}<|start|>user<|message|>Weather in Oslo?<|end|><|start|>assistant`);
  });

  it("a conversation with reasoning, tool calls and results: answered reasoning dropped, calls to functions.NAME, results from it", () => {
    const messages = [
      { role: "user", content: "Hi" },
      { role: "assistant", reasoning: "Greet back.", content: "Hello!" },
      { role: "user", content: "Weather in Oslo?" },
      {
        role: "assistant",
        reasoning_content: "Need the tool.",
        content: "Checking.",
        tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Oslo"}' } }],
      },
      { role: "tool", tool_call_id: "call_1", content: '{"temp": 3}' },
      { role: "developer", content: "Be short." },
    ];
    const out = renderHarmonyPrompt(messages, { reasoningEffort: "low", date: "2025-08-05", tools: [WEATHER] });
    const tools =
      "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n// Current weather in a city.\ntype get_weather = (_: {\n" +
      "// City name\ncity: string,\nunit?: \"c\" | \"f\", // default: c\n}) => any;\n\n} // namespace functions<|end|>";
    assertPrompt(
      out,
      SYSTEM("low", "2025-08-05", true) +
        tools +
        "<|start|>user<|message|>Hi<|end|>" +
        "<|start|>assistant<|channel|>final<|message|>Hello!<|end|>" + // its analysis came before the last final: dropped
        "<|start|>user<|message|>Weather in Oslo?<|end|>" +
        "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>" +
        "<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>" +
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Oslo"}<|call|>' +
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{"temp": 3}<|end|>' +
        "<|start|>developer<|message|># Instructions\n\nBe short.<|end|>" +
        "<|start|>assistant",
    );
  });

  it("tool parameters as openai-harmony's TypeScript: nested objects, arrays, enums, nullable, oneOf, titles, examples", () => {
    const tool = {
      type: "function",
      function: {
        name: "book",
        description: "Books a trip.\nTwo lines.",
        parameters: {
          type: "object",
          properties: {
            legs: { type: "array", items: { type: "object", properties: { from: { type: "string" }, day: { type: "integer" } }, required: ["from"] } },
            seats: { type: ["integer", "null"] },
            note: { type: "string", nullable: true, title: "Note", examples: ["window"] },
            when: { oneOf: [{ type: "string", description: "ISO date" }, { type: "number" }], description: "Departure" },
            flags: { type: "array" },
            vip: { type: "boolean", default: false },
          },
          required: ["legs"],
        },
      },
    };
    const out = renderHarmonyPrompt([{ role: "user", content: "x" }], { reasoningEffort: null, date: "2025-08-05", tools: [tool] });
    const ts =
      "// Books a trip.\n// Two lines.\ntype book = (_: {\n" +
      "legs: {\n    from: string,\n    day?: number,\n    }[],\n" +
      "seats?: number | null,\n" +
      "// Note\n//\n// Examples:\n// - \"window\"\nnote?: string | null,\n" +
      // (the property's own description above it stands in for its first variant's, as openai-harmony writes it)
      "// Departure\nwhen?:\n | string\n | number\n,\n" +
      "flags?: Array<any>,\n" +
      "vip?: boolean, // default: false\n" +
      "}) => any;\n";
    assert.ok(out.includes(`namespace functions {\n\n${ts}\n} // namespace functions`), out);
    assert.deepEqual(encode(out), piecewise(out));
  });

  it("refuses efforts Harmony does not know, naming the field", () => {
    assert.equal(harmonyEffort("low", "reasoning_effort"), "low");
    assert.equal(harmonyEffort(undefined, "reasoning_effort"), null);
    for (const bad of ["none", "minimal", 3]) {
      assert.throws(() => harmonyEffort(bad, "reasoning.effort"), (e: unknown) => e instanceof ApiError && e.status === 400 && e.param === "reasoning.effort" && /low, medium, high/.test(e.message));
    }
    assert.throws(() => renderHarmonyPrompt([{ role: "critic", content: "x" }], { reasoningEffort: null, date: "2025-08-05", tools: undefined }), (e: unknown) => e instanceof ApiError && e.param === "messages[0].role");
  });
});

// ---- replies ----

const ctx = { tokenizer: tok, harmony: { tokens: T, toolCalls: true } } as unknown as ServingContext;
const chatReq = (over: Partial<ChatRequest> = {}) =>
  ({ includeReasoning: true, toolChoice: { kind: "auto" }, parallelToolCalls: true, tools: [WEATHER], ...over }) as ChatRequest;

// a reply that thinks (with a character of several tokens' bytes), prefaces, and calls a tool
const CALL_REPLY =
  "<|channel|>analysis<|message|>User wants weather ⛈️ in Oslo 𝄞.<|end|>" +
  "<|start|>assistant<|channel|>commentary<|message|>Let me check.<|end|>" +
  '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Oslo","unit":"c","note":"é"}<|call|>';
const ANSWER_REPLY = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.<|return|>";

describe("Harmony replies (vLLM's parse_chat_output and openai tool-call parser)", () => {
  it("reads channels, recipients and content types from the headers", () => {
    const p = new HarmonyParser(tok, T);
    for (const id of encode(CALL_REPLY)) p.push(id);
    assert.equal(p.current, null);
    assert.deepEqual(
      p.messages.map((m) => [m.author, m.channel, m.recipient, m.contentType, m.text]),
      [
        ["assistant", "analysis", null, null, "User wants weather ⛈️ in Oslo 𝄞."],
        ["assistant", "commentary", null, null, "Let me check."],
        ["assistant", "commentary", "functions.get_weather", "<|constrain|>json", '{"city":"Oslo","unit":"c","note":"é"}'],
      ],
    );
    // the recipient may also come before the channel, the content type without <|constrain|>
    const q = new HarmonyParser(tok, T);
    for (const id of encode(" to=functions.now<|channel|>commentary json<|message|>{}<|call|>")) q.push(id);
    assert.deepEqual([q.messages[0]!.recipient, q.messages[0]!.channel, q.messages[0]!.contentType], ["functions.now", "commentary", "json"]);
  });

  it("a whole reply: analysis is reasoning, final and preambles are content, calls' JSON re-serialized as Python's json.dumps", () => {
    assert.deepEqual(parseHarmonyReply(tok, T, encode(ANSWER_REPLY)), { reasoning: "Easy.", content: "It is 4.", calls: [] });
    assert.deepEqual(parseHarmonyReply(tok, T, encode(CALL_REPLY)), {
      reasoning: "User wants weather ⛈️ in Oslo 𝄞.",
      content: "Let me check.",
      calls: [{ name: "get_weather", arguments: '{"city": "Oslo", "unit": "c", "note": "\\u00e9"}' }],
    });
    // cut short (max_tokens): the reasoning so far; a call cut short is no call
    const cut = encode(CALL_REPLY);
    assert.deepEqual(parseHarmonyReply(tok, T, cut.slice(0, 6)).reasoning, tok.decode(cut.slice(3, 6)));
    assert.deepEqual(parseHarmonyReply(tok, T, cut.slice(0, -3)).calls, []);
  });

  it("call arguments: JSON normalized, other content types and broken JSON as written", () => {
    const m = (text: string, contentType: string | null) => ({ author: "assistant", recipient: "functions.f", channel: "commentary", contentType, text });
    assert.equal(callArguments(m(' {"a":1.0,"b":[true,null],"c":10000000000000000001}\n', "json")), '{"a": 1.0, "b": [true, null], "c": 10000000000000000001}');
    assert.equal(callArguments(m('{"a":1', null)), '{"a":1');
    assert.equal(callArguments(m("print(1)", "code")), "print(1)");
  });

  it("the chat message: tool calls with finish_reason tool_calls; include_reasoning false; tool_choice none; without the parser", () => {
    const ids = encode(CALL_REPLY);
    const r = harmonyMessage(ctx, chatReq(), ids, "stop", T.call);
    assert.equal(r.finishReason, "tool_calls");
    assert.equal(r.reasoning, "User wants weather ⛈️ in Oslo 𝄞.");
    assert.equal(r.content, "Let me check.");
    assert.deepEqual(r.toolCalls.map((c) => c.function), [{ name: "get_weather", arguments: '{"city": "Oslo", "unit": "c", "note": "\\u00e9"}' }]);
    assert.match(r.toolCalls[0]!.id, /^chatcmpl-tool-[0-9a-f]{32}$/);
    assert.equal(harmonyMessage(ctx, chatReq({ includeReasoning: false }), ids, "stop", T.call).reasoning, null);
    const none = harmonyMessage(ctx, chatReq({ toolChoice: { kind: "none" } }), ids, "stop", T.call);
    assert.deepEqual([none.toolCalls, none.finishReason], [[], "stop"]);
    const noParser = { ...ctx, harmony: { tokens: T, toolCalls: false } } as ServingContext;
    // as vLLM without --tool-call-parser: the calls are dropped, whole and streamed
    assert.deepEqual(harmonyMessage(noParser, chatReq(), ids, "stop", T.call).toolCalls, []);
    const streamed = new HarmonyChatStream(noParser, chatReq(), 1).delta(0, ids, "stop", T.call);
    assert.deepEqual([streamed.delta.tool_calls, streamed.delta.content, streamed.finishReason], [undefined, "Let me check.", "stop"]);
    // tool_choice "required" or a named function: a 400 on chat without the parser; the reply grammar swapped in with it
    for (const toolChoice of [{ kind: "required" }, { kind: "named", name: "get_weather" }] as const) {
      assert.throws(() => checkHarmonyToolChoice(noParser, chatReq({ toolChoice })), (e: unknown) => e instanceof ApiError && e.status === 400 && e.param === "tool_choice");
      checkHarmonyToolChoice(ctx, chatReq({ toolChoice }));
      const p = harmonyParams(ctx.harmony!, { structuredOutputs: { json: { type: "object" } } }, chatReq({ toolChoice, tools: [{ type: "function", function: { name: "get_weather" } }] }));
      assert.equal(p.structuredOutputs?.harmonyReply, true);
      assert.match(String(p.structuredOutputs?.structuralTag), /to=functions\.get_weather/);
      assert.deepEqual(p.stopTokenIds, [T.return, T.call]);
    }
    // the stop token left out of the ids still ends the call
    assert.equal(harmonyMessage(ctx, chatReq(), ids.slice(0, -1), "stop", T.call).toolCalls.length, 1);
    assert.equal(parseReply(ctx, ids.slice(0, -1), "length", null).current?.recipient, "functions.get_weather");
  });

  it("streamed in chunks cut anywhere: the deltas add up to the whole reading; one call opens with its id and name", () => {
    for (const reply of [CALL_REPLY, ANSWER_REPLY]) {
      const ids = encode(reply);
      const whole = harmonyMessage(ctx, chatReq(), ids, "stop", null);
      for (let i = 0; i <= ids.length; i++) {
        for (let j = i; j <= ids.length; j += 3) {
          const s = new HarmonyChatStream(ctx, chatReq(), 1);
          const chunks = [ids.slice(0, i), ids.slice(i, j), ids.slice(j)];
          let content = "";
          let reasoning = "";
          const calls: { id?: string; name?: string; arguments: string }[] = [];
          let finish: string | null = null;
          chunks.forEach((chunk, k) => {
            const last = k === chunks.length - 1;
            const { delta, finishReason } = s.delta(0, chunk, last ? "stop" : null, null);
            assert.ok(!JSON.stringify(delta).includes("\\ufffd") && !JSON.stringify(delta).includes("\uFFFD"), "a character's bytes were split");
            content += (delta.content as string | undefined) ?? "";
            assert.equal(delta.reasoning, delta.reasoning_content);
            reasoning += (delta.reasoning as string | undefined) ?? "";
            for (const c of (delta.tool_calls ?? []) as { index: number; id?: string; function: { name?: string; arguments: string } }[]) {
              if (c.id !== undefined) calls[c.index] = { id: c.id, name: c.function.name!, arguments: c.function.arguments };
              else calls[c.index]!.arguments += c.function.arguments;
            }
            finish = finishReason;
          });
          assert.equal(content, whole.content ?? "", `cut at ${i}, ${j}`);
          assert.equal(reasoning, whole.reasoning ?? "");
          // streamed arguments are the text as written (vLLM streams them raw); whole ones are re-serialized
          assert.deepEqual(calls.map((c) => [c.name, JSON.parse(c.arguments)]), whole.toolCalls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]));
          assert.equal(finish, whole.finishReason);
        }
      }
    }
  });
});

describe("Harmony serving's options", () => {
  const serve = (tokenizer: Tokenizer | FakeEngine["tokenizer"], over: Record<string, unknown>) => () =>
    createServer({ engine: new FakeEngine(), tokenizer, servedModelNames: ["m"], maxModelLen: 256, version: "t", ...over });

  it("refuses the openai tool-call parser for other models, text parsers for gpt-oss, and a tokenizer without Harmony's tokens", () => {
    assert.throws(serve(new FakeEngine().tokenizer, { toolCallParser: "openai" }), /not gpt-oss/);
    assert.throws(serve(tok, { harmony: true, toolCallParser: "hermes" }), /--tool-call-parser openai, not hermes/);
    assert.throws(serve(new FakeEngine().tokenizer, { harmony: true }), /no single token <\|start\|>/);
    serve(tok, { harmony: true, toolCallParser: "openai" })();
  });
});
