// EAGLE's mechanics eager vs step graphs, in one process on the same served model (default kiln-default; --model DIR):
// random EAGLE-1 (one decoder layer) and EAGLE-3 heads. No trained head exists here, so acceptance means nothing (a
// random head's drafts are rejected, which pauses drafting 1, 2, 4... steps); what is measured is what a step costs.
// For each head, an engine with --enforce-eager and one with step graphs (the served model's graphs returning the
// hidden rows the head reads, the head's feed and draft steps captured) decode --streams concurrent greedy requests,
// alternating over --rounds rounds; each line gives the best round's ms per engine step, split into the served
// model's step (forward with hidden rows) and the head's proposal (its feed and draft forwards), eager / graphs ratios.
// Outputs are checked equal to a plain engine's (greedy speculation changes nothing).
// Usage: node dist/bench/eagle-steps.js [--model DIR] [--streams 1,4] [--k 3] [--rounds 3] [--tokens 64]
import * as fs from "node:fs";
import * as path from "node:path";
import { DEFAULT_MODEL_DIR } from "../src/cli/default-model.js";
import { LLM } from "../src/engine/llm-engine.js";
import type { PendingRunnerOutput, ScheduledBatch } from "../src/engine/model-runner.js";
import type { Drafter } from "../src/engine/speculative.js";
import { writeEagleHead } from "../test/helpers/eagle-head.js";

const option = (name: string, dflt: string): string => {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1]! : dflt;
};
const model = option("--model", DEFAULT_MODEL_DIR);
const streams = option("--streams", "1,4").split(",").map(Number);
const k = Number(option("--k", "3"));
const rounds = Number(option("--rounds", "3"));
const tokens = Number(option("--tokens", "64"));

const config = JSON.parse(fs.readFileSync(path.join(model, "config.json"), "utf8")) as Record<string, unknown>;
const L = config.num_hidden_layers as number;
const heads = {
  eagle: writeEagleHead(model, "bench-e1", { method: "eagle" }),
  // three distinct aux layers whatever L (vLLM's default 2, L/2, L-3 needs L >= 6)
  eagle3: writeEagleHead(model, "bench-e3", { method: "eagle3", config: { eagle_aux_hidden_state_layer_ids: [0, Math.floor(L / 2), L - 1] } }),
};

/** Wall time of the served model's steps (dispatch to wait) and of the drafter's proposals, summed. */
interface Timings {
  served: number;
  propose: number;
}

/** An engine whose served steps and proposals are timed. */
function timedEngine(method: keyof typeof heads, enforceEager: boolean): { llm: LLM; t: Timings } {
  const llm = new LLM({
    model, maxModelLen: 512, kvCacheMemory: 64 << 20, maxNumSeqs: 8, enforceEager,
    speculativeConfig: { method, model: heads[method], numSpeculativeTokens: k },
  });
  const t: Timings = { served: 0, propose: 0 };
  const runner = llm.engine.runner;
  const drafter = (llm.engine as unknown as { draft: Drafter }).draft;
  const dispatch = runner.dispatch!.bind(runner);
  runner.dispatch = (batch: ScheduledBatch): PendingRunnerOutput => {
    const t0 = performance.now();
    const pending = dispatch(batch);
    return { ...pending, wait: () => {
      const out = pending.wait();
      t.served += performance.now() - t0;
      return out;
    } };
  };
  const propose = drafter.propose.bind(drafter);
  drafter.propose = (requests, running) => {
    const t0 = performance.now();
    const out = propose(requests, running);
    t.propose += performance.now() - t0;
    return out;
  };
  return { llm, t };
}

const prompts = (n: number) => Array.from({ length: n }, (_, i) => ({ promptTokenIds: Array.from({ length: 24 }, (_, j) => (i * 31 + j * 7 + 3) % 1000) }));
const params = { temperature: 0, maxTokens: tokens, ignoreEos: true };

/** Best round of ms per engine step, served ms per step and propose ms per step. */
interface Best {
  step: number;
  served: number;
  propose: number;
}

const plain = new LLM({ model, maxModelLen: 512, kvCacheMemory: 64 << 20, maxNumSeqs: 8 });
console.log(`served: ${model} (${config.hidden_size} hidden, ${L} layers); k=${k}; ${tokens} greedy tokens per request; best of ${rounds} rounds, eager and graphs alternating`);
for (const method of Object.keys(heads) as (keyof typeof heads)[]) {
  const engines = { eager: timedEngine(method, true), graphs: timedEngine(method, false) };
  for (const n of streams) {
    const expected = JSON.stringify(plain.generate(prompts(n), params).map((o) => o.outputs[0]!.tokenIds));
    const best: Record<string, Best> = {};
    for (let r = 0; r < rounds; r++) {
      for (const [name, { llm, t }] of Object.entries(engines)) {
        const steps0 = llm.engine.numSteps, served0 = t.served, propose0 = t.propose;
        const t0 = performance.now();
        const out = llm.generate(prompts(n), params).map((o) => o.outputs[0]!.tokenIds);
        const wall = performance.now() - t0;
        if (JSON.stringify(out) !== expected) throw new Error(`${method} ${name}: greedy outputs differ from the plain engine's`);
        const steps = llm.engine.numSteps - steps0;
        const b = { step: wall / steps, served: (t.served - served0) / steps, propose: (t.propose - propose0) / steps };
        if (best[name] === undefined || b.step < best[name].step) best[name] = b;
      }
    }
    const e = best.eager!, g = best.graphs!;
    const ms = (x: number) => `${x.toFixed(2)} ms`;
    const ratio = (a: number, b: number) => `${(a / b).toFixed(2)}x`;
    console.log(
      `  ${method.padEnd(6)} ${n} stream${n > 1 ? "s" : " "}: step ${ms(e.step)} eager vs ${ms(g.step)} graphs (${ratio(e.step, g.step)}); ` +
        `served ${ms(e.served)} vs ${ms(g.served)} (${ratio(e.served, g.served)}); head ${ms(e.propose)} vs ${ms(g.propose)} (${ratio(e.propose, g.propose)})`,
    );
  }
}
