// Images on every endpoint that serves a chat, on a real engine (a random tiny Gemma3ForConditionalGeneration), as
// vLLM takes them there: /v1/responses input_image parts (official OpenAI client; streamed; a previous_response_id
// whose earlier turn held the image), /v1/messages image blocks (official Anthropic client; base64 and url sources) and
// count_tokens, /tokenize with messages. Each gives the chat API's greedy tokens and logprobs for the same image and
// text, /tokenize's ids are the prompt written out by hand, and bad images are 400s naming the part on each endpoint.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import Anthropic from "@anthropic-ai/sdk";
import OpenAIClient from "openai";
import { gemma3ImageInputSpec } from "../../src/models/gemma3-vision-weights.js";
import { createServer } from "../../src/server/index.js";
import type { ServerEngineOptions } from "../../src/server/server.js";
import { dataUrl, gemma3TextThenImageIds, png, serveFiles, tinyVisionEngine } from "../helpers/image-fixture.js";
import { MODEL } from "./helpers.js";

type Json = Record<string, any>;

describe("image inputs on /v1/responses, /v1/messages and /tokenize", () => {
  const { dir, setup, engine: llm, tokenizer } = tinyVisionEngine(160);
  const closers: { close(): Promise<void> }[] = [];
  const [imgA, imgB] = [png(1), png(2)];
  const QUESTION = "What is in this image?";
  let url: string, textOnly: string, imageHost: string, openai: OpenAIClient, anthropic: Anthropic;

  async function serve(options: Partial<ServerEngineOptions>): Promise<string> {
    const app = createServer({ engine: llm, tokenizer, servedModelNames: [MODEL], maxModelLen: 160, version: "0.1.0-test", ...options });
    await app.listen({ port: 0, host: "127.0.0.1" });
    closers.push({ close: async () => { const c = app.close(); app.server.closeAllConnections(); await c; } });
    return `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  }

  before(async () => {
    url = await serve({ imageInput: gemma3ImageInputSpec(dir, setup.loaded.tokenizer), imageLimit: 2 });
    textOnly = await serve({ imageInput: null });
    const files = await serveFiles({ "/a.png": imgA });
    imageHost = files.url;
    closers.push(files);
    openai = new OpenAIClient({ baseURL: `${url}/v1`, apiKey: "unused", maxRetries: 0 });
    anthropic = new Anthropic({ baseURL: url, apiKey: "unused", maxRetries: 0 });
  });
  after(async () => {
    for (const c of closers) await c.close();
  });

  const post = async (path: string, body: unknown, base = url): Promise<{ status: number; body: Json }> => {
    const res = await fetch(`${base}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    return { status: res.status, body: (await res.json()) as Json };
  };

  /**
   * The chat API's greedy reply to a conversation (the reference every endpoint is held to), asked twice: the second
   * answer reads the prompt's blocks from the prefix cache, as the endpoint's request after it will (a cached prefix
   * computes the rest in other steps, which moves logprobs in their last bits).
   */
  const chat = async (messages: unknown[]) => {
    const body = { model: MODEL, messages, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 3, return_token_ids: true };
    await post("/v1/chat/completions", body);
    return (await post("/v1/chat/completions", body)).body;
  };
  const chatTurn = (image: string) => ({ role: "user", content: [{ type: "text", text: QUESTION }, { type: "image_url", image_url: { url: image } }] });

  describe("/v1/responses", () => {
    const input = (image: string) => [{ role: "user" as const, content: [{ type: "input_text" as const, text: QUESTION }, { type: "input_image" as const, image_url: image, detail: "auto" as const }] }];
    const respond = (extra: Json) =>
      openai.responses.create({ model: MODEL, max_output_tokens: 4, temperature: 0, include: ["message.output_text.logprobs"], top_logprobs: 3, ...extra } as never) as unknown as Promise<Json>;
    const outputText = (r: Json) => r.output.find((o: Json) => o.type === "message").content[0];

    it("input_image parts give the chat API's tokens and logprobs, whole, streamed and fetched", async () => {
      const want = await chat([chatTurn(dataUrl(imgA))]);
      const r = await respond({ input: input(dataUrl(imgA)) });
      assert.equal(r.status, "incomplete"); // (cut at max_output_tokens)
      assert.equal(r.usage.input_tokens, want.usage.prompt_tokens);
      assert.equal(r.usage.input_tokens, gemma3TextThenImageIds(setup.loaded.tokenizer, QUESTION, 4).length);
      assert.equal(outputText(r).text, want.choices[0].message.content);
      assert.deepEqual(outputText(r).logprobs, want.choices[0].logprobs.content);
      const other = await respond({ input: input(dataUrl(imgB)) });
      assert.notDeepEqual(outputText(other).logprobs, outputText(r).logprobs, "another image, another reply");
      const fetched = await respond({ input: input(`${imageHost}/a.png`) });
      assert.deepEqual(outputText(fetched).logprobs, outputText(r).logprobs);
      const stream = await openai.responses.create({ model: MODEL, max_output_tokens: 4, temperature: 0, input: input(dataUrl(imgA)), stream: true });
      let text = "";
      for await (const e of stream) if (e.type === "response.output_text.delta") text += e.delta;
      assert.equal(text, want.choices[0].message.content);
    });

    it("previous_response_id keeps the earlier turn's image", async () => {
      const first = await respond({ input: input(dataUrl(imgA)) });
      const want = await chat([chatTurn(dataUrl(imgA)), { role: "assistant", content: outputText(first).text }, { role: "user", content: "And the colours?" }]);
      const next = await respond({ previous_response_id: first.id, input: "And the colours?" });
      assert.equal(next.usage.input_tokens, want.usage.prompt_tokens);
      assert.deepEqual(outputText(next).logprobs, want.choices[0].logprobs.content);
      // the same conversation over another image answers otherwise: the stored image is the one read
      const firstB = await respond({ input: input(dataUrl(imgB)) });
      const nextB = await respond({ previous_response_id: firstB.id, input: "And the colours?" });
      assert.notDeepEqual(outputText(nextB).logprobs, outputText(next).logprobs);
    });

    it("refuses bad images with a 400 naming the input part", async () => {
      const cases: [unknown[], RegExp, string][] = [
        [input("data:image/png;base64,@@@"), /base64 data is malformed/, "input[0].content[1].image_url"],
        [input(`data:image/png;base64,${Buffer.from("not an image").toString("base64")}`), /not a PNG, JPEG, WebP or GIF/, "input[0].content[1].image_url"],
        [input(`${imageHost}/missing.png`), /HTTP 404/, "input[0].content[1].image_url"],
        [[{ role: "user", content: [{ type: "input_image", file_id: "file-1" }] }], /file_id/, "input[0].content[0].file_id"],
        [[{ role: "user", content: [{ type: "input_image" }] }], /image_url/, "input[0].content[0].image_url"],
        [[{ role: "user", content: "hi" }, ...input(dataUrl(imgA)), ...input(dataUrl(imgA)), ...input(dataUrl(imgA))], /^At most 2 image\(s\)/, "input[3].content[1].image_url"],
      ];
      for (const [inp, message, param] of cases) {
        const r = await post("/v1/responses", { model: MODEL, input: inp, max_output_tokens: 2 });
        assert.equal(r.status, 400, JSON.stringify(r.body));
        assert.match(r.body.error.message, message);
        assert.equal(r.body.error.param, param);
      }
      const t = await post("/v1/responses", { model: MODEL, input: input(dataUrl(imgA)) }, textOnly);
      assert.equal(t.status, 400);
      assert.equal(t.body.error.message, "At most 0 image(s) may be provided in one prompt.");
      assert.equal(t.body.error.param, "input[0].content[1].image_url");
    });
  });

  describe("/v1/messages", () => {
    const b64 = (b: Buffer) => ({ type: "base64" as const, media_type: "image/png" as const, data: b.toString("base64") });
    const turn = (source: Json) => [{ role: "user" as const, content: [{ type: "text" as const, text: QUESTION }, { type: "image" as const, source }] }];
    const create = (source: Json) => anthropic.messages.create({ model: MODEL, max_tokens: 4, temperature: 0, messages: turn(source) } as never) as unknown as Promise<Anthropic.Message>;

    it("image blocks (base64 and url sources) give the chat API's reply; count_tokens counts the image's tokens", async () => {
      const want = await chat([chatTurn(dataUrl(imgA))]);
      const m = await create(b64(imgA));
      const text = m.content.flatMap((b) => (b.type === "text" ? [b.text] : [])).join("");
      assert.equal(text, want.choices[0].message.content);
      assert.equal(m.usage.input_tokens, want.usage.prompt_tokens);
      const viaUrl = await create({ type: "url", url: `${imageHost}/a.png` });
      assert.deepEqual(viaUrl.content, m.content);
      const other = await create(b64(imgB));
      const otherChat = await chat([chatTurn(dataUrl(imgB))]);
      assert.equal(other.content.flatMap((b) => (b.type === "text" ? [b.text] : [])).join(""), otherChat.choices[0].message.content);
      let streamed = "";
      const stream = anthropic.messages.stream({ model: MODEL, max_tokens: 4, temperature: 0, messages: turn(b64(imgA)) } as never) as unknown as AsyncIterable<Anthropic.MessageStreamEvent>;
      for await (const e of stream) if (e.type === "content_block_delta" && e.delta.type === "text_delta") streamed += e.delta.text;
      assert.equal(streamed, text);
      const count = await anthropic.messages.countTokens({ model: MODEL, messages: turn(b64(imgA)) as never });
      assert.equal(count.input_tokens, gemma3TextThenImageIds(setup.loaded.tokenizer, QUESTION, 4).length);
    });

    it("refuses bad images with Anthropic's error object naming the block", async () => {
      const cases: [Json, RegExp][] = [
        [{ type: "base64", media_type: "image/png", data: "@@@@" }, /^messages\[0\]\.content\[1\]\.source: the data URL's base64 data is malformed$/],
        [{ type: "base64", media_type: "image/png", data: Buffer.from("not an image").toString("base64") }, /^messages\[0\]\.content\[1\]\.source: .*not a PNG, JPEG, WebP or GIF/],
        [{ type: "url", url: `${imageHost}/missing.png` }, /HTTP 404/],
        [{ type: "base64", data: "AAAA" }, /media_type/],
        [{ type: "file", file_id: "f" }, /image source type "file"/],
      ];
      for (const [source, message] of cases) {
        for (const path of ["/v1/messages", "/v1/messages/count_tokens"]) {
          const r = await post(path, { model: MODEL, max_tokens: 2, messages: turn(source) });
          assert.equal(r.status, 400, JSON.stringify(r.body));
          assert.equal(r.body.type, "error");
          assert.equal(r.body.error.type, "invalid_request_error");
          assert.match(r.body.error.message, message);
        }
      }
      const t = await post("/v1/messages", { model: MODEL, max_tokens: 2, messages: turn(b64(imgA)) }, textOnly);
      assert.equal(t.status, 400);
      assert.equal(t.body.error.message, "messages[0].content[1].source: At most 0 image(s) may be provided in one prompt.");
    });
  });

  describe("/tokenize", () => {
    it("returns the prompt with each image expanded, as the engine is fed it", async () => {
      const want = gemma3TextThenImageIds(setup.loaded.tokenizer, QUESTION, 4);
      const r = await post("/tokenize", { model: MODEL, messages: [chatTurn(dataUrl(imgA))] });
      assert.equal(r.status, 200);
      assert.deepEqual(r.body.tokens, want);
      assert.equal(r.body.count, want.length);
      assert.deepEqual((await chat([chatTurn(dataUrl(imgA))])).prompt_token_ids, want, "the ids the engine got");
      const bad = await post("/tokenize", { model: MODEL, messages: [chatTurn("data:image/png,abc")] });
      assert.equal(bad.status, 400);
      assert.match(bad.body.error.message, /Only base64 data URLs/);
      assert.equal(bad.body.error.param, "messages[0].content[1].image_url");
      const t = await post("/tokenize", { model: MODEL, messages: [chatTurn(dataUrl(imgA))] }, textOnly);
      assert.equal(t.status, 400);
      assert.equal(t.body.error.message, "At most 0 image(s) may be provided in one prompt.");
    });
  });
});
