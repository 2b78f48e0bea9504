// Offline LLM.chat with images (vLLM's LLM.chat over image_url parts), from a model path as users make it: a data:
// URL, the file's bytes, decoded pixels and (chatAsync) an http URL all give the logprobs of LLM.generate over the
// prompt written out by hand with the image's processed pixels at its tokens; bad images and a text-only LLM (--limit-mm-per-prompt image 0) throw
// ChatInputErrors naming the part.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { LLM } from "../../src/engine/llm-engine.js";
import { ChatInputError, type ChatInputMessage, type ChatInputPart } from "../../src/models/chat-images.js";
import { gemma3ProcessImage, GEMMA3_IMAGE_DEFAULTS } from "../../src/models/gemma3-image-processor.js";
import { decodeImage } from "../../src/models/image-decode.js";
import { Tokenizer } from "../../src/models/tokenizer.js";
import { dataUrl, gemma3TextThenImageIds, png, serveFiles } from "../helpers/image-fixture.js";
import { tinyGemma3VisionDir } from "../helpers/tiny-model.js";

describe("LLM.chat with images", () => {
  // (no prefix cache: a cached prefix computes the rest in other steps, which moves logprobs in their last bits)
  const llm = new LLM({ model: tinyGemma3VisionDir(), maxModelLen: 128, kvCacheMemory: 2 << 20, blockSize: 4, enablePrefixCaching: false });
  const [imgA, imgB] = [png(1), png(2)];
  const QUESTION = "What is in this image?";
  const params = { maxTokens: 3, temperature: 0, logprobs: 3 };
  const tokenizer = Tokenizer.fromDir(tinyGemma3VisionDir());
  const turn = (image: ChatInputPart): ChatInputMessage[] => [{ role: "user", content: [{ type: "text", text: QUESTION }, image] }];
  const logprobsOf = (outs: { outputs: { logprobs: unknown }[] }[]) => outs.map((o) => o.outputs[0]!.logprobs);
  let files: { url: string; close(): Promise<void> };
  before(async () => {
    files = await serveFiles({ "/a.png": imgA });
  });
  after(() => files.close());

  it("takes data: URLs, bytes and pixels as LLM.generate takes the prompt written out by hand", () => {
    const want = gemma3TextThenImageIds(tokenizer, QUESTION, 4);
    const [byUrl] = llm.chat(turn({ type: "image_url", image_url: { url: dataUrl(imgA) } }), params);
    assert.deepEqual(byUrl!.promptTokenIds, want);
    const offset = want.indexOf(tokenizer.encode("<image_soft_token>", { addSpecialTokens: false })[0]!);
    const pixelValues = gemma3ProcessImage(imgA, { imageSize: 56, ...GEMMA3_IMAGE_DEFAULTS });
    const [ref] = llm.generate([{ promptTokenIds: want, mmFeatures: [{ hash: "a", offset, length: 4, pixelValues }] }], params);
    assert.deepEqual(byUrl!.outputs[0]!.logprobs, ref!.outputs[0]!.logprobs);
    const parts: ChatInputPart[] = [
      { type: "image", image: new Uint8Array(imgA) },
      { type: "image", image: decodeImage(imgA) },
      { type: "image_url", image_url: dataUrl(imgA) },
    ];
    for (const p of parts) assert.deepEqual(logprobsOf(llm.chat(turn(p), params)), logprobsOf([ref!]), p.type);
    // a batch of conversations, each its own image (batched rows: the same tokens, logprobs to float32 rounding)
    const batch = llm.chat([turn({ type: "image", image: new Uint8Array(imgB) }), turn({ type: "image", image: new Uint8Array(imgA) })], params);
    assert.deepEqual(batch[1]!.outputs[0]!.tokenIds, ref!.outputs[0]!.tokenIds);
    const firstLogprob = (o: typeof ref) => o!.outputs[0]!.logprobs![0]!.get(o!.outputs[0]!.tokenIds[0]!)!.logprob;
    assert.ok(Math.abs(firstLogprob(batch[1]) - firstLogprob(ref)) < 1e-5);
    assert.ok(Math.abs(firstLogprob(batch[0]) - firstLogprob(ref)) > 1e-3, "another image, another reply");
  });

  it("chatAsync fetches an http image; chat refuses to", async () => {
    const [ref] = llm.chat(turn({ type: "image", image: new Uint8Array(imgA) }), params);
    const [fetched] = await llm.chatAsync(turn({ type: "image_url", image_url: { url: `${files.url}/a.png` } }), params);
    assert.deepEqual(fetched!.outputs[0]!.logprobs, ref!.outputs[0]!.logprobs);
    assert.throws(() => llm.chat(turn({ type: "image_url", image_url: { url: `${files.url}/a.png` } }), params), (e: unknown) =>
      e instanceof ChatInputError && e.param === "messages[0].content[1].image_url" && /chatAsync/.test(e.message));
  });

  it("throws a ChatInputError naming the bad part", async () => {
    const cases: [ChatInputMessage[], RegExp, string][] = [
      [turn({ type: "image_url", image_url: "data:image/png;base64,@@@" }), /base64 data is malformed/, "messages[0].content[1].image_url"],
      [turn({ type: "image", image: new Uint8Array([1, 2, 3]) }), /not a PNG, JPEG, WebP or GIF/, "messages[0].content[1].image"],
      [turn({ type: "image", image: { width: 2, height: 2, data: new Uint8Array(3) } }), /RGB pixels/, "messages[0].content[1].image"],
      [turn({ type: "image_url", image_url: "ftp://x/y.png" }), /HTTP, data or file URL/, "messages[0].content[1].image_url"],
    ];
    for (const [messages, message, param] of cases)
      assert.throws(() => llm.chat(messages, params), (e: unknown) => e instanceof ChatInputError && message.test(e.message) && e.param === param, param);
    await assert.rejects(llm.chatAsync(turn({ type: "image_url", image_url: `${files.url}/missing.png` }), params), /HTTP 404/);
    const textOnly = new LLM({ model: tinyGemma3VisionDir(), maxModelLen: 64, kvCacheMemory: 1 << 20, limitMmPerPrompt: { image: 0 } }); // (text only)
    assert.throws(() => textOnly.chat(turn({ type: "image", image: new Uint8Array(imgA) }), params), (e: unknown) =>
      e instanceof ChatInputError && e.message === "At most 0 image(s) may be provided in one prompt." && e.param === "messages[0].content[1].image");
    assert.equal(llm.engine.hasUnfinishedRequests(), false);
  });
});
