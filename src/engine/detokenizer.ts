// Incremental detokenization over TokenizerLike.decode (vLLM's detokenize_incrementally): decode a short window
// [prefixOffset, end) and emit only the text past [prefixOffset, readOffset), holding back while the window
// ends in U+FFFD (an incomplete UTF-8 character split across tokens).
import type { IncrementalDetokenizerLike, TokenizerLike } from "../models/tokenizer-types.js";

/** Prompt tokens kept as left context so tokenizers that strip a leading space (SentencePiece) decode right. */
const PROMPT_CONTEXT_TOKENS = 5;

/** Default {@link IncrementalDetokenizerLike}, built on any TokenizerLike. */
export class IncrementalDetokenizer implements IncrementalDetokenizerLike {
  private tokens: number[];
  private prefixOffset = 0;
  private readOffset: number;
  private out = "";
  private readonly opts: { skipSpecialTokens: boolean; spacesBetweenSpecialTokens: boolean };

  constructor(
    private readonly tokenizer: TokenizerLike,
    promptTokenIds: readonly number[],
    options: { skipSpecialTokens?: boolean; spacesBetweenSpecialTokens?: boolean } = {},
  ) {
    this.tokens = promptTokenIds.slice(Math.max(0, promptTokenIds.length - PROMPT_CONTEXT_TOKENS));
    this.readOffset = this.tokens.length;
    this.opts = {
      skipSpecialTokens: options.skipSpecialTokens ?? true,
      spacesBetweenSpecialTokens: options.spacesBetweenSpecialTokens ?? true,
    };
  }

  get text(): string {
    return this.out;
  }

  push(ids: readonly number[]): string {
    if (ids.length === 0) return "";
    for (const id of ids) this.tokens.push(id);
    const prefixText = this.tokenizer.decode(this.tokens.slice(this.prefixOffset, this.readOffset), this.opts);
    const newText = this.tokenizer.decode(this.tokens.slice(this.prefixOffset), this.opts);
    if (newText.length <= prefixText.length || newText.endsWith("\uFFFD")) return "";
    const delta = newText.slice(prefixText.length);
    this.prefixOffset = this.readOffset;
    this.readOffset = this.tokens.length;
    if (this.prefixOffset > 64) {
      // Drop tokens left of the window so memory stays O(window).
      this.tokens = this.tokens.slice(this.prefixOffset);
      this.readOffset -= this.prefixOffset;
      this.prefixOffset = 0;
    }
    this.out += delta;
    return delta;
  }

  finish(): string {
    const prefixText = this.tokenizer.decode(this.tokens.slice(this.prefixOffset, this.readOffset), this.opts);
    const newText = this.tokenizer.decode(this.tokens.slice(this.prefixOffset), this.opts);
    const delta = newText.length > prefixText.length ? newText.slice(prefixText.length) : "";
    this.prefixOffset = this.readOffset = this.tokens.length;
    this.out += delta;
    return delta;
  }
}
