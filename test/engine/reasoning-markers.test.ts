// Each reasoning parser names its markers: mistral's [THINK] and [/THINK] (special tokens, as in Magistral's
// tokenizer) gate structured output as <think> does; granite's are phrases of text, and structured output under
// them is refused with a typed error. A fake model whose next tokens are written out shows where the grammar starts
// (the expected texts follow from the script and the regex by hand).
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { after, describe, it } from "node:test";
import { LLM } from "../../src/engine/llm-engine.js";
import { EngineInputError } from "../../src/engine/errors.js";
import { FakeModelRunner } from "../../src/engine/fake-model-runner.js";
import { hasTokenMarkers, REASONING_PARSERS, textMarkersRefusal, thinkMarkers, type ReasoningParserName } from "../../src/engine/reasoning.js";
import { Tokenizer } from "../../src/models/tokenizer.js";
import { loadCorpus } from "../../src/train/corpus.js";
import { saveTokenizer, trainBpeTokenizer } from "../../src/train/bpe-trainer.js";

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-think-markers-"));
after(() => fs.rmSync(dir, { recursive: true, force: true }));
saveTokenizer(dir, trainBpeTokenizer(loadCorpus({ source: "brown", maxDocs: 40 }), { vocabSize: 400, specialTokens: ["<|endoftext|>", "[THINK]", "[/THINK]"] }));
const tok = Tokenizer.fromDir(dir);
const ids = (text: string) => tok.encode(text, { addSpecialTokens: false });
const [THINK] = ids("[THINK]");
const [END_THINK] = ids("[/THINK]");
const PLAN = ids(" plan it");
const ZZZ = ids("zzz")[0]!;

/** A model that writes `script` token by token after the prompt, then keeps proposing "zzz" (the regex forbids it). */
function scripted(prompt: number[], script: number[], reasoningParser: ReasoningParserName | null): LLM {
  const runner = new FakeModelRunner(tok.vocabSize, {
    override: (context, logits) => {
      const k = context.length - prompt.length;
      logits[k < script.length ? script[k]! : ZZZ]! += 100;
    },
  });
  return new LLM({ runner, tokenizer: tok, engineArgs: { maxModelLen: 128, numGpuBlocks: 32, blockSize: 4, reasoningParser } });
}

const ANSWER = { regex: "Answer: (yes|no)" };
const greedy = { temperature: 0, maxTokens: 24, skipSpecialTokens: false };

describe("reasoning markers per parser", () => {
  it("names token markers for <think> parsers and mistral, text for granite", () => {
    assert.deepEqual(REASONING_PARSERS, ["deepseek_r1", "qwen3", "mistral", "granite"]);
    assert.deepEqual(REASONING_PARSERS.map(hasTokenMarkers), [true, true, true, false]);
    assert.deepEqual(thinkMarkers(tok, "mistral"), { start: THINK, end: END_THINK });
    assert.throws(() => thinkMarkers(tok, "qwen3"), /needs <think> and <\/think> as single tokens/);
    assert.throws(() => thinkMarkers(tok, "granite"), /text markers/);
    assert.equal(textMarkersRefusal("mistral"), null);
    assert.match(textMarkersRefusal("granite")!, /cannot follow the granite reasoning parser's reasoning/);
  });

  it("mistral: the grammar waits for [/THINK], or starts at once after a prompt that closed the thinking", () => {
    const prompt = ids("Is it?");
    const [o] = scripted(prompt, [THINK!, ...PLAN, END_THINK!], "mistral").generate([{ promptTokenIds: prompt }], { ...greedy, structuredOutputs: ANSWER })[0]!.outputs;
    assert.match(o!.text, /^\[THINK\] plan it\[\/THINK\]Answer: (yes|no)$/);
    // Magistral's system prompt shows [THINK]...[/THINK]: the reasoning counts as ended, as vLLM's is_reasoning_end reads it
    const closed = [THINK!, ...ids("example"), END_THINK!, ...prompt];
    const [a] = scripted(closed, [THINK!, ...PLAN, END_THINK!], "mistral").generate([{ promptTokenIds: closed }], { ...greedy, structuredOutputs: ANSWER })[0]!.outputs;
    assert.match(a!.text, /^Answer: (yes|no)$/);
  });

  it("granite: structured output is refused (param structured_outputs); plain generation runs", () => {
    const prompt = ids("Is it?");
    const llm = scripted(prompt, PLAN, "granite");
    assert.throws(
      () => llm.generate([{ promptTokenIds: prompt }], { ...greedy, structuredOutputs: ANSWER }),
      (e: unknown) => e instanceof EngineInputError && e.param === "structured_outputs" && /markers are text/.test(e.message),
    );
    const [o] = llm.generate([{ promptTokenIds: prompt }], { temperature: 0, maxTokens: PLAN.length })[0]!.outputs;
    assert.equal(o!.text, " plan it");
  });
});
