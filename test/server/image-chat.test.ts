// Images through `POST /v1/chat/completions` on a real engine (a random tiny Gemma3ForConditionalGeneration), sent
// by the official OpenAI client as vLLM takes them: image_url parts (data: URLs, and an http URL fetched), the
// template's <start_of_image> expanded as Gemma3Processor expands it (checked against the prompt written out by hand),
// replies that depend on the image, prefix-cache hits for the same image only, and vLLM's 400s naming the part.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import type OpenAI from "openai";
import { gemma3ImageInputSpec } from "../../src/models/gemma3-vision-weights.js";
import { createServer } from "../../src/server/index.js";
import type { ServerEngineOptions } from "../../src/server/server.js";
import { dataUrl, gemma3TextThenImageIds, png, serveFiles, tinyVisionEngine } from "../helpers/image-fixture.js";
import { MODEL } from "./helpers.js";
import OpenAIClient from "openai";

describe("image inputs through the chat API", () => {
  const { dir, setup, engine: llm, tokenizer } = tinyVisionEngine(128);
  const servers: { close(): Promise<void> }[] = [];
  let client: OpenAI, url: string, imageHost: string;
  const [imgA, imgB] = [png(1), png(2)];

  async function serve(options: Partial<ServerEngineOptions>): Promise<{ client: OpenAI; url: string }> {
    const app = createServer({ engine: llm, tokenizer, servedModelNames: [MODEL], maxModelLen: 128, enablePromptTokensDetails: true, version: "0.1.0-test", ...options });
    await app.listen({ port: 0, host: "127.0.0.1" });
    const addr = app.server.address() as { port: number };
    servers.push({ close: async () => { const c = app.close(); app.server.closeAllConnections(); await c; } });
    const u = `http://127.0.0.1:${addr.port}`;
    return { client: new OpenAIClient({ baseURL: `${u}/v1`, apiKey: "unused", maxRetries: 0 }), url: u };
  }

  before(async () => {
    ({ client, url } = await serve({ imageInput: gemma3ImageInputSpec(dir, setup.loaded.tokenizer), imageLimit: 2 }));
    const files = await serveFiles({ "/a.png": imgA });
    imageHost = files.url;
    servers.push(files);
  });
  after(async () => {
    for (const s of servers) await s.close();
  });

  const ask = (image: string, extra: Record<string, unknown> = {}) =>
    client.chat.completions.create({
      model: MODEL, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 3,
      messages: [{ role: "user", content: [{ type: "text", text: "What is in this image?" }, { type: "image_url", image_url: { url: image } }] }],
      ...extra,
    } as never) as unknown as Promise<OpenAI.Chat.ChatCompletion & { prompt_token_ids?: number[]; usage: { prompt_tokens_details?: { cached_tokens: number } } }>;

  it("expands the image as Gemma3Processor does and answers from the image", async () => {
    const r = await ask(dataUrl(imgA), { return_token_ids: true });
    const want = gemma3TextThenImageIds(setup.loaded.tokenizer, "What is in this image?", 4);
    assert.deepEqual(r.prompt_token_ids, want);
    assert.equal(r.usage.prompt_tokens, want.length);
    assert.equal(r.choices[0]!.message.role, "assistant");
    const other = await ask(dataUrl(imgB));
    const top = (c: typeof r) => c.choices[0]!.logprobs!.content![0]!.top_logprobs.map((t) => t.logprob);
    assert.notDeepEqual(top(other), top(r), "another image, another reply distribution");
    // streamed: the same reply
    const stream = await client.chat.completions.create({
      model: MODEL, max_tokens: 4, temperature: 0, stream: true,
      messages: [{ role: "user", content: [{ type: "text", text: "What is in this image?" }, { type: "image_url", image_url: { url: dataUrl(imgA) } }] }],
    });
    let text = "";
    for await (const c of stream) text += c.choices[0]?.delta.content ?? "";
    assert.equal(text, r.choices[0]!.message.content);
  });

  it("takes WebP and GIF images (OpenAI's and Anthropic's other formats): the same pixels as a PNG, the same reply", async () => {
    const fixture = (name: string) => readFileSync(fileURLToPath(new URL(`../../../test/fixtures/images/${name}`, import.meta.url)));
    const media = (name: string, type: string) => `data:image/${type};base64,${fixture(name).toString("base64")}`;
    const top = (r: Awaited<ReturnType<typeof ask>>) => r.choices[0]!.logprobs!.content!.map((t) => t.top_logprobs.map((x) => [x.token, x.logprob] as const));
    const want = top(await ask(media("pattern.png", "png")));
    for (const [name, type] of [["lossless.webp", "webp"], ["pattern.gif", "gif"]] as const) {
      const r = await ask(media(name, type));
      // the same pixels hash alike, so the PNG's blocks are reused (which moves logprobs in their last bits)
      assert.equal(r.usage.prompt_tokens_details?.cached_tokens, Math.floor((r.usage.prompt_tokens - 1) / 4) * 4, name);
      top(r).forEach((row, i) => row.forEach(([token, lp], j) => {
        assert.equal(token, want[i]![j]![0], name);
        assert.ok(Math.abs(lp - want[i]![j]![1]) < 1e-5, `${name}: ${lp} vs ${want[i]![j]![1]}`);
      }));
    }
  });

  it("fetches an http image; the same image hits the prefix cache, another does not", async () => {
    const a = await ask(dataUrl(imgA));
    const fetched = await ask(`${imageHost}/a.png`);
    assert.deepEqual(fetched.choices[0]!.logprobs, a.choices[0]!.logprobs);
    const prompt = a.usage.prompt_tokens;
    assert.equal(fetched.usage.prompt_tokens_details?.cached_tokens, Math.floor((prompt - 1) / 4) * 4); // all whole blocks
    const b = await ask(dataUrl(png(3)));
    // a new image: only the blocks before its first image token come from the cache
    assert.ok((b.usage.prompt_tokens_details?.cached_tokens ?? 0) < Math.floor((prompt - 1) / 4) * 4 - 4);
  });

  it("truncate_prompt_tokens moves the image with the text, drops an image it cuts away whole, refuses a cut inside it", async () => {
    const full = gemma3TextThenImageIds(setup.loaded.tokenizer, "What is in this image?", 4);
    const soft = setup.loaded.tokenizer.encode("<image_soft_token>", { addSpecialTokens: false })[0]!;
    const first = full.indexOf(soft), last = full.lastIndexOf(soft); // the image's tokens: its 4 soft tokens and their markers
    const top = (c: Awaited<ReturnType<typeof ask>>) => c.choices[0]!.logprobs!.content![0]!.top_logprobs.map((t) => t.logprob);
    // kept from just before the image's start marker: the image still answers (another image, another reply)
    const keep = full.length - (first - 2);
    const [a, b] = [await ask(dataUrl(imgA), { truncate_prompt_tokens: keep, return_token_ids: true }), await ask(dataUrl(imgB), { truncate_prompt_tokens: keep })];
    assert.deepEqual(a.prompt_token_ids, full.slice(full.length - keep));
    assert.notDeepEqual(top(a), top(b));
    // kept from after the image's end marker: no image left, so both images give the same reply
    const tail = full.length - (last + 2);
    const [c, d] = [await ask(dataUrl(imgA), { truncate_prompt_tokens: tail }), await ask(dataUrl(imgB), { truncate_prompt_tokens: tail })];
    top(c).forEach((x, i) => assert.ok(Math.abs(x - top(d)[i]!) < 1e-5, `${x} vs ${top(d)[i]}`)); // (a cached prefix moves the last bits)
    const r = await post({ ...withImages(dataUrl(imgA)), truncate_prompt_tokens: full.length - (first + 1) });
    assert.equal(r.status, 400);
    assert.equal(r.error.param, "truncate_prompt_tokens");
    assert.match(r.error.message, /inside an image/);
  });

  it("--allowed-local-media-path serves file: URLs under its directory only; --allowed-media-domains limits http(s) hosts", async () => {
    const root = realpathSync(mkdtempSync(join(tmpdir(), "kiln-media-")));
    const outside = realpathSync(mkdtempSync(join(tmpdir(), "kiln-outside-")));
    try {
      mkdirSync(join(root, "sub"));
      writeFileSync(join(root, "sub", "a.png"), imgA);
      writeFileSync(join(outside, "b.png"), imgB);
      symlinkSync(join(outside, "b.png"), join(root, "link.png"));
      const s = await serve({ imageInput: gemma3ImageInputSpec(dir, setup.loaded.tokenizer), mediaAccess: { localPath: root, domains: ["127.0.0.1"] } });
      const top = (r: Awaited<ReturnType<typeof ask>>) => r.choices[0]!.logprobs!.content!.map((t) => t.top_logprobs.map((x) => x.token));
      const want = top(await ask(dataUrl(imgA)));
      const fromFile = await s.client.chat.completions.create({
        model: MODEL, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 3,
        messages: [{ role: "user", content: [{ type: "text", text: "What is in this image?" }, { type: "image_url", image_url: { url: pathToFileURL(join(root, "sub", "a.png")).href } }] }],
      });
      assert.deepEqual(fromFile.choices[0]!.logprobs!.content!.map((t) => t.top_logprobs.map((x) => x.token)), want);
      assert.ok((await fetch(`${s.url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(withImages(`${imageHost}/a.png`)) })).ok);
      const refused: [string, RegExp][] = [
        [pathToFileURL(join(outside, "b.png")).href, /must be a subpath of `--allowed-local-media-path`/],
        [pathToFileURL(join(root, "link.png")).href, /must be a subpath of `--allowed-local-media-path`/], // a link out of it
        [pathToFileURL(join(root, "missing.png")).href, /no such file/],
        [imageHost.replace("127.0.0.1", "localhost") + "/a.png", /The URL must be from one of the allowed domains: \['127\.0\.0\.1'\]\. Input URL domain: localhost/],
      ];
      for (const [u, message] of refused) {
        const r = await post(withImages(u), s.url);
        assert.equal(r.status, 400, u);
        assert.match(r.error.message, message);
        assert.equal(r.error.param, "messages[0].content[1].image_url");
      }
      // without the flag a file URL is refused, in vLLM's words
      assert.match((await post(withImages(pathToFileURL(join(root, "sub", "a.png")).href))).error.message, /Cannot load local files without `--allowed-local-media-path`/);
    } finally {
      rmSync(root, { recursive: true });
      rmSync(outside, { recursive: true });
    }
  });

  async function post(body: unknown, base = url): Promise<{ status: number; error: { message: string; param: string | null; type: string } }> {
    const res = await fetch(`${base}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    return { status: res.status, error: ((await res.json()) as { error: { message: string; param: string | null; type: string } }).error };
  }
  const withImages = (...urls: string[]) => ({
    model: MODEL, max_tokens: 2,
    messages: [{ role: "user", content: [{ type: "text", text: "Look:" }, ...urls.map((u) => ({ type: "image_url", image_url: { url: u } }))] }],
  });

  it("answers bad images with vLLM's 400s, naming the part", async () => {
    const cases: [unknown, RegExp, string][] = [
      [withImages(dataUrl(imgA), dataUrl(imgA), dataUrl(imgA)), /^At most 2 image\(s\) may be provided in one prompt\. Set `--limit-mm-per-prompt` to increase this limit\.$/, "messages[0].content[3].image_url"],
      [withImages("data:image/png,abc"), /Only base64 data URLs are supported/, "messages[0].content[1].image_url"],
      [withImages("data:image/png;base64,@@@not base64@@@"), /base64 data is malformed/, "messages[0].content[1].image_url"],
      [withImages(`data:image/png;base64,${Buffer.from("hello, not an image").toString("base64")}`), /not a PNG, JPEG, WebP or GIF/, "messages[0].content[1].image_url"],
      [withImages(dataUrl(imgA.subarray(0, 60))), /cannot decode the PNG image/, "messages[0].content[1].image_url"],
      [withImages("ftp://example.com/a.png"), /The URL must be either a HTTP, data or file URL\./, "messages[0].content[1].image_url"],
      [withImages(`${imageHost}/missing.png`), /HTTP 404/, "messages[0].content[1].image_url"],
      [{ ...withImages(dataUrl(imgA)), messages: [{ role: "user", content: [{ type: "image_url", image_url: {} }] }] }, /image_url\.url' must be a non-empty string/, "messages[0].content[0].image_url"],
    ];
    for (const [body, message, param] of cases) {
      const r = await post(body);
      assert.equal(r.status, 400, JSON.stringify(r.error));
      assert.match(r.error.message, message);
      assert.equal(r.error.param, param);
      assert.equal(r.error.type, "invalid_request_error"); // (Kiln's type for every 400)
    }
  });

  it("a text-only model (or --limit-mm-per-prompt image=0) takes no image", async () => {
    const textOnly = await serve({ imageInput: null });
    const r = await post(withImages(dataUrl(imgA)), textOnly.url);
    assert.equal(r.status, 400);
    assert.equal(r.error.message, "At most 0 image(s) may be provided in one prompt.");
    assert.equal(r.error.param, "messages[0].content[1].image_url");
    // and text still works there
    const ok = await textOnly.client.chat.completions.create({ model: MODEL, max_tokens: 2, messages: [{ role: "user", content: "Hello" }] });
    assert.equal(ok.choices.length, 1);
  });
});
