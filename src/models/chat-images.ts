// A chat's images as an image-text model takes them, shared by the server's chat path, the offline LLM.chat (as
// vLLM's chat_utils serves both) and the router's precise prefix routing: the chat API's wire messages and OpenAI
// content parts read into the template's messages and the images' sources,
// the count checked against --limit-mm-per-prompt, each image loaded (a data: URL's base64, an http(s) URL fetched,
// or bytes / decoded pixels given offline), decoded and processed, and the template's placeholders expanded. Every
// failure is a ChatInputError naming the part (over HTTP, a 400 with that param).
import { readFileSync, realpathSync, statSync } from "node:fs";
import { sep } from "node:path";
import { fileURLToPath } from "node:url";
import { KilnError } from "../util/errors.js";
import { decodeImage, ImageDecodeError, type RgbImage } from "./image-decode.js";
import {
  GEMMA3_BOI, gemma3ImagePrompt, gemma3ImageWithCrops, type Gemma3ImageInputSpec, type Gemma3ImageProcessorConfig, type ImageFeatureSpec,
} from "./gemma3-image-processor.js";
import { templateToolCall } from "./chat-content-format.js";
import type { ChatContentPart, ChatMessage } from "./tokenizer-types.js";

/** A chat input that cannot be served; `param` names it as the request spells it (`messages[0].content[1].image_url`). */
export class ChatInputError extends KilnError {
  override name = "ChatInputError";
  constructor(
    readonly param: string,
    message: string,
  ) {
    super(message);
  }
}

/** vLLM's default --limit-mm-per-prompt of each modality. */
export const DEFAULT_IMAGE_LIMIT = 999;
/** vLLM's VLLM_IMAGE_FETCH_TIMEOUT (seconds) for an http(s) image. */
const FETCH_TIMEOUT_MS = 5000;
/** The largest image file read (bytes). */
const MAX_IMAGE_BYTES = 64 << 20;

/** One image of a chat: a URL (data:, http(s):), or (offline) file bytes or decoded pixels; `param` names its part. */
export type ChatImage = { param: string } & ({ url: string } | { image: Uint8Array | RgbImage });

/**
 * A content part as LLM.chat takes it: OpenAI's text and image_url parts, and an image's file bytes (PNG, JPEG) or
 * decoded RGB pixels, which a JSON request cannot carry.
 */
export type ChatInputPart =
  | { type: "text"; text: string }
  | { type: "image_url"; image_url: string | { url: string; detail?: string } }
  | { type: "image"; image: Uint8Array | RgbImage };

/** A chat message as LLM.chat takes it: its content a string, null, or content parts (OpenAI's, and offline images). */
export type ChatInputMessage = Omit<ChatMessage, "content"> & { content: string | null | ChatInputPart[] };

/** A content part of a wire message: text, or an image (the chat API's image_url part). */
export type WirePart = { type: "text"; text: string } | { type: "image_url"; image_url: { url: string } };

/** A chat message in the chat API's wire shape (as readWireMessages reads it). */
export interface WireMessage {
  role: string;
  content: string | WirePart[] | null;
  tool_calls?: { id: string; type: "function"; function: { name: string; arguments: string } }[];
  tool_call_id?: string;
}

/** A message's content read: its text (text parts joined by newlines, as vLLM), its parts in order, its images. */
export interface ChatContent {
  text: string | null;
  parts: ChatContentPart[];
  images: ChatImage[];
}

type Json = Record<string, unknown>;

const isRgbImage = (v: unknown): v is RgbImage => {
  const o = v as Partial<RgbImage> | null;
  return typeof o === "object" && o !== null && Number.isInteger(o.width) && Number.isInteger(o.height) &&
    o.data instanceof Uint8Array && o.data.length === o.width! * o.height! * 3 && o.width! > 0 && o.height! > 0;
};

/**
 * String content, null, or a list of content parts: {type: "text", text}, {type: "refusal", refusal} (read as text)
 * and {type: "image_url", image_url: {url}} (the URL alone is taken too, as vLLM takes it); `offline` (LLM.chat) also
 * {type: "image", image: bytes | pixels}.
 */
export function readChatContent(content: unknown, param: string, { offline = false } = {}): ChatContent {
  if (content === undefined || content === null) return { text: null, parts: [], images: [] };
  if (typeof content === "string") return { text: content, parts: [{ type: "text", text: content }], images: [] };
  if (!Array.isArray(content)) throw new ChatInputError(param, `'${param}' must be a string or a list of content parts`);
  const parts: ChatContentPart[] = [];
  const images: ChatImage[] = [];
  content.forEach((part, j) => {
    const p = part as Json | null;
    const at = `${param}[${j}]`;
    if (typeof p !== "object" || p === null) throw new ChatInputError(param, `'${at}' must be an object`);
    if (p.type === "image_url") {
      const u = p.image_url as Json | string | null | undefined;
      const url = typeof u === "string" ? u : typeof u === "object" && u !== null ? u.url : undefined;
      if (typeof url !== "string" || url === "") throw new ChatInputError(`${at}.image_url`, `'${at}.image_url.url' must be a non-empty string`);
      parts.push({ type: "image" });
      images.push({ url, param: `${at}.image_url` });
    } else if (offline && p.type === "image") {
      if (!(p.image instanceof Uint8Array) && !isRgbImage(p.image))
        throw new ChatInputError(`${at}.image`, `'${at}.image' must be image file bytes (a Uint8Array) or RGB pixels ({ width, height, data })`);
      parts.push({ type: "image" });
      images.push({ image: p.image, param: `${at}.image` });
    } else if (p.type === "text" || p.type === "refusal") {
      // an assistant turn's refusal part (OpenAI's) reaches the template as text, as vLLM reads it
      const text = p.type === "text" ? p.text : p.refusal;
      if (typeof text !== "string") throw new ChatInputError(param, `'${at}.${p.type}' must be a string`);
      parts.push({ type: "text", text });
    } else {
      throw new ChatInputError(param, `content part type ${JSON.stringify(p.type)} is not supported (only "text", "refusal"${offline ? ', "image_url" and "image"' : ' and "image_url"'})`);
    }
  });
  const texts = parts.flatMap((p) => (p.type === "text" ? [p.text] : []));
  return { text: texts.join("\n"), parts, images };
}

/** The messages as the template takes them, and their images in order (`param` names the message list in errors). */
export function readChatMessages(messages: readonly ChatInputMessage[], param: string): { messages: ChatMessage[]; images: ChatImage[] } {
  const images: ChatImage[] = [];
  const out = messages.map((m, i): ChatMessage => {
    if (!Array.isArray(m.content)) return m as ChatMessage;
    const content = readChatContent(m.content, `${param}[${i}].content`, { offline: true });
    images.push(...content.images);
    return { ...m, content: content.text, ...(content.images.length > 0 ? { contentParts: content.parts } : {}) };
  });
  return { messages: out, images };
}

/**
 * A request's messages in the chat API's wire shape as the template takes them, and their image_url parts in order
 * (each message's contentParts mark where they sit); earlier tool calls' arguments as objects (templateToolCall).
 */
export function readWireMessages(raw: unknown): { messages: ChatMessage[]; images: ChatImage[] } {
  if (!Array.isArray(raw) || raw.length === 0) throw new ChatInputError("messages", "'messages' must be a non-empty list");
  const images: ChatImage[] = [];
  const messages = raw.map((m: unknown, i) => {
    const param = `messages[${i}]`;
    if (typeof m !== "object" || m === null) throw new ChatInputError(param, `'${param}' must be an object`);
    const msg = m as Json;
    if (typeof msg.role !== "string" || !msg.role) throw new ChatInputError(`${param}.role`, `'${param}.role' must be a string`);
    const content = readChatContent(msg.content, `${param}.content`);
    const out: ChatMessage = { role: msg.role, content: content.text };
    if (content.images.length > 0) {
      out.contentParts = content.parts;
      images.push(...content.images);
    }
    if (typeof msg.name === "string") out.name = msg.name;
    if (Array.isArray(msg.tool_calls)) out.tool_calls = msg.tool_calls.map(templateToolCall);
    if (typeof msg.tool_call_id === "string") out.tool_call_id = msg.tool_call_id;
    // an earlier reply's reasoning, for templates that write it back within a turn of tool calls (vLLM passes it)
    if (msg.role === "assistant" && typeof msg.reasoning === "string") out.reasoning = out.reasoning_content = msg.reasoning;
    return out;
  });
  return { messages, images };
}

/** Refuses more images than the model takes (none for a text-only model), in vLLM's words. */
export function checkImageCount(images: readonly ChatImage[], spec: Gemma3ImageInputSpec | null, limit: number): void {
  const allowed = spec === null ? 0 : limit;
  if (images.length <= allowed) return;
  // vLLM adds the flag's hint where the model could take more
  const hint = spec === null ? "" : " Set `--limit-mm-per-prompt` to increase this limit.";
  throw new ChatInputError(images[allowed]!.param, `At most ${allowed} image(s) may be provided in one prompt.${hint}`);
}

/** A data: URL's bytes (base64 only, as vLLM's MediaConnector reads them). */
function dataUrlBytes(url: string, param: string): Uint8Array {
  const comma = url.indexOf(",");
  if (comma < 0) throw new ChatInputError(param, "the data URL has no ',' before its data (expected data:<media type>;base64,<data>)");
  const spec = url.slice("data:".length, comma);
  if (!spec.split(";").slice(1).includes("base64")) throw new ChatInputError(param, "Only base64 data URLs are supported for now.");
  const data = url.slice(comma + 1).replace(/\s+/g, "");
  if (data.length === 0 || data.length % 4 !== 0 || !/^[A-Za-z0-9+/]*={0,2}$/.test(data))
    throw new ChatInputError(param, "the data URL's base64 data is malformed");
  return new Uint8Array(Buffer.from(data, "base64"));
}

/**
 * Where images may come from besides data: URLs and pixels (vLLM's --allowed-local-media-path and
 * --allowed-media-domains): file: URLs under `localPath` (a resolved directory; null: none), http(s) URLs of the hosts
 * in `domains` (null: any); and how they are read (--media-io-kwargs' image.rgba_background_color: the colour under a
 * transparent image, default white).
 */
export interface MediaAccess {
  localPath: string | null;
  domains: readonly string[] | null;
  rgbaBackground?: readonly [number, number, number];
}
export const DEFAULT_MEDIA_ACCESS: MediaAccess = { localPath: null, domains: null };

/** Refuses an http(s) URL whose host is not among the allowed domains (vLLM's words). */
function checkDomain(url: string, param: string, access: MediaAccess): void {
  if (access.domains === null) return;
  const host = new URL(url).hostname;
  if (!access.domains.includes(host))
    throw new ChatInputError(param, `The URL must be from one of the allowed domains: [${access.domains.map((d) => `'${d}'`).join(", ")}]. Input URL domain: ${host}`);
}

/** A file: URL's bytes, when the file lies under --allowed-local-media-path (links resolved first). */
function localFileBytes(url: string, param: string, access: MediaAccess): Uint8Array {
  if (access.localPath === null) throw new ChatInputError(param, "Cannot load local files without `--allowed-local-media-path`.");
  let file: string;
  try {
    file = fileURLToPath(url);
  } catch (e) {
    throw new ChatInputError(param, `the file URL ${url} is not a local path: ${(e as Error).message}`);
  }
  let real: string;
  try {
    real = realpathSync(file);
  } catch {
    throw new ChatInputError(param, `cannot read the image file ${file}: no such file`);
  }
  if (!real.startsWith(access.localPath + sep))
    throw new ChatInputError(param, `The file path ${file} must be a subpath of \`--allowed-local-media-path\` ${access.localPath}.`);
  const size = statSync(real).size;
  if (size > MAX_IMAGE_BYTES) throw new ChatInputError(param, `the image file ${file} is over ${MAX_IMAGE_BYTES >> 20} MiB`);
  return new Uint8Array(readFileSync(real));
}

/** An http(s) image's bytes (a redirect must stay within the allowed domains too). */
async function fetchImage(url: string, param: string, access: MediaAccess): Promise<Uint8Array> {
  let res: Response;
  try {
    res = await fetch(url, { signal: AbortSignal.timeout(FETCH_TIMEOUT_MS), redirect: "follow" });
  } catch (e) {
    throw new ChatInputError(param, `cannot fetch the image at ${url}: ${(e as Error).message}`);
  }
  if (res.redirected) checkDomain(res.url, param, access);
  if (!res.ok) throw new ChatInputError(param, `cannot fetch the image at ${url}: HTTP ${res.status}`);
  const bytes = new Uint8Array(await res.arrayBuffer());
  if (bytes.length > MAX_IMAGE_BYTES) throw new ChatInputError(param, `the image at ${url} is over ${MAX_IMAGE_BYTES >> 20} MiB`);
  return bytes;
}

/** A URL's bytes where no fetch is needed (data: and allowed file: URLs); null for an allowed http(s) URL; else refused. */
function unfetchedBytes(url: string, param: string, access: MediaAccess): Uint8Array | null {
  const scheme = /^([a-zA-Z][a-zA-Z0-9+.-]*):/.exec(url)?.[1]?.toLowerCase();
  if (scheme === "data") return dataUrlBytes(url, param);
  if (scheme === "http" || scheme === "https") {
    checkDomain(url, param, access);
    return null;
  }
  if (scheme === "file") return localFileBytes(url, param, access);
  throw new ChatInputError(param, "The URL must be either a HTTP, data or file URL.");
}

/**
 * pixel_values of one image (PNG or JPEG bytes decoded, or pixels) and of its pan-and-scan crops after it, as
 * Gemma3ImageProcessor computes them.
 */
function pixelValues(source: Uint8Array | RgbImage, cfg: Gemma3ImageProcessorConfig, param: string, access: MediaAccess): Float32Array[] {
  try {
    return gemma3ImageWithCrops(source instanceof Uint8Array ? decodeImage(source, access.rgbaBackground) : source, cfg);
  } catch (e) {
    if (e instanceof ImageDecodeError) throw new ChatInputError(param, e.message);
    throw e;
  }
}

/** Each image's pixel_values (then its crops'), in order; http(s) images fetched. */
export async function loadChatImages(images: readonly ChatImage[], cfg: Gemma3ImageProcessorConfig, access = DEFAULT_MEDIA_ACCESS): Promise<Float32Array[][]> {
  const out: Float32Array[][] = [];
  for (const img of images) {
    const source = "image" in img ? img.image : (unfetchedBytes(img.url, img.param, access) ?? (await fetchImage(img.url, img.param, access)));
    out.push(pixelValues(source, cfg, img.param, access));
  }
  return out;
}

/** Each image's pixel_values (then its crops'), in order, without fetching: an http(s) image is refused (LLM.chatAsync fetches it). */
export function loadChatImagesSync(images: readonly ChatImage[], cfg: Gemma3ImageProcessorConfig, access = DEFAULT_MEDIA_ACCESS): Float32Array[][] {
  return images.map((img) => {
    const source = "image" in img ? img.image : unfetchedBytes(img.url, img.param, access);
    if (source === null) throw new ChatInputError(img.param, "an http(s) image is fetched by LLM.chatAsync (LLM.chat reads data: URLs, bytes and pixels)");
    return pixelValues(source, cfg, img.param, access);
  });
}

/**
 * The messages as a "string" content format renders them with images: one `<start_of_image>` per image before the
 * text, joined by newlines (vLLM's placeholders), or with `interleave` (--interleave-mm-strings) each part in its
 * place, joined by newlines; an "openai" one reads the parts.
 */
function messagesWithPlaceholders(messages: ChatMessage[], interleave: boolean): ChatMessage[] {
  return messages.map((m) => {
    const n = m.contentParts?.filter((p) => p.type === "image").length ?? 0;
    if (n === 0) return m;
    if (interleave) return { ...m, content: m.contentParts!.map((p) => (p.type === "image" ? GEMMA3_BOI : p.text)).join("\n") };
    return { ...m, content: [...Array<string>(n).fill(GEMMA3_BOI), ...(m.content ? [m.content] : [])].join("\n") };
  });
}

/**
 * A chat's prompt with its images' pixel_values: the messages rendered (`render`: the chat template) with each image's
 * placeholder, expanded as Gemma3Processor expands it and encoded, with each image's feature positions. A template
 * that wrote the wrong number of placeholders is a ChatInputError naming `param` (the messages).
 */
export function imageChatPrompt(
  messages: ChatMessage[], pixels: readonly (readonly Float32Array[])[], spec: Gemma3ImageInputSpec,
  { render, encode, param, interleave = false }: { render: (messages: ChatMessage[]) => string; encode: (text: string) => number[]; param: string; interleave?: boolean },
): { promptText: string; promptTokenIds: number[]; features: ImageFeatureSpec[] } {
  const rendered = render(messagesWithPlaceholders(messages, interleave));
  try {
    return gemma3ImagePrompt(rendered, pixels, spec, encode);
  } catch (e) {
    if (e instanceof RangeError) throw new ChatInputError(param, `${e.message} (the chat template must write one ${GEMMA3_BOI} per image)`);
    throw e;
  }
}
