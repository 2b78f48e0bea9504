// POST /tokenize and POST /detokenize (vLLM's extra endpoints).
import type { FastifyInstance } from "fastify";
import { badRequest } from "./errors.js";
import { optBool } from "./fields.js";
import { asJsonBody, parseChatRequest } from "./protocol.js";
import { resolveModel, type ServingContext } from "./serving-context.js";
import { chatEffort, harmonyChatPrompt } from "./serving-chat-harmony.js";

/** `bound`: the serving context, once the engine is bound (prepareServer). */
export function registerTokenizeRoutes(app: FastifyInstance, bound: () => ServingContext): void {
  app.post("/tokenize", async (request) => {
    const ctx = bound();
    const body = asJsonBody(request.body);
    resolveModel(ctx, typeof body.model === "string" ? body.model : undefined);
    let tokens: number[];
    if (body.messages !== undefined) {
      // vLLM's TokenizeChatRequest has tools (rendered by the template) but no tool_choice
      const chat = parseChatRequest({ ...body, tool_choice: "none" }, ctx.tokenizer.vocabSize, { trustChatTemplate: ctx.trustRequestChatTemplate });
      if (chat.images.length > 0) throw badRequest("/tokenize does not take images: send them to /v1/chat/completions", chat.images[0]!.param);
      // gpt-oss: the Harmony prompt the chat API would send
      const text = ctx.harmony !== null ? harmonyChatPrompt(chat, body.messages as unknown[], chatEffort(body, chat), "reasoning_effort") : ctx.tokenizer.applyChatTemplate(chat.messages, {
        addGenerationPrompt: chat.addGenerationPrompt,
        continueFinalMessage: chat.continueFinalMessage,
        ...(chat.tools ? { tools: chat.tools } : {}),
        ...(chat.chatTemplate ?? ctx.chatTemplate ? { chatTemplate: chat.chatTemplate ?? ctx.chatTemplate } : {}),
        ...(chat.chatTemplateKwargs ? { chatTemplateKwargs: chat.chatTemplateKwargs } : {}),
      });
      tokens = ctx.tokenizer.encode(text, { addSpecialTokens: optBool(body, "add_special_tokens") ?? false });
    } else if (typeof body.prompt === "string") {
      tokens = ctx.tokenizer.encode(body.prompt, { addSpecialTokens: optBool(body, "add_special_tokens") ?? true });
    } else {
      throw badRequest("'prompt' (a string) or 'messages' is required", "prompt");
    }
    // vLLM's token_strs: the tokens' vocabulary spellings (convert_ids_to_tokens), not their decoded text
    const tok = ctx.tokenizer;
    const tokenStrs = optBool(body, "return_token_strs") === true ? tokens.map((id) => tok.idToRawToken?.(id) ?? tok.idToToken(id) ?? "") : null;
    return { count: tokens.length, max_model_len: ctx.maxModelLen, tokens, token_strs: tokenStrs };
  });

  app.post("/detokenize", async (request) => {
    const ctx = bound();
    const body = asJsonBody(request.body);
    resolveModel(ctx, typeof body.model === "string" ? body.model : undefined);
    const tokens = body.tokens;
    if (!Array.isArray(tokens) || !tokens.every((t) => Number.isInteger(t))) throw badRequest("'tokens' must be a list of integers", "tokens");
    for (const t of tokens as number[]) if (t < 0 || t >= ctx.tokenizer.vocabSize) throw badRequest(`Token id ${t} is out of vocabulary`, "tokens");
    return { prompt: ctx.tokenizer.decode(tokens as number[], { skipSpecialTokens: false }) };
  });
}
