// precise_prefix for image chats and Anthropic's /v1/messages: a real Kiln server over a real engine (the random tiny
// Gemma 3 image-text model, KV-cache events on) serves requests, and the block hashes its engine reports (BlockStored)
// are what the router must match, computed by the worker path alone. The router's RequestTokenizer, loaded from the
// same model directory, must send the same image chat and the same Messages request to the worker holding them, a
// chat whose image differs by load, and a chat it cannot process (a remote image, no processor config) by load.
// Last, the router over HTTP with the events coming over a real nats-server.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { connect } from "nats";
import { PNG } from "pngjs";
import { AsyncLLM } from "../../src/engine/async-llm.js";
import type { KvCacheEvent } from "../../src/engine/kv-events.js";
import { createServingSetupSync } from "../../src/engine/serving.js";
import { withChatTemplateDefaults } from "../../src/models/chat-content-format.js";
import { gemma3ImageInputSpec } from "../../src/models/gemma3-vision-weights.js";
import { KvBlockIndex } from "../../src/router/kv-block-index.js";
import { createRouter, type Router } from "../../src/router/index.js";
import type { WorkerView } from "../../src/router/policies.js";
import { PrecisePrefixPolicy, prefixHits } from "../../src/router/precise-prefix-policy.js";
import { RequestTokenizer } from "../../src/router/request-tokens.js";
import { createServer } from "../../src/server/index.js";
import { dataUrl, png } from "../helpers/image-fixture.js";
import { natsSkipReason, startNatsServer } from "../helpers/nats-server.js";
import { tinyGemma3VisionDir } from "../helpers/tiny-model.js";
import { cleanedUp, startFakeWorker } from "./fake-worker.js";

const MODEL = "kiln-test";
const A = "http://127.0.0.1:8001";
const B = "http://127.0.0.1:8002";
const w = (url: string, load: number): WorkerView => ({ url, load, kvCacheUsage: null });
const [imgA, imgB, imgC] = [png(1), png(2), png(3)];

const chat = (image: string) => ({
  model: MODEL, max_tokens: 2, temperature: 0,
  messages: [{ role: "user", content: [{ type: "text", text: "Describe this picture in a few words, please." }, { type: "image_url", image_url: { url: image } }] }],
});
const messages = (image: Buffer) => ({
  model: MODEL, max_tokens: 2, temperature: 0,
  system: "You describe pictures for a museum catalogue, briefly.",
  messages: [{ role: "user", content: [{ type: "text", text: "What is shown here?" }, { type: "image", source: { type: "base64", media_type: "image/png", data: image.toString("base64") } }] }],
});
// 60x20 with pan-and-scan on (the request's mm_processor_kwargs): the image and 3 crops, each keyed by its own hash
const panAndScan = { ...chat(dataUrl(png(5, 60, 20))), mm_processor_kwargs: { do_pan_and_scan: true, pan_and_scan_min_crop_size: 8 } };
const textMessages = {
  model: MODEL, max_tokens: 2, temperature: 0,
  system: [{ type: "text", text: "You answer questions about rivers in one sentence." }],
  messages: [{ role: "user", content: "Which river flows through Vienna?" }, { role: "assistant", content: "The Danube." }, { role: "user", content: [{ type: "text", text: "And Paris?" }] }],
};

describe("precise_prefix for image chats and Messages requests", { timeout: 120_000 }, () => {
  const dir = tinyGemma3VisionDir();
  const setup = createServingSetupSync({ model: dir, maxModelLen: 128, kvCacheMemory: 2 << 20, blockSize: 4 });
  const llm = new AsyncLLM({ runner: setup.runner, tokenizer: setup.loaded.tokenizer, engineArgs: { ...setup.engineArgs, enableKvCacheEvents: true } });
  const app = createServer({
    engine: llm, servedModelNames: [MODEL], maxModelLen: 128, version: "0.1.0-test",
    tokenizer: withChatTemplateDefaults(setup.loaded.tokenizer, { contentFormat: "auto", kwargs: null }),
    imageInput: gemma3ImageInputSpec(dir, setup.loaded.tokenizer), imageLimit: 2,
  });
  let worker = "";
  /** What the worker's engine stored serving `body` on `route`: its own KV-cache events. */
  const served = async (route: string, body: unknown): Promise<KvCacheEvent[]> => {
    await llm.resetPrefixCache(); // each request stores all its blocks, as on a worker that has served nothing else
    llm.engine.takeKvEvents();
    const res = await fetch(`${worker}${route}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    assert.equal(res.status, 200, await res.text());
    const events = llm.engine.takeKvEvents();
    assert.ok(events.some((e) => e.type === "BlockStored"), "the worker stored blocks");
    return events;
  };
  const events = new Map<string, KvCacheEvent[]>();

  before(async () => {
    await app.listen({ port: 0, host: "127.0.0.1" });
    worker = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
    events.set("chatA", await served("/v1/chat/completions", chat(dataUrl(imgA))));
    events.set("chatC", await served("/v1/chat/completions", chat(dataUrl(imgC))));
    events.set("messagesA", await served("/v1/messages", messages(imgA)));
    events.set("textMessages", await served("/v1/messages", textMessages));
    events.set("panAndScan", await served("/v1/chat/completions", panAndScan));
  });
  after(async () => {
    const c = app.close();
    app.server.closeAllConnections();
    await c;
  });

  /** B holds what the worker stored for image A's chat and the Messages requests; A what it stored for image C's chat. */
  const index = (): KvBlockIndex => {
    const ix = new KvBlockIndex();
    ix.applyBatch({ ts: 0, events: ["chatA", "messagesA", "textMessages", "panAndScan"].flatMap((k) => events.get(k)!), data_parallel_rank: null, engine_id: B, seq: 0 });
    ix.applyBatch({ ts: 0, events: events.get("chatC")!, data_parallel_rank: null, engine_id: A, seq: 0 });
    return ix;
  };

  it("an image chat goes to the worker holding its blocks, however loaded; another image by load", () => {
    const rt = RequestTokenizer.fromDir(dir);
    const ix = index();
    const policy = new PrecisePrefixPolicy(ix);
    const route = "/v1/chat/completions";
    // A idle, B busy: only B's events can send the request there
    assert.deepEqual(policy.select([w(A, 0), w(B, 3)], "", rt.blockHashes(route, chat(dataUrl(imgA)))), { url: B, reason: "cache_hit", matchRate: 1 });
    // image B: both hold the text blocks before the image, neither its own: a tie, the least loaded
    const other = rt.blockHashes(route, chat(dataUrl(imgB)));
    const hits = prefixHits(ix, [w(A, 0), w(B, 0)], other);
    assert.equal(hits[0]!.hits, hits[1]!.hits);
    assert.ok(hits[0]!.hits > 0 && hits[0]!.hits < hits[0]!.blocks, JSON.stringify(hits));
    assert.equal(policy.select([w(A, 0), w(B, 3)], "", other).url, A);
    assert.equal(policy.select([w(A, 3), w(B, 0)], "", other).url, B);
    // the conversation's next turn sends the image again: the first turn's blocks lead it
    const first = chat(dataUrl(imgA));
    const turn2 = { ...first, messages: [...first.messages, { role: "assistant", content: "Noise." }, { role: "user", content: "Which colours?" }] };
    const next = policy.select([w(A, 0), w(B, 3)], "", rt.blockHashes(route, turn2));
    assert.ok(next.url === B && next.reason === "cache_hit" && next.matchRate < 1, JSON.stringify(next));
    // pan-and-scan: the crops' blocks too; without the kwargs the same image is another prompt
    assert.deepEqual(policy.select([w(A, 0), w(B, 3)], "", rt.blockHashes(route, panAndScan)), { url: B, reason: "cache_hit", matchRate: 1 });
    const { mm_processor_kwargs: _, ...whole } = panAndScan;
    assert.ok(policy.select([w(A, 0), w(B, 3)], "", rt.blockHashes(route, whole)).matchRate < 1);
    // image A's pixels in another PNG file (uncompressed): keyed by the processed image, not the file
    const reencoded = PNG.sync.write(PNG.sync.read(imgA), { deflateLevel: 0 });
    assert.notDeepEqual(reencoded, imgA);
    assert.equal(policy.select([w(A, 0), w(B, 3)], "", rt.blockHashes(route, chat(dataUrl(reencoded)))).url, B);
  });

  it("/v1/messages goes by the blocks the worker hashes for it, with images and without", () => {
    const rt = RequestTokenizer.fromDir(dir);
    const policy = new PrecisePrefixPolicy(index());
    for (const body of [messages(imgA), textMessages]) {
      assert.deepEqual(policy.select([w(A, 0), w(B, 3)], "", rt.blockHashes("/v1/messages", body)), { url: B, reason: "cache_hit", matchRate: 1 });
    }
    // image B: B holds the system prompt's and the text's blocks only
    const other = policy.select([w(A, 0), w(B, 3)], "", rt.blockHashes("/v1/messages", messages(imgB)));
    assert.ok(other.url === B && other.matchRate > 0 && other.matchRate < 1, JSON.stringify(other));
    // counting computes no K/V: no prompt
    assert.deepEqual(rt.blockHashes("/v1/messages/count_tokens", textMessages)(4), []);
  });

  it("no prompt, so by load: a remote image, a router without the processor's config, a request the worker refuses", () => {
    const rt = RequestTokenizer.fromDir(dir);
    const route = "/v1/chat/completions";
    assert.deepEqual(rt.blockHashes(route, chat("http://127.0.0.1:9/a.png"))(4), []);
    assert.deepEqual(new RequestTokenizer(rt.tokenizer).blockHashes(route, chat(dataUrl(imgA)))(4), []);
    assert.deepEqual(rt.blockHashes(route, chat("data:image/png;base64,AAAA"))(4), [], "not an image");
    assert.deepEqual(rt.blockHashes("/v1/messages", { messages: [{ role: "tool", content: "x" }] })(4), []);
  });

  describe("through the router, events over NATS", { skip: natsSkipReason }, () => {
    const { routers, workers } = cleanedUp<Router>();

    it("sends the image chat and the Messages request to the worker whose events hold them", async () => {
      const nats = await startNatsServer();
      const pub = await connect({ servers: nats.url });
      try {
        const [fa, fb] = [await startFakeWorker("a"), await startFakeWorker("b")];
        workers.push(fa, fb);
        const router = createRouter(
          { workerUrls: [fa.url, fb.url], port: 0, healthCheckIntervalMs: 60_000, logLevel: "critical", policy: "precise_prefix", kvEventsEndpoint: nats.url, kvEventsTopic: "kv-img", tokenizer: dir },
          { log: () => {} },
        );
        routers.push(router);
        const url = await router.listen();
        const publish = (engine: string, evs: KvCacheEvent[]) =>
          pub.publish("kv-img", new TextEncoder().encode(JSON.stringify({ ts: 0, events: evs, data_parallel_rank: null, engine_id: engine, seq: 0 })));
        const indexed = async (): Promise<number[]> => ((await (await fetch(`${url}/workers`)).json()) as { workers: { kv_blocks: number }[] }).workers.map((x) => x.kv_blocks);
        for (let i = 0; i < 100 && (await indexed()).includes(0); i++) {
          publish(fb.url, [...events.get("chatA")!, ...events.get("messagesA")!]);
          publish(fa.url, events.get("chatC")!);
          await pub.flush();
          await new Promise((r) => setTimeout(r, 50));
        }
        assert.ok(!(await indexed()).includes(0), "the router indexed both workers' blocks");
        const post = async (route: string, body: unknown) =>
          (await fetch(`${url}${route}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) })).headers.get("x-worker-name");
        // without the workers' blocks both are idle and the first listed (a) takes every request
        assert.equal(await post("/v1/chat/completions", chat(dataUrl(imgA))), "b");
        assert.equal(await post("/v1/messages", messages(imgA)), "b");
        assert.equal(await post("/v1/chat/completions", chat(dataUrl(imgB))), "a", "a tie on the text blocks: the first listed");
      } finally {
        await pub.close();
        await nats.stop();
      }
    });
  });
});
