import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";
import { Template } from "@huggingface/jinja";
import { BYTE_TO_UNICODE, ByteLevelBpe, saveTokenizer, trainBpeTokenizer } from "../../src/train/bpe-trainer.js";
import { loadCorpus } from "../../src/train/corpus.js";

const SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

test("GPT-2 byte table: 256 distinct printable chars, space -> Ġ", () => {
  assert.equal(new Set(BYTE_TO_UNICODE).size, 256);
  assert.equal(BYTE_TO_UNICODE[32], "Ġ");
  assert.equal(BYTE_TO_UNICODE[10], "Ċ");
  assert.equal(BYTE_TO_UNICODE[65], "A");
});

test("first merges on a hand-made corpus follow pair frequency", () => {
  // Pre-tokens: "hug" x1, " hug" x3, " pug" x2, " bun" x1.
  // Pair counts: u g 6, h u 4, Ġ h 3, Ġ p 2, p u 2, ... -> merge "u g"; then "h ug" (4);
  // then "Ġ hug" (3); then "Ġ p" and "p ug" tie at 2 and the smaller (left id, right id) wins:
  // p (0x70) precedes Ġ (U+0120) in the byte order -> "p ug"; then "Ġ pug" (2); the rest occur once.
  const tok = trainBpeTokenizer(["hug hug hug hug pug pug bun"], { vocabSize: 1000, specialTokens: SPECIALS, minFrequency: 2 });
  assert.deepEqual(tok.json.model.merges, ["u g", "h ug", "Ġ hug", "p ug", "Ġ pug"]);
  assert.equal(tok.vocabSize, 3 + 256 + 5);
  assert.equal(tok.json.model.vocab["<|endoftext|>"], 0);
  assert.equal(tok.json.model.vocab["Ġpug"], 263);
  assert.deepEqual(tok.encode(" hug pug"), [261, 263]);
  // vocabSize caps the merges.
  assert.deepEqual(trainBpeTokenizer(["hug hug hug hug pug pug bun"], { vocabSize: 256 + 2, minFrequency: 1 }).json.model.merges, [
    "u g",
    "h ug",
  ]);
});

const SAMPLES = [
  "Hello, world! It's 2024 and we're testing BPE's limits...",
  "Grüße aus Köln — naïve café, déjà vu. Ελληνικά κείμενα. Русский текст.",
  "日本語のテキスト、中文文本와 한국어 텍스트。",
  "Emoji: 👍🏽 🚀🔥 👨‍👩‍👧 and flags 🇫🇷🇯🇵",
  "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\nHello<|im_end|><|endoftext|>",
  "  leading spaces,\ttabs\t\tand\n\n\nnewlines   trailing   ",
  "code: for (let i = 0; i < n; i++) { x[i] = y[i] * 2; } // done",
  "numbers 3.14159 1,000,000 and 0x1F and $5.00 <|endoftext|>x<|im_end|>",
  "\u0000 control \u0007 chars \ufeff bom and lone surrogate-free text",
];

function trainSmall(): ByteLevelBpe {
  const docs = [
    ...loadCorpus({ source: "brown", maxDocs: 25 }),
    ...SAMPLES.slice(1, 4),
    ...loadCorpus({ source: "nlp-corpus", maxDocs: 2000 }),
  ];
  return trainBpeTokenizer(docs, { vocabSize: 1200, specialTokens: SPECIALS, minFrequency: 2 });
}

test("tokenizer.json loads in @huggingface/tokenizers and encodes/decodes identically", () => {
  const tok = trainSmall();
  assert.equal(tok.vocabSize, 1200);
  const hf = new Tokenizer(JSON.parse(JSON.stringify(tok.json)) as object, { clean_up_tokenization_spaces: false });
  for (const text of SAMPLES) {
    const ours = tok.encode(text);
    const theirs = hf.encode(text).ids;
    assert.deepEqual(ours, theirs, `encode mismatch on ${JSON.stringify(text)}`);
    assert.equal(tok.decode(ours), text, "exact round trip");
    assert.equal(hf.decode(theirs), text);
    assert.equal(tok.decode(ours, { skipSpecialTokens: true }), hf.decode(theirs, { skip_special_tokens: true }));
  }
  // Special tokens are single ids.
  assert.deepEqual(tok.encode("<|im_start|><|im_end|><|endoftext|>"), [1, 2, 0]);
  // Decoding a split multi-byte character gives U+FFFD, as HF does.
  const rocket = tok.encode("🚀");
  for (let cut = 1; cut <= rocket.length; cut++) assert.equal(tok.decode(rocket.slice(0, cut)), hf.decode(rocket.slice(0, cut)));
  // Brown text compresses (a 1200-token vocab gives > 2.5 chars/token on Brown).
  const doc = loadCorpus({ source: "brown", maxDocs: 30 })[29]!;
  assert.deepEqual(tok.encode(doc), hf.encode(doc).ids);
  assert.ok(doc.length / tok.encode(doc).length > 2.5);
});

test("saveTokenizer writes tokenizer.json + tokenizer_config.json with a ChatML template", () => {
  const tok = trainBpeTokenizer(["hello world, hello chat"], { vocabSize: 300, specialTokens: SPECIALS });
  const dir = mkdtempSync(join(tmpdir(), "kiln-tok-"));
  saveTokenizer(dir, tok, { modelMaxLength: 512 });
  const json = JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8")) as object;
  const config = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")) as Record<string, unknown>;
  assert.equal(config.eos_token, "<|im_end|>");
  assert.equal(config.pad_token, "<|endoftext|>");
  assert.equal(config.bos_token, null);
  assert.equal(config.model_max_length, 512);
  const hf = new Tokenizer(json, config);
  assert.deepEqual(hf.encode("hello <|im_end|>").ids, tok.encode("hello <|im_end|>"));
  const reloaded = ByteLevelBpe.fromJson(json as never);
  assert.deepEqual(reloaded.encode("hello world"), tok.encode("hello world"));
  const template = new Template(config.chat_template as string);
  const messages = [
    { role: "system", content: "Be brief." },
    { role: "user", content: "Hi" },
  ];
  assert.equal(
    template.render({ messages, add_generation_prompt: true }),
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
  );
  assert.equal(template.render({ messages, add_generation_prompt: false }).endsWith("Hi<|im_end|>\n"), true);
});
