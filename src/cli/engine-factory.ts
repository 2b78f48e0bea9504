// The seam between the CLI and model loading: turns ServeArgs into a running engine + tokenizer.
// OWNED BY THE LEAD: implement createEngineFromArgs (load config/weights/tokenizer, size the KV cache, warm up).
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { EngineClient, SamplingParams } from "../engine/types.js";
import type { TokenizerLike } from "../models/tokenizer-types.js";
import type { ServeArgs } from "./serve-args.js";

/** `<package root>/models/kiln-default`: the model `kiln serve` uses when none is given. */
export const DEFAULT_MODEL_DIR = join(packageRoot(), "models", "kiln-default");

/** The nearest directory above this file holding package.json (works from src/ and from dist/src/). */
function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "package.json")) && dirname(dir) !== dir) dir = dirname(dir);
  return dir;
}

/** Reports start-up stages ("loading weights", "sizing KV cache", "warm-up") and optional progress in [0, 1]. */
export type ProgressFn = (stage: string, fraction?: number) => void;

export interface LoadedEngine {
  engine: EngineClient;
  tokenizer: TokenizerLike;
  maxModelLen: number;
  modelName: string;
  /** Default sampling params from generation_config.json (per --generation-config). */
  generationDefaults?: Partial<SamplingParams>;
  close(): Promise<void>;
}

export type EngineFactory = (args: ServeArgs, progress: ProgressFn) => Promise<LoadedEngine>;

export const createEngineFromArgs: EngineFactory = async () => {
  throw new Error("engine construction is not wired yet (src/cli/engine-factory.ts: createEngineFromArgs)");
};
