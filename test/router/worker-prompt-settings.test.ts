// The router computes prompts as workers started with non-default prompt flags do (--default-chat-template-kwargs,
// --mm-processor-kwargs, --interleave-mm-strings, --media-io-kwargs, --chat-template-content-format): each setting
// given to the router equals the same setting given in the request (what precise-prefix-images.test.ts checks against
// a real worker), and changes the prompt where it should.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { PNG } from "pngjs";
import { RequestTokenizer } from "../../src/router/request-tokens.js";
import { dataUrl, png } from "../helpers/image-fixture.js";
import { tinyGemma3VisionDir } from "../helpers/tiny-model.js";

const dir = tinyGemma3VisionDir();
const chat = (url: string, extra: Record<string, unknown> = {}) => ({
  messages: [{ role: "user", content: [{ type: "text", text: "Describe it." }, { type: "image_url", image_url: { url } }] }], ...extra,
});

/** An RGBA PNG whose pixels are all transparent. */
function transparentPng(): Buffer {
  const p = new PNG({ width: 20, height: 20 });
  for (let i = 0; i < p.data.length; i++) p.data[i] = i % 4 === 3 ? 0 : 128;
  return PNG.sync.write(p);
}

describe("the router's copy of the workers' prompt flags", () => {
  it("--mm-processor-kwargs: as the request's mm_processor_kwargs (the image and its crops hashed)", () => {
    const kwargs = { do_pan_and_scan: true, pan_and_scan_min_crop_size: 8 };
    const url = dataUrl(png(5, 60, 20));
    const viaRouter = RequestTokenizer.fromDir(dir, { mmProcessorKwargs: kwargs }).prompt("/v1/chat/completions", chat(url))!;
    const viaRequest = RequestTokenizer.fromDir(dir).prompt("/v1/chat/completions", chat(url, { mm_processor_kwargs: kwargs }))!;
    const plain = RequestTokenizer.fromDir(dir).prompt("/v1/chat/completions", chat(url))!;
    assert.deepEqual(viaRouter, viaRequest);
    assert.equal(viaRouter.images.length, 4); // the image and 3 crops
    assert.equal(plain.images.length, 1);
  });

  it("--default-chat-template-kwargs: as the request's chat_template_kwargs", () => {
    const template = "{{ greeting }}{% for m in messages %}{{ m['content'] }}{% endfor %}";
    const body = { messages: [{ role: "user", content: "Hello there." }] };
    const viaRouter = RequestTokenizer.fromDir(dir, { chatTemplate: template, defaultChatTemplateKwargs: { greeting: "Good morning. " } }).promptTokenIds("/v1/chat/completions", body);
    const viaRequest = RequestTokenizer.fromDir(dir, { chatTemplate: template }).promptTokenIds("/v1/chat/completions", { ...body, chat_template_kwargs: { greeting: "Good morning. " } });
    const plain = RequestTokenizer.fromDir(dir, { chatTemplate: template }).promptTokenIds("/v1/chat/completions", body);
    assert.deepEqual(viaRouter, viaRequest);
    assert.notDeepEqual(viaRouter, plain);
  });

  it("--interleave-mm-strings with the string content format: the image stays after the text", () => {
    const url = dataUrl(png(1));
    const tok = RequestTokenizer.fromDir(dir);
    const order = (r: RequestTokenizer) => {
      const p = r.prompt("/v1/chat/completions", chat(url))!;
      const text = tok.tokenizer.decode(p.tokenIds, { skipSpecialTokens: false });
      return text.indexOf("Describe it.") < text.indexOf("<start_of_image>") ? "text first" : "image first";
    };
    assert.equal(order(RequestTokenizer.fromDir(dir, { contentFormat: "string" })), "image first");
    assert.equal(order(RequestTokenizer.fromDir(dir, { contentFormat: "string", interleaveMmStrings: true })), "text first");
  });

  it("--media-io-kwargs' background: a transparent image's hash follows it", () => {
    const url = dataUrl(transparentPng());
    const hash = (r: RequestTokenizer) => r.prompt("/v1/chat/completions", chat(url))!.images[0]!.hash;
    const white = hash(RequestTokenizer.fromDir(dir));
    assert.equal(hash(RequestTokenizer.fromDir(dir, { rgbaBackground: [255, 255, 255] })), white);
    assert.notEqual(hash(RequestTokenizer.fromDir(dir, { rgbaBackground: [0, 0, 0] })), white);
  });
});
