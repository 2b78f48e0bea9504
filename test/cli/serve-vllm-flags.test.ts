// vLLM `serve` flags a pasted command line carries: each is honoured (its value reaches ServeArgs and the engine's
// arguments), accepted with a start-up warning where it cannot change a reply, or refused naming why.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { servingArgsOf, type EngineFactory } from "../../src/cli/engine-factory.js";
import { main } from "../../src/cli/main.js";
import { spawnServe } from "./serve-child.js";
import { CliUsageError, expandMultiLetterShortFlags, parseServeArgs, type ServeArgs } from "../../src/cli/serve-args.js";

const root = fileURLToPath(new URL("../../..", import.meta.url)); // dist/test/cli -> package root
const kiln = (...args: string[]) => spawnSync(`${root}/bin/kiln`, args, { encoding: "utf8", timeout: 10_000 });
const parse = (o: Record<string, unknown>, model = "org/hub-model"): ServeArgs => parseServeArgs(model, o, {});
const noProgress = () => undefined;

describe("vLLM serve flags", () => {
  it("--load-format: auto, safetensors, pt, gguf and dummy reach the engine; fastsafetensors reads safetensors; others are refused", () => {
    assert.equal(parse({}).loadFormat, "auto");
    assert.equal(servingArgsOf(parse({ loadFormat: "dummy" }), noProgress).loadFormat, "dummy");
    const fast = parse({ loadFormat: "fastsafetensors" });
    assert.equal(fast.loadFormat, "safetensors");
    assert.match(fast.warnings.join("\n"), /--load-format fastsafetensors: read as safetensors/);
    assert.equal(parse({ loadFormat: "pt" }).loadFormat, "pt");
    const npcache = parse({ loadFormat: "npcache" });
    assert.equal(npcache.loadFormat, "pt");
    assert.match(npcache.warnings.join("\n"), /--load-format npcache: read as pt/);
    assert.throws(() => parse({ loadFormat: "bitsandbytes" }), /--load-format bitsandbytes is not supported: .* --quantization int8/);
    assert.throws(() => parse({ loadFormat: "parquet" }), /--load-format must be one of auto, safetensors, pt, gguf, dummy, got "parquet"/);
  });

  it("--hf-overrides, with --rope-scaling and --rope-theta over it, reach the engine as one object", () => {
    assert.equal(parse({}).hfOverrides, null);
    const a = parse({ hfOverrides: '{"max_position_embeddings": 96, "rope_theta": 1}', ropeTheta: "500000", ropeScaling: '{"rope_type": "linear", "factor": 2}' });
    assert.deepEqual(a.hfOverrides, { max_position_embeddings: 96, rope_theta: 500000, rope_scaling: { rope_type: "linear", factor: 2 } });
    assert.deepEqual(servingArgsOf(a, noProgress).hfOverrides, a.hfOverrides);
    assert.throws(() => parse({ hfOverrides: "max_position_embeddings=96" }), /--hf-overrides must be a JSON object/);
    assert.throws(() => parse({ ropeTheta: "fast" }), /--rope-theta must be a number/);
  });

  it("hub flags: --revision and --download-dir reach the loader; a local model says they do nothing; --tokenizer-revision must be the model's", () => {
    const hub = parse({ revision: "v2", downloadDir: "/data/hf", tokenizerRevision: "v2", codeRevision: "abc" });
    assert.deepEqual([hub.revision, hub.downloadDir], ["v2", "/data/hf"]);
    const s = servingArgsOf(hub, noProgress);
    assert.deepEqual([s.revision, s.downloadDir], ["v2", "/data/hf"]);
    assert.deepEqual(hub.warnings, ["--code-revision abc: no effect: Kiln runs no code from the model repository"]);
    const local = parse({ revision: "v2", tokenizerRevision: "v1" }, root);
    assert.match(local.warnings.join("\n"), /--revision v2: no effect: .* is a local path/);
    assert.match(local.warnings.join("\n"), /--tokenizer-revision v1: no effect: the tokenizer is read from a local directory/);
    assert.equal(parse({ tokenizerRevision: "main" }).warnings.length, 0);
    assert.throws(() => parse({ revision: "v2", tokenizerRevision: "v1" }), /--tokenizer-revision v1 is not supported: .*--revision v2.*--tokenizer DIR/);
  });

  it("--tokenizer-mode: auto and hf read tokenizer.json, slow says so, mistral and custom are refused", () => {
    assert.deepEqual(parse({ tokenizerMode: "hf" }).warnings, []);
    assert.match(parse({ tokenizerMode: "slow" }).warnings[0]!, /--tokenizer-mode slow: the tokenizer is read from tokenizer.json/);
    assert.throws(() => parse({ tokenizerMode: "mistral" }), /--tokenizer-mode mistral is not supported/);
  });

  it("CORS: --allow-credentials, --allowed-methods and --allowed-headers (JSON lists, default any) reach the server's options", () => {
    assert.deepEqual(parse({}).cors, { allowCredentials: false, allowedMethods: ["*"], allowedHeaders: ["*"] });
    const a = parse({ allowCredentials: true, allowedMethods: '["GET", "POST"]', allowedHeaders: '["authorization"]' });
    assert.deepEqual(a.cors, { allowCredentials: true, allowedMethods: ["GET", "POST"], allowedHeaders: ["authorization"] });
    assert.throws(() => parse({ allowedMethods: "GET,POST" }), /--allowed-methods must be a JSON list of strings/);
  });

  it("--allowed-local-media-path (an existing directory, resolved) and --allowed-media-domains reach the server's options", () => {
    assert.deepEqual(parse({}).mediaAccess, { localPath: null, domains: null });
    const a = parse({ allowedLocalMediaPath: `${root}/test/../test`, allowedMediaDomains: ["upload.wikimedia.org"] });
    assert.deepEqual(a.mediaAccess, { localPath: `${root}/test`.replace(/\/+$/, "").replace(/\/\//g, "/"), domains: ["upload.wikimedia.org"] });
    assert.throws(() => parse({ allowedLocalMediaPath: "/no/such/dir" }), /--allowed-local-media-path \/no\/such\/dir does not exist/);
    assert.throws(() => parse({ allowedLocalMediaPath: `${root}/package.json` }), /is not a directory/);
  });

  it("--disable-sliding-window reaches the engine", () => {
    assert.equal(servingArgsOf(parse({}), noProgress).disableSlidingWindow, undefined);
    assert.equal(servingArgsOf(parse({ disableSlidingWindow: true }), noProgress).disableSlidingWindow, true);
  });

  it("-O / --compilation-config: level 0 and cudagraph_mode NONE run eagerly; capture sizes cap the step graphs; other keys are named", () => {
    const eager = (v: string) => parse({ compilationConfig: v }).enforceEager;
    assert.deepEqual(["0", "3", '{"level": 0}', '{"mode": "NONE"}', '{"cudagraph_mode": "NONE"}', ".cudagraph_mode=NONE", '{"cudagraph_mode": "FULL"}'].map(eager),
      [true, false, true, true, true, true, false]);
    const capped = parse({ compilationConfig: '{"max_cudagraph_capture_size": 8, "backend": "inductor", "custom_ops": ["none"]}' });
    assert.equal(capped.maxCaptureSize, 8);
    assert.match(capped.warnings[0]!, /--compilation-config: backend, custom_ops: no effect/);
    const s = servingArgsOf(capped, noProgress);
    assert.deepEqual([s.maxCaptureSize, s.maxCaptureTokens], [8, 8]);
    const sizes = parse({ compilationConfig: '{"cudagraph_capture_sizes": [1, 2, 24]}' });
    assert.equal(sizes.maxCaptureSize, 24);
    assert.match(sizes.warnings[0]!, /powers of two up to 24/);
    assert.equal(parse({ maxCudagraphCaptureSize: "16", compilationConfig: '{"max_cudagraph_capture_size": 8}' }).maxCaptureSize, 16);
    assert.equal(servingArgsOf(parse({}), noProgress).maxCaptureSize, undefined);
    assert.throws(() => parse({ compilationConfig: "7" }), /--compilation-config: level \/ mode must be 0 to 3/);
    assert.throws(() => parse({ compilationConfig: '{"cudagraph_mode": "SOME"}' }), /cudagraph_mode must be one of NONE/);
  });

  it("--kv-cache-memory-bytes is --kv-cache-memory under vLLM's name", () => {
    assert.equal(parse({ kvCacheMemoryBytes: "2GiB" }).kvCacheMemoryBytes, 2 ** 31);
    assert.throws(() => parse({ kvCacheMemoryBytes: "1G", kvCacheMemory: "1G" }), /are one setting: give one/);
    assert.throws(() => parse({ kvCacheMemoryBytes: "lots" }), /--kv-cache-memory-bytes must be a byte count/);
  });

  it("GPU-only engine flags: accepted with a warning when given; Python classes and other roles refused", () => {
    const a = parse({ enableDbo: true, numLookaheadSlots: "3", cudagraphCaptureSizes: ["1", "2"], useTqdmOnLoad: false });
    assert.deepEqual(a.warnings, [
      "--enable-dbo: no effect: no dual-batch overlap: one CPU stream computes each step",
      "--num-lookahead-slots: no effect: speculative decoding reserves its own slots",
      "--cudagraph-capture-sizes: no effect: step graphs are captured for powers of two up to --max-cudagraph-capture-size",
    ]);
    assert.throws(() => parse({ workerCls: "my.Worker" }), /--worker-cls is not supported: it names a Python class/);
    assert.throws(() => parse({ grpc: true }), /--grpc is not supported: Kiln serves HTTP only/);
    const r = kiln("serve", "--headless");
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /--headless is not supported: multi-node data parallelism/);
  });

  it("--num-gpu-blocks-override reaches the engine's arguments", () => {
    assert.equal(servingArgsOf(parse({}), noProgress).numGpuBlocksOverride, undefined);
    assert.equal(servingArgsOf(parse({ numGpuBlocksOverride: "64" }), noProgress).numGpuBlocksOverride, 64);
    assert.throws(() => parse({ numGpuBlocksOverride: "1" }), /--num-gpu-blocks-override must be an integer >= 2/);
  });

  it("flags with no counterpart: accepted, saying so where the value would have done something in vLLM, or refused", () => {
    const quiet = parse({
      swapSpace: "0", cpuOffloadGb: "0", disableCascadeAttn: true, disableLogStats: true, disableCustomAllReduce: true, distributedExecutorBackend: "mp",
      maxNumPartialPrefills: "1", limitMmPerPrompt: '{"image": 0, "video": {"count": 0}}',
    });
    assert.deepEqual(quiet.warnings, []);
    const loud = parse({
      swapSpace: "16", cpuOffloadGb: "4", maxSeqLenToCapture: "8192", maxNumPartialPrefills: "4", enableExpertParallel: true,
      limitMmPerPrompt: "image=2,video=1",
    });
    assert.deepEqual(loud.limitMmPerPrompt, { image: 2, video: 1 }); // images are served (Gemma 3), the rest said at start-up
    assert.deepEqual(parse({ limitMmPerPrompt: '{"image": 3}' }).warnings, []);
    assert.deepEqual(loud.warnings.map((w) => w.split(":")[0]), [
      "--swap-space", "--cpu-offload-gb", "--max-seq-len-to-capture", "--max-num-partial-prefills", "--enable-expert-parallel", "--limit-mm-per-prompt",
    ]);
    const sleepy = parse({ enableSleepMode: true }); // an engine flag now (engine/sleep-mode.ts), not a no-op
    assert.deepEqual([sleepy.enableSleepMode, sleepy.warnings, parse({}).enableSleepMode], [true, [], false]);
    assert.match(loud.warnings.join("\n"), /--limit-mm-per-prompt: Kiln takes images only \(Gemma 3\): a request with audio or video parts gets a 400/);
    const bad: [Record<string, unknown>, RegExp][] = [
      [{ distributedExecutorBackend: "ray" }, /--distributed-executor-backend ray is not supported: Kiln's tensor-parallel ranks are processes it spawns \(mp\)/],
      [{ swapSpace: "-1" }, /--swap-space must be a number >= 0/],
      [{ maxNumPartialPrefills: "0" }, /--max-num-partial-prefills must be an integer >= 1/],
      [{ limitMmPerPrompt: '{"image": -1}' }, /--limit-mm-per-prompt: image must be a count >= 0/],
      [{ limitMmPerPrompt: "image" }, /--limit-mm-per-prompt must be JSON such as/],
    ];
    for (const [o, re] of bad) assert.throws(() => parse(o), re, JSON.stringify(o));
  });

  it("-tp / -pp / -dp stand for the long flags (commander's short flags are one letter)", () => {
    assert.deepEqual(expandMultiLetterShortFlags(["-tp", "2", "-pp=1", "--dp", "-dp", "1", "-q", "int8"]), [
      "--tensor-parallel-size", "2", "--pipeline-parallel-size=1", "--dp", "--data-parallel-size", "1", "-q", "int8",
    ]);
  });

  it("front-end flags: --uds, --chat-template-content-format and --default-chat-template-kwargs", () => {
    const d = parse({});
    assert.deepEqual([d.uds, d.chatTemplateContentFormat, d.defaultChatTemplateKwargs], [null, "auto", null]);
    const a = parse({ uds: "/tmp/kiln.sock", chatTemplateContentFormat: "openai", defaultChatTemplateKwargs: '{"enable_thinking": false}' });
    assert.deepEqual([a.uds, a.chatTemplateContentFormat, a.defaultChatTemplateKwargs], ["/tmp/kiln.sock", "openai", { enable_thinking: false }]);
    assert.throws(() => parse({ chatTemplateContentFormat: "xml" }), /--chat-template-content-format must be one of auto, string, openai/);
    assert.throws(() => parse({ defaultChatTemplateKwargs: "enable_thinking=false" }), /--default-chat-template-kwargs must be a JSON object/);
    // a KV-events engine_id cannot default to a URL when the server has none
    const ev = '{"enable_kv_cache_events": true, "publisher": "nats", "endpoint": "nats://127.0.0.1:4222"}';
    assert.throws(() => parse({ uds: "/tmp/kiln.sock", kvEventsConfig: ev }), /--kv-events-config with --uds: give "engine_id"/);
  });

  it("the command line: -tp, -O and -q reach the args, warnings are printed before the model loads, refusals exit 2 naming the flag", async () => {
    let got: ServeArgs | null = null;
    const factory: EngineFactory = async (args) => {
      got = args;
      throw new CliUsageError("stop before loading");
    };
    const written: string[] = [];
    const write = process.stderr.write;
    process.stderr.write = ((s: string) => written.push(s) > 0) as typeof process.stderr.write;
    try {
      assert.equal(await main(["node", "kiln", "serve", "m", "-tp", "1", "-O0", "-q", "int8", "--swap-space", "8"], { engineFactory: factory }), 2);
    } finally {
      process.stderr.write = write;
    }
    const args = got as ServeArgs | null;
    assert.ok(args);
    assert.deepEqual([args.tensorParallelSize, args.enforceEager, args.quantization], [1, true, "int8"]);
    assert.match(written[0]!, /^kiln: warning: --swap-space: no effect/);
    const r = kiln("serve", "m", "--load-format", "tensorizer");
    assert.equal(r.status, 2);
    assert.match(r.stderr, /kiln: error: --load-format tensorizer is not supported: tensorizer files are not read/);
  });

  it("--config: a YAML file's keys for the new flags work as on the command line", async () => {
    const tmp = mkdtempSync(join(tmpdir(), "kiln-vllm-flags-"));
    try {
      const file = join(tmp, "serve.yaml");
      writeFileSync(file, [
        "load_format: dummy",
        "hf_overrides: {max_position_embeddings: 96, text_config: {rope_theta: 1000}}",
        "uds: /tmp/kiln-config.sock",
        "default_chat_template_kwargs: {enable_thinking: false}",
        "chat_template_content_format: string",
        "compilation_config: {level: 0}",
        "disable_log_stats: true",
        "disable_sliding_window: false",
        "limit_mm_per_prompt: {image: 0}",
        "swap_space: 4",
        "kv_cache_memory_bytes: 1GiB",
        "",
      ].join("\n"));
      let got: ServeArgs | null = null;
      const factory: EngineFactory = async (args) => {
        got = args;
        throw new CliUsageError("stop before loading");
      };
      const write = process.stderr.write;
      process.stderr.write = () => true;
      try {
        assert.equal(await main(["node", "kiln", "serve", "m", "--config", file], { engineFactory: factory }), 2);
      } finally {
        process.stderr.write = write;
      }
      const a = got as ServeArgs | null;
      assert.ok(a);
      assert.equal(a.loadFormat, "dummy");
      assert.deepEqual(a.hfOverrides, { max_position_embeddings: 96, text_config: { rope_theta: 1000 } });
      assert.equal(a.uds, "/tmp/kiln-config.sock");
      assert.deepEqual(a.defaultChatTemplateKwargs, { enable_thinking: false });
      assert.equal(a.chatTemplateContentFormat, "string");
      assert.equal(a.enforceEager, true);
      assert.equal(a.disableSlidingWindow, false);
      assert.equal(a.kvCacheMemoryBytes, 2 ** 30);
      assert.match(a.warnings.join("\n"), /--swap-space: no effect/);
    } finally {
      rmSync(tmp, { recursive: true });
    }
  });

  it("--log-error-stack: an error response's stack goes to stderr; without it, none", async () => {
    const serve = async (...flags: string[]): Promise<string> => {
      const { child, url, stderr } = await spawnServe(["--host", "127.0.0.1", "--port", "0", ...flags]);
      const exited = new Promise((resolve) => child.on("exit", resolve));
      const res = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
      assert.equal(res.status, 400);
      child.kill("SIGTERM");
      await exited;
      return stderr();
    };
    assert.match(await serve("--log-error-stack"), /\[server\] POST \/v1\/completions: 400: .*\n\s+at /);
    assert.doesNotMatch(await serve(), /\[server\] POST/);
  });

  it("--enable-offline-docs and the h11 limits are accepted, saying what applies instead", () => {
    const w = parse({ enableOfflineDocs: true, h11MaxIncompleteEventSize: "65536", h11MaxHeaderCount: "128" }).warnings.join("\n");
    assert.match(w, /--enable-offline-docs: no effect: Kiln serves no API docs pages/);
    assert.match(w, /--h11-max-incomplete-event-size: no effect: Node's HTTP server takes up to 16 KiB/);
    assert.match(w, /--h11-max-header-count: no effect: Node's HTTP server takes up to 2000/);
  });

  it("newer vLLM engine flags: accepted with a warning, refused naming why, or (--optimization-level 0) eager", () => {
    const a = parse({ attentionBackend: "FLASH_ATTN", kvCacheMetrics: true, mambaCacheDtype: "auto", dataParallelRank: "0", dataParallelExternalLb: true, kvOffloadingSize: "8", prefillContextParallelSize: "1" });
    assert.deepEqual(a.warnings, [
      "--attention-backend: no effect: attention runs in Kiln's one CPU kernel (paged, with an online softmax)",
      "--kv-cache-metrics: no effect: Kiln exports no KV-cache residency metrics",
      "--mamba-cache-dtype: no effect: no state-space (Mamba) models are served",
      "--kv-offloading-size: no effect: the KV cache is in host memory already (size it with --kv-cache-memory)",
      "--data-parallel-rank: no effect: one engine per server (--data-parallel-size 1); replicas run behind kiln router",
      "--data-parallel-external-lb: no effect: one engine per server (--data-parallel-size 1); replicas run behind kiln router",
    ]);
    assert.deepEqual(parse({ disableFrontendMultiprocessing: true }).warnings, ["--disable-frontend-multiprocessing: no effect: the API server and the engine share one process already (the engine in a worker thread)"]);
    assert.throws(() => parse({ otlpTracesEndpoint: "http://collector:4317" }), /--otlp-traces-endpoint is not supported: Kiln exports no OpenTelemetry traces/);
    assert.throws(() => parse({ reasoningParserPlugin: "my_parser.py" }), /--reasoning-parser-plugin is not supported: it names a Python plugin/);
    assert.throws(() => parse({ enableMmEmbeds: true }), /--enable-mm-embeds is not supported/);
    assert.throws(() => parse({ decodeContextParallelSize: "2" }), /--decode-context-parallel-size above 1 is not supported: Kiln has no context parallelism/);
    assert.deepEqual(["0", "1", "3"].map((v) => parse({ optimizationLevel: v }).enforceEager), [true, false, false]);
    assert.equal(parse({}).enforceEager, false);
    assert.throws(() => parse({ optimizationLevel: "4" }), /--optimization-level must be 0 to 3, got 4/);
    // on the command line too: the flag is declared, and a refusal exits 2 before the model loads
    const r = kiln("serve", "--collect-detailed-traces", "all");
    assert.equal(r.status, 2);
    assert.match(r.stderr, /--collect-detailed-traces is not supported/);
  });

  it("--api-server-count 1 is Kiln's one API server; more are refused, pointing at kiln router", () => {
    assert.deepEqual(parse({ apiServerCount: "1" }).warnings, []);
    assert.throws(() => parse({ apiServerCount: "4" }), /--api-server-count above 1 is not supported: .*kiln router/);
    assert.throws(() => parse({ apiServerCount: "0" }), /--api-server-count must be an integer >= 1/);
  });

  it("--disable-access-log-for-endpoints leaves those paths' requests out of the HTTP log", async () => {
    const { child, url, stdout } = await spawnServe(["--host", "127.0.0.1", "--port", "0", "--enable-log-requests", "--disable-access-log-for-endpoints", "/health,/metrics"]);
    const exited = new Promise((resolve) => child.on("exit", resolve));
    for (const path of ["/health", "/metrics?x=1", "/v1/models"]) assert.equal((await fetch(`${url}${path}`)).status, 200, path);
    child.kill("SIGTERM");
    await exited;
    const urls = stdout().split("\n").flatMap((l) => /"url":"([^"]+)"/.exec(l)?.[1] ?? []);
    assert.ok(urls.includes("/v1/models"), stdout());
    assert.ok(!urls.some((u) => u.startsWith("/health") || u.startsWith("/metrics")), stdout());
    assert.throws(() => parse({ disableAccessLogForEndpoints: "health" }), /takes paths such as "\/health,\/metrics", got "health"/);
  });

  it("--enable-log-requests logs each request's prompt, params and ids, --enable-log-outputs its reply, cut to --max-log-len", async () => {
    const run = async (...flags: string[]) => {
      const { child, url, stdout } = await spawnServe(["--host", "127.0.0.1", "--port", "0", ...flags]);
      const exited = new Promise((resolve) => child.on("exit", resolve));
      const complete = (stream: boolean) =>
        fetch(`${url}/v1/completions`, {
          method: "POST", headers: { "content-type": "application/json" },
          body: JSON.stringify({ model: "kiln-default", prompt: "Hello there, world", max_tokens: 8, ignore_eos: true, return_token_ids: true, stream }),
        });
      const body = (await (await complete(false)).json()) as { id: string; choices: { text: string; token_ids: number[]; prompt_token_ids: number[]; finish_reason: string }[] };
      const streamed = await (await complete(true)).text();
      child.kill("SIGTERM");
      await exited;
      return { body, streamed, log: stdout() };
    };
    const { body, log } = await run("--enable-log-requests", "--enable-log-outputs", "--max-log-len", "5");
    const received = /INFO Received request (\S+): prompt: "Hello", params: (\{.*\}), prompt_token_ids: \[([\d, ]*)\], lora_request: None\./.exec(log);
    assert.ok(received, log);
    assert.equal(received[1], `${body.id}-0`); // the engine request's id: the response's and the prompt's index
    assert.equal(JSON.parse(received[2]!).maxTokens, 8);
    const c = body.choices[0]!;
    assert.deepEqual(received[3]!.split(", ").map(Number), c.prompt_token_ids.slice(0, 5));
    assert.ok(log.includes(`INFO Generated response ${received[1]}: output: ${JSON.stringify(c.text.slice(0, 5))}, output_token_ids: [${c.token_ids.slice(0, 5).join(", ")}], finish_reason: length`), log);
    // streamed: each delta, then the whole reply (vLLM's "streaming delta" / "streaming complete" lines)
    const full = await run("--enable-log-requests", "--enable-log-outputs");
    const text = full.streamed.split("\n").filter((l) => l.startsWith("data: {")).map((l) => (JSON.parse(l.slice(6)) as { choices: { text: string }[] }).choices[0]!.text).join("");
    const deltas = [...full.log.matchAll(/Generated response \S+ \(streaming delta\): output: ("(?:[^"\\]|\\.)*")/g)].map((m) => JSON.parse(m[1]!) as string);
    assert.equal(deltas.join(""), text);
    assert.ok(deltas.length > 1, full.log);
    assert.ok(full.log.includes(`(streaming complete): output: ${JSON.stringify(text)}`) && /finish_reason: streaming_complete/.test(full.log), full.log);
    const noDeltas = await run("--enable-log-requests", "--enable-log-outputs", "--no-enable-log-deltas");
    assert.doesNotMatch(noDeltas.log, /streaming delta/);
    assert.match(noDeltas.log, /\(streaming complete\)/);
    // without --enable-log-outputs: the request only; without --enable-log-requests: neither
    const quiet = await run("--enable-log-requests");
    assert.match(quiet.log, /INFO Received request .*prompt: "Hello there, world"/);
    assert.doesNotMatch(quiet.log, /Generated response/);
    assert.doesNotMatch((await run("--enable-log-outputs")).log, /Received request|Generated response/);
  });
});
