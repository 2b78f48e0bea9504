// A sequence classifier with one label is a cross-encoder (vLLM's reranker): /score and /rerank read each (text_1,
// text_2) pair as one prompt, the tokenizer's text pair (here a TemplateProcessing pair template, so the joining
// tokens show), and a pair scores sigmoid of the head's logit. The expectation is computed here: the prompt built by
// hand from each text's own encoding, and the logit from the model's dense forward (no KV cache, another attention
// kernel) with the head multiplied out in float64. A use_sep_token: false model (an LLM converted to a reranker)
// scores the two texts joined into one text instead; an embedding model keeps the cosine path (score.test.ts).
import assert from "node:assert/strict";
import * as fs from "node:fs";
import { after, before, describe, it } from "node:test";
import { LLM } from "../../src/engine/llm-engine.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { arange, noGrad, tensor } from "../../src/tensor/index.js";
import { tempPath, testTokenizerDir, tinyModelDir } from "../helpers/tiny-model.js";
import { postRaw, startKiln, type KilnServer } from "./kiln-process.js";

/** The test tokenizer with a pair template: `<|im_start|> $A` alone, `<|im_start|> $A <|endoftext|> $B <|im_end|>` for a pair. */
function pairTemplateTokenizerDir(): string {
  const dir = tempPath("tokenizer-pair-template");
  if (fs.existsSync(dir)) return dir;
  fs.cpSync(testTokenizerDir(), dir, { recursive: true });
  const file = `${dir}/tokenizer.json`;
  const json = JSON.parse(fs.readFileSync(file, "utf8")) as { added_tokens: { id: number; content: string }[]; post_processor: unknown };
  const id = (content: string) => json.added_tokens.find((t) => t.content === content)!.id;
  const special = (name: string, typeId: number) => ({ SpecialToken: { id: name, type_id: typeId } });
  const names = ["<|im_start|>", "<|endoftext|>", "<|im_end|>"];
  json.post_processor = {
    type: "TemplateProcessing",
    single: [special("<|im_start|>", 0), { Sequence: { id: "A", type_id: 0 } }],
    pair: [special("<|im_start|>", 0), { Sequence: { id: "A", type_id: 0 } }, special("<|endoftext|>", 1), { Sequence: { id: "B", type_id: 1 } }, special("<|im_end|>", 1)],
    special_tokens: Object.fromEntries(names.map((n) => [n, { id: n, ids: [id(n)], tokens: [n] }])),
  };
  fs.writeFileSync(file, JSON.stringify(json));
  return dir;
}

const reranker = (extra: Record<string, unknown> = {}) =>
  tinyModelDir("LlamaForCausalLM", { tokenizerDir: pairTemplateTokenizerDir(), std: 0.05, overrides: { architectures: ["LlamaForSequenceClassification"], num_labels: 1, ...extra } });
const dir = reranker();
const query = "the river ran by the old mill";
const docs = ["a quiet city", "the river ran", "old mill wheels turn slowly", "stars at night", "a river"];

const models = new Map<string, ReturnType<typeof loadLocalModel>>();
const loaded = (modelDir: string) => models.get(modelDir) ?? models.set(modelDir, loadLocalModel(modelDir)).get(modelDir)!;

/** sigmoid(w . h_last) in float64, h_last from the dense forward of the whole prompt. */
function expectedScore(modelDir: string, ids: number[]): number {
  const { model } = loaded(modelDir);
  const H = model.config.hiddenSize;
  const h = noGrad(() => model.forward(tensor(Int32Array.from(ids)), { kind: "dense", batch: 1, seqLen: ids.length, positions: arange(ids.length) }).dataSync() as Float32Array);
  const last = h.subarray((ids.length - 1) * H, ids.length * H);
  const w = model.score!.weight.dataSync() as Float32Array;
  let logit = 0;
  for (let i = 0; i < H; i++) logit += w[i]! * last[i]!;
  return 1 / (1 + Math.exp(-logit));
}

const tok = loaded(dir).tokenizer;
const special = (t: string) => tok.encode(t, { addSpecialTokens: false })[0]!;
/** The pair template by hand: <|im_start|> A <|endoftext|> B <|im_end|>, each text encoded alone without specials. */
const pairIds = (a: string, b: string) => [
  special("<|im_start|>"), ...tok.encode(a, { addSpecialTokens: false }), special("<|endoftext|>"), ...tok.encode(b, { addSpecialTokens: false }), special("<|im_end|>"),
];
const assertNear = (got: number, want: number, what: string): void => assert.ok(Math.abs(got - want) < 1e-5, `${what}: ${got} vs ${want}`);

interface ScoreBody {
  object: string;
  data: { index: number; object: string; score: number }[];
  usage: { prompt_tokens: number; total_tokens: number; completion_tokens: number };
}
interface RerankBody {
  usage: { prompt_tokens: number; total_tokens: number };
  results: { index: number; document?: { text: string }; relevance_score: number }[];
}

describe("cross-encoder scoring (*ForSequenceClassification, num_labels 1)", () => {
  const want = new Map(docs.map((d) => [d, expectedScore(dir, pairIds(query, d))]));

  it("the expectation is not degenerate: scores inside (0, 1), far apart, and unlike the plain concatenation's", () => {
    const scores = [...want.values()].sort();
    assert.ok(scores.every((s) => s > 0.001 && s < 0.999), String(scores));
    for (let i = 1; i < scores.length; i++) assert.ok(scores[i]! - scores[i - 1]! > 1e-4, `distinct: ${String(scores)}`);
    const plain = [special("<|im_start|>"), ...tok.encode(query + docs[0]!, { addSpecialTokens: false })];
    assert.ok(Math.abs(expectedScore(dir, plain) - want.get(docs[0]!)!) > 1e-4, "the pair template changes the score");
  });

  describe("kiln serve (e2e)", () => {
    let server: KilnServer;
    const ok = async <T>(path: string, body: Record<string, unknown>): Promise<T> => {
      const r = await postRaw(server.url, path, { model: server.model, ...body });
      assert.equal(r.status, 200, `${path}: ${JSON.stringify(r.body)}`);
      return r.body as T;
    };
    before(async () => {
      server = await startKiln(["--max-model-len", "128"], dir);
    });
    after(async () => {
      assert.equal(await server.stop(), 0);
    });

    it("/score and /v1/score: each pair's prompt classified, sigmoid of its logit (1:1, 1:N, N:N); usage counts the pair prompts", async () => {
      const one = await ok<ScoreBody>("/v1/score", { text_1: query, text_2: docs[2] });
      assert.deepEqual(one.data.map((d) => [d.index, d.object]), [[0, "score"]]);
      assertNear(one.data[0]!.score, want.get(docs[2]!)!, "1:1");
      assert.deepEqual(one.usage, { ...one.usage, prompt_tokens: pairIds(query, docs[2]!).length, total_tokens: pairIds(query, docs[2]!).length, completion_tokens: 0 });
      for (const text1 of [query, [query]]) {
        const many = await ok<ScoreBody>("/score", { text_1: text1, text_2: docs });
        assert.deepEqual(many.data.map((d) => d.index), [0, 1, 2, 3, 4]);
        many.data.forEach((d, i) => assertNear(d.score, want.get(docs[i]!)!, `1:N ${i}`));
        assert.equal(many.usage.prompt_tokens, docs.reduce((n, d) => n + pairIds(query, d).length, 0));
      }
      const left = [docs[0]!, query];
      const right = [docs[1]!, docs[4]!];
      const pairs = await ok<ScoreBody>("/v1/score", { text_1: left, text_2: right });
      pairs.data.forEach((d, i) => assertNear(d.score, expectedScore(dir, pairIds(left[i]!, right[i]!)), `N:N ${i}`));
      // the same prompt through /classify (token ids): the same score, its one probability
      const viaClassify = await ok<{ data: { probs: number[] }[] }>("/classify", { input: pairIds(query, docs[2]!) });
      assert.deepEqual(viaClassify.data[0]!.probs, [one.data[0]!.score]);
    });

    it("truncate_prompt_tokens keeps each pair prompt's last tokens, as for any pooling prompt", async () => {
      const r = await ok<ScoreBody>("/v1/score", { text_1: query, text_2: docs[2], truncate_prompt_tokens: 4 });
      assertNear(r.data[0]!.score, expectedScore(dir, pairIds(query, docs[2]!).slice(-4)), "truncated");
      assert.equal(r.usage.prompt_tokens, 4);
      // vLLM's truncation_side "right" keeps the first tokens instead
      const right = await ok<ScoreBody>("/v1/score", { text_1: query, text_2: docs[2], truncate_prompt_tokens: 4, truncation_side: "right" });
      assertNear(right.data[0]!.score, expectedScore(dir, pairIds(query, docs[2]!).slice(0, 4)), "truncated on the right");
    });

    it("/rerank, /v1/rerank and /v2/rerank: documents by cross-encoder score, best first; top_n and return_documents", async () => {
      const byHand = docs.map((d, index) => ({ index, score: want.get(d)! })).sort((a, b) => b.score - a.score);
      for (const path of ["/rerank", "/v1/rerank", "/v2/rerank"]) {
        const r = await ok<RerankBody>(path, { query, documents: docs });
        assert.deepEqual(r.results.map((x) => x.index), byHand.map((x) => x.index), path);
        r.results.forEach((x, k) => {
          assertNear(x.relevance_score, byHand[k]!.score, `${path} result ${k}`);
          assert.deepEqual(x.document, { text: docs[x.index] });
        });
        const prompt = docs.reduce((n, d) => n + pairIds(query, d).length, 0);
        assert.deepEqual(r.usage, { prompt_tokens: prompt, total_tokens: prompt });
      }
      const top = await ok<RerankBody>("/v1/rerank", { query, documents: docs, top_n: 2, return_documents: false });
      assert.deepEqual(top.results.map((x) => [x.index, Object.keys(x).sort()]), byHand.slice(0, 2).map((x) => [x.index, ["index", "relevance_score"]]));
      // use_activation false (vLLM): the raw logit, whose sigmoid is the default score
      const logit = (p: number) => Math.log(p / (1 - p));
      const rawRerank = await ok<RerankBody>("/rerank", { query, documents: docs, use_activation: false });
      assert.deepEqual(rawRerank.results.map((x) => x.index), byHand.map((x) => x.index));
      rawRerank.results.forEach((x, i) => assert.ok(Math.abs(x.relevance_score - logit(byHand[i]!.score)) < 1e-3, `${x.relevance_score} vs ${logit(byHand[i]!.score)}`));
      const activated = await ok<RerankBody>("/rerank", { query, documents: docs, use_activation: true });
      assert.deepEqual(activated.results.map((x) => x.index), byHand.map((x) => x.index));
    });
  });

  it("LLM.score: the server's cross-encoder scores offline; use_sep_token false scores the texts joined into one text", () => {
    const llm = new LLM({ model: dir, maxModelLen: 128, kvCacheMemory: 1 << 20 });
    const scores = llm.score(query, docs);
    scores.forEach((s, i) => {
      assertNear(s.score, want.get(docs[i]!)!, `offline ${i}`);
      assert.deepEqual(s.promptTokenIds, pairIds(query, docs[i]!));
    });
    assert.throws(() => llm.score({ promptTokenIds: [1, 2] }, "x"), (e: Error & { param?: string }) => e.param === "text_1");
    // vLLM's `llm as reranker` (use_sep_token false): tokenizer(text=text_1 + text_2), the single template's specials
    const joinedDir = reranker({ use_sep_token: false });
    const joined = new LLM({ model: joinedDir, maxModelLen: 128, kvCacheMemory: 1 << 20 }).score(query, docs.slice(0, 2));
    joined.forEach((s, i) => {
      const ids = [special("<|im_start|>"), ...tok.encode(query + docs[i]!, { addSpecialTokens: false })];
      assert.deepEqual(s.promptTokenIds, ids);
      assertNear(s.score, expectedScore(joinedDir, ids), `joined ${i}`);
    });
  });
});
