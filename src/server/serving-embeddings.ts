// POST /v1/embeddings (OpenAI's Embeddings API, as vLLM serves it with --runner pooling): every input's prompt is
// read by the pooling engine and answered with its pooled vector, as floats or as base64 of little-endian float32.
// poolingTokenIds and poolTokenIds are the pooling requests' machinery, shared with /score and /rerank.
import { setMaxListeners } from "node:events";
import type { FastifyReply, FastifyRequest } from "fastify";
import { bf16BytesToF32, f16BytesToF32, f32ToBf16, f32ToF16 } from "../models/formats/dtype-convert.js";
import { asJsonBody, parseMessages, parsePrompts, requestChatTemplate, type PromptInput } from "./protocol.js";
import { badRequest } from "./errors.js";
import { optBool, optInt, optObject, optString } from "./fields.js";
import { mergeStreams, primeStream, streamEngineRequest } from "./engine-stream.js";
import type { PoolingOverrides } from "../engine/types.js";
import { abortOnDisconnect, checkQueue, cutTokens, encodeTruncated, nowSeconds, randomId, resolveModel, type ServingContext } from "./serving-context.js";

/** vLLM's embed_dtype: the precision of the returned values (floats rounded to it, or its little-endian bytes). */
const EMBED_DTYPES: Record<string, { floats(v: Float32Array): number[]; bytes(v: Float32Array): Uint8Array }> = {
  float32: { floats: (v) => Array.from(v), bytes: (v) => new Uint8Array(v.buffer, v.byteOffset, v.byteLength) },
  float16: { floats: (v) => Array.from(halfBack(f32ToF16(v), "f16")), bytes: (v) => new Uint8Array(f32ToF16(v).buffer) },
  bfloat16: { floats: (v) => Array.from(halfBack(f32ToBf16(v), "bf16")), bytes: (v) => new Uint8Array(f32ToBf16(v).buffer) },
};

function halfBack(h: Uint16Array, kind: "f16" | "bf16"): Float32Array {
  const bytes = new Uint8Array(h.buffer, h.byteOffset, h.byteLength);
  return kind === "f16" ? f16BytesToF32(bytes) : bf16BytesToF32(bytes);
}

/**
 * How a pooling response writes each vector (vLLM's encoding_format, embed_dtype and endianness, shared by
 * /v1/embeddings and /pooling): floats rounded to the dtype, or base64 of its little-endian bytes.
 */
export function vectorEncoder(body: Record<string, unknown>): (v: Float32Array) => number[] | string {
  const format = optString(body, "encoding_format") ?? "float";
  if (format !== "float" && format !== "base64") throw badRequest(`'encoding_format' must be "float" or "base64", got ${JSON.stringify(format)}`, "encoding_format");
  const dtype = optString(body, "embed_dtype") ?? "float32";
  if (!Object.hasOwn(EMBED_DTYPES, dtype)) throw badRequest(`'embed_dtype' must be one of ${Object.keys(EMBED_DTYPES).join(", ")}, got ${JSON.stringify(dtype)}`, "embed_dtype");
  const endianness = optString(body, "endianness") ?? "native";
  if (endianness !== "native" && endianness !== "little") throw badRequest(`'endianness' must be "native" or "little" (this server is little-endian), got ${JSON.stringify(endianness)}`, "endianness");
  const codec = EMBED_DTYPES[dtype]!;
  return format === "float" ? (v) => codec.floats(v) : (v) => Buffer.from(codec.bytes(v)).toString("base64");
}

/** The text a messages-style embedding request embeds (the chat template, without a generation prompt by default). */
function renderChat(ctx: ServingContext, body: Record<string, unknown>): string {
  const messages = parseMessages(body);
  const template = requestChatTemplate(body, ctx.trustRequestChatTemplate) ?? ctx.chatTemplate;
  const kwargs = optObject(body, "chat_template_kwargs");
  try {
    return ctx.tokenizer.applyChatTemplate(messages, {
      addGenerationPrompt: optBool(body, "add_generation_prompt") ?? false,
      continueFinalMessage: optBool(body, "continue_final_message") ?? false,
      ...(template !== undefined ? { chatTemplate: template } : {}),
      ...(kwargs !== undefined ? { chatTemplateKwargs: kwargs } : {}),
    });
  } catch (err) {
    throw badRequest(`Failed to apply the chat template: ${(err as Error).message}`, "messages");
  }
}

/**
 * A pooling request's prompts: its `input`, or vLLM's chat form (`messages` without `input`) rendered with the chat
 * template; `chat` says which (a rendered chat holds its special tokens already).
 */
export function poolingPrompts(ctx: ServingContext, body: Record<string, unknown>): { prompts: PromptInput[]; chat: boolean } {
  const chat = body.messages !== undefined && body.input === undefined;
  return { prompts: chat ? [{ text: renderChat(ctx, body) }] : parsePrompts(body, ctx.tokenizer.vocabSize, "input"), chat };
}

/** The API a pooling server does not serve, as vLLM words its refusal. */
export function refuseOnPoolingRunner(ctx: ServingContext, api: string): void {
  if (ctx.poolingTask !== null) throw badRequest(`The model does not support ${api} API`);
}

/** A pooling request's truncation_side (vLLM's): which end truncate_prompt_tokens cuts, "left" (the default) or "right". */
export function optTruncationSide(body: Record<string, unknown>): "left" | "right" {
  const side = optString(body, "truncation_side") ?? "left";
  if (side !== "left" && side !== "right") throw badRequest(`'truncation_side' must be "left" or "right", got ${JSON.stringify(side)}`, "truncation_side");
  return side;
}

/**
 * Each prompt's token ids for a pooling request: cut to truncate_prompt_tokens (-1: max_model_len; its last tokens, or
 * with `side` "right" its first; a text's added special tokens stay, as HF's truncation keeps them), then checked non-empty and within max_model_len (a 400 naming `field`; `operation`
 * words it as vLLM does).
 */
export function poolingTokenIds(
  ctx: ServingContext,
  prompts: PromptInput[],
  options: { truncate: number | undefined; side: "left" | "right"; addSpecialTokens: boolean; field: string; operation: string },
): number[][] {
  const { truncate, side, addSpecialTokens, field, operation } = options;
  if (truncate !== undefined && truncate > ctx.maxModelLen)
    throw badRequest(`truncate_prompt_tokens value (${truncate}) is greater than max_model_len (${ctx.maxModelLen}). Please, select a smaller truncation size.`, "truncate_prompt_tokens");
  const keep = truncate === -1 ? ctx.maxModelLen : truncate;
  return prompts.map((p) => {
    const ids = "text" in p
      ? encodeTruncated(ctx.tokenizer, p.text, addSpecialTokens, keep, side)
      : keep === undefined ? p.tokenIds : cutTokens(p.tokenIds, keep, side);
    if (ids.length === 0) throw badRequest(`'${field}' must not be empty`, field);
    if (ids.length > ctx.maxModelLen)
      throw badRequest(
        `This model's maximum context length is ${ctx.maxModelLen} tokens. However, you requested ${ids.length} tokens in the input for ${operation}. Please reduce the length of the input.`,
        field,
      );
    return ids;
  });
}

/**
 * Pools every prompt (one engine request each, ids `${id}-${i}`) and returns the vectors in input order. Every prompt
 * counts against --max-waiting-requests; a client that goes away aborts them all with one engine call.
 */
export async function poolTokenIds(
  ctx: ServingContext, request: FastifyRequest, reply: FastifyReply, id: string, prompts: number[][], priority: number,
  pooling: PoolingOverrides | null = null,
): Promise<Float32Array[]> {
  checkQueue(ctx, prompts.length);
  const requestIds = prompts.map((_, i) => `${id}-${i}`);
  const controller = new AbortController();
  setMaxListeners(prompts.length + 1, controller.signal); // each prompt's stream listens, and so do we: not a leak
  // Listens before each stream's own listener, which then finds its request gone: one abort (one worker message), not
  // one per prompt, which would let the worker run engine steps between them.
  controller.signal.addEventListener("abort", () => ctx.engine.abort(requestIds), { once: true });
  abortOnDisconnect(request, reply, controller);
  const streams = prompts.map((promptTokenIds, i) =>
    streamEngineRequest(ctx.engine, ctx.metrics, ctx.inflight, ctx.unstarted, { requestId: requestIds[i]!, promptTokenIds, params: { maxTokens: 1, pooling }, priority }, controller.signal, ctx.requestLog),
  );
  const vectors: (Float32Array | null)[] = prompts.map(() => null);
  try {
    for await (const [i, out] of await primeStream(mergeStreams(streams))) if (out.pooled != null) vectors[i] = out.pooled;
  } finally {
    controller.abort();
  }
  return vectors.map((v, i) => {
    if (v === null) throw new Error(`[pooling] prompt ${i} finished without a pooled vector`);
    return v;
  });
}

/**
 * A pooling request's PoolingParams (vLLM's): on a classifier, use_activation (older names: activation, softmax)
 * false takes the head's raw logits; on an embedding model, normalize (newer name: use_activation) false takes the
 * pooled state without L2 normalization. null: the server's --pooler-config for every field.
 */
export function poolingOverrides(ctx: ServingContext, body: Record<string, unknown>): PoolingOverrides | null {
  const first = (fields: string[]): boolean | undefined => {
    for (const f of fields) {
      const v = optBool(body, f);
      if (v !== undefined) return v;
    }
    return undefined;
  };
  if (ctx.poolingTask === "classify") {
    if (body.normalize != null) throw badRequest("'normalize' applies to embedding models; a classifier takes use_activation", "normalize");
    const activation = first(["use_activation", "activation", "softmax"]);
    return activation === undefined ? null : { activation };
  }
  const normalize = first(["normalize", "use_activation"]);
  return normalize === undefined ? null : { normalize };
}

/**
 * Pools the `input` prompts of a pooling request (its truncate_prompt_tokens, add_special_tokens and priority fields
 * read here): the response id, each prompt's pooled vector in input order, and the prompt tokens read.
 */
export async function poolInputs(
  ctx: ServingContext, request: FastifyRequest, reply: FastifyReply, body: Record<string, unknown>, prompts: PromptInput[],
  o: { addSpecialTokens: boolean; operation: string; idPrefix: string },
): Promise<{ id: string; vectors: Float32Array[]; promptTokens: number }> {
  const truncate = optInt(body, "truncate_prompt_tokens", { min: -1 });
  const addSpecialTokens = optBool(body, "add_special_tokens") ?? o.addSpecialTokens;
  const priority = optInt(body, "priority") ?? 0;
  const ids = poolingTokenIds(ctx, prompts, { truncate, side: optTruncationSide(body), addSpecialTokens, field: "input", operation: o.operation });
  const id = randomId(o.idPrefix);
  const vectors = await poolTokenIds(ctx, request, reply, id, ids, priority, poolingOverrides(ctx, body));
  return { id, vectors, promptTokens: ids.reduce((n, t) => n + t.length, 0) };
}

export async function handleEmbeddings(ctx: ServingContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  if (ctx.poolingTask !== "embed") throw badRequest("The model does not support Embeddings API");
  const body = asJsonBody(request.body);
  const model = resolveModel(ctx, optString(body, "model"));
  const { prompts, chat } = poolingPrompts(ctx, body); // (vLLM's EmbeddingChatRequest takes messages)
  const encode = vectorEncoder(body);
  const dimensions = optInt(body, "dimensions", { min: 1 });
  if (dimensions !== undefined)
    throw badRequest(`Model "${model}" does not support matryoshka representation, changing output dimensions will lead to poor results.`, "dimensions");
  const { id, vectors, promptTokens } = await poolInputs(ctx, request, reply, body, prompts, { addSpecialTokens: !chat, operation: "embedding generation", idPrefix: "embd" });
  return {
    id,
    object: "list",
    created: nowSeconds(),
    model,
    data: vectors.map((v, index) => ({ object: "embedding", index, embedding: encode(v) })),
    usage: { prompt_tokens: promptTokens, total_tokens: promptTokens, completion_tokens: 0, prompt_tokens_details: null },
  };
}
