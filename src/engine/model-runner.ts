// The contract between the engine and a model: the engine schedules, the runner computes logits.
// The runner never decides anything about blocks: it writes the K/V of each new token into the slot the
// scheduler gives it and reads earlier tokens' K/V through the block table.
import type { ClassifierConfig } from "../models/hf-config.js";
import type { LoraSlots } from "../models/lora-slots.js";
import type { KvLayout } from "./kv-transfer.js";

/**
 * One image of a request's prompt (vLLM's MultiModalFeatureSpec): its processed pixels and the run of prompt
 * positions [offset, offset + length) whose input embeddings are the image's features (Gemma 3's `<image_soft_token>`s).
 */
export interface MultiModalFeature {
  /** Content hash of the image (vLLM's mm_hash): keys its features in the encoder cache and its KV blocks in the prefix cache. */
  hash: string;
  offset: number;
  length: number;
  /** The model's processed input: Gemma 3's pixel_values [3, S, S] (empty for prompt embeddings). */
  pixelValues: Float32Array;
  /**
   * Prompt embeddings (vLLM's prompt_embeds) [length, hidden]: the positions' input embeddings as given, in place of
   * the token embeddings (placeholder ids there). No encoder, causal attention, split across steps as text is.
   */
  inputEmbeds?: Float32Array;
}

/** One request's share of a step. Positions of `tokenIds` are startPosition .. startPosition+tokenIds.length-1. */
export interface ScheduledSequence {
  requestId: string;
  /** Tokens whose K/V this step computes (a prefill chunk, or the one last-sampled token of a decode). */
  tokenIds: readonly number[];
  /** Position of tokenIds[0] = tokens whose K/V is already cached for this request. */
  startPosition: number;
  /** The request's whole block table, block ids in sequence order (token at position p lives in blockTable[p / blockSize]). */
  blockTable: readonly number[];
  /** Flat KV slot per new token: blockTable[p / blockSize] * blockSize + p % blockSize. [tokenIds.length] */
  slotMapping: Int32Array;
  /** The step reaches the request's last known token: return one logits row (for the last token) to sample from. */
  needsLogits: boolean;
  /**
   * Speculative decoding: the last numSpecTokens of tokenIds are drafts after the last known token; with
   * needsLogits, the runner returns 1 + numSpecTokens rows (the last known token's and each draft's). Absent = 0.
   */
  numSpecTokens?: number;
  /** Return a logits row for every new token (prompt logprobs). */
  needsPromptLogits: boolean;
  /** The LoRA slot its tokens use (runner.lora), -1 or absent for none. */
  loraSlot?: number;
  /** The request's images (absent: none): the step's tokens inside one take their input embeddings from its features. */
  mmFeatures?: readonly MultiModalFeature[];
}

export interface ScheduledBatch {
  /** Requests in scheduling order; the K/V of a sequence must be written before later sequences read it. */
  sequences: ScheduledSequence[];
  blockSize: number;
  /** Sum of tokenIds.length over sequences (<= max_num_batched_tokens). */
  numTokens: number;
  /** Requests finished or preempted since the previous step: the runner may drop any per-request state. */
  finishedRequestIds: string[];
  /**
   * Every sampled row is plain greedy (no logprobs, masks, penalties or processors): the runner may pick
   * the tokens on the device and return only their ids (RunnerOutput.tokenIds).
   */
  sampleOnDevice?: boolean;
  /**
   * Token ids not yet on the host (async scheduling): the tokens the previous step is sampling on the device, fed
   * from there into this step's inputs. Their entries in `sequences[].tokenIds` are -1.
   */
  fedTokens?: FedTokens;
  /**
   * A pooling engine's step (EngineArgs.pooler): no logits; the runner returns each sequence's share of its pooled
   * hidden state (RunnerOutput.pooled).
   */
  pooling?: PoolingType;
  /**
   * Return the target model's hidden states of every token of the step (RunnerOutput.hiddenStates), for an EAGLE
   * drafter: "final" the final normed ones, or the residual streams entering `layers` (vLLM's aux hidden state ids),
   * concatenated per row in layer order. Absent: none (the step costs nothing more).
   */
  hiddenStates?: HiddenStatesRequest;
}

export type HiddenStatesRequest = "final" | { layers: readonly number[] };

/** How a pooling engine reduces a prompt's final hidden states (vLLM's pooling_type). */
export const POOLING_TYPES = ["LAST", "MEAN", "CLS"] as const;
export type PoolingType = (typeof POOLING_TYPES)[number];
export const isPoolingType = (t: unknown): t is PoolingType => (POOLING_TYPES as readonly unknown[]).includes(t);

/** A step's token ids sampled on the device, still there: `read()` waits for the step and copies them out. */
export interface DeviceTokens {
  read(): Int32Array;
}

/** Batch token `at[k]` (an index into the batch's concatenated tokenIds) is row `rows[k]` of `from`. */
export interface FedTokens {
  from: DeviceTokens;
  at: Int32Array;
  rows: Int32Array;
}

/** Writes the fed tokens into `ids` (the batch's concatenated token ids), reading them from the host copy. */
export function fillFedTokens(ids: Int32Array, fed: FedTokens): void {
  const got = fed.from.read();
  for (let k = 0; k < fed.at.length; k++) {
    const row = fed.rows[k]!;
    if (row < 0 || row >= got.length) throw new RangeError(`fed token row ${row} outside the ${got.length} sampled rows`);
    ids[fed.at[k]!] = got[row]!;
  }
}

export interface RunnerOutput {
  /** [sampled rows, vocabSize]: per sequence with needsLogits, 1 + numSpecTokens rows, in sequence order. The engine may edit it in place. */
  logits: Float32Array;
  /** requestId -> [tokenIds.length, vocabSize] for sequences with needsPromptLogits. */
  promptLogits: Map<string, Float32Array>;
  /** With batch.sampleOnDevice: the argmax token of each sampled row, in row order (logits may be empty). */
  tokenIds?: Int32Array;
  /**
   * With batch.pooling, by request id, the chunk's part of the pooled state: LAST the last prompt token's hidden row
   * (chunk with needsLogits), CLS the first token's (chunk at position 0), MEAN the sum of the chunk's rows.
   */
  pooled?: Map<string, Float32Array>;
  /** With batch.hiddenStates: [numTokens, width] of every token of the batch, in batch order. */
  hiddenStates?: Float32Array;
}

/** A step whose kernels are queued on the device: `wait()` blocks until its logits are on the host. */
export interface PendingRunnerOutput {
  wait(): RunnerOutput;
  /** Sampled on the device: the ids, which the next step may take as fed tokens before this one has finished. */
  deviceTokens?: DeviceTokens;
}

/** What the engine calls each step. The real implementation wraps the model and the paged KV cache. */
export interface ModelRunner {
  readonly vocabSize: number;
  /** The model's LoRA slots, when it serves adapters (EngineArgs.lora). */
  readonly lora?: LoraSlots | null;
  /** Whether the model reads images (ScheduledSequence.mmFeatures): an image-text model. */
  readonly supportsImages?: boolean;
  /** The width prompt embeddings must have (MultiModalFeature.inputEmbeds: the hidden size), or null/absent: not taken. */
  readonly inputEmbedsWidth?: number | null;
  /** Whether execute() serves pooling batches (ScheduledBatch.pooling). */
  readonly supportsPooling?: boolean;
  /** A sequence classifier's head (the model is a *ForSequenceClassification), or null/absent. */
  readonly classifier?: ClassifierConfig | null;
  /** The classifier's logits [num_labels] for one pooled final hidden state (with `classifier`). */
  classify?(pooled: Float32Array): Float32Array;
  execute(batch: ScheduledBatch): RunnerOutput;
  /**
   * Queues the step's work and returns before it has run (async scheduling: the engine schedules the next
   * step meanwhile). Runners without it are driven synchronously through execute().
   */
  dispatch?(batch: ScheduledBatch): PendingRunnerOutput;
  /** The paged cache's layout (P/D disaggregation, kv-transfer.ts); runners that cannot move K/V omit it and the next two. */
  readonly kvLayout?: KvLayout;
  /**
   * The K/V of positions [0, numTokens) of a block table, as KvSnapshot.data lays it out ([layer][k, v][token][row]),
   * after the work queued so far.
   */
  readKv?(blockTable: readonly number[], blockSize: number, numTokens: number): Uint8Array;
  /**
   * Writes positions [from, to) of `data` (numTokens tokens laid out as readKv's) into a block table's slots, ordered
   * behind the work queued so far and before any later step.
   */
  writeKv?(blockTable: readonly number[], blockSize: number, data: Uint8Array, numTokens: number, from: number, to: number): void;
  /**
   * Sleep mode (level >= 1, sleep-mode.ts): frees the paged KV cache's memory, contents lost; restoreKvCache() allocates
   * it again. Runners without them hold no KV memory of their own.
   */
  releaseKvCache?(): void;
  restoreKvCache?(): void;
  /**
   * Sleep level 2: why the weights could not be read again once released (a model built in memory), or null when they
   * can; releaseWeights() frees them and reloadWeights() reads them again from the checkpoint. Absent: they cannot.
   */
  weightsReloadRefusal?(): string | null;
  releaseWeights?(): void;
  reloadWeights?(): void;
}
