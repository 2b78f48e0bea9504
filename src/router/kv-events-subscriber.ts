// Feeds the KV-block index from the engines' KV-cache events: subscribes to the topic (a NATS subject) the workers
// publish on (`kiln serve --kv-events-config`), reads each JSON KvEventBatch and applies it under its engine_id,
// normalized as a worker URL so that it names the worker as --worker-urls does. Connects and reconnects in the
// background: without NATS the index simply stays as it was and routing falls back to load.
import type { KvCacheEvent, KvEventBatch } from "../engine/kv-events.js";
import type { KvBlockIndex } from "./kv-block-index.js";
import { normalizeWorkerUrl } from "./worker-pool.js";

interface NatsLike {
  subscribe(subject: string): AsyncIterable<{ data: Uint8Array }>;
  flush(): Promise<void>;
  close(): Promise<void>;
  status(): AsyncIterable<{ type: string }>;
}

/** A batch as published, checked just enough to apply safely; null when it is not one. */
export function parseKvEventBatch(data: Uint8Array | string): KvEventBatch | null {
  let b: unknown;
  try {
    b = JSON.parse(typeof data === "string" ? data : new TextDecoder().decode(data));
  } catch {
    return null;
  }
  const o = b as Partial<KvEventBatch> | null;
  if (typeof o !== "object" || o === null || typeof o.engine_id !== "string" || !Array.isArray(o.events)) return null;
  const okEvent = (e: KvCacheEvent): boolean =>
    e !== null && typeof e === "object" &&
    (e.type === "AllBlocksCleared" ||
      ((e.type === "BlockStored" || e.type === "BlockRemoved") && Array.isArray(e.block_hashes) && e.block_hashes.every((h) => typeof h === "string") &&
        (e.type === "BlockRemoved" || (Number.isInteger(e.block_size) && e.block_size > 0))));
  if (!o.events.every(okEvent)) return null;
  return { ts: Number(o.ts ?? 0), events: o.events, data_parallel_rank: o.data_parallel_rank ?? null, engine_id: o.engine_id, seq: Number.isInteger(o.seq) ? o.seq! : 0 };
}

/** engine_id as a worker URL (http://host:port) when it is one; as it is otherwise. */
export function workerOfEngine(engineId: string): string {
  try {
    return normalizeWorkerUrl(engineId);
  } catch {
    return engineId;
  }
}

export class KvEventsSubscriber {
  private nc: NatsLike | null = null;
  private closed = false;
  private readonly started: Promise<void>;
  /** Messages that were not KV-event batches. */
  malformed = 0;

  constructor(
    private readonly endpoint: string,
    private readonly topic: string,
    private readonly index: KvBlockIndex,
    private readonly log: (level: "info" | "warning", line: string) => void,
  ) {
    this.started = this.run();
  }

  private async run(): Promise<void> {
    const { connect } = await import("nats");
    let nc: NatsLike;
    try {
      nc = (await connect({ servers: this.endpoint, name: "kiln-router kv-events", waitOnFirstConnect: true, maxReconnectAttempts: -1, reconnectTimeWait: 500 })) as unknown as NatsLike;
    } catch (e) {
      this.log("warning", `KV events: cannot connect to ${this.endpoint}: ${(e as Error).message}`);
      return;
    }
    if (this.closed) {
      await nc.close();
      return;
    }
    this.nc = nc;
    void (async () => {
      for await (const s of nc.status()) if (s.type === "disconnect" || s.type === "reconnect") this.log(s.type === "reconnect" ? "info" : "warning", `KV events: NATS ${s.type} (${this.endpoint})`);
    })();
    const sub = nc.subscribe(this.topic);
    await nc.flush();
    this.log("info", `KV events: subscribed to ${this.topic} at ${this.endpoint}`);
    void (async () => {
      for await (const m of sub) {
        const batch = parseKvEventBatch(m.data);
        if (batch === null) {
          if (this.malformed++ === 0) this.log("warning", `KV events: a message on ${this.topic} is not a KV-event batch (ignored, counted)`);
          continue;
        }
        this.index.applyBatch(batch, workerOfEngine(batch.engine_id));
      }
    })();
  }

  /** Resolves once subscribed (or once connecting failed). */
  ready(): Promise<void> {
    return this.started;
  }

  async close(): Promise<void> {
    this.closed = true;
    const nc = this.nc;
    this.nc = null;
    if (nc !== null) await nc.close().catch(() => {});
  }
}
