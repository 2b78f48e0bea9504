// The layer test (DESIGN.md "Layers"): a lower layer never imports a higher one, and same-rank siblings
// (compile/distributed, engine/train) never import each other. src/index.ts (the package facade) is exempt.
import assert from "node:assert/strict";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { it } from "node:test";

/** Rank of each top-level directory of src/, low to high. */
const RANK: Record<string, number> = {
  util: 0, backends: 1, tensor: 2, compile: 3, distributed: 3, nn: 4, models: 5, engine: 6, train: 6, router: 7, server: 8, cli: 9,
};

// dist/test/layering.test.js -> repository root
const root = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const src = join(root, "src");

function tsFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) return tsFiles(p);
    return name.endsWith(".ts") && !name.endsWith(".d.ts") ? [p] : [];
  });
}

/** Every module specifier of static imports, re-exports and dynamic import("...") calls. */
function importsOf(text: string): string[] {
  const code = text.replace(/\/\*[\s\S]*?\*\//g, "").replace(/^\s*\/\/.*$/gm, "");
  const out: string[] = [];
  const re = /(?:^|[\s;])(?:import|export)\s[^'"]*?from\s*["']([^"']+)["']|(?:^|[\s;])import\s*["']([^"']+)["']|import\(\s*["']([^"']+)["']\s*\)/gm;
  for (let m; (m = re.exec(code)); ) out.push((m[1] ?? m[2] ?? m[3])!);
  return out;
}

/** The layer (top-level directory under src/) of a path, or null for src/index.ts and files outside src/. */
function layerOf(path: string): string | null {
  const rel = relative(src, path);
  if (rel.startsWith("..")) return null;
  const parts = rel.split(sep);
  return parts.length > 1 ? parts[0]! : null;
}

it("lower layers never import higher ones; siblings of one rank never import each other", () => {
  const files = tsFiles(src);
  assert.ok(files.length > 10, `found ${files.length} files under ${src}`);
  const violations: string[] = [];
  const unknown = new Set<string>();
  for (const file of files) {
    const from = layerOf(file);
    if (from === null) continue; // src/index.ts is exempt
    if (RANK[from] === undefined) {
      unknown.add(from);
      continue;
    }
    for (const spec of importsOf(readFileSync(file, "utf8"))) {
      if (!spec.startsWith(".")) continue; // packages and node: builtins
      const target = resolve(dirname(file), spec.replace(/\.js$/, ".ts"));
      const to = layerOf(target);
      if (to === null) {
        if (!relative(src, target).startsWith("..")) violations.push(`${relative(root, file)} imports "${spec}" (the src/index.ts facade)`);
        continue;
      }
      if (to === from || RANK[to] === undefined) continue;
      if (RANK[to]! > RANK[from]!) violations.push(`${relative(root, file)} (${from}) imports "${spec}" from higher layer ${to}`);
      else if (RANK[to] === RANK[from]) violations.push(`${relative(root, file)} (${from}) imports "${spec}" from sibling layer ${to}`);
    }
  }
  assert.deepEqual([...unknown], [], `directories under src/ without a rank: add them to RANK`);
  assert.deepEqual(violations, [], `layering violations:\n  ${violations.join("\n  ")}`);
});

it("the router's imports reach no tensor runtime, device back end or layers (`kiln router` runs without them)", () => {
  const seen = new Set<string>();
  const heavy: string[] = [];
  const visit = (file: string, via: string): void => {
    if (seen.has(file)) return;
    seen.add(file);
    const text = readFileSync(file, "utf8").replace(/^\s*import type\s[^;]*;/gm, "").replace(/^\s*export type\s[^;]*;/gm, "");
    for (const spec of importsOf(text)) {
      if (!spec.startsWith(".")) continue;
      const target = resolve(dirname(file), spec.replace(/\.js$/, ".ts"));
      if (["tensor", "backends", "nn", "compile"].includes(layerOf(target) ?? "")) heavy.push(`${relative(root, target)} <- ${via} <- ${relative(root, file)}`);
      else visit(target, relative(root, file));
    }
  };
  visit(join(src, "router", "index.ts"), "");
  assert.ok(seen.size > 10);
  assert.deepEqual(heavy, []);
});

it("the import scanner sees every import form", () => {
  const text = [
    `import { a } from "./a.js";`,
    `import type { B } from "../b.js";`,
    `export { c } from "./c.js";`,
    `export * from "./d.js";`,
    `import "./side-effect.js";`,
    `const m = await import("./lazy.js");`,
    `import {\n  e,\n  f,\n} from "./multi.js";`,
    `// import { no } from "./commented.js";`,
  ].join("\n");
  assert.deepEqual(importsOf(text), ["./a.js", "../b.js", "./c.js", "./d.js", "./side-effect.js", "./lazy.js", "./multi.js"]);
});
