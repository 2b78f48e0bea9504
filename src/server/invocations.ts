// POST /invocations (vLLM's SageMaker entry point): the JSON body goes to the endpoint whose request it is, judged by
// its shape in vLLM's order (chat, completions, embeddings, classify, score, rerank, pooling) among the endpoints the
// served model answers; a body that is none of them is a 400 naming the request types it could have been.
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { badRequest } from "./errors.js";
import type { ServingContext } from "./serving-context.js";
import { SCORE_FIELD_PAIRS, servesScoring } from "./serving-score.js";

/** A route's handler, as server.ts registers it (the model checks included). */
export type Endpoint = (request: FastifyRequest, reply: FastifyReply) => Promise<unknown>;

export type InvocationEndpoint = "chat" | "completion" | "embedding" | "classify" | "score" | "rerank" | "pooling";

interface InvocationType {
  /** vLLM's request type, named in the 400 when no type fits. */
  name: string;
  endpoint: InvocationEndpoint;
  /** The body is this request when it has every field of one of these sets (the fields the type requires). */
  needs: readonly (readonly string[])[];
  /** Whether the served model answers it (vLLM lists a type only for a model with its task). */
  serves(ctx: ServingContext): boolean;
}

const generates = (ctx: ServingContext): boolean => ctx.poolingTask === null;

/** vLLM's INVOCATION_TYPES, in its order: the first that fits wins (a body with messages and prompt is a chat). */
const INVOCATION_TYPES: readonly InvocationType[] = [
  { name: "ChatCompletionRequest", endpoint: "chat", needs: [["messages"]], serves: generates },
  { name: "CompletionRequest", endpoint: "completion", needs: [["prompt"]], serves: generates },
  { name: "EmbeddingRequest", endpoint: "embedding", needs: [["input"], ["messages"]], serves: (ctx) => ctx.poolingTask === "embed" },
  { name: "ClassificationRequest", endpoint: "classify", needs: [["input"], ["messages"]], serves: (ctx) => ctx.poolingTask === "classify" },
  { name: "ScoreRequest", endpoint: "score", needs: SCORE_FIELD_PAIRS, serves: servesScoring },
  { name: "RerankRequest", endpoint: "rerank", needs: [["query", "documents"]], serves: servesScoring },
  { name: "PoolingRequest", endpoint: "pooling", needs: [["input"], ["messages"]], serves: (ctx) => ctx.poolingTask !== null },
];

/** The request type `body` is, among those the model answers; null when it fits none (or is not a JSON object). */
export function invocationType(ctx: ServingContext, body: unknown): InvocationType | null {
  if (typeof body !== "object" || body === null || Array.isArray(body)) return null;
  const has = (field: string): boolean => (body as Record<string, unknown>)[field] != null;
  return INVOCATION_TYPES.find((t) => t.serves(ctx) && t.needs.some((fields) => fields.every(has))) ?? null;
}

/** Registers POST /invocations over the endpoints' own handlers (so streaming, errors and load tracking are theirs). */
export function registerInvocationsRoute(
  app: FastifyInstance, bound: () => ServingContext, endpoints: Readonly<Record<InvocationEndpoint, Endpoint>>,
): void {
  app.post("/invocations", async (request: FastifyRequest, reply: FastifyReply) => {
    const ctx = bound();
    const type = invocationType(ctx, request.body);
    if (type === null) {
      const expected = INVOCATION_TYPES.filter((t) => t.serves(ctx)).map((t) => `'${t.name}'`);
      throw badRequest(`Cannot find suitable handler for request. Expected one of: [${expected.join(", ")}]`);
    }
    return endpoints[type.endpoint](request, reply);
  });
}
