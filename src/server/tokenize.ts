// POST /tokenize and POST /detokenize (vLLM's extra endpoints). Chat messages are tokenized as the chat API feeds them
// to the model, each image expanded to its placeholder tokens.
import type { FastifyInstance } from "fastify";
import { badRequest } from "./errors.js";
import { optBool } from "./fields.js";
import { asJsonBody, parseChatRequest } from "./protocol.js";
import { resolveModel, type ServingContext } from "./serving-context.js";
import { chatEffort, harmonyChatPrompt } from "./serving-chat-harmony.js";
import { chatPrompt } from "./chat-prompt.js";

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
      // the prompt the chat API would send (images expanded as the model sees them; gpt-oss: the Harmony prompt)
      const harmony = () => harmonyChatPrompt(chat, body.messages as unknown[], chatEffort(body, chat), "reasoning_effort");
      tokens = (await chatPrompt(ctx, chat, harmony, { addSpecialTokens: optBool(body, "add_special_tokens") ?? false })).promptTokenIds;
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
