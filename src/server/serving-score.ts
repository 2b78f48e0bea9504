// POST /score, /v1/score (vLLM's Score API) and /rerank, /v1/rerank, /v2/rerank (vLLM's Jina/Cohere-style Rerank API)
// on a pooling server, as vLLM serves them. An embedding (bi-encoder) model pools every text once by the
// /v1/embeddings machinery and a pair scores the cosine similarity of its two vectors; a sequence classifier with one
// label (cross-encoder, a reranker) reads each pair as one prompt and a pair scores its classifier output, the
// sigmoid of its logit (engine/scoring.ts). A classifier of more labels scores nothing, as in vLLM.
import type { FastifyReply, FastifyRequest } from "fastify";
import { cosineSimilarity, crossEncoderLabelsError, crossEncoderPromptIds, scorePairingError, scorePairs } from "../engine/scoring.js";
import { badRequest } from "./errors.js";
import { optBool, optInt, optString, type Json } from "./fields.js";
import { asJsonBody } from "./protocol.js";
import { nowSeconds, randomId, resolveModel, type ServingContext } from "./serving-context.js";
import { optTruncationSide, poolingOverrides, poolingTokenIds, poolTokenIds } from "./serving-embeddings.js";

/** A field that is one text or a list of texts (vLLM's `str | list[str]`). */
function texts(body: Json, field: string, { single = false } = {}): string[] {
  const v = body[field];
  if (v === undefined || v === null) throw badRequest(`'${field}' is required`, field);
  if (typeof v === "string") return [v];
  if (!single && Array.isArray(v) && v.every((t) => typeof t === "string")) return v as string[];
  throw badRequest(`'${field}' must be a string${single ? "" : " or a list of strings"}`, field);
}

/** Why the model does not score pairs ("" for a generating model), or null when it does. */
function scoringRefusal(ctx: ServingContext): string | null {
  if (ctx.poolingTask === "embed") return null;
  return ctx.poolingTask === "classify" ? crossEncoderLabelsError(ctx.classLabels?.length ?? 0) : "";
}

/** Whether /score and /rerank serve the model: an embedding model, or a one-label classifier (a cross-encoder). */
export const servesScoring = (ctx: ServingContext): boolean => scoringRefusal(ctx) === null;

/**
 * Refuses a model that does not score pairs, as vLLM words it for `api`: a generating one, and a classifier of other
 * than one label (vLLM enables scoring for num_labels == 1 only).
 */
function checkScoringModel(ctx: ServingContext, api: string): void {
  const why = scoringRefusal(ctx);
  if (why !== null) throw badRequest(`The model does not support ${api} API${why ? ` (it is ${why})` : ""}`);
}

/** One scored pair: its text_1 and text_2 indices and score (cosine similarity, or the cross-encoder's output). */
interface PairScore {
  first: number;
  second: number;
  score: number;
}

/**
 * Scores the pairs of `first` and `second` (1:1, 1:N or N:N, one per `second` text). A cross-encoder pools each pair's
 * prompt (the pair encoded as vLLM does, then cut like any pooling prompt); a bi-encoder pools each text once.
 * `promptTokens` counts each pair's prompt (a bi-encoder's: its two texts' prompts), as vLLM's usage does.
 */
async function scoreTexts(
  ctx: ServingContext,
  request: FastifyRequest,
  reply: FastifyReply,
  body: Json,
  id: string,
  first: string[],
  second: string[],
  fields: { first: string; second: string; operation: string },
): Promise<{ pairs: PairScore[]; promptTokens: number }> {
  const why = scorePairingError(first.length, second.length);
  if (why !== null) throw badRequest(why, first.length === 0 ? fields.first : fields.second);
  const truncate = optInt(body, "truncate_prompt_tokens", { min: -1 });
  const priority = optInt(body, "priority") ?? 0;
  const options = { truncate, side: optTruncationSide(body), addSpecialTokens: true, operation: fields.operation };
  if (ctx.poolingTask === "classify") {
    const pairOptions = { useSepToken: ctx.useSepToken, addSpecialTokens: true };
    const pairs = scorePairs(first.length, second.length);
    const prompts = pairs.map(([i, j]) => ({ tokenIds: crossEncoderPromptIds(ctx.tokenizer, first[i]!, second[j]!, pairOptions) }));
    const ids = poolingTokenIds(ctx, prompts, { ...options, field: fields.second });
    const scores = await poolTokenIds(ctx, request, reply, id, ids, priority, poolingOverrides(ctx, body));
    return {
      pairs: pairs.map(([i, j], k) => ({ first: i, second: j, score: scores[k]![0]! })),
      promptTokens: ids.reduce((n, t) => n + t.length, 0),
    };
  }
  const prompts = (t: string[]) => t.map((text) => ({ text }));
  const ids = [
    ...poolingTokenIds(ctx, prompts(first), { ...options, field: fields.first }),
    ...poolingTokenIds(ctx, prompts(second), { ...options, field: fields.second }),
  ];
  const vectors = await poolTokenIds(ctx, request, reply, id, ids, priority);
  let promptTokens = 0;
  const pairs = scorePairs(first.length, second.length).map(([i, j]) => {
    promptTokens += ids[i]!.length + ids[first.length + j]!.length;
    return { first: i, second: j, score: cosineSimilarity(vectors[i]!, vectors[first.length + j]!) };
  });
  return { pairs, promptTokens };
}

/**
 * The field pairs vLLM's ScoreRequest takes for its two sides, in the order its union tries them (queries/documents,
 * queries/items and data_1/data_2 are the newer names of text_1/text_2).
 */
export const SCORE_FIELD_PAIRS = [["queries", "documents"], ["queries", "items"], ["data_1", "data_2"], ["text_1", "text_2"]] as const;

/** The pair of fields `body` gives its texts in: the first it has both of, else the first it has one of (text_1/text_2 when none). */
function scoreFields(body: Json): readonly [string, string] {
  const given = (pair: readonly string[], n: number) => pair.filter((f) => body[f] != null).length >= n;
  return SCORE_FIELD_PAIRS.find((p) => given(p, 2)) ?? SCORE_FIELD_PAIRS.find((p) => given(p, 1)) ?? SCORE_FIELD_PAIRS[3];
}

/** vLLM's ScoreRequest: text_1 and text_2 (or their newer names), each a string or a list of strings; one score per second text. */
export async function handleScore(ctx: ServingContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  checkScoringModel(ctx, "Score");
  const body = asJsonBody(request.body);
  const model = resolveModel(ctx, optString(body, "model"));
  const id = randomId("score");
  const [first, second] = scoreFields(body);
  const fields = { first, second, operation: "score" };
  const { pairs, promptTokens } = await scoreTexts(ctx, request, reply, body, id, texts(body, first), texts(body, second), fields);
  return {
    id,
    object: "list",
    created: nowSeconds(),
    model,
    data: pairs.map((p, index) => ({ index, object: "score", score: p.score })),
    usage: { prompt_tokens: promptTokens, total_tokens: promptTokens, completion_tokens: 0, prompt_tokens_details: null },
  };
}

/**
 * vLLM's RerankRequest (Jina's and Cohere's API): the query scored against each document, results by score,
 * best first, the top_n of them (0 or less: all). return_documents false leaves each result's document out
 * (Jina's meaning; vLLM itself always returns it).
 */
export async function handleRerank(ctx: ServingContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  checkScoringModel(ctx, "Rerank (Score)");
  const body = asJsonBody(request.body);
  const model = resolveModel(ctx, optString(body, "model"));
  const query = texts(body, "query", { single: true });
  const documents = texts(body, "documents");
  const topN = optInt(body, "top_n") ?? 0;
  const returnDocuments = optBool(body, "return_documents") ?? true;
  const id = randomId("rerank");
  const fields = { first: "query", second: "documents", operation: "embedding generation" };
  const { pairs, promptTokens } = await scoreTexts(ctx, request, reply, body, id, query, documents, fields);
  const ranked = pairs.sort((a, b) => b.score - a.score).slice(0, topN > 0 ? topN : pairs.length);
  return {
    id,
    model,
    usage: { prompt_tokens: promptTokens, total_tokens: promptTokens },
    results: ranked.map((p) => ({
      index: p.second,
      ...(returnDocuments ? { document: { text: documents[p.second]! } } : {}),
      relevance_score: p.score,
    })),
  };
}
