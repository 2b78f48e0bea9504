// Where the built-in default model lives, without importing the engine (the CLI's main thread needs only this).
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/** `<package root>/models/kiln-default`: the model `kiln serve` uses when none is given. */
export const DEFAULT_MODEL_DIR = join(packageRoot(), "models", "kiln-default");

/** The nearest directory above this file holding package.json (works from src/ and from dist/src/). */
function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "package.json")) && dirname(dir) !== dir) dir = dirname(dir);
  return dir;
}
