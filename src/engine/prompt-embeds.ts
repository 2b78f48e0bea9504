// A prompt given as its input embeddings (vLLM's EmbedsPrompt / prompt_embeds): the engine sees placeholder token ids
// at those positions and one feature holding the rows, hashed by content so the prefix cache shares an identical
// prompt's blocks and no other's.
import { createHash } from "node:crypto";
import { EngineInputError } from "./errors.js";
import type { MultiModalFeature } from "./model-runner.js";

/** The token id at an embedded position (any id in range would do: the model reads the embeddings there). */
const PLACEHOLDER_ID = 0;

/** Rows [seq * hiddenSize] of input embeddings as engine input: placeholder ids and their feature (the rows kept, not copied). */
export function promptEmbedsInput(values: Float32Array, hiddenSize: number): { promptTokenIds: number[]; mmFeatures: MultiModalFeature[] } {
  if (!Number.isInteger(hiddenSize) || hiddenSize < 1 || values.length === 0 || values.length % hiddenSize !== 0)
    throw new EngineInputError("prompt_embeds", `${values.length} values are not rows of width ${hiddenSize}`);
  const length = values.length / hiddenSize;
  const hash = createHash("sha256").update("prompt_embeds\u0000").update(new Uint8Array(values.buffer, values.byteOffset, values.byteLength)).digest("hex");
  return {
    promptTokenIds: new Array<number>(length).fill(PLACEHOLDER_ID),
    mmFeatures: [{ hash, offset: 0, length, pixelValues: new Float32Array(0), inputEmbeds: values }],
  };
}
