// Gemma 3's image processor (HF Gemma3ImageProcessor with its defaults, pan-and-scan off): RGB pixels resized to
// image_size x image_size (PIL bilinear), rescaled by 1/255 and normalised with mean 0.5 and std 0.5 per channel, as
// channel-first float32 pixel_values [3, size, size]. And the prompt text one image stands for (processing_gemma3.py).
import { createHash } from "node:crypto";
import { decodeImage, resizeBilinear, type RgbImage } from "./image-decode.js";

/** Gemma 3's processor settings (preprocessor_config.json's defaults). */
export interface Gemma3ImageProcessorConfig {
  /** vision_config.image_size (896 for the released models). */
  imageSize: number;
  /** Per-channel mean and std of the normalisation (0.5 each: pixels end in [-1, 1]). */
  imageMean: readonly [number, number, number];
  imageStd: readonly [number, number, number];
}

export const GEMMA3_IMAGE_DEFAULTS = { imageMean: [0.5, 0.5, 0.5], imageStd: [0.5, 0.5, 0.5] } as const;

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

/** The prompt with each `<start_of_image>` expanded to the full image sequence; throws when the count is not `numImages`. */
export function expandGemma3ImageTokens(prompt: string, numImages: number, mmTokensPerImage: number): string {
  const parts = prompt.split(GEMMA3_BOI);
  if (parts.length - 1 !== numImages)
    throw new RangeError(`the prompt has ${parts.length - 1} ${GEMMA3_BOI} placeholder(s) for ${numImages} image(s)`);
  return parts.join(gemma3FullImageSequence(mmTokensPerImage));
}

/** One image of a prompt: the runs of positions its embeddings fill (the engine's MultiModalFeature). */
export interface ImageFeatureSpec {
  /** sha256 of the processed pixels and the processor settings (vLLM's mm_hash: equal images share it). */
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
 * A rendered chat prompt with one `<start_of_image>` per image: its token ids with each image expanded as
 * Gemma3Processor does, and each image's processed pixels at the run of `<image_soft_token>` positions it fills.
 * `encode` tokenizes without adding special tokens (the template wrote `<bos>`).
 */
export function gemma3ImagePrompt(
  prompt: string, pixelValues: readonly Float32Array[], spec: Gemma3ImageInputSpec, encode: (text: string) => number[],
): { promptText: string; promptTokenIds: number[]; features: ImageFeatureSpec[] } {
  const promptText = expandGemma3ImageTokens(prompt, pixelValues.length, spec.mmTokensPerImage);
  const ids = encode(promptText);
  const features: ImageFeatureSpec[] = [];
  for (let i = 0; i < ids.length; i++) {
    if (ids[i] !== spec.imageTokenIndex) continue;
    let j = i;
    while (j < ids.length && ids[j] === spec.imageTokenIndex) j++;
    const pixels = pixelValues[features.length];
    if (pixels === undefined || j - i !== spec.mmTokensPerImage)
      throw new RangeError(`the prompt's image token runs do not match its ${pixelValues.length} image(s) of ${spec.mmTokensPerImage} tokens (a prompt text may not contain ${GEMMA3_IMAGE_TOKEN})`);
    features.push({ hash: gemma3ImageHash(pixels, spec.processor), offset: i, length: j - i, pixelValues: pixels });
    i = j - 1;
  }
  if (features.length !== pixelValues.length) throw new RangeError(`the prompt holds ${features.length} image token runs for ${pixelValues.length} image(s)`);
  return { promptText, promptTokenIds: ids, features };
}

/** An image's content hash (vLLM's mm_hash): sha256 of the processor settings and the processed pixels. */
export function gemma3ImageHash(pixels: Float32Array, cfg: Gemma3ImageProcessorConfig): string {
  const h = createHash("sha256");
  h.update(JSON.stringify(cfg));
  h.update(new Uint8Array(pixels.buffer, pixels.byteOffset, pixels.byteLength));
  return h.digest("hex");
}
