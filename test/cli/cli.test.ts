// The `kiln` command line: flag errors, and `serve` end to end (progress, banner, graceful SIGTERM drain).
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { EngineFactory } from "../../src/cli/engine-factory.js";
import { generationDefaults } from "../../src/engine/sampling-params.js";
import { main } from "../../src/cli/main.js";
import { CliUsageError, parseBytes, parseServeArgs, type ServeArgs } from "../../src/cli/serve-args.js";
import { configValue } from "../../src/cli/train-commands.js";
import { spawnServe } from "./serve-child.js";

const root = fileURLToPath(new URL("../../..", import.meta.url)); // dist/test/cli -> package root
const kiln = (...args: string[]) => spawnSync(`${root}/bin/kiln`, args, { encoding: "utf8", timeout: 10_000 });

describe("kiln CLI", () => {
  it("rejects unknown flags, naming the flag", () => {
    const r = kiln("serve", "--bogus-flag");
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /--bogus-flag/);
  });

  it("a command line it cannot parse exits 2, as a bad flag value does (argparse's usage status)", () => {
    for (const args of [["serve", "--bogus-flag"], ["bogus-command"], ["serve", "--max-model-len"], ["generate", "--dtype", "int3", "--prompt", "x"], ["collect-env", "extra"], ["generate", "--prompt", "x", "--max-tokens", "abc"]]) {
      const r = kiln(...args);
      assert.equal(r.status, 2, `${args.join(" ")}: ${r.stderr}`);
    }
    assert.equal(kiln("--help").status, 0);
  });

  it("kiln convert names a model directory that is missing, a file or without config.json (exit 2, not a bare ENOENT)", () => {
    const gguf = join(tmpdir(), `kiln-convert-${process.pid}.gguf`);
    writeFileSync(gguf, "GGUF");
    try {
      for (const [dir, why] of [["/nonexistent/model", /model directory \/nonexistent\/model does not exist/], [gguf, /is not a Hugging Face model directory \(it is already a GGUF file\)/], [tmpdir(), /has no config\.json/]] as const) {
        const r = kiln("convert", dir, "--out", join(tmpdir(), "never.gguf"));
        assert.equal(r.status, 2, r.stderr);
        assert.match(r.stderr, why);
        assert.doesNotMatch(r.stderr, /ENOENT|ENOTDIR/);
      }
    } finally {
      rmSync(gguf);
    }
  });

  it("--dtype takes vLLM's aliases: float is float32, half is float16", () => {
    const float = kiln("generate", "--dtype", "float", "--prompt", "x", "--max-tokens", "1");
    assert.equal(float.status, 0, float.stderr);
    const half = kiln("generate", "--dtype", "half", "--prompt", "x", "--max-tokens", "1");
    assert.equal(half.status, 1, half.stderr);
    assert.match(half.stderr, /--dtype float16 is not supported on cpu/);
  });

  it("--max-model-len takes vLLM's human-readable integers: k/m decimal, K/M binary", () => {
    const len = (v: string) => parseServeArgs("m", { maxModelLen: v }, {}).maxModelLen;
    assert.equal(len("2048"), 2048);
    assert.equal(len("1k"), 1000);
    assert.equal(len("25.6k"), 25600);
    assert.equal(len("1K"), 1024);
    assert.equal(len("2M"), 2 * 1024 * 1024);
    assert.throws(() => len("1.5K"), /--max-model-len: decimals are not allowed with binary suffixes like K/);
    assert.throws(() => len("1x"), /--max-model-len must be an integer >= 1, got "1x"/);
  });

  it("serve takes the model as vLLM does: positional or --model, not both different", () => {
    const r = kiln("serve", "--model", "/nonexistent/model-dir");
    assert.notEqual(r.status, 0);
    assert.doesNotMatch(r.stderr, /unknown option/);
    assert.match(r.stderr, /nonexistent\/model-dir/);
    const twice = kiln("serve", "/a", "--model", "/b");
    assert.notEqual(twice.status, 0);
    assert.match(twice.stderr, /the model is given twice/);
  });

  it("chat answers every piped line in turn and exits when the input ends", () => {
    const r = spawnSync(`${root}/bin/kiln`, ["chat", "--max-tokens", "2", "--temperature", "0"], {
      encoding: "utf8", timeout: 60_000, input: "hello\nhow are you\n/reset\nthird\n",
    });
    assert.equal(r.status, 0, r.stderr);
    // one prompt per line read, and the last one when the input ended
    assert.equal(r.stdout.split("> ").length - 1, 5, r.stdout);
  });

  it("chat says why it refuses a message too long for the model, drops it and answers the next one", () => {
    const long = "word ".repeat(60);
    const r = spawnSync(`${root}/bin/kiln`, ["chat", "--max-model-len", "64", "--max-tokens", "2", "--temperature", "0"], {
      encoding: "utf8", timeout: 60_000, input: `hi\n${long}\nhello\n`,
    });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stderr, /kiln: error: \[engine\] invalid prompt: the prompt \(length \d+\) is longer than the maximum model length of 64/);
    const replies = r.stdout.split("> ").slice(1, -1); // after each prompt, up to the next one
    assert.equal(replies.length, 3, r.stdout);
    assert.equal(replies[1], "", "nothing was answered to the refused message");
    assert.ok(replies[0]!.trim() !== "" && replies[2]!.trim() !== "", r.stdout);
  });

  it("chat --quick (-q, vLLM's) answers one message and exits; --quantization keeps its long name there", () => {
    const r = spawnSync(`${root}/bin/kiln`, ["chat", "-q", "hello", "--max-tokens", "3", "--temperature", "0"], { encoding: "utf8", timeout: 60_000, input: "never read\n" });
    assert.equal(r.status, 0, r.stderr);
    assert.doesNotMatch(r.stdout, /> |Kiln chat/); // no prompt: the piped line is not read
    assert.equal(r.stdout.split("\n").length, 2, r.stdout); // the reply, then its newline
    const bad = kiln("chat", "--quantization", "bogus", "-q", "x");
    assert.equal(bad.status, 2);
    assert.match(bad.stderr, /quantization/);
  });

  it("takes --tensor-parallel-size N >= 1 (tensor-parallel serving: test/engine/tensor-parallel.test.ts)", () => {
    assert.equal(parseServeArgs("m", { tensorParallelSize: "2" }, {}).tensorParallelSize, 2);
    assert.throws(() => parseServeArgs("m", { tensorParallelSize: "0" }, {}), /--tensor-parallel-size must be an integer >= 1/);
    // vLLM's other parallel sizes: 1 is accepted (a pasted command line), more refused naming the alternative
    assert.equal(parseServeArgs("m", { pipelineParallelSize: "1", dataParallelSize: "1" }, {}).tensorParallelSize, 1);
    assert.throws(() => parseServeArgs("m", { pipelineParallelSize: "2" }, {}), /--pipeline-parallel-size > 1 is not supported: split the model with --tensor-parallel-size/);
    assert.throws(() => parseServeArgs("m", { dataParallelSize: "2" }, {}), /--data-parallel-size > 1 .* kiln router/);
    assert.throws(() => parseServeArgs("m", { dataParallelSize: "0" }, {}), /--data-parallel-size must be an integer >= 1/);
  });

  it("validates serve args", () => {
    const a = parseServeArgs("m", { port: "9000", servedModelName: ["a", "b"], kvCacheMemory: "2GiB", allowedOrigins: '["http://x"]' }, {});
    assert.equal(a.port, 9000);
    assert.equal(a.kvCacheMemoryBytes, 2 * 2 ** 30);
    assert.deepEqual(a.servedModelName, ["a", "b"]);
    assert.deepEqual(a.allowedOrigins, ["http://x"]);
    assert.equal(a.host, "0.0.0.0");
    assert.equal(a.asyncScheduling, null);
    assert.equal(a.enforceEager, false);
    const b = parseServeArgs("m", { asyncScheduling: false, enforceEager: true }, {});
    assert.equal(b.asyncScheduling, false);
    assert.equal(b.enforceEager, true);
    assert.equal(parseServeArgs(undefined, {}, { KILN_API_KEY: "k" }).apiKey, "k");
    assert.match(parseServeArgs(undefined, {}, {}).model, /models\/kiln-default$/);
    assert.equal(parseBytes("4G", "x"), 4e9);
    assert.throws(() => parseServeArgs("m", { gpuMemoryUtilization: "1.5" }), /--gpu-memory-utilization/);
    assert.throws(() => parseServeArgs("m", { allowedOrigins: "*" }), /--allowed-origins/);
    assert.throws(() => parseServeArgs("m", { maxModelLen: "abc" }), /--max-model-len/);
    assert.throws(() => parseServeArgs("m", { quantization: "q9" }), /--quantization/);
    assert.throws(() => parseServeArgs("m", { blockSize: "12" }), /--block-size/);
    // tool calling and structured output flags, as vLLM checks them
    assert.equal(parseServeArgs("m", {}, {}).toolCallParser, null);
    assert.equal(parseServeArgs("m", { enableAutoToolChoice: true, toolCallParser: "hermes" }, {}).toolCallParser, "hermes");
    assert.equal(parseServeArgs("m", { toolCallParser: "hermes" }, {}).toolCallParser, null); // parser alone: auto stays off
    assert.throws(() => parseServeArgs("m", { enableAutoToolChoice: true }, {}), /requires --tool-call-parser/);
    assert.throws(() => parseServeArgs("m", { enableAutoToolChoice: true, toolCallParser: "no_such_parser" }, {}), /--tool-call-parser must be one of hermes/);
    assert.equal(parseServeArgs("m", { enableAutoToolChoice: true, toolCallParser: "mistral" }, {}).toolCallParser, "mistral");
    assert.equal(parseServeArgs("m", { reasoningParser: "granite" }, {}).reasoningParser, "granite");
    assert.equal(parseServeArgs("m", { structuredOutputsConfig: '{"backend": "xgrammar", "disable_any_whitespace": true}' }, {}).disableAnyWhitespace, true);
    assert.equal(parseServeArgs("m", { guidedDecodingBackend: "xgrammar" }, {}).disableAnyWhitespace, false);
    // vLLM's other StructuredOutputsConfig switches are taken (no fallback backend; additional properties are guidance's)
    assert.equal(parseServeArgs("m", { structuredOutputsConfig: '{"backend": "xgrammar", "disable_fallback": true, "disable_additional_properties": false}' }, {}).disableAnyWhitespace, false);
    assert.throws(() => parseServeArgs("m", { structuredOutputsConfig: '{"disable_fallback": "yes"}' }, {}), /disable_fallback must be a boolean/);
    assert.throws(() => parseServeArgs("m", { structuredOutputsConfig: '{"backend": "outlines"}' }, {}), /backend must be auto or xgrammar/);
    assert.throws(() => parseServeArgs("m", { structuredOutputsConfig: "xgrammar" }, {}), /must be a JSON object/);
    assert.throws(() => parseServeArgs("m", { guidedDecodingBackend: "guidance" }, {}), /--guided-decoding-backend/);
    assert.deepEqual(parseServeArgs("m", { speculativeConfig: '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}' }, {}).speculativeConfig, {
      method: "ngram", numSpeculativeTokens: 3, promptLookupMax: 4, promptLookupMin: 1,
    });
    assert.throws(() => parseServeArgs("m", { speculativeConfig: '{"method": "medusa", "num_speculative_tokens": 3}' }, {}), /--speculative-config: method "medusa" is not supported/);
    assert.throws(() => parseServeArgs("m", { speculativeConfig: '{"method": "ngram", "num_speculative_tokens": 3, "model": "x"}' }, {}), /"model" does not apply to method "ngram"/);
    assert.throws(() => parseServeArgs("m", { speculativeConfig: '{"method": "ngram", "num_speculative_tokens": "3"}' }, {}), /num_speculative_tokens must be an integer in \[1, 16\], got "3"/);
    assert.throws(() => parseServeArgs("m", { speculativeConfig: '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5, "prompt_lookup_max": 2}' }, {}), /prompt_lookup_max \(2\) must be >= prompt_lookup_min \(5\)/);
    assert.throws(() => parseServeArgs("m", { speculativeConfig: '{"method": "ngram", "num_speculative_tokens": 3}', asyncScheduling: true }, {}), /cannot be combined/);
    // --kv-events-config: vLLM's JSON; engine_id defaults to the served URL (the machine's name for a wildcard host)
    const ev = '{"enable_kv_cache_events": true, "publisher": "nats", "endpoint": "nats://127.0.0.1:4222", "topic": "kv"}';
    assert.deepEqual(parseServeArgs("m", { kvEventsConfig: ev, host: "127.0.0.1", port: "8001" }, {}).kvEventsConfig, {
      enableKvCacheEvents: true, publisher: "nats", endpoint: "nats://127.0.0.1:4222", topic: "kv", engineId: "http://127.0.0.1:8001", dataParallelRank: null,
    });
    assert.match(parseServeArgs("m", { kvEventsConfig: ev, port: "8001" }, {}).kvEventsConfig!.engineId!, /^http:\/\/[^:]+:8001$/);
    assert.equal(parseServeArgs("m", { kvEventsConfig: ev.replace('"topic"', '"engine_id": "pod-3", "topic"'), port: "0" }, {}).kvEventsConfig!.engineId, "pod-3");
    assert.equal(parseServeArgs("m", { kvEventsConfig: '{"enable_kv_cache_events": false}' }, {}).kvEventsConfig, null);
    assert.equal(parseServeArgs("m", {}, {}).kvEventsConfig, null);
    assert.throws(() => parseServeArgs("m", { kvEventsConfig: ev, port: "0" }, {}), /with --port 0: give "engine_id"/);
    assert.throws(() => parseServeArgs("m", { kvEventsConfig: '{"enable_kv_cache_events": true, "publisher": "zmq"}' }, {}), /--kv-events-config: publisher must be one of null, nats/);
    assert.throws(() => parseServeArgs("m", { kvEventsConfig: "nats" }, {}), /--kv-events-config must be a JSON object/);
    // LoRA flags, as vLLM's --lora-modules takes them (name=path or JSON)
    const lora = parseServeArgs("m", { enableLora: true, loraModules: ["sql=/a/sql", '{"name": "chat", "path": "/a/chat", "base_model_name": "b"}'], maxLoras: "2" }, {});
    assert.deepEqual(lora.loraModules, [{ name: "sql", path: "/a/sql", baseModelName: null }, { name: "chat", path: "/a/chat", baseModelName: "b" }]);
    assert.equal(lora.maxLoras, 2);
    assert.throws(() => parseServeArgs("m", { loraModules: ["sql=/a"] }, {}), /--lora-modules needs --enable-lora/);
    assert.throws(() => parseServeArgs("m", { enableLora: true, loraModules: ["sql"] }, {}), /name=path or JSON/);
    assert.throws(() => parseServeArgs("m", { enableLora: true, loraModules: ["a=/x", "a=/y"] }, {}), /names "a" twice/);
    assert.throws(() => parseServeArgs("m", { enableLora: true, maxLoras: "4", maxCpuLoras: "2" }, {}), /--max-cpu-loras \(2\) must be >= --max-loras \(4\)/);
    // the pooling runner (embeddings), with vLLM's newer and older flag names
    assert.equal(parseServeArgs("m", {}, {}).runner, "generate");
    assert.equal(parseServeArgs("m", { runner: "pooling" }, {}).runner, "pooling");
    assert.equal(parseServeArgs("m", { task: "embed" }, {}).runner, "pooling");
    assert.deepEqual(parseServeArgs("m", { runner: "pooling", poolerConfig: '{"pooling_type": "MEAN", "normalize": false}' }, {}).poolerConfig, { poolingType: "MEAN", normalize: false });
    assert.deepEqual(parseServeArgs("m", { convert: "embed", overridePoolerConfig: '{"pooling_type": "CLS"}' }, {}).poolerConfig, { poolingType: "CLS" });
    assert.throws(() => parseServeArgs("m", { poolerConfig: '{"pooling_type": "MEAN"}' }, {}), /--pooler-config needs --runner pooling/);
    assert.throws(() => parseServeArgs("m", { runner: "pooling", poolerConfig: '{"pooling_type": "MAX"}' }, {}), /pooling_type must be LAST, MEAN or CLS/);
    assert.throws(() => parseServeArgs("m", { runner: "pooling", poolerConfig: '{"dimensions": 8}' }, {}), /"dimensions" is not supported/);
    assert.throws(() => parseServeArgs("m", { runner: "generate", task: "embed" }, {}), /--task embed needs --runner pooling/);
    assert.throws(() => parseServeArgs("m", { runner: "pooling", enableLora: true }, {}), /--enable-lora needs the generate runner/);
    assert.equal(parseServeArgs("m", { reasoningParser: "qwen3" }, {}).reasoningParser, "qwen3");
    assert.equal(parseServeArgs("m", {}, {}).reasoningParser, null);
    assert.throws(() => parseServeArgs("m", { reasoningParser: "o1" }, {}), /--reasoning-parser must be one of deepseek_r1, qwen3/);
    const tmp = mkdtempSync(join(tmpdir(), "kiln-cli-"));
    writeFileSync(join(tmp, "t.jinja"), "{{ messages[0].content }}");
    assert.equal(parseServeArgs("m", { chatTemplate: join(tmp, "t.jinja") }, {}).chatTemplate, "{{ messages[0].content }}");
    assert.equal(parseServeArgs("m", { chatTemplate: "{{ 'x' }}" }, {}).chatTemplate, "{{ 'x' }}");
    // an inline template's escapes are read as vLLM reads them (Python's unicode_escape); a file's text is as written
    const inline = String.raw`{% for m in messages %}{{ m.content }}\n\t\x41\u00e9\'\q{% endfor %}`;
    assert.equal(parseServeArgs("m", { chatTemplate: inline }, {}).chatTemplate, "{% for m in messages %}{{ m.content }}\n\tAé'\\q{% endfor %}");
    writeFileSync(join(tmp, "escaped.jinja"), inline);
    assert.equal(parseServeArgs("m", { chatTemplate: join(tmp, "escaped.jinja") }, {}).chatTemplate, inline);
    assert.throws(() => parseServeArgs("m", { chatTemplate: String.raw`{{ x }}\x4` }, {}), /--chat-template: a truncated \\x escape/);
    assert.throws(() => parseServeArgs("m", { chatTemplate: join(tmp, "missing.jinja") }, {}), /looks like a file path, but it cannot be opened/);
    assert.throws(() => parseServeArgs("m", { generationConfig: tmp }, {}), /has no generation_config.json/);
    writeFileSync(join(tmp, "generation_config.json"), '{"temperature": 0.1, "max_new_tokens": 7}');
    assert.equal(parseServeArgs("m", { generationConfig: tmp }, {}).generationConfig, tmp);
    // The directory's defaults replace the model's; "vllm" drops them; "auto" keeps the model's.
    const modelGen = { eosTokenIds: [], bosTokenId: null, padTokenId: null, raw: {}, temperature: 0.8, topK: 50 };
    assert.deepEqual(generationDefaults(tmp, modelGen), { temperature: 0.1, maxTokens: 7 });
    assert.deepEqual(generationDefaults("auto", modelGen), { temperature: 0.8, topK: 50 });
    assert.equal(generationDefaults("vllm", modelGen), undefined);
    rmSync(tmp, { recursive: true });
    assert.equal(parseServeArgs("m.gguf", { quantization: "gguf" }, {}).quantization, null, "a GGUF file keeps its own types");
    assert.throws(() => parseServeArgs("m", { quantization: "gguf" }, {}), /--quantization gguf needs a GGUF model/);
    assert.equal(parseServeArgs("m", {}, {}).logprobsMode, "raw_logprobs");
    assert.equal(parseServeArgs("m", { logprobsMode: "processed_logprobs" }, {}).logprobsMode, "processed_logprobs");
    assert.throws(() => parseServeArgs("m", { logprobsMode: "raw_logits" }, {}), /--logprobs-mode must be one of raw_logprobs, processed_logprobs/);
    assert.equal(parseServeArgs("m", {}, {}).kvCacheDtype, "auto");
    assert.equal(parseServeArgs("m", { kvCacheDtype: "bfloat16" }, {}).kvCacheDtype, "bfloat16");
    assert.equal(parseServeArgs("m", { kvCacheDtype: "fp8" }, {}).kvCacheDtype, "fp8");
    assert.throws(() => parseServeArgs("m", { kvCacheDtype: "fp8_e4m3fnuz" }, {}), /--kv-cache-dtype must be one of auto, float32, bfloat16, fp8, fp8_e4m3, fp8_e5m2/);
  });

  it("parses vLLM's tokenizer, logprobs, chunked prefill, generation config and front-end flags", () => {
    const tmp = mkdtempSync(join(tmpdir(), "kiln-cli-flags-"));
    try {
      const d = parseServeArgs("m", {}, {});
      assert.deepEqual(
        [d.tokenizer, d.maxLogprobs, d.enableChunkedPrefill, d.longPrefillTokenThreshold, d.overrideGenerationConfig],
        [null, 20, null, null, {}],
      );
      assert.deepEqual(
        [d.responseRole, d.returnTokensAsTokenIds, d.enableRequestIdHeaders, d.tls, d.rootPath, d.httpLogLevel, d.disableAccessLog, d.enableServerLoadTracking],
        ["assistant", false, false, null, null, null, false, false],
      );
      writeFileSync(join(tmp, "tokenizer.json"), "{}");
      const a = parseServeArgs("m", {
        tokenizer: tmp, maxLogprobs: "-1", enableChunkedPrefill: false, longPrefillTokenThreshold: "256",
        overrideGenerationConfig: '{"temperature": 0.5, "top_k": null, "max_new_tokens": 64}', responseRole: "bot",
        returnTokensAsTokenIds: true, enableRequestIdHeaders: true, rootPath: "/api/llm/", uvicornLogLevel: "warning",
        disableUvicornAccessLog: true, trustRemoteCode: true, disableFastapiDocs: true, enableServerLoadTracking: true,
      }, {});
      assert.deepEqual(
        [a.tokenizer, a.maxLogprobs, a.enableChunkedPrefill, a.longPrefillTokenThreshold, a.overrideGenerationConfig],
        [tmp, -1, false, 256, { temperature: 0.5, top_k: null, max_new_tokens: 64 }],
      );
      assert.deepEqual(
        [a.responseRole, a.returnTokensAsTokenIds, a.enableRequestIdHeaders, a.rootPath, a.httpLogLevel, a.disableAccessLog, a.enableServerLoadTracking],
        ["bot", true, true, "/api/llm", "warning", true, true],
      );
      assert.equal(parseServeArgs("m", { rootPath: "/" }, {}).rootPath, null);
      // HTTPS: the key from its own file, or from the certificate's (a PEM holding both, as Python's load_cert_chain reads it)
      const key = readFileSync(join(root, "test/fixtures/tls-key.pem"), "utf8");
      const cert = readFileSync(join(root, "test/fixtures/tls-cert.pem"), "utf8");
      assert.deepEqual(parseServeArgs("m", { sslKeyfile: join(root, "test/fixtures/tls-key.pem"), sslCertfile: join(root, "test/fixtures/tls-cert.pem") }, {}).tls, { key, cert });
      writeFileSync(join(tmp, "both.pem"), key + cert);
      assert.equal(parseServeArgs("m", { sslCertfile: join(tmp, "both.pem") }, {}).tls?.key, key + cert);
      // every wrong value names its flag
      const bad: [Record<string, unknown>, RegExp][] = [
        [{ tokenizer: join(tmp, "missing") }, /--tokenizer must be a local directory holding tokenizer.json/],
        [{ tokenizer: root }, /--tokenizer ".*": the directory has no tokenizer.json/],
        [{ maxLogprobs: "-2" }, /--max-logprobs must be an integer >= -1, got "-2"/],
        [{ maxLogprobs: "many" }, /--max-logprobs must be an integer/],
        [{ longPrefillTokenThreshold: "-1" }, /--long-prefill-token-threshold must be an integer >= 0/],
        [{ enableChunkedPrefill: false, maxModelLen: "4096", maxNumBatchedTokens: "2048" },
          /--max-num-batched-tokens \(2048\) must be >= --max-model-len \(4096\) with --no-enable-chunked-prefill/],
        [{ overrideGenerationConfig: "temperature=0.5" }, /--override-generation-config must be a JSON object/],
        [{ overrideGenerationConfig: '{"do_sample": false}' }, /--override-generation-config: "do_sample" is not a sampling default/],
        [{ overrideGenerationConfig: '{"top_p": 0}' }, /--override-generation-config: top_p must be a number in \(0, 1\] or null, got 0/],
        [{ overrideGenerationConfig: '{"max_new_tokens": 1.5}' }, /max_new_tokens must be an integer >= 1/],
        [{ responseRole: " " }, /--response-role must be a non-empty role name/],
        [{ rootPath: "api" }, /--root-path must be a URL path such as \/api\/llm, got "api"/],
        [{ uvicornLogLevel: "verbose" }, /--uvicorn-log-level must be one of critical, error, warning, info, debug, trace/],
        [{ sslKeyfile: join(root, "test/fixtures/tls-key.pem") }, /--ssl-keyfile needs --ssl-certfile/],
        [{ sslCertfile: join(tmp, "missing.pem") }, /--ssl-certfile ".*missing.pem" cannot be read: ENOENT/],
        [{ sslCertfile: join(root, "test/fixtures/tls-cert.pem") }, /--ssl-certfile \(no --ssl-keyfile: the key is read from it\): not a usable PEM key/],
        [{ sslKeyfile: join(tmp, "tokenizer.json"), sslCertfile: join(root, "test/fixtures/tls-cert.pem") }, /--ssl-keyfile \/ --ssl-certfile: not a usable/],
      ];
      for (const [o, re] of bad) assert.throws(() => parseServeArgs("m", o, {}), re, JSON.stringify(o));
      // --override-generation-config goes over --generation-config's source (a null unsets a key), also over "vllm"'s none
      const modelGen = { eosTokenIds: [], bosTokenId: null, padTokenId: null, raw: { temperature: 0.8, top_k: 50 }, temperature: 0.8, topK: 50 };
      assert.deepEqual(generationDefaults("auto", modelGen, { temperature: 0.5, top_k: null }), { temperature: 0.5 });
      assert.deepEqual(generationDefaults("vllm", modelGen, { max_new_tokens: 9 }), { maxTokens: 9 });
    } finally {
      rmSync(tmp, { recursive: true });
    }
  });

  it("generate samples with the model's generation config under the flags given, over its own defaults", async () => {
    const run = async (generationDefaults: Record<string, number> | undefined, ...argv: string[]): Promise<Record<string, unknown>> => {
      let params: Record<string, unknown> = {};
      const factory: EngineFactory = async () => ({
        engine: {
          async *generate(_prompt: unknown, p: Record<string, unknown>) {
            params = p;
            yield { outputs: [{ text: "" }], finished: true };
          },
        } as never,
        tokenizer: { encode: () => [1] } as never,
        maxModelLen: 64,
        modelName: "m",
        ...(generationDefaults ? { generationDefaults } : {}),
        close: async () => {},
      });
      // (the reply is empty: generate prints one empty line among the test runner's output)
      assert.equal(await main(["node", "kiln", "generate", "--prompt", "x", ...argv], { engineFactory: factory }), 0);
      return params;
    };
    const model = { temperature: 0.2, topK: 5, repetitionPenalty: 1.3, maxTokens: 9 };
    assert.deepEqual(await run(model, "--seed", "3"), { temperature: 0.2, topP: 1, topK: 5, repetitionPenalty: 1.3, maxTokens: 9, seed: 3 });
    assert.deepEqual(await run(model, "--temperature", "0", "--max-tokens", "4"), { temperature: 0, topP: 1, topK: 5, repetitionPenalty: 1.3, maxTokens: 4, seed: 0 });
    assert.deepEqual(await run(undefined), { temperature: 0.7, topP: 1, maxTokens: 256, seed: 0 });
  });

  it("--config: a YAML file of flags (snake or kebab case) under the command line's, as vLLM reads it", async () => {
    const tmp = mkdtempSync(join(tmpdir(), "kiln-cli-config-"));
    const serve = async (...argv: string[]): Promise<ServeArgs> => {
      let got: ServeArgs | null = null;
      const factory: EngineFactory = async (args) => {
        got = args;
        throw new CliUsageError("stop before loading");
      };
      const write = process.stderr.write;
      process.stderr.write = () => true; // main() prints the factory's stop
      try {
        assert.equal(await main(["node", "kiln", "serve", ...argv], { engineFactory: factory }), 2);
      } finally {
        process.stderr.write = write;
      }
      assert.ok(got, "the engine factory was reached");
      return got;
    };
    try {
      const file = join(tmp, "serve.yaml");
      writeFileSync(file, [
        "model: /models/from-config",
        "port: 9001",
        "max_model_len: 128",
        "enable-prefix-caching: false",
        "enforce_eager: yes # YAML 1.1, as PyYAML reads it",
        "served-model-name: [a, b]",
        "speculative_config: {method: ngram, num_speculative_tokens: 2}",
        "response_role: bot",
        "max_num_seqs: null",
        "",
      ].join("\n"));
      const a = await serve("--config", file, "--port", "0", "--served-model-name", "cli");
      assert.equal(a.model, "/models/from-config");
      assert.equal(a.port, 0, "the command line's flag wins");
      assert.deepEqual(a.servedModelName, ["cli"], "a list flag is replaced, not extended");
      assert.equal(a.maxModelLen, 128);
      assert.equal(a.enablePrefixCaching, false);
      assert.equal(a.enforceEager, true);
      assert.equal(a.speculativeConfig?.numSpeculativeTokens, 2);
      assert.equal(a.responseRole, "bot");
      assert.equal(a.maxNumSeqs, null);
      const b = await serve("/models/cli", "--config", file, "--enable-prefix-caching");
      assert.equal(b.model, "/models/cli", "the positional model wins over the file's");
      assert.equal(b.enablePrefixCaching, true);
      assert.deepEqual(b.servedModelName, ["a", "b"]);
      assert.equal(b.port, 9001);
      // errors name the file and the flag, before anything loads
      writeFileSync(join(tmp, "bad.yaml"), "bogus_flag: 1\n");
      writeFileSync(join(tmp, "value.yaml"), "max_model_len: lots\n");
      writeFileSync(join(tmp, "list.yaml"), "- port\n");
      writeFileSync(join(tmp, "flags.json"), "{}");
      const cases: [string, RegExp][] = [
        [join(tmp, "bad.yaml"), /--config .*bad.yaml: unknown option '--bogus-flag'/],
        [join(tmp, "value.yaml"), /--max-model-len must be an integer >= 1, got "lots"/],
        [join(tmp, "list.yaml"), /the file must be a mapping of flag names to values/],
        [join(tmp, "flags.json"), /--config must be a .yaml or .yml file/],
        [join(tmp, "missing.yaml"), /--config ".*missing.yaml" cannot be read: ENOENT/],
      ];
      for (const [f, re] of cases) {
        const r = kiln("serve", "--config", f);
        assert.equal(r.status, 2, r.stderr);
        assert.match(r.stderr, re);
      }
    } finally {
      rmSync(tmp, { recursive: true });
    }
  });

  it("serve starts, answers, and drains in-flight streams on SIGTERM", async () => {
    const { child, url, stderr } = await spawnServe(["--host", "127.0.0.1", "--port", "0", "--served-model-name", "m1"]);
    assert.match(stderr(), /loading weights/);
    assert.match(stderr(), /warm-up/);
    const res = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "m1", prompt: "drain", max_tokens: 30, stream: true, ignore_eos: true }),
    });
    assert.equal(res.status, 200);
    const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
    child.kill("SIGTERM");
    const body = await res.text(); // the in-flight stream still completes
    assert.match(body, /"finish_reason":"length"/);
    assert.ok(body.trimEnd().endsWith("data: [DONE]"));
    assert.equal(await exited, 0);
    assert.match(stderr(), /draining 1 in-flight/);
  });
});

it("init-model --set values are JSON where they parse (objects such as rope_scaling included), else text; empty is refused", () => {
  assert.equal(configValue("num_hidden_layers", "4"), 4);
  assert.equal(configValue("tie_word_embeddings", "true"), true);
  assert.equal(configValue("sliding_window", "null"), null);
  assert.equal(configValue("hidden_act", "silu"), "silu");
  assert.deepEqual(configValue("rope_scaling", '{"rope_type":"longrope","short_factor":[1,2],"long_factor":[3,4]}'), { rope_type: "longrope", short_factor: [1, 2], long_factor: [3, 4] });
  assert.throws(() => configValue("rope_theta", ""), /--set rope_theta= needs a value/);
});
