// Beam search as vLLM v1 runs it (LLM.beam_search, the OpenAI server's use_beam_search): outside the engine, one
// round per token. Each round asks the engine for one token of every live beam with its 2 * beam_width most likely
// tokens' logprobs, extends every beam by each of them, moves those ending in EOS to the completed list (unless
// ignore_eos), and keeps the beam_width best of the rest. At the end the completed beams and the live ones are
// ranked together and the beam_width best are returned. The prefix cache makes each round's prompts cheap.
// Score (vLLM's get_beam_search_score): cumulative logprob / (length ** length_penalty), the length counting the
// prompt and not a final EOS.
import type { LoraRequest } from "./lora-manager.js";
import type { EngineClient, SamplingParams, TokenLogprobs } from "./types.js";

/** vLLM's BeamSearchParams. */
export interface BeamSearchParams {
  beamWidth: number;
  maxTokens: number;
  ignoreEos?: boolean;
  /** Of the logprobs that rank candidates: 0 (default) reads the model's own. */
  temperature?: number;
  lengthPenalty?: number;
}

/** One beam: its tokens (prompt included), and the sum of its generated tokens' logprobs. */
export interface Beam {
  tokens: number[];
  cumLogprob: number;
}

/** A finished beam search's beams, best first: generated tokens (prompt excluded) and scores. */
export interface BeamSearchResult {
  tokenIds: number[];
  cumulativeLogprob: number;
  /** Whether it ended on EOS (finish_reason "stop") rather than max_tokens ("length"). */
  endedOnEos: boolean;
}

/** Throws RangeError for parameters beam search cannot run with. */
export function checkBeamSearchParams(p: BeamSearchParams): void {
  if (!Number.isInteger(p.beamWidth) || p.beamWidth < 1) throw new RangeError(`beam width must be an integer >= 1, got ${p.beamWidth}`);
  if (!Number.isInteger(p.maxTokens) || p.maxTokens < 1) throw new RangeError(`max_tokens must be an integer >= 1, got ${p.maxTokens}`);
  if (p.lengthPenalty !== undefined && !Number.isFinite(p.lengthPenalty)) throw new RangeError(`length_penalty must be a finite number, got ${p.lengthPenalty}`);
}

/** One prompt's search: its live beams and the completed ones. */
export class BeamSearchInstance {
  beams: Beam[];
  readonly completed: Beam[] = [];

  constructor(
    readonly prompt: readonly number[],
    private readonly p: BeamSearchParams,
    private readonly eosTokenIds: readonly number[],
  ) {
    this.beams = [{ tokens: [...prompt], cumLogprob: 0 }];
  }

  /** The sampling params of a round's one-token request per beam. */
  get roundParams(): Partial<SamplingParams> {
    return { maxTokens: 1, logprobs: 2 * this.p.beamWidth, temperature: this.p.temperature ?? 0, ignoreEos: true };
  }

  /** Extends the live beams by the round's candidates (`candidates[i]`: beam i's next-token logprobs). */
  advance(candidates: readonly (TokenLogprobs | null)[]): void {
    const next: Beam[] = [];
    this.beams.forEach((beam, i) => {
      for (const [token, lp] of candidates[i] ?? []) {
        const b = { tokens: [...beam.tokens, token], cumLogprob: beam.cumLogprob + lp.logprob };
        if (this.isEos(token) && this.p.ignoreEos !== true) this.completed.push(b);
        else next.push(b);
      }
    });
    this.beams = this.rank(next).slice(0, this.p.beamWidth);
  }

  /** The beam_width best of the completed and the live beams. */
  finish(): BeamSearchResult[] {
    return this.rank([...this.completed, ...this.beams])
      .slice(0, this.p.beamWidth)
      .map((b) => ({
        tokenIds: b.tokens.slice(this.prompt.length),
        cumulativeLogprob: b.cumLogprob,
        endedOnEos: this.isEos(b.tokens[b.tokens.length - 1]!) && this.p.ignoreEos !== true && b.tokens.length > this.prompt.length,
      }));
  }

  score(b: Beam): number {
    const len = b.tokens.length - (this.isEos(b.tokens[b.tokens.length - 1]!) ? 1 : 0);
    return b.cumLogprob / len ** (this.p.lengthPenalty ?? 1);
  }

  private isEos(token: number): boolean {
    return this.eosTokenIds.includes(token);
  }

  /** Best score first; ties keep their order (a stable sort, as Python's sorted). */
  private rank(beams: Beam[]): Beam[] {
    return beams.map((b) => ({ b, s: this.score(b) })).sort((x, y) => y.s - x.s).map((x) => x.b);
  }
}

/**
 * Beam search over a streaming engine (the server's use_beam_search): rounds of one-token requests, one per live
 * beam, run concurrently. An aborted `signal` stops it before its next round (rejecting with the signal's reason).
 */
export async function beamSearch(
  engine: EngineClient,
  prompt: readonly number[],
  p: BeamSearchParams,
  eosTokenIds: readonly number[],
  requestId: string,
  loraRequest: LoraRequest | null = null,
  signal?: AbortSignal,
): Promise<BeamSearchResult[]> {
  checkBeamSearchParams(p);
  const s = new BeamSearchInstance(prompt, p, eosTokenIds);
  for (let t = 0; t < p.maxTokens && s.beams.length > 0; t++) {
    signal?.throwIfAborted();
    const candidates = await Promise.all(
      s.beams.map(async (beam, i) => {
        let lps: TokenLogprobs | null = null;
        for await (const out of engine.generate({ promptTokenIds: beam.tokens }, s.roundParams, { requestId: `${requestId}-${t}-${i}`, loraRequest }))
          lps = out.outputs[0]?.logprobs?.[0] ?? lps;
        return lps;
      }),
    );
    s.advance(candidates);
  }
  return s.finish();
}
