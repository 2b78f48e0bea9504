// POST /v1/responses on a reasoning server (--reasoning-parser qwen3) with auto tool choice (hermes), through the
// official `openai` client: reasoning items, their streamed events and token count, and auto tool calls continued
// with their results, each checked against the chat completions endpoint over the same requests.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type OpenAI from "openai";
import { Tokenizer } from "../../src/models/tokenizer.js";
import { thinkTokenizerDir, tinyModelDir } from "../helpers/tiny-model.js";
import { startKiln, type KilnServer } from "./kiln-process.js";
import { api, final, TOOL_TEMPLATE, USER, withoutIds } from "./responses-client.js";

describe("POST /v1/responses with --reasoning-parser qwen3 and hermes auto tool choice (e2e)", () => {
  let server: KilnServer;
  let r: ReturnType<typeof api>;
  let endId: number;
  before(async () => {
    server = await startKiln(
      ["--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--trust-request-chat-template"],
      tinyModelDir("LlamaForCausalLM", { tokenizerDir: thinkTokenizerDir() }),
    );
    r = api(server);
    endId = Tokenizer.fromDir(thinkTokenizerDir()).encode("</think>", { addSpecialTokens: false })[0]!;
  });
  after(async () => {
    assert.equal(await server.stop(), 0);
  });

  it("the thinking comes back as a reasoning item before the message, as chat's reasoning and content; streamed the same", async () => {
    // </think> made likely by logit_bias: a few free tokens of thinking, then the regex's answer
    const steer = { temperature: 1, seed: 1, logit_bias: { [endId]: 5 }, structured_outputs: { regex: "Answer: (yes|no)" } };
    const a = await r.create({ input: USER, max_output_tokens: 40, ...steer });
    assert.equal(a.status, "completed");
    assert.deepEqual(
      a.output.map((o) => o.type),
      ["reasoning", "message"],
    );
    const reasoning = a.output[0] as OpenAI.Responses.ResponseReasoningItem;
    assert.match(reasoning.id, /^rs_[0-9a-f]{32}$/);
    assert.match(a.output_text, /^Answer: (yes|no)$/);
    const chat = await r.chat({
      messages: [{ role: "user", content: USER }],
      max_tokens: 40,
      ...steer,
      logprobs: true,
      return_tokens_as_token_ids: true,
    });
    const m = chat.choices[0]!.message as unknown as { content: string; reasoning: string };
    assert.deepEqual(reasoning.content, [{ type: "reasoning_text", text: m.reasoning }]);
    assert.ok(m.reasoning.length > 0);
    assert.equal(a.output_text, m.content);
    // reasoning_tokens: the sampled tokens before </think>, as the chat API's logprobs list them
    const sampled = chat.choices[0]!.logprobs!.content!.map((t) => t.token);
    assert.equal(a.usage!.output_tokens, sampled.length);
    assert.equal(a.usage!.output_tokens_details.reasoning_tokens, sampled.indexOf(`token_id:${endId}`));

    const events = await r.events({ input: USER, max_output_tokens: 40, ...steer });
    const joined = (type: string) =>
      events
        .filter((e) => e.type === type)
        .map((e) => (e as { delta: string }).delta)
        .join("");
    assert.equal(joined("response.reasoning_text.delta"), m.reasoning);
    assert.equal(joined("response.output_text.delta"), m.content);
    const outline = events.map((e) => e.type).filter((t) => !t.endsWith(".delta"));
    assert.deepEqual(outline, [
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.reasoning_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.completed",
    ]);
    assert.deepEqual(withoutIds(final(events).output), withoutIds(a.output));
    assert.deepEqual(final(events).usage!.output_tokens_details, a.usage!.output_tokens_details);
  });

  it("tool_choice auto: the text before the call is a message, the call a function_call item; the result continues the turn", async () => {
    const tools = [{ type: "function", name: "get_time", parameters: { type: "object", properties: { zone: { type: "string" } } } }];
    // </think> first, then a reply with a hermes call steered by a regex
    const steer = {
      logit_bias: { [endId]: 100 },
      temperature: 1,
      seed: 2,
      structured_outputs: { regex: 'Checking\\. <tool_call>\\{"name": "get_time", "arguments": \\{"zone": "(UTC|CET)"\\}\\}</tool_call>' },
    };
    const body = { input: USER, tools, max_output_tokens: 80, ...steer };
    const a = await r.create(body);
    assert.deepEqual(
      a.output.map((o) => o.type),
      ["message", "function_call"],
    );
    assert.equal(a.output_text, "Checking. ");
    const call = a.output[1] as OpenAI.Responses.ResponseFunctionToolCall;
    assert.equal(call.name, "get_time");
    assert.match(call.arguments, /^\{"zone": "(UTC|CET)"\}$/);
    const events = await r.events(body);
    assert.deepEqual(withoutIds(final(events).output), withoutIds(a.output));
    const types = events.map((e) => e.type);
    assert.ok(types.indexOf("response.function_call_arguments.done") > types.lastIndexOf("response.output_text.done"));

    const next = { tools, tool_choice: "none", chat_template: TOOL_TEMPLATE, max_output_tokens: 5, temperature: 0 };
    const cont = await r.create({
      previous_response_id: a.id,
      input: [{ type: "function_call_output", call_id: call.call_id, output: "12:00" }],
      ...next,
    });
    const messages = [
      { role: "user", content: USER },
      {
        role: "assistant",
        content: "Checking. ",
        tool_calls: [{ id: call.call_id, type: "function", function: { name: "get_time", arguments: call.arguments } }],
      },
      { role: "tool", tool_call_id: call.call_id, content: "12:00" },
    ];
    assert.equal(cont.usage!.input_tokens, await r.promptTokens({ messages, chat_template: TOOL_TEMPLATE }));
    const chat = await r.chat({
      messages,
      tools: tools.map(({ name, parameters }) => ({ type: "function", function: { name, parameters } })),
      tool_choice: "none",
      chat_template: TOOL_TEMPLATE,
      max_tokens: 5,
      temperature: 0,
    });
    const m = chat.choices[0]!.message as unknown as { content: string | null; reasoning: string | null };
    assert.equal(cont.output_text, m.content ?? "");
    assert.equal(
      (cont.output.find((o) => o.type === "reasoning") as OpenAI.Responses.ResponseReasoningItem | undefined)?.content?.[0]?.text ?? null,
      m.reasoning || null,
    );
  });
});
