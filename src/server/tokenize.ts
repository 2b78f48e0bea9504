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
    if (ctx.skipTokenizerInit) throw badRequest("detokenizing needs the tokenizer, and the server was started with --skip-tokenizer-init", "tokens");
    if (!Array.isArray(tokens) || !tokens.every((t) => Number.isInteger(t))) throw badRequest("'tokens' must be a list of integers", "tokens");
    for (const t of tokens as number[]) if (t < 0 || t >= ctx.tokenizer.vocabSize) throw badRequest(`Token id ${t} is out of vocabulary`, "tokens");
    // vLLM decodes with transformers' tokenizer.decode: tokenizer_config's clean_up_tokenization_spaces applies
    const cleanUpTokenizationSpaces = ctx.tokenizer.cleanUpTokenizationSpaces ?? false;
    return { prompt: ctx.tokenizer.decode(tokens as number[], { skipSpecialTokens: false, cleanUpTokenizationSpaces }) };
  });
}

/**
 * GET /tokenizer_info (vLLM --enable-tokenizer-info-endpoint): tokenizer_config.json's settings as HF's init_kwargs
 * holds them (file paths dropped, AddedToken objects as their content), the tokenizer's class as transformers loads
 * it (the fast one) and the served chat template.
 */
export function registerTokenizerInfoRoute(app: FastifyInstance, bound: () => ServingContext): void {
  app.get("/tokenizer_info", async () => {
    const ctx = bound();
    const { vocab_file: _v, merges_file: _m, ...config } = ctx.tokenizer.tokenizerConfig?.() ?? {};
    const info = addedTokensAsContent(config) as Record<string, unknown>;
    const declared = typeof config.tokenizer_class === "string" ? config.tokenizer_class : "PreTrainedTokenizer";
    info.tokenizer_class = declared.endsWith("Fast") ? declared : `${declared}Fast`;
    const template = ctx.chatTemplate ?? (ctx.tokenizer as { chatTemplate?: string | null }).chatTemplate;
    if (template) info.chat_template = template;
    return info;
  });
}

/** `value` with every {"content": ...} object (an AddedToken) as its content, as vLLM's _make_json_serializable. */
function addedTokensAsContent(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(addedTokensAsContent);
  if (typeof value !== "object" || value === null) return value;
  if ("content" in value) return (value as { content: unknown }).content;
  return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, addedTokensAsContent(v)]));
}
