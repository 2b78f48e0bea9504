// `kiln bench latency` and `kiln bench throughput` (vLLM's bench latency / throughput) through the CLI over a fake
// engine with a fixed pause per token: every request generates --output-len tokens, the JSON carries vLLM's keys, the
// latency of a batch is at least its tokens' pauses, and percentiles interpolate as numpy's default.
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import type { EngineFactory } from "../../src/cli/engine-factory.js";
import { main } from "../../src/cli/main.js";
import { percentile, runBenchLatency, runBenchThroughput } from "../../src/cli/bench-offline.js";
import type { ServeArgs } from "../../src/cli/serve-args.js";
import { Writable } from "node:stream";
import { FakeEngine } from "../server/fake-engine.js";

function fakeFactory(seen: { prompts: number[][] }): EngineFactory {
  return async (args) => {
    const engine = new FakeEngine({ stepDelayMs: 2, maxModelLen: args.maxModelLen ?? 256, eosProbability: 1 });
    const generate = engine.generate.bind(engine);
    engine.generate = (prompt, params, options) => {
      seen.prompts.push(prompt.promptTokenIds);
      return generate(prompt, params, options);
    };
    return { engine, tokenizer: engine.tokenizer, maxModelLen: engine.maxModelLen, modelName: "fake", close: async () => {} };
  };
}

// (the CLI's lines go to stdout among node:test's own output; they are checked through the runners' `out` stream)
async function run(argv: string[], factory: EngineFactory): Promise<{ code: number }> {
  return { code: await main(["node", "kiln", "bench", ...argv], { engineFactory: factory }) };
}

function collect(): { stream: NodeJS.WritableStream; text: () => string } {
  let text = "";
  const stream = new Writable({ write: (chunk: Buffer, _e, cb) => ((text += chunk.toString()), cb()) });
  return { stream, text: () => text };
}

describe("kiln bench latency / throughput", () => {
  const dir = mkdtempSync(join(tmpdir(), "kiln-bench-offline-"));

  it("latency: warm-up and timed batches of --batch-size random prompts, vLLM's lines and JSON", async () => {
    const seen = { prompts: [] as number[][] };
    const file = join(dir, "latency.json");
    const { code } = await run(
      ["latency", "--input-len", "12", "--output-len", "5", "--batch-size", "3", "--num-iters-warmup", "1", "--num-iters", "2", "--output-json", file],
      fakeFactory(seen),
    );
    assert.equal(code, 0);
    assert.equal(seen.prompts.length, 3 * 3, "one warm-up and two timed batches of 3");
    assert.ok(seen.prompts.every((p) => p.length === 12));
    assert.notDeepEqual(seen.prompts[0], seen.prompts[1], "the prompts are random");
    assert.deepEqual(seen.prompts.slice(0, 3), seen.prompts.slice(3, 6), "every batch sends the same prompts");
    const j = JSON.parse(readFileSync(file, "utf8")) as { avg_latency: number; latencies: number[]; percentiles: Record<string, number> };
    assert.equal(j.latencies.length, 2);
    // 5 tokens each, 2 ms apart at least (EOS probability 1 is ignored: ignore_eos)
    assert.ok(j.latencies.every((l) => l >= 0.008), JSON.stringify(j.latencies));
    assert.equal(j.avg_latency, (j.latencies[0]! + j.latencies[1]!) / 2);
    assert.deepEqual(Object.keys(j.percentiles), ["10", "25", "50", "75", "90", "99"]);
    const out = collect();
    await runBenchLatency({ maxModelLen: 64 } as ServeArgs, { inputLen: 4, outputLen: 2, seed: 1, outputJson: null, batchSize: 2, numItersWarmup: 0, numIters: 3 }, fakeFactory(seen), out.stream);
    assert.match(out.text(), /^Avg latency: [\d.]+ seconds\n10% percentile latency: [\d.]+ seconds\n(.*\n){4}99% percentile latency: [\d.]+ seconds\n$/);
  });

  it("throughput: --num-prompts requests at once; tokens counted as generated", async () => {
    const seen = { prompts: [] as number[][] };
    const file = join(dir, "throughput.json");
    const { code } = await run(["throughput", "--input-len", "7", "--output-len", "4", "--num-prompts", "10", "--output-json", file], fakeFactory(seen));
    assert.equal(code, 0);
    assert.equal(seen.prompts.length, 10);
    const j = JSON.parse(readFileSync(file, "utf8")) as Record<string, number>;
    assert.equal(j.num_requests, 10);
    assert.equal(j.total_output_tokens, 40);
    assert.equal(j.total_num_tokens, 70 + 40);
    assert.ok(Math.abs(j.requests_per_second! - 10 / j.elapsed_time!) < 1e-9);
    const out = collect();
    await runBenchThroughput({ maxModelLen: 64 } as ServeArgs, { inputLen: 7, outputLen: 4, seed: 0, outputJson: null, numPrompts: 10 }, fakeFactory(seen), out.stream);
    assert.match(out.text(), /^Throughput: [\d.]+ requests\/s, [\d.]+ total tokens\/s, [\d.]+ output tokens\/s\nTotal num prompt tokens: +70\nTotal num output tokens: +40\n$/);
  });

  it("a prompt and output longer than the model takes is an error naming both; bad numbers are usage errors", async () => {
    const write = process.stderr.write;
    let err = "";
    process.stderr.write = ((s: string) => ((err += s), true)) as typeof process.stderr.write;
    try {
      assert.equal((await run(["throughput", "--input-len", "200", "--output-len", "100", "--max-model-len", "256"], fakeFactory({ prompts: [] }))).code, 1);
      assert.match(err, /--input-len 200 \+ --output-len 100 exceed the model's max_model_len 256/);
      assert.equal((await run(["latency", "--batch-size", "0"], fakeFactory({ prompts: [] }))).code, 2);
      assert.match(err, /--batch-size must be an integer >= 1/);
    } finally {
      process.stderr.write = write;
    }
  });

  it("percentile interpolates between ranks (numpy's linear)", () => {
    assert.equal(percentile([1, 2, 3, 4], 50), 2.5);
    assert.equal(percentile([1, 2, 3, 4], 10), 1.3);
    assert.equal(percentile([5], 99), 5);
    assert.ok(Number.isNaN(percentile([], 50)));
  });
});
