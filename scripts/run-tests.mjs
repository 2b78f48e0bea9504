// Runs every compiled test file under dist/test with Node's built-in test runner.
// Usage: node scripts/run-tests.mjs [filter-substring...]
import { readdirSync, statSync, existsSync } from "node:fs";
import { join } from "node:path";
import { spawnSync } from "node:child_process";

const root = "dist/test";
if (!existsSync(root)) {
  console.error("dist/test is missing: run `npm install` (or `npx tsc`) first");
  process.exit(1);
}
const filters = process.argv.slice(2);
const files = [];
(function walk(dir) {
  for (const name of readdirSync(dir).sort()) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) walk(path);
    else if (name.endsWith(".test.js") && (filters.length === 0 || filters.some((f) => path.includes(f)))) files.push(path);
  }
})(root);
if (files.length === 0) {
  // `node --test` with no files would run every .js file it finds, fixtures included
  console.error(`no test file under ${root} matches ${filters.join(", ")}`);
  process.exit(1);
}
const result = spawnSync(process.execPath, ["--test", "--test-concurrency=2", ...files], { stdio: "inherit" });
process.exit(result.status ?? 1);
