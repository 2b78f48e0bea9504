// POST /invocations (vLLM's SageMaker route): a body goes to the endpoint whose request it is, by its shape, among the
// endpoints the served model answers; streaming goes through; a body of no known shape is OpenAI's 400.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import type { Stream } from "openai/streaming";
import { MODEL, startTestServer, type TestServer } from "./helpers.js";

async function post(s: TestServer, path: string, body: unknown, contentType = "application/json") {
  const res = await fetch(`${s.url}${path}`, { method: "POST", headers: { "content-type": contentType }, body: typeof body === "string" ? body : JSON.stringify(body) });
  return { status: res.status, body: (await res.json()) as any };
}

/** The response without what differs between two calls (id, created). */
const stable = (r: any) => ({ ...r, id: undefined, created: undefined });

describe("POST /invocations on a generating model", () => {
  let s: TestServer;
  let root: OpenAI; // the official client at the server root: /invocations is not under /v1
  before(async () => {
    s = await startTestServer();
    root = new OpenAI({ baseURL: s.url, apiKey: "unused", maxRetries: 0 });
  });
  after(() => s.close());

  const chat = { model: MODEL, messages: [{ role: "user", content: "hello there" }], max_tokens: 6, temperature: 0, ignore_eos: true };
  const completion = { model: MODEL, prompt: "once upon", max_tokens: 6, temperature: 0, ignore_eos: true };

  it("a body with messages is a chat completion, the same as /v1/chat/completions answers it", async () => {
    const direct = await post(s, "/v1/chat/completions", chat);
    const via = await post(s, "/invocations", chat);
    assert.equal(via.status, 200);
    assert.equal(via.body.object, "chat.completion");
    assert.match(via.body.id, /^chatcmpl-/);
    assert.deepEqual(stable(via.body), stable(direct.body));
  });

  it("a body with prompt is a completion, the same as /v1/completions answers it", async () => {
    const direct = await post(s, "/v1/completions", completion);
    const via = await post(s, "/invocations", completion);
    assert.equal(via.status, 200);
    assert.equal(via.body.object, "text_completion");
    assert.deepEqual(stable(via.body), stable(direct.body));
  });

  it("chat comes first: a body with both messages and prompt is a chat completion (vLLM's order)", async () => {
    const r = await post(s, "/invocations", { ...chat, prompt: "ignored" });
    assert.equal(r.status, 200);
    assert.equal(r.body.object, "chat.completion");
  });

  it("streams chat and completions through the official client", async () => {
    const plainChat = (await post(s, "/v1/chat/completions", chat)).body.choices[0].message.content as string;
    const chatStream = await root.post<Stream<OpenAI.ChatCompletionChunk>>("/invocations", { body: { ...chat, stream: true }, stream: true });
    let content = "";
    let finish: string | null = null;
    for await (const chunk of chatStream) {
      assert.equal(chunk.object, "chat.completion.chunk");
      content += chunk.choices[0]?.delta.content ?? "";
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(content, plainChat);
    assert.equal(finish, "length");

    const plainText = (await post(s, "/v1/completions", completion)).body.choices[0].text as string;
    const textStream = await root.post<Stream<OpenAI.Completion>>("/invocations", {
      body: { ...completion, stream: true, stream_options: { include_usage: true } }, stream: true,
    });
    let text = "";
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of textStream) {
      text += chunk.choices[0]?.text ?? "";
      usage = chunk.usage ?? usage;
    }
    assert.equal(text, plainText);
    assert.equal(usage?.completion_tokens, 6);
  });

  it("a body of no known shape is a 400 naming the request types the model takes", async () => {
    for (const body of [{ model: MODEL, input: "embed me" }, { model: MODEL }, { messages: null, prompt: null }, [chat], "\"text\""]) {
      const r = await post(s, "/invocations", body);
      assert.equal(r.status, 400, JSON.stringify(body));
      assert.deepEqual(r.body, {
        error: {
          message: "Cannot find suitable handler for request. Expected one of: ['ChatCompletionRequest', 'CompletionRequest']",
          type: "invalid_request_error", param: null, code: null,
        },
      });
    }
  });

  it("the endpoint's own errors come back as they would from it", async () => {
    const bad = await post(s, "/invocations", { ...chat, temperature: "hot" });
    assert.equal(bad.status, 400);
    assert.equal(bad.body.error.param, "temperature");
    const unknown = await post(s, "/invocations", { ...completion, model: "nope" });
    assert.equal(unknown.status, 404);
    assert.equal(unknown.body.error.type, "not_found_error");
    const malformed = await post(s, "/invocations", "{not json");
    assert.equal(malformed.status, 400);
    assert.equal(malformed.body.error.code, "invalid_json");
    const notJson = await post(s, "/invocations", "<prompt>x</prompt>", "application/xml");
    assert.equal(notJson.status, 415);
    assert.equal(notJson.body.error.code, "unsupported_media_type");
  });
});

describe("POST /invocations on pooling models", () => {
  let embed: TestServer;
  let classify: TestServer;
  before(async () => {
    embed = await startTestServer({ runner: "pooling" }, { pooling: { task: "embed" } });
    classify = await startTestServer({ runner: "pooling" }, { pooling: { task: "classify", labels: ["neg", "pos"] } });
  });
  after(async () => {
    await embed.close();
    await classify.close();
  });

  it("an embedding model: input and messages embed, text_1/text_2 score, query/documents rerank", async () => {
    const input = { model: MODEL, input: ["a river", "the sea"] };
    const direct = await post(embed, "/v1/embeddings", input);
    const via = await post(embed, "/invocations", input);
    assert.equal(via.status, 200);
    assert.deepEqual(stable(via.body), stable(direct.body));
    assert.equal(via.body.data[0].object, "embedding");

    const chatForm = await post(embed, "/invocations", { model: MODEL, messages: [{ role: "user", content: "hi" }] });
    assert.equal(chatForm.status, 200);
    assert.equal(chatForm.body.data[0].object, "embedding", "EmbeddingRequest comes before PoolingRequest");

    const score = await post(embed, "/invocations", { model: MODEL, text_1: "a river", text_2: ["the sea", "a river"] });
    assert.equal(score.status, 200);
    assert.deepEqual(score.body.data.map((d: any) => d.object), ["score", "score"]);
    assert.ok(Math.abs(score.body.data[1].score - 1) < 1e-6, "a text scores 1 against itself");
    // vLLM's newer names for the two sides score the same, on /score and through /invocations
    for (const [first, second] of [["queries", "documents"], ["queries", "items"], ["data_1", "data_2"]]) {
      for (const path of ["/score", "/v1/score", "/invocations"]) {
        const renamed = await post(embed, path, { model: MODEL, [first]: "a river", [second]: ["the sea", "a river"] });
        assert.equal(renamed.status, 200, `${path} ${first}/${second}: ${JSON.stringify(renamed.body)}`);
        assert.deepEqual(renamed.body.data, score.body.data, `${path} ${first}/${second}`);
      }
    }
    const half = await post(embed, "/score", { model: MODEL, queries: "a river" });
    assert.equal(half.status, 400);
    assert.equal(half.body.error.param, "documents");

    const rerank = await post(embed, "/invocations", { model: MODEL, query: "a river", documents: ["the sea", "a river"] });
    assert.equal(rerank.status, 200);
    assert.equal(rerank.body.results[0].index, 1, "the identical document ranks first");

    const prompt = await post(embed, "/invocations", { model: MODEL, prompt: "generate" });
    assert.equal(prompt.status, 400);
    assert.equal(prompt.body.error.message,
      "Cannot find suitable handler for request. Expected one of: ['EmbeddingRequest', 'ScoreRequest', 'RerankRequest', 'PoolingRequest']");
  });

  it("a two-label classifier: input classifies; pairs are not scored (scoring needs one label)", async () => {
    const input = { model: MODEL, input: "good stuff" };
    const direct = await post(classify, "/classify", input);
    const via = await post(classify, "/invocations", input);
    assert.equal(via.status, 200);
    assert.deepEqual(stable(via.body), stable(direct.body));
    assert.ok(["neg", "pos"].includes(via.body.data[0].label));
    const pair = await post(classify, "/invocations", { model: MODEL, text_1: "a", text_2: "b" });
    assert.equal(pair.status, 400);
    assert.equal(pair.body.error.message, "Cannot find suitable handler for request. Expected one of: ['ClassificationRequest', 'PoolingRequest']");
  });
});
