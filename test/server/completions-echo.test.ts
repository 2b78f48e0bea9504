// Completions with echo, logprobs and return_token_ids: the choice text is the prompt then the completion,
// prompt_token_ids the prompt's ids (BOS included), token_ids the generated ones, and every logprobs token sits at its
// text_offset in the choice text. A BOS the tokenizer added to a text prompt is a token of no text: it neither shifts
// the offsets (vLLM adds its "<s>"'s 3 characters) nor shows in the text. (vLLM also drops the echoed text when
// return_token_ids is set, vllm-project/vllm#57996; Kiln keeps it.)
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { BOS } from "./fake-engine.js";
import { MODEL, startTestServer, type TestServer } from "./helpers.js";

interface Choice {
  index: number;
  text: string;
  logprobs: { tokens: string[]; token_logprobs: (number | null)[]; text_offset: number[] } | null;
  prompt_token_ids?: number[];
  token_ids?: number[];
}

describe("completions: echo with logprobs and return_token_ids", () => {
  let s: TestServer;
  before(async () => {
    s = await startTestServer();
  });
  after(() => s.close());

  const base = { model: MODEL, max_tokens: 3, temperature: 0, ignore_eos: true, logprobs: 0, return_token_ids: true };
  const complete = async (body: object): Promise<Choice[]> => {
    const res = await fetch(`${s.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ ...base, ...body }) });
    assert.equal(res.status, 200);
    return ((await res.json()) as { choices: Choice[] }).choices;
  };
  /** Every token that is text of the choice starts at its text_offset; special tokens (absent from it) take no room. */
  const checkOffsets = (c: Choice, specials: ReadonlySet<string> = new Set(["<s>"])) => {
    const { tokens, text_offset } = c.logprobs!;
    assert.equal(text_offset.length, tokens.length);
    tokens.forEach((token, i) => {
      if (specials.has(token)) return;
      assert.ok(c.text.startsWith(token, text_offset[i]), `token ${i} ${JSON.stringify(token)} at ${text_offset[i]} of ${JSON.stringify(c.text)}`);
    });
    for (let i = 1; i < text_offset.length; i++) assert.ok(text_offset[i]! >= text_offset[i - 1]!, "offsets never go back");
  };

  it("a text prompt: the BOS the tokenizer adds takes no characters and is not echoed", async () => {
    const [plain] = await complete({ prompt: "hi yo" });
    const [c] = await complete({ prompt: "hi yo", echo: true });
    assert.equal(c!.text, `hi yo${plain!.text}`);
    assert.deepEqual(c!.prompt_token_ids, s.engine.tokenizer.encode("hi yo"));
    assert.equal(c!.prompt_token_ids![0], BOS);
    assert.deepEqual(c!.token_ids, plain!.token_ids, "token_ids: the generated ones only");
    assert.deepEqual(c!.logprobs!.tokens.slice(0, 6), ["<s>", "h", "i", " ", "y", "o"]);
    assert.equal(c!.logprobs!.token_logprobs[0], null, "the first prompt token has no logprob");
    assert.deepEqual(c!.logprobs!.text_offset, [0, 0, 1, 2, 3, 4, 5, 6, 7]);
    checkOffsets(c!);
  });

  it("echo alone (max_tokens 0) and without special tokens", async () => {
    const [only] = await complete({ prompt: "hi yo", echo: true, max_tokens: 0 });
    assert.equal(only!.text, "hi yo");
    assert.deepEqual(only!.token_ids, []);
    assert.deepEqual(only!.logprobs!.text_offset, [0, 0, 1, 2, 3, 4]);
    const [bare] = await complete({ prompt: "hi yo", echo: true, max_tokens: 0, add_special_tokens: false });
    assert.deepEqual(bare!.prompt_token_ids, s.engine.tokenizer.encode("hi yo", { addSpecialTokens: false }));
    assert.deepEqual(bare!.logprobs!.tokens, ["h", "i", " ", "y", "o"]);
    assert.deepEqual(bare!.logprobs!.text_offset, [0, 1, 2, 3, 4]);
  });

  it("a prompt of token ids echoes them decoded, a BOS among them as its text, at its offset", async () => {
    const ids = s.engine.tokenizer.encode("hi");
    const [c] = await complete({ prompt: ids, echo: true });
    assert.ok(c!.text.startsWith("<s>hi"));
    assert.deepEqual(c!.prompt_token_ids, ids);
    assert.deepEqual(c!.logprobs!.text_offset.slice(0, 4), [0, 3, 4, 5]);
    checkOffsets(c!, new Set());
  });

  it("streamed: the chunks add up to the whole reply, offsets and ids included; prompt_token_ids come once", async () => {
    const [whole] = await complete({ prompt: "hi yo", echo: true, max_tokens: 4 });
    const res = await fetch(`${s.url}/v1/completions`, {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ ...base, prompt: "hi yo", echo: true, max_tokens: 4, stream: true }),
    });
    const chunks = (await res.text()).split("\n\n").filter((e) => e.startsWith("data: {")).map((e) => (JSON.parse(e.slice(6)) as { choices: Choice[] }).choices[0]!);
    assert.equal(chunks.map((c) => c.text).join(""), whole!.text);
    assert.deepEqual(chunks.flatMap((c) => c.logprobs!.text_offset), whole!.logprobs!.text_offset);
    assert.deepEqual(chunks.flatMap((c) => c.logprobs!.tokens), whole!.logprobs!.tokens);
    assert.deepEqual(chunks.flatMap((c) => c.token_ids), whole!.token_ids);
    assert.deepEqual(chunks.map((c) => c.prompt_token_ids).filter((p) => p !== undefined), [whole!.prompt_token_ids]);
  });

  it("every choice of n echoes the prompt at the same offsets; truncate_prompt_tokens echoes it whole, its kept tokens in place", async () => {
    const choices = await complete({ prompt: "hi yo", echo: true, n: 2, temperature: 1, seed: 3 });
    assert.equal(choices.length, 2);
    for (const c of choices) {
      assert.deepEqual(c.logprobs!.text_offset.slice(0, 6), [0, 0, 1, 2, 3, 4]);
      checkOffsets(c);
    }
    const [cut] = await complete({ prompt: "abcdef", echo: true, truncate_prompt_tokens: 3, max_tokens: 0 });
    assert.equal(cut!.text, "abcdef");
    // cut as HF's truncation cuts a text: the tokenizer's BOS stays, then the text's last 2 tokens
    assert.deepEqual(cut!.prompt_token_ids, [s.engine.tokenizer.bosTokenId, ...s.engine.tokenizer.encode("ef", { addSpecialTokens: false })]);
    assert.deepEqual(cut!.logprobs!.text_offset, [4, 4, 5]);
    checkOffsets(cut!);
  });

  it("return_tokens_as_token_ids: tokens are named by id, offsets still count the text's characters", async () => {
    const [c] = await complete({ prompt: "hi yo", echo: true, max_tokens: 0, return_tokens_as_token_ids: true });
    const ids = s.engine.tokenizer.encode("hi yo");
    assert.deepEqual(c!.logprobs!.tokens, ids.map((id) => `token_id:${id}`));
    assert.deepEqual(c!.logprobs!.text_offset, [0, 0, 1, 2, 3, 4]);
  });
});
