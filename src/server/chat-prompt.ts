// The chat path's prompt, one for every endpoint that serves a chat (chat completions, the Responses API, Anthropic's
// Messages API and its count_tokens, /tokenize; run-batch through them): the messages through the chat template (or
// gpt-oss's Harmony renderer) and, with images, what vLLM's chat path feeds the model: the count checked against
// --limit-mm-per-prompt, each image loaded and processed (the request's mm_processor_kwargs over the server's), its
// placeholder expanded (models/chat-images.ts).
import { withMmProcessorKwargs, type ImageFeatureSpec } from "../models/gemma3-image-processor.js";
import { checkImageCount, imageChatPrompt, loadChatImages } from "../models/chat-images.js";
import { badRequest } from "./errors.js";
import type { ChatRequest } from "./protocol.js";
import type { ServingContext } from "./serving-context.js";

/** A chat's prompt as the engine takes it. */
export interface ChatPrompt {
  promptText: string;
  promptTokenIds: number[];
  /** Each image's pixels and positions (null without images). */
  mmFeatures: ImageFeatureSpec[] | null;
}

/** The request's messages (and tools) through the chat template; a template that fails is a 400 naming `param`. */
export function renderChatPrompt(ctx: ServingContext, req: ChatRequest, param = "messages"): string {
  try {
    return ctx.tokenizer.applyChatTemplate(req.messages, {
      addGenerationPrompt: req.addGenerationPrompt,
      continueFinalMessage: req.continueFinalMessage,
      ...(req.tools && !(ctx.excludeToolsWhenToolChoiceNone && req.toolChoice.kind === "none") ? { tools: req.tools } : {}),
      ...(req.chatTemplate ?? ctx.chatTemplate ? { chatTemplate: req.chatTemplate ?? ctx.chatTemplate } : {}),
      ...(req.chatTemplateKwargs ? { chatTemplateKwargs: req.chatTemplateKwargs } : {}),
    });
  } catch (err) {
    throw badRequest(`Failed to apply the chat template: ${(err as Error).message}`, param);
  }
}

/**
 * The chat request's prompt: `harmony` renders it for gpt-oss (its endpoint's effort field), the chat template
 * otherwise; `param` names the messages in errors; `addSpecialTokens` on encoding (/tokenize's flag: the template
 * writes them). Images that cannot be served are 400s naming their part (ChatInputError's param).
 */
export async function chatPrompt(
  ctx: ServingContext, req: ChatRequest, harmony: () => string, { param = "messages", addSpecialTokens = false } = {},
): Promise<ChatPrompt> {
  checkImageCount(req.images, ctx.imageInput, ctx.imageLimit);
  const encode = (text: string) => ctx.tokenizer.encode(text, { addSpecialTokens });
  if (ctx.harmony !== null) {
    const promptText = harmony();
    return { promptText, promptTokenIds: encode(promptText), mmFeatures: null };
  }
  if (req.images.length === 0) {
    const promptText = renderChatPrompt(ctx, req, param);
    return { promptText, promptTokenIds: encode(promptText), mmFeatures: null };
  }
  // (checkImageCount refuses images without an image input; the request's kwargs were checked on parsing)
  const spec = withMmProcessorKwargs(ctx.imageInput!, req.mmProcessorKwargs);
  const pixels = await loadChatImages(req.images, spec.processor, ctx.mediaAccess);
  const p = imageChatPrompt(req.messages, pixels, spec, {
    render: (messages) => renderChatPrompt(ctx, { ...req, messages }, param), encode, param, interleave: ctx.interleaveMmStrings,
  });
  return { promptText: p.promptText, promptTokenIds: p.promptTokenIds, mmFeatures: p.features };
}
