// The tokenizer surface that the engine and the server rely on (implemented by models/tokenizer.ts).

/** An OpenAI content part as a chat template sees it: text, or an image's place (vLLM's {"type": "image"}). */
export type ChatContentPart = { type: "text"; text: string } | { type: "image" };

export interface ChatMessage {
  role: "system" | "user" | "assistant" | "tool" | string;
  /** The content as text (a "string" content format renders it; with images, their placeholders go first). */
  content: string | null;
  /** The content's parts in order, images included, for an "openai" content format; absent: one text part of `content`. */
  contentParts?: ChatContentPart[];
  name?: string;
  tool_calls?: unknown[];
  tool_call_id?: string;
  /** An assistant turn's reasoning, under vLLM's name and the one templates read (Qwen3's reasoning_content). */
  reasoning?: string;
  reasoning_content?: string;
}

export interface ChatTemplateOptions {
  addGenerationPrompt?: boolean; // default true
  continueFinalMessage?: boolean;
  tools?: unknown[];
  chatTemplate?: string; // overrides the tokenizer's template
  chatTemplateKwargs?: Record<string, unknown>;
  /**
   * How the template sees message content (vLLM's chat_template_content_format, chat-content-format.ts): "string"
   * (the default), "openai" (a list of text parts) or "auto" (from the template: "openai" when it loops over content).
   */
  contentFormat?: "auto" | "string" | "openai";
}

/** What a grammar engine (xgrammar) needs of a tokenizer: every token's spelling by id and how to decode it. */
export interface GrammarVocab {
  /** Spellings by id as in tokenizer.json (e.g. "Ġhello"); special tokens as "" (never allowed in text). */
  tokens: string[];
  vocabType: "RAW" | "BYTE_FALLBACK" | "BYTE_LEVEL";
  /** Whether encoding prepends a space (Metaspace / sentencepiece tokenizers). */
  prependSpace: boolean;
}

export interface DecodeOptions {
  skipSpecialTokens?: boolean;
  spacesBetweenSpecialTokens?: boolean;
  /** Remove spaces before punctuation and contractions (" ." -> ".", " 's" -> "'s"), as transformers' decode; default false. */
  cleanUpTokenizationSpaces?: boolean;
}

export interface TokenizerLike {
  readonly vocabSize: number;
  readonly eosTokenIds: number[];
  readonly bosTokenId: number | null;
  encode(text: string, options?: { addSpecialTokens?: boolean }): number[];
  decode(ids: readonly number[], options?: DecodeOptions): string;
  /** tokenizer_config.json's clean_up_tokenization_spaces: transformers' `decode` (vLLM's /detokenize) cleans up with it. */
  readonly cleanUpTokenizationSpaces?: boolean;
  /** A text pair's ids as HF's tokenizer(text, text_pair) gives them (cross-encoders); tokenizers without it cannot. */
  encodePair?(text: string, pair: string, options?: { addSpecialTokens?: boolean }): number[];
  /** The token's text as the model's vocabulary spells it, decoded to a string (used for logprobs). */
  idToToken(id: number): string | undefined;
  /** The token as the vocabulary spells it ("Ġhello"), HF's convert_ids_to_tokens; without it, idToToken's text. */
  idToRawToken?(id: number): string | undefined;
  isSpecial(id: number): boolean;
  applyChatTemplate(messages: ChatMessage[], options?: ChatTemplateOptions): string;
  /** tokenizer_config.json as read (GET /tokenizer_info); tokenizers without one have none. */
  tokenizerConfig?(): Record<string, unknown>;
  /** The vocabulary for structured output; tokenizers without it cannot serve structured output. */
  grammarVocab?(): GrammarVocab;
}

/** Streams text out of a growing token list without ever emitting a partial UTF-8 character. */
export interface IncrementalDetokenizerLike {
  /** Adds tokens and returns the newly completed text (possibly ""). */
  push(ids: readonly number[]): string;
  /** Flushes what is left (e.g. at end of stream), returning any remaining text. */
  finish(): string;
  readonly text: string;
}
