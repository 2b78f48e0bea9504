// `kiln bench serve` against the fake-engine server.
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { runBenchServe, type BenchServeArgs } from "../../src/cli/bench-serve.js";
import { startTestServer, type TestServer } from "./helpers.js";

describe("bench serve", () => {
  let s: TestServer;
  before(async () => {
    s = await startTestServer({}, { stepDelayMs: 1 });
  });
  after(() => s.close());

  const base = (over: Partial<BenchServeArgs>): BenchServeArgs => ({
    baseUrl: s.url, model: null, datasetName: "random", randomInputLen: 16, randomOutputLen: 8, randomPrefixLen: 4,
    prefixRepetitionPrefixLen: 8, prefixRepetitionSuffixLen: 8, prefixRepetitionNumPrefixes: 2, prefixRepetitionOutputLen: 4,
    numPrompts: 12, requestRate: Infinity, maxConcurrency: 4, ignoreEos: true, seed: 0, apiKey: null, percentiles: [99],
    saveResult: false, resultFilename: null, quiet: true, ...over,
  });

  it("random dataset: every request completes with the requested lengths", async () => {
    const file = join(mkdtempSync(join(tmpdir(), "kiln-bench-")), "r.json");
    const r = await runBenchServe(base({ resultFilename: file }));
    assert.equal(r.completed, 12);
    assert.equal(r.failed, 0);
    assert.equal(r.total_input_tokens, 12 * 20);
    assert.equal(r.total_output_tokens, 12 * 8);
    for (const k of ["request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "mean_e2el_ms"]) {
      assert.ok(typeof r[k] === "number" && (r[k] as number) > 0, k);
    }
    assert.equal(JSON.parse(readFileSync(file, "utf8")).completed, 12);
  });

  it("prefix-repetition dataset with Poisson arrivals", async () => {
    const r = await runBenchServe(base({ datasetName: "prefix-repetition", requestRate: 200, maxConcurrency: null, numPrompts: 8 }));
    assert.equal(r.completed, 8);
    assert.equal(r.total_output_tokens, 8 * 4);
    assert.equal(r.total_input_tokens, 8 * 16);
  });
});
