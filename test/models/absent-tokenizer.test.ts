// The tokenizer of a model served with --skip-tokenizer-init: the config's vocabulary size and EOS ids (its
// generation_config.json's first), empty text for any ids, and a NoTokenizerError for what needs the vocabulary.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { absentTokenizerOf, NoTokenizerError } from "../../src/models/absent-tokenizer.js";

describe("AbsentTokenizer", () => {
  it("takes the vocabulary size and EOS ids from config.json, generation_config.json's EOS ids first", () => {
    const config = { vocab_size: 320, eos_token_id: 2, bos_token_id: 1 };
    const tok = absentTokenizerOf(config, null);
    assert.deepEqual([tok.vocabSize, tok.eosTokenIds, tok.bosTokenId], [320, [2], 1]);
    assert.deepEqual(absentTokenizerOf(config, { eos_token_id: [7, 8] }).eosTokenIds, [7, 8]);
    // an image-text config's vocabulary is its text_config's
    assert.equal(absentTokenizerOf({ text_config: { vocab_size: 99, eos_token_id: 3 } }, null).vocabSize, 99);
  });

  it("decodes any ids to empty text; encoding, chat templates and grammars throw NoTokenizerError", () => {
    const tok = absentTokenizerOf({ vocab_size: 10, eos_token_id: 2 }, null);
    assert.equal(tok.decode([1, 2, 3]), "");
    assert.equal(tok.idToToken(1), undefined);
    assert.throws(() => tok.encode("hi"), (e: Error) => e instanceof NoTokenizerError && e.name === "NoTokenizerError" && /--skip-tokenizer-init/.test(e.message));
    assert.throws(() => tok.applyChatTemplate([{ role: "user", content: "hi" }]), /a chat conversation needs the tokenizer/);
    assert.throws(() => tok.grammarVocab(), /structured output needs the tokenizer/);
  });
});
