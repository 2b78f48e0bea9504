// `kiln serve` on a tiny random gpt-oss model (config.json model_type gpt_oss, the real o200k_harmony tokenizer) with
// --reasoning-parser openai_gptoss --enable-auto-tool-choice --tool-call-parser openai, through the official `openai`
// client. The random model's sampling is scripted by a logits processor that forces the tokens of a Harmony reply
// given in vllm_xargs, so the real engine generates it: the prompt comes back (return_token_ids) as the hand-written
// Harmony text's tokens; the reply as reasoning, content and tool calls, whole and streamed; the engine stops at
// <|call|> though the script goes on; /v1/responses gives reasoning, message and function_call items.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { after, before, describe, it } from "node:test";
import type OpenAI from "openai";
import { Tokenizer } from "../../src/models/tokenizer.js";
import { harmonyDate } from "../../src/server/harmony-render.js";
import { assertErrorBody, postRaw, startKiln, type KilnServer } from "../e2e/kiln-process.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";

const GPTOSS_TOKENIZER = path.resolve("node_modules", "@lenml", "tokenizer-gptoss", "models");

// forces extraArgs.script[i] as the i-th sampled token (the rest of the vocabulary at -inf) for the requests that give one;
// a token the grammar masked (already -inf) is not forced, and once the reply has left the script it runs free
const SCRIPT_PROCESSOR = `export default class Script {
  apply(logits, rows, vocabSize) {
    rows.forEach((row, r) => {
      const script = row.extraArgs.script;
      const out = row.outputTokenIds;
      if (!Array.isArray(script) || out.length >= script.length || out.some((t, i) => t !== script[i])) return;
      const keep = script[out.length];
      if (logits[r * vocabSize + keep] === -Infinity) return;
      logits.fill(-Infinity, r * vocabSize, (r + 1) * vocabSize);
      logits[r * vocabSize + keep] = 0;
    });
  }
}
`;

const tok = Tokenizer.fromDir(GPTOSS_TOKENIZER);
const encode = (text: string) => tok.encode(text, { addSpecialTokens: false });

const WEATHER: OpenAI.Chat.ChatCompletionTool = {
  type: "function",
  function: { name: "get_weather", description: "Weather in a city.", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } },
};
const CALL_REPLY =
  "<|channel|>analysis<|message|>Need the weather tool.<|end|>" +
  '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Oslo"}<|call|>';
const ANALYSIS = "<|channel|>analysis<|message|>Need a tool.<|end|><|start|>assistant";
// tools whose arguments a random model can finish (enums), for the grammar-made calls
const CITY_WEATHER: OpenAI.Chat.ChatCompletionTool = {
  type: "function",
  function: { name: "get_weather", parameters: { type: "object", properties: { city: { enum: ["Oslo", "Paris"] } }, required: ["city"], additionalProperties: false } },
};
const TIME: OpenAI.Chat.ChatCompletionTool = {
  type: "function",
  function: { name: "get_time", parameters: { type: "object", properties: { tz: { enum: ["UTC", "CET"] } }, required: ["tz"], additionalProperties: false } },
};

/** Checks a call against CITY_WEATHER's or TIME's schema by hand: its one property, a value of the enum. */
function assertValidCall(name: string, args: string): void {
  const want: Record<string, [string, string[]]> = { get_weather: ["city", ["Oslo", "Paris"]], get_time: ["tz", ["UTC", "CET"]] };
  assert.ok(name in want, `a call to ${name}`);
  const [key, values] = want[name]!;
  const parsed = JSON.parse(args) as Record<string, unknown>;
  assert.deepEqual(Object.keys(parsed), [key], args);
  assert.ok(values.includes(parsed[key] as string), args);
}

const ANSWER_REPLY = "<|channel|>analysis<|message|>It rains.<|end|><|start|>assistant<|channel|>final<|message|>Rainy, 3 °C.<|return|>";

describe("kiln serve gpt-oss in Harmony format (openai_gptoss / openai parsers)", () => {
  let server: KilnServer;
  let client: OpenAI;
  before(async () => {
    const procs = tempPath("harmony-procs");
    fs.mkdirSync(procs, { recursive: true });
    fs.writeFileSync(path.join(procs, "script.mjs"), SCRIPT_PROCESSOR);
    const model = tinyModelDir("GptOssForCausalLM", { tokenizerDir: GPTOSS_TOKENIZER, dtype: "bfloat16" });
    server = await startKiln(
      [
        "--max-model-len", "512", "--enforce-eager", "--max-num-seqs", "4", "--logits-processors", `${path.join(procs, "script.mjs")}`,
        "--reasoning-parser", "openai_gptoss", "--enable-auto-tool-choice", "--tool-call-parser", "openai",
      ],
      model,
    );
    client = server.client();
  });
  after(async () => {
    assert.equal(await server.stop(), 0);
  });

  const scripted = (reply: string, tail = "") => ({ vllm_xargs: { script: encode(reply + tail) } });

  /** A streamed chat reply's tool calls (name and joined arguments), finish reason and content. */
  async function streamCalls(request: object) {
    const stream = await client.chat.completions.create(request as OpenAI.Chat.ChatCompletionCreateParamsStreaming);
    const calls: { name: string; args: string }[] = [];
    let finish: string | null = null;
    let content = "";
    for await (const chunk of stream) {
      for (const c of chunk.choices[0]?.delta.tool_calls ?? []) {
        if (c.id !== undefined) calls[c.index] = { name: c.function!.name!, args: c.function!.arguments ?? "" };
        else calls[c.index]!.args += c.function!.arguments ?? "";
      }
      content += chunk.choices[0]?.delta.content ?? "";
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    return { calls, finish, content };
  }

  it("renders the Harmony prompt and reads a tool call; generation stops at <|call|>", { timeout: 60_000 }, async () => {
    const r = await client.chat.completions.create({
      model: server.model,
      messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Weather in Oslo?" }],
      tools: [WEATHER],
      reasoning_effort: "low",
      max_tokens: 100,
      ...scripted(CALL_REPLY, "<|start|>assistant<|channel|>final<|message|>never<|return|>"),
      return_token_ids: true,
    } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    const prompt =
      "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n" +
      `Current date: ${harmonyDate()}\n\nReasoning: low\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.\n` +
      "Calls to these tools must go to the commentary channel: 'functions'.<|end|>" +
      "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n// Weather in a city.\n" +
      "type get_weather = (_: {\ncity: string,\n}) => any;\n\n} // namespace functions<|end|>" +
      "<|start|>user<|message|>Weather in Oslo?<|end|><|start|>assistant";
    const body = r as unknown as { prompt_token_ids: number[]; choices: { token_ids: number[] }[] };
    assert.deepEqual(body.prompt_token_ids, encode(prompt));
    const choice = r.choices[0]!;
    assert.equal(choice.finish_reason, "tool_calls");
    const message = choice.message as OpenAI.Chat.ChatCompletionMessage & { reasoning_content: string; reasoning: string };
    assert.equal(message.reasoning_content, "Need the weather tool.");
    assert.equal(message.reasoning, "Need the weather tool.");
    assert.equal(message.content, null);
    const calls = message.tool_calls as OpenAI.Chat.ChatCompletionMessageFunctionToolCall[];
    assert.deepEqual(calls.map((c) => [c.type, c.function.name, c.function.arguments]), [["function", "get_weather", '{"city": "Oslo"}']]);
    // the engine stopped at <|call|>: the script's tokens after it were never sampled
    assert.deepEqual(body.choices[0]!.token_ids, encode(CALL_REPLY));
    assert.equal(r.usage!.completion_tokens, encode(CALL_REPLY).length);
  });

  it("continues with the tool's result: an answer in final, reasoning apart; streamed the same", { timeout: 60_000 }, async () => {
    const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [
      { role: "user", content: "Weather in Oslo?" },
      { role: "assistant", content: null, tool_calls: [{ id: "call_7", type: "function", function: { name: "get_weather", arguments: '{"city":"Oslo"}' } }] },
      { role: "tool", tool_call_id: "call_7", content: "rain, 3 C" },
    ];
    const request = { model: server.model, messages, tools: [WEATHER], max_tokens: 100, ...scripted(ANSWER_REPLY), return_token_ids: true };
    const r = await client.chat.completions.create(request as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    const tail =
      '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Oslo"}<|call|>' +
      "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>rain, 3 C<|end|><|start|>assistant";
    const promptIds = (r as unknown as { prompt_token_ids: number[] }).prompt_token_ids;
    assert.deepEqual(promptIds.slice(-encode(tail).length), encode(tail));
    const m = r.choices[0]!.message as OpenAI.Chat.ChatCompletionMessage & { reasoning_content: string };
    assert.deepEqual([m.reasoning_content, m.content, m.tool_calls, r.choices[0]!.finish_reason], ["It rains.", "Rainy, 3 °C.", [], "stop"]);

    const stream = await client.chat.completions.create({ ...request, stream: true } as OpenAI.Chat.ChatCompletionCreateParamsStreaming);
    let content = "";
    let reasoning = "";
    let finish: string | null = null;
    for await (const chunk of stream) {
      const d = chunk.choices[0]?.delta as { content?: string; reasoning_content?: string } | undefined;
      content += d?.content ?? "";
      reasoning += d?.reasoning_content ?? "";
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.deepEqual([reasoning, content, finish], ["It rains.", "Rainy, 3 °C.", "stop"]);
  });

  it("streams a tool call: its id and name first, then the arguments; finish_reason tool_calls", { timeout: 60_000 }, async () => {
    const stream = await client.chat.completions.create({
      model: server.model,
      messages: [{ role: "user", content: "Weather in Oslo?" }],
      tools: [WEATHER],
      max_tokens: 100,
      stream: true,
      ...scripted(CALL_REPLY),
    } as OpenAI.Chat.ChatCompletionCreateParamsStreaming);
    const calls: { id: string; name: string; args: string }[] = [];
    let finish: string | null = null;
    for await (const chunk of stream) {
      for (const c of chunk.choices[0]?.delta.tool_calls ?? []) {
        if (c.id !== undefined) calls[c.index] = { id: c.id, name: c.function!.name!, args: c.function!.arguments ?? "" };
        else calls[c.index]!.args += c.function!.arguments ?? "";
      }
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(calls.length, 1);
    assert.equal(calls[0]!.name, "get_weather");
    assert.equal(calls[0]!.args, '{"city":"Oslo"}');
    assert.equal(finish, "tool_calls");
  });

  it("/v1/responses: reasoning, function_call and message items from the channels", { timeout: 60_000 }, async () => {
    const tools: OpenAI.Responses.Tool[] = [{ type: "function", name: "get_weather", description: "Weather in a city.", parameters: WEATHER.function.parameters!, strict: false }];
    const a = await client.responses.create({ model: server.model, input: "Weather in Oslo?", tools, reasoning: { effort: "high" }, ...scripted(CALL_REPLY) } as OpenAI.Responses.ResponseCreateParamsNonStreaming);
    assert.deepEqual(a.output.map((o) => o.type), ["reasoning", "function_call"]);
    const call = a.output[1] as OpenAI.Responses.ResponseFunctionToolCall;
    assert.deepEqual([call.name, call.arguments], ["get_weather", '{"city":"Oslo"}']);
    assert.equal(a.usage!.output_tokens_details.reasoning_tokens, encode("Need the weather tool.").length);
    const b = await client.responses.create({
      model: server.model,
      previous_response_id: a.id,
      input: [{ type: "function_call_output", call_id: call.call_id, output: "rain, 3 C" }],
      tools,
      ...scripted(ANSWER_REPLY),
    } as OpenAI.Responses.ResponseCreateParamsNonStreaming);
    assert.deepEqual(b.output.map((o) => o.type), ["reasoning", "message"]);
    assert.equal(b.output_text, "Rainy, 3 °C.");

    // streamed: the same items, the reasoning and the call's arguments as deltas
    const events = await client.responses.create({ model: server.model, input: "Weather in Oslo?", tools, stream: true, ...scripted(CALL_REPLY) } as OpenAI.Responses.ResponseCreateParamsStreaming);
    let reasoning = "";
    let args = "";
    let done: OpenAI.Responses.Response | null = null;
    for await (const e of events) {
      if (e.type === "response.reasoning_text.delta") reasoning += e.delta;
      if (e.type === "response.function_call_arguments.delta") args += e.delta;
      if (e.type === "response.completed") done = e.response;
    }
    assert.equal(reasoning, "Need the weather tool.");
    assert.equal(args, '{"city":"Oslo"}');
    assert.deepEqual(done!.output.map((o) => o.type), ["reasoning", "function_call"]);
    assert.equal((done!.output[1] as OpenAI.Responses.ResponseFunctionToolCall).name, "get_weather");
  });

  it("structured output constrains the final channel only: the reasoning runs free, the answer follows the schema", { timeout: 60_000 }, async () => {
    // the script forces the analysis message and the final channel's header; the grammar takes over after <|message|>
    const schema = { type: "object", properties: { answer: { enum: ["yes", "no"] } }, required: ["answer"], additionalProperties: false };
    const r = await client.chat.completions.create({
      model: server.model,
      messages: [{ role: "user", content: "Is it raining?" }],
      max_tokens: 60,
      temperature: 0,
      structured_outputs: { json: schema, disable_any_whitespace: true },
      ...scripted("<|channel|>analysis<|message|>It rains.<|end|><|start|>assistant<|channel|>final<|message|>"),
    } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    const choice = r.choices[0]!;
    assert.equal((choice.message as { reasoning_content?: string }).reasoning_content, "It rains.");
    const answer = JSON.parse(choice.message.content ?? "null") as Record<string, unknown>;
    assert.deepEqual(Object.keys(answer), ["answer"], JSON.stringify(choice.message));
    assert.ok(answer.answer === "yes" || answer.answer === "no");
    assert.equal(choice.finish_reason, "stop", "the grammar's end takes <|return|>");
  });

  it("tool_choice required: a reply scripted to answer in final is made a call of a given tool, its arguments on the schema; streamed the same", { timeout: 90_000 }, async () => {
    // the script writes the analysis and tries a final answer; the grammar refuses <|message|> after
    // <|channel|>final, the script stops there and the random model goes on inside the grammar
    const request = {
      model: server.model,
      messages: [{ role: "user", content: "Weather in Oslo?" }],
      tools: [CITY_WEATHER, TIME],
      tool_choice: "required",
      max_tokens: 80,
      temperature: 0,
      structured_outputs: { disable_any_whitespace: true }, // (a random model would write whitespace forever)
      ...scripted(`${ANALYSIS}<|channel|>final<|message|>Sunny.<|return|>`),
    };
    const r = await client.chat.completions.create(request as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    const choice = r.choices[0]!;
    const message = choice.message as OpenAI.Chat.ChatCompletionMessage & { reasoning_content: string };
    assert.equal(choice.finish_reason, "tool_calls", JSON.stringify(choice));
    assert.equal(message.reasoning_content, "Need a tool.");
    assert.equal(message.content, null);
    const calls = message.tool_calls as OpenAI.Chat.ChatCompletionMessageFunctionToolCall[];
    assert.equal(calls.length, 1);
    assertValidCall(calls[0]!.function.name, calls[0]!.function.arguments);

    const streamed = await streamCalls({ ...request, stream: true });
    assert.deepEqual(streamed, { calls: [{ name: calls[0]!.function.name, args: calls[0]!.function.arguments }], finish: "tool_calls", content: "" });
  });

  it("named tool_choice: the call is to that function, even where the script names another; streamed the same", { timeout: 90_000 }, async () => {
    const request = {
      model: server.model,
      messages: [{ role: "user", content: "Time?" }],
      tools: [CITY_WEATHER, TIME],
      tool_choice: { type: "function", function: { name: "get_time" } },
      max_tokens: 80,
      temperature: 0,
      structured_outputs: { disable_any_whitespace: true }, // (a random model would write whitespace forever)
      ...scripted(`${ANALYSIS}<|channel|>commentary to=functions.get_weather json<|message|>{"city":"Oslo"}<|call|>`),
    };
    const r = await client.chat.completions.create(request as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    const choice = r.choices[0]!;
    assert.equal(choice.finish_reason, "tool_calls", JSON.stringify(choice));
    const calls = choice.message.tool_calls as OpenAI.Chat.ChatCompletionMessageFunctionToolCall[];
    assert.deepEqual(calls.map((c) => c.function.name), ["get_time"]);
    assertValidCall("get_time", calls[0]!.function.arguments);
    const streamed = await streamCalls({ ...request, stream: true });
    assert.deepEqual(streamed, { calls: [{ name: "get_time", args: calls[0]!.function.arguments }], finish: "tool_calls", content: "" });
  });

  it("/v1/responses: tool_choice required and a named function give one function_call item on the schema", { timeout: 90_000 }, async () => {
    const tools: OpenAI.Responses.Tool[] = [CITY_WEATHER, TIME].map((t) => ({ type: "function", name: t.function.name, parameters: t.function.parameters!, strict: true }));
    for (const tool_choice of ["required", { type: "function", name: "get_time" }] as const) {
      const a = await client.responses.create({
        model: server.model,
        input: "Weather in Oslo?",
        tools,
        tool_choice,
        max_output_tokens: 80,
        temperature: 0,
        structured_outputs: { disable_any_whitespace: true },
        ...scripted(`${ANALYSIS}<|channel|>final<|message|>Sunny.<|return|>`),
      } as OpenAI.Responses.ResponseCreateParamsNonStreaming);
      assert.deepEqual(a.output.map((o) => o.type), ["reasoning", "function_call"], JSON.stringify(a.output));
      const call = a.output[1] as OpenAI.Responses.ResponseFunctionToolCall;
      if (tool_choice !== "required") assert.equal(call.name, "get_time");
      assertValidCall(call.name, call.arguments);
    }
  });

  it("refuses what Harmony serving cannot do, as OpenAI errors (vLLM's messages for tool_choice)", { timeout: 30_000 }, async () => {
    const base = { model: server.model, messages: [{ role: "user", content: "x" }], max_tokens: 4 };
    for (const [extra, param, message] of [
      [{ reasoning_effort: "none" }, "reasoning_effort", /not supported by Harmony/],
      [{ tool_choice: "required" }, "tool_choice", /^When using `tool_choice`, `tools` must be set\.$/],
      [{ tools: [WEATHER], tool_choice: { type: "function", function: { name: "lookup" } } }, "tool_choice", /^Tool 'lookup' has not been passed in `tools`\.$/],
    ] as const) {
      const r = await postRaw(server.url, "/v1/chat/completions", { ...base, ...extra });
      assert.equal(r.status, 400, JSON.stringify(r.body));
      assertErrorBody(r.body, { type: "invalid_request_error", param, message });
    }
  });
});
