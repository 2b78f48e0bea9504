// use_beam_search on /v1/completions and /v1/chat/completions (vLLM's OpenAIServing.beam_search): the n best beams
// of each prompt (engine/beam-search.ts), answered whole (no streaming, no logprobs) with finish_reason "stop" for a
// beam that ended on EOS and "length" for one cut at max_tokens.
import { beamSearch, type BeamSearchResult } from "../engine/beam-search.js";
import type { LoraRequest } from "../engine/lora-manager.js";
import type { SamplingParams } from "../engine/types.js";
import { ApiError, badRequest } from "./errors.js";
import { randomId, type ServingContext } from "./serving-context.js";

/**
 * Each prompt's beams, best first (n per prompt), and the usage they add up to. `signal` (the client's disconnect)
 * stops every search before its next round; one prompt's search failing stops the others too.
 */
export async function runBeamSearch(
  ctx: ServingContext,
  prompts: number[][],
  params: Partial<SamplingParams>[],
  lengthPenalty: number,
  lora: LoraRequest | null,
  signal: AbortSignal,
): Promise<{ beams: (BeamSearchResult & { text: string })[][]; usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number } }> {
  if (params.some((p) => p.structuredOutputs !== undefined)) throw badRequest("use_beam_search cannot be combined with structured output or tool_choice", "use_beam_search");
  const id = randomId("beam");
  const stop = new AbortController();
  // (a 4xx: nobody reads it, and it is not the server's failure)
  const onDisconnect = () => stop.abort(new ApiError(499, "the client disconnected during beam search"));
  if (signal.aborted) onDisconnect();
  signal.addEventListener("abort", onDisconnect, { once: true });
  try {
    const beams = await Promise.all(
      prompts.map(async (prompt, i) => {
        const p = params[i]!;
        try {
          const found = await beamSearch(
            ctx.engine, prompt,
            { beamWidth: p.n ?? 1, maxTokens: p.maxTokens ?? 16, ignoreEos: p.ignoreEos ?? false, temperature: p.temperature ?? 0, lengthPenalty },
            ctx.tokenizer.eosTokenIds, `${id}-${i}`, lora, stop.signal,
          );
          return found.map((b) => ({ ...b, text: ctx.tokenizer.decode(b.tokenIds, { skipSpecialTokens: p.skipSpecialTokens ?? true }) }));
        } catch (e) {
          stop.abort(e);
          throw e;
        }
      }),
    );
    const promptTokens = prompts.reduce((n, p) => n + p.length, 0);
    const completionTokens = beams.flat().reduce((n, b) => n + b.tokenIds.length, 0);
    return { beams, usage: { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens } };
  } finally {
    signal.removeEventListener("abort", onDisconnect);
  }
}

export const beamFinishReason = (b: BeamSearchResult): "stop" | "length" => (b.endedOnEos ? "stop" : "length");
