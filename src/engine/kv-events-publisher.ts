// Publishes each engine step's KV-cache events (kv-events.ts) as one JSON KvEventBatch on a NATS subject (vLLM's
// EventPublisher; its "null" publisher drops them). Publishing never blocks or fails the engine: the NATS client
// connects and reconnects in the background, and while it is not connected batches are dropped and counted
// (a warning once per outage) rather than queued, so a subscriber never reads a stale burst.
import type { KvCacheEvent, KvEventBatch, KvEventsConfig } from "./kv-events.js";

export interface KvEventPublisherStats {
  /** Batches handed to the NATS client. */
  publishedBatches: number;
  /** Batches (and their events) dropped: not connected, or the client refused them. */
  droppedBatches: number;
  droppedEvents: number;
}

export interface KvEventPublisher {
  readonly stats: KvEventPublisherStats;
  /** Sends one step's events as a batch (nothing when `events` is empty). Never throws. */
  publish(events: KvCacheEvent[]): void;
  /** Flushes what was sent and closes the connection. */
  close(): Promise<void>;
}

/** The "null" publisher: counts nothing, sends nothing. */
class NullPublisher implements KvEventPublisher {
  readonly stats = { publishedBatches: 0, droppedBatches: 0, droppedEvents: 0 };
  publish(): void {}
  async close(): Promise<void> {}
}

/** The slice of nats.js's NatsConnection used here. */
interface NatsConnectionLike {
  publish(subject: string, data: Uint8Array): void;
  status(): AsyncIterable<{ type: string }>;
  drain(): Promise<void>;
  close(): Promise<void>;
  isClosed(): boolean;
}

class NatsPublisher implements KvEventPublisher {
  readonly stats = { publishedBatches: 0, droppedBatches: 0, droppedEvents: 0 };
  private nc: NatsConnectionLike | null = null;
  private connected = false;
  private warned = false;
  private closed = false;
  private seq = 0;
  private readonly encoder = new TextEncoder();
  private readonly connecting: Promise<void>;

  constructor(
    private readonly config: KvEventsConfig,
    private readonly engineId: string,
    private readonly warn: (line: string) => void,
  ) {
    this.connecting = this.connect();
  }

  private async connect(): Promise<void> {
    try {
      const { connect } = await import("nats");
      // waitOnFirstConnect: an unreachable server at start-up is retried forever, like a lost one
      const nc = (await connect({
        servers: this.config.endpoint, name: `kiln-kv-events ${this.engineId}`, waitOnFirstConnect: true,
        maxReconnectAttempts: -1, reconnectTimeWait: 500, pingInterval: 10_000,
      })) as unknown as NatsConnectionLike;
      if (this.closed) {
        await nc.close();
        return;
      }
      this.nc = nc;
      this.connected = true;
      if (this.warned) this.warn(`[kv-events] connected to ${this.config.endpoint}: publishing again`);
      this.warned = false;
      void this.watch(nc);
    } catch (e) {
      this.warnOnce(`cannot connect to ${this.config.endpoint}: ${(e as Error).message}`);
    }
  }

  private async watch(nc: NatsConnectionLike): Promise<void> {
    for await (const s of nc.status()) {
      if (s.type === "disconnect") this.connected = false;
      else if (s.type === "reconnect") {
        this.connected = true;
        if (this.warned) this.warn(`[kv-events] reconnected to ${this.config.endpoint}: publishing again (${this.stats.droppedBatches} batches dropped so far)`);
        this.warned = false;
      }
    }
  }

  private warnOnce(why: string): void {
    if (this.warned) return;
    this.warned = true;
    this.warn(`[kv-events] ${why}: KV-cache events are dropped until NATS is reachable`);
  }

  publish(events: KvCacheEvent[]): void {
    if (events.length === 0) return;
    const batch: KvEventBatch = { ts: Date.now() / 1000, events, data_parallel_rank: this.config.dataParallelRank, engine_id: this.engineId, seq: this.seq++ };
    const nc = this.nc;
    if (nc === null || !this.connected || nc.isClosed()) {
      this.drop(events.length);
      if (nc !== null) this.warnOnce(`lost the connection to ${this.config.endpoint}`);
      else if (!this.closed) this.warnOnce(`not connected to ${this.config.endpoint} yet`);
      return;
    }
    try {
      nc.publish(this.config.topic, this.encoder.encode(JSON.stringify(batch)));
      this.stats.publishedBatches++;
    } catch (e) {
      this.drop(events.length);
      this.warnOnce(`publishing failed (${(e as Error).message})`);
    }
  }

  private drop(n: number): void {
    this.stats.droppedBatches++;
    this.stats.droppedEvents += n;
  }

  async close(): Promise<void> {
    this.closed = true;
    const nc = this.nc;
    if (nc === null) return; // still connecting: connect() closes it when it gets through
    this.nc = null;
    // drain waits for the server: only while connected (a lost server would keep it waiting)
    if (this.connected) await nc.drain().catch(() => {});
    if (!nc.isClosed()) await nc.close().catch(() => {});
    await this.connecting;
  }
}

/**
 * The publisher the config names; `engineId` says who sends (the config's engine_id, else the served URL).
 * @example const p = createKvEventPublisher(config, "http://127.0.0.1:8000"); p.publish(core.takeKvEvents());
 */
export function createKvEventPublisher(config: KvEventsConfig, engineId: string, warn: (line: string) => void = (l) => process.stderr.write(`${l}\n`)): KvEventPublisher {
  return config.publisher === "null" ? new NullPublisher() : new NatsPublisher(config, config.engineId ?? engineId, warn);
}
