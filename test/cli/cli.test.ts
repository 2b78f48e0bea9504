// The `kiln` command line: flag errors, and `serve` end to end (progress, banner, graceful SIGTERM drain).
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { generationDefaults } from "../../src/cli/engine-factory.js";
import { parseBytes, parseServeArgs } from "../../src/cli/serve-args.js";

const root = fileURLToPath(new URL("../../..", import.meta.url)); // dist/test/cli -> package root
const kiln = (...args: string[]) => spawnSync(`${root}/bin/kiln`, args, { encoding: "utf8", timeout: 10_000 });

describe("kiln CLI", () => {
  it("rejects unknown flags, naming the flag", () => {
    const r = kiln("serve", "--bogus-flag");
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /--bogus-flag/);
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

  it("rejects --tensor-parallel-size > 1 clearly", () => {
    const r = kiln("serve", "--tensor-parallel-size", "2");
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /not supported until distributed lands/);
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
    assert.throws(() => parseServeArgs("m", { enableAutoToolChoice: true, toolCallParser: "mistral" }, {}), /--tool-call-parser must be one of hermes/);
    assert.equal(parseServeArgs("m", { structuredOutputsConfig: '{"backend": "xgrammar", "disable_any_whitespace": true}' }, {}).disableAnyWhitespace, true);
    assert.equal(parseServeArgs("m", { guidedDecodingBackend: "xgrammar" }, {}).disableAnyWhitespace, false);
    assert.throws(() => parseServeArgs("m", { structuredOutputsConfig: '{"backend": "outlines"}' }, {}), /backend must be auto or xgrammar/);
    assert.throws(() => parseServeArgs("m", { structuredOutputsConfig: "xgrammar" }, {}), /must be a JSON object/);
    assert.throws(() => parseServeArgs("m", { guidedDecodingBackend: "guidance" }, {}), /--guided-decoding-backend/);
    assert.deepEqual(parseServeArgs("m", { speculativeConfig: '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}' }, {}).speculativeConfig, {
      method: "ngram", numSpeculativeTokens: 3, promptLookupMax: 4, promptLookupMin: 1,
    });
    assert.throws(() => parseServeArgs("m", { speculativeConfig: '{"method": "eagle", "num_speculative_tokens": 3}' }, {}), /--speculative-config: method "eagle" is not supported/);
    assert.throws(() => parseServeArgs("m", { speculativeConfig: '{"method": "ngram", "num_speculative_tokens": 3, "model": "x"}' }, {}), /"model" is not supported/);
    assert.throws(() => parseServeArgs("m", { speculativeConfig: '{"method": "ngram", "num_speculative_tokens": "3"}' }, {}), /num_speculative_tokens must be an integer in \[1, 16\], got "3"/);
    assert.throws(() => parseServeArgs("m", { speculativeConfig: '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5, "prompt_lookup_max": 2}' }, {}), /prompt_lookup_max \(2\) must be >= prompt_lookup_min \(5\)/);
    assert.throws(() => parseServeArgs("m", { speculativeConfig: '{"method": "ngram", "num_speculative_tokens": 3}', asyncScheduling: true }, {}), /cannot be combined/);
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

  it("serve starts, answers, and drains in-flight streams on SIGTERM", async () => {
    const child = spawn(process.execPath, [`${root}/dist/test/cli/serve-fixture.js`, "serve", "--host", "127.0.0.1", "--port", "0", "--served-model-name", "m1"], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stderr.on("data", (d) => (stderr += d));
    const url = await new Promise<string>((resolve, reject) => {
      child.stdout.on("data", (d) => {
        stdout += d;
        const m = /Kiln serving m1 at (http:\/\/\S+)\/v1/.exec(stdout);
        if (m) resolve(m[1]!);
      });
      child.on("exit", () => reject(new Error(`exited early: ${stderr}`)));
    });
    assert.match(stderr, /loading weights/);
    assert.match(stderr, /warm-up/);
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
    assert.match(stderr, /draining 1 in-flight/);
  });
});
