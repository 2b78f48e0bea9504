// A chat request's images (OpenAI image_url parts) into an image-text model's input, as vLLM's chat path does: the
// count checked against --limit-mm-per-prompt, each URL loaded (data: URLs, base64; http(s): fetched), decoded and
// processed, the template's image placeholders expanded and each image's positions found. Every failure is a 400
// naming the part.
import { ImageDecodeError } from "../models/image-decode.js";
import { GEMMA3_BOI, gemma3ImagePrompt, gemma3ProcessImage, type Gemma3ImageInputSpec, type ImageFeatureSpec } from "../models/gemma3-image-processor.js";
import type { ChatMessage } from "../models/tokenizer-types.js";
import { badRequest } from "./errors.js";
import type { ImageRef } from "./protocol.js";

/** vLLM's default --limit-mm-per-prompt of each modality. */
export const DEFAULT_IMAGE_LIMIT = 999;
/** vLLM's VLLM_IMAGE_FETCH_TIMEOUT (seconds) for an http(s) image. */
const FETCH_TIMEOUT_MS = 5000;
/** The largest image file read (bytes). */
const MAX_IMAGE_BYTES = 64 << 20;

/** Refuses more images than the server takes (none for a text-only model), in vLLM's words. */
export function checkImageCount(images: readonly ImageRef[], spec: Gemma3ImageInputSpec | null, limit: number): void {
  const allowed = spec === null ? 0 : limit;
  if (images.length <= allowed) return;
  // vLLM adds the flag's hint where the model could take more
  const hint = spec === null ? "" : " Set `--limit-mm-per-prompt` to increase this limit.";
  throw badRequest(`At most ${allowed} image(s) may be provided in one prompt.${hint}`, images[allowed]!.param);
}

/** A data: URL's bytes (base64 only, as vLLM's MediaConnector reads them). */
function dataUrlBytes(url: string, param: string): Uint8Array {
  const comma = url.indexOf(",");
  if (comma < 0) throw badRequest("the data URL has no ',' before its data (expected data:<media type>;base64,<data>)", param);
  const spec = url.slice("data:".length, comma);
  if (!spec.split(";").slice(1).includes("base64")) throw badRequest("Only base64 data URLs are supported for now.", param);
  const data = url.slice(comma + 1).replace(/\s+/g, "");
  if (data.length === 0 || data.length % 4 !== 0 || !/^[A-Za-z0-9+/]*={0,2}$/.test(data))
    throw badRequest("the data URL's base64 data is malformed", param);
  return new Uint8Array(Buffer.from(data, "base64"));
}

/** An http(s) image's bytes. */
async function fetchImage(url: string, param: string): Promise<Uint8Array> {
  let res: Response;
  try {
    res = await fetch(url, { signal: AbortSignal.timeout(FETCH_TIMEOUT_MS), redirect: "follow" });
  } catch (e) {
    throw badRequest(`cannot fetch the image at ${url}: ${(e as Error).message}`, param);
  }
  if (!res.ok) throw badRequest(`cannot fetch the image at ${url}: HTTP ${res.status}`, param);
  const bytes = new Uint8Array(await res.arrayBuffer());
  if (bytes.length > MAX_IMAGE_BYTES) throw badRequest(`the image at ${url} is over ${MAX_IMAGE_BYTES >> 20} MiB`, param);
  return bytes;
}

/** One image_url part's bytes: a data: URL's, or an http(s) URL's fetched. */
export async function loadImageBytes(ref: ImageRef): Promise<Uint8Array> {
  const scheme = /^([a-zA-Z][a-zA-Z0-9+.-]*):/.exec(ref.url)?.[1]?.toLowerCase();
  if (scheme === "data") return dataUrlBytes(ref.url, ref.param);
  if (scheme === "http" || scheme === "https") return fetchImage(ref.url, ref.param);
  if (scheme === "file") throw badRequest("Cannot load local files without `--allowed-local-media-path`.", ref.param);
  throw badRequest("The URL must be either a HTTP, data or file URL.", ref.param);
}

/**
 * The messages as the template sees them with images: a "string" content format reads each message's content with
 * one `<start_of_image>` per image before its text, joined by newlines (vLLM's placeholders); an "openai" one its parts.
 */
export function messagesWithPlaceholders(messages: ChatMessage[]): ChatMessage[] {
  return messages.map((m) => {
    const n = m.contentParts?.filter((p) => p.type === "image").length ?? 0;
    return n === 0 ? m : { ...m, content: [...Array<string>(n).fill(GEMMA3_BOI), ...(m.content ? [m.content] : [])].join("\n") };
  });
}

/**
 * The rendered prompt with its images: each loaded and processed (400s naming the part), the placeholders expanded,
 * the token ids and each image's feature positions.
 */
export async function imagePrompt(
  promptText: string, images: readonly ImageRef[], spec: Gemma3ImageInputSpec, encode: (text: string) => number[],
): Promise<{ promptText: string; promptTokenIds: number[]; features: ImageFeatureSpec[] }> {
  const pixels: Float32Array[] = [];
  for (const ref of images) {
    const bytes = await loadImageBytes(ref);
    try {
      pixels.push(gemma3ProcessImage(bytes, spec.processor));
    } catch (e) {
      if (e instanceof ImageDecodeError) throw badRequest(e.message, ref.param);
      throw e;
    }
  }
  try {
    return gemma3ImagePrompt(promptText, pixels, spec, encode);
  } catch (e) {
    if (e instanceof RangeError) throw badRequest(`${e.message} (the chat template must write one ${GEMMA3_BOI} per image)`, "messages");
    throw e;
  }
}
