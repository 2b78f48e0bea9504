// POST /pooling (vLLM's Pooling API) on a pooling server: each input (or the chat form's messages) pooled as the
// served task does it, returned raw as vLLM's PoolingResponse: `data[i].data` is the embedding of an embedding model
// or the class probabilities of a classifier. `task` may name the served task; the per-token tasks (token_embed,
// token_classify) and plugins are not served.
import type { FastifyReply, FastifyRequest } from "fastify";
import { badRequest } from "./errors.js";
import { optString } from "./fields.js";
import { asJsonBody } from "./protocol.js";
import { nowSeconds, resolveModel, type ServingContext } from "./serving-context.js";
import { poolingPrompts, poolInputs, vectorEncoder } from "./serving-embeddings.js";

const KNOWN_TASKS = ["embed", "classify", "score", "token_embed", "token_classify", "plugin"];

export async function handlePooling(ctx: ServingContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  if (ctx.poolingTask === null) throw badRequest("The model does not support Pooling API");
  const body = asJsonBody(request.body);
  const model = resolveModel(ctx, optString(body, "model"));
  const task = optString(body, "task") ?? ctx.poolingTask;
  if (!KNOWN_TASKS.includes(task)) throw badRequest(`'task' must be one of ${KNOWN_TASKS.join(", ")}, got ${JSON.stringify(task)}`, "task");
  if (task !== ctx.poolingTask)
    throw badRequest(`Task ${task} is not supported by this server: it pools for ${ctx.poolingTask} (per-token tasks and plugins are not served)`, "task");
  const encode = vectorEncoder(body);
  if (body.dimensions !== undefined && body.dimensions !== null) throw badRequest("'dimensions' per request is not supported: the server's --pooler-config sets pooling", "dimensions");
  const { prompts, chat } = poolingPrompts(ctx, body);
  const { id, vectors, promptTokens } = await poolInputs(ctx, request, reply, body, prompts, { addSpecialTokens: !chat, operation: "pooling", idPrefix: "pool" });
  return {
    id,
    object: "list",
    created: nowSeconds(),
    model,
    // (encoded as /v1/embeddings encodes its vectors: embed_dtype, base64 of little-endian bytes)
    data: vectors.map((v, index) => ({ index, object: "pooling", data: encode(v) })),
    usage: { prompt_tokens: promptTokens, total_tokens: promptTokens, completion_tokens: 0, prompt_tokens_details: null },
  };
}
