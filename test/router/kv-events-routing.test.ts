// The router's side of KV-cache events: the KV-block index (hand-worked stores, removals, clears, longest prefixes),
// precise_prefix and weighted's precise scorer over it, request tokenization and hashing equal to the engine's, and
// the subscriber fed by a real nats-server.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { connect, type NatsConnection } from "nats";
import { chainBlockHashes } from "../../src/engine/kv-cache-manager.js";
import type { KvCacheEvent, KvEventBatch } from "../../src/engine/kv-events.js";
import { Tokenizer } from "../../src/models/tokenizer.js";
import { KvBlockIndex } from "../../src/router/kv-block-index.js";
import { KvEventsSubscriber, parseKvEventBatch, workerOfEngine } from "../../src/router/kv-events-subscriber.js";
import { createPolicy, type WorkerView } from "../../src/router/policies.js";
import { PrecisePrefixPolicy } from "../../src/router/precise-prefix-policy.js";
import { RequestTokenizer } from "../../src/router/request-tokens.js";
import { WeightedPolicy } from "../../src/router/weighted-policy.js";
import { natsSkipReason, startNatsServer, type NatsServer } from "../helpers/nats-server.js";
import { testTokenizerDir } from "../helpers/tiny-model.js";

const A = "http://127.0.0.1:8001";
const B = "http://127.0.0.1:8002";
const C = "http://127.0.0.1:8003";
const stored = (hashes: string[], blockSize = 4): KvCacheEvent => ({
  type: "BlockStored", block_hashes: hashes, parent_block_hash: null, token_ids: [], block_size: blockSize, lora_id: null, medium: "GPU",
});
const removed = (hashes: string[]): KvCacheEvent => ({ type: "BlockRemoved", block_hashes: hashes, medium: "GPU" });
const batch = (engine: string, seq: number, events: KvCacheEvent[]): KvEventBatch => ({ ts: 0, events, data_parallel_rank: null, engine_id: engine, seq });
const w = (url: string, load = 0): WorkerView => ({ url, load, kvCacheUsage: null });
const fixed = (hashes: string[]) => () => hashes;

describe("KV-block index", () => {
  it("stores, removes and clears per worker; the longest held prefix counts only unbroken leading blocks", () => {
    const ix = new KvBlockIndex();
    ix.applyBatch(batch(A, 0, [stored(["h0", "h1", "h2"])]));
    ix.applyBatch(batch(B, 0, [stored(["h0", "h2"])])); // B lacks h1: only its first block leads
    assert.deepEqual([...ix.longestPrefix(["h0", "h1", "h2", "h3"], [A, B, C])], [[A, 3], [B, 1], [C, 0]]);
    assert.deepEqual([...ix.holdersOf("h0")], [A, B]);
    ix.applyBatch(batch(A, 1, [removed(["h1"])]));
    assert.deepEqual([...ix.longestPrefix(["h0", "h1", "h2"], [A, B])], [[A, 1], [B, 1]]);
    assert.equal(ix.size(A), 2);
    ix.applyBatch(batch(B, 1, [{ type: "AllBlocksCleared" }, stored(["x0"])]));
    assert.equal(ix.size(B), 1);
    assert.deepEqual([...ix.holdersOf("h0")], [A]);
    assert.equal(ix.stats.gaps, 0);
    ix.applyBatch(batch(A, 5, [])); // 2, 3, 4 never arrived
    assert.equal(ix.stats.gaps, 1);
    // B numbers from 0 again: a new engine process, whose cache starts empty
    ix.applyBatch(batch(B, 0, [stored(["y0"])]));
    assert.deepEqual([ix.stats.restarts, ix.size(B), [...ix.holdersOf("x0")].length], [1, 1, 0]);
    ix.removeWorker(A);
    assert.equal(ix.size(A), 0);
    assert.deepEqual([...ix.holdersOf("h2")], []);
    assert.deepEqual([...ix.blockSizes()], [4]);
  });

  it("a removal for a hash the worker never reported, or another worker's, changes nothing", () => {
    const ix = new KvBlockIndex();
    ix.applyBatch(batch(A, 0, [stored(["h0"])]));
    ix.applyBatch(batch(B, 0, [removed(["h0", "zz"])]));
    assert.deepEqual([...ix.holdersOf("h0")], [A]);
  });
});

describe("precise_prefix", () => {
  const ix = new KvBlockIndex();
  ix.applyBatch(batch(A, 0, [stored(["h0", "h1"])]));
  ix.applyBatch(batch(B, 0, [stored(["h0", "h1", "h2"])]));
  const p = new PrecisePrefixPolicy(ix);

  it("the most held leading blocks win, whatever the load; ties go to the less loaded", () => {
    assert.deepEqual(p.select([w(A), w(B, 5)], "", fixed(["h0", "h1", "h2", "h3"])), { url: B, reason: "cache_hit", matchRate: 0.75 });
    assert.deepEqual(p.select([w(A, 3), w(B, 1)], "", fixed(["h0", "h1", "q"])), { url: B, reason: "cache_hit", matchRate: 2 / 3 });
    assert.equal(p.select([w(A, 0), w(B, 1)], "", fixed(["h0", "h1", "q"])).url, A);
  });

  it("falls back to the least loaded when no candidate holds the first block, or the prompt is unknown", () => {
    assert.deepEqual(p.select([w(A, 2), w(B, 1)], "", fixed(["q", "h1"])), { url: B, reason: "cache_miss", matchRate: 0 });
    assert.deepEqual(p.select([w(A, 0), w(B, 1)], "text"), { url: A, reason: "cache_miss", matchRate: 0 });
    // B, the holder, is not a candidate (down, tried, or full): A's own blocks count
    assert.deepEqual(p.select([w(A, 9), w(C, 0)], "", fixed(["h0", "h1", "h2"])), { url: A, reason: "cache_hit", matchRate: 2 / 3 });
  });

  it("hashes the prompt once per block size the workers reported", () => {
    const ix2 = new KvBlockIndex();
    ix2.applyBatch(batch(A, 0, [stored(["a8"], 8)]));
    const asked: number[] = [];
    const p2 = new PrecisePrefixPolicy(ix2);
    const d = p2.select([w(A), w(B)], "", (bs) => (asked.push(bs), bs === 8 ? ["a8"] : ["b16"]));
    assert.equal(d.url, A);
    assert.deepEqual(asked, [8, 16]); // B has not reported: the engine's default, 16
  });

  it("createPolicy needs the index; weighted adds the precise scorer with its weight", () => {
    const opts = { cacheThreshold: 0.5, balanceAbsThreshold: 2, balanceRelThreshold: 1.5, maxTreeSize: 1000, prefixCacheScorerWeight: 3, queueScorerWeight: 2, kvCacheUtilizationScorerWeight: 2 };
    assert.throws(() => createPolicy("precise_prefix", opts), /needs the KV-block index/);
    assert.equal(createPolicy("precise_prefix", { ...opts, kvBlockIndex: ix }).name, "precise_prefix");
    const weighted = new WeightedPolicy({ ...opts, precisePrefixCacheScorerWeight: 4 }, ix);
    // A: precise 2/4, queue 1 (load 0), kv 1 -> 4*0.5 + 2 + 2 = 6; B: precise 3/4, queue 0 (load 2), kv 1 -> 3 + 0 + 2 = 5
    const scores = weighted.score([w(A, 0), w(B, 2)], "", fixed(["h0", "h1", "h2", "h3"]));
    assert.deepEqual(scores.map((s) => [s.precise, s.total]), [[0.5, 6], [0.75, 5]]);
    // weight 0 (the default) leaves the index out
    const plain = new WeightedPolicy(opts, ix);
    assert.deepEqual(plain.score([w(A, 0), w(B, 2)], "", fixed(["h0"])).map((s) => s.precise), [0, 0]);
  });
});

describe("request tokenization and hashing", () => {
  const dir = testTokenizerDir();
  const tok = Tokenizer.fromDir(dir);
  const rt = RequestTokenizer.fromDir(dir);

  it("a completion's prompt is encoded as the server does, with its special tokens; token ids pass as they are", () => {
    const text = "The old man walked to the river and sat down by the water.";
    assert.deepEqual(rt.promptTokenIds("/v1/completions", { prompt: text }), tok.encode(text, { addSpecialTokens: true }));
    assert.deepEqual(rt.promptTokenIds("/v1/completions", { prompt: text, add_special_tokens: false }), tok.encode(text, { addSpecialTokens: false }));
    assert.deepEqual(rt.promptTokenIds("/v1/completions", { prompt: [5, 6, 7] }), [5, 6, 7]);
    assert.equal(rt.promptTokenIds("/v1/completions", { prompt: ["a", "b"] }), null);
    // a batch of one is that prompt; nested deeper it is no prompt (the worker's 400), not a stack overflow
    assert.deepEqual(rt.promptTokenIds("/v1/completions", { prompt: [[5, 6, 7]] }), [5, 6, 7]);
    assert.deepEqual(rt.promptTokenIds("/v1/completions", { prompt: [text] }), tok.encode(text, { addSpecialTokens: true }));
    assert.deepEqual(rt.promptTokenIds("/v1/completions", { prompt: [5] }), [5]);
    const deep = JSON.parse(`${"[".repeat(20_000)}${"]".repeat(20_000)}`) as unknown;
    assert.equal(rt.promptTokenIds("/v1/completions", { prompt: deep }), null);
    assert.equal(rt.promptTokenIds("/v1/completions", { prompt: [[[5, 6]]] }), null);
    assert.equal(rt.promptTokenIds("/v1/embeddings", { input: text }), null);
  });

  it("a chat request goes through the chat template, text parts joined by newlines, no special tokens added", () => {
    const messages = [{ role: "system", content: "Be brief." }, { role: "user", content: [{ type: "text", text: "Hi" }, { type: "text", text: "there" }] }];
    const text = tok.applyChatTemplate([{ role: "system", content: "Be brief." }, { role: "user", content: "Hi\nthere" }], { addGenerationPrompt: true });
    assert.deepEqual(rt.promptTokenIds("/v1/chat/completions", { messages }), tok.encode(text, { addSpecialTokens: false }));
    assert.equal(rt.promptTokenIds("/v1/chat/completions", { messages: [{ role: "user", content: [{ type: "image_url", image_url: {} }] }] }), null);
    // the workers' --chat-template (given to the router too), and a request's own chat_template, as the server uses them
    const plain = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}";
    const own = new RequestTokenizer(tok, { chatTemplate: plain });
    const simple = [{ role: "user", content: "Hi there" }];
    assert.deepEqual(own.promptTokenIds("/v1/chat/completions", { messages: simple }), tok.encode("[user] Hi there\n", { addSpecialTokens: false }));
    assert.deepEqual(rt.promptTokenIds("/v1/chat/completions", { messages: simple, chat_template: plain }), tok.encode("[user] Hi there\n", { addSpecialTokens: false }));
  });

  it("block hashes are the engine's chain hashes, salted as the engine salts them; [] when the prompt is unknown", () => {
    const ids = Array.from({ length: 40 }, (_, i) => 10 + i);
    assert.deepEqual(rt.blockHashes("/v1/completions", { prompt: ids })(16), chainBlockHashes(ids, 16));
    const salted = rt.blockHashes("/v1/completions", { prompt: ids, cache_salt: "s" })(16);
    assert.deepEqual(salted, chainBlockHashes(ids, 16, { lora: null, cacheSalt: "s" }));
    assert.notEqual(salted[1], chainBlockHashes(ids, 16)[1], "the salt of the first block carries down the chain");
    assert.deepEqual(rt.blockHashes("/score", { text_1: "a" })(16), []);
  });
});

describe("batches off the wire", () => {
  it("parses batches, refuses what is not one, names workers by URL", () => {
    const b = batch("http://127.0.0.1:8001/", 3, [stored(["h0"])]);
    assert.deepEqual(parseKvEventBatch(JSON.stringify(b)), b);
    assert.equal(parseKvEventBatch("not json"), null);
    assert.equal(parseKvEventBatch(JSON.stringify({ engine_id: "x", events: [{ type: "BlockStored", block_hashes: [1] }] })), null);
    assert.equal(workerOfEngine("http://127.0.0.1:8001/"), A);
    assert.equal(workerOfEngine("pod-7"), "pod-7");
  });
});

describe("subscriber over NATS", { skip: natsSkipReason, timeout: 30_000 }, () => {
  let server: NatsServer;
  let pub: NatsConnection;
  before(async () => {
    server = await startNatsServer();
    pub = await connect({ servers: server.url });
  });
  after(async () => {
    await pub?.close();
    await server?.stop();
  });

  it("applies each worker's batches to the index under its URL; malformed messages are counted and skipped", async () => {
    const ix = new KvBlockIndex();
    const logs: string[] = [];
    const sub = new KvEventsSubscriber(server.url, "kv-r", ix, (_l, line) => logs.push(line));
    await sub.ready();
    const send = (x: unknown): void => pub.publish("kv-r", new TextEncoder().encode(typeof x === "string" ? x : JSON.stringify(x)));
    send(batch(`${A}/`, 0, [stored(["h0", "h1"])]));
    send("garbage");
    send(batch(B, 0, [stored(["h0"])]));
    send(batch(`${A}/`, 1, [removed(["h1"])]));
    await pub.flush();
    for (let i = 0; i < 100 && ix.stats.batches < 3; i++) await new Promise((r) => setTimeout(r, 20));
    await sub.close();
    assert.equal(ix.stats.batches, 3);
    assert.deepEqual([...ix.longestPrefix(["h0", "h1"], [A, B])], [[A, 1], [B, 1]]);
    assert.equal(sub.malformed, 1);
    assert.ok(logs.some((l) => /subscribed to kv-r/.test(l)), logs.join("\n"));
  });
});
