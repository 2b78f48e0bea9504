// What requests are routed by: the routing text of each API's body (a conversation's next turn extends the previous
// turn's text), worker URL normalization and the Prometheus gauges read from a worker's /metrics.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { routingText } from "../../src/router/request-text.js";
import { normalizeWorkerUrl, readGauge } from "../../src/router/worker-pool.js";

describe("routing text", () => {
  it("chat: role and content per message; the next turn's text extends this turn's", () => {
    const turn1 = [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" }];
    const turn2 = [...turn1, { role: "assistant", content: "Hello!" }, { role: "user", content: "Why?" }];
    assert.equal(routingText("/v1/chat/completions", { messages: turn1 }), "system\nBe brief.\nuser\nHi\n");
    const t2 = routingText("/v1/chat/completions", { messages: turn2 });
    assert.equal(t2, "system\nBe brief.\nuser\nHi\nassistant\nHello!\nuser\nWhy?\n");
    assert.ok(t2.startsWith(routingText("/v1/chat/completions", { messages: turn1 })));
    const parts = { messages: [{ role: "user", content: [{ type: "text", text: "look: " }, { type: "image_url", image_url: { url: "x" } }] }] };
    assert.match(routingText("/v1/chat/completions", parts), /^user\nlook: \[image:[0-9a-f]{16}\]\n$/);
    const tools = { messages: [{ role: "assistant", content: null, tool_calls: [{ id: "1" }] }] };
    assert.equal(routingText("/v1/chat/completions", tools), 'assistant\n[{"id":"1"}]\n');
    assert.equal(routingText("/tokenize", { messages: turn1 }), "system\nBe brief.\nuser\nHi\n");
  });

  it("an image is the hash of its source: the same image gives the same text on every API, another image another", () => {
    const b64 = Buffer.from("some image bytes").toString("base64");
    const chat = (url: string) => routingText("/v1/chat/completions", { messages: [{ role: "user", content: [{ type: "text", text: "What is it?" }, { type: "image_url", image_url: { url } }] }] });
    const a = chat(`data:image/png;base64,${b64}`);
    assert.match(a, /^user\nWhat is it\?\[image:[0-9a-f]{16}\]\n$/);
    assert.notEqual(chat(`data:image/png;base64,${Buffer.from("other bytes").toString("base64")}`), a);
    assert.notEqual(chat("https://example.com/a.png"), a);
    const responses = routingText("/v1/responses", { input: [{ role: "user", content: [{ type: "input_text", text: "What is it?" }, { type: "input_image", image_url: `data:image/png;base64,${b64}` }] }] });
    const messages = routingText("/v1/messages", { messages: [{ role: "user", content: [{ type: "text", text: "What is it?" }, { type: "image", source: { type: "base64", media_type: "image/png", data: b64 } }] }] });
    assert.equal(responses, a);
    assert.equal(messages, a);
  });

  it("completions, embeddings, responses and the rest", () => {
    assert.equal(routingText("/v1/completions", { prompt: "Once upon" }), "Once upon");
    assert.equal(routingText("/v1/completions", { prompt: [1, 2, 3] }), "1,2,3");
    assert.equal(routingText("/v1/completions", { prompt: ["a", "b"] }), "a\nb");
    assert.equal(routingText("/v1/embeddings", { input: "some text" }), "some text");
    assert.equal(routingText("/v1/responses", { instructions: "Be kind.", input: "Hi" }), "system\nBe kind.\nuser\nHi\n");
    assert.equal(routingText("/v1/responses", { input: [{ role: "user", content: [{ type: "input_text", text: "Hi" }] }] }), "user\nHi\n");
    assert.equal(routingText("/rerank", { query: "q", documents: ["d"] }), "q");
    assert.equal(routingText("/detokenize", { tokens: [1, 2] }), "");
    assert.equal(routingText("/v1/completions", null), "");
    assert.equal(routingText("/v1/completions", [1, 2]), "");
  });
});

describe("worker URLs and gauges", () => {
  it("normalizes worker URLs and refuses what is not one", () => {
    assert.equal(normalizeWorkerUrl("http://127.0.0.1:8000/"), "http://127.0.0.1:8000");
    assert.equal(normalizeWorkerUrl("https://host.example/prefix//"), "https://host.example/prefix");
    for (const bad of ["127.0.0.1:8000", "ftp://x", "http://h:1/?q=1", "http://u:p@h:1", "not a url"]) assert.throws(() => normalizeWorkerUrl(bad), bad);
  });

  it("reads a gauge as the sum of its samples, ignoring longer names and comments", () => {
    const text = [
      "# HELP vllm:num_requests_running Number of requests in model execution batches.",
      "# TYPE vllm:num_requests_running gauge",
      'vllm:num_requests_running{model_name="a"} 2',
      'vllm:num_requests_running{model_name="b"} 3',
      "vllm:num_requests_running_total 100",
      "vllm:kv_cache_usage_perc 0.25",
    ].join("\n");
    assert.equal(readGauge(text, "vllm:num_requests_running"), 5);
    assert.equal(readGauge(text, "vllm:kv_cache_usage_perc"), 0.25);
    assert.equal(readGauge(text, "vllm:num_requests_waiting"), null);
  });
});
