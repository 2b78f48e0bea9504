// Gemma 3's image processor (HF Gemma3ImageProcessor): RGB pixels resized to image_size x image_size (PIL bilinear),
// rescaled by 1/255 and normalised with mean 0.5 and std 0.5 per channel, as channel-first float32 pixel_values
// [3, size, size]; with pan-and-scan, the image's crops likewise after it. And the prompt text one image stands for
// (processing_gemma3.py).
import { createHash } from "node:crypto";
import { decodeImage, resizeBilinear, type RgbImage } from "./image-decode.js";
import { applyMmProcessorKwargs, cropImage, PAN_AND_SCAN_DEFAULTS, panAndScanCrops, type PanAndScanConfig } from "./gemma3-pan-and-scan.js";

/** Gemma 3's processor settings (preprocessor_config.json's defaults). */
export interface Gemma3ImageProcessorConfig {
  /** vision_config.image_size (896 for the released models). */
  imageSize: number;
  /** Per-channel mean and std of the normalisation (0.5 each: pixels end in [-1, 1]). */
  imageMean: readonly [number, number, number];
  imageStd: readonly [number, number, number];
  /** Pan-and-scan (off by default; preprocessor_config.json, --mm-processor-kwargs, a request's mm_processor_kwargs). */
  panAndScan: PanAndScanConfig;
}

export const GEMMA3_IMAGE_DEFAULTS = { imageMean: [0.5, 0.5, 0.5], imageStd: [0.5, 0.5, 0.5], panAndScan: PAN_AND_SCAN_DEFAULTS } as const;

/** pixel_values [3, size, size] (channel-first, float32) of an RGB image, as Gemma3ImageProcessor computes them. */
export function gemma3PixelValues(img: RgbImage, cfg: Gemma3ImageProcessorConfig): Float32Array {
  const S = cfg.imageSize;
  const r = resizeBilinear(img, S, S);
  const out = new Float32Array(3 * S * S);
  for (let c = 0; c < 3; c++) {
    const mean = cfg.imageMean[c]!, std = cfg.imageStd[c]!;
    for (let i = 0; i < S * S; i++) {
      // HF rescales in float64 and casts to float32, then normalises in float32
      const scaled = Math.fround(r.data[3 * i + c]! / 255);
      out[c * S * S + i] = Math.fround(Math.fround(scaled - mean) / std);
    }
  }
  return out;
}

/** PNG or JPEG bytes to Gemma 3's pixel_values [3, size, size] (throws ImageDecodeError for other bytes). */
export function gemma3ProcessImage(bytes: Uint8Array, cfg: Gemma3ImageProcessorConfig): Float32Array {
  return gemma3PixelValues(decodeImage(bytes), cfg);
}

/** An image's pixel_values and then its pan-and-scan crops' (none with pan-and-scan off): what its prompt text holds. */
export function gemma3ImageWithCrops(img: RgbImage, cfg: Gemma3ImageProcessorConfig): Float32Array[] {
  return [img, ...panAndScanCrops(img.width, img.height, cfg.panAndScan).map((box) => cropImage(img, box))].map((im) => gemma3PixelValues(im, cfg));
}

/** Gemma 3's image tokens (tokenizer_config.json's boi_token, image_token, eoi_token). */
export const GEMMA3_BOI = "<start_of_image>";
export const GEMMA3_IMAGE_TOKEN = "<image_soft_token>";
export const GEMMA3_EOI = "<end_of_image>";

/**
 * What Gemma3Processor puts in the text for each `<start_of_image>`: "\n\n<start_of_image>", mm_tokens_per_image
 * `<image_soft_token>`s, "<end_of_image>\n\n" (its full_image_sequence).
 */
export function gemma3FullImageSequence(mmTokensPerImage: number): string {
  return `\n\n${GEMMA3_BOI}${GEMMA3_IMAGE_TOKEN.repeat(mmTokensPerImage)}${GEMMA3_EOI}\n\n`;
}

/**
 * What Gemma3Processor puts in the text for an image with `numCrops` pan-and-scan crops: the full image sequence, or
 * with crops "Here is the original image {seq} and here are some crops to help you see better {seq} {seq}...".
 */
export function gemma3ImageText(numCrops: number, mmTokensPerImage: number): string {
  const seq = gemma3FullImageSequence(mmTokensPerImage);
  if (numCrops === 0) return seq;
  return `Here is the original image ${seq} and here are some crops to help you see better ${Array<string>(numCrops).fill(seq).join(" ")}`;
}

/**
 * The prompt with each `<start_of_image>` expanded to its image's text (`numCrops[i]`: image i's crops); throws when
 * the placeholders are not one per image.
 */
export function expandGemma3ImageTokens(prompt: string, numCrops: readonly number[], mmTokensPerImage: number): string {
  const parts = prompt.split(GEMMA3_BOI);
  if (parts.length - 1 !== numCrops.length)
    throw new RangeError(`the prompt has ${parts.length - 1} ${GEMMA3_BOI} placeholder(s) for ${numCrops.length} image(s)`);
  return parts.map((part, i) => (i === 0 ? part : gemma3ImageText(numCrops[i - 1]!, mmTokensPerImage) + part)).join("");
}

/** One image (or one crop of it) of a prompt: the run of positions its embeddings fill (the engine's MultiModalFeature). */
export interface ImageFeatureSpec {
  /** sha256 of the processed pixels and the processor settings, pan-and-scan's included (vLLM's mm_hash). */
  hash: string;
  offset: number;
  length: number;
  pixelValues: Float32Array;
}

/** What an image-text Gemma 3 model takes of each image: its processor's settings and the image token's id. */
export interface Gemma3ImageInputSpec {
  processor: Gemma3ImageProcessorConfig;
  mmTokensPerImage: number;
  imageTokenIndex: number;
}

/**
 * `spec` with processor kwargs applied (vLLM's mm_processor_kwargs: --mm-processor-kwargs over preprocessor_config.json,
 * a request's over both); throws MmProcessorKwargsError for a key or value Gemma 3 does not take.
 */
export function withMmProcessorKwargs(spec: Gemma3ImageInputSpec, kwargs: unknown): Gemma3ImageInputSpec {
  if (kwargs === undefined || kwargs === null) return spec;
  return { ...spec, processor: { ...spec.processor, panAndScan: applyMmProcessorKwargs(spec.processor.panAndScan, kwargs) } };
}

/**
 * A rendered chat prompt with one `<start_of_image>` per image: its token ids with each image expanded as
 * Gemma3Processor does, and each image's processed pixels (`images[i]`: image i's, then its crops') at the runs of
 * `<image_soft_token>` positions they fill, one feature per run. `encode` tokenizes without adding special tokens
 * (the template wrote `<bos>`).
 */
export function gemma3ImagePrompt(
  prompt: string, images: readonly (readonly Float32Array[])[], spec: Gemma3ImageInputSpec, encode: (text: string) => number[],
): { promptText: string; promptTokenIds: number[]; features: ImageFeatureSpec[] } {
  const promptText = expandGemma3ImageTokens(prompt, images.map((withCrops) => withCrops.length - 1), spec.mmTokensPerImage);
  const pixelValues = images.flat();
  const ids = encode(promptText);
  const features: ImageFeatureSpec[] = [];
  for (let i = 0; i < ids.length; i++) {
    if (ids[i] !== spec.imageTokenIndex) continue;
    let j = i;
    while (j < ids.length && ids[j] === spec.imageTokenIndex) j++;
    const pixels = pixelValues[features.length];
    if (pixels === undefined || j - i !== spec.mmTokensPerImage)
      throw new RangeError(`the prompt's image token runs do not match its ${images.length} image(s) of ${spec.mmTokensPerImage} tokens each (a prompt text may not contain ${GEMMA3_IMAGE_TOKEN})`);
    features.push({ hash: gemma3ImageHash(pixels, spec.processor), offset: i, length: j - i, pixelValues: pixels });
    i = j - 1;
  }
  if (features.length !== pixelValues.length) throw new RangeError(`the prompt holds ${features.length} image token runs for ${pixelValues.length} image(s) and crops`);
  return { promptText, promptTokenIds: ids, features };
}

/** An image's content hash (vLLM's mm_hash): sha256 of the processor settings and the processed pixels. */
export function gemma3ImageHash(pixels: Float32Array, cfg: Gemma3ImageProcessorConfig): string {
  const h = createHash("sha256");
  h.update(JSON.stringify(cfg));
  h.update(new Uint8Array(pixels.buffer, pixels.byteOffset, pixels.byteLength));
  return h.digest("hex");
}
