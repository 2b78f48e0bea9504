// Image bytes (PNG, JPEG, WebP or GIF: the formats OpenAI's and Anthropic's APIs take) to 8-bit RGB pixels, as vLLM
// loads an image (PIL, then convert("RGB") with a transparent image composited over white: vLLM's rgba_to_rgb, HF's
// convert_to_rgb), and PIL's bilinear resize of such pixels. WebP is decoded by libwebp (compiled to wasm,
// @cwasm/webp), GIF's first frame by omggif.
import { createRequire } from "node:module";
import jpeg from "jpeg-js";
import { PNG } from "pngjs";
import { KilnError } from "../util/errors.js";

/** Bytes that are no image Kiln can decode (unknown format, or a corrupt file). */
export class ImageDecodeError extends KilnError {
  override name = "ImageDecodeError";
}

/** 8-bit RGB pixels, row-major, interleaved: data[(y * width + x) * 3 + c]. */
export interface RgbImage {
  width: number;
  height: number;
  data: Uint8Array;
}

/** The background a transparent image is composited over by default. */
const WHITE = [255, 255, 255] as const;

/** The largest image decoded, in megapixels (jpeg-js's own default bound, applied to PNG as well). */
const MAX_MEGAPIXELS = 100;

type ImageFormat = "png" | "jpeg" | "webp" | "gif";

/** The container format of `bytes` from its signature, or null. */
export function imageFormat(bytes: Uint8Array): ImageFormat | null {
  const ascii = (at: number, s: string) => bytes.length >= at + s.length && [...s].every((c, i) => bytes[at + i] === c.charCodeAt(0));
  if (bytes.length >= 8 && bytes[0] === 0x89 && ascii(1, "PNG")) return "png";
  if (bytes.length >= 3 && bytes[0] === 0xff && bytes[1] === 0xd8 && bytes[2] === 0xff) return "jpeg";
  if (ascii(0, "RIFF") && ascii(8, "WEBP")) return "webp";
  if (ascii(0, "GIF87a") || ascii(0, "GIF89a")) return "gif";
  return null;
}

type Rgba = { width: number; height: number; data: Uint8Array };
const require = createRequire(import.meta.url);
let webpDecoder: ((bytes: Uint8Array) => { width: number; height: number; data: Uint8ClampedArray }) | null = null;

/**
 * A WebP file's canvas size from its first chunk (VP8X: the canvas; VP8L: the lossless bitstream's header; VP8: the
 * key frame's header), read before decoding so an oversized image is refused without decoding it.
 */
function webpSize(b: Uint8Array): { width: number; height: number } {
  const chunk = String.fromCharCode(...b.subarray(12, 16));
  const u24 = (at: number) => b[at]! | (b[at + 1]! << 8) | (b[at + 2]! << 16);
  if (chunk === "VP8X" && b.length >= 30) return { width: u24(24) + 1, height: u24(27) + 1 };
  if (chunk === "VP8L" && b.length >= 25) {
    const bits = (b[21]! | (b[22]! << 8) | (b[23]! << 16) | (b[24]! << 24)) >>> 0;
    return { width: (bits & 0x3fff) + 1, height: ((bits >>> 14) & 0x3fff) + 1 };
  }
  if (chunk === "VP8 " && b.length >= 30) return { width: (b[26]! | (b[27]! << 8)) & 0x3fff, height: (b[28]! | (b[29]! << 8)) & 0x3fff };
  throw new Error(`unknown WebP chunk ${JSON.stringify(chunk)}`);
}

function decodeWebp(bytes: Uint8Array): Rgba {
  // VP8X's flags byte: bit 1 marks an animation, which libwebp's still-image API does not decode
  if (String.fromCharCode(...bytes.subarray(12, 16)) === "VP8X" && ((bytes[20] ?? 0) & 0x02) !== 0)
    throw new ImageDecodeError("animated WebP images are not supported (send a still image)");
  const { width, height } = webpSize(bytes);
  checkSize(width, height);
  webpDecoder ??= (require("@cwasm/webp") as { decode: typeof webpDecoder & object }).decode;
  const img = webpDecoder(bytes); // throws on a corrupt or animated file (libwebp's simple API decodes stills)
  return { width: img.width, height: img.height, data: new Uint8Array(img.data.buffer, img.data.byteOffset, img.data.byteLength) };
}

interface GifFrame {
  x: number; y: number; width: number; height: number; palette_offset: number | null; transparent_index: number | null;
}
interface GifReader {
  width: number; height: number; numFrames(): number; frameInfo(i: number): GifFrame; decodeAndBlitFrameRGBA(i: number, pixels: Uint8Array): void;
}

/**
 * A GIF's first frame (what PIL's Image.open shows) as RGB through its palette, as PIL's P -> RGB conversion maps
 * it: a transparent pixel takes its palette color (convert("RGB") ignores the transparency), and pixels outside the
 * frame take the transparent index's color where there is one, else the background color's.
 */
function decodeGif(bytes: Uint8Array): Rgba {
  const { GifReader } = require("omggif") as { GifReader: new (b: Uint8Array) => GifReader };
  const reader = new GifReader(bytes);
  checkSize(reader.width, reader.height);
  if (reader.numFrames() < 1) throw new Error("the GIF has no frame");
  const frame = reader.frameInfo(0);
  if (frame.palette_offset === null) throw new Error("the GIF's first frame has no palette");
  const fill = frame.transparent_index ?? bytes[11]!; // the logical screen's background color index
  const at = frame.palette_offset + 3 * fill;
  const data = new Uint8Array(reader.width * reader.height * 4);
  data.set([bytes[at] ?? 0, bytes[at + 1] ?? 0, bytes[at + 2] ?? 0, 255]);
  for (let n = 4; n < data.length; n *= 2) data.copyWithin(n, 0, Math.min(n, data.length - n)); // the pixel, doubled
  reader.decodeAndBlitFrameRGBA(0, data); // (transparent pixels are skipped: they keep the fill)
  return { width: reader.width, height: reader.height, data };
}

function checkSize(width: number, height: number): void {
  if (width * height > MAX_MEGAPIXELS * 1e6) throw new ImageDecodeError(`the image is ${width}x${height}, over ${MAX_MEGAPIXELS} megapixels`);
}

/**
 * Decodes PNG, JPEG, WebP or GIF bytes to RGB; transparent pixels are composited over `background` (white, vLLM's
 * default rgba_background_color) as PIL's alpha_composite does.
 */
export function decodeImage(bytes: Uint8Array, background: readonly [number, number, number] = WHITE): RgbImage {
  const format = imageFormat(bytes);
  if (format === null) throw new ImageDecodeError("cannot identify the image: not a PNG, JPEG, WebP or GIF file");
  let rgba: Rgba;
  try {
    if (format === "png") {
      const png = PNG.sync.read(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength));
      rgba = { width: png.width, height: png.height, data: png.data };
    } else if (format === "jpeg") {
      rgba = jpeg.decode(bytes, { useTArray: true, formatAsRGBA: true, maxResolutionInMP: MAX_MEGAPIXELS });
    } else if (format === "webp") {
      rgba = decodeWebp(bytes);
    } else {
      rgba = decodeGif(bytes);
    }
  } catch (e) {
    if (e instanceof ImageDecodeError) throw e;
    throw new ImageDecodeError(`cannot decode the ${format === "webp" ? "WebP" : format.toUpperCase()} image: ${(e as Error).message}`);
  }
  if (rgba.width < 1 || rgba.height < 1) throw new ImageDecodeError(`the ${format.toUpperCase()} image is empty (${rgba.width}x${rgba.height})`);
  checkSize(rgba.width, rgba.height);
  return rgbaToRgb(rgba.width, rgba.height, rgba.data, background);
}

/**
 * RGBA over an opaque background (white unless given), as PIL's Image.alpha_composite computes it (integer math with
 * 7 extra bits, divisions by 255 rounded), then the alpha dropped; opaque pixels pass unchanged.
 */
export function rgbaToRgb(width: number, height: number, rgba: Uint8Array, background: readonly [number, number, number] = WHITE): RgbImage {
  const n = width * height;
  const out = new Uint8Array(n * 3);
  const P = 7;
  for (let i = 0; i < n; i++) {
    const a = rgba[4 * i + 3]!;
    for (let c = 0; c < 3; c++) {
      const src = rgba[4 * i + c]!;
      if (a === 255) {
        out[3 * i + c] = src;
        continue;
      }
      // PIL: blend = dst.a * (255 - src.a); outa255 = src.a * 255 + blend; coef1 = src.a * 255 * 255 * 2^P / outa255
      const outa255 = a * 255 + 255 * (255 - a);
      const coef1 = Math.floor((a * 255 * 255 * (1 << P)) / outa255);
      const coef2 = 255 * (1 << P) - coef1;
      const tmp = src * coef1 + background[c]! * coef2 + (0x80 << P);
      out[3 * i + c] = (((tmp >>> 8) + tmp) >>> 8) >>> P;
    }
  }
  return { width, height, data: out };
}

/** PIL's fixed-point precision of resampling weights for 8-bit images. */
const PRECISION_BITS = 32 - 8 - 2;

/**
 * PIL's per-output-pixel weights of a bilinear (triangle) filter from `inSize` to `outSize` pixels: the filter widens
 * by the scale when shrinking (antialiasing), weights are normalised over the pixels inside the image and then
 * rounded to PRECISION_BITS fixed point. Returns each output pixel's first input pixel and its integer weights.
 */
function bilinearCoefficients(inSize: number, outSize: number): { start: Int32Array; weights: Int32Array[] } {
  const scale = inSize / outSize;
  const filterScale = Math.max(scale, 1);
  const support = filterScale; // the triangle's support is 1
  const start = new Int32Array(outSize);
  const weights: Int32Array[] = [];
  for (let x = 0; x < outSize; x++) {
    const center = (x + 0.5) * scale;
    const lo = Math.max(0, Math.trunc(center - support + 0.5));
    const hi = Math.min(inSize, Math.trunc(center + support + 0.5));
    const w = new Float64Array(hi - lo);
    let sum = 0;
    for (let i = 0; i < w.length; i++) {
      const d = Math.abs((i + lo - center + 0.5) / filterScale);
      w[i] = d < 1 ? 1 - d : 0;
      sum += w[i]!;
    }
    const fixed = new Int32Array(w.length);
    for (let i = 0; i < w.length; i++) {
      const k = sum !== 0 ? w[i]! / sum : w[i]!;
      fixed[i] = Math.trunc(k < 0 ? -0.5 + k * (1 << PRECISION_BITS) : 0.5 + k * (1 << PRECISION_BITS));
    }
    start[x] = lo;
    weights.push(fixed);
  }
  return { start, weights };
}

/** One separable pass of PIL's 8-bit resampling along x (horizontal) or y, rounding and clamping to 0..255. */
function resamplePass(src: RgbImage, outSize: number, horizontal: boolean): RgbImage {
  const inSize = horizontal ? src.width : src.height;
  const { start, weights } = bilinearCoefficients(inSize, outSize);
  const width = horizontal ? outSize : src.width;
  const height = horizontal ? src.height : outSize;
  const out = new Uint8Array(width * height * 3);
  const half = 1 << (PRECISION_BITS - 1);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const o = horizontal ? x : y;
      const w = weights[o]!;
      const s = start[o]!;
      for (let c = 0; c < 3; c++) {
        let acc = half;
        for (let i = 0; i < w.length; i++) {
          const at = horizontal ? (y * src.width + s + i) * 3 + c : ((s + i) * src.width + x) * 3 + c;
          acc += src.data[at]! * w[i]!;
        }
        const v = Math.floor(acc / (1 << PRECISION_BITS));
        out[(y * width + x) * 3 + c] = v < 0 ? 0 : v > 255 ? 255 : v;
      }
    }
  }
  return { width, height, data: out };
}

/** PIL's Image.resize((width, height), BILINEAR) of an 8-bit RGB image: a horizontal pass, then a vertical one. */
export function resizeBilinear(img: RgbImage, width: number, height: number): RgbImage {
  let out = img;
  if (width !== img.width) out = resamplePass(out, width, true);
  if (height !== img.height) out = resamplePass(out, height, false);
  return out;
}
