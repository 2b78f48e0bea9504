// End to end: a real nats-server, two real `kiln serve` workers publishing KV-cache events (--kv-events-config) and a
// real `kiln router --policy precise_prefix` subscribed to them. A long prompt served by worker B directly (the router
// never saw it) makes the router send a request extending it to B, because B's events said it holds those blocks
// (B's prefix cache then hits); a chat request sharing a long system prompt likewise. Once B has evicted them,
// the router no longer prefers B: the request goes to the least loaded worker, the first listed (A). A worker that
// dies loses its entries in the index as soon as the router marks it down.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { startKiln, type KilnServer } from "./kiln-process.js";
import { startRouter, type KilnRouter } from "./router-process.js";
import { freePort, natsSkipReason, startNatsServer, type NatsServer } from "../helpers/nats-server.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

describe("precise prefix routing from KV-cache events (e2e)", { skip: natsSkipReason, timeout: 180_000 }, () => {
  let nats: NatsServer;
  let workers: KilnServer[];
  let router: KilnRouter;
  const model = tinyModelDir("LlamaForCausalLM");
  const topic = `kv-e2e-${process.pid}`;

  before(async () => {
    nats = await startNatsServer();
    const events = JSON.stringify({ enable_kv_cache_events: true, publisher: "nats", endpoint: nats.url, topic });
    const ports = [await freePort(), await freePort()];
    // a small KV cache, so that a few prompts evict the first one's blocks
    workers = await Promise.all(ports.map((p) => startKiln(["--max-model-len", "256", "--kv-cache-memory", "256KiB", "--port", String(p), "--kv-events-config", events], model)));
    router = await startRouter(workers.map((w) => w.url), [
      "--policy", "precise_prefix", "--kv-events-endpoint", nats.url, "--kv-events-topic", topic, "--tokenizer", model,
      "--health-check-interval-secs", "0.5",
    ]);
    for (let i = 0; i < 100 && !router.log().includes(`subscribed to ${topic}`); i++) await new Promise((r) => setTimeout(r, 50));
    assert.match(router.log(), /KV events: subscribed/);
  });
  after(async () => {
    if (router !== undefined) assert.equal(await router.stop(), 0, router.log());
    // a worker connected to NATS still shuts down at once, and cleanly (B was killed by the last test)
    const codes = await Promise.all((workers ?? []).map((w) => w.stop()));
    if (codes.length > 0) assert.equal(codes[0], 0, A().log());
    await nats?.stop();
  });

  const A = (): KilnServer => workers[0]!;
  const B = (): KilnServer => workers[1]!;
  /** The router's count of blocks it indexes for each worker, once stable (events arrive asynchronously). */
  const indexed = async (): Promise<number[]> => {
    let last = "";
    for (let i = 0; i < 50; i++) {
      const body = (await (await fetch(`${router.url}/workers`)).json()) as { workers: { url: string; kv_blocks: number }[] };
      const now = JSON.stringify(workers.map((w) => body.workers.find((x) => x.url === w.url)!.kv_blocks));
      if (now === last) return JSON.parse(now) as number[];
      last = now;
      await new Promise((r) => setTimeout(r, 150));
    }
    throw new Error("the index did not settle");
  };
  const decisions = async (reason: string): Promise<number> => {
    const text = await (await fetch(`${router.url}/metrics`)).text();
    const line = text.split("\n").find((l) => l.startsWith("kiln_router_routing_decisions_total") && l.includes(`reason="${reason}"`));
    return line === undefined ? 0 : Number(line.slice(line.lastIndexOf(" ") + 1));
  };
  const complete = async (prompt: string | number[]) => {
    const { response } = await router.client().completions.create({ model, prompt: prompt as string, max_tokens: 2, temperature: 0 }).withResponse();
    return response.headers.get("x-kiln-worker");
  };
  const prefix = "Here is a long shared context about rivers, lakes and the sea that every question repeats, word for word. ".repeat(3);

  it("routes a request extending a prompt to the worker whose KV events say it holds the prompt's blocks", async () => {
    assert.deepEqual(await indexed(), [0, 0]);
    await B().client().completions.create({ model, prompt: `${prefix}Where does it start?`, max_tokens: 2, temperature: 0 });
    const [a, b] = await indexed();
    assert.equal(a, 0);
    assert.ok(b! >= 4, `B reported ${b} blocks`);
    const hitsBefore = await B().metric("vllm:prefix_cache_hits_total");
    const hitDecisions = await decisions("cache_hit");
    // without B's events the tie (both idle) would go to A, the first listed
    assert.equal(await complete(`${prefix}How deep is it?`), B().url);
    assert.equal((await decisions("cache_hit")) - hitDecisions, 1);
    assert.ok((await B().metric("vllm:prefix_cache_hits_total")) - hitsBefore >= 4 * 16, "B read the prompt's blocks from its cache");
    const seen = ((await (await fetch(`${router.url}/workers`)).json()) as { kv_events: { batches: number; gaps: number; restarts: number } }).kv_events;
    assert.ok(seen.batches >= 1 && seen.gaps === 0 && seen.restarts === 0, JSON.stringify(seen));
    assert.ok((await B().metric("kiln:kv_events_published_batches_total")) >= 1);
    assert.equal(await B().metric("kiln:kv_events_dropped_batches_total"), 0);
  });

  it("chat: a shared long system prompt, rendered through the chat template, routes to its holder", async () => {
    const system = "You answer questions about the geography of rivers in great detail, citing their sources. ".repeat(3);
    const ask = (content: string) => ({ model, messages: [{ role: "system" as const, content: system }, { role: "user" as const, content }], max_tokens: 2, temperature: 0 });
    await B().client().chat.completions.create(ask("Name a river."));
    await indexed();
    const { response } = await router.client().chat.completions.create(ask("Name a lake.")).withResponse();
    assert.equal(response.headers.get("x-kiln-worker"), B().url);
  });

  it("once the worker has evicted those blocks, routing no longer prefers it", async () => {
    const blocks = Number(/KV cache \([^)]*\): (\d+) blocks of 16 tokens/.exec(B().log())?.[1]);
    assert.ok(blocks >= 20 && blocks < 400, `B has ${blocks} blocks`);
    const before = (await indexed())[1]!;
    // unrelated prompts of 14 blocks each, straight to B, until every block has been reused
    for (let i = 0; i * 14 < blocks + 14; i++) {
      const ids = Array.from({ length: 224 }, (_, j) => 3 + ((i * 7919 + j * 31 + j * j) % 500));
      await B().client().completions.create({ model, prompt: ids as unknown as string, max_tokens: 1, temperature: 0 });
    }
    const after = (await indexed())[1]!;
    assert.ok(after <= blocks, `the index follows B's cache (${before} -> ${after} blocks of ${blocks})`);
    const misses = await decisions("cache_miss");
    assert.equal(await complete(`${prefix}Who lives there?`), A().url);
    assert.equal((await decisions("cache_miss")) - misses, 1);
  });

  it("a worker that goes down loses its index entries", async () => {
    await B().client().completions.create({ model, prompt: `${prefix}Again.`, max_tokens: 1, temperature: 0 });
    assert.ok((await indexed())[1]! > 0);
    process.kill(B().pid, "SIGKILL");
    await B().exited;
    let kv = -1;
    for (let i = 0; i < 100 && kv !== 0; i++) {
      await new Promise((r) => setTimeout(r, 100));
      const body = (await (await fetch(`${router.url}/workers`)).json()) as { workers: { url: string; healthy: boolean; kv_blocks: number }[] };
      const b = body.workers.find((x) => x.url === B().url)!;
      kv = b.healthy ? -1 : b.kv_blocks;
    }
    assert.equal(kv, 0, "B is down and holds nothing in the index");
    assert.equal(await complete(`${prefix}Again and again.`), A().url);
  });
});

describe("kiln serve with its NATS server away (e2e)", { skip: natsSkipReason, timeout: 120_000 }, () => {
  it("serves as usual, drops and counts the events with one warning, and publishes once NATS is up", async () => {
    const model = tinyModelDir("LlamaForCausalLM");
    const natsPort = await freePort();
    const events = JSON.stringify({ enable_kv_cache_events: true, publisher: "nats", endpoint: `nats://127.0.0.1:${natsPort}`, topic: "kv-away" });
    const server = await startKiln(["--max-model-len", "256", "--port", String(await freePort()), "--kv-events-config", events], model);
    let nats: NatsServer | null = null;
    try {
      const prompt = (i: number) => `Request number ${i} carries a prompt long enough to fill a few blocks of sixteen tokens each, at least.`;
      for (let i = 0; i < 3; i++) await server.client().completions.create({ model, prompt: prompt(i), max_tokens: 2, temperature: 0 });
      assert.ok((await server.metric("kiln:kv_events_dropped_batches_total")) >= 3);
      assert.equal(await server.metric("kiln:kv_events_published_batches_total"), 0);
      assert.equal(server.log().match(/KV-cache events are dropped until NATS is reachable/g)?.length, 1, server.log());
      nats = await startNatsServer(natsPort);
      let published = 0;
      for (let i = 3; i < 60 && published === 0; i++) {
        await server.client().completions.create({ model, prompt: prompt(i), max_tokens: 2, temperature: 0 });
        published = await server.metric("kiln:kv_events_published_batches_total");
        if (published === 0) await new Promise((r) => setTimeout(r, 100));
      }
      assert.ok(published > 0, "publishing resumed once NATS came up");
    } finally {
      assert.equal(await server.stop(), 0, server.log());
      await nats?.stop();
    }
  });
});
