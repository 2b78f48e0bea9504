// End to end: two real `kiln serve` workers on a tiny random Llama behind a real `kiln router`, spoken to with the
// official `openai` client. Greedy answers through the router equal the worker's own; a shared long prefix sticks to
// one worker (whose prefix cache then hits); errors keep OpenAI's shape; a killed worker is routed around; with
// every worker gone the router answers 503.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { assertErrorBody, postRaw, startKiln, type KilnServer } from "./kiln-process.js";
import { startRouter, type KilnRouter } from "./router-process.js";

let workers: KilnServer[];
let router: KilnRouter;
let client: OpenAI;

before(async () => {
  workers = await Promise.all([startKiln(["--max-model-len", "256"]), startKiln(["--max-model-len", "256"])]);
  router = await startRouter(workers.map((w) => w.url), ["--health-check-interval-secs", "0.5", "--health-failure-threshold", "1", "--health-success-threshold", "1"]);
  client = router.client();
});
after(async () => {
  assert.equal(await router.stop(), 0, router.log());
  await Promise.all(workers.map((w) => w.stop()));
});

const chatParams = (content: string) => ({
  model: workers[0]!.model, messages: [{ role: "user" as const, content }], max_tokens: 8, temperature: 0,
});
const kill = async (w: KilnServer): Promise<void> => {
  process.kill(w.pid, "SIGKILL");
  await w.exited;
};

describe("kiln router in front of two kiln serve workers (e2e)", () => {
  it("lists the workers' model and answers chat, completions and streams exactly as a worker does (greedy)", async () => {
    assert.deepEqual((await client.models.list()).data.map((m) => m.id), [workers[0]!.model]);
    const direct = workers[0]!.client();
    const chatDirect = await direct.chat.completions.create(chatParams("Tell me about the river."));
    const chatRouted = await client.chat.completions.create(chatParams("Tell me about the river."));
    assert.ok(chatDirect.choices[0]!.message.content!.length > 0);
    assert.equal(chatRouted.choices[0]!.message.content, chatDirect.choices[0]!.message.content);
    assert.deepEqual(chatRouted.usage, chatDirect.usage);

    const completion = { model: workers[0]!.model, prompt: "The old man walked to the", max_tokens: 8, temperature: 0 };
    const compDirect = await direct.completions.create(completion);
    const compRouted = await client.completions.create(completion);
    assert.equal(compRouted.choices[0]!.text, compDirect.choices[0]!.text);

    let streamed = "";
    let chunks = 0;
    for await (const chunk of await client.chat.completions.create({ ...chatParams("Tell me about the river."), stream: true })) {
      streamed += chunk.choices[0]?.delta.content ?? "";
      chunks++;
    }
    assert.equal(streamed, chatDirect.choices[0]!.message.content);
    assert.ok(chunks >= 3, `the stream came in ${chunks} chunks`);
  });

  it("requests sharing a long prefix land on one worker, whose prefix cache hits", async () => {
    const prefix = "Here is a long shared context about rivers, lakes and the sea that every question repeats. ".repeat(3);
    const before = await Promise.all(workers.map((w) => w.metric("vllm:request_success_total", 'finished_reason="length"')));
    const hitsBefore = await Promise.all(workers.map((w) => w.metric("vllm:prefix_cache_hits_total")));
    const chosen = new Set<string>();
    for (const q of ["Where does it start?", "How deep is it?", "Who lives there?", "What is it called?"]) {
      const { response } = await client.completions.create({ model: workers[0]!.model, prompt: prefix + q, max_tokens: 2, temperature: 0 }).withResponse();
      chosen.add(response.headers.get("x-kiln-worker")!);
    }
    assert.equal(chosen.size, 1, `routed to ${[...chosen].join(", ")}`);
    const target = workers.findIndex((w) => w.url === [...chosen][0]);
    assert.ok(target >= 0);
    const after = await Promise.all(workers.map((w) => w.metric("vllm:request_success_total", 'finished_reason="length"')));
    assert.equal(after[target]! - before[target]!, 4); // all four ran on the chosen worker ...
    assert.equal(after[1 - target]! - before[1 - target]!, 0); // ... and none on the other
    const hits = (await workers[target]!.metric("vllm:prefix_cache_hits_total")) - hitsBefore[target]!;
    assert.ok(hits > 0, "the later requests read the shared prefix from the worker's cache");
  });

  it("errors: a worker's own 4xx passes through as the worker wrote it; the router's own are OpenAI error objects", async () => {
    const body = { model: "no-such-model", prompt: "x", max_tokens: 1 };
    const direct = await postRaw(workers[0]!.url, "/v1/completions", body);
    const routed = await postRaw(router.url, "/v1/completions", body);
    assert.equal(direct.status, 404);
    assert.deepEqual(routed, direct);
    const tooLong = { model: workers[0]!.model, prompt: "x", max_tokens: 100000 };
    const tooLongDirect = await postRaw(workers[1]!.url, "/v1/completions", tooLong);
    assert.equal(tooLongDirect.status, 400);
    assert.deepEqual(await postRaw(router.url, "/v1/completions", tooLong), tooLongDirect);
    const bad = await postRaw(router.url, "/v1/chat/completions", '{"messages": [');
    assert.equal(bad.status, 400);
    assertErrorBody(bad.body, { type: "invalid_request_error", code: "invalid_json", param: null });
  });

  it("a killed worker is routed around; with both gone the router answers 503", async () => {
    const prompt = "A prompt for the failover test, long enough to be routed by its prefix.";
    const { response } = await client.completions.create({ model: workers[0]!.model, prompt, max_tokens: 2, temperature: 0 }).withResponse();
    const first = workers.find((w) => w.url === response.headers.get("x-kiln-worker"))!;
    const other = workers.find((w) => w !== first)!;
    await kill(first);
    for (let i = 0; i < 3; i++) {
      // the same prefix: the router would choose the dead worker, fails to connect, and retries on the other
      const r = await client.completions.create({ model: workers[0]!.model, prompt: `${prompt} ${i}`, max_tokens: 2, temperature: 0 }).withResponse();
      assert.equal(r.response.headers.get("x-kiln-worker"), other.url);
      assert.equal(r.data.choices.length, 1);
    }
    await kill(other);
    const err = await client.chat.completions.create(chatParams("anyone there?")).then(() => null, (e: unknown) => e);
    assert.ok(err instanceof OpenAI.APIError, String(err));
    assert.equal(err.status, 503);
    const raw = await postRaw(router.url, "/v1/completions", { model: workers[0]!.model, prompt: "x" });
    assert.equal(raw.status, 503);
    assertErrorBody(raw.body, { type: "service_unavailable_error", code: "no_healthy_worker" });
    const health = await fetch(`${router.url}/health`);
    assert.equal(health.status, 503);
    const metrics = await (await fetch(`${router.url}/metrics`)).text();
    assert.match(metrics, /vllm_router_active_workers 0/);
  });
});
