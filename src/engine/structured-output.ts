// Structured output (vLLM's StructuredOutputsParams with its xgrammar back end): a request may constrain its
// output to a JSON schema, any JSON object, a regular expression, one of a list of strings, an EBNF grammar
// (xgrammar's dialect, as vLLM's `grammar`) or a structural tag. Each step, the request's grammar matcher masks
// the logits of every token that cannot continue a valid output (before any other sampling step, as vLLM
// applies the grammar bitmask before its sampler), and the sampled token advances the matcher. When the
// output is complete, only the stop tokens remain allowed.
//
// Checking: the spec is checked on its own (a grammar built without a tokenizer) when the params are
// normalized, so a bad schema or regex is a typed EngineInputError naming `structured_outputs`, raised before
// the request is queued. Each check runs on a shared instance of the wasm module, replaced when a bad grammar
// aborts it. The engine compiles checked specs against the tokenizer on its grammar thread (grammar-thread.ts runs a
// StructuredOutputManager there), beside its steps.
import type { GrammarVocab } from "../models/tokenizer-types.js";
import { EngineInputError } from "./errors.js";
import { grammarIsLikelyLark, larkToEbnf } from "./lark-grammar.js";
import type { ReasoningEnd } from "./reasoning.js";
import { respellNonAsciiClasses } from "./xgrammar-classes.js";
import {
  XgrammarError,
  XgrammarInstance,
  type XgBinding,
  type XgCompiledGrammar,
  type XgGrammar,
  type XgGrammarCompiler,
  type XgGrammarMatcher,
} from "./xgrammar.js";

/**
 * vLLM StructuredOutputsParams (camelCase): exactly one of json, regex, choice, grammar, jsonObject and
 * structuralTag. `json` is a JSON schema (object or JSON text).
 */
export interface StructuredOutputsParams {
  json?: string | Record<string, unknown> | null;
  regex?: string | null;
  choice?: string[] | null;
  grammar?: string | null;
  jsonObject?: boolean | null;
  structuralTag?: string | Record<string, unknown> | null;
  /** JSON output without free whitespace between tokens (vLLM's disable_any_whitespace). */
  disableAnyWhitespace?: boolean;
  /** vLLM's: objects without additionalProperties take none (already so: xgrammar runs in strict mode). */
  disableAdditionalProperties?: boolean;
  /** vLLM's: never fall back to another backend (there is none here). */
  disableFallback?: boolean;
  /**
   * Kiln's, set by the server (no wire field): the structural tag constrains a whole Harmony reply, header tokens
   * spelled as harmony-grammar.ts spells them, live from the first token (tool_choice "required" or named on gpt-oss).
   */
  harmonyReply?: boolean;
}

/** A checked spec: one kind, its source as text (what the compiled grammars are cached by). */
export interface StructuredOutputSpec {
  kind: "json" | "json_object" | "regex" | "choice" | "grammar" | "structural_tag";
  source: string;
  anyWhitespace: boolean;
  /** A whole Harmony reply's structural tag (StructuredOutputsParams.harmonyReply). */
  harmonyReply?: boolean;
}

const KEYS = [
  "json", "regex", "choice", "grammar", "jsonObject", "structuralTag", "disableAnyWhitespace", "disableAdditionalProperties", "disableFallback", "harmonyReply",
] as const;
const PARAM = "structured_outputs";
/** Each field's name in a refusal: vLLM's wire (snake_case) name, as the server takes it; harmonyReply has none. */
const WIRE: Record<(typeof KEYS)[number], string> = {
  json: "json", regex: "regex", choice: "choice", grammar: "grammar", jsonObject: "json_object", structuralTag: "structural_tag",
  disableAnyWhitespace: "disable_any_whitespace", disableAdditionalProperties: "disable_additional_properties",
  disableFallback: "disable_fallback", harmonyReply: "harmonyReply",
};

function fail(message: string): never {
  throw new EngineInputError(PARAM, message);
}

/** The grammar text of a choice: one literal per option (JSON string escapes are xgrammar EBNF escapes). */
export function choiceGrammar(choice: readonly string[]): string {
  return `root ::= ${choice.map((c) => JSON.stringify(c)).join(" | ")}`;
}

/** JSON text of a user's object (a circular or BigInt value is the user's error, not a crash). */
function toJson(x: unknown, name: string): string {
  try {
    return JSON.stringify(x);
  } catch (e) {
    return fail(`${name} cannot be written as JSON: ${(e as Error).message}`);
  }
}

/** Checks a StructuredOutputsParams' shape and returns its spec (null when none is set). Throws EngineInputError. */
export function structuredOutputSpec(p: StructuredOutputsParams | null | undefined): StructuredOutputSpec | null {
  if (p === null || p === undefined) return null;
  if (typeof p !== "object" || Array.isArray(p)) fail("must be an object");
  for (const k of Object.keys(p)) if (!(KEYS as readonly string[]).includes(k)) fail(`unknown field ${JSON.stringify(k)} (expected one of ${KEYS.join(", ")})`);
  const set = (["json", "regex", "choice", "grammar", "jsonObject", "structuralTag"] as const).filter((k) => p[k] !== undefined && p[k] !== null && p[k] !== false);
  // vLLM's message for more than one
  if (set.length > 1) fail(`You can only use one kind of structured outputs constraint but multiple are specified: ${set.map((k) => WIRE[k]).join(", ")}`);
  for (const k of ["disableAnyWhitespace", "disableAdditionalProperties", "disableFallback", "harmonyReply"] as const)
    if (p[k] !== undefined && typeof p[k] !== "boolean") fail(`${WIRE[k]} must be a boolean`);
  if (set.length === 0) return null;
  if (p.harmonyReply === true && set[0] !== "structuralTag") fail("harmonyReply needs a structural_tag");
  const dw = p.disableAnyWhitespace ?? false;
  const anyWhitespace = !dw;
  const kind = set[0]!;
  switch (kind) {
    case "json": {
      const j = p.json!;
      let text: string;
      if (typeof j === "string") {
        try {
          JSON.parse(j);
        } catch (e) {
          fail(`json is not valid JSON: ${(e as Error).message}`);
        }
        text = j;
      } else if (typeof j === "object" && !Array.isArray(j)) text = toJson(j, "json");
      else fail("json must be a JSON schema (an object, or its JSON text)");
      return { kind: "json", source: text, anyWhitespace };
    }
    case "jsonObject":
      if (p.jsonObject !== true) fail("json_object must be a boolean");
      return { kind: "json_object", source: "", anyWhitespace };
    case "regex":
      if (typeof p.regex !== "string" || p.regex.length === 0) fail("regex must be a non-empty string");
      return { kind: "regex", source: p.regex, anyWhitespace };
    case "choice": {
      const c = p.choice!;
      if (!Array.isArray(c) || c.length === 0 || !c.every((s) => typeof s === "string" && s.length > 0))
        fail("choice must be a non-empty list of non-empty strings");
      return { kind: "choice", source: choiceGrammar(c), anyWhitespace };
    }
    case "grammar": {
      const g = p.grammar;
      if (typeof g !== "string" || g.trim().length === 0) fail("grammar must be a non-empty EBNF string");
      if (!grammarIsLikelyLark(g)) return { kind: "grammar", source: g, anyWhitespace };
      try {
        return { kind: "grammar", source: larkToEbnf(g), anyWhitespace }; // as vLLM takes a Lark grammar
      } catch (e) {
        return fail(`the grammar is not valid: Failed to convert the grammar from Lark to EBNF: ${(e as Error).message}`);
      }
    }
    case "structuralTag": {
      const t = p.structuralTag!;
      const text = typeof t === "string" ? t : toJson(t, "structural_tag");
      try {
        JSON.parse(text);
      } catch (e) {
        fail(`structural_tag is not valid JSON: ${(e as Error).message}`);
      }
      return { kind: "structural_tag", source: text, anyWhitespace, ...(p.harmonyReply === true ? { harmonyReply: true } : {}) };
    }
  }
}

/** json_object is any JSON object (vLLM compiles it as this schema), not any JSON value. */
const JSON_OBJECT_SCHEMA = '{"type": "object"}';

/** The structural tag of a regex (how the web build of xgrammar compiles one). */
const regexTag = (pattern: string): string => JSON.stringify({ type: "structural_tag", format: { type: "regex", pattern } });

let checker: XgrammarInstance | null = null;

/**
 * Builds the spec's grammar without a tokenizer, so a bad schema, regex or EBNF fails here with xgrammar's
 * message. Throws EngineInputError.
 */
export function checkStructuredOutputSpec(spec: StructuredOutputSpec): void {
  if (spec.kind === "json" || spec.kind === "structural_tag") checkDepth(JSON.parse(spec.source) as unknown, spec.kind);
  if (spec.kind === "regex" || spec.kind === "grammar") checkGroupDepth(spec.source, spec.kind === "regex" ? "regex" : "ebnf");
  if (spec.kind === "json") {
    const schema = JSON.parse(spec.source) as unknown;
    // vLLM's has_xgrammar_unsupported_json_features: keywords xgrammar would silently not enforce
    if (unsupportedJsonFeature(schema)) fail("The provided JSON schema contains features not supported by xgrammar.");
    if (patternsOf(schema).some((p) => nonAsciiClass(p, "regex"))) fail(NON_ASCII_CLASS);
  }
  if ((spec.kind === "regex" || spec.kind === "grammar") && nonAsciiClass(spec.source, spec.kind === "regex" ? "regex" : "ebnf")) fail(NON_ASCII_CLASS);
  if (checker === null || checker.broken) checker = new XgrammarInstance();
  try {
    checker.call((b) => grammarOf(b, spec)).delete();
  } catch (e) {
    if (e instanceof XgrammarError) fail(`the ${spec.kind} is not valid: ${e.message}`);
    throw e;
  }
}

/**
 * A JSON schema's grammar as xgrammar EBNF text (root rule `root`), for a structural tag's "grammar" format: its
 * "json_schema" format takes any whitespace, this one `anyWhitespace` as asked. Throws EngineInputError.
 */
export function jsonSchemaEbnf(schema: unknown, anyWhitespace: boolean): string {
  checkDepth(schema, "json");
  if (checker === null || checker.broken) checker = new XgrammarInstance();
  try {
    return checker.call((b) => {
      const g = b.Grammar.FromJSONSchema(toJson(schema, "json"), anyWhitespace, undefined, undefined, true, undefined, false);
      try {
        return respellNonAsciiClasses(g.ToString()) ?? fail(NON_ASCII_CLASS);
      } finally {
        g.delete();
      }
    });
  } catch (e) {
    if (e instanceof XgrammarError) fail(`the json is not valid: ${e.message}`);
    throw e;
  }
}

/** The spec's grammar, built without a tokenizer (the check) or to be compiled against one (the engine). */
function grammarOf(b: XgBinding, spec: StructuredOutputSpec): XgGrammar {
  switch (spec.kind) {
    case "json":
    case "json_object":
      return byCharacter(b, b.Grammar.FromJSONSchema(spec.kind === "json" ? spec.source : JSON_OBJECT_SCHEMA, spec.anyWhitespace, undefined, undefined, true, undefined, false), "root");
    case "regex":
      return byCharacter(b, b.Grammar.FromStructuralTag(regexTag(spec.source)), null);
    case "choice":
    case "grammar":
      return b.Grammar.FromEBNF(spec.source, "root");
    case "structural_tag":
      return byCharacter(b, b.Grammar.FromStructuralTag(spec.source), null);
  }
}

/**
 * A converted grammar (a regex's, a JSON schema's, a structural tag's) whose character classes with non-ASCII members
 * are respelled so that this xgrammar build matches them by character, not by byte (xgrammar-classes.ts). `root` names
 * its root rule; null: its last rule (a structural tag's root comes after the grammars it holds, which may have taken
 * the name "root": it is then "root_1", "root_2"...). Throws EngineInputError.
 */
function byCharacter(b: XgBinding, g: XgGrammar, root: string | null): XgGrammar {
  const text = g.ToString();
  const spelled = respellNonAsciiClasses(text);
  if (spelled === text) return g;
  g.delete();
  if (spelled === null) fail(NON_ASCII_CLASS);
  return b.Grammar.FromEBNF(spelled, root ?? [...text.matchAll(/^([A-Za-z_][\w-]*) ::=/gm)].at(-1)![1]!);
}

/**
 * How deep the xgrammar build Kiln uses can convert: its wasm stack is small, and a JSON schema nested past ~60 levels,
 * a regex with ~500 nested groups or a grammar with ~300 overflows it ("memory access out of bounds", "table index is out
 * of bounds", or a call that never returns).
 */
const MAX_JSON_DEPTH = 40;
const MAX_GROUP_DEPTH = 128;

/**
 * Refuses a JSON schema (or structural tag) nested more than MAX_JSON_DEPTH objects and arrays deep, counted through
 * its local $refs (a $ref back into its own path, a recursive schema, adds nothing), or holding a pattern whose groups
 * nest deeper than MAX_GROUP_DEPTH. Throws EngineInputError.
 */
function checkDepth(root: unknown, kind: "json" | "structural_tag"): void {
  const onPath = new Set<object>();
  const known = new Map<object, number>(); // each node once: $refs may reach one by many paths
  const depth = (x: unknown): number => {
    if (typeof x !== "object" || x === null || onPath.has(x) || onPath.size > MAX_JSON_DEPTH) return 0;
    const seen = known.get(x);
    if (seen !== undefined) return seen;
    onPath.add(x);
    let d = 0;
    for (const v of Object.values(x)) d = Math.max(d, depth(v));
    const ref = (x as { $ref?: unknown }).$ref;
    if (typeof ref === "string") d = Math.max(d, depth(localRef(root, ref)));
    const pattern = (x as { pattern?: unknown }).pattern;
    if (typeof pattern === "string") checkGroupDepth(pattern);
    onPath.delete(x);
    known.set(x, d + 1);
    return d + 1;
  };
  if (depth(root) > MAX_JSON_DEPTH)
    fail(
      `the ${kind === "json" ? "JSON schema" : "structural tag"} nests objects and arrays more than ${MAX_JSON_DEPTH} levels deep (counted through its $refs); ` +
        `the xgrammar build Kiln uses (@mlc-ai/web-xgrammar 0.1.27, a small wasm stack) takes at most ${MAX_JSON_DEPTH}`,
    );
}

/** The value a local $ref ("#", "#/$defs/a", with JSON pointer's ~1 and ~0) points at in `root`, or undefined. */
function localRef(root: unknown, ref: string): unknown {
  if (!ref.startsWith("#")) return undefined;
  let x = root;
  for (const part of ref.slice(1).split("/").slice(1)) {
    if (typeof x !== "object" || x === null) return undefined;
    x = (x as Record<string, unknown>)[part.replace(/~1/g, "/").replace(/~0/g, "~")];
  }
  return x;
}

/**
 * Refuses a regex (or an xgrammar EBNF text, whose string literals are skipped) whose groups nest deeper than
 * MAX_GROUP_DEPTH. Throws EngineInputError.
 */
function checkGroupDepth(text: string, syntax: "regex" | "ebnf" = "regex"): void {
  let depth = 0;
  let inClass = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === "\\") i++;
    else if (inClass) inClass = c !== "]";
    else if (c === "[") inClass = true;
    else if (syntax === "ebnf" && (c === '"' || c === "'")) for (i++; i < text.length && text[i] !== c; i++) i += text[i] === "\\" ? 1 : 0;
    else if (c === ")") depth--;
    else if (c === "(" && ++depth > MAX_GROUP_DEPTH)
      fail(
        `the ${syntax === "regex" ? "regex" : "grammar"} nests groups more than ${MAX_GROUP_DEPTH} deep; ` +
          `the xgrammar build Kiln uses (@mlc-ai/web-xgrammar 0.1.27, a small wasm stack) takes at most ${MAX_GROUP_DEPTH}`,
      );
  }
}

/** JSON-schema string formats xgrammar enforces (vLLM's list). */
const STRING_FORMATS = new Set([
  "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri", "uri-reference", "uri-template",
  "json-pointer", "relative-json-pointer",
]);

/** Whether a schema (or one nested in it) uses a keyword xgrammar accepts but does not enforce. */
function unsupportedJsonFeature(x: unknown): boolean {
  if (Array.isArray(x)) return x.some(unsupportedJsonFeature);
  if (typeof x !== "object" || x === null) return false;
  const o = x as Record<string, unknown>;
  const has = (...keys: string[]): boolean => keys.some((k) => k in o);
  if ((o.type === "integer" || o.type === "number") && has("multipleOf")) return true;
  if (o.type === "array" && has("uniqueItems", "contains", "minContains", "maxContains")) return true;
  if (o.type === "string" && "format" in o && !STRING_FORMATS.has(String(o.format))) return true;
  if (o.type === "object" && has("patternProperties", "propertyNames")) return true;
  return Object.values(o).some(unsupportedJsonFeature);
}

/** Every "pattern" string in a schema. */
function patternsOf(x: unknown): string[] {
  if (Array.isArray(x)) return x.flatMap(patternsOf);
  if (typeof x !== "object" || x === null) return [];
  const o = x as Record<string, unknown>;
  return [...(typeof o.pattern === "string" ? [o.pattern] : []), ...Object.values(o).flatMap(patternsOf)];
}

const NON_ASCII_CLASS =
  "character classes ([...]) with non-ASCII characters are not supported by the xgrammar build Kiln uses " +
  "(@mlc-ai/web-xgrammar 0.1.27 matches them byte by byte); write the characters as alternatives instead, e.g. (ä|ö|ü)";

/**
 * Whether a regex or an xgrammar EBNF text has a character class holding a character above U+007F (or an escape of
 * one). EBNF string literals are skipped (brackets in them are text).
 */
export function nonAsciiClass(text: string, syntax: "regex" | "ebnf"): boolean {
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!;
    if (c === "\\") {
      i++;
      continue;
    }
    if (syntax === "ebnf" && (c === '"' || c === "'")) {
      for (i++; i < text.length && text[i] !== c; i++) if (text[i] === "\\") i++;
      continue;
    }
    if (c !== "[") continue;
    for (i++; i < text.length && text[i] !== "]"; i++) {
      const d = text[i]!;
      if (d.charCodeAt(0) > 0x7f) return true;
      if (d !== "\\") continue;
      const esc = /^(?:x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|u\{([0-9a-fA-F]+)\}|U([0-9a-fA-F]{8}))/.exec(text.slice(i + 1));
      if (esc !== null && parseInt(esc[1] ?? esc[2] ?? esc[3] ?? esc[4]!, 16) > 0x7f) return true;
      i++;
    }
  }
  return false;
}

/**
 * A reasoning model's request (see reasoning.ts): its grammar waits for the reasoning to end. `ended` says whether
 * the prompt already ended it.
 */
export interface ReasoningGate {
  end: ReasoningEnd;
  ended: boolean;
}

/** Sets every token whose bit is clear in `mask` (one bit per token id, 32 per word) to -Infinity. */
export function applyBitmask(logits: Float32Array, mask: Int32Array): void {
  const n = logits.length;
  for (let w = 0; w < mask.length; w++) {
    const bits = mask[w]!;
    if (bits === -1) continue;
    const base = w * 32;
    for (let j = 0; j < 32 && base + j < n; j++) if (((bits >>> j) & 1) === 0) logits[base + j] = -Infinity;
  }
}

/**
 * A grammar matcher as RequestGrammar drives it: one on this thread (LocalMatcher) or one on the grammar thread
 * (grammar-thread.ts, which compiles off the engine's step loop).
 */
export interface GrammarMatcher {
  /** Whether its grammar is compiled (a request waits until then, as vLLM's WAITING_FOR_FSM). */
  readonly ready: boolean;
  /** xgrammar's message when the grammar did not compile (the request cannot run), else null. */
  readonly failure: string | null;
  /** Advances past a token; false (and unchanged) when the grammar refuses it. */
  acceptToken(tokenId: number): boolean;
  /** Takes back the last `n` accepted tokens. */
  rollback(n: number): void;
  /** Whether a stop token was accepted (the output is complete). */
  isTerminated(): boolean;
  /** Starts computing the next mask ahead of nextTokenBitmask (while a step runs on the device). */
  prefetch(): void;
  /** The next-token bitmask (bit set = allowed), one bit per token id, 32 per word. */
  nextTokenBitmask(): Int32Array;
  dispose(): void;
}

/** A matcher on this thread's wasm instance; a prefetched mask is kept until the matcher moves. */
class LocalMatcher implements GrammarMatcher {
  readonly ready = true;
  readonly failure = null;
  private prefetched: Int32Array | null = null;

  constructor(
    private readonly matcher: XgGrammarMatcher,
    private readonly owner: StructuredOutputManager,
  ) {}

  acceptToken(tokenId: number): boolean {
    this.prefetched = null;
    return this.matcher.AcceptToken(tokenId, false);
  }

  rollback(n: number): void {
    this.prefetched = null;
    this.matcher.Rollback(n);
  }

  isTerminated(): boolean {
    return this.matcher.IsTerminated();
  }

  prefetch(): void {
    this.prefetched ??= this.bitmask();
  }

  nextTokenBitmask(): Int32Array {
    const m = this.prefetched ?? this.bitmask();
    this.prefetched = null;
    return m;
  }

  /** The matcher's next-token bitmask, copied out of the wasm heap. */
  private bitmask(): Int32Array {
    const vec = this.matcher.GetNextTokenBitmask(this.owner.vocabSize);
    try {
      return this.owner.instance.binding.vecIntToView(vec).slice();
    } finally {
      vec.delete();
    }
  }

  dispose(): void {
    this.matcher.delete();
  }
}

/** One request's position in its grammar. */
export class RequestGrammar {
  /** Set when a token the grammar refused was accepted anyway (the mask was not applied): no more masking. */
  private failed = false;
  /** Whether the grammar is live: false while a reasoning model still thinks (nothing masked, nothing advanced). */
  private live: boolean;
  /** While it thinks: the latest tokens, as many as the gate's end needs to see. */
  private recent: number[] = [];

  constructor(
    private readonly matcher: GrammarMatcher,
    private readonly gate: ReasoningGate | null = null,
  ) {
    this.live = gate === null || gate.ended;
  }

  /** Whether the grammar is compiled: the request is not scheduled before. */
  get ready(): boolean {
    return this.matcher.ready;
  }

  /** Why the grammar did not compile, or null. */
  get failure(): string | null {
    return this.matcher.failure;
  }

  /** Whether there is a mask to apply: the grammar is live, was followed so far, and is not complete. */
  private get masking(): boolean {
    return this.live && !this.failed && !this.matcher.isTerminated();
  }

  /**
   * Computes the next mask now (while the step that needs it runs on the device, as vLLM prepares its bitmask
   * during the forward pass); applyMask then uses it if no token was accepted since.
   */
  prefetchMask(): void {
    if (this.masking) this.matcher.prefetch();
  }

  /** Sets every token the grammar does not allow next to -Infinity. `logits` is one row of vocabSize values. */
  applyMask(logits: Float32Array): void {
    if (this.masking) applyBitmask(logits, this.matcher.nextTokenBitmask());
  }

  /** Speculative decoding: how many of `drafts` the grammar allows in a row from here (vLLM's validate_tokens). */
  validPrefix(drafts: readonly number[]): number {
    return this.tentatively((step) => {
      let n = 0;
      while (n < drafts.length && step(drafts[n]!)) n++;
      return n;
    });
  }

  /**
   * Speculative decoding: the mask of each verify row after the first, where row j samples as if drafts 0..j-1 were
   * output: entry j - 1 is the grammar's mask after them (null: nothing masked). The drafts must be allowed
   * (validPrefix). The grammar is left as it was.
   */
  draftMasks(drafts: readonly number[]): (Int32Array | null)[] {
    return this.tentatively((step) =>
      drafts.map((t) => {
        if (!step(t)) throw new Error(`[structured output] draft token ${t} is not allowed by the grammar`);
        return this.masking ? this.matcher.nextTokenBitmask() : null;
      }),
    );
  }

  /**
   * Runs `f` with a function that advances the grammar by one token as accept() does (false when it refuses the
   * token), then takes the grammar back to where it was (the matcher rolls back what it accepted).
   */
  private tentatively<T>(f: (step: (tokenId: number) => boolean) => T): T {
    const live = this.live;
    const recent = this.recent.slice();
    let advanced = 0;
    const step = (t: number): boolean => {
      if (!this.live) {
        this.live = this.sees(t);
        return true;
      }
      if (this.failed || this.matcher.isTerminated()) return true;
      if (!this.matcher.acceptToken(t)) return false;
      advanced++;
      return true;
    };
    try {
      return f(step);
    } finally {
      if (advanced > 0) this.matcher.rollback(advanced);
      this.live = live;
      this.recent = recent;
    }
  }

  /** Takes a token sampled while the model thinks; true when it ends the reasoning (the grammar starts after it). */
  private sees(tokenId: number): boolean {
    const end = this.gate!.end;
    this.recent.push(tokenId);
    if (this.recent.length > end.window) this.recent.shift();
    return end.endedIn(this.recent);
  }

  /**
   * Advances past a sampled token; false when the grammar refused it (masking stops for this request then). While
   * the reasoning goes on, a </think> makes the grammar live from the next token (vLLM's should_advance).
   */
  accept(tokenId: number): boolean {
    if (!this.live) {
      this.live = this.sees(tokenId);
      return true;
    }
    if (this.failed || this.matcher.isTerminated()) return true;
    const ok = this.matcher.acceptToken(tokenId);
    if (!ok) this.failed = true;
    return ok;
  }

  /** Whether the constrained output is complete (never while the reasoning goes on). */
  get isTerminated(): boolean {
    return this.live && this.matcher.isTerminated();
  }

  dispose(): void {
    this.matcher.dispose();
  }
}

/**
 * The engine's grammar compiler: one wasm instance holding the tokenizer's vocabulary, compiled grammars cached
 * by spec (as vLLM caches them), and a matcher per request.
 */
export class StructuredOutputManager {
  readonly instance: XgrammarInstance;
  private readonly compiler: XgGrammarCompiler;
  private readonly cache = new Map<string, XgCompiledGrammar>();
  private static readonly CACHE_SIZE = 64;

  /**
   * @param vocab the tokenizer's vocabulary.
   * @param vocabSize the logits' row width (the model's vocab_size, which may exceed the tokenizer's).
   * @param stopTokenIds the ids that end a complete output (the model's EOS ids).
   */
  constructor(
    vocab: GrammarVocab,
    readonly vocabSize: number,
    stopTokenIds: readonly number[],
  ) {
    this.instance = new XgrammarInstance();
    this.compiler = this.instance.call((b) => {
      const tokens = vocab.tokens.length > vocabSize ? vocab.tokens.slice(0, vocabSize) : vocab.tokens;
      const strings = b.vecStringFromJSArray(tokens);
      const stops = stopTokenIds.length > 0 ? b.vecIntFromJSArray([...stopTokenIds]) : undefined;
      const info = new b.TokenizerInfo(strings, vocab.vocabType, vocabSize, stops, vocab.prependSpace);
      strings.delete();
      stops?.delete();
      const compiler = new b.GrammarCompiler(info, 1, false);
      info.delete(); // the compiler holds its own reference
      return compiler;
    });
  }

  /** A request's grammar for a checked spec (see checkStructuredOutputSpec), idle until the reasoning ends when gated. */
  matcher(spec: StructuredOutputSpec, gate: ReasoningGate | null = null): RequestGrammar {
    return new RequestGrammar(this.compileMatcher(spec), gate);
  }

  /** A matcher at the start of a checked spec's grammar (compiled now, or taken from the cache). */
  compileMatcher(spec: StructuredOutputSpec): GrammarMatcher {
    const compiled = this.compile(spec);
    return new LocalMatcher(this.instance.call((b) => new b.GrammarMatcher(compiled, undefined, false, -1)), this);
  }

  private compile(spec: StructuredOutputSpec): XgCompiledGrammar {
    const key = `${spec.kind}\u0000${spec.anyWhitespace}\u0000${spec.source}`;
    const hit = this.cache.get(key);
    if (hit !== undefined) {
      this.cache.delete(key); // re-inserted as the most recent
      this.cache.set(key, hit);
      return hit;
    }
    const compiled = this.instance.call((b) => {
      const g = grammarOf(b, spec);
      try {
        return this.compiler.CompileGrammar(g);
      } finally {
        g.delete();
      }
    });
    this.cache.set(key, compiled);
    if (this.cache.size > StructuredOutputManager.CACHE_SIZE) {
      const [oldest, g] = this.cache.entries().next().value as [string, XgCompiledGrammar];
      this.cache.delete(oldest);
      g.delete(); // matchers hold their own reference to the compiled grammar
    }
    return compiled;
  }
}
