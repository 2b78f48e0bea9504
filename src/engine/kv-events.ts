// KV-cache events (vLLM's --kv-events-config, vllm/distributed/kv_events.py): the block pool records which prefix-cache
// blocks it stores and drops, and each engine step's events go out as one batch that a router's KV-block index reads
// (llm-d's precise prefix-cache scorer). Here: the event types, the batch, and the config with its checks. The
// publisher (NATS) is kv-events-publisher.ts.
import { EngineInputError } from "./errors.js";

/** A full block of `block_size` tokens got its chain hash: it is now in the prefix cache. Consecutive blocks of one chain. */
export interface BlockStored {
  type: "BlockStored";
  /** Chain hashes, parent first (hex sha256, see kv-cache-manager.ts). */
  block_hashes: string[];
  /** Hash of the block before block_hashes[0], or null when the first is the chain's first block. */
  parent_block_hash: string | null;
  /** The blocks' tokens, block_hashes.length * block_size ids. */
  token_ids: number[];
  block_size: number;
  lora_id: number | null;
  /** Where the blocks live (vLLM's medium): "GPU", the engine's device KV cache, as vLLM names it. */
  medium: string | null;
}

/** Blocks whose hashes left the prefix cache (a free cached block was reused for new tokens). */
export interface BlockRemoved {
  type: "BlockRemoved";
  block_hashes: string[];
  medium: string | null;
}

/** The whole prefix cache was dropped (reset_prefix_cache). */
export interface AllBlocksCleared {
  type: "AllBlocksCleared";
}

export type KvCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared;

/** One engine step's events (vLLM's KVEventBatch) plus who sent them, as JSON on the topic. */
export interface KvEventBatch {
  /** Seconds since the epoch. */
  ts: number;
  events: KvCacheEvent[];
  data_parallel_rank: number | null;
  /** The engine's identity: the URL it serves at (what a router lists it by) unless the config names another. */
  engine_id: string;
  /** Counts batches from this engine from 0: a gap says batches were lost (a subscriber counts it). */
  seq: number;
}

export const KV_EVENT_PUBLISHERS = ["null", "nats"] as const;
export type KvEventPublisherName = (typeof KV_EVENT_PUBLISHERS)[number];

/** vLLM's KVEventsConfig, camelCase; `engineId` is Kiln's (vLLM's ZMQ publisher names the source by its socket). */
export interface KvEventsConfig {
  enableKvCacheEvents: boolean;
  publisher: KvEventPublisherName;
  /** nats://host:port (vLLM's default endpoint is a ZMQ socket; Kiln publishes over NATS). */
  endpoint: string;
  /** The NATS subject the batches are published on. */
  topic: string;
  engineId: string | null;
  dataParallelRank: number | null;
}

export const DEFAULT_KV_EVENTS_TOPIC = "kv-events";

/** vLLM's snake_case keys -> ours; replay_endpoint, buffer_steps, hwm and max_queue_size are ZMQ's (accepted, unused). */
const KEYS = {
  enable_kv_cache_events: "enableKvCacheEvents", publisher: "publisher", endpoint: "endpoint", topic: "topic",
  engine_id: "engineId", data_parallel_rank: "dataParallelRank",
} as const;
const ZMQ_ONLY = ["replay_endpoint", "buffer_steps", "hwm", "max_queue_size"];

/**
 * Reads vLLM's --kv-events-config JSON object (snake_case keys); throws EngineInputError("kv_events_config") naming
 * what is wrong. Returns null when events are disabled.
 * @example parseKvEventsConfig({ enable_kv_cache_events: true, publisher: "nats", endpoint: "nats://127.0.0.1:4222", topic: "kv-events" })
 */
export function parseKvEventsConfig(raw: Record<string, unknown>): KvEventsConfig | null {
  const bad = (m: string): never => {
    throw new EngineInputError("kv_events_config", `--kv-events-config: ${m}`);
  };
  for (const k of Object.keys(raw))
    if (!(k in KEYS) && !ZMQ_ONLY.includes(k)) bad(`${JSON.stringify(k)} is not supported (${[...Object.keys(KEYS), ...ZMQ_ONLY].join(", ")})`);
  const enabled = raw.enable_kv_cache_events ?? false;
  if (typeof enabled !== "boolean") bad("enable_kv_cache_events must be a boolean");
  if (enabled === false) return null;
  const publisher = raw.publisher ?? "nats";
  if (!(KV_EVENT_PUBLISHERS as readonly unknown[]).includes(publisher))
    bad(`publisher must be one of ${KV_EVENT_PUBLISHERS.join(", ")} (Kiln publishes over NATS; vLLM's "zmq" is not implemented), got ${JSON.stringify(publisher)}`);
  const endpoint = raw.endpoint ?? "nats://127.0.0.1:4222";
  if (typeof endpoint !== "string") return bad("endpoint must be a string such as nats://127.0.0.1:4222");
  if (publisher === "nats" && !/^(nats|tls):\/\/[^/\s]+$/.test(endpoint)) bad(`endpoint must be nats://host:port, got ${JSON.stringify(endpoint)}`);
  const topic = raw.topic ?? DEFAULT_KV_EVENTS_TOPIC;
  if (typeof topic !== "string" || !/^[^\s*>]+$/.test(topic)) bad(`topic must be a NATS subject without spaces or wildcards, got ${JSON.stringify(topic)}`);
  const engineId = raw.engine_id ?? null;
  if (engineId !== null && (typeof engineId !== "string" || engineId === "")) bad("engine_id must be a non-empty string");
  const rank = raw.data_parallel_rank ?? null;
  if (rank !== null && !(typeof rank === "number" && Number.isInteger(rank) && rank >= 0)) bad("data_parallel_rank must be an integer >= 0");
  return {
    enableKvCacheEvents: true,
    publisher: publisher as KvEventPublisherName,
    endpoint,
    topic: topic as string,
    engineId: engineId as string | null,
    dataParallelRank: rank as number | null,
  };
}
