// Tensor-parallel serving through the engine API: WorkerEngine with tensorParallelSize 2 (rank 1 a process the
// engine spawns) must give the single-rank engine's greedy tokens and top logprobs, for MHA, GQA and qkv-bias models;
// models the split cannot divide are refused naming the field; a rank that dies fails the engine naming it; close()
// stops the ranks.
import assert from "node:assert/strict";
import { execFileSync, fork } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, it } from "node:test";
import { LLM } from "../../src/engine/llm-engine.js";
import type { ServingArgs } from "../../src/engine/serving.js";
import type { RequestOutput, SamplingParams } from "../../src/engine/types.js";
import { WorkerEngine } from "../../src/engine/worker-engine.js";
import { tinyModelDir } from "../helpers/tiny-model.js";
import { skipWithoutGloo } from "../distributed/run-ranks.js";

const PROMPTS = ["The jury said", "It was a cold morning in the", "She", "In the morning the men of the county"];
const PARAMS: Partial<SamplingParams> = { temperature: 0, maxTokens: 12, ignoreEos: true, logprobs: 4, promptLogprobs: 2 };

async function final(it: AsyncIterable<RequestOutput>): Promise<RequestOutput> {
  let last: RequestOutput | undefined;
  for await (const o of it) last = o;
  return last!;
}

/** The pids of this process's child processes (the spawned ranks). */
function childPids(): number[] {
  const out = execFileSync("ps", ["-o", "pid=", "--ppid", String(process.pid)], { encoding: "utf8" });
  return out.split("\n").map((l) => Number(l.trim())).filter((p) => p > 0);
}

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

/** Every logprob of `got` within tol of `want`'s for the same token ids. */
function assertLogprobsClose(got: RequestOutput, want: RequestOutput, tol: number, what: string): void {
  const a = got.outputs[0]!.logprobs!;
  const b = want.outputs[0]!.logprobs!;
  assert.equal(a.length, b.length);
  a.forEach((row, t) => {
    const ref = b[t]!;
    assert.deepEqual([...row.keys()].sort(), [...ref.keys()].sort(), `${what}: top tokens at step ${t}`);
    for (const [id, lp] of row) assert.ok(Math.abs(lp.logprob - ref.get(id)!.logprob) <= tol, `${what}: token ${id} at step ${t}: ${lp.logprob} vs ${ref.get(id)!.logprob}`);
  });
  const pa = got.promptLogprobs!;
  const pb = want.promptLogprobs!;
  assert.equal(pa.length, pb.length);
  pa.forEach((row, t) => {
    if (row === null) return assert.equal(pb[t], null);
    for (const [id, lp] of row) assert.ok(Math.abs(lp.logprob - pb[t]!.get(id)!.logprob) <= tol, `${what}: prompt token ${t}`);
  });
}

describe("tensor-parallel serving (2 ranks)", { skip: skipWithoutGloo }, () => {
  const models: [string, string][] = [
    ["GQA Llama (4 heads, 2 KV heads)", tinyModelDir("LlamaForCausalLM")],
    ["MHA Llama (4 heads, 4 KV heads)", tinyModelDir("LlamaForCausalLM", { overrides: { num_key_value_heads: 4 } })],
    ["Qwen2 (q/k/v biases)", tinyModelDir("Qwen2ForCausalLM")],
    ["Qwen3 (per-head q/k norms)", tinyModelDir("Qwen3ForCausalLM")],
    ["Gemma 2 (GELU MLP, soft-capping, four norms)", tinyModelDir("Gemma2ForCausalLM")],
    ["Phi-3 (q/k/v and gate/up fused in the checkpoint)", tinyModelDir("Phi3ForCausalLM")],
  ];
  for (const [name, model] of models) {
    it(`${name}: greedy tokens and logprobs equal a single rank's`, { timeout: 60_000 }, async () => {
      const args: ServingArgs = { model, maxModelLen: 256, kvCacheMemory: 2 * 1024 ** 2 };
      const ref = new LLM({ ...args, enforceEager: true }).generate(PROMPTS, PARAMS);
      const engine = await WorkerEngine.create({ ...args, tensorParallelSize: 2 });
      try {
        // all prompts at once: batched prefill and decode steps
        const got = await Promise.all(
          PROMPTS.map((p, i) => final(engine.generate({ promptTokenIds: engine.tokenizer.encode(p), prompt: p }, PARAMS, { requestId: `r${i}` }))),
        );
        got.forEach((out, i) => {
          assert.deepEqual(out.outputs[0]!.tokenIds, ref[i]!.outputs[0]!.tokenIds, `${name}: prompt ${i}`);
          assertLogprobsClose(out, ref[i]!, 1e-4, `${name}: prompt ${i}`);
        });
      } finally {
        await engine.close();
      }
    });
  }

  it("load_format dummy and hf_overrides reach every rank: greedy tokens and logprobs equal one rank's", { timeout: 60_000 }, async () => {
    // a rank reading the checkpoint, or building both layers, would not agree with rank 0's random one-layer model
    const args: ServingArgs = {
      model: tinyModelDir("LlamaForCausalLM"), maxModelLen: 64, kvCacheMemory: 2 * 1024 ** 2, loadFormat: "dummy", hfOverrides: { num_hidden_layers: 1 },
    };
    const ref = new LLM({ ...args, enforceEager: true }).generate(PROMPTS, PARAMS);
    const engine = await WorkerEngine.create({ ...args, tensorParallelSize: 2 });
    try {
      for (const [i, p] of PROMPTS.entries()) {
        const out = await final(engine.generate({ promptTokenIds: engine.tokenizer.encode(p), prompt: p }, PARAMS, { requestId: `d${i}` }));
        assert.deepEqual(out.outputs[0]!.tokenIds, ref[i]!.outputs[0]!.tokenIds, `prompt ${i}`);
        assertLogprobsClose(out, ref[i]!, 1e-4, `dummy: prompt ${i}`);
      }
    } finally {
      await engine.close();
    }
  });

  it("hf_config_path and skip_tokenizer_init reach every rank: a model without tokenizer.json, read with another config", { timeout: 60_000 }, async () => {
    // a rank reading the model's own config (two layers) would not agree with rank 0's one-layer random model, and a
    // rank looking for tokenizer.json would not start
    const model = tinyModelDir("LlamaForCausalLM");
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-tp-notok-"));
    const cfg = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-tp-cfg-"));
    try {
      fs.copyFileSync(path.join(model, "config.json"), path.join(dir, "config.json"));
      const config = JSON.parse(fs.readFileSync(path.join(model, "config.json"), "utf8")) as Record<string, unknown>;
      fs.writeFileSync(path.join(cfg, "config.json"), JSON.stringify({ ...config, num_hidden_layers: 1 }));
      const args: ServingArgs = { model: dir, maxModelLen: 64, kvCacheMemory: 2 * 1024 ** 2, loadFormat: "dummy", hfConfigPath: cfg, skipTokenizerInit: true };
      const prompts = [[5, 6, 7], [9, 3]];
      const ref = new LLM({ ...args, enforceEager: true }).generate(prompts.map((promptTokenIds) => ({ promptTokenIds })), PARAMS);
      const engine = await WorkerEngine.create({ ...args, tensorParallelSize: 2 });
      try {
        for (const [i, promptTokenIds] of prompts.entries()) {
          const out = await final(engine.generate({ promptTokenIds }, PARAMS, { requestId: `s${i}` }));
          assert.deepEqual(out.outputs[0]!.tokenIds, ref[i]!.outputs[0]!.tokenIds, `prompt ${i}`);
          assert.equal(out.outputs[0]!.text, "");
        }
      } finally {
        await engine.close();
      }
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
      fs.rmSync(cfg, { recursive: true, force: true });
    }
  });

  it("each rank caches its KV heads: twice the blocks of one rank for the same KV memory", { timeout: 30_000 }, async () => {
    const args: ServingArgs = { model: tinyModelDir("LlamaForCausalLM"), maxModelLen: 256, kvCacheMemory: 2 * 1024 ** 2, enforceEager: true };
    const single = await WorkerEngine.create(args);
    const split = await WorkerEngine.create({ ...args, tensorParallelSize: 2 });
    try {
      assert.equal(split.numBlocks, 2 * single.numBlocks, `TP 2 blocks ${split.numBlocks} vs TP 1 ${single.numBlocks}`);
    } finally {
      await Promise.all([single.close(), split.close()]);
    }
  });

  it("refuses a head count the ranks cannot divide, naming the field", { timeout: 30_000 }, async () => {
    const model = tinyModelDir("LlamaForCausalLM");
    await assert.rejects(WorkerEngine.create({ model, maxModelLen: 64, kvCacheMemory: 2 ** 20, tensorParallelSize: 3 }), /num_attention_heads \(4\) is not divisible by tensor_parallel_size \(3\)/);
    const mqa = tinyModelDir("LlamaForCausalLM", { overrides: { num_key_value_heads: 1 } });
    await assert.rejects(WorkerEngine.create({ model: mqa, maxModelLen: 64, kvCacheMemory: 2 ** 20, tensorParallelSize: 2 }), /num_key_value_heads \(1\) is not divisible by tensor_parallel_size \(2\)/);
    await assert.rejects(
      WorkerEngine.create({ model, maxModelLen: 64, kvCacheMemory: 2 ** 20, tensorParallelSize: 2, quantization: "int8" }),
      /invalid quantization: quantization int8 is not supported with tensor_parallel_size > 1/,
    );
    assert.throws(() => new LLM({ model, maxModelLen: 64, kvCacheMemory: 2 ** 20, tensorParallelSize: 2 }), /synchronous LLM runs one rank/);
    assert.deepEqual(childPids().filter(alive), [], "no rank was spawned");
  });

  it("a spawned rank whose rank 0 goes away during start-up exits (no orphan waiting in the rendezvous)", { timeout: 30_000 }, async () => {
    // as after Ctrl-C or SIGKILL of `kiln serve` while it starts: rank 0 gone before it hosts the rendezvous. The rank
    // used to block in the store's connect loop for the 7-day timeout, its parent gone
    const script = path.join(path.dirname(fileURLToPath(import.meta.url)), "../../src/engine/tp-worker-main.js");
    const rankArgs = { model: tinyModelDir("LlamaForCausalLM"), rank: 1, worldSize: 2, initMethod: "tcp://127.0.0.1:1" };
    const child = fork(script, [JSON.stringify(rankArgs)], { stdio: ["ignore", "ignore", "ignore", "ipc"], execArgv: [] });
    try {
      await new Promise<void>((resolve) => child.on("message", (m: { type?: string }) => m.type === "hello" && resolve()));
      const exited = new Promise<boolean>((resolve) => {
        child.once("exit", () => resolve(true));
        setTimeout(() => resolve(false), 5000).unref();
      });
      child.disconnect(); // what rank 0's exit does to the rank's IPC channel
      assert.equal(await exited, true, "the rank still runs 5 s after rank 0 went away");
    } finally {
      child.kill("SIGKILL");
    }
  });

  it("a rank that dies fails the engine naming it; close() stops the ranks", { timeout: 60_000 }, async () => {
    const model = tinyModelDir("LlamaForCausalLM");
    const args: ServingArgs = { model, maxModelLen: 64, kvCacheMemory: 2 ** 20, tensorParallelSize: 2 };
    const params = { temperature: 0, maxTokens: 4, ignoreEos: true };
    const a = await WorkerEngine.create(args);
    const [rank1] = childPids();
    assert.ok(rank1 !== undefined && alive(rank1), "rank 1 runs as a child process");
    assert.equal((await final(a.generate({ promptTokenIds: [5, 6, 7] }, params, { requestId: "x" }))).outputs[0]!.tokenIds.length, 4);
    await a.close();
    const deadline = Date.now() + 5000;
    while (alive(rank1) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    assert.equal(alive(rank1), false, "close() stopped rank 1");

    // killed while the engine idles: the engine fails at once (generate throws), naming the rank
    const b = await WorkerEngine.create(args);
    assert.equal(b.deadError(), null);
    const [victim] = childPids().filter(alive);
    process.kill(victim!, "SIGKILL");
    await new Promise((r) => setTimeout(r, 300));
    assert.match(String(b.deadError()), /rank 1 \(pid \d+\) exited \(SIGKILL\)/, "the engine reports itself dead (the server's /health: 503)");
    await assert.rejects(async () => final(b.generate({ promptTokenIds: [5, 6, 7] }, params, { requestId: "y" })), /rank 1 \(pid \d+\) exited \(SIGKILL\)/);
    await b.close();

    // killed mid-stream: the running request fails naming the rank (no hang in the all-reduce)
    const c = await WorkerEngine.create({ ...args, maxModelLen: 256, kvCacheMemory: 2 * 2 ** 20 });
    const [victim2] = childPids().filter(alive);
    const long = c.generate({ promptTokenIds: [5, 6, 7] }, { temperature: 0, maxTokens: 200, ignoreEos: true }, { requestId: "z", delta: true });
    const failed = (async () => {
      let n = 0;
      for await (const o of long) {
        n += o.outputs[0]!.tokenIds.length;
        if (n >= 2 && alive(victim2!)) process.kill(victim2!, "SIGKILL");
      }
      return n;
    })();
    await assert.rejects(failed, /rank 1 \(pid \d+\) (exited|died)/);
    await c.close();
  });
});
