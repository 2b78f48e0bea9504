// Sleep mode on the real paged runner (a tiny random Llama from a checkpoint directory, step graphs captured, async
// scheduling): level 1 frees the KV cache's memory, level 2 the weights too (the device's live bytes drop by them),
// wake_up allocates and reads them again, and greedy tokens are the same as before the sleep, mid-request ones too;
// and `kiln serve --enable-sleep-mode` (the engine in its worker thread) over HTTP.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { AsyncLLM } from "../../src/engine/async-llm.js";
import { createServingSetupSync } from "../../src/engine/serving.js";
import type { RequestOutput } from "../../src/engine/types.js";
import { weightTensors } from "../../src/nn/quantized-linear.js";
import { tinyModelDir } from "../helpers/tiny-model.js";
import { assertErrorBody, postRaw, startKiln } from "../e2e/kiln-process.js";
import { metricValue } from "./helpers.js";

const PROMPT = Array.from({ length: 37 }, (_, i) => 5 + ((i * 37 + 11) % 200));
const GREEDY = { temperature: 0, maxTokens: 12, ignoreEos: true };

function start(loadFormat?: "dummy") {
  const s = createServingSetupSync({
    model: tinyModelDir("LlamaForCausalLM"), maxModelLen: 128, kvCacheMemory: 4 << 20, enableSleepMode: true, ...(loadFormat ? { loadFormat } : {}),
  });
  const llm = new AsyncLLM({ runner: s.runner, tokenizer: s.loaded.tokenizer, engineArgs: s.engineArgs });
  return { llm, runner: s.runner, backend: s.runner.model.device.backend };
}

async function greedy(llm: AsyncLLM, id: string): Promise<number[]> {
  let last: RequestOutput | undefined;
  for await (const out of llm.generate({ promptTokenIds: PROMPT }, GREEDY, { requestId: id })) last = out;
  return last!.outputs[0]!.tokenIds;
}

describe("sleep mode on the paged runner", () => {
  it("level 1 frees the KV cache (and its step graphs); wake_up gives the same greedy tokens", { timeout: 120_000 }, async () => {
    const { llm, runner, backend } = start();
    assert.notEqual(runner.graphs, null, "step graphs were captured");
    assert.equal(llm.engine.asyncScheduling, true);
    const want = await greedy(llm, "before");
    const kvBytes = runner.bytesPerBlock * runner.spec.numBlocks;
    assert.ok(kvBytes >= 2 << 20, `a KV cache of ${kvBytes} bytes`);
    const live = backend.liveBytes();
    await llm.sleep(1, "abort");
    const asleep = backend.liveBytes();
    assert.ok(live - asleep >= kvBytes, `freed ${live - asleep} bytes, the cache holds ${kvBytes}`);
    assert.equal(backend.reservedBytes!(), asleep, "nothing freed stays cached");
    assert.equal(runner.graphs, null);
    await llm.wakeUp(null);
    assert.ok(backend.liveBytes() - asleep >= kvBytes, "the cache is allocated again");
    assert.notEqual(runner.graphs, null, "and the step graphs captured again");
    assert.deepEqual(await greedy(llm, "after"), want);
  });

  it("a request kept across a level 1 sleep recomputes its K/V and ends with the tokens it would have had", { timeout: 120_000 }, async () => {
    const { llm } = start();
    const want = await greedy(llm, "alone");
    const stream = llm.generate({ promptTokenIds: PROMPT }, GREEDY, { requestId: "kept", delta: true })[Symbol.asyncIterator]();
    const tokens = [...(await stream.next()).value!.outputs[0]!.tokenIds];
    assert.ok(tokens.length > 0 && tokens.length < GREEDY.maxTokens, "it is mid-way");
    await llm.sleep(1, "keep");
    await llm.wakeUp(null);
    for (let r = await stream.next(); !r.done; r = await stream.next()) tokens.push(...r.value.outputs[0]!.tokenIds);
    assert.deepEqual(tokens, want);
  });

  it("level 2 frees the weights too and wake_up reads them from the checkpoint again", { timeout: 120_000 }, async () => {
    const { llm, runner, backend } = start();
    const want = await greedy(llm, "before");
    const oldModel = runner.model;
    const weightBytes = weightTensors(oldModel).reduce((n, t) => n + t.storage.buffer.byteLength, 0);
    const live = backend.liveBytes();
    await llm.sleep(2, "abort");
    assert.deepEqual(llm.stats().sleep, { isSleeping: true, level: 2, sleepingTags: ["weights", "kv_cache"] });
    const freed = live - backend.liveBytes();
    assert.ok(freed >= runner.bytesPerBlock * runner.spec.numBlocks + weightBytes * 0.9, `freed ${freed} bytes (weights ${weightBytes})`);
    // and none of it stays in the host allocator's cache of freed memory: the process gives it back
    assert.equal(backend.reservedBytes!(), backend.liveBytes(), "reserved = live bytes while asleep");
    await llm.wakeUp(["weights"]);
    assert.notEqual(runner.model, oldModel, "a model read anew");
    assert.equal(runner.graphs, null, "no capture before the KV cache is back");
    await llm.wakeUp(["kv_cache"]);
    assert.notEqual(runner.graphs, null);
    assert.deepEqual(await greedy(llm, "after"), want);
  });

  it("level 2 is refused for random (dummy) weights, which could not come back the same", { timeout: 120_000 }, async () => {
    const { llm } = start("dummy");
    await assert.rejects(llm.sleep(2, "abort"), { name: "EngineInputError", param: "level", message: /built in memory/ });
    assert.equal(llm.isSleeping(), false);
  });
});

describe("kiln serve --enable-sleep-mode (VLLM_SERVER_DEV_MODE=1, engine worker)", () => {
  it("levels 1 and 2 over HTTP: 503 while asleep, is_sleeping, the metric, the same greedy reply after wake_up", { timeout: 120_000 }, async () => {
    const server = await startKiln(["--max-model-len", "128", "--kv-cache-memory", "4MiB", "--enable-sleep-mode"], undefined, { VLLM_SERVER_DEV_MODE: "1" });
    try {
      const complete = () => postRaw(server.url, "/v1/completions", { model: server.model, prompt: "The jury said", max_tokens: 8, temperature: 0, ignore_eos: true });
      const sleeping = async () => ((await (await fetch(`${server.url}/is_sleeping`)).json()) as { is_sleeping: boolean }).is_sleeping;
      const state = async (s: string) => metricValue(await (await fetch(`${server.url}/metrics`)).text(), "vllm:engine_sleep_state", `sleep_state="${s}"`);
      const first = await complete();
      assert.equal(first.status, 200, JSON.stringify(first.body));
      const text = (first.body as { choices: { text: string }[] }).choices[0]!.text;
      for (const level of [1, 2]) {
        assert.equal((await fetch(`${server.url}/sleep?level=${level}`, { method: "POST" })).status, 200);
        assert.equal(await sleeping(), true);
        assert.equal(await state(level === 1 ? "weights_offloaded" : "discard_all"), 1);
        assert.equal(await state("awake"), 0);
        const refused = await complete();
        assert.equal(refused.status, 503);
        assertErrorBody(refused.body, { type: "service_unavailable_error", code: "engine_sleeping", message: /sleeping/ });
        assert.equal((await fetch(`${server.url}/wake_up`, { method: "POST" })).status, 200);
        assert.equal(await sleeping(), false);
        assert.equal(await state("awake"), 1);
        const again = await complete();
        assert.equal(again.status, 200, JSON.stringify(again.body));
        assert.equal((again.body as { choices: { text: string }[] }).choices[0]!.text, text, `level ${level}`);
      }
    } finally {
      assert.equal(await server.stop(), 0);
    }
  });
});
