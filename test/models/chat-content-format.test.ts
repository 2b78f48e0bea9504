// vLLM's chat_template_content_format (content as a string or as OpenAI parts; "auto" from the template) and a
// server's default chat template kwargs (under each request's own).
import assert from "node:assert/strict";
import { test } from "node:test";
import { detectContentFormat, withChatTemplateDefaults } from "../../src/models/chat-content-format.js";
import { Tokenizer } from "../../src/models/tokenizer.js";
import { testTokenizerDir } from "../helpers/tiny-model.js";

// a template that walks content parts (as Llama 4's and many multimodal ones do) and prints a variable
const PARTS = "{{ greeting }}|{% for m in messages %}{{ m.role }}:{% for p in m['content'] %}{{ p['text'] }}{% endfor %};{% endfor %}";
const STRING = "{{ greeting }}|{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}";

test("auto detects a template that loops over message content", () => {
  assert.equal(detectContentFormat(PARTS), "openai");
  assert.equal(detectContentFormat(STRING), "string");
  assert.equal(detectContentFormat("{%- for item in message.content | selectattr('type', 'equalto', 'text') -%}{{ item.text }}{%- endfor %}"), "openai");
  assert.equal(detectContentFormat("{% for message in messages %}{{ message['content'] }}{% endfor %}"), "string");
});

test("content reaches the template as a string or as OpenAI text parts", () => {
  const tok = Tokenizer.fromDir(testTokenizerDir());
  const messages = [{ role: "user", content: "hi" }, { role: "assistant", content: null }];
  const render = (chatTemplate: string, contentFormat?: "auto" | "string" | "openai") =>
    tok.applyChatTemplate(messages, { chatTemplate, addGenerationPrompt: false, chatTemplateKwargs: { greeting: "g" }, ...(contentFormat ? { contentFormat } : {}) });
  assert.equal(render(PARTS, "openai"), "g|user:hi;assistant:;");
  assert.equal(render(PARTS, "auto"), "g|user:hi;assistant:;");
  assert.throws(() => render(PARTS), /Expected iterable/, "the default (string) gives a parts loop a string");
  assert.equal(render(STRING, "auto"), "g|user:hi;assistant:;");
});

test("a string content format gives null content as \"\" (vLLM), so a template's `+` renders a tool-call turn or a content-less message", () => {
  const tok = Tokenizer.fromDir(testTokenizerDir());
  // ChatML as many models write it (kiln-default's own): content joined with `+`, which fails on null
  const CONCAT = "{% for m in messages %}{{ '<' + m['role'] + '>' + m['content'] + ';' }}{% endfor %}";
  const call = { id: "c1", type: "function", function: { name: "f", arguments: "{}" } };
  const messages = [{ role: "user", content: null }, { role: "assistant", content: null, tool_calls: [call] }, { role: "tool", content: "3" }];
  const render = (contentFormat: "string" | "auto") => tok.applyChatTemplate(messages, { chatTemplate: CONCAT, addGenerationPrompt: false, contentFormat });
  assert.equal(render("string"), "<user>;<assistant>;<tool>3;");
  assert.equal(render("auto"), "<user>;<assistant>;<tool>3;");
});

test("an empty tool_calls list reaches the template as none (vLLM drops it), so a reply fed back is a plain turn", () => {
  const tok = Tokenizer.fromDir(testTokenizerDir());
  // Llama 3.1's test: a message with the key is a tool-call turn, and it takes exactly one call
  const LLAMA = "{% for m in messages %}{% if 'tool_calls' in m %}{% if m.tool_calls | length != 1 %}{{ raise_exception('one call only') }}" +
    "{% endif %}call;{% else %}{{ m.content }};{% endif %}{% endfor %}";
  const call = { id: "c1", type: "function", function: { name: "f", arguments: {} } };
  const messages = [{ role: "assistant", content: "hi", tool_calls: [] }, { role: "assistant", content: null, tool_calls: [call] }];
  assert.equal(tok.applyChatTemplate(messages, { chatTemplate: LLAMA, addGenerationPrompt: false }), "hi;call;");
});

test("an openai content format gives a tool message's text as a string (vLLM), other roles' as parts", () => {
  const tok = Tokenizer.fromDir(testTokenizerDir());
  const TOOL = "{% for m in messages %}{{ m.role }}:{% if m.content is string %}S={{ m.content }}{% else %}{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endif %};{% endfor %}";
  const messages = [{ role: "user", content: "hi" }, { role: "tool", content: "42" }, { role: "tool", content: null }];
  assert.equal(tok.applyChatTemplate(messages, { chatTemplate: TOOL, addGenerationPrompt: false, contentFormat: "openai" }), "user:hi;tool:S=42;tool:S=;");
});

test("default chat template kwargs go under each request's own; the rest of the tokenizer is its own", () => {
  const tok = Tokenizer.fromDir(testTokenizerDir());
  const served = withChatTemplateDefaults(tok, { contentFormat: "auto", kwargs: { greeting: "default", other: 1 } });
  const messages = [{ role: "user", content: "hi" }];
  assert.equal(served.applyChatTemplate(messages, { chatTemplate: PARTS, addGenerationPrompt: false }), "default|user:hi;");
  assert.equal(served.applyChatTemplate(messages, { chatTemplate: PARTS, addGenerationPrompt: false, chatTemplateKwargs: { greeting: "mine" } }), "mine|user:hi;");
  assert.throws(() => served.applyChatTemplate(messages, { chatTemplate: PARTS, addGenerationPrompt: false, contentFormat: "string" }), /Expected iterable/, "a call's own format wins");
  assert.deepEqual(served.encode("The jury"), tok.encode("The jury"));
  assert.equal(served.vocabSize, tok.vocabSize);
  assert.equal(served.idToRawToken?.(5), tok.idToRawToken(5));
});
