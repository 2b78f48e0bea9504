// Incremental detokenization (vLLM's prefix/read offset scheme): each step decodes a short window
// ending at the newest token and emits only text that is complete (not ending in U+FFFD, which a
// byte-level token splitting a multi-byte character produces).

import type { IncrementalDetokenizerLike, TokenizerLike } from "./tokenizer-types.js";

/** Tokens of prompt context decoded ahead of the first generated token (vLLM uses 5). */
const INITIAL_OFFSET = 5;

export interface IncrementalDetokenizerOptions {
  skipSpecialTokens?: boolean;
  /** Prompt ids: give the first generated tokens their left context (e.g. SentencePiece spaces). */
  promptIds?: readonly number[];
}

/**
 * @example
 *   const d = new IncrementalDetokenizer(tok, { skipSpecialTokens: true });
 *   for (const id of stream) process.stdout.write(d.push([id]));
 *   process.stdout.write(d.finish());
 */
export class IncrementalDetokenizer implements IncrementalDetokenizerLike {
  private readonly tokens: number[];
  private readonly promptLength: number;
  private prefixOffset: number;
  private readOffset: number;
  private emitted = "";
  private readonly skipSpecialTokens: boolean;

  constructor(
    private readonly tokenizer: Pick<TokenizerLike, "decode">,
    options: IncrementalDetokenizerOptions = {},
  ) {
    this.skipSpecialTokens = options.skipSpecialTokens ?? false;
    this.tokens = [...(options.promptIds ?? [])];
    this.promptLength = this.tokens.length;
    this.prefixOffset = Math.max(0, this.tokens.length - INITIAL_OFFSET);
    this.readOffset = this.tokens.length;
  }

  get text(): string {
    return this.emitted;
  }

  private decode(from: number, to: number): string {
    return this.tokenizer.decode(this.tokens.slice(from, to), { skipSpecialTokens: this.skipSpecialTokens });
  }

  push(ids: readonly number[]): string {
    if (ids.length === 0) return "";
    this.tokens.push(...ids);
    const prefixText = this.decode(this.prefixOffset, this.readOffset);
    const newText = this.decode(this.prefixOffset, this.tokens.length);
    if (newText.length > prefixText.length && !newText.endsWith("\uFFFD")) {
      const delta = newText.slice(prefixText.length);
      this.prefixOffset = this.readOffset;
      this.readOffset = this.tokens.length;
      this.emitted += delta;
      return delta;
    }
    return "";
  }

  /** Emits whatever is held back; with no prompt, the total equals decode(all generated ids). */
  finish(): string {
    let delta: string;
    const full = this.promptLength === 0 ? this.decode(0, this.tokens.length) : null;
    if (full !== null && full.startsWith(this.emitted)) delta = full.slice(this.emitted.length);
    else {
      const prefixText = this.decode(this.prefixOffset, this.readOffset);
      const newText = this.decode(this.prefixOffset, this.tokens.length);
      delta = newText.slice(prefixText.length);
    }
    this.prefixOffset = this.readOffset = this.tokens.length;
    this.emitted += delta;
    return delta;
  }
}
