// Child process for step-graph-cache.test.ts: builds an engine (capturing the fused decode step graphs under
// the KILN_CACHE_DIR it was given) and prints what the capture did plus one greedy completion, as JSON.
import { LLM } from "../../src/engine/llm-engine.js";
import { PagedModelRunner } from "../../src/engine/paged-model-runner.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

const llm = new LLM({ model: tinyModelDir("LlamaForCausalLM"), maxModelLen: 64, kvCacheMemory: 2 << 20, maxNumSeqs: 4 });
const runner = llm.engine.runner;
if (!(runner instanceof PagedModelRunner)) throw new Error("expected the paged runner");
const [out] = llm.generate(["The jury said that"], { temperature: 0, maxTokens: 8, ignoreEos: true });
process.stdout.write(JSON.stringify({ info: runner.graphs?.info ?? null, tokens: out!.outputs[0]!.tokenIds }));
