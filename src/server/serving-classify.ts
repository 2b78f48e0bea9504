// POST /classify and /v1/classify (vLLM's Classification API) for a sequence classifier (*ForSequenceClassification)
// served by the pooling runner: each input is read once, its last token's state goes through the model's
// classification head, and the reply carries the class probabilities, the best label and the number of classes.
import type { FastifyReply, FastifyRequest } from "fastify";
import { badRequest } from "./errors.js";
import { optString } from "./fields.js";
import { asJsonBody } from "./protocol.js";
import { nowSeconds, resolveModel, type ServingContext } from "./serving-context.js";
import { poolingPrompts, poolInputs } from "./serving-embeddings.js";

export async function handleClassify(ctx: ServingContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  const labels = ctx.classLabels;
  if (ctx.poolingTask !== "classify" || labels === null) throw badRequest("The model does not support Classification API");
  const body = asJsonBody(request.body);
  const model = resolveModel(ctx, optString(body, "model"));
  const { prompts, chat } = poolingPrompts(ctx, body); // (vLLM's ClassificationChatRequest takes messages)
  const { id, vectors: scores, promptTokens } = await poolInputs(ctx, request, reply, body, prompts, { addSpecialTokens: !chat, operation: "classification", idPrefix: "classify" });
  return {
    id,
    object: "list",
    created: nowSeconds(),
    model,
    data: scores.map((probs, index) => {
      let best = 0;
      for (let i = 1; i < probs.length; i++) if (probs[i]! > probs[best]!) best = i;
      return { index, label: labels[best] ?? null, probs: Array.from(probs), num_classes: probs.length };
    }),
    usage: { prompt_tokens: promptTokens, total_tokens: promptTokens, completion_tokens: 0, prompt_tokens_details: null },
  };
}
