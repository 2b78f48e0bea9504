// POST /v1/embeddings (OpenAI's Embeddings API, as vLLM serves it with --runner pooling): every input's prompt is
// read by the pooling engine and answered with its pooled vector, as floats or as base64 of little-endian float32.
import type { FastifyReply, FastifyRequest } from "fastify";
import { asJsonBody, parsePrompts } from "./protocol.js";
import { badRequest } from "./errors.js";
import { optBool, optInt, optString } from "./fields.js";
import { mergeStreams, primeStream, streamEngineRequest } from "./engine-stream.js";
import { abortOnDisconnect, checkQueue, nowSeconds, randomId, resolveModel, type ServingContext } from "./serving-context.js";

/** The API a pooling server does not serve, as vLLM words its refusal. */
export function refuseOnPoolingRunner(ctx: ServingContext, api: string): void {
  if (ctx.runner === "pooling") throw badRequest(`The model does not support ${api} API`);
}

export async function handleEmbeddings(ctx: ServingContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  if (ctx.runner !== "pooling") throw badRequest("The model does not support Embeddings API");
  const body = asJsonBody(request.body);
  const model = resolveModel(ctx, optString(body, "model"));
  const prompts = parsePrompts(body, ctx.tokenizer.vocabSize, "input");
  const format = optString(body, "encoding_format") ?? "float";
  if (format !== "float" && format !== "base64") throw badRequest(`'encoding_format' must be "float" or "base64", got ${JSON.stringify(format)}`, "encoding_format");
  const dimensions = optInt(body, "dimensions", { min: 1 });
  if (dimensions !== undefined)
    throw badRequest("Model does not support matryoshka representation, changing output dimensions will lead to poor results.", "dimensions");
  const truncate = optInt(body, "truncate_prompt_tokens", { min: 1 });
  const addSpecialTokens = optBool(body, "add_special_tokens") ?? true;
  const tokenized = prompts.map((p) => ("text" in p ? ctx.tokenizer.encode(p.text, { addSpecialTokens }) : p.tokenIds));
  const ids = tokenized.map((t) => (truncate !== undefined && t.length > truncate ? t.slice(t.length - truncate) : t));
  ids.forEach((t) => {
    if (t.length === 0) throw badRequest("'input' must not be empty", "input");
    if (t.length > ctx.maxModelLen)
      throw badRequest(
        `This model's maximum context length is ${ctx.maxModelLen} tokens. However, you requested ${t.length} tokens in the input for embedding generation. Please reduce the length of the input.`,
        "input",
      );
  });
  checkQueue(ctx);

  const id = randomId("embd");
  const controller = new AbortController();
  abortOnDisconnect(request, reply, controller);
  const streams = ids.map((promptTokenIds, i) =>
    streamEngineRequest(ctx.engine, ctx.metrics, ctx.inflight, ctx.unstarted, { requestId: `${id}-${i}`, promptTokenIds, params: { maxTokens: 1 }, priority: 0 }, controller.signal),
  );
  const vectors: (Float32Array | null)[] = ids.map(() => null);
  try {
    for await (const [i, out] of await primeStream(mergeStreams(streams))) if (out.pooled != null) vectors[i] = out.pooled;
  } finally {
    controller.abort();
  }
  const promptTokens = ids.reduce((n, t) => n + t.length, 0);
  return {
    id,
    object: "list",
    created: nowSeconds(),
    model,
    data: vectors.map((v, index) => {
      if (v === null) throw new Error(`[embeddings] input ${index} finished without a pooled vector`);
      const embedding = format === "float" ? Array.from(v) : Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString("base64");
      return { object: "embedding", index, embedding };
    }),
    usage: { prompt_tokens: promptTokens, total_tokens: promptTokens, completion_tokens: 0, prompt_tokens_details: null },
  };
}
