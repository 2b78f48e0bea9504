// Tokenizer over @huggingface/tokenizers (tokenizer.json) with chat templates rendered by
// @huggingface/jinja, plus generation_config.json loading.

import * as fs from "node:fs";
import * as path from "node:path";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import type { ChatMessage, ChatTemplateOptions, DecodeOptions, GrammarVocab, TokenizerLike } from "./tokenizer-types.js";
import { detectContentFormat, messagesForTemplate } from "./chat-content-format.js";
import { compileTemplate, renderTemplate, type TemplateProgram } from "./jinja-python.js";

export class TokenizerError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "TokenizerError";
  }
}

type Json = Record<string, unknown>;

/** A special-token entry in tokenizer_config.json: a string or an AddedToken dict. */
function tokenContent(v: unknown): string | null {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof (v as Json).content === "string") return (v as Json).content as string;
  return null;
}

export interface GenerationConfig {
  eosTokenIds: number[];
  bosTokenId: number | null;
  padTokenId: number | null;
  temperature?: number;
  topP?: number;
  topK?: number;
  minP?: number;
  repetitionPenalty?: number;
  maxNewTokens?: number;
  doSample?: boolean;
  raw: Json;
}

/** Parses a generation_config.json object. */
export function parseGenerationConfig(raw: Json): GenerationConfig {
  const num = (k: string) => (typeof raw[k] === "number" ? (raw[k] as number) : undefined);
  const ids = (v: unknown) => (typeof v === "number" ? [v] : Array.isArray(v) ? v.filter((x): x is number => typeof x === "number") : []);
  const out: GenerationConfig = {
    eosTokenIds: ids(raw.eos_token_id),
    bosTokenId: num("bos_token_id") ?? null,
    padTokenId: num("pad_token_id") ?? null,
    raw,
  };
  const opt: [keyof GenerationConfig, string][] = [
    ["temperature", "temperature"], ["topP", "top_p"], ["topK", "top_k"], ["minP", "min_p"],
    ["repetitionPenalty", "repetition_penalty"], ["maxNewTokens", "max_new_tokens"],
  ];
  for (const [k, j] of opt) if (num(j) !== undefined) (out as unknown as Json)[k] = num(j);
  if (typeof raw.do_sample === "boolean") out.doSample = raw.do_sample;
  return out;
}

/** Reads `dir/generation_config.json`; null when absent. */
export function loadGenerationConfig(dir: string): GenerationConfig | null {
  const p = path.join(dir, "generation_config.json");
  if (!fs.existsSync(p)) return null;
  return parseGenerationConfig(readJson(p));
}

function readJson(p: string): Json {
  try {
    return JSON.parse(fs.readFileSync(p, "utf8")) as Json;
  } catch (e) {
    throw new TokenizerError(`[tokenizer] cannot read ${p}: ${(e as Error).message}`);
  }
}

export interface TokenizerOptions {
  /** generation_config.json contents: its eos ids are added to eosTokenIds. */
  generationConfig?: Json | null;
  /** A chat template that overrides tokenizer_config's (e.g. chat_template.jinja). */
  chatTemplate?: string | null;
  /**
   * Build the HF tokenizer on first use instead of now, for a thread that needs only the EOS ids before then and
   * may never encode (the engine worker): decode and the id lookups build it without the BPE merges, encode in
   * full. Default false: build in full now, so a bad tokenizer.json fails at load.
   */
  deferBuild?: boolean;
}

/** The id of an added token spelled `content` (the last entry wins, as in the built tokenizer); undefined if none. */
function addedTokenId(tokenizerJson: Json, content: string): number | undefined {
  const added = tokenizerJson.added_tokens;
  if (!Array.isArray(added)) return undefined;
  let id: number | undefined;
  for (const t of added as Json[]) if (t !== null && typeof t === "object" && t.content === content && typeof t.id === "number") id = t.id;
  return id;
}

/**
 * A loaded tokenizer: encode/decode, special tokens, chat templates.
 * @example
 *   const tok = Tokenizer.fromDir("/models/Qwen3-0.6B");
 *   const prompt = tok.applyChatTemplate([{ role: "user", content: "Hi" }]);
 *   const ids = tok.encode(prompt, { addSpecialTokens: false });
 */
export class Tokenizer implements TokenizerLike {
  readonly eosTokenIds: number[];
  readonly bosTokenId: number | null;
  readonly bosToken: string | null;
  readonly eosToken: string | null;
  readonly chatTemplate: string | null;
  /** tokenizer_config.json's clean_up_tokenization_spaces (transformers' default false): what `decode` of transformers does. */
  readonly cleanUpTokenizationSpaces: boolean;
  /** The HF tokenizer; `encodes` is false for a deferred one built without its BPE merges (only encode reads them). */
  private built: { hf: HfTokenizer; encodes: boolean; vocabSize: number; specialIds: Set<number> } | null = null;
  private readonly tokenizerJson: Json;
  private readonly namedTemplates: Map<string, string>;
  private readonly config: Json;
  private compiled = new Map<string, TemplateProgram>();

  protected constructor(tokenizerJson: Json, config: Json, options: TokenizerOptions) {
    this.tokenizerJson = tokenizerJson;
    this.config = config;
    if (options.deferBuild !== true) this.build(true);

    this.bosToken = tokenContent(config.bos_token);
    this.eosToken = tokenContent(config.eos_token);
    this.cleanUpTokenizationSpaces = config.clean_up_tokenization_spaces === true;
    this.bosTokenId = this.bosToken !== null ? (this.tokenIdForSetup(this.bosToken) ?? null) : null;
    const eos = new Set<number>();
    const eosId = this.eosToken !== null ? this.tokenIdForSetup(this.eosToken) : undefined;
    if (eosId !== undefined) eos.add(eosId);
    const gen = options.generationConfig ? parseGenerationConfig(options.generationConfig) : null;
    for (const id of gen?.eosTokenIds ?? []) eos.add(id);
    this.eosTokenIds = [...eos];

    this.namedTemplates = new Map();
    const tpl = config.chat_template;
    if (typeof tpl === "string") this.namedTemplates.set("default", tpl);
    else if (Array.isArray(tpl)) {
      for (const t of tpl as Json[]) if (typeof t.name === "string" && typeof t.template === "string") this.namedTemplates.set(t.name, t.template);
    }
    if (options.chatTemplate) this.namedTemplates.set("default", options.chatTemplate);
    this.chatTemplate = this.namedTemplates.get("default") ?? null;
  }

  /**
   * Builds the HF tokenizer: in full, or (`full` false) without the BPE merges, which only encode reads. Without
   * them a large vocabulary builds several times faster (Llama 3's 280k merges: ~430 -> ~75 ms), and decode and the
   * id lookups give the same results (the vocabulary and added tokens are the same). Throws TokenizerError.
   */
  private build(full: boolean): void {
    const model = this.tokenizerJson.model;
    const strip = !full && model !== null && typeof model === "object" && Array.isArray((model as Json).merges);
    // an empty merges list keeps the "merges" key, which picks the BPE model for a config without a "type"
    const json = strip ? { ...this.tokenizerJson, model: { ...(model as Json), merges: [] } } : this.tokenizerJson;
    let hf: HfTokenizer;
    try {
      hf = new HfTokenizer(json, this.config);
    } catch (e) {
      throw new TokenizerError(`[tokenizer] cannot build tokenizer: ${(e as Error).message}`);
    }
    const specialIds = new Set<number>();
    for (const [id, t] of hf.get_added_tokens_decoder()) if (t.special) specialIds.add(id);
    // ids run 0 .. vocab.length - 1 (added tokens included), so this is get_vocab()'s max id + 1 without the map
    this.built = { hf, encodes: !strip, vocabSize: hf.model!.vocab.length, specialIds };
  }

  /** Builds what decode() and the id lookups need, if not yet built (a deferred tokenizer builds it on first use). */
  buildDecoder(): void {
    this.decoder();
  }

  /** The HF tokenizer for decode and id lookups: either build. */
  private decoder(): HfTokenizer {
    if (this.built === null) this.build(false);
    return this.built!.hf;
  }

  /** The HF tokenizer for encode: the full build. */
  private encoder(): HfTokenizer {
    if (this.built?.encodes !== true) this.build(true);
    return this.built!.hf;
  }

  /** token_to_id for the special tokens read at construction: an added token's id needs no build. */
  private tokenIdForSetup(token: string): number | undefined {
    if (this.built === null) {
      const added = addedTokenId(this.tokenizerJson, token);
      if (added !== undefined) return added;
    }
    return this.decoder().token_to_id(token);
  }

  get vocabSize(): number {
    this.decoder();
    return this.built!.vocabSize;
  }

  /** Builds from parsed tokenizer.json and tokenizer_config.json objects. */
  static fromJson(tokenizerJson: Json, config: Json = {}, options: TokenizerOptions = {}): Tokenizer {
    return new Tokenizer(tokenizerJson, config, options);
  }

  /** Loads tokenizer.json, tokenizer_config.json, chat_template.jinja/.json and generation_config.json from `dir`. */
  /** `generationConfigDir`: where generation_config.json (its EOS ids) is read, when not `dir` (vLLM's --tokenizer). */
  static fromDir(dir: string, options: Pick<TokenizerOptions, "deferBuild"> & { generationConfigDir?: string } = {}): Tokenizer {
    const tj = path.join(dir, "tokenizer.json");
    if (!fs.existsSync(tj)) throw new TokenizerError(`[tokenizer] ${dir}: no tokenizer.json`);
    const cfgPath = path.join(dir, "tokenizer_config.json");
    const config = fs.existsSync(cfgPath) ? readJson(cfgPath) : {};
    let chatTemplate: string | null = null;
    const jinja = path.join(dir, "chat_template.jinja");
    const jsonTpl = path.join(dir, "chat_template.json");
    if (fs.existsSync(jinja)) chatTemplate = fs.readFileSync(jinja, "utf8");
    else if (fs.existsSync(jsonTpl)) {
      const t = readJson(jsonTpl).chat_template;
      if (typeof t === "string") chatTemplate = t;
    }
    const genPath = path.join(options.generationConfigDir ?? dir, "generation_config.json");
    const generationConfig = fs.existsSync(genPath) ? readJson(genPath) : null;
    return new Tokenizer(readJson(tj), config, { chatTemplate, generationConfig, deferBuild: options.deferBuild });
  }

  encode(text: string, options: { addSpecialTokens?: boolean } = {}): number[] {
    return this.encoder().encode(text, { add_special_tokens: options.addSpecialTokens ?? true }).ids;
  }

  /**
   * A text pair's ids as HF's `tokenizer(text, text_pair)` gives them: each text encoded on its own, then joined by
   * tokenizer.json's post-processor for pairs (TemplateProcessing's `pair` template, Bert's `[CLS] A [SEP] B [SEP]`,
   * Roberta's `<s> A </s></s> B </s>`; none or ByteLevel: A then B). The JS tokenizer drops the pair under a ByteLevel
   * post-processor and reads an empty pair as none, so the pair is joined here. Throws TokenizerError for another
   * post-processor.
   * @example tok.encodePair("a query", "a document") // Gemma: [<bos>, ...query, <bos>, ...document]
   */
  encodePair(text: string, pair: string, options: { addSpecialTokens?: boolean } = {}): number[] {
    const a = this.encode(text, { addSpecialTokens: false });
    const b = this.encode(pair, { addSpecialTokens: false });
    if (options.addSpecialTokens === false) return [...a, ...b];
    const joins = pairJoins(this.tokenizerJson.post_processor);
    if (joins.length > 1) throw new TokenizerError("[tokenizer] text pairs: a Sequence of more than one special-token post-processor is not supported");
    return joins.length === 0 ? [...a, ...b] : joins[0]!(a, b);
  }

  /**
   * The text the ids spell, as tokenizers' `Tokenizer.decode` and vLLM's detokenizer give it: no
   * clean_up_tokenization_spaces unless asked (`cleanUpTokenizationSpaces`: transformers' `decode` cleanup), and ids
   * past the vocabulary (a model's padded embedding rows) skipped, where the JS library spells them as the unk token.
   */
  decode(ids: readonly number[], options: DecodeOptions = {}): string {
    const vocab = this.decoder();
    const known = ids.filter((id) => vocab.id_to_token(id) !== undefined);
    if (known.length === 0) return "";
    const clean = options.cleanUpTokenizationSpaces ?? false;
    return vocab.decode(known, { skip_special_tokens: options.skipSpecialTokens ?? false, clean_up_tokenization_spaces: clean });
  }

  /** The token alone decoded as transformers' decode([id]) gives it (vLLM's logprob tokens): the config's cleanup applies. */
  idToToken(id: number): string | undefined {
    if (this.decoder().id_to_token(id) === undefined) return undefined;
    return this.decode([id], { cleanUpTokenizationSpaces: this.cleanUpTokenizationSpaces });
  }

  tokenizerConfig(): Record<string, unknown> {
    return structuredClone(this.config);
  }

  /** The vocabulary spelling of a token (e.g. "Ġhello"), as in tokenizer.json. */
  idToRawToken(id: number): string | undefined {
    return this.decoder().id_to_token(id);
  }

  /**
   * The vocabulary for structured output (xgrammar's TokenizerInfo): spellings by id, special tokens blank, and
   * the decoding read from tokenizer.json as xgrammar's from_huggingface reads it (a ByteLevel decoder: byte-level;
   * a ByteFallback decoder or byte_fallback model: byte-fallback; else raw), with whether encoding prepends a space.
   */
  grammarVocab(): GrammarVocab {
    const n = this.vocabSize;
    const tokens = new Array<string>(n);
    for (let id = 0; id < n; id++) tokens[id] = this.isSpecial(id) ? "" : (this.idToRawToken(id) ?? "");
    const parts = (x: unknown, key: string): Json[] => {
      if (x === null || typeof x !== "object") return [];
      const o = x as Json;
      return Array.isArray(o[key]) ? (o[key] as Json[]).flatMap((e) => parts(e, key)) : [o];
    };
    const decoders = parts(this.tokenizerJson.decoder, "decoders");
    const model = (this.tokenizerJson.model ?? {}) as Json;
    const vocabType = decoders.some((d) => d.type === "ByteLevel")
      ? "BYTE_LEVEL"
      : decoders.some((d) => d.type === "ByteFallback") || model.byte_fallback === true
        ? "BYTE_FALLBACK"
        : "RAW";
    const prependSpace =
      parts(this.tokenizerJson.normalizer, "normalizers").some((x) => x.type === "Prepend") ||
      parts(this.tokenizerJson.pre_tokenizer, "pretokenizers").some(
        (x) => x.type === "Metaspace" && (x.add_prefix_space === true || x.prepend_scheme === "first" || x.prepend_scheme === "always"),
      );
    return { tokens, vocabType, prependSpace };
  }

  tokenToId(token: string): number | undefined {
    return this.decoder().token_to_id(token);
  }

  isSpecial(id: number): boolean {
    this.decoder();
    return this.built!.specialIds.has(id);
  }

  /**
   * Renders the chat template as transformers' apply_chat_template(tokenize=False) does. The result
   * already holds any BOS the template writes: encode it with addSpecialTokens=false.
   */
  applyChatTemplate(messages: ChatMessage[], options: ChatTemplateOptions = {}): string {
    const continueFinal = options.continueFinalMessage ?? false;
    const addGenerationPrompt = continueFinal ? false : (options.addGenerationPrompt ?? true);
    if (continueFinal && options.addGenerationPrompt === true) {
      throw new TokenizerError("[chat_template] continueFinalMessage and addGenerationPrompt cannot both be set");
    }
    let source = options.chatTemplate;
    if (!source && options.tools?.length && this.namedTemplates.has("tool_use")) source = this.namedTemplates.get("tool_use");
    source ??= this.chatTemplate ?? undefined;
    if (!source) throw new TokenizerError("[chat_template] this tokenizer has no chat template; pass one with chatTemplate");
    let template = this.compiled.get(source);
    if (!template) {
      try {
        template = compileTemplate(source);
      } catch (e) {
        throw new TokenizerError(`[chat_template] cannot parse template: ${(e as Error).message}`);
      }
      this.compiled.set(source, template);
    }
    // transformers renders with render(messages=..., **kwargs): a kwarg named messages is a TypeError (vLLM's 400)
    if (options.chatTemplateKwargs !== undefined && Object.hasOwn(options.chatTemplateKwargs, "messages")) {
      throw new TokenizerError("[chat_template] render() got multiple values for keyword argument 'messages' (chat_template_kwargs.messages)");
    }
    const asked = options.contentFormat ?? "string";
    const format = asked === "auto" ? detectContentFormat(source) : asked;
    const specials: Json = {};
    for (const k of ["bos_token", "eos_token", "pad_token", "unk_token"]) specials[k] = tokenContent(this.config[k]) ?? "";
    let rendered: string;
    try {
      rendered = renderTemplate(template, {
        ...specials,
        messages: messagesForTemplate(messages, format),
        add_generation_prompt: addGenerationPrompt,
        tools: options.tools ?? null,
        continue_final_message: continueFinal,
        // raise_exception and strftime_now are globals (jinja-python.ts)
        ...(options.chatTemplateKwargs ?? {}),
      });
    } catch (e) {
      throw new TokenizerError(`[chat_template] ${(e as Error).message}`);
    }
    if (continueFinal) rendered = cutAfterFinalMessage(rendered, messages);
    return rendered;
  }
}

type PairJoin = (a: number[], b: number[]) => number[];

/**
 * The special-token joins of a tokenizer.json post-processor for a text pair (HF tokenizers' process with a pair
 * encoding), in order; ByteLevel only trims offsets and joins nothing. Throws TokenizerError for an unknown one.
 */
function pairJoins(pp: unknown): PairJoin[] {
  if (pp === null || pp === undefined) return [];
  const p = pp as Json;
  const idOf = (v: unknown): number => {
    if (!Array.isArray(v) || typeof v[1] !== "number") throw new TokenizerError(`[tokenizer] ${String(p.type)} post-processor: bad special token ${JSON.stringify(v)}`);
    return v[1];
  };
  switch (p.type) {
    case "ByteLevel":
      return [];
    case "Sequence":
      return (Array.isArray(p.processors) ? p.processors : []).flatMap(pairJoins);
    case "BertProcessing": {
      const [cls, sep] = [idOf(p.cls), idOf(p.sep)];
      return [(a, b) => [cls, ...a, sep, ...b, sep]];
    }
    case "RobertaProcessing": {
      const [cls, sep] = [idOf(p.cls), idOf(p.sep)];
      return [(a, b) => [cls, ...a, sep, sep, ...b, sep]];
    }
    case "TemplateProcessing": {
      const specials = (p.special_tokens ?? {}) as Record<string, { ids?: unknown }>;
      const items = Array.isArray(p.pair) ? (p.pair as Json[]) : null;
      if (items === null) throw new TokenizerError("[tokenizer] TemplateProcessing post-processor without a pair template");
      return [
        (a, b) =>
          items.flatMap((item): number[] => {
            const seq = item.Sequence as { id?: unknown } | undefined;
            if (seq !== undefined) return seq.id === "B" ? b : a;
            const name = (item.SpecialToken as { id?: unknown } | undefined)?.id;
            const ids = typeof name === "string" ? specials[name]?.ids : undefined;
            if (!Array.isArray(ids)) throw new TokenizerError(`[tokenizer] TemplateProcessing: unknown special token ${JSON.stringify(name)}`);
            return ids as number[];
          }),
      ];
    }
    default:
      throw new TokenizerError(`[tokenizer] text pairs under a ${String(p.type)} post-processor are not supported`);
  }
}

/** transformers' continue_final_message: end the prompt right after the last message's content. */
function cutAfterFinalMessage(rendered: string, messages: ChatMessage[]): string {
  const final = messages.at(-1)?.content ?? "";
  if (!rendered.includes(final.trim())) {
    throw new TokenizerError("[chat_template] continueFinalMessage is set but the final message does not appear in the rendered chat");
  }
  const loc = rendered.lastIndexOf(final.trim());
  if (rendered.slice(loc, loc + final.trimStart().length) === final) return rendered.slice(0, loc + final.trimStart().length);
  return rendered.slice(0, loc + final.trim().length);
}
