// Speculative decoding with n-gram drafts (vLLM's `--speculative-config '{"method": "ngram", ...}'`, prompt lookup
// decoding): a request whose last tokens repeat an earlier n-gram of its prompt or output is given the tokens
// that followed that n-gram as drafts. One step then computes the last sampled token and the drafts together,
// with logits at each of their positions, and keeps the drafts up to the first one the model would not have
// produced, plus the model's own token after them: up to 1 + k tokens for one pass over the weights.
//
// Verification samples every row as usual and accepts a draft while the sampled token equals it. For a greedy
// request that is the argmax check; for a random one it is exactly rejection sampling with a one-hot draft
// distribution q = δ(d) (which is what n-gram drafts are): vLLM accepts d with probability min(1, p(d)/q(d)) = p(d)
// and otherwise draws from max(0, p - q) renormalized, which is p without d; drawing x ~ p and accepting iff x = d
// gives P(d) = p(d) and P(y) = p(y) for y != d, the same distribution. So outputs follow the model's own
// distribution, and greedy outputs are token for token those without speculation.
//
// A request whose drafts were all rejected decodes 1, 2, 4, ... (at most 16) steps without drafts before it
// drafts again, while its rejections continue: a wasted verify step costs more than a decode (not vLLM's rule).
//
// Row j is sampled as if drafts 0..j-1 were already output, so what reads the output (penalties, min_tokens, bad
// words, logits processor functions) sees what it would see without speculation; each kept token carries its own
// row's logprobs. Under structured output, a request drafts only what its grammar allows (the proposal is cut at the
// first token it refuses, as vLLM's validate_tokens), and row j is masked by the grammar's state after drafts
// 0..j-1 (the matcher runs ahead through them and rolls back). Under engine-level logits processors no request
// drafts.

import { camelCaseHint } from "../util/names.js";
import type { HiddenStatesRequest } from "./model-runner.js";

/** vLLM's SpeculativeConfig (camelCase): the n-gram method, a draft model (draft-model.ts) or an EAGLE head (eagle.ts). */
export type SpeculativeConfig = NgramSpeculativeConfig | DraftModelSpeculativeConfig | EagleSpeculativeConfig;

export interface NgramSpeculativeConfig {
  method: "ngram";
  /** Drafts per step (k). */
  numSpeculativeTokens: number;
  /** Longest n-gram matched (vLLM prompt_lookup_max). */
  promptLookupMax: number;
  /** Shortest n-gram matched (vLLM prompt_lookup_min). */
  promptLookupMin: number;
}

/**
 * vLLM's "draft_model" method: a smaller model of the same vocabulary drafts k tokens greedily each step (vLLM infers
 * the method when `model` is given without one).
 */
export interface DraftModelSpeculativeConfig {
  method: "draft_model";
  /** The draft model: a directory or GGUF file (as the served model is named). */
  model: string;
  numSpeculativeTokens: number;
}

/**
 * vLLM's "eagle" and "eagle3" methods: an EAGLE head (eagle-head.ts) that reads the served model's hidden states drafts
 * k tokens greedily each step.
 */
export interface EagleSpeculativeConfig {
  method: "eagle" | "eagle3";
  /** The head's directory (config.json and safetensors). */
  model: string;
  numSpeculativeTokens: number;
}

/** The methods whose drafts come from a model (a Drafter). */
export const isModelDraftMethod = (m: SpeculativeConfig["method"]): m is "draft_model" | "eagle" | "eagle3" => m !== "ngram";

/** One request to draft for: its tokens (prompt and output) and how many drafts it takes (0: none, just keep up). */
export interface DraftRequest {
  requestId: string;
  tokens: readonly number[];
  k: number;
}

/** What proposes drafts with a model of its own (DraftModelProposer, EagleProposer); EngineCore calls it each step. */
export interface Drafter {
  /** Up to `k` drafts per request (by request id); `running`: every request still running (the others are forgotten). */
  propose(requests: readonly DraftRequest[], running: ReadonlySet<string>): Map<string, number[]>;
  /** The served model's hidden states it reads (ScheduledBatch.hiddenStates), absent for none. */
  readonly hiddenStates?: HiddenStatesRequest;
  /**
   * With hiddenStates, after each step: the hidden rows [n, width] of one request's positions start .. start+n-1
   * (those the step computed and kept). Every running request is then passed to propose(), with k = 0 when it drafts
   * nothing, so that the drafter keeps up.
   */
  observe?(requestId: string, start: number, rows: Float32Array, n: number): void;
  releaseKvCache(): void;
  restoreKvCache(): void;
  dispose(): void;
}

/** The keys a speculative config may hold, per method (camelCase). */
const MODEL_KEYS = ["method", "model", "numSpeculativeTokens"] as const;
const KEYS = { ngram: ["method", "numSpeculativeTokens", "promptLookupMax", "promptLookupMin"], draft_model: MODEL_KEYS, eagle: MODEL_KEYS, eagle3: MODEL_KEYS } as const;

/**
 * Checks and completes a speculative config (prompt_lookup_min defaults to 1, prompt_lookup_max to 5 here; a `model`
 * without a method is a draft model, as vLLM infers it).
 */
export function resolveSpeculativeConfig(c: Partial<NgramSpeculativeConfig> | Partial<DraftModelSpeculativeConfig> | Partial<EagleSpeculativeConfig>): SpeculativeConfig {
  const fail = (m: string): never => {
    throw new Error(`[engine] speculativeConfig: ${m}`);
  };
  if (typeof c !== "object" || c === null) fail("must be an object");
  const given = c as Record<string, unknown>;
  const method = given.method ?? (given.model !== undefined ? "draft_model" : undefined);
  if (typeof method !== "string" || !Object.hasOwn(KEYS, method))
    fail(`method ${JSON.stringify(given.method)} is not supported (Kiln has ${Object.keys(KEYS).map((m) => JSON.stringify(m)).join(", ")})`);
  const keys: readonly string[] = KEYS[method as keyof typeof KEYS];
  const anyKey = (k: string): boolean => Object.values(KEYS).some((ks) => (ks as readonly string[]).includes(k));
  for (const k of Object.keys(c)) {
    if (!anyKey(k)) fail(`unknown key ${JSON.stringify(k)}${camelCaseHint(k, anyKey)}`);
    if (!keys.includes(k)) fail(`${JSON.stringify(k)} does not apply to method ${JSON.stringify(method)}`);
  }
  const int = (v: unknown, name: string, min: number, max: number): number => {
    if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) fail(`${name} must be an integer in [${min}, ${max}], got ${JSON.stringify(v)}`);
    return v as number;
  };
  const k = int(given.numSpeculativeTokens, "numSpeculativeTokens", 1, 16);
  if (method === "draft_model" || method === "eagle" || method === "eagle3") {
    const what = method === "draft_model" ? "the draft model (a directory or GGUF file)" : "the EAGLE head's directory";
    if (typeof given.model !== "string" || given.model === "") fail(`model must name ${what}, got ${JSON.stringify(given.model)}`);
    return { method, model: given.model as string, numSpeculativeTokens: k };
  }
  const min = int(given.promptLookupMin ?? 1, "promptLookupMin", 1, 64);
  const max = int(given.promptLookupMax ?? Math.max(5, min), "promptLookupMax", 1, 64);
  if (max < min) fail(`promptLookupMax (${max}) must be >= promptLookupMin (${min})`);
  return { method: "ngram", numSpeculativeTokens: k, promptLookupMax: max, promptLookupMin: min };
}

/**
 * Drafts for `tokens` (prompt + output): the longest suffix n-gram (n from max down to min) that occurs earlier,
 * and up to `k` tokens that followed it there: at its latest occurrence with k tokens after it, else at its
 * earliest (the most tokens after it; in a short loop the latest occurrences are followed by little). [] when none
 * matches.
 */
export function proposeNgram(tokens: readonly number[], minN: number, maxN: number, k: number): number[] {
  const L = tokens.length;
  for (let n = Math.min(maxN, L - 1); n >= minN; n--) {
    let earliest = -1;
    // starts i < L - n with tokens[i .. i+n) == tokens[L-n .. L), latest first
    for (let i = L - n - 1; i >= 0; i--) {
      let j = 0;
      while (j < n && tokens[i + j] === tokens[L - n + j]) j++;
      if (j < n) continue;
      if (i + n + k <= L) return tokens.slice(i + n, i + n + k) as number[];
      earliest = i;
    }
    if (earliest >= 0) return tokens.slice(earliest + n, L) as number[];
  }
  return [];
}
