// vLLM's bi-encoder scoring (score_utils.py, BiEncoderIOProcessor): every text is embedded once, text_1 and text_2
// pair up 1:1, 1:N (the one text_1 with each text_2) or N:N (element-wise), and a pair scores the cosine similarity
// of its two embeddings. Shared by LLM.score and the server's /score and /rerank.

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
