// vLLM's scoring (score_utils.py), shared by LLM.score and the server's /score and /rerank. text_1 and text_2 pair up
// 1:1, 1:N (the one text_1 with each text_2) or N:N (element-wise). An embedding model (bi-encoder) embeds every text
// once and a pair scores the cosine similarity of its two embeddings; a sequence classifier with one label
// (cross-encoder) reads each pair as one prompt and the pair scores its classifier output (sigmoid of the logit).
import type { TokenizerLike } from "../models/tokenizer-types.js";

/** Why vLLM refuses these numbers of texts (its messages), or null when they pair up. */
export function scorePairingError(count1: number, count2: number): string | null {
  if (count1 > 1 && count1 !== count2) return `Input lengths must be either 1:1, 1:N or N:N, got ${count1}:${count2}`;
  if (count1 === 0) return "At least one text element must be given";
  if (count2 === 0) return "At least one text_pair element must be given";
  return null;
}

/** [text_1 index, text_2 index] of each scored pair, in output order (one per text_2); the counts must pair up. */
export function scorePairs(count1: number, count2: number): [number, number][] {
  return Array.from({ length: count2 }, (_, j) => [count1 === 1 ? 0 : j, j]);
}

/** torch.nn.functional.cosine_similarity of two vectors (eps 1e-8), summed in float64. */
export function cosineSimilarity(a: Float32Array, b: Float32Array): number {
  if (a.length !== b.length) throw new Error(`[score] cosine similarity of vectors of ${a.length} and ${b.length} values`);
  let dot = 0;
  let aa = 0;
  let bb = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i]! * b[i]!;
    aa += a[i]! * a[i]!;
    bb += b[i]! * b[i]!;
  }
  return dot / Math.max(Math.sqrt(aa * bb), 1e-8);
}

/** Why a classifier of `labels` labels scores no pairs (vLLM enables scoring for num_labels == 1 only), or null. */
export function crossEncoderLabelsError(labels: number): string | null {
  return labels === 1 ? null : `only enabled for num_labels == 1; this classifier has ${labels}`;
}

/**
 * A cross-encoder pair's prompt ids, as vLLM's get_score_prompt builds them for a model without a score template:
 * with use_sep_token (the default) the tokenizer's text pair, `tokenizer(text=text1, text_pair=text2)`; without it
 * (an LLM converted to a reranker) the joined text, `tokenizer(text=text1 + text2)`; special tokens as asked.
 */
export function crossEncoderPromptIds(
  tokenizer: TokenizerLike, text1: string, text2: string, o: { useSepToken: boolean; addSpecialTokens: boolean },
): number[] {
  if (!o.useSepToken) return tokenizer.encode(text1 + text2, { addSpecialTokens: o.addSpecialTokens });
  if (tokenizer.encodePair === undefined) throw new Error("[score] this tokenizer cannot encode text pairs for a cross-encoder");
  return tokenizer.encodePair(text1, text2, { addSpecialTokens: o.addSpecialTokens });
}
