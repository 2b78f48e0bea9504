// Engine-level logits processors (vLLM v1 `logits_processors`): loading by specifier with typed errors, the
// sampler's order (before penalties / after temperature), per-request state hooks, extra_args validation, and
// the same processor file working in-process (LLM) and in the engine worker (WorkerEngine).
import assert from "node:assert/strict";
import * as path from "node:path";
import { after, before, test } from "node:test";
import { EngineCore } from "../../src/engine/engine-core.js";
import { EngineInputError } from "../../src/engine/errors.js";
import { FakeModelRunner } from "../../src/engine/fake-model-runner.js";
import { LLM } from "../../src/engine/llm-engine.js";
import {
  LogitsProcessorLoadError,
  instantiateLogitsProcessors,
  loadLogitsProcessors,
  parseLogitsProcessorSpecifier,
  type LogitsProcessor,
  type LogitsProcessorInput,
  type LogitsProcessorRow,
} from "../../src/engine/logits-processors.js";
import type { ServingArgs } from "../../src/engine/serving.js";
import type { RequestOutput } from "../../src/engine/types.js";
import { WorkerEngine } from "../../src/engine/worker-engine.js";
import { tinyModelDir } from "../helpers/tiny-model.js";
import { writeBanTokenProcessor } from "./ban-token-processor.js";
import { VOCAB, prompt, runToCompletion, tokenizer } from "./helpers.js";

interface BanTokenLike extends LogitsProcessor {
  added: string[];
  removed: string[];
}

let file: string;
before(() => {
  file = writeBanTokenProcessor();
});

const isLoadError = (specifier: string, message: RegExp) => (e: unknown) =>
  e instanceof LogitsProcessorLoadError && e.specifier === specifier && message.test(e.message) && e.message.includes(specifier);

test("logits processors: specifiers load by path (relative to cwd), export name or default export", async () => {
  assert.deepEqual(parseLogitsProcessorSpecifier("a/b.mjs:BanToken"), { module: "a/b.mjs", exportName: "BanToken" });
  assert.deepEqual(parseLogitsProcessorSpecifier("my-package"), { module: "my-package", exportName: "default" });
  assert.deepEqual(parseLogitsProcessorSpecifier("C:\\procs\\p.mjs"), { module: "C:\\procs\\p.mjs", exportName: "default" });
  assert.deepEqual(parseLogitsProcessorSpecifier("file:///x/p.mjs:P"), { module: "file:///x/p.mjs", exportName: "P" });
  const dir = path.dirname(file);
  const [named, byDefault, relative] = await loadLogitsProcessors([`${file}:BanToken`, file, "ban-token.mjs:BanToken"], dir);
  assert.equal(typeof named, "function");
  assert.equal(byDefault, named);
  assert.equal(relative, named);
  const [inst] = instantiateLogitsProcessors([named!], { vocabSize: 10 });
  assert.equal((inst as unknown as { vocabSize: number }).vocabSize, 10);
});

test("logits processors: a bad specifier is a LogitsProcessorLoadError naming it", async () => {
  const dir = path.dirname(file);
  await assert.rejects(loadLogitsProcessors(["./missing.mjs"], dir), isLoadError("./missing.mjs", /import failed/));
  await assert.rejects(loadLogitsProcessors(["no-such-package-kiln:X"], dir), isLoadError("no-such-package-kiln:X", /import failed/));
  await assert.rejects(loadLogitsProcessors([`${file}:Nope`]), isLoadError(`${file}:Nope`, /no export "Nope" \(exports: .*BanToken/));
  await assert.rejects(loadLogitsProcessors([`${file}:notAProcessor`]), isLoadError(`${file}:notAProcessor`, /neither a class nor/));
  await assert.rejects(loadLogitsProcessors(["broken.mjs"], dir), isLoadError("broken.mjs", /import failed/));
  const [throws] = await loadLogitsProcessors([`${file}:Throws`]);
  assert.throws(
    () => instantiateLogitsProcessors([throws!], { vocabSize: 4 }, ["p.mjs:Throws"]),
    isLoadError("p.mjs:Throws", /constructor threw: no GPU here/),
  );
  assert.throws(() => instantiateLogitsProcessors([{} as LogitsProcessor], { vocabSize: 4 }), /no apply/);
});

/** An EngineCore over the fake runner where token 7 always wins, then 9. */
function engineWith(logitsProcessors: readonly LogitsProcessorInput[], seenRaw?: (row: Float32Array) => void): EngineCore {
  const runner = new FakeModelRunner(VOCAB, {
    override: (_ctx, row) => {
      row[7] = 50;
      row[9] = 40;
      seenRaw?.(row);
    },
  });
  return new EngineCore({ maxModelLen: 256, numGpuBlocks: 128, blockSize: 4 }, runner, { tokenizer, logitsProcessors });
}

test("logits processors: non-argmax-invariant ones run before penalties, argmax-invariant ones after temperature", () => {
  const calls: string[] = [];
  const before: LogitsProcessor = {
    apply(logits, rows, V) {
      calls.push(`before:${rows.length}`);
      // penalties come later: token 7 (in the prompt, repetition_penalty 2) still has its raw logit
      rows.forEach((row, r) =>
        assert.equal(logits[r * V + 7], row.params.logitBias?.[7] === undefined ? 50 : 50 + row.params.logitBias[7]!),
      );
    },
  };
  class After implements LogitsProcessor {
    isArgmaxInvariant(): boolean {
      return true;
    }
    apply(logits: Float32Array, rows: readonly LogitsProcessorRow[], V: number): void {
      calls.push(`after:${rows.length}`);
      rows.forEach((row, r) => {
        if (row.params.temperature === 0.5) assert.equal(logits[r * V + 7], 50 / 2 / 0.5); // penalized, then temperature-scaled
      });
    }
  }
  const core = engineWith([before, After]);
  core.addRequest({ requestId: "g", promptTokenIds: [7, 3, 4], params: { temperature: 0, maxTokens: 2, repetitionPenalty: 2 } });
  runToCompletion(core);
  assert.deepEqual(calls, ["before:1", "before:1"], "greedy-only steps skip argmax-invariant processors");
  calls.length = 0;
  core.addRequest({ requestId: "r", promptTokenIds: [7, 3, 4], params: { temperature: 0.5, seed: 1, maxTokens: 2, repetitionPenalty: 2 } });
  core.addRequest({ requestId: "g2", promptTokenIds: [5, 6], params: { temperature: 0, maxTokens: 2, logitBias: { 7: -1 } } });
  runToCompletion(core);
  assert.deepEqual(calls, ["before:2", "after:2", "before:2", "after:2"]);
});

test("logits processors: per-request function processors still run in-process, before penalties", () => {
  const seen: number[] = [];
  const core = engineWith([]);
  core.addRequest({
    requestId: "f",
    promptTokenIds: [7, 3],
    params: { temperature: 0, maxTokens: 3, repetitionPenalty: 100, logitsProcessors: [(_out, l) => void seen.push(l[7]!)] },
  });
  const out = runToCompletion(core).get("f")!.outputs[0]!;
  assert.deepEqual(seen, [50, 50, 50]);
  assert.equal(out.tokenIds[0], 9); // 50 / 100 < 40 once penalized
});

test("logits processors: in-process LLM bans a token per request via extraArgs; hooks track requests; bad extra_args is a 400-style error", async () => {
  const [BanToken] = await loadLogitsProcessors([`${file}:BanToken`]);
  const llm = new LLM({
    runner: new FakeModelRunner(VOCAB, { override: (_c, row) => ((row[7] = 50), (row[9] = 40)) }),
    tokenizer,
    engineArgs: { maxModelLen: 256, numGpuBlocks: 128, blockSize: 4 },
    logitsProcessors: [BanToken!],
  });
  const proc = llm.engine.sampler.logitsProcessors.nonArgmaxInvariant[0] as BanTokenLike;
  const prompts = [{ promptTokenIds: prompt(1, 5) }, { promptTokenIds: prompt(2, 5) }];
  const [banned, free] = llm.generate(prompts, [
    { temperature: 0, maxTokens: 4, ignoreEos: true, extraArgs: { ban_token: 7 } },
    { temperature: 0, maxTokens: 4, ignoreEos: true },
  ]);
  assert.deepEqual(banned!.outputs[0]!.tokenIds, [9, 9, 9, 9]);
  assert.deepEqual(free!.outputs[0]!.tokenIds, [7, 7, 7, 7]);
  assert.deepEqual(proc.added, ["0", "1"]);
  // n > 1: each sample is its own engine request; finished requests are released at the next step
  const [multi] = llm.generate([prompts[0]!], {
    temperature: 1,
    seed: 3,
    n: 2,
    maxTokens: 3,
    ignoreEos: true,
    extraArgs: { ban_token: 7 },
  });
  for (const o of multi!.outputs) assert.ok(!o.tokenIds.includes(7));
  assert.deepEqual(proc.added, ["0", "1", "0_2", "1_2"]);
  assert.deepEqual(proc.removed, ["0", "1"]);
  assert.throws(
    () => llm.generate(prompts, { extraArgs: { ban_token: "seven" } }),
    (e: unknown) => e instanceof EngineInputError && e.param === "extra_args" && /ban_token must be a token id/.test(e.message),
  );
  assert.throws(
    () => llm.generate(prompts, { extraArgs: { f: (() => 1) as unknown as string } }),
    (e: unknown) => e instanceof EngineInputError && e.param === "extra_args",
  );
  assert.equal(llm.engine.hasUnfinishedRequests(), false);
});

// The same processor file in the engine worker, steered by extraArgs, gives the in-process LLM's greedy output.
let args: ServingArgs;
let engine: WorkerEngine | null = null;
after(async () => {
  await engine?.close();
});

async function collect(it: AsyncIterable<RequestOutput>): Promise<RequestOutput> {
  let last: RequestOutput | null = null;
  for await (const o of it) last = o;
  return last!;
}

test("logits processors: the worker engine loads them at start-up and applies them per extraArgs", { timeout: 120_000 }, async () => {
  args = { model: tinyModelDir("LlamaForCausalLM"), maxModelLen: 256, kvCacheMemory: 2 * 1024 ** 2 };
  const spec = `${file}:BanToken`;
  engine = await WorkerEngine.create({ ...args, logitsProcessors: [spec] });
  const ids = engine.tokenizer.encode("The jury said");
  const params = { temperature: 0, maxTokens: 12, ignoreEos: true };
  const free = (await collect(engine.generate({ promptTokenIds: ids }, params, { requestId: "free" }))).outputs[0]!.tokenIds;
  const ban = free[0]!;
  const bannedParams = { ...params, extraArgs: { ban_token: ban } };
  const banned = (await collect(engine.generate({ promptTokenIds: ids }, bannedParams, { requestId: "banned" }))).outputs[0]!.tokenIds;
  assert.ok(!banned.includes(ban), `token ${ban} was banned: ${banned.join(",")}`);
  assert.notDeepEqual(banned, free);
  // the in-process LLM with the same processor class gives the same tokens
  const [BanToken] = await loadLogitsProcessors([spec]);
  const [ref] = new LLM({ ...args, logitsProcessors: [BanToken!] }).generate([{ promptTokenIds: ids }], bannedParams);
  assert.deepEqual(banned, ref!.outputs[0]!.tokenIds);
  // validateParams runs in the worker; its error comes back as EngineInputError("extra_args")
  await assert.rejects(
    collect(engine.generate({ promptTokenIds: ids }, { extraArgs: { ban_token: -1 } }, { requestId: "bad" })),
    (e: unknown) => e instanceof EngineInputError && e.param === "extra_args" && /ban_token must be a token id/.test(e.message),
  );
  // per-request functions still cannot cross; the error points to --logits-processors
  assert.throws(
    () => engine!.generate({ promptTokenIds: ids }, { logitsProcessors: [() => undefined] }, { requestId: "fn" }),
    (e: unknown) => e instanceof EngineInputError && e.param === "logits_processors" && /--logits-processors/.test(e.message),
  );
});

test("logits processors: a load failure in the worker rejects WorkerEngine.create with the typed error", { timeout: 60_000 }, async () => {
  const model = tinyModelDir("LlamaForCausalLM");
  await assert.rejects(
    WorkerEngine.create({ model, maxModelLen: 256, kvCacheMemory: 2 * 1024 ** 2, logitsProcessors: ["./definitely-missing.mjs:P"] }),
    isLoadError("./definitely-missing.mjs:P", /import failed/),
  );
  await assert.rejects(
    WorkerEngine.create({ model, maxModelLen: 256, kvCacheMemory: 2 * 1024 ** 2, logitsProcessors: [`${file}:Throws`] }),
    isLoadError(`${file}:Throws`, /constructor threw: no GPU here/),
  );
});
