// The tokenizer of a model served without one (vLLM's --skip-tokenizer-init): no tokenizer.json is read. Prompts must
// be token ids, outputs carry token ids and empty text; what needs the vocabulary (text prompts, chat templates, stop
// strings, structured output) throws a NoTokenizerError, which the server answers with a 400.
import type { ChatMessage, GrammarVocab } from "./tokenizer-types.js";
import { Tokenizer } from "./tokenizer.js";

/** What needs a tokenizer, asked of a model served without one (named "NoTokenizerError": the server reads a 400). */
export class NoTokenizerError extends Error {
  constructor(what: string) {
    super(`${what} needs the tokenizer, and the server was started with --skip-tokenizer-init: send prompts as token ids`);
    this.name = "NoTokenizerError";
  }
}

/** What the model's config says of its vocabulary: its size and the EOS / BOS ids (generation_config.json's first). */
export interface AbsentTokenizerSpec {
  vocabSize: number;
  eosTokenIds: number[];
  bosTokenId: number | null;
}

/**
 * A Tokenizer with no vocabulary: decode gives "" (vLLM's detokenize off), encode throws NoTokenizerError.
 * @example const tok = AbsentTokenizer.of({ vocabSize: 32000, eosTokenIds: [2], bosTokenId: 1 }); tok.decode([5]) === "";
 */
export class AbsentTokenizer extends Tokenizer {
  private readonly size: number;
  override readonly bosTokenId: number | null;

  private constructor(spec: AbsentTokenizerSpec) {
    // (no tokens: nothing is built, the EOS ids come as a generation config's)
    super({}, {}, { deferBuild: true, generationConfig: { eos_token_id: spec.eosTokenIds } });
    this.size = spec.vocabSize;
    this.bosTokenId = spec.bosTokenId;
  }

  static of(spec: AbsentTokenizerSpec): AbsentTokenizer {
    return new AbsentTokenizer(spec);
  }

  override get vocabSize(): number {
    return this.size;
  }

  override buildDecoder(): void {}

  override encode(_text: string): number[] {
    throw new NoTokenizerError("a text prompt");
  }

  override encodePair(_text: string, _pair: string): number[] {
    throw new NoTokenizerError("a text pair");
  }

  override decode(_ids: readonly number[]): string {
    return "";
  }

  override idToToken(_id: number): string | undefined {
    return undefined;
  }

  override idToRawToken(_id: number): string | undefined {
    return undefined;
  }

  override tokenizerConfig(): Record<string, unknown> {
    return {};
  }

  override grammarVocab(): GrammarVocab {
    throw new NoTokenizerError("structured output");
  }

  override tokenToId(_token: string): number | undefined {
    return undefined;
  }

  override isSpecial(_id: number): boolean {
    return false;
  }

  override applyChatTemplate(_messages: ChatMessage[]): string {
    throw new NoTokenizerError("a chat conversation");
  }
}

/** The AbsentTokenizer of a config.json object (vocab_size, eos/bos_token_id) and its generation_config.json's (or null). */
export function absentTokenizerOf(config: Record<string, unknown>, generationConfig: Record<string, unknown> | null): AbsentTokenizer {
  const text = (typeof config.text_config === "object" && config.text_config !== null ? config.text_config : config) as Record<string, unknown>;
  const ids = (v: unknown): number[] => (typeof v === "number" ? [v] : Array.isArray(v) ? v.filter((x): x is number => typeof x === "number") : []);
  const eos = ids(generationConfig?.eos_token_id);
  const bos = ids(generationConfig?.bos_token_id ?? text.bos_token_id ?? config.bos_token_id);
  return AbsentTokenizer.of({
    vocabSize: Number(text.vocab_size ?? config.vocab_size),
    eosTokenIds: eos.length > 0 ? eos : ids(text.eos_token_id ?? config.eos_token_id),
    bosTokenId: bos[0] ?? null,
  });
}
