import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, mkdirSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { brownParagraphs, corpusStats, detokenize, loadCorpus, stripPosTags } from "../../src/train/corpus.js";

test("detokenize: punctuation spacing and `` '' quotes", () => {
  const toks = ["``", "Only", "a", "handful", "''", ",", "the", "jury", "said", "(", "twice", ")", ";", "why", "?", "Fine", "!"];
  assert.equal(detokenize(toks), '"Only a handful", the jury said (twice); why? Fine!');
  assert.equal(detokenize(["He", "said", ":", "``", "no", "''", "."]), 'He said: "no".');
  assert.equal(detokenize(["Ivan", "Allen", "Jr.", "."]), "Ivan Allen Jr.");
});

test("stripPosTags keeps slashes inside words and drops the tag after the last one", () => {
  assert.deepEqual(stripPosTags("The/at Fulton/np-tl 1-1/2/cd ./."), ["The", "Fulton", "1-1/2", "."]);
});

test("brownParagraphs: blank-line paragraphs, one tagged sentence per line", () => {
  const raw = "\n\n\tThe/at jury/nn said/vbd ``/`` no/at ''/'' ./.\nIt/pps ended/vbd ./.\n\n\n\tA/at new/jj paragraph/nn ,/, here/rb ./.\n";
  assert.deepEqual(brownParagraphs(raw), ['The jury said "no". It ended.', "A new paragraph, here."]);
});

test("loadCorpus brown: tags stripped, documents kept separate", () => {
  const docs = loadCorpus({ source: "brown", maxDocs: 20 });
  assert.equal(docs.length, 20);
  const text = docs.join("\n");
  assert.ok(text.length > 150_000, `20 Brown texts hold ~240k chars, got ${text.length}`);
  // No word/tag pairs such as "jury/nn", "said/vbd", "./." remain.
  assert.equal(/[A-Za-z.,]\/(at|nn|np|vbd|in|jj|cc|nns|rb|vb|pps)(-tl|-hl)?\b/.test(text), false);
  assert.equal(/ [,.;:?!)]/.test(text), false, "no space before punctuation");
  assert.ok(docs[0]!.startsWith("The Fulton County Grand Jury said Friday"));
  const paras = loadCorpus({ source: "brown", granularity: "paragraph", maxDocs: 5 });
  assert.equal(paras.length, 5);
  assert.ok(paras.every((p) => !p.includes("\n")));
});

test("loadCorpus nlp-corpus and files", () => {
  const docs = loadCorpus({ source: "nlp-corpus", maxDocs: 300 });
  assert.equal(docs.length, 300);
  assert.ok(docs.every((d) => d.length > 0));
  const dir = mkdtempSync(join(tmpdir(), "kiln-corpus-"));
  mkdirSync(join(dir, "sub"));
  writeFileSync(join(dir, "a.txt"), "first doc\n\nsecond para\n");
  writeFileSync(join(dir, "sub", "b.md"), "third\r\n");
  writeFileSync(join(dir, "skip.bin"), "x");
  assert.deepEqual(loadCorpus({ source: "files", paths: [dir] }), ["first doc\n\nsecond para", "third"]);
  assert.deepEqual(loadCorpus({ source: "files", paths: [dir], granularity: "paragraph" }), ["first doc", "second para", "third"]);
  assert.deepEqual(corpusStats(["ab", "é"]), { docs: 2, chars: 3, bytes: 4 });
  assert.throws(() => loadCorpus({ source: "files", paths: [join(dir, "missing")] }), /does not exist/);
  // a directory with nothing to read is named, not left to fail later as "0 tokens give 0 windows"
  mkdirSync(join(dir, "empty"));
  writeFileSync(join(dir, "empty", "data.jsonl"), "{}\n");
  assert.throws(() => loadCorpus({ source: "files", paths: [join(dir, "empty")] }), /empty holds no text files \(\.txt, \.md, \.text or no extension\)/);
});
