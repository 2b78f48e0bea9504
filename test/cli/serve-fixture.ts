// A `kiln` process whose engine factory builds the fake engine: lets tests run `serve` end to end.
import { main } from "../../src/cli/main.js";
import type { EngineFactory } from "../../src/cli/engine-factory.js";
import { generationDefaults } from "../../src/engine/sampling-params.js";
import { FakeEngine } from "../server/fake-engine.js";

const factory: EngineFactory = async (args, progress) => {
  progress("loading weights", 0);
  progress("loading weights", 1);
  progress("sizing KV cache");
  const engine = new FakeEngine({ stepDelayMs: 10, maxModelLen: args.maxModelLen ?? 256 });
  progress("warm-up");
  // (--override-generation-config sets the served defaults, as for a real model without a generation_config.json)
  const defaults = generationDefaults("auto", null, args.overrideGenerationConfig);
  return { engine, tokenizer: engine.tokenizer, maxModelLen: engine.maxModelLen, modelName: "fake-model", close: async () => {}, ...(defaults ? { generationDefaults: defaults } : {}) };
};

const code = await main(process.argv, { engineFactory: factory });
if (code !== 0) process.exit(code);
