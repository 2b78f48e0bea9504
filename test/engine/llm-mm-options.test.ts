// LLM's multimodal options (vLLM's LLM(mm_processor_kwargs=..., interleave_mm_strings=...) and LLM.chat's
// mm_processor_kwargs) on the tiny Gemma 3 image-text model, against prompts written out by hand; and the image
// loader's background under a transparent image (--media-io-kwargs' image.rgba_background_color).
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { PNG } from "pngjs";
import { EngineInputError } from "../../src/engine/errors.js";
import { LLM } from "../../src/engine/llm-engine.js";
import { loadChatImagesSync, type ChatInputMessage } from "../../src/models/chat-images.js";
import { GEMMA3_IMAGE_DEFAULTS } from "../../src/models/gemma3-image-processor.js";
import { decodeImage } from "../../src/models/image-decode.js";
import { Tokenizer } from "../../src/models/tokenizer.js";
import { dataUrl, gemma3TextThenImageIds, png } from "../helpers/image-fixture.js";
import { tinyGemma3VisionDir } from "../helpers/tiny-model.js";

const SEQ = `\n\n<start_of_image>${"<image_soft_token>".repeat(4)}<end_of_image>\n\n`;

describe("LLM's multimodal options", () => {
  const dir = tinyGemma3VisionDir();
  const tokenizer = Tokenizer.fromDir(dir);
  const encode = (s: string) => tokenizer.encode(s, { addSpecialTokens: false });
  const wide = png(5, 60, 20); // aspect ratio 3: 3 crops of 20x20 at pan_and_scan_min_crop_size 8
  const QUESTION = "What is in this image?";
  const params = { maxTokens: 1, temperature: 0 };
  const turn: ChatInputMessage[] = [{ role: "user", content: [{ type: "text", text: QUESTION }, { type: "image_url", image_url: { url: dataUrl(wide) } }] }];

  it("mm_processor_kwargs: the LLM's turn pan-and-scan on, a chat call's override them; bad ones are EngineInputErrors", () => {
    const llm = new LLM({ model: dir, maxModelLen: 128, kvCacheMemory: 2 << 20, blockSize: 4, mmProcessorKwargs: { do_pan_and_scan: true, pan_and_scan_min_crop_size: 8 } });
    const image = `Here is the original image ${SEQ} and here are some crops to help you see better ${SEQ} ${SEQ} ${SEQ}`;
    const [on] = llm.chat(turn, params);
    assert.deepEqual(on!.promptTokenIds, encode(`<bos><start_of_turn>user\n${QUESTION}${image}<end_of_turn>\n<start_of_turn>model\n`));
    const [off] = llm.chat(turn, params, {}, { mmProcessorKwargs: { do_pan_and_scan: false } });
    assert.deepEqual(off!.promptTokenIds, gemma3TextThenImageIds(tokenizer, QUESTION, 4));
    assert.throws(() => llm.chat(turn, params, {}, { mmProcessorKwargs: { crops: 1 } }), (e: unknown) =>
      e instanceof EngineInputError && /unknown key 'crops'/.test(e.message));
    assert.throws(() => new LLM({ model: dir, mmProcessorKwargs: { do_pan_and_scan: "on" } }), (e: unknown) =>
      e instanceof EngineInputError && /'do_pan_and_scan' must be a boolean/.test(e.message));
  });

  it("interleave_mm_strings: a string content format writes the image between the texts, not before them", () => {
    const parts: ChatInputMessage[] = [{ role: "user", content: [{ type: "text", text: "Before" }, { type: "image_url", image_url: { url: dataUrl(png(1)) } }, { type: "text", text: "After" }] }];
    const prompt = (body: string) => encode(`<bos><start_of_turn>user\n${body}<end_of_turn>\n<start_of_turn>model\n`);
    const interleaved = new LLM({ model: dir, maxModelLen: 128, kvCacheMemory: 2 << 20, blockSize: 4, interleaveMmStrings: true });
    assert.deepEqual(interleaved.chat(parts, params, { contentFormat: "string" })[0]!.promptTokenIds, prompt(`Before\n${SEQ}\nAfter`));
    const plain = new LLM({ model: dir, maxModelLen: 128, kvCacheMemory: 2 << 20, blockSize: 4 });
    assert.deepEqual(plain.chat(parts, params, { contentFormat: "string" })[0]!.promptTokenIds, prompt(`${SEQ}\nBefore\nAfter`));
  });

  it("a transparent image is composited over the loader's background (white unless --media-io-kwargs says)", () => {
    const p = new PNG({ width: 2, height: 2 }); // all pixels red, alpha 0
    for (let i = 0; i < 4; i++) p.data.set([255, 0, 0, 0], i * 4);
    const bytes = new Uint8Array(PNG.sync.write(p));
    assert.deepEqual([...decodeImage(bytes).data], new Array(12).fill(255));
    assert.deepEqual([...decodeImage(bytes, [0, 0, 0]).data], new Array(12).fill(0));
    const cfg = { imageSize: 2, ...GEMMA3_IMAGE_DEFAULTS };
    const image = [{ image: bytes, param: "p" }];
    assert.deepEqual([...loadChatImagesSync(image, cfg)[0]![0]!], new Array(12).fill(1));
    assert.deepEqual([...loadChatImagesSync(image, cfg, { localPath: null, domains: null, rgbaBackground: [0, 0, 0] })[0]![0]!], new Array(12).fill(-1));
  });
});
