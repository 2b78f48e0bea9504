// A `kiln` process whose engine factory builds the fake engine: lets tests run `serve` end to end.
import { main } from "../../src/cli/main.js";
import type { EngineFactory } from "../../src/cli/engine-factory.js";
import { FakeEngine } from "../server/fake-engine.js";

const factory: EngineFactory = async (args, progress) => {
  progress("loading weights", 0);
  progress("loading weights", 1);
  progress("sizing KV cache");
  const engine = new FakeEngine({ stepDelayMs: 10, maxModelLen: args.maxModelLen ?? 256 });
  progress("warm-up");
  return { engine, tokenizer: engine.tokenizer, maxModelLen: engine.maxModelLen, modelName: "fake-model", close: async () => {} };
};

const code = await main(process.argv, { engineFactory: factory });
if (code !== 0) process.exit(code);
