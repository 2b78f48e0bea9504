// vLLM's model and loader flags on `kiln serve`: --hf-config-path (another directory's config.json), --ignore-patterns
// (weight files left unread), --hf-token, --logits-processor-pattern, --log-config-file, and those Kiln accepts
// saying what applies or refuses saying why (--config-format, --model-impl, --override-attention-dtype,
// --model-loader-extra-config, --lora-dtype, --additional-config, --middleware, --tool-server, --tokens-only,
// --enable-per-request-metrics).
import assert from "node:assert/strict";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { servingArgsOf } from "../../src/cli/engine-factory.js";
import { parseServeArgs, type ServeArgs } from "../../src/cli/serve-args.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { globToRegExp } from "../../src/models/model-dir.js";
import { createServer } from "../../src/server/index.js";
import { startKiln } from "../e2e/kiln-process.js";
import { tinyModelDir } from "../helpers/tiny-model.js";
import { FakeEngine } from "../server/fake-engine.js";
import { MODEL } from "../server/helpers.js";

const parse = (o: Record<string, unknown>, model = "org/hub-model", env: NodeJS.ProcessEnv = {}): ServeArgs => parseServeArgs(model, o, env);
const noProgress = () => undefined;

let tmp: string;
before(() => (tmp = mkdtempSync(join(tmpdir(), "kiln-loader-flags-"))));
after(() => rmSync(tmp, { recursive: true, force: true }));

describe("--hf-config-path", () => {
  it("the other directory's config.json is served: its max_position_embeddings is /v1/models' max_model_len", { timeout: 60_000 }, async () => {
    const model = tinyModelDir("LlamaForCausalLM");
    const config = JSON.parse(readFileSync(join(model, "config.json"), "utf8")) as { max_position_embeddings: number };
    const other = join(tmp, "other-config");
    mkdirSync(other);
    const len = config.max_position_embeddings - 17;
    writeFileSync(join(other, "config.json"), JSON.stringify({ ...config, max_position_embeddings: len }));
    const server = await startKiln(["--hf-config-path", other]);
    try {
      const models = (await (await fetch(`${server.url}/v1/models`)).json()) as { data: { max_model_len: number }[] };
      assert.equal(models.data[0]!.max_model_len, len);
    } finally {
      assert.equal(await server.stop(), 0);
    }
  });

  it("the flag: a local directory holding config.json, reaching the engine", () => {
    const dir = join(tmp, "cfg");
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "config.json"), "{}");
    assert.equal(servingArgsOf(parse({ hfConfigPath: dir }), noProgress).hfConfigPath, dir);
    assert.equal(parse({}).hfConfigPath, null);
    assert.throws(() => parse({ hfConfigPath: join(tmp, "none") }), /--hf-config-path must be a local directory holding config.json/);
    assert.throws(() => parse({ hfConfigPath: tmp }), /--hf-config-path .*: the directory has no config.json/);
  });
});

describe("--ignore-patterns", () => {
  it("a weight file matched is not read: a broken shard beside the model is left out", () => {
    const model = tinyModelDir("LlamaForCausalLM");
    const dir = join(tmp, "two-files");
    mkdirSync(dir);
    for (const f of ["config.json", "tokenizer.json", "tokenizer_config.json"]) copyFileSync(join(model, f), join(dir, f));
    copyFileSync(join(model, "model.safetensors"), join(dir, "weights.safetensors"));
    writeFileSync(join(dir, "consolidated.safetensors"), "not a safetensors file"); // listed first
    assert.throws(() => loadLocalModel(dir, { dtype: "float32" }), /consolidated\.safetensors/);
    const loaded = loadLocalModel(dir, { dtype: "float32", ignorePatterns: ["consolidated*"] });
    assert.equal(loaded.config.architecture, "LlamaForCausalLM");
  });

  it("the flag: globs (vLLM's default original/**/*), reaching the engine; an absolute path is a usage error", () => {
    assert.deepEqual(parse({}).ignorePatterns, ["original/**/*"]);
    assert.deepEqual(servingArgsOf(parse({ ignorePatterns: ["*.pt", "consolidated*"] }), noProgress).ignorePatterns, ["*.pt", "consolidated*"]);
    assert.throws(() => parse({ ignorePatterns: ["/abs/*.safetensors"] }), /--ignore-patterns takes glob patterns relative to the model directory/);
    assert.ok(globToRegExp("model-0000[1-2]-of-*.safetensors").test("model-00002-of-00003.safetensors"));
    assert.ok(!globToRegExp("model-0000[!1]-*").test("model-00001-x"));
    assert.ok(globToRegExp("original/**/*").test("original/a/b.pth"));
    assert.ok(!globToRegExp("a.b").test("axb"));
  });
});

describe("--logits-processor-pattern", () => {
  const complete = async (pattern: string | null, body: Record<string, unknown>) => {
    const engine = new FakeEngine();
    const app = createServer({ engine, tokenizer: engine.tokenizer, servedModelNames: [MODEL], maxModelLen: engine.maxModelLen, version: "t", logitsProcessorPattern: pattern });
    try {
      const r = await app.inject({ method: "POST", url: "/v1/completions", payload: { model: MODEL, prompt: "hi", max_tokens: 2, ...body } });
      return { status: r.statusCode, body: r.json<{ error: { message: string; param: string } }>() };
    } finally {
      await app.close();
    }
  };

  it("a request listing logits_processors gets a 400 naming the pattern (none without the flag); one without them is served", async () => {
    assert.equal((await complete(null, {})).status, 200);
    const none = await complete(null, { logits_processors: ["my.mod.Proc"] });
    assert.equal(none.status, 400);
    assert.match(none.body.error.message, /started without --logits-processor-pattern/);
    assert.equal(none.body.error.param, "logits_processors");
    const outside = await complete("my\\.mod\\..*", { logits_processors: ["other.Proc"] });
    assert.equal(outside.status, 400);
    assert.match(outside.body.error.message, /Logits processor 'other.Proc' is not allowed by this server's --logits-processor-pattern "my\\\\.mod\\\\..\*"/);
    const inside = await complete("my\\.mod\\..*", { logits_processors: [{ qualname: "my.mod.Proc" }] });
    assert.equal(inside.status, 400);
    assert.match(inside.body.error.message, /Per-request logits processors are not supported .*--logits-processors/);
    assert.equal((await complete("my", { logits_processors: [] })).status, 200);
  });

  it("the flag: a regular expression, reaching the server's options", () => {
    assert.equal(parse({ logitsProcessorPattern: "^my\\." }).logitsProcessorPattern, "^my\\.");
    assert.throws(() => parse({ logitsProcessorPattern: "(" }), /--logits-processor-pattern must be a regular expression, got "\("/);
  });
});

describe("--log-config-file", () => {
  it("the vllm logger's level is the log level and uvicorn's the HTTP log's; VLLM_LOGGING_CONFIG_PATH is read too", () => {
    const file = join(tmp, "logging.json");
    writeFileSync(file, JSON.stringify({ version: 1, handlers: {}, loggers: { vllm: { level: "DEBUG" }, uvicorn: { level: "WARNING" } } }));
    const a = parse({ logConfigFile: file });
    assert.deepEqual([a.logLevel, a.httpLogLevel], ["debug", "warning"]);
    assert.match(a.warnings.join("\n"), /--log-config-file: only the loggers' levels are used/);
    assert.equal(parse({}, "m", { VLLM_LOGGING_CONFIG_PATH: file }).logLevel, "debug");
    writeFileSync(file, JSON.stringify({ root: { level: 40 } }));
    assert.equal(parse({ logConfigFile: file }).logLevel, "error");
    writeFileSync(file, JSON.stringify({ loggers: { vllm: { level: "LOUD" } } }));
    assert.throws(() => parse({ logConfigFile: file }), /--log-config-file: loggers.vllm's level must be a Python logging level/);
    writeFileSync(file, "[1]");
    assert.throws(() => parse({ logConfigFile: file }), /--log-config-file .* must be a JSON object/);
    assert.throws(() => parse({ logConfigFile: join(tmp, "none.json") }), /--log-config-file .* cannot be read: ENOENT/);
  });
});

describe("model flags accepted or refused", () => {
  it("--hf-token reaches the loader (a local model says it is unused); bare, HF_TOKEN's is used", () => {
    assert.equal(servingArgsOf(parse({ hfToken: "hf_abc" }), noProgress).hfToken, "hf_abc");
    assert.equal(parse({ hfToken: true }).hfToken, null);
    assert.match(parse({ hfToken: "hf_abc" }, tmp).warnings.join("\n"), /--hf-token: no effect: .* is a local path/);
  });

  it("--config-format and --model-impl: Kiln's config.json and models; mistral, transformers and terratorch refused", () => {
    assert.deepEqual(parse({ configFormat: "hf", modelImpl: "vllm" }).warnings, []);
    assert.throws(() => parse({ configFormat: "mistral" }), /--config-format mistral is not supported: .*params.json/);
    assert.throws(() => parse({ configFormat: "yaml" }), /--config-format must be one of auto, hf, mistral/);
    assert.throws(() => parse({ modelImpl: "transformers" }), /--model-impl transformers is not supported/);
    assert.throws(() => parse({ modelImpl: "terratorch" }), /--model-impl terratorch is not supported/);
    assert.throws(() => parse({ modelImpl: "jax" }), /--model-impl must be one of auto, vllm, transformers, terratorch/);
  });

  it("--override-attention-dtype, --lora-dtype, --additional-config: accepted, saying what Kiln computes in", () => {
    assert.deepEqual(parse({ overrideAttentionDtype: "float32", loraDtype: "auto", additionalConfig: "{}" }).warnings, []);
    const w = parse({ overrideAttentionDtype: "bfloat16", loraDtype: "float16", additionalConfig: '{"tpu_thing": 1}' }).warnings.join("\n");
    assert.match(w, /--override-attention-dtype bfloat16: attention computes in float32/);
    assert.match(w, /--lora-dtype float16: LoRA adapters are held and applied in float32/);
    assert.match(w, /--additional-config: no effect: .*\(tpu_thing\)/);
    assert.throws(() => parse({ overrideAttentionDtype: "int8" }), /--override-attention-dtype must be one of/);
    assert.throws(() => parse({ loraDtype: "fp8" }), /--lora-dtype must be one of auto, float16, bfloat16, float32/);
    assert.throws(() => parse({ additionalConfig: "x=1" }), /--additional-config must be a JSON object/);
  });

  it("--model-loader-extra-config: the safetensors loader's keys accepted (said), others named", () => {
    assert.match(parse({ modelLoaderExtraConfig: '{"enable_multithread_load": true, "num_threads": 8}' }).warnings.join("\n"), /--model-loader-extra-config: no effect: .*memory-mapped/);
    assert.throws(() => parse({ modelLoaderExtraConfig: '{"distributed": true}' }), /unexpected keys for --load-format auto: distributed \(it takes enable_multithread_load, num_threads\)/);
    assert.throws(() => parse({ modelLoaderExtraConfig: '{"num_threads": 8}', loadFormat: "dummy" }), /unexpected keys for --load-format dummy: num_threads \(it takes none\)/);
    assert.throws(() => parse({ modelLoaderExtraConfig: '{"num_threads": 0}' }), /num_threads must be an integer >= 1/);
    assert.throws(() => parse({ modelLoaderExtraConfig: "[]" }), /--model-loader-extra-config must be a JSON object/);
  });

  it("--middleware, --tool-server, --tokens-only and --enable-per-request-metrics are refused, saying why", () => {
    assert.throws(() => parse({ middleware: "my.Middleware" }), /--middleware is not supported: it names a Python ASGI middleware/);
    assert.throws(() => parse({ toolServer: "demo" }), /--tool-server is not supported: Kiln runs no built-in \(demo\) or MCP tool servers/);
    assert.throws(() => parse({ tokensOnly: true }), /--tokens-only is not supported/);
    assert.throws(() => parse({ enablePerRequestMetrics: true }), /--enable-per-request-metrics is not supported/);
  });
});

describe("--skip-tokenizer-init", () => {
  it("a model without tokenizer.json is served: token-id prompts get token ids and empty text; text, chat and stop strings get 400s", { timeout: 90_000 }, async () => {
    const model = tinyModelDir("LlamaForCausalLM");
    const dir = join(tmp, "no-tokenizer");
    mkdirSync(dir);
    for (const f of ["config.json", "model.safetensors"]) copyFileSync(join(model, f), join(dir, f));
    const server = await startKiln(["--skip-tokenizer-init", "--max-model-len", "64"], dir);
    try {
      const post = async (path: string, body: Record<string, unknown>) => {
        const r = await fetch(`${server.url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: dir, ...body }) });
        return { status: r.status, body: (await r.json()) as Record<string, unknown> };
      };
      const ok = await post("/v1/completions", { prompt: [5, 6, 7], max_tokens: 4, ignore_eos: true, temperature: 0, return_token_ids: true });
      assert.equal(ok.status, 200, JSON.stringify(ok.body));
      const choice = (ok.body.choices as { text: string; token_ids: number[]; prompt_token_ids: number[] }[])[0]!;
      assert.equal(choice.text, "");
      assert.equal(choice.token_ids.length, 4);
      assert.deepEqual(choice.prompt_token_ids, [5, 6, 7]);
      const batch = await post("/v1/completions", { prompt: [[5, 6], [7]], max_tokens: 2, ignore_eos: true, logprobs: 1 });
      assert.equal(batch.status, 200, JSON.stringify(batch.body));
      // logprobs are served too (with no vocabulary to spell their tokens)
      const tokens = (batch.body.choices as { logprobs: { tokens: string[] } }[])[0]!.logprobs.tokens;
      assert.equal(tokens.length, 2);
      const streamed = await fetch(`${server.url}/v1/completions`, {
        method: "POST", headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: dir, prompt: [5, 6, 7], max_tokens: 3, ignore_eos: true, stream: true, return_token_ids: true }),
      });
      const chunks = (await streamed.text()).split("\n").filter((l) => l.startsWith("data: {")).map((l) => JSON.parse(l.slice(6)) as { choices: { text: string; token_ids?: number[] }[] });
      assert.equal(chunks.flatMap((c) => c.choices[0]?.token_ids ?? []).length, 3);
      assert.equal(chunks.map((c) => c.choices[0]?.text ?? "").join(""), "");
      const errorOf = (r: { body: Record<string, unknown> }) => r.body.error as { message: string; param: string | null };
      const text = await post("/v1/completions", { prompt: "Hello", max_tokens: 2 });
      assert.equal(text.status, 400);
      assert.match(errorOf(text).message, /prompt must be token ids .*--skip-tokenizer-init/);
      const stop = await post("/v1/completions", { prompt: [5], max_tokens: 2, stop: ["x"] });
      assert.equal(stop.status, 400);
      assert.match(errorOf(stop).message, /stop strings are not supported: .*use stop_token_ids/);
      const chat = await post("/v1/chat/completions", { messages: [{ role: "user", content: "Hi" }], max_tokens: 2 });
      assert.equal(chat.status, 400, JSON.stringify(chat.body));
      assert.match(errorOf(chat).message, /needs the tokenizer, and the server was started with --skip-tokenizer-init/);
      const detok = await post("/detokenize", { tokens: [5, 6] });
      assert.equal(detok.status, 400, JSON.stringify(detok.body));
      assert.match(errorOf(detok).message, /detokenizing needs the tokenizer, and the server was started with --skip-tokenizer-init/);
    } finally {
      assert.equal(await server.stop(), 0);
    }
  });

  it("the flag reaches the engine's arguments", () => {
    assert.equal(servingArgsOf(parse({ skipTokenizerInit: true }), noProgress).skipTokenizerInit, true);
    assert.equal(servingArgsOf(parse({}), noProgress).skipTokenizerInit, undefined);
    assert.throws(() => parse({ skipTokenizerInit: true, reasoningParser: "qwen3" }), /--reasoning-parser reads the tokenizer: it cannot be combined with --skip-tokenizer-init/);
    assert.throws(() => parse({ skipTokenizerInit: true, enableAutoToolChoice: true, toolCallParser: "hermes" }), /--tool-call-parser reads the tokenizer/);
  });
});
