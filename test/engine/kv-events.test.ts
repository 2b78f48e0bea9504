// KV-cache events (vLLM's --kv-events-config): the exact events of a scripted engine run (stores, a prefix hit that
// stores only its new block, an eviction of three cached blocks, a reset), each checked against the block pool's
// prefix-cache map; the config's checks; and publishing over a real nats-server, through an outage.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { connect, type NatsConnection } from "nats";
import { chainBlockHashes } from "../../src/engine/kv-cache-manager.js";
import type { EngineCore } from "../../src/engine/engine-core.js";
import { parseKvEventsConfig, type KvCacheEvent, type KvEventBatch, type KvEventsConfig } from "../../src/engine/kv-events.js";
import { createKvEventPublisher } from "../../src/engine/kv-events-publisher.js";
import { add, makeEngine, prompt } from "./helpers.js";
import { freePort, natsSkipReason, startNatsServer, type NatsServer } from "../helpers/nats-server.js";

const BS = 4;
const stored = (hashes: string[], parent: string | null, tokenIds: number[]): KvCacheEvent => ({
  type: "BlockStored", block_hashes: hashes, parent_block_hash: parent, token_ids: tokenIds, block_size: BS, lora_id: null, medium: "GPU",
});

/** Applies events to a replayed view of the cache and checks it equals the pool's own prefix-cache map. */
function checkAgainstPool(core: EngineCore, view: Set<string>, events: KvCacheEvent[]): void {
  for (const e of events) {
    if (e.type === "BlockStored") for (const h of e.block_hashes) view.add(h);
    else if (e.type === "BlockRemoved") for (const h of e.block_hashes) assert.ok(view.delete(h), `removed ${h} was never stored`);
    else view.clear();
  }
  assert.equal(core.kv.pool.numCachedBlocks, view.size);
  for (const h of view) assert.notEqual(core.kv.pool.getCachedBlock(h), null, `the pool no longer holds ${h}`);
}

/** Runs one request to completion, one step at a time; returns the events of each step. */
function serve(core: EngineCore, id: string, tokens: number[]): KvCacheEvent[][] {
  add(core, id, tokens, { maxTokens: 1, ignoreEos: true, temperature: 0 });
  const steps: KvCacheEvent[][] = [];
  while (core.hasUnfinishedRequests()) {
    core.step();
    steps.push(core.takeKvEvents());
  }
  return steps;
}

test("kv events: stores, a prefix hit storing only its new block, evictions in LRU order, reset; the pool agrees", () => {
  // 5 usable blocks of 4 tokens; one request at a time, synchronous steps
  const { core } = makeEngine({ numGpuBlocks: 6, blockSize: BS, asyncScheduling: false, enableKvCacheEvents: true });
  const view = new Set<string>();
  const a = prompt(1, 9);
  const hA = chainBlockHashes(a, BS);
  assert.equal(hA.length, 2);
  // A: 9 tokens in 3 blocks (1, 2, 3); its 2 full blocks are stored in the step that computes them
  let steps = serve(core, "A", a);
  assert.deepEqual(steps, [[stored(hA, null, a.slice(0, 8))]]);
  checkAgainstPool(core, view, steps.flat());
  assert.deepEqual(core.kv.pool.freeQueue.blockIds(), [4, 5, 3, 2, 1]); // A freed tail first

  // B shares A's 8 tokens: it reads blocks 1, 2 from the cache, takes fresh 4, 5 (no hash to drop), stores block 3 of its chain
  const b = [...a.slice(0, 8), ...prompt(2, 5)];
  const hB = chainBlockHashes(b, BS);
  assert.deepEqual(hB.slice(0, 2), hA);
  steps = serve(core, "B", b);
  assert.deepEqual(steps, [[stored([hB[2]!], hA[1]!, b.slice(8, 12))]]);
  checkAgainstPool(core, view, steps.flat());
  assert.deepEqual(core.kv.pool.freeQueue.blockIds(), [3, 5, 4, 2, 1]);

  // C needs all 5 blocks: taking 4, 2, 1 drops hB[2], hA[1], hA[0] (one event, LRU order), then C's 4 are stored
  const c = prompt(3, 17);
  const hC = chainBlockHashes(c, BS);
  steps = serve(core, "C", c);
  assert.deepEqual(steps, [[{ type: "BlockRemoved", block_hashes: [hB[2]!, hA[1]!, hA[0]!], medium: "GPU" }, stored(hC, null, c.slice(0, 16))]]);
  checkAgainstPool(core, view, steps.flat());

  assert.equal(core.kv.resetPrefixCache(), true);
  const reset = core.takeKvEvents();
  assert.deepEqual(reset, [{ type: "AllBlocksCleared" }]);
  checkAgainstPool(core, view, reset);
  assert.deepEqual(core.takeKvEvents(), [], "taken events are not handed out twice");
});

test("kv events: a chunked prefill stores each chunk's full blocks in its step, chained by parent hash", () => {
  const { core } = makeEngine({ blockSize: BS, asyncScheduling: false, enableKvCacheEvents: true, maxNumBatchedTokens: 6 });
  const p = prompt(7, 14);
  const h = chainBlockHashes(p, BS);
  const steps = serve(core, "P", p);
  // chunks of 6, 6, 2 tokens: full blocks after each are 1, 3, 3
  assert.deepEqual(steps, [[stored([h[0]!], null, p.slice(0, 4))], [stored([h[1]!, h[2]!], h[0]!, p.slice(4, 12))], []]);
});

test("kv events: off by default, and nothing is recorded without prefix caching", () => {
  for (const args of [{}, { enableKvCacheEvents: true, enablePrefixCaching: false }]) {
    const { core } = makeEngine({ blockSize: BS, asyncScheduling: false, ...args });
    assert.deepEqual(serve(core, "A", prompt(1, 9)).flat(), []);
  }
});

test("kv events config: vLLM's JSON, checked", () => {
  assert.equal(parseKvEventsConfig({}), null);
  assert.equal(parseKvEventsConfig({ enable_kv_cache_events: false, publisher: "nats" }), null);
  assert.deepEqual(parseKvEventsConfig({ enable_kv_cache_events: true, publisher: "nats", endpoint: "nats://10.0.0.1:4222", topic: "kv", hwm: 100 }), {
    enableKvCacheEvents: true, publisher: "nats", endpoint: "nats://10.0.0.1:4222", topic: "kv", engineId: null, dataParallelRank: null,
  });
  assert.equal(parseKvEventsConfig({ enable_kv_cache_events: true, publisher: "null" })!.publisher, "null");
  for (const [raw, msg] of [
    [{ enable_kv_cache_events: true, publisher: "zmq" }, /publisher must be one of null, nats/],
    [{ enable_kv_cache_events: true, endpoint: "tcp://*:5557" }, /endpoint must be nats:\/\/host:port/],
    [{ enable_kv_cache_events: true, topic: "kv.>" }, /topic must be a NATS subject/],
    [{ enable_kv_cache_events: "yes" }, /enable_kv_cache_events must be a boolean/],
    [{ enable_kv_cache_events: true, endpoints: "x" }, /"endpoints" is not supported/],
  ] as const)
    assert.throws(() => parseKvEventsConfig(raw), msg);
});

describe("kv events over NATS", { skip: natsSkipReason, timeout: 30_000 }, () => {
  let server: NatsServer;
  let sub: NatsConnection;
  before(async () => {
    server = await startNatsServer();
    sub = await connect({ servers: server.url });
  });
  after(async () => {
    await sub?.close();
    await server?.stop();
  });

  const config = (endpoint: string): KvEventsConfig => ({
    enableKvCacheEvents: true, publisher: "nats", endpoint, topic: "kv-test", engineId: null, dataParallelRank: 0,
  });
  /** Subscribes now; `batches` resolves with the next `n` batches on the test topic. */
  const receive = async (n: number): Promise<{ batches: Promise<KvEventBatch[]> }> => {
    const s = sub.subscribe("kv-test", { max: n });
    await sub.flush();
    const collect = async (): Promise<KvEventBatch[]> => {
      const out: KvEventBatch[] = [];
      for await (const m of s) out.push(JSON.parse(new TextDecoder().decode(m.data)) as KvEventBatch);
      return out;
    };
    return { batches: collect() };
  };
  const waitFor = async (cond: () => boolean, what: string): Promise<void> => {
    for (let i = 0; i < 200; i++) {
      if (cond()) return;
      await new Promise((r) => setTimeout(r, 25));
    }
    assert.fail(`timed out waiting: ${what}`);
  };

  test("each step's events are one JSON batch naming the engine, numbered", async () => {
    const warnings: string[] = [];
    const pub = createKvEventPublisher(config(server.url), "http://127.0.0.1:8001", (l) => warnings.push(l));
    const got = await receive(2);
    const { core } = makeEngine({ numGpuBlocks: 6, blockSize: BS, asyncScheduling: false, enableKvCacheEvents: true });
    const a = prompt(1, 9);
    // the publisher connects in the background: batches before that are dropped, not queued
    await waitFor(() => {
      pub.publish([{ type: "AllBlocksCleared" }]);
      return pub.stats.publishedBatches > 0;
    }, "the publisher connected");
    add(core, "A", a, { maxTokens: 1, ignoreEos: true });
    core.step();
    pub.publish(core.takeKvEvents());
    pub.publish([]); // an empty step sends nothing
    const batches = await got.batches;
    await pub.close();
    assert.equal(batches[0]!.events[0]!.type, "AllBlocksCleared");
    const b = batches[1]!;
    assert.equal(b.engine_id, "http://127.0.0.1:8001");
    assert.equal(b.data_parallel_rank, 0);
    assert.equal(b.seq, batches[0]!.seq + 1);
    assert.ok(Math.abs(b.ts - Date.now() / 1000) < 60);
    assert.deepEqual(b.events, [stored(chainBlockHashes(a, BS), null, a.slice(0, 8))]);
    assert.equal(pub.stats.droppedBatches, batches[0]!.seq, "every batch before the connection was dropped and counted");
  });

  test("a NATS outage drops and counts batches (one warning), never throws; publishing resumes on reconnect", async () => {
    const port = await freePort();
    const warnings: string[] = [];
    const pub = createKvEventPublisher(config(`nats://127.0.0.1:${port}`), "e1", (l) => warnings.push(l));
    for (let i = 0; i < 5; i++) pub.publish([{ type: "AllBlocksCleared" }]);
    assert.deepEqual(pub.stats, { publishedBatches: 0, droppedBatches: 5, droppedEvents: 5 });
    assert.equal(warnings.length, 1, warnings.join("\n"));
    assert.match(warnings[0]!, /dropped until NATS is reachable/);
    const late = await startNatsServer(port);
    try {
      await waitFor(() => {
        pub.publish([{ type: "AllBlocksCleared" }]);
        return pub.stats.publishedBatches > 0;
      }, "the publisher connected once the server came up");
      // a server that goes away again: dropped and counted, one more warning
      await late.stop();
      await waitFor(() => {
        pub.publish([{ type: "AllBlocksCleared" }]);
        return warnings.some((w) => /lost the connection/.test(w));
      }, "the lost connection was noticed");
      const dropped = pub.stats.droppedBatches;
      pub.publish([{ type: "AllBlocksCleared" }]);
      assert.equal(pub.stats.droppedBatches, dropped + 1);
    } finally {
      await late.stop();
      await pub.close();
    }
  });
});
