// `kiln bench serve` against the fake-engine server.
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { parseBenchServeArgs } from "../../src/cli/bench-serve-args.js";
import { benchServeDefaults, gammaDraw, runBenchServe, type BenchServeArgs } from "../../src/cli/bench-serve.js";
import { mulberry32 } from "../../src/util/random.js";
import { startTestServer, type TestServer } from "./helpers.js";

describe("bench serve", () => {
  let s: TestServer;
  before(async () => {
    s = await startTestServer({}, { stepDelayMs: 1 });
  });
  after(() => s.close());

  const base = (over: Partial<BenchServeArgs>): BenchServeArgs => ({
    ...benchServeDefaults(), baseUrl: s.url, randomInputLen: 16, randomOutputLen: 8, randomPrefixLen: 4,
    prefixRepetitionPrefixLen: 8, prefixRepetitionSuffixLen: 8, prefixRepetitionNumPrefixes: 2, prefixRepetitionOutputLen: 4,
    numPrompts: 12, maxConcurrency: 4, ignoreEos: true, percentileMetrics: ["ttft", "tpot", "itl", "e2el"], quiet: true, ...over,
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

  /** runBenchServe with every request the client sends recorded (route and body). */
  async function recorded(args: BenchServeArgs): Promise<{ result: Record<string, unknown>; calls: { route: string; body: Record<string, unknown> | null; id: string | null }[] }> {
    const calls: { route: string; body: Record<string, unknown> | null; id: string | null }[] = [];
    const real = globalThis.fetch;
    globalThis.fetch = (async (input: string | URL | Request, init?: RequestInit) => {
      const headers = (init?.headers ?? {}) as Record<string, string>;
      calls.push({ route: new URL(String(input)).pathname, body: init?.body ? (JSON.parse(String(init.body)) as Record<string, unknown>) : null, id: headers["x-request-id"] ?? null });
      return real(input, init);
    }) as typeof fetch;
    try {
      return { result: await runBenchServe(args), calls };
    } finally {
      globalThis.fetch = real;
    }
  }

  it("openai-chat sends chat completions (random ids as their text), with the sampling flags and --extra-body", async () => {
    const { result, calls } = await recorded(base({
      backend: "openai-chat", endpoint: "/v1/chat/completions", numPrompts: 4, sampling: { temperature: 0.5, top_k: 3 }, extraBody: { seed: 7 }, requestIdPrefix: "run1-",
    }));
    const posts = calls.filter((c) => c.route === "/v1/chat/completions");
    assert.equal(posts.length, 4);
    assert.equal(calls.filter((c) => c.route === "/v1/completions").length, 0);
    assert.deepEqual(posts.map((p) => p.id).sort(), ["run1-0", "run1-1", "run1-2", "run1-3"]);
    for (const p of posts) {
      const b = p.body!;
      assert.equal(b.max_completion_tokens, 8);
      assert.equal(b.temperature, 0.5);
      assert.equal(b.top_k, 3);
      assert.equal(b.seed, 7);
      assert.equal(b.ignore_eos, true);
      const content = (b.messages as { role: string; content: string }[])[0]!;
      assert.equal(content.role, "user");
      assert.equal(content.content.length, 20); // the fake tokenizer's ids are characters: 4 prefix + 16
    }
    assert.equal(result.completed, 4);
    assert.equal(result.total_input_tokens, 4 * 20);
    assert.equal(result.total_output_tokens, 4 * 8);
  });

  it("custom dataset: JSONL prompts in the chat template (or as written), shuffled, oversampled unless told not to", async () => {
    const dir = mkdtempSync(join(tmpdir(), "kiln-bench-"));
    const file = join(dir, "prompts.jsonl");
    const prompts = ["hello there", "what is two plus two", "name a color"];
    writeFileSync(file, prompts.map((prompt) => JSON.stringify({ prompt })).join("\n") + "\n");
    // the fake chat template: "user: <text>\nassistant:", one token per character, no BOS for messages
    const templated = (p: string) => `user: ${p}\nassistant:`.length;
    const { result, calls } = await recorded(base({ datasetName: "custom", datasetPath: file, customOutputLen: 5, numPrompts: 3, saveDetailed: true }));
    const sent = calls.filter((c) => c.route === "/v1/completions").map((c) => c.body!);
    assert.equal(sent.length, 3);
    assert.deepEqual(sent.map((b) => (b.prompt as number[]).length).sort(), prompts.map(templated).sort());
    assert.ok(sent.every((b) => b.max_tokens === 5));
    assert.equal(result.total_input_tokens, prompts.map(templated).reduce((a, b) => a + b));
    assert.equal(result.total_output_tokens, 15);
    const plain = await runBenchServe(base({ datasetName: "custom", datasetPath: file, customOutputLen: 5, numPrompts: 7, customSkipChatTemplate: true }));
    assert.equal(plain.completed, 7); // oversampled from 3
    const once = await runBenchServe(base({ datasetName: "custom", datasetPath: file, customOutputLen: 5, numPrompts: 7, noOversample: true, saveDetailed: true }));
    assert.equal(once.completed, 3);
    // as written: the fake tokenizer adds BOS to a text prompt
    const kept = await runBenchServe(base({ datasetName: "custom", datasetPath: file, customOutputLen: 5, numPrompts: 3, customSkipChatTemplate: true, disableShuffle: true, saveDetailed: true }));
    assert.deepEqual(kept.input_lens, prompts.map((p) => p.length + 1));
    writeFileSync(join(dir, "bad.jsonl"), '{"text": "no prompt key"}\n');
    await assert.rejects(runBenchServe(base({ datasetName: "custom", datasetPath: join(dir, "bad.jsonl") })), /line 1 has no "prompt" string/);
  });

  it("sharegpt dataset: the first turn as prompt, the reply's length as output, vLLM's length filter", async () => {
    const dir = mkdtempSync(join(tmpdir(), "kiln-bench-"));
    const file = join(dir, "sharegpt.json");
    const turn = (human: string, gpt: string) => ({ conversations: [{ from: "human", value: human }, { from: "gpt", value: gpt }] });
    writeFileSync(file, JSON.stringify([
      { conversations: [{ from: "human", value: "only one turn here" }] }, // fewer than two turns: dropped
      turn("hi", "a reply long enough"), // prompt of 3 tokens (BOS + 2): under 4, dropped
      turn("x".repeat(1100), "fine"), // prompt over 1024 tokens: dropped
      turn("Tell me a story", "Once upon a time"), // kept: 16 prompt tokens, 17 output
    ]));
    const r = await runBenchServe(base({ datasetName: "sharegpt", datasetPath: file, numPrompts: 4, noOversample: true }));
    assert.equal(r.completed, 1);
    assert.equal(r.total_input_tokens, 16);
    assert.equal(r.total_output_tokens, 17);
    const fixed = await runBenchServe(base({ datasetName: "sharegpt", datasetPath: file, numPrompts: 2, sharegptOutputLen: 3 }));
    assert.equal(fixed.total_output_tokens, 6); // oversampled to 2, each 3 tokens
  });

  it("goodput counts the requests within every SLO; --random-range-ratio spreads the lengths", async () => {
    const all = await runBenchServe(base({ goodput: { ttft: 1e9, tpot: 1e9, e2el: 1e9 } }));
    assert.equal(all.request_goodput, all.request_throughput);
    const none = await runBenchServe(base({ goodput: { e2el: 0 } }));
    assert.equal(none.request_goodput, 0);
    const spread = await runBenchServe(base({ randomRangeRatio: 0.5, randomPrefixLen: 0, numPrompts: 16, saveDetailed: true }));
    const lens = spread.input_lens as number[];
    assert.ok(lens.every((n) => n >= 8 && n <= 24), String(lens));
    assert.ok(new Set(lens).size > 1, String(lens));
    assert.equal(spread.total_input_tokens, lens.reduce((a, b) => a + b));
    assert.deepEqual(spread.output_lens, (spread.output_lens as number[]).map((n) => Math.min(12, Math.max(4, n)))); // within 8 * (1 -+ 0.5)
  });

  it("saves the result under --result-dir with the label, metadata and only the chosen metrics", async () => {
    const dir = mkdtempSync(join(tmpdir(), "kiln-bench-"));
    const r = await runBenchServe(base({ saveResult: true, resultDir: dir, label: "mylabel", metadata: { env: "ci" }, percentileMetrics: ["ttft"], numPrompts: 3, maxConcurrency: 2 }));
    const files = readdirSync(dir);
    assert.equal(files.length, 1);
    assert.match(files[0]!, /^mylabel-infqps-concurrency2-kiln-test-\d{8}-\d{6}\.json$/);
    const saved = JSON.parse(readFileSync(join(dir, files[0]!), "utf8")) as Record<string, unknown>;
    assert.equal(saved.env, "ci");
    assert.equal(saved.label, "mylabel");
    assert.equal(saved.completed, r.completed);
    assert.ok("p99_ttft_ms" in saved);
    assert.ok(!("mean_itl_ms" in saved) && !("mean_e2el_ms" in saved));
  });
});

describe("bench serve flags and arrivals", () => {
  it("parses vLLM's flags into the run's settings, refusing what cannot work", () => {
    const o = (over: Record<string, unknown>) => ({
      backend: "vllm", host: "127.0.0.1", port: "8000", datasetName: "random", randomInputLen: "1024", randomOutputLen: "128", randomPrefixLen: "0",
      randomRangeRatio: "0", prefixRepetitionPrefixLen: "256", prefixRepetitionSuffixLen: "256", prefixRepetitionNumPrefixes: "10",
      prefixRepetitionOutputLen: "128", customOutputLen: "256", oversample: true, numPrompts: "1000", numWarmups: "0", requestRate: "inf",
      burstiness: "1", seed: "0", percentileMetrics: "ttft,tpot,itl", metricPercentiles: "99", requestIdPrefix: "bench-", readyCheckTimeoutSec: "600", ...over,
    });
    const a = parseBenchServeArgs(o({ backend: "openai-chat", host: "10.0.0.2", port: "9000", goodput: ["ttft:500", "tpot:50"], metadata: ["a=b=c"], temperature: "0.7", extraBody: '{"seed": 1}' }), {});
    assert.equal(a.baseUrl, "http://10.0.0.2:9000");
    assert.equal(a.endpoint, "/v1/chat/completions");
    assert.deepEqual(a.goodput, { ttft: 500, tpot: 50 });
    assert.deepEqual(a.metadata, { a: "b=c" });
    assert.deepEqual(a.sampling, { temperature: 0.7 });
    assert.deepEqual(a.extraBody, { seed: 1 });
    assert.equal(parseBenchServeArgs(o({ baseUrl: "http://h:1/v1/" }), {}).baseUrl, "http://h:1");
    assert.equal(parseBenchServeArgs(o({}), { OPENAI_API_KEY: "k" }).apiKey, "k");
    assert.throws(() => parseBenchServeArgs(o({ backend: "openai-chat", endpoint: "/v1/completions" }), {}), /--endpoint must be \/v1\/chat\/completions/);
    assert.throws(() => parseBenchServeArgs(o({ endpoint: "/v1/chat/completions" }), {}), /use --backend openai-chat/);
    assert.throws(() => parseBenchServeArgs(o({ datasetName: "sharegpt" }), {}), /--dataset-name sharegpt needs --dataset-path/);
    assert.throws(() => parseBenchServeArgs(o({ datasetName: "sonnet" }), {}), /--dataset-name must be one of/);
    assert.throws(() => parseBenchServeArgs(o({ goodput: ["latency:5"] }), {}), /--goodput's key must be one of ttft, tpot, e2el/);
    assert.throws(() => parseBenchServeArgs(o({ goodput: ["ttft"] }), {}), /KEY:VALUE/);
    assert.throws(() => parseBenchServeArgs(o({ randomRangeRatio: "1" }), {}), /--random-range-ratio must be in \[0, 1\)/);
    assert.throws(() => parseBenchServeArgs(o({ percentileMetrics: "ttft,latency" }), {}), /--percentile-metrics must be one of/);
    assert.throws(() => parseBenchServeArgs(o({ burstiness: "0" }), {}), /--burstiness must be > 0/);
  });

  it("gamma inter-arrivals have the shape's mean and variance (Poisson at 1)", () => {
    for (const shape of [0.5, 1, 4]) {
      const rand = mulberry32(42);
      const xs = Array.from({ length: 40_000 }, () => gammaDraw(shape, rand));
      const mean = xs.reduce((a, b) => a + b) / xs.length;
      const variance = xs.reduce((a, b) => a + (b - mean) ** 2, 0) / xs.length;
      assert.ok(Math.abs(mean - shape) < 0.03 * shape, `shape ${shape}: mean ${mean}`);
      assert.ok(Math.abs(variance - shape) < 0.06 * shape, `shape ${shape}: variance ${variance}`);
    }
  });
});
