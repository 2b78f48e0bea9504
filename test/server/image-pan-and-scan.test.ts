// Gemma 3's pan-and-scan through `POST /v1/chat/completions` on a real engine (a random tiny Gemma 3 image-text model,
// 4 tokens per image): a request's mm_processor_kwargs (vLLM's field) turns it on or off over the server's
// --mm-processor-kwargs; the prompt is Gemma3Processor's, written out by hand (the original image, then "Here is the
// original image ... and here are some crops to help you see better ..." with each crop's tokens); bad kwargs are 400s.
// And --interleave-mm-strings: with the "string" content format, an image stays between the texts around it.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { withChatTemplateDefaults } from "../../src/models/chat-content-format.js";
import { withMmProcessorKwargs } from "../../src/models/gemma3-image-processor.js";
import { gemma3ImageInputSpec } from "../../src/models/gemma3-vision-weights.js";
import { createServer } from "../../src/server/index.js";
import type { ServerEngineOptions } from "../../src/server/server.js";
import { dataUrl, gemma3TextThenImageIds, png, tinyVisionEngine } from "../helpers/image-fixture.js";
import { MODEL } from "./helpers.js";

type Reply = { status: number; body: { prompt_token_ids?: number[]; usage?: { prompt_tokens: number; prompt_tokens_details?: { cached_tokens: number } }; choices?: { logprobs: { content: { top_logprobs: { logprob: number }[] }[] } }[]; error?: { message: string; param: string | null; type: string } } };

describe("Gemma 3 pan-and-scan through the chat API", () => {
  const { dir, setup, engine: llm, tokenizer } = tinyVisionEngine(128);
  const servers: { close(): Promise<void> }[] = [];
  const spec = gemma3ImageInputSpec(dir, setup.loaded.tokenizer)!;
  // 60x20: aspect ratio 3, so 3 crops of 20x20 (round(60/20) = 3, under 60 // 8 = 7) with pan_and_scan_min_crop_size 8
  const wide = png(5, 60, 20);
  const question = "What is in this image?";
  let plainUrl: string, panUrl: string;

  async function serve(options: Partial<ServerEngineOptions>): Promise<string> {
    const app = createServer({ engine: llm, tokenizer, servedModelNames: [MODEL], maxModelLen: 128, version: "0.1.0-test", enablePromptTokensDetails: true, ...options });
    await app.listen({ port: 0, host: "127.0.0.1" });
    servers.push({ close: async () => { const c = app.close(); app.server.closeAllConnections(); await c; } });
    return `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  }
  async function ask(base: string, extra: Record<string, unknown> = {}): Promise<Reply> {
    const res = await fetch(`${base}/v1/chat/completions`, {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: MODEL, max_tokens: 2, temperature: 0, logprobs: true, top_logprobs: 3, return_token_ids: true,
        messages: [{ role: "user", content: [{ type: "text", text: question }, { type: "image_url", image_url: { url: dataUrl(wide) } }] }],
        ...extra,
      }),
    });
    return { status: res.status, body: (await res.json()) as Reply["body"] };
  }

  /** Gemma3Processor's prompt for the question then the image with `crops` crops, as HF formats it. */
  function panAndScanIds(crops: number): number[] {
    const seq = `\n\n<start_of_image>${"<image_soft_token>".repeat(4)}<end_of_image>\n\n`;
    const image = `Here is the original image ${seq} and here are some crops to help you see better ${Array<string>(crops).fill(seq).join(" ")}`;
    return setup.loaded.tokenizer.encode(`<bos><start_of_turn>user\n${question}${image}<end_of_turn>\n<start_of_turn>model\n`, { addSpecialTokens: false });
  }

  before(async () => {
    plainUrl = await serve({ imageInput: spec });
    // kiln serve --mm-processor-kwargs '{"do_pan_and_scan": true, "pan_and_scan_min_crop_size": 8}'
    panUrl = await serve({ imageInput: withMmProcessorKwargs(spec, { do_pan_and_scan: true, pan_and_scan_min_crop_size: 8 }) });
  });
  after(async () => {
    for (const s of servers) await s.close();
  });

  it("a request's mm_processor_kwargs turns pan-and-scan on: the image and its 3 crops, 4 tokens each, in HF's text", async () => {
    const off = await ask(plainUrl);
    const offIds = gemma3TextThenImageIds(setup.loaded.tokenizer, question, 4);
    assert.deepEqual(off.body.prompt_token_ids, offIds);
    const on = await ask(plainUrl, { mm_processor_kwargs: { do_pan_and_scan: true, pan_and_scan_min_crop_size: 8 } });
    assert.equal(on.status, 200, JSON.stringify(on.body.error));
    const want = panAndScanIds(3);
    assert.deepEqual(on.body.prompt_token_ids, want);
    assert.equal(on.body.usage!.prompt_tokens, want.length);
    const imageTokens = (ids: number[]) => ids.filter((t) => t === spec.imageTokenIndex).length;
    assert.deepEqual([imageTokens(offIds), imageTokens(want)], [4, 16]);
    assert.ok(on.body.usage!.prompt_tokens > off.body.usage!.prompt_tokens);
    const top = (r: Reply) => r.body.choices![0]!.logprobs.content[0]!.top_logprobs.map((t) => t.logprob);
    assert.notDeepEqual(top(on), top(off), "the crops reach the model");
    // max 2 crops: round(3) capped at 2 (30x20 each)
    const two = await ask(plainUrl, { mm_processor_kwargs: { do_pan_and_scan: true, pan_and_scan_min_crop_size: 8, pan_and_scan_max_num_crops: 2 } });
    assert.deepEqual(two.body.prompt_token_ids, panAndScanIds(2));
  });

  it("the settings are part of the prefix cache's key: the same crops under other settings share no image blocks", async () => {
    const kwargs = (ratio: number) => ({ mm_processor_kwargs: { do_pan_and_scan: true, pan_and_scan_min_crop_size: 8, pan_and_scan_min_ratio_to_activate: ratio } });
    const first = await ask(plainUrl, kwargs(1.5));
    const again = await ask(plainUrl, kwargs(1.5));
    const other = await ask(plainUrl, kwargs(2)); // (ratio 3 reaches both: the same 3 crops, the same token ids)
    assert.deepEqual(other.body.prompt_token_ids, first.body.prompt_token_ids);
    const n = first.body.usage!.prompt_tokens, firstImage = first.body.prompt_token_ids!.indexOf(spec.imageTokenIndex);
    // blocks of 4 tokens: a hit covers every full block but the last token's; a miss stops at the block holding the first image token
    assert.equal(again.body.usage!.prompt_tokens_details!.cached_tokens, Math.floor((n - 1) / 4) * 4);
    assert.equal(other.body.usage!.prompt_tokens_details!.cached_tokens, Math.floor(firstImage / 4) * 4);
  });

  it("the server's --mm-processor-kwargs is the default; a request's overrides it", async () => {
    const byDefault = await ask(panUrl);
    assert.deepEqual(byDefault.body.prompt_token_ids, panAndScanIds(3));
    const off = await ask(panUrl, { mm_processor_kwargs: { do_pan_and_scan: false } });
    assert.deepEqual(off.body.prompt_token_ids, gemma3TextThenImageIds(setup.loaded.tokenizer, question, 4));
    // a ratio threshold above the image's 3: no crops
    const high = await ask(panUrl, { mm_processor_kwargs: { pan_and_scan_min_ratio_to_activate: 3.5 } });
    assert.deepEqual(high.body.prompt_token_ids, off.body.prompt_token_ids);
  });

  it("--interleave-mm-strings: a string content format writes the image where the parts put it (vLLM: images first)", async () => {
    const stringFormat = withChatTemplateDefaults(setup.loaded.tokenizer, { contentFormat: "string", kwargs: null });
    const seq = `\n\n<start_of_image>${"<image_soft_token>".repeat(4)}<end_of_image>\n\n`;
    const ids = (body: string) => setup.loaded.tokenizer.encode(`<bos><start_of_turn>user\n${body}<end_of_turn>\n<start_of_turn>model\n`, { addSpecialTokens: false });
    const messages = [{ role: "user", content: [{ type: "text", text: "Before" }, { type: "image_url", image_url: { url: dataUrl(wide) } }, { type: "text", text: "After" }] }];
    for (const [interleaveMmStrings, body] of [[true, `Before\n${seq}\nAfter`], [false, `${seq}\nBefore\nAfter`]] as const) {
      const base = await serve({ imageInput: spec, tokenizer: stringFormat, interleaveMmStrings });
      const r = await ask(base, { messages });
      assert.deepEqual(r.body.prompt_token_ids, ids(body), `interleave ${interleaveMmStrings}`);
    }
  });

  it("an unknown key, a wrong type or a non-object mm_processor_kwargs is a 400 in OpenAI's error object", async () => {
    const cases: [unknown, RegExp][] = [
      [{ num_crops: 2 }, /unknown key 'num_crops'/],
      [{ do_pan_and_scan: "yes" }, /'do_pan_and_scan' must be a boolean, got "yes"/],
      [{ pan_and_scan_max_num_crops: 2.5 }, /'pan_and_scan_max_num_crops' must be a positive integer/],
      [[true], /'mm_processor_kwargs' must be an object/],
    ];
    for (const [kwargs, message] of cases) {
      const r = await ask(plainUrl, { mm_processor_kwargs: kwargs });
      assert.equal(r.status, 400, JSON.stringify(r.body));
      assert.match(r.body.error!.message, message);
      assert.equal(r.body.error!.param, "mm_processor_kwargs");
      assert.equal(r.body.error!.type, "invalid_request_error");
    }
  });
});
