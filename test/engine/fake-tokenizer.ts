// A tiny byte-level tokenizer for engine tests: 64 ids, some multi-character and multi-byte tokens, and the
// 4 bytes of an emoji as 4 separate tokens (so decoding mid-character yields U+FFFD).
import type { ChatMessage, TokenizerLike } from "../../src/models/tokenizer-types.js";

const enc = new TextEncoder();
const SPECIAL = ["<pad>", "<s>", "</s>"];
export const EOS = 2;
export const BOS = 1;

function buildVocab(): Uint8Array[] {
  const v: Uint8Array[] = SPECIAL.map((s) => enc.encode(s));
  for (let c = 0; c < 26; c++) v.push(enc.encode(String.fromCharCode(97 + c))); // 3..28 a-z
  v.push(enc.encode(" ")); // 29
  v.push(enc.encode("é")); // 30
  for (const b of enc.encode("🙂")) v.push(new Uint8Array([b])); // 31..34
  v.push(enc.encode("日本")); // 35
  for (let c = 0; c < 26; c++) v.push(enc.encode(String.fromCharCode(65 + c))); // 36..61 A-Z
  v.push(enc.encode("xy")); // 62
  v.push(enc.encode("\n")); // 63
  return v;
}

export class FakeTokenizer implements TokenizerLike {
  readonly vocab = buildVocab();
  readonly vocabSize = this.vocab.length;
  readonly eosTokenIds = [EOS];
  readonly bosTokenId = BOS;
  private readonly byText = new Map<string, number>();

  constructor() {
    const dec = new TextDecoder("utf-8", { fatal: false });
    this.vocab.forEach((b, id) => {
      const s = dec.decode(b);
      if (id >= 3 && !s.includes("\uFFFD")) this.byText.set(s, id);
    });
  }

  encode(text: string, options: { addSpecialTokens?: boolean } = {}): number[] {
    const ids: number[] = options.addSpecialTokens === false ? [] : [BOS];
    const chars = [...text];
    for (let i = 0; i < chars.length;) {
      const two = (chars[i] ?? "") + (chars[i + 1] ?? "");
      if (this.byText.has(two)) {
        ids.push(this.byText.get(two)!);
        i += 2;
      } else if (this.byText.has(chars[i]!)) ids.push(this.byText.get(chars[i++]!)!);
      else if (chars[i] === "🙂") {
        ids.push(31, 32, 33, 34);
        i++;
      } else throw new Error(`fake tokenizer cannot encode ${JSON.stringify(chars[i])}`);
    }
    return ids;
  }

  decode(ids: readonly number[], options: { skipSpecialTokens?: boolean } = {}): string {
    const parts: Uint8Array[] = [];
    for (const id of ids) if (!(options.skipSpecialTokens !== false && this.isSpecial(id))) parts.push(this.vocab[id]!);
    const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let o = 0;
    for (const p of parts) {
      all.set(p, o);
      o += p.length;
    }
    return new TextDecoder("utf-8", { fatal: false }).decode(all);
  }

  idToToken(id: number): string | undefined {
    return id < this.vocabSize ? new TextDecoder().decode(this.vocab[id]) : undefined;
  }

  isSpecial(id: number): boolean {
    return id < SPECIAL.length;
  }

  applyChatTemplate(messages: ChatMessage[]): string {
    return messages.map((m) => `${m.role[0]} ${m.content ?? ""}\n`).join("") + "a ";
  }
}
