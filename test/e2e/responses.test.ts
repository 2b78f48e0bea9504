// POST /v1/responses end to end through the official `openai` client against a real `kiln serve` on a tiny random
// Llama, checked against the chat completions endpoint (an independent path over the same engine) and /tokenize:
// greedy text, usage, streamed events, text.format, tool calls and their follow-up turns, previous_response_id.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type OpenAI from "openai";
import { assertErrorBody, postRaw, startKiln, type KilnServer } from "./kiln-process.js";
import { api, checkWeather, final, TOOL_TEMPLATE, USER, WEATHER, withoutIds } from "./responses-client.js";

describe("POST /v1/responses (e2e)", () => {
  let server: KilnServer;
  let r: ReturnType<typeof api>;
  before(async () => {
    server = await startKiln(["--trust-request-chat-template"]);
    r = api(server);
  });
  after(async () => {
    assert.equal(await server.stop(), 0);
  });

  it("greedy output equals chat completions' for the same messages; usage counts the chat template's tokens", async () => {
    const messages = [
      { role: "system", content: "Answer briefly." },
      { role: "user", content: USER },
    ];
    const greedy = { max_output_tokens: 10, temperature: 0, ignore_eos: true };
    const a = await r.create({
      instructions: "Answer briefly.",
      input: [{ role: "user", content: [{ type: "input_text", text: USER }] }],
      ...greedy,
      metadata: { run: "1" },
      user: "u1",
    });
    const chat = await r.chat({ messages, max_tokens: 10, temperature: 0, ignore_eos: true });
    assert.equal(a.output_text, chat.choices[0]!.message.content);
    assert.match(a.id, /^resp_[0-9a-f]{32}$/);
    assert.equal(a.object, "response");
    assert.equal(a.model, server.model);
    assert.equal(a.status, "incomplete");
    assert.deepEqual(a.incomplete_details, { reason: "max_output_tokens" });
    assert.equal(a.output.length, 1);
    const m = a.output[0] as OpenAI.Responses.ResponseOutputMessage;
    assert.match(m.id, /^msg_[0-9a-f]{32}$/);
    assert.deepEqual(
      { ...m, id: "" },
      {
        type: "message",
        id: "",
        status: "incomplete",
        role: "assistant",
        content: [{ type: "output_text", text: a.output_text, annotations: [] }],
      },
    );
    const count = await r.promptTokens({ messages });
    assert.equal(count, chat.usage!.prompt_tokens);
    const cached = a.usage!.input_tokens_details.cached_tokens;
    assert.ok(cached >= 0 && cached < count);
    assert.deepEqual(a.usage, {
      input_tokens: count,
      input_tokens_details: { cached_tokens: cached },
      output_tokens: 10,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: count + 10,
    });
    // the request's fields come back
    assert.deepEqual(
      [a.instructions, a.metadata, a.user, a.temperature, a.top_p, a.max_output_tokens],
      ["Answer briefly.", { run: "1" }, "u1", 0, 1, 10],
    );
    assert.deepEqual(
      [a.tools, a.tool_choice, a.text, a.previous_response_id, a.error],
      [[], "auto", { format: { type: "text" } }, null, null],
    );
    // a developer message is read as a system message
    const dev = await r.create({
      input: [
        { type: "message", role: "developer", content: "Answer briefly." },
        { role: "user", content: USER },
      ],
      ...greedy,
    });
    assert.equal(dev.output_text, a.output_text);
  });

  it("a string input is one user message; a reply ended by a stop string is completed", async () => {
    const free = await r.create({ input: USER, max_output_tokens: 16, temperature: 0, ignore_eos: true });
    const stop = free.output_text.slice(6, 8);
    const s = await r.create({ input: USER, max_output_tokens: 16, temperature: 0, ignore_eos: true, stop: [stop] });
    const chat = await r.chat({
      messages: [{ role: "user", content: USER }],
      max_tokens: 16,
      temperature: 0,
      ignore_eos: true,
      stop: [stop],
    });
    assert.equal(s.output_text, chat.choices[0]!.message.content);
    assert.equal(s.output_text, free.output_text.slice(0, free.output_text.indexOf(stop)));
    assert.equal(s.status, "completed");
    assert.equal(s.incomplete_details, null);
    assert.equal((s.output[0] as OpenAI.Responses.ResponseOutputMessage).status, "completed");
  });

  it("reasoning.effort reaches the chat template as reasoning_effort", async () => {
    const chat_template = "{{ reasoning_effort or '' }} effort. {% for m in messages %}{{ m.content }}{% endfor %}";
    const a = await r.create({ input: USER, reasoning: { effort: "high" }, chat_template, max_output_tokens: 1 });
    assert.equal(
      a.usage!.input_tokens,
      await r.promptTokens({
        messages: [{ role: "user", content: USER }],
        chat_template,
        chat_template_kwargs: { reasoning_effort: "high" },
      }),
    );
    assert.notEqual(a.usage!.input_tokens, await r.promptTokens({ messages: [{ role: "user", content: USER }], chat_template }));
    assert.deepEqual(a.reasoning, { effort: "high", summary: null });
  });

  it("streamed: OpenAI's events in order, numbered from 0, whose deltas join to the whole reply's text", async () => {
    const body = { input: USER, max_output_tokens: 12, temperature: 0, ignore_eos: true };
    const whole = await r.create(body);
    const events = await r.events(body);
    const deltas = events.filter((e) => e.type === "response.output_text.delta");
    assert.ok(deltas.length > 1);
    assert.deepEqual(
      events.map((e) => e.type),
      [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        ...deltas.map(() => "response.output_text.delta"),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
      ],
    );
    assert.deepEqual(
      events.map((e) => e.sequence_number),
      events.map((_, i) => i),
    );
    assert.equal(deltas.map((d) => d.delta).join(""), whole.output_text);
    const created = (events[0] as OpenAI.Responses.ResponseCreatedEvent).response;
    assert.equal(created.status, "in_progress");
    assert.deepEqual(created.output, []);
    const done = final(events);
    assert.equal(done.id, created.id);
    assert.equal(done.status, "incomplete");
    assert.deepEqual(withoutIds(done.output), withoutIds(whole.output));
    assert.deepEqual({ ...done.usage, input_tokens_details: null }, { ...whole.usage, input_tokens_details: null });
    const itemId = (events[2] as OpenAI.Responses.ResponseOutputItemAddedEvent).item.id;
    assert.ok(events.slice(3, -2).every((e) => (e as { item_id: string }).item_id === itemId));

    // on the wire: `event:` names each event's type, and no [DONE] closes the stream
    const res = await fetch(`${server.url}/v1/responses`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ ...body, stop: [whole.output_text.slice(4, 6)], stream: true }),
    });
    assert.match(res.headers.get("content-type")!, /^text\/event-stream/);
    const blocks = (await res.text()).split("\n\n").filter((b) => b.length > 0);
    for (const b of blocks) {
      const [event, data] = b.split("\n");
      assert.equal(event, `event: ${(JSON.parse(data!.slice("data: ".length)) as { type: string }).type}`);
    }
    assert.match(blocks.at(-1)!, /^event: response\.completed\n/); // ended by the stop string
  });

  it("include message.output_text.logprobs: chat completions' logprobs for the same request, streamed per delta too", async () => {
    const body = { input: USER, max_output_tokens: 8, temperature: 0, ignore_eos: true, top_logprobs: 3, include: ["message.output_text.logprobs"] };
    const whole = await r.create(body);
    const chat = await r.chat({ messages: [{ role: "user", content: USER }], max_tokens: 8, temperature: 0, ignore_eos: true, logprobs: true, top_logprobs: 3 });
    const text = (whole.output[0] as OpenAI.Responses.ResponseOutputMessage).content[0] as OpenAI.Responses.ResponseOutputText;
    assert.equal(text.logprobs!.length, 8);
    assert.deepEqual(text.logprobs, chat.choices[0]!.logprobs!.content);
    assert.ok(text.logprobs!.every((l) => l.top_logprobs.length === 3 && l.top_logprobs[0]!.token === l.token)); // greedy: the top one
    const events = await r.events(body);
    const deltas = events.filter((e) => e.type === "response.output_text.delta");
    assert.deepEqual(deltas.flatMap((d) => d.logprobs), text.logprobs);
    const done = events.find((e) => e.type === "response.output_text.done")!;
    assert.deepEqual(done.logprobs, text.logprobs);
    assert.deepEqual(((final(events).output[0] as OpenAI.Responses.ResponseOutputMessage).content[0] as OpenAI.Responses.ResponseOutputText).logprobs, text.logprobs);
    // without include, no logprobs; top_logprobs alone and other include items are refused
    assert.equal(((await r.create({ ...body, include: undefined, top_logprobs: undefined })).output[0] as OpenAI.Responses.ResponseOutputMessage).content[0]!.type, "output_text");
    for (const [extra, param] of [[{ include: undefined }, "top_logprobs"], [{ include: ["reasoning.encrypted_content"] }, "include[0]"]] as const) {
      const res = await postRaw(server.url, "/v1/responses", { model: server.model, ...body, ...extra });
      assert.equal(res.status, 400);
      assertErrorBody(res.body, { type: "invalid_request_error", param });
    }
  });

  it("text.format json_schema: the output parses and follows the schema, as chat's response_format gives it", async () => {
    const format = { type: "json_schema", name: "weather", schema: WEATHER, strict: true };
    const sampled = { max_output_tokens: 120, temperature: 1, seed: 5, structured_outputs: { disable_any_whitespace: true } };
    const a = await r.create({ input: USER, text: { format }, ...sampled });
    assert.equal(a.status, "completed");
    checkWeather(JSON.parse(a.output_text));
    assert.deepEqual(a.text, { format });
    const chat = await r.chat({
      messages: [{ role: "user", content: USER }],
      max_tokens: 120,
      temperature: 1,
      seed: 5,
      structured_outputs: { disable_any_whitespace: true },
      response_format: { type: "json_schema", json_schema: { name: "weather", schema: WEATHER, strict: true } },
    });
    assert.equal(a.output_text, chat.choices[0]!.message.content);
    // json_object is chat's json_object
    const short = { max_output_tokens: 12, temperature: 1, seed: 3 };
    const o = await r.create({ input: USER, text: { format: { type: "json_object" } }, ...short });
    const co = await r.chat({
      messages: [{ role: "user", content: USER }],
      max_tokens: 12,
      temperature: 1,
      seed: 3,
      response_format: { type: "json_object" },
    });
    assert.equal(o.output_text, co.choices[0]!.message.content);
    assert.match(o.output_text, /^\s*\{/);
    // a schema the grammar compiler refuses is a 400 naming text.format
    const bad = await postRaw(server.url, "/v1/responses", {
      model: server.model,
      input: "x",
      text: { format: { ...format, schema: { type: "nope" } } },
    });
    assert.equal(bad.status, 400);
    assertErrorBody(bad.body, { type: "invalid_request_error", param: "text.format", message: /Unsupported type "nope"/ });
  });

  const tools = [
    { type: "function", name: "get_weather", description: "The weather in a city", parameters: WEATHER, strict: true },
    {
      type: "function",
      name: "get_time",
      parameters: { type: "object", properties: { zone: { type: "string", enum: ["UTC", "CET"] } }, required: ["zone"] },
    },
  ];
  const chatTools = tools.map(({ name, description, parameters }) => ({
    type: "function",
    function: { name, parameters, ...(description ? { description } : {}) },
  }));

  it("a named tool_choice returns one function_call item with schema-valid arguments (chat's call), streamed the same", async () => {
    const sampled = { max_output_tokens: 120, temperature: 1, seed: 5, structured_outputs: { disable_any_whitespace: true } };
    const body = { input: USER, tools, tool_choice: { type: "function", name: "get_weather" }, ...sampled };
    const a = await r.create(body);
    assert.equal(a.status, "completed");
    assert.equal(a.output_text, "");
    assert.equal(a.output.length, 1);
    const call = a.output[0] as OpenAI.Responses.ResponseFunctionToolCall;
    assert.equal(call.type, "function_call");
    assert.equal(call.name, "get_weather");
    assert.equal(call.status, "completed");
    assert.match(call.id!, /^fc_[0-9a-f]{32}$/);
    assert.match(call.call_id, /^call_[0-9a-f]{32}$/);
    checkWeather(JSON.parse(call.arguments));
    const chat = await r.chat({
      messages: [{ role: "user", content: USER }],
      tools: chatTools,
      tool_choice: { type: "function", function: { name: "get_weather" } },
      max_tokens: 120,
      temperature: 1,
      seed: 5,
      structured_outputs: { disable_any_whitespace: true },
    });
    assert.equal(
      (chat.choices[0]!.message.tool_calls![0] as OpenAI.ChatCompletionMessageFunctionToolCall).function.arguments,
      call.arguments,
    );
    assert.deepEqual(
      a.tools,
      tools.map((t) => ({ description: null, strict: null, ...t })),
    );
    assert.deepEqual(a.tool_choice, { type: "function", name: "get_weather" });

    const events = await r.events(body);
    const args = events.filter((e) => e.type === "response.function_call_arguments.delta");
    assert.deepEqual(
      events.map((e) => e.type),
      [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        ...args.map(() => "response.function_call_arguments.delta"),
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
      ],
    );
    assert.equal(args.map((e) => e.delta).join(""), call.arguments);
    assert.deepEqual(withoutIds(final(events).output), withoutIds(a.output));
  });

  it("previous_response_id continues a stored conversation: the next prompt is the chat API's over both turns", async () => {
    const greedy = { max_output_tokens: 8, temperature: 0, ignore_eos: true };
    const first = await r.create({ instructions: "Be kind.", input: USER, ...greedy });
    // instructions are not carried over (as OpenAI): the conversation is the turns' input and output
    const second = await r.create({ previous_response_id: first.id, input: "And then?", ...greedy });
    const messages = [
      { role: "user", content: USER },
      { role: "assistant", content: first.output_text },
      { role: "user", content: "And then?" },
    ];
    const chat = await r.chat({ messages, max_tokens: 8, temperature: 0, ignore_eos: true });
    assert.equal(second.output_text, chat.choices[0]!.message.content);
    assert.equal(second.usage!.input_tokens, await r.promptTokens({ messages }));
    assert.equal(second.previous_response_id, first.id);
    // stored responses read back; store: false keeps none
    const got = await r.client.responses.retrieve(first.id);
    assert.deepEqual(got.output, first.output);
    assert.equal(got.output_text, first.output_text);
    const unstored = await r.create({ input: USER, store: false, ...greedy });
    assert.equal((unstored as unknown as { store: boolean }).store, false);
    for (const res of [await fetch(`${server.url}/v1/responses/${unstored.id}`), await fetch(`${server.url}/v1/responses/resp_nope`)]) {
      assert.equal(res.status, 404);
      assertErrorBody(await res.json(), { type: "invalid_request_error", code: "response_not_found" });
    }
    const missing = await postRaw(server.url, "/v1/responses", { input: "x", previous_response_id: unstored.id });
    assert.equal(missing.status, 404);
    assertErrorBody(missing.body, { type: "invalid_request_error", param: "previous_response_id", message: /not found/ });
  });

  it("a turn's function_call and function_call_output items make the chat API's tool call and tool message", async () => {
    const called = await r.create({
      input: USER,
      tools,
      tool_choice: "required",
      max_output_tokens: 120,
      temperature: 1,
      seed: 5,
      structured_outputs: { disable_any_whitespace: true },
    });
    const calls = called.output as OpenAI.Responses.ResponseFunctionToolCall[];
    assert.ok(calls.length >= 1 && calls.every((c) => c.type === "function_call"), JSON.stringify(called.output));
    const results = calls.map((c) => ({ type: "function_call_output", call_id: c.call_id, output: `result ${c.name}` }));
    const next = { tools, tool_choice: "none", chat_template: TOOL_TEMPLATE, max_output_tokens: 6, temperature: 0, ignore_eos: true };
    const cont = await r.create({ previous_response_id: called.id, input: results, ...next });
    // the same turns sent whole (the earlier call as an input item) give the same prompt
    const whole = await r.create({ input: [{ role: "user", content: USER }, ...calls, ...results], ...next });
    const messages = [
      { role: "user", content: USER },
      {
        role: "assistant",
        content: null,
        tool_calls: calls.map((c) => ({ id: c.call_id, type: "function", function: { name: c.name, arguments: c.arguments } })),
      },
      ...calls.map((c) => ({ role: "tool", tool_call_id: c.call_id, content: `result ${c.name}` })),
    ];
    const chat = await r.chat({
      messages,
      tools: chatTools,
      tool_choice: "none",
      chat_template: TOOL_TEMPLATE,
      max_tokens: 6,
      temperature: 0,
      ignore_eos: true,
    });
    const count = await r.promptTokens({ messages, chat_template: TOOL_TEMPLATE });
    assert.ok(
      count > (await r.promptTokens({ messages: messages.slice(0, 1), chat_template: TOOL_TEMPLATE })) + 10,
      "the prompt shows the calls",
    );
    for (const x of [cont, whole]) {
      assert.equal(x.output_text, chat.choices[0]!.message.content);
      assert.equal(x.usage!.input_tokens, count);
    }
  });
});
