// `kiln bench serve` against a real `kiln serve` whose model vocabulary is larger than its tokenizer's (as the
// smollm-135m preset with a small trained tokenizer): most sampled ids decode to "", yet each is a token.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { benchServeDefaults, runBenchServe } from "../../src/cli/bench-serve.js";
import { tinyModelDir } from "../helpers/tiny-model.js";
import { startKiln, type KilnServer } from "./kiln-process.js";

let server: KilnServer;
before(async () => {
  server = await startKiln([], tinyModelDir("LlamaForCausalLM", { overrides: { vocab_size: 32768 } }));
});
after(async () => {
  assert.equal(await server.stop(), 0);
});

describe("kiln bench serve against kiln serve (e2e)", () => {
  it("times every streamed token, including those whose text is empty", async () => {
    const r = await runBenchServe({
      ...benchServeDefaults(), baseUrl: server.url, randomInputLen: 24, randomOutputLen: 16,
      numPrompts: 12, maxConcurrency: 4, ignoreEos: true, percentiles: [1, 99], percentileMetrics: ["ttft", "tpot", "itl", "e2el"], quiet: true,
    });
    assert.equal(r.model_id, server.model);
    assert.equal(r.completed, 12);
    assert.equal(r.failed, 0);
    assert.equal(r.total_input_tokens, 12 * 24);
    assert.equal(r.total_output_tokens, 12 * 16);
    const n = (k: string): number => r[k] as number;
    // Every request saw its first token: no TTFT of 0 (the old client only counted chunks with text).
    assert.ok(n("p1_ttft_ms") > 0, `p1 TTFT ${n("p1_ttft_ms")}`);
    assert.ok(n("p1_itl_ms") > 0);
    for (const key of ["ttft", "tpot", "itl"]) assert.ok(n(`mean_${key}_ms`) < n("mean_e2el_ms"), key);
    assert.ok(n("mean_ttft_ms") + 15 * n("mean_tpot_ms") <= n("mean_e2el_ms") * 1.001 + 1e-6);
    assert.ok(Math.abs(n("total_token_throughput") - n("request_throughput") * 40) < 1e-6);
  });
});
