// Grammars over a whole Harmony (gpt-oss) reply, header tokens included: what tool_choice "required" or a named
// function needs, since a Harmony call is a commentary message whose header (`<|channel|>commentary
// to=functions.NAME <|constrain|>json<|message|>`) is made of special tokens. The structured-output vocabulary blanks
// special tokens (never allowed in text), so a grammar could not write these headers. A reply grammar is compiled
// against a second vocabulary instead, where Harmony's header tokens are spelled `\x01name\x01` and every ordinary
// token holding the byte 0x01 is blanked: a spelled special in the grammar then matches its special token and
// nothing else (byte 0x01 never occurs in text, and JSON strings refuse it). vLLM gives xgrammar the specials' own
// text (`<|channel|>`), which ordinary tokens can also spell; this keeps the reply readable by the Harmony parser.
// Such a grammar is live from the reply's first token (it encodes the analysis message itself), not gated on the
// final channel as other structured output is (reasoning.ts harmonyEnd).
import type { GrammarVocab, TokenizerLike } from "../models/tokenizer-types.js";

/** Harmony's tokens that a reply grammar spells, by name (`<|channel|>` is "channel"). */
export const HARMONY_SPELLED = ["start", "end", "message", "channel", "constrain"] as const;
export type HarmonySpelled = (typeof HARMONY_SPELLED)[number];

/** How a reply grammar writes Harmony's `<|name|>` token (in grammar text: decoded bytes). */
export const harmonySpelling = (name: HarmonySpelled): string => `\u0001${name}\u0001`;

/** The GPT-2 byte-level alphabet's character for each byte (how BYTE_LEVEL vocabularies spell bytes). */
function byteLevelChar(byte: number): string {
  const printable = (b: number) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  if (printable(byte)) return String.fromCharCode(byte);
  let n = 0;
  for (let b = 0; b < byte; b++) if (!printable(b)) n++;
  return String.fromCharCode(256 + n);
}

/** A vocabulary spelling of `text` (ASCII) for `vocabType`. */
function spell(text: string, vocabType: GrammarVocab["vocabType"]): string {
  if (vocabType !== "BYTE_LEVEL") return text;
  return [...text].map((c) => byteLevelChar(c.charCodeAt(0))).join("");
}

/**
 * The reply-grammar vocabulary of a Harmony tokenizer (see the file comment), and the stop tokens its grammars end
 * with (the model's, and <|call|> and <|return|>); null when the tokenizer lacks Harmony's tokens.
 */
export function harmonyReplyVocab(tokenizer: TokenizerLike, vocab: GrammarVocab, eosTokenIds: readonly number[]): { vocab: GrammarVocab; stopTokenIds: number[] } | null {
  const idOf = (text: string): number | null => {
    const ids = tokenizer.encode(text, { addSpecialTokens: false });
    return ids.length === 1 ? ids[0]! : null;
  };
  const tokens = vocab.tokens.slice();
  const marker = spell("\u0001", vocab.vocabType);
  for (let id = 0; id < tokens.length; id++) if (tokens[id]!.includes(marker)) tokens[id] = "";
  for (const name of HARMONY_SPELLED) {
    const id = idOf(`<|${name}|>`);
    if (id === null || id >= tokens.length) return null;
    tokens[id] = spell(harmonySpelling(name), vocab.vocabType);
  }
  const stops = new Set(eosTokenIds);
  for (const text of ["<|call|>", "<|return|>"]) {
    const id = idOf(text);
    if (id === null) return null;
    stops.add(id);
  }
  return { vocab: { ...vocab, tokens }, stopTokenIds: [...stops] };
}
