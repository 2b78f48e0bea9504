// Images for the image-input tests: random PNGs, their data: URLs, a tiny http server that serves them, and the prompt
// Gemma 3's template and Gemma3Processor make of one user turn of text then an image (written out by hand, so the
// server's expansion is checked against it rather than against itself).
import * as http from "node:http";
import { PNG } from "pngjs";
import { AsyncLLM } from "../../src/engine/async-llm.js";
import { createServingSetupSync } from "../../src/engine/serving.js";
import { withChatTemplateDefaults } from "../../src/models/chat-content-format.js";
import type { TokenizerLike } from "../../src/models/tokenizer-types.js";
import { mulberry32 } from "../../src/util/random.js";
import { tinyGemma3VisionDir } from "./tiny-model.js";

/**
 * A real engine over the random tiny Gemma 3 image-text model: its directory and serving set-up, an AsyncLLM over it,
 * and the tokenizer a server gives it (content format "auto", as kiln serve's default).
 */
export function tinyVisionEngine(maxModelLen = 128) {
  const dir = tinyGemma3VisionDir();
  const setup = createServingSetupSync({ model: dir, maxModelLen, kvCacheMemory: 2 << 20, blockSize: 4 });
  const engine = new AsyncLLM({ runner: setup.runner, tokenizer: setup.loaded.tokenizer, engineArgs: setup.engineArgs });
  return { dir, setup, engine, tokenizer: withChatTemplateDefaults(setup.loaded.tokenizer, { contentFormat: "auto", kwargs: null }) };
}

/** An opaque random PNG. */
export function png(seed: number, width = 24, height = 18): Buffer {
  const u = mulberry32(seed);
  const p = new PNG({ width, height });
  for (let i = 0; i < width * height * 4; i++) p.data[i] = i % 4 === 3 ? 255 : Math.floor(u() * 256);
  return PNG.sync.write(p);
}

export const dataUrl = (b: Buffer): string => `data:image/png;base64,${b.toString("base64")}`;

/** Serves `files` (path -> bytes) as image/png; anything else is a 404. */
export async function serveFiles(files: Record<string, Buffer>): Promise<{ url: string; close(): Promise<void> }> {
  const server = http.createServer((req, res) => {
    const body = files[req.url ?? ""];
    if (body !== undefined) res.writeHead(200, { "content-type": "image/png" }).end(body);
    else res.writeHead(404).end();
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(server.address() as { port: number }).port}`,
    close: () => new Promise((r) => { server.closeAllConnections(); server.close(() => r()); }),
  };
}

/**
 * The token ids of Gemma 3's prompt for one user turn of `text` then one image (the template writes the parts in
 * order; the processor puts "\n\n", the image's tokens and "\n\n" where it wrote <start_of_image>).
 */
export function gemma3TextThenImageIds(tokenizer: TokenizerLike, text: string, mmTokensPerImage: number): number[] {
  const image = `\n\n<start_of_image>${"<image_soft_token>".repeat(mmTokensPerImage)}<end_of_image>\n\n`;
  return tokenizer.encode(`<bos><start_of_turn>user\n${text}${image}<end_of_turn>\n<start_of_turn>model\n`, { addSpecialTokens: false });
}
