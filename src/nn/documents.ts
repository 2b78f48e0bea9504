// Packed documents in a dense training batch (TorchTitan's block_causal attention mask): rows of documents, each
// ended by a separator (EOS) token, where a token attends only within its own document.
//
// TorchTitan (torchtitan/models/attention.py, get_document_mask_mod) numbers a row's documents by the separators
// strictly before each position, so a separator belongs to the document it ends and the token after it starts the
// next; a row's first tokens (the tail of a document begun in an earlier row) are a document of their own.
import { KilnError } from "../util/errors.js";

/**
 * Each token's document index within its row, int32 [batch * seqLen] (0 at every row's start): the count of
 * `separator` tokens strictly before it in the row.
 * @example
 *   documentIds(Int32Array.of(5, 6, 0, 7, 0, 8), 1, 6, 0); // [0, 0, 0, 1, 1, 2]
 */
export function documentIds(tokens: Int32Array, batch: number, seqLen: number, separator: number): Int32Array {
  if (tokens.length !== batch * seqLen) throw new KilnError(`[documents] ${tokens.length} tokens are not batch ${batch} x seqLen ${seqLen}`);
  const ids = new Int32Array(tokens.length);
  for (let b = 0; b < batch; b++) {
    let doc = 0;
    for (let s = 0; s < seqLen; s++) {
      ids[b * seqLen + s] = doc;
      if (tokens[b * seqLen + s] === separator) doc++;
    }
  }
  return ids;
}

/**
 * Positions restarting at 0 with each document, int32 [batch * seqLen], for document ids as {@link documentIds}
 * gives: each document reads as a sequence of its own, as a serving engine sees it (TorchTitan's per-document
 * positions). Under rotary embeddings, scores within a document depend only on position differences, so this equals
 * row positions 0..seqLen-1 up to float rounding; a continued document's tail starts at 0 (TorchTitan carries its count).
 */
export function documentPositions(documents: Int32Array, batch: number, seqLen: number): Int32Array {
  const pos = new Int32Array(documents.length);
  for (let b = 0; b < batch; b++) {
    let start = 0;
    for (let s = 0; s < seqLen; s++) {
      if (s > 0 && documents[b * seqLen + s] !== documents[b * seqLen + s - 1]) start = s;
      pos[b * seqLen + s] = s - start;
    }
  }
  return pos;
}
