// vLLM's --trust-request-chat-template: a request's own chat template (chat_template, or chat_template_kwargs'
// chat_template) is Jinja the server would run, so without the flag every chat-rendering endpoint refuses it with
// vLLM's 400; with it the request's template renders the prompt (checked against the tokenizer's encoding of the text
// the template gives, worked out by hand).
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { Template } from "@huggingface/jinja";
import type { ChatMessage, ChatTemplateOptions } from "../../src/models/tokenizer-types.js";
import { FakeTokenizer } from "./fake-engine.js";
import { MODEL, startTestServer, type TestServer } from "./helpers.js";

/** The fake engine's tokenizer, rendering a given template with Jinja (its own format otherwise). */
class JinjaFakeTokenizer extends FakeTokenizer {
  override applyChatTemplate(messages: ChatMessage[], options: ChatTemplateOptions = {}): string {
    if (options.chatTemplate === undefined) return super.applyChatTemplate(messages, options);
    return new Template(options.chatTemplate).render({ messages, add_generation_prompt: options.addGenerationPrompt ?? true });
  }
}

const MESSAGES = [{ role: "user", content: "hello there" }];
const TEMPLATE = "T:{% for m in messages %}{{ m.content }}{% endfor %}";
const RENDERED = "T:hello there";
const REFUSAL = "Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template.";

async function post(s: TestServer, path: string, body: object) {
  const res = await fetch(`${s.url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: res.status, json: (await res.json()) as any };
}

describe("request chat templates (--trust-request-chat-template)", () => {
  let plain: TestServer, trusted: TestServer, pooling: TestServer, trustedPooling: TestServer;
  before(async () => {
    plain = await startTestServer();
    const tokenizer = new JinjaFakeTokenizer();
    trusted = await startTestServer({ trustRequestChatTemplate: true, tokenizer });
    pooling = await startTestServer({ runner: "pooling" }, { pooling: { task: "embed" } });
    trustedPooling = await startTestServer({ runner: "pooling", trustRequestChatTemplate: true, tokenizer }, { pooling: { task: "embed" } });
  });
  after(async () => {
    for (const s of [plain, trusted, pooling, trustedPooling]) await s.close();
  });

  it("refuses a request's template on every endpoint that renders chats, unless trusted", async () => {
    const cases: [TestServer, string, object, string][] = [
      [plain, "/v1/chat/completions", { model: MODEL, messages: MESSAGES, chat_template: TEMPLATE }, "chat_template"],
      [plain, "/v1/chat/completions", { model: MODEL, messages: MESSAGES, chat_template_kwargs: { chat_template: TEMPLATE } }, "chat_template_kwargs"],
      [plain, "/tokenize", { model: MODEL, messages: MESSAGES, chat_template: TEMPLATE }, "chat_template"],
      [plain, "/v1/responses", { model: MODEL, input: "hello there", chat_template: TEMPLATE }, "chat_template"],
      [pooling, "/v1/embeddings", { model: MODEL, messages: MESSAGES, chat_template: TEMPLATE }, "chat_template"],
    ];
    for (const [s, path, body, param] of cases) {
      const r = await post(s, path, body);
      assert.equal(r.status, 400, `${path}: ${JSON.stringify(r.json)}`);
      assert.equal(r.json.error.message, REFUSAL, path);
      assert.equal(r.json.error.param, param, path);
      assert.equal(r.json.error.type, "invalid_request_error");
    }
    // nothing was queued, and the same requests without a template are served
    assert.equal((await post(plain, "/v1/chat/completions", { model: MODEL, messages: MESSAGES, max_tokens: 2 })).status, 200);
    assert.equal((await post(plain, "/tokenize", { model: MODEL, messages: MESSAGES, chat_template_kwargs: { chat_template: null } })).status, 200);
    const bad = await post(trusted, "/v1/chat/completions", { model: MODEL, messages: MESSAGES, chat_template_kwargs: { chat_template: 7 } });
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.param, "chat_template_kwargs");
  });

  it("renders with the request's template when trusted", async () => {
    const expected = (await post(trusted, "/tokenize", { model: MODEL, prompt: RENDERED, add_special_tokens: false })).json.tokens as number[];
    assert.ok(expected.length > 2);
    for (const body of [{ chat_template: TEMPLATE }, { chat_template_kwargs: { chat_template: TEMPLATE } }]) {
      const tok = await post(trusted, "/tokenize", { model: MODEL, messages: MESSAGES, ...body });
      assert.equal(tok.status, 200, JSON.stringify(tok.json));
      assert.deepEqual(tok.json.tokens, expected, JSON.stringify(body));
      const chat = await post(trusted, "/v1/chat/completions", { model: MODEL, messages: MESSAGES, max_tokens: 1, ...body });
      assert.equal(chat.status, 200, JSON.stringify(chat.json));
      assert.equal(chat.json.usage.prompt_tokens, expected.length, JSON.stringify(body));
    }
    // the model's own template renders something else (so the counts above could not match by accident)
    const own = await post(trusted, "/tokenize", { model: MODEL, messages: MESSAGES });
    assert.notDeepEqual(own.json.tokens, expected);
    const emb = await post(trustedPooling, "/v1/embeddings", { model: MODEL, messages: MESSAGES, chat_template: TEMPLATE });
    assert.equal(emb.status, 200, JSON.stringify(emb.json));
    assert.equal(emb.json.usage.prompt_tokens, expected.length);
  });
});
