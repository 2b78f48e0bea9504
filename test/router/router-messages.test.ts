// Anthropic's Messages API through the router: POST /v1/messages and /v1/messages/count_tokens are proxied (routing
// text from the system prompt and the content blocks: a conversation's next turn sticks to the worker of its
// previous one; counting is balanced by load), streamed through, and the router's own errors on those paths are
// Anthropic's error object. Then the official client (@anthropic-ai/sdk) against a router in front of two Kiln servers
// over the fake engine.
import assert from "node:assert/strict";
import { after, describe, it } from "node:test";
import Anthropic from "@anthropic-ai/sdk";
import { createRouter, type Router } from "../../src/router/index.js";
import type { RouterConfig } from "../../src/router/router-config.js";
import { anthropicMessagesText, routingText } from "../../src/router/request-text.js";
import { cleanedUp, deadUrl, heldStream, startFakeWorker } from "./fake-worker.js";
import { startTestServer, type TestServer } from "../server/helpers.js";

const { routers, workers } = cleanedUp<Router>();

async function router(workerUrls: string[], options: Partial<RouterConfig> = {}): Promise<string> {
  const r = createRouter({ workerUrls, port: 0, healthCheckIntervalMs: 60_000, logLevel: "critical", ...options }, { log: () => {} });
  routers.push(r);
  return r.listen();
}

async function post(url: string, body: string, headers: Record<string, string> = {}) {
  const res = await fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body });
  return { status: res.status, headers: res.headers, body: await res.text() };
}

/** Anthropic's error object with exactly its keys. */
function assertAnthropicError(text: string, type: string, message: RegExp): void {
  const body = JSON.parse(text) as { type: string; error: { type: string; message: string } };
  assert.deepEqual(Object.keys(body).sort(), ["error", "type"]);
  assert.equal(body.type, "error");
  assert.deepEqual(Object.keys(body.error).sort(), ["message", "type"]);
  assert.equal(body.error.type, type);
  assert.match(body.error.message, message);
}

const SYSTEM = "You are a terse assistant who answers questions about the history of the Hanseatic League. ".repeat(4);

describe("routing text of a Messages request", () => {
  it("the system prompt (string or text blocks) and every content block; the next turn extends the text", () => {
    const turn1 = { system: "Be brief.", messages: [{ role: "user", content: "Hi" }] };
    assert.equal(routingText("/v1/messages", turn1), "system\nBe brief.\nuser\nHi\n");
    const blocks = { system: [{ type: "text", text: "Be " }, { type: "text", text: "brief." }], messages: [{ role: "user", content: [{ type: "text", text: "Hi" }] }] };
    assert.equal(routingText("/v1/messages", blocks), "system\nBe brief.\nuser\nHi\n", "blocks read as the string");
    const turn2 = {
      ...turn1,
      messages: [
        ...turn1.messages,
        { role: "assistant", content: [{ type: "thinking", thinking: "hm", signature: "" }, { type: "tool_use", id: "t1", name: "w", input: { city: "Lübeck" } }] },
        { role: "user", content: [{ type: "tool_result", tool_use_id: "t1", content: [{ type: "text", text: "rain" }] }, { type: "image", source: {} }] },
      ],
    };
    const t2 = anthropicMessagesText(turn2);
    assert.equal(t2, 'system\nBe brief.\nuser\nHi\nassistant\nhm{"name":"w","input":{"city":"Lübeck"}}\nuser\nrain[image]\n');
    assert.ok(t2.startsWith(routingText("/v1/messages", turn1)));
    assert.equal(routingText("/v1/messages", { messages: [{ role: "user", content: "Hi" }] }), "user\nHi\n", "no system prompt");
    assert.equal(routingText("/v1/messages/count_tokens", turn1), "", "counting is routed by load");
  });
});

describe("the router in front of Messages workers (fake workers)", () => {
  it("POST /v1/messages is forwarded byte for byte with Anthropic's headers; a conversation sticks to one worker", async () => {
    const ws = await Promise.all([startFakeWorker("w0"), startFakeWorker("w1")]);
    workers.push(...ws);
    const url = await router(ws.map((w) => w.url), { policy: "cache_aware" });
    const first = JSON.stringify({ model: "tiny", max_tokens: 8, system: SYSTEM, messages: [{ role: "user", content: "When was it founded?" }] });
    const a = await post(`${url}/v1/messages`, first, { "x-api-key": "k", "anthropic-version": "2023-06-01" });
    assert.equal(a.status, 200);
    const worker = a.headers.get("x-kiln-worker")!;
    const held = ws.find((w) => w.url === worker)!;
    assert.equal(held.seen.at(-1)!.body, first);
    assert.equal(held.seen.at(-1)!.path, "/v1/messages");
    assert.equal(held.seen.at(-1)!.headers["x-api-key"], "k");
    assert.equal(held.seen.at(-1)!.headers["anthropic-version"], "2023-06-01");
    const next = JSON.stringify({
      model: "tiny", max_tokens: 8, system: SYSTEM,
      messages: [{ role: "user", content: "When was it founded?" }, { role: "assistant", content: "1356." }, { role: "user", content: [{ type: "text", text: "By whom?" }] }],
    });
    for (let i = 0; i < 3; i++) {
      const b = await post(`${url}/v1/messages`, next);
      assert.equal(b.headers.get("x-kiln-worker"), worker, `turn ${i + 2} follows its prefix`);
      assert.equal(b.headers.get("x-kiln-routing"), "cache_hit");
    }
    const other = await post(`${url}/v1/messages`, JSON.stringify({ model: "tiny", max_tokens: 8, system: "Another, unrelated system prompt for a new conversation. ".repeat(4), messages: [{ role: "user", content: "?" }] }));
    assert.notEqual(other.headers.get("x-kiln-worker"), worker, "a new prefix goes to the emptier tree");
    const counted = await post(`${url}/v1/messages/count_tokens`, first);
    assert.equal(counted.status, 200);
    assert.equal(ws.flatMap((w) => w.seen).at(-1)!.path, "/v1/messages/count_tokens");
  });

  it("a streamed Messages reply reaches the client event by event", async () => {
    const [w] = await Promise.all([startFakeWorker("w0")]);
    workers.push(w!);
    const { handler, release } = heldStream('event: message_start\ndata: {"type":"message_start"}\n\n', 'event: message_stop\ndata: {"type":"message_stop"}\n\n');
    w!.handler = handler;
    const url = await router([w!.url]);
    const res = await fetch(`${url}/v1/messages`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "tiny", max_tokens: 4, stream: true, messages: [] }) });
    assert.equal(res.headers.get("content-type"), "text/event-stream");
    const reader = res.body!.getReader();
    const first = new TextDecoder().decode((await reader.read()).value);
    assert.match(first, /message_start/, "the first event arrives before the worker writes the next");
    release();
    let rest = "";
    for (let r = await reader.read(); !r.done; r = await reader.read()) rest += new TextDecoder().decode(r.value);
    assert.match(rest, /message_stop/);
  });

  it("the router's own errors on /v1/messages* are Anthropic's object; elsewhere OpenAI's", async () => {
    const [w] = await Promise.all([startFakeWorker("w0")]);
    workers.push(w!);
    const url = await router([w!.url]);
    const bad = await post(`${url}/v1/messages`, "{not json");
    assert.equal(bad.status, 400);
    assertAnthropicError(bad.body, "invalid_request_error", /Malformed JSON body/);
    assert.equal(w!.seen.length, 0, "no worker saw it");
    const unknown = await fetch(`${url}/v1/messages/batches`, { method: "POST" });
    assert.equal(unknown.status, 404);
    assertAnthropicError(await unknown.text(), "not_found_error", /Route POST \/v1\/messages\/batches not found/);
    const openai = await post(`${url}/v1/chat/completions`, "{not json");
    assert.equal((JSON.parse(openai.body) as { error: { type: string } }).error.type, "invalid_request_error");
    assert.equal((JSON.parse(openai.body) as { type?: string }).type, undefined, "OpenAI's shape on the OpenAI routes");

    const down = await router([await deadUrl()], { maxRetries: 0 });
    const none = await post(`${down}/v1/messages`, JSON.stringify({ model: "tiny", max_tokens: 4, messages: [] }));
    assert.equal(none.status, 503);
    assertAnthropicError(none.body, "overloaded_error", /No healthy worker/);
    const count = await post(`${down}/v1/messages/count_tokens`, JSON.stringify({ model: "tiny", messages: [] }));
    assertAnthropicError(count.body, "overloaded_error", /No healthy worker/);
  });
});

describe("@anthropic-ai/sdk through the router to Kiln servers (fake engine)", () => {
  const servers: TestServer[] = [];
  after(async () => {
    await Promise.all(servers.map((s) => s.close()));
  });

  it("create, stream and countTokens answer as the server does directly; a no-worker failure is the SDK's typed error", async () => {
    servers.push(await startTestServer(), await startTestServer());
    const url = await router(servers.map((s) => s.url));
    const via = new Anthropic({ baseURL: url, apiKey: "unused", maxRetries: 0 });
    const direct = new Anthropic({ baseURL: servers[0]!.url, apiKey: "unused", maxRetries: 0 });
    const params = { model: "kiln-test", max_tokens: 12, temperature: 0, system: "Be terse.", messages: [{ role: "user" as const, content: "Tell me about Lübeck." }] };
    const [routed, straight] = await Promise.all([via.messages.create(params), direct.messages.create(params)]);
    assert.equal(routed.type, "message");
    assert.deepEqual(routed.content, straight.content, "the fake engine answers the same prompt the same way on any worker");
    assert.equal(routed.usage.input_tokens, straight.usage.input_tokens);
    const stream = via.messages.stream(params);
    const events: string[] = [];
    for await (const e of stream) events.push(e.type);
    assert.equal(events[0], "message_start");
    assert.equal(events.at(-1), "message_stop");
    assert.deepEqual((await stream.finalMessage()).content, straight.content);
    const [n, m] = await Promise.all([via.messages.countTokens(params), direct.messages.countTokens(params)]);
    assert.equal(n.input_tokens, m.input_tokens);

    const down = new Anthropic({ baseURL: await router([await deadUrl()]), apiKey: "unused", maxRetries: 0 });
    await assert.rejects(down.messages.create(params), (e: unknown) => {
      assert.ok(e instanceof Anthropic.APIError);
      assert.equal(e.status, 503);
      assert.equal((e.error as { error: { type: string } }).error.type, "overloaded_error");
      return true;
    });
  });
});
