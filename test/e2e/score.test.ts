// `kiln serve --runner pooling` answers vLLM's Score (/score, /v1/score) and Rerank (/rerank, /v1/rerank, /v2/rerank)
// APIs for an embedding model: a pair scores the cosine similarity of the two texts' /v1/embeddings vectors (computed
// here, by hand), paired 1:1, 1:N or N:N; rerank sorts the documents by it. Every input of a request counts against
// --max-waiting-requests; LLM.score gives the same scores offline.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { LLM } from "../../src/engine/llm-engine.js";
import { tinyModelDir } from "../helpers/tiny-model.js";
import { startTestServer } from "../server/helpers.js";
import { assertErrorBody, postRaw, startKiln, type KilnServer } from "./kiln-process.js";

const query = "the river ran by the old mill";
const docs = ["a quiet city", "the river ran", "old mill wheels turn slowly", "stars at night", "a river"];

/** cos(a, b) = a.b / (|a| |b|), in float64. */
function cosine(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let dot = 0;
  let aa = 0;
  let bb = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i]! * b[i]!;
    aa += a[i]! ** 2;
    bb += b[i]! ** 2;
  }
  return dot / Math.sqrt(aa * bb);
}

interface ScoreBody {
  id: string;
  object: string;
  created: number;
  model: string;
  data: { index: number; object: string; score: number }[];
  usage: { prompt_tokens: number; total_tokens: number; completion_tokens: number };
}
interface RerankBody {
  id: string;
  model: string;
  usage: { prompt_tokens: number; total_tokens: number };
  results: { index: number; document?: { text: string }; relevance_score: number }[];
}

describe("kiln serve --runner pooling: /score and /rerank (e2e)", () => {
  let server: KilnServer;
  const vectors = new Map<string, number[]>();
  const tokens = new Map<string, number>();
  const post = (path: string, body: Record<string, unknown>) => postRaw(server.url, path, { model: server.model, ...body });
  const ok = async <T>(path: string, body: Record<string, unknown>): Promise<T> => {
    const r = await post(path, body);
    assert.equal(r.status, 200, `${path}: ${JSON.stringify(r.body)}`);
    return r.body as T;
  };
  const expectScore = (a: string, b: string): number => cosine(vectors.get(a)!, vectors.get(b)!);
  const assertNear = (got: number, want: number, what: string): void =>
    assert.ok(Math.abs(got - want) < 1e-5, `${what}: ${got} vs ${want}`);

  before(async () => {
    server = await startKiln(["--runner", "pooling", "--max-model-len", "64", "--max-waiting-requests", "8"]);
    // the independent expectation: each text's vector from /v1/embeddings, its token count from /tokenize
    const all = [query, ...docs];
    const r = await post("/v1/embeddings", { input: all, encoding_format: "float" });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    (r.body as { data: { embedding: number[] }[] }).data.forEach((d, i) => vectors.set(all[i]!, d.embedding));
    for (const t of all) tokens.set(t, ((await post("/tokenize", { prompt: t })).body as { count: number }).count);
  });
  after(async () => {
    assert.equal(await server.stop(), 0);
  });

  it("scores 1:1, 1:N and N:N pairs as the cosine similarity of their embeddings, on /score and /v1/score", async () => {
    const one = await ok<ScoreBody>("/v1/score", { text_1: query, text_2: docs[2] });
    assert.equal(one.object, "list");
    assert.match(one.id, /^score-/);
    assert.equal(one.model, server.model);
    assert.equal(typeof one.created, "number");
    assert.deepEqual(
      one.data.map((d) => [d.index, d.object]),
      [[0, "score"]],
    );
    assertNear(one.data[0]!.score, expectScore(query, docs[2]!), "1:1");
    assert.deepEqual(one.usage, { ...one.usage, prompt_tokens: tokens.get(query)! + tokens.get(docs[2]!)!, completion_tokens: 0 });
    assert.equal(one.usage.total_tokens, one.usage.prompt_tokens);

    // 1:N, the one text_1 as a string or a one-element list: one score per text_2; usage counts text_1 once per pair
    for (const text1 of [query, [query]]) {
      const many = await ok<ScoreBody>("/score", { text_1: text1, text_2: docs });
      assert.deepEqual(
        many.data.map((d) => d.index),
        [0, 1, 2, 3, 4],
      );
      many.data.forEach((d, i) => assertNear(d.score, expectScore(query, docs[i]!), `1:N ${i}`));
      assert.equal(
        many.usage.prompt_tokens,
        docs.reduce((n, d) => n + tokens.get(query)! + tokens.get(d)!, 0),
      );
    }

    // N:N, element-wise
    const left = [docs[0]!, query, docs[3]!];
    const right = [docs[1]!, docs[4]!, query];
    const pairs = await ok<ScoreBody>("/v1/score", { text_1: left, text_2: right });
    assert.equal(pairs.data.length, 3);
    pairs.data.forEach((d, i) => assertNear(d.score, expectScore(left[i]!, right[i]!), `N:N ${i}`));
    // a text against itself: 1
    assertNear((await ok<ScoreBody>("/v1/score", { text_1: query, text_2: query })).data[0]!.score, 1, "self");
  });

  it("truncate_prompt_tokens cuts each text as /v1/embeddings does", async () => {
    const cut = await post("/v1/embeddings", { input: [query, docs[2]], encoding_format: "float", truncate_prompt_tokens: 3 });
    const [q, d] = (cut.body as { data: { embedding: number[] }[] }).data.map((e) => e.embedding);
    const r = await ok<ScoreBody>("/v1/score", { text_1: query, text_2: docs[2], truncate_prompt_tokens: 3 });
    assertNear(r.data[0]!.score, cosine(q!, d!), "truncated");
    assert.equal(r.usage.prompt_tokens, 6);
    assertNear(
      (await ok<ScoreBody>("/v1/score", { text_1: query, text_2: docs[2], truncate_prompt_tokens: -1 })).data[0]!.score,
      expectScore(query, docs[2]!),
      "-1: max_model_len",
    );
  });

  it("reranks the documents by score, best first, on /rerank, /v1/rerank and /v2/rerank; top_n keeps the best n", async () => {
    const byHand = docs.map((d, index) => ({ index, score: expectScore(query, d) })).sort((a, b) => b.score - a.score);
    for (const path of ["/rerank", "/v1/rerank", "/v2/rerank"]) {
      const r = await ok<RerankBody>(path, { query, documents: docs });
      assert.match(r.id, /^rerank-/);
      assert.equal(r.model, server.model);
      assert.deepEqual(
        r.results.map((x) => x.index),
        byHand.map((x) => x.index),
        path,
      );
      r.results.forEach((x, k) => {
        assertNear(x.relevance_score, byHand[k]!.score, `${path} result ${k}`);
        assert.deepEqual(x.document, { text: docs[x.index] });
      });
      const prompt = docs.reduce((n, d) => n + tokens.get(query)! + tokens.get(d)!, 0);
      assert.deepEqual(r.usage, { prompt_tokens: prompt, total_tokens: prompt });
    }
    const top = await ok<RerankBody>("/v1/rerank", { query, documents: docs, top_n: 2 });
    assert.deepEqual(
      top.results.map((x) => x.index),
      byHand.slice(0, 2).map((x) => x.index),
    );
    for (const n of [0, -1, 99])
      assert.equal((await ok<RerankBody>("/v1/rerank", { query, documents: docs, top_n: n })).results.length, docs.length);
    const bare = await ok<RerankBody>("/v1/rerank", { query, documents: docs, return_documents: false, top_n: 1 });
    assert.deepEqual(
      bare.results.map((x) => Object.keys(x).sort()),
      [["index", "relevance_score"]],
    );
  });

  it("answers bad input with a 400 naming the field, and an unknown model with 404", async () => {
    const bad = async (path: string, body: Record<string, unknown>, param: string, message?: RegExp) => {
      const r = await post(path, body);
      assert.equal(r.status, 400, `${path} ${JSON.stringify(body)}: ${JSON.stringify(r.body)}`);
      assertErrorBody(r.body, { type: "invalid_request_error", param, ...(message ? { message } : {}) });
    };
    await bad("/v1/score", { text_1: [query, docs[0]], text_2: docs }, "text_2", /1:1, 1:N or N:N/);
    await bad("/v1/score", { text_1: [], text_2: docs }, "text_1", /At least one text element/);
    await bad("/v1/score", { text_1: query, text_2: [] }, "text_2", /At least one text_pair element/);
    await bad("/v1/score", { text_2: docs }, "text_1");
    await bad("/v1/score", { text_1: [1, 2], text_2: docs }, "text_1");
    await bad("/v1/score", { text_1: query, text_2: "x", truncate_prompt_tokens: -2 }, "truncate_prompt_tokens");
    await bad(
      "/v1/score",
      { text_1: query, text_2: "x", truncate_prompt_tokens: 65 },
      "truncate_prompt_tokens",
      /greater than max_model_len \(64\)/,
    );
    await bad("/v1/score", { text_1: query, text_2: "x", priority: "high" }, "priority");
    await bad("/v1/score", { text_1: query, text_2: "word ".repeat(80) }, "text_2", /maximum context length is 64 tokens.*for score/);
    await bad("/v1/rerank", { query, documents: [] }, "documents", /At least one text_pair element/);
    await bad("/v1/rerank", { documents: docs }, "query");
    await bad("/v1/rerank", { query: [query], documents: docs }, "query");
    await bad("/v1/rerank", { query, documents: [{ text: "x" }] }, "documents");
    await bad("/v1/rerank", { query, documents: docs, top_n: 1.5 }, "top_n");
    await bad("/v1/rerank", { query, documents: docs, return_documents: "no" }, "return_documents");
    await bad("/v1/rerank", { query: "word ".repeat(80), documents: docs }, "query", /maximum context length/);
    for (const [path, body] of [
      ["/v1/score", { text_1: query, text_2: "x" }],
      ["/v1/rerank", { query, documents: docs }],
    ] as const) {
      const r = await postRaw(server.url, path, { ...body, model: "other" });
      assert.equal(r.status, 404);
      assertErrorBody(r.body, { type: "not_found_error", param: "model" });
    }
  });

  it("counts every input against --max-waiting-requests (8): more inputs than that is a 503 queue_full", async () => {
    const eight = Array.from({ length: 8 }, (_, i) => `doc ${i}`);
    for (const [path, body] of [
      ["/v1/score", { text_1: query, text_2: eight }], // 1 + 8 texts
      ["/v1/score", { text_1: eight.slice(0, 5), text_2: eight.slice(3) }], // 5 + 5
      ["/v1/rerank", { query, documents: eight }],
      ["/v1/embeddings", { input: [...eight, query] }],
    ] as const) {
      const r = await post(path, body);
      assert.equal(r.status, 503, `${path}: ${JSON.stringify(r.body)}`);
      assertErrorBody(r.body, {
        type: "service_unavailable_error",
        param: null,
        code: "queue_full",
        message: /overloaded.*9 inputs|overloaded.*10 inputs/,
      });
    }
    assert.equal((await post("/v1/score", { text_1: query, text_2: eight.slice(1) })).status, 200, "1 + 7 texts fit");
    assert.equal((await post("/v1/embeddings", { input: eight })).status, 200, "8 inputs fit");
  });

  it("LLM.score gives the server's scores offline (1:N, N:N) and refuses other pairings", () => {
    const llm = new LLM({ model: tinyModelDir("LlamaForCausalLM"), runner: "pooling", maxModelLen: 64, kvCacheMemory: 1 << 20 });
    const scores = llm.score(query, docs);
    assert.equal(scores.length, docs.length);
    scores.forEach((s, i) => {
      assertNear(s.score, expectScore(query, docs[i]!), `offline ${i}`);
      assert.equal(s.promptTokenIds.length, tokens.get(query)! + tokens.get(docs[i]!)!);
    });
    const [pair] = llm.score([docs[0]!], [docs[1]!]);
    assertNear(pair!.score, expectScore(docs[0]!, docs[1]!), "offline 1:1");
    assert.throws(
      () => llm.score([query, docs[0]!], docs),
      (e: Error & { param?: string }) => e.param === "text_2" && /1:1, 1:N or N:N/.test(e.message),
    );
    assert.throws(
      () => llm.score(query, []),
      (e: Error & { param?: string }) => e.param === "text_2",
    );
  });
});

it("a generating server refuses /score and /rerank as vLLM does", async () => {
  const s = await startTestServer();
  try {
    const score = await postRaw(s.url, "/v1/score", { model: "kiln-test", text_1: "a", text_2: "b" });
    assert.equal(score.status, 400);
    assertErrorBody(score.body, { type: "invalid_request_error", message: /does not support Score API/ });
    for (const path of ["/rerank", "/v1/rerank", "/v2/rerank"]) {
      const r = await postRaw(s.url, path, { model: "kiln-test", query: "a", documents: ["b"] });
      assert.equal(r.status, 400, path);
      assertErrorBody(r.body, { type: "invalid_request_error", message: /does not support Rerank \(Score\) API/ });
    }
  } finally {
    await s.close();
  }
});
