// --tool-parser-plugin (vLLM's: a module that registers tool-call parsers, then named by --tool-call-parser): a
// JavaScript module (ESM, or CommonJS through Node's interop) whose `toolParsers` export, or default export, maps
// parser names to parser objects ({ streamable(text, sent), extract(text, tools) }: ToolCallParser in
// src/server/tool-parsers.ts). Imported before the flags are parsed, so --tool-call-parser can name its parsers.
import * as path from "node:path";
import { pathToFileURL } from "node:url";
import { registerToolCallParser, type ToolCallParser } from "../server/tool-parsers.js";
import { CliUsageError } from "./usage-error.js";

/** Imports the plugin at `file` and registers its parsers; returns their names. */
export async function loadToolParserPlugin(file: string): Promise<string[]> {
  let mod: Record<string, unknown>;
  try {
    mod = (await import(pathToFileURL(path.resolve(file)).href)) as Record<string, unknown>;
  } catch (e) {
    throw new CliUsageError(`--tool-parser-plugin ${file}: cannot import it: ${(e as Error).message}`);
  }
  const table = mod.toolParsers ?? mod.default;
  if (typeof table !== "object" || table === null || Array.isArray(table) || Object.keys(table).length === 0)
    throw new CliUsageError(`--tool-parser-plugin ${file}: the module must export \`toolParsers\` (or a default export): an object of name -> parser`);
  for (const [name, parser] of Object.entries(table as Record<string, unknown>)) {
    try {
      registerToolCallParser(name, parser as ToolCallParser);
    } catch (e) {
      throw new CliUsageError(`--tool-parser-plugin ${file}: ${(e as Error).message}`);
    }
  }
  return Object.keys(table);
}
