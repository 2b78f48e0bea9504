// The prompt a worker will compute for a request, as token ids, and its chain block hashes: what the precise prefix
// policy matches against the workers' KV-cache events. Chat requests go through the model's chat template as the
// server renders them (serving-chat.ts: content read by models/chat-images.ts, text parts joined by newlines, content
// format "auto" as `kiln serve`'s default, earlier tool calls' arguments as objects, the generation prompt added unless
// the request says not to, no special tokens added on encoding); an Anthropic Messages request becomes those chat
// fields first (models/anthropic-messages.ts, as the server converts it). A completion's prompt is encoded as the
// server encodes it (a string with special tokens unless add_special_tokens is false; token ids as they are).
// Images: an image-text model's (its directory has the processor's config) data: URLs are decoded and processed as the
// worker processes them, their placeholders expanded into the same token ids, and each block holding an image's
// positions keyed by the processed image's hash, as the engine keys it. Remote (http, file) images are not fetched:
// such a chat, and any other request, has no known prompt and routes by load.
import { createHash } from "node:crypto";
import { chainBlockHashes } from "../engine/kv-cache-manager.js";
import { messagesChatFields } from "../models/anthropic-messages.js";
import { withChatTemplateDefaults, type ChatContentFormat } from "../models/chat-content-format.js";
import { DEFAULT_MEDIA_ACCESS, imageChatPrompt, loadChatImagesSync, readWireMessages, type ChatImage, type MediaAccess } from "../models/chat-images.js";
import {
  gemma3ImageHash, withMmProcessorKwargs, type Gemma3ImageInputSpec, type Gemma3ImageProcessorConfig, type ImageFeatureSpec,
} from "../models/gemma3-image-processor.js";
import { gemma3ImageInputSpec } from "../models/gemma3-vision-config.js";
import { Tokenizer } from "../models/tokenizer.js";
import type { ChatMessage, ChatTemplateOptions, TokenizerLike } from "../models/tokenizer-types.js";

type Json = unknown;

/** Processed images' hashes kept (by their URL's digest: 64 hex digits and a hash per image or crop each). */
const IMAGE_HASH_CACHE_SIZE = 1024;
const NO_PIXELS = new Float32Array(0);
const isRecord = (v: Json): v is Record<string, Json> => typeof v === "object" && v !== null && !Array.isArray(v);

/** A request's prompt as the engine hashes it: its token ids, and each image's run of positions and content hash. */
export interface RequestPrompt {
  tokenIds: number[];
  images: readonly Pick<ImageFeatureSpec, "hash" | "offset" | "length">[];
}

/** How the workers were started, where it changes the prompts they compute (their `kiln serve` flags). */
export interface WorkerPromptSettings {
  /** --chat-template text, when they were given one (else the tokenizer's). */
  chatTemplate?: string | null;
  /** --chat-template-content-format (`kiln serve`'s default: "auto"). */
  contentFormat?: ChatContentFormat;
  /** --default-chat-template-kwargs (a request's chat_template_kwargs win), or null. */
  defaultChatTemplateKwargs?: Record<string, unknown> | null;
  /** --mm-processor-kwargs (a request's mm_processor_kwargs win), or null. */
  mmProcessorKwargs?: Record<string, unknown> | null;
  /** --interleave-mm-strings. */
  interleaveMmStrings?: boolean;
  /** --media-io-kwargs' image.rgba_background_color (what a transparent image's pixels, and so its hash, are over), or null: white. */
  rgbaBackground?: readonly [number, number, number] | null;
}

export interface RequestTokenizerOptions extends WorkerPromptSettings {
  /** An image-text model's image input (models/gemma3-vision-weights.ts); null: chats with images route by load. */
  imageInput?: Gemma3ImageInputSpec | null;
}

export class RequestTokenizer {
  readonly tokenizer: TokenizerLike;
  readonly chatTemplate: string | null;
  readonly imageInput: Gemma3ImageInputSpec | null;
  /** sha256 of a data: URL and the processor's settings -> the image's (and its crops') hashes, least recently used first. */
  private readonly processed = new Map<string, string[]>();
  private readonly interleave: boolean;
  private readonly media: MediaAccess;

  constructor(tokenizer: TokenizerLike, o: RequestTokenizerOptions = {}) {
    this.tokenizer = withChatTemplateDefaults(tokenizer, { contentFormat: o.contentFormat ?? "auto", kwargs: o.defaultChatTemplateKwargs ?? null });
    this.chatTemplate = o.chatTemplate ?? null;
    // the workers' --mm-processor-kwargs over the model's preprocessor_config.json, as the server applies them
    this.imageInput = o.imageInput == null ? null : withMmProcessorKwargs(o.imageInput, o.mmProcessorKwargs ?? null);
    this.interleave = o.interleaveMmStrings === true;
    this.media = o.rgbaBackground == null ? DEFAULT_MEDIA_ACCESS : { ...DEFAULT_MEDIA_ACCESS, rgbaBackground: o.rgbaBackground };
  }

  /**
   * The tokenizer of a model directory (its tokenizer.json and chat template), as `kiln serve` loads it, and the
   * image input of an image-text model's directory (config.json, preprocessor_config.json).
   */
  static fromDir(dir: string, workers: WorkerPromptSettings = {}): RequestTokenizer {
    const tokenizer = Tokenizer.fromDir(dir);
    return new RequestTokenizer(tokenizer, { ...workers, imageInput: gemma3ImageInputSpec(dir, tokenizer) });
  }

  /** The prompt's token ids for a parsed body on `route`, or null when the router cannot tell them. */
  promptTokenIds(route: string, body: Json): number[] | null {
    return this.prompt(route, body)?.tokenIds ?? null;
  }

  /** The prompt (token ids and images) the worker will compute for a parsed body on `route`, or null when unknown. */
  prompt(route: string, body: Json): RequestPrompt | null {
    if (!isRecord(body)) return null;
    if (route === "/v1/chat/completions") return this.chatPrompt(body);
    if (route === "/v1/messages") return this.messagesPrompt(body);
    if (route === "/v1/completions") {
      // a batch of one prompt is that prompt (one level only: a body nested deeper is the worker's 400)
      const p = Array.isArray(body.prompt) && body.prompt.length === 1 && typeof body.prompt[0] !== "number" ? (body.prompt[0] as Json) : body.prompt;
      if (typeof p === "string") return { tokenIds: this.tokenizer.encode(p, { addSpecialTokens: body.add_special_tokens !== false }), images: [] };
      if (Array.isArray(p) && p.length > 0 && p.every((x) => Number.isInteger(x))) return { tokenIds: p as number[], images: [] };
    }
    return null;
  }

  /** A Messages request as the chat request the server serves it with (its fields only: no chat_template, no salt). */
  private messagesPrompt(body: Record<string, Json>): RequestPrompt | null {
    try {
      return this.chatPrompt(messagesChatFields(body).chat);
    } catch {
      return null; // the worker will answer 400: any worker will do
    }
  }

  private chatPrompt(body: Record<string, Json>): RequestPrompt | null {
    try {
      const { messages, images } = readWireMessages(body.messages);
      const options: ChatTemplateOptions = {
        addGenerationPrompt: body.add_generation_prompt !== false,
        continueFinalMessage: body.continue_final_message === true,
        ...(typeof body.chat_template === "string" ? { chatTemplate: body.chat_template } : this.chatTemplate !== null ? { chatTemplate: this.chatTemplate } : {}),
        ...(Array.isArray(body.tools) ? { tools: body.tools } : {}),
        ...(isRecord(body.chat_template_kwargs) ? { chatTemplateKwargs: body.chat_template_kwargs } : {}),
      };
      const render = (msgs: ChatMessage[]): string => this.tokenizer.applyChatTemplate(msgs, options);
      const encode = (text: string): number[] => this.tokenizer.encode(text, { addSpecialTokens: false });
      if (images.length === 0) return { tokenIds: encode(render(messages)), images: [] };
      if (this.imageInput === null) return null; // a text-only model (or the router lacks its config): the worker decides
      // the request's mm_processor_kwargs over the model's settings, as the server applies them (a bad one: a 400 there)
      const spec = withMmProcessorKwargs(this.imageInput, body.mm_processor_kwargs);
      const hashes = images.map((image) => this.imageHashes(image, spec.processor));
      // the prompt's image positions (the pixels are not needed for those: each run takes its image's or crop's hash)
      const p = imageChatPrompt(messages, hashes.map((crops) => crops.map(() => NO_PIXELS)), spec, { render, encode, param: "messages", interleave: this.interleave });
      const flat = hashes.flat();
      return { tokenIds: p.promptTokenIds, images: p.features.map((f, i) => ({ hash: flat[i]!, offset: f.offset, length: f.length })) };
    } catch {
      return null; // not a chat the router can render (the worker may answer 400): any worker will do
    }
  }

  /**
   * A chat image's content hashes as the engine keys its blocks (the image's, then each pan-and-scan crop's): decoded
   * and processed as the worker does, once per data: URL and settings (a conversation sends its images again with
   * each turn). An http(s) image is not fetched (nor a file: one read) here: it throws, and the chat goes by load.
   */
  private imageHashes(image: ChatImage, processor: Gemma3ImageProcessorConfig): string[] {
    const key = "url" in image ? createHash("sha256").update(JSON.stringify(processor)).update("\u0000").update(image.url).digest("hex") : null; // (one background per router)
    const known = key === null ? undefined : this.processed.get(key);
    if (known !== undefined) {
      this.processed.delete(key!); // (most recently used last)
      this.processed.set(key!, known);
      return known;
    }
    const hashes = loadChatImagesSync([image], processor, this.media)[0]!.map((pixels) => gemma3ImageHash(pixels, processor));
    if (key !== null) {
      this.processed.set(key, hashes);
      if (this.processed.size > IMAGE_HASH_CACHE_SIZE) this.processed.delete(this.processed.keys().next().value!);
    }
    return hashes;
  }

  /**
   * A lazy `blockSize -> chain hashes` of the request's prompt: tokenized (its images processed) on the first call,
   * hashed once per block size asked; [] when the prompt is not known. The cache salt enters the first block as the
   * engine's does (a Messages request has none: the server's chat request carries none over).
   */
  blockHashes(route: string, body: Json): (blockSize: number) => readonly string[] {
    let prompt: RequestPrompt | null | undefined;
    const salt = route !== "/v1/messages" && isRecord(body) && typeof body.cache_salt === "string" ? body.cache_salt : null;
    const memo = new Map<number, string[]>();
    return (blockSize) => {
      prompt ??= this.prompt(route, body);
      if (prompt === null) return [];
      let h = memo.get(blockSize);
      if (h === undefined) memo.set(blockSize, (h = chainBlockHashes(prompt.tokenIds, blockSize, { lora: null, cacheSalt: salt, mmFeatures: prompt.images })));
      return h;
    };
  }
}
