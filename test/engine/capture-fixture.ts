// Child process for step-graph-cache.test.ts: builds an engine (capturing the fused decode step graphs under
// the KILN_CACHE_DIR it was given, or replaying them from it) and prints what the capture did plus two greedy
// completions (their tokens, the first one's cumulative logprob), as JSON.
import { LLM } from "../../src/engine/llm-engine.js";
import { PagedModelRunner } from "../../src/engine/paged-model-runner.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

// the parent's model directory, so that two starts load the same files (a replay needs the same checkpoint)
const model = process.env.KILN_FIXTURE_MODEL ?? tinyModelDir("LlamaForCausalLM");
const llm = new LLM({ model, maxModelLen: 64, kvCacheMemory: 2 << 20, maxNumSeqs: 4 });
const runner = llm.engine.runner;
if (!(runner instanceof PagedModelRunner)) throw new Error("expected the paged runner");
// a prompt of 20+ tokens (mixed bucket 32) and a batch of two (decode bucket 2) as well
const [out, other] = llm.generate(["The jury said that the city's election was conducted well and fairly by the officials of the county", "Hello"], {
  temperature: 0,
  maxTokens: 8,
  ignoreEos: true,
  logprobs: 1,
});
const o = out!.outputs[0]!;
process.stdout.write(
  JSON.stringify({ info: runner.graphs?.info ?? null, tokens: [...o.tokenIds, ...other!.outputs[0]!.tokenIds], logprob: o.cumulativeLogprob, replays: runner.graphs?.replays }),
);
