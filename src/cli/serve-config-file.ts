// vLLM's `--config file.yaml` (FlexibleArgumentParser.load_config_file): a YAML mapping of serve flags, under the
// command line's flags. Keys are flag names without dashes (snake_case or kebab-case), values as the flag takes them.
import { readFileSync } from "node:fs";
import { Command, CommanderError } from "commander";
import { parse as parseYaml } from "yaml";
import { CliUsageError } from "./usage-error.js";

/**
 * The file's flags as command-line words, as vLLM turns them: `key: value` is `--key value`, `true` is `--key`,
 * `false` is `--no-key` where that flag exists (else nothing), a list is `--key item...`, a mapping is `--key <JSON>`;
 * a null (or an empty list) leaves the flag at its default. `hasFlag` says whether a long flag exists.
 */
export function configFileWords(file: string, hasFlag: (long: string) => boolean): string[] {
  if (!/\.ya?ml$/i.test(file)) throw new CliUsageError(`--config must be a .yaml or .yml file, got ${JSON.stringify(file)}`);
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (e) {
    throw new CliUsageError(`--config ${JSON.stringify(file)} cannot be read: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
  let doc: unknown;
  try {
    // YAML 1.1, as PyYAML's safe_load reads it (yes/no/on/off are booleans)
    doc = parseYaml(text, { version: "1.1" });
  } catch (e) {
    throw new CliUsageError(`--config ${file}: not valid YAML: ${(e as Error).message.split("\n")[0]}`);
  }
  if (doc === null || doc === undefined) return [];
  if (typeof doc !== "object" || Array.isArray(doc)) throw new CliUsageError(`--config ${file}: the file must be a mapping of flag names to values`);
  const words: string[] = [];
  for (const [key, value] of Object.entries(doc as Record<string, unknown>)) {
    const flag = `--${key.replace(/^-+/, "").replaceAll("_", "-")}`;
    if (flag === "--config") throw new CliUsageError(`--config ${file}: a config file cannot name another (config: ...)`);
    const word = (v: unknown): string => (typeof v === "object" && v !== null ? JSON.stringify(v) : String(v));
    if (value === null || (Array.isArray(value) && value.length === 0)) continue;
    if (typeof value === "boolean") {
      if (value) words.push(flag);
      else if (hasFlag(`--no-${flag.slice(2)}`)) words.push(`--no-${flag.slice(2)}`);
      else if (!hasFlag(flag)) words.push(flag); // unknown: let the parser name it
    } else if (Array.isArray(value)) words.push(flag, ...value.map(word));
    else words.push(flag, word(value));
  }
  return words;
}

/**
 * The options of `cli` (a command whose action is running) with --config's file under them: a flag the command line
 * gave keeps its value, one only the file gives takes the file's, the rest keep their defaults. `fresh` builds an
 * unparsed command with the same options; the file's words are parsed with it (an unknown or bad flag is named).
 */
export function withConfigFile(cli: Command, fresh: () => Command): Record<string, unknown> {
  const opts = cli.opts();
  const file = String(opts.config);
  const fromFile = fresh()
    .exitOverride()
    .configureOutput({ writeOut: () => undefined, writeErr: () => undefined })
    .allowExcessArguments(false);
  const words = configFileWords(file, (long) => fromFile.options.some((o) => o.long === long));
  try {
    fromFile.parse(words, { from: "user" });
  } catch (e) {
    if (e instanceof CommanderError) throw new CliUsageError(`--config ${file}: ${e.message.replace(/^error: /, "")}`);
    throw e;
  }
  const merged: Record<string, unknown> = { ...opts };
  for (const [key, value] of Object.entries(fromFile.opts())) {
    if (fromFile.getOptionValueSource(key) === "cli" && cli.getOptionValueSource(key) !== "cli") merged[key] = value;
  }
  return merged;
}
