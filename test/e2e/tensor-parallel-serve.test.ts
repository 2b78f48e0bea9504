// `kiln serve --tensor-parallel-size 2` through the official openai client: the same greedy completions (tokens and
// top logprobs within 1e-4) and chat replies as a single-rank server on the same model; SIGTERM stops rank 1 too.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { after, before, describe, it } from "node:test";
import { skipWithoutGloo } from "../distributed/run-ranks.js";
import { startKiln, type KilnServer } from "./kiln-process.js";

const PROMPTS = ["The jury said", "It was a cold morning in the", "She", "In the morning the men of the county"];
const FLAGS = ["--max-model-len", "256", "--kv-cache-memory", "4MiB"];

const childPids = (pid: number): number[] => {
  try {
    return execFileSync("ps", ["-o", "pid=", "--ppid", String(pid)], { encoding: "utf8" }).split("\n").map((l) => Number(l.trim())).filter((p) => p > 0);
  } catch {
    return []; // ps exits 1 when there is none
  }
};
const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

describe("kiln serve --tensor-parallel-size 2 (e2e)", { skip: skipWithoutGloo }, () => {
  let tp1: KilnServer;
  let tp2: KilnServer;
  before(async () => {
    [tp1, tp2] = await Promise.all([startKiln(FLAGS), startKiln([...FLAGS, "--tensor-parallel-size", "2"])]);
  });
  after(async () => {
    await Promise.all([tp1?.stop(), tp2?.stop()]);
  });

  it("completions and chat equal the single-rank server's", { timeout: 60_000 }, async () => {
    assert.match(tp2.log(), /tensor_parallel_size 2 runs eagerly/);
    for (const prompt of PROMPTS) {
      const req = { model: tp1.model, prompt, max_tokens: 12, temperature: 0, logprobs: 3, ignore_eos: true };
      const [a, b] = await Promise.all([tp1.client().completions.create(req), tp2.client().completions.create({ ...req, model: tp2.model })]);
      const ca = a.choices[0]!;
      const cb = b.choices[0]!;
      assert.equal(cb.text, ca.text, `completion of ${JSON.stringify(prompt)}`);
      assert.deepEqual(cb.logprobs!.tokens, ca.logprobs!.tokens);
      cb.logprobs!.top_logprobs!.forEach((row, t) => {
        const ref = ca.logprobs!.top_logprobs![t]!;
        assert.deepEqual(Object.keys(row).sort(), Object.keys(ref).sort(), `top tokens at ${t}`);
        for (const [tok, lp] of Object.entries(row)) assert.ok(Math.abs(lp - ref[tok]!) <= 1e-4, `${JSON.stringify(prompt)} step ${t} ${tok}: ${lp} vs ${ref[tok]}`);
      });
    }
    const chat = { model: tp1.model, messages: [{ role: "user" as const, content: "Tell me about the river." }], max_tokens: 16, temperature: 0 };
    const [ra, rb] = await Promise.all([tp1.client().chat.completions.create(chat), tp2.client().chat.completions.create({ ...chat, model: tp2.model })]);
    assert.equal(rb.choices[0]!.message.content, ra.choices[0]!.message.content);
  });

  it("SIGTERM stops the server and its rank 1", { timeout: 30_000 }, async () => {
    const ranks = childPids(tp2.pid);
    assert.equal(ranks.length, 1, "one rank process under the server");
    assert.equal(await tp2.stop(), 0);
    const deadline = Date.now() + 5000;
    while (ranks.some(alive) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    assert.deepEqual(ranks.filter(alive), [], "rank 1 exited with the server");
  });
});
