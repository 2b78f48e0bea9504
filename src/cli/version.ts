// The package version, read once from package.json.
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

function readVersion(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (dirname(dir) !== dir) {
    const pkg = join(dir, "package.json");
    if (existsSync(pkg)) return (JSON.parse(readFileSync(pkg, "utf8")) as { version?: string }).version ?? "0.0.0";
    dir = dirname(dir);
  }
  return "0.0.0";
}

export const KILN_VERSION = readVersion();
