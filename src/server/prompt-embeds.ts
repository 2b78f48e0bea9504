// vLLM's prompt_embeds (/v1/completions with --enable-prompt-embeds): each a base64-encoded torch.save tensor
// [seq, hidden] (or [1, seq, hidden]) in float32, bfloat16 or float16, standing for a prompt's input embeddings
// (engine/prompt-embeds.ts makes them engine input).
import type { MultiModalFeature } from "../engine/model-runner.js";
import { promptEmbedsInput } from "../engine/prompt-embeds.js";
import { readTorchSavedTensor, TorchFileError } from "../models/torch-saved-tensor.js";
import { badRequest } from "./errors.js";

export interface EmbeddedPrompt {
  /** Placeholder ids, one per embedded position. */
  promptTokenIds: number[];
  feature: MultiModalFeature;
}

/** One prompt_embeds entry, decoded and checked; `keep(seq)`: how many of its last rows truncate_prompt_tokens leaves. */
export function readPromptEmbeds(base64: string, keep: (seq: number) => number): EmbeddedPrompt {
  const param = "prompt_embeds";
  if (base64.length % 4 !== 0 || !/^[A-Za-z0-9+/]*={0,2}$/.test(base64)) throw badRequest("'prompt_embeds' is not valid base64", param);
  let t;
  try {
    t = readTorchSavedTensor(Buffer.from(base64, "base64"));
  } catch (e) {
    if (e instanceof TorchFileError) throw badRequest(`'prompt_embeds': ${e.message}`, param);
    throw e;
  }
  const shape = t.shape.length === 3 && t.shape[0] === 1 ? t.shape.slice(1) : t.shape; // torch's squeeze(0)
  if (shape.length !== 2 || shape[0]! < 1 || shape[1]! < 1)
    throw badRequest(`'prompt_embeds' must be a tensor [sequence_length, hidden_size] (or [1, sequence_length, hidden_size]), got [${t.shape.join(", ")}]`, param);
  const [seq, hidden] = shape as [number, number];
  const rows = Math.min(seq, keep(seq));
  const values = t.data.subarray((seq - rows) * hidden);
  if (rows < 1) throw badRequest("'prompt_embeds' is empty after truncate_prompt_tokens", param);
  if (!values.every(Number.isFinite)) throw badRequest("'prompt_embeds' holds non-finite values (NaN or infinity)", param);
  const input = promptEmbedsInput(values.slice(), hidden);
  return { promptTokenIds: input.promptTokenIds, feature: input.mmFeatures[0]! };
}
