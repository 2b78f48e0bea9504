// Structured output under a reasoning parser (vLLM's --reasoning-parser with structured outputs): the grammar is
// idle while the model thinks and holds from the token after its </think>, or from the first token when the prompt
// already ended the reasoning. A fake model whose next tokens are written out (a thinking script, then a token the
// grammar forbids) shows where the mask starts; the expected texts follow from the script and the regex by hand.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { LLM } from "../../src/engine/llm-engine.js";
import { EngineInputError } from "../../src/engine/errors.js";
import { FakeModelRunner } from "../../src/engine/fake-model-runner.js";
import { reasoningEnded, thinkMarkers } from "../../src/engine/reasoning.js";
import { Tokenizer } from "../../src/models/tokenizer.js";
import { testTokenizerDir, thinkTokenizerDir, tinyModelDir } from "../helpers/tiny-model.js";

const tok = Tokenizer.fromDir(thinkTokenizerDir());
const ids = (text: string) => tok.encode(text, { addSpecialTokens: false });
const [START] = ids("<think>");
const [END] = ids("</think>");
const PLAN = ids(" plan it");
const ZZZ = ids("zzz")[0]!;

/** A model that writes `script` token by token after the prompt, then keeps proposing "zzz" (no regex here allows it). */
function scripted(prompt: number[], script: number[], reasoningParser: "qwen3" | null): LLM {
  const runner = new FakeModelRunner(tok.vocabSize, {
    override: (context, logits) => {
      const k = context.length - prompt.length; // tokens generated so far
      logits[k < script.length ? script[k]! : ZZZ]! += 100;
    },
  });
  return new LLM({ runner, tokenizer: tok, engineArgs: { maxModelLen: 128, numGpuBlocks: 32, blockSize: 4, reasoningParser } });
}

const ANSWER = { regex: "Answer: (yes|no)" };
const greedy = { temperature: 0, maxTokens: 24 };

describe("structured output after the reasoning", () => {
  it("finds the markers and reads where a token list leaves the reasoning", () => {
    assert.equal(typeof START, "number");
    assert.equal(typeof END, "number");
    const m = thinkMarkers(tok, "qwen3");
    assert.deepEqual(m, { start: START, end: END });
    assert.equal(reasoningEnded([1, 2], m), false);
    assert.equal(reasoningEnded([START!, 1, END!, 2], m), true);
    assert.equal(reasoningEnded([END!, 2, START!, 3], m), false); // thinking opened again: the last marker counts
    assert.throws(() => thinkMarkers(Tokenizer.fromDir(testTokenizerDir()), "deepseek_r1"), /needs <think> and <\/think> as single tokens/);
  });

  it("the grammar waits for </think>: the thinking is the model's own, the answer follows the regex", () => {
    const prompt = ids("Is it?");
    const [o] = scripted(prompt, [...PLAN, END!], "qwen3").generate([{ promptTokenIds: prompt }], { ...greedy, structuredOutputs: ANSWER })[0]!.outputs;
    assert.match(o!.text, /^ plan it<\/think>Answer: (yes|no)$/);
    assert.equal(o!.finishReason, "stop"); // the grammar completed: only EOS was left
    // without a reasoning parser the grammar holds from the first token, as before
    const [plain] = scripted(prompt, [...PLAN, END!], null).generate([{ promptTokenIds: prompt }], { ...greedy, structuredOutputs: ANSWER })[0]!.outputs;
    assert.match(plain!.text, /^Answer: (yes|no)$/);
  });

  it("a prompt that ended the reasoning starts the grammar at once; one that reopened it does not", () => {
    const closed = [...ids("Is it?"), START!, END!];
    const [a] = scripted(closed, [...PLAN, END!], "qwen3").generate([{ promptTokenIds: closed }], { ...greedy, structuredOutputs: ANSWER })[0]!.outputs;
    assert.match(a!.text, /^Answer: (yes|no)$/);
    const reopened = [...ids("Is it?"), END!, START!];
    const [b] = scripted(reopened, [...PLAN, END!], "qwen3").generate([{ promptTokenIds: reopened }], { ...greedy, structuredOutputs: ANSWER })[0]!.outputs;
    assert.match(b!.text, /^ plan it<\/think>Answer: (yes|no)$/);
  });

  it("thinking cut by max_tokens is never constrained; n samples each keep their own gate", () => {
    const prompt = ids("Is it?");
    const llm = scripted(prompt, [...PLAN, ...PLAN, ...PLAN], "qwen3");
    const [o] = llm.generate([{ promptTokenIds: prompt }], { temperature: 0, maxTokens: PLAN.length * 2, structuredOutputs: ANSWER })[0]!.outputs;
    assert.equal(o!.text, " plan it plan it");
    assert.equal(o!.finishReason, "length");
    const outs = scripted(prompt, [...PLAN, END!], "qwen3").generate([{ promptTokenIds: prompt }], { n: 2, seed: 1, temperature: 0.01, maxTokens: 24, structuredOutputs: ANSWER })[0]!.outputs;
    for (const s of outs) assert.match(s.text, /^ plan it<\/think>Answer: (yes|no)$/);
  });

  it("a tokenizer without the markers is refused when the model is loaded", () => {
    assert.throws(
      () => new LLM({ model: tinyModelDir("LlamaForCausalLM"), maxModelLen: 64, reasoningParser: "qwen3" }),
      (e: unknown) => e instanceof EngineInputError && e.param === "reasoning_parser" && /single tokens/.test(e.message),
    );
  });
});
