// vLLM's sleep mode over the real AsyncLLM with the fake runner (whose KV store a level 1 sleep drops, so a request
// that read stale K/V after wake_up would fail or change its tokens): POST /sleep, /wake_up, GET /is_sleeping in dev
// mode, 503 while asleep, vllm:engine_sleep_state, the modes abort / wait / keep, and the refusals.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type { FastifyInstance } from "fastify";
import { AsyncLLM } from "../../src/engine/async-llm.js";
import { FakeModelRunner } from "../../src/engine/fake-model-runner.js";
import { EngineSleepingError } from "../../src/engine/sleep-mode.js";
import type { RequestOutput } from "../../src/engine/types.js";
import { createServer } from "../../src/server/index.js";
import { FakeTokenizer } from "./fake-engine.js";
import { metricValue, startTestServer } from "./helpers.js";

const PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 84, 19]; // 20 tokens: one full block and a bit
const GREEDY = { temperature: 0, maxTokens: 24, ignoreEos: true };

function engine(enableSleepMode = true): { llm: AsyncLLM; runner: FakeModelRunner } {
  const tokenizer = new FakeTokenizer();
  const runner = new FakeModelRunner(tokenizer.vocabSize);
  const llm = new AsyncLLM({ runner, tokenizer, engineArgs: { maxModelLen: 128, numGpuBlocks: 32, blockSize: 16, enableSleepMode } });
  return { llm, runner };
}

async function collect(stream: AsyncIterable<RequestOutput>): Promise<RequestOutput> {
  let last: RequestOutput | undefined;
  for await (const out of stream) last = out;
  return last!;
}

/** Greedy tokens of PROMPT on a fresh engine that never slept: what every engine below must reproduce. */
async function reference(): Promise<number[]> {
  return (await collect(engine().llm.generate({ promptTokenIds: PROMPT }, GREEDY, { requestId: "ref" }))).outputs[0]!.tokenIds;
}

describe("sleep mode in AsyncLLM", () => {
  let want: number[];
  before(async () => {
    want = await reference();
    assert.equal(want.length, 24);
  });

  it("level 1, mode abort: running requests end with finish reason abort, the KV is dropped; after wake_up the output is the same", async () => {
    const { llm, runner } = engine();
    const stream = llm.generate({ promptTokenIds: PROMPT }, { ...GREEDY, maxTokens: 100 }, { requestId: "long" })[Symbol.asyncIterator]();
    assert.equal((await stream.next()).done, false, "the request is running");
    await llm.sleep(1, "abort");
    let last: RequestOutput | undefined;
    for (let r = await stream.next(); !r.done; r = await stream.next()) last = r.value;
    assert.equal(last!.finished, true);
    assert.equal(last!.outputs[0]!.finishReason, "abort");
    assert.equal(llm.isSleeping(), true);
    assert.deepEqual(llm.stats().sleep, { isSleeping: true, level: 1, sleepingTags: ["weights", "kv_cache"] });
    assert.equal(runner.kvReleased, true);
    assert.equal(llm.engine.kv.pool.numCachedBlocks, 0, "the prefix cache went with the KV");
    assert.throws(() => llm.generate({ promptTokenIds: PROMPT }, GREEDY, { requestId: "asleep" }), EngineSleepingError);
    await llm.wakeUp(null);
    assert.equal(llm.isSleeping(), false);
    assert.equal(runner.kvReleased, false);
    const out = await collect(llm.generate({ promptTokenIds: PROMPT }, GREEDY, { requestId: "after" }));
    assert.deepEqual(out.outputs[0]!.tokenIds, want);
    assert.equal(out.numCachedTokens, 0, "nothing cached survived the sleep");
  });

  it("mode keep: a running request stops while asleep and finishes after wake_up with the tokens it would have had", async () => {
    const { llm } = engine();
    const stream = llm.generate({ promptTokenIds: PROMPT }, GREEDY, { requestId: "kept", delta: true })[Symbol.asyncIterator]();
    const first = await stream.next();
    const tokens = [...first.value!.outputs[0]!.tokenIds];
    await llm.sleep(1, "keep");
    const steps = llm.engine.numSteps;
    await new Promise((r) => setTimeout(r, 30));
    assert.equal(llm.engine.numSteps, steps, "no step runs while asleep");
    assert.equal(llm.stats().numWaiting, 1, "the request waits, its blocks freed (preempted)");
    assert.equal(llm.stats().numFreeBlocks, llm.stats().numTotalBlocks);
    await llm.wakeUp(["kv_cache"]);
    assert.equal(llm.isSleeping(), true, "weights still asleep (as vLLM's tags): nothing runs yet");
    await llm.wakeUp(["weights"]);
    for (let r = await stream.next(); !r.done; r = await stream.next()) tokens.push(...r.value.outputs[0]!.tokenIds);
    assert.deepEqual(tokens, want, "recomputed from its tokens, not from stale K/V (the fake runner's store was dropped)");
  });

  it("mode wait: new requests are refused at once, the running one finishes normally, then the engine sleeps", async () => {
    const { llm } = engine();
    const running = collect(llm.generate({ promptTokenIds: PROMPT }, GREEDY, { requestId: "w" }));
    await new Promise((r) => setImmediate(r));
    const sleeping = llm.sleep(1, "wait");
    assert.throws(() => llm.generate({ promptTokenIds: PROMPT }, GREEDY, { requestId: "late" }), /falling asleep/);
    const out = await running;
    assert.equal(out.outputs[0]!.finishReason, "length");
    assert.deepEqual(out.outputs[0]!.tokenIds, want);
    await sleeping;
    assert.equal(llm.isSleeping(), true);
  });

  it("level 0 pauses scheduling only; a second sleep changes nothing; tags not asleep are ignored", async () => {
    const { llm, runner } = engine();
    await llm.sleep(0, "abort");
    assert.deepEqual(llm.stats().sleep, { isSleeping: true, level: 0, sleepingTags: [] });
    assert.equal(runner.kvReleased, false);
    await llm.sleep(2, "abort"); // already asleep: ignored, as vLLM's executor does
    assert.equal(llm.stats().sleep!.level, 0);
    await llm.wakeUp(["scheduling"]);
    assert.equal(llm.isSleeping(), false);
    await llm.wakeUp(null); // awake: nothing to do
    assert.deepEqual((await collect(llm.generate({ promptTokenIds: PROMPT }, GREEDY, { requestId: "z" }))).outputs[0]!.tokenIds, want);
  });

  it("refusals: no sleep mode; level 2 on a runner that cannot read its weights again (nothing changes)", async () => {
    const off = engine(false).llm;
    await assert.rejects(off.sleep(1, "abort"), { name: "EngineInputError", param: "enable_sleep_mode" });
    await assert.rejects(off.wakeUp(null), { name: "EngineInputError", param: "enable_sleep_mode" });
    assert.equal(off.stats().sleep, undefined);
    const { llm } = engine();
    const stream = llm.generate({ promptTokenIds: PROMPT }, GREEDY, { requestId: "x" });
    await assert.rejects(llm.sleep(2, "abort"), { name: "EngineInputError", param: "level", message: /cannot read them again: sleep at level 1/ });
    assert.equal(llm.isSleeping(), false);
    assert.deepEqual((await collect(stream)).outputs[0]!.tokenIds, want, "the running request was not aborted");
  });
});

describe("sleep mode over HTTP (VLLM_SERVER_DEV_MODE=1, --enable-sleep-mode)", () => {
  let app: FastifyInstance;
  let llm: AsyncLLM;
  let url: string;
  before(async () => {
    const tokenizer = new FakeTokenizer();
    llm = engine().llm;
    app = createServer({ engine: llm, tokenizer, servedModelNames: ["real"], maxModelLen: 128, version: "t", devMode: true });
    await app.listen({ port: 0, host: "127.0.0.1" });
    url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  });
  after(async () => {
    const closing = app.close();
    app.server.closeAllConnections();
    await closing;
  });

  const post = (path: string) => fetch(`${url}${path}`, { method: "POST" });
  const isSleeping = async () => ((await (await fetch(`${url}/is_sleeping`)).json()) as { is_sleeping: boolean }).is_sleeping;
  const complete = () =>
    fetch(`${url}/v1/completions`, {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "real", prompt: "sleep well", max_tokens: 6, temperature: 0, ignore_eos: true }),
    });
  const sleepState = async () => {
    const text = await (await fetch(`${url}/metrics`)).text();
    return ["awake", "weights_offloaded", "discard_all"].map((s) => metricValue(text, "vllm:engine_sleep_state", `sleep_state="${s}"`));
  };

  it("sleep, 503 while asleep (tokenize still served), wake_up, the same greedy reply", async () => {
    assert.equal(await isSleeping(), false);
    assert.deepEqual(await sleepState(), [1, 0, 0]);
    const before = (await (await complete()).json()) as { choices: { text: string }[] };
    const res = await post("/sleep");
    assert.equal(res.status, 200);
    assert.equal(await res.text(), "", "vLLM's empty 200");
    assert.equal(await isSleeping(), true);
    assert.deepEqual(await sleepState(), [0, 1, 0], "level 1 (the default): weights_offloaded");
    const refused = await complete();
    assert.equal(refused.status, 503);
    assert.deepEqual(await refused.json(), {
      error: { message: "The engine is sleeping (wake it with wakeUp(), or POST /wake_up on a server); it serves no requests until then", type: "service_unavailable_error", param: null, code: "engine_sleeping" },
    });
    const chat = await fetch(`${url}/v1/chat/completions`, {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "real", messages: [{ role: "user", content: "hi" }] }),
    });
    assert.equal(chat.status, 503);
    const tok = await fetch(`${url}/tokenize`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: "hi" }) });
    assert.equal(tok.status, 200, "endpoints without the model keep working");
    const woke = await post("/wake_up?tags=weights&tags=kv_cache");
    assert.equal(woke.status, 200);
    assert.equal(await isSleeping(), false);
    assert.deepEqual(await sleepState(), [1, 0, 0]);
    const again = (await (await complete()).json()) as { choices: { text: string }[] };
    assert.equal(again.choices[0]!.text, before.choices[0]!.text);
  });

  it("bad level, mode or tag: a 400 naming it; level 2 this engine cannot wake from: a 400; GET /sleep: 405", async () => {
    for (const [path, param] of [["/sleep?level=3", "level"], ["/sleep?level=one", "level"], ["/sleep?mode=later", "mode"], ["/wake_up?tags=lora", "tags"], ["/sleep?level=2", "level"]]) {
      const res = await post(path);
      assert.equal(res.status, 400, path);
      const body = (await res.json()) as { error: { param: string; type: string } };
      assert.equal(body.error.param, param, path);
      assert.equal(body.error.type, "invalid_request_error");
    }
    assert.equal(await isSleeping(), false, "a refused sleep leaves the engine awake");
    assert.equal((await fetch(`${url}/sleep`)).status, 405);
  });
});

describe("sleep mode: not enabled, or not in dev mode", () => {
  it("without --enable-sleep-mode POST /sleep and /wake_up are a 400 naming the flag, is_sleeping is false, no sleep metric", async () => {
    const tokenizer = new FakeTokenizer();
    const app = createServer({ engine: engine(false).llm, tokenizer, servedModelNames: ["real"], maxModelLen: 128, version: "t", devMode: true });
    try {
      for (const path of ["/sleep", "/wake_up"]) {
        const res = await app.inject({ method: "POST", url: path });
        assert.equal(res.statusCode, 400);
        const body = res.json<{ error: { param: string; message: string } }>();
        assert.equal(body.error.param, "enable_sleep_mode");
        assert.match(body.error.message, /--enable-sleep-mode/);
      }
      assert.deepEqual((await app.inject({ url: "/is_sleeping" })).json(), { is_sleeping: false });
      assert.doesNotMatch((await app.inject({ url: "/metrics" })).body, /engine_sleep_state/);
    } finally {
      await app.close();
    }
  });

  it("without dev mode the routes 404; an engine without sleep mode answers 501", async () => {
    const s = await startTestServer();
    try {
      for (const [method, path] of [["POST", "/sleep"], ["POST", "/wake_up"], ["GET", "/is_sleeping"]] as const)
        assert.equal((await fetch(`${s.url}${path}`, { method })).status, 404, path);
    } finally {
      await s.close();
    }
    const d = await startTestServer({ devMode: true });
    try {
      const res = await fetch(`${d.url}/sleep`, { method: "POST" });
      assert.equal(res.status, 501);
      assert.deepEqual(await (await fetch(`${d.url}/is_sleeping`)).json(), { is_sleeping: false });
    } finally {
      await d.close();
    }
  });
});
